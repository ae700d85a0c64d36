/* Reading a shard file: one part checked whole (FORMAT.md).
 *
 * Happy path: the file is mapped, its magic, header CRC and header
 * (shardfile_hdr.c) checked, its size against the sections the header
 * implies, then its data CRC and the ids of a sparse part.
 * Failure modes, each refused with a message naming the file: shorter or
 * longer than its header says, a bad magic or CRC (header or data), a
 * header field of the wrong type or out of range, sizes whose products
 * overflow (a huge n_rows does not wrap to a small size), ids outside the
 * part's rows or of another shard. Every check comes before the caller
 * reads a byte of data.
 *
 * Resident memory. A mapped file's pages that a pass has touched count
 * in the reader's resident memory until they are unmapped: checking and
 * then restoring a 2 GB shard held the whole file resident beside the
 * shard built from it. A file opened with tsr_shardfile_open is checked
 * a piece at a time (SF_DROP bytes) and each piece's pages are released
 * behind the check (MADV_DONTNEED: they stay in the page cache, and a
 * later touch maps them again); the caller copying out of the map
 * releases behind itself with tsr_shardfile_drop. tsr_shardfile_parse on
 * a caller's buffer releases nothing.
 */
#include "common/ckpt/shardfile_int.h"
#include "common/crc32c.h"
#include "common/err.h"

#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define SF_DROP (8u << 20) /* bytes checked between releases */

/* Releases the whole pages inside [p, p+n) of a mapping. */
static void sf_drop(const void *p, size_t n) {
  uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
  uintptr_t a = ((uintptr_t)p + pg - 1) / pg * pg,
            e = ((uintptr_t)p + n) / pg * pg;
  if (e > a) madvise((void *)a, e - a, MADV_DONTNEED);
}

/* Releases [from, to) of b when `drop` (a mapped file); returns `to`. */
static uint64_t sf_behind(bool drop, const uint8_t *b, uint64_t from,
                          uint64_t to) {
  if (drop && to > from) sf_drop(b + from, (size_t)(to - from));
  return to;
}

void tsr_shardfile_drop(const tsr_shardfile *f, const void *p, size_t n) {
  const uint8_t *m = f->map, *q = p;
  if (!m || n == 0 || q < m || q > m + f->size || n > (size_t)(m + f->size - q))
    return; /* not inside the map */
  sf_drop(p, n);
}

/* Each id of a sparse part belongs to the part. */
static int sf_ids(const tsr_shardfile_part *p, bool drop, const char *path,
                  char *err, size_t errlen) {
  const tsr_shardfile_hdr *h = &p->h;
  const uint8_t *b = p->data + p->off_ids;
  uint64_t done = 0;
  for (int64_t r = 0; h->sparse && r < h->n_rows; r++) {
    if ((uint64_t)r * 8 - done >= SF_DROP)
      done = sf_behind(drop, b, done, (uint64_t)r * 8);
    int64_t id;
    memcpy(&id, p->data + p->off_ids + (size_t)r * 8, 8);
    bool in = h->bounded ? id >= h->row0 && id - h->row0 < h->rows
                         : id >= 0 && id % h->num_shards == h->shard;
    if (!in)
      return tsr_errf(err, errlen, TSR_EFORMAT, "%s: row id %" PRId64 " (row %"
                      PRId64 ") does not belong to part %d of %d", path, id, r,
                      h->shard, h->num_shards);
  }
  if (h->sparse) sf_behind(drop, b, done, (uint64_t)h->n_rows * 8);
  return 0;
}

/* Slots that hold a sum of squares or a maximum of magnitudes: Adagrad's
 * and FTRL's accumulator, Adam's (AdamW's, Nadam's) v, Adamax's u,
 * RMSprop's velocity. Training never makes them negative. */
