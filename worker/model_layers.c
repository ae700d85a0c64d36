/* The Keras layers Tessera runs: one {class_name, parser} table, each
 * parser reading a layer's config as Keras 2 (tf_keras) and Keras 3 write
 * it, working out its output shape from its inputs' and creating its
 * variables with Keras's names, shapes, order and initializers.
 *
 * The layers without variables (activation layers, Dropout, merges) are
 * in model_layers_plain.c.
 * Happy path: tsr_model__parse_layer() finds the class in the table,
 * refuses options that are set but not implemented, and calls the parser,
 * which appends one node (or none, for a layer that computes nothing).
 * Failure modes: a class not in the table, an option not implemented, or
 * shapes that do not fit: TSR_EUNSUPPORTED / TSR_ESHAPE / TSR_ECONFIG with
 * the layer's name, the key and the value, and what is supported.
 */
#include "worker/model_layers_int.h"

#include "common/err.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const wk_layer *tsr_layer__in0(const lp *p) { return &p->m->layers[p->in[0]]; }

wk_layer *tsr_layer__node(lp *p, wk_layer_kind kind) {
  wk_layer *l = tsr_model__add_node(p->m, kind, p->nm, p->cls, p->in, p->n_in,
                                   p->err, p->errlen);
  if (l) *p->out = (int)(l - p->m->layers);
  return l;
}

void tsr_layer__same_shape(wk_layer *l, const wk_layer *src) {
  l->rank = src->rank;
  memcpy(l->dim, src->dim, sizeof l->dim);
  l->size = src->size;
}

wk_layer *tsr_layer__node_same(lp *p, wk_layer_kind kind) {
  wk_layer *l = tsr_layer__node(p, kind);
  if (l) tsr_layer__same_shape(l, tsr_layer__in0(p));
  return l;
}

void tsr_layer__shape_text(const wk_layer *l, char *buf, size_t len) {
  size_t o = (size_t)snprintf(buf, len, "(batch");
  for (int i = 0; i < l->rank && o < len; i++)
    o += (size_t)snprintf(buf + o, len - o, ", %lld", (long long)l->dim[i]);
  if (o < len) snprintf(buf + o, len - o, ")");
}

/* ---- config values -------------------------------------------------------*/

/* The value of `key` in the layer's config; NULL when it is absent or
 * null, where the getters give their default. */
static const json_t *cfg_get(const lp *p, const char *key) {
  const json_t *v = json_object_get(p->cfg, key);
  return json_is_null(v) ? NULL : v;
}

/* A value of the wrong type: "layer 'N': KEY must be WANT". */
static int cfg_bad(const lp *p, const char *key, const char *want) {
  return tsr_errf(p->err, p->errlen, TSR_ECONFIG, "layer '%s': %s must be %s",
                  p->nm, key, want);
}

int tsr_layer__get_int(const lp *p, const char *key, int64_t def, int64_t lo,
                   int64_t *out) {
  const json_t *v = cfg_get(p, key);
  if (v && (!json_is_integer(v) || json_integer_value(v) < lo))
    return tsr_errf(p->err, p->errlen, TSR_ECONFIG,
                    "layer '%s': %s must be an integer >= %lld",
                    p->nm, key, (long long)lo);
  *out = v ? json_integer_value(v) : def;
  return 0;
}

int tsr_layer__get_num(const lp *p, const char *key, double def, double *out) {
  const json_t *v = cfg_get(p, key);
  if (v && !json_is_number(v)) return cfg_bad(p, key, "a number");
  *out = v ? json_number_value(v) : def;
  return 0;
}

int tsr_layer__get_bool(const lp *p, const char *key, bool def, bool *out) {
  const json_t *v = cfg_get(p, key);
  if (v && !json_is_boolean(v)) return cfg_bad(p, key, "true or false");
  *out = v ? json_is_true(v) : def;
  return 0;
}

/* kernel_size, strides, pool_size: an integer or a pair; `def` when null
 * (def[0] < 1: required). */
