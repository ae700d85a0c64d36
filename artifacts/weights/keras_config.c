/* The config.json of an exported .keras archive: the job's model (Keras 2
 * or Keras 3 spelling, Sequential or Functional) as Keras 3's
 * deserialize_keras_object reads it, with the input pipeline's affine map
 * as a Normalization layer after each input.
 *
 * Happy path: copy each layer's config, drop the shape keys Keras 3 does
 * not take on a layer (its inputs carry the shapes), spell
 * BatchNormalization's axis as Keras 3 does; a Sequential gets an
 * InputLayer with its batch_shape, a Functional keeps its InputLayers and
 * has every reader of an input read that input's Normalization instead.
 * Each input's slice of the affine map (its columns: the manifest's
 * "columns", where the workers placed it, else one input after the
 * other) becomes the Normalization's mean and variance: one value per
 * channel when the map is the same for every element of a channel (an
 * image scaled by 1/255), else one per element over all the input's axes.
 * Inputs read only by Embedding layers (integer ids) get none.
 * Failure modes: a scale of 0 (no Normalization can express it), an
 * input whose shape is unknown, columns beyond the map; each named.
 */
#include "artifacts/weights/keras_int.h"
#include "common/err.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


int chief__input_moments(const json_t *input, int64_t first, int64_t n,
                         json_t **mean, json_t **var, char *err,
                         size_t errlen) {
  const json_t *a = json_object_get(input, "scale");
  const json_t *b = json_object_get(input, "shift");
  if (!json_is_array(a) || !json_is_array(b) ||
      json_array_size(a) != json_array_size(b))
    return tsr_errf(err, errlen, TSR_ECONFIG, "manifest input: scale and shift must be lists "
                "of one length");
  if (n < 0) n = (int64_t)json_array_size(a) - first;
  if (first < 0 || first + n > (int64_t)json_array_size(a))
    return tsr_errf(err, errlen, TSR_ESHAPE, "manifest input: columns %lld..%lld are beyond "
                "its %zu features", (long long)first,
                (long long)(first + n - 1), json_array_size(a));
  *mean = json_array();
  *var = json_array();
  for (int64_t j = first; j < first + n; j++) {
    double s = json_number_value(json_array_get(a, (size_t)j));
    double t = json_number_value(json_array_get(b, (size_t)j));
    if (!(fabs(s) > 0)) {
      json_decref(*mean);
      json_decref(*var);
      return tsr_errf(err, errlen, TSR_ECONFIG, "manifest input: feature %lld has scale 0",
                  (long long)j);
    }
    json_array_append_new(*mean, json_real(t == 0 ? 0.0 : -t / s));
    json_array_append_new(*var, json_real(1.0 / (s * s)));
  }
  return 0;
}

/* ---- layers ------------------------------------------------------------ */

/* One layer object (a model's, or one a wrapper holds) as Keras 3 takes
 * it: without the shape keys its inputs carry and the arguments only
 * tf_keras has (an RNN's time_major, a MultiHeadAttention's query_shape,
 * key_shape, value_shape and softmax_robust_masking (false: Tessera
 * refuses true), which Keras 3 refuses), the layers a
 * Bidirectional or TimeDistributed holds likewise. */
static void keras3_obj(json_t *L, int depth) {
  const char *cls = json_string_value(json_object_get(L, "class_name"));
  json_t *c = json_object_get(L, "config");
  if (!cls || !json_is_object(c)) return;
  static const char *const drop[] = {"batch_input_shape", "batch_shape",
                                     "input_shape", "time_major",
                                     "query_shape", "key_shape",
                                     "value_shape", "softmax_robust_masking",
                                     NULL};
  for (int i = 0; drop[i]; i++) json_object_del(c, drop[i]);
  if (!strcmp(cls, "Embedding")) json_object_del(c, "input_length");
  else json_object_del(c, "input_dim");
  json_t *ax = json_object_get(c, "axis");
  if (!strcmp(cls, "BatchNormalization") && json_is_array(ax) &&
      json_array_size(ax) == 1)
    json_object_set(c, "axis", json_array_get(ax, 0));
  if (!json_object_get(L, "module"))
    json_object_set_new(L, "module", json_string("keras.layers"));
  if (!json_object_get(L, "registered_name"))
    json_object_set_new(L, "registered_name", json_null());
  static const char *const held[] = {"layer", "backward_layer", NULL};
  for (int i = 0; depth < 4 && held[i]; i++)
    if (json_is_object(json_object_get(c, held[i])))
      keras3_obj(json_object_get(c, held[i]), depth + 1);
}

