/* CUDA kernels of the GPU backend: indexing and launches only. Every
 * formula is kern_math.h's (the CPU backend calls the same functions) and
 * every grid comes from kern_plan.h (both tested on the CPU). Bias +
 * activation and their gradients, softmax (a block per row), column sums
 * in two deterministic passes, losses (a thread per row), embedding gather
 * (a block per bag) and scatter-add (a block per unique row over its own
 * occurrences: no atomics, a fixed summation order), 16-bit casts and
 * rounding, the loss-scale finiteness check, dropout. Failure modes: a
 * size over a grid limit (TSR_ERANGE), launch errors and scratch
 * allocation, recorded with their CUDA name in the context's message.
 */
#include "kernels/cuda/cuda_int.h"
#include "kernels/kern_math.h"
#include "kernels/kern_plan.h"

#define TPB KERN_PLAN_TPB
#define GRID_STRIDE(i, n)                                                   \
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); \
       i += (size_t)gridDim.x * blockDim.x)

static unsigned blocks_for(size_t n) {
  return kern_plan_stride_blocks(n, TPB);
}

__global__ void k_bias_act(float *z, const float *bias, float *y, size_t N,
                           int64_t d, kern_act act, float alpha) {
  GRID_STRIDE(i, N) {
    float v = z[i];
    if (bias) {
      v += bias[i % (size_t)d];
      z[i] = v;
    }
    y[i] = kern_math_act(act, v, alpha);
  }
}

/* block-wide reductions (blockDim.x == TPB) */
__device__ float block_max(float v, float *sh) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, o));
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
  __syncthreads();
  float r = sh[0];
  for (int w = 1; w < TPB / 32; w++) r = fmaxf(r, sh[w]);
  __syncthreads();
  return r;
}
__device__ float block_sum(float v, float *sh) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
  __syncthreads();
  float r = 0;
  for (int w = 0; w < TPB / 32; w++) r += sh[w];
  __syncthreads();
  return r;
}

__global__ void k_softmax(const float *z, float *y, int64_t d) {
  __shared__ float sh[TPB / 32];
  const float *zr = z + blockIdx.x * d;
  float *yr = y + blockIdx.x * d;
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < d; j += TPB) mx = fmaxf(mx, zr[j]);
  mx = block_max(mx, sh);
  float s = 0;
  for (int64_t j = threadIdx.x; j < d; j += TPB) {
    float e = kern_math_softmax_exp(zr[j], mx);
    yr[j] = e;
    s += e;
  }
  s = block_sum(s, sh);
  float inv = 1.0f / s;
  for (int64_t j = threadIdx.x; j < d; j += TPB) yr[j] *= inv;
}

__global__ void k_add_bias(float *z, const float *bias, size_t N, int64_t d) {
  GRID_STRIDE(i, N) z[i] += bias[i % (size_t)d];
}

int kc__bias_act(kc_ctx *c, float *z, const float *bias, float *y, int64_t n,
                 int64_t d, kern_act act, float alpha) {
  size_t N = (size_t)(n * d);
  if (act == KERN_ACT_SOFTMAX) {
    unsigned g;
    if (kern_plan_row_blocks(n, &g))
      return kc__fail(c, TSR_ERANGE, "softmax over %lld rows: more than a "
                      "grid holds", (long long)n);
    if (bias) k_add_bias<<<blocks_for(N), TPB, 0, c->s>>>(z, bias, N, d);
    k_softmax<<<g, TPB, 0, c->s>>>(z, y, d);
  } else {
    k_bias_act<<<blocks_for(N), TPB, 0, c->s>>>(z, bias, y, N, d, act, alpha);
  }
  return kc__launch_check(c, "bias_act");
}

__global__ void k_act_grad(const float *dy, const float *z, const float *y,
                           float *dz, size_t N, kern_act act, float alpha) {
  GRID_STRIDE(i, N)
    dz[i] = kern_math_act_grad(act, dy[i], z[i], y ? y[i] : 0.0f, alpha);
}

__global__ void k_softmax_grad(const float *dy, const float *y, float *dz,
                               int64_t d) {
  __shared__ float sh[TPB / 32];
  const float *g = dy + blockIdx.x * d, *yr = y + blockIdx.x * d;
  float *o = dz + blockIdx.x * d;
  float s = 0;
  for (int64_t j = threadIdx.x; j < d; j += TPB) s += g[j] * yr[j];
  s = block_sum(s, sh);
  for (int64_t j = threadIdx.x; j < d; j += TPB)
    o[j] = kern_math_softmax_grad(g[j], yr[j], s);
}

int kc__act_grad(kc_ctx *c, const float *dy, const float *z, const float *y,
                 float *dz, int64_t n, int64_t d, kern_act act, float alpha) {
  size_t N = (size_t)(n * d);
  if (act == KERN_ACT_SOFTMAX) {
    unsigned g;
    if (kern_plan_row_blocks(n, &g))
      return kc__fail(c, TSR_ERANGE, "softmax gradient over %lld rows: more "
                      "than a grid holds", (long long)n);
    k_softmax_grad<<<g, TPB, 0, c->s>>>(dy, y, dz, d);
  } else {
    k_act_grad<<<blocks_for(N), TPB, 0, c->s>>>(dy, z, y, dz, N, act, alpha);
  }
  return kc__launch_check(c, "act_grad");
}

