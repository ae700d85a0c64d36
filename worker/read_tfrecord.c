/* TFRecord reader: files of length-prefixed, CRC-checked records, each a
 * serialized tf.train.Example (proto/example.proto, TensorFlow's field
 * numbers).
 *
 * Record framing (TensorFlow's record_writer): uint64 length, uint32
 * masked CRC32C of those 8 bytes, the data, uint32 masked CRC32C of the
 * data; all little-endian. Files may be compressed (TFRecordOptions GZIP
 * or ZLIB): the gzip magic, or a zlib header where the first 12 bytes are
 * not a valid record header, is detected.
 *
 * Happy path: stream this worker's files through a large read buffer,
 * check both CRCs, and hand the record's bytes, in place, to the pipeline
 * (next_raw), which keeps copies in its shuffle buffer and has each one
 * decoded straight into its batch row (decode_raw), or decode them into a
 * wk_rec (next). The Example decoder (tfr_example.c) fills either without
 * allocating: the
 * named dense features (float_list of a fixed size), the label
 * (float_list or int64_list of one value) and the sparse features
 * (int64_list of any length; absent means empty, as tf.io.VarLenFeature).
 * A dense feature may also be an int64_list (read as floats) or, with
 * "decode", a bytes_list of raw uint8/float32 values or a PNG/JPEG image
 * (decode.c).
 * Failure modes, each naming the file and the byte offset of the record: a
 * length or data CRC mismatch, a truncated record, a malformed Example, a
 * dense feature or the label absent, a dtype mismatch (int64_list where a
 * float_list is expected or the reverse), a wrong value count, an id
 * outside its vocabulary. With skip_corrupt, CRC mismatches and truncation
 * are counted and skipped: a bad length CRC is followed by a search for
 * the next valid record header (logged with the bytes skipped), so one
 * damaged byte does not drop the rest of the file; truncation ends it.
 */
#include "worker/input_int.h"
#include "worker/tfr_example.h"

#include "common/crc32c.h"
#include "common/err.h"
#include "common/log.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#define TFR_MAX_RECORD (INT64_C(1) << 30)
#define TFR_BUF (256 << 10)

typedef struct {
  wk_src base;
  char **paths;
  int n_files;
  int *files;                    /* this worker's files, in order */
  int n_mine;
  bool skip_corrupt;
  wk_sel sel;
  wk_tfr_dec dec;                /* the Example decoder (tfr_example.c) */
  /* stream state */
  int cur;                       /* index into files */
  int fd;
  gzFile gz;
  bool zlib;                     /* a zlib stream (TFRecordOptions ZLIB) */
  bool zend;
  z_stream zs;
  uint8_t *zin;
  bool resync;                   /* searching for a valid header */
  uint64_t resync_from;
  uint8_t *buf;
  size_t cap, pos, len;
  uint64_t off;                  /* file offset of buf[pos] */
  bool eof;
  int64_t rec_in_file, pos_all;
} tfr_src;

/* ---- buffered file access --------------------------------------------- */

static void close_file(tfr_src *t) {
  if (t->gz) gzclose(t->gz);
  else if (t->fd >= 0) close(t->fd);
  if (t->zlib) inflateEnd(&t->zs);
  t->zlib = false;
  t->gz = NULL;
  t->fd = -1;
}

#define TFR_ZIN (64 << 10)

/* Reads inflated bytes of a ZLIB file; 0 at its end. */
static ssize_t zread(tfr_src *t, uint8_t *out, size_t n, const char *path,
                     char *err, size_t errlen) {
  if (t->zend) return 0;
  t->zs.next_out = out;
  t->zs.avail_out = (uInt)(n > (1u << 30) ? (1u << 30) : n);
  uInt want = t->zs.avail_out;
  while (t->zs.avail_out == want) {
    if (t->zs.avail_in == 0) {
      ssize_t r = read(t->fd, t->zin, TFR_ZIN);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0)
        return tsr_errf(err, errlen, -errno, "%s: %s", path,
                        strerror(errno));
      if (r == 0)
        return tsr_errf(err, errlen, TSR_ECORRUPT,
                        "%s: the ZLIB stream ends early", path);
      t->zs.next_in = t->zin;
      t->zs.avail_in = (uInt)r;
    }
    int zr = inflate(&t->zs, Z_NO_FLUSH);
    if (zr == Z_STREAM_END) {
      t->zend = true;
      break;
    }
    if (zr != Z_OK && zr != Z_BUF_ERROR)
      return tsr_errf(err, errlen, TSR_ECORRUPT, "%s: ZLIB: %s", path,
                      t->zs.msg ? t->zs.msg : "corrupt stream");
  }
  return (ssize_t)(want - t->zs.avail_out);
}

