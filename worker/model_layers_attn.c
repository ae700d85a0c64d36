/* Keras's attention layers (entries of model_layers.c's table):
 * MultiHeadAttention over the steps of (batch, steps, features) inputs,
 * called as mha(query, value) or mha(query, value, key), and the
 * dot-product Attention()([query, value]) / ([query, value, key]).
 *
 * Happy path: one node reading the query, value and key nodes (the key is
 * the value when not given). MultiHeadAttention's variables are Keras's,
 * in Keras's order: query, key, value kernels [features, heads, key_dim]
 * with biases [heads, key_dim], then attention_output/kernel [heads,
 * value_dim, output] and its bias. Masks of Embedding(mask_zero) inputs
 * are applied as Keras applies them (query and value masks combined into
 * the attention mask); the output carries the query's mask.
 * Failure modes: options Tessera does not implement (dropout, gates,
 * attention over other axes, score_mode concat, keys whose mask differs
 * from the value's): TSR_EUNSUPPORTED naming the layer, the option and
 * what is supported; inputs that are not (batch, steps, features) or whose
 * widths do not fit: TSR_ESHAPE.
 */
#include "worker/model_layers_int.h"

#include "common/err.h"

#include <stdio.h>
#include <string.h>

static int seq_input(const lp *p, int i, const char *role) {
  const wk_layer *x = &p->m->layers[p->in[i]];
  if (x->rank == 2) return 0;
  char s[96];
  tsr_layer__shape_text(x, s, sizeof s);
  return tsr_errf(p->err, p->errlen, TSR_ESHAPE,
                  "layer '%s' (%s): the %s has shape %s; it needs a sequence "
                  "(batch, steps, features)", p->nm, p->cls, role, s);
}

/* The key's mask must be the value's (Keras masks the keys by either). */
static int masks(const lp *p, wk_layer *l) {
  const tsr_model *m = p->m;
  int vm = m->layers[p->in[1]].mask_src;
  if (p->n_in > 2 && m->layers[p->in[2]].mask_src != vm)
    return tsr_errf(p->err, p->errlen, TSR_EUNSUPPORTED,
                    "layer '%s' (%s): a key whose mask differs from the "
                    "value's is not supported", p->nm, p->cls);
  l->use_mask = m->layers[p->in[0]].mask_src;
  l->use_mask2 = vm;
  l->mask_src = l->use_mask;
  return 0;
}

static int nonzero(const lp *p, const char *key, const char *supported) {
  const json_t *v = json_object_get(p->cfg, key);
  if (!v || json_is_null(v) || json_is_false(v) ||
      (json_is_number(v) && json_number_value(v) == 0))
    return 0;
  return tsr_errf(p->err, p->errlen, TSR_EUNSUPPORTED,
                  "layer '%s' (%s): %s is not supported (supported: %s)",
                  p->nm, p->cls, key, supported);
}

/* A kernel [in, a, b] and bias [a, b] of sub-layer `sub` (query, key,
 * value), or the output's kernel [a, b, in] and bias [in]. */
static int einsum_vars(lp *p, const char *sub, bool out, int64_t in,
                       int64_t a, int64_t b, bool bias, int *vk, int *vb) {
  char pre[160];
  snprintf(pre, sizeof pre, "%s/%s", p->nm, sub);
  lp q = *p;
  q.vprefix = pre;
  int64_t ks[3] = {in, a, b}, ko[3] = {a, b, in}, bs[2] = {a, b};
  int rc;
  if ((*vk = tsr_layer__var(&q, "kernel", 3, out ? ko : ks,
                            "kernel_initializer", "glorot_uniform")) < 0)
    return *vk;
  if (bias && (*vb = tsr_layer__var(&q, "bias", out ? 1 : 2, out ? &in : bs,
                                    "bias_initializer", "zeros")) < 0)
    return *vb;
  if ((rc = tsr_layer__set_reg(&q, *vk, "kernel_regularizer")) ||
      (rc = tsr_layer__set_reg(&q, *vb, "bias_regularizer")))
    return rc;
  return 0;
}