/* column sums: pass 1 sums row chunks into part[chunk][d], pass 2 adds the
 * chunks in order (deterministic, no atomics) */
__global__ void k_colsum_part(const float *dz, int64_t n, int64_t d,
                              kern_colsum_plan p, float *part) {
  int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (j >= d) return;
  int64_t r0, r1;
  kern_plan_colsum_rows(&p, (int)blockIdx.y, n, &r0, &r1);
  float s = 0;
  for (int64_t r = r0; r < r1; r++) s += dz[r * d + j];
  part[blockIdx.y * d + j] = s;
}
__global__ void k_colsum_fin(const float *part, int chunks, int64_t d,
                             float beta, float *db) {
  int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (j >= d) return;
  float s = 0;
  for (int k = 0; k < chunks; k++) s += part[k * d + j];
  db[j] = beta == 0.0f ? s : beta * db[j] + s;
}

int kc__col_sum(kc_ctx *c, const float *dz, int64_t n, int64_t d, float beta,
                float *db) {
  kern_colsum_plan p;
  if (kern_plan_colsum(n, d, TPB, &p))
    return kc__fail(c, TSR_ERANGE, "column sum of [%lld, %lld]: more than a "
                    "grid holds", (long long)n, (long long)d);
  int rc = kc__scratch(c, (void **)&c->part, &c->part_bytes,
                       (size_t)p.chunks * (size_t)d * sizeof(float),
                       "column-sum partials");
  if (rc) return rc;
  dim3 g1(p.grid_x, (unsigned)p.chunks);
  k_colsum_part<<<g1, TPB, 0, c->s>>>(dz, n, d, p, c->part);
  k_colsum_fin<<<p.grid_x, TPB, 0, c->s>>>(c->part, p.chunks, d, beta, db);
  return kc__launch_check(c, "col_sum");
}

/* a thread per row; the row's formula is the CPU's */
__global__ void k_loss(kern_loss kind, float param, const float *p,
                       const float *y, int64_t n, int64_t d, float s,
                       float *ex, float *grad) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i >= n) return;
  bool sparse = kern_math_loss_sparse(kind);
  int64_t cls = sparse ? kern_math_sparse_class(y[i], d) : -1;
  double L = kern_math_loss_row_p(kind, param, p + i * d,
                                  sparse ? NULL : y + i * d, cls, d, s,
                                  grad ? grad + i * d : NULL);
  if (ex) ex[i] = (float)L;
}

#define LOSS_TPB 128
int kc__loss(kc_ctx *c, kern_loss kind, float param, const float *p,
             const float *y, int64_t n, int64_t d, float s, float *ex_loss,
             float *grad) {
  unsigned g;
  if (kern_plan_thread_blocks(n, LOSS_TPB, &g))
    return kc__fail(c, TSR_ERANGE, "loss over %lld rows: more than a grid "
                    "holds", (long long)n);
  k_loss<<<g, LOSS_TPB, 0, c->s>>>(kind, param, p, y, n, d, s, ex_loss,
                                    grad);
  return kc__launch_check(c, "loss");
}

__global__ void k_gather(const float *rows, int64_t dim, const int32_t *idx,
                         const int32_t *bag_off, kern_pool pool, float *out,
                         int64_t stride, int64_t off) {
  int64_t b = blockIdx.x;
  int32_t lo = bag_off[b], hi = bag_off[b + 1];
  float sc = pool == KERN_POOL_MEAN && hi - lo > 1 ? 1.0f / (float)(hi - lo) : 1.0f;
  for (int64_t t = threadIdx.x; t < dim; t += blockDim.x) {
    float s = 0;
    for (int32_t j = lo; j < hi; j++) s += rows[(int64_t)idx[j] * dim + t];
    out[b * stride + off + t] = s * sc;
  }
}

int kc__gather(kc_ctx *c, const float *rows, int64_t dim, const int32_t *idx,
               const int32_t *bag_off, int64_t nb, kern_pool pool, float *out,
               int64_t stride, int64_t off) {
  unsigned g;
  if (kern_plan_row_blocks(nb, &g))
    return kc__fail(c, TSR_ERANGE, "embedding gather of %lld bags: more "
                    "than a grid holds", (long long)nb);
  k_gather<<<g, kern_plan_row_threads(dim), 0, c->s>>>(
      rows, dim, idx, bag_off, pool, out, stride, off);
  return kc__launch_check(c, "embed_gather");
}

__global__ void k_scatter(const float *dout, int64_t stride, int64_t off,
                          int64_t dim, const int32_t *occ_off,
                          const int32_t *occ_bag, const float *occ_w,
                          float *grad) {
  int64_t u = blockIdx.x;
  for (int64_t t = threadIdx.x; t < dim; t += blockDim.x) {
    float s = 0;
    for (int32_t j = occ_off[u]; j < occ_off[u + 1]; j++)
      s += (occ_w ? occ_w[j] : 1.0f) * dout[(int64_t)occ_bag[j] * stride + off + t];
    grad[u * dim + t] = s;
  }
}

