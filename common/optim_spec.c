/* Optimizer specs as Keras writes them, and learning-rate schedules.
 *
 * Happy path: tsr_optim_parse() takes a name, an object {"name", ...},
 * Keras's optimizer.get_config() output as it is, or the serialized
 * {"class_name", "config"} form; picks the kind, fills Keras's defaults,
 * then reads each key it knows (null means the default, as get_config()
 * writes it). The learning rate is a number or a serialized schedule;
 * tsr_optim_lr() evaluates it at an iteration count with Keras's formulas
 * (in double; Keras computes in float32).
 * Failure modes: an unknown key (named, with a close match), a value of the
 * wrong type or out of range (named with its path), an option Tessera does
 * not implement at a non-default value (EMA, amsgrad, a fixed loss scale,
 * gradient accumulation: "is not supported"), more than one clipping
 * option (Keras refuses that too).
 */
#include "common/optim_spec.h"
#include "common/conf.h"
#include "common/err.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* ---- names ---------------------------------------------------------------*/

static const char *const opt_names[TSR_OPT__COUNT] = {
    "sgd", "adagrad", "rmsprop", "adam", "ftrl", "adamw", "nadam", "adamax",
    "moving_average"};

const char *tsr_optim_name(tsr_opt_kind kind) {
  return (unsigned)kind < TSR_OPT__COUNT ? opt_names[kind] : "?";
}

int tsr_optim_kind_parse(const char *name) {
  if (!name) return -1;
  for (int i = 0; i < TSR_OPT__COUNT; i++)
    if (strcasecmp(name, opt_names[i]) == 0) return i;
  return -1;
}

/* An optimizer instance's name as Keras writes it in get_config(): tf_keras
 * names it after its class ("AdamW", "RMSprop"), Keras 3 after the class in
 * snake case with a counter for the second and later instances ("adam_w",
 * "rm_sprop", "adam_1"). Case, underscores and that counter aside, it must
 * spell one of the classes. */
static int optim_kind_of_instance(const char *name) {
  char k[32];
  size_t n = strlen(name), o = 0;
  /* the counter: "_" then digits at the end */
  size_t end = n;
  while (end > 0 && name[end - 1] >= '0' && name[end - 1] <= '9') end--;
  if (end < n && end > 0 && name[end - 1] == '_') n = end - 1;
  for (size_t i = 0; i < n; i++) {
    if (name[i] == '_') continue;
    if (o + 1 >= sizeof k) return -1;
    k[o++] = name[i];
  }
  if (!o) return -1;
  k[o] = 0;
  return tsr_optim_kind_parse(k);
}

void tsr_optim_defaults(tsr_opt_kind kind, tsr_optim_spec *o) {
  memset(o, 0, sizeof *o);
  o->kind = kind;
  o->learning_rate = kind == TSR_OPT_SGD ? 0.01 : 0.001;
  o->beta_1 = 0.9;
  o->beta_2 = 0.999;
  o->epsilon = 1e-7;
  o->rho = 0.9;
  o->initial_accumulator_value = 0.1;
  o->learning_rate_power = -0.5;
  if (kind == TSR_OPT_ADAMW) o->weight_decay = 0.004;
  o->schedule.kind = TSR_LR_CONSTANT;
  o->schedule.initial = o->learning_rate;
}

/* ---- typed values, null meaning "the default" ----------------------------*/

static int get_num(json_t *o, const char *where, const char *key, double *out,
                   char *err, size_t errlen) {
  json_t *v = json_object_get(o, key);
  if (!v || json_is_null(v)) return 0;
  if (!json_is_number(v))
    return tsr_errf(err, errlen, TSR_ECONFIG, "%s.%s must be a number", where,
                    key);
  double d = json_number_value(v);
  if (!isfinite(d))
    return tsr_errf(err, errlen, TSR_ECONFIG, "%s.%s must be finite", where,
                    key);
  *out = d;
  return 0;
}

