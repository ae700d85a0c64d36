/* kern_plan.h on the CPU: what the GPU backend hands cuBLAS and the grids
 * it launches, checked without a GPU.
 *
 *   - the row-major to column-major GEMM mapping, run through
 *     cblas_sgemm(CblasColMajor, ...) with the very arguments cuBLAS gets,
 *     against a float64 row-major product: every transpose combination,
 *     odd and degenerate sizes (k = 0 included), alpha and beta;
 *   - sizes over INT_MAX refused, by the plan and by kern_gemm, before any
 *     memory is touched, with a message;
 *   - every launch's index coverage simulated: grid-stride loops visit each
 *     element once, column-sum chunks cover the rows once and sum to the
 *     column sums, row grids stop at CUDA's limit;
 *   - the device check: sm_80 and newer pass, older devices are refused by
 *     name and capability. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/err.h"
#include "kernels/kern.h"
#include "kernels/kern_plan.h"

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TSR_TEST_SEED 0x9E3779B97F4A7C15ull
#include "../test_rand.h"

/* Uniform in [-1, 1). */
static float pm1(void) { return (float)(urand() * 2 - 1); }

/* C = alpha op(A) op(B) + beta C through the column-major call the GPU
 * makes: cuBLAS's A is our B, its B our A. */
static void colmajor_gemm(bool ta, bool tb, int m, int n, int k, float alpha,
                          const float *A, const float *B, float beta,
                          float *C) {
  kern_gemm_args g = {0};
  assert_int_equal(kern_plan_gemm(ta, tb, m, n, k, &g), 0);
  /* cuBLAS's own argument rules (CUBLAS_STATUS_INVALID_VALUE otherwise),
   * which OpenBLAS does not enforce when k is 0 */
  assert_true(g.lda >= (g.trans_a ? g.k : g.m) && g.lda >= 1);
  assert_true(g.ldb >= (g.trans_b ? g.n : g.k) && g.ldb >= 1);
  assert_true(g.ldc >= g.m && g.ldc >= 1);
  cblas_sgemm(CblasColMajor, g.trans_a ? CblasTrans : CblasNoTrans,
              g.trans_b ? CblasTrans : CblasNoTrans, g.m, g.n, g.k, alpha, B,
              g.lda, A, g.ldb, beta, C, g.ldc);
}

static void test_gemm_mapping(void **state) {
  const int sizes[][3] = {{1, 1, 1},  {1, 7, 3},   {5, 1, 9},  {3, 4, 1},
                          {17, 13, 31}, {33, 2, 65}, {2, 33, 5}, {64, 63, 65},
                          {7, 5, 0}};
  const float ab[][2] = {{1, 0}, {0.5f, 2}, {-1.5f, -0.25f}};
  int cases = 0;
  for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
    for (int t = 0; t < 4; t++)
      for (int q = 0; q < 3; q++) {
        bool ta = t & 1, tb = t & 2;
        int m = sizes[s][0], n = sizes[s][1], k = sizes[s][2];
        float alpha = ab[q][0], beta = ab[q][1];
        size_t na = (size_t)m * k, nb = (size_t)k * n, nc = (size_t)m * n;
        float *A = malloc((na ? na : 1) * 4), *B = malloc((nb ? nb : 1) * 4),
              *C = malloc(nc * 4), *C0 = malloc(nc * 4);
        for (size_t i = 0; i < na; i++) A[i] = pm1();
        for (size_t i = 0; i < nb; i++) B[i] = pm1();
        for (size_t i = 0; i < nc; i++) C0[i] = C[i] = pm1();
        colmajor_gemm(ta, tb, m, n, k, alpha, A, B, beta, C);
        for (int i = 0; i < m; i++)
          for (int j = 0; j < n; j++) {
            double acc = 0;
            for (int p = 0; p < k; p++)
              acc += (double)(ta ? A[p * m + i] : A[i * k + p]) *
                     (tb ? B[j * k + p] : B[p * n + j]);
            double want = alpha * acc + beta * C0[i * n + j];
            if (fabs(C[i * n + j] - want) > 1e-5 * (1 + fabs(want)))
              fail_msg("gemm ta=%d tb=%d %dx%dx%d alpha=%g beta=%g: C[%d,%d] "
                       "= %g, row-major product %g", ta, tb, m, n, k, alpha,
                       beta, i, j, C[i * n + j], want);
          }
        free(A); free(B); free(C); free(C0);
        cases++;
      }
  print_message("%d column-major GEMM calls checked\n", cases);
  /* the CPU backend runs the same mapping: k = 0 leaves beta * C */
  kern_opts o = {.device = KERN_DEVICE_CPU};
  kern_ctx *c;
  char err[256];
  assert_int_equal(kern_open(&o, &c, err, sizeof err), 0);
  float A1[1] = {0}, B1[1] = {0}, C1[6] = {1, 2, 3, 4, 5, 6};
  for (int t = 0; t < 4; t++) {
    float Cc[6];
    memcpy(Cc, C1, sizeof Cc);
    assert_int_equal(kern_gemm(c, t & 1, t & 2, 2, 3, 0, 1, A1, B1, 0.5f, Cc,
                               KERN_BF16), 0);
    for (int i = 0; i < 6; i++) assert_float_equal(Cc[i], 0.5f * C1[i], 0);
  }
  kern_close(c);
}

