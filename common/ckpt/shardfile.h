/* Shard checkpoint files: one file per saved part of a variable, the
 * format described in common/ckpt/FORMAT.md. This library writes, reads
 * and checks them; it knows no role: the parameter server saves and
 * restores its shards through it, the chief verifies a checkpoint before
 * it commits one and `tessera ckpt` reads them for inspect and export.
 *
 * Happy path (writing): fill a tsr_shardfile_hdr, call
 * tsr_shardfile_write with a function that puts the data sections in
 * order; it runs that function twice (the data's CRC goes in the header,
 * ahead of the data), writes <dir>/<name> through a temp file, fsync and
 * rename, and reports the file's name, size and CRC.
 * Happy path (reading): tsr_shardfile_open maps a file and checks it whole
 * (tsr_shardfile_parse); the part then says where each section lies.
 *
 * Failure modes: every function returns 0 or a negative code (common/err.h)
 * with a message in `err` naming the file and the problem: a file that is
 * not a regular file (a link, a FIFO, a device), truncated or padded, a bad
 * magic or CRC, a header field missing, twice, of the wrong type or out of
 * range, a sections list that is not the one the header implies, sizes
 * whose products overflow, a part that is not its place in the saved
 * layout, an id outside the part, a value training cannot leave (NaN or
 * infinite, a negative sum of squares).
 *
 * Threads: any; nothing here keeps state between calls.
 */
#ifndef TSR_SHARDFILE_H
#define TSR_SHARDFILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/var.h"

#define TSR_SHARDFILE_MAGIC "TSRSHARD"
#define TSR_SHARDFILE_VERSION 2
#define TSR_SHARDFILE_MAX_PARTS 65536 /* num_shards of one variable */
#define TSR_SHARDFILE_MAX_SLOTS 4
#define TSR_SHARDFILE_SLOT_MAX 32     /* slot name, with its NUL */
#define TSR_SHARDFILE_OPTIM_MAX 16    /* optimizer name, with its NUL */
#define TSR_SHARDFILE_ID_MAX 64       /* longest checkpoint id (bytes) */
/* value + slots + ids */
#define TSR_SHARDFILE_MAX_SECTIONS (TSR_SHARDFILE_MAX_SLOTS + 2)
/* "<enc>.part-<k>-of-<n>.tshard" with every name byte as %XX, and a NUL */
#define TSR_SHARDFILE_NAME_MAX (3 * TSR_VAR_NAME_MAX + 48)

/* What the header of a part says (FORMAT.md names each key). The data
 * sections follow from it: tsr_shardfile_layout. */
typedef struct {
  char ckpt_id[TSR_SHARDFILE_ID_MAX + 1]; /* "" when none was given */
  int64_t ckpt_step;
  char name[TSR_VAR_NAME_MAX];            /* the variable */
  int rank;
  int64_t shape[TSR_MAX_RANK];            /* the whole variable's */
  bool sparse, bounded;
  int32_t shard, num_shards;
  int64_t row0, rows;                     /* the part's place in the layout */
  int64_t width;                          /* product of shape[1:] */
  int64_t n_rows;                         /* rows stored */
  int64_t step;                           /* optimizer applies */
  uint64_t var_version;
  char optimizer[TSR_SHARDFILE_OPTIM_MAX];/* Keras name */
  int nslots;
  char slots[TSR_SHARDFILE_MAX_SLOTS][TSR_SHARDFILE_SLOT_MAX];
} tsr_shardfile_hdr;

/* One data section as the header's `sections` list gives it. */
typedef struct {
  char name[8 + TSR_SHARDFILE_SLOT_MAX]; /* "ids", "value", "slot/<name>" */
  const char *dtype;                     /* "<i8" or "<f4" (numpy's) */
  int rank;                              /* 1 (ids) or 2 */
  int64_t shape[2];
  uint64_t offset, nbytes;               /* from the data's start */
} tsr_shardfile_section;

/* The sections a part with header `h` holds, in file order: sparse parts
 * "ids" [n_rows] (int64), then "value" and one "slot/<name>" per slot,
 * each [n_rows, width] float32. *data_bytes gets their total. TSR_ERANGE
 * when a size overflows 64 bits; TSR_EINVAL for counts out of range. */