static int get_bool(json_t *o, const char *where, const char *key, bool *out,
                    char *err, size_t errlen) {
  json_t *v = json_object_get(o, key);
  if (!v || json_is_null(v)) return 0;
  if (!json_is_boolean(v))
    return tsr_errf(err, errlen, TSR_ECONFIG, "%s.%s must be true or false",
                    where, key);
  *out = json_is_true(v);
  return 0;
}

/* ---- schedules -----------------------------------------------------------*/

static const char *const lr_names[] = {
    "constant", "ExponentialDecay", "PiecewiseConstantDecay", "CosineDecay",
    "CosineDecayRestarts", "PolynomialDecay", "InverseTimeDecay"};

const char *tsr_lr_schedule_name(tsr_lr_kind kind) {
  return (unsigned)kind <= TSR_LR_INVERSE_TIME ? lr_names[kind] : "?";
}

#define LR_SUPPORTED                                                        \
  "ExponentialDecay, PiecewiseConstantDecay, CosineDecay, "                \
  "CosineDecayRestarts, PolynomialDecay, InverseTimeDecay"

static int need_pos(double x, const char *where, const char *key, char *err,
                    size_t errlen) {
  if (x > 0) return 0;
  return tsr_errf(err, errlen, TSR_ECONFIG, "%s.config.%s %g must be > 0",
                  where, key, x);
}

