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

static json_t *keras3_layer(const ek_layer *el) {
  json_t *L = json_deep_copy(el->obj);
  json_t *c = json_object_get(L, "config");
  static const char *const drop[] = {"batch_input_shape", "batch_shape",
                                     "input_shape", NULL};
  for (int i = 0; drop[i]; i++) json_object_del(c, drop[i]);
  if (!strcmp(el->cls, "Embedding")) json_object_del(c, "input_length");
  else json_object_del(c, "input_dim");
  json_t *ax = json_object_get(c, "axis");
  if (!strcmp(el->cls, "BatchNormalization") && json_is_array(ax) &&
      json_array_size(ax) == 1)
    json_object_set(c, "axis", json_array_get(ax, 0));
  if (!json_object_get(L, "module"))
    json_object_set_new(L, "module", json_string("keras.layers"));
  if (!json_object_get(L, "registered_name"))
    json_object_set_new(L, "registered_name", json_null());
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
    json_t *L = keras3_layer(el);
    json_object_set_new(L, "name", json_string(el->name));
    json_t *call = json_array();
    for (int j = 0; j < el->n_in; j++) {
      const char *src = el->in[j];
      for (int i = 0; i < p->n_inputs; i++)
        if (norm[i][0] && !strcmp(src, p->inputs[i])) src = norm[i];
      json_array_append_new(call, ref(src));
    }
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
