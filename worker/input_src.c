/* Sources and their shared pieces: records, the shard/split selection, the
 * in-memory table source that CSV, npy/npz and IDX load into, and reading
 * a whole (possibly gzipped) file.
 *
 * Happy path: wk_src__open() dispatches on the format; table formats load
 * every file (so row numbers and training statistics are the same on every
 * worker) and keep the row numbers of this worker's share.
 * Failure modes: a missing or unreadable file (named, with the system's
 * reason), files whose widths differ, file sharding with fewer files than
 * workers.
 */
#include "worker/input_int.h"

#include "common/err.h"
#include "common/mem.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

int wk_rec__init(wk_rec *r, int64_t n_dense, int n_sparse) {
  memset(r, 0, sizeof *r);
  r->x = calloc((size_t)(n_dense > 0 ? n_dense : 1), sizeof(float));
  r->off = calloc((size_t)n_sparse + 1, sizeof(int64_t));
  r->ids_cap = 16;
  r->ids = malloc(r->ids_cap * sizeof(int64_t));
  if (!r->x || !r->off || !r->ids) {
    wk_rec__free(r);
    return TSR_ENOMEM;
  }
  return 0;
}

void wk_rec__free(wk_rec *r) {
  free(r->x);
  free(r->ids);
  free(r->off);
  memset(r, 0, sizeof *r);
}

int wk_rec__reserve(wk_rec *r, size_t need) {
  if (need <= r->ids_cap) return 0;
  size_t cap = r->ids_cap * 2;
  while (cap < need) cap *= 2;
  int64_t *n = realloc(r->ids, cap * sizeof(int64_t));
  if (!n) return TSR_ENOMEM;
  r->ids = n;
  r->ids_cap = cap;
  return 0;
}

int wk_rec__copy(wk_rec *dst, const wk_rec *src, int64_t n_dense,
                 int n_sparse) {
  memcpy(dst->x, src->x, (size_t)n_dense * sizeof(float));
  dst->y = src->y;
  size_t n = (size_t)src->off[n_sparse];
  if (wk_rec__reserve(dst, n)) return TSR_ENOMEM;
  memcpy(dst->ids, src->ids, n * sizeof(int64_t));
  memcpy(dst->off, src->off, ((size_t)n_sparse + 1) * sizeof(int64_t));
  return 0;
}

int wk_sel__resolve(wk_sel *sel, wk_shard_policy asked, int n_files,
                    char *err, size_t errlen) {
  if (sel->W <= 1) {
    sel->policy = WK_SHARD_OFF;
    return 0;
  }
  if (asked == WK_SHARD_AUTO)
    asked = n_files >= sel->W ? WK_SHARD_FILE : WK_SHARD_DATA;
  if (asked == WK_SHARD_FILE && n_files < sel->W)
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "shard \"file\": %d files for %d workers (worker "
                    "%d would read nothing); use \"data\" or \"auto\"",
                    n_files, sel->W, sel->w);
  sel->policy = asked;
  return 0;
}

void wk_src__close(wk_src *s) {
  if (s && s->ops) s->ops->destroy(s);
}

int wk_read__slurp(const char *path, uint8_t **buf, size_t *len, char *err,
                   size_t errlen) {
  *buf = NULL;
  *len = 0;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return tsr_errf(err, errlen, -errno, "%s: %s", path,
                    strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || S_ISDIR(st.st_mode)) {
    int e = S_ISDIR(st.st_mode) ? EISDIR : errno;
    close(fd);
    return tsr_errf(err, errlen, -e, "%s: %s", path, strerror(e));
  }
  gzFile gz = gzdopen(fd, "rb");
  if (!gz) {
    close(fd);
    return tsr_errf(err, errlen, TSR_ENOMEM, "%s: cannot open", path);
  }
  gzbuffer(gz, 1 << 17);
  size_t cap = (size_t)st.st_size + 1, n = 0;
  if (cap < 4096) cap = 4096;
  uint8_t *b = malloc(cap);
  int rc = 0;
  for (;;) {
    if (!b) {
      rc = TSR_ENOMEM;
      break;
    }
    if (n == cap) {
      uint8_t *nb = realloc(b, cap * 2);
      if (!nb) {
        rc = TSR_ENOMEM;
        break;
      }
      b = nb;
      cap *= 2;
    }
    size_t want = cap - n;
    if (want > (1u << 30)) want = 1u << 30;
    int r = gzread(gz, b + n, (unsigned)want);
    if (r < 0) {
      int zerr;
      const char *m = gzerror(gz, &zerr);
      rc = tsr_errf(err, errlen, zerr == Z_ERRNO ? TSR_EIO : TSR_ECORRUPT,
                    "%s: %s", path,
                    zerr == Z_ERRNO ? strerror(errno) : m);
      break;
    }
    if (r == 0) break;
    n += (size_t)r;
  }
  gzclose(gz);
  if (rc) {
    free(b);
    if (rc == TSR_ENOMEM)
      tsr_errf(err, errlen, rc, "%s: out of memory reading it", path);
    return rc;
  }
  *buf = b;
  *len = n;
  return 0;
}