int tsr_lr_schedule_parse(json_t *v, const char *where, tsr_lr_schedule *s,
                          char *err, size_t errlen) {
  memset(s, 0, sizeof *s);
  if (json_is_number(v)) {
    s->kind = TSR_LR_CONSTANT;
    s->initial = json_number_value(v);
    /* 0 is allowed, as Keras allows it (a frozen run, a warmup's start) */
    if (!(s->initial >= 0) || !isfinite(s->initial))
      return tsr_errf(err, errlen, TSR_ECONFIG, "%s %g must be >= 0", where,
                      s->initial);
    return 0;
  }
  const char *cls = json_is_object(v)
                        ? json_string_value(json_object_get(v, "class_name"))
                        : NULL;
  json_t *cfg = json_is_object(v) ? json_object_get(v, "config") : NULL;
  if (!cls || !json_is_object(cfg))
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "%s must be a number or a Keras schedule "
                    "{\"class_name\": \"ExponentialDecay\", \"config\": {...}}",
                    where);
  static const char *const wrap[] = {"class_name", "config", "module",
                                     "registered_name", NULL};
  int rc = tsr_conf_check_keys(v, where, wrap, NULL, err, errlen);
  if (rc) return rc;
  int kind = -1;
  for (int i = 1; i <= TSR_LR_INVERSE_TIME; i++)
    if (!strcmp(cls, lr_names[i])) kind = i;
  if (kind < 0)
    return tsr_errf(err, errlen, TSR_EUNSUPPORTED,
                    "%s: schedule '%s' is not supported (supported: %s)",
                    where, cls, LR_SUPPORTED);
  s->kind = (tsr_lr_kind)kind;
  char w[160];
  snprintf(w, sizeof w, "%s.config", where);
  static const char *const k_exp[] = {"name", "initial_learning_rate",
                                      "decay_steps", "decay_rate",
                                      "staircase", NULL};
  static const char *const k_pw[] = {"name", "boundaries", "values", NULL};
  static const char *const k_cos[] = {"name", "initial_learning_rate",
                                      "decay_steps", "alpha", "warmup_target",
                                      "warmup_steps", NULL};
  static const char *const k_cr[] = {"name", "initial_learning_rate",
                                     "first_decay_steps", "t_mul", "m_mul",
                                     "alpha", NULL};
  static const char *const k_poly[] = {"name", "initial_learning_rate",
                                       "decay_steps", "end_learning_rate",
                                       "power", "cycle", NULL};
  const char *const *keys[] = {NULL, k_exp, k_pw, k_cos, k_cr, k_poly, k_exp};
  if ((rc = tsr_conf_check_keys(cfg, w, keys[kind], NULL, err, errlen)))
    return rc;
  s->t_mul = 2.0;
  s->m_mul = 1.0;
  s->end_lr = 0.0001;
  s->power = 1.0;
  if (s->kind == TSR_LR_PIECEWISE) {
    json_t *b = json_object_get(cfg, "boundaries");
    json_t *vals = json_object_get(cfg, "values");
    if (!json_is_array(b) || !json_is_array(vals))
      return tsr_errf(err, errlen, TSR_ECONFIG,
                      "%s: boundaries and values must be lists", w);
    size_t nb = json_array_size(b);
    if (nb > TSR_LR_MAX_BOUNDARIES)
      return tsr_errf(err, errlen, TSR_ERANGE,
                      "%s.boundaries: %zu boundaries, at most %d", w, nb,
                      TSR_LR_MAX_BOUNDARIES);
    if (json_array_size(vals) != nb + 1)
      return tsr_errf(err, errlen, TSR_ECONFIG,
                      "%s: values must have one more entry than boundaries "
                      "(%zu values, %zu boundaries)", w,
                      json_array_size(vals), nb);
    for (size_t i = 0; i <= nb; i++) {
      json_t *x = json_array_get(vals, i);
      if (!json_is_number(x) || !(json_number_value(x) >= 0))
        return tsr_errf(err, errlen, TSR_ECONFIG,
                        "%s.values[%zu] must be a number >= 0", w, i);
      s->values[i] = json_number_value(x);
      if (i == nb) break;
      x = json_array_get(b, i);
      if (!json_is_number(x))
        return tsr_errf(err, errlen, TSR_ECONFIG,
                        "%s.boundaries[%zu] must be a number", w, i);
      s->boundaries[i] = json_number_value(x);
      if (i > 0 && !(s->boundaries[i] > s->boundaries[i - 1]))
        return tsr_errf(err, errlen, TSR_ECONFIG,
                        "%s.boundaries must increase (%g after %g)", w,
                        s->boundaries[i], s->boundaries[i - 1]);
    }
    s->n_boundaries = (int)nb;
    s->initial = s->values[0];
    return 0;
  }
  json_t *wt = json_object_get(cfg, "warmup_target");
  s->warmup = wt && !json_is_null(wt);
  if ((rc = get_num(cfg, w, "initial_learning_rate", &s->initial, err,
                    errlen)) ||
      (rc = get_num(cfg, w, "decay_steps", &s->decay_steps, err, errlen)) ||
      (rc = get_num(cfg, w, "first_decay_steps", &s->decay_steps, err,
                    errlen)) ||
      (rc = get_num(cfg, w, "decay_rate", &s->decay_rate, err, errlen)) ||
      (rc = get_bool(cfg, w, "staircase", &s->staircase, err, errlen)) ||
      (rc = get_num(cfg, w, "alpha", &s->alpha, err, errlen)) ||
      (rc = get_num(cfg, w, "warmup_target", &s->warmup_target, err,
                    errlen)) ||
      (rc = get_num(cfg, w, "warmup_steps", &s->warmup_steps, err, errlen)) ||
      (rc = get_num(cfg, w, "t_mul", &s->t_mul, err, errlen)) ||
      (rc = get_num(cfg, w, "m_mul", &s->m_mul, err, errlen)) ||
      (rc = get_num(cfg, w, "end_learning_rate", &s->end_lr, err, errlen)) ||
      (rc = get_num(cfg, w, "power", &s->power, err, errlen)) ||
      (rc = get_bool(cfg, w, "cycle", &s->cycle, err, errlen)))
    return rc;
  if (!json_object_get(cfg, "initial_learning_rate"))
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "%s.initial_learning_rate is required", w);
  if (!(s->initial >= 0))
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "%s.initial_learning_rate %g must be >= 0", w, s->initial);
  const char *dk =
      s->kind == TSR_LR_COSINE_RESTARTS ? "first_decay_steps" : "decay_steps";
  if ((rc = need_pos(s->decay_steps, where, dk, err, errlen))) return rc;
  if ((s->kind == TSR_LR_EXPONENTIAL || s->kind == TSR_LR_INVERSE_TIME) &&
      !json_object_get(cfg, "decay_rate"))
    return tsr_errf(err, errlen, TSR_ECONFIG, "%s.decay_rate is required", w);
  if (s->decay_rate < 0 || s->alpha < 0 || s->alpha > 1 ||
      s->warmup_steps < 0 || s->end_lr < 0 || s->t_mul <= 0 ||
      s->m_mul < 0 || s->power < 0)
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "%s: decay_rate, alpha (at most 1), warmup_steps, "
                    "end_learning_rate, m_mul and power must be >= 0, t_mul "
                    "> 0", w);
  if (s->warmup && !(s->warmup_target >= 0))
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "%s.warmup_target %g must be >= 0", w, s->warmup_target);
  return 0;
}

