/* Optimizers as Keras names and configures them, and learning-rate
 * schedules: the description the PS applies (kernels/optim.h) and the job
 * file carries (common/job.h), parsed and evaluated in optim_spec.c.
 * Nothing here reads a file or knows a role.
 */
#ifndef TSR_OPTIM_SPEC_H
#define TSR_OPTIM_SPEC_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/var.h"

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

/* X(member) for each scalar member of tsr_lr_schedule but its kind; the
 * wire's LrSchedule (proto/ps.proto) names them alike, so a copy either
 * way is one X per member. */
#define TSR_LR_SCHEDULE_SCALARS(X)                                        \
  X(initial) X(decay_steps) X(decay_rate) X(staircase) X(alpha) X(warmup) \
  X(warmup_target) X(warmup_steps) X(t_mul) X(m_mul) X(end_lr) X(power)  \
  X(cycle)

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

/* The update rule of a variable: the job's optimizer for a trainable one,
 * the moving average (TSR_OPT_MOVING_AVERAGE, learning_rate = 1 -
 * momentum) for a moving statistic. The chief gives it to the PS with the
 * variable; the standalone trainer applies it. */
void tsr_var_optimizer(const tsr_var *v, const tsr_optim_spec *job_opt,
                       tsr_optim_spec *out);

#endif
