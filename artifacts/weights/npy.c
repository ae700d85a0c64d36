/* The streaming .npy writer of npz.h: rows appended to a temp file after a
 * header of fixed length, the header rewritten with the final row count at
 * close (numpy reads any header length that keeps the data 64-aligned, so
 * the room is the longest header the row shape can need, padded with
 * spaces). Failure modes: a row shape that no header can hold, a write
 * error (the file is left as it was, the temp file removed). */
#include "artifacts/weights/npz.h"
#include "common/err.h"
#include "common/fs.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NPY_MAX_RANK 8

struct chief_npy {
  tsr_atomic_file af;
  int64_t shape[NPY_MAX_RANK]; /* [0]: the rows, counted as they come */
  int rank;
  int64_t row_numel;
  size_t header_len;            /* magic to '\n', a multiple of 64 */
};

/* The header for w's shape in exactly `len` bytes (0: it does not fit). */
static size_t header(const chief_npy *w, const int64_t *shape, char *buf,
                     size_t len) {
  char dict[512];
  int n = snprintf(dict, sizeof dict,
                   "{'descr': '<f4', 'fortran_order': False, 'shape': (");
  for (int i = 0; i < w->rank && n > 0 && (size_t)n < sizeof dict; i++)
    n += snprintf(dict + n, sizeof dict - (size_t)n, "%" PRId64 ",%s",
                  shape[i], i + 1 < w->rank ? " " : "");
  if (n <= 0 || (size_t)n >= sizeof dict - 8) return 0;
  n += snprintf(dict + n, sizeof dict - (size_t)n, "), }");
  size_t need = 10 + (size_t)n + 1;
  if (len == 0) len = (need + 63) / 64 * 64;
  if (need > len || len - 10 > 0xffff) return 0;
  memcpy(buf, "\x93NUMPY\x01\x00", 8);
  buf[8] = (char)((len - 10) & 0xff);
  buf[9] = (char)((len - 10) >> 8);
  memcpy(buf + 10, dict, (size_t)n);
  memset(buf + 10 + n, ' ', len - need);
  buf[len - 1] = '\n';
  return len;
}

int chief_npy_open(chief_npy **out, const char *path, const int64_t *row,
                   int rank, char *err, size_t errlen) {
  *out = NULL;
  if (rank < 0 || rank + 1 > NPY_MAX_RANK)
    return tsr_errf(err, errlen, TSR_EINVAL,
                    "%s: outputs of rank %d (at most %d)", path, rank,
                    NPY_MAX_RANK - 1);
  chief_npy *w = calloc(1, sizeof *w);
  if (!w) return tsr_errf(err, errlen, TSR_ENOMEM, "out of memory");
  w->rank = rank + 1;
  w->row_numel = 1;
  for (int i = 0; i < rank; i++) {
    if (row[i] < 1) {
      free(w);
      return tsr_errf(err, errlen, TSR_EINVAL, "%s: a row of %" PRId64
                      " elements on axis %d", path, row[i], i + 1);
    }
    w->shape[i + 1] = row[i];
    w->row_numel *= row[i];
  }
  /* room for the longest row count */
  int64_t widest[NPY_MAX_RANK];
  memcpy(widest, w->shape, sizeof widest);
  widest[0] = INT64_MAX;
  char buf[1024];
  w->header_len = header(w, widest, buf, 0);
  int rc;
  if (!w->header_len) {
    free(w);
    return tsr_errf(err, errlen, TSR_EINVAL, "%s: shape too long for an "
                    ".npy header", path);
  }
  if ((rc = tsr_atomic_open(&w->af, path, err, errlen))) {
    free(w);
    return rc;
  }
  memset(buf, ' ', w->header_len); /* the real one comes at close */
  if (fwrite(buf, 1, w->header_len, w->af.f) != w->header_len) {
    chief_npy_abort(w);
    return tsr_errf(err, errlen, TSR_EIO, "%s: cannot write", path);
  }
  *out = w;
  return 0;
}

int chief_npy_append(chief_npy *w, const float *rows, int64_t n, char *err,
                     size_t errlen) {
  size_t k = (size_t)(n * w->row_numel);
  if (k && fwrite(rows, sizeof *rows, k, w->af.f) != k)
    return tsr_errf(err, errlen, TSR_EIO, "%s: cannot write", w->af.path);
  w->shape[0] += n;
  return 0;
}

int chief_npy_close(chief_npy *w, char *err, size_t errlen) {
  char buf[1024];
  int rc = 0;
  if (!header(w, w->shape, buf, w->header_len) ||
      fseek(w->af.f, 0, SEEK_SET) != 0 ||
      fwrite(buf, 1, w->header_len, w->af.f) != w->header_len) {
    rc = tsr_errf(err, errlen, TSR_EIO, "%s: cannot write its header",
                  w->af.path);
    tsr_atomic_abort(&w->af);
  } else {
    rc = tsr_atomic_commit(&w->af, err, errlen);
  }
  free(w);
  return rc;
}

void chief_npy_abort(chief_npy *w) {
  if (!w) return;
  tsr_atomic_abort(&w->af);
  free(w);
}
