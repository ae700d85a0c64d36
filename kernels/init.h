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

#include "common/var.h"

/* The initializer's description (tsr_init_spec: kind, arguments, fans)
 * and its names are common/var.h's. */

/* 64-bit key of a variable name (FNV-1a), so the chief, the PS and the
 * standalone trainer agree on it. */
uint64_t kern_init_var_key(const char *name);

/* Fills out[0..n) with the values of elements first .. first+n-1 of the
 * variable keyed (seed, var_key). */
void kern_init_fill(const tsr_init_spec *spec, uint64_t seed,
                    uint64_t var_key, uint64_t first, float *out, size_t n);

/* The uniform [0,1) draw behind every initializer, exposed for tests and
 * for data generators that need the same determinism. */
double kern_init_uniform01(uint64_t seed, uint64_t var_key, uint64_t index,
                           uint32_t draw);

#endif
