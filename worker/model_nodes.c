/* Each node's forward and backward pass on the compute context (the
 * memory is laid out by model_exec.c).
 *
 * Happy path, forward: embedding gathers first (they read only ids), then
 * the nodes in order, each from its inputs' outputs. Backward: the loss has
 * written the output's gradient; the nodes in reverse order turn their
 * output gradient into their variables' gradients and their inputs'. A
 * tensor read by several nodes sums their gradients: the first writes it
 * (beta 0), the next ones add (beta 1, or through the `acc` scratch for
 * ops without a beta); dy_set says which is which. Views (Flatten,
 * Reshape) share their root's memory, gradients included. Embedding
 * scatters run last, from their nodes' gradients.
 * Batch statistics of BatchNormalization (training) are written to the
 * moving statistics' gradient buffers, scaled to this slice's share of the
 * global batch (n * grad_scale); regularizers add theirs the same way.
 * Failure modes: the kern_ ops' codes (allocation, launch errors).
 */
#include "worker/model_int.h"

#include "common/err.h"
#include "kernels/kern_seq.h"

#include <string.h>

#define CK(x) do { if ((rc = (x))) return rc; } while (0)

static const float *Y(const wk_exec *e, int k) {
  return e->y[e->m->layers[k].root];
}

static float *DY(const wk_exec *e, int k) {
  return e->dy[e->m->layers[k].root];
}

/* rows of a node's output as [rows, last axis] */
static int64_t rows_of(const wk_exec *e, const wk_layer *l) {
  return e->n * (l->size / l->dim[l->rank - 1]);
}

/* Where sparse plan `p`'s rows sit in its embedding node's output (the
 * gather writes there, the scatter reads the gradient from there): a
 * per-id embedding owns its node, [ids, dim]; a pooled one writes `dim`
 * columns of each row at its offset (0 when the plan is wide). */
static const wk_embed *emb_place(const wk_exec *e, const wk_splan *p,
                                 int64_t *stride, int64_t *off) {
  const wk_embed *em = &e->m->emb[p->first_emb];
  *stride = em->per_id ? p->dim : e->m->layers[em->node].size;
  *off = em->per_id || p->wide ? 0 : em->out_off;
  return em;
}

static int gathers(wk_exec *e, const wk_run_opts *o) {
  int rc;
  for (int s = 0; s < e->n_sp; s++) {
    const wk_splan *p = &e->sp[s];
    int64_t stride, off;
    const wk_embed *em = emb_place(e, p, &stride, &off);
    CK(wk_exec__need(e, o, p->var));
    CK(kern_embed_gather(e->ctx, e->dp[p->var], p->dim, p->d_idx,
                         p->d_bag_off, em->per_id ? p->n_bags : e->n,
                         em->per_id ? KERN_POOL_SUM : em->pool,
                         e->y[em->node], stride, off));
  }
  return 0;
}

static int conv_fwd(wk_exec *e, const wk_layer *l, int k) {
  kern_ctx *c = e->ctx;
  int rc;
  const kern_win *g = &l->win;
  int64_t F = l->dim[l->rank - 1];
  /* relu runs inside the convolution: z is y (model_exec.c), and relu's
   * gradient reads it as well as z */
  bool relu = l->act == KERN_ACT_RELU;
  CK(kern_conv2d_fwd(c, g, e->n, F, Y(e, l->in[0]), e->dp[l->var_w],
                     l->var_b >= 0 ? e->dp[l->var_b] : NULL, relu, e->z[k],
                     e->prec, e->cols));
  if (relu || l->act == KERN_ACT_LINEAR) return 0;
  return kern_bias_act(c, e->z[k], NULL, e->y[k], e->n * g->oh * g->ow, F,
                       l->act, l->alpha);
}

static int add_fwd(wk_exec *e, const wk_layer *l, int k) {
  kern_ctx *c = e->ctx;
  int rc;
  size_t n = (size_t)(e->n * l->size);
  bool avg = l->coef != 1.0f && l->coef != -1.0f;
  CK(kern_copy(c, e->y[k], Y(e, l->in[0]), n * sizeof(float)));
  if (avg) CK(kern_scale(c, e->y[k], n, l->coef));
  for (int i = 1; i < l->n_in; i++)
    CK(kern_axpy(c, e->y[k], Y(e, l->in[i]), n, l->coef));
  return 0;
}

