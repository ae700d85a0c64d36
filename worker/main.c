/* tessera-worker: with --standalone, trains a whole job in this process
 * (worker/train.h); otherwise resolves its place in the cluster (TF_CONFIG
 * or --cluster/--task) and reports that this build has no worker service.
 * Flags that change the job (--steps, --precision, ...) become job
 * overrides, so they are validated with the job file's own rules.
 */
#include "common/cluster.h"
#include "common/err.h"
#include "common/job.h"
#include "common/log.h"
#include "worker/service.h"
#include "worker/train.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
  fprintf(f,
      "usage: tessera-worker [--cluster FILE.json] [--task TYPE:INDEX]\n"
      "       tessera-worker --standalone --job JOB.json [--device auto|cpu|gpu]\n"
      "              [--precision fp32|bf16|fp16] [--steps N] [--epochs N]\n"
      "              [--batch-size N] [--seed N] [--gpus N] [--threads N]\n"
      "              [--set KEY=VALUE ...]\n"
      "  The cluster comes from TF_CONFIG unless --cluster is given.\n"
      "  --standalone trains the job in this process, without a PS.\n");
}

enum { O_STANDALONE = 1, O_JOB, O_DEVICE, O_PREC,
       O_STEPS, O_EPOCHS, O_BATCH, O_SEED, O_GPUS, O_THREADS, O_SET };

static int run_standalone(const char *job_path, char **ovr,
                          const wk_train_opts *o) {
  tsr_job job;
  char err[1024];
  int rc = tsr_job_load(job_path, (const char *const *)ovr, &job, err,
                        sizeof err);
  if (rc) {
    tsr_error("%s", err);
    return 2;
  }
  wk_train_result r;
  rc = wk_train_standalone(&job, o, &r, err, sizeof err);
  tsr_job_free(&job);
  if (rc) {
    tsr_error("%s", err);
    return rc == TSR_ENODEVICE ? 4 : rc == TSR_EDATA ? TSR_EXIT_DATA : 1;
  }
  return 0;
}

int main(int argc, char **argv) {
  if (wk_service_selected(argc, argv)) return wk_service_main(argc, argv);
  const char *job_path = NULL;
  wk_train_opts to = {.device = KERN_DEVICE_AUTO};
  char *ovr[64];
  int novr = 0;
  static const struct option opts[] = {
      {"standalone", no_argument, 0, O_STANDALONE},
      {"job", required_argument, 0, O_JOB},
      {"device", required_argument, 0, O_DEVICE},
      {"precision", required_argument, 0, O_PREC},
      {"steps", required_argument, 0, O_STEPS},
      {"epochs", required_argument, 0, O_EPOCHS},
      {"batch-size", required_argument, 0, O_BATCH},
      {"seed", required_argument, 0, O_SEED},
      {"gpus", required_argument, 0, O_GPUS},
      {"threads", required_argument, 0, O_THREADS},
      {"set", required_argument, 0, O_SET},
      {"help", no_argument, 0, 'h'},
      {0, 0, 0, 0}};
  static const char *const keys[] = {
      [O_PREC] = "precision", [O_STEPS] = "steps", [O_EPOCHS] = "epochs",
      [O_BATCH] = "batch_size", [O_SEED] = "seed"};
  int ch;
  tsr_log_init("worker");
  while ((ch = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (ch) {
      case O_STANDALONE: break; /* how main() got here */
      case O_JOB: job_path = optarg; break;
      case O_DEVICE:
        if (!strcmp(optarg, "auto")) to.device = KERN_DEVICE_AUTO;
        else if (!strcmp(optarg, "cpu")) to.device = KERN_DEVICE_CPU;
        else if (!strcmp(optarg, "gpu")) to.device = KERN_DEVICE_GPU;
        else {
          tsr_error("--device %s: must be auto, cpu or gpu", optarg);
          return 2;
        }
        break;
      case O_GPUS: to.max_gpus = atoi(optarg); break;
      case O_THREADS: to.cpu_threads = atoi(optarg); break;
      case O_PREC: case O_STEPS: case O_EPOCHS: case O_BATCH: case O_SEED:
      case O_SET: {
        if (novr == 63) {
          tsr_error("too many overrides");
          return 2;
        }
        char buf[512];
        if (ch == O_SET) snprintf(buf, sizeof buf, "%s", optarg);
        else snprintf(buf, sizeof buf, "%s=%s", keys[ch], optarg);
        ovr[novr++] = strdup(buf);
        break;
      }
      case 'h': usage(stdout); return 0;
      default: usage(stderr); return 2;
    }
  }
  ovr[novr] = NULL;
  /* every command line without --standalone went to the service above */
  int ret;
  if (!job_path) {
    tsr_error("--standalone needs --job JOB.json");
    ret = 2;
  } else {
    ret = run_standalone(job_path, ovr, &to);
  }
  for (int i = 0; i < novr; i++) free(ovr[i]);
  return ret;
}
