/* The CPU backend: OpenBLAS sgemm for the matrix products, plain loops over
 * contiguous float arrays for the rest (built with -O3 -fno-math-errno so
 * gcc vectorizes them). Device pointers are host pointers.
 *
 * bf16/fp16 products are emulated: both inputs are rounded to the 16-bit
 * type into scratch buffers (kern_math.h's rounding, the very bits the GPU
 * hands cuBLAS) and multiplied with sgemm, i.e. 16-bit inputs with fp32
 * accumulation, as tensor cores do. Failure modes: scratch allocation
 * (TSR_ENOMEM, with the size in the last error); everything else works on
 * any input. Dimensions reach sgemm only after the front end has checked
 * them against its int arguments.
 */
#include "kernels/cpu/cpu_int.h"
#include "kernels/kern_math.h"
#include "kernels/kern_plan.h"
#include "kernels/kern_nn_int.h"
#include "kernels/kern_seq_int.h"
#include "common/err.h"

#include <cblas.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int kern__cpu_fail(void *impl, int rc, const char *fmt, ...) {
  kern__cpu *c = impl;
  va_list ap;
  va_start(ap, fmt);
  tsr_verrf(c->msg, sizeof c->msg, rc, fmt, ap);
  va_end(ap);
  return rc;
}

static const char *cpu_last_error(void *impl) {
  return ((kern__cpu *)impl)->msg;
}

static int cpu_open(void **impl, int device, int threads, char *err,
                    size_t len) {
  kern__cpu *c = calloc(1, sizeof *c);
  if (!c) return TSR_ENOMEM;
  /* Small dense GEMMs run best on one thread per worker; OpenBLAS's thread
   * count is process-wide, so the last context opened decides. */
  openblas_set_num_threads(threads > 0 ? threads : 1);
  *impl = c;
  return 0;
}

static void cpu_close(void *impl) {
  kern__cpu *c = impl;
  free(c->scratch[0]);
  free(c->scratch[1]);
  free(c);
}

static void *cpu_alloc(void *impl, size_t bytes) {
  void *p = NULL;
  size_t b = (bytes + 63) & ~(size_t)63;
  if (posix_memalign(&p, 64, b ? b : 64)) return NULL;
  return p;
}
static void cpu_free(void *impl, void *p) { free(p); }
static int cpu_copy(void *impl, void *dst, const void *src, size_t bytes) {
  if (dst != src) memmove(dst, src, bytes);
  return 0;
}
static int cpu_sync(void *impl) { return 0; }

static void round_into(float *dst, const float *src, size_t n, kern_prec p) {
  if (p == KERN_BF16)
    for (size_t i = 0; i < n; i++) dst[i] = kern_math_round_bf16(src[i]);
  else
    for (size_t i = 0; i < n; i++) dst[i] = kern_math_round_f16(src[i]);
}

static float *scratch(kern__cpu *c, int i, size_t n) {
  if (c->scratch_n[i] < n) {
    free(c->scratch[i]);
    c->scratch[i] = cpu_alloc(c, n * sizeof(float));
    c->scratch_n[i] = c->scratch[i] ? n : 0;
  }
  return c->scratch[i];
}

/* The same column-major call the GPU makes (kern_plan_gemm), so every CPU
 * product also runs the mapping; OpenBLAS's row-major entry swaps the
 * operands the same way. */
static int cpu_gemm(void *impl, bool ta, bool tb, int64_t m, int64_t n,
                    int64_t k, float alpha, const float *A, const float *B,
                    float beta, float *C, kern_prec prec) {
  kern__cpu *c = impl;
  kern_gemm_args g;
  int rc = kern_plan_gemm(ta, tb, m, n, k, &g);
  if (rc)
    return kern__cpu_fail(c, rc, "gemm %lld x %lld x %lld: sizes OpenBLAS "
                          "cannot take", (long long)m, (long long)n,
                          (long long)k);
  if (prec != KERN_F32 && k > 0) {
    float *a = scratch(c, 0, (size_t)(m * k));
    float *b = scratch(c, 1, (size_t)(k * n));
    if (!a || !b)
      return kern__cpu_fail(c, TSR_ENOMEM, "gemm %s: no memory for the "
                            "rounded inputs (%lld and %lld floats)",
                            kern_prec_name(prec), (long long)(m * k),
                            (long long)(k * n));
    round_into(a, A, (size_t)(m * k), prec);
    round_into(b, B, (size_t)(k * n), prec);
    A = a;
    B = b;
  }
  cblas_sgemm(CblasColMajor, g.trans_a ? CblasTrans : CblasNoTrans,
              g.trans_b ? CblasTrans : CblasNoTrans, g.m, g.n, g.k, alpha, B,
              g.lda, A, g.ldb, beta, C, g.ldc);
  return 0;
}

