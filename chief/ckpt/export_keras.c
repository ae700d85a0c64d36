/* Keras exports; see export_keras.h.
 *
 * Happy path: walk the Sequential config's layers, give each its saving
 * path (class in snake case, numbered) and its variables (names
 * "<layer name>/..." in the checkpoint's order), write them with libhdf5
 * under the root group of the target format, and for .keras build a Keras
 * 3 config (InputLayer with batch_shape, the Normalization of the input
 * map, the model's own layers) and zip the three files.
 * Failure modes: see the header; HDF5's own error printing is turned off
 * and its failures become messages naming the file and the dataset.
 */
#include "chief/ckpt/export_keras.h"
#include "chief/ckpt/keras_int.h"
#include "chief/ckpt/npz.h"
#include "common/err.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <hdf5.h>


static int ek_fail(char *err, size_t errlen, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int ek_fail(char *err, size_t errlen, int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
  return code;
}

/* Keras's naming.to_snake_case: "(.)([A-Z][a-z]+)" -> "\1_\2", then
 * "([a-z])([A-Z])" -> "\1_\2", lower case ("BatchNormalization" ->
 * "batch_normalization", "Conv2D" -> "conv2d"). */
static void snake(const char *in, char *out, size_t len) {
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

static const json_t *layer_shape(const json_t *cfg) {
  const json_t *s = json_object_get(cfg, "batch_shape");
  if (!s) s = json_object_get(cfg, "batch_input_shape");
  return s;
}

int chief__keras_plan(const json_t *model, const chief_export_var *vars,
                      size_t n, ek_plan *p, char *err, size_t errlen) {
  memset(p, 0, sizeof *p);
  p->in_width = -1;
  if (json_object_get(model, "builtin"))
    return ek_fail(err, errlen, TSR_EUNSUPPORTED,
                   "the built-in %s model has no Keras counterpart: export "
                   "it with --npz",
                   json_string_value(json_object_get(model, "builtin")));
  const char *cls = json_string_value(json_object_get(model, "class_name"));
  const json_t *cfg = json_object_get(model, "config");
  const json_t *layers = json_object_get(cfg, "layers");
  if (!cls || strcmp(cls, "Sequential") || !json_is_array(layers))
    return ek_fail(err, errlen, TSR_EUNSUPPORTED,
                   "model class %s: only Sequential models are exported to "
                   "Keras files (use --npz)", cls ? cls : "(none)");
  p->order = calloc(n ? n : 1, sizeof *p->order);
  if (!p->order) return TSR_ENOMEM;
  struct { char cls[64]; int count; } seen[64];
  int nseen = 0;
  for (size_t i = 0; i < json_array_size(layers); i++) {
    const json_t *L = json_array_get(layers, i);
    const char *lc = json_string_value(json_object_get(L, "class_name"));
    const json_t *c = json_object_get(L, "config");
    if (!lc || !json_is_object(c))
      return ek_fail(err, errlen, TSR_ECONFIG,
                     "model: layers[%zu] needs class_name and config", i);
    const json_t *shp = layer_shape(c);
    if (shp && p->in_width < 0 && json_is_array(shp)) {
      int64_t w = 1;
      for (size_t k = 1; k < json_array_size(shp); k++)
        w *= json_integer_value(json_array_get(shp, k));
      p->in_width = w;
    }
    if (!strcmp(lc, "InputLayer")) {
      p->input_layer = L;
      continue;
    }
    if (p->n == EK_MAX_LAYERS)
      return ek_fail(err, errlen, TSR_ERANGE, "model: over %d layers",
                     EK_MAX_LAYERS);
    ek_layer *el = &p->l[p->n++];
    char base[64];
    snake(lc, base, sizeof base);
    int k;
    for (k = 0; k < nseen; k++)
      if (!strcmp(seen[k].cls, base)) break;
    if (k == nseen && nseen < 64) {
      snprintf(seen[nseen].cls, sizeof seen[0].cls, "%s", base);
      seen[nseen++].count = 0;
    }
    int nth = k < 64 ? seen[k].count++ : 0;
    if (nth)
      snprintf(el->path, sizeof el->path, "%s_%d", base, nth);
    else
      snprintf(el->path, sizeof el->path, "%s", base);
    el->cfg = L;
    el->first = (int)p->n_order;
    const char *lname = json_string_value(json_object_get(c, "name"));
    char prefix[160];
    snprintf(prefix, sizeof prefix, "%s/", lname ? lname : el->path);
    for (size_t v = 0; v < n; v++)
      if (!strncmp(vars[v].name, prefix, strlen(prefix))) {
        p->order[p->n_order++] = &vars[v];
        el->count++;
      }
  }
  if (p->n_order != n) {
    for (size_t v = 0; v < n; v++) {
      bool used = false;
      for (size_t k = 0; k < p->n_order; k++) used |= p->order[k] == &vars[v];
      if (!used)
        return ek_fail(err, errlen, TSR_ECONFIG,
                       "variable %s belongs to no layer of the model",
                       vars[v].name);
    }
  }
  return 0;
}

static int h5_write(const char *path, const char *root, const ek_plan *p,
                    char *err, size_t errlen) {
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
  hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (f < 0)
    return ek_fail(err, errlen, TSR_EIO, "%s: HDF5 cannot create the file",
                   path);
  hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
  H5Pset_create_intermediate_group(lcpl, 1);
  int rc = 0;
  hid_t g = H5Gcreate2(f, "vars", lcpl, H5P_DEFAULT, H5P_DEFAULT);
  if (g < 0) rc = TSR_EIO;
  else H5Gclose(g);
  for (int i = 0; !rc && i < p->n; i++) {
    const ek_layer *el = &p->l[i];
    char gp[256];
    snprintf(gp, sizeof gp, "%s/%s/vars", root, el->path);
    g = H5Gcreate2(f, gp, lcpl, H5P_DEFAULT, H5P_DEFAULT);
    if (g < 0) {
      rc = ek_fail(err, errlen, TSR_EIO, "%s: HDF5 cannot create group %s",
                   path, gp);
      break;
    }
    for (int k = 0; !rc && k < el->count; k++) {
      const chief_export_var *v = p->order[el->first + k];
      hsize_t dims[8];
      int rank = v->rank < 8 ? v->rank : 8;
      for (int d = 0; d < rank; d++) dims[d] = (hsize_t)v->shape[d];
      hid_t sp = H5Screate_simple(rank, dims, NULL);
      char dn[16];
      snprintf(dn, sizeof dn, "%d", k);
      hid_t ds = sp < 0 ? -1
                        : H5Dcreate2(g, dn, H5T_IEEE_F32LE, sp, H5P_DEFAULT,
                                     H5P_DEFAULT, H5P_DEFAULT);
      if (ds < 0 || H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL,
                             H5P_DEFAULT, v->data) < 0)
        rc = ek_fail(err, errlen, TSR_EIO, "%s: HDF5 cannot write %s/%s (%s)",
                     path, gp, dn, v->name);
      if (ds >= 0) H5Dclose(ds);
      if (sp >= 0) H5Sclose(sp);
    }
    H5Gclose(g);
  }
  H5Pclose(lcpl);
  if (H5Fclose(f) < 0 && !rc)
    rc = ek_fail(err, errlen, TSR_EIO, "%s: HDF5 cannot close the file",
                 path);
  if (rc == TSR_EIO && !err[0])
    ek_fail(err, errlen, rc, "%s: HDF5 write failed", path);
  return rc;
}

int chief_export_weights_h5(const char *out, const json_t *model,
                            const chief_export_var *vars, size_t n,
                            char *err, size_t errlen) {
  ek_plan *p = calloc(1, sizeof *p);
  if (!p) return TSR_ENOMEM;
  err[0] = 0;
  int rc = chief__keras_plan(model, vars, n, p, err, errlen);
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s.tmp", out);
  if (!rc) rc = h5_write(tmp, "_layer_checkpoint_dependencies", p, err, errlen);
  if (!rc && rename(tmp, out) != 0)
    rc = ek_fail(err, errlen, -errno, "%s: %s", out, strerror(errno));
  if (rc) unlink(tmp);
  free(p->order);
  free(p);
  return rc;
}

/* mean = -shift/scale, variance = 1/scale^2 of the input map. */
static int input_moments(const json_t *input, json_t **mean, json_t **var,
                         char *err, size_t errlen) {
  const json_t *a = json_object_get(input, "scale");
  const json_t *b = json_object_get(input, "shift");
  if (!json_is_array(a) || !json_is_array(b) ||
      json_array_size(a) != json_array_size(b))
    return ek_fail(err, errlen, TSR_ECONFIG,
                   "manifest input: scale and shift must be lists of one "
                   "length");
  *mean = json_array();
  *var = json_array();
  for (size_t j = 0; j < json_array_size(a); j++) {
    double s = json_number_value(json_array_get(a, j));
    double t = json_number_value(json_array_get(b, j));
    if (!(fabs(s) > 0)) {
      json_decref(*mean);
      json_decref(*var);
      return ek_fail(err, errlen, TSR_ECONFIG,
                     "manifest input: feature %zu has scale 0", j);
    }
    json_array_append_new(*mean, json_real(-t / s));
    json_array_append_new(*var, json_real(1.0 / (s * s)));
  }
  return 0;
}

int chief_export_input_stats(const char *path, const json_t *input,
                             char *err, size_t errlen) {
  if (!input) return 0;
  json_t *mean, *var;
  int rc = input_moments(input, &mean, &var, err, errlen);
  if (rc) return rc;
  json_t *o = json_pack("{sososO}", "mean", mean, "variance", var, "scale",
                        json_object_get(input, "scale"));
  json_object_set(o, "shift", json_object_get(input, "shift"));
  json_object_set_new(o, "note", json_string(
      "inputs as training read them: (x - mean) / sqrt(variance), which is "
      "x * scale + shift; variance is the population one"));
  if (json_dump_file(o, path, JSON_INDENT(1)) != 0)
    rc = ek_fail(err, errlen, TSR_EIO, "%s: cannot write", path);
  json_decref(o);
  return rc;
}

/* The Keras 3 config of the model: {"module", "class_name": "Sequential",
 * "config": {"layers": [InputLayer, Normalization?, ...]}, ...}. */
static json_t *keras3_config(const json_t *model, const json_t *input,
                             const ek_plan *p, char *err, size_t errlen) {
  json_t *layers = json_array();
  int64_t w = p->in_width;
  json_t *bs = json_pack("[nI]", (json_int_t)w);
  json_t *in = json_pack("{ss ss s{sO ss sb ss} sn}", "module", "keras.layers",
                         "class_name", "InputLayer", "config", "batch_shape",
                         bs, "dtype", "float32", "sparse", 0, "name",
                         "input_layer", "registered_name");
  json_array_append_new(layers, in);
  if (input) {
    json_t *mean, *var;
    if (input_moments(input, &mean, &var, err, errlen)) {
      json_decref(layers);
      json_decref(bs);
      return NULL;
    }
    json_t *norm = json_pack(
        "{ss ss s{ss sb ss si sb so so} sn s{sO}}", "module", "keras.layers",
        "class_name", "Normalization", "config", "name", "normalization",
        "trainable", 1, "dtype", "float32", "axis", -1, "invert", 0, "mean",
        mean, "variance", var, "registered_name", "build_config",
        "input_shape", bs);
    json_array_append_new(layers, norm);
  }
  json_decref(bs);
  for (int i = 0; i < p->n; i++) {
    json_t *L = json_deep_copy(p->l[i].cfg);
    json_t *c = json_object_get(L, "config");
    json_object_del(c, "batch_input_shape");
    json_object_del(c, "batch_shape");
    json_object_del(c, "input_shape");
    json_object_del(c, "input_dim");
    if (!json_object_get(L, "module"))
      json_object_set_new(L, "module", json_string("keras.layers"));
    if (!json_object_get(L, "registered_name"))
      json_object_set_new(L, "registered_name", json_null());
    json_array_append_new(layers, L);
  }
  const json_t *mc = json_object_get(model, "config");
  const char *name = json_string_value(json_object_get(mc, "name"));
  return json_pack("{ss ss s{ss sb ss so} sn s{s[nI]} sn}", "module", "keras",
                   "class_name", "Sequential", "config", "name",
                   name ? name : "sequential", "trainable", 1, "dtype",
                   "float32", "layers", layers, "registered_name",
                   "build_config", "input_shape", (json_int_t)w,
                   "compile_config");
}

int chief_export_keras(const char *out, const json_t *model,
                       const json_t *input, const chief_export_var *vars,
                       size_t n, char *err, size_t errlen) {
  ek_plan *p = calloc(1, sizeof *p);
  if (!p) return TSR_ENOMEM;
  err[0] = 0;
  char *cfg = NULL, *meta = NULL;
  uint8_t *h5 = NULL;
  json_t *c = NULL;
  chief_npz *z = NULL;
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s.weights.tmp", out);
  int rc = chief__keras_plan(model, vars, n, p, err, errlen);
  if (!rc && p->in_width < 1)
    rc = ek_fail(err, errlen, TSR_ESHAPE,
                 "model: the input shape is unknown (no batch_input_shape)");
  if (!rc && !(c = keras3_config(model, input, p, err, errlen)))
    rc = err[0] ? TSR_ECONFIG : TSR_ENOMEM;
  if (!rc && !(cfg = json_dumps(c, JSON_COMPACT))) rc = TSR_ENOMEM;
  if (!rc) {
    char date[64];
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(date, sizeof date, "%Y-%m-%d@%H:%M:%S", &tm);
    json_t *m = json_pack("{ssss}", "keras_version", "3.6.0", "date_saved",
                          date);
    meta = json_dumps(m, JSON_COMPACT);
    json_decref(m);
    if (!meta) rc = TSR_ENOMEM;
  }
  if (!rc) rc = h5_write(tmp, "layers", p, err, errlen);
  size_t hl = 0;
  if (!rc) {
    FILE *f = fopen(tmp, "rb");
    if (f && fseek(f, 0, SEEK_END) == 0) {
      long sz = ftell(f);
      rewind(f);
      if (sz > 0 && (h5 = malloc((size_t)sz)) &&
          fread(h5, 1, (size_t)sz, f) == (size_t)sz)
        hl = (size_t)sz;
    }
    if (f) fclose(f);
    if (!hl) rc = ek_fail(err, errlen, TSR_EIO, "%s: cannot read back", tmp);
  }
  if (!rc) rc = chief_npz_open(&z, out, err, errlen);
  if (!rc) rc = chief_npz_add_file(z, "metadata.json", meta, strlen(meta),
                                   err, errlen);
  if (!rc) rc = chief_npz_add_file(z, "config.json", cfg, strlen(cfg), err,
                                   errlen);
  if (!rc) rc = chief_npz_add_file(z, "model.weights.h5", h5, hl, err, errlen);
  if (z) {
    if (rc) chief_npz_abort(z);
    else rc = chief_npz_close(z, err, errlen);
  }
  unlink(tmp);
  json_decref(c);
  free(cfg);
  free(meta);
  free(h5);
  free(p->order);
  free(p);
  return rc;
}
