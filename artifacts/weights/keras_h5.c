/* Keras weight files in HDF5, both layouts, written and read with libhdf5
 * (keras_int.h):
 *   saving   "layers/<path>/vars/<i>": Keras 3's model.weights.h5 and
 *            .weights.h5, and tf_keras 2.14+'s .weights.h5 (2.13 wrote
 *            the root as "_layer_checkpoint_dependencies", read too);
 *   legacy   "<name>/<name>/<var>:0" with the root's layer_names and each
 *            layer's weight_names attributes: tf_keras's save_weights to
 *            a plain .h5, which Keras 3's load_weights also reads (and a
 *            whole model's .h5, under "model_weights").
 * Happy path: one group per layer with variables, one float32 dataset per
 * variable in the plan's order. Reading checks every dataset's shape
 * against the variable; the legacy layout is matched layer by layer in
 * order, as Keras's load_weights matches it.
 * Failure modes: HDF5 errors (its own printing is turned off) and
 * missing or misshapen datasets, each named with the file and the path.
 */
#include "artifacts/weights/keras_int.h"
#include "common/err.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hdf5.h>


/* ---- writing ------------------------------------------------------------ */

/* v's data at dn, with Keras's rank krank (0: a scalar; -1: v's own). */
static int put_dataset(hid_t g, const char *dn, const chief_export_var *v,
                       int krank) {
  hsize_t dims[8];
  int rank = v->rank < 8 ? v->rank : 8;
  for (int d = 0; d < rank; d++) dims[d] = (hsize_t)v->shape[d];
  hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
  H5Pset_create_intermediate_group(lcpl, 1);
  hid_t sp = krank == 0 ? H5Screate(H5S_SCALAR)
                        : H5Screate_simple(rank, dims, NULL);
  hid_t ds = sp < 0 ? -1
                    : H5Dcreate2(g, dn, H5T_IEEE_F32LE, sp, lcpl, H5P_DEFAULT,
                                 H5P_DEFAULT);
  int rc = ds >= 0 && H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL,
                               H5P_DEFAULT, v->data) >= 0
               ? 0
               : TSR_EIO;
  if (ds >= 0) H5Dclose(ds);
  if (sp >= 0) H5Sclose(sp);
  H5Pclose(lcpl);
  return rc;
}

/* A list of strings as an attribute (fixed length, as numpy's bytes
 * arrays are stored); an empty list is an empty float64 array, as tf_keras
 * writes it. */
static int put_strings(hid_t obj, const char *name, const char *const *s,
                       size_t n) {
  hsize_t dims[1] = {n};
  hid_t sp = H5Screate_simple(1, dims, NULL);
  if (sp < 0) return TSR_EIO;
  size_t w = 1;
  for (size_t i = 0; i < n; i++)
    if (strlen(s[i]) > w) w = strlen(s[i]);
  hid_t t = n ? H5Tcopy(H5T_C_S1) : H5Tcopy(H5T_IEEE_F64LE);
  if (n) {
    H5Tset_size(t, w);
    H5Tset_strpad(t, H5T_STR_NULLPAD);
  }
  char *buf = calloc(n ? n : 1, w);
  int rc = buf ? 0 : TSR_ENOMEM;
  for (size_t i = 0; !rc && i < n; i++) memcpy(buf + i * w, s[i], strlen(s[i]));
  hid_t a = rc ? -1 : H5Acreate2(obj, name, t, sp, H5P_DEFAULT, H5P_DEFAULT);
  if (!rc && (a < 0 || H5Awrite(a, t, buf) < 0)) rc = TSR_EIO;
  if (a >= 0) H5Aclose(a);
  free(buf);
  H5Tclose(t);
  H5Sclose(sp);
  return rc;
}

static int put_string(hid_t obj, const char *name, const char *s) {
  hid_t sp = H5Screate(H5S_SCALAR);
  hid_t t = H5Tcopy(H5T_C_S1);
  H5Tset_size(t, strlen(s) + 1);
  hid_t a = H5Acreate2(obj, name, t, sp, H5P_DEFAULT, H5P_DEFAULT);
  int rc = a >= 0 && H5Awrite(a, t, s) >= 0 ? 0 : TSR_EIO;
  if (a >= 0) H5Aclose(a);
  H5Tclose(t);
  H5Sclose(sp);
  return rc;
}