int tsr_shardfile_layout(const tsr_shardfile_hdr *h,
                         tsr_shardfile_section secs[TSR_SHARDFILE_MAX_SECTIONS],
                         int *n, uint64_t *data_bytes);

/* A part checked whole, held in the caller's bytes. */
typedef struct {
  tsr_shardfile_hdr h;
  const uint8_t *data;          /* the data sections, in the caller's bytes */
  uint64_t data_bytes;
  uint64_t off_ids, off_value;  /* offsets in data */
  uint64_t off_slot[TSR_SHARDFILE_MAX_SLOTS];
} tsr_shardfile_part;

/* Checks a whole part file held in b[0..size): magic, header CRC, every
 * header field (types, ranges, no key twice, the width from the shape, the
 * row range from the saved layout, slot names unique), the sections list
 * entry by entry against tsr_shardfile_layout (names, dtypes, shapes,
 * offsets, sizes), sizes with checked arithmetic against the file's size,
 * the data CRC, each id of a sparse part (inside the part's rows, or of
 * the part's shard), every float finite and the slots that hold sums of
 * squares or magnitudes (accumulator, v, u, velocity) >= 0. `path` names
 * it in errors. Pure: no I/O, no allocation beyond msgpack's own. */
int tsr_shardfile_parse(const char *path, const uint8_t *b, size_t size,
                        tsr_shardfile_part *p, char *err, size_t errlen);

/* Checks the part file at `path` for a reader that wants no data out of
 * it (the chief's check of the files a checkpoint's PS report): a
 * regular file of `bytes` bytes whose every byte has CRC32C `crc`, then
 * every check of tsr_shardfile_parse, in that order of report. Reads the
 * file once, a few MiB at a time, without mapping it and with direct I/O
 * where the file system takes it. *h (may be NULL) gets its header.
 * Errors name the file: missing (-ENOENT), not a regular file, another
 * size or CRC ("damaged"), the part's own. */
int tsr_shardfile_check(const char *path, uint64_t bytes, uint32_t crc,
                        tsr_shardfile_hdr *h, char *err, size_t errlen);

/* A part file mapped and checked (tsr_shardfile_parse). */
typedef struct {
  char path[4096];
  void *map;
  size_t size;
  tsr_shardfile_part p;
} tsr_shardfile;

/* Maps `path` read-only, only when it is a regular file: a symbolic link
 * is not followed, a FIFO or a device is refused without waiting on it
 * (TSR_EFORMAT naming what it is). Nothing is checked of its contents
 * (f->p stays zero). On failure nothing is left open. */
int tsr_shardfile_map(tsr_shardfile *f, const char *path, char *err,
                      size_t errlen);
/* tsr_shardfile_map, then tsr_shardfile_parse of the whole file. Close
 * with tsr_shardfile_close (also fine on a zeroed one). */
int tsr_shardfile_open(tsr_shardfile *f, const char *path, char *err,
                       size_t errlen);
void tsr_shardfile_close(tsr_shardfile *f);
/* Releases the pages of f's map inside [p, p+n) (the whole pages) from the
 * process's resident memory; touched again, they are read again from the
 * file (the page cache). For a reader done with a range: a restore copying
 * a 2 GB part need not hold it resident. Outside the map: nothing. A file
 * tsr_shardfile_open checked is released already; only what the caller
 * touches after is resident again. */
void tsr_shardfile_drop(const tsr_shardfile *f, const void *p, size_t n);

/* ---- names ------------------------------------------------------------ */

/* The variable name as file names carry it: bytes outside [A-Za-z0-9._-]
 * as %XX (cut to `len`). */
void tsr_shardfile_enc_name(const char *name, char *out, size_t len);
/* "<enc>.part-<k>-of-<n>.tshard"; TSR_ERANGE when it does not fit. */
int tsr_shardfile_name(const char *var, int32_t k, int32_t n, char *buf,
                       size_t len);
