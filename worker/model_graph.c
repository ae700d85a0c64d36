/* Model graphs: a Keras Sequential (a chain), a Keras Functional model (a
 * DAG read from each layer's inbound_nodes, Keras 2 and Keras 3 forms), and
 * the built-in wide-and-deep CTR model, all as nodes in topological order
 * ending in the one output.
 *
 * Happy path: inputs become INPUT nodes (columns of the batch's dense
 * features: a Functional model's inputs in the order of its input_layers,
 * or placed by name when the data names its features), every other layer
 * goes through the layer table (model_layers.c), and finish_graph() works
 * out which nodes need gradients and that every layer feeds the output.
 * Failure modes: a layer called more than once (shared layers), several
 * outputs, an inbound layer that does not exist, a cycle, a layer that does
 * not lead to the output, an input name the data does not have: each an
 * error naming the layer.
 */
#include "worker/model_int.h"

#include "common/err.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

wk_layer *tsr_model__add_node(tsr_model *m, wk_layer_kind kind,
                             const char *name, const char *cls,
                             const int *in, int n_in, char *err,
                             size_t errlen) {
  if (m->n_layers == WK_MAX_LAYERS) {
    tsr_errf(err, errlen, TSR_ERANGE,
             "model: more than %d layers", WK_MAX_LAYERS);
    return NULL;
  }
  if (n_in > WK_MAX_IN) {
    tsr_errf(err, errlen, TSR_ERANGE,
             "layer '%s': more than %d inputs", name, WK_MAX_IN);
    return NULL;
  }
  wk_layer *l = &m->layers[m->n_layers];
  memset(l, 0, sizeof *l);
  l->kind = kind;
  snprintf(l->name, sizeof l->name, "%s", name);
  snprintf(l->cls, sizeof l->cls, "%s", cls);
  for (int i = 0; i < n_in; i++) l->in[i] = in[i];
  l->n_in = n_in;
  l->root = m->n_layers;
  l->var_w = l->var_b = l->var_mm = l->var_mv = l->addend = -1;
  l->mask_src = l->use_mask = l->use_mask2 = -1;
  for (int i = 0; i < 8; i++) l->var_x[i] = -1;
  l->alpha = 1.0f;
  l->coef = 1.0f;
  m->n_layers++;
  return l;
}

int tsr_model__node_vars(const wk_layer *l, int out[12]) {
  out[0] = l->var_w;
  out[1] = l->var_b;
  out[2] = l->var_mm;
  out[3] = l->var_mv;
  for (int i = 0; i < 8; i++) out[4 + i] = l->var_x[i];
  return 12;
}

bool tsr_model__has_logits(const wk_layer *l) {
  return l->kind == WK_L_DENSE || l->kind == WK_L_CONV2D ||
         l->kind == WK_L_ACTIVATION;
}

void tsr_model__keras_name(const char *cls, int nth, char *out, size_t len) {
  size_t o = 0;
  for (size_t i = 0; cls[i] && o + 2 < len; i++) {
    char c = cls[i];
    bool up = c >= 'A' && c <= 'Z';
    bool prev_low = i > 0 && ((cls[i - 1] >= 'a' && cls[i - 1] <= 'z'));
    bool next_low = cls[i + 1] >= 'a' && cls[i + 1] <= 'z';
    if (up && i > 0 && (prev_low || next_low) && cls[i - 1] != '_')
      out[o++] = '_';
    out[o++] = up ? (char)(c - 'A' + 'a') : c;
  }
  out[o] = 0;
  if (nth > 0 && o < len) snprintf(out + o, len - o, "_%d", nth);
}

static const json_t *input_shape_of(const json_t *cfg) {
  const json_t *s = json_object_get(cfg, "batch_input_shape");
  if (!s) s = json_object_get(cfg, "batch_shape");
  return s;
}