/* layers/<path>[/<sub>]/vars[/<idx>] */
static void saving_path(char *buf, size_t len, const char *root,
                        const ek_layer *el, const char *sub, int idx) {
  int n = snprintf(buf, len, "%s/%s%s%s/vars", root, el->path,
                   sub[0] ? "/" : "", sub);
  if (idx >= 0 && n > 0 && (size_t)n < len)
    snprintf(buf + n, len - (size_t)n, "/%d", idx);
}

/* Each variable at layers/<path>/<sub>/vars/<idx>; a sub-layer that
 * tf_keras names otherwise ("_query_dense") is linked under that name
 * too, so both Keras 3's and tf_keras's load_weights find it. */
static int write_saving(hid_t f, const ek_plan *p, char *gp, size_t gl) {
  hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
  H5Pset_create_intermediate_group(lcpl, 1);
  int rc = 0;
  hid_t g = H5Gcreate2(f, "vars", lcpl, H5P_DEFAULT, H5P_DEFAULT);
  if (g < 0) rc = TSR_EIO;
  else H5Gclose(g);
  snprintf(gp, gl, "vars");
  for (int i = 0; !rc && i < p->n; i++) {
    const ek_layer *el = &p->l[i];
    for (int k = 0; !rc && k < el->count; k++) {
      const ek_where *w = &p->where[el->first + k];
      saving_path(gp, gl, "layers", el, w->sub, w->idx);
      rc = put_dataset(f, gp, p->order[el->first + k], w->krank);
      if (rc || !w->tfk_sub || w->idx) continue;
      char src[300], dst[300];
      snprintf(src, sizeof src, "layers/%s/%s", el->path, w->sub);
      snprintf(dst, sizeof dst, "layers/%s/%s", el->path, w->tfk_sub);
      snprintf(gp, gl, "%s", dst);
      if (H5Lcreate_hard(f, src, f, dst, lcpl, H5P_DEFAULT) < 0)
        rc = TSR_EIO;
    }
  }
  H5Pclose(lcpl);
  return rc;
}

