/* Shard specs from the wire (VarSpec) to their C form (ps_var_spec), and
 * the consistency mode text. Every error names the variable and the field.
 * (The client's side, ps_var_spec_init and the VarSpec it sends, is
 * client_spec.c.)
 */
#include "ps/svc_int.h"
#include "common/err.h"
#include "common/partition.h"
#include "common/size.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* ---- validation ---------------------------------------------------------*/

static bool sp_finite(double v) { return isfinite(v); }

/* A hyper-parameter: finite and in [lo, hi) (hi_open) or [lo, hi]. */
static int sp_hyper(const ps_var_spec *s, const char *field, double v,
                    double lo, double hi, bool hi_open, char *err,
                    size_t errlen) {
  if (!sp_finite(v) || v < lo || (hi_open ? v >= hi : v > hi))
    return tsr_errf(err, errlen, TSR_EINVAL,
                    "%s: optimizer.%s %g is not a finite value in [%g, %g%s",
                    s->var.name, field, v, lo, hi, hi_open ? ")" : "]");
  return 0;
}

int ps__spec_validate(const ps_var_spec *s, char *err, size_t errlen) {
  if (!s->var.name[0])
    return tsr_errf(err, errlen, TSR_EINVAL, "variable name is empty");
  if (memchr(s->var.name, 0, TSR_VAR_NAME_MAX) == NULL)
    return tsr_errf(err, errlen, TSR_EINVAL, "variable name is not terminated");
  if (s->var.rank < 0 || s->var.rank > TSR_MAX_RANK)
    return tsr_errf(err, errlen, TSR_EINVAL, "%s: rank %d out of [0, %d]",
                    s->var.name, s->var.rank, TSR_MAX_RANK);
  for (int i = 0; i < s->var.rank; i++)
    if (s->var.shape[i] <= 0 || s->var.shape[i] > TSR_STEP_MAX)
      return tsr_errf(err, errlen, TSR_EINVAL,
                      "%s: shape[%d] = %" PRId64 " must be in [1, 2^62]",
                      s->var.name, i, s->var.shape[i]);
  if (s->shard.num_shards < 1 || s->shard.shard < 0 ||
      s->shard.shard >= s->shard.num_shards)
    return tsr_errf(err, errlen, TSR_EINVAL,
                    "%s: shard %d of num_shards %d is invalid", s->var.name,
                    s->shard.shard, s->shard.num_shards);
  if (ps_var_spec_sparse(s) && s->var.rank < 1)
    return tsr_errf(err, errlen, TSR_EINVAL,
                    "%s: a sparse variable needs rank >= 1", s->var.name);
  if ((unsigned)s->optim.kind >= TSR_OPT__COUNT)
    return tsr_errf(err, errlen, TSR_EINVAL, "%s: optimizer kind %d is unknown",
                    s->var.name, (int)s->optim.kind);
  int64_t width, numel;
  size_t slots = (size_t)kern_optim_num_slots(&s->optim), bytes;
  if (tsr_dims_product(s->var.shape, 1, s->var.rank, &width) ||
      tsr_mul3_size((size_t)width, sizeof(float), 1 + slots, &bytes))
    return tsr_errf(err, errlen, TSR_ERANGE,
                    "%s: a row of shape[1:] with %zu optimizer slot(s) does "
                    "not fit in memory sizes",
                    s->var.name, slots);
  int64_t dim0 = s->var.rank ? s->var.shape[0] : 1, end;
  if (!ps_var_spec_sparse(s) || s->bounded) {
    if (s->shard.row0 < 0 || s->shard.rows < 1 ||
        tsr_add_i64(s->shard.row0, s->shard.rows, &end) || end > dim0)
      return tsr_errf(err, errlen, TSR_EINVAL,
                      "%s: rows (row0 %" PRId64 ", rows %" PRId64
                      ") are "
                      "empty or reach outside dim0 %" PRId64,
                      s->var.name, s->shard.row0, s->shard.rows, dim0);
  } else if (s->shard.row0 < 0 || s->shard.rows < 0) {
    return tsr_errf(err, errlen, TSR_EINVAL,
                    "%s: row0 %" PRId64 " / rows %" PRId64
                    " must not be "
                    "negative",
                    s->var.name, s->shard.row0, s->shard.rows);
  }
  if (!ps_var_spec_sparse(s) &&
      (tsr_mul_i64(s->shard.rows, width, &numel) ||
       tsr_mul3_size((size_t)numel, sizeof(float), 1 + slots, &bytes)))
    return tsr_errf(err, errlen, TSR_ERANGE,
                    "%s shard %d: %" PRId64 " rows of %" PRId64
                    " elements "
                    "(with %zu slot(s)) overflow a memory size",
                    s->var.name, s->shard.shard, s->shard.rows, width, slots);
  if (s->materialized && (!ps_var_spec_sparse(s) || !s->bounded))
    return tsr_errf(err, errlen, TSR_EINVAL,
                    "%s: materialized is for bounded sparse tables only",
                    s->var.name);
  if (ps_var_spec_sparse(s) && tsr_mul_size(bytes, PS_ROWS_PER_CHUNK, &bytes))
    return tsr_errf(err, errlen, TSR_ERANGE,
                    "%s: rows of %" PRId64 " elements are too wide to hold",
                    s->var.name, width);
  const tsr_init_spec *in = &s->var.init;
  if ((unsigned)in->kind > TSR_INIT_FORGET_BIAS)
    return tsr_errf(err, errlen, TSR_EINVAL,
                    "%s: initializer kind %d is "
                    "unknown",
                    s->var.name, (int)in->kind);
  if (!sp_finite(in->a) || !sp_finite(in->b))
    return tsr_errf(err, errlen, TSR_EINVAL,
                    "%s: initializer arguments a %g, b %g must be finite",
                    s->var.name, in->a, in->b);
  if (in->kind == TSR_INIT_UNIFORM && in->a > in->b)
    return tsr_errf(err, errlen, TSR_EINVAL,
                    "%s: uniform initializer minval %g > maxval %g",
                    s->var.name, in->a, in->b);
  if ((in->kind == TSR_INIT_NORMAL || in->kind == TSR_INIT_TRUNCATED_NORMAL) &&
      in->b < 0)
    return tsr_errf(err, errlen, TSR_EINVAL,
                    "%s: initializer stddev %g must be >= 0", s->var.name,
                    in->b);
  if (in->fan_in < 0 || in->fan_out < 0)
    return tsr_errf(err, errlen, TSR_EINVAL,
                    "%s: initializer fan_in %" PRId64 " / fan_out %" PRId64
                    " must not be negative",
                    s->var.name, in->fan_in, in->fan_out);
  const tsr_optim_spec *o = &s->optim;
  if (!sp_finite(o->learning_rate) || !(o->learning_rate >= 0))
    return tsr_errf(err, errlen, TSR_EINVAL,
                    "%s: optimizer.learning_rate %g must be finite and >= 0",
                    s->var.name, o->learning_rate);
  int rc;
  if ((rc = sp_hyper(s, "momentum", o->momentum, 0, 1, true, err, errlen)) ||
      (rc = sp_hyper(s, "beta_1", o->beta_1, 0, 1, true, err, errlen)) ||
      (rc = sp_hyper(s, "beta_2", o->beta_2, 0, 1, true, err, errlen)) ||
      (rc = sp_hyper(s, "rho", o->rho, 0, 1, true, err, errlen)) ||
      (rc = sp_hyper(s, "epsilon", o->epsilon, 0, HUGE_VAL, false, err,
                     errlen)) ||
      (rc = sp_hyper(s, "initial_accumulator_value",
                     o->initial_accumulator_value, 0, HUGE_VAL, false, err,
                     errlen)) ||
      (rc = sp_hyper(s, "learning_rate_power", o->learning_rate_power,
                     -HUGE_VAL, 0, false, err, errlen)) ||
      (rc = sp_hyper(s, "l1", o->l1, 0, HUGE_VAL, false, err, errlen)) ||
      (rc = sp_hyper(s, "l2", o->l2, 0, HUGE_VAL, false, err, errlen)) ||
      (rc = sp_hyper(s, "l2_shrinkage", o->l2_shrinkage, 0, HUGE_VAL, false,
                     err, errlen)) ||
      (rc = sp_hyper(s, "beta", o->beta, 0, HUGE_VAL, false, err, errlen)) ||
      (rc = sp_hyper(s, "weight_decay", o->weight_decay, 0, HUGE_VAL, false,
                     err, errlen)) ||
      (rc = sp_hyper(s, "clipnorm", o->clipnorm, 0, HUGE_VAL, false, err,
                     errlen)) ||
      (rc = sp_hyper(s, "global_clipnorm", o->global_clipnorm, 0, HUGE_VAL,
                     false, err, errlen)) ||
      (rc = sp_hyper(s, "clipvalue", o->clipvalue, 0, HUGE_VAL, false, err,
                     errlen)))
    return rc;
  return 0;
}

