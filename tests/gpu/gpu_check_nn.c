/* gpu_check's comparisons of kern_nn.h's ops (convolution, pooling,
 * normalization, column copies, regularizer gradient): each op on random
 * inputs on both backends, GPU outputs poisoned with NaN first so an
 * unwritten element fails, ||gpu - cpu|| / ||cpu|| within fp32 rounding
 * (sums run in other orders on the GPU); max-pooling winners must be
 * identical. Called from gpu_check.c's main; returns the failure count. */
#include "kernels/kern_nn.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int gpu_check_nn(kern_ctx *cpu, kern_ctx *gpu);

static int fails;
static kern_ctx *C_, *G_;
static uint64_t rs = 0xD1B54A32D192ED03ull;

static float fr(float lo, float hi) {
  rs ^= rs << 13;
  rs ^= rs >> 7;
  rs ^= rs << 17;
  return lo + (hi - lo) * (float)((double)(rs >> 11) / 9007199254740992.0);
}

static float *rnd(size_t n, float lo, float hi) {
  float *h = malloc((n ? n : 1) * sizeof *h);
  for (size_t i = 0; i < n; i++) h[i] = fr(lo, hi);
  return h;
}

static void *up(const void *h, size_t bytes) {
  void *d = kern_alloc(G_, bytes ? bytes : 4);
  if (!d || kern_upload(G_, d, h, bytes)) {
    fprintf(stderr, "GPU allocation/upload of %zu bytes failed\n", bytes);
    exit(1);
  }
  return d;
}

static float *dnan(size_t n) {
  float *h = malloc((n ? n : 1) * sizeof *h);
  for (size_t i = 0; i < n; i++) h[i] = NAN;
  float *d = up(h, n * sizeof *h);
  free(h);
  return d;
}

static float *down(const float *d, size_t n) {
  float *h = malloc((n ? n : 1) * sizeof *h);
  if (kern_download(G_, h, d, n * sizeof *h)) {
    fprintf(stderr, "GPU download failed\n");
    exit(1);
  }
  return h;
}

static double relerr(const float *a, const float *ref, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) {
    if (isnan(a[i]) != isnan(ref[i])) return INFINITY;
    double d = (double)a[i] - ref[i];
    num += d * d;
    den += (double)ref[i] * ref[i];
  }
  return den > 0 ? sqrt(num / den) : sqrt(num);
}

static void report(const char *what, int rc, double err, double tol) {
  bool ok = rc == 0 && err <= tol;
  printf("%-48s rel err %9.2e  (tol %.0e)  %s\n", what, rc ? INFINITY : err,
         tol, ok ? "ok" : "FAIL");
  if (!ok) fails++;
}

/* compares device buffer d (n floats) with host ref, then frees d */
static void cmp(const char *what, int rc, float *d, const float *ref,
                size_t n, double tol) {
  float *h = down(d, n);
  report(what, rc, relerr(h, ref, n), tol);
  free(h);
  kern_free(G_, d);
}

