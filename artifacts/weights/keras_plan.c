/* The Keras weight layout of a model JSON; see keras_int.h.
 *
 * Happy path: a Sequential's layers are taken in order (the InputLayer
 * aside, its shape kept); a Functional's are ordered as Keras's map_graph
 * orders model.layers: a depth-first walk from the output numbers each
 * layer the first time it is met and lists it after its inputs; walking
 * that list backwards gives each layer its depth (the longest path to the
 * output); layers sort by depth, deepest first, ties by their number.
 * Then each layer gets its saving path (class in snake case, numbered per
 * class) and its variables by name prefix.
 * Failure modes: the built-in model (no Keras counterpart), a class other
 * than Sequential or Functional, a layer without class or config, an
 * inbound layer the model does not have, a cycle, a variable that
 * belongs to no layer; each error names the layer or the variable.
 */
#include "artifacts/weights/keras_int.h"
#include "common/err.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* "(.)([A-Z][a-z]+)" -> "\1_\2", then "([a-z])([A-Z])" -> "\1_\2",
 * lower case. */
void chief__keras_snake(const char *in, char *out, size_t len) {
  char a[128];
  size_t o = 0;
  for (size_t i = 0; in[i] && o + 2 < sizeof a; i++) {
    char c = in[i];
    bool up = c >= 'A' && c <= 'Z';
    bool next_low = in[i + 1] >= 'a' && in[i + 1] <= 'z';
    if (i > 0 && up && next_low) a[o++] = '_';
    a[o++] = c;
  }
  a[o] = 0;
  size_t k = 0;
  for (size_t i = 0; a[i] && k + 2 < len; i++) {
    char c = a[i];
    bool up = c >= 'A' && c <= 'Z';
    if (i > 0 && up && a[i - 1] >= 'a' && a[i - 1] <= 'z') out[k++] = '_';
    out[k++] = up ? (char)(c - 'A' + 'a') : c;
  }
  out[k] = 0;
}

static const json_t *batch_shape(const json_t *cfg) {
  const json_t *s = json_object_get(cfg, "batch_shape");
  if (!s) s = json_object_get(cfg, "batch_input_shape");
  return json_is_array(s) ? s : NULL;
}

/* Numbered saving paths per class, in the plan's order (as many classes
 * as a model may have layers, one more for a Sequential's InputLayer). */
typedef struct {
  struct { char cls[64]; int count; } seen[EK_MAX_LAYERS + 1];
  int n;
} ek_namer;

static void name_path(ek_namer *nr, const char *cls, char *out, size_t len) {
  char base[64];
  chief__keras_snake(cls, base, sizeof base);
  int k;
  for (k = 0; k < nr->n; k++)
    if (!strcmp(nr->seen[k].cls, base)) break;
  if (k == nr->n && nr->n <= EK_MAX_LAYERS) {
    snprintf(nr->seen[nr->n].cls, sizeof nr->seen[0].cls, "%s", base);
    nr->seen[nr->n++].count = 0;
  }
  int nth = k < nr->n ? nr->seen[k].count++ : 0;
  if (nth) snprintf(out, len, "%s_%d", base, nth);
  else snprintf(out, len, "%s", base);
}

/* ---- Sequential ----------------------------------------------------------*/

typedef struct {
  ek_layer l[EK_MAX_LAYERS];
  int n;
} ek_scratch;

static int plan_sequential(const json_t *model, ek_plan *p, char *err,
                           size_t errlen) {
  const json_t *cfg = json_object_get(model, "config");
  const json_t *layers = json_object_get(cfg, "layers");
  if (!layers && json_is_array(cfg)) layers = cfg;
  if (!json_is_array(layers))
    return tsr_errf(err, errlen, TSR_ECONFIG, "model: config.layers must be a list");
  ek_namer dn = {0};
  for (size_t i = 0; i < json_array_size(layers); i++) {
    const json_t *L = json_array_get(layers, i);
    const char *lc = json_string_value(json_object_get(L, "class_name"));
    const json_t *c = json_object_get(L, "config");
    if (!lc || !json_is_object(c))
      return tsr_errf(err, errlen, TSR_ECONFIG, "model: layers[%zu] needs class_name and "
                  "config", i);
    const json_t *shp = batch_shape(c);
    if (shp && !p->n_inputs) {
      p->input_shape[0] = shp;
      p->inputs[0] = "input_layer";
      p->n_inputs = 1;
    }
    char defname[64];
    name_path(&dn, lc, defname, sizeof defname);
    if (!strcmp(lc, "InputLayer")) {
      const char *nm = json_string_value(json_object_get(c, "name"));
      if (nm) p->inputs[0] = nm;
      continue;
    }
    if (p->n == EK_MAX_LAYERS)
      return tsr_errf(err, errlen, TSR_ERANGE, "model: over %d layers", EK_MAX_LAYERS);
    ek_layer *el = &p->l[p->n];
    const char *nm = json_string_value(json_object_get(c, "name"));
    if (!nm) {
      snprintf(el->defname, sizeof el->defname, "%s", defname);
      nm = el->defname;
    }
    el->name = nm;
    el->cls = lc;
    el->obj = L;
    p->n++;
  }
  return 0;
}

