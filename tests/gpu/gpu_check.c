/* GPU backend against the CPU backend, then the GPU benchmark. Built by
 * meson (tests/gpu/meson.build); tests/gpu/run.sh runs it on a machine
 * with a GPU, and the suite runs it on the CPU (both sides on the CPU
 * backend, TSR_GPU_CHECK_ON_CPU=1) so the harness itself never rots.
 *
 * Checks (fresh random inputs each, outputs poisoned with NaN first so an
 * unwritten element fails): every op of kern.h on both backends,
 * ||gpu - cpu|| / ||cpu|| within fp32 rounding (1e-5; transcendental
 * activations 2e-5, the device's libm differing by an ulp or two); dropout
 * masks and 16-bit rounding bit-identical (one kern_math.h for both).
 * Products are judged against the error bound of fp32 accumulation, which
 * holds whatever the order: |gpu - cpu| <= K 2^-22 (sum |a b| + |beta c|)
 * per element (both sides within K 2^-24, doubled for accumulators that
 * truncate). bf16/fp16 products get the same bound against the CPU's
 * emulation, which rounds the inputs exactly as the GPU does (the products
 * of 16-bit numbers are exact in fp32, so accumulation is the only
 * difference), and against fp32 the input rounding on top (2u + u^2 with
 * u = 2^-8, 2^-11). A full training step (forward, loss, backward) of an
 * MLP and of wide_deep with gradients compared the same way (1e-4 in
 * fp32, 1e-2 in 16 bits, where an fp32 difference flips the rounding of
 * some activations: the CPU self-test measures that margin by running each
 * step again with the parameters of one side an ulp apart); with two or
 * more GPUs, replicas whose NCCL-summed gradients equal one GPU's. Also
 * whole steps of a CNN with BatchNormalization and of a Functional
 * residual block with LayerNormalization; the convolution, pooling and
 * normalization ops one by one are in gpu_check_nn.c.
 * Benchmark: the MLP 784-1024-1024-10 step at batch 256 (fp32) and an
 * 8192-wide MLP at batch 4096 (bf16), each against the rate of its own
 * products through kern_gemm (cublasGemmEx, with the same bf16 casts the
 * step does) measured in the same run. Exit 0 only when every check passed.
 * Usage: gpu_check [--bench-only | --no-bench]; TSR_GPU_CHECK_ON_CPU=1 runs
 * the harness with both sides on the CPU (a self-test without a GPU). */
#include "common/err.h"
#include "kernels/kern.h"
#include "worker/model_exec.h"
#include "worker/train.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int failures;
int gpu_check_nn(kern_ctx *cpu, kern_ctx *gpu); /* gpu_check_nn.c */
int gpu_check_seq(kern_ctx *cpu, kern_ctx *gpu); /* gpu_check_seq.c */
/* gpu_check_nccl.c: NCCL among processes (this program is a rank with
 * --nccl-rank R ID) */
int gpu_check_nccl(kern_ctx *gpu, int ngpu, const char *self);
int gpu_check_nccl_rank(int rank, const char *idhex);
static uint64_t rs = 0x9E3779B97F4A7C15ull;
static float frand(float lo, float hi) {
  rs ^= rs << 13;
  rs ^= rs >> 7;
  rs ^= rs << 17;
  return lo + (hi - lo) * (float)((double)(rs >> 11) / 9007199254740992.0);
}
static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static kern_ctx *cpu, *gpu;

static double relerr(const float *a, const float *ref, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) {
    if (isnan(a[i]) != isnan(ref[i])) return INFINITY;
    if (isnan(a[i])) continue;
    double d = (double)a[i] - ref[i];
    num += d * d;
    den += (double)ref[i] * ref[i];
  }
  return den > 0 ? sqrt(num / den) : sqrt(num);
}

static void report(const char *what, double err, double tol) {
  bool ok = err <= tol;
  printf("%-48s rel err %9.2e  (tol %.1e)  %s\n", what, err, tol,
         ok ? "ok" : "FAIL");
  if (!ok) failures++;
}

/* device buffer filled from host */
static void *up(const void *h, size_t bytes) {
  void *d = kern_alloc(gpu, bytes);
  if (!d || kern_upload(gpu, d, h, bytes)) {
    fprintf(stderr, "GPU allocation/upload of %zu bytes failed\n", bytes);
    exit(1);
  }
  return d;
}
static void down(void *h, const void *d, size_t bytes) {
  if (kern_download(gpu, h, d, bytes)) {
    fprintf(stderr, "GPU download failed\n");
    exit(1);
  }
}
static float *rnd(size_t n, float lo, float hi) {
  float *h = malloc(n * sizeof *h);
  for (size_t i = 0; i < n; i++) h[i] = frand(lo, hi);
  return h;
}

/* a GPU buffer of n floats set to NaN */
static float *dnan(size_t n) {
  float *h = malloc(n * sizeof *h);
  for (size_t i = 0; i < n; i++) h[i] = NAN;
  float *d = up(h, n * sizeof *h);
  free(h);
  return d;
}

/* Largest |got - ref| over the magnitude the element is summed from,
 * |alpha| sum_k |op(A)_ik op(B)_kj| + |beta C0_ij| (float64). */
static double gemm_err(const float *got, const float *ref, bool ta, bool tb,
                       int M, int N, int K, float alpha, const float *A,
                       const float *B, float beta, const float *C0) {
  double worst = 0;
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) {
      double mag = fabs((double)beta * C0[i * N + j]);
      for (int k = 0; k < K; k++)
        mag += fabs((double)alpha * (ta ? A[k * M + i] : A[i * K + k]) *
                    (tb ? B[j * K + k] : B[k * N + j]));
      double g = got[i * N + j], r = ref[i * N + j];
      if (isnan(g) != isnan(r)) return INFINITY;
      double e = fabs(g - r) / (mag > 0 ? mag : 1e-30);
      if (e > worst) worst = e;
    }
  return worst;
}