static double cosine_decay(double step, double steps, double lr0,
                           double alpha) {
  double frac = step / steps;
  double c = 0.5 * (1.0 + cos(M_PI * frac));
  return lr0 * ((1.0 - alpha) * c + alpha);
}

double tsr_lr_schedule_at(const tsr_lr_schedule *s, int64_t step_i) {
  double step = (double)(step_i < 0 ? 0 : step_i);
  double lr0 = s->initial, ds = s->decay_steps;
  switch (s->kind) {
    case TSR_LR_CONSTANT: return lr0;
    case TSR_LR_EXPONENTIAL: {
      double p = step / ds;
      if (s->staircase) p = floor(p);
      return lr0 * pow(s->decay_rate, p);
    }
    case TSR_LR_INVERSE_TIME: {
      double p = step / ds;
      if (s->staircase) p = floor(p);
      return lr0 / (1.0 + s->decay_rate * p);
    }
    case TSR_LR_PIECEWISE: {
      /* values[i] while step <= boundaries[i] (Keras's intervals) */
      for (int i = 0; i < s->n_boundaries; i++)
        if (step <= s->boundaries[i]) return s->values[i];
      return s->values[s->n_boundaries];
    }
    case TSR_LR_COSINE: {
      if (!s->warmup) return cosine_decay(fmin(step, ds), ds, lr0, s->alpha);
      double ws = s->warmup_steps;
      double st = fmin(step, ds + ws);
      if (st < ws)
        return (s->warmup_target - lr0) * (st / ws) + lr0;
      return cosine_decay(st - ws, ds, s->warmup_target, s->alpha);
    }
    case TSR_LR_COSINE_RESTARTS: {
      double frac = step / ds, i_restart;
      if (s->t_mul == 1.0) {
        i_restart = floor(frac);
        frac -= i_restart;
      } else {
        i_restart = floor(log(1.0 - frac * (1.0 - s->t_mul)) / log(s->t_mul));
        double sum_r = (1.0 - pow(s->t_mul, i_restart)) / (1.0 - s->t_mul);
        frac = (frac - sum_r) / pow(s->t_mul, i_restart);
      }
      double c = 0.5 * pow(s->m_mul, i_restart) * (1.0 + cos(M_PI * frac));
      return lr0 * ((1.0 - s->alpha) * c + s->alpha);
    }
    case TSR_LR_POLYNOMIAL: {
      double dsr = ds;
      if (s->cycle) {
        double mult = step == 0 ? 1.0 : ceil(step / ds);
        dsr = ds * mult;
      } else {
        step = fmin(step, ds);
      }
      double p = step / dsr;
      return (lr0 - s->end_lr) * pow(1.0 - p, s->power) + s->end_lr;
    }
  }
  return lr0;
}

