/* kern_ CPU backend against float64 references: every activation's forward
 * and gradient (central differences of a float64 implementation), every
 * loss and its gradient, GEMM in all transpositions, bias gradients,
 * embedding gather/scatter-add, 16-bit rounding, finiteness checks,
 * dropout, and the GPU module's clean fallback on a machine without one. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "../cmocka_skip.h"

#include "common/err.h"
#include "kernels/kern.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TSR_TEST_SEED 88172645463325252ull
#include "../test_rand.h"

static kern_ctx *cpu(void) {
  kern_opts o = {.device = KERN_DEVICE_CPU};
  kern_ctx *c = NULL;
  char err[256];
  assert_int_equal(kern_open(&o, &c, err, sizeof err), 0);
  return c;
}

static double act_ref(kern_act a, double z) {
  switch (a) {
    case KERN_ACT_LINEAR: return z;
    case KERN_ACT_RELU: return z > 0 ? z : 0;
    case KERN_ACT_RELU6: return z < 0 ? 0 : z > 6 ? 6 : z;
    case KERN_ACT_LEAKY_RELU: return z > 0 ? z : 0.2 * z;
    case KERN_ACT_SIGMOID: return 1 / (1 + exp(-z));
    case KERN_ACT_TANH: return tanh(z);
    case KERN_ACT_ELU: return z > 0 ? z : exp(z) - 1;
    case KERN_ACT_SELU:
      return 1.0507009873554805 * (z > 0 ? z : 1.6732632423543772 * (exp(z) - 1));
    case KERN_ACT_GELU: return 0.5 * z * (1 + erf(z / sqrt(2.0)));
    case KERN_ACT_SWISH: return z / (1 + exp(-z));
    case KERN_ACT_SOFTPLUS: return log1p(exp(z));
    case KERN_ACT_SOFTSIGN: return z / (1 + fabs(z));
    case KERN_ACT_EXPONENTIAL: return exp(z);
    default: return NAN;
  }
}

/* sum_j w_j * act(z)_j of one row, float64 (softmax needs the row). */
static double act_row_ref(kern_act a, const double *z, const double *w,
                          int d) {
  double s = 0;
  if (a == KERN_ACT_SOFTMAX) {
    double mx = z[0], se = 0;
    for (int j = 1; j < d; j++) mx = fmax(mx, z[j]);
    for (int j = 0; j < d; j++) se += exp(z[j] - mx);
    for (int j = 0; j < d; j++) s += w[j] * exp(z[j] - mx) / se;
    return s;
  }
  for (int j = 0; j < d; j++) s += w[j] * act_ref(a, z[j]);
  return s;
}

static void test_activations(void **state) {
  kern_ctx *c = cpu();
  enum { N = 4, D = 7 };
  for (int a = 0; a < KERN_ACT__COUNT; a++) {
    float z[N * D], zb[N * D], y[N * D], dy[N * D], dz[N * D], bias[D];
    for (int i = 0; i < N * D; i++) {
      z[i] = frand(-3, 3);
      /* keep clear of the kinks, where a difference quotient is no
       * derivative */
      if (fabsf(z[i]) < 0.05f) z[i] += 0.2f;
      if (fabsf(z[i] - 6.0f) < 0.05f) z[i] += 0.2f;
      dy[i] = frand(-1, 1);
    }
    for (int j = 0; j < D; j++) bias[j] = frand(-0.5, 0.5);
    memcpy(zb, z, sizeof z);
    float al = a == KERN_ACT_LEAKY_RELU ? 0.2f : 1.0f;
    assert_int_equal(kern_bias_act(c, zb, bias, y, N, D, (kern_act)a, al), 0);
    for (int i = 0; i < N; i++)
      for (int j = 0; j < D; j++)
        assert_float_equal(zb[i * D + j], z[i * D + j] + bias[j], 1e-6);
    /* forward against float64 */
    for (int i = 0; i < N; i++)
      for (int j = 0; j < D; j++) {
        double zr[D], w[D] = {0};
        for (int t = 0; t < D; t++) zr[t] = zb[i * D + t];
        w[j] = 1;
        double ref = act_row_ref((kern_act)a, zr, w, D);
        double got = y[i * D + j];
        if (fabs(got - ref) > 1e-5 * fmax(1.0, fabs(ref)))
          fail_msg("%s forward: %g vs %g", kern_act_name((kern_act)a), got, ref);
      }
    assert_int_equal(kern_act_grad(c, dy, zb, y, dz, N, D, (kern_act)a, al), 0);
    for (int i = 0; i < N; i++) {
      double zr[D], w[D];
      for (int t = 0; t < D; t++) {
        zr[t] = zb[i * D + t];
        w[t] = dy[i * D + t];
      }
      for (int j = 0; j < D; j++) {
        double h = 1e-6, keep = zr[j];
        zr[j] = keep + h;
        double fp = act_row_ref((kern_act)a, zr, w, D);
        zr[j] = keep - h;
        double fm = act_row_ref((kern_act)a, zr, w, D);
        zr[j] = keep;
        double fd = (fp - fm) / (2 * h);
        double got = dz[i * D + j];
        if (fabs(got - fd) > 1e-4 * fmax(1.0, fabs(fd)))
          fail_msg("%s gradient [%d,%d]: %g vs finite difference %g",
                   kern_act_name((kern_act)a), i, j, got, fd);
      }
    }
  }
  kern_close(c);
}