static int open_file(tfr_src *t, const char *path, char *err, size_t errlen) {
  close_file(t);
  t->fd = open(path, O_RDONLY | O_CLOEXEC);
  if (t->fd < 0)
    return tsr_errf(err, errlen, -errno, "%s: %s", path,
                    strerror(errno));
  uint8_t magic[12];
  ssize_t r = pread(t->fd, magic, 12, 0);
  if (r < 0) {
    int e = errno;
    close_file(t);
    return tsr_errf(err, errlen, -e, "%s: %s", path, strerror(e));
  }
  uint32_t lcrc = 0;
  if (r == 12) memcpy(&lcrc, magic + 8, 4);
  bool plain = r == 12 && tsr_crc32c_mask(tsr_crc32c(0, magic, 8)) == lcrc;
  if (!plain && r >= 2 && (magic[0] & 0x0f) == 8 &&
      ((magic[0] << 8) | magic[1]) % 31 == 0) {
    memset(&t->zs, 0, sizeof t->zs);
    if (!t->zin && !(t->zin = malloc(TFR_ZIN))) {
      close_file(t);
      return TSR_ENOMEM;
    }
    if (inflateInit(&t->zs) != Z_OK) {
      close_file(t);
      return TSR_ENOMEM;
    }
    t->zlib = true;
    t->zend = false;
  } else if (r >= 2 && magic[0] == 0x1f && magic[1] == 0x8b) {
    t->gz = gzdopen(t->fd, "rb");
    if (!t->gz) {
      close_file(t);
      return TSR_ENOMEM;
    }
    gzbuffer(t->gz, 1 << 17);
  } else {
    posix_fadvise(t->fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  }
  t->pos = t->len = 0;
  t->off = 0;
  t->eof = false;
  t->rec_in_file = 0;
  t->resync = false;
  return 0;
}

/* Makes `n` bytes contiguous at buf+pos; returns how many are there
 * (< n only at the end of the file), or a negative code. */
static int64_t need(tfr_src *t, size_t n, const char *path, char *err,
                    size_t errlen) {
  if (t->len - t->pos >= n) return (int64_t)n;
  if (t->pos > 0) {
    memmove(t->buf, t->buf + t->pos, t->len - t->pos);
    t->len -= t->pos;
    t->pos = 0;
  }
  if (n > t->cap) {
    size_t cap = t->cap;
    while (cap < n) cap *= 2;
    uint8_t *b = realloc(t->buf, cap);
    if (!b) return TSR_ENOMEM;
    t->buf = b;
    t->cap = cap;
  }
  while (t->len < n && !t->eof) {
    ssize_t r;
    if (t->zlib) {
      r = zread(t, t->buf + t->len, t->cap - t->len, path, err, errlen);
      if (r < 0) return r;
    } else if (t->gz) {
      r = gzread(t->gz, t->buf + t->len, (unsigned)(t->cap - t->len));
      if (r < 0) {
        int ze;
        const char *m = gzerror(t->gz, &ze);
        return tsr_errf(err, errlen, TSR_ECORRUPT,
                        "%s: byte offset %llu: gzip: %s", path,
                        (unsigned long long)(t->off + t->len), m);
      }
    } else {
      r = read(t->fd, t->buf + t->len, t->cap - t->len);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0)
        return tsr_errf(err, errlen, -errno, "%s: %s", path,
                        strerror(errno));
    }
    if (r == 0) t->eof = true;
    t->len += (size_t)r;
  }
  return (int64_t)(t->len - t->pos < n ? t->len - t->pos : n);
}

/* ---- the stream -------------------------------------------------------- */

static int tfr_begin(wk_src *s, char *err, size_t errlen) {
  tfr_src *t = (tfr_src *)s;
  close_file(t);
  t->cur = -1;
  t->pos_all = 0;
  return 0;
}

/* Corrupt framing: an error, or (skip_corrupt) counted and the rest of the
 * file or the record skipped. */
