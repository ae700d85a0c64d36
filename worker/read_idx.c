/* IDX reader (the MNIST family's format: Fashion-MNIST as Debian ships it,
 * gzipped): an images file and a labels file.
 *
 * Happy path: read both files (gunzipped when they start with the gzip
 * magic), check the magic (two zero bytes, a type byte, the number of
 * dimensions), read the big-endian dimensions, keep uint8 images as uint8
 * and convert other types to float.
 * Failure modes, each naming the file: a wrong magic (with the bytes
 * found), data shorter than the dimensions say, images and labels with
 * different counts, labels with more than one dimension.
 */
#include "worker/input_int.h"

#include "common/err.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
  int type;          /* 0x08 u8, 0x09 i8, 0x0B i16, 0x0C i32, 0x0D f32, 0x0E f64 */
  int ndim;
  int64_t dims[4];
  int64_t count;
  const uint8_t *data;
} idx_arr;

static int esize(int type) {
  switch (type) {
    case 0x08: case 0x09: return 1;
    case 0x0B: return 2;
    case 0x0C: case 0x0D: return 4;
    case 0x0E: return 8;
  }
  return 0;
}

static uint64_t be(const uint8_t *p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; i++) v = (v << 8) | p[i];
  return v;
}

static int parse_idx(const uint8_t *p, size_t len, const char *path,
                     idx_arr *a, char *err, size_t errlen) {
  memset(a, 0, sizeof *a);
  if (len < 4 || p[0] != 0 || p[1] != 0 || !esize(p[2]) || p[3] < 1 ||
      p[3] > 4)
    return tsr_errf(err, errlen, TSR_EFORMAT,
                    "%s: not an IDX file (magic 0x%02x%02x%02x%02x; "
                    "expected 0x0000TTNN with type TT 08-0e and 1-4 "
                    "dimensions NN)",
                    path, len > 0 ? p[0] : 0, len > 1 ? p[1] : 0,
                    len > 2 ? p[2] : 0, len > 3 ? p[3] : 0);
  a->type = p[2];
  a->ndim = p[3];
  if (len < 4 + 4 * (size_t)a->ndim)
    return tsr_errf(err, errlen, TSR_EFORMAT,
                    "%s: header truncated", path);
  a->count = 1;
  for (int i = 0; i < a->ndim; i++) {
    a->dims[i] = (int64_t)be(p + 4 + 4 * i, 4);
    a->count *= a->dims[i];
  }
  size_t need = (size_t)a->count * (size_t)esize(a->type);
  size_t have = len - 4 - 4 * (size_t)a->ndim;
  if (have < need)
    return tsr_errf(err, errlen, TSR_EFORMAT,
                    "%s: data truncated (%zu bytes, the dimensions "
                    "need %zu)",
                    path, have, need);
  a->data = p + 4 + 4 * a->ndim;
  return 0;
}

static float idx_get(const idx_arr *a, int64_t i) {
  const uint8_t *p = a->data + i * esize(a->type);
  switch (a->type) {
    case 0x08: return (float)p[0];
    case 0x09: return (float)(int8_t)p[0];
    case 0x0B: return (float)(int16_t)be(p, 2);
    case 0x0C: return (float)(int32_t)be(p, 4);
    case 0x0D: { uint32_t u = (uint32_t)be(p, 4); float f; memcpy(&f, &u, 4); return f; }
    case 0x0E: { uint64_t u = be(p, 8); double d; memcpy(&d, &u, 8); return (float)d; }
  }
  return 0;
}

int wk_read__idx(const char *images, const char *labels, wk_table *out,
                 char *err, size_t errlen) {
  uint8_t *ib = NULL, *lb = NULL;
  size_t il = 0, ll = 0;
  idx_arr x, y;
  memset(out, 0, sizeof *out);
  int rc = wk_read__slurp(images, &ib, &il, err, errlen);
  if (!rc) rc = wk_read__slurp(labels, &lb, &ll, err, errlen);
  if (!rc) rc = parse_idx(ib, il, images, &x, err, errlen);
  if (!rc) rc = parse_idx(lb, ll, labels, &y, err, errlen);
  if (!rc && y.ndim != 1)
    rc = tsr_errf(err, errlen, TSR_ESHAPE,
                  "%s: labels must have one dimension, found %d",
                  labels, y.ndim);
  if (!rc && y.dims[0] != x.dims[0])
    rc = tsr_errf(err, errlen, TSR_ESHAPE,
                  "%s has %lld items but %s has %lld labels", images,
                  (long long)x.dims[0], labels, (long long)y.dims[0]);
  if (rc) goto out;
  int64_t n = x.dims[0], d = n ? x.count / n : 1;
  out->n = n;
  out->d = d;
  out->y = malloc((size_t)(n ? n : 1) * sizeof(float));
  if (x.type == 0x08)
    out->xu8 = malloc((size_t)(n * d > 0 ? n * d : 1));
  else
    out->x = malloc((size_t)(n * d > 0 ? n * d : 1) * sizeof(float));
  if (!out->y || (!out->x && !out->xu8)) {
    rc = TSR_ENOMEM;
    goto out;
  }
  if (out->xu8)
    memcpy(out->xu8, x.data, (size_t)(n * d));
  else
    for (int64_t i = 0; i < n * d; i++) out->x[i] = idx_get(&x, i);
  for (int64_t i = 0; i < n; i++) out->y[i] = idx_get(&y, i);
out:
  if (rc) wk_table__free(out);
  free(ib);
  free(lb);
  return rc;
}