/* Concatenate: rows of `outer` per example, each input a block of columns */
static int64_t cat_outer(const wk_layer *l) {
  int64_t o = 1;
  for (int d = 0; d < l->cat_axis; d++) o *= l->dim[d];
  return o;
}

static int cat_fwd(wk_exec *e, const wk_layer *l, int k) {
  int rc;
  int64_t outer = cat_outer(l), w_out = l->size / outer, off = 0;
  for (int i = 0; i < l->n_in; i++) {
    int64_t w = e->m->layers[l->in[i]].size / outer;
    CK(kern_copy_cols(e->ctx, e->n * outer, w, Y(e, l->in[i]), w, 0, 0.0f,
                      e->y[k], w_out, off));
    off += w;
  }
  return 0;
}

static int bn_fwd(wk_exec *e, const wk_layer *l, int k,
                  const wk_run_opts *o) {
  kern_ctx *c = e->ctx;
  int rc;
  int64_t ch = l->dim[l->rank - 1], rows = rows_of(e, l);
  const float *x = Y(e, l->in[0]);
  const float *gamma = l->var_w >= 0 ? e->dp[l->var_w] : NULL;
  const float *beta = l->var_b >= 0 ? e->dp[l->var_b] : NULL;
  if (!o->train)
    return kern_bn_apply(c, x, rows, ch, e->dp[l->var_mm], e->dp[l->var_mv],
                         l->eps, gamma, beta, e->y[k]);
  CK(kern_moments(c, x, rows, ch, e->st_a[k], e->st_b[k]));
  CK(kern_bn_apply(c, x, rows, ch, e->st_a[k], e->st_b[k], l->eps, gamma,
                   beta, e->y[k]));
  /* the batch statistics, as this slice's share, for the moving averages */
  float share = (float)e->n * o->grad_scale;
  size_t bytes = (size_t)ch * sizeof(float);
  CK(kern_copy(c, e->dg[l->var_mm], e->st_a[k], bytes));
  CK(kern_scale(c, e->dg[l->var_mm], (size_t)ch, share));
  CK(kern_copy(c, e->dg[l->var_mv], e->st_b[k], bytes));
  return kern_scale(c, e->dg[l->var_mv], (size_t)ch, share);
}

