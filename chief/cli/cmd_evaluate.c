/* `tessera evaluate` and `tessera predict`: a job's model with given
 * weights on its eval data (or its training data, --data train), without
 * a cluster and without training (chief/eval/offline.h). evaluate prints
 * the loss and the job's metrics (and writes them as JSON with
 * --summary-json); predict writes the model's outputs, one row per
 * example in the data's order, as a float32 .npy. Bad arguments exit 2
 * with a line naming the flag or file; the data's errors exit 3. */
#include "chief/cli/cli.h"
#include "chief/eval/offline.h"
#include "common/arg.h"
#include "common/log.h"
#include "kernels/kern.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The --set KEY=VALUE overrides, in their order. */
typedef struct {
  const char **ovr;
  int n;
} ev_overrides;

static int add_set(void *data, const char *flag, const char *value,
                   char *err, size_t errlen) {
  (void)flag, (void)err, (void)errlen;
  ev_overrides *o = data;
  o->ovr[o->n++] = value;
  return 0;
}

static void usage(FILE *f, const void *data) {
  bool predict = *(const bool *)data;
  fprintf(f,
      "usage: tessera %s --job JOB.json (--checkpoint DIR | --weights FILE)\n"
      "              %s[--data eval|train] [--device auto|cpu|gpu]\n"
      "              [--threads N] [--set KEY=VALUE ...]\n"
      "  %s\n"
      "  DIR: a checkpoint folder (its newest committed checkpoint), one\n"
      "  ckpt-<step> folder, or the standalone trainer's --checkpoint-dir\n"
      "  (weights.npz). FILE: .npz, .keras, .weights.h5 or .h5, as\n"
      "  initial_weights reads them. --data: the job's data.eval (default)\n"
      "  or data.train, read once in order, every example. Nothing is\n"
      "  trained and no weight changes.\n",
      predict ? "predict" : "evaluate",
      predict ? "--out P.npy " : "[--summary-json PATH] ",
      predict ? "writes the model's outputs (one row per example, in the "
                "data's order) as float32 .npy"
              : "prints the job's loss and metrics for the weights");
}

static int run(int argc, char **argv, bool predict) {
  const char *name = predict ? "tessera predict" : "tessera evaluate";
  chief_offline_opts o = {.device = KERN_DEVICE_AUTO};
  const char *data = NULL;
  ev_overrides ov = {calloc((size_t)argc + 1, sizeof(const char *)), 0};
  int status = 2;
  if (!ov.ovr) return 1;
  const tsr_arg opts[] = {
      TSR_ARG_STR("job", &o.job_path),
      TSR_ARG_STR("checkpoint", &o.checkpoint),
      TSR_ARG_STR("weights", &o.weights),
      TSR_ARG_STR("data", &data),
      TSR_ARG_STR("out", &o.predict_out),
      TSR_ARG_STR("summary-json", &o.summary_json),
      TSR_ARG_CHOICE("device", &o.device, kern_device_names),
      TSR_ARG_INT("threads", &o.threads, 1, KERN_MAX_THREADS),
      TSR_ARG_CALL("set", add_set, &ov),
      TSR_ARG_END};
  const tsr_arg_cmd cmd = {.name = name, .usage = usage, .data = &predict};
  int rc = tsr_arg_parse(&cmd, opts, argc, argv, NULL);
  if (rc) {
    status = tsr_arg_status(rc);
  } else if (!o.job_path) {
    fprintf(stderr, "%s: --job JOB.json is required\n", name);
  } else if (!o.checkpoint == !o.weights) {
    fprintf(stderr, "%s: the weights to use: --checkpoint DIR or --weights "
            "F.npz|F.keras|F.weights.h5|F.h5 (one of them)\n", name);
  } else if (data && strcmp(data, "eval") && strcmp(data, "train")) {
    fprintf(stderr, "%s: --data %s: must be eval (the job's data.eval) or "
            "train (data.train)\n", name, data);
  } else if (predict && !o.predict_out) {
    fprintf(stderr, "%s: --out P.npy is required\n", name);
  } else if (predict && (strlen(o.predict_out) < 4 ||
             strcmp(o.predict_out + strlen(o.predict_out) - 4, ".npy"))) {
    fprintf(stderr, "%s: --out %s: the outputs are written as .npy; name "
            "the file NAME.npy\n", name, o.predict_out);
  } else if (!predict && o.predict_out) {
    fprintf(stderr, "%s: --out: the outputs are `tessera predict`'s\n",
            name);
  } else {
    tsr_log_init(predict ? "predict" : "evaluate");
    o.train_split = data && !strcmp(data, "train");
    o.overrides = ov.ovr;
    status = chief_offline_run(&o);
  }
  free(ov.ovr);
  return status;
}

int chief_cmd_evaluate(int argc, char **argv) { return run(argc, argv, false); }
int chief_cmd_predict(int argc, char **argv) { return run(argc, argv, true); }