static void check_gemm(void) {
  const int M = 123, N = 77, K = 301;
  /* fp32 accumulation, any order, on either side: K 2^-24 each, doubled */
  const double acc = K * 0x1p-22;
  for (int p = 0; p < 3; p++)
    for (int t = 0; t < 4; t++) {
      bool ta = t & 1, tb = t & 2;
      float *A = rnd((size_t)M * K, -1, 1), *B = rnd((size_t)K * N, -1, 1);
      float *C0 = rnd((size_t)M * N, -1, 1), *Cc = malloc((size_t)M * N * 4),
            *Cg = malloc((size_t)M * N * 4);
      memcpy(Cc, C0, (size_t)M * N * 4);
      kern_gemm(cpu, ta, tb, M, N, K, 0.7f, A, B, 0.5f, Cc, (kern_prec)p);
      float *dA = up(A, (size_t)M * K * 4), *dB = up(B, (size_t)K * N * 4),
            *dC = up(C0, (size_t)M * N * 4);
      int rc = kern_gemm(gpu, ta, tb, M, N, K, 0.7f, dA, dB, 0.5f, dC,
                         (kern_prec)p);
      down(Cg, dC, (size_t)M * N * 4);
      char what[96];
      snprintf(what, sizeof what, "gemm %s ta=%d tb=%d (error / bound)",
               kern_prec_name((kern_prec)p), ta, tb);
      report(what, rc ? INFINITY
                      : gemm_err(Cg, Cc, ta, tb, M, N, K, 0.7f, A, B, 0.5f, C0),
             acc);
      if (p != KERN_F32) { /* against fp32: the input rounding on top */
        double u = p == KERN_BF16 ? 0x1p-8 : 0x1p-11;
        float *Cf = malloc((size_t)M * N * 4);
        memcpy(Cf, C0, (size_t)M * N * 4);
        kern_gemm(cpu, ta, tb, M, N, K, 0.7f, A, B, 0.5f, Cf, KERN_F32);
        snprintf(what, sizeof what, "gemm %s ta=%d tb=%d vs fp32",
                 kern_prec_name((kern_prec)p), ta, tb);
        report(what, gemm_err(Cg, Cf, ta, tb, M, N, K, 0.7f, A, B, 0.5f, C0),
               2 * u + u * u + acc);
        free(Cf);
      }
      kern_free(gpu, dA); kern_free(gpu, dB); kern_free(gpu, dC);
      free(A); free(B); free(C0); free(Cc); free(Cg);
    }
}

static void check_acts(void) {
  const int n = 67, d = 131;
  size_t N = (size_t)n * d;
  for (int a = 0; a < KERN_ACT__COUNT; a++) {
    float al = a == KERN_ACT_LEAKY_RELU ? 0.2f : 1.0f;
    float *z = rnd(N, -4, 4), *b = rnd((size_t)d, -1, 1), *dy = rnd(N, -1, 1);
    float *zc = malloc(N * 4), *yc = malloc(N * 4), *dzc = malloc(N * 4);
    float *yg = malloc(N * 4), *dzg = malloc(N * 4), *zg = malloc(N * 4);
    memcpy(zc, z, N * 4);
    kern_bias_act(cpu, zc, b, yc, n, d, (kern_act)a, al);
    kern_act_grad(cpu, dy, zc, yc, dzc, n, d, (kern_act)a, al);
    float *dz_ = up(z, N * 4), *db = up(b, (size_t)d * 4), *ddy = up(dy, N * 4);
    float *dyv = dnan(N), *ddz = dnan(N);
    int rc = kern_bias_act(gpu, dz_, db, dyv, n, d, (kern_act)a, al);
    rc |= kern_act_grad(gpu, ddy, dz_, dyv, ddz, n, d, (kern_act)a, al);
    down(yg, dyv, N * 4);
    down(dzg, ddz, N * 4);
    down(zg, dz_, N * 4);
    char what[96];
    snprintf(what, sizeof what, "bias+%s forward", kern_act_name((kern_act)a));
    report(what, rc ? INFINITY : fmax(relerr(yg, yc, N), relerr(zg, zc, N)), 2e-5);
    snprintf(what, sizeof what, "%s gradient", kern_act_name((kern_act)a));
    report(what, rc ? INFINITY : relerr(dzg, dzc, N), 2e-5);
    kern_free(gpu, dz_); kern_free(gpu, db); kern_free(gpu, ddy);
    kern_free(gpu, dyv); kern_free(gpu, ddz);
    free(z); free(b); free(dy); free(zc); free(yc); free(dzc); free(yg);
    free(dzg); free(zg);
  }
  /* column sums, large enough for several chunks */
  const int rn = 1000, rd = 300;
  float *dz = rnd((size_t)rn * rd, -1, 1), *dbc = rnd(rd, -1, 1), *dbg = malloc(rd * 4);
  float *g_dz = up(dz, (size_t)rn * rd * 4), *g_db = up(dbc, rd * 4);
  kern_col_sum(cpu, dz, rn, rd, 0.5f, dbc);
  int rc = kern_col_sum(gpu, g_dz, rn, rd, 0.5f, g_db);
  down(dbg, g_db, rd * 4);
  report("column sum (bias gradient)", rc ? INFINITY : relerr(dbg, dbc, rd), 1e-5);
  kern_free(gpu, g_dz); kern_free(gpu, g_db);
  free(dz); free(dbc); free(dbg);
}

