/* CUDA kernels of the GPU backend: bias + activation and their gradients,
 * softmax (a block per row), column sums in two deterministic passes,
 * losses (a thread per row, fp64 accumulation as on the CPU), embedding
 * gather (a block per bag) and scatter-add (a block per unique row over its
 * own occurrences, so no atomics and a fixed summation order), casts and
 * rounding to bf16/fp16, the loss-scale finiteness check, dropout with the
 * same counter-based mask as the CPU. Formulas follow kernels/cpu/cpu_ops.c
 * line for line so both backends agree to fp32 rounding. Failure modes:
 * launch errors and scratch allocation, mapped to TSR_E* codes.
 */
#include "kernels/cuda/cuda_int.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>

#define SELU_ALPHA 1.6732632423543772f
#define SELU_SCALE 1.0507009873554805f
#define KERAS_EPS 1e-7f
#define TPB 256

static inline unsigned blocks_for(size_t n) {
  size_t b = (n + TPB - 1) / TPB;
  return (unsigned)(b > 65535 * 8 ? 65535 * 8 : (b ? b : 1));
}

__device__ __forceinline__ float d_sigm(float z) {
  return z >= 0 ? 1.0f / (1.0f + expf(-z)) : expf(z) / (1.0f + expf(z));
}

__device__ __forceinline__ float d_act(kern_act a, float z, float alpha) {
  switch (a) {
    case KERN_ACT_RELU: return z > 0 ? z : 0.0f;
    case KERN_ACT_RELU6: return z > 0 ? (z < 6.0f ? z : 6.0f) : 0.0f;
    case KERN_ACT_LEAKY_RELU: return z > 0 ? z : alpha * z;
    case KERN_ACT_SIGMOID: return d_sigm(z);
    case KERN_ACT_TANH: return tanhf(z);
    case KERN_ACT_ELU: return z > 0 ? z : alpha * expm1f(z);
    case KERN_ACT_SELU: return SELU_SCALE * (z > 0 ? z : SELU_ALPHA * expm1f(z));
    case KERN_ACT_GELU: return 0.5f * z * (1.0f + erff(z * 0.70710678118654752f));
    case KERN_ACT_SWISH: return z * d_sigm(z);
    case KERN_ACT_SOFTPLUS: return (z > 0 ? z : 0.0f) + log1pf(expf(-fabsf(z)));
    case KERN_ACT_SOFTSIGN: return z / (1.0f + fabsf(z));
    case KERN_ACT_EXPONENTIAL: return expf(z);
    default: return z;
  }
}

__device__ __forceinline__ float d_act_grad(kern_act a, float g, float z,
                                            float y, float alpha) {
  switch (a) {
    case KERN_ACT_RELU: return z > 0 ? g : 0.0f;
    case KERN_ACT_RELU6: return (z > 0 && z < 6.0f) ? g : 0.0f;
    case KERN_ACT_LEAKY_RELU: return z > 0 ? g : alpha * g;
    case KERN_ACT_SIGMOID: return g * y * (1.0f - y);
    case KERN_ACT_TANH: return g * (1.0f - y * y);
    case KERN_ACT_ELU: return z > 0 ? g : g * (y + alpha);
    case KERN_ACT_SELU: return z > 0 ? g * SELU_SCALE : g * (y + SELU_SCALE * SELU_ALPHA);
    case KERN_ACT_GELU: {
      float cdf = 0.5f * (1.0f + erff(z * 0.70710678118654752f));
      float pdf = 0.3989422804014327f * expf(-0.5f * z * z);
      return g * (cdf + z * pdf);
    }
    case KERN_ACT_SWISH: {
      float s = d_sigm(z);
      return g * (s + y * (1.0f - s));
    }
    case KERN_ACT_SOFTPLUS: return g * d_sigm(z);
    case KERN_ACT_SOFTSIGN: {
      float a1 = 1.0f + fabsf(z);
      return g / (a1 * a1);
    }
    case KERN_ACT_EXPONENTIAL: return g * y;
    default: return g;
  }
}

__global__ void k_bias_act(float *z, const float *bias, float *y, size_t N,
                           int64_t d, kern_act act, float alpha) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < N;
       i += (size_t)gridDim.x * blockDim.x) {
    float v = z[i];
    if (bias) {
      v += bias[i % (size_t)d];
      z[i] = v;
    }
    y[i] = d_act(act, v, alpha);
  }
}