/* float64 loss of one row; labels t as the kernel takes them */
static double loss_ref(kern_loss k, const double *p, const float *t, int d) {
  const double eps = 1e-7;
  double L = 0;
  switch (k) {
    case KERN_LOSS_MSE:
      for (int j = 0; j < d; j++) L += (p[j] - t[j]) * (p[j] - t[j]);
      return L / d;
    case KERN_LOSS_MAE:
      for (int j = 0; j < d; j++) L += fabs(p[j] - t[j]);
      return L / d;
    case KERN_LOSS_BCE_LOGITS:
      for (int j = 0; j < d; j++) {
        double s = 1 / (1 + exp(-p[j]));
        L -= t[j] * log(s) + (1 - t[j]) * log(1 - s);
      }
      return L / d;
    case KERN_LOSS_BCE_PROBS:
      for (int j = 0; j < d; j++)
        L -= t[j] * log(p[j] + eps) + (1 - t[j]) * log(1 - p[j] + eps);
      return L / d;
    case KERN_LOSS_CCE_LOGITS:
    case KERN_LOSS_SPARSE_CCE_LOGITS: {
      double mx = p[0], se = 0;
      for (int j = 1; j < d; j++) mx = fmax(mx, p[j]);
      for (int j = 0; j < d; j++) se += exp(p[j] - mx);
      for (int j = 0; j < d; j++) {
        double tj = k == KERN_LOSS_CCE_LOGITS ? t[j] : (j == (int)t[0]);
        L -= tj * (p[j] - mx - log(se));
      }
      return L;
    }
    case KERN_LOSS_CCE_PROBS:
    case KERN_LOSS_SPARSE_CCE_PROBS: {
      double S = 0;
      for (int j = 0; j < d; j++) S += p[j];
      for (int j = 0; j < d; j++) {
        double tj = k == KERN_LOSS_CCE_PROBS ? t[j] : (j == (int)t[0]);
        L -= tj * log(p[j] / S);
      }
      return L;
    }
    case KERN_LOSS_HUBER: /* delta 1, kern_loss_eval's default */
      for (int j = 0; j < d; j++) {
        double e = fabs(p[j] - t[j]);
        L += e <= 1 ? 0.5 * e * e : e - 0.5;
      }
      return L / d;
    case KERN_LOSS_KLD:
      for (int j = 0; j < d; j++) {
        double tj = fmax(t[j], eps);
        L += tj * log(tj / fmax(p[j], eps));
      }
      return L;
    default: return NAN;
  }
}

