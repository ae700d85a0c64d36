/* What the evaluator sidecar (evaluator.c) and evaluation alone
 * (offline.c) share. */
#ifndef TSR_CHIEF_EVAL_INT_H
#define TSR_CHIEF_EVAL_INT_H

#include <stddef.h>

#include <jansson.h>

#include "worker/model.h"
#include "worker/train.h"

/* Copies every variable of a committed checkpoint folder (one
 * ckpt-<step>) into the trainer; rows a sparse table never stored keep
 * the trainer's initial values, which are the ones the PS would have
 * created. Errors name the folder and the variable. */
int chief_eval__load_ckpt(wk_trainer *tr, const tsr_model *m,
                          const char *folder, char *err, size_t errlen);
/* The same from a weights file (.npz, .keras, .weights.h5, .h5; `model`
 * is the job's model JSON, which maps Keras's layouts to the variables). */
int chief_eval__load_file(wk_trainer *tr, const tsr_model *m,
                          const char *path, const json_t *model, char *err,
                          size_t errlen);

#endif