static json_t *keras3_layer(const ek_layer *el) {
  json_t *L = json_deep_copy(el->obj);
  keras3_obj(L, 0);
  json_object_del(L, "build_config");
  json_object_del(L, "inbound_nodes");
  return L;
}

static json_t *input_layer(const char *name, const json_t *shape) {
  return json_pack("{ss ss s{sO ss sb ss} sn}", "module", "keras.layers",
                   "class_name", "InputLayer", "config", "batch_shape", shape,
                   "dtype", "float32", "sparse", 0, "name", name,
                   "registered_name");
}

/* values[k] over the input's shape dims[0..r) as nested lists */
static json_t *nest(const json_t *flat, const int64_t *dims, int r,
                    int64_t *at) {
  json_t *a = json_array();
  for (int64_t i = 0; i < dims[0]; i++) {
    if (r == 1)
      json_array_append(a, json_array_get(flat, (size_t)(*at)++));
    else
      json_array_append_new(a, nest(flat, dims + 1, r - 1, at));
  }
  return a;
}

/* The Normalization of one input: columns [first, first + size). */
static json_t *normalization(const char *name, const json_t *shape,
                             const json_t *input, int64_t first, char *err,
                             size_t errlen) {
  int r = (int)json_array_size(shape) - 1;
  int64_t dims[8], size = 1;
  for (int i = 0; i < r && i < 8; i++) {
    dims[i] = json_integer_value(json_array_get(shape, (size_t)i + 1));
    size *= dims[i];
  }
  if (r < 1 || r > 8 || size < 1) {
    tsr_errf(err, errlen, TSR_ESHAPE, "model input '%s': its shape is unknown", name);
    return NULL;
  }
  json_t *mean, *var;
  if (chief__input_moments(input, first, size, &mean, &var, err, errlen))
    return NULL;
  /* the same map for every element of a channel: one value per channel */
  int64_t ch = dims[r - 1];
  bool per_channel = true;
  for (int64_t k = ch; per_channel && k < size; k++)
    per_channel =
        json_real_value(json_array_get(mean, (size_t)k)) ==
            json_real_value(json_array_get(mean, (size_t)(k % ch))) &&
        json_real_value(json_array_get(var, (size_t)k)) ==
            json_real_value(json_array_get(var, (size_t)(k % ch)));
  json_t *axis, *m, *v;
  if (per_channel || r == 1) {
    axis = json_integer(-1);
    m = json_array();
    v = json_array();
    for (int64_t k = 0; k < ch; k++) {
      json_array_append(m, json_array_get(mean, (size_t)k));
      json_array_append(v, json_array_get(var, (size_t)k));
    }
  } else {
    axis = json_array();
    for (int i = 1; i <= r; i++) json_array_append_new(axis, json_integer(i));
    int64_t at = 0;
    m = nest(mean, dims, r, &at);
    at = 0;
    v = nest(var, dims, r, &at);
  }
  json_decref(mean);
  json_decref(var);
  char nm[160];
  snprintf(nm, sizeof nm, "%s_normalization", name);
  return json_pack("{ss ss s{ss sb ss so sb so so} sn s{sO}}", "module",
                   "keras.layers", "class_name", "Normalization", "config",
                   "name", nm, "trainable", 1, "dtype", "float32", "axis",
                   axis, "invert", 0, "mean", m, "variance", v,
                   "registered_name", "build_config", "input_shape", shape);
}