int tsr_layer__get_pair(const lp *p, const char *key, const int64_t *def,
                    int64_t out[2]) {
  const json_t *v = cfg_get(p, key);
  if (!v) {
    if (!def || def[0] < 1)
      return tsr_errf(p->err, p->errlen, TSR_ECONFIG,
                      "layer '%s': %s is required", p->nm, key);
    out[0] = def[0];
    out[1] = def[1];
    return 0;
  }
  if (json_is_integer(v)) {
    out[0] = out[1] = json_integer_value(v);
  } else if (json_is_array(v) && json_array_size(v) == 2 &&
             json_is_integer(json_array_get(v, 0)) &&
             json_is_integer(json_array_get(v, 1))) {
    out[0] = json_integer_value(json_array_get(v, 0));
    out[1] = json_integer_value(json_array_get(v, 1));
  } else {
    return tsr_errf(p->err, p->errlen, TSR_ECONFIG,
                    "layer '%s': %s must be an integer or a pair "
                    "of integers", p->nm, key);
  }
  if (out[0] < 1 || out[1] < 1)
    return tsr_errf(p->err, p->errlen, TSR_ECONFIG,
                    "layer '%s': %s must be >= 1", p->nm, key);
  return 0;
}

int tsr_layer__get_padding(const lp *p, bool *same) {
  const char *s = json_string_value(json_object_get(p->cfg, "padding"));
  if (!s || !strcasecmp(s, "valid")) *same = false;
  else if (!strcasecmp(s, "same")) *same = true;
  else
    return tsr_errf(p->err, p->errlen, TSR_EUNSUPPORTED,
                    "layer '%s': padding '%s' is not "
                    "supported (supported: valid, same)", p->nm, s);
  return 0;
}

int tsr_layer__channels_last(const lp *p) {
  const char *s = json_string_value(json_object_get(p->cfg, "data_format"));
  if (s && strcmp(s, "channels_last"))
    return tsr_errf(p->err, p->errlen, TSR_EUNSUPPORTED,
                    "layer '%s': data_format '%s' is not "
                    "supported (images are NHWC: channels_last)", p->nm, s);
  return 0;
}

/* Keras regularizer: null, "l1"/"l2"/"l1_l2", or {"class_name": "L1" |
 * "L2" | "L1L2", "config": {"l1": a, "l2": b}}. */
static int get_reg(const lp *p, const char *key, float *l1, float *l2) {
  *l1 = *l2 = 0;
  const json_t *v = cfg_get(p, key);
  if (!v) return 0;
  const char *c = json_is_string(v) ? json_string_value(v)
                  : json_string_value(json_object_get(v, "class_name"));
  const json_t *cfg = json_is_object(v) ? json_object_get(v, "config") : NULL;
  double a = 0, b = 0;
  if (c && (!strcmp(c, "L1") || !strcmp(c, "l1"))) a = 0.01;
  else if (c && (!strcmp(c, "L2") || !strcmp(c, "l2"))) b = 0.01;
  else if (c && (!strcmp(c, "L1L2") || !strcmp(c, "l1_l2")))
    a = b = json_is_string(v) ? 0.01 : 0.0;
  else
    return tsr_errf(p->err, p->errlen, TSR_EUNSUPPORTED,
                    "layer '%s': %s '%s' is not supported "
                    "(supported: L1, L2, L1L2)", p->nm, key, c ? c : "?");
  const json_t *x;
  if (cfg && (x = json_object_get(cfg, "l1")) && json_is_number(x))
    a = json_number_value(x);
  if (cfg && (x = json_object_get(cfg, "l2")) && json_is_number(x))
    b = json_number_value(x);
  if (a < 0 || b < 0 || !isfinite(a) || !isfinite(b))
    return tsr_errf(p->err, p->errlen, TSR_ECONFIG,
                    "layer '%s': %s factors must be >= 0", p->nm,
                    key);
  *l1 = (float)a;
  *l2 = (float)b;
  return 0;
}

int tsr_layer__set_reg(lp *p, int var, const char *key) {
  if (var < 0) return 0;
  tsr_var *v = &p->m->vars[var];
  int rc = get_reg(p, key, &v->l1, &v->l2);
  if (rc == 0 && (v->l1 > 0 || v->l2 > 0)) p->m->has_reg = true;
  return rc;
}

