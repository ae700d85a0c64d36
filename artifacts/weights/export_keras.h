/* Weights out in Keras's own files: a Keras 3 `.keras` archive (a zip of
 * config.json, metadata.json and model.weights.h5) that
 * keras.models.load_model() opens, a `.weights.h5` for load_weights()
 * (Keras 3, tf_keras 2.14+), tf_keras's legacy `.h5`, and
 * input_stats.json, the input normalization a served model needs beside
 * an npz or a weights file. Weights in (initial_weights) from the same
 * files and from an npz.
 *
 * Layout (keras_int.h): each layer's variables in model.layers order
 * (Sequential: as listed; Functional: by depth from the output, as Keras
 * orders them), numbered per class for the saving paths
 * "layers/<path>/vars/<i>", a sub-layer's below it
 * ("layers/bidirectional/forward_layer/cell/vars/0",
 * "layers/multi_head_attention/query_dense/vars/0", linked under tf_keras's
 * "_query_dense" too); the legacy .h5 is "<name>/<name>/<var>:0".
 * Attention's scale is written as Keras's scalar and read as a scalar or
 * as Tessera's [1].
 * Variables within a layer in Keras's order (BatchNormalization: gamma,
 * beta, moving_mean, moving_variance), which is Tessera's. The input
 * pipeline's affine map (the job's scale and normalize) becomes a
 * Normalization layer after each input, mean = -shift/scale and variance
 * = 1/scale^2, so the .keras model reads raw inputs as Tessera's eval did.
 *
 * Sequential and Functional models (Keras JSON); the built-in wide_deep
 * has no Keras counterpart and is refused with a message (export it as
 * npz). Failure modes: a variable the model does not list, a layer whose
 * variables are missing, an HDF5 or file error; each names the variable,
 * the layer or the path.
 */
#ifndef TSR_CHIEF_EXPORT_KERAS_H
#define TSR_CHIEF_EXPORT_KERAS_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
  const char *name;      /* "dense/kernel" */
  int rank;
  const int64_t *shape;
  const float *data;     /* the full value, row-major */
} chief_export_var;

/* `model` is the job's model JSON (manifest "model"), `input` the
 * manifest's {"scale": [...], "shift": [...]} over the dense features,
 * with "columns" (the first feature of each model input, in the model's
 * input order) when the data placed inputs by name; NULL: no map. */
int chief_export_keras(const char *out, const json_t *model,
                       const json_t *input, const chief_export_var *vars,
                       size_t n, char *err, size_t errlen);
/* The layout follows the name: NAME.weights.h5 is Keras 3's and tf_keras
 * 2.14+'s ("layers/<path>/vars/<i>"), NAME.h5 or .hdf5 tf_keras's legacy
 * one ("<name>/<name>/<var>:0"), which Keras 3 loads too; another name is
 * refused. */
int chief_export_weights_h5(const char *out, const json_t *model,
                            const chief_export_var *vars, size_t n,
                            char *err, size_t errlen);

/* model.get_weights()'s order of the model's variables `names`: order[k]
 * is the index in names of the k-th weight (the npz export and the
 * standalone trainer's weights.npz use it). The built-in model keeps the
 * given order. */
int chief_keras_weight_order(const json_t *model, const char *const *names,
                             size_t n, size_t *order, char *err,
                             size_t errlen);
/* The variables as an .npz of float32 arrays named as the variables, in
 * model.get_weights()'s order and with Keras's shapes (Attention's scale
 * a scalar), so `model.set_weights([z[k] for k in z.files])` takes them;
 * a model without a Keras layout (the built-in one) keeps the given order
 * and shapes. Written atomically (artifacts/weights/npz.h). */
int chief_export_npz(const char *out, const json_t *model,
                     const chief_export_var *vars, size_t n, char *err,
                     size_t errlen);

/* {"mean": [...], "variance": [...], "scale": [...], "shift": [...]}:
 * apply as (x - mean) / sqrt(variance), which is x * scale + shift. A NULL
 * `input` writes nothing and returns 0. */
int chief_export_input_stats(const char *path, const json_t *input,
                             char *err, size_t errlen);

/* initial_weights: fills each variable's `data` (numel floats, the caller's)
 * from an .npz (by variable name, else arr_<i> in get_weights order), a
 * .keras archive, a .weights.h5 or a legacy .h5 (mapped through `model`).
 * Every variable must be found with its shape; errors name the file and
 * the variable. */
typedef struct {
  const char *name;
  int rank;
  const int64_t *shape;
  float *data;
} chief_import_var;

int chief_weights_load(const char *path, const json_t *model,
                       chief_import_var *vars, size_t n, char *err,
                       size_t errlen);

/* For a cluster run: loads `weights` as above and writes each variable as
 * raw little-endian float32 to DIR/initial_weights/var-<i>.f32 (DIR: a
 * folder the parameter servers can read, the checkpoint root), putting
 * the absolute paths in paths[i] (each `plen` bytes) for the PS to
 * initialize from. Each vars[i].data is ignored (scratch is allocated). */
int chief_initial_weights_files(const char *weights, const json_t *model,
                                const char *dir,
                                const chief_import_var *vars, size_t n,
                                char *paths, size_t plen, char *err,
                                size_t errlen);

#endif
