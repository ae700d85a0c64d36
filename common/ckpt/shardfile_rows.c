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
 *
 * Why direct I/O. A buffered write copies every byte into the page cache
 * and leaves gigabytes of dirty pages for the kernel to write back and
 * reclaim; on a parameter server those bytes are the size of its model,
 * and the copy, the writeback and the reclaim take the CPU that training
 * needs while a checkpoint is written (on a 2-core VM, 1 GiB written
 * buffered cost 5.5 s of system time, with O_DIRECT 0.15 s). So the bulk
 * of each section goes through a second descriptor opened with O_DIRECT,
 * from a staging buffer aligned to SR_ALIGN and at offsets aligned to it:
 * a section starts its direct part at the first aligned offset inside it,
 * and the bytes before that (its head) and after its last aligned offset
 * (its tail), less than SR_ALIGN each, are written buffered through the
 * ordinary descriptor, like the header. The two kinds never share a
 * block. A section under SR_DIRECT_MIN goes buffered whole: a small
 * model's checkpoint is cheap to copy, and the page cache's merged
 * writeback beats a synchronous write per stage on a busy disk. Where
 * O_DIRECT is refused (tmpfs, some network file systems:
 * open or the first write fails with EINVAL) every byte goes buffered,
 * as before; the file is the same either way.
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
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SR_STAGE (1u << 20)
#define SR_BLOCK_BYTES (256u << 10)
#define SR_ALIGN 4096u /* of O_DIRECT buffers, offsets and lengths */
/* sections from this size go direct: below it the page cache's merged
 * writeback costs less than a synchronous write of each stage, which on
 * a busy disk made a small model's checkpoints several times slower */
#define SR_DIRECT_MIN (4u << 20)

typedef struct {
  int fd;         /* buffered */
  int dfd;        /* O_DIRECT on the same file; -1: none (all buffered) */
} sr_out;

