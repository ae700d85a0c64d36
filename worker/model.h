/* The model description: a Keras Sequential or Functional model read from
 * its model.to_json() document, or the built-in wide-and-deep CTR model,
 * with its loss and metrics, parsed into a layer graph with shapes and a
 * variable list. Running it on a compute context is model_exec.h's.
 *
 * Happy path: tsr_model_build() validates the model against the loss and
 * (when given) the data schema and lists its variables; the chief creates
 * those variables on the PS (tsr_model_variables), the standalone trainer in
 * memory; a worker binds the model to its compute contexts (model_exec.h).
 * Failure modes: an unsupported layer, activation, initializer or option
 * (the error names it and lists what is supported), shapes that do not
 * chain (named with both widths).
 *
 * Threads: a built model is read-only; any thread may read it.
 */
#ifndef TSR_WK_MODEL_H
#define TSR_WK_MODEL_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/job.h"
#include "common/var.h"
#include "kernels/init.h"
#include "kernels/kern.h"
#include "worker/input.h"

/* A model variable is common/var.h's tsr_var; a model's variables have
 * rank 1..TSR_MODEL_MAX_RANK. */
#define TSR_MODEL_MAX_RANK 4

typedef struct tsr_model tsr_model;

/* Builds a model from the job's model JSON (Keras Sequential, Functional,
 * or {"builtin": "wide_deep", ...}), loss name and metric names. `schema`
 * (may be NULL) is checked against the model's input and output shapes,
 * fills sizes the built-in spec leaves out, and places a Functional
 * model's inputs by feature name when its dense features are named. The
 * variable list does not depend on the schema. */
int tsr_model_build(const json_t *model, const char *loss,
                   char *const *metrics, int n_metrics,
                   const wk_input_schema *schema, tsr_model **out, char *err,
                   size_t errlen);
int tsr_model_from_job(const tsr_job *job, const wk_input_schema *schema,
                      tsr_model **out, char *err, size_t errlen);
void tsr_model_free(tsr_model *m);

/* The variables in creation order (stable for a given model), for the chief
 * to partition and create on the PS and for `tessera partition --job`. The
 * array belongs to the model. */
int tsr_model_variables(const tsr_model *m, const tsr_var **out, size_t *n);

/* The update rule of a variable: the job's optimizer for a trainable one,
 * the moving average (TSR_OPT_MOVING_AVERAGE, learning_rate = 1 -
 * momentum) for a moving statistic. The chief gives it to the PS with the
 * variable; the standalone trainer applies it. */
void tsr_var_optimizer(const tsr_var *v, const tsr_optim_spec *job_opt,
                      tsr_optim_spec *out);

/* Fills elements [first, first+n) of variable v with its initial value for
 * the job seed (kern_init_fill keyed by the variable's name), as the PS
 * does, so both start from identical values. */
void tsr_model_init_var(const tsr_model *m, int v, uint64_t seed,
                       uint64_t first, float *out, size_t n);

/* One line per layer ("dense (Dense) 10 -> 64 relu", "conv2d (Conv2D)
 * 28x28x1 -> 26x26x32 relu"), for logs. */
void tsr_model_summary(const tsr_model *m, char *buf, size_t len);
int64_t tsr_model_input_dense(const tsr_model *m); /* dense features read */
/* The model's inputs that read numbers (not Embedding ids), in node
 * order: each one's name and first column of the batch's dense features
 * (placed by feature name when the data names them). Fills up to max
 * entries; returns the number of such inputs. The names belong to the
 * model. */
int tsr_model_inputs(const tsr_model *m, const char **names, int64_t *first,
                    int max);
int64_t tsr_model_output_dim(const tsr_model *m);  /* units of the output */
/* The output's shape after the batch axis, as Keras's predict returns it
 * ((units,) after a Dense; its product is tsr_model_output_dim): fills up
 * to max axes, returns the rank. */
int tsr_model_output_shape(const tsr_model *m, int64_t *dims, int max);
/* Classes a label must fall in ([0, n)) for a categorical loss; 0 when
 * labels are not class indices (regression, binary). */
int64_t tsr_model_num_classes(const tsr_model *m);
int tsr_model_num_metrics(const tsr_model *m);
const char *tsr_model_metric_name(const tsr_model *m, int i);

#endif
