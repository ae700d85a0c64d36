/* Partitioners: how a variable is split along axis 0 into shards, and which
 * PS holds each shard. TensorFlow's formulas (tf.distribute.experimental.
 * partitioners), with `elem` the dtype size and `numel` the element count:
 *   FixedShards(k):        n = min(k, dim0)
 *   MinSize(min_b, max_s): n = max(1, min(dim0, max_s, ceil(numel*elem/min_b)))
 *   MaxSize(max_b, max_s): rows = max(1, floor(max_b / (numel/dim0*elem)));
 *                          n = ceil(dim0/rows), capped by max_s (0: no cap)
 * Rank-0 variables are never split. Rows follow TF's "div" layout: the first
 * dim0 % n shards get one extra row.
 *
 * MinSize's max_shards defaults to 0, "one shard per PS at most": TF's
 * default of 1 keeps every variable whole, and a model with one large
 * kernel then loads one PS with most of the bytes whatever the placement.
 *
 * Placement:
 *   balanced (default)  shards sorted by bytes (optimizer slots included),
 *                       largest first, ties in creation order; each goes to
 *                       the PS holding the fewest bytes so far, ties to the
 *                       lowest index. Deterministic.
 *   round_robin         TensorFlow's layout: one counter across all shards
 *                       of all variables, in creation order (every kernel of
 *                       an MLP lands on ps:0 and every bias on ps:1).
 */
#ifndef TSR_PARTITION_H
#define TSR_PARTITION_H

#include <stddef.h>
#include <stdint.h>

#include "common/var.h"

typedef enum {
  TSR_PART_MIN_SIZE = 0, /* TF's default for ParameterServerStrategy users */
  TSR_PART_MAX_SIZE,
  TSR_PART_FIXED
} tsr_part_kind;

typedef enum {
  TSR_PLACE_BALANCED = 0,
  TSR_PLACE_ROUND_ROBIN
} tsr_placement;

typedef struct {
  tsr_part_kind kind;
  tsr_placement placement;
  int64_t num_shards;      /* fixed */
  int64_t min_shard_bytes; /* min_size; default 256 KiB */
  int64_t max_shard_bytes; /* max_size */
  int64_t max_shards;      /* min_size (default 0: the number of PS, 1 when
                              counted without a cluster) and max_size
                              (0: no cap) */
} tsr_partitioner;

/* Defaults: MinSize(256 KiB, one shard per PS at most), balanced. */
void tsr_partitioner_default(tsr_partitioner *p);

/* Checks the partitioner's own numbers (min_shard_bytes > 0, ...). */
int tsr_partitioner_check(const tsr_partitioner *p, char *err, size_t errlen);

/* Number of shards of one variable (its rank, shape and dtype; the
 * derived numel is not trusted); TSR_EINVAL (err filled) for a zero or
 * negative dimension, rank out of range, a dtype without a size. */
int tsr_partition_count(const tsr_partitioner *p, const tsr_var *v,
                        int64_t *n, char *err, size_t errlen);

/* Row range of shard i of n over dim0 rows ("div" layout). */
void tsr_partition_rows(int64_t dim0, int64_t n, int64_t i, int64_t *row0,
                        int64_t *rows);

/* Plans every variable: fills *out (malloc'd, caller frees) with one entry
 * per shard in variable and shard order, placed over n_ps as p->placement
 * says. slots[i] (0..16; NULL: none) is the number of optimizer slot
 * copies the PS keeps beside variable i, which placement counts. A MinSize
 * max_shards of 0 becomes n_ps here. */
int tsr_partition_plan(const tsr_partitioner *p, const tsr_var *vars,
                       const int *slots, size_t n_vars, int n_ps, tsr_shard **out,
                       size_t *n_out, char *err, size_t errlen);

/* Bytes a shard holds on its PS: rows x row elements x dtype size x
 * (1 + slots). */
int64_t tsr_shard_bytes(const tsr_shard *s, const tsr_var *v, int slots);

/* Sums tsr_shard_bytes per PS into per_ps[0..n_ps) and returns max/mean
 * (1.0 when perfectly even or empty). */
double tsr_partition_balance(const tsr_shard *shards, size_t n,
                             const tsr_var *vars, const int *slots,
                             int n_ps, int64_t *per_ps);

/* "balanced" / "round_robin"; TSR_EINVAL (err names the value) else. */
int tsr_placement_parse(const char *s, tsr_placement *out, char *err,
                        size_t errlen);
const char *tsr_placement_name(tsr_placement p);

#endif