/* An INPUT node from a Keras batch shape [null, d1 (, d2, d3)]. */
static int add_input(tsr_model *m, const char *nm, const json_t *shp,
                     int *out, char *err, size_t errlen) {
  size_t k = json_is_array(shp) ? json_array_size(shp) : 0;
  if (k < 2 || k > WK_MAX_DIMS + 1)
    return tsr_errf(err, errlen, TSR_ESHAPE,
                    "layer '%s': input shape must be [null, ...] "
                    "with 1 to %d sizes after the batch", nm, WK_MAX_DIMS);
  wk_layer *l = tsr_model__add_node(m, WK_L_INPUT, nm, "InputLayer", NULL, 0,
                                   err, errlen);
  if (!l) return TSR_ERANGE;
  l->rank = (int)k - 1;
  l->size = 1;
  for (size_t i = 1; i < k; i++) {
    const json_t *d = json_array_get(shp, i);
    if (!json_is_integer(d) || json_integer_value(d) < 1)
      return tsr_errf(err, errlen, TSR_ESHAPE,
                      "layer '%s': input shape must have positive "
                      "sizes after the batch (a variable length is not "
                      "supported)", nm);
    l->dim[i - 1] = json_integer_value(d);
    l->size *= l->dim[i - 1];
  }
  *out = m->n_layers - 1;
  return 0;
}

static int check_input_cfg(const json_t *cfg, const char *nm, char *err,
                           size_t errlen) {
  static const char *const no[] = {"sparse", "ragged", NULL};
  for (int i = 0; no[i]; i++)
    if (json_is_true(json_object_get(cfg, no[i])))
      return tsr_errf(err, errlen, TSR_EUNSUPPORTED,
                      "layer '%s': %s inputs are not "
                      "supported", nm, no[i]);
  return 0;
}

/* Keras's default names when a layer has none: per class, a counter. */
typedef struct {
  struct { char cls[32]; int n; } seen[32];
  int nseen;
} namer;

static void layer_name(namer *nr, const json_t *lc, const char *cls,
                       char *nm, size_t len) {
  const char *lname = json_string_value(json_object_get(lc, "name"));
  int nth = 0, si;
  for (si = 0; si < nr->nseen; si++)
    if (!strcmp(nr->seen[si].cls, cls)) break;
  if (si < nr->nseen) nth = nr->seen[si].n++;
  else if (nr->nseen < 32) {
    snprintf(nr->seen[nr->nseen].cls, sizeof nr->seen[0].cls, "%s", cls);
    nr->seen[nr->nseen++].n = 1;
  }
  if (lname) snprintf(nm, len, "%s", lname);
  else tsr_model__keras_name(cls, nth, nm, len);
}

int tsr_model__parse_sequential(tsr_model *m, const json_t *root, char *err,
                               size_t errlen) {
  namer nr = {0};
  const json_t *cfg = json_object_get(root, "config");
  const json_t *layers = cfg ? json_object_get(cfg, "layers") : NULL;
  if (!layers && json_is_array(cfg)) layers = cfg; /* very old Keras */
  if (!json_is_array(layers) || json_array_size(layers) == 0)
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "model: config.layers must be a non-empty list");
  int cur = -1; /* the node the next layer reads */
  int rc;
  for (size_t i = 0; i < json_array_size(layers); i++) {
    const json_t *L = json_array_get(layers, i);
    const char *cls = json_string_value(json_object_get(L, "class_name"));
    const json_t *lc = json_object_get(L, "config");
    if (!cls || !json_is_object(lc))
      return tsr_errf(err, errlen, TSR_ECONFIG,
                      "model: config.layers[%zu] needs class_name "
                      "and config", i);
    char nm[64];
    layer_name(&nr, lc, cls, nm, sizeof nm);
    const json_t *shp = input_shape_of(lc);
    if (!strcmp(cls, "InputLayer")) {
      if (cur >= 0)
        return tsr_errf(err, errlen, TSR_ECONFIG,
                        "layer '%s': InputLayer must come first", nm);
      if (!shp) return tsr_errf(err, errlen, TSR_ESHAPE,
                                "layer '%s': no batch_input_shape", nm);
      if ((rc = check_input_cfg(lc, nm, err, errlen)) ||
          (rc = add_input(m, nm, shp, &cur, err, errlen)))
        return rc;
      continue;
    }
    if (cur < 0 && shp) {
      char in_nm[80];
      snprintf(in_nm, sizeof in_nm, "%s_input", nm);
      if ((rc = add_input(m, in_nm, shp, &cur, err, errlen))) return rc;
    }
    if (cur < 0 && !strcmp(cls, "Embedding") &&
        json_is_integer(json_object_get(lc, "input_length"))) {
      json_t *s = json_pack("[nI]", (json_int_t)json_integer_value(
                                        json_object_get(lc, "input_length")));
      char in_nm[80];
      snprintf(in_nm, sizeof in_nm, "%s_input", nm);
      rc = s ? add_input(m, in_nm, s, &cur, err, errlen) : TSR_ENOMEM;
      json_decref(s);
      if (rc) return rc;
    }
    if (cur < 0)
      return tsr_errf(err, errlen, TSR_ESHAPE,
                      "layer '%s': the model's input shape is unknown "
                      "(give the first layer input_shape/batch_input_shape)", nm);
    int in[1] = {cur};
    if ((rc = tsr_model__parse_layer(m, cls, lc, nm, in, 1, &cur, err,
                                    errlen)))
      return rc;
  }
  if (cur < 0 || m->layers[cur].kind == WK_L_INPUT)
    return tsr_errf(err, errlen, TSR_ESHAPE,
                    "model: no layer computes anything");
  return 0;
}