/* ---- Functional ----------------------------------------------------------*/

/* The layer names a call reads, in the order Keras flattens a call's
 * arguments: Keras 2 [name, node, tensor, {kwargs}] lists, Keras 3
 * {"args": [...], "kwargs": {...}} with __keras_tensor__ objects; the
 * tensors among the keyword arguments (tf_keras's value= of a
 * MultiHeadAttention) after the positional ones, by key. A mask is left
 * out: Tessera and Keras derive it from the Embedding. */
static int refs(const json_t *j, ek_layer *el, int depth, char *err,
                size_t errlen);

/* by key: each round takes the smallest key above the last one taken */
static int kw_refs(const json_t *kw, ek_layer *el, int depth, char *err,
                   size_t errlen) {
  const char *last = NULL;
  for (;;) {
    const char *next = NULL, *k;
    json_t *v;
    json_object_foreach((json_t *)kw, k, v) {
      if (strcmp(k, "mask") && (!last || strcmp(k, last) > 0) &&
          (!next || strcmp(k, next) < 0))
        next = k;
    }
    if (!next) return 0;
    int rc = refs(json_object_get(kw, next), el, depth + 1, err, errlen);
    if (rc) return rc;
    last = next;
  }
}

static int refs(const json_t *j, ek_layer *el, int depth, char *err,
                size_t errlen) {
  if (depth > 8) return 0;
  if (json_is_object(j)) {
    const char *cn = json_string_value(json_object_get(j, "class_name"));
    if (cn && !strcmp(cn, "__keras_tensor__")) {
      const json_t *h = json_object_get(json_object_get(j, "config"),
                                        "keras_history");
      return refs(h, el, depth + 1, err, errlen);
    }
    const json_t *args = json_object_get(j, "args");
    int rc = args ? refs(args, el, depth + 1, err, errlen) : 0;
    return rc ? rc
              : kw_refs(json_object_get(j, "kwargs"), el, depth, err, errlen);
  }
  if (!json_is_array(j)) return 0;
  if (json_array_size(j) >= 3 && json_is_string(json_array_get(j, 0)) &&
      json_is_integer(json_array_get(j, 1))) {
    if (el->n_in == EK_MAX_IN)
      return tsr_errf(err, errlen, TSR_ERANGE, "layer '%s': more than %d inputs", el->name,
                  EK_MAX_IN);
    el->in[el->n_in++] = json_string_value(json_array_get(j, 0));
    return kw_refs(json_array_get(j, 3), el, depth, err, errlen);
  }
  for (size_t i = 0; i < json_array_size(j); i++) {
    int rc = refs(json_array_get(j, i), el, depth + 1, err, errlen);
    if (rc) return rc;
  }
  return 0;
}

/* input_layers / output_layers: [[name, 0, 0], ...] or one [name, 0, 0]. */
static int io_names(const json_t *v, const char *key, const char **out,
                    int max, int *n, char *err, size_t errlen) {
  *n = 0;
  if (json_is_array(v) && json_is_string(json_array_get(v, 0))) {
    out[(*n)++] = json_string_value(json_array_get(v, 0));
    return 0;
  }
  for (size_t i = 0; json_is_array(v) && i < json_array_size(v); i++) {
    const char *s = json_string_value(json_array_get(json_array_get(v, i), 0));
    if (!s) break;
    if (*n == max)
      return tsr_errf(err, errlen, TSR_ERANGE, "model: more than %d %s", max, key);
    out[(*n)++] = s;
  }
  if (*n == 0)
    return tsr_errf(err, errlen, TSR_ECONFIG, "model: config.%s must list [name, 0, 0] "
                "entries", key);
  return 0;
}

typedef struct {
  ek_scratch *s;
  int idx[EK_MAX_LAYERS];     /* first met in the walk; -1 not yet */
  int state[EK_MAX_LAYERS];   /* 0 new, 1 in progress, 2 finished */
  int post[EK_MAX_LAYERS], n_post;
  int counter;
} ek_walk;