/* block-wide reduction helpers (blockDim.x == TPB) */
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
    float e = expf(zr[j] - mx);
    yr[j] = e;
    s += e;
  }
  s = block_sum(s, sh);
  float inv = 1.0f / s;
  for (int64_t j = threadIdx.x; j < d; j += TPB) yr[j] *= inv;
}

__global__ void k_add_bias(float *z, const float *bias, size_t N, int64_t d) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < N;
       i += (size_t)gridDim.x * blockDim.x)
    z[i] += bias[i % (size_t)d];
}

int kc__bias_act(kc_ctx *c, float *z, const float *bias, float *y, int64_t n,
                 int64_t d, kern_act act, float alpha) {
  size_t N = (size_t)(n * d);
  if (act == KERN_ACT_SOFTMAX) {
    if (bias) k_add_bias<<<blocks_for(N), TPB, 0, c->s>>>(z, bias, N, d);
    k_softmax<<<(unsigned)n, TPB, 0, c->s>>>(z, y, d);
  } else {
    k_bias_act<<<blocks_for(N), TPB, 0, c->s>>>(z, bias, y, N, d, act, alpha);
  }
  return kc__launch_check();
}

__global__ void k_act_grad(const float *dy, const float *z, const float *y,
                           float *dz, size_t N, kern_act act, float alpha) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < N;
       i += (size_t)gridDim.x * blockDim.x)
    dz[i] = d_act_grad(act, dy[i], z[i], y ? y[i] : 0.0f, alpha);
}

__global__ void k_softmax_grad(const float *dy, const float *y, float *dz,
                               int64_t d) {
  __shared__ float sh[TPB / 32];
  const float *g = dy + blockIdx.x * d, *yr = y + blockIdx.x * d;
  float *o = dz + blockIdx.x * d;
  float s = 0;
  for (int64_t j = threadIdx.x; j < d; j += TPB) s += g[j] * yr[j];
  s = block_sum(s, sh);
  for (int64_t j = threadIdx.x; j < d; j += TPB) o[j] = yr[j] * (g[j] - s);
}

int kc__act_grad(kc_ctx *c, const float *dy, const float *z, const float *y,
                 float *dz, int64_t n, int64_t d, kern_act act, float alpha) {
  size_t N = (size_t)(n * d);
  if (act == KERN_ACT_SOFTMAX)
    k_softmax_grad<<<(unsigned)n, TPB, 0, c->s>>>(dy, y, dz, d);
  else
    k_act_grad<<<blocks_for(N), TPB, 0, c->s>>>(dy, z, y, dz, N, act, alpha);
  return kc__launch_check();
}

/* column sums: pass 1 sums row chunks into part[chunk][d], pass 2 adds the
 * chunks in order (deterministic, no atomics) */
#define CS_CHUNKS 64
__global__ void k_colsum_part(const float *dz, int64_t n, int64_t d,
                              int64_t rows_per, float *part) {
  int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (j >= d) return;
  int64_t r0 = blockIdx.y * rows_per, r1 = r0 + rows_per < n ? r0 + rows_per : n;
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
  int chunks = n < CS_CHUNKS ? (int)(n > 0 ? n : 1) : CS_CHUNKS;
  int64_t rows_per = (n + chunks - 1) / chunks;
  int rc = kc__scratch((void **)&c->part, &c->part_n,
                       (size_t)chunks * (size_t)d * sizeof(float));
  if (rc) return rc;
  dim3 g1((unsigned)((d + TPB - 1) / TPB), (unsigned)chunks);
  k_colsum_part<<<g1, TPB, 0, c->s>>>(dz, n, d, rows_per, c->part);
  k_colsum_fin<<<(unsigned)((d + TPB - 1) / TPB), TPB, 0, c->s>>>(
      c->part, chunks, d, beta, db);
  return kc__launch_check();
}

