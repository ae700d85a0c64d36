/* kern_math.h on the CPU: the formulas the CUDA kernels run, checked where
 * the GPU path differs from the CPU backend's loops. The per-element
 * dispatchers the kernels call (kern_math_act, kern_math_act_grad) agree
 * bit for bit with the CPU backend and with float64 references; the loss
 * row the GPU runs per thread equals the CPU's; the 16-bit storage bits
 * the GPU hands cuBLAS are IEEE half (against gcc's _Float16) and
 * bfloat16 (against a float64 reference) for millions of inputs including
 * every rounding tie; the softmax element formulas rebuild the row
 * function; the dropout draw keeps the asked fraction; the normalization,
 * window and regularizer formulas of the convolution and normalization
 * ops agree with float64 references. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/err.h"
#include "kernels/kern.h"
#include "kernels/kern_math.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TSR_TEST_SEED 0x2545F4914F6CDD1Dull
#include "../test_rand.h"

static uint32_t bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
static float from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static kern_ctx *cpu(void) {
  kern_opts o = {.device = KERN_DEVICE_CPU};
  kern_ctx *c = NULL;
  char err[256];
  assert_int_equal(kern_open(&o, &c, err, sizeof err), 0);
  return c;
}

static double act_ref(kern_act a, double z, double alpha) {
  switch (a) {
    case KERN_ACT_LINEAR: return z;
    case KERN_ACT_RELU: return z > 0 ? z : 0;
    case KERN_ACT_RELU6: return z < 0 ? 0 : z > 6 ? 6 : z;
    case KERN_ACT_LEAKY_RELU: return z > 0 ? z : alpha * z;
    case KERN_ACT_SIGMOID: return 1 / (1 + exp(-z));
    case KERN_ACT_TANH: return tanh(z);
    case KERN_ACT_ELU: return z > 0 ? z : alpha * (exp(z) - 1);
    case KERN_ACT_SELU:
      return 1.0507009873554805 * (z > 0 ? z : 1.6732632423543772 * expm1(z));
    case KERN_ACT_GELU: return 0.5 * z * (1 + erf(z / sqrt(2.0)));
    case KERN_ACT_SWISH: return z / (1 + exp(-z));
    case KERN_ACT_SOFTPLUS: return log1p(exp(z));
    case KERN_ACT_SOFTSIGN: return z / (1 + fabs(z));
    case KERN_ACT_EXPONENTIAL: return exp(z);
    default: return NAN;
  }
}

/* The dispatchers a CUDA thread calls give what the CPU loops give, bit for
 * bit, and what float64 gives within float rounding; their gradients
 * match central differences of the float64 forward. */