/* ---- models ------------------------------------------------------------- */

static int64_t shape_size(const json_t *shape) {
  int64_t s = 1;
  for (size_t i = 1; i < json_array_size(shape); i++)
    s *= json_integer_value(json_array_get(shape, i));
  return s;
}

/* Whether input i is read only by Embedding layers (ids, not numbers). */
static bool ids_only(const ek_plan *p, const char *input) {
  bool any = false;
  for (int k = 0; k < p->n; k++)
    for (int j = 0; j < p->l[k].n_in; j++)
      if (!strcmp(p->l[k].in[j], input)) {
        if (strcmp(p->l[k].cls, "Embedding")) return false;
        any = true;
      }
  return any;
}

/* First column of each input in the affine map: the manifest's columns
 * ({input name: first column}, as the workers placed them; a Sequential's
 * one input whatever its name), else one input after the other. */
static int input_columns(const json_t *input, const ek_plan *p,
                         int64_t *first, char *err, size_t errlen) {
  const json_t *cols = json_object_get(input, "columns");
  int64_t off = 0;
  for (int i = 0; i < p->n_inputs; i++) {
    if (!p->input_shape[i])
      return tsr_errf(err, errlen, TSR_ESHAPE, "model input '%s': no batch shape",
                  p->inputs[i]);
    first[i] = off;
    off += shape_size(p->input_shape[i]);
    const json_t *c = json_object_get(cols, p->inputs[i]);
    if (!c && !p->functional && json_object_size(cols) == 1)
      c = json_object_iter_value(json_object_iter((json_t *)cols));
    if (json_is_integer(c)) first[i] = json_integer_value(c);
  }
  return 0;
}

static json_t *ref(const char *name) {
  return json_pack("[sii{}]", name, 0, 0);
}

/* ---- a Functional layer's call ------------------------------------------*/

/* The input a call reads in its place: an input's Normalization. */
static const char *reads(const ek_plan *p, char norm[][160], const char *src) {
  for (int i = 0; i < p->n_inputs; i++)
    if (norm[i][0] && !strcmp(src, p->inputs[i])) return norm[i];
  return src;
}

/* A Keras 3 call ({"args", "kwargs"} with __keras_tensor__ objects) with
 * each tensor reading its source's replacement; the mask argument goes
 * (Keras derives it from the Embedding as Tessera does). */
static void retarget(json_t *j, const ek_plan *p, char norm[][160],
                     int depth) {
  if (depth > 16) return;
  if (json_is_array(j)) {
    for (size_t i = 0; i < json_array_size(j); i++)
      retarget(json_array_get(j, i), p, norm, depth + 1);
    return;
  }
  if (!json_is_object(j)) return;
  const char *cn = json_string_value(json_object_get(j, "class_name"));
  if (cn && !strcmp(cn, "__keras_tensor__")) {
    json_t *h = json_object_get(json_object_get(j, "config"), "keras_history");
    const char *src = json_string_value(json_array_get(h, 0));
    if (src && reads(p, norm, src) != src)
      json_array_set_new(h, 0, json_string(reads(p, norm, src)));
    return;
  }
  json_object_del(json_object_get(j, "kwargs"), "mask");
  const char *k;
  json_t *v;
  json_object_foreach(j, k, v) retarget(v, p, norm, depth + 1);
}

static bool legacy_ref(const json_t *j) {
  return json_is_array(j) && json_array_size(j) >= 3 &&
         json_is_string(json_array_get(j, 0)) &&
         json_is_integer(json_array_get(j, 1));
}

/* A tensor of a tf_keras keyword argument as Keras 3 writes it: the shape
 * is the one tf_keras recorded for that argument ("<kw>_shape", a
 * MultiHeadAttention's query_shape/value_shape/key_shape), else the
 * layer's input shape. */
