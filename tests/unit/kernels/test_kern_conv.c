/* The CPU backend's convolutions (kern_conv2d_*: oneDNN where the build
 * has it) against the im2col path they replace, on odd shapes: batch 1,
 * strides that leave columns over, same/valid/causal padding, a 1-row
 * Conv1D, 1x1 kernels, without and with bias, relu fused, input gradients
 * written and added to. Then its threads: every op that runs over the pool gives the
 * same bits on 1 and 3 threads, and the pool's workers sleep between ops
 * (none is runnable while the context is idle). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/err.h"
#include "kernels/kern.h"
#include "kernels/kern_nn.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define TSR_TEST_SEED 2463534242ull
#include "../test_rand.h"

static kern_ctx *cpu(int threads) {
  kern_opts o = {.device = KERN_DEVICE_CPU, .cpu_threads = threads};
  kern_ctx *c = NULL;
  char err[256];
  assert_int_equal(kern_open(&o, &c, err, sizeof err), 0);
  assert_int_equal(kern_threads(c), threads);
  return c;
}

static float *rnd(int64_t n) {
  float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof *p);
  assert_non_null(p);
  for (int64_t i = 0; i < n; i++) p[i] = frand(-1, 1);
  return p;
}

static float *fdup(const float *p, int64_t n) {
  float *q = malloc((size_t)(n > 0 ? n : 1) * sizeof *q);
  assert_non_null(q);
  memcpy(q, p, (size_t)n * sizeof *q);
  return q;
}

static void near(const char *what, const float *got, const float *want,
                 int64_t n, double tol) {
  for (int64_t i = 0; i < n; i++)
    if (!(fabs((double)got[i] - want[i]) <= tol * (1 + fabs(want[i]))))
      fail_msg("%s[%lld]: %.9g, the im2col path %.9g", what, (long long)i,
               got[i], want[i]);
}

typedef struct {
  int64_t n, h, w, c, kh, kw, sh, sw, f;
  int pad; /* 0 valid, 1 same, 2 causal (1-row) */
} shape;

static void make_win(const shape *s, kern_win *g) {
  assert_int_equal(kern_win_make(g, s->h, s->w, s->c, s->kh, s->kw, s->sh,
                                 s->sw, s->pad != 0), 0);
  if (s->pad == 2) g->pl = s->kw - 1; /* as the Conv1D layer does */
}

/* The im2col path: the whole batch's columns, one product each way. */
static void old_path(kern_ctx *c, const kern_win *g, const shape *s,
                     const float *x, const float *w, const float *b,
                     const float *dy, float *y, float *dx, float *dw,
                     float *db) {
  int64_t K = kern_win_patch(g), rows = s->n * g->oh * g->ow;
  float *cols = malloc((size_t)(rows * K) * sizeof *cols);
  assert_non_null(cols);
  assert_int_equal(kern_im2col(c, g, s->n, x, cols), 0);
  assert_int_equal(kern_gemm(c, false, false, rows, s->f, K, 1, cols, w, 0,
                             y, KERN_F32), 0);
  for (int64_t r = 0; r < rows; r++)
    for (int64_t j = 0; j < s->f; j++) y[r * s->f + j] += b[j];
  assert_int_equal(kern_gemm(c, true, false, K, s->f, rows, 1, cols, dy, 0,
                             dw, KERN_F32), 0);
  assert_int_equal(kern_col_sum(c, dy, rows, s->f, 0, db), 0);
  assert_int_equal(kern_gemm(c, false, true, rows, K, s->f, 1, dy, w, 0,
                             cols, KERN_F32), 0);
  assert_int_equal(kern_col2im(c, g, s->n, cols, 1.0f, dx), 0);
  free(cols);
}

