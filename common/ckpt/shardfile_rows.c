/* Writing a shard file from its rows in one pass (FORMAT.md): for a
 * writer whose rows come as records (value, then each slot) and cost
 * something to fetch, such as a parameter server reading a snapshot while
 * training goes on.
 *
 * Happy path: the header goes last. Its data CRC is packed fixed-width,
 * so its length, and with it where the data starts, is known before the
 * data is written. The rows are asked for in blocks of about 256 KiB,
 * and the caller puts each block's ids, values and slots straight into
 * the sections' staging buffers (one copy of a row from wherever it
 * lives, none through a buffer of records); each section's CRC32C is
 * taken of the block just put, while it is in the cache, and about 1 MiB
 * of a section is sent with pwrite at the section's own offset; the
 * data's CRC and the file's are the sections' joined
 * (tsr_crc32c_combine), not a second pass over the rows. The staging
 * memory may be the caller's (tsr_shardfile_stage), kept warm across the
 * files of a checkpoint and across checkpoints. Then the header at
 * offset 0, fsync, rename, fsync of the folder (tsr_atomic_open /
 * tsr_atomic_commit, common/fs.h).
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

struct tsr_shardfile_stage {
  uint8_t *buf[TSR_SHARDFILE_MAX_SECTIONS]; /* aligned to SR_ALIGN */
  size_t cap;                               /* bytes of each */
};

tsr_shardfile_stage *tsr_shardfile_stage_new(void) {
  return calloc(1, sizeof(tsr_shardfile_stage));
}

static void sr_stage_clear(tsr_shardfile_stage *st) {
  for (int k = 0; k < TSR_SHARDFILE_MAX_SECTIONS; k++) {
    free(st->buf[k]);
    st->buf[k] = NULL;
  }
  st->cap = 0;
}

void tsr_shardfile_stage_free(tsr_shardfile_stage *st) {
  if (!st) return;
  sr_stage_clear(st);
  free(st);
}

/* nsec buffers of at least cap bytes each; false: out of memory (the
 * stage then holds none). */
static bool sr_stage_fit(tsr_shardfile_stage *st, int nsec, size_t cap) {
  if (st->cap < cap) sr_stage_clear(st);
  if (!st->cap) st->cap = cap;
  for (int k = 0; k < nsec; k++) {
    if (st->buf[k]) continue;
    void *p = NULL;
    if (posix_memalign(&p, SR_ALIGN, st->cap)) {
      sr_stage_clear(st);
      return false;
    }
    st->buf[k] = p;
  }
  return true;
}

typedef struct {
  int fd;         /* buffered */
  int dfd;        /* O_DIRECT on the same file; -1: none (all buffered) */
} sr_out;

/* A section being staged. buf[i] is the file's byte base + i (base is
 * aligned, so whole blocks of buf go direct from aligned memory); the
 * bytes before `start` are not the section's. */