/* A variable of the layer; its index or a negative code. */
int tsr_layer__var(lp *p, const char *vname, int rank, const int64_t *shape,
               const char *init_key, const char *init_def) {
  tsr_init_spec is;
  char where[128];
  snprintf(where, sizeof where, "layer '%s' %s", p->nm, init_key);
  int rc = tsr_model__parse_init(json_object_get(p->cfg, init_key), init_def,
                                where, &is, p->err, p->errlen);
  if (rc) return rc;
  if (is.kind == TSR_INIT_ORTHOGONAL && rank != 2)
    return tsr_errf(p->err, p->errlen, TSR_EUNSUPPORTED,
                    "layer '%s' (%s): %s Orthogonal on a rank-%d variable is "
                    "not supported (rank 2 only)", p->nm, p->cls, init_key,
                    rank);
  rc = tsr_model__add_var(p->m, p->vprefix ? p->vprefix : p->nm, vname, rank,
                         shape, &is, TSR_VAR_DENSE);
  if (rc == TSR_ERANGE)
    snprintf(p->err, p->errlen, "layer '%s': %s: a dim is < 1 or the size "
             "is too large", p->nm, vname);
  return rc;
}

int tsr_layer__need_rank(const lp *p, int rank, const char *what) {
  if (tsr_layer__in0(p)->rank == rank) return 0;
  char s[96];
  tsr_layer__shape_text(tsr_layer__in0(p), s, sizeof s);
  return tsr_errf(p->err, p->errlen, TSR_ESHAPE,
                  "layer '%s' (%s): input of shape %s; it needs %s",
                  p->nm, p->cls, s, what);
}

/* What Dense and Conv2D share: the activation, use_bias, a kernel of
 * shape kshape[krank] and a bias of `units`, with their initializers and
 * regularizers. */
int tsr_layer__act_kernel_bias(lp *p, wk_layer *l, int krank,
                           const int64_t *kshape, const int64_t *units) {
  int rc;
  if ((rc = tsr_model__parse_act(json_object_get(p->cfg, "activation"), p->nm,
                                &l->act, &l->alpha, p->err, p->errlen)) ||
      (rc = tsr_layer__get_bool(p, "use_bias", true, &l->use_bias)))
    return rc;
  if ((l->var_w = tsr_layer__var(p, "kernel", krank, kshape, "kernel_initializer",
                      "glorot_uniform")) < 0)
    return l->var_w;
  if (l->use_bias &&
      (l->var_b = tsr_layer__var(p, "bias", 1, units, "bias_initializer", "zeros")) < 0)
    return l->var_b;
  if ((rc = tsr_layer__set_reg(p, l->var_w, "kernel_regularizer")) ||
      (rc = tsr_layer__set_reg(p, l->var_b, "bias_regularizer")))
    return rc;
  return 0;
}

/* The output window of a Conv2D kernel or a pooling window (`what`) over
 * the layer's image input. */
int tsr_layer__window(lp *p, const char *what, const int64_t *ks,
                  const int64_t *st, bool same, kern_win *g) {
  const wk_layer *x = tsr_layer__in0(p);
  if (kern_win_make(g, x->dim[0], x->dim[1], x->dim[2], ks[0], ks[1], st[0],
                    st[1], same))
    return tsr_errf(p->err, p->errlen, TSR_ESHAPE,
                    "layer '%s': a %lldx%lld %s does not fit the %lldx%lld "
                    "input with padding 'valid'", p->nm, (long long)ks[0],
                    (long long)ks[1], what, (long long)x->dim[0],
                    (long long)x->dim[1]);
  return 0;
}

int tsr_layer__pool_node(lp *p, const kern_win *g, kern_pool2d pool,
                         int rank) {
  wk_layer *l = tsr_layer__node(p, WK_L_POOL2D);
  if (!l) return TSR_ERANGE;
  const int64_t out[3] = {g->oh, g->ow, g->c};
  l->win = *g;
  l->pool = pool;
  l->rank = rank;
  l->size = 1;
  for (int i = 0; i < rank; i++) {
    l->dim[i] = out[3 - rank + i];
    l->size *= l->dim[i];
  }
  return 0;
}

/* ---- parsers ---------------------------------------------------------- */

int tsr_layer__p_dense(lp *p) {
  int64_t units;
  int rc;
  if ((rc = tsr_layer__get_int(p, "units", 0, 1, &units))) return rc;
  if (units < 1)
    return tsr_errf(p->err, p->errlen, TSR_ECONFIG,
                    "layer '%s': units must be a positive integer",
                    p->nm);
  wk_layer *l = tsr_layer__node_same(p, WK_L_DENSE);
  if (!l) return TSR_ERANGE;
  int64_t fan_in = l->dim[l->rank - 1];
  l->dim[l->rank - 1] = units;
  l->size = l->size / fan_in * units;
  int64_t ks[2] = {fan_in, units};
  return tsr_layer__act_kernel_bias(p, l, 2, ks, &units);
}

