/* A checkpoint's variables gathered from its shard files without a
 * parameter server, for `tessera ckpt inspect` and `tessera ckpt export`.
 * Each file is read and checked whole by the shard file library
 * (common/ckpt/shardfile.h), the one the PS restores with.
 *
 * Failure modes: a file the library refuses (truncated, a bad magic or
 * CRC, a header out of range), parts of one variable that disagree on
 * its shape, kind or sharding, parts that do not cover a dense variable's
 * rows, a sparse id outside the variable: each an error naming the file.
 */
#ifndef TSR_CHIEF_CKPT_READ_H
#define TSR_CHIEF_CKPT_READ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CHIEF_CKPT_MAX_PARTS 4096

typedef struct {
  char name[256];
  int rank;
  int64_t shape[8];
  bool sparse;
  int64_t width;        /* elements per row */
  int n_parts;
  int num_shards;       /* as saved */
  int64_t step;         /* optimizer applies of part 0 */
  char optimizer[16];
  int n_slots;
  char slots[4][32];
  uint64_t n_rows;      /* rows stored over all parts (sparse: touched) */
  uint64_t bytes;       /* file bytes over all parts */
  char **files;         /* n_parts paths */
} chief_ckpt_var;

/* Every variable of a checkpoint folder, from the shard files' headers
 * (header CRCs checked). Free with chief_ckpt_vars_free. */
int chief_ckpt_scan(const char *folder, chief_ckpt_var **vars, size_t *n,
                    char *err, size_t errlen);
void chief_ckpt_vars_free(chief_ckpt_var *vars, size_t n);

/* The full value of a variable, [shape[0] * width] floats, gathered from
 * its parts (data CRCs checked). For a sparse variable, rows no part holds
 * are left as they are in `out` and marked 0 in `present` (may be NULL;
 * shape[0] bytes), so the caller can fill them with their initial values.
 * A dense variable must be covered entirely. */
int chief_ckpt_load_value(const chief_ckpt_var *v, float *out,
                          uint8_t *present, char *err, size_t errlen);

#endif
