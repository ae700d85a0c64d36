/* Writing a shard file from its rows in one pass (FORMAT.md): for a
 * writer whose rows come as records (value, then each slot) and cost
 * something to fetch, such as a parameter server reading a snapshot while
 * training goes on.
 *
 * Happy path: the header goes last. Its data CRC is packed fixed-width,
 * so its length, and with it where the data starts, is known before the
 * data is written. The rows are asked for in blocks of about 256 KiB;
 * each block is split into its sections (ids, value, each slot), each
 * section's bytes staged in 1 MiB and sent with pwrite at the section's
 * own offset, its CRC32C kept as it goes; the data's CRC and the file's
 * are the sections' joined (tsr_crc32c_combine), not a second pass over
 * the rows. Then the header at offset 0, fsync, rename, fsync of the
 * folder (tsr_atomic_open / tsr_atomic_commit, common/fs.h).
 * Failure modes: a name or header out of range, the caller's own error
 * for a block (its message kept), a write, fsync or rename that fails, a
 * file that reads back different: each names the file, and the temp file
 * is removed.
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
#include <unistd.h>

#define SR_STAGE (1u << 20)
#define SR_BLOCK_BYTES (256u << 10)

typedef struct {
  uint64_t off;   /* where the next staged bytes go (from the file's start) */
  uint64_t len;   /* the section's length */
  uint32_t crc;   /* of its bytes so far */
  uint8_t *buf;   /* SR_STAGE bytes */
  size_t n;
} sr_sec;

