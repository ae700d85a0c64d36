/* Evaluation alone, from the front door: `tessera evaluate` (the job's
 * loss and metrics for given weights on its eval data) and `tessera
 * predict` (the model's outputs as .npy), with no cluster and no
 * training. The weights come from a checkpoint folder (a cluster's: its
 * newest committed checkpoint, or one ckpt-<step> folder; or the
 * standalone trainer's, holding weights.npz) or a weights file (.npz,
 * .keras, .weights.h5, .h5, as initial_weights reads them). The run is
 * the standalone trainer's evaluation (worker/train.h's
 * wk_eval_standalone): the same figures it and the evaluator sidecar
 * report, nothing changed (the BatchNormalization moving statistics
 * included) and nothing written but --out and --summary-json.
 *
 * Failure modes, each one line naming the file: weights or a checkpoint
 * that are not there or do not fit the model, a job the model refuses
 * (exit 2); the data's errors (exit 3); an output that cannot be written
 * (exit 1).
 */
#ifndef TSR_CHIEF_OFFLINE_H
#define TSR_CHIEF_OFFLINE_H

#include <stdbool.h>

#include "kernels/kern.h"

typedef struct {
  const char *job_path;
  const char *const *overrides;  /* "key=value", NULL-terminated (may be NULL) */
  const char *checkpoint;        /* one of checkpoint and weights */
  const char *weights;
  bool train_split;              /* data.train instead of data.eval */
  const char *predict_out;       /* predict: the .npy to write */
  const char *summary_json;      /* the figures as JSON (may be NULL) */
  kern_device device;
  int threads;                   /* OpenBLAS threads (0: 1) */
} chief_offline_opts;

/* Runs it; returns the process exit status (0, 1, 2, 3 or 4: no device). */
int chief_offline_run(const chief_offline_opts *o);

#endif