int wk_exec__forward(wk_exec *e, const wk_run_opts *o) {
  const tsr_model *m = e->m;
  kern_ctx *c = e->ctx;
  int64_t n = e->n;
  int rc;
  /* an input that is the whole batch row is the batch itself */
  for (int k = 0; k < m->n_layers; k++) {
    const wk_layer *r = &m->layers[m->layers[k].root];
    if (r->kind == WK_L_INPUT && !r->ids && !e->own_y[r - m->layers])
      e->y[k] = e->x;
  }
  CK(gathers(e, o));
  for (int k = 0; k < m->n_layers; k++) {
    const wk_layer *l = &m->layers[k];
    const float *x = l->n_in ? Y(e, l->in[0]) : NULL;
    /* overlap: this node's variables have arrived */
    int vs[12];
    int nvs = tsr_model__node_vars(l, vs);
    for (int i = 0; i < nvs; i++) CK(wk_exec__need(e, o, vs[i]));
    switch (l->kind) {
      case WK_L_INPUT:
        if (e->own_y[k])
          CK(kern_copy_cols(c, n, l->size, e->x, m->n_dense, l->x_off, 0.0f,
                            e->y[k], l->size, 0));
        break;
      case WK_L_EMBED:
      case WK_L_RESHAPE:
        break;
      case WK_L_DENSE: {
        const wk_layer *in = &m->layers[l->in[0]];
        int64_t K = in->dim[in->rank - 1], u = l->dim[l->rank - 1];
        int64_t rows = rows_of(e, l);
        CK(kern_gemm(c, false, false, rows, u, K, 1.0f, x, e->dp[l->var_w],
                     0.0f, e->z[k], e->prec));
        if (l->addend >= 0)
          CK(kern_axpy(c, e->z[k], Y(e, l->addend), (size_t)(n * l->size),
                       1.0f));
        CK(kern_bias_act(c, e->z[k],
                         l->var_b >= 0 ? e->dp[l->var_b] : NULL, e->y[k],
                         rows, u, l->act, l->alpha));
        break;
      }
      case WK_L_CONV2D:
        CK(conv_fwd(e, l, k));
        break;
      case WK_L_ACTIVATION:
        CK(kern_bias_act(c, (float *)x, NULL, e->y[k], rows_of(e, l),
                         l->dim[l->rank - 1], l->act, l->alpha));
        break;
      case WK_L_DROPOUT:
        CK(kern_copy(c, e->y[k], x, (size_t)(n * l->size) * sizeof(float)));
        if (o->train && l->rate > 0)
          CK(kern_dropout(c, e->y[k], e->mask[k], (size_t)(n * l->size),
                          l->rate, o->seed ^ ((uint64_t)k << 56)));
        break;
      case WK_L_POOL2D:
        CK(kern_pool2d_fwd(c, &l->win, n, l->pool, x, e->y[k],
                           o->train ? e->arg[k] : NULL));
        break;
      case WK_L_GPOOL: {
        int64_t ch = l->dim[l->rank - 1];
        if (l->use_mask >= 0)
          CK(kern_masked_mean(c, n, m->layers[l->in[0]].size / ch, ch, x,
                              e->seqmask[l->use_mask], e->y[k]));
        else
          CK(kern_mean_mid(c, x, n, m->layers[l->in[0]].size / ch, ch,
                           e->y[k]));
        break;
      }
      case WK_L_RNN:
      case WK_L_MHA:
      case WK_L_ATTN:
      case WK_L_MUL:
        CK(wk_exec__seq_fwd(e, l, k, o));
        break;
      case WK_L_BATCHNORM:
        CK(bn_fwd(e, l, k, o));
        break;
      case WK_L_LAYERNORM:
        CK(kern_ln_fwd(c, x, n * (l->size / l->norm_w), l->norm_w, l->eps,
                       l->var_w >= 0 ? e->dp[l->var_w] : NULL,
                       l->var_b >= 0 ? e->dp[l->var_b] : NULL, e->y[k],
                       e->st_a[k], e->st_b[k]));
        break;
      case WK_L_ADD:
        CK(add_fwd(e, l, k));
        break;
      case WK_L_CONCAT:
        CK(cat_fwd(e, l, k));
        break;
    }
  }
  return 0;
}

/* ---- backward ------------------------------------------------------------*/

/* Where a gradient for input node `in` goes: its own buffer when nothing
 * wrote it yet this pass (*beta 0), else the same buffer added to. */
static float *din_of(wk_exec *e, int in, float *beta) {
  int r = e->m->layers[in].root;
  *beta = e->dy_set[r] ? 1.0f : 0.0f;
  e->dy_set[r] = true;
  return e->dy[r];
}

/* For ops that can only write: the target, or `acc` to be added after
 * (finish_acc). */
static float *din_write(wk_exec *e, int in, bool *add) {
  float beta;
  float *d = din_of(e, in, &beta);
  *add = beta != 0.0f;
  return *add ? e->acc : d;
}

static int finish_acc(wk_exec *e, int in, bool add, size_t n) {
  return add ? kern_axpy(e->ctx, DY(e, in), e->acc, n, 1.0f) : 0;
}

static bool wants(const wk_exec *e, int in) {
  return e->m->layers[in].needs_grad;
}

static int dense_bwd(wk_exec *e, const wk_layer *l, const float *dz) {
  kern_ctx *c = e->ctx;
  int rc;
  const wk_layer *in = &e->m->layers[l->in[0]];
  int64_t K = in->dim[in->rank - 1], u = l->dim[l->rank - 1];
  int64_t rows = rows_of(e, l);
  CK(kern_gemm(c, true, false, K, u, rows, 1.0f, Y(e, l->in[0]), dz, 0.0f,
               e->dg[l->var_w], e->prec));
  if (l->var_b >= 0) CK(kern_col_sum(c, dz, rows, u, 0.0f, e->dg[l->var_b]));
  if (!wants(e, l->in[0])) return 0;
  float beta;
  float *din = din_of(e, l->in[0], &beta);
  return kern_gemm(c, false, true, rows, K, u, 1.0f, dz, e->dp[l->var_w],
                   beta, din, e->prec);
}

