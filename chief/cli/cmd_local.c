/* `tessera local`: a whole cluster on loopback with one command.
 *
 * Its own options come first or anywhere; every argument it does not know
 * (`--job JOB.json`, `--steps 100`, ...) goes to tessera-chief unchanged,
 * and so does everything after `--`. It says where the TensorBoard logs
 * will be (the chief's --logdir, else the job file's "logdir") and exits
 * with the chief's status; 2 when the cluster could not be set up.
 */
#include "chief/cli/cli.h"
#include "chief/cli/local.h"
#include "common/arg.h"
#include "common/err.h"
#include "common/log.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f, const void *data) {
  (void)data;
  fprintf(f,
          "usage: tessera local [--ps N] [--workers N] [--evaluator]\n"
          "                     [--bin-dir DIR]\n"
          "                     [--max-restarts N] [--restart-backoff-ms MS]\n"
          "                     [--grace-ms MS] [--eval-drain-ms MS]\n"
          "                     [--host IPV4] [CHIEF ARGS...]\n"
          "\n"
          "Starts tessera-ps x N (default 2; 0 for a job with dense\n"
          "\"allreduce\" and no sparse table), tessera-worker x N (default 2)\n"
          "and tessera-chief on free loopback ports with a fresh cluster\n"
          "token (--evaluator adds TF_CONFIG's evaluator task, which\n"
          "evaluates each new checkpoint and finishes after the chief, at\n"
          "most --eval-drain-ms later, default 120000),\n"
          "restarts a crashed process (default up to 5 times, backoff\n"
          "from 100 ms doubling to 10 s), prefixes each process's output,\n"
          "stops everything on Ctrl-C (SIGTERM, then SIGKILL after the grace\n"
          "period, default 10000 ms) and exits with the chief's status.\n"
          "Other arguments (--job JOB.json, --steps N, ...) and everything\n"
          "after -- go to tessera-chief. The binaries are looked up in\n"
          "--bin-dir, $TESSERA_BIN_DIR, next to tessera, then $PATH.\n");
}

/* The logdir the chief will use, for the message; NULL when none. */
static char *find_logdir(char **args, int n) {
  const char *job = NULL;
  for (int i = 0; i < n; i++) {
    if (!strcmp(args[i], "--logdir") && i + 1 < n) return strdup(args[i + 1]);
    if (!strncmp(args[i], "--logdir=", 9)) return strdup(args[i] + 9);
    if (!strcmp(args[i], "--job") && i + 1 < n) job = args[i + 1];
    if (!strncmp(args[i], "--job=", 6)) job = args[i] + 6;
  }
  if (!job) return NULL;
  json_error_t jerr;
  json_t *root = json_load_file(job, 0, &jerr);
  if (!root) return NULL; /* the chief reports the job file's errors */
  json_t *ld = json_object_get(root, "logdir");
  char *out = json_is_string(ld) ? strdup(json_string_value(ld)) : NULL;
  json_decref(root);
  return out;
}

int chief_cmd_local(int argc, char **argv) {
  tsr_log_set_task("local");
  chief_local_opts o;
  chief_local_opts_init(&o);
  const tsr_arg opts[] = {
      TSR_ARG_INT("ps", &o.n_ps, 0, 1000),
      TSR_ARG_INT("workers", &o.n_workers, 1, 1000),
      TSR_ARG_FLAG("evaluator", &o.n_evaluators),
      TSR_ARG_STR("bin-dir", &o.bin_dir),
      TSR_ARG_INT("max-restarts", &o.max_restarts, 0, 1000000),
      TSR_ARG_INT("restart-backoff-ms", &o.backoff_ms, 1, 3600000),
      TSR_ARG_INT("grace-ms", &o.grace_ms, 0, 3600000),
      TSR_ARG_STR("host", &o.host),
      TSR_ARG_INT("eval-drain-ms", &o.eval_drain_ms, 0, 86400000),
      TSR_ARG_END};
  /* everything else is tessera-chief's */
  static const tsr_arg_cmd cmd = {.name = "tessera local", .pass = true,
                                  .usage = usage};
  int n_chief, rc = tsr_arg_parse(&cmd, opts, argc, argv, &n_chief);
  if (rc) return tsr_arg_status(rc);
  if (o.backoff_max_ms < o.backoff_ms) o.backoff_max_ms = o.backoff_ms;
  char **chief_args = argv + 1;
  o.chief_args = chief_args;
  o.n_chief_args = n_chief;

  char *logdir = find_logdir(chief_args, n_chief);
  if (logdir)
    tsr_info("TensorBoard logs go to %s (view with: tensorboard --logdir "
             "%s); report.html is written there at the end",
             logdir, logdir);
  else
    tsr_info("no logdir given (job \"logdir\" key or --logdir DIR): no "
             "TensorBoard logs will be written");

  chief_local_result res;
  char err[1024] = "";
  int r = chief_local_run(&o, &res, err, sizeof err);
  if (r) {
    fprintf(stderr, "tessera local: %s\n", err[0] ? err : tsr_strerror(r));
    rc = res.chief_status ? res.chief_status : 2;
  } else {
    rc = res.chief_status;
    if (logdir)
      tsr_info("TensorBoard logs: %s  (tensorboard --logdir %s)", logdir,
               logdir);
    tsr_info("chief exit status %d; restarts: %d ps, %d worker, %d chief, "
             "%d evaluator%s",
             rc, res.restarts[CHIEF_LOCAL_PS], res.restarts[CHIEF_LOCAL_WORKER],
             res.restarts[CHIEF_LOCAL_CHIEF], res.restarts[CHIEF_LOCAL_EVALUATOR],
             res.interrupted ? " (interrupted)" : "");
  }
  free(logdir);
  return rc;
}
