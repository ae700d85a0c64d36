/* The Keras sequence layers: Conv1D, MaxPooling1D / AveragePooling1D,
 * GlobalMaxPooling1D/2D, LSTM, GRU, Bidirectional and TimeDistributed
 * (entries of model_layers.c's table), and the masks of
 * Embedding(mask_zero=True) that flow between them.
 *
 * Happy path: a Conv1D or 1-D pooling is the 2-D node over a (1, steps)
 * image, so its kernel [k, in, filters] is Conv2D's [1, k, in, filters];
 * a global max pooling is a max pooling whose window is the whole input.
 * An LSTM or GRU is one RNN node (Keras's gate order, variable names
 * "<layer>/lstm_cell/kernel" ...), a Bidirectional two (the second
 * reading from the end) and a merge, TimeDistributed(Dense) a Dense on the
 * last axis with the wrapper's variable names (tf_keras: "<wrapper>/kernel",
 * Keras 3: "<wrapper>/<inner>/kernel").
 * Failure modes: options Tessera does not implement (stateful,
 * return_state, time_major, dropout, recurrent_dropout, activations other
 * than Keras's defaults, GRU reset_after=False, dilation, a mask reaching a
 * layer that cannot take it): TSR_EUNSUPPORTED naming the layer, its class,
 * the option and what is supported; shapes that do not fit: TSR_ESHAPE.
 */
#include "worker/model_layers_int.h"

#include "common/err.h"

#include <stdio.h>
#include <string.h>

bool tsr_layer__keras3(const json_t *cfg) {
  return json_is_object(json_object_get(cfg, "dtype"));
}

/* kernel_size, strides, pool_size of a 1-D layer: an integer or [k] */
static int get_one(const lp *p, const char *key, int64_t def, int64_t *out) {
  const json_t *v = json_object_get(p->cfg, key);
  if (json_is_array(v) && json_array_size(v) == 1)
    v = json_array_get(v, 0);
  if (!v || json_is_null(v)) {
    if (def < 1)
      return tsr_errf(p->err, p->errlen, TSR_ECONFIG,
                      "layer '%s': %s is required", p->nm, key);
    *out = def;
    return 0;
  }
  if (!json_is_integer(v) || json_integer_value(v) < 1)
    return tsr_errf(p->err, p->errlen, TSR_ECONFIG,
                    "layer '%s' (%s): %s must be a positive integer or a "
                    "list of one", p->nm, p->cls, key);
  *out = json_integer_value(v);
  return 0;
}

/* valid, same, or (Conv1D) causal: the left padding of k - 1 */
static int padding_1d(const lp *p, bool causal_ok, bool *same,
                      bool *causal) {
  const char *s = json_string_value(json_object_get(p->cfg, "padding"));
  *causal = false;
  if (s && causal_ok && !strcasecmp(s, "causal")) {
    *same = true;
    *causal = true;
    return 0;
  }
  if (s && strcasecmp(s, "valid") && strcasecmp(s, "same"))
    return tsr_errf(p->err, p->errlen, TSR_EUNSUPPORTED,
                    "layer '%s' (%s): padding '%s' is not supported "
                    "(supported: valid, same%s)", p->nm, p->cls, s,
                    causal_ok ? ", causal" : "");
  return tsr_layer__get_padding(p, same);
}

static const char seq_shape[] = "a sequence (batch, steps, features)";