static int sp_optim_kind(const char *name, tsr_opt_kind *k) {
  int i = tsr_optim_kind_parse(name);
  if (i < 0) return TSR_EINVAL;
  *k = (tsr_opt_kind)i;
  return 0;
}

/* The schedule from the wire, checked as the job parser checks it. */
static int sp_schedule(const Tessera__Ps__LrSchedule *p, const char *var,
                       tsr_lr_schedule *s, char *err, size_t errlen) {
  memset(s, 0, sizeof *s);
  if (!p || !p->kind || !p->kind[0] || !strcmp(p->kind, "constant")) return 0;
  int kind = -1;
  for (int i = 1; i <= TSR_LR_INVERSE_TIME; i++)
    if (!strcmp(p->kind, tsr_lr_schedule_name((tsr_lr_kind)i))) kind = i;
  if (kind < 0)
    return tsr_errf(err, errlen, TSR_EINVAL, "%s: unknown learning-rate "
                    "schedule \"%s\"", var, p->kind);
  s->kind = (tsr_lr_kind)kind;
#define SP_FROM_WIRE(m) s->m = p->m;
  TSR_LR_SCHEDULE_SCALARS(SP_FROM_WIRE)
#undef SP_FROM_WIRE
  if (s->kind == TSR_LR_PIECEWISE) {
    if (p->n_boundaries > TSR_LR_MAX_BOUNDARIES ||
        p->n_values != p->n_boundaries + 1)
      return tsr_errf(err, errlen, TSR_EINVAL, "%s: piecewise schedule with "
                      "%zu boundaries and %zu values (at most %d boundaries, "
                      "one value more)", var, p->n_boundaries, p->n_values,
                      TSR_LR_MAX_BOUNDARIES);
    s->n_boundaries = (int)p->n_boundaries;
    for (size_t i = 0; i < p->n_boundaries; i++)
      s->boundaries[i] = p->boundaries[i];
    for (size_t i = 0; i < p->n_values; i++) s->values[i] = p->values[i];
  } else if (!(s->decay_steps > 0) || !(s->initial > 0) ||
             (s->kind == TSR_LR_COSINE_RESTARTS && !(s->t_mul > 0))) {
    return tsr_errf(err, errlen, TSR_EINVAL, "%s: %s needs decay_steps > 0 "
                    "and initial > 0", var, p->kind);
  }
  return 0;
}

