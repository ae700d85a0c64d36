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
 * check both CRCs, and decode the Example straight from the wire bytes
 * without allocating: the named dense features (float_list of a fixed
 * size), the label (float_list or int64_list of one value) and the sparse
 * features (int64_list of any length; absent means empty, as
 * tf.io.VarLenFeature) land in the record. A dense feature may also be an
 * int64_list (read as floats) or, with "decode", a bytes_list of raw
 * uint8/float32 values or a PNG/JPEG image (decode.c). The decoder accepts
 * packed and
 * unpacked repeated values, as protobuf parsers must; the unit tests check
 * it against protobuf-c's own unpacking.
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
#define TFR_PRED_MAX 256 /* map entries whose position predicts the slot */
#define TFR_BUF (256 << 10)

enum { SLOT_DENSE = 0, SLOT_LABEL, SLOT_SPARSE };

typedef struct {
  const char *name;
  size_t len;
  int kind;
  int index;        /* dense feature index or sparse feature index */
  int64_t at;       /* dense: offset in x */
  int64_t size;     /* dense: values */
  wk_decode decode; /* dense: a bytes_list and how to read it */
} tfr_slot;

typedef struct {
  wk_src base;
  const wk_input_spec *spec_ref; /* names only; the spec outlives the source */
  char **paths;
  int n_files;
  int *files;                    /* this worker's files, in order */
  int n_mine;
  bool skip_corrupt;
  wk_sel sel;
  tfr_slot *slots;
  int n_slots;
  int *table;                    /* open addressing: slot index + 1 */
  uint32_t table_mask;
  uint32_t *seen;                /* per slot: generation when last set */
  uint32_t gen;
  /* Per map entry position, the slot (+1) its key named in the last
   * record: writers emit a data set's features in one order, so the key
   * is checked against it before any hashing. */
  int pred[TFR_PRED_MAX];
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

/* The slot a map entry's key names: the one at the same position in the
 * last record when the key matches it, else by hash. */
static int lookup(const tfr_src *t, const char *p, size_t n);
static inline int lookup_at(tfr_src *t, int pos, const char *p, size_t n) {
  if (pos < TFR_PRED_MAX) {
    int s = t->pred[pos] - 1;
    if (s >= 0 && t->slots[s].len == n && memcmp(t->slots[s].name, p, n) == 0)
      return s;
  }
  int s = lookup(t, p, n);
  if (pos < TFR_PRED_MAX) t->pred[pos] = s + 1;
  return s;
}

static uint32_t hash_name(const char *p, size_t n) {
  uint32_t h = 2166136261u;
  for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)p[i]) * 16777619u;
  return h;
}

static int lookup(const tfr_src *t, const char *p, size_t n) {
  uint32_t i = hash_name(p, n) & t->table_mask;
  for (;;) {
    int s = t->table[i];
    if (!s) return -1;
    const tfr_slot *sl = &t->slots[s - 1];
    if (sl->len == n) {
      size_t k = 0;
      while (k < n && sl->name[k] == p[k]) k++;
      if (k == n) return s - 1;
    }
    i = (i + 1) & t->table_mask;
  }
}

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

/* ---- Example decoding -------------------------------------------------- */

static inline int varint(const uint8_t **p, const uint8_t *end, uint64_t *v) {
  uint64_t x = 0;
  for (int s = 0; s < 64; s += 7) {
    if (*p >= end) return -1;
    uint8_t b = *(*p)++;
    x |= (uint64_t)(b & 0x7f) << s;
    if (!(b & 0x80)) {
      *v = x;
      return 0;
    }
  }
  return -1;
}

static inline int skip_field(const uint8_t **p, const uint8_t *end, int wt) {
  uint64_t v;
  switch (wt) {
    case 0: return varint(p, end, &v);
    case 1: if (end - *p < 8) return -1; *p += 8; return 0;
    case 2:
      if (varint(p, end, &v) || v > (uint64_t)(end - *p)) return -1;
      *p += v;
      return 0;
    case 5: if (end - *p < 4) return -1; *p += 4; return 0;
  }
  return -1;
}