typedef struct {
  uint64_t off;   /* where the staged bytes go (from the file's start) */
  uint64_t len;   /* the section's length */
  uint64_t left;  /* of its bytes not yet put */
  uint64_t head;  /* bytes still to put before its first aligned offset */
  uint32_t crc;   /* of its bytes so far */
  bool direct;    /* its aligned bytes go direct (SR_DIRECT_MIN) */
  uint8_t *buf;   /* SR_STAGE bytes, aligned to SR_ALIGN */
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

/* n bytes at off, aligned: direct where the file system takes it. A
 * direct write refused as a whole (EINVAL: the file system does not do
 * O_DIRECT after all) turns every later write buffered. */
static int sr_write_aligned(sr_out *o, const void *p, size_t n, uint64_t off) {
  if (o->dfd >= 0) {
    int rc = sr_pwrite(o->dfd, p, n, off);
    if (rc != -EINVAL) return rc;
    close(o->dfd);
    o->dfd = -1;
  }
  return sr_pwrite(o->fd, p, n, off);
}

/* Writes what is staged; `last`: the section's end is in it. Before the
 * end only whole SR_ALIGN blocks are staged (the stage is a multiple of
 * it, and starts aligned once the head is out). */
static int sr_flush(sr_out *o, sr_sec *c, bool last) {
  if (!c->n) return 0;
  c->crc = tsr_crc32c(c->crc, c->buf, c->n);
  size_t whole = c->n, rest = 0;
  int rc = 0;
  if (c->off % SR_ALIGN) /* a head, or a section too small to align */
    whole = 0, rest = c->n;
  else if (last)
    rest = c->n % SR_ALIGN, whole = c->n - rest;
  if (whole)
    rc = c->direct ? sr_write_aligned(o, c->buf, whole, c->off)
                   : sr_pwrite(o->fd, c->buf, whole, c->off);
  if (!rc && rest) rc = sr_pwrite(o->fd, c->buf + whole, rest, c->off + whole);
  c->off += c->n;
  c->n = 0;
  return rc;
}

static int sr_put(sr_out *o, sr_sec *c, const void *p, size_t n) {
  const uint8_t *b = p;
  while (n) {
    size_t room = SR_STAGE - c->n;
    if (c->head && room > c->head) room = (size_t)c->head;
    size_t k = room < n ? room : n;
    memcpy(c->buf + c->n, b, k);
    c->n += k;
    b += k;
    n -= k;
    c->left -= k;
    bool full = c->n == SR_STAGE;
    if (c->head) {
      c->head -= k;
      full = c->head == 0; /* the head goes on its own */
    }
    int rc = full || !c->left ? sr_flush(o, c, !c->left) : 0;
    if (rc) return rc;
  }
  return 0;
}

/* The O_DIRECT descriptor on the temp file; -1 where it is refused, or
 * where a page is larger than SR_ALIGN (a buffered head's page would
 * then cover blocks written direct). */
static int sr_open_direct(const char *tmp) {
#ifdef O_DIRECT
  long pg = sysconf(_SC_PAGESIZE);
  if (pg <= 0 || (unsigned long)pg > SR_ALIGN) return -1;
  return open(tmp, O_WRONLY | O_DIRECT | O_CLOEXEC);
#else
  (void)tmp;
  return -1;
#endif
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
    sec[k].len = sec[k].left = d.secs[k].nbytes;
    sec[k].direct = sec[k].len >= SR_DIRECT_MIN;
    /* up to the first aligned offset (none inside it: all of it) */
    uint64_t a = (sec[k].off + SR_ALIGN - 1) / SR_ALIGN * SR_ALIGN;
    sec[k].head = a - sec[k].off < sec[k].len ? a - sec[k].off : 0;
    void *p = NULL;
    bufs = posix_memalign(&p, SR_ALIGN, SR_STAGE) == 0;
    sec[k].buf = p;
  }
  tsr_atomic_file af;
  bool open = false;
  sr_out o = {-1, -1};
  if (!bufs) {
    rc = tsr_errf(err, errlen, TSR_ENOMEM, "%s: out of memory for the write "
                  "buffers", d.path);
    goto out;
  }
  if ((rc = tsr_atomic_open(&af, d.path, err, errlen))) goto out;
  open = true;
  o.fd = fileno(af.f);
  o.dfd = sr_open_direct(af.tmp);
  uint64_t n_rows = (uint64_t)h->n_rows;
  for (uint64_t r = 0; r < n_rows && !rc; r += B) {
    size_t n = n_rows - r < B ? (size_t)(n_rows - r) : B;
    if ((rc = rows(ctx, r, n, h->sparse ? ids : NULL, recs, err, errlen)))
      goto out; /* the caller's message */
    if (ids_at >= 0) rc = sr_put(&o, &sec[ids_at], ids, n * sizeof(int64_t));
    for (size_t i = 0; i < n && !rc; i++)
      for (int k = first_f; k < d.nsec && !rc; k++)
        rc = sr_put(&o, &sec[k], recs + i * S + (size_t)(k - first_f) * W,
                    W * sizeof(float));
  }
  for (int k = 0; k < d.nsec && !rc; k++) rc = sr_flush(&o, &sec[k], true);
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
  if ((rc = sr_pwrite(o.fd, head, 12, 0)) ||
      (rc = sr_pwrite(o.fd, sb.data, sb.size, 12)) ||
      (rc = sr_pwrite(o.fd, &hcrc, 4, 12 + hlen))) {
    tsr_errf(err, errlen, rc, "%s: write failed: %s", af.tmp,
             tsr_strerror(rc));
    goto out;
  }
  open = false;
  if (o.dfd >= 0) close(o.dfd); /* its writes are on the file already */
  o.dfd = -1;
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
  if (o.dfd >= 0) close(o.dfd);
  if (open) tsr_atomic_abort(&af);
  msgpack_sbuffer_destroy(&sb);
  for (int k = 0; k < d.nsec; k++) free(sec[k].buf);
  free(recs);
  free(ids);
  return rc;
}
