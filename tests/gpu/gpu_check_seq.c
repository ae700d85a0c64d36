/* gpu_check's comparisons of kern_seq.h's ops (LSTM and GRU steps and
 * their backward, step-order layout changes, batched products, axis swap,
 * masked attention softmax and its gradient, masked mean): each op on
 * random inputs with a mask that drops some rows, on both backends, GPU
 * outputs poisoned with NaN first so an unwritten element fails,
 * ||gpu - cpu|| / ||cpu|| within fp32 rounding. Called from gpu_check.c's
 * main; returns the failure count. */
#include "kernels/kern_seq.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int gpu_check_seq(kern_ctx *cpu, kern_ctx *gpu);

static int fails;
static kern_ctx *C_, *G_;
static uint64_t rs = 0x2545F4914F6CDD1Dull;

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

/* 1 / 0 per row, about a quarter 0 */
static float *mask(size_t n) {
  float *h = malloc((n ? n : 1) * sizeof *h);
  for (size_t i = 0; i < n; i++) h[i] = fr(0, 1) < 0.25f ? 0.0f : 1.0f;
  return h;
}

static float *up(const float *h, size_t n) {
  float *d = kern_alloc(G_, (n ? n : 1) * sizeof *d);
  if (!d || kern_upload(G_, d, h, n * sizeof *h)) {
    fprintf(stderr, "GPU allocation/upload of %zu floats failed\n", n);
    exit(1);
  }
  return d;
}

static float *dnan(size_t n) {
  float *h = malloc((n ? n : 1) * sizeof *h);
  for (size_t i = 0; i < n; i++) h[i] = NAN;
  float *d = up(h, n);
  free(h);
  return d;
}

/* compares device d (n floats) with host ref; frees d */
static void cmp(const char *what, int rc, float *d, const float *ref,
                size_t n, double tol) {
  float *h = malloc((n ? n : 1) * sizeof *h);
  double num = 0, den = 0;
  bool bad = rc != 0 || kern_download(G_, h, d, n * sizeof *h) != 0;
  for (size_t i = 0; !bad && i < n; i++) {
    if (isnan(h[i]) != isnan(ref[i])) bad = true;
    double e = (double)h[i] - ref[i];
    num += e * e;
    den += (double)ref[i] * ref[i];
  }
  double err = bad ? INFINITY : den > 0 ? sqrt(num / den) : sqrt(num);
  bool ok = err <= tol;
  printf("%-48s rel err %9.2e  (tol %.0e)  %s\n", what, err, tol,
         ok ? "ok" : "FAIL");
  fails += !ok;
  free(h);
  kern_free(G_, d);
}

