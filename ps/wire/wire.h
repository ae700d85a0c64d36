/* What the PS and its clients both speak, below both: the method numbers,
 * the wire dtypes of gradients and pulled values, the limits a PS
 * enforces on what a client sends, the shard spec a create carries
 * (ps_var_spec) with its row width, and the bfloat16 conversions. The
 * server (ps/) and the client (ps/client/) include this and nothing of
 * each other; an optimizer's slot count is kern_optim_num_slots
 * (kernels/optim.h), below both too.
 */
#ifndef TSR_PS_WIRE_H
#define TSR_PS_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/optim_spec.h"
#include "common/var.h"

/* Longest init_path (with its terminating zero). */
#define PS_INIT_PATH_MAX 256
/* Largest worker index a PS accepts (pulls, pushes, clocks). */
#define PS_WORKER_MAX 65535

/* Method numbers of tessera-ps. */
enum {
  PS_M_CREATE = 0x401,
  PS_M_PULL = 0x402,
  PS_M_PULL_ROWS = 0x403,
  PS_M_PUSH = 0x404,
  PS_M_PUSH_ROWS = 0x405,
  PS_M_PUSH_PULL = 0x406,
  PS_M_CLOCK = 0x407,
  PS_M_CONFIG = 0x408,
  PS_M_SAVE = 0x409,
  PS_M_RESTORE = 0x40a,
  PS_M_STATS = 0x40b,
  PS_M_SHUTDOWN = 0x40c,
};

/* Wire dtypes of gradients (values are always float32 on the PS). */
typedef enum { PS_DT_F32 = 0, PS_DT_BF16 = 1, PS_DT_F16 = 2 } ps_dtype;

/* Bytes per value of a wire dtype (`dt` as it came off the wire: 0 for
 * one that is no ps_dtype), and its name for messages. */
static inline size_t ps__dtype_size(int dt) {
  switch (dt) {
    case PS_DT_F32: return 4;
    case PS_DT_BF16: return 2;
    case PS_DT_F16: return 2;
  }
  return 0;
}

static inline const char *ps__dtype_name(int dt) {
  switch (dt) {
    case PS_DT_F32: return "float32";
    case PS_DT_BF16: return "bfloat16";
    case PS_DT_F16: return "float16";
  }
  return "?";
}

/* One shard of one variable as a create sends it: the variable itself
 * (common/var.h), the shard's rows, and what only the PS needs beyond
 * them. Enough to build the shard, and to tell whether a second create
 * names the same thing. */
typedef struct {
  tsr_var var;     /* name, rank, shape (the full variable), kind
                      (row-sparse: rows by id, created on first touch),
                      initializer with its fans; dtype float32, the one
                      the PS holds. The PS reads only these; it fills
                      row_dim, and numel where the element count fits
                      int64 (0 where a table's nominal rows overflow it) */
  tsr_shard shard; /* shard, num_shards, row0, rows (dense, or sparse
                      bounded); var and ps are the chief's and unused */
  bool bounded;    /* sparse: ids in [row0, row0+rows); unbounded:
                      id % num_shards == shard */
  uint64_t seed;
  tsr_optim_spec optim;
  char init_path[PS_INIT_PATH_MAX]; /* non-empty: initial values from
                                       this file (the whole variable as
                                       raw little-endian float32,
                                       row-major: a job's initial_weights),
                                       read by every PS */
} ps_var_spec;

/* Whether the spec's variable is row-sparse. */
static inline bool ps_var_spec_sparse(const ps_var_spec *s) {
  return s->var.kind == TSR_VAR_ROW_SPARSE;
}

/* Elements per row: product of shape[1..rank). */
static inline int64_t ps__spec_width(const ps_var_spec *s) {
  int64_t w = 1;
  for (int i = 1; i < s->var.rank; i++) w *= s->var.shape[i];
  return w;
}

/* bfloat16 conversions of the wire (round to nearest even, overflow to
 * inf; NaN stays a NaN). ps_bf16_from_f32 may write over its own source
 * (dst == (uint16_t *)src: the PS packs gathered rows in place); otherwise
 * the buffers must not overlap. */
void ps_bf16_from_f32(uint16_t *dst, const float *src, size_t n);
void ps_bf16_to_f32(float *dst, const uint16_t *src, size_t n);

/* Widens n bfloat16 values held in the first 2n bytes of buf into n
 * float32 in place. */
void ps__bf16_expand(float *buf, size_t n);

#endif
