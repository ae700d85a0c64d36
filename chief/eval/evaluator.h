/* The evaluator: the `evaluator` task of TF_CONFIG, a sidecar that
 * evaluates every new committed checkpoint on the job's eval data and
 * writes the figures to TensorBoard (logdir/eval, as TensorFlow's
 * evaluator does) and to eval.jsonl there. tessera-chief runs it when its
 * task is evaluator.
 *
 * It needs no other process: it reads the checkpoint's shard files
 * directly (chief/ckpt_read.h) into the model's variables in host memory.
 * It stops when it has evaluated the checkpoint of the job's last step
 * (when the job gives steps), when no new checkpoint has appeared for
 * idle_timeout_s, or on SIGINT/SIGTERM.
 * Failure modes: no checkpoint folder or no eval data in the job (exit 2
 * with the key named); a checkpoint that does not match the model (named,
 * skipped, the evaluator waits for the next one).
 */
#ifndef TSR_CHIEF_EVALUATOR_H
#define TSR_CHIEF_EVALUATOR_H

#include "chief/coord/coord.h"

typedef struct {
  double poll_s;          /* how often the folder is looked at; default 2 */
  double idle_timeout_s;  /* default 600 */
} chief_eval_opts;

/* Returns the process exit status. */
int chief_evaluator_run(const chief_coord_opts *o, const chief_eval_opts *e);

#endif