/* ---- tables ------------------------------------------------------------ */

void wk_table__free(wk_table *t) {
  if (!t) return;
  TSR_FREE_ALL(t->x, t->xu8, t->y, t->file_start);
  for (int64_t j = 0; t->names && j < t->d; j++) free(t->names[j]);
  free(t->names);
  memset(t, 0, sizeof *t);
}

int wk_table__append(wk_table *t, wk_table *part, const char *what,
                     char *err, size_t errlen) {
  int rc = 0;
  if (t->n_files == 0) {
    *t = *part;
    t->n_files = 1;
    t->file_start = malloc(2 * sizeof(int64_t));
    if (!t->file_start) return TSR_ENOMEM;
    t->file_start[0] = 0;
    t->file_start[1] = part->n;
    memset(part, 0, sizeof *part);
    return 0;
  }
  if (part->d != t->d || (!part->x) != (!t->x)) {
    rc = tsr_errf(err, errlen, TSR_ESHAPE,
                  "%s: %lld features per row, but the first file has "
                  "%lld",
                  what, (long long)part->d, (long long)t->d);
    goto out;
  }
  size_t n = (size_t)(t->n + part->n), d = (size_t)t->d;
  if (t->x) {
    float *x = realloc(t->x, (n * d > 0 ? n * d : 1) * sizeof(float));
    if (!x) { rc = TSR_ENOMEM; goto out; }
    t->x = x;
    memcpy(t->x + (size_t)t->n * d, part->x, (size_t)part->n * d * sizeof(float));
  } else {
    uint8_t *x = realloc(t->xu8, n * d > 0 ? n * d : 1);
    if (!x) { rc = TSR_ENOMEM; goto out; }
    t->xu8 = x;
    memcpy(t->xu8 + (size_t)t->n * d, part->xu8, (size_t)part->n * d);
  }
  float *y = realloc(t->y, (n ? n : 1) * sizeof(float));
  int64_t *fs = realloc(t->file_start, ((size_t)t->n_files + 2) * sizeof(int64_t));
  if (y) t->y = y;
  if (fs) t->file_start = fs;
  if (!y || !fs) { rc = TSR_ENOMEM; goto out; }
  memcpy(t->y + t->n, part->y, (size_t)part->n * sizeof(float));
  t->n = (int64_t)n;
  t->n_files++;
  t->file_start[t->n_files] = t->n;
out:
  wk_table__free(part);
  return rc;
}

typedef struct {
  wk_src base;
  wk_table t;
  /* where the rows come from, for messages (validate) */
  char **paths;           /* t.n_files paths, or NULL */
  bool csv;               /* row i of a file is its line i + 2 */
  char *label;            /* the label's column or member name, or NULL */
} wk_table_src;

static int table_get(wk_src *s, int64_t row, wk_rec *r, char *err,
                     size_t errlen) {
  wk_table *t = &((wk_table_src *)s)->t;
  int64_t d = t->d;
  if (t->x) {
    memcpy(r->x, t->x + row * d, (size_t)d * sizeof(float));
  } else {
    const uint8_t *p = t->xu8 + row * d;
    for (int64_t j = 0; j < d; j++) r->x[j] = (float)p[j];
  }
  r->y = t->y[row];
  r->off[0] = 0;
  return 0;
}