/* one thread per row; mirrors kern__cpu_loss */
__global__ void k_loss(kern_loss kind, float param, const float *p,
                       const float *y, int64_t n, int64_t d, float s,
                       float *ex, float *grad) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float *pi = p + i * d;
  float *gi = grad ? grad + i * d : NULL;
  bool sparse = kind == KERN_LOSS_SPARSE_CCE_LOGITS ||
                kind == KERN_LOSS_SPARSE_CCE_PROBS;
  int64_t cls = sparse ? (int64_t)y[i] : -1;
  const float *yi = sparse ? NULL : y + i * d;
  double L = 0;
  switch (kind) {
    case KERN_LOSS_MSE:
      for (int64_t j = 0; j < d; j++) {
        float e = pi[j] - yi[j];
        L += (double)e * e;
        if (gi) gi[j] = 2.0f * e / (float)d * s;
      }
      L /= (double)d;
      break;
    case KERN_LOSS_MAE:
      for (int64_t j = 0; j < d; j++) {
        float e = pi[j] - yi[j];
        L += fabs((double)e);
        if (gi) gi[j] = (e > 0 ? 1.0f : e < 0 ? -1.0f : 0.0f) / (float)d * s;
      }
      L /= (double)d;
      break;
    case KERN_LOSS_BCE_LOGITS:
      for (int64_t j = 0; j < d; j++) {
        double z = pi[j], t = yi[j];
        L += (z > 0 ? z : 0) - z * t + log1p(exp(-fabs(z)));
        if (gi) gi[j] = (d_sigm(pi[j]) - yi[j]) / (float)d * s;
      }
      L /= (double)d;
      break;
    case KERN_LOSS_BCE_PROBS:
      for (int64_t j = 0; j < d; j++) {
        double q = pi[j], t = yi[j];
        bool clipped = q < KERAS_EPS || q > 1.0 - KERAS_EPS;
        double qc = q < KERAS_EPS ? KERAS_EPS : q > 1.0 - KERAS_EPS ? 1.0 - KERAS_EPS : q;
        L -= t * log(qc + KERAS_EPS) + (1 - t) * log(1 - qc + KERAS_EPS);
        if (gi)
          gi[j] = clipped ? 0.0f
                          : (float)((-t / (q + KERAS_EPS) + (1 - t) / (1 - q + KERAS_EPS)) /
                                    (double)d * s);
      }
      L /= (double)d;
      break;
    case KERN_LOSS_CCE_LOGITS:
    case KERN_LOSS_SPARSE_CCE_LOGITS: {
      float mx = pi[0];
      for (int64_t j = 1; j < d; j++) mx = pi[j] > mx ? pi[j] : mx;
      double se = 0;
      for (int64_t j = 0; j < d; j++) se += exp((double)(pi[j] - mx));
      double lse = log(se) + mx, tsum = 0;
      for (int64_t j = 0; j < d; j++) {
        double tj = yi ? yi[j] : (j == cls ? 1.0 : 0.0);
        L += tj * (lse - pi[j]);
        tsum += tj;
      }
      if (gi)
        for (int64_t j = 0; j < d; j++) {
          double tj = yi ? yi[j] : (j == cls ? 1.0 : 0.0);
          gi[j] = (float)((exp(pi[j] - lse) * tsum - tj) * s);
        }
      break;
    }
    case KERN_LOSS_CCE_PROBS:
    case KERN_LOSS_SPARSE_CCE_PROBS: {
      double S = 0, gq = 0;
      for (int64_t j = 0; j < d; j++) S += pi[j];
      for (int64_t j = 0; j < d; j++) {
        double tj = yi ? yi[j] : (j == cls ? 1.0 : 0.0);
        double q = pi[j] / S;
        bool clipped = q < KERAS_EPS || q > 1.0 - KERAS_EPS;
        double qc = q < KERAS_EPS ? KERAS_EPS : q > 1.0 - KERAS_EPS ? 1.0 - KERAS_EPS : q;
        L -= tj * log(qc);
        double dq = clipped ? 0.0 : -tj / q;
        if (gi) gi[j] = (float)dq;
        gq += dq * q;
      }
      if (gi)
        for (int64_t j = 0; j < d; j++) gi[j] = (float)((gi[j] - gq) / S * s);
      break;
    }
    case KERN_LOSS_HUBER:
      for (int64_t j = 0; j < d; j++) {
        double e = (double)pi[j] - yi[j], a = fabs(e);
        L += a <= param ? 0.5 * e * e : param * (a - 0.5 * param);
        if (gi)
          gi[j] = (float)((a <= param ? e : e > 0 ? param : -param) /
                          (double)d * s);
      }
      L /= (double)d;
      break;
    case KERN_LOSS_KLD:
      for (int64_t j = 0; j < d; j++) {
        double t = yi[j], q = pi[j];
        double tc = t < KERAS_EPS ? KERAS_EPS : t > 1 ? 1 : t;
        bool clipped = q < KERAS_EPS || q > 1;
        double qc = q < KERAS_EPS ? KERAS_EPS : q > 1 ? 1 : q;
        L += tc * log(tc / qc);
        if (gi) gi[j] = clipped ? 0.0f : (float)(-tc / q * s);
      }
      break;
    default:
      break;
  }
  if (ex) ex[i] = (float)L;
}

