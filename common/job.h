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

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/conf.h"
#include "common/partition.h"

typedef enum {
  TSR_OPT_SGD = 0,
  TSR_OPT_ADAGRAD,
  TSR_OPT_RMSPROP,
  TSR_OPT_ADAM,
  TSR_OPT_FTRL,
  TSR_OPT_ADAMW,
  TSR_OPT_NADAM,
  TSR_OPT_ADAMAX,
  /* Not an optimizer a job names: the rule of non-trainable moving
   * statistics (BatchNormalization's moving mean and variance), w +=
   * learning_rate * (g - w) with learning_rate = 1 - momentum, where the
   * pushed "gradient" g is the batch statistic. */
  TSR_OPT_MOVING_AVERAGE,
  TSR_OPT__COUNT
} tsr_opt_kind;

/* Learning-rate schedules as Keras serializes them
 * (keras.optimizers.schedules), evaluated at the optimizer's iteration
 * count (0 for the first update) by tsr_optim_lr(). */
typedef enum {
  TSR_LR_CONSTANT = 0,
  TSR_LR_EXPONENTIAL,      /* ExponentialDecay */
  TSR_LR_PIECEWISE,        /* PiecewiseConstantDecay */
  TSR_LR_COSINE,           /* CosineDecay (with optional linear warmup) */
  TSR_LR_COSINE_RESTARTS,  /* CosineDecayRestarts */
  TSR_LR_POLYNOMIAL,       /* PolynomialDecay */
  TSR_LR_INVERSE_TIME      /* InverseTimeDecay (also the legacy `decay`) */
} tsr_lr_kind;

#define TSR_LR_MAX_BOUNDARIES 64

typedef struct {
  tsr_lr_kind kind;
  double initial;          /* initial_learning_rate */
  double decay_steps;      /* decay_steps / first_decay_steps */
  double decay_rate;       /* exponential, inverse time */
  bool staircase;          /* exponential, inverse time */
  double alpha;            /* cosine, cosine restarts: floor fraction */
  bool warmup;             /* cosine: warmup_target given */
  double warmup_target, warmup_steps;
  double t_mul, m_mul;     /* cosine restarts: 2, 1 */
  double end_lr, power;    /* polynomial: 0.0001, 1 */
  bool cycle;              /* polynomial */
  int n_boundaries;        /* piecewise: values has n_boundaries + 1 */
  double boundaries[TSR_LR_MAX_BOUNDARIES];
  double values[TSR_LR_MAX_BOUNDARIES + 1];
} tsr_lr_schedule;

/* Keras names and defaults (tf.keras.optimizers, Keras 2/3). The struct is
 * compared with memcmp (PS create idempotency): always start from
 * tsr_optim_defaults(), which zeroes it. */
typedef struct {
  tsr_opt_kind kind;
  double learning_rate;     /* sgd 0.01; others 0.001; with a schedule, its
                               initial value (tsr_optim_lr gives the rate) */
  double momentum;          /* sgd, rmsprop: 0 */
  bool nesterov;            /* sgd: false */
  double beta_1, beta_2;    /* adam, adamw, nadam, adamax: 0.9, 0.999 */
  double epsilon;           /* 1e-7 */
  double rho;               /* rmsprop: 0.9 */
  bool centered;            /* rmsprop: false */
  double initial_accumulator_value; /* adagrad, ftrl: 0.1 */
  double learning_rate_power;       /* ftrl: -0.5 */
  double l1, l2;            /* ftrl l1/l2_regularization_strength: 0 */
  double l2_shrinkage;      /* ftrl l2_shrinkage_regularization_strength */
  double beta;              /* ftrl: 0 */
  double weight_decay;      /* decoupled: w -= w * wd * lr before the
                               update; 0 off (adamw: 0.004) */
  double clipnorm;          /* per variable, on the worker; 0 off */
  double global_clipnorm;   /* over all variables, on the worker; 0 off */
  double clipvalue;         /* elementwise, where the update runs; 0 off */
  tsr_lr_schedule schedule; /* kind CONSTANT: learning_rate throughout */
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

/* Parses an optimizer (common/optim_spec.c): a Keras name ("adam"), an
 * object {"name": "adam", ...}, the output of Keras's
 * optimizer.get_config() as it is (null meaning the default), or
 * keras.optimizers.serialize()'s {"class_name", "config"} form. The
 * learning rate may be a number or a serialized schedule. Options Tessera
 * does not implement (use_ema, amsgrad, loss_scale_factor, ...) are
 * accepted only at their inactive values; any other value is refused with
 * a message that says it is not supported. */
int tsr_optim_parse(json_t *v, tsr_optim_spec *out, char *err, size_t errlen);
void tsr_optim_defaults(tsr_opt_kind kind, tsr_optim_spec *out);
const char *tsr_optim_name(tsr_opt_kind kind);
/* Kind from a Keras name or class name, case-insensitive ("Adam", "adamw");
 * -1 when unknown. */
int tsr_optim_kind_parse(const char *name);
/* Parses a serialized schedule {"class_name", "config"} (or a number, a
 * constant rate). `where` prefixes errors ("optimizer.learning_rate"). */
int tsr_lr_schedule_parse(json_t *v, const char *where, tsr_lr_schedule *out,
                          char *err, size_t errlen);
const char *tsr_lr_schedule_name(tsr_lr_kind kind);
/* The learning rate of the update after `iterations` earlier updates
 * (Keras evaluates the schedule at optimizer.iterations before it counts
 * the update). Computed in double with Keras's formulas. */
double tsr_optim_lr(const tsr_optim_spec *o, int64_t iterations);
double tsr_lr_schedule_at(const tsr_lr_schedule *s, int64_t step);

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

/* Reads a whole file into a NUL-terminated malloc'd buffer (limit 1 GiB).
 * Returns NULL with `*rc` and `err` set. */
char *tsr_read_file(const char *path, size_t *len, int *rc, char *err,
                    size_t errlen);

#endif
