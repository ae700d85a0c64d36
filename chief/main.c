/* tessera-chief: the coordinator. Reads its place in the cluster
 * (TF_CONFIG, --cluster/--task, or Slurm) and the job file, then runs the
 * training described in chief/coord/coord.h. Flags that name a job key override
 * it (--steps 100 is steps=100; --set KEY=VALUE for any key).
 */
#include "chief/coord/coord.h"
#include "chief/eval/evaluator.h"
#include "common/arg.h"
#include "common/cluster.h"
#include "common/daemon.h"
#include "common/err.h"
#include "common/log.h"
#include "tsr_config.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_OVERRIDES 64

static void usage(FILE *f, const void *data) {
  (void)data;
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

/* The job-key overrides of the command line, in its order: --set KEY=VALUE
 * as given, the flags that name a key as KEY=VALUE (owned). */
typedef struct {
  const char *ov[MAX_OVERRIDES];
  char *owned[MAX_OVERRIDES];
  int n_ov, n_owned;
} chief_overrides;

static int add_override(void *data, const char *flag, const char *value,
                        char *err, size_t errlen) {
  static const char *const keys[][2] = {{"--steps", "steps"},
                                        {"--epochs", "epochs"},
                                        {"--logdir", "logdir"},
                                        {"--checkpoint-dir", "checkpoint.dir"}};
  chief_overrides *c = data;
  if (c->n_ov >= MAX_OVERRIDES - 1) {
    snprintf(err, errlen, "more than %d overrides", MAX_OVERRIDES - 1);
    return TSR_EINVAL;
  }
  const char *kv = value;
  for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
    if (strcmp(flag, keys[k][0])) continue;
    size_t n = strlen(keys[k][1]) + strlen(value) + 2;
    char *own = malloc(n);
    if (!own) {
      snprintf(err, errlen, "%s: out of memory", flag);
      return TSR_ENOMEM;
    }
    snprintf(own, n, "%s=%s", keys[k][1], value);
    c->owned[c->n_owned++] = own;
    kv = own;
  }
  c->ov[c->n_ov++] = kv;
  c->ov[c->n_ov] = NULL;
  return 0;
}

int main(int argc, char **argv) {
  chief_coord_opts o;
  chief_coord_opts_init(&o);
  tsr_daemon_flags df = {0};
  tsr_daemon d;
  tsr_cluster_init(&d.cluster);
  d.token_len = 0;
  chief_overrides ov = {.n_ov = 0};
  chief_eval_opts eo = {2.0, 600.0};
  bool version = false;
  const tsr_arg opts[] = {
      TSR_ARG_STR("job", &o.job_path),
      TSR_DAEMON_ARGS(&df),
      TSR_ARG_CALL("steps", add_override, &ov),
      TSR_ARG_CALL("epochs", add_override, &ov),
      TSR_ARG_CALL("logdir", add_override, &ov),
      TSR_ARG_CALL("checkpoint-dir", add_override, &ov),
      TSR_ARG_CALL("set", add_override, &ov),
      TSR_ARG_STR("summary-json", &o.summary_json),
      TSR_ARG_NUM_ABOVE("wait-timeout", &o.wait_timeout_s, 0, INFINITY),
      TSR_ARG_NUM_ABOVE("ps-timeout", &o.ps_timeout_s, 0, INFINITY),
      TSR_ARG_NUM_ABOVE("closure-timeout", &o.closure_timeout_s, 0, INFINITY),
      TSR_ARG_FLAG("keep-cluster", &o.keep_cluster),
      TSR_ARG_NUM("heartbeat-timeout", &o.heartbeat_timeout_s, 0.2, INFINITY),
      TSR_ARG_STR("trace", &o.trace_path),
      TSR_ARG_NUM_ABOVE("eval-poll", &eo.poll_s, 0, INFINITY),
      TSR_ARG_NUM_ABOVE("eval-idle-timeout", &eo.idle_timeout_s, 0, INFINITY),
      TSR_ARG_FLAG("version", &version),
      TSR_ARG_END};
  static const tsr_arg_cmd cmd = {.name = "tessera-chief", .usage = usage};
  int rc = tsr_arg_parse(&cmd, opts, argc, argv, NULL);
  if (rc) {
    rc = tsr_arg_status(rc);
    goto out;
  }
  if (version) {
    printf("tessera-chief %s\n", TSR_VERSION);
    goto out;
  }
  o.overrides = ov.ov;
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
  for (int i = 0; i < ov.n_owned; i++) free(ov.owned[i]);
  return rc;
}
