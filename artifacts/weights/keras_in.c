/* Weights in (a job's initial_weights): an .npz (arrays named as the
 * model's variables, as `tessera ckpt export --npz` writes them, or
 * np.savez(*model.get_weights())'s arr_0, arr_1, ... in get_weights
 * order), a Keras 3 .keras archive, a .weights.h5 or a legacy .h5
 * (keras_h5.c reads every layout), mapped onto the model's variables
 * through the same plan the exporter writes with.
 *
 * Happy path: read the zip's central directory (stored or deflated
 * members), parse each .npy header (little-endian float32/float64, C
 * order) or open the HDF5 file and read each layer's variables; check
 * every variable is found with its shape and copy it in.
 * Failure modes, each naming the file and the variable or member: a
 * missing variable, a shape that differs, a dtype other than float32 or
 * float64, a damaged zip or HDF5 file.
 */
#include "artifacts/weights/keras_int.h"
#include "common/err.h"
#include "common/job.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include <errno.h>
#include <limits.h>
#include <sys/stat.h>

static uint32_t le32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
         (uint32_t)p[3] << 24;
}
static uint16_t le16(const uint8_t *p) {
  return (uint16_t)(p[0] | p[1] << 8);
}

/* ---- zip members -------------------------------------------------------*/

typedef struct {
  char name[256];
  uint8_t *data;   /* inflated; owned */
  size_t len;
} ki_member;

static void members_free(ki_member *m, size_t n) {
  for (size_t i = 0; i < n; i++) free(m[i].data);
  free(m);
}

static int zip_read(const char *path, const uint8_t *z, size_t zl,
                    ki_member **out, size_t *nout, char *err,
                    size_t errlen) {
  size_t eocd = 0;
  bool found = false;
  for (size_t i = zl >= 22 ? zl - 22 : 0; zl >= 22; i--) {
    if (le32(z + i) == 0x06054b50) {
      eocd = i;
      found = true;
      break;
    }
    if (i == 0 || zl - i > 65557) break;
  }
  if (!found)
    return tsr_errf(err, errlen, TSR_EFORMAT, "%s: not a zip archive", path);
  size_t n = le16(z + eocd + 10), cd = le32(z + eocd + 16);
  ki_member *m = calloc(n ? n : 1, sizeof *m);
  if (!m) return TSR_ENOMEM;
  int rc = 0;
  for (size_t i = 0; i < n && !rc; i++) {
    if (cd + 46 > zl || le32(z + cd) != 0x02014b50) {
      rc = tsr_errf(err, errlen, TSR_EFORMAT, "%s: damaged zip directory",
                   path);
      break;
    }
    unsigned method = le16(z + cd + 10);
    size_t csz = le32(z + cd + 20), usz = le32(z + cd + 24);
    size_t nl = le16(z + cd + 28), xl = le16(z + cd + 30),
           cl = le16(z + cd + 32), lho = le32(z + cd + 42);
    snprintf(m[i].name, sizeof m[i].name, "%.*s",
             (int)(nl < 255 ? nl : 255), (const char *)z + cd + 46);
    cd += 46 + nl + xl + cl;
    if (lho + 30 > zl || le32(z + lho) != 0x04034b50) {
      rc = tsr_errf(err, errlen, TSR_EFORMAT, "%s: %s: damaged local header",
                   path, m[i].name);
      break;
    }
    size_t at = lho + 30 + le16(z + lho + 26) + le16(z + lho + 28);
    if (at + csz > zl || usz > ((size_t)1 << 32)) {
      rc = tsr_errf(err, errlen, TSR_EFORMAT, "%s: %s: truncated", path,
                   m[i].name);
      break;
    }
    m[i].data = malloc(usz ? usz : 1);
    m[i].len = usz;
    if (!m[i].data) {
      rc = TSR_ENOMEM;
      break;
    }
    if (method == 0 && csz == usz) {
      memcpy(m[i].data, z + at, usz);
    } else if (method == 8) {
      z_stream zs;
      memset(&zs, 0, sizeof zs);
      if (inflateInit2(&zs, -15) != Z_OK) {
        rc = TSR_ENOMEM;
        break;
      }
      zs.next_in = (Bytef *)(z + at);
      zs.avail_in = (uInt)csz;
      zs.next_out = m[i].data;
      zs.avail_out = (uInt)usz;
      int zr = inflate(&zs, Z_FINISH);
      inflateEnd(&zs);
      if (zr != Z_STREAM_END || zs.total_out != usz)
        rc = tsr_errf(err, errlen, TSR_EFORMAT, "%s: %s: damaged deflate data",
                     path, m[i].name);
    } else {
      rc = tsr_errf(err, errlen, TSR_EUNSUPPORTED,
                   "%s: %s: zip method %u is not supported", path, m[i].name,
                   method);
    }
  }
  if (rc) {
    members_free(m, n);
    return rc;
  }
  *out = m;
  *nout = n;
  return 0;
}

/* .npy into floats when its shape is v's (or a scalar where Keras keeps
 * one, krank 0). */
