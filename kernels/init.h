/* Deterministic initializers: every element's
 * initial value is a pure function of (seed, variable name, element index
 * in the full variable), so a variable starts with the same values however
 * it is sharded, on however many PS, and in the standalone trainer.
 *
 * The generator is counter based (a SplitMix64-style mix of the three keys
 * into 64 bits, then 24 bits to a float in [0, 1)); no state is carried
 * between calls, so any range of elements can be filled independently.
 * Keras defaults: Dense kernels glorot_uniform, biases zeros, embeddings
 * uniform(-0.05, 0.05).
 */
#ifndef TSR_KERN_INIT_H
#define TSR_KERN_INIT_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
  KERN_INIT_ZEROS = 0,
  KERN_INIT_ONES,
  KERN_INIT_CONSTANT,        /* a */
  KERN_INIT_UNIFORM,         /* [a, b) */
  KERN_INIT_NORMAL,          /* mean a, stddev b */
  KERN_INIT_TRUNCATED_NORMAL,/* mean a, stddev b, redrawn beyond 2 stddev */
  KERN_INIT_GLOROT_UNIFORM,  /* limit sqrt(6/(fan_in+fan_out)) */
  KERN_INIT_GLOROT_NORMAL,   /* truncated normal, stddev sqrt(2/(fan_in+fan_out))/.87962566 */
  KERN_INIT_HE_UNIFORM,      /* limit sqrt(6/fan_in) */
  KERN_INIT_HE_NORMAL        /* truncated normal, stddev sqrt(2/fan_in)/.87962566 */
} kern_init_kind;

typedef struct {
  kern_init_kind kind;
  double a, b;              /* see above */
  int64_t fan_in, fan_out;  /* for glorot/he (Keras: kernel [in, out]) */
} kern_init_spec;

/* Keras name ("glorot_uniform", "zeros", "random_uniform", ...) to a spec
 * with Keras's default arguments; TSR_EINVAL for an unknown name. */
int kern_init_parse(const char *name, kern_init_spec *out);
const char *kern_init_name(kern_init_kind kind);

/* 64-bit key of a variable name (FNV-1a), so the chief, the PS and the
 * standalone trainer agree on it. */
uint64_t kern_init_var_key(const char *name);

/* Fills out[0..n) with the values of elements first .. first+n-1 of the
 * variable keyed (seed, var_key). */
void kern_init_fill(const kern_init_spec *spec, uint64_t seed,
                    uint64_t var_key, uint64_t first, float *out, size_t n);

/* The uniform [0,1) draw behind every initializer, exposed for tests and
 * for data generators that need the same determinism. */
double kern_init_uniform01(uint64_t seed, uint64_t var_key, uint64_t index,
                           uint32_t draw);

#endif