typedef struct {
  const char *path;
  uint64_t off;
  char *err;
  size_t errlen;
} tfr_ctx;

static const char *kind_name(int k) {
  return k == 1 ? "bytes_list" : k == 2 ? "float_list" : k == 3 ? "int64_list"
                                                                 : "no value";
}

/* Decodes one Feature's values into the record per its slot. */
static int decode_feature(tfr_src *t, const tfr_slot *sl, const uint8_t *p,
                          const uint8_t *end, wk_rec *r, const tfr_ctx *c) {
  int kind = 0;
  const uint8_t *lp = NULL, *le = NULL;
  while (p < end) {
    uint64_t tag, len;
    if (varint(&p, end, &tag)) goto malformed;
    int f = (int)(tag >> 3), wt = (int)(tag & 7);
    if (f >= 1 && f <= 3 && wt == 2) {
      if (varint(&p, end, &len) || len > (uint64_t)(end - p)) goto malformed;
      kind = f; /* oneof: the last one wins */
      lp = p;
      le = p + len;
      p += len;
    } else if (skip_field(&p, end, wt)) {
      goto malformed;
    }
  }
  if (sl->decode) {
    /* one bytes value: raw or an image */
    const uint8_t *bp = NULL;
    uint64_t bl = 0;
    int nval = 0;
    p = lp;
    while (kind == 1 && p < le) {
      uint64_t tag;
      if (varint(&p, le, &tag)) goto malformed;
      if ((tag >> 3) == 1 && (tag & 7) == 2) {
        if (varint(&p, le, &bl) || bl > (uint64_t)(le - p)) goto malformed;
        if (nval++ == 0) bp = p;
        p += bl;
      } else if (skip_field(&p, le, (int)(tag & 7))) {
        goto malformed;
      }
    }
    if (kind != 1 || nval != 1)
      return tsr_errf(c->err, c->errlen, TSR_EDTYPE,
                      "%s: record at byte offset %llu: feature \"%s\" "
                      "(decode %s) must be a bytes_list of one value; "
                      "it is a %s%s",
                      c->path, (unsigned long long)c->off, sl->name,
                      wk_decode__name(sl->decode), kind_name(kind),
                      kind == 1 ? " of several values" : "");
    if (!bp) bl = 0;
    char why[256];
    int rc = wk_decode__bytes(sl->decode, bp ? bp : lp, (size_t)bl,
                              r->x + sl->at, sl->size, why, sizeof why);
    if (rc == TSR_ENOMEM) return rc;
    if (rc)
      return tsr_errf(c->err, c->errlen, rc,
                      "%s: record at byte offset %llu: feature \"%s\": "
                      "%s", c->path, (unsigned long long)c->off,
                      sl->name, why);
    return 0;
  }
  int want = sl->kind == SLOT_SPARSE ? 3 : 2;
  if (kind != want && !(sl->kind != SLOT_SPARSE && kind == 3))
    return tsr_errf(c->err, c->errlen, TSR_EDTYPE,
                          "%s: record at byte offset %llu: feature \"%s\" is "
                          "a %s, expected %s",
                          c->path, (unsigned long long)c->off, sl->name,
                          kind_name(kind),
                          sl->kind != SLOT_SPARSE ? "a float_list or "
                                                    "int64_list (or set "
                                                    "\"decode\" for bytes)"
                                                  : kind_name(want));
  /* The usual sparse feature: one packed int64_list (tag 0x0a), ids
   * decoded in one tight loop with the capacity reserved up front (a
   * varint is at least one byte). */
  if (sl->kind == SLOT_SPARSE && kind == 3 && le - lp >= 2 && lp[0] == 0x0a) {
    const uint8_t *q = lp + 1;
    uint64_t nb;
    if (!varint(&q, le, &nb) && nb == (uint64_t)(le - q)) {
      int64_t f0 = r->off[sl->index], vocab = t->base.vocab[sl->index];
      if ((size_t)(f0 + (int64_t)nb) > r->ids_cap &&
          wk_rec__reserve(r, (size_t)(f0 + (int64_t)nb)))
        return TSR_ENOMEM;
      int64_t *ids = r->ids + f0, k = 0;
      while (q < le) {
        uint64_t v;
        if (*q < 0x80) {
          v = *q++;
        } else if (varint(&q, le, &v)) {
          goto malformed;
        }
        int64_t id = (int64_t)v;
        if (id < 0 || (vocab > 0 && id >= vocab))
          return tsr_errf(
              c->err, c->errlen, TSR_ERANGE,
              "%s: record at byte offset %llu: feature \"%s\": id %lld "
              "is outside its vocabulary [0, %lld)",
              c->path, (unsigned long long)c->off, sl->name, (long long)id,
              (long long)vocab);
        ids[k++] = id;
      }
      r->off[sl->index + 1] = f0 + k;
      return 0;
    }
  }
  /* values: field 1, packed (wire type 2) or one per tag (5 / 0) */
  int64_t cnt = 0;
  float *fx = sl->kind == SLOT_DENSE ? r->x + sl->at : NULL;
  int64_t f_at = sl->kind == SLOT_SPARSE ? r->off[sl->index] : 0;
  double label = 0;
  p = lp;
  while (p < le) {
    uint64_t tag, v;
    if (varint(&p, le, &tag)) goto malformed;
    int f = (int)(tag >> 3), wt = (int)(tag & 7);
    if (f != 1) {
      if (skip_field(&p, le, wt)) goto malformed;
      continue;
    }
    if (kind == 2 && (wt == 2 || wt == 5)) {
      uint64_t nb = 4;
      if (wt == 2 && (varint(&p, le, &nb) || nb > (uint64_t)(le - p) ||
                      nb % 4))
        goto malformed;
      if (wt == 5 && le - p < 4) goto malformed;
      int64_t k = (int64_t)(nb / 4);
      if (fx) {
        if (cnt + k <= sl->size) memcpy(fx + cnt, p, (size_t)nb);
      } else if (k > 0 && cnt == 0) {
        float fv;
        memcpy(&fv, p, 4);
        label = fv;
      }
      cnt += k;
      p += nb;
    } else if (kind == 3 && (wt == 2 || wt == 0)) {
      const uint8_t *ve = le;
      if (wt == 2) {
        uint64_t nb;
        if (varint(&p, le, &nb) || nb > (uint64_t)(le - p)) goto malformed;
        ve = p + nb;
      }
      for (bool once = wt == 0; once || p < ve; once = false) {
        if (varint(&p, ve, &v)) goto malformed;
        if (sl->kind == SLOT_SPARSE) {
          int64_t id = (int64_t)v, vocab = t->base.vocab[sl->index];
          if (id < 0 || (vocab > 0 && id >= vocab))
            return tsr_errf(
                c->err, c->errlen, TSR_ERANGE,
                "%s: record at byte offset %llu: feature \"%s\": id %lld "
                "is outside its vocabulary [0, %lld)",
                c->path, (unsigned long long)c->off, sl->name,
                (long long)id, (long long)vocab);
          if ((size_t)(f_at + cnt + 1) > r->ids_cap &&
              wk_rec__reserve(r, (size_t)(f_at + cnt + 1)))
            return TSR_ENOMEM;
          r->ids[f_at + cnt] = id;
        } else if (fx) {
          if (cnt < sl->size) fx[cnt] = (float)(int64_t)v;
        } else if (cnt == 0) {
          label = (double)(int64_t)v;
        }
        cnt++;
        if (once) break;
      }
    } else if (kind == 1) {
      if (skip_field(&p, le, wt)) goto malformed;
    } else {
      goto malformed;
    }
  }
  if (sl->kind == SLOT_DENSE && cnt != sl->size)
    return tsr_errf(c->err, c->errlen, TSR_ESHAPE,
                    "%s: record at byte offset %llu: feature \"%s\" "
                    "has %lld values, expected %lld",
                    c->path, (unsigned long long)c->off, sl->name,
                    (long long)cnt, (long long)sl->size);
  if (sl->kind == SLOT_LABEL) {
    if (cnt != 1)
      return tsr_errf(c->err, c->errlen, TSR_ESHAPE,
                      "%s: record at byte offset %llu: label \"%s\" "
                      "has %lld values, expected 1",
                      c->path, (unsigned long long)c->off, sl->name,
                      (long long)cnt);
    r->y = (float)label;
  }
  if (sl->kind == SLOT_SPARSE) r->off[sl->index + 1] = f_at + cnt;
  return 0;
malformed:
  return tsr_errf(c->err, c->errlen, TSR_EFORMAT,
                  "%s: record at byte offset %llu: malformed Example "
                  "(feature \"%s\")",
                  c->path, (unsigned long long)c->off, sl->name);
}