static void check_cells(int64_t n, int64_t u) {
  for (int gru = 0; gru < 2; gru++) {
    int64_t G = gru ? 3 : 4;
    size_t ng = (size_t)(n * G * u), nu = (size_t)(n * u);
    float *g = rnd(ng, -2, 2), *rg = rnd(ng, -2, 2), *cp = rnd(nu, -1, 1);
    float *hp = rnd(nu, -1, 1), *m = mask((size_t)n);
    float *c = malloc(nu * 4), *h = malloc(nu * 4), *ga = malloc(ng * 4);
    memcpy(ga, g, ng * 4);
    if (gru) kern_gru_step(C_, n, u, ga, rg, hp, m, h);
    else kern_lstm_step(C_, n, u, ga, cp, hp, m, c, h);
    float *dg = up(g, ng), *drg = up(rg, ng), *dcp = up(cp, nu);
    float *dhp = up(hp, nu), *dm = up(m, (size_t)n);
    float *dc = dnan(nu), *dh = dnan(nu);
    int rc = gru ? kern_gru_step(G_, n, u, dg, drg, dhp, dm, dh)
                 : kern_lstm_step(G_, n, u, dg, dcp, dhp, dm, dc, dh);
    char what[96];
    snprintf(what, sizeof what, "%s step %lldx%lld: h", gru ? "gru" : "lstm",
             (long long)n, (long long)u);
    cmp(what, rc, dh, h, nu, 2e-6);
    if (!gru) cmp("lstm step: c", rc, dc, c, nu, 2e-6);
    else kern_free(G_, dc);
    snprintf(what, sizeof what, "%s step: activated gates", gru ? "gru" : "lstm");
    float *ga_d = up(ga, ng); /* the gates the backward reads, CPU's */
    float *gchk = malloc(ng * 4);
    kern_download(G_, gchk, dg, ng * 4);
    float *dgate = up(gchk, ng);
    cmp(what, rc, dgate, ga, ng, 2e-6);
    /* backward from the CPU's gates on both sides */
    float *dho = rnd(nu, -1, 1), *dh0 = rnd(nu, -1, 1), *dc0 = rnd(nu, -1, 1);
    float *rdh = malloc(nu * 4), *rdc = malloc(nu * 4);
    float *rdx = malloc(ng * 4), *rdr = malloc(ng * 4);
    memcpy(rdh, dh0, nu * 4);
    memcpy(rdc, dc0, nu * 4);
    if (gru) kern_gru_step_grad(C_, n, u, ga, rg, hp, m, dho, rdh, rdx, rdr);
    else kern_lstm_step_grad(C_, n, u, ga, cp, c, m, dho, rdh, rdc, rdx);
    float *gdho = up(dho, nu), *gdh = up(dh0, nu), *gdc = up(dc0, nu);
    float *gdx = dnan(ng), *gdr = dnan(ng), *gc = up(c, nu);
    rc = gru ? kern_gru_step_grad(G_, n, u, ga_d, drg, dhp, dm, gdho, gdh, gdx,
                                  gdr)
             : kern_lstm_step_grad(G_, n, u, ga_d, dcp, gc, dm, gdho, gdh, gdc,
                                   gdx);
    snprintf(what, sizeof what, "%s step backward: dh", gru ? "gru" : "lstm");
    cmp(what, rc, gdh, rdh, nu, 2e-6);
    snprintf(what, sizeof what, "%s step backward: gate gradients",
             gru ? "gru" : "lstm");
    cmp(what, rc, gdx, rdx, ng, 2e-6);
    if (gru) cmp("gru step backward: recurrent gradients", rc, gdr, rdr, ng,
                 2e-6);
    else {
      cmp("lstm step backward: dc", rc, gdc, rdc, nu, 2e-6);
      kern_free(G_, gdr);
    }
    if (gru) kern_free(G_, gdc);
    kern_free(G_, drg);
    kern_free(G_, dcp);
    kern_free(G_, dhp);
    kern_free(G_, dm);
    kern_free(G_, ga_d);
    kern_free(G_, gdho);
    kern_free(G_, gc);
    kern_free(G_, dg);
    free(g); free(rg); free(cp); free(hp); free(m); free(c); free(h);
    free(ga); free(gchk); free(dho); free(dh0); free(dc0); free(rdh);
    free(rdc); free(rdx); free(rdr);
  }
}

static void check_layout(void) {
  const int64_t n = 7, T = 9, d = 5;
  size_t N = (size_t)(n * T * d);
  float *x = rnd(N, -1, 1), *m = mask((size_t)(n * T)), *y0 = rnd(N, -1, 1);
  float *gx = up(x, N), *gm = up(m, (size_t)(n * T));
  for (int rev = 0; rev < 2; rev++) {
    float *ref = malloc(N * 4);
    kern_seq_to_steps(C_, n, T, d, x, rev, 0.0f, ref);
    float *o = dnan(N);
    int rc = kern_seq_to_steps(G_, n, T, d, gx, rev, 0.0f, o);
    cmp(rev ? "to step order, reversed" : "to step order", rc, o, ref, N, 0);
    memcpy(ref, y0, N * 4);
    kern_seq_from_steps(C_, n, T, d, x, rev, m, 1.0f, ref);
    o = up(y0, N);
    rc = kern_seq_from_steps(G_, n, T, d, gx, rev, gm, 1.0f, o);
    cmp(rev ? "from step order, masked, added, reversed"
            : "from step order, masked, added", rc, o, ref, N, 1e-7);
    free(ref);
  }
  /* axis swap [2, 3, 4, 5] */
  float *ref = malloc(120 * 4);
  kern_swap12(C_, 2, 3, 4, 5, x, 0.0f, ref);
  float *o = dnan(120);
  int rc = kern_swap12(G_, 2, 3, 4, 5, gx, 0.0f, o);
  cmp("axis swap", rc, o, ref, 120, 0);
  free(ref);
  /* masked mean and its backward */
  float *mm = malloc((size_t)(n * d) * 4), *dx = malloc(N * 4);
  for (int64_t b = 0; b < n; b++) m[b * T] = 1.0f; /* no row masked whole */
  kern_upload(G_, gm, m, (size_t)(n * T) * 4);
  kern_masked_mean(C_, n, T, d, x, m, mm);
  o = dnan((size_t)(n * d));
  rc = kern_masked_mean(G_, n, T, d, gx, gm, o);
  cmp("masked mean", rc, o, mm, (size_t)(n * d), 1e-6);
  memcpy(dx, y0, N * 4);
  kern_masked_mean_grad(C_, n, T, d, x, m, 1.0f, dx);
  o = up(y0, N);
  rc = kern_masked_mean_grad(G_, n, T, d, gx, gm, 1.0f, o);
  cmp("masked mean backward (added)", rc, o, dx, N, 1e-6);
  kern_free(G_, gx);
  kern_free(G_, gm);
  free(x); free(m); free(y0); free(mm); free(dx);
}