static int p_conv2d(lp *p) {
  int rc;
  int64_t filters, ks[2], st[2], one[2] = {1, 1}, dil[2], groups;
  bool same = false; /* set by get_padding; gcc -O3 cannot tell */
  if ((rc = tsr_layer__need_rank(p, 3, "an image (batch, rows, cols, channels)")) ||
      (rc = tsr_layer__get_int(p, "filters", 0, 1, &filters)) ||
      (rc = tsr_layer__get_pair(p, "kernel_size", NULL, ks)) ||
      (rc = tsr_layer__get_pair(p, "strides", one, st)) ||
      (rc = tsr_layer__get_pair(p, "dilation_rate", one, dil)) ||
      (rc = tsr_layer__get_int(p, "groups", 1, 1, &groups)) ||
      (rc = tsr_layer__get_padding(p, &same)) || (rc = tsr_layer__channels_last(p)))
    return rc;
  if (filters < 1)
    return tsr_errf(p->err, p->errlen, TSR_ECONFIG,
                    "layer '%s': filters must be a positive "
                    "integer", p->nm);
  if (dil[0] != 1 || dil[1] != 1)
    return tsr_errf(p->err, p->errlen, TSR_EUNSUPPORTED,
                    "layer '%s': dilation_rate (%lld, %lld) is "
                    "not supported (only 1)", p->nm, (long long)dil[0],
                    (long long)dil[1]);
  if (groups != 1)
    return tsr_errf(p->err, p->errlen, TSR_EUNSUPPORTED,
                    "layer '%s': groups %lld is not supported "
                    "(only 1)", p->nm, (long long)groups);
  kern_win g;
  if ((rc = tsr_layer__window(p, "kernel", ks, st, same, &g))) return rc;
  wk_layer *l = tsr_layer__node(p, WK_L_CONV2D);
  if (!l) return TSR_ERANGE;
  l->win = g;
  l->rank = 3;
  l->dim[0] = g.oh;
  l->dim[1] = g.ow;
  l->dim[2] = filters;
  l->size = g.oh * g.ow * filters;
  int64_t kshape[4] = {ks[0], ks[1], g.c, filters};
  return tsr_layer__act_kernel_bias(p, l, 4, kshape, &filters);
}

static int p_pool2d(lp *p) {
  int rc;
  int64_t ps[2], st[2], two[2] = {2, 2};
  bool same = false; /* set by get_padding; gcc -O3 cannot tell */
  if ((rc = tsr_layer__need_rank(p, 3, "an image (batch, rows, cols, channels)")) ||
      (rc = tsr_layer__get_pair(p, "pool_size", two, ps)) ||
      (rc = tsr_layer__get_pair(p, "strides", ps, st)) || (rc = tsr_layer__get_padding(p, &same)) ||
      (rc = tsr_layer__channels_last(p)))
    return rc;
  kern_win g;
  if ((rc = tsr_layer__window(p, "pool", ps, st, same, &g))) return rc;
  return tsr_layer__pool_node(
      p, &g, strstr(p->cls, "Max") ? KERN_POOL2D_MAX : KERN_POOL2D_AVG, 3);
}

static int p_gpool(lp *p) {
  int rc;
  bool keep = false; /* set by get_bool; gcc -O3 cannot tell */
  bool two = strstr(p->cls, "2D") != NULL;
  if ((rc = tsr_layer__need_rank(p, two ? 3 : 2, two ? "an image (batch, rows, cols, "
                      "channels)" : "a sequence (batch, steps, features)")) ||
      (rc = tsr_layer__channels_last(p)) || (rc = tsr_layer__get_bool(p, "keepdims", false, &keep)))
    return rc;
  wk_layer *l = tsr_layer__node(p, WK_L_GPOOL);
  if (!l) return TSR_ERANGE;
  int64_t c = tsr_layer__in0(p)->dim[tsr_layer__in0(p)->rank - 1];
  if (keep) {
    l->rank = tsr_layer__in0(p)->rank;
    for (int i = 0; i < l->rank - 1; i++) l->dim[i] = 1;
  } else {
    l->rank = 1;
  }
  l->dim[l->rank - 1] = c;
  l->size = c;
  return 0;
}

