/* Forward and backward of the sequence nodes on the compute context:
 * RNN (LSTM, GRU), MHA (MultiHeadAttention), ATTN (dot-product Attention)
 * and MUL (Bidirectional's merge_mode mul). The memory is laid out by
 * model_exec.c: each node's workspace (ws, what the backward reads) and one
 * backward scratch shared by all of them.
 *
 * Happy path, RNN: the input goes to step order ([T, n, F], reversed for
 * a backward reader), one GEMM gives every step's x W + b, then step by
 * step h_prev U is added and the cell op applied; the states [T+1, n, u]
 * stay for the backward, which runs the steps in reverse and then takes
 * the kernels' gradients over all steps in one GEMM each. Attention: the
 * projections are GEMMs over all steps, heads are split into [n, H, T, d]
 * and the scores, weights and outputs are strided batches of products.
 * Failure modes: the kern_ ops' codes.
 */
#include "worker/model_int.h"
#include "kernels/kern_seq.h"

#include "common/err.h"

#include <math.h>
#include <string.h>

#define CK(x) do { if ((rc = (x))) return rc; } while (0)

static const float *Yn(const wk_exec *e, int k) {
  return e->y[e->m->layers[k].root];
}

static const float *mask_of(const wk_exec *e, int src) {
  return src >= 0 ? e->seqmask[src] : NULL;
}

/* Where a gradient for input node `in` goes (beta 0: write, 1: add). */
static float *din(wk_exec *e, int in, float *beta) {
  int r = e->m->layers[in].root;
  *beta = e->dy_set[r] ? 1.0f : 0.0f;
  e->dy_set[r] = true;
  return e->dy[r];
}

static bool wants(const wk_exec *e, int in) {
  return e->m->layers[in].needs_grad;
}

/* ---- RNN ----------------------------------------------------------------*/

typedef struct {
  int64_t T, F, u, G;     /* steps, input width, units, gates */
  float *xs, *g, *rg, *h, *c, *mk; /* workspace */
  float *dg, *drg, *dhs, *dh, *dc, *dxs; /* scratch */
} rnn_mem;

static void rnn_lay(const tsr_model *m, const wk_layer *l, int64_t B,
                    float *ws, float *sc, rnn_mem *r, int64_t *wsn,
                    int64_t *scn) {
  const wk_layer *x = &m->layers[l->in[0]];
  r->T = x->dim[0];
  r->F = x->dim[1];
  r->u = l->units;
  r->G = l->cell == WK_CELL_GRU ? 3 : 4;
  bool gru = l->cell == WK_CELL_GRU;
  int64_t T = r->T, u = r->u, Gu = r->G * u, o = 0;
#define TAKE(p, cnt, base, off) \
  do { p = base ? base + off : NULL; off += (cnt); } while (0)
  TAKE(r->xs, T * B * r->F, ws, o);
  TAKE(r->g, T * B * Gu, ws, o);
  r->rg = NULL;
  if (gru) TAKE(r->rg, T * B * Gu, ws, o);
  TAKE(r->h, (T + 1) * B * u, ws, o);
  r->c = NULL;
  if (!gru) TAKE(r->c, (T + 1) * B * u, ws, o);
  r->mk = NULL;
  if (l->use_mask >= 0) TAKE(r->mk, T * B, ws, o);
  *wsn = o;
  o = 0;
  TAKE(r->dg, T * B * Gu, sc, o);
  r->drg = NULL;
  if (gru) TAKE(r->drg, T * B * Gu, sc, o);
  TAKE(r->dhs, T * B * u, sc, o);
  TAKE(r->dh, B * u, sc, o);
  TAKE(r->dc, B * u, sc, o);
  TAKE(r->dxs, T * B * r->F, sc, o);
  *scn = o;
}