static void check_losses(void) {
  const int n = 301, d = 7;
  for (int k = 0; k < KERN_LOSS__COUNT; k++) {
    bool sparse = k == KERN_LOSS_SPARSE_CCE_LOGITS || k == KERN_LOSS_SPARSE_CCE_PROBS;
    bool probs = k == KERN_LOSS_BCE_PROBS || k == KERN_LOSS_CCE_PROBS ||
                 k == KERN_LOSS_SPARSE_CCE_PROBS || k == KERN_LOSS_KLD;
    size_t N = (size_t)n * d, ny = sparse ? (size_t)n : N;
    float *p = rnd(N, probs ? 0.01f : -3, probs ? 0.99f : 3), *y = rnd(ny, 0, 1);
    if (sparse)
      for (int i = 0; i < n; i++) y[i] = (float)(i % d);
    float *ec = malloc((size_t)n * 4), *gc = malloc(N * 4), *eg = malloc((size_t)n * 4),
          *gg = malloc(N * 4);
    kern_loss_eval(cpu, (kern_loss)k, p, y, n, d, 0.125f, ec, gc);
    float *dp = up(p, N * 4), *dy = up(y, ny * 4), *de = dnan((size_t)n), *dg = dnan(N);
    int rc = kern_loss_eval(gpu, (kern_loss)k, dp, dy, n, d, 0.125f, de, dg);
    down(eg, de, (size_t)n * 4);
    down(gg, dg, N * 4);
    char what[96];
    snprintf(what, sizeof what, "loss %d values", k);
    report(what, rc ? INFINITY : relerr(eg, ec, (size_t)n), 1e-5);
    snprintf(what, sizeof what, "loss %d gradient", k);
    report(what, rc ? INFINITY : relerr(gg, gc, N), 1e-5);
    kern_free(gpu, dp); kern_free(gpu, dy); kern_free(gpu, de); kern_free(gpu, dg);
    free(p); free(y); free(ec); free(gc); free(eg); free(gg);
  }
}

static void check_embed_misc(void) {
  const int U = 500, dim = 48, nb = 800;
  float *rows = rnd((size_t)U * dim, -1, 1);
  int32_t *bag_off = malloc((nb + 1) * 4), *idx = malloc(nb * 4 * 4);
  bag_off[0] = 0;
  for (int b = 0; b < nb; b++) {
    int k = (int)frand(0, 4);
    for (int j = 0; j < k; j++) idx[bag_off[b] + j] = (int32_t)frand(0, U);
    bag_off[b + 1] = bag_off[b] + k;
  }
  int nidx = bag_off[nb];
  for (int pool = 0; pool < 2; pool++) {
    const int stride = dim + 5, off = 3;
    size_t no = (size_t)nb * stride;
    float *oc = rnd(no, 9, 9), *og = malloc(no * 4);
    float *d_out = up(oc, no * 4);
    kern_embed_gather(cpu, rows, dim, idx, bag_off, nb, (kern_pool)pool, oc, stride, off);
    float *d_rows = up(rows, (size_t)U * dim * 4);
    int32_t *d_idx = up(idx, (size_t)(nidx ? nidx : 1) * 4), *d_bo = up(bag_off, (nb + 1) * 4);
    int rc = kern_embed_gather(gpu, d_rows, dim, d_idx, d_bo, nb, (kern_pool)pool,
                               d_out, stride, off);
    down(og, d_out, no * 4);
    report(pool ? "embedding gather (mean)" : "embedding gather (sum)",
           rc ? INFINITY : relerr(og, oc, no), 1e-6);
    /* scatter: inverse lists by row */
    int32_t *occ_off = calloc(U + 1, 4), *occ_bag = malloc((size_t)(nidx ? nidx : 1) * 4);
    float *occ_w = malloc((size_t)(nidx ? nidx : 1) * 4);
    for (int j = 0; j < nidx; j++) occ_off[idx[j] + 1]++;
    for (int u = 0; u < U; u++) occ_off[u + 1] += occ_off[u];
    int32_t *pos = malloc((U + 1) * 4);
    memcpy(pos, occ_off, (U + 1) * 4);
    for (int b = 0; b < nb; b++) {
      int cnt = bag_off[b + 1] - bag_off[b];
      for (int j = bag_off[b]; j < bag_off[b + 1]; j++) {
        int q = pos[idx[j]]++;
        occ_bag[q] = b;
        occ_w[q] = pool && cnt ? 1.0f / cnt : 1.0f;
      }
    }
    float *dout = rnd(no, -1, 1), *gc = malloc((size_t)U * dim * 4), *gg = malloc((size_t)U * dim * 4);
    kern_embed_scatter(cpu, dout, stride, off, dim, occ_off, occ_bag, occ_w, U, gc);
    float *d_dout = up(dout, no * 4), *d_g = dnan((size_t)U * dim);
    int32_t *d_oo = up(occ_off, (U + 1) * 4), *d_ob = up(occ_bag, (size_t)(nidx ? nidx : 1) * 4);
    float *d_ow = up(occ_w, (size_t)(nidx ? nidx : 1) * 4);
    rc = kern_embed_scatter(gpu, d_dout, stride, off, dim, d_oo, d_ob, d_ow, U, d_g);
    down(gg, d_g, (size_t)U * dim * 4);
    report(pool ? "embedding scatter-add (mean)" : "embedding scatter-add (sum)",
           rc ? INFINITY : relerr(gg, gc, (size_t)U * dim), 1e-6);
    kern_free(gpu, d_out); kern_free(gpu, d_rows); kern_free(gpu, d_idx);
    kern_free(gpu, d_bo); kern_free(gpu, d_dout); kern_free(gpu, d_g);
    kern_free(gpu, d_oo); kern_free(gpu, d_ob); kern_free(gpu, d_ow);
    free(oc); free(og); free(occ_off); free(occ_bag); free(occ_w); free(pos);
    free(dout); free(gc); free(gg);
  }
  free(rows); free(bag_off); free(idx);
  /* rounding, finiteness, dropout, scale/axpy/mul */
  const size_t n = 100003;
  float *x = rnd(n, -70000, 70000);
  for (size_t i = 0; i < 1000; i++) x[i] = frand(-1e-6f, 1e-6f);
  for (int p = 1; p < 3; p++) {
    float *xc = malloc(n * 4), *xg = malloc(n * 4);
    memcpy(xc, x, n * 4);
    kern_round(cpu, xc, n, (kern_prec)p);
    float *dx = up(x, n * 4);
    int rc = kern_round(gpu, dx, n, (kern_prec)p);
    down(xg, dx, n * 4);
    size_t diff = 0;
    for (size_t i = 0; i < n; i++)
      diff += memcmp(&xc[i], &xg[i], 4) != 0;
    printf("%-48s %zu of %zu differ  %s\n",
           p == 1 ? "round to bf16 (bitwise)" : "round to fp16 (bitwise, overflow inf)",
           diff, n, diff || rc ? "FAIL" : "ok");
    failures += diff || rc;
    bool fc, fg;
    kern_all_finite(cpu, xc, n, &fc);
    kern_all_finite(gpu, dx, n, &fg);
    printf("%-48s cpu %d gpu %d  %s\n", "finiteness check", fc, fg, fc == fg ? "ok" : "FAIL");
    failures += fc != fg;
    kern_free(gpu, dx);
    free(xc); free(xg);
  }
  float *v = rnd(n, -1, 1), *vc = malloc(n * 4), *vg = malloc(n * 4), *mc = malloc(n * 4);
  memcpy(vc, v, n * 4);
  kern_dropout(cpu, vc, mc, n, 0.3f, 1234);
  float *dv = up(v, n * 4), *dm = dnan(n);
  int rc = kern_dropout(gpu, dv, dm, n, 0.3f, 1234);
  down(vg, dv, n * 4);
  report("dropout (same counter-based mask)", rc ? INFINITY : relerr(vg, vc, n), 0);
  float *w = rnd(n, -1, 1), *dw = up(w, n * 4);
  kern_axpy(cpu, vc, w, n, 0.5f);
  kern_scale(cpu, vc, n, 3.0f);
  kern_mul(cpu, vc, w, n);
  rc = kern_axpy(gpu, dv, dw, n, 0.5f) | kern_scale(gpu, dv, n, 3.0f) | kern_mul(gpu, dv, dw, n);
  down(vg, dv, n * 4);
  report("axpy, scale, mul", rc ? INFINITY : relerr(vg, vc, n), 1e-6);
  kern_free(gpu, dv); kern_free(gpu, dm); kern_free(gpu, dw);
  free(v); free(vc); free(vg); free(mc); free(w); free(x);
}