static const shape shapes[] = {
    {1, 7, 5, 3, 3, 3, 1, 1, 4, 0},     /* batch 1 */
    {3, 9, 8, 2, 3, 2, 2, 3, 5, 1},     /* odd strides, same */
    {5, 6, 7, 1, 5, 3, 2, 1, 3, 0},     /* valid, a row left over */
    {2, 1, 13, 4, 1, 3, 1, 2, 6, 1},    /* Conv1D, same */
    {3, 1, 9, 3, 1, 4, 1, 1, 5, 2},     /* Conv1D, causal */
    {2, 1, 10, 3, 1, 3, 1, 3, 4, 2},    /* Conv1D, causal, stride 3 */
    {4, 5, 5, 8, 1, 1, 1, 1, 8, 0},     /* 1x1 */
    {2, 8, 8, 3, 2, 2, 2, 2, 16, 0},    /* stride = kernel */
    {37, 12, 11, 16, 3, 3, 1, 1, 32, 1}, /* several items, a short last */
};

static void test_conv_vs_im2col(void **state) {
  kern_ctx *c = cpu(2);
  printf("convolutions: %s\n", kern_conv_impl(c));
  for (size_t t = 0; t < sizeof shapes / sizeof *shapes; t++) {
    const shape *s = &shapes[t];
    kern_win g;
    make_win(s, &g);
    int64_t nx = s->n * s->h * s->w * s->c, ny = s->n * g.oh * g.ow * s->f;
    int64_t nw = kern_win_patch(&g) * s->f;
    float *x = rnd(nx), *w = rnd(nw), *b = rnd(s->f), *dy = rnd(ny);
    float *dx0 = rnd(nx);
    float *y = rnd(ny), *yr = rnd(ny), *dxr = fdup(dx0, nx);
    float *dw = rnd(nw), *dwr = rnd(nw), *db = rnd(s->f), *dbr = rnd(s->f);
    old_path(c, &g, s, x, w, b, dy, yr, dxr, dwr, dbr);
    int64_t nws = kern_conv2d_ws(c, &g, s->n, s->f, KERN_F32);
    float *ws = nws ? rnd(nws) : NULL;
    char what[64];
    double tol = 2e-6 * (double)kern_win_patch(&g);
    snprintf(what, sizeof what, "shape %zu y", t);
    assert_int_equal(kern_conv2d_fwd(c, &g, s->n, s->f, x, w, b, false, y,
                                     KERN_F32, ws), 0);
    near(what, y, yr, ny, tol);
    /* relu fused: max(0, y), exactly 0 below */
    float *yrelu = rnd(ny);
    assert_int_equal(kern_conv2d_fwd(c, &g, s->n, s->f, x, w, b, true, yrelu,
                                     KERN_F32, ws), 0);
    for (int64_t i = 0; i < ny; i++)
      if (yr[i] < -tol * (1 + fabs(yr[i]))) {
        if (yrelu[i] != 0.0f)
          fail_msg("shape %zu relu[%lld]: %.9g for %.9g", t, (long long)i,
                   yrelu[i], yr[i]);
      } else if (yr[i] > tol * (1 + fabs(yr[i]))) {
        near("relu", yrelu + i, yr + i, 1, tol);
      }
    free(yrelu);
    /* the input gradient added to what is there (beta 1), then written */
    float *dx = fdup(dx0, nx);
    snprintf(what, sizeof what, "shape %zu dx (added)", t);
    assert_int_equal(kern_conv2d_bwd_data(c, &g, s->n, s->f, dy, w, 1.0f, dx,
                                          KERN_F32, ws), 0);
    near(what, dx, dxr, nx, tol * s->f);
    for (int64_t i = 0; i < nx; i++) dxr[i] -= dx0[i];
    snprintf(what, sizeof what, "shape %zu dx", t);
    assert_int_equal(kern_conv2d_bwd_data(c, &g, s->n, s->f, dy, w, 0.0f, dx,
                                          KERN_F32, ws), 0);
    near(what, dx, dxr, nx, tol * s->f);
    snprintf(what, sizeof what, "shape %zu dw", t);
    assert_int_equal(kern_conv2d_bwd_filter(c, &g, s->n, s->f, x, dy, dw, db,
                                            KERN_F32, ws), 0);
    near(what, dw, dwr, nw, 2e-6 * (double)(s->n * g.oh * g.ow));
    snprintf(what, sizeof what, "shape %zu db", t);
    near(what, db, dbr, s->f, 2e-6 * (double)(s->n * g.oh * g.ow));
    /* without a bias: the same kernel gradient, the output less b */
    float *dw2 = rnd(nw);
    assert_int_equal(kern_conv2d_bwd_filter(c, &g, s->n, s->f, x, dy, dw2,
                                            NULL, KERN_F32, ws), 0);
    snprintf(what, sizeof what, "shape %zu dw (no bias)", t);
    near(what, dw2, dwr, nw, 2e-6 * (double)(s->n * g.oh * g.ow));
    assert_int_equal(kern_conv2d_fwd(c, &g, s->n, s->f, x, w, NULL, false, y,
                                     KERN_F32, ws), 0);
    for (int64_t i = 0; i < ny; i++) yr[i] -= b[i % s->f];
    snprintf(what, sizeof what, "shape %zu y (no bias)", t);
    near(what, y, yr, ny, tol);
    free(x); free(w); free(b); free(dy); free(dx0); free(y); free(yr);
    free(dx); free(dxr); free(dw); free(dwr); free(db); free(dbr);
    free(dw2); free(ws);
  }
  kern_close(c);
}