static int corrupt(tfr_src *t, bool end_file, int code, char *err,
                   size_t errlen) {
  if (!t->skip_corrupt) return code;
  __atomic_fetch_add(&t->base.skipped, 1, __ATOMIC_RELAXED); /* read live */
  tsr_warn("skipping a corrupt record: %s", err);
  if (err && errlen) err[0] = 0;
  if (end_file) close_file(t);
  return 0;
}

/* The next record of this reader's share whose CRCs match: its bytes in
 * place in the read buffer. */
static int tfr_next_raw(wk_src *s, wk_raw *out, char *err, size_t errlen) {
  tfr_src *t = (tfr_src *)s;
  int rc;
  for (;;) {
    if (t->fd < 0) {
      if (++t->cur >= t->n_mine) return TSR_EEOF;
      if ((rc = open_file(t, t->paths[t->files[t->cur]], err, errlen)))
        return rc;
    }
    const char *path = t->paths[t->files[t->cur]];
    uint64_t roff = t->off;
    int64_t got = need(t, 12, path, err, errlen);
    if (got < 0) return (int)got;
    if (got == 0) {
      close_file(t);
      continue;
    }
    if (got < 12) {
      rc = tsr_errf(err, errlen, TSR_ECORRUPT,
                    "%s: byte offset %llu: truncated record (the file "
                    "ends %lld bytes into the 12-byte header)",
                    path, (unsigned long long)roff, (long long)got);
      if ((rc = corrupt(t, true, rc, err, errlen))) return rc;
      continue;
    }
    const uint8_t *h = t->buf + t->pos;
    uint64_t len;
    uint32_t lcrc, dcrc;
    memcpy(&len, h, 8);
    memcpy(&lcrc, h + 8, 4);
    if (tsr_crc32c_mask(tsr_crc32c(0, h, 8)) != lcrc ||
        len > (uint64_t)TFR_MAX_RECORD) {
      if (t->resync) { /* still searching: one byte on */
        t->pos++;
        t->off++;
        continue;
      }
      rc = tsr_errf(err, errlen, TSR_ECORRUPT,
                    "%s: byte offset %llu: corrupt record (length CRC "
                    "mismatch)",
                    path, (unsigned long long)roff);
      if ((rc = corrupt(t, false, rc, err, errlen))) return rc;
      /* the framing is lost: look for the next valid header */
      t->resync = true;
      t->resync_from = roff;
      t->pos++;
      t->off++;
      continue;
    }
    if (t->resync) {
      t->resync = false;
      tsr_warn("%s: a valid record header again at byte offset %llu: %llu "
               "byte(s) skipped from offset %llu", path,
               (unsigned long long)roff,
               (unsigned long long)(roff - t->resync_from),
               (unsigned long long)t->resync_from);
    }
    got = need(t, 12 + (size_t)len + 4, path, err, errlen);
    if (got < 0) return (int)got;
    if ((uint64_t)got < 12 + len + 4) {
      rc = tsr_errf(err, errlen, TSR_ECORRUPT,
                    "%s: byte offset %llu: truncated record (%llu data "
                    "bytes announced, the file ends %lld bytes later)",
                    path, (unsigned long long)roff,
                    (unsigned long long)len, (long long)got - 12);
      if ((rc = corrupt(t, true, rc, err, errlen))) return rc;
      continue;
    }
    const uint8_t *data = t->buf + t->pos + 12;
    t->pos += 12 + (size_t)len + 4;
    t->off += 12 + len + 4;
    int64_t idx = t->rec_in_file++;
    if (!wk_sel__split_ok(&t->sel, idx)) continue;
    if (!wk_sel__data_ok(&t->sel, t->pos_all++)) continue;
    memcpy(&dcrc, data + len, 4);
    if (tsr_crc32c_mask(tsr_crc32c(0, data, (size_t)len)) != dcrc) {
      rc = tsr_errf(err, errlen, TSR_ECORRUPT,
                    "%s: byte offset %llu: corrupt record (data CRC "
                    "mismatch)",
                    path, (unsigned long long)roff);
      if ((rc = corrupt(t, false, rc, err, errlen))) return rc;
      continue;
    }
    *out = (wk_raw){data, (size_t)len, t->files[t->cur], roff};
    return 0;
  }
}

static int tfr_decode_raw(wk_src *s, const wk_raw *r, const wk_row *o,
                          char *err, size_t errlen) {
  tfr_src *t = (tfr_src *)s;
  return wk_tfr__decode_row(&t->dec, r->p, r->n, o, t->paths[r->file],
                            r->off, err, errlen);
}

