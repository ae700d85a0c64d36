/* tessera-chief: the coordinator. Reads its place in the cluster
 * (TF_CONFIG, --cluster/--task, or Slurm) and the job file, then runs the
 * training described in chief/coord/coord.h. Flags that name a job key override
 * it (--steps 100 is steps=100; --set KEY=VALUE for any key).
 */
#include "chief/coord/coord.h"
#include "chief/eval/evaluator.h"
#include "common/cluster.h"
#include "common/log.h"
#include "tsr_config.h"

#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_OVERRIDES 64

static void usage(FILE *f) {
  fprintf(f,
      "usage: tessera-chief --job JOB.json [options]\n"
      "  --cluster FILE.json     cluster spec (default: TF_CONFIG, or Slurm)\n"
      "  --task TYPE:INDEX       this task (default: from TF_CONFIG)\n"
      "  --token-file FILE       cluster token (default: TESSERA_TOKEN)\n"
      "  --steps N               job key steps\n"
      "  --epochs N              job key epochs\n"
      "  --logdir DIR            job key logdir (TensorBoard, report.html)\n"
      "  --checkpoint-dir DIR    job key checkpoint.dir\n"
      "  --set KEY=VALUE         any job key (e.g. optimizer.learning_rate=0.01)\n"
      "  --summary-json PATH     write the final summary as JSON\n"
      "  --wait-timeout S        wait this long for the cluster (300)\n"
      "  --ps-timeout S          wait this long for a lost PS (600)\n"
      "  --closure-timeout S     deadline of one closure (600)\n"
      "  --keep-cluster          leave the PS and workers running at the end\n"
      "  --heartbeat-timeout S   a silent worker or PS is lost after S s (10)\n"
      "  --trace FILE            Chrome trace-event JSON of every worker's\n"
      "                          closures and step phases and every PS's applies\n"
      "As the evaluator task (TF_CONFIG task type evaluator), it evaluates\n"
      "every new checkpoint of the job instead:\n"
      "  --eval-poll S           look for a new checkpoint every S s (2)\n"
      "  --eval-idle-timeout S   stop after S s without one (600)\n"
      "  --version, --help\n");
}

static int add_override(const char **ov, int *n, const char *kv) {
  if (*n >= MAX_OVERRIDES - 1) {
    fprintf(stderr, "tessera-chief: more than %d overrides\n",
            MAX_OVERRIDES - 1);
    return -1;
  }
  ov[(*n)++] = kv;
  ov[*n] = NULL;
  return 0;
}

int main(int argc, char **argv) {
  chief_coord_opts o;
  chief_coord_opts_init(&o);
  const char *ov[MAX_OVERRIDES] = {NULL};
  char *owned[MAX_OVERRIDES];
  int n_ov = 0, n_owned = 0;
  static const struct option opts[] = {
      {"job", required_argument, 0, 'J'},
      {"cluster", required_argument, 0, 'c'},
      {"task", required_argument, 0, 't'},
      {"token-file", required_argument, 0, 'T'},
      {"steps", required_argument, 0, 's'},
      {"epochs", required_argument, 0, 'e'},
      {"logdir", required_argument, 0, 'l'},
      {"checkpoint-dir", required_argument, 0, 'k'},
      {"set", required_argument, 0, 'S'},
      {"summary-json", required_argument, 0, 'j'},
      {"wait-timeout", required_argument, 0, 'w'},
      {"ps-timeout", required_argument, 0, 'p'},
      {"closure-timeout", required_argument, 0, 'C'},
      {"keep-cluster", no_argument, 0, 'K'},
      {"heartbeat-timeout", required_argument, 0, 'H'},
      {"trace", required_argument, 0, 'R'},
      {"eval-poll", required_argument, 0, 'P'},
      {"eval-idle-timeout", required_argument, 0, 'I'},
      {"version", no_argument, 0, 'V'},
      {"help", no_argument, 0, 'h'},
      {0, 0, 0, 0}};
  chief_eval_opts eo = {2.0, 600.0};
  int ch, rc = 2;
  while ((ch = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    const char *key = NULL;
    switch (ch) {
      case 'J': o.job_path = optarg; break;
      case 'c': o.cluster_file = optarg; break;
      case 't': o.task = optarg; break;
      case 'T': o.token_file = optarg; break;
      case 's': key = "steps"; break;
      case 'e': key = "epochs"; break;
      case 'l': key = "logdir"; break;
      case 'k': key = "checkpoint.dir"; break;
      case 'S':
        if (add_override(ov, &n_ov, optarg)) goto out;
        break;
      case 'j': o.summary_json = optarg; break;
      case 'w': o.wait_timeout_s = atof(optarg); break;
      case 'p': o.ps_timeout_s = atof(optarg); break;
      case 'C': o.closure_timeout_s = atof(optarg); break;
      case 'K': o.keep_cluster = true; break;
      case 'H': o.heartbeat_timeout_s = atof(optarg); break;
      case 'R': o.trace_path = optarg; break;
      case 'P': eo.poll_s = atof(optarg); break;
      case 'I': eo.idle_timeout_s = atof(optarg); break;
      case 'V': printf("tessera-chief %s\n", TSR_VERSION); rc = 0; goto out;
      case 'h': usage(stdout); rc = 0; goto out;
      default: usage(stderr); goto out;
    }
    if (key) {
      size_t n = strlen(key) + strlen(optarg) + 2;
      char *kv = malloc(n);
      if (!kv || n_owned >= MAX_OVERRIDES) {
        free(kv);
        goto out;
      }
      snprintf(kv, n, "%s=%s", key, optarg);
      owned[n_owned++] = kv;
      if (add_override(ov, &n_ov, kv)) goto out;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "tessera-chief: unexpected argument \"%s\"\n",
            argv[optind]);
    goto out;
  }
  if (o.wait_timeout_s <= 0 || o.ps_timeout_s <= 0 ||
      o.closure_timeout_s <= 0 || o.heartbeat_timeout_s < 0.2 || eo.poll_s <= 0 || eo.idle_timeout_s <= 0) {
    fprintf(stderr, "tessera-chief: timeouts must be > 0 seconds\n");
    goto out;
  }
  o.overrides = ov;
  /* A peer that closes while we write must give EPIPE, not end us. */
  signal(SIGPIPE, SIG_IGN);
  tsr_log_init("chief");
  {
    /* The evaluator task runs the checkpoint sidecar instead. */
    tsr_cluster c;
    char err[TSR_ERRBUF];
    if (tsr_cluster_load(o.cluster_file, o.task, &c, err, sizeof err) == 0) {
      bool eval = c.task_type == TSR_TASK_EVALUATOR;
      tsr_cluster_free(&c);
      if (eval) {
        tsr_log_set_task("evaluator");
        rc = chief_evaluator_run(&o, &eo);
        goto out;
      }
    }
  }
  rc = chief_coord_run(&o);
out:
  for (int i = 0; i < n_owned; i++) free(owned[i]);
  return rc;
}