int kc__loss(kc_ctx *c, kern_loss kind, float param, const float *p,
             const float *y, int64_t n, int64_t d, float s, float *ex_loss,
             float *grad) {
  k_loss<<<(unsigned)((n + 127) / 128), 128, 0, c->s>>>(
      kind, param, p, y, n, d, s, ex_loss, grad);
  return kc__launch_check();
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
  int th = dim >= 128 ? 128 : dim >= 32 ? 32 : (int)dim;
  k_gather<<<(unsigned)nb, th > 0 ? th : 1, 0, c->s>>>(rows, dim, idx, bag_off,
                                                      pool, out, stride, off);
  return kc__launch_check();
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
  int th = dim >= 128 ? 128 : dim >= 32 ? 32 : (int)dim;
  k_scatter<<<(unsigned)n_uniq, th > 0 ? th : 1, 0, c->s>>>(
      dout, stride, off, dim, occ_off, occ_bag, occ_w, grad);
  return kc__launch_check();
}

__global__ void k_to_bf16(const float *x, __nv_bfloat16 *o, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    o[i] = __float2bfloat16_rn(x[i]);
}
__global__ void k_to_f16(const float *x, __half *o, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    o[i] = __float2half_rn(x[i]);
}
__global__ void k_round(float *x, size_t n, int bf) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    x[i] = bf ? __bfloat162float(__float2bfloat16_rn(x[i]))
              : __half2float(__float2half_rn(x[i]));
}

int kc__to_half(kc_ctx *c, const float *x, void *out, size_t n,
                kern_prec prec) {
  if (prec == KERN_BF16)
    k_to_bf16<<<blocks_for(n), TPB, 0, c->s>>>(x, (__nv_bfloat16 *)out, n);
  else
    k_to_f16<<<blocks_for(n), TPB, 0, c->s>>>(x, (__half *)out, n);
  return kc__launch_check();
}

int kc__round(kc_ctx *c, float *x, size_t n, kern_prec prec) {
  k_round<<<blocks_for(n), TPB, 0, c->s>>>(x, n, prec == KERN_BF16);
  return kc__launch_check();
}

__global__ void k_finite(const float *x, size_t n, int *flag) {
  bool bad = false;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    bad |= !isfinite(x[i]);
  if (__any_sync(0xffffffff, bad) && (threadIdx.x & 31) == 0) *flag = 1;
}

int kc__all_finite(kc_ctx *c, const float *x, size_t n, bool *finite) {
  cudaError_t e = cudaMemsetAsync(c->flag, 0, sizeof(int), c->s);
  if (e != cudaSuccess) return kc__err(e);
  k_finite<<<blocks_for(n), TPB, 0, c->s>>>(x, n, c->flag);
  int rc = kc__launch_check();
  if (rc) return rc;
  e = cudaMemcpyAsync(c->hflag, c->flag, sizeof(int), cudaMemcpyDeviceToHost, c->s);
  if (e == cudaSuccess) e = cudaStreamSynchronize(c->s);
  if (e != cudaSuccess) return kc__err(e);
  *finite = *c->hflag == 0;
  return 0;
}

__global__ void k_scale(float *x, size_t n, float a) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    x[i] *= a;
}
__global__ void k_axpy(float *y, const float *x, size_t n, float a) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    y[i] += a * x[i];
}
__global__ void k_mul(float *x, const float *m, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    x[i] *= m[i];
}
__global__ void k_dropout(float *x, float *mask, size_t n, uint32_t thr,
                          float keep, uint64_t seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    float m = kern__hash32(seed, i) >= thr ? keep : 0.0f;
    mask[i] = m;
    x[i] *= m;
  }
}

int kc__scale(kc_ctx *c, float *x, size_t n, float a) {
  k_scale<<<blocks_for(n), TPB, 0, c->s>>>(x, n, a);
  return kc__launch_check();
}
int kc__axpy(kc_ctx *c, float *y, const float *x, size_t n, float a) {
  k_axpy<<<blocks_for(n), TPB, 0, c->s>>>(y, x, n, a);
  return kc__launch_check();
}
int kc__mul(kc_ctx *c, float *x, const float *m, size_t n) {
  k_mul<<<blocks_for(n), TPB, 0, c->s>>>(x, m, n);
  return kc__launch_check();
}
int kc__dropout(kc_ctx *c, float *x, float *mask, size_t n, float rate,
                uint64_t seed) {
  uint32_t thr = (uint32_t)((double)rate * 4294967296.0);
  k_dropout<<<blocks_for(n), TPB, 0, c->s>>>(x, mask, n, thr,
                                             1.0f / (1.0f - rate), seed);
  return kc__launch_check();
}
