/* NumPy readers: .npy (features file + labels file) and .npz (a zip of
 * .npy members, stored or deflated).
 *
 * Happy path: read the file, check the NPY magic and header dict
 * ('descr', 'fortran_order', 'shape'), convert the little-endian values to
 * float (uint8 features stay uint8 in memory). An npz is found through its
 * zip central directory (zip64 sizes included); a deflated member is
 * inflated with zlib and its CRC-32 checked.
 * Failure modes, each naming the file (and member): bad magic or header, a
 * dtype other than little-endian float32/float64/int32/int64 or uint8
 * (dtype mismatch), Fortran order, data shorter than the shape, features
 * and labels with different row counts, a member missing from the npz.
 */
#include "worker/input_int.h"

#include "common/err.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

typedef enum { NPY_F4, NPY_F8, NPY_I4, NPY_I8, NPY_U1 } npy_dtype;

typedef struct {
  npy_dtype dtype;
  int ndim;
  int64_t shape[8];
  int64_t count;       /* product of the shape */
  const uint8_t *data;
} npy_arr;

static int64_t rd_le(const uint8_t *p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
  return (int64_t)v;
}

/* Finds 'key': in the header dict and returns the text after the colon. */
static const char *dict_value(const char *h, const char *key) {
  char pat[32];
  snprintf(pat, sizeof pat, "'%s'", key);
  const char *p = strstr(h, pat);
  if (!p) return NULL;
  p = strchr(p + strlen(pat), ':');
  if (!p) return NULL;
  p++;
  while (*p == ' ') p++;
  return p;
}

static int parse_npy(const uint8_t *p, size_t len, const char *what,
                     npy_arr *a, char *err, size_t errlen) {
  memset(a, 0, sizeof *a);
  if (len < 10 || memcmp(p, "\x93NUMPY", 6) != 0)
    return tsr_errf(err, errlen, TSR_EFORMAT,
                    "%s: not a .npy array (bad magic)", what);
  int major = p[6];
  size_t hl, ho;
  if (major == 1) {
    hl = (size_t)rd_le(p + 8, 2);
    ho = 10;
  } else if (major == 2 || major == 3) {
    if (len < 12)
      return tsr_errf(err, errlen, TSR_EFORMAT, "%s: truncated header",
                      what);
    hl = (size_t)rd_le(p + 8, 4);
    ho = 12;
  } else {
    return tsr_errf(err, errlen, TSR_EFORMAT,
                    "%s: .npy version %d is not supported", what, major);
  }
  if (ho + hl > len || hl > 65536)
    return tsr_errf(err, errlen, TSR_EFORMAT, "%s: truncated header",
                    what);
  char h[65537];
  memcpy(h, p + ho, hl);
  h[hl] = 0;
  const char *v = dict_value(h, "descr");
  if (!v || (*v != '\'' && *v != '"'))
    return tsr_errf(err, errlen, TSR_EFORMAT,
                    "%s: header has no 'descr'", what);
  char descr[16] = "";
  const char *ve = strchr(v + 1, *v);
  if (!ve || ve - v - 1 >= (long)sizeof descr)
    return tsr_errf(err, errlen, TSR_EFORMAT, "%s: bad 'descr'", what);
  memcpy(descr, v + 1, (size_t)(ve - v - 1));
  static const struct { const char *d; npy_dtype t; } dt[] = {
      {"<f4", NPY_F4}, {"<f8", NPY_F8}, {"<i4", NPY_I4}, {"<i8", NPY_I8},
      {"|u1", NPY_U1}, {"<u1", NPY_U1}, {"u1", NPY_U1}};
  size_t i;
  for (i = 0; i < sizeof dt / sizeof dt[0]; i++)
    if (strcmp(descr, dt[i].d) == 0) break;
  if (i == sizeof dt / sizeof dt[0])
    return tsr_errf(err, errlen, TSR_EDTYPE,
                    "%s: dtype '%s' is not supported (little-endian "
                    "float32 '<f4', float64 '<f8', int32 '<i4', int64 "
                    "'<i8', or uint8 '|u1')",
                    what, descr);
  a->dtype = dt[i].t;
  v = dict_value(h, "fortran_order");
  if (!v || strncmp(v, "False", 5) != 0)
    return tsr_errf(err, errlen, TSR_EUNSUPPORTED,
                    "%s: Fortran-order arrays are not supported (save "
                    "with np.ascontiguousarray)",
                    what);
  v = dict_value(h, "shape");
  if (!v || *v != '(')
    return tsr_errf(err, errlen, TSR_EFORMAT, "%s: header has no "
                    "'shape'", what);
  v++;
  a->count = 1;
  while (*v && *v != ')') {
    while (*v == ' ' || *v == ',') v++;
    if (*v == ')') break;
    char *e;
    long long x = strtoll(v, &e, 10);
    if (e == v || x < 0 || a->ndim == 8)
      return tsr_errf(err, errlen, TSR_EFORMAT, "%s: bad 'shape'",
                      what);
    a->shape[a->ndim++] = x;
    a->count *= x;
    v = e;
  }
  static const int esz[] = {4, 8, 4, 8, 1};
  size_t need = (size_t)a->count * (size_t)esz[a->dtype];
  if (len - ho - hl < need)
    return tsr_errf(err, errlen, TSR_EFORMAT,
                    "%s: data truncated (%zu bytes for a shape needing "
                    "%zu)",
                    what, len - ho - hl, need);
  a->data = p + ho + hl;
  return 0;
}