/* Whether `fname` is a part file of the variable whose encoded name is
 * `enc`, exactly as tsr_shardfile_name writes it: "<enc>.part-<k>-of-<n>
 * .tshard" with 0 <= k < n <= MAX_PARTS in plain decimal (no sign, space
 * or leading zero: "w.part-00-of-1.tshard" is no part file). *k and *n
 * get the numbers. */
bool tsr_shardfile_name_parse(const char *fname, const char *enc, int32_t *k,
                              int32_t *n);

/* ---- writing ---------------------------------------------------------- */

typedef struct tsr_shardfile_writer tsr_shardfile_writer;

/* Puts the next `n` bytes of the data sections (in layout order); small
 * pieces are gathered, so a row at a time costs little. Errors are kept
 * and reported by tsr_shardfile_write. */
void tsr_shardfile_put(tsr_shardfile_writer *w, const void *p, size_t n);

/* A file written, as a manifest lists it. */
typedef struct {
  char name[TSR_SHARDFILE_NAME_MAX];  /* inside its folder */
  uint64_t bytes;
  uint32_t crc32c;                    /* of every byte of the file */
} tsr_shardfile_written;

/* Writes the part described by `h` (its n_rows set; its sections follow
 * from it) to <dir>/<tsr_shardfile_name>: emit(ctx, w) is called twice and
 * must put the same bytes each time, exactly the layout's data_bytes
 * (first for the data CRC the header carries, then to the file). Temp
 * file, fsync, rename, fsync of the folder (common/fs.h). `verify`: read
 * the file back and check its size and CRC. `out` (may be NULL) gets the
 * file's name, size and CRC. `written_by` names the writer in the header.
 * Failure modes: a name too long, a header out of range, data of another
 * size or CRC the second time, a write, fsync or rename that fails, a file
 * that reads back different: each names the file, and no file is left
 * under the part's name but the one there was. */
int tsr_shardfile_write(const char *dir, const tsr_shardfile_hdr *h,
                        const char *written_by,
                        void (*emit)(void *ctx, tsr_shardfile_writer *w),
                        void *ctx, bool verify, tsr_shardfile_written *out,
                        char *err, size_t errlen);

/* Rows [r0, r0+n) of the part being written, put straight where the
 * file's sections are staged (no copy of the records in between): ids
 * gets the n ids, 8 bytes each (sparse parts; NULL for a dense one),
 * secs[0] the n values, secs[1 + k] slot k, width * 4 bytes per row,
 * rows one after the other. The places are not aligned (a section starts
 * wherever the header leaves it): store with memcpy. 0, or a negative
 * code with `err` filled (it is passed on). */
typedef int (*tsr_shardfile_rows_fn)(void *ctx, uint64_t r0, size_t n,
                                     unsigned char *ids,
                                     unsigned char *const *secs, char *err,
                                     size_t errlen);

/* The staging memory of tsr_shardfile_write_rows, kept by a writer of
 * many files so that each file reuses the pages the last one touched
 * (a megabyte or more per section: fresh pages cost the kernel a fault
 * and a zeroing each). Allocated on first use, grown where a file needs
 * more; one file at a time. tsr_shardfile_stage_free(NULL) is a no-op. */
typedef struct tsr_shardfile_stage tsr_shardfile_stage;
tsr_shardfile_stage *tsr_shardfile_stage_new(void);
void tsr_shardfile_stage_free(tsr_shardfile_stage *st);

/* The same file as tsr_shardfile_write, from rows asked for once each, in
 * blocks, in order: every section is written at its own offset as the
 * blocks come, the header last (its data CRC is fixed-width), the CRCs
 * joined rather than computed in a second pass. For a writer whose rows
 * are costly to fetch (a snapshot read while training goes on). `stage`:
 * the caller's staging memory, or NULL for memory of this call only. The
 * same failure modes, and the caller's own error for a block. */
int tsr_shardfile_write_rows(const char *dir, const tsr_shardfile_hdr *h,
                             const char *written_by, tsr_shardfile_rows_fn rows,
                             void *ctx, tsr_shardfile_stage *stage,
                             bool verify, tsr_shardfile_written *out,
                             char *err, size_t errlen);

#endif
