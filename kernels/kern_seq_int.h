/* The backend table of kern_seq.h's ops, reached from kern__ops.seq. The
 * CPU backend fills it in kernels/cpu/cpu_seq.c, the CUDA module in
 * kernels/cuda/seq.cu. Plain C so nvcc can include it. Arguments are
 * checked by kern_seq.c before they get here. */
#ifndef TSR_KERN_SEQ_INT_H
#define TSR_KERN_SEQ_INT_H

#include "kernels/kern_int.h"
#include "kernels/kern_seq.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kern__seq_ops {
  int (*to_steps)(void *impl, int64_t n, int64_t T, int64_t d,
                  const float *x, bool reverse, float beta, float *out);
  int (*from_steps)(void *impl, int64_t n, int64_t T, int64_t d,
                    const float *in, bool reverse, const float *m, float beta,
                    float *y);
  int (*lstm)(void *impl, int64_t n, int64_t u, float *g, const float *c_prev,
              const float *h_prev, const float *m, float *c, float *h);
  int (*lstm_grad)(void *impl, int64_t n, int64_t u, const float *g,
                   const float *c_prev, const float *c, const float *m,
                   const float *dh_out, float *dh, float *dc, float *dg);
  int (*gru)(void *impl, int64_t n, int64_t u, float *xg, const float *rg,
             const float *h_prev, const float *m, float *h);
  int (*gru_grad)(void *impl, int64_t n, int64_t u, const float *xg,
                  const float *rg, const float *h_prev, const float *m,
                  const float *dh_out, float *dh, float *dxg, float *drg);
  int (*gemm_batched)(void *impl, bool ta, bool tb, int64_t m, int64_t n,
                      int64_t k, float alpha, const float *A, int64_t sa,
                      const float *B, int64_t sb, float beta, float *C,
                      int64_t sc, int64_t batch);
  int (*swap12)(void *impl, int64_t a, int64_t b, int64_t c, int64_t d,
                const float *src, float beta, float *dst);
  int (*attn_softmax)(void *impl, int64_t B, int64_t H, int64_t Tq,
                      int64_t Tk, const float *s, float scale,
                      const float *qm, const float *km, float *p);
  int (*attn_softmax_grad)(void *impl, int64_t rows, int64_t Tk,
                           const float *dp, const float *p, float scale,
                           float *ds);
  int (*masked_mean)(void *impl, int64_t n, int64_t T, int64_t c,
                     const float *x, const float *m, float *y);
  int (*masked_mean_grad)(void *impl, int64_t n, int64_t T, int64_t c,
                          const float *dy, const float *m, float beta,
                          float *dx);
} kern__seq_ops;

extern const kern__seq_ops kern__cpu_seq_ops;

#ifdef __cplusplus
}
#endif

#endif
