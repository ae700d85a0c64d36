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
#ifdef KERN_HAVE_DNNL
#include "kernels/cpu/cpu_dnnl.h"
#endif
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
  if (threads < 1) threads = 1;
  if (threads > KERN__POOL_MAX)
    return tsr_errf(err, len, TSR_EINVAL, "%d CPU threads asked for: at "
                    "most %d", threads, KERN__POOL_MAX);
  kern__cpu *c = calloc(1, sizeof *c);
  if (!c) return TSR_ENOMEM;
  /* OpenBLAS's own threads would spin between calls and split each
   * product statically; every product runs on one OpenBLAS thread, the
   * context's pool cuts the big ones (cpu_gemm). Process-wide, and the
   * same value for every context. */
  openblas_set_num_threads(1);
  int rc = kern__pool_open(&c->pool, threads);
  if (rc) {
    free(c);
    return tsr_errf(err, len, rc, "cannot start %d CPU threads", threads);
  }
#ifdef KERN_HAVE_DNNL
  if ((rc = kern__dnnl_open(&c->dnnl, threads, err, len))) {
    kern__pool_close(c->pool);
    free(c);
    return rc;
  }
#endif
  *impl = c;
  return 0;
}

static void cpu_close(void *impl) {
  kern__cpu *c = impl;
#ifdef KERN_HAVE_DNNL
  kern__dnnl_close(c->dnnl);
#endif
  kern__pool_close(c->pool);
  for (int i = 0; i < KERN__CPU_SCRATCH; i++) free(c->scratch[i]);
  free(c);
}

static int cpu_threads(void *impl) {
  return kern__pool_threads(((kern__cpu *)impl)->pool);
}

/* ---- ranges over the pool ---------------------------------------------- */
typedef struct {
  kern__range_fn fn;
  void *arg;
  int64_t total, per;
} par_job;

static void par_item(void *a, int64_t i, int tid) {
  par_job *j = a;
  int64_t r0 = i * j->per, r1 = r0 + j->per;
  j->fn(j->arg, r0, r1 < j->total ? r1 : j->total, tid);
}

int64_t kern__cpu_par_count(int64_t total, int64_t grain) {
  return kern__pool_items(total, grain);
}

int64_t kern__cpu_par_fixed(kern__cpu *c, int64_t total, int64_t grain,
                            kern__range_fn fn, void *arg) {
  if (grain < 1) grain = 1;
  par_job j = {fn, arg, total, grain};
  int64_t n = kern__pool_items(total, grain);
  if (total > 0) kern__pool_run(c->pool, n, par_item, &j);
  return n;
}

void kern__cpu_par(kern__cpu *c, int64_t total, int64_t grain,
                   kern__range_fn fn, void *arg) {
  if (total <= 0) return;
  if (kern__pool_threads(c->pool) == 1 || total <= grain) {
    fn(arg, 0, total, 0);
    return;
  }
  kern__cpu_par_fixed(c, total, grain, fn, arg);
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

float *kern__cpu_scratch(kern__cpu *c, int i, size_t n) {
  if (c->scratch_n[i] < n) {
    free(c->scratch[i]);
    c->scratch[i] = cpu_alloc(c, n * sizeof(float));
    c->scratch_n[i] = c->scratch[i] ? n : 0;
  }
  return c->scratch[i];
}

/* A product big enough for several threads is cut into blocks of C's rows
 * (or columns, whichever dimension is longer: the operand every block
 * packs again is then the smaller one), each one single-threaded sgemm
 * over the whole k, so every element of C is the same dot product as in
 * one call. */
typedef struct {
  bool ta, tb;
  int64_t m, n, k, bm, bn, nbm;
  float alpha, beta;
  const float *A, *B;
  float *C;
} gemm_job;

static void gemm_block(void *a, int64_t i, int tid) {
  const gemm_job *j = a;
  int64_t i0 = (i % j->nbm) * j->bm, j0 = (i / j->nbm) * j->bn;
  int64_t mb = j->m - i0 < j->bm ? j->m - i0 : j->bm;
  int64_t nb = j->n - j0 < j->bn ? j->n - j0 : j->bn;
  const float *A = j->ta ? j->A + i0 : j->A + i0 * j->k;
  const float *B = j->tb ? j->B + j0 * j->k : j->B + j0;
  cblas_sgemm(CblasRowMajor, j->ta ? CblasTrans : CblasNoTrans,
              j->tb ? CblasTrans : CblasNoTrans, (int)mb, (int)nb, (int)j->k,
              j->alpha, A, (int)(j->ta ? j->m : j->k), B,
              (int)(j->tb ? j->k : j->n), j->beta, j->C + i0 * j->n + j0,
              (int)j->n);
}

#define GEMM_BLOCK_MACS (1 << 21) /* smallest block worth a thread */

/* Blocks of a split product (1: one call); rows or columns per block in
 * *bm / *bn, multiples of 16. */
static int64_t gemm_split(int threads, int64_t m, int64_t n, int64_t k,
                          int64_t *bm, int64_t *bn) {
  *bm = m;
  *bn = n;
  double macs = (double)m * (double)n * (double)k;
  if (threads < 2 || macs < 2.0 * GEMM_BLOCK_MACS) return 1;
  int64_t want = 2 * (int64_t)threads; /* room to balance a busy machine */
  if (macs / (double)want < GEMM_BLOCK_MACS)
    want = (int64_t)(macs / GEMM_BLOCK_MACS);
  int64_t len = m >= n ? m : n;
  int64_t b = (len + want - 1) / want;
  b = (b + 15) / 16 * 16;
  if (b >= len) return 1;
  if (m >= n) *bm = b;
  else *bn = b;
  return ((m + *bm - 1) / *bm) * ((n + *bn - 1) / *bn);
}

/* One block: the same column-major call the GPU makes (kern_plan_gemm),
 * so every CPU product also runs the mapping; OpenBLAS's row-major entry
 * swaps the operands the same way. */
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
    float *a = kern__cpu_scratch(c, 0, (size_t)(m * k));
    float *b = kern__cpu_scratch(c, 1, (size_t)(k * n));
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
  int64_t bm, bn;
  int64_t blocks = gemm_split(kern__pool_threads(c->pool), m, n, k, &bm, &bn);
  if (blocks == 1) {
    cblas_sgemm(CblasColMajor, g.trans_a ? CblasTrans : CblasNoTrans,
                g.trans_b ? CblasTrans : CblasNoTrans, g.m, g.n, g.k, alpha,
                B, g.lda, A, g.ldb, beta, C, g.ldc);
    return 0;
  }
  gemm_job j = {ta, tb, m, n, k, bm, bn, (m + bm - 1) / bm, alpha, beta,
                A, B, C};
  kern__pool_run(c->pool, blocks, gemm_block, &j);
  return 0;
}