static void test_act_dispatch(void **state) {
  kern_ctx *c = cpu();
  enum { N = 997 };
  float *z = malloc(N * sizeof *z), *zc = malloc(N * sizeof *z),
        *y = malloc(N * sizeof *z), *dy = malloc(N * sizeof *z),
        *dz = malloc(N * sizeof *z);
  for (int a = 0; a < KERN_ACT__COUNT; a++) {
    if (a == KERN_ACT_SOFTMAX) continue; /* a row op: test_softmax */
    float al = a == KERN_ACT_LEAKY_RELU ? 0.2f : a == KERN_ACT_ELU ? 0.7f : 1;
    for (int i = 0; i < N; i++) {
      z[i] = frand(-9, 9);
      if (fabsf(z[i]) < 0.01f || fabsf(z[i] - 6) < 0.01f) z[i] += 0.05f;
      dy[i] = frand(-1, 1);
    }
    z[0] = 0.0f;     /* the kinks themselves: both sides alike */
    z[1] = 6.0f;
    z[2] = -0.0f;
    memcpy(zc, z, N * sizeof *z);
    assert_int_equal(kern_bias_act(c, zc, NULL, y, 1, N, (kern_act)a, al), 0);
    assert_int_equal(
        kern_act_grad(c, dy, zc, y, dz, 1, N, (kern_act)a, al), 0);
    for (int i = 0; i < N; i++) {
      float gy = kern_math_act((kern_act)a, z[i], al);
      float gd = kern_math_act_grad((kern_act)a, dy[i], z[i], y[i], al);
      if (bits(gy) != bits(y[i]) || bits(gd) != bits(dz[i]))
        fail_msg("%s at z=%.9g: dispatcher %.9g / %.9g, CPU loop %.9g / %.9g",
                 kern_act_name((kern_act)a), z[i], gy, gd, y[i], dz[i]);
      double ref = act_ref((kern_act)a, z[i], al);
      if (fabs(gy - ref) > 4e-7 * fmax(1.0, fabs(ref)))
        fail_msg("%s(%.9g) = %.9g, float64 %.12g", kern_act_name((kern_act)a),
                 z[i], gy, ref);
      if (i < 3) continue;
      double h = 1e-5 * fmax(1.0, fabs(z[i]));
      double fd = (act_ref((kern_act)a, z[i] + h, al) -
                   act_ref((kern_act)a, z[i] - h, al)) / (2 * h) * dy[i];
      if (fabs(gd - fd) > 2e-4 * fmax(1.0, fabs(fd)))
        fail_msg("%s gradient at %.9g: %.9g, finite difference %.9g",
                 kern_act_name((kern_act)a), z[i], gd, fd);
    }
  }
  /* an unknown activation passes through (the front end refuses it) */
  assert_true(kern_math_act(KERN_ACT__COUNT, 1.5f, 0) == 1.5f);
  free(z); free(zc); free(y); free(dy); free(dz);
  kern_close(c);
}

/* The GPU's block softmax applies kern_math_softmax_exp and
 * kern_math_softmax_grad to a row; they rebuild the row functions. */
static void test_softmax(void **state) {
  enum { D = 33 };
  float z[D], y[D], y2[D], g[D], dz[D];
  for (int j = 0; j < D; j++) {
    z[j] = frand(-30, 30);
    g[j] = frand(-1, 1);
  }
  z[5] = 80.0f; /* exp(80) overflows float: the max shift keeps it finite */
  kern_math_softmax_row(z, y, D);
  float mx = -INFINITY, s = 0;
  for (int j = 0; j < D; j++) mx = fmaxf(mx, z[j]);
  for (int j = 0; j < D; j++) s += (y2[j] = kern_math_softmax_exp(z[j], mx));
  double sum = 0;
  for (int j = 0; j < D; j++) {
    assert_float_equal(y[j], y2[j] / s, 1e-7);
    sum += y[j];
  }
  assert_float_equal(sum, 1.0, 1e-6);
  kern_math_softmax_grad_row(g, y, dz, D);
  double gy = 0, dsum = 0;
  for (int j = 0; j < D; j++) gy += (double)g[j] * y[j];
  for (int j = 0; j < D; j++) {
    assert_float_equal(dz[j], kern_math_softmax_grad(g[j], y[j], (float)gy),
                       1e-6);
    dsum += dz[j];
  }
  assert_float_equal(dsum, 0.0, 1e-6); /* the Jacobian's rows sum to 0 */
}

/* A CUDA thread evaluates one row with kern_math_loss_row and the class
 * from kern_math_sparse_class; the CPU backend's results are the same
 * bits. Labels that are no class give -1 (and no read past the row). */