int tsr_layer__p_conv1d(lp *p) {
  int rc;
  int64_t filters, k, st, dil, groups;
  bool same = false, causal = false;
  if ((rc = tsr_layer__need_rank(p, 2, seq_shape)) ||
      (rc = tsr_layer__get_int(p, "filters", 0, 1, &filters)) ||
      (rc = get_one(p, "kernel_size", 0, &k)) ||
      (rc = get_one(p, "strides", 1, &st)) ||
      (rc = get_one(p, "dilation_rate", 1, &dil)) ||
      (rc = tsr_layer__get_int(p, "groups", 1, 1, &groups)) ||
      (rc = padding_1d(p, true, &same, &causal)) ||
      (rc = tsr_layer__channels_last(p)))
    return rc;
  if (filters < 1)
    return tsr_errf(p->err, p->errlen, TSR_ECONFIG,
                    "layer '%s': filters must be a positive integer", p->nm);
  if (dil != 1 || groups != 1)
    return tsr_errf(p->err, p->errlen, TSR_EUNSUPPORTED,
                    "layer '%s' (Conv1D): dilation_rate %lld, groups %lld "
                    "is not supported (supported: 1 and 1)", p->nm,
                    (long long)dil, (long long)groups);
  const wk_layer *x = tsr_layer__in0(p);
  kern_win g;
  if (kern_win_make(&g, 1, x->dim[0], x->dim[1], 1, k, 1, st, same))
    return tsr_errf(p->err, p->errlen, TSR_ESHAPE,
                    "layer '%s' (Conv1D): a kernel of %lld does not fit %lld "
                    "steps with padding 'valid'", p->nm, (long long)k,
                    (long long)x->dim[0]);
  if (causal) g.pl = k - 1;
  wk_layer *l = tsr_layer__node(p, WK_L_CONV2D);
  if (!l) return TSR_ERANGE;
  l->win = g;
  l->rank = 2;
  l->dim[0] = g.ow;
  l->dim[1] = filters;
  l->size = g.ow * filters;
  int64_t kshape[3] = {k, g.c, filters};
  return tsr_layer__act_kernel_bias(p, l, 3, kshape, &filters);
}

int tsr_layer__p_pool1d(lp *p) {
  int rc;
  int64_t ps = 0, st = 0; /* set by get_one before use; -O3 cannot see it */
  bool same = false, causal = false;
  if ((rc = tsr_layer__need_rank(p, 2, seq_shape)) ||
      (rc = get_one(p, "pool_size", 2, &ps)) ||
      (rc = get_one(p, "strides", ps, &st)) ||
      (rc = padding_1d(p, false, &same, &causal)) ||
      (rc = tsr_layer__channels_last(p)))
    return rc;
  const wk_layer *x = tsr_layer__in0(p);
  kern_win g;
  if (kern_win_make(&g, 1, x->dim[0], x->dim[1], 1, ps, 1, st, same))
    return tsr_errf(p->err, p->errlen, TSR_ESHAPE,
                    "layer '%s' (%s): a pool of %lld does not fit %lld steps "
                    "with padding 'valid'", p->nm, p->cls, (long long)ps,
                    (long long)x->dim[0]);
  return tsr_layer__pool_node(
      p, &g, strstr(p->cls, "Max") ? KERN_POOL2D_MAX : KERN_POOL2D_AVG, 2);
}

int tsr_layer__p_gmaxpool(lp *p) {
  int rc;
  bool keep = false;
  bool two = strstr(p->cls, "2D") != NULL;
  if ((rc = tsr_layer__need_rank(p, two ? 3 : 2, two ? "an image (batch, "
                                 "rows, cols, channels)" : seq_shape)) ||
      (rc = tsr_layer__channels_last(p)) ||
      (rc = tsr_layer__get_bool(p, "keepdims", false, &keep)))
    return rc;
  const wk_layer *x = tsr_layer__in0(p);
  int64_t h = two ? x->dim[0] : 1, w = two ? x->dim[1] : x->dim[0];
  int64_t c = x->dim[x->rank - 1];
  kern_win g;
  if (kern_win_make(&g, h, w, c, h, w, h, w, false)) return TSR_ESHAPE;
  /* the window is the whole input: every output axis but the channels is 1 */
  return tsr_layer__pool_node(p, &g, KERN_POOL2D_MAX, keep ? x->rank : 1);
}

/* ---- LSTM, GRU, Bidirectional ------------------------------------------ */

static int refuse(const lp *p, const char *fmt, const char *key,
                  const char *supported) {
  char what[160];
  snprintf(what, sizeof what, fmt, key);
  return tsr_errf(p->err, p->errlen, TSR_EUNSUPPORTED,
                  "layer '%s' (%s): %s is not supported (supported: %s)",
                  p->nm, p->cls, what, supported);
}