double tsr_optim_lr(const tsr_optim_spec *o, int64_t iterations) {
  if (o->schedule.kind == TSR_LR_CONSTANT) return o->learning_rate;
  return tsr_lr_schedule_at(&o->schedule, iterations);
}

/* ---- the optimizer -------------------------------------------------------*/

#define OPT_SUPPORTED "sgd, adagrad, rmsprop, adam, adamw, nadam, adamax, ftrl"

/* Keys every Keras optimizer's get_config() writes (Keras 3 and tf_keras,
 * new and legacy optimizers). */
static const char *const base_keys[] = {
    "name", "learning_rate", "weight_decay", "clipnorm", "global_clipnorm",
    "clipvalue", "use_ema", "ema_momentum", "ema_overwrite_frequency",
    "jit_compile", "is_legacy_optimizer", "loss_scale_factor",
    "gradient_accumulation_steps", "decay", "lr", NULL};

/* Options accepted only at the value that leaves them off. */
static int inactive(json_t *o, const char *key, const char *why, char *err,
                    size_t errlen) {
  json_t *v = json_object_get(o, key);
  if (!v || json_is_null(v) || json_is_false(v)) return 0;
  if (!strcmp(key, "gradient_accumulation_steps") && json_is_integer(v) &&
      json_integer_value(v) <= 1)
    return 0;
  char *d = json_dumps(v, JSON_ENCODE_ANY | JSON_REAL_PRECISION(6));
  int rc = tsr_errf(err, errlen, TSR_EUNSUPPORTED,
                    "optimizer.%s = %s is not supported (%s)", key,
                    d ? d : "?", why);
  free(d);
  return rc;
}