static void check_conv_pool(int64_t h, int64_t w, int64_t c, int64_t kh,
                            int64_t kw, int64_t s, bool same) {
  kern_win g;
  if (kern_win_make(&g, h, w, c, kh, kw, s, s, same)) {
    printf("window %lldx%lld on %lldx%lld: no output\n", (long long)kh,
           (long long)kw, (long long)h, (long long)w);
    fails++;
    return;
  }
  const int64_t n = 5;
  size_t nx = (size_t)(n * h * w * c), nc = (size_t)(n * g.oh * g.ow) *
                                            (size_t)kern_win_patch(&g);
  size_t ny = (size_t)(n * g.oh * g.ow * c);
  char what[128];
  float *x = rnd(nx, -1, 1), *dcols = rnd(nc, -1, 1), *dx0 = rnd(nx, -1, 1);
  float *dx_g = up(x, nx * 4), *cols_ref = malloc(nc * 4);
  kern_im2col(C_, &g, n, x, cols_ref);
  float *cols_g = dnan(nc);
  int rc = kern_im2col(G_, &g, n, dx_g, cols_g);
  snprintf(what, sizeof what, "im2col %lldx%lld s%lld %s", (long long)kh,
           (long long)kw, (long long)s, same ? "same" : "valid");
  cmp(what, rc, cols_g, cols_ref, nc, 0);
  for (int beta = 0; beta < 2; beta++) {
    float *ref = malloc(nx * 4);
    memcpy(ref, dx0, nx * 4);
    kern_col2im(C_, &g, n, dcols, (float)beta, ref);
    float *dc = up(dcols, nc * 4), *dd = beta ? up(dx0, nx * 4) : dnan(nx);
    rc = kern_col2im(G_, &g, n, dc, (float)beta, dd);
    snprintf(what, sizeof what, "col2im %lldx%lld s%lld %s beta %d",
             (long long)kh, (long long)kw, (long long)s, same ? "same" : "valid",
             beta);
    cmp(what, rc, dd, ref, nx, 1e-6);
    kern_free(G_, dc);
    free(ref);
  }
  for (int k = 0; k < 2; k++) {
    kern_pool2d kind = (kern_pool2d)k;
    float *y = malloc(ny * 4), *dy = rnd(ny, -1, 1), *dx = malloc(nx * 4);
    int32_t *arg = malloc(ny * 4);
    kern_pool2d_fwd(C_, &g, n, kind, x, y, arg);
    kern_pool2d_grad(C_, &g, n, kind, dy, arg, 0.0f, dx);
    float *yg = dnan(ny);
    int32_t *ag = kern_alloc(G_, ny * 4);
    rc = kern_pool2d_fwd(G_, &g, n, kind, dx_g, yg, ag);
    snprintf(what, sizeof what, "%s pool %lldx%lld s%lld %s forward",
             k ? "avg" : "max", (long long)kh, (long long)kw, (long long)s,
             same ? "same" : "valid");
    cmp(what, rc, yg, y, ny, 1e-6);
    if (kind == KERN_POOL2D_MAX) {
      int32_t *ah = malloc(ny * 4);
      kern_download(G_, ah, ag, ny * 4);
      size_t diff = 0;
      for (size_t i = 0; i < ny; i++) diff += ah[i] != arg[i];
      printf("%-48s %zu of %zu differ  %s\n", "max pool winners", diff, ny,
             diff ? "FAIL" : "ok");
      fails += diff != 0;
      free(ah);
    }
    float *dyg = up(dy, ny * 4), *dxg = dnan(nx);
    rc = kern_pool2d_grad(G_, &g, n, kind, dyg, ag, 0.0f, dxg);
    snprintf(what, sizeof what, "%s pool %lldx%lld s%lld %s backward",
             k ? "avg" : "max", (long long)kh, (long long)kw, (long long)s,
             same ? "same" : "valid");
    cmp(what, rc, dxg, dx, nx, 1e-6);
    kern_free(G_, dyg);
    kern_free(G_, ag);
    free(y);
    free(dy);
    free(dx);
    free(arg);
  }
  kern_free(G_, dx_g);
  free(x);
  free(dcols);
  free(dx0);
  free(cols_ref);
}