/* The options of an LSTM or GRU config that Tessera does not implement. */
static int rnn_opts(const lp *p, bool gru) {
  static const char *const truthy[] = {"stateful", "return_state",
                                       "time_major", NULL};
  int rc;
  for (int i = 0; truthy[i]; i++) {
    const json_t *v = json_object_get(p->cfg, truthy[i]);
    if (v && json_is_true(v))
      return refuse(p, "%s=true", truthy[i], "false");
  }
  static const char *const rates[] = {"dropout", "recurrent_dropout", NULL};
  for (int i = 0; rates[i]; i++) {
    double r;
    if ((rc = tsr_layer__get_num(p, rates[i], 0, &r))) return rc;
    if (r != 0) return refuse(p, "%s above 0", rates[i], "0");
  }
  const char *a = json_string_value(json_object_get(p->cfg, "activation"));
  const char *ra =
      json_string_value(json_object_get(p->cfg, "recurrent_activation"));
  if ((a && strcmp(a, "tanh")) || (ra && strcmp(ra, "sigmoid")))
    return tsr_errf(p->err, p->errlen, TSR_EUNSUPPORTED,
                    "layer '%s' (%s): activation '%s' with "
                    "recurrent_activation '%s' is not supported (supported: "
                    "Keras's defaults, tanh and sigmoid)", p->nm, p->cls,
                    a ? a : "tanh", ra ? ra : "sigmoid");
  const json_t *rc_ = json_object_get(p->cfg, "recurrent_constraint");
  if (rc_ && !json_is_null(rc_))
    return refuse(p, "%s", "recurrent_constraint", "null");
  if (gru) {
    const json_t *ra2 = json_object_get(p->cfg, "reset_after");
    if (ra2 && json_is_false(ra2))
      return refuse(p, "%s=false", "reset_after", "true, Keras's default");
  }
  return 0;
}

/* One RNN node reading node `in`: its variables named vpre/kernel,
 * vpre/recurrent_kernel, vpre/bias. */
