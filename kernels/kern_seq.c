/* kern_seq.h front end: argument checks and forwarding to the context's
 * backend table (kern__ops.seq).
 * Failure modes: negative sizes or strides that make batches overlap
 * (TSR_EINVAL), sizes over the int arguments of BLAS (TSR_ERANGE), a
 * backend without these ops (TSR_EUNSUPPORTED, an old CUDA module);
 * everything else is the backend's.
 */
#include "kernels/kern_plan.h"
#include "kernels/kern_seq_int.h"
#include "common/err.h"

#define SQ(c) (kern__ctx_ops(c)->seq)
#define IMPL(c) kern__ctx_impl(c)
#define NEED(c) do { if (!SQ(c)) return TSR_EUNSUPPORTED; } while (0)

static bool bad(int64_t a, int64_t b, int64_t c) {
  return a < 0 || b < 0 || c < 0;
}

int kern_seq_to_steps(kern_ctx *ctx, int64_t n, int64_t T, int64_t d,
                      const float *x, bool reverse, float beta, float *out) {
  NEED(ctx);
  if (bad(n, T, d)) return TSR_EINVAL;
  if (!n || !T || !d) return 0;
  return SQ(ctx)->to_steps(IMPL(ctx), n, T, d, x, reverse, beta, out);
}

int kern_seq_from_steps(kern_ctx *ctx, int64_t n, int64_t T, int64_t d,
                        const float *in, bool reverse, const float *m,
                        float beta, float *y) {
  NEED(ctx);
  if (bad(n, T, d)) return TSR_EINVAL;
  if (!n || !T || !d) return 0;
  return SQ(ctx)->from_steps(IMPL(ctx), n, T, d, in, reverse, m, beta, y);
}

int kern_lstm_step(kern_ctx *ctx, int64_t n, int64_t u, float *g,
                   const float *c_prev, const float *h_prev, const float *m,
                   float *c, float *h) {
  NEED(ctx);
  if (bad(n, u, 0)) return TSR_EINVAL;
  if (!n || !u) return 0;
  return SQ(ctx)->lstm(IMPL(ctx), n, u, g, c_prev, h_prev, m, c, h);
}

int kern_lstm_step_grad(kern_ctx *ctx, int64_t n, int64_t u, const float *g,
                        const float *c_prev, const float *c, const float *m,
                        const float *dh_out, float *dh, float *dc,
                        float *dg) {
  NEED(ctx);
  if (bad(n, u, 0)) return TSR_EINVAL;
  if (!n || !u) return 0;
  return SQ(ctx)->lstm_grad(IMPL(ctx), n, u, g, c_prev, c, m, dh_out, dh, dc,
                            dg);
}

int kern_gru_step(kern_ctx *ctx, int64_t n, int64_t u, float *xg,
                  const float *rg, const float *h_prev, const float *m,
                  float *h) {
  NEED(ctx);
  if (bad(n, u, 0)) return TSR_EINVAL;
  if (!n || !u) return 0;
  return SQ(ctx)->gru(IMPL(ctx), n, u, xg, rg, h_prev, m, h);
}

int kern_gru_step_grad(kern_ctx *ctx, int64_t n, int64_t u, const float *xg,
                       const float *rg, const float *h_prev, const float *m,
                       const float *dh_out, float *dh, float *dxg,
                       float *drg) {
  NEED(ctx);
  if (bad(n, u, 0)) return TSR_EINVAL;
  if (!n || !u) return 0;
  return SQ(ctx)->gru_grad(IMPL(ctx), n, u, xg, rg, h_prev, m, dh_out, dh,
                           dxg, drg);
}

int kern_gemm_batched(kern_ctx *ctx, bool ta, bool tb, int64_t m, int64_t n,
                      int64_t k, float alpha, const float *A, int64_t sa,
                      const float *B, int64_t sb, float beta, float *C,
                      int64_t sc, int64_t batch) {
  NEED(ctx);
  kern_gemm_args g;
  int rc = kern_plan_gemm(ta, tb, m, n, k, &g);
  if (rc) return rc;
  if (batch < 0 || sa < 0 || sb < 0 || sc < m * n) return TSR_EINVAL;
  if (batch > INT_MAX) return TSR_ERANGE;
  if (!batch || !m || !n) return 0;
  return SQ(ctx)->gemm_batched(IMPL(ctx), ta, tb, m, n, k, alpha, A, sa, B,
                               sb, beta, C, sc, batch);
}

int kern_swap12(kern_ctx *ctx, int64_t a, int64_t b, int64_t c, int64_t d,
                const float *src, float beta, float *dst) {
  NEED(ctx);
  if (bad(a, b, c) || d < 0) return TSR_EINVAL;
  if (!a || !b || !c || !d) return 0;
  return SQ(ctx)->swap12(IMPL(ctx), a, b, c, d, src, beta, dst);
}

int kern_attn_softmax(kern_ctx *ctx, int64_t B, int64_t H, int64_t Tq,
                      int64_t Tk, const float *s, float scale,
                      const float *qm, const float *km, float *p) {
  NEED(ctx);
  if (bad(B, H, Tq) || Tk < 1) return TSR_EINVAL;
  if (!B || !H || !Tq) return 0;
  return SQ(ctx)->attn_softmax(IMPL(ctx), B, H, Tq, Tk, s, scale, qm, km, p);
}

int kern_attn_softmax_grad(kern_ctx *ctx, int64_t rows, int64_t Tk,
                           const float *dp, const float *p, float scale,
                           float *ds) {
  NEED(ctx);
  if (rows < 0 || Tk < 1) return TSR_EINVAL;
  if (!rows) return 0;
  return SQ(ctx)->attn_softmax_grad(IMPL(ctx), rows, Tk, dp, p, scale, ds);
}

int kern_masked_mean(kern_ctx *ctx, int64_t n, int64_t T, int64_t c,
                     const float *x, const float *m, float *y) {
  NEED(ctx);
  if (n < 0 || T < 1 || c < 1) return TSR_EINVAL;
  if (!n) return 0;
  return SQ(ctx)->masked_mean(IMPL(ctx), n, T, c, x, m, y);
}

int kern_masked_mean_grad(kern_ctx *ctx, int64_t n, int64_t T, int64_t c,
                          const float *dy, const float *m, float beta,
                          float *dx) {
  NEED(ctx);
  if (n < 0 || T < 1 || c < 1) return TSR_EINVAL;
  if (!n) return 0;
  return SQ(ctx)->masked_mean_grad(IMPL(ctx), n, T, c, dy, m, beta, dx);
}