int ps__spec_from_proto(const Tessera__Ps__VarSpec *v, ps_var_spec *s,
                        char *err, size_t errlen) {
  memset(s, 0, sizeof *s);
  if (!v->name || !v->name[0])
    return tsr_errf(err, errlen, TSR_EINVAL, "create: a variable has no name");
  if (strlen(v->name) >= TSR_VAR_NAME_MAX)
    return tsr_errf(err, errlen, TSR_EINVAL,
                    "create: name \"%.40s...\" is "
                    "longer than %d bytes",
                    v->name, TSR_VAR_NAME_MAX - 1);
  snprintf(s->var.name, sizeof s->var.name, "%s", v->name);
  if (v->n_shape > TSR_MAX_RANK)
    return tsr_errf(err, errlen, TSR_EINVAL, "%s: rank %zu over %d", v->name,
                    v->n_shape, TSR_MAX_RANK);
  if (v->dtype && v->dtype[0] && strcmp(v->dtype, "float32"))
    return tsr_errf(err, errlen, TSR_EDTYPE, "%s: dtype \"%s\": variables are "
                    "held as float32", v->name, v->dtype);
  s->var.rank = (int)v->n_shape;
  for (int i = 0; i < TSR_MAX_RANK; i++)
    s->var.shape[i] = i < s->var.rank ? v->shape[i] : 1;
  s->var.dtype = TSR_DT_FLOAT32;
  s->var.kind = v->sparse ? TSR_VAR_ROW_SPARSE : TSR_VAR_DENSE;
  s->bounded = v->bounded;
  s->materialized = v->materialized;
  s->shard.shard = v->shard;
  s->shard.num_shards = v->num_shards;
  s->shard.row0 = v->row0;
  s->shard.rows = v->rows;
  s->seed = v->seed;
  if (v->init_path && v->init_path[0]) {
    if (strlen(v->init_path) >= sizeof s->init_path)
      return tsr_errf(err, errlen, TSR_EINVAL, "%s: init_path longer than %zu "
                      "bytes", v->name, sizeof s->init_path - 1);
    snprintf(s->init_path, sizeof s->init_path, "%s", v->init_path);
  }
  if (!ps_var_spec_sparse(s) && s->var.rank == 0 && s->shard.rows == 0)
    s->shard.rows = 1;
  const char *iname =
      v->init && v->init->name && v->init->name[0]
          ? v->init->name
          : (ps_var_spec_sparse(s) ? "random_uniform" : "glorot_uniform");
  if (tsr_init_parse(iname, &s->var.init))
    return tsr_errf(err, errlen, TSR_EINVAL, "%s: unknown initializer \"%s\"",
                    v->name, iname);
  if (v->init) {
    if (v->init->a != 0 || v->init->b != 0) {
      s->var.init.a = v->init->a;
      s->var.init.b = v->init->b;
    }
    s->var.init.fan_in = v->init->fan_in;
    s->var.init.fan_out = v->init->fan_out;
  }
  const Tessera__Ps__Optimizer *o = v->optimizer;
  if (!o || !o->name || sp_optim_kind(o->name, &s->optim.kind))
    return tsr_errf(err, errlen, TSR_EINVAL, "%s: unknown optimizer \"%s\" "
                    "(sgd, adagrad, rmsprop, adam, adamw, nadam, adamax, "
                    "ftrl)", v->name, o && o->name ? o->name : "");
  s->optim.learning_rate = o->learning_rate;
  s->optim.momentum = o->momentum;
  s->optim.nesterov = o->nesterov;
  s->optim.beta_1 = o->beta_1;
  s->optim.beta_2 = o->beta_2;
  s->optim.epsilon = o->epsilon;
  s->optim.rho = o->rho;
  s->optim.centered = o->centered;
  s->optim.initial_accumulator_value = o->initial_accumulator_value;
  s->optim.learning_rate_power = o->learning_rate_power;
  s->optim.l1 = o->l1;
  s->optim.l2 = o->l2;
  s->optim.l2_shrinkage = o->l2_shrinkage;
  s->optim.beta = o->beta;
  s->optim.weight_decay = o->weight_decay;
  s->optim.clipnorm = o->clipnorm;
  s->optim.global_clipnorm = o->global_clipnorm;
  s->optim.clipvalue = o->clipvalue;
  int rc = sp_schedule(o->schedule, v->name, &s->optim.schedule, err, errlen);
  if (rc) return rc;
  if (s->optim.schedule.kind == TSR_LR_CONSTANT)
    s->optim.schedule.initial = s->optim.learning_rate;
  if (!(s->optim.weight_decay >= 0) || !(s->optim.clipvalue >= 0) ||
      !(s->optim.clipnorm >= 0) || !(s->optim.global_clipnorm >= 0))
    return tsr_errf(err, errlen, TSR_EINVAL, "%s: weight_decay and clipping "
                    "values must be >= 0", v->name);
  rc = ps__spec_validate(s, err, errlen);
  if (rc) return rc;
  /* the derived sizes (validate checked the row's width fits) */
  s->var.row_dim = ps__spec_width(s);
  if (tsr_mul_i64(s->var.shape[0], s->var.row_dim, &s->var.numel))
    s->var.numel = 0;
  return 0;
}

int ps__mode_parse(const char *str, ps_mode *mode, int *staleness) {
  *staleness = 0;
  if (!str || !str[0] || strcmp(str, "async") == 0) {
    *mode = PS_MODE_ASYNC;
    return 0;
  }
  if (strcmp(str, "sync") == 0) {
    *mode = PS_MODE_SYNC;
    return 0;
  }
  if (strncmp(str, "ssp:", 4) == 0) {
    char *end;
    long v = strtol(str + 4, &end, 10);
    if (end == str + 4 || *end || v < 0 || v > 1000000) return TSR_EINVAL;
    *mode = PS_MODE_SSP;
    *staleness = (int)v;
    return 0;
  }
  return TSR_EINVAL;
}