static void test_loss_rows(void **state) {
  kern_ctx *c = cpu();
  enum { N = 9, D = 6 };
  for (int k = 0; k < KERN_LOSS__COUNT; k++) {
    bool sparse = kern_math_loss_sparse((kern_loss)k);
    float p[N * D], y[N * D], g[N * D], ex[N], g2[D];
    for (int i = 0; i < N * D; i++) {
      p[i] = frand(0.001, 0.999);
      if (k == KERN_LOSS_MSE || k == KERN_LOSS_MAE || k == KERN_LOSS_BCE_LOGITS ||
          k == KERN_LOSS_CCE_LOGITS || k == KERN_LOSS_SPARSE_CCE_LOGITS)
        p[i] = frand(-20, 20);
      y[i] = frand(0, 1);
    }
    if (sparse)
      for (int i = 0; i < N; i++) y[i] = (float)((i * 5) % D);
    p[3] = 1e-9f; /* clipped for the probability kinds */
    assert_int_equal(kern_loss_eval(c, (kern_loss)k, p, y, N, D, 0.5f, ex, g), 0);
    for (int i = 0; i < N; i++) {
      int64_t cls = sparse ? kern_math_sparse_class(y[i], D) : -1;
      double L = kern_math_loss_row((kern_loss)k, p + i * D,
                                    sparse ? NULL : y + i * D, cls, D, 0.5f, g2);
      assert_true(bits((float)L) == bits(ex[i]));
      assert_memory_equal(g2, g + i * D, sizeof g2);
      assert_true(isfinite(L));
    }
  }
  assert_int_equal(kern_math_sparse_class(2.0f, 3), 2);
  assert_int_equal(kern_math_sparse_class(0.0f, 3), 0);
  assert_int_equal(kern_math_sparse_class(3.0f, 3), -1);
  assert_int_equal(kern_math_sparse_class(-1.0f, 3), -1);
  assert_int_equal(kern_math_sparse_class(1.5f, 3), -1);
  assert_int_equal(kern_math_sparse_class(NAN, 3), -1);
  /* a row with no class (a bad label on the GPU) reads nothing of t and
   * gives a finite loss */
  float z[3] = {1, 2, 3}, gg[3];
  assert_true(kern_math_loss_row(KERN_LOSS_SPARSE_CCE_LOGITS, z, NULL, -1, 3,
                                 1, gg) == 0.0);
  kern_close(c);
}

/* float64 reference of round-to-nearest-even to `sig` significant bits
 * with the given smallest quantum and the overflow threshold. */
static double round_ref(double f, int sig, int min_exp, double overflow) {
  if (f == 0 || !isfinite(f)) return f;
  int e;
  frexp(f, &e); /* f = m 2^e, m in [0.5, 1) */
  int qe = e - sig;
  if (qe < min_exp) qe = min_exp;
  double q = ldexp(1.0, qe);
  double r = nearbyint(f / q) * q; /* default mode: ties to even */
  if (fabs(r) >= overflow) return copysign(INFINITY, f);
  return r;
}

/* IEEE binary16 bits of a value already rounded to it */
static uint16_t half_encode(double r) {
  uint16_t sign = signbit(r) ? 0x8000 : 0;
  double a = fabs(r);
  if (isinf(a)) return sign | 0x7c00;
  if (a < 0x1p-14) return sign | (uint16_t)(a * 0x1p24);
  int e;
  double m = frexp(a, &e); /* a = m 2^e, m in [0.5, 1) */
  return sign | (uint16_t)((e - 1 + 15) << 10) |
         (uint16_t)((m * 2 - 1) * 1024);
}

static void check_one(uint32_t u, uint64_t *checked) {
  float f = from_bits(u);
  (*checked)++;
  uint16_t hb = kern_math_f16_bits(f), bb = kern_math_bf16_bits(f);
  if (isnan(f)) {
    if ((hb & 0x7c00u) != 0x7c00u || !(hb & 0x3ffu) ||
        (bb & 0x7f80u) != 0x7f80u || !(bb & 0x7fu))
      fail_msg("NaN %08x: half %04x bf16 %04x are not NaN", u, hb, bb);
    return;
  }
  double hr64 = round_ref(f, 11, -24, 65520.0);
  uint16_t want = half_encode(hr64);
#ifdef __FLT16_MAX__
  /* and gcc's own IEEE binary16 conversion agrees with the reference */
  _Float16 h = (_Float16)f;
  uint16_t gcc_bits;
  memcpy(&gcc_bits, &h, 2);
  if (gcc_bits != want)
    fail_msg("reference half of %.9g: %04x, gcc %04x", f, want, gcc_bits);
#endif
  if (hb != want)
    fail_msg("half bits of %.9g (%08x): %04x, IEEE %04x", f, u, hb, want);
  /* the float the CPU multiplies is the value of those bits */
  float hr = kern_math_round_f16(f);
  if (hr != (float)hr64 || signbit(hr) != signbit(f))
    fail_msg("round_f16(%.9g) = %.9g, IEEE %.9g", f, hr, hr64);
  double br = round_ref(f, 8, -133, 0x1p128);
  float bf = kern_math_round_bf16(f);
  if (bits(bf) != bits((float)br) || bb != (uint16_t)(bits((float)br) >> 16))
    fail_msg("bf16 of %.9g (%08x): %.9g bits %04x, reference %.9g", f, u, bf,
             bb, br);
}