/* ---- whole steps -------------------------------------------------------- */
static tsr_model *mk_model(const char *json, const char *loss) {
  json_error_t je;
  json_t *j = json_loads(json, 0, &je);
  tsr_model *m = NULL;
  char err[512];
  if (!j || tsr_model_build(j, loss, NULL, 0, NULL, &m, err, sizeof err)) {
    fprintf(stderr, "model: %s\n", j ? err : je.text);
    exit(1);
  }
  json_decref(j);
  return m;
}

static char *mlp_json(const int *w, int nl, const char *hidden_act,
                      const char *out_act) {
  static char buf[8192];
  int o = snprintf(buf, sizeof buf,
                   "{\"class_name\": \"Sequential\", \"config\": {\"layers\": ["
                   "{\"class_name\": \"InputLayer\", \"config\": "
                   "{\"batch_input_shape\": [null, %d]}}", w[0]);
  for (int l = 1; l < nl; l++)
    o += snprintf(buf + o, sizeof buf - (size_t)o,
                  ", {\"class_name\": \"Dense\", \"config\": {\"units\": %d, "
                  "\"activation\": \"%s\"}}",
                  w[l], l == nl - 1 ? out_act : hidden_act);
  snprintf(buf + o, sizeof buf - (size_t)o, "]}}");
  return buf;
}

typedef struct {
  int nv;
  float *full[64], *p[64], *g[64];
  int64_t ne[64];
} params_t;

static void stage(const tsr_model *m, wk_exec *e, params_t *pt, uint64_t seed) {
  const tsr_var *vi;
  size_t nv;
  tsr_model_variables(m, &vi, &nv);
  pt->nv = (int)nv;
  for (size_t v = 0; v < nv; v++) {
    if (!pt->full[v]) {
      pt->full[v] = malloc((size_t)vi[v].numel * 4);
      tsr_model_init_var(m, (int)v, seed, 0, pt->full[v], (size_t)vi[v].numel);
      for (int64_t i = 0; i < vi[v].numel; i++) pt->full[v][i] += frand(-0.05f, 0.05f);
    }
    const int64_t *ids;
    int64_t nr;
    wk_exec_rows(e, (int)v, &ids, &nr);
    pt->ne[v] = vi[v].kind == TSR_VAR_DENSE ? vi[v].numel : nr * vi[v].row_dim;
    free(pt->p[v]);
    free(pt->g[v]);
    pt->p[v] = malloc((size_t)(pt->ne[v] ? pt->ne[v] : 1) * 4);
    pt->g[v] = malloc((size_t)(pt->ne[v] ? pt->ne[v] : 1) * 4);
    for (int64_t i = 0; i < pt->ne[v]; i++) pt->g[v][i] = NAN;
    if (vi[v].kind == TSR_VAR_DENSE)
      memcpy(pt->p[v], pt->full[v], (size_t)pt->ne[v] * 4);
    else
      for (int64_t u = 0; u < nr; u++)
        memcpy(pt->p[v] + u * vi[v].row_dim, pt->full[v] + ids[u] * vi[v].row_dim,
               (size_t)vi[v].row_dim * 4);
  }
}