/* ---- Functional ----------------------------------------------------------*/

typedef struct {
  const json_t *L;
  const char *name;
  int node;              /* output node; -1 until parsed */
  int mask_of;           /* a NotEqual(ids, 0) layer: the ids' node (it
                          * stands for that input's Embedding mask) */
} fl_entry;

static int find_entry(const fl_entry *t, size_t n, const char *name) {
  for (size_t i = 0; i < n; i++)
    if (!strcmp(t[i].name, name)) return (int)i;
  return -1;
}

/* A reference to a layer's output: Keras 2 ["name", node, tensor, {...}],
 * ["name", node, tensor], or Keras 3 {"class_name": "__keras_tensor__",
 * "config": {"keras_history": ["name", node, tensor]}}. */
static const char *ref_name(const json_t *r, const char *layer, char *err,
                            size_t errlen, int *rc) {
  const json_t *h = r;
  if (json_is_object(r)) {
    const json_t *c = json_object_get(r, "config");
    h = c ? json_object_get(c, "keras_history") : NULL;
  }
  if (!json_is_array(h) || json_array_size(h) < 3 ||
      !json_is_string(json_array_get(h, 0))) {
    *rc = tsr_errf(err, errlen, TSR_ECONFIG,
                   "layer '%s': an inbound tensor is neither "
                   "[name, node, tensor] nor a __keras_tensor__ with "
                   "keras_history", layer);
    return NULL;
  }
  if (json_integer_value(json_array_get(h, 1)) != 0 ||
      json_integer_value(json_array_get(h, 2)) != 0) {
    *rc = tsr_errf(err, errlen, TSR_EUNSUPPORTED,
                   "layer '%s': reads output %lld of call %lld "
                   "of layer '%s' (layers with several outputs or called more "
                   "than once are not supported)", layer,
                   (long long)json_integer_value(json_array_get(h, 2)),
                   (long long)json_integer_value(json_array_get(h, 1)),
                   json_string_value(json_array_get(h, 0)));
    return NULL;
  }
  return json_string_value(json_array_get(h, 0));
}

static bool is_ref(const json_t *r) {
  if (json_is_object(r)) return json_object_get(r, "config") != NULL;
  return json_is_array(r) && json_array_size(r) >= 3 &&
         json_is_string(json_array_get(r, 0));
}

/* What a layer's one call reads: its tensors (positional, then the
 * value= and key= of an attention call) and the layers named by its mask=
 * argument (Keras 3 writes the mask of an Embedding(mask_zero) as a
 * NotEqual layer it passes explicitly). */
typedef struct {
  const char *names[WK_MAX_IN];
  int n;
  const char *masks[WK_MAX_IN];
  int n_masks;
} wk_call;

/* A call argument: tensors go to the call, flags that change nothing are
 * accepted, anything else is refused with what is supported. */