/* Sparse features must be decoded in order (their ids are concatenated):
 * the map may list them in any order, so their byte ranges are gathered
 * first. */
typedef struct {
  const uint8_t *p, *e;
} span;

static int decode_example(tfr_src *t, const uint8_t *p, const uint8_t *end,
                          wk_rec *r, const tfr_ctx *c) {
  int ns = t->base.n_sparse, rc;
  span sp[ns > 0 ? ns : 1];
  memset(sp, 0, sizeof sp);
  if (++t->gen == 0) {
    memset(t->seen, 0, (size_t)t->n_slots * sizeof *t->seen);
    t->gen = 1;
  }
  while (p < end) {
    uint64_t tag, len;
    if (varint(&p, end, &tag)) goto malformed;
    if (tag != ((1 << 3) | 2)) {
      if (skip_field(&p, end, (int)(tag & 7))) goto malformed;
      continue;
    }
    if (varint(&p, end, &len) || len > (uint64_t)(end - p)) goto malformed;
    const uint8_t *fe = p + len; /* Features */
    int pos = 0;                 /* map entry position */
    while (p < fe) {
      if (varint(&p, fe, &tag)) goto malformed;
      if (tag != ((1 << 3) | 2)) {
        if (skip_field(&p, fe, (int)(tag & 7))) goto malformed;
        continue;
      }
      if (varint(&p, fe, &len) || len > (uint64_t)(fe - p)) goto malformed;
      const uint8_t *me = p + len; /* map entry */
      const uint8_t *key = NULL, *val = NULL, *vend = NULL;
      uint64_t klen = 0;
      while (p < me) {
        if (varint(&p, me, &tag)) goto malformed;
        int f = (int)(tag >> 3), wt = (int)(tag & 7);
        if ((f == 1 || f == 2) && wt == 2) {
          if (varint(&p, me, &len) || len > (uint64_t)(me - p)) goto malformed;
          if (f == 1) {
            key = p;
            klen = len;
          } else {
            val = p;
            vend = p + len;
          }
          p += len;
        } else if (skip_field(&p, me, wt)) {
          goto malformed;
        }
      }
      if (!key) continue;
      int s = lookup_at(t, pos++, (const char *)key, (size_t)klen);
      if (s < 0) continue;
      const tfr_slot *sl = &t->slots[s];
      t->seen[s] = t->gen;
      if (!val) val = vend = key; /* an empty Feature */
      if (sl->kind == SLOT_SPARSE) {
        sp[sl->index].p = val;
        sp[sl->index].e = vend;
      } else if ((rc = decode_feature(t, sl, val, vend, r, c))) {
        return rc;
      }
    }
  }
  for (int i = 0; i < t->n_slots - ns; i++) { /* dense and label */
    const tfr_slot *sl = &t->slots[i];
    if (t->seen[i] != t->gen)
      return tsr_errf(c->err, c->errlen, TSR_ENOTFOUND,
                      "%s: record at byte offset %llu: feature \"%s\" "
                      "is absent from the Example",
                      c->path, (unsigned long long)c->off, sl->name);
  }
  r->off[0] = 0;
  for (int f = 0; f < ns; f++) {
    r->off[f + 1] = r->off[f];
    if (!sp[f].p) continue;
    const tfr_slot *sl = &t->slots[t->n_slots - ns + f]; /* sparse come last */
    if ((rc = decode_feature(t, sl, sp[f].p, sp[f].e, r, c))) return rc;
  }
  return 0;
malformed:
  return tsr_errf(c->err, c->errlen, TSR_EFORMAT,
                  "%s: record at byte offset %llu: malformed Example", c->path,
                  (unsigned long long)c->off);
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

static int tfr_next(wk_src *s, wk_rec *r, char *err, size_t errlen) {
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
    tfr_ctx c = {path, roff, err, errlen};
    return decode_example(t, data, data + len, r, &c);
  }
}