static void free_params(params_t *pt, bool full) {
  for (int v = 0; v < 64; v++) {
    if (full) free(pt->full[v]);
    free(pt->p[v]);
    free(pt->g[v]);
    pt->p[v] = pt->g[v] = NULL;
  }
}

/* a batch with dense features, sparse ids and labels */
static wk_batch mk_batch(int64_t n, int64_t nd, int ns, int64_t vocab, int classes) {
  wk_batch b = {.n = n, .n_dense = nd, .n_sparse = ns};
  b.x = malloc((size_t)(n * (nd ? nd : 1)) * 4);
  b.y = malloc((size_t)n * 4);
  for (int64_t i = 0; i < n * nd; i++) b.x[i] = frand(-1, 1);
  for (int64_t i = 0; i < n; i++) b.y[i] = (float)(int)frand(0, (float)classes);
  if (ns) {
    b.ids = calloc((size_t)ns, sizeof *b.ids);
    b.offsets = calloc((size_t)ns, sizeof *b.offsets);
    for (int f = 0; f < ns; f++) {
      b.offsets[f] = malloc((size_t)(n + 1) * 8);
      b.ids[f] = malloc((size_t)n * 3 * 8);
      b.offsets[f][0] = 0;
      for (int64_t i = 0; i < n; i++) {
        int k = (int)frand(1, 4);
        for (int j = 0; j < k; j++)
          b.ids[f][b.offsets[f][i] + j] = (int64_t)frand(0, (float)vocab);
        b.offsets[f][i + 1] = b.offsets[f][i] + k;
      }
    }
  }
  return b;
}

static void free_batch(wk_batch *b) {
  for (int f = 0; f < b->n_sparse; f++) {
    free(b->offsets[f]);
    free(b->ids[f]);
  }
  free(b->offsets);
  free(b->ids);
  free(b->x);
  free(b->y);
}

/* nudge: every parameter of the second side one ulp away, at random. An
 * fp32 difference this size is what another summation order gives the
 * GPU's activations; in 16 bits it flips the rounding of a few inputs of
 * the next product. The CPU self-test runs it to show the tolerances hold
 * with that margin (worst gradients measured so, over several draws: up to
 * 4e-3 in 16 bits, 1e-6 in fp32). */
static void step_compare_n(const char *name, const char *json,
                           const char *loss, wk_batch *b, kern_prec prec,
                           bool nudge) {
  tsr_model *m = mk_model(json, loss);
  char err[512];
  wk_exec *ec, *eg;
  if (wk_exec_open(m, cpu, b->n, prec, &ec, err, sizeof err) ||
      wk_exec_open(m, gpu, b->n, prec, &eg, err, sizeof err)) {
    fprintf(stderr, "%s: %s\n", name, err);
    exit(1);
  }
  if (wk_exec_prepare(ec, b, 0, b->n, NULL, err, sizeof err) ||
      wk_exec_prepare(eg, b, 0, b->n, NULL, err, sizeof err)) {
    fprintf(stderr, "%s: %s\n", name, err);
    exit(1);
  }
  params_t pc = {0}, pg = {0};
  stage(m, ec, &pc, 7);
  for (int v = 0; v < pc.nv; v++) pg.full[v] = pc.full[v];
  stage(m, eg, &pg, 7);
  if (nudge)
    for (int v = 0; v < pg.nv; v++)
      for (int64_t i = 0; i < pg.ne[v]; i++)
        pg.p[v][i] = nextafterf(pg.p[v][i], frand(-1, 1) > 0 ? INFINITY
                                                              : -INFINITY);
  wk_run_opts o = {.train = true, .grad_scale = 1.0f / (float)b->n, .seed = 3};
  wk_run_result rc_, rg_;
  int r1 = wk_exec_run(ec, pc.p, pc.g, &o, &rc_);
  double lc = rc_.loss_sum;
  int r2 = wk_exec_run(eg, pg.p, pg.g, &o, &rg_);
  double tol = prec == KERN_F32 ? 1e-4 : 1e-2;
  char what[128];
  snprintf(what, sizeof what, "step %s %s%s: loss", name, kern_prec_name(prec),
           nudge ? " nudged" : "");
  report(what, r1 || r2 ? INFINITY : fabs(rg_.loss_sum - lc) / fmax(fabs(lc), 1e-12), tol);
  double worst = 0;
  for (int v = 0; v < pc.nv; v++) {
    double e = relerr(pg.g[v], pc.g[v], (size_t)pc.ne[v]);
    if (e > worst) worst = e;
  }
  snprintf(what, sizeof what, "step %s %s%s: gradients (worst variable)",
           name, kern_prec_name(prec), nudge ? " nudged" : "");
  report(what, r1 || r2 ? INFINITY : worst, tol);
  for (int v = 0; v < pc.nv; v++) pg.full[v] = NULL;
  free_params(&pc, true);
  free_params(&pg, false);
  wk_exec_close(ec);
  wk_exec_close(eg);
  tsr_model_free(m);
}