static float get_f(const npy_arr *a, int64_t i) {
  const uint8_t *p = a->data;
  switch (a->dtype) {
    case NPY_F4: { float f; memcpy(&f, p + 4 * i, 4); return f; }
    case NPY_F8: { double d; memcpy(&d, p + 8 * i, 8); return (float)d; }
    case NPY_I4: { int32_t x; memcpy(&x, p + 4 * i, 4); return (float)x; }
    case NPY_I8: { int64_t x; memcpy(&x, p + 8 * i, 8); return (float)x; }
    case NPY_U1: return (float)p[i];
  }
  return 0;
}

/* Features (N, ...) and labels (N,) or (N, 1) into a table; labels (N, C)
 * with C > 1 are one-hot rows (keras.utils.to_categorical), read as their
 * class index. */
static int to_table(const npy_arr *x, const npy_arr *y, const char *xwhat,
                    const char *ywhat, wk_table *out, char *err,
                    size_t errlen) {
  memset(out, 0, sizeof *out);
  if (x->ndim < 1)
    return tsr_errf(err, errlen, TSR_ESHAPE,
                    "%s: features must have a row axis (shape (N, "
                    "...))",
                    xwhat);
  if (y->ndim < 1 || y->ndim > 2 || (y->ndim == 2 && y->shape[1] < 1))
    return tsr_errf(err, errlen, TSR_ESHAPE,
                    "%s: labels must have shape (N,), (N, 1) or (N, C) "
                    "of one-hot rows", ywhat);
  int64_t C = y->ndim == 2 ? y->shape[1] : 1;
  if (y->shape[0] != x->shape[0])
    return tsr_errf(err, errlen, TSR_ESHAPE,
                    "%s has %lld rows but %s has %lld", xwhat,
                    (long long)x->shape[0], ywhat,
                    (long long)y->shape[0]);
  int64_t n = x->shape[0], d = n ? x->count / n : 1;
  if (n == 0)
    for (int i = 1; i < x->ndim; i++) d *= x->shape[i];
  out->n = n;
  out->d = d;
  out->y = malloc((size_t)(n ? n : 1) * sizeof(float));
  if (x->dtype == NPY_U1)
    out->xu8 = malloc((size_t)(n * d > 0 ? n * d : 1));
  else
    out->x = malloc((size_t)(n * d > 0 ? n * d : 1) * sizeof(float));
  if (!out->y || (!out->x && !out->xu8)) {
    wk_table__free(out);
    return TSR_ENOMEM;
  }
  if (out->xu8)
    memcpy(out->xu8, x->data, (size_t)(n * d));
  else if (x->dtype == NPY_F4)
    memcpy(out->x, x->data, (size_t)(n * d) * sizeof(float));
  else
    for (int64_t i = 0; i < n * d; i++) out->x[i] = get_f(x, i);
  if (C == 1) {
    for (int64_t i = 0; i < n; i++) out->y[i] = get_f(y, i);
    return 0;
  }
  for (int64_t i = 0; i < n; i++) {
    int64_t hot = -1, ones = 0;
    for (int64_t j = 0; j < C; j++) {
      double v = get_f(y, i * C + j);
      if (v == 1.0) {
        hot = j;
        ones++;
      } else if (v != 0.0) {
        ones = -1;
        break;
      }
    }
    if (ones != 1) {
      wk_table__free(out);
      return tsr_errf(err, errlen, TSR_EINVAL,
                      "%s: row %lld of the (N, %lld) labels is not "
                      "one-hot (one 1, the rest 0); soft labels are "
                      "not supported: give class indices or one-hot "
                      "rows", ywhat, (long long)i, (long long)C);
    }
    out->y[i] = (float)hot;
  }
  return 0;
}