static int find(const ek_scratch *s, const char *name) {
  for (int i = 0; i < s->n; i++)
    if (!strcmp(s->l[i].name, name)) return i;
  return -1;
}

static int walk(ek_walk *w, int k, char *err, size_t errlen) {
  if (w->state[k] == 2) return 0;
  if (w->state[k] == 1)
    return tsr_errf(err, errlen, TSR_ECONFIG, "model: layer '%s' is part of a cycle",
                w->s->l[k].name);
  if (w->idx[k] < 0) w->idx[k] = w->counter++;
  w->state[k] = 1;
  const ek_layer *el = &w->s->l[k];
  for (int i = 0; !el->input && i < el->n_in; i++) {
    int j = find(w->s, el->in[i]);
    if (j < 0)
      return tsr_errf(err, errlen, TSR_ECONFIG, "layer '%s' reads layer '%s', which the model "
                  "does not have", el->name, el->in[i]);
    int rc = walk(w, j, err, errlen);
    if (rc) return rc;
  }
  w->state[k] = 2;
  w->post[w->n_post++] = k;
  return 0;
}

static int plan_functional(const json_t *model, ek_plan *p, ek_scratch *s,
                           char *err, size_t errlen) {
  const json_t *cfg = json_object_get(model, "config");
  const json_t *layers = json_object_get(cfg, "layers");
  size_t nl = json_is_array(layers) ? json_array_size(layers) : 0;
  if (nl == 0)
    return tsr_errf(err, errlen, TSR_ECONFIG, "model: config.layers must be a non-empty list");
  if (nl > EK_MAX_LAYERS)
    return tsr_errf(err, errlen, TSR_ERANGE, "model: over %d layers", EK_MAX_LAYERS);
  int rc;
  for (size_t i = 0; i < nl; i++) {
    const json_t *L = json_array_get(layers, i);
    ek_layer *el = &s->l[s->n];
    const json_t *c = json_object_get(L, "config");
    el->obj = L;
    el->cls = json_string_value(json_object_get(L, "class_name"));
    el->name = json_string_value(json_object_get(L, "name"));
    if (!el->name) el->name = json_string_value(json_object_get(c, "name"));
    if (!el->cls || !el->name || !json_is_object(c))
      return tsr_errf(err, errlen, TSR_ECONFIG, "model: layers[%zu] needs name, class_name "
                  "and config", i);
    el->input = !strcmp(el->cls, "InputLayer");
    const json_t *ib = json_object_get(L, "inbound_nodes");
    if (!el->input && json_array_size(ib) != 1)
      return tsr_errf(err, errlen, TSR_EUNSUPPORTED, "layer '%s': called %zu times (one call "
                  "per layer is supported)", el->name, json_array_size(ib));
    if (!el->input &&
        (rc = refs(json_array_get(ib, 0), el, 0, err, errlen)))
      return rc;
    s->n++;
  }
  const char *outs[2];
  int no;
  if ((rc = io_names(json_object_get(cfg, "input_layers"), "input_layers",
                     p->inputs, EK_MAX_INPUTS, &p->n_inputs, err, errlen)) ||
      (rc = io_names(json_object_get(cfg, "output_layers"), "output_layers",
                     outs, 2, &no, err, errlen)))
    return rc;
  if (no != 1)
    return tsr_errf(err, errlen, TSR_EUNSUPPORTED, "model: %d outputs (one is supported)", no);
  p->output = outs[0];
  for (int i = 0; i < p->n_inputs; i++) {
    int k = find(s, p->inputs[i]);
    if (k < 0 || !s->l[k].input)
      return tsr_errf(err, errlen, TSR_ECONFIG, "model: input_layers names '%s', which is not "
                  "an InputLayer of the model", p->inputs[i]);
    p->input_shape[i] = batch_shape(json_object_get(s->l[k].obj, "config"));
  }
  int out = find(s, p->output);
  if (out < 0)
    return tsr_errf(err, errlen, TSR_ECONFIG, "model: output_layers names '%s', which the "
                "model does not have", p->output);
  ek_walk *w = calloc(1, sizeof *w);
  if (!w) return TSR_ENOMEM;
  w->s = s;
  for (int i = 0; i < s->n; i++) w->idx[i] = -1;
  rc = walk(w, out, err, errlen);
  int depth[EK_MAX_LAYERS];
  for (int i = 0; i < s->n; i++) depth[i] = -1;
  for (int k = w->n_post - 1; !rc && k >= 0; k--) {
    int i = w->post[k];
    if (depth[i] < 0) depth[i] = 0;
    const ek_layer *el = &s->l[i];
    for (int j = 0; !el->input && j < el->n_in; j++) {
      int a = find(s, el->in[j]);
      if (depth[a] < depth[i] + 1) depth[a] = depth[i] + 1;
    }
  }
  /* inputs that do not reach the output: depth 0, first among equals */
  for (int i = 0; !rc && i < p->n_inputs; i++) {
    int k = find(s, p->inputs[i]);
    if (w->state[k] != 2) {
      depth[k] = 0;
      w->idx[k] = -1;
      w->state[k] = 2;
    }
  }
  /* deepest first, ties in walk order; layers off the output's path are
   * left out (their variables then belong to no layer) */
  while (!rc) {
    int best = -1;
    for (int i = 0; i < s->n; i++) {
      if (w->state[i] != 2) continue;
      if (best < 0 || depth[i] > depth[best] ||
          (depth[i] == depth[best] && w->idx[i] < w->idx[best]))
        best = i;
    }
    if (best < 0) break;
    w->state[best] = 3;
    p->l[p->n++] = s->l[best];
  }
  free(w);
  p->functional = true;
  return rc;
}