static void step_compare(const char *name, const char *json, const char *loss,
                         wk_batch *b, kern_prec prec) {
  step_compare_n(name, json, loss, b, prec, false);
  if (getenv("TSR_GPU_CHECK_ON_CPU"))
    step_compare_n(name, json, loss, b, prec, true);
}

static const char *wide_json =
    "{\"builtin\": \"wide_deep\", \"dense_features\": 13, \"sparse_features\": 4,"
    " \"vocab\": 1000, \"embedding_dim\": 16, \"hidden\": [64, 32]}";

/* Conv2D (same and strided), pooling, BatchNormalization, ReLU and
 * Dropout layers, regularizers */
static const char *cnn_json =
    "{\"class_name\": \"Sequential\", \"config\": {\"layers\": ["
    "{\"class_name\": \"InputLayer\", \"config\": {\"batch_input_shape\":"
    " [null, 12, 12, 3]}},"
    "{\"class_name\": \"Conv2D\", \"config\": {\"filters\": 8, "
    "\"kernel_size\": 3, \"padding\": \"same\", \"activation\": \"relu\","
    " \"kernel_regularizer\": {\"class_name\": \"L2\", \"config\": "
    "{\"l2\": 0.01}}}},"
    "{\"class_name\": \"MaxPooling2D\", \"config\": {}},"
    "{\"class_name\": \"Conv2D\", \"config\": {\"filters\": 16, "
    "\"kernel_size\": 3, \"strides\": 2, \"use_bias\": false}},"
    "{\"class_name\": \"BatchNormalization\", \"config\": {}},"
    "{\"class_name\": \"ReLU\", \"config\": {}},"
    "{\"class_name\": \"AveragePooling2D\", \"config\": {\"padding\": "
    "\"same\"}},"
    "{\"class_name\": \"Flatten\", \"config\": {}},"
    "{\"class_name\": \"Dropout\", \"config\": {\"rate\": 0.3}},"
    "{\"class_name\": \"Dense\", \"config\": {\"units\": 10, "
    "\"activation\": \"softmax\"}}]}}";

/* Functional: a residual block, Concatenate, LayerNormalization, GAP */
#define FL(cls, nm, cfg, ins)                                              \
  "{\"class_name\": \"" cls "\", \"name\": \"" nm "\", \"config\": "   \
  "{\"name\": \"" nm "\"" cfg "}, \"inbound_nodes\": [[" ins "]]}"
#define FR(nm) "[\"" nm "\", 0, 0, {}]"
static const char *res_json =
    "{\"class_name\": \"Functional\", \"config\": {\"layers\": ["
    "{\"class_name\": \"InputLayer\", \"name\": \"img\", \"config\": "
    "{\"name\": \"img\", \"batch_input_shape\": [null, 12, 12, 3]}, "
    "\"inbound_nodes\": []}, "
    FL("Conv2D", "c1", ", \"filters\": 6, \"kernel_size\": 3, "
       "\"padding\": \"same\", \"activation\": \"relu\"", FR("img")) ", "
    FL("Conv2D", "c2", ", \"filters\": 6, \"kernel_size\": 3, "
       "\"padding\": \"same\"", FR("c1")) ", "
    FL("Add", "add", "", FR("c1") ", " FR("c2")) ", "
    FL("Concatenate", "cat", "", FR("add") ", " FR("img")) ", "
    FL("LayerNormalization", "ln", "", FR("cat")) ", "
    FL("GlobalAveragePooling2D", "gap", "", FR("ln")) ", "
    FL("Dense", "out", ", \"units\": 10, \"activation\": \"softmax\"",
       FR("gap"))
    "], \"input_layers\": [[\"img\", 0, 0]], \"output_layers\": "
    "[[\"out\", 0, 0]]}}";

/* Conv1D, Bidirectional GRU, self-attention, Attention, TimeDistributed
 * and an LSTM over a (12, 36) sequence, as tf_keras writes it. The
 * attention has no biases: the key's bias has a gradient of exactly zero
 * in exact arithmetic (the softmax ignores a constant per row), so its
 * rounding noise has no scale to be judged against. */
static const char *seq_json =
    "{\"class_name\": \"Functional\", \"config\": {\"layers\": ["
    "{\"class_name\": \"InputLayer\", \"name\": \"x\", \"config\": "
    "{\"batch_input_shape\": [null, 12, 36], \"name\": \"x\"}, "
    "\"inbound_nodes\": []},"
    "{\"class_name\": \"Conv1D\", \"name\": \"c\", \"config\": {\"name\": "
    "\"c\", \"filters\": 16, \"kernel_size\": [3], \"padding\": \"same\", "
    "\"activation\": \"relu\"}, \"inbound_nodes\": [[[\"x\", 0, 0, {}]]]},"
    "{\"class_name\": \"Bidirectional\", \"name\": \"b\", \"config\": "
    "{\"name\": \"b\", \"layer\": {\"class_name\": \"GRU\", \"config\": "
    "{\"name\": \"gru\", \"units\": 8, \"return_sequences\": true}}}, "
    "\"inbound_nodes\": [[[\"c\", 0, 0, {}]]]},"
    "{\"class_name\": \"MultiHeadAttention\", \"name\": \"m\", \"config\": "
    "{\"name\": \"m\", \"num_heads\": 2, \"key_dim\": 4, \"use_bias\": false}, "
    "\"inbound_nodes\": "
    "[[[\"b\", 0, 0, {\"value\": [\"b\", 0, 0]}]]]},"
    "{\"class_name\": \"Attention\", \"name\": \"a\", \"config\": {\"name\": "
    "\"a\", \"use_scale\": true}, \"inbound_nodes\": [[[\"m\", 0, 0, {}], "
    "[\"b\", 0, 0, {}]]]},"
    "{\"class_name\": \"TimeDistributed\", \"name\": \"t\", \"config\": "
    "{\"name\": \"t\", \"layer\": {\"class_name\": \"Dense\", \"config\": "
    "{\"name\": \"d\", \"units\": 8, \"activation\": \"tanh\"}}}, "
    "\"inbound_nodes\": [[[\"a\", 0, 0, {}]]]},"
    "{\"class_name\": \"LSTM\", \"name\": \"l\", \"config\": {\"name\": "
    "\"l\", \"units\": 8}, \"inbound_nodes\": [[[\"t\", 0, 0, {}]]]},"
    "{\"class_name\": \"Dense\", \"name\": \"out\", \"config\": {\"name\": "
    "\"out\", \"units\": 10, \"activation\": \"softmax\"}, "
    "\"inbound_nodes\": [[[\"l\", 0, 0, {}]]]}], "
    "\"input_layers\": [[\"x\", 0, 0]], \"output_layers\": [[\"out\", 0, 0]]}}";

