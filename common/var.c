/* Variables and shards: the checked constructor, Keras's fans, the dtype
 * and initializer names (see var.h). Pure: no I/O, no allocation. */
#include "common/var.h"

#include "common/err.h"

#include <stdio.h>
#include <string.h>

int tsr_var_set(tsr_var *v, const char *name, int rank, const int64_t *shape,
                tsr_dtype dtype, tsr_var_kind kind, char *err, size_t errlen) {
  memset(v, 0, sizeof *v);
  if (!name || strlen(name) >= sizeof v->name)
    return tsr_errf(err, errlen, TSR_EINVAL,
                    "variable name '%.40s...' is longer than %d bytes",
                    name ? name : "(null)", TSR_VAR_NAME_MAX - 1);
  if (rank < 0 || rank > TSR_MAX_RANK)
    return tsr_errf(err, errlen, TSR_EINVAL,
                    "%s: rank %d out of range 0..%d", name, rank,
                    TSR_MAX_RANK);
  size_t esz = tsr_dtype_size(dtype);
  if (esz == 0)
    return tsr_errf(err, errlen, TSR_EINVAL, "%s: dtype %d is not one of "
                    "float32, float16, bfloat16, float64, int64, int32, int8, uint8",
                    name, (int)dtype);
  int64_t numel = 1, bytes;
  for (int i = 0; i < TSR_MAX_RANK; i++) {
    int64_t d = i < rank ? shape[i] : 1;
    if (d <= 0)
      return tsr_errf(err, errlen, TSR_EINVAL,
                      "%s: dimension %d is %lld; a dimension must be > 0",
                      name, i, (long long)d);
    if (__builtin_mul_overflow(numel, d, &numel))
      return tsr_errf(err, errlen, TSR_EINVAL,
                      "%s: element count overflows", name);
    v->shape[i] = d;
  }
  if (__builtin_mul_overflow(numel, (int64_t)esz, &bytes))
    return tsr_errf(err, errlen, TSR_EINVAL, "%s: byte size overflows",
                    name);
  snprintf(v->name, sizeof v->name, "%s", name);
  v->rank = rank;
  v->numel = numel;
  v->row_dim = numel / v->shape[0];
  v->dtype = dtype;
  v->kind = kind;
  v->init.kind = TSR_INIT_ZEROS;
  v->trainable = true;
  return 0;
}

void tsr_var_set_init(tsr_var *v, const tsr_init_spec *init) {
  v->init = *init;
  if (v->rank >= 2 && init->kind >= TSR_INIT_GLOROT_UNIFORM) {
    /* Keras: kernel [..., in, out]; the leading axes are the receptive
     * field, which multiplies both fans */
    int64_t rf = 1;
    for (int i = 0; i < v->rank - 2; i++) rf *= v->shape[i];
    v->init.fan_in = v->shape[v->rank - 2] * rf;
    v->init.fan_out = v->shape[v->rank - 1] * rf;
  }
}

static const struct {
  const char *name;
  tsr_dtype dt;
  size_t size;
} tsr__dtypes[] = {
    {"float32", TSR_DT_FLOAT32, 4}, {"float16", TSR_DT_FLOAT16, 2},
    {"bfloat16", TSR_DT_BFLOAT16, 2}, {"float64", TSR_DT_FLOAT64, 8},
    {"int64", TSR_DT_INT64, 8},     {"int32", TSR_DT_INT32, 4},
    {"int8", TSR_DT_INT8, 1},       {"uint8", TSR_DT_UINT8, 1},
    {"fp32", TSR_DT_FLOAT32, 4},    {"fp16", TSR_DT_FLOAT16, 2},
    {"bf16", TSR_DT_BFLOAT16, 2},
};
#define TSR__N_DTYPES (sizeof tsr__dtypes / sizeof tsr__dtypes[0])

size_t tsr_dtype_size(tsr_dtype dt) {
  for (size_t i = 0; i < TSR__N_DTYPES; i++)
    if (tsr__dtypes[i].dt == dt) return tsr__dtypes[i].size;
  return 0;
}

const char *tsr_dtype_name(tsr_dtype dt) {
  for (size_t i = 0; i < TSR__N_DTYPES; i++)
    if (tsr__dtypes[i].dt == dt) return tsr__dtypes[i].name;
  return "?";
}

int tsr_dtype_parse(const char *s, tsr_dtype *out) {
  for (size_t i = 0; s && i < TSR__N_DTYPES; i++)
    if (strcmp(s, tsr__dtypes[i].name) == 0) {
      *out = tsr__dtypes[i].dt;
      return 0;
    }
  return TSR_EINVAL;
}

static const struct {
  const char *name;
  tsr_init_kind kind;
  double a, b;
} tsr__init_names[] = {
    {"zeros", TSR_INIT_ZEROS, 0, 0},
    {"Zeros", TSR_INIT_ZEROS, 0, 0},
    {"ones", TSR_INIT_ONES, 0, 0},
    {"Ones", TSR_INIT_ONES, 0, 0},
    {"constant", TSR_INIT_CONSTANT, 0, 0},
    {"Constant", TSR_INIT_CONSTANT, 0, 0},
    {"random_uniform", TSR_INIT_UNIFORM, -0.05, 0.05},
    {"RandomUniform", TSR_INIT_UNIFORM, -0.05, 0.05},
    {"uniform", TSR_INIT_UNIFORM, -0.05, 0.05},
    {"random_normal", TSR_INIT_NORMAL, 0.0, 0.05},
    {"RandomNormal", TSR_INIT_NORMAL, 0.0, 0.05},
    {"normal", TSR_INIT_NORMAL, 0.0, 0.05},
    {"truncated_normal", TSR_INIT_TRUNCATED_NORMAL, 0.0, 0.05},
    {"TruncatedNormal", TSR_INIT_TRUNCATED_NORMAL, 0.0, 0.05},
    {"glorot_uniform", TSR_INIT_GLOROT_UNIFORM, 0, 0},
    {"GlorotUniform", TSR_INIT_GLOROT_UNIFORM, 0, 0},
    {"glorot_normal", TSR_INIT_GLOROT_NORMAL, 0, 0},
    {"GlorotNormal", TSR_INIT_GLOROT_NORMAL, 0, 0},
    {"he_uniform", TSR_INIT_HE_UNIFORM, 0, 0},
    {"HeUniform", TSR_INIT_HE_UNIFORM, 0, 0},
    {"he_normal", TSR_INIT_HE_NORMAL, 0, 0},
    {"HeNormal", TSR_INIT_HE_NORMAL, 0, 0},
    {"orthogonal", TSR_INIT_ORTHOGONAL, 1.0, 0},
    {"Orthogonal", TSR_INIT_ORTHOGONAL, 1.0, 0},
    {"unit_forget_bias", TSR_INIT_FORGET_BIAS, 0, 0},
};
#define TSR__N_INITS (sizeof tsr__init_names / sizeof tsr__init_names[0])

int tsr_init_parse(const char *name, tsr_init_spec *out) {
  memset(out, 0, sizeof *out);
  for (size_t i = 0; name && i < TSR__N_INITS; i++) {
    if (strcmp(name, tsr__init_names[i].name) == 0) {
      out->kind = tsr__init_names[i].kind;
      out->a = tsr__init_names[i].a;
      out->b = tsr__init_names[i].b;
      return 0;
    }
  }
  return TSR_EINVAL;
}

const char *tsr_init_name(tsr_init_kind kind) {
  for (size_t i = 0; i < TSR__N_INITS; i++)
    if (tsr__init_names[i].kind == kind) return tsr__init_names[i].name;
  return "?";
}