int kc__scatter(kc_ctx *c, const float *dout, int64_t stride, int64_t off,
                int64_t dim, const int32_t *occ_off, const int32_t *occ_bag,
                const float *occ_w, int64_t n_uniq, float *grad) {
  unsigned g;
  if (kern_plan_row_blocks(n_uniq, &g))
    return kc__fail(c, TSR_ERANGE, "embedding scatter of %lld rows: more "
                    "than a grid holds", (long long)n_uniq);
  k_scatter<<<g, kern_plan_row_threads(dim), 0, c->s>>>(
      dout, stride, off, dim, occ_off, occ_bag, occ_w, grad);
  return kc__launch_check(c, "embed_scatter");
}

/* the storage bits cuBLAS reads as CUDA_R_16BF / CUDA_R_16F */
__global__ void k_to_bf16(const float *x, uint16_t *o, size_t n) {
  GRID_STRIDE(i, n) o[i] = kern_math_bf16_bits(x[i]);
}
__global__ void k_to_f16(const float *x, uint16_t *o, size_t n) {
  GRID_STRIDE(i, n) o[i] = kern_math_f16_bits(x[i]);
}
__global__ void k_round(float *x, size_t n, kern_prec p) {
  GRID_STRIDE(i, n) x[i] = kern_math_round(p, x[i]);
}

int kc__to_half(kc_ctx *c, const float *x, void *out, size_t n,
                kern_prec prec) {
  if (prec == KERN_BF16)
    k_to_bf16<<<blocks_for(n), TPB, 0, c->s>>>(x, (uint16_t *)out, n);
  else
    k_to_f16<<<blocks_for(n), TPB, 0, c->s>>>(x, (uint16_t *)out, n);
  return kc__launch_check(c, "gemm input cast to 16 bits");
}

int kc__round(kc_ctx *c, float *x, size_t n, kern_prec prec) {
  k_round<<<blocks_for(n), TPB, 0, c->s>>>(x, n, prec);
  return kc__launch_check(c, "round");
}

__global__ void k_finite(const float *x, size_t n, int *flag) {
  bool bad = false;
  GRID_STRIDE(i, n) bad |= !isfinite(x[i]);
  if (__any_sync(0xffffffff, bad) && (threadIdx.x & 31) == 0) *flag = 1;
}

int kc__all_finite(kc_ctx *c, const float *x, size_t n, bool *finite) {
  cudaError_t e = cudaMemsetAsync(c->flag, 0, sizeof(int), c->s);
  if (e != cudaSuccess) return kc__cuda_fail(c, e, "all_finite: cudaMemsetAsync");
  k_finite<<<blocks_for(n), TPB, 0, c->s>>>(x, n, c->flag);
  int rc = kc__launch_check(c, "all_finite");
  if (rc) return rc;
  e = cudaMemcpyAsync(c->hflag, c->flag, sizeof(int), cudaMemcpyDeviceToHost, c->s);
  if (e != cudaSuccess) return kc__cuda_fail(c, e, "all_finite: cudaMemcpyAsync");
  e = cudaStreamSynchronize(c->s);
  if (e != cudaSuccess) return kc__cuda_fail(c, e, "all_finite: cudaStreamSynchronize");
  *finite = *c->hflag == 0;
  return 0;
}

__global__ void k_scale(float *x, size_t n, float a) {
  GRID_STRIDE(i, n) x[i] *= a;
}
__global__ void k_axpy(float *y, const float *x, size_t n, float a) {
  GRID_STRIDE(i, n) y[i] += a * x[i];
}
__global__ void k_mul(float *x, const float *m, size_t n) {
  GRID_STRIDE(i, n) x[i] *= m[i];
}
__global__ void k_dropout(float *x, float *mask, size_t n, uint32_t thr,
                          float keep, uint64_t seed) {
  GRID_STRIDE(i, n) {
    float m = kern_math_dropout_mask(seed, i, thr, keep);
    mask[i] = m;
    x[i] *= m;
  }
}

int kc__scale(kc_ctx *c, float *x, size_t n, float a) {
  k_scale<<<blocks_for(n), TPB, 0, c->s>>>(x, n, a);
  return kc__launch_check(c, "scale");
}
int kc__axpy(kc_ctx *c, float *y, const float *x, size_t n, float a) {
  k_axpy<<<blocks_for(n), TPB, 0, c->s>>>(y, x, n, a);
  return kc__launch_check(c, "axpy");
}
int kc__mul(kc_ctx *c, float *x, const float *m, size_t n) {
  k_mul<<<blocks_for(n), TPB, 0, c->s>>>(x, m, n);
  return kc__launch_check(c, "mul");
}
int kc__dropout(kc_ctx *c, float *x, float *mask, size_t n, float rate,
                uint64_t seed) {
  k_dropout<<<blocks_for(n), TPB, 0, c->s>>>(
      x, mask, n, kern_math_dropout_threshold(rate),
      kern_math_dropout_keep(rate), seed);
  return kc__launch_check(c, "dropout");
}