static int call_kwarg(wk_call *c, const char *cls, const char *nm,
                      const char *k, const json_t *v, char *err,
                      size_t errlen) {
  int rc = 0;
  if (!strcmp(k, "training") || json_is_null(v)) return 0;
  if ((!strcmp(k, "return_attention_scores") ||
       !strcmp(k, "use_causal_mask")) && json_is_false(v))
    return 0;
  if (!strcmp(k, "mask")) { /* one tensor, or a list (Attention's) */
    bool list = json_is_array(v) && !is_ref(v);
    size_t cnt = list ? json_array_size(v) : 1;
    for (size_t i = 0; i < cnt; i++) {
      const json_t *r = list ? json_array_get(v, i) : v;
      if (json_is_null(r)) continue;
      if (c->n_masks == WK_MAX_IN) return TSR_ERANGE;
      if (!(c->masks[c->n_masks++] = ref_name(r, nm, err, errlen, &rc)))
        return rc;
    }
    return 0;
  }
  if ((!strcmp(k, "value") || !strcmp(k, "key")) &&
      !strcmp(cls, "MultiHeadAttention") && is_ref(v)) {
    /* value first, then key: the order the layer reads them in */
    if (c->n >= WK_MAX_IN) return TSR_ERANGE;
    const char *r = ref_name(v, nm, err, errlen, &rc);
    if (!r) return rc;
    if (!strcmp(k, "value") && c->n == 2) { /* key came first */
      c->names[2] = c->names[1];
      c->names[1] = r;
      c->n = 3;
    } else {
      c->names[c->n++] = r;
    }
    return 0;
  }
  char val[64];
  if (json_is_boolean(v)) snprintf(val, sizeof val, "=%s",
                                   json_is_true(v) ? "true" : "false");
  else val[0] = 0;
  return tsr_errf(err, errlen, TSR_EUNSUPPORTED,
                  "layer '%s' (%s): the call argument %s%s is not supported "
                  "(supported: the input tensors%s, mask from an "
                  "Embedding(mask_zero=True), training)", nm, cls, k, val,
                  !strcmp(cls, "MultiHeadAttention")
                      ? ", value=, key=, use_causal_mask=False, "
                        "return_attention_scores=False"
                      : !strcmp(cls, "Attention")
                            ? ", use_causal_mask=False, "
                              "return_attention_scores=False"
                            : "");
}

static int call_kwargs(wk_call *c, const char *cls, const char *nm,
                       const json_t *kw, char *err, size_t errlen) {
  const char *k;
  json_t *v;
  int rc;
  json_object_foreach((json_t *)kw, k, v) {
    if ((rc = call_kwarg(c, cls, nm, k, v, err, errlen))) {
      if (rc == TSR_ERANGE)
        return tsr_errf(err, errlen, TSR_ERANGE,
                        "layer '%s': more than %d inputs", nm, WK_MAX_IN);
      return rc;
    }
  }
  return 0;
}

/* The inbound tensors of a layer's one call. */
static int inbound(const json_t *L, const char *nm, wk_call *c, char *err,
                   size_t errlen) {
  const json_t *ib = json_object_get(L, "inbound_nodes");
  const char *cls = json_string_value(json_object_get(L, "class_name"));
  memset(c, 0, sizeof *c);
  if (!json_is_array(ib) || json_array_size(ib) == 0)
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "layer '%s' is not connected (no inbound_nodes)",
                    nm);
  if (json_array_size(ib) > 1)
    return tsr_errf(err, errlen, TSR_EUNSUPPORTED,
                    "layer '%s' is called %zu times (shared "
                    "layers are not supported)", nm, json_array_size(ib));
  const json_t *call = json_array_get(ib, 0);
  const json_t *refs = call;
  const json_t *kw3 = NULL;
  if (json_is_object(call)) { /* Keras 3 {"args": [...], "kwargs": {...}} */
    kw3 = json_object_get(call, "kwargs");
    refs = json_object_get(call, "args");
    /* merge layers take one list of tensors */
    if (json_is_array(refs) && json_array_size(refs) == 1 &&
        json_is_array(json_array_get(refs, 0)) &&
        !is_ref(json_array_get(refs, 0)))
      refs = json_array_get(refs, 0);
  }
  if (!json_is_array(refs) || json_array_size(refs) == 0)
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "layer '%s': inbound_nodes lists no tensor", nm);
  if (json_array_size(refs) > WK_MAX_IN)
    return tsr_errf(err, errlen, TSR_ERANGE,
                    "layer '%s': more than %d inputs", nm, WK_MAX_IN);
  int rc = 0;
  for (size_t i = 0; i < json_array_size(refs); i++) {
    const json_t *r = json_array_get(refs, i);
    if (cls && !strcmp(cls, "NotEqual") && !is_ref(r))
      continue; /* its constant, checked by not_equal() */
    if (!(c->names[c->n] = ref_name(r, nm, err, errlen, &rc))) return rc;
    c->n++;
  }
  /* Keras 2: [name, node, tensor, kwargs] */
  for (size_t i = 0; i < json_array_size(refs); i++) {
    const json_t *r = json_array_get(refs, i);
    if (json_is_array(r) && json_array_size(r) >= 4 &&
        (rc = call_kwargs(c, cls ? cls : "?", nm, json_array_get(r, 3), err,
                          errlen)))
      return rc;
  }
  if (kw3 && (rc = call_kwargs(c, cls ? cls : "?", nm, kw3, err, errlen)))
    return rc;
  return 0;
}