static void table_get_dense(wk_src *s, int64_t row, const float *xa,
                            const float *xb, float *restrict x, float *y) {
  wk_table *t = &((wk_table_src *)s)->t;
  int64_t d = t->d;
  if (t->x) {
    const float *restrict p = t->x + row * d;
    if (!xa)
      memcpy(x, p, (size_t)d * sizeof(float));
    else
      for (int64_t j = 0; j < d; j++) x[j] = p[j] * xa[j] + xb[j];
  } else {
    const uint8_t *restrict p = t->xu8 + row * d;
    if (!xa)
      for (int64_t j = 0; j < d; j++) x[j] = (float)p[j];
    else
      for (int64_t j = 0; j < d; j++) x[j] = (float)p[j] * xa[j] + xb[j];
  }
  *y = t->y[row];
}

static void table_prefetch(wk_src *s, int64_t row) {
  wk_table *t = &((wk_table_src *)s)->t;
  const char *p = t->x ? (const char *)(t->x + row * t->d)
                       : (const char *)(t->xu8 + row * t->d);
  size_t bytes = (size_t)t->d * (t->x ? sizeof(float) : 1);
  for (size_t o = 0; o < bytes; o += 64) __builtin_prefetch(p + o);
  __builtin_prefetch(&t->y[row]);
}

/* "FILE: line 7 (data row 5)" or "FILE: row 5" of table row r. */
static void table_where(const wk_table_src *ts, int64_t r, char *buf,
                        size_t len) {
  const wk_table *t = &ts->t;
  int f = 0;
  while (f + 1 < t->n_files && r >= t->file_start[f + 1]) f++;
  int64_t i = r - t->file_start[f];
  const char *path =
      ts->paths && ts->paths[f] ? ts->paths[f] : "the data";
  if (ts->csv)
    snprintf(buf, len, "%s: line %lld (data row %lld)", path,
             (long long)i + 2, (long long)i);
  else
    snprintf(buf, len, "%s: row %lld", path, (long long)i);
}

static int table_validate(wk_src *s, int64_t n_classes, char *err,
                          size_t errlen) {
  wk_table_src *ts = (wk_table_src *)s;
  const wk_table *t = &ts->t;
  char where[600];
  for (int64_t r = 0; r < t->n; r++) {
    for (int64_t j = 0; t->x && j < t->d; j++) {
      float v = t->x[r * t->d + j];
      if (isfinite(v)) continue;
      table_where(ts, r, where, sizeof where);
      if (t->names && t->names[j])
        return tsr_errf(err, errlen, TSR_EDATA,
                        "%s, column \"%s\": the value is %s", where,
                        t->names[j], isnan(v) ? "NaN" : "infinite");
      return tsr_errf(err, errlen, TSR_EDATA,
                      "%s, feature %lld: the value is %s", where,
                      (long long)j, isnan(v) ? "NaN" : "infinite");
    }
    float y = t->y[r];
    bool bad = !isfinite(y);
    if (!bad && n_classes > 0 &&
        (!(y >= 0 && y < (float)n_classes) || y != floorf(y)))
      bad = true;
    if (!bad) continue;
    table_where(ts, r, where, sizeof where);
    char col[200];
    if (ts->label)
      snprintf(col, sizeof col, "column \"%s\" (the label)", ts->label);
    else
      snprintf(col, sizeof col, "the label");
    if (!isfinite(y))
      return tsr_errf(err, errlen, TSR_EDATA, "%s, %s: the value is %s",
                      where, col, isnan(y) ? "NaN" : "infinite");
    return tsr_errf(err, errlen, TSR_EDATA,
                    "%s, %s: %g is not a class in [0, %lld)", where,
                    col, (double)y, (long long)n_classes);
  }
  return 0;
}

static void table_destroy(wk_src *s) {
  wk_table_src *ts = (wk_table_src *)s;
  for (int f = 0; ts->paths && f < ts->t.n_files; f++) free(ts->paths[f]);
  free(ts->paths);
  free(ts->label);
  wk_table__free(&ts->t);
  free(s->rows);
  free(ts);
}

static const wk_src_ops table_ops = {.get = table_get,
                                     .get_dense = table_get_dense,
                                     .prefetch = table_prefetch,
                                     .validate = table_validate,
                                     .destroy = table_destroy};