/* ---- variables inside a layer ------------------------------------------*/

/* A MultiHeadAttention's dense sub-layers: Tessera's variable prefix,
 * Keras 3's attribute, tf_keras's. */
static const char *const mha_subs[][3] = {
    {"query", "query_dense", "_query_dense"},
    {"key", "key_dense", "_key_dense"},
    {"value", "value_dense", "_value_dense"},
    {"attention_output", "output_dense", "_output_dense"},
};

static bool is_cls(const ek_layer *el, const char *c) {
  return !strcmp(el->cls, c);
}

/* Each of el's variables' place (keras_int.h): its sub-layer by the name
 * after "<layer>/", numbered within that sub-layer in order. */
static int place_vars(ek_plan *p, const ek_layer *el, char *err,
                      size_t errlen) {
  size_t pl = strlen(el->name) + 1;
  const char *fwd = NULL; /* a Bidirectional's first (forward) layer */
  size_t fwd_len = 0;
  for (int k = 0; k < el->count; k++) {
    const chief_export_var *v = p->order[el->first + k];
    ek_where *w = &p->where[el->first + k];
    const char *rest = v->name + pl;
    const char *slash = strchr(rest, '/');
    size_t cl = slash ? (size_t)(slash - rest) : strlen(rest);
    const char *sub = "";
    w->krank = -1;
    if (is_cls(el, "LSTM") || is_cls(el, "GRU")) {
      sub = "cell";
    } else if (is_cls(el, "Bidirectional")) {
      if (!slash)
        return tsr_errf(err, errlen, TSR_ECONFIG,
                        "variable %s: a Bidirectional's variables are "
                        "<layer>/<forward or backward layer>/<cell>/<name>",
                        v->name);
      if (!fwd) {
        fwd = rest;
        fwd_len = cl;
      }
      sub = cl == fwd_len && !strncmp(rest, fwd, cl) ? "forward_layer/cell"
                                                      : "backward_layer/cell";
    } else if (is_cls(el, "MultiHeadAttention")) {
      size_t s;
      for (s = 0; s < sizeof mha_subs / sizeof *mha_subs; s++)
        if (strlen(mha_subs[s][0]) == cl && !strncmp(rest, mha_subs[s][0], cl))
          break;
      if (s == sizeof mha_subs / sizeof *mha_subs || !slash)
        return tsr_errf(err, errlen, TSR_EUNSUPPORTED,
                        "variable %s: a MultiHeadAttention has query, key, "
                        "value and attention_output variables, Keras has no "
                        "place for this one", v->name);
      sub = mha_subs[s][1];
      w->tfk_sub = mha_subs[s][2];
    } else if (is_cls(el, "TimeDistributed")) {
      sub = "layer";
    } else if (is_cls(el, "Attention") && !strcmp(rest, "scale")) {
      int64_t nv = 1;
      for (int d = 0; v->shape && d < v->rank; d++) nv *= v->shape[d];
      if (nv != 1)
        return tsr_errf(err, errlen, TSR_ESHAPE,
                        "variable %s: an Attention's scale is one number "
                        "(Keras keeps a scalar)", v->name);
      w->krank = 0;
    }
    snprintf(w->sub, sizeof w->sub, "%s", sub);
    w->idx = 0;
    for (int j = 0; j < k; j++)
      w->idx += !strcmp(p->where[el->first + j].sub, w->sub);
  }
  return 0;
}