static int rnn_fwd(wk_exec *e, const wk_layer *l, int k) {
  kern_ctx *c = e->ctx;
  int rc;
  rnn_mem r;
  int64_t a, b;
  rnn_lay(e->m, l, e->maxb, e->ws[k], NULL, &r, &a, &b);
  int64_t n = e->n, T = r.T, u = r.u, Gu = r.G * u, nu = n * u;
  bool gru = l->cell == WK_CELL_GRU;
  const float *W = e->dp[l->var_w], *U = e->dp[l->var_x[0]];
  const float *bias = l->var_b >= 0 ? e->dp[l->var_b] : NULL;
  CK(kern_seq_to_steps(c, n, T, r.F, Yn(e, l->in[0]), l->reverse, 0.0f,
                       r.xs));
  if (r.mk)
    CK(kern_seq_to_steps(c, n, T, 1, mask_of(e, l->use_mask), l->reverse,
                         0.0f, r.mk));
  CK(kern_gemm(c, false, false, T * n, Gu, r.F, 1.0f, r.xs, W, 0.0f, r.g,
               e->prec));
  if (bias)
    CK(kern_bias_act(c, r.g, bias, r.g, T * n, Gu, KERN_ACT_LINEAR, 1.0f));
  CK(kern_copy(c, r.h, e->zeros, (size_t)nu * sizeof(float)));
  if (r.c) CK(kern_copy(c, r.c, e->zeros, (size_t)nu * sizeof(float)));
  for (int64_t s = 0; s < T; s++) {
    const float *hp = r.h + s * nu, *ms = r.mk ? r.mk + s * n : NULL;
    float *hc = r.h + (s + 1) * nu;
    if (gru) {
      float *rgs = r.rg + s * n * Gu;
      CK(kern_gemm(c, false, false, n, Gu, u, 1.0f, hp, U, 0.0f, rgs,
                   e->prec));
      if (bias)
        CK(kern_bias_act(c, rgs, bias + Gu, rgs, n, Gu, KERN_ACT_LINEAR,
                         1.0f));
      CK(kern_gru_step(c, n, u, r.g + s * n * Gu, rgs, hp, ms, hc));
    } else {
      float *gs = r.g + s * n * Gu;
      CK(kern_gemm(c, false, false, n, Gu, u, 1.0f, hp, U, 1.0f, gs,
                   e->prec));
      CK(kern_lstm_step(c, n, u, gs, r.c + s * nu, hp, ms, r.c + (s + 1) * nu,
                        hc));
    }
  }
  if (!l->ret_seq)
    return kern_copy(c, e->y[k], r.h + T * nu, (size_t)nu * sizeof(float));
  return kern_seq_from_steps(c, n, T, u, r.h + nu, l->reverse && !l->rev_out,
                             l->zero_masked ? r.mk : NULL, 0.0f, e->y[k]);
}

static int rnn_bwd(wk_exec *e, const wk_layer *l, int k) {
  kern_ctx *c = e->ctx;
  int rc;
  rnn_mem r;
  int64_t a, b;
  rnn_lay(e->m, l, e->maxb, e->ws[k], e->seq_scratch, &r, &a, &b);
  int64_t n = e->n, T = r.T, u = r.u, Gu = r.G * u, nu = n * u;
  bool gru = l->cell == WK_CELL_GRU;
  const float *W = e->dp[l->var_w], *U = e->dp[l->var_x[0]];
  const float *g = e->dy[k];
  CK(kern_copy(c, r.dc, e->zeros, (size_t)nu * sizeof(float)));
  if (l->ret_seq) {
    CK(kern_seq_to_steps(c, n, T, u, g, l->reverse && !l->rev_out, 0.0f,
                         r.dhs));
    if (l->zero_masked && r.mk) /* outputs that were zeros pass nothing */
      CK(kern_seq_from_steps(c, T * n, 1, u, r.dhs, false, r.mk, 0.0f,
                             r.dhs));
    CK(kern_copy(c, r.dh, e->zeros, (size_t)nu * sizeof(float)));
  } else {
    CK(kern_copy(c, r.dh, g, (size_t)nu * sizeof(float)));
  }
  for (int64_t s = T - 1; s >= 0; s--) {
    const float *ms = r.mk ? r.mk + s * n : NULL;
    const float *dho = l->ret_seq ? r.dhs + s * nu : NULL;
    if (gru) {
      CK(kern_gru_step_grad(c, n, u, r.g + s * n * Gu, r.rg + s * n * Gu,
                            r.h + s * nu, ms, dho, r.dh, r.dg + s * n * Gu,
                            r.drg + s * n * Gu));
      CK(kern_gemm(c, false, true, n, u, Gu, 1.0f, r.drg + s * n * Gu, U,
                   1.0f, r.dh, e->prec));
    } else {
      CK(kern_lstm_step_grad(c, n, u, r.g + s * n * Gu, r.c + s * nu,
                             r.c + (s + 1) * nu, ms, dho, r.dh, r.dc,
                             r.dg + s * n * Gu));
      CK(kern_gemm(c, false, true, n, u, Gu, 1.0f, r.dg + s * n * Gu, U,
                   1.0f, r.dh, e->prec));
    }
  }
  const float *drec = gru ? r.drg : r.dg;
  CK(kern_gemm(c, true, false, r.F, Gu, T * n, 1.0f, r.xs, r.dg, 0.0f,
               e->dg[l->var_w], e->prec));
  CK(kern_gemm(c, true, false, u, Gu, T * n, 1.0f, r.h, drec, 0.0f,
               e->dg[l->var_x[0]], e->prec));
  if (l->var_b >= 0) {
    CK(kern_col_sum(c, r.dg, T * n, Gu, 0.0f, e->dg[l->var_b]));
    if (gru) CK(kern_col_sum(c, r.drg, T * n, Gu, 0.0f, e->dg[l->var_b] + Gu));
  }
  if (!wants(e, l->in[0])) return 0;
  CK(kern_gemm(c, false, true, T * n, r.F, Gu, 1.0f, r.dg, W, 0.0f, r.dxs,
               e->prec));
  float beta;
  float *d = din(e, l->in[0], &beta);
  return kern_seq_from_steps(c, n, T, r.F, r.dxs, l->reverse, NULL, beta, d);
}