/* input_layers / output_layers: [["name", 0, 0], ...], a single
 * ["name", 0, 0], or (Keras 3) a dict of them. */
static int io_list(const json_t *v, const char *key, const char **names,
                   int max, int *n, char *err, size_t errlen) {
  *n = 0;
  if (json_is_array(v) && json_array_size(v) >= 1 &&
      json_is_string(json_array_get(v, 0))) {
    names[(*n)++] = json_string_value(json_array_get(v, 0));
    return 0;
  }
  if (json_is_object(v))
    return tsr_errf(err, errlen, TSR_EUNSUPPORTED,
                    "model: config.%s as a dict is not "
                    "supported (give the model a list of inputs)", key);
  if (!json_is_array(v) || json_array_size(v) == 0)
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "model: config.%s must be a non-empty list", key);
  for (size_t i = 0; i < json_array_size(v); i++) {
    const json_t *e = json_array_get(v, i);
    if (!json_is_array(e) || !json_is_string(json_array_get(e, 0)))
      return tsr_errf(err, errlen, TSR_ECONFIG,
                      "model: config.%s[%zu] must be [name, node, "
                      "tensor]", key, i);
    if (*n == max)
      return tsr_errf(err, errlen, TSR_ERANGE,
                      "model: more than %d %s", max, key);
    names[(*n)++] = json_string_value(json_array_get(e, 0));
  }
  return 0;
}

/* Columns of each input: by name when the data names its dense features
 * ("age", or "img[0]".."img[k-1]" for a multi-value feature), else one
 * after the other in the model's input order. */
static int place_inputs(tsr_model *m, const int *inputs, int n,
                        const wk_input_schema *sc, char *err, size_t errlen) {
  int64_t off = 0;
  for (int i = 0; i < n; i++) {
    wk_layer *l = &m->layers[inputs[i]];
    l->x_off = off;
    off += l->size;
  }
  m->n_dense = off;
  if (!sc || !sc->dense_names || n < 2) return 0;
  int64_t col[WK_MAX_LAYERS];
  int found = 0;
  for (int i = 0; i < n; i++) {
    const wk_layer *l = &m->layers[inputs[i]];
    char want[96];
    col[i] = -1;
    for (int64_t c = 0; c < sc->n_dense && col[i] < 0; c++) {
      const char *dn = sc->dense_names[c];
      if (!dn) continue;
      if (!strcmp(dn, l->name)) col[i] = c;
      snprintf(want, sizeof want, "%s[0]", l->name);
      if (!strcmp(dn, want)) col[i] = c;
    }
    if (col[i] >= 0) found++;
  }
  if (found == 0) return 0; /* positional */
  for (int i = 0; i < n; i++) {
    const wk_layer *l = &m->layers[inputs[i]];
    if (col[i] < 0)
      return tsr_errf(err, errlen, TSR_ESHAPE,
                      "model input '%s': the data has no feature of "
                      "that name (inputs are matched to features by name when "
                      "any matches)", l->name);
    if (col[i] + l->size > sc->n_dense)
      return tsr_errf(err, errlen, TSR_ESHAPE,
                      "model input '%s' takes %lld column(s) from "
                      "column %lld; the data has %lld", l->name,
                      (long long)l->size, (long long)col[i],
                      (long long)sc->n_dense);
    m->layers[inputs[i]].x_off = col[i];
  }
  m->n_dense = sc->n_dense;
  m->named_inputs = true;
  return 0;
}