static void tfr_destroy(wk_src *s) {
  tfr_src *t = (tfr_src *)s;
  close_file(t);
  free(t->buf);
  free(t->zin);
  free(t->files);
  free(t->slots);
  free(t->table);
  free(t->seen);
  for (int64_t j = 0; s->dense_names && j < s->n_dense; j++)
    free(s->dense_names[j]);
  free(s->dense_names);
  free(s->sparse_names);
  free(s->vocab);
  free(t);
}

static const wk_src_ops tfr_ops = {.begin = tfr_begin,
                                   .next = tfr_next,
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
  t->n_slots = spec->n_dense + 1 + spec->n_sparse;
  t->slots = calloc((size_t)t->n_slots, sizeof *t->slots);
  t->seen = calloc((size_t)t->n_slots, sizeof *t->seen);
  uint32_t tsz = 16;
  while (tsz < (uint32_t)t->n_slots * 2) tsz *= 2;
  t->table = calloc(tsz, sizeof *t->table);
  t->table_mask = tsz - 1;
  t->files = calloc((size_t)t->n_files + 1, sizeof *t->files);
  t->cap = TFR_BUF;
  t->buf = malloc(t->cap);
  s->n_sparse = spec->n_sparse;
  s->sparse_names = calloc((size_t)spec->n_sparse + 1, sizeof(char *));
  s->vocab = calloc((size_t)spec->n_sparse + 1, sizeof(int64_t));
  if (!t->slots || !t->seen || !t->table || !t->files || !t->buf ||
      !s->sparse_names || !s->vocab)
    goto fail;
  int k = 0;
  int64_t at = 0;
  for (int i = 0; i < spec->n_dense; i++, k++) {
    t->slots[k] = (tfr_slot){spec->dense[i].name, strlen(spec->dense[i].name),
                             SLOT_DENSE, i, at, spec->dense[i].size,
                             spec->dense[i].decode};
    at += spec->dense[i].size;
  }
  s->n_dense = at;
  t->slots[k++] = (tfr_slot){spec->label, strlen(spec->label), SLOT_LABEL, 0,
                             0, 1, WK_DECODE_NONE};
  for (int i = 0; i < spec->n_sparse; i++, k++) {
    t->slots[k] = (tfr_slot){spec->sparse[i].name,
                             strlen(spec->sparse[i].name), SLOT_SPARSE, i, 0,
                             0, WK_DECODE_NONE};
    s->sparse_names[i] = spec->sparse[i].name;
    s->vocab[i] = spec->sparse[i].vocab;
  }
  for (int i = 0; i < t->n_slots; i++) {
    tfr_slot *sl = &t->slots[i];
    if (lookup(t, sl->name, sl->len) >= 0) {
      rc = tsr_errf(err, errlen, TSR_ECONFIG,
                    "%s: feature \"%s\" is named twice (features, "
                    "label, sparse_features)",
                    spec->where, sl->name);
      goto fail;
    }
    uint32_t h = hash_name(sl->name, sl->len) & t->table_mask;
    while (t->table[h]) h = (h + 1) & t->table_mask;
    t->table[h] = i + 1;
  }
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
    int64_t g = need(t, 1, t->paths[t->files[f]], err, errlen);
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
