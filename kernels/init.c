/* Counter-based initializers; see init.h. The normal draws use the
 * Box-Muller transform over two uniform draws of the same element (draw
 * numbers 2k and 2k+1), truncated normals redraw with the next pair. */
#include "kernels/init.h"
#include "common/err.h"

#include <math.h>
#include <string.h>

static uint64_t kern__mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t kern_init_var_key(const char *name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const unsigned char *p = (const unsigned char *)name; *p; p++) {
    h ^= *p;
    h *= 0x100000001b3ull;
  }
  return h;
}

double kern_init_uniform01(uint64_t seed, uint64_t var_key, uint64_t index,
                           uint32_t draw) {
  uint64_t z = kern__mix(seed ^ kern__mix(var_key));
  z = kern__mix(z ^ index);
  z = kern__mix(z + (uint64_t)draw * 0xd1b54a32d192ed03ull);
  /* 53 bits to a double in [0, 1) */
  return (double)(z >> 11) * (1.0 / 9007199254740992.0);
}

static double kern__normal(uint64_t seed, uint64_t key, uint64_t idx,
                           uint32_t pair) {
  double u1 = kern_init_uniform01(seed, key, idx, 2 * pair);
  double u2 = kern_init_uniform01(seed, key, idx, 2 * pair + 1);
  if (u1 < 1e-300) u1 = 1e-300;
  return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

static double kern__truncated(uint64_t seed, uint64_t key, uint64_t idx) {
  for (uint32_t k = 0; k < 64; k++) {
    double z = kern__normal(seed, key, idx, k);
    if (z > -2.0 && z < 2.0) return z;
  }
  return 0.0;
}


void kern_init_fill(const tsr_init_spec *s, uint64_t seed, uint64_t key,
                    uint64_t first, float *out, size_t n) {
  double fan_in = s->fan_in > 0 ? (double)s->fan_in : 1.0;
  double fan_out = s->fan_out > 0 ? (double)s->fan_out : 1.0;
  double lo = 0, hi = 0, mean = 0, sd = 0;
  int mode = 0; /* 0 const, 1 uniform, 2 normal, 3 truncated */
  switch (s->kind) {
    case TSR_INIT_ZEROS: mean = 0; break;
    case TSR_INIT_ONES: mean = 1; break;
    case TSR_INIT_CONSTANT: mean = s->a; break;
    case TSR_INIT_UNIFORM: mode = 1; lo = s->a; hi = s->b; break;
    case TSR_INIT_NORMAL: mode = 2; mean = s->a; sd = s->b; break;
    case TSR_INIT_TRUNCATED_NORMAL: mode = 3; mean = s->a; sd = s->b; break;
    case TSR_INIT_GLOROT_UNIFORM: {
      double lim = sqrt(6.0 / (fan_in + fan_out));
      mode = 1; lo = -lim; hi = lim;
      break;
    }
    case TSR_INIT_GLOROT_NORMAL:
      mode = 3; sd = sqrt(2.0 / (fan_in + fan_out)) / 0.87962566103423978;
      break;
    case TSR_INIT_HE_UNIFORM: {
      double lim = sqrt(6.0 / fan_in);
      mode = 1; lo = -lim; hi = lim;
      break;
    }
    case TSR_INIT_HE_NORMAL:
      mode = 3; sd = sqrt(2.0 / fan_in) / 0.87962566103423978;
      break;
  }
  for (size_t i = 0; i < n; i++) {
    uint64_t idx = first + i;
    double v;
    switch (mode) {
      case 1: v = lo + (hi - lo) * kern_init_uniform01(seed, key, idx, 0); break;
      case 2: v = mean + sd * kern__normal(seed, key, idx, 0); break;
      case 3: v = mean + sd * kern__truncated(seed, key, idx); break;
      default: v = mean; break;
    }
    out[i] = (float)v;
  }
}
