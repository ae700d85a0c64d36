/* The job file: what to train and how. Only the chief (and the standalone
 * trainer) reads it; workers get what they need over the wire.
 *
 * JSON, parsed once into `tsr_job`. The keys, how each is read, their
 * defaults and their documentation are one table (common/job_keys.h).
 * Every key has a Keras-like default where one exists; an unknown key is
 * an error that names it (with its path, e.g.
 * "optimizer.beta1: unknown key; did you mean beta_1?"). Command-line flags
 * override single keys before the struct is filled: tsr_job_override()
 * takes "steps=100" or "optimizer.learning_rate=0.01" (the value is read as
 * JSON when it parses, else as a string).
 *
 * The "model" and "data" values are kept as JSON here and validated by the
 * modules that own them (worker/model, worker/input); a model given as a
 * path is loaded from that file, relative to the job file's folder.
 */
#ifndef TSR_JOB_H
#define TSR_JOB_H

/* Room for a metric's name, NUL included: the longest name a metric
 * resolves to (sparse_top_k_categorical_accuracy, 33 bytes) with room to
 * spare. Every output (TensorBoard tags, metrics.jsonl, the summary) keeps
 * a name whole; a name that would not fit is refused where it is
 * resolved, never cut. */
#define TSR_METRIC_NAME_MAX 64

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/conf.h"
#include "common/optim_spec.h"
#include "common/partition.h"

typedef enum { TSR_MODE_ASYNC = 0, TSR_MODE_SSP, TSR_MODE_SYNC } tsr_mode;
typedef enum {
  TSR_PREC_FP32 = 0,
  TSR_PREC_BF16,
  TSR_PREC_FP16
} tsr_precision;

typedef struct {
  char *path;          /* the job file; when parsed from text with a
                          base_dir, base_dir/<source's file name>; else
                          NULL. Relative data paths resolve from its folder */
  json_t *model;       /* resolved model JSON (owned) */
  char *model_source;  /* path the model came from, or "inline" */
  char *loss;          /* Keras name; default "mse" */
  char **metrics;
  int n_metrics;
  tsr_optim_spec optimizer;
  json_t *data;        /* {"train": {...}, "eval": {...}} (owned) */
  int64_t batch_size;  /* per worker step; default 32 (Keras) */
  int64_t steps;       /* 0: use epochs */
  int64_t epochs;      /* default 1 when steps is 0 */
  int64_t steps_per_closure; /* default 10 */
  tsr_mode mode;
  int staleness;       /* ssp:S */
  tsr_partitioner partitioner;
  tsr_precision precision;
  tsr_precision wire_precision; /* of gradients and values between the
                                   workers and the PS: fp32 (default) or
                                   bf16; the PS keeps and applies fp32 */
  bool prefetch_params;     /* async: each step computes with the values
                               pulled during the step before (default
                               false) */
  bool dense_allreduce;     /* dense "allreduce": dense variables on every
                               worker, gradients all-reduced; sparse ones
                               on the PS (default "ps": all on the PS) */
  int64_t allreduce_bucket_bytes; /* gradient buckets; default 4 MiB */
  uint64_t seed;       /* default 0 */
  char *checkpoint_dir;     /* NULL: no checkpoints */
  int64_t checkpoint_every_steps; /* 0: only at the end */
  double checkpoint_every_secs;   /* 0: off */
  int checkpoint_keep;      /* default 3 */
  bool checkpoint_per_ps;   /* checkpoint.storage "per_ps": each PS writes
                               to a folder only it sees (and verifies its
                               own files); default "shared": the chief
                               verifies every file before it commits */
  char *logdir;             /* NULL: no TensorBoard files */
  char *initial_weights;    /* .npz / .keras / .weights.h5 to start from
                               (as written; relative to the job file) */
  int64_t eval_every_steps; /* 0: only at the end */
  int64_t summary_every_steps; /* TensorBoard points; 0: a hundredth of the
                                  run */
  double summary_every_secs;   /* also by time; 0: off */
  json_t *raw;              /* the whole document after overrides (owned) */
} tsr_job;

void tsr_job_init(tsr_job *job);
void tsr_job_free(tsr_job *job);

/* Reads and validates a job file. `overrides` is a NULL-terminated list of
 * "key=value" (may be NULL). Returns 0 or a negative code with `err`. */
int tsr_job_load(const char *path, const char *const *overrides,
                 tsr_job *job, char *err, size_t errlen);

/* Same from text; `base_dir` resolves a relative model path (may be NULL). */
int tsr_job_parse(const char *text, const char *source, const char *base_dir,
                  const char *const *overrides, tsr_job *job, char *err,
                  size_t errlen);

/* Applies one "a.b=value" override to a JSON document. */
int tsr_job_override(json_t *root, const char *kv, char *err, size_t errlen);

/* Losses and metrics (common/keras_names.c): a Keras name passes through;
 * Keras's serialized object ({"class_name": "Huber", "config": {...}})
 * becomes the canonical text the model resolves: the snake-case name,
 * "_from_logits" when set, then "@option=value" for each option that
 * differs from its default ("huber@delta=2", "auc@multi_label",
 * "top_k_categorical_accuracy@k=3"). Options at values Tessera does not
 * implement are refused, naming them. */
int tsr_loss_canon(json_t *v, char *out, size_t len, char *err,
                   size_t errlen);
int tsr_metric_canon(json_t *v, char *out, size_t len, char *err,
                     size_t errlen);

/* Parses a partitioner object. */
int tsr_partitioner_parse(json_t *v, tsr_partitioner *out, char *err,
                          size_t errlen);

/* "async", "ssp:3", "sync". */
int tsr_mode_parse(const char *s, tsr_mode *mode, int *staleness);
const char *tsr_precision_name(tsr_precision p);

/* The README's table of the job file's keys (Markdown, one row a key, in
 * the order common/job_keys.h lists them); malloc'd, NULL when out of
 * memory. */
char *tsr_job_keys_markdown(void);

/* The folder of the job file ("." when it names none, or the job was
 * parsed from text), in `dir`. */
void tsr_job_dir(const tsr_job *job, char *dir, size_t len);
/* `p` resolved against the job file's folder (as it is when absolute),
 * then `suffix` ("" for none): a malloc'd string, NULL when out of
 * memory. */
char *tsr_job_resolve(const tsr_job *job, const char *p, const char *suffix);

/* Reads a whole file into a NUL-terminated malloc'd buffer (limit 1 GiB).
 * Returns NULL with `*rc` and `err` set. */
char *tsr_read_file(const char *path, size_t *len, int *rc, char *err,
                    size_t errlen);

#endif