/* bf16 products keep the im2col path (16-bit inputs, fp32 sums). */
static void test_conv_bf16(void **state) {
  kern_ctx *c = cpu(1);
  const shape *s = &shapes[1];
  kern_win g;
  make_win(s, &g);
  int64_t nx = s->n * s->h * s->w * s->c, ny = s->n * g.oh * g.ow * s->f;
  int64_t nw = kern_win_patch(&g) * s->f, rows = s->n * g.oh * g.ow;
  int64_t nws = kern_conv2d_ws(c, &g, s->n, s->f, KERN_BF16);
  assert_true(nws >= rows * kern_win_patch(&g));
  float *x = rnd(nx), *w = rnd(nw), *y = rnd(ny), *yr = rnd(ny);
  float *ws = rnd(nws), *cols = rnd(nws);
  assert_int_equal(kern_conv2d_fwd(c, &g, s->n, s->f, x, w, NULL, false, y,
                                   KERN_BF16, ws), 0);
  assert_int_equal(kern_im2col(c, &g, s->n, x, cols), 0);
  assert_int_equal(kern_gemm(c, false, false, rows, s->f, kern_win_patch(&g),
                             1, cols, w, 0, yr, KERN_BF16), 0);
  assert_memory_equal(y, yr, (size_t)ny * sizeof *y);
  /* a workspace missing where one is needed */
  assert_int_equal(kern_conv2d_fwd(c, &g, s->n, s->f, x, w, NULL, false, y,
                                   KERN_BF16, NULL), TSR_EINVAL);
  free(x); free(w); free(y); free(yr); free(ws); free(cols);
  kern_close(c);
}

/* Max pooling's gradient where windows tile the image (written once per
 * element, not zeroed and scattered into), with the rows and columns
 * valid padding leaves over, and windows that overlap or are padded: all
 * the scatter of dy at the winners, written (beta 0) or added (beta 1). */
