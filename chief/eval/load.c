/* Weights into a trainer's host variables, for the evaluator sidecar and
 * evaluation alone (eval_int.h): from a committed checkpoint's shard
 * files (the chief's checkpoint reader, no PS) or from a weights file
 * (the artifacts library's readers, as initial_weights). Failure modes:
 * a variable the checkpoint or file lacks, a shape that differs, a file
 * that cannot be read; each message names the folder or file and the
 * variable. */
#include "chief/eval/eval_int.h"
#include "chief/ckpt/ckpt_read.h"
#include "artifacts/weights/export_keras.h"
#include "common/err.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int chief_eval__load_ckpt(wk_trainer *tr, const tsr_model *m,
                          const char *folder, char *err, size_t errlen) {
  chief_ckpt_var *vars;
  size_t n;
  int rc = chief_ckpt_scan(folder, &vars, &n, err, errlen);
  if (rc) return rc;
  const tsr_var *vi;
  size_t nv;
  tsr_model_variables(m, &vi, &nv);
  for (size_t v = 0; v < nv && !rc; v++) {
    const chief_ckpt_var *cv = NULL;
    for (size_t k = 0; k < n; k++)
      if (strcmp(vars[k].name, vi[v].name) == 0) cv = &vars[k];
    if (!cv) {
      rc = TSR_ENOTFOUND;
      snprintf(err, errlen, "%s: no variable %s", folder, vi[v].name);
      break;
    }
    if (cv->shape[0] != vi[v].shape[0] || cv->width != vi[v].row_dim) {
      rc = TSR_ESHAPE;
      snprintf(err, errlen, "%s: %s is [%lld, %lld] there, [%lld, %lld] in "
               "the model", folder, vi[v].name, (long long)cv->shape[0],
               (long long)cv->width, (long long)vi[v].shape[0],
               (long long)vi[v].row_dim);
      break;
    }
    float *dst = wk_trainer_var(tr, (int)v);
    uint8_t *present = malloc((size_t)cv->shape[0] + 1);
    float *tmp = malloc((size_t)(cv->shape[0] * cv->width) * sizeof *tmp + 1);
    if (!present || !tmp) {
      free(present);
      free(tmp);
      rc = TSR_ENOMEM;
      break;
    }
    rc = chief_ckpt_load_value(cv, tmp, present, err, errlen);
    for (int64_t r = 0; !rc && r < cv->shape[0]; r++)
      if (present[r])
        memcpy(dst + r * cv->width, tmp + r * cv->width,
               (size_t)cv->width * sizeof *dst);
    free(present);
    free(tmp);
  }
  chief_ckpt_vars_free(vars, n);
  return rc;
}

int chief_eval__load_file(wk_trainer *tr, const tsr_model *m,
                          const char *path, const json_t *model, char *err,
                          size_t errlen) {
  const tsr_var *vi;
  size_t nv;
  tsr_model_variables(m, &vi, &nv);
  chief_import_var *iv = calloc(nv ? nv : 1, sizeof *iv);
  if (!iv) return tsr_errf(err, errlen, TSR_ENOMEM, "out of memory");
  for (size_t v = 0; v < nv; v++)
    iv[v] = (chief_import_var){vi[v].name, vi[v].rank, vi[v].shape,
                               wk_trainer_var(tr, (int)v)};
  int rc = chief_weights_load(path, model, iv, nv, err, errlen);
  free(iv);
  return rc;
}
