/* Shard specs from the wire (VarSpec) to their C form (ps_var_spec), and
 * the consistency mode text. Every error names the variable and the field.
 * (The client's side, ps_var_spec_init and the VarSpec it sends, is
 * client_spec.c.)
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
  if (kern_init_parse(iname, &s->init))
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
