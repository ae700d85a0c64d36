/* Writing a shard file (FORMAT.md).
 *
 * Happy path: the caller's emit() puts the data sections a piece at a
 * time; pieces are gathered into a 1 MiB buffer and each full buffer goes
 * to the CRCs and to the file at once (per row, a CRC call and an fwrite,
 * which locks the stream, cost more than the disk). A first pass without
 * a file computes the data CRC the header carries; the second writes
 * <file>.tmp.<pid>, which is fsynced and renamed over <file>, and the
 * folder fsynced (tsr_atomic_open / tsr_atomic_commit, common/fs.h).
 * Failure modes: a name too long, a header out of range, a second pass
 * that put other bytes than the first, a write, fsync or rename that
 * fails, a file that reads back different: each names the file, and the
 * temp file is removed.
 */
#include "common/ckpt/shardfile_int.h"
#include "common/crc32c.h"
#include "common/err.h"
#include "common/fs.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SF_BUF (1u << 20)

struct tsr_shardfile_writer {
  FILE *f;           /* NULL: the CRC-only pass */
  uint32_t crc;      /* of the data put */
  uint32_t file_crc; /* of every byte written to f */
  uint64_t put;      /* data bytes put */
  uint64_t bytes;    /* bytes written to f */
  int err;
  uint8_t *buf;      /* SF_BUF bytes, allocated on the first small piece */
  size_t n;          /* of them held */
};

/* Bytes that are part of the file; `data` counts them as data. */
static void sf_out(tsr_shardfile_writer *w, const void *p, size_t n,
                   bool data) {
  if (data) w->crc = tsr_crc32c(w->crc, p, n);
  if (!w->f) return;
  w->file_crc = tsr_crc32c(w->file_crc, p, n);
  w->bytes += n;
  if (fwrite(p, 1, n, w->f) != n && !w->err) w->err = errno ? -errno : TSR_EIO;
}

static void sf_flush(tsr_shardfile_writer *w) {
  if (w->n) sf_out(w, w->buf, w->n, true);
  w->n = 0;
}

void tsr_shardfile_put(tsr_shardfile_writer *w, const void *p, size_t n) {
  w->put += n;
  if (n > SF_BUF / 2) { /* large: straight through */
    sf_flush(w);
    sf_out(w, p, n, true);
    return;
  }
  if (!w->buf && !(w->buf = malloc(SF_BUF))) {
    if (!w->err) w->err = TSR_ENOMEM;
    return;
  }
  if (w->n + n > SF_BUF) sf_flush(w);
  memcpy(w->buf + w->n, p, n);
  w->n += n;
}

int tsr_shardfile__verify(const char *path, uint64_t bytes, uint32_t crc,
                          char *err, size_t errlen) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return tsr_errf(err, errlen, -errno, "%s: cannot read it back: %s", path,
                    strerror(errno));
  uint8_t buf[1 << 16];
  uint64_t n = 0;
  uint32_t c = 0;
  size_t r;
  while ((r = fread(buf, 1, sizeof buf, f)) > 0) {
    c = tsr_crc32c(c, buf, r);
    n += r;
  }
  int bad = ferror(f);
  fclose(f);
  if (bad)
    return tsr_errf(err, errlen, TSR_EIO, "%s: read error reading it back",
                    path);
  if (n != bytes || c != crc)
    return tsr_errf(err, errlen, TSR_ECORRUPT, "%s: reads back as %" PRIu64
                    " bytes with CRC32C %08x, written %" PRIu64 " bytes with "
                    "%08x", path, n, c, bytes, crc);
  return 0;
}

int tsr_shardfile__dest_of(const char *dir, const tsr_shardfile_hdr *h,
                           tsr_shardfile__dest *d, char *err, size_t errlen) {
  int rc = tsr_shardfile_name(h->name, h->shard, h->num_shards, d->fname,
                              sizeof d->fname);
  if (rc) return tsr_errf(err, errlen, rc, "%s: name too long", h->name);
  if (snprintf(d->path, sizeof d->path, "%s/%s", dir, d->fname) >=
      (int)sizeof d->path)
    return tsr_errf(err, errlen, TSR_ERANGE, "%s/%s: path too long", dir,
                    d->fname);
  if ((rc = tsr_shardfile_layout(h, d->secs, &d->nsec, &d->data_bytes)))
    return tsr_errf(err, errlen, rc, "%s: %" PRId64 " rows of width %" PRId64
                    " with %d slot(s) do not fit a file", d->path, h->n_rows,
                    h->width, h->nslots);
  return 0;
}

int tsr_shardfile_write(const char *dir, const tsr_shardfile_hdr *h,
                        const char *written_by,
                        void (*emit)(void *ctx, tsr_shardfile_writer *w),
                        void *ctx, bool verify, tsr_shardfile_written *out,
                        char *err, size_t errlen) {
  tsr_shardfile__dest d;
  int rc = tsr_shardfile__dest_of(dir, h, &d, err, errlen);
  if (rc) return rc;

  /* the data CRC goes in the header, so compute it first */
  tsr_shardfile_writer w = {0};
  emit(ctx, &w);
  sf_flush(&w);
  uint32_t dcrc = w.crc;
  uint64_t put = w.put;
  if (w.err || put != d.data_bytes) {
    rc = w.err ? w.err : TSR_EINVAL;
    free(w.buf);
    return tsr_errf(err, errlen, rc, "%s: %s", d.path, w.err
                    ? tsr_strerror(w.err) : "the data is not the size its "
                    "header says");
  }

  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  if ((rc = tsr_shardfile__hdr_pack(h, written_by, dcrc, &sb))) {
    msgpack_sbuffer_destroy(&sb);
    free(w.buf);
    return tsr_errf(err, errlen, rc, "%s: header out of range", d.path);
  }
  tsr_atomic_file af;
  if ((rc = tsr_atomic_open(&af, d.path, err, errlen))) {
    msgpack_sbuffer_destroy(&sb);
    free(w.buf);
    return rc;
  }
  setvbuf(af.f, NULL, _IOFBF, 1 << 20);
  uint32_t hlen = (uint32_t)sb.size, hcrc = tsr_crc32c(0, sb.data, sb.size);
  uint8_t *buf = w.buf;
  w = (tsr_shardfile_writer){.f = af.f, .buf = buf};
  sf_out(&w, TSR_SHARDFILE_MAGIC, 8, false);
  sf_out(&w, &hlen, 4, false);
  sf_out(&w, sb.data, sb.size, false);
  sf_out(&w, &hcrc, 4, false);
  msgpack_sbuffer_destroy(&sb);
  emit(ctx, &w);
  sf_flush(&w);
  free(w.buf);
  if (!w.err && (w.put != put || w.crc != dcrc))
    w.err = TSR_ECORRUPT;
  if (w.err) {
    tsr_atomic_abort(&af);
    return tsr_errf(err, errlen, w.err, "%s: write failed: %s", af.tmp,
                    w.err == TSR_ECORRUPT ? "the data changed while it was "
                    "written" : tsr_strerror(w.err));
  }
  /* flush, fsync, rename over the file, fsync the folder */
  if ((rc = tsr_atomic_commit(&af, err, errlen))) return rc;
  if (verify &&
      (rc = tsr_shardfile__verify(d.path, w.bytes, w.file_crc, err, errlen)))
    return rc;
  if (out) {
    snprintf(out->name, sizeof out->name, "%s", d.fname);
    out->bytes = w.bytes;
    out->crc32c = w.file_crc;
  }
  return 0;
}
