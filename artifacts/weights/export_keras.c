/* Keras exports; see export_keras.h.
 *
 * Happy path: plan the model's Keras layout (keras_plan.c: the layers in
 * model.layers order, their saving paths and variables), write the
 * weights with libhdf5 in the layout the target file's name asks for
 * (keras_h5.c), and for .keras build the Keras 3 config (keras_config.c)
 * and zip config.json, metadata.json and model.weights.h5.
 * Failure modes: see the header; each names the file, the layer or the
 * variable.
 */
#include "artifacts/weights/export_keras.h"
#include "artifacts/weights/keras_int.h"
#include "artifacts/weights/npz.h"
#include "common/err.h"
#include "common/fs.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static bool ends(const char *s, const char *suf) {
  size_t a = strlen(s), b = strlen(suf);
  return a >= b && !strcmp(s + a - b, suf);
}

int chief_export_weights_h5(const char *out, const json_t *model,
                            const chief_export_var *vars, size_t n,
                            char *err, size_t errlen) {
  err[0] = 0;
  ek_h5_layout layout;
  if (ends(out, ".weights.h5"))
    layout = EK_H5_SAVING;
  else if (ends(out, ".h5") || ends(out, ".hdf5"))
    layout = EK_H5_LEGACY;
  else
    return tsr_errf(err, errlen, TSR_ECONFIG,
                          "%s: name the file NAME.weights.h5 (Keras 3 and "
                          "tf_keras's load_weights) or NAME.h5 (tf_keras's "
                          "legacy HDF5 layout)", out);
  ek_plan *p = calloc(1, sizeof *p);
  if (!p) return TSR_ENOMEM;
  int rc = chief__keras_plan(model, vars, n, p, err, errlen);
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s.tmp", out);
  if (!rc) rc = chief__h5_write(tmp, layout, p, err, errlen);
  if (!rc)
    rc = tsr_commit_written(tmp, out, err, errlen);
  else
    unlink(tmp);
  chief__keras_plan_free(p);
  free(p);
  return rc;
}

int chief_keras_weight_order(const json_t *model, const char *const *names,
                             size_t n, size_t *order, char *err,
                             size_t errlen) {
  chief_export_var *ev = calloc(n ? n : 1, sizeof *ev);
  if (!ev) return TSR_ENOMEM;
  for (size_t i = 0; i < n; i++)
    ev[i] = (chief_export_var){names[i], 0, NULL, NULL};
  int rc = chief__keras_order(model, ev, n, order, NULL, err, errlen);
  free(ev);
  return rc;
}

int chief_export_npz(const char *out, const json_t *model,
                     const chief_export_var *vars, size_t n, char *err,
                     size_t errlen) {
  size_t *order = calloc(n ? n : 1, sizeof *order);
  int *krank = calloc(n ? n : 1, sizeof *krank);
  int rc = order && krank ? 0 : TSR_ENOMEM;
  if (rc) snprintf(err, errlen, "out of memory");
  /* a model Keras cannot lay out keeps the given order and shapes */
  if (!rc && chief__keras_order(model, vars, n, order, krank, err, errlen))
    for (size_t i = 0; i < n; i++) {
      order[i] = i;
      krank[i] = -1;
    }
  chief_npz *z = NULL;
  if (!rc) rc = chief_npz_open(&z, out, err, errlen);
  for (size_t k = 0; !rc && k < n; k++) {
    const chief_export_var *v = &vars[order[k]];
    bool scalar = krank[order[k]] == 0;
    rc = chief_npz_add_f32(z, v->name, scalar ? NULL : v->shape,
                           scalar ? 0 : v->rank, v->data, err, errlen);
  }
  if (z) {
    if (rc) chief_npz_abort(z);
    else rc = chief_npz_close(z, err, errlen);
  }
  free(order);
  free(krank);
  return rc;
}

int chief_export_input_stats(const char *path, const json_t *input,
                             char *err, size_t errlen) {
  if (!input) return 0;
  json_t *mean, *var;
  int rc = chief__input_moments(input, 0, -1, &mean, &var, err, errlen);
  if (rc) return rc;
  json_t *o = json_pack("{sososO}", "mean", mean, "variance", var, "scale",
                        json_object_get(input, "scale"));
  json_object_set(o, "shift", json_object_get(input, "shift"));
  if (json_object_get(input, "columns"))
    json_object_set(o, "columns", json_object_get(input, "columns"));
  json_object_set_new(o, "note", json_string(
      "inputs as training read them: (x - mean) / sqrt(variance), which is "
      "x * scale + shift; variance is the population one; columns: the "
      "first feature of each model input"));
  if (json_dump_file(o, path, JSON_INDENT(1)) != 0)
    rc = tsr_errf(err, errlen, TSR_EIO, "%s: cannot write", path);
  json_decref(o);
  return rc;
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
  if (!rc && !(c = chief__keras3_config(model, input, p, err, errlen)))
    rc = TSR_ECONFIG;
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
  if (!rc) rc = chief__h5_write(tmp, EK_H5_SAVING, p, err, errlen);
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
    if (!hl)
      rc = tsr_errf(err, errlen, TSR_EIO, "%s: cannot read back", tmp);
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
  chief__keras_plan_free(p);
  free(p);
  return rc;
}