int wk_table__src(wk_table *t, const wk_sel *sel, wk_src **out, char *err,
                  size_t errlen) {
  wk_table_src *ts = calloc(1, sizeof *ts);
  if (!ts) {
    wk_table__free(t);
    return TSR_ENOMEM;
  }
  ts->t = *t;
  memset(t, 0, sizeof *t);
  wk_src *s = &ts->base;
  s->ops = &table_ops;
  s->n_dense = ts->t.d;
  s->dense_names = ts->t.names;
  s->best_auc = NAN;
  s->rows = malloc((size_t)(ts->t.n ? ts->t.n : 1) * sizeof(int64_t));
  if (!s->rows) {
    table_destroy(s);
    return TSR_ENOMEM;
  }
  int64_t pos = 0;
  for (int f = 0; f < ts->t.n_files; f++) {
    int64_t a = ts->t.file_start[f], b = ts->t.file_start[f + 1];
    bool mine = wk_sel__file_ok(sel, f);
    for (int64_t r = a; r < b; r++) {
      if (!wk_sel__split_ok(sel, r - a)) continue;
      if (mine && wk_sel__data_ok(sel, pos)) s->rows[s->n_rows++] = r;
      pos++;
    }
  }
  s->n_total = pos;
  s->labels_integral = true;
  s->label_max = 0;
  for (int64_t i = 0; i < ts->t.n; i++) {
    float y = ts->t.y[i];
    if (!(y >= 0) || y != floorf(y)) s->labels_integral = false;
    if (y > s->label_max) s->label_max = y;
  }
  (void)err;
  (void)errlen;
  *out = s;
  return 0;
}

/* Loads every file of a table format. */
static int open_table(const wk_input_spec *spec, const wk_sel *sel,
                      wk_src **out, char *err, size_t errlen) {
  wk_table t = {0};
  int rc = 0;
  for (int f = 0; f < spec->n_paths && !rc; f++) {
    wk_table part = {0};
    switch (spec->format) {
      case WK_FMT_CSV:
        rc = wk_read__csv(spec->paths[f], spec, &part, err, errlen);
        break;
      case WK_FMT_NPY:
        rc = wk_read__npy(spec->paths[f], spec->labels[f], &part, err, errlen);
        break;
      case WK_FMT_NPZ:
        rc = wk_read__npz(spec->paths[f], spec->features_member, spec->label,
                          &part, err, errlen);
        break;
      case WK_FMT_IDX:
        rc = wk_read__idx(spec->paths[f], spec->labels[f], &part, err, errlen);
        break;
      default:
        rc = TSR_EINVAL;
        break;
    }
    if (!rc) rc = wk_table__append(&t, &part, spec->paths[f], err, errlen);
    else wk_table__free(&part);
  }
  if (rc) {
    wk_table__free(&t);
    return rc;
  }
  int n_files = t.n_files;
  if ((rc = wk_table__src(&t, sel, out, err, errlen))) return rc;
  /* where the rows come from, for validate's messages (best effort) */
  wk_table_src *ts = (wk_table_src *)*out;
  ts->csv = spec->format == WK_FMT_CSV;
  if (spec->label) ts->label = strdup(spec->label);
  ts->paths = calloc((size_t)(n_files ? n_files : 1), sizeof *ts->paths);
  for (int f = 0; ts->paths && f < n_files && f < spec->n_paths; f++)
    ts->paths[f] = strdup(spec->paths[f]);
  return 0;
}

int wk_src__open(const wk_input_spec *spec, const wk_sel *sel, wk_src **out,
                 char *err, size_t errlen) {
  *out = NULL;
  switch (spec->format) {
    case WK_FMT_CSV:
    case WK_FMT_NPY:
    case WK_FMT_NPZ:
    case WK_FMT_IDX:
      return open_table(spec, sel, out, err, errlen);
    case WK_FMT_TFRECORD:
      return wk_read__tfrecord_src(spec, sel, out, err, errlen);
    case WK_FMT_SYNTHETIC:
    case WK_FMT_SYNTHETIC_CTR:
      return wk_synth__src(spec, sel, out, err, errlen);
  }
  return tsr_errf(err, errlen, TSR_EINVAL, "%s: unknown format",
                  spec->where);
}
