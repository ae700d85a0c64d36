/* Daemon start-up (daemon.h): flags -> cluster -> task check -> log task
 * -> token -> frame MAC -> SIGPIPE. Each step's error is already one line naming the
 * file, key or variable; the task check adds which types the program
 * runs. */
#include "common/daemon.h"
#include "common/err.h"
#include "common/log.h"

#include <signal.h>
#include <sodium.h>
#include <stdio.h>
#include <string.h>

/* "ps or worker" from a bit set. */
static void type_list(unsigned bits, char *out, size_t len) {
  size_t o = 0;
  int n = 0, total = 0;
  for (int t = 0; t < TSR_TASK__COUNT; t++) total += !!(bits & TSR_TASK_BIT(t));
  out[0] = 0;
  for (int t = 0; t < TSR_TASK__COUNT && o < len; t++) {
    if (!(bits & TSR_TASK_BIT(t))) continue;
    const char *sep = n == 0 ? "" : n == total - 1 ? " or " : ", ";
    o += (size_t)snprintf(out + o, len - o, "%s%s", sep,
                          tsr_task_type_name((tsr_task_type)t));
    n++;
  }
}

int tsr_daemon_start(tsr_daemon *d, const tsr_daemon_spec *spec,
                     const tsr_daemon_flags *f, char *err, size_t errlen) {
  memset(d, 0, sizeof *d);
  tsr_cluster_init(&d->cluster);
  int rc = tsr_cluster_load(f->cluster_file, f->task, &d->cluster, err,
                            errlen);
  if (rc) return rc;
  tsr_cluster *c = &d->cluster;
  if (c->task_type == TSR_TASK_NONE ||
      !(spec->runs & TSR_TASK_BIT(c->task_type))) {
    char types[64];
    type_list(spec->runs, types, sizeof types);
    if (c->task_type == TSR_TASK_NONE)
      rc = tsr_errf(err, errlen, TSR_ECONFIG,
                    "no task: %s runs a %s task (TF_CONFIG's task or "
                    "--task TYPE:INDEX)", spec->program, types);
    else
      rc = tsr_errf(err, errlen, TSR_ECONFIG,
                    "this task is %s:%d; %s runs a %s task (TF_CONFIG's "
                    "task or --task TYPE:INDEX)",
                    tsr_task_type_name(c->task_type), c->task_index,
                    spec->program, types);
    goto fail;
  }
  if (c->task_type == TSR_TASK_CHIEF || c->task_type == TSR_TASK_EVALUATOR)
    snprintf(d->task, sizeof d->task, "%s", tsr_task_type_name(c->task_type));
  else
    snprintf(d->task, sizeof d->task, "%s:%d",
             tsr_task_type_name(c->task_type), c->task_index);
  tsr_log_set_task(spec->log_task ? spec->log_task : d->task);
  if (spec->token_for & TSR_TASK_BIT(c->task_type)) {
    rc = tsr_rpc_token_load(f->token_file, d->token, sizeof d->token,
                            &d->token_len, err, errlen);
    if (rc) goto fail;
  }
  if ((rc = tsr_rpc_frame_mac_setting(f->frame_mac, &d->plain_frames, err,
                                      errlen)))
    goto fail;
  if (d->plain_frames)
    tsr_warn("frames without a MAC asked for (trusted network only)");
  signal(SIGPIPE, SIG_IGN);
  return 0;
fail:
  tsr_daemon_free(d);
  return rc;
}

void tsr_daemon_free(tsr_daemon *d) {
  tsr_cluster_free(&d->cluster);
  sodium_memzero(d->token, sizeof d->token);
  d->token_len = 0;
}