static int tfr_next(wk_src *s, wk_rec *r, char *err, size_t errlen) {
  tfr_src *t = (tfr_src *)s;
  wk_raw raw;
  int rc = tfr_next_raw(s, &raw, err, errlen);
  if (rc) return rc;
  return wk_tfr__decode(&t->dec, raw.p, raw.n, r, t->paths[raw.file],
                        raw.off, err, errlen);
}

static void tfr_destroy(wk_src *s) {
  tfr_src *t = (tfr_src *)s;
  close_file(t);
  free(t->buf);
  free(t->zin);
  free(t->files);
  wk_tfr__dec_free(&t->dec);
  for (int64_t j = 0; s->dense_names && j < s->n_dense; j++)
    free(s->dense_names[j]);
  free(s->dense_names);
  free(s->sparse_names);
  free(s->vocab);
  free(t);
}

static const wk_src_ops tfr_ops = {.begin = tfr_begin,
                                   .next = tfr_next,
                                   .next_raw = tfr_next_raw,
                                   .decode_raw = tfr_decode_raw,
                                   .destroy = tfr_destroy};

int wk_read__tfrecord_src(const wk_input_spec *spec, const wk_sel *sel,
                          wk_src **out, char *err, size_t errlen) {
  tfr_src *t = calloc(1, sizeof *t);
  if (!t) return TSR_ENOMEM;
  wk_src *s = &t->base;
  s->ops = &tfr_ops;
  s->best_auc = NAN;
  s->n_total = -1;
  t->fd = -1;
  t->paths = spec->paths;
  t->n_files = spec->n_paths;
  t->skip_corrupt = spec->skip_corrupt;
  t->sel = *sel;
  int rc = TSR_ENOMEM;
  t->files = calloc((size_t)t->n_files + 1, sizeof *t->files);
  t->cap = TFR_BUF;
  t->buf = malloc(t->cap);
  s->n_sparse = spec->n_sparse;
  s->sparse_names = calloc((size_t)spec->n_sparse + 1, sizeof(char *));
  s->vocab = calloc((size_t)spec->n_sparse + 1, sizeof(int64_t));
  if (!t->files || !t->buf || !s->sparse_names || !s->vocab) goto fail;
  for (int i = 0; i < spec->n_sparse; i++) {
    s->sparse_names[i] = spec->sparse[i].name;
    s->vocab[i] = spec->sparse[i].vocab;
  }
  if ((rc = wk_tfr__dec_init(&t->dec, spec, s->vocab, err, errlen))) goto fail;
  int64_t at = t->dec.n_dense;
  s->n_dense = at;
  /* dense names: "name" or "name[j]" for multi-value features */
  s->dense_names = calloc((size_t)(at ? at : 1), sizeof(char *));
  if (!s->dense_names) goto fail;
  for (int i = 0, j = 0; i < spec->n_dense; i++)
    for (int64_t v = 0; v < spec->dense[i].size; v++, j++) {
      char b[300];
      if (spec->dense[i].size == 1)
        snprintf(b, sizeof b, "%s", spec->dense[i].name);
      else
        snprintf(b, sizeof b, "%s[%lld]", spec->dense[i].name, (long long)v);
      if (!(s->dense_names[j] = strdup(b))) goto fail;
    }
  for (int f = 0; f < t->n_files; f++)
    if (wk_sel__file_ok(sel, f)) t->files[t->n_mine++] = f;
  /* fail early on a missing or unreadable file */
  for (int f = 0; f < t->n_mine; f++) {
    if ((rc = open_file(t, t->paths[t->files[f]], err, errlen))) goto fail;
    int64_t g = need(t, 12, t->paths[t->files[f]], err, errlen);
    if (g == 12 && !s->raw_bytes) { /* the first record's size */
      uint64_t len;
      memcpy(&len, t->buf + t->pos, 8);
      if (len <= (uint64_t)TFR_MAX_RECORD) s->raw_bytes = (int64_t)len;
    }
    close_file(t);
    if (g < 0) {
      rc = (int)g;
      goto fail;
    }
  }
  t->cur = -1;
  *out = s;
  return 0;
fail:
  tfr_destroy(s);
  if (rc == TSR_ENOMEM)
    tsr_errf(err, errlen, rc, "%s: out of memory", spec->where);
  return rc;
}
