/* Shard specs between their C form (ps_var_spec) and the wire (VarSpec),
 * the consistency mode text, and ps_var_spec_init for callers that place
 * shards. Every error names the variable and the field.
 */
#include "ps/svc_int.h"
#include "common/err.h"
#include "common/partition.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

int ps_var_spec_init(ps_var_spec *s, const char *name, int rank,
                     const int64_t *shape, int shard, int num_shards,
                     const char *init, uint64_t seed,
                     const tsr_optim_spec *optim) {
  memset(s, 0, sizeof *s);
  if (!name || strlen(name) >= PS_NAME_MAX || rank < 0 || rank > PS_MAX_RANK ||
      num_shards < 1 || shard < 0 || shard >= num_shards)
    return TSR_EINVAL;
  snprintf(s->name, sizeof s->name, "%s", name);
  s->rank = rank;
  for (int i = 0; i < rank; i++) {
    if (shape[i] <= 0) return TSR_EINVAL;
    s->shape[i] = shape[i];
  }
  s->shard = shard;
  s->num_shards = num_shards;
  int64_t dim0 = rank ? shape[0] : 1;
  if (num_shards > dim0) return TSR_EINVAL;
  tsr_partition_rows(dim0, num_shards, shard, &s->row0, &s->rows);
  if (tsr_init_parse(init, &s->init)) return TSR_EINVAL;
  /* Keras fans: receptive field times the last two dims */
  if (rank >= 2) {
    int64_t rf = 1;
    for (int i = 0; i < rank - 2; i++) rf *= shape[i];
    s->init.fan_in = shape[rank - 2] * rf;
    s->init.fan_out = shape[rank - 1] * rf;
  } else if (rank == 1) {
    s->init.fan_in = s->init.fan_out = shape[0];
  } else {
    s->init.fan_in = s->init.fan_out = 1;
  }
  s->seed = seed;
  s->optim = *optim;
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
  s->initial = p->initial;
  s->decay_steps = p->decay_steps;
  s->decay_rate = p->decay_rate;
  s->staircase = p->staircase;
  s->alpha = p->alpha;
  s->warmup = p->warmup;
  s->warmup_target = p->warmup_target;
  s->warmup_steps = p->warmup_steps;
  s->t_mul = p->t_mul;
  s->m_mul = p->m_mul;
  s->end_lr = p->end_lr;
  s->power = p->power;
  s->cycle = p->cycle;
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

static void sp_schedule_to_proto(const tsr_lr_schedule *s,
                                 Tessera__Ps__LrSchedule *p) {
  tessera__ps__lr_schedule__init(p);
  p->kind = (char *)tsr_lr_schedule_name(s->kind);
  p->initial = s->initial;
  p->decay_steps = s->decay_steps;
  p->decay_rate = s->decay_rate;
  p->staircase = s->staircase;
  p->alpha = s->alpha;
  p->warmup = s->warmup;
  p->warmup_target = s->warmup_target;
  p->warmup_steps = s->warmup_steps;
  p->t_mul = s->t_mul;
  p->m_mul = s->m_mul;
  p->end_lr = s->end_lr;
  p->power = s->power;
  p->cycle = s->cycle;
  if (s->kind == TSR_LR_PIECEWISE) {
    p->n_boundaries = (size_t)s->n_boundaries;
    p->boundaries = (double *)s->boundaries;
    p->n_values = (size_t)s->n_boundaries + 1;
    p->values = (double *)s->values;
  }
}

int ps__spec_from_proto(const Tessera__Ps__VarSpec *v, ps_var_spec *s,
                        char *err, size_t errlen) {
  memset(s, 0, sizeof *s);
  if (!v->name || !v->name[0])
    return tsr_errf(err, errlen, TSR_EINVAL, "create: a variable has no name");
  if (strlen(v->name) >= PS_NAME_MAX)
    return tsr_errf(err, errlen, TSR_EINVAL, "create: name \"%.40s...\" is "
                    "longer than %d bytes", v->name, PS_NAME_MAX - 1);
  snprintf(s->name, sizeof s->name, "%s", v->name);
  if (v->n_shape > PS_MAX_RANK)
    return tsr_errf(err, errlen, TSR_EINVAL, "%s: rank %zu over %d", v->name,
                    v->n_shape, PS_MAX_RANK);
  if (v->dtype && v->dtype[0] && strcmp(v->dtype, "float32"))
    return tsr_errf(err, errlen, TSR_EDTYPE, "%s: dtype \"%s\": variables are "
                    "held as float32", v->name, v->dtype);
  s->rank = (int)v->n_shape;
  for (size_t i = 0; i < v->n_shape; i++) s->shape[i] = v->shape[i];
  s->sparse = v->sparse;
  s->bounded = v->bounded;
  s->shard = v->shard;
  s->num_shards = v->num_shards;
  s->row0 = v->row0;
  s->rows = v->rows;
  s->seed = v->seed;
  if (v->init_path && v->init_path[0]) {
    if (strlen(v->init_path) >= sizeof s->init_path)
      return tsr_errf(err, errlen, TSR_EINVAL, "%s: init_path longer than %zu "
                      "bytes", v->name, sizeof s->init_path - 1);
    snprintf(s->init_path, sizeof s->init_path, "%s", v->init_path);
  }
  if (!s->sparse && s->rank == 0 && s->rows == 0) s->rows = 1;
  const char *iname = v->init && v->init->name && v->init->name[0]
                          ? v->init->name
                          : (s->sparse ? "random_uniform" : "glorot_uniform");
  if (tsr_init_parse(iname, &s->init))
    return tsr_errf(err, errlen, TSR_EINVAL, "%s: unknown initializer \"%s\"",
                    v->name, iname);
  if (v->init) {
    if (v->init->a != 0 || v->init->b != 0) {
      s->init.a = v->init->a;
      s->init.b = v->init->b;
    }
    s->init.fan_in = v->init->fan_in;
    s->init.fan_out = v->init->fan_out;
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
  if (s->optim.momentum < 0 || s->optim.momentum >= 1)
    return tsr_errf(err, errlen, TSR_EINVAL, "%s: momentum %g not in [0, 1)",
                    v->name, s->optim.momentum);
  return 0;
}

void ps__spec_to_proto(const ps_var_spec *s, Tessera__Ps__VarSpec *v,
                       Tessera__Ps__Initializer *in, Tessera__Ps__Optimizer *o,
                       Tessera__Ps__LrSchedule *sched, int64_t *shape_buf) {
  tessera__ps__var_spec__init(v);
  tessera__ps__initializer__init(in);
  tessera__ps__optimizer__init(o);
  v->name = (char *)s->name;
  for (int i = 0; i < s->rank; i++) shape_buf[i] = s->shape[i];
  v->n_shape = (size_t)s->rank;
  v->shape = shape_buf;
  v->sparse = s->sparse;
  v->bounded = s->bounded;
  v->shard = s->shard;
  v->num_shards = s->num_shards;
  v->row0 = s->row0;
  v->rows = s->rows;
  v->seed = s->seed;
  v->dtype = (char *)"float32";
  if (s->init_path[0]) v->init_path = (char *)s->init_path;
  in->name = (char *)tsr_init_name(s->init.kind);
  in->a = s->init.a;
  in->b = s->init.b;
  in->fan_in = s->init.fan_in;
  in->fan_out = s->init.fan_out;
  v->init = in;
  o->name = (char *)tsr_optim_name(s->optim.kind);
  o->learning_rate = s->optim.learning_rate;
  o->momentum = s->optim.momentum;
  o->nesterov = s->optim.nesterov;
  o->beta_1 = s->optim.beta_1;
  o->beta_2 = s->optim.beta_2;
  o->epsilon = s->optim.epsilon;
  o->rho = s->optim.rho;
  o->centered = s->optim.centered;
  o->initial_accumulator_value = s->optim.initial_accumulator_value;
  o->learning_rate_power = s->optim.learning_rate_power;
  o->l1 = s->optim.l1;
  o->l2 = s->optim.l2;
  o->l2_shrinkage = s->optim.l2_shrinkage;
  o->beta = s->optim.beta;
  o->weight_decay = s->optim.weight_decay;
  o->clipnorm = s->optim.clipnorm;
  o->global_clipnorm = s->optim.global_clipnorm;
  o->clipvalue = s->optim.clipvalue;
  if (s->optim.schedule.kind != TSR_LR_CONSTANT) {
    sp_schedule_to_proto(&s->optim.schedule, sched);
    o->schedule = sched;
  }
  v->optimizer = o;
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