static int rnn_node(lp *p, int in, const char *node_name, const char *vpre,
                    bool reverse, bool rev_out, bool zero_masked,
                    int *out) {
  bool gru = !strcmp(p->cls, "GRU");
  int rc;
  int64_t units;
  bool ret_seq = false, use_bias = true, ufb = true;
  if ((rc = rnn_opts(p, gru)) ||
      (rc = tsr_layer__get_int(p, "units", 0, 1, &units)) ||
      (rc = tsr_layer__get_bool(p, "return_sequences", false, &ret_seq)) ||
      (rc = tsr_layer__get_bool(p, "use_bias", true, &use_bias)) ||
      (rc = tsr_layer__get_bool(p, "unit_forget_bias", true, &ufb)))
    return rc;
  if (units < 1)
    return tsr_errf(p->err, p->errlen, TSR_ECONFIG,
                    "layer '%s': units must be a positive integer", p->nm);
  const wk_layer *x = &p->m->layers[in];
  if (x->rank != 2) {
    char s[96];
    tsr_layer__shape_text(x, s, sizeof s);
    return tsr_errf(p->err, p->errlen, TSR_ESHAPE,
                    "layer '%s' (%s): input of shape %s; it needs %s", p->nm,
                    p->cls, s, seq_shape);
  }
  wk_layer *l = tsr_model__add_node(p->m, WK_L_RNN, node_name, p->cls, &in, 1,
                                   p->err, p->errlen);
  if (!l) return TSR_ERANGE;
  int k = (int)(l - p->m->layers);
  *out = k;
  l->cell = gru ? WK_CELL_GRU : WK_CELL_LSTM;
  l->units = units;
  l->reverse = reverse;
  l->rev_out = rev_out;
  l->ret_seq = ret_seq;
  l->zero_masked = zero_masked;
  l->use_mask = x->mask_src;
  l->mask_src = ret_seq ? x->mask_src : -1;
  l->rank = ret_seq ? 2 : 1;
  l->dim[0] = ret_seq ? x->dim[0] : units;
  l->dim[1] = ret_seq ? units : 0;
  l->size = ret_seq ? x->dim[0] * units : units;
  l->use_bias = use_bias;
  int64_t gates = gru ? 3 : 4;
  int64_t ks[2] = {x->dim[1], gates * units}, rs[2] = {units, gates * units};
  lp q = *p;
  q.vprefix = vpre;
  if ((l->var_w = tsr_layer__var(&q, "kernel", 2, ks, "kernel_initializer",
                                 "glorot_uniform")) < 0)
    return l->var_w;
  if ((l->var_x[0] = tsr_layer__var(&q, "recurrent_kernel", 2, rs,
                                    "recurrent_initializer",
                                    "orthogonal")) < 0)
    return l->var_x[0];
  if (use_bias) {
    int64_t bs[2] = {2, gates * units};
    bool two = gru; /* reset_after: input and recurrent biases */
    const json_t *bi = json_object_get(p->cfg, "bias_initializer");
    const char *bn = json_is_string(bi) ? json_string_value(bi)
                     : json_string_value(json_object_get(bi, "class_name"));
    bool zeros = !bn || !strcasecmp(bn, "zeros");
    if (!gru && ufb && !zeros)
      return tsr_errf(p->err, p->errlen, TSR_EUNSUPPORTED,
                      "layer '%s' (LSTM): unit_forget_bias=true with "
                      "bias_initializer '%s' is not supported (supported: "
                      "zeros, or unit_forget_bias=false)", p->nm, bn);
    if ((l->var_b = tsr_layer__var(&q, "bias", two ? 2 : 1,
                                   two ? bs : bs + 1, "bias_initializer",
                                   "zeros")) < 0)
      return l->var_b;
    if (!gru && ufb) {
      tsr_init_spec is = {.kind = TSR_INIT_FORGET_BIAS, .a = (double)units};
      tsr_var_set_init(&p->m->vars[l->var_b], &is);
    }
  }
  if ((rc = tsr_layer__set_reg(&q, l->var_w, "kernel_regularizer")) ||
      (rc = tsr_layer__set_reg(&q, l->var_x[0], "recurrent_regularizer")) ||
      (rc = tsr_layer__set_reg(&q, l->var_b, "bias_regularizer")))
    return rc;
  return 0;
}

static const char *cell_name(const char *cls) {
  return !strcmp(cls, "GRU") ? "gru_cell" : "lstm_cell";
}

int tsr_layer__p_rnn(lp *p) {
  int rc;
  bool back = false, zero = false;
  if ((rc = tsr_layer__get_bool(p, "go_backwards", false, &back)) ||
      (rc = tsr_layer__get_bool(p, "zero_output_for_mask", false, &zero)))
    return rc;
  char vpre[160];
  snprintf(vpre, sizeof vpre, "%s/%s", p->nm, cell_name(p->cls));
  return rnn_node(p, p->in[0], p->nm, vpre, back, back, zero, p->out);
}

/* The layer a wrapper (Bidirectional, TimeDistributed) holds in
 * config.layer: its class, one of `ok` (NULL-terminated), and config. */
static int wrapped(const lp *p, const char *wrapper, const char *const *ok,
                   const char **icls, const json_t **icfg) {
  const json_t *inner = json_object_get(p->cfg, "layer");
  *icls = json_string_value(json_object_get(inner, "class_name"));
  *icfg = json_object_get(inner, "config");
  if (!*icls || !json_is_object(*icfg))
    return tsr_errf(p->err, p->errlen, TSR_ECONFIG,
                    "layer '%s' (%s): config.layer needs class_name and "
                    "config", p->nm, wrapper);
  char list[64] = "";
  size_t off = 0;
  for (int i = 0; ok[i]; i++) {
    if (!strcmp(*icls, ok[i])) return 0;
    off += (size_t)snprintf(list + off, sizeof list - off, "%s%s",
                            i ? ", " : "", ok[i]);
  }
  return tsr_errf(p->err, p->errlen, TSR_EUNSUPPORTED,
                  "layer '%s' (%s): wrapping a %s is not supported "
                  "(supported: %s)", p->nm, wrapper, *icls, list);
}