typedef struct {
  uint64_t base;  /* the file offset buf[0] stands for (aligned) */
  size_t start;   /* where the section's bytes begin in buf (first stage) */
  size_t n;       /* bytes of buf in use, start included */
  uint64_t len;   /* the section's length */
  uint64_t put;   /* of its bytes put so far */
  uint32_t crc;   /* of its bytes so far */
  bool direct;    /* its aligned bytes go direct (SR_DIRECT_MIN) */
  uint8_t *buf;
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

/* Writes the whole blocks staged (`last`: every byte, the section's end
 * is in it). A section's first block, when it starts inside one, and its
 * last partial block go buffered, like the header: direct and buffered
 * writes never share a block. What follows the last whole block moves
 * to the front of the buffer (under a block: it stays aligned). */
static int sr_flush(sr_out *o, sr_sec *c, bool last) {
  size_t whole = c->n & ~(size_t)(SR_ALIGN - 1);
  size_t end = last ? c->n : whole;
  int rc = 0;
  if (end > c->start) {
    if (!c->direct) {
      rc = sr_pwrite(o->fd, c->buf + c->start, end - c->start,
                     c->base + c->start);
    } else {
      size_t d0 = c->start ? SR_ALIGN : 0, d1 = whole;
      if (d0 > end) d0 = end;
      if (d1 < d0) d1 = d0;
      if (d0 > c->start)
        rc = sr_pwrite(o->fd, c->buf + c->start, d0 - c->start,
                       c->base + c->start);
      if (!rc && d1 > d0)
        rc = sr_write_aligned(o, c->buf + d0, d1 - d0, c->base + d0);
      if (!rc && end > d1)
        rc = sr_pwrite(o->fd, c->buf + d1, end - d1, c->base + d1);
    }
  }
  if (rc || last || !whole) return rc;
  memmove(c->buf, c->buf + whole, c->n - whole);
  c->n -= whole;
  c->base += whole;
  c->start = 0;
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
                             void *ctx, tsr_shardfile_stage *stage,
                             bool verify, tsr_shardfile_written *out,
                             char *err, size_t errlen) {
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

  /* the sections in layout order: [ids,] value, each slot; a block puts
   * at most SR_BLOCK_BYTES of records (one row at least) */
  size_t W = (size_t)h->width, S = W * (size_t)(1 + h->nslots);
  int first_f = h->sparse ? 1 : 0;
  sr_sec sec[TSR_SHARDFILE_MAX_SECTIONS];
  memset(sec, 0, sizeof sec);
  size_t B = SR_BLOCK_BYTES / (S * sizeof(float));
  if (B < 1) B = 1;
  size_t most = B * (W * sizeof(float) > sizeof(int64_t) ? W * sizeof(float)
                                                          : sizeof(int64_t));
  /* a block's bytes of one section fit after the block kept at a flush */
  size_t cap = (most + 2 * SR_ALIGN - 1) / SR_ALIGN * SR_ALIGN;
  if (cap < SR_STAGE) cap = SR_STAGE;
  tsr_shardfile_stage own = {0}, *st = stage ? stage : &own;
  tsr_atomic_file af;
  bool open = false;
  sr_out o = {-1, -1};
  if (!sr_stage_fit(st, d.nsec, cap)) {
    rc = tsr_errf(err, errlen, TSR_ENOMEM, "%s: out of memory for the write "
                  "buffers", d.path);
    goto out;
  }
  for (int k = 0; k < d.nsec; k++) {
    uint64_t off = base + d.secs[k].offset;
    sec[k].base = off / SR_ALIGN * SR_ALIGN;
    sec[k].start = sec[k].n = (size_t)(off - sec[k].base);
    sec[k].len = d.secs[k].nbytes;
    sec[k].direct = sec[k].len >= SR_DIRECT_MIN;
    sec[k].buf = st->buf[k];
  }
  if ((rc = tsr_atomic_open(&af, d.path, err, errlen))) goto out;
  open = true;
  o.fd = fileno(af.f);
  o.dfd = sr_open_direct(af.tmp);
  uint64_t n_rows = (uint64_t)h->n_rows;
  for (uint64_t r = 0; r < n_rows && !rc; r += B) {
    size_t n = n_rows - r < B ? (size_t)(n_rows - r) : B;
    unsigned char *to[TSR_SHARDFILE_MAX_SECTIONS];
    size_t sz[TSR_SHARDFILE_MAX_SECTIONS];
    for (int k = 0; k < d.nsec && !rc; k++) {
      sr_sec *c = &sec[k];
      sz[k] = n * (k < first_f ? sizeof(int64_t) : W * sizeof(float));
      if (c->n + sz[k] > cap) rc = sr_flush(&o, c, false);
      to[k] = c->buf + c->n;
    }
    if (rc) break;
    if ((rc = rows(ctx, r, n, first_f ? to[0] : NULL, to + first_f, err,
                   errlen)))
      goto out; /* the caller's message */
    for (int k = 0; k < d.nsec; k++) {
      sr_sec *c = &sec[k];
      c->crc = tsr_crc32c(c->crc, to[k], sz[k]);
      c->n += sz[k];
      c->put += sz[k];
    }
  }
  for (int k = 0; k < d.nsec && !rc; k++) {
    if (sec[k].put != sec[k].len) rc = TSR_EINVAL; /* cannot happen */
    if (!rc) rc = sr_flush(&o, &sec[k], true);
  }
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
  if (st == &own) sr_stage_clear(&own);
  return rc;
}