/* Keras 3 writes how masks combine as op layers: LogicalOr / LogicalAnd
 * of masks (merges), which for one Embedding's mask is that mask. */
static bool mask_op(const char *cls) {
  return !strcmp(cls, "LogicalOr") || !strcmp(cls, "LogicalAnd");
}

/* Keras 3's NotEqual(ids, 0): the mask of an Embedding(mask_zero=True),
 * written out because the model passes it explicitly. */
static int not_equal(const json_t *L, const char *nm, int n, char *err,
                     size_t errlen) {
  const json_t *call = json_array_get(json_object_get(L, "inbound_nodes"), 0);
  const json_t *args = json_object_get(call, "args");
  const json_t *z = json_array_get(args, 1);
  if (n != 1 || json_array_size(args) != 2 || !json_is_number(z) ||
      json_number_value(z) != 0)
    return tsr_errf(err, errlen, TSR_EUNSUPPORTED,
                    "layer '%s' (NotEqual): only the mask of an "
                    "Embedding(mask_zero=True), NotEqual(ids, 0), is "
                    "supported", nm);
  return 0;
}

/* A mask= given explicitly must be the one the layer's input carries: the
 * mask of the Embedding(mask_zero=True) reading those ids. */
static int explicit_masks(const tsr_model *m, const fl_entry *t, size_t nl,
                          const wk_call *c, const int *in, const char *nm,
                          const char *cls, char *err, size_t errlen) {
  for (int i = 0; i < c->n_masks; i++) {
    int e = find_entry(t, nl, c->masks[i]);
    bool ok = false;
    for (int k = 0; k < c->n && !ok; k++) {
      int src = m->layers[in[k]].mask_src;
      ok = e >= 0 && src >= 0 &&
           (t[e].mask_of >= 0 ? m->layers[src].in[0] == t[e].mask_of
                              : t[e].node == src);
    }
    if (!ok)
      return tsr_errf(err, errlen, TSR_EUNSUPPORTED,
                      "layer '%s' (%s): the call argument mask='%s' is not "
                      "the mask of its input (supported: the mask of an "
                      "Embedding(mask_zero=True) that its input carries)",
                      nm, cls, c->masks[i]);
  }
  return 0;
}