static void test_pool_grad(void **state) {
  kern_ctx *c = cpu(2);
  const struct { int64_t n, h, w, ch, k, s; bool same; } ps[] = {
      {3, 26, 26, 32, 2, 2, false}, {2, 11, 11, 64, 2, 2, false},
      {1, 9, 7, 5, 3, 3, false},    {2, 1, 13, 3, 1, 2, false},
      {2, 7, 7, 4, 3, 2, false},    {2, 7, 6, 3, 2, 2, true}};
  for (size_t t = 0; t < sizeof ps / sizeof *ps; t++) {
    kern_win g;
    assert_int_equal(kern_win_make(&g, ps[t].h, ps[t].w, ps[t].ch,
                                   ps[t].k == 1 ? 1 : ps[t].k, ps[t].k,
                                   ps[t].k == 1 ? 1 : ps[t].s, ps[t].s,
                                   ps[t].same), 0);
    int64_t img = g.h * g.w * g.c, nx = ps[t].n * img;
    int64_t ny = ps[t].n * g.oh * g.ow * g.c;
    float *x = rnd(nx), *y = rnd(ny), *dy = rnd(ny), *dx0 = rnd(nx);
    int32_t *arg = malloc((size_t)ny * sizeof *arg);
    assert_int_equal(kern_pool2d_fwd(c, &g, ps[t].n, KERN_POOL2D_MAX, x, y,
                                     arg), 0);
    for (int beta = 0; beta < 2; beta++) {
      float *dx = fdup(dx0, nx), *ref = fdup(dx0, nx);
      if (!beta) memset(ref, 0, (size_t)nx * sizeof *ref);
      for (int64_t i = 0; i < ny; i++) {
        int64_t b = i / (g.oh * g.ow * g.c);
        assert_true(arg[i] >= 0 && arg[i] < img);
        assert_true(x[b * img + arg[i]] == y[i]);
        ref[b * img + arg[i]] += dy[i];
      }
      assert_int_equal(kern_pool2d_grad(c, &g, ps[t].n, KERN_POOL2D_MAX, dy,
                                        arg, (float)beta, dx), 0);
      char what[64];
      snprintf(what, sizeof what, "pool %zu beta %d dx", t, beta);
      near(what, dx, ref, nx, 1e-6);
      free(dx);
      free(ref);
    }
    free(x); free(y); free(dy); free(dx0); free(arg);
  }
  kern_close(c);
}

/* ---- threads ------------------------------------------------------------ */

static void same_bits(const char *what, const float *a, const float *b,
                      int64_t n) {
  for (int64_t i = 0; i < n; i++)
    if (memcmp(&a[i], &b[i], sizeof *a))
      fail_msg("%s[%lld]: %.9g on 1 thread, %.9g on 3", what, (long long)i,
               a[i], b[i]);
}

/* Each op on a 1-thread and a 3-thread context from the same (never
 * written) inputs: x, w, b, in, g; results in out[0] and out[1]. */