static bool sf_nonneg_slot(const char *name) {
  static const char *const names[] = {"accumulator", "v", "u", "velocity"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (!strcmp(name, names[i])) return true;
  return false;
}

/* One float32 section: every value finite (and >= 0 when `nonneg`). A
 * quick pass first; the first bad value is found only for the message. */
static int sf_floats(const uint8_t *b, uint64_t n, int64_t width, bool nonneg,
                     bool drop, const char *sec, const char *path, char *err,
                     size_t errlen) {
  int bad = 0;
  uint64_t done = 0;
  for (uint64_t i = 0; i < n; i++) {
    float x;
    memcpy(&x, b + i * 4, 4);
    bad |= (fabsf(x) <= FLT_MAX ? 0 : 1) | (nonneg && !(x >= 0.0f) ? 1 : 0);
    if (i * 4 - done >= SF_DROP) done = sf_behind(drop, b, done, i * 4);
  }
  sf_behind(drop, b, done, n * 4);
  if (!bad) return 0;
  for (uint64_t i = 0; i < n; i++) {
    float x;
    memcpy(&x, b + i * 4, 4);
    if (fabsf(x) <= FLT_MAX && (!nonneg || x >= 0.0f)) continue;
    const char *what = isnan(x) ? "NaN" : isinf(x) ? "an infinity"
                                                    : "a negative value";
    return tsr_errf(err, errlen, TSR_EFORMAT, "%s: section \"%s\" holds %s "
                    "(%g, row %" PRIu64 ", element %" PRIu64 "), which "
                    "training never leaves there", path, sec, what, (double)x,
                    i / (uint64_t)width, i % (uint64_t)width);
  }
  return 0;
}

/* Values training can leave: finite weights and slots, no negative sum
 * of squares. */
static int sf_values(const tsr_shardfile_part *p, bool drop, const char *path,
                     char *err, size_t errlen) {
  const tsr_shardfile_hdr *h = &p->h;
  uint64_t n = (uint64_t)h->n_rows * (uint64_t)h->width; /* layout-checked */
  int rc = sf_floats(p->data + p->off_value, n, h->width, false, drop,
                     "value", path, err, errlen);
  for (int k = 0; !rc && k < h->nslots; k++) {
    char sec[8 + TSR_SHARDFILE_SLOT_MAX];
    snprintf(sec, sizeof sec, "slot/%s", h->slots[k]);
    rc = sf_floats(p->data + p->off_slot[k], n, h->width,
                   sf_nonneg_slot(h->slots[k]), drop, sec, path, err, errlen);
  }
  return rc;
}

/* The sections' offsets (from the header alone) and the file's size. */
static int sf_sections(tsr_shardfile_part *p, const char *path,
                       uint64_t data_bytes, size_t size, uint64_t base,
                       char *err, size_t errlen) {
  const tsr_shardfile_hdr *h = &p->h;
  tsr_shardfile_section secs[TSR_SHARDFILE_MAX_SECTIONS];
  int nsec;
  uint64_t want;
  int rc = tsr_shardfile__layout_read(h, path, secs, &nsec, &want, err,
                                      errlen);
  if (rc) return rc;
  if (data_bytes != want)
    return tsr_errf(err, errlen, TSR_EFORMAT, "%s: data_bytes %" PRIu64 " does "
                    "not match the header's rows and slots (%" PRIu64 ")", path,
                    data_bytes, want);
  if (want > size || base + want != size)
    return tsr_errf(err, errlen, TSR_ECORRUPT, "%s: truncated or padded: %zu "
                    "bytes, the header says %" PRIu64, path, size,
                    want > size ? want : base + want);
  int k = 0;
  if (h->sparse) p->off_ids = secs[k++].offset;
  p->off_value = secs[k++].offset;
  for (int s = 0; s < h->nslots; s++) p->off_slot[s] = secs[k++].offset;
  p->data_bytes = want;
  return 0;
}

/* The data's CRC32C, a piece at a time. */
static uint32_t sf_data_crc(const uint8_t *d, uint64_t n, bool drop) {
  uint32_t c = 0;
  for (uint64_t at = 0; at < n; at += SF_DROP) {
    size_t k = n - at < SF_DROP ? (size_t)(n - at) : SF_DROP;
    c = tsr_crc32c(c, d + at, k);
    sf_behind(drop, d, at, at + k);
  }
  return c;
}

/* The header of the file b holds (its first 16 + hlen bytes at least;
 * the file is `size` bytes): magic, header CRC, fields, sections against
 * the size. *crc gets the data CRC it names. */
static int sf_header(const char *path, const uint8_t *b, size_t size,
                     tsr_shardfile_part *p, uint32_t *crc, char *err,
                     size_t errlen) {
  memset(p, 0, sizeof *p);
  if (size < 16)
    return tsr_errf(err, errlen, TSR_ECORRUPT, "%s: truncated (%zu bytes, no "
                    "header)", path, size);
  if (memcmp(b, TSR_SHARDFILE_MAGIC, 8))
    return tsr_errf(err, errlen, TSR_EFORMAT, "%s: not a tessera shard file "
                    "(bad magic)", path);
  uint32_t hlen, hcrc;
  memcpy(&hlen, b + 8, 4);
  if ((uint64_t)hlen + 16 > size)
    return tsr_errf(err, errlen, TSR_ECORRUPT, "%s: truncated (header of %u "
                    "bytes, file of %zu)", path, hlen, size);
  memcpy(&hcrc, b + 12 + hlen, 4);
  if (tsr_crc32c(0, b + 12, hlen) != hcrc)
    return tsr_errf(err, errlen, TSR_ECORRUPT, "%s: header CRC32C mismatch",
                    path);
  msgpack_unpacked up;
  msgpack_unpacked_init(&up);
  int rc = 0;
  uint64_t data_bytes;
  if (msgpack_unpack_next(&up, (const char *)b + 12, hlen, NULL) !=
      MSGPACK_UNPACK_SUCCESS) {
    rc = tsr_errf(err, errlen, TSR_EFORMAT, "%s: header is not msgpack", path);
    goto out;
  }
  if (!(rc = tsr_shardfile__hdr_unpack(&up.data, path, &p->h, &data_bytes,
                                       crc, err, errlen)))
    rc = sf_sections(p, path, data_bytes, size, 16 + (uint64_t)hlen, err,
                     errlen);
out:
  msgpack_unpacked_destroy(&up);
  return rc;
}

/* tsr_shardfile_parse; `drop`: b is a mapped file, released behind. */
static int sf_parse(const char *path, const uint8_t *b, size_t size,
                    tsr_shardfile_part *p, bool drop, char *err,
                    size_t errlen) {
  uint32_t crc;
  int rc = sf_header(path, b, size, p, &crc, err, errlen);
  if (rc) return rc;
  uint32_t hlen;
  memcpy(&hlen, b + 8, 4);
  p->data = b + 16 + hlen;
  if (sf_data_crc(p->data, p->data_bytes, drop) != crc)
    return tsr_errf(err, errlen, TSR_ECORRUPT, "%s: data CRC32C mismatch "
                    "(file damaged)", path);
  if (!(rc = sf_ids(p, drop, path, err, errlen)))
    rc = sf_values(p, drop, path, err, errlen);
  return rc;
}

int tsr_shardfile_parse(const char *path, const uint8_t *b, size_t size,
                        tsr_shardfile_part *p, char *err, size_t errlen) {
  return sf_parse(path, b, size, p, false, err, errlen);
}

/* ---- files ----------------------------------------------------------------*/

void tsr_shardfile_close(tsr_shardfile *f) {
  if (f->map) munmap(f->map, f->size);
  f->map = NULL;
}

static const char *sf_kind(mode_t m) {
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  if (S_ISDIR(m)) return "a folder";
  return "not a plain file";
}

/* Opens `path` for reading only when it is a regular file of 16 bytes or
 * more (its size in *size): the descriptor, or a negative code. */
static int sf_open_regular(const char *path, size_t *size, char *err,
                           size_t errlen) {
  /* O_NOFOLLOW: a link is not followed out of the folder; O_NONBLOCK: the
   * open of a FIFO does not wait for a writer (it is refused below) */
  int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0 && errno == ELOOP)
    return tsr_errf(err, errlen, TSR_EFORMAT, "%s: a symbolic link: shard "
                    "files are read only as regular files", path);
  if (fd < 0)
    return tsr_errf(err, errlen, -errno, "%s: cannot open: %s", path,
                    strerror(errno));
  struct stat st;
  if (fstat(fd, &st)) {
    int e = errno;
    close(fd);
    return tsr_errf(err, errlen, -e, "%s: cannot stat: %s", path,
                    strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return tsr_errf(err, errlen, TSR_EFORMAT, "%s: %s, not a regular file: "
                    "shard files are read only as regular files", path,
                    sf_kind(st.st_mode));
  }
  *size = (size_t)st.st_size;
  if (*size < 16) {
    close(fd);
    return tsr_errf(err, errlen, TSR_ECORRUPT, "%s: truncated (%zu bytes, no "
                    "header)", path, *size);
  }
  return fd;
}

int tsr_shardfile_map(tsr_shardfile *f, const char *path, char *err,
                      size_t errlen) {
  memset(f, 0, sizeof *f);
  int n = snprintf(f->path, sizeof f->path, "%s", path);
  if (n < 0 || (size_t)n >= sizeof f->path)
    return tsr_errf(err, errlen, TSR_ERANGE, "%.200s...: path too long",
                    path);
  int fd = sf_open_regular(path, &f->size, err, errlen);
  if (fd < 0) return fd;
  f->map = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
  int e = errno;
  close(fd);
  if (f->map == MAP_FAILED) {
    f->map = NULL;
    return tsr_errf(err, errlen, -e, "%s: mmap failed: %s", path,
                    strerror(e));
  }
  return 0;
}

int tsr_shardfile_open(tsr_shardfile *f, const char *path, char *err,
                       size_t errlen) {
  int rc = tsr_shardfile_map(f, path, err, errlen);
  if (!rc) rc = sf_parse(f->path, f->map, f->size, &f->p, true, err, errlen);
  if (rc) tsr_shardfile_close(f);
  return rc;
}

/* ---- a file checked as it is read ---------------------------------------- */

#define SF_PIECE (4u << 20) /* read at a time */
#define SR_READ_ALIGN 4096u /* of direct reads' memory and offsets */
#define SF_CARRY 8u         /* bytes kept before a piece: an element begun in
                               the last one (ids are 8 bytes, floats 4) */

/* A section's elements still to check: the file offsets of the next one
 * and of the section's end. */
typedef struct {
  uint64_t at, start, end;
  unsigned es;        /* 8: ids; 4: floats */
  bool nonneg;
  char name[8 + TSR_SHARDFILE_SLOT_MAX];
} sf_run;

/* The elements of r that end inside [p0, p1), at memory m (m stands for
 * file offset p0; up to SF_CARRY bytes before it are the last piece's).
 * The first bad one's message in err; 0 or its code. */
static int sf_run_check(sf_run *r, const tsr_shardfile_hdr *h, uint64_t p0,
                        uint64_t p1, const uint8_t *m, const char *path,
                        char *err, size_t errlen) {
  uint64_t to = p1 < r->end ? p1 : r->end;
  if (r->at + r->es > to) return 0;
  uint64_t n = (to - r->at) / r->es;
  const uint8_t *q = m + r->at - p0; /* r->at >= p0 - SF_CARRY */
  uint64_t first = (r->at - r->start) / r->es;
  r->at += n * r->es;
  if (r->es == 8) {
    for (uint64_t i = 0; i < n; i++) {
      int64_t id;
      memcpy(&id, q + i * 8, 8);
      bool in = h->bounded ? id >= h->row0 && id - h->row0 < h->rows
                           : id >= 0 && id % h->num_shards == h->shard;
      if (!in)
        return tsr_errf(err, errlen, TSR_EFORMAT, "%s: row id %" PRId64
                        " (row %" PRIu64 ") does not belong to part %d of %d",
                        path, id, first + i, h->shard, h->num_shards);
    }
    return 0;
  }
  /* the quick pass on the bits, two floats a word: an exponent of all
   * ones (infinite, NaN) carries into the lane's top bit when its lowest
   * bit is added; a sign bit on anything but -0 is negative */
  const uint64_t EXP = 0x7f8000007f800000ull, ONE = 0x0080000000800000ull,
                 TOP = 0x8000000080000000ull, MAG = 0x7fffffff7fffffffull;
  uint64_t acc = 0, i = 0;
  for (; i + 2 <= n; i += 2) {
    uint64_t w;
    memcpy(&w, q + i * 4, 8);
    acc |= (w & EXP) + ONE;
    if (r->nonneg) acc |= w & ((w & MAG) + MAG);
  }
  for (; i < n; i++) {
    uint32_t w;
    memcpy(&w, q + i * 4, 4);
    acc |= (uint64_t)((w & 0x7f800000u) + 0x00800000u);
    if (r->nonneg) acc |= (uint64_t)(w & ((w & 0x7fffffffu) + 0x7fffffffu));
  }
  bool bad = (acc & TOP) != 0;
  for (i = 0; bad && i < n; i++) {
    float x;
    memcpy(&x, q + i * 4, 4);
    if (fabsf(x) <= FLT_MAX && (!r->nonneg || x >= 0.0f)) continue;
    const char *what = isnan(x) ? "NaN" : isinf(x) ? "an infinity"
                                                    : "a negative value";
    uint64_t e = first + i;
    return tsr_errf(err, errlen, TSR_EFORMAT, "%s: section \"%s\" holds %s "
                    "(%g, row %" PRIu64 ", element %" PRIu64 "), which "
                    "training never leaves there", path, r->name, what,
                    (double)x, e / (uint64_t)h->width, e % (uint64_t)h->width);
  }
  return 0;
}

/* n bytes at off, all of them (short only at the file's end). */
static ssize_t sf_pread(int fd, uint8_t *b, size_t n, uint64_t off) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = pread(fd, b + got, n - got, (off_t)(off + got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return got ? (ssize_t)got : -errno;
    if (r == 0) break;
    got += (size_t)r;
  }
  return (ssize_t)got;
}

/* The header of the file on fd, read and checked as sf_header does. */
static int sf_read_header(int fd, const char *path, size_t size,
                          tsr_shardfile_part *p, uint32_t *crc, char *err,
                          size_t errlen) {
  uint8_t head[12];
  if (sf_pread(fd, head, 12, 0) != 12)
    return tsr_errf(err, errlen, TSR_EIO, "%s: cannot read its header", path);
  uint32_t hlen;
  memcpy(&hlen, head + 8, 4);
  if (memcmp(head, TSR_SHARDFILE_MAGIC, 8))
    return tsr_errf(err, errlen, TSR_EFORMAT, "%s: not a tessera shard file "
                    "(bad magic)", path);
  if ((uint64_t)hlen + 16 > size)
    return tsr_errf(err, errlen, TSR_ECORRUPT, "%s: truncated (header of %u "
                    "bytes, file of %zu)", path, hlen, size);
  uint8_t *b = malloc(16 + (size_t)hlen);
  if (!b) return tsr_errf(err, errlen, TSR_ENOMEM, "%s: out of memory for "
                          "its header of %u bytes", path, hlen);
  int rc = sf_pread(fd, b, 16 + (size_t)hlen, 0) == (ssize_t)(16 + hlen)
               ? sf_header(path, b, size, p, crc, err, errlen)
               : tsr_errf(err, errlen, TSR_EIO, "%s: cannot read its header",
                          path);
  free(b);
  return rc;
}

int tsr_shardfile_check(const char *path, uint64_t bytes, uint32_t crc,
                        tsr_shardfile_hdr *h, char *err, size_t errlen) {
  size_t size;
  int fd = sf_open_regular(path, &size, err, errlen);
  if (fd < 0) return fd;
  int rc = 0;
  uint8_t *mem = NULL;
  if (size != bytes) {
    rc = tsr_errf(err, errlen, TSR_ECORRUPT, "%s: %zu bytes, written %"
                  PRIu64, path, size, bytes);
    goto out;
  }
  /* the header first; its error is told only if the file is the one
   * written (a damaged file is named as damaged) */
  tsr_shardfile_part p;
  uint32_t dcrc_want = 0, fcrc, hcrc = 0, dcrc = 0;
  char hmsg[512] = "", emsg[512] = "";
  int hrc = sf_read_header(fd, path, size, &p, &dcrc_want, hmsg, sizeof hmsg);
  int erc = 0;
  sf_run run[TSR_SHARDFILE_MAX_SECTIONS];
  int nrun = 0;
  uint64_t d0 = size - (hrc ? 0 : p.data_bytes); /* the data's start */
  if (!hrc) {
    const tsr_shardfile_hdr *ph = &p.h;
    uint64_t width = (uint64_t)ph->width, n = (uint64_t)ph->n_rows;
    if (ph->sparse)
      run[nrun++] = (sf_run){d0 + p.off_ids, d0 + p.off_ids,
                             d0 + p.off_ids + n * 8, 8, false, "ids"};
    run[nrun++] = (sf_run){d0 + p.off_value, d0 + p.off_value,
                           d0 + p.off_value + n * width * 4, 4, false,
                           "value"};
    for (int k = 0; k < ph->nslots; k++) {
      uint64_t o = d0 + p.off_slot[k];
      run[nrun] = (sf_run){o, o, o + n * width * 4, 4,
                           sf_nonneg_slot(ph->slots[k]), ""};
      snprintf(run[nrun].name, sizeof run[nrun].name, "slot/%s",
               ph->slots[k]);
      nrun++;
    }
  }
  /* direct I/O where the file system takes it: no page cache to fill
   * and reclaim, no page faults of a map (on a VM, mapping the files a
   * checkpoint had just written cost 1.5 s of CPU per GB) */
  int fl = fcntl(fd, F_GETFL);
  bool direct = fl >= 0 && fcntl(fd, F_SETFL, fl | O_DIRECT) == 0;
  void *pm = NULL;
  if (posix_memalign(&pm, SR_READ_ALIGN, SR_READ_ALIGN + SF_PIECE)) {
    rc = tsr_errf(err, errlen, TSR_ENOMEM, "%s: out of memory for reading "
                  "it", path);
    goto out;
  }
  mem = pm;
  uint8_t *piece = mem + SR_READ_ALIGN;
  for (uint64_t off = 0; off < size;) {
    ssize_t r = sf_pread(fd, piece, SF_PIECE, off);
    if (r == -EINVAL && direct) { /* not for direct reads after all */
      fcntl(fd, F_SETFL, fl);
      direct = false;
      continue;
    }
    if (r <= 0) {
      rc = r ? tsr_errf(err, errlen, (int)r, "%s: read error: %s", path,
                        strerror((int)-r))
             : tsr_errf(err, errlen, TSR_ECORRUPT, "%s: truncated while "
                        "read (%" PRIu64 " of %zu bytes)", path, off, size);
      goto out;
    }
    size_t k = (uint64_t)r < size - off ? (size_t)r : (size_t)(size - off);
    /* the data once: the file's CRC is the header's joined with it */
    size_t head = off >= d0 ? 0 : d0 - off < k ? (size_t)(d0 - off) : k;
    hcrc = tsr_crc32c(hcrc, piece, head);
    if (off + k > d0) {
      dcrc = tsr_crc32c(dcrc, piece + head, k - head);
      for (int i = 0; i < nrun && !erc; i++)
        erc = sf_run_check(&run[i], &p.h, off, off + k, piece, path, emsg,
                           sizeof emsg);
    }
    memmove(piece - SF_CARRY, piece + k - SF_CARRY, SF_CARRY);
    off += k;
  }
  fcrc = tsr_crc32c_combine(hcrc, dcrc, size - d0);
  if (fcrc != crc)
    rc = tsr_errf(err, errlen, TSR_ECORRUPT, "%s: CRC32C %08x, written "
                  "%08x (damaged)", path, fcrc, crc);
  else if (hrc)
    rc = tsr_errf(err, errlen, hrc, "%s", hmsg);
  else if (dcrc != dcrc_want)
    rc = tsr_errf(err, errlen, TSR_ECORRUPT, "%s: data CRC32C mismatch (file "
                  "damaged)", path);
  else if (erc)
    rc = tsr_errf(err, errlen, erc, "%s", emsg);
  if (!rc && h) *h = p.h;
out:
  free(mem);
  close(fd);
  return rc;
}
