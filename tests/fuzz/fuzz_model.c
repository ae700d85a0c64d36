/* libFuzzer target: the model parser (worker/model.c).
 *
 * The input is a model's JSON (a Keras model.to_json() or a built-in
 * spec); the first byte picks the loss. Any JSON must be built into a
 * model or refused with a message; a model built must list variables
 * whose sizes agree with their shapes. Nothing may crash, overflow (UBSan)
 * or leak. */
#include "common/log.h"
#include "worker/model.h"

#include <jansson.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  tsr_log_set_level(TSR_LOG_ERROR); /* a plain store: cheap per input */
  if (size < 1) return 0;
  static const char *const losses[] = {"mse", "sparse_categorical_crossentropy",
                                       "binary_crossentropy", "mae"};
  const char *loss = losses[data[0] & 3];
  json_error_t je;
  json_t *j = json_loadb((const char *)data + 1, size - 1, 0, &je);
  if (!j) return 0;
  char *metrics[1] = {(char *)"accuracy"};
  tsr_model *m;
  char err[512];
  if (tsr_model_build(j, loss, metrics, (data[0] & 4) ? 1 : 0, NULL, &m, err,
                     sizeof err) == 0) {
    const tsr_var *v;
    size_t n;
    if (tsr_model_variables(m, &v, &n) == 0)
      for (size_t i = 0; i < n; i++)
        if (v[i].numel != v[i].shape[0] * (v[i].rank == 2 ? v[i].shape[1] : 1))
          abort();
    tsr_model_free(m);
  } else if (!err[0]) {
    abort();
  }
  json_decref(j);
  return 0;
}
