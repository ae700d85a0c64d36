/* A float64 reference of the Keras layers, written from Keras's and TF's
 * definitions (not from worker/), for the gradient and forward checks of
 * test_layers.c. It reads the same model JSON (Sequential, or Functional
 * in Keras 2's inbound_nodes form) and evaluates it on a batch with the
 * parameters in float64, looked up by their Keras names.
 *
 * Layers: InputLayer, Dense, Conv2D (valid/same, strides), MaxPooling2D,
 * AveragePooling2D, GlobalAveragePooling1D/2D, Flatten, Reshape,
 * BatchNormalization (batch statistics in training, moving ones in
 * inference), LayerNormalization (trailing axes), Activation, ReLU,
 * LeakyReLU, ELU, Softmax, Dropout (identity: used only in inference or at
 * rate 0), Embedding (ids from the input's columns), Add, Subtract,
 * Average, Concatenate; l1/l2 regularizers. Losses: mse, and sparse
 * categorical cross-entropy on a softmax output.
 */
#ifndef TSR_TEST_REF_MODEL_H
#define TSR_TEST_REF_MODEL_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct {
  int n_vars;
  const char *const *names; /* "dense/kernel" ... */
  double *const *vals;      /* float64 values of each variable */
} ref_params;

typedef struct {
  double loss_sum;          /* sum over examples, plus n * regularization */
  double *out;              /* [n, out_dim] the model's outputs (caller frees) */
  int64_t out_dim;
  /* BatchNormalization batch statistics of the first BN layer in training
   * (mean then variance, per channel; NULL when none) */
  double *bn_stats;
  int64_t bn_c;
} ref_result;

/* Evaluates `model` on n examples of x (row-major, n_dense columns) with
 * labels y. `loss` is "mse" or "sparse_categorical_crossentropy". Returns 0,
 * or -1 with a message on stderr for something it does not know. */
int ref_run(const json_t *model, const char *loss, const ref_params *p,
            const float *x, int64_t n, int64_t n_dense, const float *y,
            bool train, ref_result *r);
void ref_result_free(ref_result *r);

#endif