static json_t *keras_tensor(const ek_layer *el, const char *src,
                            const char *kw, char *err, size_t errlen) {
  const json_t *c = json_object_get(el->obj, "config");
  char key[64];
  snprintf(key, sizeof key, "%s_shape", kw);
  const json_t *shape = json_object_get(c, key);
  if (!json_is_array(shape) && !strcmp(kw, "query"))
    shape = json_object_get(json_object_get(el->obj, "build_config"),
                            "input_shape");
  if (!json_is_array(shape) || json_array_size(shape) < 2 ||
      json_is_array(json_array_get(shape, 0))) {
    tsr_errf(err, errlen, TSR_ECONFIG,
             "layer '%s' (%s): its %s argument's shape is not in the model "
             "(tf_keras records it as config.%s)", el->name, el->cls, kw,
             key);
    return NULL;
  }
  return json_pack("{ss s{sO ss s[sii]}}", "class_name", "__keras_tensor__",
                   "config", "shape", shape, "dtype", "float32",
                   "keras_history", src, 0, 0);
}

/* The call of one layer in the Keras 3 config: a Keras 3 call as it was
 * (retargeted); a tf_keras call [[name, 0, 0, kwargs], ...] as the list
 * of its inputs, or, when a keyword argument is a tensor (tf_keras's
 * mha(query, value=v)), as a Keras 3 call with that tensor among the
 * kwargs (Keras 3 would pass a tf_keras call's kwargs on as written: a
 * [name, 0, 0] list where the layer wants a tensor). The positional
 * tensors then take MultiHeadAttention's recorded query_shape, else the
 * layer's input shape. */
static json_t *call_of(const ek_layer *el, const ek_plan *p,
                       char norm[][160], char *err, size_t errlen) {
  const json_t *node =
      json_array_get(json_object_get(el->obj, "inbound_nodes"), 0);
  if (json_is_object(node)) {
    json_t *c = json_deep_copy(node);
    retarget(c, p, norm, 0);
    return c;
  }
  json_t *call = json_array(), *kwargs = json_object();
  bool tensors = false;
  for (size_t j = 0; j < json_array_size(node); j++) {
    const json_t *r = json_array_get(node, j);
    if (!legacy_ref(r)) continue;
    json_array_append_new(
        call, ref(reads(p, norm, json_string_value(json_array_get(r, 0)))));
    const char *k;
    json_t *v;
    json_object_foreach(json_array_get(r, 3), k, v) {
      if (!legacy_ref(v)) continue;
      json_t *t = keras_tensor(
          el, reads(p, norm, json_string_value(json_array_get(v, 0))), k,
          err, errlen);
      if (!t) {
        json_decref(call);
        json_decref(kwargs);
        return NULL;
      }
      json_object_set_new(kwargs, k, t);
      tensors = true;
    }
  }
  if (!tensors) {
    json_decref(kwargs);
    return call;
  }
  /* the positional tensors: one, or a list of several */
  json_t *args = json_array();
  for (size_t j = 0; j < json_array_size(call); j++) {
    json_t *r = json_array_get(call, j);
    json_t *t = keras_tensor(el, json_string_value(json_array_get(r, 0)),
                             "query", err, errlen);
    if (!t) {
      json_decref(args);
      json_decref(call);
      json_decref(kwargs);
      return NULL;
    }
    json_array_append_new(args, t);
  }
  json_decref(call);
  if (json_array_size(args) > 1) args = json_pack("[o]", args);
  return json_pack("{soso}", "args", args, "kwargs", kwargs);
}

