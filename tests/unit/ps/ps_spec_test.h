/* Shard specs for the PS tests, the fuzz seeds and the benches: a 2-D
 * float32 variable built the way a caller that places shards itself does
 * (ps_var_spec_init: TF's "div" rows, Keras fans, the optimizer's Keras
 * defaults), optionally made row-sparse. A bad argument aborts: these are
 * fixtures, not the code under test. */
#ifndef TSR_TEST_PS_SPEC_H
#define TSR_TEST_PS_SPEC_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "common/optim_spec.h"
#include "ps/client/client.h"

/* Shard `shard` of `nsh` of [d0, d1] with initializer `init`, `seed` and
 * the defaults of optimizer `k`. */
static inline ps_var_spec h_spec(const char *name, int64_t d0, int64_t d1,
                                 int shard, int nsh, const char *init,
                                 uint64_t seed, tsr_opt_kind k) {
  ps_var_spec s;
  tsr_optim_spec o;
  tsr_optim_defaults(k, &o);
  int64_t shape[2] = {d0, d1};
  if (ps_var_spec_init(&s, name, 2, shape, shard, nsh, init, seed, &o))
    abort();
  return s;
}

/* `s` as a row-sparse table whose ids are bounded by the shard's rows or
 * (unbounded) spread by id modulo the shard count. */
static inline ps_var_spec h_sparse(ps_var_spec s, bool bounded) {
  s.var.kind = TSR_VAR_ROW_SPARSE;
  s.bounded = bounded;
  return s;
}

#endif