int wk_read__npy(const char *xpath, const char *ypath, wk_table *out,
                 char *err, size_t errlen) {
  uint8_t *xb = NULL, *yb = NULL;
  size_t xl, yl;
  npy_arr x, y;
  int rc = wk_read__slurp(xpath, &xb, &xl, err, errlen);
  if (!rc) rc = wk_read__slurp(ypath, &yb, &yl, err, errlen);
  if (!rc) rc = parse_npy(xb, xl, xpath, &x, err, errlen);
  if (!rc) rc = parse_npy(yb, yl, ypath, &y, err, errlen);
  if (!rc) rc = to_table(&x, &y, xpath, ypath, out, err, errlen);
  free(xb);
  free(yb);
  return rc;
}

/* ---- npz: zip central directory ---------------------------------------- */

typedef struct {
  const uint8_t *zip;
  size_t len;
  const char *path;
} zip_file;

/* Locates member `name` (e.g. "x.npy") and returns its bytes (malloc'd). */
static int zip_member(const zip_file *z, const char *name, uint8_t **data,
                      size_t *dlen, char *err, size_t errlen) {
  const uint8_t *p = z->zip;
  size_t len = z->len;
  int64_t eocd = -1;
  for (int64_t i = (int64_t)len - 22; i >= 0 && i >= (int64_t)len - 65557; i--)
    if (rd_le(p + i, 4) == 0x06054b50) {
      eocd = i;
      break;
    }
  if (eocd < 0)
    return tsr_errf(err, errlen, TSR_EFORMAT,
                    "%s: not an .npz (no zip end-of-directory record)",
                    z->path);
  uint64_t nent = (uint64_t)rd_le(p + eocd + 10, 2);
  uint64_t cdoff = (uint64_t)rd_le(p + eocd + 16, 4);
  if (cdoff == 0xffffffffu || nent == 0xffff) { /* zip64 locator */
    if (eocd < 20 || rd_le(p + eocd - 20, 4) != 0x07064b50)
      return tsr_errf(err, errlen, TSR_EFORMAT,
                      "%s: zip64 locator missing", z->path);
    uint64_t z64 = (uint64_t)rd_le(p + eocd - 12, 8);
    if (z64 + 56 > len || rd_le(p + z64, 4) != 0x06064b50)
      return tsr_errf(err, errlen, TSR_EFORMAT,
                      "%s: bad zip64 end-of-directory record", z->path);
    nent = (uint64_t)rd_le(p + z64 + 32, 8);
    cdoff = (uint64_t)rd_le(p + z64 + 48, 8);
  }
  char names[512] = "";
  size_t nl = strlen(name);
  uint64_t off = cdoff;
  for (uint64_t e = 0; e < nent; e++) {
    if (off + 46 > len || rd_le(p + off, 4) != 0x02014b50)
      return tsr_errf(err, errlen, TSR_EFORMAT,
                      "%s: zip central directory is corrupt", z->path);
    int method = (int)rd_le(p + off + 10, 2);
    uint32_t crc = (uint32_t)rd_le(p + off + 16, 4);
    uint64_t csize = (uint64_t)rd_le(p + off + 20, 4);
    uint64_t usize = (uint64_t)rd_le(p + off + 24, 4);
    size_t fnl = (size_t)rd_le(p + off + 28, 2);
    size_t exl = (size_t)rd_le(p + off + 30, 2);
    size_t cml = (size_t)rd_le(p + off + 32, 2);
    uint64_t lho = (uint64_t)rd_le(p + off + 42, 4);
    if (off + 46 + fnl + exl > len)
      return tsr_errf(err, errlen, TSR_EFORMAT,
                      "%s: zip central directory is corrupt", z->path);
    const char *fn = (const char *)p + off + 46;
    /* zip64 extra: the 0xffffffff fields, in order */
    const uint8_t *x = p + off + 46 + fnl, *xe = x + exl;
    while (x + 4 <= xe) {
      int id = (int)rd_le(x, 2), sz = (int)rd_le(x + 2, 2);
      const uint8_t *q = x + 4;
      if (id == 1) {
        if (usize == 0xffffffffu && q + 8 <= xe) { usize = (uint64_t)rd_le(q, 8); q += 8; }
        if (csize == 0xffffffffu && q + 8 <= xe) { csize = (uint64_t)rd_le(q, 8); q += 8; }
        if (lho == 0xffffffffu && q + 8 <= xe) { lho = (uint64_t)rd_le(q, 8); }
      }
      x += 4 + sz;
    }
    size_t used = strlen(names);
    if (used + fnl + 3 < sizeof names)
      snprintf(names + used, sizeof names - used, "%s%.*s", used ? ", " : "",
               (int)fnl, fn);
    off += 46 + fnl + exl + cml;
    if (fnl != nl || memcmp(fn, name, nl) != 0) continue;

    if (lho + 30 > len || rd_le(p + lho, 4) != 0x04034b50)
      return tsr_errf(err, errlen, TSR_EFORMAT,
                      "%s: member %s: bad local header", z->path, name);
    uint64_t doff = lho + 30 + (uint64_t)rd_le(p + lho + 26, 2) +
                    (uint64_t)rd_le(p + lho + 28, 2);
    if (doff + csize > len)
      return tsr_errf(err, errlen, TSR_EFORMAT,
                      "%s: member %s is truncated", z->path, name);
    uint8_t *out = malloc(usize ? usize : 1);
    if (!out) return TSR_ENOMEM;
    if (method == 0) {
      if (csize != usize) {
        free(out);
        return tsr_errf(err, errlen, TSR_EFORMAT,
                        "%s: member %s: stored sizes differ", z->path,
                        name);
      }
      memcpy(out, p + doff, usize);
    } else if (method == 8) {
      z_stream zs = {0};
      if (inflateInit2(&zs, -15) != Z_OK) {
        free(out);
        return TSR_ENOMEM;
      }
      zs.next_in = (Bytef *)(p + doff);
      zs.avail_in = (uInt)csize;
      zs.next_out = out;
      zs.avail_out = (uInt)usize;
      int zr = inflate(&zs, Z_FINISH);
      uint64_t got = zs.total_out;
      inflateEnd(&zs);
      if (zr != Z_STREAM_END || got != usize) {
        free(out);
        return tsr_errf(err, errlen, TSR_ECORRUPT,
                        "%s: member %s: deflate data is corrupt",
                        z->path, name);
      }
    } else {
      free(out);
      return tsr_errf(err, errlen, TSR_EUNSUPPORTED,
                      "%s: member %s: zip method %d (only stored and "
                      "deflated)",
                      z->path, name, method);
    }
    if ((uint32_t)crc32(0, out, (uInt)usize) != crc) {
      free(out);
      return tsr_errf(err, errlen, TSR_ECORRUPT,
                      "%s: member %s: CRC-32 mismatch", z->path, name);
    }
    *data = out;
    *dlen = usize;
    return 0;
  }
  return tsr_errf(err, errlen, TSR_ENOTFOUND,
                  "%s: member \"%.*s\" is not in the archive "
                  "(members: %s)",
                  z->path, (int)(nl - 4), name, names);
}

int wk_read__npz(const char *path, const char *xmember, const char *ymember,
                 wk_table *out, char *err, size_t errlen) {
  uint8_t *zb = NULL, *xb = NULL, *yb = NULL;
  size_t zl = 0, xl = 0, yl = 0;
  char xn[256], yn[256], xw[512], yw[512];
  npy_arr x, y;
  snprintf(xn, sizeof xn, "%s.npy", xmember);
  snprintf(yn, sizeof yn, "%s.npy", ymember);
  snprintf(xw, sizeof xw, "%s:%s", path, xn);
  snprintf(yw, sizeof yw, "%s:%s", path, yn);
  int rc = wk_read__slurp(path, &zb, &zl, err, errlen);
  zip_file z = {zb, zl, path};
  if (!rc) rc = zip_member(&z, xn, &xb, &xl, err, errlen);
  if (!rc) rc = zip_member(&z, yn, &yb, &yl, err, errlen);
  if (!rc) rc = parse_npy(xb, xl, xw, &x, err, errlen);
  if (!rc) rc = parse_npy(yb, yl, yw, &y, err, errlen);
  if (!rc) rc = to_table(&x, &y, xw, yw, out, err, errlen);
  free(zb);
  free(xb);
  free(yb);
  return rc;
}