static void test_threads_same_bits(void **state) {
  kern_ctx *c[2] = {cpu(1), cpu(3)};
  const shape s = {130, 13, 13, 32, 3, 3, 1, 1, 64, 0};
  kern_win g, pg;
  make_win(&s, &g);
  int64_t nx = s.n * s.h * s.w * s.c, ny = s.n * g.oh * g.ow * s.f;
  int64_t nw = kern_win_patch(&g) * s.f, rows = s.n * g.oh * g.ow;
  float *x = rnd(nx), *w = rnd(nw), *b = rnd(s.f), *in = rnd(ny),
        *gr = rnd(ny);
  float *y[2], *z[2], *dx[2], *dw[2], *db[2];
  int32_t *arg[2];
  for (int k = 0; k < 2; k++) {
    y[k] = rnd(ny);
    z[k] = rnd(ny);
    dx[k] = rnd(nx);
    dw[k] = rnd(nw);
    db[k] = rnd(s.f);
    arg[k] = malloc((size_t)ny * sizeof(int32_t));
    assert_non_null(arg[k]);
  }
  int64_t nws = kern_conv2d_ws(c[0], &g, s.n, s.f, KERN_F32);
  float *ws = nws ? rnd(nws) : NULL;
  for (int k = 0; k < 2; k++) {
    assert_int_equal(kern_conv2d_fwd(c[k], &g, s.n, s.f, x, w, b, false, y[k],
                                     KERN_F32, ws), 0);
    assert_int_equal(kern_conv2d_bwd_data(c[k], &g, s.n, s.f, gr, w, 0,
                                          dx[k], KERN_F32, ws), 0);
    assert_int_equal(kern_conv2d_bwd_filter(c[k], &g, s.n, s.f, x, gr, dw[k],
                                            db[k], KERN_F32, ws), 0);
  }
  same_bits("conv y", y[0], y[1], ny);
  same_bits("conv dx", dx[0], dx[1], nx);
  same_bits("conv dw", dw[0], dw[1], nw);
  same_bits("conv db", db[0], db[1], s.f);
  /* an activation with a bias, its gradient, the bias gradient */
  for (int k = 0; k < 2; k++) {
    memcpy(z[k], in, (size_t)ny * sizeof(float));
    assert_int_equal(kern_bias_act(c[k], z[k], b, y[k], rows, s.f,
                                   KERN_ACT_SWISH, 0), 0);
    assert_int_equal(kern_act_grad(c[k], gr, z[k], y[k], z[k], rows, s.f,
                                   KERN_ACT_SWISH, 0), 0);
    assert_int_equal(kern_col_sum(c[k], z[k], rows, s.f, 0, db[k]), 0);
  }
  same_bits("swish", y[0], y[1], ny);
  same_bits("swish gradient", z[0], z[1], ny);
  same_bits("column sums", db[0], db[1], s.f);
  /* pooling, max and average, same padding, and the gradients */
  assert_int_equal(kern_win_make(&pg, g.oh, g.ow, s.f, 3, 3, 2, 2, true), 0);
  int64_t np = s.n * pg.oh * pg.ow * s.f;
  for (int kind = 0; kind < 2; kind++) {
    for (int k = 0; k < 2; k++) {
      assert_int_equal(kern_pool2d_fwd(c[k], &pg, s.n, (kern_pool2d)kind, in,
                                       z[k], arg[k]), 0);
      assert_int_equal(kern_pool2d_grad(c[k], &pg, s.n, (kern_pool2d)kind,
                                        gr, arg[k], 0, y[k]), 0);
    }
    same_bits(kind ? "avg pool" : "max pool", z[0], z[1], np);
    if (!kind)
      assert_memory_equal(arg[0], arg[1], (size_t)np * sizeof(int32_t));
    same_bits("pool gradient", y[0], y[1], ny);
  }
  /* batch normalization over the rows of `in` */
  float mean[2][64], var[2][64], dg[2][64], dbt[2][64];
  for (int k = 0; k < 2; k++) {
    assert_int_equal(kern_moments(c[k], in, rows, s.f, mean[k], var[k]), 0);
    assert_int_equal(kern_bn_apply(c[k], in, rows, s.f, mean[k], var[k],
                                   1e-3f, b, b, z[k]), 0);
    assert_int_equal(kern_bn_grad(c[k], gr, in, rows, s.f, mean[k], var[k],
                                  1e-3f, b, 0, y[k], dg[k], dbt[k]), 0);
  }
  same_bits("bn mean", mean[0], mean[1], s.f);
  same_bits("bn var", var[0], var[1], s.f);
  same_bits("bn y", z[0], z[1], ny);
  same_bits("bn dx", y[0], y[1], ny);
  same_bits("bn dgamma", dg[0], dg[1], s.f);
  same_bits("bn dbeta", dbt[0], dbt[1], s.f);
  /* a product big enough to be cut into blocks */
  for (int k = 0; k < 2; k++)
    assert_int_equal(kern_gemm(c[k], false, true, 1000, 600, 333, 1, in, gr,
                               0, z[k], KERN_F32), 0);
  same_bits("gemm", z[0], z[1], 1000 * 600);
  for (int k = 0; k < 2; k++) {
    free(y[k]); free(z[k]); free(dx[k]); free(dw[k]); free(db[k]);
    free(arg[k]);
    kern_close(c[k]);
  }
  free(x); free(w); free(b); free(in); free(gr); free(ws);
}

/* The state letter of /proc/self/task/TID/stat ('R' running or runnable,
 * 'S' asleep), after the parenthesized name. */
