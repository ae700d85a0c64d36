/* Shard specs on the client side: ps_var_spec_from_var, the one place a
 * spec is built from a variable and its shard (checked as the PS will),
 * ps_var_spec_init for callers that place shards themselves (TF's "div"
 * rows, Keras fans), and a spec as the create request's
 * VarSpec (strings point into the spec, sub-messages and the shape into
 * the caller's storage, nothing is allocated). The PS reads it back with
 * its own checks (spec.c).
 */
#include "ps/client/client_int.h"
#include "common/err.h"
#include "common/optim_spec.h"
#include "common/partition.h"
#include "common/size.h"

#include <stdio.h>
#include <string.h>

int ps_var_spec_init(ps_var_spec *s, const char *name, int rank,
                     const int64_t *shape, int shard, int num_shards,
                     const char *init, uint64_t seed,
                     const tsr_optim_spec *optim) {
  memset(s, 0, sizeof *s);
  tsr_var v;
  tsr_init_spec in;
  if (tsr_var_set(&v, name, rank, shape, TSR_DT_FLOAT32, TSR_VAR_DENSE, NULL,
                  0) ||
      tsr_init_parse(init, &in) || num_shards < 1 || shard < 0 ||
      shard >= num_shards || num_shards > v.shape[0])
    return TSR_EINVAL;
  /* Keras fans for every initializer: receptive field times the last two
   * dims (rank 1: the one dim both ways; rank 0: 1) */
  if (rank >= 2) {
    int64_t rf;
    if (tsr_dims_product(shape, 0, rank - 2, &rf) ||
        tsr_mul_i64(shape[rank - 2], rf, &in.fan_in) ||
        tsr_mul_i64(shape[rank - 1], rf, &in.fan_out))
      return TSR_ERANGE;
  } else {
    in.fan_in = in.fan_out = rank ? shape[0] : 1;
  }
  v.init = in;
  tsr_shard sh = {.shard = shard, .num_shards = num_shards};
  tsr_partition_rows(v.shape[0], num_shards, shard, &sh.row0, &sh.rows);
  return ps_var_spec_from_var(s, &v, &sh, seed, optim, NULL);
}

int ps_var_spec_from_var(ps_var_spec *s, const tsr_var *v,
                         const tsr_shard *sh, uint64_t seed,
                         const tsr_optim_spec *optim, const char *init_path) {
  memset(s, 0, sizeof *s);
  if (!memchr(v->name, 0, sizeof v->name) || v->rank < 0 ||
      v->rank > TSR_MAX_RANK || v->dtype != TSR_DT_FLOAT32 ||
      sh->num_shards < 1 || sh->shard < 0 || sh->shard >= sh->num_shards ||
      (init_path && strlen(init_path) >= sizeof s->init_path))
    return TSR_EINVAL;
  for (int i = 0; i < v->rank; i++)
    if (v->shape[i] <= 0) return TSR_EINVAL;
  int64_t dim0 = v->rank ? v->shape[0] : 1;
  if (sh->num_shards > dim0 || sh->row0 < 0 || sh->rows < 1 ||
      sh->row0 > dim0 - sh->rows)
    return TSR_EINVAL;
  s->var = *v;
  s->shard = *sh;
  s->bounded = ps_var_spec_sparse(s);
  s->seed = seed;
  s->optim = *optim;
  if (init_path) snprintf(s->init_path, sizeof s->init_path, "%s", init_path);
  return 0;
}

static void sp_schedule_to_proto(const tsr_lr_schedule *s,
                                 Tessera__Ps__LrSchedule *p) {
  tessera__ps__lr_schedule__init(p);
  p->kind = (char *)tsr_lr_schedule_name(s->kind);
#define SP_TO_WIRE(m) p->m = s->m;
  TSR_LR_SCHEDULE_SCALARS(SP_TO_WIRE)
#undef SP_TO_WIRE
  if (s->kind == TSR_LR_PIECEWISE) {
    p->n_boundaries = (size_t)s->n_boundaries;
    p->boundaries = (double *)s->boundaries;
    p->n_values = (size_t)s->n_boundaries + 1;
    p->values = (double *)s->values;
  }
}

void ps__client_spec_to_proto(const ps_var_spec *s, Tessera__Ps__VarSpec *v,
                              Tessera__Ps__Initializer *in,
                              Tessera__Ps__Optimizer *o,
                              Tessera__Ps__LrSchedule *sched,
                              int64_t *shape_buf) {
  tessera__ps__var_spec__init(v);
  tessera__ps__initializer__init(in);
  tessera__ps__optimizer__init(o);
  v->name = (char *)s->var.name;
  for (int i = 0; i < s->var.rank; i++) shape_buf[i] = s->var.shape[i];
  v->n_shape = (size_t)s->var.rank;
  v->shape = shape_buf;
  v->sparse = ps_var_spec_sparse(s);
  v->bounded = s->bounded;
  v->materialized = s->materialized;
  v->shard = s->shard.shard;
  v->num_shards = s->shard.num_shards;
  v->row0 = s->shard.row0;
  v->rows = s->shard.rows;
  v->seed = s->seed;
  v->dtype = (char *)"float32";
  if (s->init_path[0]) v->init_path = (char *)s->init_path;
  in->name = (char *)tsr_init_name(s->var.init.kind);
  in->a = s->var.init.a;
  in->b = s->var.init.b;
  in->fan_in = s->var.init.fan_in;
  in->fan_out = s->var.init.fan_out;
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