static void test_losses(void **state) {
  kern_ctx *c = cpu();
  enum { N = 5, D = 4 };
  for (int k = 0; k < KERN_LOSS__COUNT; k++) {
    bool sparse = k == KERN_LOSS_SPARSE_CCE_LOGITS ||
                  k == KERN_LOSS_SPARSE_CCE_PROBS;
    bool probs = k == KERN_LOSS_BCE_PROBS || k == KERN_LOSS_CCE_PROBS ||
                 k == KERN_LOSS_SPARSE_CCE_PROBS || k == KERN_LOSS_KLD;
    float p[N * D], y[N * D], g[N * D], exl[N];
    for (int i = 0; i < N * D; i++) {
      p[i] = probs ? frand(0.05, 0.95) : frand(-2, 2);
      y[i] = k == KERN_LOSS_MSE || k == KERN_LOSS_MAE ? frand(-2, 2)
                                                      : frand(0, 1);
      if (k == KERN_LOSS_MAE && fabsf(p[i] - y[i]) < 0.05f) p[i] += 0.1f;
    }
    if (k == KERN_LOSS_CCE_LOGITS || k == KERN_LOSS_CCE_PROBS)
      for (int i = 0; i < N; i++) {
        double s = 0;
        for (int j = 0; j < D; j++) s += y[i * D + j];
        for (int j = 0; j < D; j++) y[i * D + j] /= (float)s;
      }
    if (sparse)
      for (int i = 0; i < N; i++) y[i] = (float)(i % D);
    float scale = 0.25f;
    assert_int_equal(kern_loss_eval(c, (kern_loss)k, p, y, N, D, scale, exl, g), 0);
    for (int i = 0; i < N; i++) {
      double pr[D];
      const float *t = sparse ? &y[i] : &y[i * D];
      for (int j = 0; j < D; j++) pr[j] = p[i * D + j];
      double ref = loss_ref((kern_loss)k, pr, t, D);
      if (!(fabs(exl[i] - ref) <= 1e-5 * fmax(1.0, fabs(ref))))
        fail_msg("loss %d row %d: %g vs %g", k, i, exl[i], ref);
      for (int j = 0; j < D; j++) {
        double h = 1e-6, keep = pr[j];
        pr[j] = keep + h;
        double fp = loss_ref((kern_loss)k, pr, t, D);
        pr[j] = keep - h;
        double fm = loss_ref((kern_loss)k, pr, t, D);
        pr[j] = keep;
        double fd = (fp - fm) / (2 * h) * scale;
        if (fabs(g[i * D + j] - fd) > 1e-4 * fmax(1.0, fabs(fd)))
          fail_msg("loss %d gradient [%d,%d]: %g vs finite difference %g", k,
                   i, j, g[i * D + j], fd);
      }
    }
  }
  /* a sparse label out of range is an error, not a read past the row */
  float p[4] = {0}, y1[1] = {4}, e1[1];
  assert_int_equal(kern_loss_eval(c, KERN_LOSS_SPARSE_CCE_LOGITS, p, y1, 1, 4,
                                  1, e1, NULL), TSR_ERANGE);
  kern_close(c);
}

static void test_gemm(void **state) {
  kern_ctx *c = cpu();
  enum { M = 9, N = 7, K = 11 };
  float A[M * K], B[K * N], C[M * N];
  for (int t = 0; t < 4; t++) {
    bool ta = t & 1, tb = t & 2;
    for (int i = 0; i < M * K; i++) A[i] = frand(-1, 1);
    for (int i = 0; i < K * N; i++) B[i] = frand(-1, 1);
    for (int i = 0; i < M * N; i++) C[i] = frand(-1, 1);
    float C0[M * N];
    memcpy(C0, C, sizeof C);
    assert_int_equal(kern_gemm(c, ta, tb, M, N, K, 0.5f, A, B, 2.0f, C, KERN_F32), 0);
    for (int i = 0; i < M; i++)
      for (int j = 0; j < N; j++) {
        double s = 0;
        for (int k = 0; k < K; k++)
          s += (double)(ta ? A[k * M + i] : A[i * K + k]) *
               (tb ? B[j * K + k] : B[k * N + j]);
        double ref = 0.5 * s + 2.0 * C0[i * N + j];
        assert_true(fabs(C[i * N + j] - ref) < 1e-5);
      }
  }
  /* bf16: the product of rounded inputs, accumulated in fp32 */
  for (int i = 0; i < M * K; i++) A[i] = frand(-1, 1);
  for (int i = 0; i < K * N; i++) B[i] = frand(-1, 1);
  assert_int_equal(kern_gemm(c, false, false, M, N, K, 1, A, B, 0, C, KERN_BF16), 0);
  float Ar[M * K], Br[K * N];
  memcpy(Ar, A, sizeof A);
  memcpy(Br, B, sizeof B);
  kern_round(c, Ar, M * K, KERN_BF16);
  kern_round(c, Br, K * N, KERN_BF16);
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) {
      double s = 0, s32 = 0;
      for (int k = 0; k < K; k++) {
        s += (double)Ar[i * K + k] * Br[k * N + j];
        s32 += (double)A[i * K + k] * B[k * N + j];
      }
      assert_true(fabs(C[i * N + j] - s) < 1e-5);
      assert_true(fabs(C[i * N + j] - s32) < 2e-2);
    }
  /* bias gradient */
  float dz[3 * 4], db[4] = {1, 1, 1, 1};
  for (int i = 0; i < 12; i++) dz[i] = (float)i;
  assert_int_equal(kern_col_sum(c, dz, 3, 4, 1.0f, db), 0);
  assert_float_equal(db[0], 1 + 0 + 4 + 8, 0);
  assert_float_equal(db[3], 1 + 3 + 7 + 11, 0);
  kern_close(c);
}

