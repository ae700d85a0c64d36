/* Partitioners: how a variable is split along axis 0 into shards, and which
 * PS holds each shard. TensorFlow's formulas (tf.distribute.experimental.
 * partitioners), with `elem` the dtype size and `numel` the element count:
 *   FixedShards(k):        n = min(k, dim0)
 *   MinSize(min_b, max_s): n = max(1, min(dim0, max_s, ceil(numel*elem/min_b)))
 *   MaxSize(max_b, max_s): rows = max(1, floor(max_b / (numel/dim0*elem)));
 *                          n = ceil(dim0/rows), capped by max_s (0: no cap)
 * Rank-0 variables are never split. Rows follow TF's "div" layout: the first
 * dim0 % n shards get one extra row. Placement is round-robin over the PS
 * with one counter across all shards of all variables, in creation order.
 */
#ifndef TSR_PARTITION_H
#define TSR_PARTITION_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
  TSR_PART_MIN_SIZE = 0, /* TF's default for ParameterServerStrategy users */
  TSR_PART_MAX_SIZE,
  TSR_PART_FIXED
} tsr_part_kind;

typedef struct {
  tsr_part_kind kind;
  int64_t num_shards;      /* fixed */
  int64_t min_shard_bytes; /* min_size; default 256 KiB */
  int64_t max_shard_bytes; /* max_size */
  int64_t max_shards;      /* min_size (default 1) and max_size (0: none) */
} tsr_partitioner;

#define TSR_MAX_RANK 8

typedef struct {
  const char *name;
  int rank;
  int64_t shape[TSR_MAX_RANK];
  size_t elem_size; /* bytes per element */
} tsr_var_shape;

typedef struct {
  int var;         /* index into the variable list */
  int shard;       /* index within the variable */
  int num_shards;  /* shards of that variable */
  int64_t row0;    /* first row (axis 0) */
  int64_t rows;    /* number of rows */
  int ps;          /* PS task index (position in the ps job) */
} tsr_shard;

/* Defaults: MinSize(256 KiB, 1). */
void tsr_partitioner_default(tsr_partitioner *p);

/* Checks the partitioner's own numbers (min_shard_bytes > 0, ...). */
int tsr_partitioner_check(const tsr_partitioner *p, char *err, size_t errlen);

/* Number of shards of one variable; TSR_EINVAL (err filled) for a zero
 * or negative dimension, rank out of range, elem_size 0. */
int tsr_partition_count(const tsr_partitioner *p, const tsr_var_shape *v,
                        int64_t *n, char *err, size_t errlen);

/* Row range of shard i of n over dim0 rows ("div" layout). */
void tsr_partition_rows(int64_t dim0, int64_t n, int64_t i, int64_t *row0,
                        int64_t *rows);

/* Plans every variable: fills *out (malloc'd, caller frees) with one entry
 * per shard in order, placed round-robin over n_ps with one counter. */
int tsr_partition_plan(const tsr_partitioner *p, const tsr_var_shape *vars,
                       size_t n_vars, int n_ps, tsr_shard **out,
                       size_t *n_out, char *err, size_t errlen);

#endif
