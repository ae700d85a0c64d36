/* tessera-chief: the coordinator. Reads its place in the cluster
 * (TF_CONFIG, --cluster/--task, or Slurm) and the job file, then runs the
 * training described in chief/coord/coord.h. Flags that name a job key override
 * it (--steps 100 is steps=100; --set KEY=VALUE for any key).
 */
#include "chief/coord/coord.h"
#include "chief/eval/evaluator.h"
#include "common/cluster.h"
#include "common/daemon.h"
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
      TSR_DAEMON_USAGE
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
  tsr_daemon_flags df = {0};
  tsr_daemon d;
  tsr_cluster_init(&d.cluster);
  d.token_len = 0;
  const char *ov[MAX_OVERRIDES] = {NULL};
  char *owned[MAX_OVERRIDES];
  int n_ov = 0, n_owned = 0;
  static const struct option opts[] = {
      {"job", required_argument, 0, 'J'},
      TSR_DAEMON_OPTIONS,
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
    if (tsr_daemon_flag(&df, ch, optarg)) continue;
    switch (ch) {
      case 'J': o.job_path = optarg; break;
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
  tsr_log_init("chief");
  /* the chief (or worker 0 of a cluster without one, which the
   * coordinator checks), or the evaluator: the checkpoint sidecar, which
   * talks to no one and needs no token */
  static const tsr_daemon_spec spec = {
      "tessera-chief",
      TSR_TASK_BIT(TSR_TASK_CHIEF) | TSR_TASK_BIT(TSR_TASK_WORKER) |
          TSR_TASK_BIT(TSR_TASK_EVALUATOR),
      TSR_TASK_BIT(TSR_TASK_CHIEF) | TSR_TASK_BIT(TSR_TASK_WORKER), "chief"};
  char err[TSR_ERRBUF];
  if (tsr_daemon_start(&d, &spec, &df, err, sizeof err)) {
    tsr_error("%s", err);
    rc = 2;
    goto out;
  }
  if (d.cluster.task_type == TSR_TASK_EVALUATOR) {
    tsr_log_set_task("evaluator");
    rc = chief_evaluator_run(&o, &eo);
    goto out;
  }
  o.cluster = &d.cluster;
  o.token = d.token;
  o.token_len = d.token_len;
  o.plain_frames = d.plain_frames;
  o.test_folder_gate = getenv("TESSERA_TEST_FOLDER_GATE");
  rc = chief_coord_run(&o);
out:
  tsr_daemon_free(&d);
  for (int i = 0; i < n_owned; i++) free(owned[i]);
  return rc;
}