/* ---- MultiHeadAttention and Attention ----------------------------------*/

typedef struct {
  int64_t Tq, Tk, Fq, Fk, Fv, H, dk, dv;
  float *qp, *kp, *vp, *qh, *kh, *vh, *p, *s, *oh, *o; /* workspace */
  float *d1, *d2, *dp, *dvh, *dqh, *dkh, *dqp, *dkp, *dvp; /* scratch */
} att_mem;

static void att_lay(const tsr_model *m, const wk_layer *l, int64_t B,
                    float *ws, float *sc, att_mem *a, int64_t *wsn,
                    int64_t *scn) {
  const wk_layer *q = &m->layers[l->in[0]], *v = &m->layers[l->in[1]];
  const wk_layer *kx = &m->layers[l->in[l->n_in > 2 ? 2 : 1]];
  a->Tq = q->dim[0];
  a->Tk = v->dim[0];
  a->Fq = q->dim[1];
  a->Fv = v->dim[1];
  a->Fk = kx->dim[1];
  a->H = l->heads;
  a->dk = l->key_dim;
  a->dv = l->value_dim;
  bool mha = l->kind == WK_L_MHA;
  int64_t H = a->H, o = 0;
  int64_t nq = B * a->Tq * H * a->dk, nk = B * a->Tk * H * a->dk;
  int64_t nv = B * a->Tk * H * a->dv, np = B * H * a->Tq * a->Tk;
  int64_t no = B * a->Tq * H * a->dv;
  a->qp = a->kp = a->vp = a->qh = a->kh = a->vh = a->o = a->s = NULL;
  if (mha) {
    TAKE(a->qp, nq, ws, o);
    TAKE(a->kp, nk, ws, o);
    TAKE(a->vp, nv, ws, o);
    TAKE(a->qh, nq, ws, o);
    TAKE(a->kh, nk, ws, o);
    TAKE(a->vh, nv, ws, o);
    TAKE(a->oh, no, ws, o);
    TAKE(a->o, no, ws, o);
  } else {
    TAKE(a->s, np, ws, o); /* the raw scores, for the scale's gradient */
    a->oh = NULL;
  }
  TAKE(a->p, np, ws, o);
  *wsn = o;
  o = 0;
  TAKE(a->d1, no > nq ? no : nq, sc, o);
  TAKE(a->d2, no > nq ? no : nq, sc, o);
  TAKE(a->dp, np, sc, o);
  TAKE(a->dvh, nv, sc, o);
  TAKE(a->dqh, nq, sc, o);
  TAKE(a->dkh, nk, sc, o);
  TAKE(a->dqp, nq, sc, o);
  TAKE(a->dkp, nk, sc, o);
  TAKE(a->dvp, nv, sc, o);
  *scn = o;
#undef TAKE
}