static int conv_bwd(wk_exec *e, const wk_layer *l, const float *dz) {
  kern_ctx *c = e->ctx;
  int rc;
  const kern_win *g = &l->win;
  int64_t F = l->dim[l->rank - 1];
  CK(kern_conv2d_bwd_filter(c, g, e->n, F, Y(e, l->in[0]), dz,
                            e->dg[l->var_w],
                            l->var_b >= 0 ? e->dg[l->var_b] : NULL, e->prec,
                            e->cols));
  if (!wants(e, l->in[0])) return 0;
  float beta;
  float *din = din_of(e, l->in[0], &beta);
  return kern_conv2d_bwd_data(c, g, e->n, F, dz, e->dp[l->var_w], beta, din,
                              e->prec, e->cols);
}

/* Dense and Conv2D: the gradient of z (the output's, for a fused loss). */
static int layer_bwd(wk_exec *e, const wk_layer *l, int k, bool fused_out) {
  kern_ctx *c = e->ctx;
  int rc;
  const float *g = e->dy[k];
  const float *dz = g;
  if (!fused_out && l->act != KERN_ACT_LINEAR) {
    /* a Conv2D's output gradient is read by nothing else after this: its
     * activation's gradient overwrites it (an element-wise op), which
     * spares a pass over a buffer of the layer's size */
    float *out = l->kind == WK_L_CONV2D && l->act != KERN_ACT_SOFTMAX
                     ? e->dy[k]
                     : e->dz;
    CK(kern_act_grad(c, g, e->z[k], e->y[k], out, rows_of(e, l),
                     l->dim[l->rank - 1], l->act, l->alpha));
    dz = out;
  }
  if (l->addend >= 0) { /* the wide logit's gradient is the logit's */
    CK(kern_copy(c, e->dy[l->addend], dz,
                 (size_t)(e->n * l->size) * sizeof(float)));
    e->dy_set[l->addend] = true;
  }
  return l->kind == WK_L_DENSE ? dense_bwd(e, l, dz) : conv_bwd(e, l, dz);
}

/* A normalization node's backward pass: gamma, the input's gradient (when
 * the input wants one) and the gradients of gamma and beta, the same for
 * BatchNormalization (over the last axis, statistics per channel) and
 * LayerNormalization (over norm_w, statistics per row). */
static int norm_bwd(wk_exec *e, const wk_layer *l, int k, int in,
                    const float *g) {
  float beta = 0.0f;
  float *d = wants(e, in) ? din_of(e, in, &beta) : NULL;
  const float *gamma = l->var_w >= 0 ? e->dp[l->var_w] : NULL;
  float *dgamma = l->var_w >= 0 ? e->dg[l->var_w] : NULL;
  float *dbeta = l->var_b >= 0 ? e->dg[l->var_b] : NULL;
  if (l->kind == WK_L_BATCHNORM)
    return kern_bn_grad(e->ctx, g, Y(e, in), rows_of(e, l),
                        l->dim[l->rank - 1], e->st_a[k], e->st_b[k], l->eps,
                        gamma, beta, d, dgamma, dbeta);
  return kern_ln_grad(e->ctx, g, Y(e, in), e->n * (l->size / l->norm_w),
                      l->norm_w, e->st_a[k], e->st_b[k], gamma, beta, d,
                      dgamma, dbeta);
}

static int scatters(wk_exec *e) {
  int rc;
  for (int s = 0; s < e->n_sp; s++) {
    const wk_splan *p = &e->sp[s];
    int64_t stride, off;
    const wk_embed *em = emb_place(e, p, &stride, &off);
    CK(kern_embed_scatter(e->ctx, e->dy[em->node], stride, off, p->dim,
                          p->d_occ_off, p->d_occ_bag, p->d_occ_w, p->n_uniq,
                          e->dg[p->var]));
  }
  return 0;
}

static int regularizers(wk_exec *e, const wk_run_opts *o) {
  const tsr_model *m = e->m;
  int rc;
  float s = (float)e->n * o->grad_scale;
  for (int v = 0; v < m->n_vars; v++) {
    const tsr_var *vi = &m->vars[v];
    if (vi->l1 > 0 || vi->l2 > 0)
      CK(kern_l1l2_grad(e->ctx, e->dp[v], (size_t)vi->numel, vi->l1 * s,
                        2.0f * vi->l2 * s, e->dg[v]));
  }
  return 0;
}