int tsr_layer__p_mha(lp *p) {
  int rc;
  if (p->n_in < 2 || p->n_in > 3)
    return tsr_errf(p->err, p->errlen, TSR_ESHAPE,
                    "layer '%s' (MultiHeadAttention) is called with %d "
                    "tensors; it needs query and value (and a key)", p->nm,
                    p->n_in);
  if ((rc = seq_input(p, 0, "query")) || (rc = seq_input(p, 1, "value")) ||
      (p->n_in > 2 && (rc = seq_input(p, 2, "key"))) ||
      (rc = nonzero(p, "dropout", "0")) ||
      (rc = nonzero(p, "use_gate", "false")) ||
      (rc = nonzero(p, "sliding_window", "null")) ||
      (rc = nonzero(p, "softmax_robust_masking", "false")))
    return rc;
  const json_t *ax = json_object_get(p->cfg, "attention_axes");
  if (ax && !json_is_null(ax) &&
      !(json_is_array(ax) && json_array_size(ax) == 1 &&
        (json_integer_value(json_array_get(ax, 0)) == 1 ||
         json_integer_value(json_array_get(ax, 0)) == -2)) &&
      !(json_is_integer(ax) && json_integer_value(ax) == 1))
    return tsr_errf(p->err, p->errlen, TSR_EUNSUPPORTED,
                    "layer '%s' (MultiHeadAttention): these attention_axes "
                    "are not supported (supported: [1], the steps)", p->nm);
  int64_t heads, kd, vd, od;
  bool use_bias = true;
  const wk_layer *qx = &p->m->layers[p->in[0]];
  const wk_layer *vx = &p->m->layers[p->in[1]];
  const wk_layer *kx = &p->m->layers[p->in[p->n_in > 2 ? 2 : 1]];
  const json_t *os = json_object_get(p->cfg, "output_shape");
  if (json_is_array(os) && json_array_size(os) == 1)
    os = json_array_get(os, 0);
  if (os && !json_is_null(os) && !json_is_integer(os))
    return tsr_errf(p->err, p->errlen, TSR_EUNSUPPORTED,
                    "layer '%s' (MultiHeadAttention): output_shape of more "
                    "than one axis is not supported", p->nm);
  if ((rc = tsr_layer__get_int(p, "num_heads", 0, 1, &heads)) ||
      (rc = tsr_layer__get_int(p, "key_dim", 0, 1, &kd)) ||
      (rc = tsr_layer__get_int(p, "value_dim", kd, 1, &vd)) ||
      (rc = tsr_layer__get_bool(p, "use_bias", true, &use_bias)))
    return rc;
  od = os && json_is_integer(os) ? json_integer_value(os) : qx->dim[1];
  if (heads < 1 || kd < 1 || od < 1)
    return tsr_errf(p->err, p->errlen, TSR_ECONFIG,
                    "layer '%s': num_heads, key_dim and output_shape must be "
                    "positive", p->nm);
  if (kx->dim[0] != vx->dim[0])
    return tsr_errf(p->err, p->errlen, TSR_ESHAPE,
                    "layer '%s' (MultiHeadAttention): the key has %lld steps, "
                    "the value %lld", p->nm, (long long)kx->dim[0],
                    (long long)vx->dim[0]);
  wk_layer *l = tsr_layer__node(p, WK_L_MHA);
  if (!l) return TSR_ERANGE;
  l->heads = heads;
  l->key_dim = kd;
  l->value_dim = vd;
  l->units = od;
  l->use_bias = use_bias;
  l->rank = 2;
  l->dim[0] = qx->dim[0];
  l->dim[1] = od;
  l->size = qx->dim[0] * od;
  int *x = l->var_x;
  if ((rc = einsum_vars(p, "query", false, qx->dim[1], heads, kd, use_bias,
                        &x[0], &x[1])) ||
      (rc = einsum_vars(p, "key", false, kx->dim[1], heads, kd, use_bias,
                        &x[2], &x[3])) ||
      (rc = einsum_vars(p, "value", false, vx->dim[1], heads, vd, use_bias,
                        &x[4], &x[5])) ||
      (rc = einsum_vars(p, "attention_output", true, od, heads, vd, use_bias,
                        &x[6], &x[7])))
    return rc;
  return masks(p, l);
}

int tsr_layer__p_attention(lp *p) {
  int rc;
  if (p->n_in < 2 || p->n_in > 3)
    return tsr_errf(p->err, p->errlen, TSR_ESHAPE,
                    "layer '%s' (Attention) is given %d tensors; it needs "
                    "[query, value] or [query, value, key]", p->nm, p->n_in);
  const char *sm = json_string_value(json_object_get(p->cfg, "score_mode"));
  if (sm && strcmp(sm, "dot"))
    return tsr_errf(p->err, p->errlen, TSR_EUNSUPPORTED,
                    "layer '%s' (Attention): score_mode '%s' is not supported "
                    "(supported: dot)", p->nm, sm);
  if ((rc = seq_input(p, 0, "query")) || (rc = seq_input(p, 1, "value")) ||
      (p->n_in > 2 && (rc = seq_input(p, 2, "key"))) ||
      (rc = nonzero(p, "dropout", "0")) || (rc = nonzero(p, "causal", "false")))
    return rc;
  bool scale = false;
  if ((rc = tsr_layer__get_bool(p, "use_scale", false, &scale))) return rc;
  const wk_layer *qx = &p->m->layers[p->in[0]];
  const wk_layer *vx = &p->m->layers[p->in[1]];
  const wk_layer *kx = &p->m->layers[p->in[p->n_in > 2 ? 2 : 1]];
  if (qx->dim[1] != kx->dim[1] || kx->dim[0] != vx->dim[0])
    return tsr_errf(p->err, p->errlen, TSR_ESHAPE,
                    "layer '%s' (Attention): query (batch, %lld, %lld), key "
                    "(batch, %lld, %lld), value (batch, %lld, %lld): query "
                    "and key need the same width, key and value the same "
                    "steps", p->nm, (long long)qx->dim[0],
                    (long long)qx->dim[1], (long long)kx->dim[0],
                    (long long)kx->dim[1], (long long)vx->dim[0],
                    (long long)vx->dim[1]);
  wk_layer *l = tsr_layer__node(p, WK_L_ATTN);
  if (!l) return TSR_ERANGE;
  l->rank = 2;
  l->dim[0] = qx->dim[0];
  l->dim[1] = vx->dim[1];
  l->size = qx->dim[0] * vx->dim[1];
  l->heads = 1;
  l->key_dim = qx->dim[1];
  l->value_dim = vx->dim[1];
  if (scale) {
    int64_t one = 1;
    tsr_init_spec is = {.kind = TSR_INIT_ONES};
    if ((l->var_w = tsr_model__add_var(p->m, p->nm, "scale", 1, &one, &is,
                                      TSR_VAR_DENSE)) < 0)
      return l->var_w;
  }
  return masks(p, l);
}