static void test_embedding(void **state) {
  kern_ctx *c = cpu();
  enum { U = 4, DIM = 3 };
  float rows[U * DIM];
  for (int i = 0; i < U * DIM; i++) rows[i] = frand(-1, 1);
  /* 3 bags: {0, 2, 2}, {}, {3, 1} ; output stride 5, offset 1 */
  int32_t idx[] = {0, 2, 2, 3, 1}, bag_off[] = {0, 3, 3, 5};
  for (int pool = 0; pool < 2; pool++) {
    float out[3 * 5];
    for (int i = 0; i < 15; i++) out[i] = 99;
    assert_int_equal(kern_embed_gather(c, rows, DIM, idx, bag_off, 3,
                                       (kern_pool)pool, out, 5, 1), 0);
    for (int b = 0; b < 3; b++) {
      assert_float_equal(out[b * 5], 99, 0);     /* outside the slice */
      assert_float_equal(out[b * 5 + 4], 99, 0);
      for (int t = 0; t < DIM; t++) {
        double s = 0;
        for (int j = bag_off[b]; j < bag_off[b + 1]; j++) s += rows[idx[j] * DIM + t];
        int cnt = bag_off[b + 1] - bag_off[b];
        if (pool == KERN_POOL_MEAN && cnt) s /= cnt;
        assert_true(fabs(out[b * 5 + 1 + t] - s) < 1e-6);
      }
    }
    /* backward: the adjoint of the gather, by inverse lists per row */
    float dout[3 * 5], grad[U * DIM];
    for (int i = 0; i < 15; i++) dout[i] = frand(-1, 1);
    int32_t occ_off[] = {0, 1, 2, 4, 5}, occ_bag[] = {0, 2, 0, 0, 2};
    float occ_w[5];
    for (int j = 0; j < 5; j++)
      occ_w[j] = pool == KERN_POOL_MEAN ? (occ_bag[j] == 0 ? 1.0f / 3 : 0.5f) : 1.0f;
    assert_int_equal(kern_embed_scatter(c, dout, 5, 1, DIM, occ_off, occ_bag,
                                        occ_w, U, grad), 0);
    /* <gather(rows), dout> == <rows, scatter(dout)> */
    double lhs = 0, rhs = 0;
    float o2[15] = {0};
    kern_embed_gather(c, rows, DIM, idx, bag_off, 3, (kern_pool)pool, o2, 5, 1);
    for (int b = 0; b < 3; b++)
      for (int t = 0; t < DIM; t++) lhs += o2[b * 5 + 1 + t] * dout[b * 5 + 1 + t];
    for (int i = 0; i < U * DIM; i++) rhs += rows[i] * grad[i];
    assert_true(fabs(lhs - rhs) < 1e-5);
  }
  kern_close(c);
}