static char task_state(const char *tid) {
  char path[64], buf[512];
  snprintf(path, sizeof path, "/proc/self/task/%s/stat", tid);
  FILE *f = fopen(path, "r");
  if (!f) return '?';
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  char *p = strrchr(buf, ')');
  return p && p[1] == ' ' ? p[2] : '?';
}

/* Between ops the workers wait without running: sampled 40 times over
 * 200 ms after a burst of work, no thread but this one is ever found
 * runnable more than a few times (a spinning or yielding thread is
 * runnable in every sample, on a loaded machine as on an idle one). */
static void test_idle_threads_sleep(void **state) {
  kern_ctx *c = cpu(4);
  const shape s = {64, 13, 13, 32, 3, 3, 1, 1, 64, 0};
  kern_win g;
  make_win(&s, &g);
  int64_t nx = s.n * s.h * s.w * s.c, ny = s.n * g.oh * g.ow * s.f;
  float *x = rnd(nx), *w = rnd(kern_win_patch(&g) * s.f), *y = rnd(ny);
  float *ws = rnd(kern_conv2d_ws(c, &g, s.n, s.f, KERN_F32) + 1);
  float *big = rnd(800 * 800), *out = rnd(800 * 800);
  for (int r = 0; r < 3; r++) {
    assert_int_equal(kern_conv2d_fwd(c, &g, s.n, s.f, x, w, NULL, false, y,
                                     KERN_F32, ws), 0);
    assert_int_equal(kern_gemm(c, false, false, 800, 800, 800, 1, big, big, 0,
                               out, KERN_F32), 0);
  }
  char self[32];
  snprintf(self, sizeof self, "%d", (int)getpid());
  int tasks = 0, worst = 0;
  char worst_tid[32] = "";
  enum { SAMPLES = 40, MAX_TASKS = 64 };
  char tids[MAX_TASKS][32];
  int runnable[MAX_TASKS] = {0};
  DIR *d = opendir("/proc/self/task");
  assert_non_null(d);
  struct dirent *e;
  while ((e = readdir(d)) && tasks < MAX_TASKS)
    if (e->d_name[0] != '.' && strcmp(e->d_name, self))
      snprintf(tids[tasks++], sizeof tids[0], "%s", e->d_name);
  closedir(d);
  assert_true(tasks >= 3); /* the pool's workers */
  for (int k = 0; k < SAMPLES; k++) {
    for (int i = 0; i < tasks; i++)
      if (task_state(tids[i]) == 'R') runnable[i]++;
    struct timespec ts = {0, 5 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  for (int i = 0; i < tasks; i++)
    if (runnable[i] > worst) {
      worst = runnable[i];
      snprintf(worst_tid, sizeof worst_tid, "%s", tids[i]);
    }
  if (worst > SAMPLES / 4)
    fail_msg("thread %s was runnable in %d of %d samples of an idle "
             "context", worst_tid, worst, SAMPLES);
  free(x); free(w); free(y); free(ws); free(big); free(out);
  kern_close(c);
}

/* Limits on the number of threads. */
static void test_thread_limits(void **state) {
  kern_opts o = {.device = KERN_DEVICE_CPU, .cpu_threads = KERN_MAX_THREADS + 1};
  kern_ctx *c = NULL;
  char err[256] = "";
  assert_int_equal(kern_open(&o, &c, err, sizeof err), TSR_EINVAL);
  assert_null(c);
  assert_non_null(strstr(err, "at most 256"));
  o.cpu_threads = 0; /* one */
  assert_int_equal(kern_open(&o, &c, err, sizeof err), 0);
  assert_int_equal(kern_threads(c), 1);
  kern_close(c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_conv_vs_im2col),
      cmocka_unit_test(test_conv_bf16),
      cmocka_unit_test(test_pool_grad),
      cmocka_unit_test(test_threads_same_bits),
      cmocka_unit_test(test_idle_threads_sleep),
      cmocka_unit_test(test_thread_limits),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