static json_t *sequential(const json_t *model, const json_t *input,
                          const ek_plan *p, char *err, size_t errlen) {
  if (p->n_inputs < 1) {
    tsr_errf(err, errlen, TSR_ESHAPE, "model: the input shape is unknown (no InputLayer or "
         "batch_input_shape)");
    return NULL;
  }
  const json_t *shape = p->input_shape[0];
  json_t *layers = json_array();
  json_array_append_new(layers, input_layer(p->inputs[0], shape));
  if (input) {
    int64_t first = 0;
    json_t *n = NULL;
    if (input_columns(input, p, &first, err, errlen) ||
        !(n = normalization(p->inputs[0], shape, input, first, err,
                            errlen))) {
      json_decref(layers);
      return NULL;
    }
    json_array_append_new(layers, n);
  }
  for (int i = 0; i < p->n; i++)
    json_array_append_new(layers, keras3_layer(&p->l[i]));
  const char *name =
      json_string_value(json_object_get(json_object_get(model, "config"),
                                        "name"));
  return json_pack("{ss ss s{ss sb ss so} sn s{sO} sn}", "module", "keras",
                   "class_name", "Sequential", "config", "name",
                   name ? name : "sequential", "trainable", 1, "dtype",
                   "float32", "layers", layers, "registered_name",
                   "build_config", "input_shape", shape, "compile_config");
}

static json_t *functional(const json_t *model, const json_t *input,
                          const ek_plan *p, char *err, size_t errlen) {
  int64_t first[EK_MAX_INPUTS];
  char norm[EK_MAX_INPUTS][160];
  if (input_columns(input, p, first, err, errlen)) return NULL;
  json_t *layers = json_array(), *ins = json_array();
  for (int i = 0; i < p->n_inputs; i++) {
    json_t *L = input_layer(p->inputs[i], p->input_shape[i]);
    json_object_set_new(L, "name", json_string(p->inputs[i]));
    json_object_set_new(L, "inbound_nodes", json_array());
    json_array_append_new(layers, L);
    json_array_append_new(ins, json_pack("[sii]", p->inputs[i], 0, 0));
    norm[i][0] = 0;
    if (!input || ids_only(p, p->inputs[i])) continue;
    json_t *n = normalization(p->inputs[i], p->input_shape[i], input,
                              first[i], err, errlen);
    if (!n) {
      json_decref(layers);
      json_decref(ins);
      return NULL;
    }
    const char *nn = json_string_value(
        json_object_get(json_object_get(n, "config"), "name"));
    snprintf(norm[i], sizeof norm[i], "%s", nn);
    json_object_set_new(n, "name", json_string(nn));
    json_object_set_new(n, "inbound_nodes",
                        json_pack("[[o]]", ref(p->inputs[i])));
    json_array_append_new(layers, n);
  }
  for (int k = 0; k < p->n; k++) {
    const ek_layer *el = &p->l[k];
    if (el->input) continue;
    json_t *call = call_of(el, p, norm, err, errlen);
    if (!call) {
      json_decref(layers);
      json_decref(ins);
      return NULL;
    }
    json_t *L = keras3_layer(el);
    json_object_set_new(L, "name", json_string(el->name));
    json_object_set_new(L, "inbound_nodes", json_pack("[o]", call));
    json_array_append_new(layers, L);
  }
  const char *name =
      json_string_value(json_object_get(json_object_get(model, "config"),
                                        "name"));
  return json_pack("{ss ss s{ss sb so so s[[sii]]} ss sn}", "module",
                   "keras.src.models.functional", "class_name", "Functional",
                   "config", "name", name ? name : "functional", "trainable",
                   1, "layers", layers, "input_layers", ins, "output_layers",
                   p->output, 0, 0, "registered_name", "Functional",
                   "compile_config");
}

json_t *chief__keras3_config(const json_t *model, const json_t *input,
                             const ek_plan *p, char *err, size_t errlen) {
  json_t *c = p->functional ? functional(model, input, p, err, errlen)
                            : sequential(model, input, p, err, errlen);
  if (!c && !err[0]) tsr_errf(err, errlen, TSR_ENOMEM, "out of memory");
  return c;
}