void chief__keras_plan_free(ek_plan *p) {
  free(p->order);
  free(p->where);
  p->order = NULL;
  p->where = NULL;
}

int chief__keras_plan(const json_t *model, const chief_export_var *vars,
                      size_t n, ek_plan *p, char *err, size_t errlen) {
  memset(p, 0, sizeof *p);
  if (json_object_get(model, "builtin"))
    return tsr_errf(err, errlen, TSR_EUNSUPPORTED,
                "the built-in %s model has no Keras counterpart (its "
                "embeddings pool bags of sparse ids, which Keras layers do "
                "not): export it with --npz",
                json_string_value(json_object_get(model, "builtin")));
  const char *cls = json_string_value(json_object_get(model, "class_name"));
  ek_scratch *s = calloc(1, sizeof *s);
  if (!s) return TSR_ENOMEM;
  int rc;
  if (cls && !strcmp(cls, "Sequential"))
    rc = plan_sequential(model, p, err, errlen);
  else if (cls && (!strcmp(cls, "Functional") || !strcmp(cls, "Model")))
    rc = plan_functional(model, p, s, err, errlen);
  else
    rc = tsr_errf(err, errlen, TSR_EUNSUPPORTED, "model class %s: Keras files are written "
              "for Sequential and Functional models (use --npz)",
              cls ? cls : "(none)");
  ek_namer nr = {0};
  for (int i = 0; !rc && i < p->n; i++)
    name_path(&nr, p->l[i].cls, p->l[i].path, sizeof p->l[i].path);
  if (!rc && (!(p->order = calloc(n ? n : 1, sizeof *p->order)) ||
              !(p->where = calloc(n ? n : 1, sizeof *p->where))))
    rc = TSR_ENOMEM;
  for (int i = 0; !rc && i < p->n; i++) {
    ek_layer *el = &p->l[i];
    el->first = (int)p->n_order;
    if (el->input) continue;
    size_t pl = strlen(el->name);
    for (size_t v = 0; !rc && v < n; v++) {
      if (strncmp(vars[v].name, el->name, pl) || vars[v].name[pl] != '/')
        continue;
      if (p->n_order == n) {
        rc = tsr_errf(err, errlen, TSR_ECONFIG, "model: two layers are named '%s'", el->name);
        break;
      }
      p->order[p->n_order++] = &vars[v];
      el->count++;
    }
    if (!rc) rc = place_vars(p, el, err, errlen);
  }
  for (size_t v = 0; !rc && p->n_order != n && v < n; v++) {
    bool used = false;
    for (size_t k = 0; k < p->n_order; k++) used |= p->order[k] == &vars[v];
    if (!used)
      rc = tsr_errf(err, errlen, TSR_ECONFIG, "variable %s belongs to no layer of the model",
                vars[v].name);
  }
  if (rc) chief__keras_plan_free(p);
  free(s);
  return rc;
}

int chief__keras_order(const json_t *model, const chief_export_var *vars,
                       size_t n, size_t *order, int *krank, char *err,
                       size_t errlen) {
  for (size_t i = 0; i < n; i++) {
    order[i] = i;
    if (krank) krank[i] = -1;
  }
  if (json_object_get(model, "builtin")) return 0;
  ek_plan *p = calloc(1, sizeof *p);
  if (!p) return TSR_ENOMEM;
  int rc = chief__keras_plan(model, vars, n, p, err, errlen);
  for (size_t k = 0; !rc && k < n; k++) {
    order[k] = (size_t)(p->order[k] - vars);
    if (krank) krank[order[k]] = p->where[k].krank;
  }
  chief__keras_plan_free(p);
  free(p);
  return rc;
}

bool chief__keras_shape_fits(const chief_export_var *v, int krank, int rank,
                             const int64_t *dims) {
  if (krank == 0 && rank == 0) return true;
  if (rank != v->rank) return false;
  for (int d = 0; d < rank; d++)
    if (dims[d] != v->shape[d]) return false;
  return true;
}

void chief__shape_text(int rank, const int64_t *dims, char *buf,
                       size_t len) {
  buf[0] = 0;
  if (rank == 0) snprintf(buf, len, "a scalar");
  for (int d = 0; d < rank; d++)
    snprintf(buf + strlen(buf), len - strlen(buf), "%s%lld", d ? "x" : "",
             (long long)dims[d]);
}