static void test_gemm_limits(void **state) {
  kern_gemm_args g = {0};
  int64_t big = (int64_t)INT_MAX + 1;
  assert_int_equal(kern_plan_gemm(false, false, INT_MAX, 1, 1, &g), 0);
  assert_int_equal(g.n, INT_MAX);
  assert_int_equal(g.ldb, 1);
  assert_int_equal(kern_plan_gemm(true, false, INT_MAX, 1, 1, &g), 0);
  assert_int_equal(g.ldb, INT_MAX);
  for (int which = 0; which < 3; which++) {
    int64_t d[3] = {4, 4, 4};
    d[which] = big;
    for (int t = 0; t < 4; t++)
      assert_int_equal(kern_plan_gemm(t & 1, t & 2, d[0], d[1], d[2], &g),
                       TSR_ERANGE);
    d[which] = -1;
    assert_int_equal(kern_plan_gemm(false, false, d[0], d[1], d[2], &g),
                     TSR_EINVAL);
  }
  /* kern_gemm refuses before touching memory (NULL operands) and says so */
  kern_opts o = {.device = KERN_DEVICE_CPU};
  kern_ctx *c;
  char err[256];
  assert_int_equal(kern_open(&o, &c, err, sizeof err), 0);
  assert_int_equal(kern_gemm(c, false, true, 8, big, 8, 1, NULL, NULL, 0,
                             NULL, KERN_F32), TSR_ERANGE);
  assert_non_null(strstr(kern_last_error(c), "INT_MAX"));
  assert_non_null(strstr(kern_last_error(c), "2147483648"));
  assert_int_equal(kern_gemm(c, false, false, 8, 8, big, 1, NULL, NULL, 0,
                             NULL, KERN_BF16), TSR_ERANGE);
  /* a later op that succeeds clears the message */
  float x[2] = {1, 2};
  assert_int_equal(kern_scale(c, x, 2, 2), 0);
  assert_string_equal(kern_last_error(c), "");
  /* an op that fails in the backend names the op and the reason */
  float p[2] = {0, 0}, y[1] = {7};
  assert_int_equal(kern_loss_eval(c, KERN_LOSS_SPARSE_CCE_LOGITS, p, y, 1, 2,
                                  1, NULL, NULL), TSR_ERANGE);
  print_message("%s\n", kern_last_error(c));
  assert_non_null(strstr(kern_last_error(c), "loss on cpu"));
  assert_non_null(strstr(kern_last_error(c), "label 7"));
  kern_close(c);
}

/* Thread t of block b in a grid-stride loop visits b*tpb + t + r*grid*tpb. */
static void check_stride(size_t n, unsigned tpb) {
  unsigned grid = kern_plan_stride_blocks(n, tpb);
  assert_true(grid >= 1 && grid <= KERN_PLAN_STRIDE_MAX_BLOCKS);
  unsigned char *seen = calloc(n ? n : 1, 1);
  for (size_t b = 0; b < grid; b++)
    for (size_t t = 0; t < tpb; t++)
      for (size_t i = b * tpb + t; i < n; i += (size_t)grid * tpb) {
        if (seen[i]) fail_msg("n=%zu tpb=%u: element %zu visited twice", n, tpb, i);
        seen[i] = 1;
      }
  for (size_t i = 0; i < n; i++)
    if (!seen[i]) fail_msg("n=%zu tpb=%u: element %zu never visited", n, tpb, i);
  free(seen);
}

