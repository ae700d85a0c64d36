/* When the chief writes its scalars, the training metrics it averages
 * between two points, and the job's own records (hparams, the job file as
 * text) at the start of a run.
 *
 * Happy path: chief_summary_due() says yes once `every_steps` global steps
 * have passed since the last point (default: a hundredth of the run, so a
 * short run still gets about 100 points, at closure granularity), or
 * `every_secs` seconds have (0: off). chief_train_acc sums each training
 * metric weighted by the examples it covered and writes the means as
 * train/NAME. chief_metrics_job_info() writes the hparams plugin's records
 * and the job text into the root run.
 * Failure modes: only the writers' (returned, never fatal).
 */
#include "artifacts/monitor/monitor.h"
#include "common/err.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

void chief_summary_policy_init(chief_summary_policy *p, int64_t every_steps,
                               double every_secs) {
  memset(p, 0, sizeof *p);
  p->every_steps = every_steps;
  p->every_secs = every_secs;
  p->last_step = -1;
}

bool chief_summary_due(chief_summary_policy *p, int64_t step,
                       int64_t total_steps, double now) {
  int64_t every = p->every_steps;
  if (every <= 0 && total_steps > 0) every = total_steps / 100;
  if (every <= 0 && total_steps > 0) every = 1;
  bool due = false;
  if (p->last_step < 0) due = step > 0;
  else if (every > 0 && step - p->last_step >= every) due = true;
  if (every <= 0 && p->every_secs <= 0 && now - p->last_s >= 2.0)
    due = true; /* length unknown yet: every 2 s */
  if (p->every_secs > 0 && now - p->last_s >= p->every_secs) due = true;
  if (due && step == p->last_step) due = false;
  if (due) {
    p->last_step = step;
    p->last_s = now;
  }
  return due;
}

void chief_train_acc_add(chief_train_acc *a, char *const *names,
                         const double *values, size_t n, double examples) {
  if (!(examples > 0)) return;
  for (size_t i = 0; i < n; i++) {
    if (!isfinite(values[i])) continue;
    int k;
    for (k = 0; k < a->count; k++)
      if (!strcmp(a->names[k], names[i])) break;
    if (k == a->count) {
      if (a->count == CHIEF_TRAIN_MAX) continue;
      snprintf(a->names[k], sizeof a->names[k], "%s", names[i]);
      a->sum[k] = a->n[k] = 0;
      a->count++;
    }
    a->sum[k] += values[i] * examples;
    a->n[k] += examples;
  }
}

int chief_train_acc_flush(chief_train_acc *a, chief_metrics *m,
                          int64_t step) {
  int rc = 0;
  for (int k = 0; k < a->count; k++) {
    if (!(a->n[k] > 0)) continue;
    char tag[TSR_METRIC_NAME_MAX + 16];
    snprintf(tag, sizeof tag, "train/%s", a->names[k]);
    int r = chief_metrics_scalar(m, tag, step, a->sum[k] / a->n[k], 0);
    if (r && !rc) rc = r;
    a->sum[k] = a->n[k] = 0;
  }
  return rc;
}

int chief_metrics_job_info(chief_metrics *m, const tsr_job *job) {
  chief_tb *tb = chief_metrics_tb(m, CHIEF_RUN_ROOT);
  if (!tb) return 0;
  char *text = job->raw ? json_dumps(job->raw, JSON_INDENT(2) |
                                                   JSON_PRESERVE_ORDER)
                        : NULL;
  int rc = 0;
  if (text) {
    /* the text plugin renders markdown: a code block keeps the JSON */
    size_t n = strlen(text) + 16;
    char *md = malloc(n);
    if (md) {
      snprintf(md, n, "```\n%s\n```", text);
      rc = chief_tb_text(tb, "job", 0, md, 0);
      free(md);
    }
    free(text);
  }
  const tsr_optim_spec *o = &job->optimizer;
  const char *names[] = {"optimizer", "learning_rate", "lr_schedule",
                         "batch_size", "steps", "epochs", "mode", "loss",
                         "precision", "seed", "weight_decay"};
  double vals[] = {0, o->learning_rate, 0, (double)job->batch_size,
                   (double)job->steps, (double)job->epochs, 0, 0, 0,
                   (double)job->seed, o->weight_decay};
  const char *mode = job->mode == TSR_MODE_ASYNC ? "async"
                     : job->mode == TSR_MODE_SYNC ? "sync" : "ssp";
  const char *strs[] = {tsr_optim_name(o->kind), NULL,
                        tsr_lr_schedule_name(o->schedule.kind), NULL, NULL,
                        NULL, mode, job->loss ? job->loss : "mse",
                        tsr_precision_name(job->precision), NULL, NULL};
  char mtags[CHIEF_TRAIN_MAX + 2][TSR_METRIC_NAME_MAX + 32];
  const char *mt[CHIEF_TRAIN_MAX + 2];
  int nm = 0;
  snprintf(mtags[nm++], sizeof mtags[0], "train/epoch_loss");
  snprintf(mtags[nm++], sizeof mtags[0], "validation/epoch_loss");
  for (int i = 0; i < job->n_metrics && nm < CHIEF_TRAIN_MAX + 2; i++) {
    char name[TSR_METRIC_NAME_MAX];
    snprintf(name, sizeof name, "%s", job->metrics[i]);
    char *at = strchr(name, '@');
    if (at) *at = 0;
    snprintf(mtags[nm++], sizeof mtags[0], "validation/epoch_%s", name);
  }
  for (int i = 0; i < nm; i++) mt[i] = mtags[i];
  int r = chief_tb_hparams(tb, names, vals, strs,
                           (int)(sizeof names / sizeof names[0]), mt, nm, 0);
  if (r && !rc) rc = r;
  r = chief_metrics_flush(m);
  return rc ? rc : r;
}
