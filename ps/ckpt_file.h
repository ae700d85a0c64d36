/* The shard checkpoint file (format in ps/ckpt.c) checked without a
 * parameter server, for the chief's verification of a checkpoint and
 * `tessera ckpt inspect --verify`: the very checks a restore makes of each
 * part it reads (ps/ckpt_load.c).
 *
 * Failure modes: the file cannot be read, or any check fails; err names
 * the file and the problem.
 */
#ifndef TSR_PS_CKPT_FILE_H
#define TSR_PS_CKPT_FILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* What a checked part says about itself. */
typedef struct {
  char name[256];          /* the variable */
  char ckpt_id[65];        /* the checkpoint it belongs to */
  int64_t ckpt_step;
  int32_t shard, num_shards;
  bool sparse;
  int64_t n_rows;
  uint64_t bytes;          /* the file's size */
} ps_ckpt_file_info;

/* Reads and checks one part file whole: magic, both CRCs, every header
 * field, sizes, the part's rows in the saved layout, its ids. */
int ps_ckpt_file_check(const char *path, ps_ckpt_file_info *info, char *err,
                       size_t errlen);

#endif