static void test_launch_geometry(void **state) {
  const size_t ns[] = {0, 1, 255, 256, 257, 100003};
  for (size_t i = 0; i < sizeof ns / sizeof *ns; i++) {
    check_stride(ns[i], KERN_PLAN_TPB);
    check_stride(ns[i], 32);
  }
  /* past the block cap the threads loop (few threads so it stays small) */
  check_stride((size_t)KERN_PLAN_STRIDE_MAX_BLOCKS * 2 + 77, 2);
  assert_int_equal(kern_plan_stride_blocks((size_t)1 << 40, KERN_PLAN_TPB),
                   KERN_PLAN_STRIDE_MAX_BLOCKS);

  unsigned g;
  assert_int_equal(kern_plan_row_blocks(1, &g), 0);
  assert_int_equal(g, 1);
  assert_int_equal(kern_plan_row_blocks(KERN_PLAN_GRID_X_MAX, &g), 0);
  assert_int_equal(g, 2147483647u);
  assert_int_equal(kern_plan_row_blocks(KERN_PLAN_GRID_X_MAX + 1, &g), TSR_ERANGE);
  assert_int_equal(kern_plan_row_blocks(-1, &g), TSR_ERANGE);
  assert_int_equal(kern_plan_thread_blocks(129, 128, &g), 0);
  assert_int_equal(g, 2);
  assert_int_equal(kern_plan_thread_blocks(KERN_PLAN_GRID_X_MAX * 128, 128, &g), 0);
  assert_int_equal(kern_plan_thread_blocks(KERN_PLAN_GRID_X_MAX * 128 + 1, 128, &g),
                   TSR_ERANGE);
  assert_int_equal(kern_plan_row_threads(0), 1);
  assert_int_equal(kern_plan_row_threads(5), 5);
  assert_int_equal(kern_plan_row_threads(32), 32);
  assert_int_equal(kern_plan_row_threads(127), 32);
  assert_int_equal(kern_plan_row_threads(4096), 128);
}

/* The two column-sum passes, run as the kernels run them. */
static void test_colsum_plan(void **state) {
  const int64_t ns[] = {0, 1, 2, 63, 64, 65, 1000, 4099};
  const int64_t ds[] = {1, 3, 300};
  for (size_t a = 0; a < sizeof ns / sizeof *ns; a++)
    for (size_t b = 0; b < sizeof ds / sizeof *ds; b++) {
      int64_t n = ns[a], d = ds[b];
      kern_colsum_plan p = {0};
      assert_int_equal(kern_plan_colsum(n, d, 256, &p), 0);
      assert_true(p.chunks >= 1 && p.chunks <= KERN_PLAN_COLSUM_CHUNKS);
      assert_true((int64_t)p.grid_x * 256 >= d);
      float *dz = malloc((size_t)(n * d + 1) * 4), *part = malloc((size_t)(p.chunks * d) * 4);
      for (int64_t i = 0; i < n * d; i++) dz[i] = (float)((i * 7) % 13) - 6;
      int64_t covered = 0, next = 0;
      for (int ch = 0; ch < p.chunks; ch++) {
        int64_t r0, r1;
        kern_plan_colsum_rows(&p, ch, n, &r0, &r1);
        assert_true(r0 <= r1);
        if (r1 > r0) {
          assert_int_equal(r0, next); /* in order, no gap, no overlap */
          next = r1;
        }
        covered += r1 - r0;
        for (int64_t j = 0; j < d; j++) {
          float s = 0;
          for (int64_t r = r0; r < r1; r++) s += dz[r * d + j];
          part[ch * d + j] = s;
        }
      }
      assert_int_equal(covered, n);
      for (int64_t j = 0; j < d; j++) {
        double s = 0, want = 0;
        for (int ch = 0; ch < p.chunks; ch++) s += part[ch * d + j];
        for (int64_t r = 0; r < n; r++) want += dz[r * d + j];
        assert_float_equal(s, want, 0);
      }
      free(dz);
      free(part);
    }
  kern_colsum_plan p = {0};
  assert_int_equal(kern_plan_colsum(10, 0, 256, &p), TSR_EINVAL);
  assert_int_equal(kern_plan_colsum(10, KERN_PLAN_GRID_X_MAX * 256 + 1, 256, &p),
                   TSR_ERANGE);
}

static void test_device_check(void **state) {
  char why[256];
  assert_int_equal(kern_plan_check_device(0, "NVIDIA A100", 8, 0, why, sizeof why), 0);
  assert_int_equal(kern_plan_check_device(0, "RTX 4090", 8, 9, why, sizeof why), 0);
  assert_int_equal(kern_plan_check_device(1, "NVIDIA H200", 9, 0, why, sizeof why), 0);
  assert_int_equal(kern_plan_check_device(0, "B200", 10, 0, why, sizeof why), 0);
  assert_int_equal(kern_plan_check_device(2, "Tesla V100-SXM2-16GB", 7, 0, why,
                                          sizeof why), TSR_ENODEVICE);
  print_message("%s\n", why);
  assert_non_null(strstr(why, "GPU 2 (Tesla V100-SXM2-16GB)"));
  assert_non_null(strstr(why, "compute capability 7.0"));
  assert_non_null(strstr(why, "sm_80"));
  assert_int_equal(kern_plan_check_device(0, "Tesla T4", 7, 5, why, sizeof why),
                   TSR_ENODEVICE);
  assert_non_null(strstr(why, "Tesla T4"));
  assert_non_null(strstr(why, "7.5"));
  assert_int_equal(kern_plan_check_device(0, "", 6, 1, NULL, 0), TSR_ENODEVICE);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gemm_mapping),
      cmocka_unit_test(test_gemm_limits),
      cmocka_unit_test(test_launch_geometry),
      cmocka_unit_test(test_colsum_plan),
      cmocka_unit_test(test_device_check),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
