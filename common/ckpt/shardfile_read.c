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
 */
#include "common/ckpt/shardfile_int.h"
#include "common/crc32c.h"
#include "common/err.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Each id of a sparse part belongs to the part. */
static int sf_ids(const tsr_shardfile_part *p, const char *path, char *err,
                  size_t errlen) {
  const tsr_shardfile_hdr *h = &p->h;
  for (int64_t r = 0; h->sparse && r < h->n_rows; r++) {
    int64_t id;
    memcpy(&id, p->data + p->off_ids + (size_t)r * 8, 8);
    bool in = h->bounded ? id >= h->row0 && id - h->row0 < h->rows
                         : id >= 0 && id % h->num_shards == h->shard;
    if (!in)
      return tsr_errf(err, errlen, TSR_EFORMAT, "%s: row id %" PRId64 " (row %"
                      PRId64 ") does not belong to part %d of %d", path, id, r,
                      h->shard, h->num_shards);
  }
  return 0;
}

/* The sections' offsets (from the header alone) and the file's size. */
static int sf_sections(tsr_shardfile_part *p, const char *path,
                       uint64_t data_bytes, size_t size, uint64_t base,
                       char *err, size_t errlen) {
  const tsr_shardfile_hdr *h = &p->h;
  tsr_shardfile_section secs[TSR_SHARDFILE_MAX_SECTIONS];
  int nsec;
  uint64_t want;
  if (tsr_shardfile_layout(h, secs, &nsec, &want))
    return tsr_errf(err, errlen, TSR_EFORMAT, "%s: %" PRId64 " rows of width %"
                    PRId64 " with %d slot(s) overflow a size", path, h->n_rows,
                    h->width, h->nslots);
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

int tsr_shardfile_parse(const char *path, const uint8_t *b, size_t size,
                        tsr_shardfile_part *p, char *err, size_t errlen) {
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
  uint32_t crc;
  if (msgpack_unpack_next(&up, (const char *)b + 12, hlen, NULL) !=
      MSGPACK_UNPACK_SUCCESS) {
    rc = tsr_errf(err, errlen, TSR_EFORMAT, "%s: header is not msgpack", path);
    goto out;
  }
  if ((rc = tsr_shardfile__hdr_unpack(&up.data, path, &p->h, &data_bytes,
                                      &crc, err, errlen)) ||
      (rc = sf_sections(p, path, data_bytes, size, 16 + (uint64_t)hlen, err,
                        errlen)))
    goto out;
  p->data = b + 16 + hlen;
  if (tsr_crc32c(0, p->data, p->data_bytes) != crc) {
    rc = tsr_errf(err, errlen, TSR_ECORRUPT, "%s: data CRC32C mismatch (file "
                  "damaged)", path);
    goto out;
  }
  rc = sf_ids(p, path, err, errlen);
out:
  msgpack_unpacked_destroy(&up);
  return rc;
}

/* ---- files ----------------------------------------------------------------*/

void tsr_shardfile_close(tsr_shardfile *f) {
  if (f->map) munmap(f->map, f->size);
  f->map = NULL;
}

static int sf_map(tsr_shardfile *f, char *err, size_t errlen) {
  int fd = open(f->path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return tsr_errf(err, errlen, -errno, "%s: cannot open: %s", f->path,
                    strerror(errno));
  struct stat st;
  if (fstat(fd, &st)) {
    close(fd);
    return tsr_errf(err, errlen, TSR_EIO, "%s: cannot stat", f->path);
  }
  f->size = (size_t)st.st_size;
  if (f->size < 16) {
    close(fd);
    return tsr_errf(err, errlen, TSR_ECORRUPT, "%s: truncated (%zu bytes, no "
                    "header)", f->path, f->size);
  }
  f->map = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (f->map == MAP_FAILED) {
    f->map = NULL;
    return tsr_errf(err, errlen, TSR_EIO, "%s: mmap failed", f->path);
  }
  return 0;
}

int tsr_shardfile_open(tsr_shardfile *f, const char *path, char *err,
                       size_t errlen) {
  memset(f, 0, sizeof *f);
  int n = snprintf(f->path, sizeof f->path, "%s", path);
  if (n < 0 || (size_t)n >= sizeof f->path)
    return tsr_errf(err, errlen, TSR_ERANGE, "%.200s...: path too long",
                    path);
  int rc = sf_map(f, err, errlen);
  if (!rc) rc = tsr_shardfile_parse(f->path, f->map, f->size, &f->p, err,
                                    errlen);
  if (rc) tsr_shardfile_close(f);
  return rc;
}