static int p_flatten(lp *p) {
  int rc = tsr_layer__channels_last(p);
  if (rc) return rc;
  wk_layer *l = tsr_layer__node(p, WK_L_RESHAPE);
  if (!l) return TSR_ERANGE;
  l->rank = 1;
  l->size = l->dim[0] = tsr_layer__in0(p)->size;
  return 0;
}

static int p_reshape(lp *p) {
  const json_t *t = json_object_get(p->cfg, "target_shape");
  size_t k = json_is_array(t) ? json_array_size(t) : 0;
  if (k < 1 || k > WK_MAX_DIMS)
    return tsr_errf(p->err, p->errlen, TSR_ECONFIG,
                    "layer '%s': target_shape must list 1 to %d "
                    "sizes", p->nm, WK_MAX_DIMS);
  int64_t d[WK_MAX_DIMS], prod = 1;
  int free_at = -1;
  for (size_t i = 0; i < k; i++) {
    const json_t *v = json_array_get(t, i);
    d[i] = json_is_integer(v) ? json_integer_value(v) : 0;
    if (d[i] == -1 && free_at < 0) free_at = (int)i;
    else if (d[i] < 1)
      return tsr_errf(p->err, p->errlen, TSR_ECONFIG,
                      "layer '%s': target_shape[%zu] must be a "
                      "positive integer (or one -1)", p->nm, i);
    else prod *= d[i];
  }
  int64_t n = tsr_layer__in0(p)->size;
  if (free_at >= 0) {
    if (n % prod)
      return tsr_errf(p->err, p->errlen, TSR_ESHAPE,
                      "layer '%s': %lld elements do not reshape to "
                      "target_shape with a -1", p->nm, (long long)n);
    d[free_at] = n / prod;
    prod = n;
  }
  if (prod != n)
    return tsr_errf(p->err, p->errlen, TSR_ESHAPE,
                    "layer '%s': target_shape holds %lld elements, "
                    "its input %lld", p->nm, (long long)prod, (long long)n);
  wk_layer *l = tsr_layer__node(p, WK_L_RESHAPE);
  if (!l) return TSR_ERANGE;
  l->rank = (int)k;
  memcpy(l->dim, d, k * sizeof *d);
  l->size = n;
  return 0;
}

/* The normalized axes of BatchNormalization / LayerNormalization: an
 * integer or a list, counted with the batch as Keras counts them (-1 or
 * rank is the last). *first gets the first normalized axis after the
 * batch (0-based); they must run to the last. */
