/* Internals of the shard file library shared by its files: the header as
 * msgpack, both ways (shardfile_hdr.c). */
#ifndef TSR_SHARDFILE_INT_H
#define TSR_SHARDFILE_INT_H

#include <msgpack.h>

#include "common/ckpt/shardfile.h"
#include "common/fs.h"

/* tsr_shardfile_layout of a header read from `path`: counts whose sizes
 * overflow are TSR_EFORMAT naming the file, the rows, width and slots. */
int tsr_shardfile__layout_read(const tsr_shardfile_hdr *h, const char *path,
                               tsr_shardfile_section *secs, int *nsec,
                               uint64_t *data_bytes, char *err, size_t errlen);

/* Packs the header map of `h` with its sections, `data_bytes` and
 * `data_crc` into sb (initialised by the caller); its length does not
 * depend on data_crc. TSR_ERANGE / TSR_EINVAL
 * from tsr_shardfile_layout. */
int tsr_shardfile__hdr_pack(const tsr_shardfile_hdr *h, const char *written_by,
                            uint32_t data_crc, msgpack_sbuffer *sb);

/* Where a part is written and how it is laid out. */
typedef struct {
  char fname[TSR_SHARDFILE_NAME_MAX]; /* tsr_shardfile_name */
  char path[TSR_PATH_MAX];            /* <dir>/<fname> */
  tsr_shardfile_section secs[TSR_SHARDFILE_MAX_SECTIONS];
  int nsec;
  uint64_t data_bytes;                /* tsr_shardfile_layout's */
} tsr_shardfile__dest;

/* The file name, path and layout of the part `h` written in `dir` into d.
 * A name or path too long is TSR_ERANGE; counts that do not fit a file are
 * tsr_shardfile_layout's code; each names the part or the file. */
int tsr_shardfile__dest_of(const char *dir, const tsr_shardfile_hdr *h,
                           tsr_shardfile__dest *d, char *err, size_t errlen);

/* Reads a written file back: its size and the CRC32C of every byte. */
int tsr_shardfile__verify(const char *path, uint64_t bytes, uint32_t crc,
                          char *err, size_t errlen);

/* Reads and checks the header map `m` of the file `path` into h;
 * *data_bytes and *data_crc get those keys. */
int tsr_shardfile__hdr_unpack(const msgpack_object *m, const char *path,
                              tsr_shardfile_hdr *h, uint64_t *data_bytes,
                              uint32_t *data_crc, char *err, size_t errlen);

#endif
