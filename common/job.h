/* The job file: what to train and how. Only the chief (and the standalone
 * trainer) reads it; workers get what they need over the wire.
 *
 * JSON, parsed once into `tsr_job`. Every key has a Keras-like default where
 * one exists; an unknown key is an error that names it (with its path, e.g.
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

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/partition.h"

typedef enum {
  TSR_OPT_SGD = 0,
  TSR_OPT_ADAGRAD,
  TSR_OPT_RMSPROP,
  TSR_OPT_ADAM,
  TSR_OPT_FTRL
} tsr_opt_kind;

/* Keras names and defaults (tf.keras.optimizers, Keras 2/3). */
typedef struct {
  tsr_opt_kind kind;
  double learning_rate;     /* sgd 0.01; others 0.001 */
  double momentum;          /* sgd, rmsprop: 0 */
  bool nesterov;            /* sgd: false */
  double beta_1, beta_2;    /* adam: 0.9, 0.999 */
  double epsilon;           /* adam, adagrad, rmsprop: 1e-7 */
  double rho;               /* rmsprop: 0.9 */
  bool centered;            /* rmsprop: false */
  double initial_accumulator_value; /* adagrad, ftrl: 0.1 */
  double learning_rate_power;       /* ftrl: -0.5 */
  double l1, l2;            /* ftrl l1/l2_regularization_strength: 0 */
  double l2_shrinkage;      /* ftrl l2_shrinkage_regularization_strength */
  double beta;              /* ftrl: 0 */
} tsr_optim_spec;

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
  uint64_t seed;       /* default 0 */
  char *checkpoint_dir;     /* NULL: no checkpoints */
  int64_t checkpoint_every_steps; /* 0: only at the end */
  double checkpoint_every_secs;   /* 0: off */
  int checkpoint_keep;      /* default 3 */
  char *logdir;             /* NULL: no TensorBoard files */
  int64_t eval_every_steps; /* 0: only at the end */
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

/* Parses an optimizer (a Keras name string or an object). */
int tsr_optim_parse(json_t *v, tsr_optim_spec *out, char *err, size_t errlen);
void tsr_optim_defaults(tsr_opt_kind kind, tsr_optim_spec *out);
const char *tsr_optim_name(tsr_opt_kind kind);

/* Parses a partitioner object. */
int tsr_partitioner_parse(json_t *v, tsr_partitioner *out, char *err,
                          size_t errlen);

/* "async", "ssp:3", "sync". */
int tsr_mode_parse(const char *s, tsr_mode *mode, int *staleness);
const char *tsr_precision_name(tsr_precision p);

/* Levenshtein distance of two short strings (99 past 40 characters), for
 * the "did you mean" of unknown keys. */
int tsr_edit_distance(const char *a, const char *b);

/* Reads a whole file into a NUL-terminated malloc'd buffer (limit 1 GiB).
 * Returns NULL with `*rc` and `err` set. */
char *tsr_read_file(const char *path, size_t *len, int *rc, char *err,
                    size_t errlen);

#endif