int wk_exec__backward(wk_exec *e, const wk_run_opts *o) {
  const tsr_model *m = e->m;
  kern_ctx *c = e->ctx;
  int64_t n = e->n;
  int rc;
  int last = m->n_layers - 1;
  memset(e->dy_set, 0, sizeof e->dy_set);
  e->dy_set[m->layers[last].root] = true;
  for (int k = last; k >= 0; k--) {
    const wk_layer *l = &m->layers[k];
    if (!l->needs_grad) continue;
    const float *g = e->dy[l->root];
    bool fused_out = k == last && m->fused;
    int in = l->n_in ? l->in[0] : -1;
    size_t ne = (size_t)(n * (in >= 0 ? m->layers[in].size : 0));
    bool add;
    float beta;
    float *d;
    switch (l->kind) {
      case WK_L_INPUT:
      case WK_L_EMBED:
      case WK_L_RESHAPE:
        break;
      case WK_L_DENSE:
      case WK_L_CONV2D:
        CK(layer_bwd(e, l, k, fused_out));
        break;
      case WK_L_ACTIVATION:
        if (!wants(e, in)) break;
        d = din_write(e, in, &add);
        if (fused_out)
          CK(kern_copy(c, d, g, ne * sizeof(float)));
        else
          CK(kern_act_grad(c, g, Y(e, in), e->y[k], d, rows_of(e, l),
                           l->dim[l->rank - 1], l->act, l->alpha));
        CK(finish_acc(e, in, add, ne));
        break;
      case WK_L_DROPOUT:
        if (!wants(e, in)) break;
        d = din_write(e, in, &add);
        CK(kern_copy(c, d, g, ne * sizeof(float)));
        if (l->rate > 0) CK(kern_mul(c, d, e->mask[k], ne));
        CK(finish_acc(e, in, add, ne));
        break;
      case WK_L_POOL2D:
        if (!wants(e, in)) break;
        d = din_of(e, in, &beta);
        CK(kern_pool2d_grad(c, &l->win, n, l->pool, g, e->arg[k], beta, d));
        break;
      case WK_L_GPOOL: {
        if (!wants(e, in)) break;
        int64_t ch = l->dim[l->rank - 1];
        d = din_of(e, in, &beta);
        if (l->use_mask >= 0)
          CK(kern_masked_mean_grad(c, n, m->layers[in].size / ch, ch, g,
                                   e->seqmask[l->use_mask], beta, d));
        else
          CK(kern_mean_mid_grad(c, g, n, m->layers[in].size / ch, ch, beta,
                                d));
        break;
      }
      case WK_L_RNN:
      case WK_L_MHA:
      case WK_L_ATTN:
      case WK_L_MUL:
        CK(wk_exec__seq_bwd(e, l, k));
        break;
      case WK_L_BATCHNORM:
      case WK_L_LAYERNORM:
        CK(norm_bwd(e, l, k, in, g));
        break;
      case WK_L_ADD: {
        bool avg = l->coef != 1.0f && l->coef != -1.0f;
        for (int i = 0; i < l->n_in; i++) {
          if (!wants(e, l->in[i])) continue;
          float cf = i == 0 && !avg ? 1.0f : l->coef;
          d = din_of(e, l->in[i], &beta);
          size_t cnt = (size_t)(n * l->size);
          if (beta == 0.0f) {
            CK(kern_copy(c, d, g, cnt * sizeof(float)));
            if (cf != 1.0f) CK(kern_scale(c, d, cnt, cf));
          } else {
            CK(kern_axpy(c, d, g, cnt, cf));
          }
        }
        break;
      }
      case WK_L_CONCAT: {
        int64_t outer = cat_outer(l), w_out = l->size / outer, off = 0;
        for (int i = 0; i < l->n_in; i++) {
          int64_t w = m->layers[l->in[i]].size / outer;
          if (wants(e, l->in[i])) {
            d = din_of(e, l->in[i], &beta);
            CK(kern_copy_cols(c, n * outer, w, g, w_out, off, beta, d, w, 0));
          }
          off += w;
        }
        break;
      }
    }
    wk_exec__done(e, o, k); /* overlap: push what is final */
  }
  CK(scatters(e));
  wk_exec__done(e, o, WK_READY_SCATTER);
  if (m->has_reg) CK(regularizers(e, o));
  wk_exec__done(e, o, WK_READY_REG);
  return 0;
}