/* x [rows, in] W [in, w] + b into out */
static int proj(wk_exec *e, const float *x, int64_t rows, int64_t in,
                int vw, int vb, int64_t w, float *out) {
  int rc;
  CK(kern_gemm(e->ctx, false, false, rows, w, in, 1.0f, x, e->dp[vw], 0.0f,
               out, e->prec));
  if (vb >= 0)
    CK(kern_bias_act(e->ctx, out, e->dp[vb], out, rows, w, KERN_ACT_LINEAR,
                     1.0f));
  return 0;
}

/* Backward of proj: dW, db, and (when wanted) the input's gradient. */
static int proj_bwd(wk_exec *e, int in, const float *dout, int64_t rows,
                    int64_t w, int vw, int vb) {
  kern_ctx *c = e->ctx;
  int rc;
  const wk_layer *x = &e->m->layers[in];
  int64_t K = x->dim[x->rank - 1];
  CK(kern_gemm(c, true, false, K, w, rows, 1.0f, Yn(e, in), dout, 0.0f,
               e->dg[vw], e->prec));
  if (vb >= 0) CK(kern_col_sum(c, dout, rows, w, 0.0f, e->dg[vb]));
  if (!wants(e, in)) return 0;
  float beta;
  float *d = din(e, in, &beta);
  return kern_gemm(c, false, true, rows, K, w, 1.0f, dout, e->dp[vw], beta, d,
                   e->prec);
}

static float attn_scale(wk_exec *e, const wk_layer *l) {
  if (l->kind == WK_L_MHA) return 1.0f / sqrtf((float)l->key_dim);
  float s = 1.0f;
  if (l->var_w >= 0 &&
      kern_download(e->ctx, &s, e->dp[l->var_w], sizeof s) != 0)
    s = NAN;
  return s;
}

static int att_fwd(wk_exec *e, const wk_layer *l, int k) {
  kern_ctx *c = e->ctx;
  int rc;
  att_mem a;
  int64_t x1, x2;
  att_lay(e->m, l, e->maxb, e->ws[k], NULL, &a, &x1, &x2);
  int64_t n = e->n, H = a.H, Tq = a.Tq, Tk = a.Tk;
  const float *q = Yn(e, l->in[0]), *v = Yn(e, l->in[1]);
  const float *kx = Yn(e, l->in[l->n_in > 2 ? 2 : 1]);
  const float *qm = mask_of(e, l->use_mask), *km = mask_of(e, l->use_mask2);
  float sc = attn_scale(e, l);
  if (l->kind == WK_L_ATTN) {
    CK(kern_gemm_batched(c, false, true, Tq, Tk, a.dk, 1.0f, q, Tq * a.dk, kx,
                         Tk * a.dk, 0.0f, a.s, Tq * Tk, n));
    CK(kern_attn_softmax(c, n, 1, Tq, Tk, a.s, sc, NULL, km, a.p));
    CK(kern_gemm_batched(c, false, false, Tq, a.dv, Tk, 1.0f, a.p, Tq * Tk,
                         v, Tk * a.dv, 0.0f, e->y[k], Tq * a.dv, n));
    if (qm) /* Keras zeroes the outputs of masked queries */
      CK(kern_seq_from_steps(c, n * Tq, 1, a.dv, e->y[k], false, qm, 0.0f,
                             e->y[k]));
    return 0;
  }
  const int *w = l->var_x;
  CK(proj(e, q, n * Tq, a.Fq, w[0], w[1], H * a.dk, a.qp));
  CK(proj(e, kx, n * Tk, a.Fk, w[2], w[3], H * a.dk, a.kp));
  CK(proj(e, v, n * Tk, a.Fv, w[4], w[5], H * a.dv, a.vp));
  CK(kern_swap12(c, n, Tq, H, a.dk, a.qp, 0.0f, a.qh));
  CK(kern_swap12(c, n, Tk, H, a.dk, a.kp, 0.0f, a.kh));
  CK(kern_swap12(c, n, Tk, H, a.dv, a.vp, 0.0f, a.vh));
  CK(kern_gemm_batched(c, false, true, Tq, Tk, a.dk, 1.0f, a.qh, Tq * a.dk,
                       a.kh, Tk * a.dk, 0.0f, a.p, Tq * Tk, n * H));
  CK(kern_attn_softmax(c, n, H, Tq, Tk, a.p, sc, qm, km, a.p));
  CK(kern_gemm_batched(c, false, false, Tq, a.dv, Tk, 1.0f, a.p, Tq * Tk,
                       a.vh, Tk * a.dv, 0.0f, a.oh, Tq * a.dv, n * H));
  CK(kern_swap12(c, n, H, Tq, a.dv, a.oh, 0.0f, a.o));
  return proj(e, a.o, n * Tq, H * a.dv, w[6], w[7], l->units, e->y[k]);
}