static void check_steps(void) {
  const int w[] = {784, 256, 128, 10};
  wk_batch b = mk_batch(256, 784, 0, 0, 10);
  for (int p = 0; p < 3; p++)
    step_compare("mlp", mlp_json(w, 4, "relu", "softmax"),
                 "sparse_categorical_crossentropy", &b, (kern_prec)p);
  const int w2[] = {784, 64, 1};
  step_compare("mlp gelu-tanh mse", mlp_json(w2, 3, "gelu", "tanh"),
               "mse", &b, KERN_F32);
  wk_batch c = mk_batch(512, 13, 4, 1000, 2);
  for (int p = 0; p < 3; p++)
    step_compare("wide_deep", wide_json, "binary_crossentropy", &c, (kern_prec)p);
  wk_batch im = mk_batch(64, 12 * 12 * 3, 0, 0, 10);
  for (int p = 0; p < 2; p++)
    step_compare("cnn+bn", cnn_json, "sparse_categorical_crossentropy", &im,
                 (kern_prec)p);
  step_compare("residual+layernorm", res_json,
               "sparse_categorical_crossentropy", &im, KERN_F32);
  step_compare("conv1d+bigru+attention+lstm", seq_json,
               "sparse_categorical_crossentropy", &im, KERN_F32);
  free_batch(&b);
  free_batch(&c);
  free_batch(&im);
}

/* several GPUs: two replicas on halves, NCCL-summed, against one GPU */
static void check_replicas(int ngpu) {
  if (ngpu < 2) {
    printf("%-48s skipped: %d GPU visible\n", "replicas with NCCL", ngpu);
    return;
  }
  tsr_model *m = mk_model(wide_json, "binary_crossentropy");
  char err[512];
  kern_opts o1 = {.device = KERN_DEVICE_GPU, .gpu_index = 1};
  kern_ctx *g1;
  if (kern_open(&o1, &g1, err, sizeof err)) {
    fprintf(stderr, "GPU 1: %s\n", err);
    failures++;
    return;
  }
  wk_batch b = mk_batch(512, 13, 4, 1000, 2);
  wk_exec *one, *plan, *r0, *r1;
  wk_exec_open(m, gpu, 512, KERN_F32, &one, err, sizeof err);
  wk_exec_open(m, cpu, 512, KERN_F32, &plan, err, sizeof err);
  wk_exec_open(m, gpu, 256, KERN_F32, &r0, err, sizeof err);
  wk_exec_open(m, g1, 256, KERN_F32, &r1, err, sizeof err);
  wk_exec_prepare(one, &b, 0, 512, NULL, err, sizeof err);
  wk_exec_prepare(plan, &b, 0, 512, NULL, err, sizeof err);
  wk_exec_prepare(r0, &b, 0, 256, plan, err, sizeof err);
  wk_exec_prepare(r1, &b, 256, 512, plan, err, sizeof err);
  params_t p1 = {0}, pr = {0};
  stage(m, one, &p1, 9);
  for (int v = 0; v < p1.nv; v++) pr.full[v] = p1.full[v];
  stage(m, r0, &pr, 9);
  wk_run_opts o = {.train = true, .grad_scale = 1.0f / 512, .seed = 1};
  wk_run_result res;
  int rc = wk_exec_run(one, p1.p, p1.g, &o, &res);
  o.keep_on_device = true;
  rc |= wk_exec_run(r0, pr.p, pr.g, &o, &res);
  rc |= wk_exec_run(r1, pr.p, pr.g, &o, &res);
  wk_exec *reps[2] = {r0, r1};
  rc |= wk_exec_allreduce(reps, 2);
  rc |= wk_exec_fetch_grads(r0, pr.g);
  double worst = 0;
  for (int v = 0; v < p1.nv; v++) {
    double e = relerr(pr.g[v], p1.g[v], (size_t)p1.ne[v]);
    worst = e > worst ? e : worst;
  }
  report("2 replicas, NCCL sum vs one GPU", rc ? INFINITY : worst, 1e-5);
  for (int v = 0; v < p1.nv; v++) pr.full[v] = NULL;
  free_params(&p1, true);
  free_params(&pr, false);
  wk_exec_close(one); wk_exec_close(plan); wk_exec_close(r0); wk_exec_close(r1);
  kern_close(g1);
  tsr_model_free(m);
}