static int npy_take(const char *path, const ki_member *m,
                    const chief_import_var *v, int krank, char *err,
                    size_t errlen) {
  const uint8_t *p = m->data;
  if (m->len < 10 || memcmp(p, "\x93NUMPY", 6))
    return tsr_errf(err, errlen, TSR_EFORMAT, "%s: %s is not an .npy", path,
                   m->name);
  size_t hl = p[6] == 1 ? le16(p + 8) : le32(p + 8);
  size_t h0 = p[6] == 1 ? 10 : 12;
  if (h0 + hl > m->len)
    return tsr_errf(err, errlen, TSR_EFORMAT, "%s: %s: bad header", path,
                   m->name);
  char hdr[1024];
  snprintf(hdr, sizeof hdr, "%.*s", (int)(hl < 1023 ? hl : 1023),
           (const char *)p + h0);
  bool f8 = strstr(hdr, "'<f8'") != NULL, f4 = strstr(hdr, "'<f4'") != NULL;
  if (!f4 && !f8)
    return tsr_errf(err, errlen, TSR_EDTYPE,
                   "%s: %s: dtype must be little-endian float32 or float64",
                   path, m->name);
  if (strstr(hdr, "'fortran_order': True"))
    return tsr_errf(err, errlen, TSR_EUNSUPPORTED, "%s: %s: Fortran order",
                   path, m->name);
  const char *sh = strstr(hdr, "'shape': (");
  int64_t dims[8];
  int rank = 0;
  for (const char *q = sh ? sh + 10 : ""; *q && *q != ')' && rank < 8;) {
    char *e;
    long long d = strtoll(q, &e, 10);
    if (e == q) break;
    dims[rank++] = d;
    q = e;
    while (*q == ',' || *q == ' ') q++;
  }
  int64_t numel = 1;
  for (int i = 0; i < rank; i++) numel *= dims[i];
  chief_export_var ev = {v->name, v->rank, v->shape, NULL};
  if (!chief__keras_shape_fits(&ev, krank, rank, dims)) {
    char a[96], b[96];
    chief__shape_text(rank, dims, a, sizeof a);
    chief__shape_text(v->rank, v->shape, b, sizeof b);
    return tsr_errf(err, errlen, TSR_ESHAPE,
                   "%s: %s has shape %s, the model's %s is %s%s", path,
                   m->name, a, v->name, b,
                   krank == 0 ? " (Keras: a scalar)" : "");
  }
  size_t es = f8 ? 8 : 4;
  if (h0 + hl + (size_t)numel * es > m->len)
    return tsr_errf(err, errlen, TSR_EFORMAT, "%s: %s: data truncated", path,
                   m->name);
  const uint8_t *d = p + h0 + hl;
  for (int64_t i = 0; i < numel; i++) {
    if (f8) {
      double x;
      memcpy(&x, d + 8 * i, 8);
      v->data[i] = (float)x;
    } else {
      memcpy(&v->data[i], d + 4 * i, 4);
    }
  }
  return 0;
}

static int from_npz(const char *path, const uint8_t *z, size_t zl,
                    const json_t *model, chief_import_var *vars, size_t n,
                    char *err, size_t errlen) {
  ki_member *m;
  size_t nm;
  /* arr_<k> is the k-th of get_weights */
  size_t *order = calloc(n ? n : 1, sizeof *order),
         *pos = calloc(n ? n : 1, sizeof *pos);
  int *krank = calloc(n ? n : 1, sizeof *krank);
  chief_export_var *ev = calloc(n ? n : 1, sizeof *ev);
  int rc = order && pos && krank && ev ? 0 : TSR_ENOMEM;
  for (size_t v = 0; !rc && v < n; v++)
    ev[v] = (chief_export_var){vars[v].name, vars[v].rank, vars[v].shape,
                               vars[v].data};
  /* a model without a Keras layout (the built-in one) keeps its order */
  if (!rc && chief__keras_order(model, ev, n, order, krank, err, errlen))
    for (size_t k = 0; k < n; k++) {
      order[k] = k;
      krank[k] = -1;
    }
  for (size_t k = 0; !rc && k < n; k++) pos[order[k]] = k;
  free(order);
  free(ev);
  if (!rc) rc = zip_read(path, z, zl, &m, &nm, err, errlen);
  if (rc) {
    free(pos);
    free(krank);
    return rc;
  }
  for (size_t v = 0; v < n && !rc; v++) {
    char want[300], arr[32];
    snprintf(want, sizeof want, "%s.npy", vars[v].name);
    snprintf(arr, sizeof arr, "arr_%zu.npy", pos[v]);
    const ki_member *hit = NULL;
    for (size_t i = 0; i < nm && !hit; i++)
      if (!strcmp(m[i].name, want)) hit = &m[i];
    for (size_t i = 0; i < nm && !hit; i++)
      if (!strcmp(m[i].name, arr)) hit = &m[i];
    if (!hit)
      rc = tsr_errf(err, errlen, TSR_ENOTFOUND,
                   "%s: no array for %s (named %s, or arr_%zu in "
                   "get_weights order)", path, vars[v].name, want, pos[v]);
    else
      rc = npy_take(path, hit, &vars[v], krank[v], err, errlen);
  }
  members_free(m, nm);
  free(pos);
  free(krank);
  return rc;
}

