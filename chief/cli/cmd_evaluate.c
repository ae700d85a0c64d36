/* `tessera evaluate` and `tessera predict`: a job's model with given
 * weights on its eval data (or its training data, --data train), without
 * a cluster and without training (chief/eval/offline.h). evaluate prints
 * the loss and the job's metrics (and writes them as JSON with
 * --summary-json); predict writes the model's outputs, one row per
 * example in the data's order, as a float32 .npy. Bad arguments exit 2
 * with a line naming the flag or file; the data's errors exit 3. */
#include "chief/cli/cli.h"
#include "chief/eval/offline.h"
#include "common/log.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { O_JOB = 1, O_CKPT, O_WEIGHTS, O_DATA, O_OUT, O_SUMMARY, O_DEVICE,
       O_THREADS, O_SET };

static void usage(FILE *f, bool predict) {
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
  char **ovr = calloc((size_t)argc + 1, sizeof *ovr);
  int novr = 0, status = 2;
  if (!ovr) return 1;
  static const struct option opts[] = {
      {"job", required_argument, 0, O_JOB},
      {"checkpoint", required_argument, 0, O_CKPT},
      {"weights", required_argument, 0, O_WEIGHTS},
      {"data", required_argument, 0, O_DATA},
      {"out", required_argument, 0, O_OUT},
      {"summary-json", required_argument, 0, O_SUMMARY},
      {"device", required_argument, 0, O_DEVICE},
      {"threads", required_argument, 0, O_THREADS},
      {"set", required_argument, 0, O_SET},
      {"help", no_argument, 0, 'h'},
      {0, 0, 0, 0}};
  int ch;
  optind = 1;
  while ((ch = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (ch) {
      case O_JOB: o.job_path = optarg; break;
      case O_CKPT: o.checkpoint = optarg; break;
      case O_WEIGHTS: o.weights = optarg; break;
      case O_DATA: data = optarg; break;
      case O_OUT: o.predict_out = optarg; break;
      case O_SUMMARY: o.summary_json = optarg; break;
      case O_DEVICE:
        if (kern_device_parse(optarg, &o.device)) {
          fprintf(stderr, "%s: --device %s: must be auto, cpu or gpu\n",
                  name, optarg);
          goto out;
        }
        break;
      case O_THREADS: {
        char *end;
        long t = strtol(optarg, &end, 10);
        if (*end || t < 1 || t > 1024) {
          fprintf(stderr, "%s: --threads %s: must be an integer 1..1024\n",
                  name, optarg);
          goto out;
        }
        o.threads = (int)t;
        break;
      }
      case O_SET: ovr[novr++] = optarg; break;
      case 'h': usage(stdout, predict); status = 0; goto out;
      default: usage(stderr, predict); goto out;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "%s: unexpected argument \"%s\"\n", name, argv[optind]);
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
    o.overrides = (const char *const *)ovr;
    status = chief_offline_run(&o);
  }
out:
  free(ovr);
  return status;
}

int chief_cmd_evaluate(int argc, char **argv) { return run(argc, argv, false); }
int chief_cmd_predict(int argc, char **argv) { return run(argc, argv, true); }
