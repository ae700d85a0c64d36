/* Training in one process: the model's variables in host memory, the
 * optimizer of kernels/optim.h applied after every step, one replica per
 * GPU (gradients summed with NCCL, as MirroredStrategy) or one CPU replica.
 * `tessera-worker --standalone` runs wk_train_standalone(); it is the
 * correctness reference for distributed runs (same initial values from
 * the same seed and names, same optimizer, same data order) and their
 * speed baseline.
 *
 * Happy path: open a trainer for a model, call wk_trainer_step() per batch
 * (prepare, gather the batch's embedding rows, forward/backward, loss-scale
 * check, optimizer), evaluate batches into a wk_metrics.
 * Failure modes: a bad batch (the model's error, naming the example), no
 * GPU when one is required, allocation failures. With fp16 a step whose
 * gradients are not finite is skipped and the loss scale halves (Keras
 * LossScaleOptimizer: start 2^15, double after 2000 finite steps).
 */
#ifndef TSR_WK_TRAIN_H
#define TSR_WK_TRAIN_H

#include <stdbool.h>
#include <stdint.h>

#include "common/job.h"
#include "common/trace.h"
#include "worker/input.h"
#include "worker/metrics.h"
#include "worker/model.h"

typedef struct wk_trainer wk_trainer;

typedef struct {
  kern_device device;     /* auto (default), cpu, gpu */
  int max_gpus;           /* replicas on a GPU machine; 0: every visible GPU */
  int cpu_threads;        /* OpenBLAS threads (0: 1) */
  int64_t log_every;      /* progress line every N steps (0: about 20 lines) */
  bool quiet;             /* no progress lines (tests) */
  /* Monitoring of wk_train_standalone (all optional), called on the
   * training thread: scalars with the chief's tags ("loss",
   * "train/learning_rate", "eval/loss", "eval/NAME") every summary_every
   * steps (0: a hundredth of the run) and at the end; the trainer's
   * weights every checkpoint_every steps (0: only at the end) and at the
   * end; every step's phases into `trace`. */
  void (*on_scalar)(void *data, const char *tag, int64_t step, double value);
  int (*on_checkpoint)(void *data, wk_trainer *t, const tsr_model *m,
                       int64_t step);
  /* after the trainer opens, before the first step (initial_weights) */
  int (*on_start)(void *data, wk_trainer *t, const tsr_model *m, char *err,
                  size_t errlen);
  void *hook_data;
  int64_t summary_every;
  int64_t checkpoint_every;
  tsr_trace *trace;
} wk_train_opts;

/* `batch` is the largest global batch the trainer will see. */
int wk_trainer_open(const tsr_model *m, const tsr_optim_spec *opt,
                    uint64_t seed, tsr_precision prec,
                    const wk_train_opts *o, int64_t batch, wk_trainer **out,
                    char *err, size_t errlen);
void wk_trainer_close(wk_trainer *t);

/* One full training step on the batch. *loss is the batch's mean loss;
 * *applied is false when fp16 loss scaling skipped the step. */
int wk_trainer_step(wk_trainer *t, const wk_batch *b, double *loss,
                    bool *applied, char *err, size_t errlen);
/* Forward only (no dropout); adds the outputs to mt. Inference mode:
 * BatchNormalization reads its moving statistics and updates nothing, so
 * no variable changes. */
int wk_trainer_eval(wk_trainer *t, const wk_batch *b, wk_metrics *mt,
                    char *err, size_t errlen);
/* Receives a batch's outputs, in the batch's order: pred [n, dim], the
 * last layer's values as Keras's predict returns them (probabilities
 * after a softmax), valid during the call. A negative return stops the
 * run with that code and `err`. */
typedef int (*wk_output_fn)(void *data, const float *pred, int64_t n,
                            int64_t dim, char *err, size_t errlen);
/* wk_trainer_eval that also hands the outputs to on_out (either of mt and
 * on_out may be NULL). */
int wk_trainer_predict(wk_trainer *t, const wk_batch *b, wk_metrics *mt,
                       wk_output_fn on_out, void *out_data, char *err,
                       size_t errlen);

/* Host value of variable v (full table), owned by the trainer. */
float *wk_trainer_var(wk_trainer *t, int v);
float wk_trainer_loss_scale(const wk_trainer *t);
int64_t wk_trainer_steps(const wk_trainer *t);      /* applied steps */
int64_t wk_trainer_skipped(const wk_trainer *t);    /* fp16 skipped steps */
int wk_trainer_replicas(const wk_trainer *t);
const char *wk_trainer_backend(const wk_trainer *t);
/* CPU threads each replica's ops run on (1 on a GPU), and what computes
 * its convolutions ("oneDNN 2.6.3", "im2col + OpenBLAS"). */
int wk_trainer_threads(const wk_trainer *t);
const char *wk_trainer_conv_impl(const wk_trainer *t);

typedef struct {
  int64_t steps, skipped, examples;
  double seconds, examples_per_sec;
  double train_loss;      /* mean over the last epoch (or last 100 steps) */
  bool has_eval;
  double eval_loss;
  int64_t eval_examples;
  int n_metrics;
  char metric_names[8][TSR_METRIC_NAME_MAX];
  double metrics[8];
  float loss_scale;
  int replicas;
  int threads;            /* CPU threads per replica (1 on a GPU) */
  char backend[16];
  int64_t skipped_records;/* corrupt records skipped (skip_corrupt) */
  double best_auc;        /* synthetic_ctr: the hidden model's AUC on the
                             training data (the best reachable); NAN else */
} wk_train_result;

/* The whole standalone run of a job: input, model, training, evaluation on
 * data.eval when the job has one, and a summary line on stdout. */
int wk_train_standalone(const tsr_job *job, const wk_train_opts *o,
                        wk_train_result *r, char *err, size_t errlen);

/* Evaluation alone (`tessera evaluate`, `tessera predict`,
 * `tessera-worker --standalone --evaluate`): the job's model with the
 * weights o->on_start puts into the trainer (required: there is nothing
 * to evaluate without them) runs over one split of the job's data, read
 * once in file order with every example (no shuffle, no dropped
 * remainder, as Keras's evaluate and predict read theirs), in inference
 * mode and without an optimizer step, so the weights (BatchNormalization's
 * moving statistics included) stay as loaded; nothing is written but what
 * on_output writes. The training split's statistics normalize the inputs,
 * as in training. r gets the eval figures (has_eval, eval_loss,
 * eval_examples, the metrics), seconds, backend and replicas; a summary
 * line goes to stdout unless o->quiet. Errors: the data's (TSR_EDATA,
 * naming the file), the model's and the weights' (on_start's code). */
typedef struct {
  wk_split split;         /* WK_SPLIT_EVAL (data.eval) or WK_SPLIT_TRAIN */
  wk_output_fn on_output; /* every batch's outputs (NULL: none) */
  void *output_data;
} wk_eval_opts;

int wk_eval_standalone(const tsr_job *job, const wk_train_opts *o,
                       const wk_eval_opts *e, wk_train_result *r, char *err,
                       size_t errlen);

/* The exit status of a standalone run (training or evaluation alone) that
 * returned rc: 0; 4 no device; 3 the data's fault (TSR_EXIT_DATA); 2 a
 * model, job or weights refused (as the chief says for the same job); 1
 * anything else. */
int wk_standalone_status(int rc);

#endif