static void check_attention(void) {
  const int64_t B = 3, H = 2, Tq = 5, Tk = 7, dk = 4;
  size_t ns = (size_t)(B * H * Tq * Tk), nq = (size_t)(B * H * Tq * dk);
  size_t nk = (size_t)(B * H * Tk * dk);
  float *q = rnd(nq, -1, 1), *k = rnd(nk, -1, 1), *s = malloc(ns * 4);
  kern_gemm_batched(C_, false, true, Tq, Tk, dk, 1.0f, q, Tq * dk, k, Tk * dk,
                    0.0f, s, Tq * Tk, B * H);
  float *gq = up(q, nq), *gk = up(k, nk), *gs = dnan(ns);
  int rc = kern_gemm_batched(G_, false, true, Tq, Tk, dk, 1.0f, gq, Tq * dk,
                             gk, Tk * dk, 0.0f, gs, Tq * Tk, B * H);
  float *hs = malloc(ns * 4);
  kern_download(G_, hs, gs, ns * 4);
  cmp("batched products (B transposed)", rc, gs, s, ns, 1e-6);
  float *qm = mask((size_t)(B * Tq)), *km = mask((size_t)(B * Tk));
  float *p = malloc(ns * 4);
  kern_attn_softmax(C_, B, H, Tq, Tk, s, 0.5f, qm, km, p);
  float *gsd = up(s, ns), *gqm = up(qm, (size_t)(B * Tq));
  float *gkm = up(km, (size_t)(B * Tk)), *gp = dnan(ns);
  rc = kern_attn_softmax(G_, B, H, Tq, Tk, gsd, 0.5f, gqm, gkm, gp);
  cmp("masked attention softmax", rc, gp, p, ns, 2e-6);
  float *dp = rnd(ns, -1, 1), *ds = malloc(ns * 4);
  kern_attn_softmax_grad(C_, B * H * Tq, Tk, dp, p, 0.5f, ds);
  float *gdp = up(dp, ns), *gpp = up(p, ns), *gds = dnan(ns);
  rc = kern_attn_softmax_grad(G_, B * H * Tq, Tk, gdp, gpp, 0.5f, gds);
  cmp("attention softmax backward", rc, gds, ds, ns, 2e-6);
  /* P^T Q: A transposed, added to what is there */
  float *o = rnd((size_t)(B * H * Tk * dk), -1, 1), *ref = malloc(nk * 4);
  memcpy(ref, o, nk * 4);
  kern_gemm_batched(C_, true, false, Tk, dk, Tq, 1.0f, p, Tq * Tk, q, Tq * dk,
                    1.0f, ref, Tk * dk, B * H);
  float *go = up(o, nk);
  rc = kern_gemm_batched(G_, true, false, Tk, dk, Tq, 1.0f, gpp, Tq * Tk, gq,
                         Tq * dk, 1.0f, go, Tk * dk, B * H);
  cmp("batched products (A transposed, added)", rc, go, ref, nk, 1e-6);
  kern_free(G_, gq); kern_free(G_, gk); kern_free(G_, gsd);
  kern_free(G_, gqm); kern_free(G_, gkm); kern_free(G_, gdp);
  kern_free(G_, gpp);
  free(q); free(k); free(s); free(hs); free(qm); free(km); free(p);
  free(dp); free(ds); free(o); free(ref);
}

int gpu_check_seq(kern_ctx *cpu, kern_ctx *gpu) {
  C_ = cpu;
  G_ = gpu;
  fails = 0;
  check_cells(9, 13);
  check_cells(64, 128);
  check_layout();
  check_attention();
  return fails;
}