static void check_norms(void) {
  const int64_t rows = 3001, c = 37;
  size_t N = (size_t)(rows * c);
  float *x = rnd(N, -2, 3), *dy = rnd(N, -1, 1), *gamma = rnd((size_t)c, 0.5f, 1.5f);
  float *beta = rnd((size_t)c, -1, 1), *dx0 = rnd(N, -1, 1);
  float mean[64], var[64];
  kern_moments(C_, x, rows, c, mean, var);
  float *gx = up(x, N * 4), *gm = dnan((size_t)c), *gv = dnan((size_t)c);
  int rc = kern_moments(G_, gx, rows, c, gm, gv);
  cmp("batch norm moments: mean", rc, gm, mean, (size_t)c, 1e-6);
  cmp("batch norm moments: variance", rc, gv, var, (size_t)c, 1e-6);
  float *y = malloc(N * 4);
  kern_bn_apply(C_, x, rows, c, mean, var, 1e-3f, gamma, beta, y);
  float *pm = up(mean, (size_t)c * 4), *pv = up(var, (size_t)c * 4);
  float *pg = up(gamma, (size_t)c * 4), *pb = up(beta, (size_t)c * 4);
  float *gy = dnan(N);
  rc = kern_bn_apply(G_, gx, rows, c, pm, pv, 1e-3f, pg, pb, gy);
  cmp("batch norm apply", rc, gy, y, N, 1e-6);
  float *dx = malloc(N * 4), dg[64], db[64];
  memcpy(dx, dx0, N * 4);
  kern_bn_grad(C_, dy, x, rows, c, mean, var, 1e-3f, gamma, 1.0f, dx, dg, db);
  float *gdy = up(dy, N * 4), *gdx = up(dx0, N * 4);
  float *gdg = dnan((size_t)c), *gdb = dnan((size_t)c);
  rc = kern_bn_grad(G_, gdy, gx, rows, c, pm, pv, 1e-3f, pg, 1.0f, gdx, gdg,
                    gdb);
  cmp("batch norm backward: dx (added)", rc, gdx, dx, N, 1e-5);
  cmp("batch norm backward: dgamma", rc, gdg, dg, (size_t)c, 1e-5);
  cmp("batch norm backward: dbeta", rc, gdb, db, (size_t)c, 1e-5);
  /* layer norm over rows of c */
  float *lm = malloc((size_t)rows * 4), *lr = malloc((size_t)rows * 4);
  kern_ln_fwd(C_, x, rows, c, 1e-3f, gamma, beta, y, lm, lr);
  float *glm = dnan((size_t)rows), *glr = dnan((size_t)rows);
  gy = dnan(N);
  rc = kern_ln_fwd(G_, gx, rows, c, 1e-3f, pg, pb, gy, glm, glr);
  cmp("layer norm forward", rc, gy, y, N, 1e-6);
  float *hm = down(glm, (size_t)rows), *hr = down(glr, (size_t)rows);
  report("layer norm mean and rstd", rc,
         fmax(relerr(hm, lm, (size_t)rows), relerr(hr, lr, (size_t)rows)),
         1e-6);
  free(hm);
  free(hr);
  memset(dx, 0, N * 4);
  kern_ln_grad(C_, dy, x, rows, c, lm, lr, gamma, 0.0f, dx, dg, db);
  gdx = dnan(N);
  gdg = dnan((size_t)c);
  gdb = dnan((size_t)c);
  rc = kern_ln_grad(G_, gdy, gx, rows, c, glm, glr, pg, 0.0f, gdx, gdg, gdb);
  cmp("layer norm backward: dx", rc, gdx, dx, N, 1e-5);
  cmp("layer norm backward: dgamma", rc, gdg, dg, (size_t)c, 1e-5);
  cmp("layer norm backward: dbeta", rc, gdb, db, (size_t)c, 1e-5);
  /* global average pooling */
  const int64_t n = 23, p = 130; /* n * p * c <= rows * c */
  float *gy2 = malloc((size_t)(n * c) * 4);
  kern_mean_mid(C_, x, n, p, c, gy2);
  float *gg = dnan((size_t)(n * c));
  rc = kern_mean_mid(G_, gx, n, p, c, gg);
  cmp("global average pooling", rc, gg, gy2, (size_t)(n * c), 1e-6);
  memcpy(dx, dx0, N * 4);
  kern_mean_mid_grad(C_, dy, n, p, c, 1.0f, dx);
  gdx = up(dx0, N * 4);
  rc = kern_mean_mid_grad(G_, gdy, n, p, c, 1.0f, gdx);
  cmp("global average pooling backward (added)", rc, gdx, dx,
      (size_t)(n * p * c), 1e-6);
  /* column copies and the regularizer gradient */
  float *dst = rnd(N, -1, 1), *ref = malloc(N * 4);
  for (int b = 0; b < 2; b++) {
    memcpy(ref, dst, N * 4);
    kern_copy_cols(C_, rows, 11, x, c, 7, (float)b, ref, c, 20);
    float *gd = up(dst, N * 4);
    rc = kern_copy_cols(G_, rows, 11, gx, c, 7, (float)b, gd, c, 20);
    cmp(b ? "column copy (added)" : "column copy", rc, gd, ref, N, 0);
  }
  memcpy(ref, dst, N * 4);
  kern_l1l2_grad(C_, x, N, 0.01f, 0.3f, ref);
  float *gd = up(dst, N * 4);
  rc = kern_l1l2_grad(G_, gx, N, 0.01f, 0.3f, gd);
  cmp("l1/l2 regularizer gradient", rc, gd, ref, N, 1e-6);
  kern_free(G_, gx);
  kern_free(G_, gdy);
  kern_free(G_, glm);
  kern_free(G_, glr);
  kern_free(G_, pm);
  kern_free(G_, pv);
  kern_free(G_, pg);
  kern_free(G_, pb);
  free(x); free(dy); free(gamma); free(beta); free(dx0); free(y); free(dx);
  free(lm); free(lr); free(gy2); free(dst); free(ref);
}

int gpu_check_nn(kern_ctx *cpu, kern_ctx *gpu) {
  C_ = cpu;
  G_ = gpu;
  fails = 0;
  check_conv_pool(28, 28, 1, 3, 3, 1, false);
  check_conv_pool(13, 11, 32, 3, 3, 1, false);
  check_conv_pool(9, 7, 5, 3, 2, 2, true);
  check_conv_pool(8, 8, 6, 2, 2, 2, false);
  check_conv_pool(7, 7, 4, 5, 5, 3, true);
  check_norms();
  return fails;
}