int tsr_optim_parse(json_t *v, tsr_optim_spec *out, char *err,
                    size_t errlen) {
  const char *name = NULL;
  json_t *cfg = NULL;
  if (json_is_string(v)) {
    name = json_string_value(v);
  } else if (json_is_object(v) && json_object_get(v, "class_name")) {
    /* keras.optimizers.serialize(): {"module", "class_name", "config",
     * "registered_name"}; config.name is the instance's name, which may be
     * anything, so the class decides */
    static const char *const wrap[] = {"class_name", "config", "module",
                                       "registered_name", NULL};
    int rc = tsr_conf_check_keys(v, "optimizer", wrap, NULL, err, errlen);
    if (rc) return rc;
    name = json_string_value(json_object_get(v, "class_name"));
    cfg = json_object_get(v, "config");
    if (!name || (cfg && !json_is_object(cfg) && !json_is_null(cfg)))
      return tsr_errf(err, errlen, TSR_ECONFIG,
                      "optimizer: class_name must be a string and config an "
                      "object");
  } else if (json_is_object(v) &&
             json_is_string(json_object_get(v, "name"))) {
    name = json_string_value(json_object_get(v, "name"));
    cfg = v;
  } else {
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "optimizer must be a name (\"adam\"), an object with "
                    "\"name\", or Keras's serialized {\"class_name\", "
                    "\"config\"}");
  }
  /* the class decides: a serialized form's class_name, or the instance
   * name Keras derives from it */
  int kind = cfg == v ? optim_kind_of_instance(name) : tsr_optim_kind_parse(name);
  if (json_is_string(v) && kind < 0) kind = optim_kind_of_instance(name);
  /* the rule of non-trainable statistics is the PS's, not a job's */
  if (kind == TSR_OPT_MOVING_AVERAGE) kind = -1;
  if (kind < 0 && cfg == v)
    return tsr_errf(err, errlen, TSR_EUNSUPPORTED,
                    "optimizer \"%s\": not the name of a supported "
                    "optimizer class (supported: %s); an optimizer named "
                    "otherwise needs its class: paste "
                    "keras.optimizers.serialize(opt), which carries "
                    "\"class_name\"", name, OPT_SUPPORTED);
  if (kind < 0)
    return tsr_errf(err, errlen, TSR_EUNSUPPORTED,
                    "optimizer \"%s\" is not supported (supported: %s)", name,
                    OPT_SUPPORTED);
  tsr_optim_defaults((tsr_opt_kind)kind, out);
  if (!json_is_object(cfg)) return 0;
  static const char *const k_sgd[] = {"momentum", "nesterov", NULL};
  static const char *const k_adagrad[] = {"initial_accumulator_value",
                                          "epsilon", NULL};
  static const char *const k_rms[] = {"rho", "momentum", "epsilon",
                                      "centered", NULL};
  static const char *const k_adam[] = {"beta_1", "beta_2", "epsilon",
                                       "amsgrad", NULL};
  static const char *const k_adamax[] = {"beta_1", "beta_2", "epsilon",
                                         NULL};
  static const char *const k_ftrl[] = {
      "learning_rate_power", "initial_accumulator_value",
      "l1_regularization_strength", "l2_regularization_strength",
      "l2_shrinkage_regularization_strength", "beta", NULL};
  const char *const *own[TSR_OPT__COUNT] = {
      k_sgd, k_adagrad, k_rms, k_adam, k_ftrl, k_adam, k_adamax, k_adamax};
  const char *w = "optimizer";
  int rc = tsr_conf_check_keys(cfg, w, base_keys, own[kind], err, errlen);
  if (rc) return rc;
  if ((rc = inactive(cfg, "use_ema", "no moving average of the weights is "
                     "kept", err, errlen)) ||
      (rc = inactive(cfg, "amsgrad", "only false", err, errlen)) ||
      (rc = inactive(cfg, "loss_scale_factor", "fp16 uses dynamic loss "
                     "scaling", err, errlen)) ||
      (rc = inactive(cfg, "gradient_accumulation_steps", "every step "
                     "applies", err, errlen)) ||
      (rc = inactive(cfg, "is_legacy_optimizer", "the legacy optimizers' "
                     "update rules differ", err, errlen)))
    return rc;
  /* the learning rate: a number, a schedule, or the legacy "lr" */
  json_t *lr = json_object_get(cfg, "learning_rate");
  if (!lr || json_is_null(lr)) lr = json_object_get(cfg, "lr");
  if (lr && !json_is_null(lr)) {
    if ((rc = tsr_lr_schedule_parse(lr, "optimizer.learning_rate",
                                    &out->schedule, err, errlen)))
      return rc;
    out->learning_rate = out->schedule.initial;
  }
  double decay = 0;
  if ((rc = get_num(cfg, w, "momentum", &out->momentum, err, errlen)) ||
      (rc = get_bool(cfg, w, "nesterov", &out->nesterov, err, errlen)) ||
      (rc = get_num(cfg, w, "beta_1", &out->beta_1, err, errlen)) ||
      (rc = get_num(cfg, w, "beta_2", &out->beta_2, err, errlen)) ||
      (rc = get_num(cfg, w, "epsilon", &out->epsilon, err, errlen)) ||
      (rc = get_num(cfg, w, "rho", &out->rho, err, errlen)) ||
      (rc = get_bool(cfg, w, "centered", &out->centered, err, errlen)) ||
      (rc = get_num(cfg, w, "initial_accumulator_value",
                    &out->initial_accumulator_value, err, errlen)) ||
      (rc = get_num(cfg, w, "learning_rate_power", &out->learning_rate_power,
                    err, errlen)) ||
      (rc = get_num(cfg, w, "l1_regularization_strength", &out->l1, err,
                    errlen)) ||
      (rc = get_num(cfg, w, "l2_regularization_strength", &out->l2, err,
                    errlen)) ||
      (rc = get_num(cfg, w, "l2_shrinkage_regularization_strength",
                    &out->l2_shrinkage, err, errlen)) ||
      (rc = get_num(cfg, w, "beta", &out->beta, err, errlen)) ||
      (rc = get_num(cfg, w, "weight_decay", &out->weight_decay, err,
                    errlen)) ||
      (rc = get_num(cfg, w, "clipnorm", &out->clipnorm, err, errlen)) ||
      (rc = get_num(cfg, w, "global_clipnorm", &out->global_clipnorm, err,
                    errlen)) ||
      (rc = get_num(cfg, w, "clipvalue", &out->clipvalue, err, errlen)) ||
      (rc = get_num(cfg, w, "decay", &decay, err, errlen)))
    return rc;
  if (decay < 0)
    return tsr_errf(err, errlen, TSR_ECONFIG, "optimizer.decay %g must be >= 0",
                    decay);
  if (decay > 0) {
    /* the legacy optimizers' time decay: lr / (1 + decay * iterations) */
    if (out->schedule.kind != TSR_LR_CONSTANT)
      return tsr_errf(err, errlen, TSR_ECONFIG,
                      "optimizer: decay and a learning-rate schedule cannot "
                      "both be given");
    tsr_lr_schedule *s = &out->schedule;
    s->kind = TSR_LR_INVERSE_TIME;
    s->initial = out->learning_rate;
    s->decay_steps = 1;
    s->decay_rate = decay;
  }
  if (!(out->learning_rate >= 0))
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "optimizer.learning_rate %g must be >= 0",
                    out->learning_rate);
  if (out->momentum < 0 || out->momentum >= 1)
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "optimizer.momentum %g must be in [0, 1)", out->momentum);
  if (out->beta_1 < 0 || out->beta_1 >= 1 || out->beta_2 < 0 ||
      out->beta_2 >= 1)
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "optimizer.beta_1/beta_2 must be in [0, 1)");
  if (out->rho < 0 || out->rho >= 1)
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "optimizer.rho %g must be in [0, 1)", out->rho);
  if (out->epsilon < 0)
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "optimizer.epsilon %g must be >= 0", out->epsilon);
  if (out->initial_accumulator_value < 0)
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "optimizer.initial_accumulator_value %g must be >= 0",
                    out->initial_accumulator_value);
  if (out->learning_rate_power > 0)
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "optimizer.learning_rate_power %g must be <= 0",
                    out->learning_rate_power);
  if (out->l1 < 0 || out->l2 < 0 || out->l2_shrinkage < 0)
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "optimizer: regularization strengths must be >= 0");
  if (out->weight_decay < 0 || out->clipnorm < 0 ||
      out->global_clipnorm < 0 || out->clipvalue < 0)
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "optimizer: weight_decay, clipnorm, global_clipnorm and "
                    "clipvalue must be >= 0");
  int nclip = (out->clipnorm > 0) + (out->global_clipnorm > 0) +
              (out->clipvalue > 0);
  if (nclip > 1)
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "optimizer: only one of clipnorm, clipvalue and "
                    "global_clipnorm can be set (as in Keras)");
  if (kind == TSR_OPT_FTRL && out->schedule.kind == TSR_LR_CONSTANT &&
      out->learning_rate == 0)
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "optimizer.learning_rate 0 with ftrl: its update divides "
                    "by the rate (a schedule may start at 0: those steps "
                    "change nothing)");
  if (out->weight_decay > 0 && kind == TSR_OPT_FTRL)
    return tsr_errf(err, errlen, TSR_EUNSUPPORTED,
                    "optimizer.weight_decay is not supported with ftrl (use "
                    "its l2_regularization_strength)");
  return 0;
}

void tsr_var_optimizer(const tsr_var *v, const tsr_optim_spec *job_opt,
                       tsr_optim_spec *out) {
  if (v->trainable) {
    *out = *job_opt;
    return;
  }
  tsr_optim_defaults(TSR_OPT_MOVING_AVERAGE, out);
  out->momentum = v->momentum;
  out->learning_rate = 1.0 - v->momentum;
}