/* db = beta * db + column sums: per range of rows a partial sum, the
 * partials added in range order. */
#define COL_SUM_ROWS 256
typedef struct {
  const float *dz;
  int64_t d;
  float *part;
} col_sum_job;

KERN__HOT static void col_sum_range(void *a, int64_t r0, int64_t r1, int tid) {
  const col_sum_job *j = a;
  float *p = j->part + (r0 / COL_SUM_ROWS) * j->d;
  memset(p, 0, (size_t)j->d * sizeof *p);
  for (int64_t i = r0; i < r1; i++) {
    const float *r = j->dz + i * j->d;
    for (int64_t t = 0; t < j->d; t++) p[t] += r[t];
  }
}

static int cpu_col_sum(void *impl, const float *dz, int64_t n, int64_t d,
                       float beta, float *db) {
  kern__cpu *c = impl;
  if (beta == 0.0f)
    memset(db, 0, (size_t)d * sizeof *db);
  else if (beta != 1.0f)
    for (int64_t j = 0; j < d; j++) db[j] *= beta;
  if (n <= 0) return 0;
  int64_t parts = kern__cpu_par_count(n, COL_SUM_ROWS);
  col_sum_job j = {dz, d, kern__cpu_scratch(c, 2, (size_t)(parts * d))};
  if (!j.part)
    return kern__cpu_fail(c, TSR_ENOMEM, "col_sum: no memory for %lld "
                          "partial sums", (long long)(parts * d));
  kern__cpu_par_fixed(c, n, COL_SUM_ROWS, col_sum_range, &j);
  for (int64_t p = 0; p < parts; p++) {
    const float *r = j.part + p * d;
    for (int64_t t = 0; t < d; t++) db[t] += r[t];
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

/* Element-wise ops: ranges of EW_GRAIN elements over the pool. */
#define EW_GRAIN (1 << 15)
typedef struct {
  float *x, *mask;
  const float *src;
  float a, keep;
  uint32_t thr;
  uint64_t seed;
} ew_job;

KERN__HOT static void scale_range(void *a, int64_t i0, int64_t i1, int tid) {
  const ew_job *j = a;
  for (int64_t i = i0; i < i1; i++) j->x[i] *= j->a;
}
static int cpu_scale(void *impl, float *x, size_t n, float a) {
  ew_job j = {.x = x, .a = a};
  kern__cpu_par(impl, (int64_t)n, EW_GRAIN, scale_range, &j);
  return 0;
}

KERN__HOT static void axpy_range(void *a, int64_t i0, int64_t i1, int tid) {
  const ew_job *j = a;
  for (int64_t i = i0; i < i1; i++) j->x[i] += j->a * j->src[i];
}
static int cpu_axpy(void *impl, float *y, const float *x, size_t n, float a) {
  ew_job j = {.x = y, .src = x, .a = a};
  kern__cpu_par(impl, (int64_t)n, EW_GRAIN, axpy_range, &j);
  return 0;
}

KERN__HOT static void dropout_range(void *a, int64_t i0, int64_t i1, int tid) {
  const ew_job *j = a;
  for (int64_t i = i0; i < i1; i++) {
    j->mask[i] = kern_math_dropout_mask(j->seed, (size_t)i, j->thr, j->keep);
    j->x[i] *= j->mask[i];
  }
}
static int cpu_dropout(void *impl, float *x, float *mask, size_t n,
                       float rate, uint64_t seed) {
  ew_job j = {.x = x, .mask = mask, .thr = kern_math_dropout_threshold(rate),
              .keep = kern_math_dropout_keep(rate), .seed = seed};
  kern__cpu_par(impl, (int64_t)n, EW_GRAIN, dropout_range, &j);
  return 0;
}

KERN__HOT static void mul_range(void *a, int64_t i0, int64_t i1, int tid) {
  const ew_job *j = a;
  for (int64_t i = i0; i < i1; i++) j->x[i] *= j->src[i];
}
static int cpu_mul(void *impl, float *x, const float *m, size_t n) {
  ew_job j = {.x = x, .src = m};
  kern__cpu_par(impl, (int64_t)n, EW_GRAIN, mul_range, &j);
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
    .threads = cpu_threads,
};