static int sr_pwrite(int fd, const void *p, size_t n, uint64_t off) {
  const uint8_t *b = p;
  while (n) {
    ssize_t w = pwrite(fd, b, n, (off_t)off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return w < 0 ? -errno : TSR_EIO;
    b += w;
    n -= (size_t)w;
    off += (uint64_t)w;
  }
  return 0;
}

static int sr_flush(int fd, sr_sec *c) {
  if (!c->n) return 0;
  c->crc = tsr_crc32c(c->crc, c->buf, c->n);
  int rc = sr_pwrite(fd, c->buf, c->n, c->off);
  c->off += c->n;
  c->n = 0;
  return rc;
}

static int sr_put(int fd, sr_sec *c, const void *p, size_t n) {
  const uint8_t *b = p;
  while (n) {
    size_t k = SR_STAGE - c->n < n ? SR_STAGE - c->n : n;
    memcpy(c->buf + c->n, b, k);
    c->n += k;
    b += k;
    n -= k;
    int rc = c->n == SR_STAGE ? sr_flush(fd, c) : 0;
    if (rc) return rc;
  }
  return 0;
}

int tsr_shardfile_write_rows(const char *dir, const tsr_shardfile_hdr *h,
                             const char *written_by, tsr_shardfile_rows_fn rows,
                             void *ctx, bool verify,
                             tsr_shardfile_written *out, char *err,
                             size_t errlen) {
  tsr_shardfile__dest d;
  int rc = tsr_shardfile__dest_of(dir, h, &d, err, errlen);
  if (rc) return rc;
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  if ((rc = tsr_shardfile__hdr_pack(h, written_by, 0, &sb))) {
    msgpack_sbuffer_destroy(&sb);
    return tsr_errf(err, errlen, rc, "%s: header out of range", d.path);
  }
  size_t hlen = sb.size;
  uint64_t base = 16 + (uint64_t)hlen;

  /* the sections in layout order: [ids,] value, each slot */
  size_t W = (size_t)h->width, S = W * (size_t)(1 + h->nslots);
  int ids_at = h->sparse ? 0 : -1, first_f = h->sparse ? 1 : 0;
  sr_sec sec[TSR_SHARDFILE_MAX_SECTIONS];
  memset(sec, 0, sizeof sec);
  size_t B = SR_BLOCK_BYTES / (S * sizeof(float));
  if (B < 1) B = 1;
  float *recs = malloc(B * S * sizeof(float));
  int64_t *ids = malloc(B * sizeof(int64_t));
  bool bufs = recs && ids;
  for (int k = 0; k < d.nsec && bufs; k++) {
    sec[k].off = base + d.secs[k].offset;
    sec[k].len = d.secs[k].nbytes;
    bufs = (sec[k].buf = malloc(SR_STAGE)) != NULL;
  }
  tsr_atomic_file af;
  bool open = false;
  if (!bufs) {
    rc = tsr_errf(err, errlen, TSR_ENOMEM, "%s: out of memory for the write "
                  "buffers", d.path);
    goto out;
  }
  if ((rc = tsr_atomic_open(&af, d.path, err, errlen))) goto out;
  open = true;
  int fd = fileno(af.f);
  uint64_t n_rows = (uint64_t)h->n_rows;
  for (uint64_t r = 0; r < n_rows && !rc; r += B) {
    size_t n = n_rows - r < B ? (size_t)(n_rows - r) : B;
    if ((rc = rows(ctx, r, n, h->sparse ? ids : NULL, recs, err, errlen)))
      goto out; /* the caller's message */
    if (ids_at >= 0) rc = sr_put(fd, &sec[ids_at], ids, n * sizeof(int64_t));
    for (size_t i = 0; i < n && !rc; i++)
      for (int k = first_f; k < d.nsec && !rc; k++)
        rc = sr_put(fd, &sec[k], recs + i * S + (size_t)(k - first_f) * W,
                    W * sizeof(float));
  }
  for (int k = 0; k < d.nsec && !rc; k++) rc = sr_flush(fd, &sec[k]);
  if (rc) {
    tsr_errf(err, errlen, rc, "%s: write failed: %s", af.tmp,
             tsr_strerror(rc));
    goto out;
  }
  uint32_t dcrc = d.nsec ? sec[0].crc : 0;
  for (int k = 1; k < d.nsec; k++)
    dcrc = tsr_crc32c_combine(dcrc, sec[k].crc, sec[k].len);
  msgpack_sbuffer_clear(&sb);
  if ((rc = tsr_shardfile__hdr_pack(h, written_by, dcrc, &sb)) ||
      sb.size != hlen) { /* cannot change: data_crc32c is fixed-width */
    rc = tsr_errf(err, errlen, rc ? rc : TSR_EINVAL, "%s: header out of "
                  "range", d.path);
    goto out;
  }
  uint8_t head[12];
  uint32_t hl = (uint32_t)hlen, hcrc = tsr_crc32c(0, sb.data, sb.size);
  memcpy(head, TSR_SHARDFILE_MAGIC, 8);
  memcpy(head + 8, &hl, 4);
  uint32_t fcrc = tsr_crc32c(0, head, 12);
  fcrc = tsr_crc32c(fcrc, sb.data, sb.size);
  fcrc = tsr_crc32c(fcrc, &hcrc, 4);
  fcrc = tsr_crc32c_combine(fcrc, dcrc, d.data_bytes);
  if ((rc = sr_pwrite(fd, head, 12, 0)) ||
      (rc = sr_pwrite(fd, sb.data, sb.size, 12)) ||
      (rc = sr_pwrite(fd, &hcrc, 4, 12 + hlen))) {
    tsr_errf(err, errlen, rc, "%s: write failed: %s", af.tmp,
             tsr_strerror(rc));
    goto out;
  }
  open = false;
  /* flush (nothing is staged in the stream), fsync, rename, fsync dir */
  if ((rc = tsr_atomic_commit(&af, err, errlen))) goto out;
  uint64_t bytes = base + d.data_bytes;
  if (verify && (rc = tsr_shardfile__verify(d.path, bytes, fcrc, err, errlen)))
    goto out;
  if (out) {
    snprintf(out->name, sizeof out->name, "%s", d.fname);
    out->bytes = bytes;
    out->crc32c = fcrc;
  }
out:
  if (open) tsr_atomic_abort(&af);
  msgpack_sbuffer_destroy(&sb);
  for (int k = 0; k < d.nsec; k++) free(sec[k].buf);
  free(recs);
  free(ids);
  return rc;
}