/* ---- HDF5 ---------------------------------------------------------------*/

static int from_h5(const char *path, const char *shown, const json_t *model,
                   chief_import_var *vars, size_t n, char *err,
                   size_t errlen) {
  chief_export_var *ev = calloc(n ? n : 1, sizeof *ev);
  ek_plan *p = calloc(1, sizeof *p);
  int rc = ev && p ? 0 : TSR_ENOMEM;
  for (size_t v = 0; !rc && v < n; v++)
    ev[v] = (chief_export_var){vars[v].name, vars[v].rank, vars[v].shape,
                               vars[v].data};
  if (!rc) rc = chief__keras_plan(model, ev, n, p, err, errlen);
  if (!rc) rc = chief__h5_read(path, shown, p, err, errlen);
  if (p) chief__keras_plan_free(p);
  free(p);
  free(ev);
  return rc;
}

static bool ends(const char *s, const char *suf) {
  size_t a = strlen(s), b = strlen(suf);
  return a >= b && !strcmp(s + a - b, suf);
}

int chief_weights_load(const char *path, const json_t *model,
                       chief_import_var *vars, size_t n, char *err,
                       size_t errlen) {
  if (ends(path, ".h5") || ends(path, ".hdf5"))
    return from_h5(path, path, model, vars, n, err, errlen);
  size_t len;
  int rc;
  char e2[512];
  uint8_t *buf = (uint8_t *)tsr_read_file(path, &len, &rc, e2, sizeof e2);
  if (!buf) return tsr_errf(err, errlen, rc, "initial_weights: %s", e2);
  if (ends(path, ".npz")) {
    rc = from_npz(path, buf, len, model, vars, n, err, errlen);
  } else if (ends(path, ".keras")) {
    ki_member *m = NULL;
    size_t nm = 0;
    rc = zip_read(path, buf, len, &m, &nm, err, errlen);
    const ki_member *h = NULL;
    for (size_t i = 0; !rc && i < nm; i++)
      if (!strcmp(m[i].name, "model.weights.h5")) h = &m[i];
    if (!rc && !h)
      rc = tsr_errf(err, errlen, TSR_ENOTFOUND,
                   "%s: no model.weights.h5 in the archive", path);
    if (!rc) {
      char tmp[] = "/tmp/tsr-weights-XXXXXX";
      int fd = mkstemp(tmp);
      if (fd < 0 || write(fd, h->data, h->len) != (ssize_t)h->len)
        rc = tsr_errf(err, errlen, TSR_EIO, "%s: cannot unpack the weights",
                     path);
      if (fd >= 0) close(fd);
      if (!rc) rc = from_h5(tmp, path, model, vars, n, err, errlen);
      unlink(tmp);
    }
    if (m) members_free(m, nm);
  } else {
    rc = tsr_errf(err, errlen, TSR_EUNSUPPORTED,
                 "initial_weights %s: give an .npz, a .keras archive, a "
                 ".weights.h5 or an .h5", path);
  }
  free(buf);
  return rc;
}

int chief_initial_weights_files(const char *weights, const json_t *model,
                                const char *dir,
                                const chief_import_var *vars, size_t n,
                                char *paths, size_t plen, char *err,
                                size_t errlen) {
  chief_import_var *iv = calloc(n ? n : 1, sizeof *iv);
  if (!iv) return TSR_ENOMEM;
  int rc = 0;
  for (size_t i = 0; i < n && !rc; i++) {
    iv[i] = vars[i];
    int64_t numel = 1;
    for (int d = 0; d < vars[i].rank; d++) numel *= vars[i].shape[d];
    if (!(iv[i].data = malloc((size_t)numel * sizeof(float) + 1)))
      rc = TSR_ENOMEM;
  }
  if (!rc) rc = chief_weights_load(weights, model, iv, n, err, errlen);
  char sub[PATH_MAX], abs[PATH_MAX];
  snprintf(sub, sizeof sub, "%s/initial_weights", dir);
  if (!rc && mkdir(sub, 0777) && errno != EEXIST)
    rc = tsr_errf(err, errlen, -errno, "%s: %s", sub, strerror(errno));
  if (!rc && !realpath(sub, abs))
    rc = tsr_errf(err, errlen, -errno, "%s: %s", sub, strerror(errno));
  for (size_t i = 0; i < n && !rc; i++) {
    char *p = paths + i * plen;
    snprintf(p, plen, "%s/var-%04zu.f32", abs, i);
    int64_t numel = 1;
    for (int d = 0; d < vars[i].rank; d++) numel *= vars[i].shape[d];
    FILE *f = fopen(p, "wb");
    if (!f || fwrite(iv[i].data, sizeof(float), (size_t)numel, f) !=
                  (size_t)numel)
      rc = tsr_errf(err, errlen, TSR_EIO, "%s: cannot write", p);
    if (f && fclose(f) && !rc)
      rc = tsr_errf(err, errlen, TSR_EIO, "%s: cannot write", p);
  }
  for (size_t i = 0; i < n; i++) free(iv[i].data);
  free(iv);
  return rc;
}
