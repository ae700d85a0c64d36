/* Weights out in Keras's own files: a Keras 3 `.keras` archive (a zip of
 * config.json, metadata.json and model.weights.h5) that
 * keras.models.load_model() opens, tf_keras's `.weights.h5` for
 * model.load_weights(), and input_stats.json, the input normalization a
 * served model needs beside an npz.
 *
 * Layout (Keras's saving_lib): each layer's variables are datasets
 * "<root>/<layer path>/vars/<i>" in the layer's variable order, where the
 * layer path is its class in snake case, numbered from the second of a
 * class on ("dense", "dense_1", "dropout"); <root> is "layers" (Keras 3)
 * or "_layer_checkpoint_dependencies" (tf_keras 2.13+). The input
 * pipeline's affine map (the job's scale and normalize) becomes a
 * Normalization layer after the input, mean = -shift/scale and variance
 * = 1/scale^2, so the .keras model reads raw inputs as Tessera's eval did.
 *
 * Only Sequential models (a Keras JSON); the built-in wide_deep has no
 * Keras counterpart and is refused with a message (export it as npz).
 * Failure modes: a variable the model does not list, a layer whose
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
 * manifest's {"scale": [...], "shift": [...]} or NULL. */
int chief_export_keras(const char *out, const json_t *model,
                       const json_t *input, const chief_export_var *vars,
                       size_t n, char *err, size_t errlen);
int chief_export_weights_h5(const char *out, const json_t *model,
                            const chief_export_var *vars, size_t n,
                            char *err, size_t errlen);
/* {"mean": [...], "variance": [...], "scale": [...], "shift": [...]}:
 * apply as (x - mean) / sqrt(variance), which is x * scale + shift. A NULL
 * `input` writes nothing and returns 0. */
int chief_export_input_stats(const char *path, const json_t *input,
                             char *err, size_t errlen);

/* initial_weights: fills each variable's `data` (numel floats, the caller's)
 * from an .npz (by variable name, else arr_<i> in order), a .keras archive
 * or a .weights.h5 (Keras 3 or tf_keras layout, mapped through `model`).
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
