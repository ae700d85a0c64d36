/* Counter-based initializers; see init.h. The normal draws use the
 * Box-Muller transform over two uniform draws of the same element (draw
 * numbers 2k and 2k+1), truncated normals redraw with the next pair. */
#include "kernels/init.h"
#include "common/err.h"

#include <math.h>
#include <stdlib.h>
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

/* Keras's Orthogonal: a normal [max, min] draw, its QR factor with the
 * signs of R's diagonal taken out (modified Gram-Schmidt gives that R
 * directly: a positive diagonal), transposed when the matrix is wide;
 * elements [first, first+n) of gain times the [rows, cols] result. The
 * whole matrix is built for any range (it depends on every draw); a matrix
 * whose scratch cannot be allocated is left at zeros. */
static void kern__orthogonal(const tsr_init_spec *s, uint64_t seed,
                             uint64_t key, uint64_t first, float *out,
                             size_t n) {
  int64_t rows = s->fan_in > 0 ? s->fan_in : 1;
  int64_t cols = s->fan_out > 0 ? s->fan_out : 1;
  bool wide = rows < cols;
  int64_t R = wide ? cols : rows, C = wide ? rows : cols; /* tall R x C */
  double *q = malloc((size_t)(R * C) * sizeof *q);
  memset(out, 0, n * sizeof *out);
  if (!q) return;
  for (int64_t i = 0; i < R * C; i++)
    q[i] = kern__normal(seed, key, (uint64_t)i, 0); /* row-major [R, C] */
  for (int64_t j = 0; j < C; j++) {
    for (int64_t k = 0; k < j; k++) {
      double d = 0;
      for (int64_t i = 0; i < R; i++) d += q[i * C + j] * q[i * C + k];
      for (int64_t i = 0; i < R; i++) q[i * C + j] -= d * q[i * C + k];
    }
    double nrm = 0;
    for (int64_t i = 0; i < R; i++) nrm += q[i * C + j] * q[i * C + j];
    nrm = sqrt(nrm);
    for (int64_t i = 0; i < R; i++) q[i * C + j] = nrm > 0 ? q[i * C + j] / nrm : 0;
  }
  for (size_t t = 0; t < n; t++) {
    uint64_t idx = first + t;
    if (idx >= (uint64_t)(rows * cols)) break;
    int64_t r = (int64_t)idx / cols, c = (int64_t)idx % cols;
    double v = wide ? q[c * C + r] : q[r * C + c];
    out[t] = (float)(s->a * v);
  }
  free(q);
}

void kern_init_fill(const tsr_init_spec *s, uint64_t seed, uint64_t key,
                    uint64_t first, float *out, size_t n) {
  if (s->kind == TSR_INIT_ORTHOGONAL) {
    kern__orthogonal(s, seed, key, first, out, n);
    return;
  }
  if (s->kind == TSR_INIT_FORGET_BIAS) {
    for (size_t i = 0; i < n; i++) {
      double u = s->a, idx = (double)(first + i);
      out[i] = idx >= u && idx < 2 * u ? 1.0f : 0.0f;
    }
    return;
  }
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
    case TSR_INIT_ORTHOGONAL:
    case TSR_INIT_FORGET_BIAS:
      break; /* handled above */
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