int tsr_layer__p_bidir(lp *p) {
  static const char *const cells[] = {"LSTM", "GRU", NULL};
  const char *icls;
  const json_t *icfg;
  int rc = wrapped(p, "Bidirectional", cells, &icls, &icfg);
  if (rc) return rc;
  const char *mm = json_string_value(json_object_get(p->cfg, "merge_mode"));
  if (!json_object_get(p->cfg, "merge_mode")) mm = "concat";
  if (!mm || (strcmp(mm, "concat") && strcmp(mm, "sum") &&
              strcmp(mm, "ave") && strcmp(mm, "mul")))
    return tsr_errf(p->err, p->errlen, TSR_EUNSUPPORTED,
                    "layer '%s' (Bidirectional): merge_mode %s is not "
                    "supported (supported: concat, sum, ave, mul)", p->nm,
                    mm ? mm : "null");
  const char *iname = json_string_value(json_object_get(icfg, "name"));
  if (!iname) iname = !strcmp(icls, "GRU") ? "gru" : "lstm";
  bool k3 = tsr_layer__keras3(p->cfg) || tsr_layer__keras3(icfg);
  const json_t *bl = json_object_get(p->cfg, "backward_layer");
  const json_t *bcfg = json_object_get(bl, "config");
  const char *bname = json_string_value(json_object_get(bcfg, "name"));
  char fn[96], bn[96];
  if (k3 && !strncmp(iname, "forward_", 8)) snprintf(fn, sizeof fn, "%s", iname);
  else snprintf(fn, sizeof fn, "forward_%s", iname);
  if (k3 && bname) snprintf(bn, sizeof bn, "%s", bname);
  else snprintf(bn, sizeof bn, "backward_%s", !strncmp(iname, "forward_", 8)
                                                  ? iname + 8 : iname);
  if (bl && !json_is_null(bl)) {
    const char *bcls = json_string_value(json_object_get(bl, "class_name"));
    const json_t *fu = json_object_get(icfg, "units");
    const json_t *bu = json_object_get(bcfg, "units");
    if (!bcls || strcmp(bcls, icls) || !json_equal(fu, bu) ||
        !json_is_true(json_object_get(bcfg, "go_backwards")) ||
        !json_equal(json_object_get(icfg, "return_sequences"),
                    json_object_get(bcfg, "return_sequences")))
      return tsr_errf(p->err, p->errlen, TSR_EUNSUPPORTED,
                      "layer '%s' (Bidirectional): a backward_layer other "
                      "than the wrapped layer read backwards is not "
                      "supported", p->nm);
  }
  lp q = *p;
  q.cls = icls;
  q.cfg = icfg;
  bool back = false, ret = false;
  if ((rc = tsr_layer__get_bool(&q, "go_backwards", false, &back)) ||
      (rc = tsr_layer__get_bool(&q, "return_sequences", false, &ret)))
    return rc;
  if (back)
    return tsr_errf(p->err, p->errlen, TSR_EUNSUPPORTED,
                    "layer '%s' (Bidirectional): a wrapped layer with "
                    "go_backwards=true is not supported (supported: false)",
                    p->nm);
  char nf[160], nb[160], vf[200], vb[200];
  snprintf(nf, sizeof nf, "%s/%s", p->nm, fn);
  snprintf(nb, sizeof nb, "%s/%s", p->nm, bn);
  snprintf(vf, sizeof vf, "%s/%s", nf, cell_name(icls));
  snprintf(vb, sizeof vb, "%s/%s", nb, cell_name(icls));
  int two[2];
  /* Keras forces zero outputs at masked steps when returning sequences */
  if ((rc = rnn_node(&q, p->in[0], nf, vf, false, false, ret, &two[0])) ||
      (rc = rnn_node(&q, p->in[0], nb, vb, true, false, ret, &two[1])))
    return rc;
  wk_layer_kind kind = !strcmp(mm, "concat") ? WK_L_CONCAT
                       : !strcmp(mm, "mul") ? WK_L_MUL : WK_L_ADD;
  wk_layer *l = tsr_model__add_node(p->m, kind, p->nm, "Bidirectional", two,
                                   2, p->err, p->errlen);
  if (!l) return TSR_ERANGE;
  *p->out = (int)(l - p->m->layers);
  const wk_layer *f = &p->m->layers[two[0]];
  tsr_layer__same_shape(l, f);
  l->mask_src = f->mask_src;
  if (kind == WK_L_CONCAT) {
    l->cat_axis = l->rank - 1;
    l->dim[l->rank - 1] *= 2;
    l->size *= 2;
  }
  l->coef = !strcmp(mm, "ave") ? 0.5f : 1.0f;
  return 0;
}