static void test_16bit(void **state) {
  uint64_t checked = 0;
  /* a sweep of the whole float range */
  for (uint64_t u = 0; u < 0x100000000ull; u += 0x3f1) check_one((uint32_t)u, &checked);
  /* every fp16 tie, with its neighbours, and every bf16 tie (both signs) */
  for (uint32_t x = 0; x < (1u << 18); x++) {
    uint32_t t = (x << 13) | 0x1000u;
    check_one(t, &checked);
    check_one(t + 1, &checked);
    check_one(t - 1, &checked);
  }
  for (uint32_t x = 0; x < (1u << 16); x++) {
    uint32_t t = (x << 16) | 0x8000u;
    check_one(t, &checked);
    check_one(t - 1, &checked);
  }
  /* named edges */
  const float edge[] = {65504.0f, 65519.99f, 65520.0f, 6.103515625e-05f,
                        6.0975552e-05f, 5.9604645e-08f, 2.9802322e-08f,
                        2.9802326e-08f, FLT_MAX, FLT_MIN, 1e-45f, INFINITY,
                        3.3895314e38f, 3.3961775e38f};
  for (size_t i = 0; i < sizeof edge / sizeof *edge; i++) {
    check_one(bits(edge[i]), &checked);
    check_one(bits(-edge[i]), &checked);
  }
  print_message("16-bit rounding: %llu inputs checked\n",
                (unsigned long long)checked);
  assert_int_equal(kern_math_f16_bits(65520.0f), 0x7c00);
  assert_int_equal(kern_math_f16_bits(-0.0f), 0x8000);
  assert_int_equal(kern_math_bf16_bits(3.3961775e38f), 0x7f80);
  assert_true(kern_math_round(KERN_F32, 1.1f) == 1.1f);
}

/* The draw depends on (seed, element) only: the rate is kept within
 * sampling error, seeds differ, rate 0 keeps everything, and the kept
 * elements are scaled by 1/(1-rate). */
static void test_dropout_draw(void **state) {
  enum { N = 200000 };
  const float rates[] = {0.0f, 0.1f, 0.5f, 0.9f};
  for (size_t r = 0; r < 4; r++) {
    uint32_t thr = kern_math_dropout_threshold(rates[r]);
    float keep = kern_math_dropout_keep(rates[r]);
    long kept = 0, same = 0;
    for (uint64_t i = 0; i < N; i++) {
      float m = kern_math_dropout_mask(42, i, thr, keep);
      assert_true(m == 0.0f || m == keep);
      kept += m != 0;
      same += (m != 0) == (kern_math_dropout_mask(43, i, thr, keep) != 0);
    }
    double want = N * (1.0 - rates[r]);
    double sd = sqrt(N * rates[r] * (1.0 - rates[r]));
    if (fabs(kept - want) > 5 * sd + 0.5)
      fail_msg("rate %g: kept %ld of %d", rates[r], kept, N);
    if (rates[r] == 0.0f) assert_int_equal(kept, N);
    if (rates[r] == 0.5f) assert_true(same < N * 0.51 && same > N * 0.49);
  }
  assert_float_equal(kern_math_dropout_keep(0.2f), 1.25f, 1e-7);
}