static int norm_axes(const lp *p, int *first, int *count) {
  const json_t *a = json_object_get(p->cfg, "axis");
  int r = tsr_layer__in0(p)->rank; /* axes 1..r with the batch as 0 */
  int ax[WK_MAX_DIMS + 1], n = 0;
  if (!a || json_is_null(a)) {
    ax[n++] = r;
  } else if (json_is_integer(a)) {
    ax[n++] = (int)json_integer_value(a);
  } else if (json_is_array(a) && json_array_size(a) >= 1 &&
             json_array_size(a) <= (size_t)r) {
    for (size_t i = 0; i < json_array_size(a); i++) {
      const json_t *v = json_array_get(a, i);
      if (!json_is_integer(v)) n = -1;
      if (n >= 0) ax[n++] = (int)json_integer_value(v);
    }
  } else {
    n = -1;
  }
  for (int i = 0; i < n; i++) {
    if (ax[i] < 0) ax[i] += r + 1;
    if (ax[i] < 1 || ax[i] > r) n = -1;
  }
  /* sorted, contiguous, ending at the last axis */
  for (int i = 1; i < n; i++)
    for (int j = i; j > 0 && ax[j] < ax[j - 1]; j--) {
      int t = ax[j];
      ax[j] = ax[j - 1];
      ax[j - 1] = t;
    }
  bool ok = n >= 1 && ax[n - 1] == r;
  for (int i = 1; ok && i < n; i++) ok = ax[i] == ax[i - 1] + 1;
  if (!ok) {
    char *s = a ? json_dumps(a, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
    int rc = tsr_errf(p->err, p->errlen, TSR_EUNSUPPORTED,
                      "layer '%s' (%s): axis %s is not "
                      "supported (the normalized axes must end at the last "
                      "one: -1)", p->nm, p->cls, s ? s : "?");
    free(s);
    return rc;
  }
  *first = ax[0] - 1;
  *count = n;
  return 0;
}

int tsr_layer__no_opts(const lp *p, const char *const *keys) {
  for (int i = 0; keys[i]; i++) {
    const json_t *v = json_object_get(p->cfg, keys[i]);
    if (v && !json_is_null(v) && !json_is_false(v))
      return tsr_errf(p->err, p->errlen, TSR_EUNSUPPORTED,
                      "layer '%s' (%s): %s is not supported "
                      "(it must be null or false)", p->nm, p->cls, keys[i]);
  }
  return 0;
}

/* The batch statistics are the batch's own (biased variance), as Keras 3
 * and tf_keras on 2-D inputs compute them; tf_keras's fused kernel on
 * images feeds the moving variance with Bessel's correction instead. */
/* A normalization's gamma (when `scale`) and beta (when `center`) of
 * shape[rank]. */
static int gamma_beta(lp *p, wk_layer *l, bool scale, bool center, int rank,
                      const int64_t *shape) {
  if (scale && (l->var_w = tsr_layer__var(p, "gamma", rank, shape, "gamma_initializer",
                               "ones")) < 0)
    return l->var_w;
  if (center && (l->var_b = tsr_layer__var(p, "beta", rank, shape, "beta_initializer",
                                "zeros")) < 0)
    return l->var_b;
  return 0;
}

/* Its regularizers, once every variable is made. */
static int norm_regs(lp *p, wk_layer *l, bool center) {
  int rc;
  l->use_bias = center;
  if ((rc = tsr_layer__set_reg(p, l->var_w, "gamma_regularizer")) ||
      (rc = tsr_layer__set_reg(p, l->var_b, "beta_regularizer")))
    return rc;
  return 0;
}

static int p_batchnorm(lp *p) {
  static const char *const no[] = {"renorm", "virtual_batch_size",
                                   "adjustment", "synchronized", NULL};
  int rc, first, cnt;
  double mom, eps;
  bool center = true, scale = true; /* set by get_bool; gcc -O3 cannot tell */
  if ((rc = tsr_layer__no_opts(p, no)) || (rc = norm_axes(p, &first, &cnt)) ||
      (rc = tsr_layer__get_num(p, "momentum", 0.99, &mom)) ||
      (rc = tsr_layer__get_num(p, "epsilon", 1e-3, &eps)) ||
      (rc = tsr_layer__get_bool(p, "center", true, &center)) ||
      (rc = tsr_layer__get_bool(p, "scale", true, &scale)))
    return rc;
  if (cnt != 1)
    return tsr_errf(p->err, p->errlen, TSR_EUNSUPPORTED,
                    "layer '%s': BatchNormalization over "
                    "several axes is not supported (axis -1 only)", p->nm);
  if (!(mom >= 0 && mom < 1) || !(eps > 0))
    return tsr_errf(p->err, p->errlen, TSR_ECONFIG,
                    "layer '%s': momentum must be in [0, 1) and "
                    "epsilon > 0 (momentum %g, epsilon %g)", p->nm, mom, eps);
  wk_layer *l = tsr_layer__node_same(p, WK_L_BATCHNORM);
  if (!l) return TSR_ERANGE;
  l->eps = (float)eps;
  int64_t c = l->dim[l->rank - 1];
  if ((rc = gamma_beta(p, l, scale, center, 1, &c))) return rc;
  if ((l->var_mm = tsr_layer__var(p, "moving_mean", 1, &c, "moving_mean_initializer",
                       "zeros")) < 0)
    return l->var_mm;
  if ((l->var_mv = tsr_layer__var(p, "moving_variance", 1, &c,
                       "moving_variance_initializer", "ones")) < 0)
    return l->var_mv;
  for (int k = 0; k < 2; k++) {
    tsr_var *v = &p->m->vars[k ? l->var_mv : l->var_mm];
    v->trainable = false;
    v->momentum = mom;
  }
  return norm_regs(p, l, center);
}

static int p_layernorm(lp *p) {
  static const char *const no[] = {"rms_scaling", NULL};
  int rc, first, cnt;
  double eps;
  bool center = true, scale = true; /* set by get_bool; gcc -O3 cannot tell */
  if ((rc = tsr_layer__no_opts(p, no)) || (rc = norm_axes(p, &first, &cnt)) ||
      (rc = tsr_layer__get_num(p, "epsilon", 1e-3, &eps)) ||
      (rc = tsr_layer__get_bool(p, "center", true, &center)) ||
      (rc = tsr_layer__get_bool(p, "scale", true, &scale)))
    return rc;
  if (!(eps > 0))
    return tsr_errf(p->err, p->errlen, TSR_ECONFIG,
                    "layer '%s': epsilon must be > 0", p->nm);
  wk_layer *l = tsr_layer__node_same(p, WK_L_LAYERNORM);
  if (!l) return TSR_ERANGE;
  l->eps = (float)eps;
  int64_t shape[WK_MAX_DIMS];
  l->norm_w = 1;
  for (int i = 0; i < cnt; i++) {
    shape[i] = l->dim[first + i];
    l->norm_w *= shape[i];
  }
  if ((rc = gamma_beta(p, l, scale, center, cnt, shape))) return rc;
  return norm_regs(p, l, center);
}

static int p_embedding(lp *p) {
  const wk_layer *x = tsr_layer__in0(p);
  int64_t idim, odim, len;
  int rc;
  if ((rc = tsr_layer__get_int(p, "input_dim", 0, 1, &idim)) ||
      (rc = tsr_layer__get_int(p, "output_dim", 0, 1, &odim)) ||
      (rc = tsr_layer__get_int(p, "input_length", x->size, 1, &len)))
    return rc;
  if (idim < 1 || odim < 1)
    return tsr_errf(p->err, p->errlen, TSR_ECONFIG,
                    "layer '%s': input_dim and output_dim must be "
                    "positive integers", p->nm);
  if (x->kind != WK_L_INPUT || x->rank != 1)
    return tsr_errf(p->err, p->errlen, TSR_ESHAPE,
                    "layer '%s': Embedding must read a model input "
                    "of integer ids (batch, length)", p->nm);
  if (len != x->size)
    return tsr_errf(p->err, p->errlen, TSR_ESHAPE,
                    "layer '%s': input_length %lld does not match "
                    "the input width %lld", p->nm, (long long)len,
                    (long long)x->size);
  if (p->m->n_emb >= WK_MAX_EMB)
    return tsr_errf(p->err, p->errlen, TSR_ERANGE,
                    "model: more than %d embeddings", WK_MAX_EMB);
  wk_layer *l = tsr_layer__node(p, WK_L_EMBED);
  if (!l) return TSR_ERANGE;
  l->rank = 2;
  l->dim[0] = len;
  l->dim[1] = odim;
  l->size = len * odim;
  int64_t shape[2] = {idim, odim};
  tsr_init_spec is;
  char where[128];
  snprintf(where, sizeof where, "layer '%s' embeddings_initializer", p->nm);
  if ((rc = tsr_model__parse_init(json_object_get(p->cfg,
                                                 "embeddings_initializer"),
                                 "uniform", where, &is, p->err, p->errlen)))
    return rc;
  int v = tsr_model__add_var(p->m, p->nm, "embeddings", 2, shape, &is,
                            TSR_VAR_ROW_SPARSE);
  if (v == TSR_ERANGE)
    snprintf(p->err, p->errlen, "layer '%s': embeddings: a dim is < 1 or the "
             "size is too large", p->nm);
  if (v < 0) return v;
  wk_embed *e = &p->m->emb[p->m->n_emb++];
  memset(e, 0, sizeof *e);
  e->var = v;
  e->dim = odim;
  e->vocab = idim;
  e->feature = -1;
  e->pool = KERN_POOL_SUM;
  e->per_id = true;
  e->node = *p->out;
  bool mz = false;
  if ((rc = tsr_layer__get_bool(p, "mask_zero", false, &mz))) return rc;
  l = &p->m->layers[*p->out];
  l->mask_zero = mz;
  l->mask_src = mz ? *p->out : -1;
  return 0;
}

/* ---- the table -------------------------------------------------------- */

typedef struct {
  const char *cls;
  int (*parse)(lp *p);
  bool multi;          /* takes several inputs (Functional merges) */
} wk_layer_entry;

static const wk_layer_entry layer_table[] = {
    {"Dense", tsr_layer__p_dense, false},
    {"Conv2D", p_conv2d, false},
    {"MaxPooling2D", p_pool2d, false},
    {"AveragePooling2D", p_pool2d, false},
    {"GlobalAveragePooling1D", p_gpool, false},
    {"GlobalAveragePooling2D", p_gpool, false},
    {"Flatten", p_flatten, false},
    {"Reshape", p_reshape, false},
    {"BatchNormalization", p_batchnorm, false},
    {"LayerNormalization", p_layernorm, false},
    {"Activation", tsr_layer__p_activation, false},
    {"ReLU", tsr_layer__p_relu, false},
    {"LeakyReLU", tsr_layer__p_leaky, false},
    {"ELU", tsr_layer__p_elu, false},
    {"Softmax", tsr_layer__p_softmax, false},
    {"Dropout", tsr_layer__p_dropout, false},
    {"Embedding", p_embedding, false},
    {"Add", tsr_layer__p_merge, true},
    {"Subtract", tsr_layer__p_merge, true},
    {"Average", tsr_layer__p_merge, true},
    {"Concatenate", tsr_layer__p_concat, true},
    {"Conv1D", tsr_layer__p_conv1d, false},
    {"MaxPooling1D", tsr_layer__p_pool1d, false},
    {"AveragePooling1D", tsr_layer__p_pool1d, false},
    {"GlobalMaxPooling1D", tsr_layer__p_gmaxpool, false},
    {"GlobalMaxPooling2D", tsr_layer__p_gmaxpool, false},
    {"LSTM", tsr_layer__p_rnn, false},
    {"GRU", tsr_layer__p_rnn, false},
    {"Bidirectional", tsr_layer__p_bidir, false},
    {"TimeDistributed", tsr_layer__p_timedist, false},
    {"MultiHeadAttention", tsr_layer__p_mha, true},
    {"Attention", tsr_layer__p_attention, true},
};
#define N_LAYERS (sizeof layer_table / sizeof layer_table[0])

void tsr_model__layers_supported(char *buf, size_t len) {
  size_t o = (size_t)snprintf(buf, len, "InputLayer");
  for (size_t i = 0; i < N_LAYERS && o < len; i++)
    o += (size_t)snprintf(buf + o, len - o, ", %s", layer_table[i].cls);
}

/* Options no layer implements: they must be absent or null. */
static int common_opts(const lp *p) {
  static const char *const keys[] = {
      "activity_regularizer", "kernel_constraint", "bias_constraint",
      "embeddings_regularizer", "embeddings_constraint", "gamma_constraint",
      "beta_constraint", "depthwise_constraint", "lora_rank", NULL};
  for (int i = 0; keys[i]; i++) {
    const json_t *v = json_object_get(p->cfg, keys[i]);
    if (v && !json_is_null(v))
      return tsr_errf(p->err, p->errlen, TSR_EUNSUPPORTED,
                      "layer '%s' (%s): %s is not supported "
                      "(it must be null)", p->nm, p->cls, keys[i]);
  }
  const json_t *tr = json_object_get(p->cfg, "trainable");
  if (tr && json_is_false(tr))
    return tsr_errf(p->err, p->errlen, TSR_EUNSUPPORTED,
                    "layer '%s' (%s): trainable=false (a "
                    "frozen layer) is not supported", p->nm, p->cls);
  return 0;
}

int tsr_model__parse_layer(tsr_model *m, const char *cls, const json_t *cfg,
                          const char *name, const int *in, int n_in,
                          int *out, char *err, size_t errlen) {
  const wk_layer_entry *e = NULL;
  for (size_t i = 0; i < N_LAYERS && !e; i++)
    if (!strcmp(layer_table[i].cls, cls)) e = &layer_table[i];
  if (!e) {
    char list[512];
    tsr_model__layers_supported(list, sizeof list);
    return tsr_errf(err, errlen, TSR_EUNSUPPORTED,
                    "layer '%s': layer class '%s' is not "
                    "supported (supported: %s)", name, cls, list);
  }
  if (n_in < 1)
    return tsr_errf(err, errlen, TSR_ESHAPE,
                    "layer '%s' (%s) has no input", name, cls);
  if (!e->multi && n_in != 1)
    return tsr_errf(err, errlen, TSR_ESHAPE,
                    "layer '%s' (%s) takes one input, it is given %d",
                    name, cls, n_in);
  lp p = {m, cls, cfg, name, in, n_in, out, err, errlen, NULL};
  int rc = common_opts(&p);
  if (rc) return rc;
  *out = in[0];
  if ((rc = e->parse(&p))) return rc;
  return tsr_layer__mask_rule(&p, *out);
}
