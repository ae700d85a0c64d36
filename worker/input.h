/* The input pipeline: reads a data set named in the job file, keeps this
 * worker's share, shuffles, batches and prefetches on a reader thread.
 *
 * Happy path: wk_input_open() validates the data spec (unknown keys are
 * errors naming them), opens the files and starts the reader thread;
 * wk_input_next() hands out batches in order until the requested epochs are
 * done (TSR_EEOF); wk_input_close() stops the thread and frees everything.
 * Failure modes: a missing or unreadable file, a bad cell or record, a
 * missing feature: the error names the file and the row or byte offset.
 * A reader error after open surfaces from the next wk_input_next() call.
 *
 * The data spec is job.data.train / job.data.eval (common/job.h); an eval
 * split may be cut from the training file ("every k-th row"), and
 * normalization uses the training rows' statistics.
 * worker/INPUT.md has the user's guide with examples. Keys of a split
 * (an unknown key, or one its format does not use, is an error naming its
 * path, e.g. "data.train.shufle_buffer: unknown key; did you mean
 * shuffle_buffer?"):
 *
 *   format          csv | npy | npz | idx | tfrecord | synthetic |
 *                   synthetic_ctr (default: from the first path's suffix)
 *   paths           file or list of files, relative to the job file's folder;
 *                   entries with * ? [ are sorted glob patterns; gzip is
 *                   detected (csv, npy, idx, tfrecord)
 *   labels          npy, idx: the label file of each path
 *   label           csv column / tfrecord feature / npz member with the label
 *                   (npz default "y")
 *   features        csv: list of column names or "all but label" (default);
 *                   tfrecord: list of names or {"name", "size"} (float_list of
 *                   `size` values, default 1); npz: the member (default "x")
 *   sparse_features tfrecord: list of names or {"name", "vocab"} (int64_list
 *                   of ids in [0, vocab); absent = empty list)
 *   n_classes       class count (default: max label + 1 when the loss is
 *                   categorical; required then for tfrecord)
 *   scale           multiplies every dense feature (digits 1/16, images 1/255)
 *   normalize       true: standardize with the training rows' mean and std
 *   shard           auto (default) | file | data | off   (tf.data AutoShardPolicy)
 *   shuffle_buffer  tf.data shuffle buffer size (0: keep the order)
 *   seed            shuffle seed (default: the options' seed, the job's seed)
 *   prefetch        batches read ahead (default 2; -1: 2)
 *   drop_remainder, epochs (-1 forever), repeat (true or a count): override
 *                   the options
 *   skip_corrupt    tfrecord: count and skip records with a bad CRC or
 *                   truncation instead of failing
 *   split, k, index eval only: {"split": "every", "k": 5, "index": 4} takes
 *                   rows with i % k == index (i counted within each file) of
 *                   the training files for eval; training leaves them out
 *   synthetic:      n (1000), dense (10), noise (0.1), data_seed (42)
 *   synthetic_ctr:  n, dense (13), sparse (26), vocab (100000, or a list),
 *                   zipf (1.1), ids_per_feature (1), positive_rate (0.25),
 *                   data_seed
 * The eval split inherits the data description (format, paths, labels,
 * label, features, sparse_features, n_classes, scale, normalize and the
 * generator keys) from train; pipeline keys (shard, shuffle_buffer, ...) it
 * does not inherit.
 */
#ifndef TSR_WK_INPUT_H
#define TSR_WK_INPUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/job.h"

typedef enum {
  WK_SPLIT_TRAIN = 0,
  WK_SPLIT_EVAL = 1
} wk_split;

/* What the model needs to know about the data. */
typedef struct {
  int64_t n_dense;        /* dense features per example */
  int n_sparse;           /* sparse (id list) features */
  char **sparse_names;    /* n_sparse names */
  int64_t *vocab;         /* per sparse feature: ids are in [0, vocab) (0: unbounded) */
  int64_t n_classes;      /* > 1 for integer class labels, 1 for regression / binary */
  int64_t n_examples;     /* examples in this worker's share per epoch, -1 if unknown */
  char **dense_names;     /* n_dense names (may be NULL) */
  int64_t n_total;        /* examples in the split, all workers, -1 if unknown */
  double best_auc;        /* synthetic_ctr: AUC of the hidden model on the
                             generated split (the best a model can reach);
                             NAN for other formats */
} wk_input_schema;

