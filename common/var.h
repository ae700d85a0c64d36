/* The one description of a model variable (tsr_var) and of a shard of one
 * (tsr_shard), shared by the chief, the worker, the PS client and the
 * partitioner.
 *
 * Happy path: the model description lists its variables as tsr_var
 * (tsr_var_set fills the derived sizes and the Keras fans); the
 * partitioner (partition.h) cuts them into tsr_shard entries; the chief
 * and the worker keep both; the PS client turns a (tsr_var, tsr_shard)
 * pair into its wire spec in one place.
 * Failure modes: a rank out of range, a dimension <= 0, an element count
 * that overflows int64, a name too long, an unknown dtype or initializer
 * name: TSR_EINVAL with the variable and the value named.
 */
#ifndef TSR_VAR_H
#define TSR_VAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TSR_MAX_RANK 8
#define TSR_VAR_NAME_MAX 128

/* Element types a variable may have (the PS keeps float32 today; the
 * partitioner counts the bytes of any of them). */
typedef enum {
  TSR_DT_FLOAT32 = 0,
  TSR_DT_FLOAT16,
  TSR_DT_BFLOAT16,
  TSR_DT_FLOAT64,
  TSR_DT_INT64,
  TSR_DT_INT32,
  TSR_DT_INT8,
  TSR_DT_UINT8
} tsr_dtype;

typedef enum { TSR_VAR_DENSE = 0, TSR_VAR_ROW_SPARSE = 1 } tsr_var_kind;

/* Keras initializers; every element's value is a pure function of (seed,
 * variable name, element index): kernels/init.h draws them. */
typedef enum {
  TSR_INIT_ZEROS = 0,
  TSR_INIT_ONES,
  TSR_INIT_CONSTANT,        /* a */
  TSR_INIT_UNIFORM,         /* [a, b) */
  TSR_INIT_NORMAL,          /* mean a, stddev b */
  TSR_INIT_TRUNCATED_NORMAL,/* mean a, stddev b, redrawn beyond 2 stddev */
  TSR_INIT_GLOROT_UNIFORM,  /* limit sqrt(6/(fan_in+fan_out)) */
  TSR_INIT_GLOROT_NORMAL,   /* truncated normal, stddev sqrt(2/(fan_in+fan_out))/.87962566 */
  TSR_INIT_HE_UNIFORM,      /* limit sqrt(6/fan_in) */
  TSR_INIT_HE_NORMAL,       /* truncated normal, stddev sqrt(2/fan_in)/.87962566 */
  TSR_INIT_ORTHOGONAL,      /* gain a times a [fan_in, fan_out] matrix with
                             * orthonormal rows or columns (rank 2 only) */
  TSR_INIT_FORGET_BIAS      /* LSTM unit_forget_bias: ones on [a, 2a)
                             * (the forget gate of a units), zeros elsewhere */
} tsr_init_kind;

typedef struct {
  tsr_init_kind kind;
  double a, b;              /* see above */
  int64_t fan_in, fan_out;  /* for glorot/he (Keras: kernel [in, out]) */
} tsr_init_spec;

typedef struct {
  char name[TSR_VAR_NAME_MAX]; /* Keras name: "dense/kernel",
                                * "embedding/embeddings",
                                * "batch_normalization/moving_mean" */
  int rank;                    /* 0..TSR_MAX_RANK (a Conv2D kernel is
                                * [kh, kw, in, out]) */
  int64_t shape[TSR_MAX_RANK]; /* unused axes are 1 */
  int64_t numel;               /* product of the shape */
  int64_t row_dim;             /* elements per axis-0 row */
  tsr_dtype dtype;
  tsr_var_kind kind;           /* row-sparse: rows move by id */
  tsr_init_spec init;
  bool trainable;              /* false: a moving statistic
                                * (BatchNormalization), whose "gradient" is
                                * the batch's statistic and whose update is
                                * the moving average below */
  double momentum;             /* !trainable: new = momentum * old +
                                * (1 - momentum) * batch statistic (Keras) */
  float l1, l2;                /* regularizer factors: l1*sum|w| +
                                * l2*sum w^2 is added to the loss, as Keras
                                * adds it */
} tsr_var;

/* One shard of one variable: rows [row0, row0 + rows) of axis 0. */
typedef struct {
  int var;         /* index into the variable list */
  int shard;       /* index within the variable */
  int num_shards;  /* shards of that variable */
  int64_t row0;    /* first row (axis 0) */
  int64_t rows;    /* number of rows */
  int ps;          /* PS task index (position in the ps job) */
} tsr_shard;

/* Sets name, rank, shape (unused axes 1), numel, row_dim, dtype and kind;
 * the rest zeroed, trainable true, initializer zeros. TSR_EINVAL (err
 * names the variable and the value) for a name of TSR_VAR_NAME_MAX bytes
 * or more, a rank out of 0..TSR_MAX_RANK, a dimension <= 0, or an element
 * count or byte size over INT64_MAX. */
int tsr_var_set(tsr_var *v, const char *name, int rank, const int64_t *shape,
                tsr_dtype dtype, tsr_var_kind kind, char *err, size_t errlen);

/* Sets v->init to `init` with Keras's fans for the variable's shape: a
 * kernel [..., in, out] has fan_in = in * receptive field and fan_out =
 * out * receptive field (the product of the leading axes); glorot and he
 * initializers of rank 2 or more only, other fans are left at zero. */
void tsr_var_set_init(tsr_var *v, const tsr_init_spec *init);

/* Bytes of one element; 0 for a value out of the enum. */
size_t tsr_dtype_size(tsr_dtype dt);
/* "float32", ...; "?" for a value out of the enum. */
const char *tsr_dtype_name(tsr_dtype dt);
/* Numpy's names and the job's precision names (fp32, fp16, bf16);
 * TSR_EINVAL for another. */
int tsr_dtype_parse(const char *s, tsr_dtype *out);

/* Keras name ("glorot_uniform", "GlorotUniform", "zeros", ...) to a spec
 * with Keras's default arguments; TSR_EINVAL for an unknown name. */
int tsr_init_parse(const char *name, tsr_init_spec *out);
/* The snake_case name of a kind ("?" out of the enum). */
const char *tsr_init_name(tsr_init_kind kind);

#endif