int tsr_model__parse_functional(tsr_model *m, const json_t *root,
                               const wk_input_schema *sc, char *err,
                               size_t errlen) {
  const json_t *cfg = json_object_get(root, "config");
  const json_t *layers = cfg ? json_object_get(cfg, "layers") : NULL;
  size_t nl = json_is_array(layers) ? json_array_size(layers) : 0;
  if (nl == 0)
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "model: config.layers must be a non-empty list");
  if (nl > WK_MAX_LAYERS)
    return tsr_errf(err, errlen, TSR_ERANGE,
                    "model: more than %d layers", WK_MAX_LAYERS);
  fl_entry *t = calloc(nl, sizeof *t);
  if (!t) return TSR_ENOMEM;
  int rc = 0;
  for (size_t i = 0; i < nl && !rc; i++) {
    t[i].L = json_array_get(layers, i);
    t[i].node = t[i].mask_of = -1;
    const json_t *lc = json_object_get(t[i].L, "config");
    t[i].name = json_string_value(json_object_get(t[i].L, "name"));
    if (!t[i].name) t[i].name = json_string_value(json_object_get(lc, "name"));
    if (!t[i].name || !json_string_value(json_object_get(t[i].L,
                                                         "class_name")) ||
        !json_is_object(lc))
      rc = tsr_errf(err, errlen, TSR_ECONFIG,
                    "model: config.layers[%zu] needs name, "
                    "class_name and config", i);
    else if (find_entry(t, i, t[i].name) >= 0)
      rc = tsr_errf(err, errlen, TSR_ECONFIG,
                    "model: two layers are named '%s'", t[i].name);
  }
  /* layers in the listed order; one that reads a later one waits */
  size_t done = 0;
  while (!rc && done < nl) {
    size_t before = done;
    for (size_t i = 0; i < nl && !rc; i++) {
      if (t[i].node >= 0) continue;
      const char *cls = json_string_value(json_object_get(t[i].L,
                                                          "class_name"));
      const json_t *lc = json_object_get(t[i].L, "config");
      if (!strcmp(cls, "InputLayer")) {
        const json_t *shp = input_shape_of(lc);
        if (!shp) {
          rc = tsr_errf(err, errlen, TSR_ESHAPE,
                        "layer '%s': no batch_shape", t[i].name);
          break;
        }
        if ((rc = check_input_cfg(lc, t[i].name, err, errlen)) ||
            (rc = add_input(m, t[i].name, shp, &t[i].node, err, errlen)))
          break;
        done++;
        continue;
      }
      wk_call call;
      int in[WK_MAX_IN];
      if ((rc = inbound(t[i].L, t[i].name, &call, err, errlen))) break;
      bool ready = true;
      for (int k = 0; k < call.n + call.n_masks && !rc; k++) {
        bool is_mask = k >= call.n;
        const char *nk = is_mask ? call.masks[k - call.n] : call.names[k];
        int e = find_entry(t, nl, nk);
        if (e < 0)
          rc = tsr_errf(err, errlen, TSR_ECONFIG,
                        "layer '%s' reads layer '%s', which the "
                        "model does not have", t[i].name, nk);
        else if (t[e].node < 0)
          ready = false;
        else if (!is_mask && t[e].mask_of >= 0 && !mask_op(cls))
          rc = tsr_errf(err, errlen, TSR_EUNSUPPORTED,
                        "layer '%s' reads the mask '%s' as a tensor (masks "
                        "are supported only as the mask= of a call)",
                        t[i].name, nk);
        else if (!is_mask)
          in[k] = t[e].node;
      }
      if (rc || !ready) continue;
      if (!strcmp(cls, "NotEqual")) {
        if ((rc = not_equal(t[i].L, t[i].name, call.n, err, errlen))) break;
        t[i].node = t[i].mask_of = in[0];
        done++;
        continue;
      }
      if (mask_op(cls)) { /* Keras 3's merge of the masks of merged inputs */
        int of = -1;
        for (int k = 0; k < call.n && !rc; k++) {
          int e = find_entry(t, nl, call.names[k]);
          if (t[e].mask_of < 0 || (of >= 0 && t[e].mask_of != of))
            rc = tsr_errf(err, errlen, TSR_EUNSUPPORTED,
                          "layer '%s' (%s): only the mask of one "
                          "Embedding(mask_zero=True) is supported here",
                          t[i].name, cls);
          of = t[e].mask_of;
        }
        if (rc) break;
        t[i].node = t[i].mask_of = of;
        done++;
        continue;
      }
      if ((rc = tsr_model__parse_layer(m, cls, lc, t[i].name, in, call.n,
                                      &t[i].node, err, errlen)) ||
          (rc = explicit_masks(m, t, nl, &call, in, t[i].name, cls, err,
                               errlen)))
        break;
      done++;
    }
    if (!rc && done == before)
      rc = tsr_errf(err, errlen, TSR_ECONFIG,
                    "model: the layers' inbound_nodes form a cycle "
                    "or read layers that never get an input");
  }
  const char *inames[WK_MAX_LAYERS], *onames[2];
  int ni = 0, no = 0, inputs[WK_MAX_LAYERS];
  if (!rc)
    rc = io_list(json_object_get(cfg, "input_layers"), "input_layers",
                 inames, WK_MAX_LAYERS, &ni, err, errlen);
  if (!rc)
    rc = io_list(json_object_get(cfg, "output_layers"), "output_layers",
                 onames, 2, &no, err, errlen);
  if (!rc && no != 1)
    rc = tsr_errf(err, errlen, TSR_EUNSUPPORTED,
                  "model: %d outputs; models with several "
                  "outputs are not supported", no);
  for (int i = 0; !rc && i < ni; i++) {
    int e = find_entry(t, nl, inames[i]);
    if (e < 0 || m->layers[t[e].node].kind != WK_L_INPUT)
      rc = tsr_errf(err, errlen, TSR_ECONFIG,
                    "model: input_layers names '%s', which is not "
                    "an InputLayer of the model", inames[i]);
    else
      inputs[i] = t[e].node;
  }
  if (!rc) {
    int e = find_entry(t, nl, onames[0]);
    if (e < 0)
      rc = tsr_errf(err, errlen, TSR_ECONFIG,
                    "model: output_layers names '%s', which the "
                    "model does not have", onames[0]);
    else if (t[e].node != m->n_layers - 1)
      rc = tsr_errf(err, errlen, TSR_ESHAPE,
                    "model: layer '%s' comes after the output '%s' "
                    "and does not feed it (every layer must lead to the output)",
                    m->layers[m->n_layers - 1].name, onames[0]);
  }
  /* every InputLayer must be listed */
  for (int k = 0; !rc && k < m->n_layers; k++) {
    if (m->layers[k].kind != WK_L_INPUT) continue;
    bool listed = false;
    for (int i = 0; i < ni; i++) listed |= inputs[i] == k;
    if (!listed)
      rc = tsr_errf(err, errlen, TSR_ECONFIG,
                    "model: InputLayer '%s' is not in input_layers",
                    m->layers[k].name);
  }
  if (!rc) rc = place_inputs(m, inputs, ni, sc, err, errlen);
  free(t);
  return rc;
}