static int att_bwd(wk_exec *e, const wk_layer *l, int k) {
  kern_ctx *c = e->ctx;
  int rc;
  att_mem a;
  int64_t x1, x2;
  att_lay(e->m, l, e->maxb, e->ws[k], e->seq_scratch, &a, &x1, &x2);
  int64_t n = e->n, H = a.H, Tq = a.Tq, Tk = a.Tk;
  int iq = l->in[0], iv = l->in[1], ik = l->in[l->n_in > 2 ? 2 : 1];
  const float *g = e->dy[k];
  float sc = attn_scale(e, l);
  if (l->kind == WK_L_ATTN) {
    const float *q = Yn(e, iq), *v = Yn(e, iv), *kx = Yn(e, ik);
    const float *qm = mask_of(e, l->use_mask);
    if (qm) {
      CK(kern_seq_from_steps(c, n * Tq, 1, a.dv, g, false, qm, 0.0f, a.d1));
      g = a.d1;
    }
    CK(kern_gemm_batched(c, false, true, Tq, Tk, a.dv, 1.0f, g, Tq * a.dv, v,
                         Tk * a.dv, 0.0f, a.dp, Tq * Tk, n));
    if (wants(e, iv)) {
      float beta;
      float *d = din(e, iv, &beta);
      CK(kern_gemm_batched(c, true, false, Tk, a.dv, Tq, 1.0f, a.p, Tq * Tk,
                           g, Tq * a.dv, beta, d, Tk * a.dv, n));
    }
    CK(kern_attn_softmax_grad(c, n * Tq, Tk, a.dp, a.p, 1.0f, a.dp));
    if (l->var_w >= 0) { /* d scale = sum(dlogit * raw score) */
      int64_t N = n * Tq * Tk;
      CK(kern_gemm(c, false, false, 1, 1, N, 1.0f, a.dp, a.s, 0.0f,
                   e->dg[l->var_w], KERN_F32));
      CK(kern_scale(c, a.dp, (size_t)N, sc));
    }
    if (wants(e, iq)) {
      float beta;
      float *d = din(e, iq, &beta);
      CK(kern_gemm_batched(c, false, false, Tq, a.dk, Tk, 1.0f, a.dp, Tq * Tk,
                           kx, Tk * a.dk, beta, d, Tq * a.dk, n));
    }
    if (wants(e, ik)) {
      float beta;
      float *d = din(e, ik, &beta);
      CK(kern_gemm_batched(c, true, false, Tk, a.dk, Tq, 1.0f, a.dp, Tq * Tk,
                           q, Tq * a.dk, beta, d, Tk * a.dk, n));
    }
    return 0;
  }
  const int *w = l->var_x;
  /* output projection */
  CK(kern_gemm(c, true, false, H * a.dv, l->units, n * Tq, 1.0f, a.o, g,
               0.0f, e->dg[w[6]], e->prec));
  if (w[7] >= 0) CK(kern_col_sum(c, g, n * Tq, l->units, 0.0f, e->dg[w[7]]));
  CK(kern_gemm(c, false, true, n * Tq, H * a.dv, l->units, 1.0f, g,
               e->dp[w[6]], 0.0f, a.d1, e->prec));
  CK(kern_swap12(c, n, Tq, H, a.dv, a.d1, 0.0f, a.d2)); /* dOh */
  CK(kern_gemm_batched(c, false, true, Tq, Tk, a.dv, 1.0f, a.d2, Tq * a.dv,
                       a.vh, Tk * a.dv, 0.0f, a.dp, Tq * Tk, n * H));
  CK(kern_gemm_batched(c, true, false, Tk, a.dv, Tq, 1.0f, a.p, Tq * Tk, a.d2,
                       Tq * a.dv, 0.0f, a.dvh, Tk * a.dv, n * H));
  CK(kern_attn_softmax_grad(c, n * H * Tq, Tk, a.dp, a.p, sc, a.dp));
  CK(kern_gemm_batched(c, false, false, Tq, a.dk, Tk, 1.0f, a.dp, Tq * Tk,
                       a.kh, Tk * a.dk, 0.0f, a.dqh, Tq * a.dk, n * H));
  CK(kern_gemm_batched(c, true, false, Tk, a.dk, Tq, 1.0f, a.dp, Tq * Tk,
                       a.qh, Tq * a.dk, 0.0f, a.dkh, Tk * a.dk, n * H));
  CK(kern_swap12(c, n, H, Tq, a.dk, a.dqh, 0.0f, a.dqp));
  CK(kern_swap12(c, n, H, Tk, a.dk, a.dkh, 0.0f, a.dkp));
  CK(kern_swap12(c, n, H, Tk, a.dv, a.dvh, 0.0f, a.dvp));
  CK(proj_bwd(e, iq, a.dqp, n * Tq, H * a.dk, w[0], w[1]));
  CK(proj_bwd(e, ik, a.dkp, n * Tk, H * a.dk, w[2], w[3]));
  return proj_bwd(e, iv, a.dvp, n * Tk, H * a.dv, w[4], w[5]);
}

