/* Internals shared by the Keras exporter and importer (keras_plan.c,
 * keras_config.c, export_keras.c, keras_in.c): how Keras lays out the
 * weights of a Sequential or Functional model.
 *
 * Keras (3, and tf_keras 2.13+) saves and loads weights by walking
 * model.layers: a Sequential's layers in order (its InputLayer left out),
 * a Functional's sorted by depth from the output (deepest first), ties in
 * the order a depth-first walk from the output first meets them. Each
 * layer's saving path is its class in snake case, numbered per class in
 * that order ("dense", "dense_1"), whatever its name; its variables are
 * the trainable ones then the non-trainable ones (BatchNormalization:
 * gamma, beta, moving_mean, moving_variance), which is the order Tessera
 * creates them in. model.get_weights() is the concatenation in the same
 * layer order.
 *
 * A layer made of sub-layers keeps their variables below its path, each
 * sub-layer numbering its own from 0 (ek_where): an LSTM's or GRU's in
 * "cell", a Bidirectional's in "forward_layer/cell" and
 * "backward_layer/cell", a MultiHeadAttention's in "query_dense",
 * "key_dense", "value_dense" and "output_dense" (tf_keras's .weights.h5:
 * "_query_dense", ...), a TimeDistributed's in "layer". Attention's
 * scale is a scalar in Keras, [1] in Tessera.
 */
#ifndef TSR_CHIEF_KERAS_INT_H
#define TSR_CHIEF_KERAS_INT_H

#include "artifacts/weights/export_keras.h"
#include "common/err.h"

#include <stdbool.h>
#include <stdint.h>

#define EK_MAX_LAYERS 256
#define EK_MAX_IN 8       /* inbound tensors of one layer */
#define EK_MAX_INPUTS 16  /* inputs of a Functional model */

typedef struct {
  char path[96];          /* saving path: "dense_1" */
  const char *name;       /* the layer's name (variables "<name>/...") */
  char defname[64];       /* Keras's default name of an unnamed Sequential
                           * layer (name points here; never copied) */
  const char *cls;        /* class_name */
  const json_t *obj;      /* the layer object of the model JSON */
  bool input;             /* an InputLayer */
  const char *in[EK_MAX_IN]; /* Functional: inbound layer names, in order */
  int n_in;
  int first, count;       /* its variables: order[first .. first+count) */
} ek_layer;

/* Where Keras keeps one variable of a layer: layers/<path>/<sub>/vars/<idx>
 * (sub "" for the layer's own variables), tf_keras's spelling of sub where
 * its .weights.h5 differs, and the rank Keras gives it. */
typedef struct {
  char sub[32];
  const char *tfk_sub; /* NULL: the same as sub */
  int idx;
  int krank;           /* -1: the variable's own rank; 0: a scalar */
} ek_where;

typedef struct {
  bool functional;
  ek_layer l[EK_MAX_LAYERS];  /* in Keras's model.layers order */
  int n;
  const chief_export_var **order; /* every variable, get_weights order */
  ek_where *where;                /* where[k]: order[k]'s place in Keras */
  size_t n_order;
  /* Sequential: the input's batch shape (from its InputLayer or the first
   * layer's batch_input_shape); Functional: per input */
  const char *inputs[EK_MAX_INPUTS];      /* input layer names, in order */
  const json_t *input_shape[EK_MAX_INPUTS]; /* [null, d1, ...] */
  int n_inputs;
  const char *output;         /* Functional: the output layer's name */
} ek_plan;

/* Each layer's saving path and its variables (by name prefix "<layer
 * name>/", in the given order, which must be Keras's within a layer).
 * Fills p->order and p->where (the caller frees them with
 * chief__keras_plan_free). A built-in model, a variable that belongs to
 * no layer and a sub-layer variable Keras does not have (a
 * MultiHeadAttention's "mha/gate/kernel") are errors. Variables given
 * without shapes (shape NULL) are placed by name alone. */
int chief__keras_plan(const json_t *model, const chief_export_var *vars,
                      size_t n, ek_plan *p, char *err, size_t errlen);
void chief__keras_plan_free(ek_plan *p);

/* Keras's get_weights order (order[k]: the index in vars of the k-th) and
 * each variable's rank as Keras stores it (krank[i] for vars[i]: -1 its
 * own, 0 a scalar; may be NULL). The built-in model keeps the given order
 * and ranks. */
int chief__keras_order(const json_t *model, const chief_export_var *vars,
                       size_t n, size_t *order, int *krank, char *err,
                       size_t errlen);

/* Whether a stored array of `rank` dims `dims` fits variable v placed with
 * Keras rank `krank`: v's own shape, or a scalar where krank is 0. */
bool chief__keras_shape_fits(const chief_export_var *v, int krank, int rank,
                             const int64_t *dims);
/* "3x3x1x8" (or "a scalar") into buf. */
void chief__shape_text(int rank, const int64_t *dims, char *buf, size_t len);

/* Keras's naming.to_snake_case ("BatchNormalization" ->
 * "batch_normalization", "Conv2D" -> "conv2d", "ReLU" -> "re_lu"). */
void chief__keras_snake(const char *in, char *out, size_t len);

/* The Keras 3 config.json object of the model (keras_config.c): the
 * model's layers in Keras 3's spelling, with a Normalization layer after
 * each input when `input` (the manifest's affine map) is given. NULL with
 * err set on a failure. */
json_t *chief__keras3_config(const json_t *model, const json_t *input,
                             const ek_plan *p, char *err, size_t errlen);

/* The affine map's (mean, variance) over columns [first, first + n) of the
 * dense features: mean = -shift/scale, variance = 1/scale^2. */
int chief__input_moments(const json_t *input, int64_t first, int64_t n,
                         json_t **mean, json_t **var, char *err,
                         size_t errlen);

/* HDF5 files (keras_h5.c). EK_H5_SAVING: "layers/<path>/vars/<i>" (Keras
 * 3, tf_keras 2.14+ .weights.h5); EK_H5_LEGACY: "<name>/<name>/<var>:0"
 * with layer_names and weight_names (tf_keras's save_weights to .h5).
 * Reading takes either (and tf_keras 2.13's root name) and fills each
 * planned variable's data, which must be writable. */
typedef enum { EK_H5_SAVING = 0, EK_H5_LEGACY } ek_h5_layout;
int chief__h5_write(const char *path, ek_h5_layout layout, const ek_plan *p,
                    char *err, size_t errlen);
int chief__h5_read(const char *path, const char *shown, const ek_plan *p,
                   char *err, size_t errlen);

#endif
