/* Ops of sequence models, beside kern.h's dense ones and kern_nn.h's
 * images: the recurrent cells of Keras's LSTM and GRU (reset_after=True),
 * one time step at a time, the layout changes around them, strided
 * batches of matrix products and the masked softmax of attention, and the
 * masked mean of GlobalAveragePooling1D. Same context, device pointers and
 * stream ordering as kern.h; row-major float32.
 *
 * Layout: a sequence is [n, T, D] (Keras's batch-major). A recurrent layer
 * runs time-major in "step order": step s reads time p(s) = s, or T-1-s
 * when reversed (go_backwards, the backward half of a Bidirectional), so
 * every step's rows [n, D] are contiguous and the products of all steps
 * at once (inputs times kernel, gradients of the kernels) are single
 * GEMMs. A mask is 1 (keep) / 0 (padding) per example and time, float;
 * a masked step of a recurrent cell carries its state unchanged, as
 * Keras's rnn() does.
 *
 * Gate order and formulas are Keras's: LSTM gates [i, f, c, o] (sigmoid,
 * sigmoid, tanh, sigmoid), c' = f c + i g, h' = o tanh(c'); GRU gates [z,
 * r, h] with reset_after: z = s(xz + rz), r = s(xr + rr), hh = tanh(xh + r
 * rh), h' = z h + (1 - z) hh, where x* = x W + b_in and r* = h U + b_rec.
 *
 * Failure modes: bad sizes (TSR_EINVAL), a backend without these ops
 * (TSR_EUNSUPPORTED), device launch errors. The CPU backend implements them
 * in kernels/cpu/cpu_seq.c, the CUDA module in kernels/cuda/seq.cu, with
 * the per-element formulas of kern_seq_math.h (tests/gpu compares them).
 */
#ifndef TSR_KERN_SEQ_H
#define TSR_KERN_SEQ_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/kern.h"

/* out[s, b, :] = beta * out[s, b, :] + x[b, p(s), :] for x [n, T, d], out
 * [T, n, d] (step order). */
int kern_seq_to_steps(kern_ctx *ctx, int64_t n, int64_t T, int64_t d,
                      const float *x, bool reverse, float beta, float *out);
/* y[b, p(s), :] = beta * y[b, p(s), :] + in[s, b, :] * m[s, b] (m NULL: 1)
 * for in [T, n, d] in step order, y [n, T, d]. With T = 1 it scales rows
 * by a per-row factor. */
int kern_seq_from_steps(kern_ctx *ctx, int64_t n, int64_t T, int64_t d,
                        const float *in, bool reverse, const float *m,
                        float beta, float *y);

/* One LSTM step over n rows of u units. g[n, 4u] holds the pre-activations
 * (x W + b + h_prev U) and is overwritten with the activated gates, which
 * the backward step reads. c, h [n, u] get the new state; a row whose
 * mask m[b] is 0 keeps c_prev, h_prev (m may be NULL). */
int kern_lstm_step(kern_ctx *ctx, int64_t n, int64_t u, float *g,
                   const float *c_prev, const float *h_prev, const float *m,
                   float *c, float *h);
/* Its backward: dh [n, u] holds the gradient reaching h from later steps
 * (in), to which dh_out (the output's gradient at this step; may be NULL)
 * is added; dc [n, u] the one reaching c. Writes dg [n, 4u] (the
 * pre-activations' gradient), leaves in dh the part of h_prev's gradient
 * that does not go through U (the caller adds dg U^T) and in dc c_prev's.
 * Masked rows: dg 0, dh and dc passed on unchanged. */
int kern_lstm_step_grad(kern_ctx *ctx, int64_t n, int64_t u, const float *g,
                        const float *c_prev, const float *c, const float *m,
                        const float *dh_out, float *dh, float *dc, float *dg);

/* One GRU step (reset_after): xg [n, 3u] = x W + b_in (overwritten with
 * the activated z, r, hh), rg [n, 3u] = h_prev U + b_rec (kept), h [n, u]
 * the new state; masked rows keep h_prev. */
int kern_gru_step(kern_ctx *ctx, int64_t n, int64_t u, float *xg,
                  const float *rg, const float *h_prev, const float *m,
                  float *h);
/* Its backward: as kern_lstm_step_grad, writing dxg [n, 3u] (x W + b_in's
 * gradient) and drg [n, 3u] (h U + b_rec's); dh keeps the direct part
 * (z times the gradient), the caller adds drg U^T. */
int kern_gru_step_grad(kern_ctx *ctx, int64_t n, int64_t u, const float *xg,
                       const float *rg, const float *h_prev, const float *m,
                       const float *dh_out, float *dh, float *dxg,
                       float *drg);

/* C_i = alpha op(A_i) op(B_i) + beta C_i for i < batch, A_i = A + i *
 * sa (elements), likewise B and C; each as kern_gemm (row-major, fp32). */
int kern_gemm_batched(kern_ctx *ctx, bool ta, bool tb, int64_t m, int64_t n,
                      int64_t k, float alpha, const float *A, int64_t sa,
                      const float *B, int64_t sb, float beta, float *C,
                      int64_t sc, int64_t batch);
/* dst[i, k, j, l] = beta * dst + src[i, j, k, l] for src [a, b, c, d]
 * (attention heads: [n, T, H, dk] <-> [n, H, T, dk]). */
int kern_swap12(kern_ctx *ctx, int64_t a, int64_t b, int64_t c, int64_t d,
                const float *src, float beta, float *dst);

/* Attention weights: for scores s [B, H, Tq, Tk], p = softmax over the
 * last axis of scale * s + add, with add = -1e9 where qm[b, q] (may be
 * NULL) or km[b, k] (may be NULL) is 0, else 0: Keras's mask adder, so a
 * row masked whole comes out uniform as in Keras. */
int kern_attn_softmax(kern_ctx *ctx, int64_t B, int64_t H, int64_t Tq,
                      int64_t Tk, const float *s, float scale,
                      const float *qm, const float *km, float *p);
/* The gradient of the scores: ds = scale * p * (dp - sum(dp * p)) per row
 * of Tk. */
int kern_attn_softmax_grad(kern_ctx *ctx, int64_t rows, int64_t Tk,
                           const float *dp, const float *p, float scale,
                           float *ds);

/* GlobalAveragePooling1D with a mask: y[b, :] = sum_t m[b, t] x[b, t, :] /
 * sum_t m[b, t] (Keras's formula, NaN for a row masked whole, as Keras),
 * and its backward dx = beta * dx + m dy / sum m. */
int kern_masked_mean(kern_ctx *ctx, int64_t n, int64_t T, int64_t c,
                     const float *x, const float *m, float *y);
int kern_masked_mean_grad(kern_ctx *ctx, int64_t n, int64_t T, int64_t c,
                          const float *dy, const float *m, float beta,
                          float *dx);

#endif