int tsr_layer__p_timedist(lp *p) {
  static const char *const dense_only[] = {"Dense", NULL};
  const char *icls;
  const json_t *icfg;
  int rc = wrapped(p, "TimeDistributed", dense_only, &icls, &icfg);
  if (rc) return rc;
  if (tsr_layer__in0(p)->rank < 2)
    return tsr_layer__need_rank(p, 2, seq_shape);
  const char *iname = json_string_value(json_object_get(icfg, "name"));
  char vpre[160];
  if (tsr_layer__keras3(p->cfg) && iname)
    snprintf(vpre, sizeof vpre, "%s/%s", p->nm, iname);
  else
    snprintf(vpre, sizeof vpre, "%s", p->nm);
  lp q = *p;
  q.cfg = icfg;
  q.vprefix = vpre;
  return tsr_layer__p_dense(&q);
}

/* ---- masks --------------------------------------------------------------*/

static bool passes_mask(const char *cls) {
  static const char *const pass[] = {
      "Dense", "TimeDistributed", "Dropout", "Activation", "ReLU",
      "LeakyReLU", "ELU", "LayerNormalization", "Bidirectional", "Add",
      "Subtract", "Average", "Concatenate", NULL};
  for (int i = 0; pass[i]; i++)
    if (!strcmp(cls, pass[i])) return true;
  return false;
}

int tsr_layer__mask_rule(lp *p, int node) {
  tsr_model *m = p->m;
  wk_layer *l = &m->layers[node];
  if (node == p->in[0] || l->kind == WK_L_EMBED || l->kind == WK_L_RNN ||
      l->kind == WK_L_MHA || l->kind == WK_L_ATTN)
    return 0; /* nothing new, or the parser said */
  int src = -1;
  for (int i = 0; i < l->n_in; i++) {
    int s = m->layers[l->in[i]].mask_src;
    if (s < 0) continue;
    if (src >= 0 && s != src)
      return tsr_errf(p->err, p->errlen, TSR_EUNSUPPORTED,
                      "layer '%s' (%s): its inputs carry the masks of two "
                      "Embedding layers ('%s' and '%s'); merging masks is not "
                      "supported", p->nm, p->cls, m->layers[src].name,
                      m->layers[s].name);
    src = s;
  }
  if (src < 0) return 0;
  if (l->kind == WK_L_GPOOL && !strcmp(p->cls, "GlobalAveragePooling1D")) {
    l->use_mask = src; /* the mean over the unmasked steps */
    return 0;
  }
  bool ok = passes_mask(p->cls);
  if (l->kind == WK_L_CONCAT && l->cat_axis != l->rank - 1) ok = false;
  if (!ok)
    return tsr_errf(p->err, p->errlen, TSR_EUNSUPPORTED,
                    "layer '%s' (%s): its input carries the mask of "
                    "Embedding '%s' (mask_zero=true), which a %s cannot take "
                    "(supported: LSTM, GRU, Bidirectional, MultiHeadAttention,"
                    " Attention and GlobalAveragePooling1D use it; Dense, "
                    "TimeDistributed, Dropout, activation layers, "
                    "LayerNormalization and merges on the last axis pass it "
                    "on)", p->nm, p->cls, m->layers[src].name, p->cls);
  l->mask_src = src;
  return 0;
}