/* The normalization, window and regularizer formulas of kern_nn.h's ops:
 * a whole batch-norm and layer-norm row built from them against float64
 * (forward, and the input gradient against central differences of the
 * float64 loss sum(dy * y)); windows against a brute-force scan; the l1/l2
 * gradient against its definition. */
static void test_norm_window_reg(void **state) {
  enum { M = 37 };
  float x[M], dy[M], gamma = 1.3f, beta = -0.4f, eps = 1e-3f;
  for (int i = 0; i < M; i++) {
    x[i] = frand(-2, 3);
    dy[i] = frand(-1, 1);
  }
  double mu = 0, var = 0;
  for (int i = 0; i < M; i++) mu += x[i] / (double)M;
  for (int i = 0; i < M; i++) var += (x[i] - mu) * (x[i] - mu) / M;
  float sc = kern_math_norm_scale(gamma, (float)var, eps);
  float rstd = kern_math_norm_scale(1.0f, (float)var, eps);
  double mg = 0, mgx = 0;
  for (int i = 0; i < M; i++) {
    double xh = (x[i] - mu) / sqrt(var + eps);
    double y = kern_math_norm_apply(x[i], (float)mu, sc, beta);
    assert_true(fabs(y - (gamma * xh + beta)) < 1e-5);
    mg += dy[i] * gamma / M;
    mgx += dy[i] * gamma * xh / M;
  }
  for (int i = 0; i < M; i++) {
    /* d/dx_i of sum_j dy_j * y_j(x), y = gamma * (x - mean) / std + beta */
    double h = 1e-6, l[2];
    for (int sgn = 0; sgn < 2; sgn++) {
      double xs[M], m2 = 0, v2 = 0;
      for (int j = 0; j < M; j++) xs[j] = x[j];
      xs[i] += sgn ? -h : h;
      for (int j = 0; j < M; j++) m2 += xs[j] / M;
      for (int j = 0; j < M; j++) v2 += (xs[j] - m2) * (xs[j] - m2) / M;
      l[sgn] = 0;
      for (int j = 0; j < M; j++)
        l[sgn] += dy[j] * (gamma * (xs[j] - m2) / sqrt(v2 + eps) + beta);
    }
    double fd = (l[0] - l[1]) / (2 * h);
    float xh = (x[i] - (float)mu) * rstd;
    float an = kern_math_norm_dx(dy[i] * gamma, xh, (float)mg, (float)mgx,
                                 rstd);
    if (fabs(an - fd) > 1e-4 * fmax(1, fabs(fd)))
      fail_msg("norm dx[%d] = %g, float64 central difference %g", i, an, fd);
  }
  /* windows: padding clipped, as a scan of the covered rows */
  for (int64_t n = 1; n < 9; n++)
    for (int64_t k = 1; k < 5; k++)
      for (int64_t s = 1; s < 4; s++)
        for (int64_t p = 0; p < k; p++)
          for (int64_t o = 0; o * s - p < n; o++) {
            int64_t lo, hi, a = -1, b = -1;
            kern_math_window(o, s, p, k, n, &lo, &hi);
            for (int64_t r = o * s - p; r < o * s - p + k; r++)
              if (r >= 0 && r < n) {
                if (a < 0) a = r;
                b = r + 1;
              }
            if (a < 0) a = b = lo; /* all padding: an empty range */
            assert_true(lo == a && (hi == b || hi <= lo));
          }
  for (int i = 0; i < 1000; i++) {
    float w = i == 0 ? 0.0f : frand(-3, 3), a1 = frand(0, 1), a2 = frand(0, 1);
    double want = (w > 0 ? a1 : w < 0 ? -a1 : 0.0) + (double)a2 * w;
    assert_true(fabs(kern_math_l1l2_grad(w, a1, a2) - want) <= 1e-6);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_norm_window_reg),
      cmocka_unit_test(test_act_dispatch),
      cmocka_unit_test(test_softmax),
      cmocka_unit_test(test_loss_rows),
      cmocka_unit_test(test_16bit),
      cmocka_unit_test(test_dropout_draw),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