/* ---- benchmark ----------------------------------------------------------- */
static int cmpd(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static void bench(const char *name, const int *w, int nl, int64_t n,
                  kern_prec prec, int reps) {
  tsr_model *m = mk_model(mlp_json(w, nl, "relu", "softmax"),
                         "sparse_categorical_crossentropy");
  char err[512];
  wk_exec *e;
  if (wk_exec_open(m, gpu, n, prec, &e, err, sizeof err)) {
    fprintf(stderr, "%s: %s\n", name, err);
    failures++;
    return;
  }
  wk_batch b = mk_batch(n, w[0], 0, 0, w[nl - 1]);
  wk_exec_prepare(e, &b, 0, n, NULL, err, sizeof err);
  params_t p = {0};
  stage(m, e, &p, 1);
  wk_run_opts o = {.train = true, .grad_scale = 1.0f / (float)n, .seed = 1,
                   .keep_on_device = true};
  wk_run_result r;
  if (wk_exec_run(e, p.p, p.g, &o, &r)) {
    fprintf(stderr, "%s: step failed\n", name);
    failures++;
    return;
  }
  o.params_resident = true;
  /* the step's products through cuBLAS on buffers of the same sizes */
  int64_t maxw = 0;
  for (int l = 0; l < nl; l++) maxw = w[l] > maxw ? w[l] : maxw;
  size_t big = (size_t)(maxw * (maxw > n ? maxw : n));
  float *hb = rnd(big, -1, 1);
  float *A = up(hb, big * 4), *B = up(hb, big * 4), *C = up(hb, big * 4);
  free(hb);
  double flops = 0;
  for (int l = 0; l + 1 < nl; l++) {
    flops += 2.0 * n * w[l + 1] * w[l] * (l == 0 ? 2 : 3);
  }
  double *ts = malloc((size_t)reps * sizeof *ts), *tg = malloc((size_t)reps * sizeof *tg);
  for (int it = -3; it < reps; it++) {
    kern_sync(gpu);
    double t0 = now();
    for (int l = 0; l + 1 < nl; l++) {
      kern_gemm(gpu, false, false, n, w[l + 1], w[l], 1, A, B, 0, C, prec);
      kern_gemm(gpu, true, false, w[l], w[l + 1], n, 1, A, B, 0, C, prec);
      if (l > 0) kern_gemm(gpu, false, true, n, w[l], w[l + 1], 1, A, B, 0, C, prec);
    }
    kern_sync(gpu);
    double t1 = now();
    wk_exec_run(e, p.p, p.g, &o, &r);
    kern_sync(gpu);
    double t2 = now();
    if (it >= 0) {
      tg[it] = t1 - t0;
      ts[it] = t2 - t1;
    }
  }
  qsort(ts, (size_t)reps, sizeof *ts, cmpd);
  qsort(tg, (size_t)reps, sizeof *tg, cmpd);
  double step = ts[reps / 2], gemm = tg[reps / 2];
  printf("%-40s %s  products %8.3f ms %8.1f TFLOP/s | step %8.3f ms %8.1f TFLOP/s\n",
         name, kern_prec_name(prec), gemm * 1e3, flops / gemm * 1e-12,
         step * 1e3, flops / step * 1e-12);
  printf("RATIO gpu_%s_step_vs_cublas %.3f goal 0.8\n", name, gemm / step);
  kern_free(gpu, A); kern_free(gpu, B); kern_free(gpu, C);
  free_params(&p, true);
  free(ts); free(tg);
  wk_exec_close(e);
  tsr_model_free(m);
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc == 4 && !strcmp(argv[1], "--nccl-rank"))
    return gpu_check_nccl_rank(atoi(argv[2]), argv[3]);
  bool bench_only = argc > 1 && !strcmp(argv[1], "--bench-only");
  bool no_bench = argc > 1 && !strcmp(argv[1], "--no-bench");
  char err[512];
  kern_opts oc = {.device = KERN_DEVICE_CPU}, og = {.device = KERN_DEVICE_GPU};
  /* harness self-test on a machine without a GPU: both sides on the CPU */
  if (getenv("TSR_GPU_CHECK_ON_CPU")) og.device = KERN_DEVICE_CPU;
  if (kern_open(&oc, &cpu, err, sizeof err) || kern_open(&og, &gpu, err, sizeof err)) {
    fprintf(stderr, "gpu_check: %s\n", err);
    return 2;
  }
  int ngpu = 0;
  kern_gpu_count(&og, &ngpu, err, sizeof err);
  printf("backends: %s and %s (GPUs visible: %d), OpenBLAS %s\n",
         kern_backend_name(cpu), kern_backend_name(gpu), ngpu, kern_cpu_corename());
  if (!bench_only) {
    check_gemm();
    check_acts();
    check_losses();
    check_embed_misc();
    failures += gpu_check_nn(cpu, gpu);
    failures += gpu_check_seq(cpu, gpu);
    check_steps();
    check_replicas(ngpu);
    failures += gpu_check_nccl(gpu, ngpu, "/proc/self/exe");
  }
  if (!no_bench) {
    const int small[] = {784, 1024, 1024, 10};
    bench("mlp_784_1024_1024_10_b256", small, 4, 256, KERN_F32, 50);
    bench("mlp_784_1024_1024_10_b256_bf16", small, 4, 256, KERN_BF16, 50);
    const int large[] = {8192, 8192, 8192, 8192, 10};
    if (!getenv("TSR_GPU_CHECK_ON_CPU")) /* hours on a CPU */
      bench("mlp_8192x3_b4096_bf16", large, 5, 4096, KERN_BF16, 10);
  }
  printf("gpu_check: %d failure(s)\n", failures);
  kern_close(gpu);
  kern_close(cpu);
  return failures ? 1 : 0;
}