/* One batch. Memory belongs to the pipeline and stays valid until the next
 * wk_input_next() or wk_input_close(). Dense features row-major. */
typedef struct {
  int64_t n;             /* examples in this batch (== batch_size unless the last) */
  int64_t n_dense;
  float *x;              /* n * n_dense */
  float *y;              /* n labels (class index as float for classification) */
  int n_sparse;
  /* sparse feature f, example i: ids[f][offsets[f][i] .. offsets[f][i+1]) */
  int64_t **ids;
  int64_t **offsets;     /* n+1 entries each */
  int64_t epoch;         /* 0-based epoch this batch belongs to */
  int64_t index;         /* 0-based batch index since open */
} wk_batch;

typedef struct {
  int worker_index;      /* this worker's place, for sharding */
  int num_workers;
  int64_t batch_size;
  bool drop_remainder;
  int64_t epochs;        /* -1: repeat forever */
  uint64_t seed;         /* shuffle seed (job seed) */
  bool pinned;           /* allocate batch memory with the GPU backend's host allocator */
  void *(*host_alloc)(size_t bytes);   /* used when pinned (may be NULL) */
  /* The same with a context (the GPU backend's kern_ctx), used in
   * preference to host_alloc when set; the context must outlive the
   * pipeline. */
  void *(*host_alloc_ctx)(void *ctx, size_t bytes);
  void (*host_free_ctx)(void *ctx, void *p);
  void *host_ctx;
  void (*host_free)(void *p);
} wk_input_opts;

typedef struct wk_input wk_input;

/* Opens the split of job->data ("train" or "eval"): reads table formats
 * (csv, npy, npz, idx) into memory, checks that the streamed files exist,
 * computes the training statistics when normalizing, and starts the reader
 * thread. TSR_ENOTFOUND when the job has no data.eval and `split` asks for
 * it; any other error names the key, file, line or byte offset in `err`. */
int wk_input_open(const tsr_job *job, wk_split split,
                  const wk_input_opts *opts, wk_input **out, char *err,
                  size_t errlen);

/* The schema; valid until close. */
const wk_input_schema *wk_input_get_schema(const wk_input *in);

/* Next batch, or TSR_EEOF after the last epoch; any other negative code is
 * a read error with wk_input_error() saying what and where. */
int wk_input_next(wk_input *in, const wk_batch **out);

/* The last error message ("" when none). */
const char *wk_input_error(const wk_input *in);

/* Time the consumer spent inside wk_input_next (seconds: blocked on an
 * empty ring, on the lock, or descheduled there), for the "share of step
 * time waiting for input" figure. */
double wk_input_wait_seconds(const wk_input *in);

/* CPU time the reader thread has used (seconds). Compared with a step's
 * compute time it says whether the input keeps up on a machine with a core
 * to spare, whatever the wall-clock noise of a busy one. */
double wk_input_reader_cpu_seconds(const wk_input *in);

void wk_input_close(wk_input *in);

/* Checks every example of the opened split before the first step (all its
 * rows, not only this worker's share, so every worker and the standalone
 * trainer fail alike on the same file): values finite, labels classes in
 * [0, n_classes) when n_classes > 0 (the model's classes; 0: no check).
 * TSR_EDATA with the file, line and column in `err`. In-memory formats
 * (CSV, npy/npz, IDX) are checked here; streamed ones (TFRecord) and the
 * generators as their batches are read. */
int wk_input_validate(wk_input *in, int64_t n_classes, char *err,
                      size_t errlen);

/* Validates job->data (both splits) without opening files, so a bad data
 * spec fails when the job is loaded rather than on the first worker. */
int wk_input_check(const tsr_job *job, char *err, size_t errlen);

/* The dense features' affine map x -> x * a[j] + b[j] (the split's scale
 * and the training rows' normalization); returns the feature count, or 0
 * when the map is the identity (then *a and *b are NULL). Valid until
 * close. */
int64_t wk_input_affine(const wk_input *in, const float **a, const float **b);

/* Same as schema->best_auc. */
double wk_input_best_auc(const wk_input *in);

/* Corrupt TFRecord records skipped so far under skip_corrupt (the reader
 * thread counts; readable at any time). */
int64_t wk_input_skipped(const wk_input *in);

#endif