static void test_round_finite_dropout(void **state) {
  kern_ctx *c = cpu();
  float x[6] = {1.0f, 1.00390625f, 1.0f + 3.0f / 2048, 70000.0f,
                3.0e-8f, -2.5f};
  float h[6];
  memcpy(h, x, sizeof x);
  kern_round(c, h, 6, KERN_F16);
  assert_float_equal(h[0], 1.0f, 0);
  assert_float_equal(h[1], 1.00390625f, 0);             /* exact in fp16 */
  assert_float_equal(h[2], 1.0f + 2.0f / 1024, 0);      /* ties to even */
  assert_true(isinf(h[3]));                              /* overflow */
  assert_float_equal(h[4], 5.9604645e-08f, 1e-12);       /* subnormal */
  assert_float_equal(h[5], -2.5f, 0);
  float b[2] = {1.00390625f, 1.0f + 3.0f / 256};
  kern_round(c, b, 2, KERN_BF16);
  assert_float_equal(b[0], 1.0f, 0);                     /* tie to even */
  assert_float_equal(b[1], 1.0f + 4.0f / 256, 0);
  bool fin;
  kern_all_finite(c, x, 6, &fin);
  assert_true(fin);
  kern_all_finite(c, h, 6, &fin);
  assert_false(fin);
  float nan1[3] = {0, NAN, 1};
  kern_all_finite(c, nan1, 3, &fin);
  assert_false(fin);
  enum { N = 20000 };
  float *v = malloc(N * sizeof *v), *m = malloc(N * sizeof *m);
  for (int i = 0; i < N; i++) v[i] = 1;
  assert_int_equal(kern_dropout(c, v, m, N, 0.25f, 7), 0);
  int kept = 0;
  for (int i = 0; i < N; i++) {
    assert_true(v[i] == 0.0f || fabsf(v[i] - 1.0f / 0.75f) < 1e-6);
    kept += v[i] != 0;
  }
  assert_true(kept > N * 0.72 && kept < N * 0.78);
  free(v);
  free(m);
  kern_close(c);
}

static void test_names(void **state) {
  kern_act a;
  assert_int_equal(kern_act_parse("silu", &a), 0);
  assert_int_equal(a, KERN_ACT_SWISH);
  assert_int_equal(kern_act_parse(NULL, &a), 0);
  assert_int_equal(a, KERN_ACT_LINEAR);
  assert_int_equal(kern_act_parse("mish", &a), TSR_EUNSUPPORTED);
  assert_non_null(strstr(kern_act_list(), "gelu"));
  assert_true(strlen(kern_cpu_corename()) > 0);
}

/* No GPU here (or in CI): auto falls back to the CPU, gpu is refused with
 * a reason, and a forced load of the module (when built) reports no device
 * rather than crashing. */
static void test_device_fallback(void **state) {
  char err[512] = "";
  kern_ctx *c = NULL;
  int n = -1;
  kern_opts probe = {.device = KERN_DEVICE_AUTO};
  assert_int_equal(kern_gpu_count(&probe, &n, err, sizeof err), 0);
  if (n > 0) TSR_SKIP(); /* a GPU machine: tests/gpu/run.sh covers it */
  kern_opts o = {.device = KERN_DEVICE_AUTO};
  assert_int_equal(kern_open(&o, &c, err, sizeof err), 0);
  assert_string_equal(kern_backend_name(c), "cpu");
  kern_close(c);
  o.device = KERN_DEVICE_GPU;
  assert_int_equal(kern_open(&o, &c, err, sizeof err), TSR_ENODEVICE);
  assert_null(c);
  assert_non_null(strstr(err, "no usable GPU"));
  char path[4096];
  bool have = kern_module_path(path, sizeof path) == 0;
  /* a -Dgpu=enabled build must have produced the module */
  if (getenv("TSR_EXPECT_CUDA_MODULE")) assert_true(have);
  if (have) {
    kern_opts f = {.device = KERN_DEVICE_GPU, .force_module = true};
    err[0] = 0;
    assert_int_equal(kern_open(&f, &c, err, sizeof err), TSR_ENODEVICE);
    print_message("forced module load: %s\n", err);
    assert_non_null(strstr(err, "no usable GPU"));
    /* the module itself loads (every symbol it needs resolves): the reason
     * is the device, not the file */
    assert_null(strstr(err, "cannot load"));
    assert_int_equal(kern_gpu_count(&f, &n, err, sizeof err), 0);
    assert_int_equal(n, 0);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_activations),
      cmocka_unit_test(test_losses),
      cmocka_unit_test(test_gemm),
      cmocka_unit_test(test_embedding),
      cmocka_unit_test(test_round_finite_dropout),
      cmocka_unit_test(test_names),
      cmocka_unit_test(test_device_fallback),
  };
  return tsr_cmocka_exit(cmocka_run_group_tests(tests, NULL, NULL));
}