static int write_legacy(hid_t f, const ek_plan *p, char *gp, size_t gl) {
  const char **names = calloc((size_t)p->n + 1, sizeof *names);
  const char **wn = calloc(p->n_order + 1, sizeof *wn);
  char *wbuf = calloc(p->n_order + 1, 160);
  int rc = names && wn && wbuf ? 0 : TSR_ENOMEM;
  snprintf(gp, gl, "/");
  for (int i = 0; !rc && i < p->n; i++) names[i] = p->l[i].name;
  if (!rc &&
      ((rc = put_string(f, "backend", "tensorflow")) ||
       (rc = put_string(f, "keras_version", "2.21.0")) ||
       (rc = put_strings(f, "layer_names", names, (size_t)p->n))))
    rc = TSR_EIO;
  for (int i = 0; !rc && i < p->n; i++) {
    const ek_layer *el = &p->l[i];
    snprintf(gp, gl, "%s", el->name);
    hid_t g = H5Gcreate2(f, el->name, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (g < 0) {
      rc = TSR_EIO;
      break;
    }
    for (int k = 0; k < el->count; k++) {
      char *w = wbuf + (size_t)(el->first + k) * 160;
      snprintf(w, 160, "%s:0", p->order[el->first + k]->name);
      wn[k] = w;
    }
    rc = put_strings(g, "weight_names", wn, (size_t)el->count);
    for (int k = 0; !rc && k < el->count; k++) {
      rc = put_dataset(g, wn[k], p->order[el->first + k],
                       p->where[el->first + k].krank);
      if (rc) snprintf(gp, gl, "%s/%s", el->name, wn[k]);
    }
    H5Gclose(g);
  }
  hid_t g = rc ? -1 : H5Gcreate2(f, "top_level_model_weights", H5P_DEFAULT,
                                 H5P_DEFAULT, H5P_DEFAULT);
  if (!rc && (g < 0 || put_strings(g, "weight_names", NULL, 0))) rc = TSR_EIO;
  if (g >= 0) H5Gclose(g);
  free(names);
  free(wn);
  free(wbuf);
  return rc;
}

int chief__h5_write(const char *path, ek_h5_layout layout, const ek_plan *p,
                    char *err, size_t errlen) {
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
  hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (f < 0) return tsr_errf(err, errlen, TSR_EIO, "%s: HDF5 cannot create the file", path);
  char gp[512] = "";
  int rc = layout == EK_H5_LEGACY ? write_legacy(f, p, gp, sizeof gp)
                                  : write_saving(f, p, gp, sizeof gp);
  if (rc) tsr_errf(err, errlen, rc, "%s: HDF5 cannot write %s", path, gp);
  if (H5Fclose(f) < 0 && !rc)
    rc = tsr_errf(err, errlen, TSR_EIO, "%s: HDF5 cannot close the file", path);
  return rc;
}

/* ---- reading ------------------------------------------------------------ */

/* dp's data into v, when its shape is v's (or a scalar where Keras keeps
 * one, krank 0); found: whether dp exists (NULL: its absence is an
 * error). */
static int get_dataset(hid_t at, const char *dp, const char *shown,
                       const chief_export_var *v, int krank, bool *found,
                       char *err, size_t errlen) {
  hid_t ds = H5Lexists(at, dp, H5P_DEFAULT) > 0 &&
                     H5Oexists_by_name(at, dp, H5P_DEFAULT) > 0
                 ? H5Dopen2(at, dp, H5P_DEFAULT)
                 : -1;
  if (found) *found = ds >= 0;
  if (ds < 0)
    return found ? 0
                 : tsr_errf(err, errlen, TSR_ENOTFOUND,
                            "%s: no dataset %s for %s", shown, dp, v->name);
  hid_t sp = H5Dget_space(ds);
  hsize_t dims[8];
  int64_t d64[8];
  int rank = H5Sget_simple_extent_ndims(sp);
  bool fits = rank >= 0 && rank <= 8;
  if (fits) H5Sget_simple_extent_dims(sp, dims, NULL);
  for (int d = 0; fits && d < rank; d++) d64[d] = (int64_t)dims[d];
  fits = fits && chief__keras_shape_fits(v, krank, rank, d64);
  int rc = 0;
  if (!fits) {
    char a[96] = "?", b[96];
    if (rank >= 0 && rank <= 8) chief__shape_text(rank, d64, a, sizeof a);
    chief__shape_text(v->rank, v->shape, b, sizeof b);
    rc = tsr_errf(err, errlen, TSR_ESHAPE,
                  "%s: %s has shape %s, the model's %s is %s%s", shown, dp, a,
                  v->name, b, krank == 0 ? " (Keras: a scalar)" : "");
  } else if (H5Dread(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT,
                     (void *)v->data) < 0) {
    rc = tsr_errf(err, errlen, TSR_EFORMAT, "%s: cannot read %s", shown, dp);
  }
  H5Sclose(sp);
  H5Dclose(ds);
  return rc;
}

/* A string-list attribute (fixed or variable length, or an empty numeric
 * array); *out is one block: n pointers then the strings. */
static int get_strings(hid_t obj, const char *name, char ***out, size_t *n) {
  *out = NULL;
  *n = 0;
  if (H5Aexists(obj, name) <= 0) return TSR_ENOTFOUND;
  hid_t a = H5Aopen(obj, name, H5P_DEFAULT);
  hid_t sp = H5Aget_space(a), ft = H5Aget_type(a);
  hssize_t cnt = H5Sget_simple_extent_npoints(sp);
  int rc = 0;
  if (cnt <= 0 || H5Tget_class(ft) != H5T_STRING) goto out; /* empty */
  size_t k = (size_t)cnt;
  if (H5Tis_variable_str(ft) > 0) {
    char **v = calloc(k, sizeof *v);
    hid_t mt = H5Tcopy(H5T_C_S1);
    H5Tset_size(mt, H5T_VARIABLE);
    size_t total = 0;
    if (!v || H5Aread(a, mt, v) < 0) {
      rc = TSR_EFORMAT;
    } else {
      for (size_t i = 0; i < k; i++) total += (v[i] ? strlen(v[i]) : 0) + 1;
      char **o = malloc(k * sizeof *o + total);
      char *s = o ? (char *)(o + k) : NULL;
      for (size_t i = 0; o && i < k; i++) {
        o[i] = s;
        s = stpcpy(s, v[i] ? v[i] : "") + 1;
      }
      if (!o) rc = TSR_ENOMEM;
      *out = o;
      H5Dvlen_reclaim(mt, sp, H5P_DEFAULT, v);
    }
    free(v);
    H5Tclose(mt);
  } else {
    size_t w = H5Tget_size(ft);
    char **o = malloc(k * sizeof *o + k * (w + 1));
    char *raw = malloc(k * w + 1);
    hid_t mt = H5Tcopy(ft); /* as stored: a null-terminated type of the
                             * same size would drop the last character */
    if (!o || !raw || H5Aread(a, mt, raw) < 0) {
      rc = o && raw ? TSR_EFORMAT : TSR_ENOMEM;
      free(o);
    } else {
      char *s = (char *)(o + k);
      for (size_t i = 0; i < k; i++) {
        o[i] = s + i * (w + 1);
        memcpy(o[i], raw + i * w, w);
        o[i][w] = 0;
      }
      *out = o;
    }
    free(raw);
    H5Tclose(mt);
  }
  if (!rc) *n = k;
out:
  H5Tclose(ft);
  H5Sclose(sp);
  H5Aclose(a);
  return rc;
}

static int read_legacy(hid_t root, const char *shown, const ek_plan *p,
                       char *err, size_t errlen) {
  char **names;
  size_t nn;
  if (get_strings(root, "layer_names", &names, &nn))
    return tsr_errf(err, errlen, TSR_EFORMAT, "%s: not a Keras weights file (no layers group "
                "and no layer_names attribute)", shown);
  /* the file's layers with weights, in order, against the model's */
  int model_k = 0, rc = 0;
  size_t file_layers = 0;
  for (size_t i = 0; !rc && i < nn; i++) {
    hid_t g = H5Lexists(root, names[i], H5P_DEFAULT) > 0
                  ? H5Gopen2(root, names[i], H5P_DEFAULT)
                  : -1;
    if (g < 0) {
      rc = tsr_errf(err, errlen, TSR_EFORMAT, "%s: layer_names lists %s, which the file does "
                "not have", shown, names[i]);
      break;
    }
    char **wn = NULL;
    size_t nw = 0;
    get_strings(g, "weight_names", &wn, &nw);
    if (nw) {
      file_layers++;
      while (model_k < p->n && !p->l[model_k].count) model_k++;
      if (model_k < p->n) {
        const ek_layer *el = &p->l[model_k++];
        if ((size_t)el->count != nw)
          rc = tsr_errf(err, errlen, TSR_ESHAPE, "%s: layer %s has %zu weights, the model's "
                    "layer %s (the same place in order) has %d", shown,
                    names[i], nw, el->name, el->count);
        for (int k = 0; !rc && k < el->count; k++)
          rc = get_dataset(g, wn[k], shown, p->order[el->first + k],
                           p->where[el->first + k].krank, NULL, err, errlen);
      }
    }
    free(wn);
    H5Gclose(g);
  }
  int model_layers = 0;
  for (int i = 0; i < p->n; i++) model_layers += p->l[i].count > 0;
  if (!rc && file_layers != (size_t)model_layers)
    rc = tsr_errf(err, errlen, TSR_ESHAPE, "%s: the file has weights for %zu layers, the "
              "model has %d layers with weights", shown, file_layers,
              model_layers);
  free(names);
  return rc;
}

int chief__h5_read(const char *path, const char *shown, const ek_plan *p,
                   char *err, size_t errlen) {
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
  hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
  if (f < 0) return tsr_errf(err, errlen, TSR_EFORMAT, "%s: not an HDF5 file", shown);
  const char *root = NULL;
  if (H5Lexists(f, "layers", H5P_DEFAULT) > 0) root = "layers";
  else if (H5Lexists(f, "_layer_checkpoint_dependencies", H5P_DEFAULT) > 0)
    root = "_layer_checkpoint_dependencies";
  int rc = 0;
  for (int i = 0; root && !rc && i < p->n; i++) {
    const ek_layer *el = &p->l[i];
    for (int k = 0; !rc && k < el->count; k++) {
      const ek_where *w = &p->where[el->first + k];
      const chief_export_var *v = p->order[el->first + k];
      char dp[300], alt[300] = "";
      bool found = false;
      saving_path(dp, sizeof dp, root, el, w->sub, w->idx);
      rc = get_dataset(f, dp, shown, v, w->krank, &found, err, errlen);
      if (!rc && !found && w->tfk_sub) { /* tf_keras's .weights.h5 */
        saving_path(alt, sizeof alt, root, el, w->tfk_sub, w->idx);
        rc = get_dataset(f, alt, shown, v, w->krank, &found, err, errlen);
      }
      if (!rc && !found)
        rc = tsr_errf(err, errlen, TSR_ENOTFOUND,
                      "%s: no dataset %s%s%s%s for %s", shown, dp,
                      alt[0] ? " (nor tf_keras's " : "", alt,
                      alt[0] ? ")" : "", v->name);
    }
  }
  if (!root) {
    hid_t g = H5Lexists(f, "model_weights", H5P_DEFAULT) > 0
                  ? H5Gopen2(f, "model_weights", H5P_DEFAULT)
                  : -1;
    rc = read_legacy(g >= 0 ? g : f, shown, p, err, errlen);
    if (g >= 0) H5Gclose(g);
  }
  H5Fclose(f);
  return rc;
}