/* ---- the entry points ---------------------------------------------------*/

void wk_exec__seq_sizes(const tsr_model *m, const wk_layer *l, int64_t B,
                        int64_t *ws, int64_t *scratch) {
  *ws = 0;
  *scratch = 0;
  if (l->kind == WK_L_RNN) {
    rnn_mem r;
    rnn_lay(m, l, B, NULL, NULL, &r, ws, scratch);
  } else if (l->kind == WK_L_MHA || l->kind == WK_L_ATTN) {
    att_mem a;
    att_lay(m, l, B, NULL, NULL, &a, ws, scratch);
  }
}

int wk_exec__seq_fwd(wk_exec *e, const wk_layer *l, int k,
                     const wk_run_opts *o) {
  (void)o;
  int rc;
  switch (l->kind) {
    case WK_L_RNN:
      return rnn_fwd(e, l, k);
    case WK_L_MHA:
    case WK_L_ATTN:
      return att_fwd(e, l, k);
    case WK_L_MUL: {
      size_t cnt = (size_t)(e->n * l->size);
      CK(kern_copy(e->ctx, e->y[k], Yn(e, l->in[0]), cnt * sizeof(float)));
      for (int i = 1; i < l->n_in; i++)
        CK(kern_mul(e->ctx, e->y[k], Yn(e, l->in[i]), cnt));
      return 0;
    }
    default:
      return TSR_EINVAL;
  }
}

int wk_exec__seq_bwd(wk_exec *e, const wk_layer *l, int k) {
  int rc;
  switch (l->kind) {
    case WK_L_RNN:
      return rnn_bwd(e, l, k);
    case WK_L_MHA:
    case WK_L_ATTN:
      return att_bwd(e, l, k);
    case WK_L_MUL: { /* two inputs: each gets dy times the other */
      size_t cnt = (size_t)(e->n * l->size);
      for (int i = 0; i < 2; i++) {
        int in = l->in[i];
        if (!wants(e, in)) continue;
        float beta;
        float *d = din(e, in, &beta);
        float *t = beta == 0.0f ? d : e->acc;
        CK(kern_copy(e->ctx, t, e->dy[k], cnt * sizeof(float)));
        CK(kern_mul(e->ctx, t, Yn(e, l->in[1 - i]), cnt));
        if (t != d) CK(kern_axpy(e->ctx, d, t, cnt, 1.0f));
      }
      return 0;
    }
    default:
      return TSR_EINVAL;
  }
}