int tsr_model__finish_graph(tsr_model *m, char *err, size_t errlen) {
  if (m->n_layers == 0) return tsr_errf(err, errlen, TSR_ESHAPE,
                                        "model: no layers");
  bool used_float[WK_MAX_LAYERS] = {false}, used_ids[WK_MAX_LAYERS] = {false};
  bool reach[WK_MAX_LAYERS] = {false};
  int64_t cols = 0;
  for (int k = 0; k < m->n_layers; k++) {
    wk_layer *l = &m->layers[k];
    l->root = l->kind == WK_L_RESHAPE ? m->layers[l->in[0]].root : k;
    int vs[12];
    int nvs = tsr_model__node_vars(l, vs);
    bool g = l->kind == WK_L_EMBED;
    for (int i = 0; i < nvs; i++) g |= vs[i] >= 0;
    for (int i = 0; i < l->n_in; i++) {
      g |= m->layers[l->in[i]].needs_grad;
      if (l->kind == WK_L_EMBED) used_ids[l->in[i]] = true;
      else used_float[l->in[i]] = true;
    }
    l->needs_grad = g;
    if (l->kind == WK_L_INPUT && l->x_off + l->size > cols)
      cols = l->x_off + l->size;
  }
  if (m->n_dense < cols) m->n_dense = cols;
  for (int k = 0; k < m->n_layers; k++) {
    wk_layer *l = &m->layers[k];
    if (l->kind != WK_L_INPUT) continue;
    if (used_ids[k] && used_float[k])
      return tsr_errf(err, errlen, TSR_EUNSUPPORTED,
                      "model input '%s' is read both as "
                      "Embedding ids and as numbers; give each its own input",
                      l->name);
    l->ids = used_ids[k];
  }
  reach[m->n_layers - 1] = true;
  for (int k = m->n_layers - 1; k >= 0; k--) {
    const wk_layer *l = &m->layers[k];
    if (!reach[k] && l->kind != WK_L_INPUT)
      return tsr_errf(err, errlen, TSR_ESHAPE,
                      "model: layer '%s' does not lead to the output "
                      "'%s'", l->name, m->layers[m->n_layers - 1].name);
    if (!reach[k]) continue;
    for (int i = 0; i < l->n_in; i++) reach[l->in[i]] = true;
    if (l->addend >= 0) reach[l->addend] = true;
  }
  const wk_layer *out = &m->layers[m->n_layers - 1];
  if (out->rank != 1) {
    char s[64] = "";
    size_t o = 0;
    for (int i = 0; i < out->rank && o < sizeof s; i++)
      o += (size_t)snprintf(s + o, sizeof s - o, "%s%lld", i ? ", " : "",
                            (long long)out->dim[i]);
    return tsr_errf(err, errlen, TSR_ESHAPE,
                    "model: the output '%s' has shape (batch, %s); "
                    "the output must be flat (batch, units): add a Flatten or a "
                    "global pooling before it", out->name, s);
  }
  if (out->kind == WK_L_INPUT)
    return tsr_errf(err, errlen, TSR_ESHAPE,
                    "model: no layer computes anything");
  m->out_dim = out->size;
  return 0;
}