static int cpu_col_sum(void *impl, const float *dz, int64_t n, int64_t d,
                       float beta, float *db) {
  if (beta == 0.0f)
    memset(db, 0, (size_t)d * sizeof *db);
  else if (beta != 1.0f)
    for (int64_t j = 0; j < d; j++) db[j] *= beta;
  for (int64_t i = 0; i < n; i++) {
    const float *r = dz + i * d;
    for (int64_t j = 0; j < d; j++) db[j] += r[j];
  }
  return 0;
}

static int cpu_gather(void *impl, const float *rows, int64_t dim,
                      const int32_t *idx, const int32_t *bag_off, int64_t nb,
                      kern_pool pool, float *out, int64_t stride,
                      int64_t off) {
  for (int64_t b = 0; b < nb; b++) {
    float *o = out + b * stride + off;
    memset(o, 0, (size_t)dim * sizeof *o);
    int32_t lo = bag_off[b], hi = bag_off[b + 1];
    for (int32_t j = lo; j < hi; j++) {
      const float *r = rows + (int64_t)idx[j] * dim;
      for (int64_t t = 0; t < dim; t++) o[t] += r[t];
    }
    if (pool == KERN_POOL_MEAN && hi - lo > 1) {
      float s = 1.0f / (float)(hi - lo);
      for (int64_t t = 0; t < dim; t++) o[t] *= s;
    }
  }
  return 0;
}

static int cpu_scatter(void *impl, const float *dout, int64_t stride,
                       int64_t off, int64_t dim, const int32_t *occ_off,
                       const int32_t *occ_bag, const float *occ_w,
                       int64_t n_uniq, float *grad) {
  for (int64_t u = 0; u < n_uniq; u++) {
    float *g = grad + u * dim;
    memset(g, 0, (size_t)dim * sizeof *g);
    for (int32_t j = occ_off[u]; j < occ_off[u + 1]; j++) {
      const float *d = dout + (int64_t)occ_bag[j] * stride + off;
      float w = occ_w ? occ_w[j] : 1.0f;
      for (int64_t t = 0; t < dim; t++) g[t] += w * d[t];
    }
  }
  return 0;
}

static int cpu_round(void *impl, float *x, size_t n, kern_prec p) {
  round_into(x, x, n, p);
  return 0;
}

static int cpu_all_finite(void *impl, const float *x, size_t n, bool *fin) {
  /* x - x is 0 for finite values and NaN for inf and NaN; summing keeps
   * the loop branch-free and vectorized. */
  float acc = 0.0f;
  for (size_t i = 0; i < n; i++) acc += x[i] - x[i];
  *fin = acc == 0.0f;
  return 0;
}

static int cpu_scale(void *impl, float *x, size_t n, float a) {
  for (size_t i = 0; i < n; i++) x[i] *= a;
  return 0;
}

static int cpu_axpy(void *impl, float *y, const float *x, size_t n, float a) {
  for (size_t i = 0; i < n; i++) y[i] += a * x[i];
  return 0;
}

static int cpu_dropout(void *impl, float *x, float *mask, size_t n,
                       float rate, uint64_t seed) {
  uint32_t thr = kern_math_dropout_threshold(rate);
  float keep = kern_math_dropout_keep(rate);
  for (size_t i = 0; i < n; i++) {
    mask[i] = kern_math_dropout_mask(seed, i, thr, keep);
    x[i] *= mask[i];
  }
  return 0;
}

static int cpu_mul(void *impl, float *x, const float *m, size_t n) {
  for (size_t i = 0; i < n; i++) x[i] *= m[i];
  return 0;
}

static int cpu_allreduce(void *const *impls, float *const *bufs, int n_impl,
                         size_t n) {
  for (int r = 1; r < n_impl; r++)
    for (size_t i = 0; i < n; i++) bufs[0][i] += bufs[r][i];
  for (int r = 1; r < n_impl; r++)
    memcpy(bufs[r], bufs[0], n * sizeof(float));
  return 0;
}

const kern__ops kern__cpu_ops = {
    .name = "cpu",
    .host = true,
    .open = cpu_open,
    .close = cpu_close,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .host_alloc = cpu_alloc,
    .host_free = cpu_free,
    .upload = cpu_copy,
    .download = cpu_copy,
    .copy = cpu_copy,
    .sync = cpu_sync,
    .gemm = cpu_gemm,
    .bias_act = kern__cpu_bias_act,
    .act_grad = kern__cpu_act_grad,
    .col_sum = cpu_col_sum,
    .loss = kern__cpu_loss,
    .gather = cpu_gather,
    .scatter = cpu_scatter,
    .round = cpu_round,
    .all_finite = cpu_all_finite,
    .scale = cpu_scale,
    .axpy = cpu_axpy,
    .dropout = cpu_dropout,
    .mul = cpu_mul,
    .allreduce = cpu_allreduce,
    .last_error = cpu_last_error,
    .nn = &kern__cpu_nn_ops,
    .seq = &kern__cpu_seq_ops,
};
