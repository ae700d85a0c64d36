/* The chief's scalar recorder: one call records a value in the TensorBoard
 * event files, in metrics.jsonl and in memory (for report.html and the
 * summary).
 *
 * TensorBoard runs, as Keras's TensorBoard callback lays them out so the
 * curves overlay: the training loss ("loss") and "train/NAME" go to
 * logdir/train as "epoch_loss" / "epoch_NAME", "eval/NAME" to
 * logdir/validation as "epoch_NAME"; the cluster's own scalars (rates,
 * PS and worker figures) stay in logdir. With flat set (the evaluator
 * sidecar) every tag goes to logdir, eval/ and train/ ones renamed the same
 * way. A second point of a tag at the step of its last one is dropped (the
 * final summary repeats the last step), so no curve has duplicates.
 *
 * metrics.jsonl holds one object per line,
 *   {"wall_time": 1764600000.123, "step": 100, "tag": "loss", "value": 0.42}
 * with null for a non-finite value (JSON has no NaN), and
 *   {"wall_time": ..., "step": 1200, "event": "session_start"}
 * where the run resumed from a checkpoint. It is flushed with
 * the event file. Failure modes: files that cannot be created fail open
 * with the path named; later write errors are remembered, returned, and
 * never lose the in-memory copy.
 */
#include "artifacts/monitor/monitor.h"
#include "artifacts/monitor/monitor_int.h"
#include "common/clock.h"
#include "common/err.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct chief_metrics {
  char *logdir;
  chief_tb *tb;
  chief_tb *tb_train, *tb_val;  /* opened on first use */
  bool flat;
  chief_tb_opts tb_opts;
  FILE *jsonl;
  chief_series_set series;
  int error;
};

int chief_metrics_open(chief_metrics **out, const char *logdir,
                       const chief_tb_opts *tb_opts, char *err,
                       size_t errlen) {
  chief_metrics *m = calloc(1, sizeof *m);
  if (!m) return TSR_ENOMEM;
  chief_series_init(&m->series);
  if (tb_opts) {
    m->tb_opts = *tb_opts;
    m->flat = tb_opts->flat;
  }
  int rc = 0;
  if (logdir) {
    m->logdir = strdup(logdir);
    if (!m->logdir) {
      rc = TSR_ENOMEM;
      goto fail;
    }
    rc = chief_tb_open(&m->tb, logdir, tb_opts, err, errlen);
    if (rc) goto fail;
    size_t plen = strlen(logdir) + sizeof(CHIEF_METRICS_JSONL) + 2;
    char *p = malloc(plen);
    if (!p) {
      rc = TSR_ENOMEM;
      goto fail;
    }
    snprintf(p, plen, "%s/%s", logdir, CHIEF_METRICS_JSONL);
    /* Append: a restarted chief continues the same series. */
    m->jsonl = fopen(p, "ae");
    if (!m->jsonl) {
      rc = -errno;
      snprintf(err, errlen, "cannot open %s: %s", p, strerror(errno));
      free(p);
      goto fail;
    }
    free(p);
  }
  *out = m;
  return 0;
fail:
  chief_tb_close(m->tb);
  free(m->logdir);
  free(m);
  return rc;
}

void chief_tb_route(const char *tag, int *run, char *out, size_t len) {
  const char *rest = NULL;
  *run = CHIEF_RUN_ROOT;
  if (!strcmp(tag, CHIEF_TAG_LOSS)) {
    *run = CHIEF_RUN_TRAIN;
    rest = "loss";
  } else if (!strncmp(tag, "train/", 6)) {
    *run = CHIEF_RUN_TRAIN;
    rest = tag + 6;
  } else if (!strncmp(tag, CHIEF_TAG_EVAL_PREFIX, 5)) {
    *run = CHIEF_RUN_VALIDATION;
    rest = tag + 5;
  }
  if (rest)
    snprintf(out, len, "epoch_%s", rest);
  else
    snprintf(out, len, "%s", tag);
}

/* The writer of a run, opened the first time it is needed. */
static chief_tb *run_writer(chief_metrics *m, int run) {
  if (run == CHIEF_RUN_ROOT || m->flat) return m->tb;
  chief_tb **slot = run == CHIEF_RUN_TRAIN ? &m->tb_train : &m->tb_val;
  if (*slot || m->error) return *slot;
  size_t n = strlen(m->logdir) + 16;
  char *dir = malloc(n);
  char err[512];
  if (!dir) {
    m->error = TSR_ENOMEM;
    return NULL;
  }
  snprintf(dir, n, "%s/%s", m->logdir,
           run == CHIEF_RUN_TRAIN ? "train" : "validation");
  int rc = chief_tb_open(slot, dir, &m->tb_opts, err, sizeof err);
  free(dir);
  if (rc) {
    *slot = NULL;
    m->error = rc;
  }
  return *slot;
}

chief_tb *chief_metrics_tb(chief_metrics *m, int run) {
  return m->tb ? run_writer(m, run) : NULL;
}

int chief_metrics_scalar(chief_metrics *m, const char *tag, int64_t step,
                         double value, double wall_time) {
  if (wall_time <= 0) wall_time = tsr_wall_s();
  const chief_series *old = chief_series_find(&m->series, tag);
  if (old && old->n > 0 && old->pts[old->n - 1].step == step) return 0;
  int rc = chief_series_add(&m->series, tag, step, value, wall_time);
  if (m->tb) {
    int run;
    char t[160];
    chief_tb_route(tag, &run, t, sizeof t);
    if (m->flat && run != CHIEF_RUN_ROOT) run = CHIEF_RUN_ROOT;
    chief_tb *w = run_writer(m, run);
    int r = w ? chief_tb_scalar(w, t, step, value, wall_time) : m->error;
    if (r && !m->error) m->error = r;
  }
  if (m->jsonl) {
    /* The tag is written as a JSON string: escape what JSON requires. */
    chief__buf b = {0};
    chief__buf_printf(&b, "{\"wall_time\": %.3f, \"step\": %lld, \"tag\": \"",
                      wall_time, (long long)step);
    for (const unsigned char *c = (const unsigned char *)tag; *c; c++) {
      if (*c == '"' || *c == '\\')
        chief__buf_printf(&b, "\\%c", *c);
      else if (*c < 0x20)
        chief__buf_printf(&b, "\\u%04x", *c);
      else
        chief__buf_put(&b, c, 1);
    }
    if (isfinite(value))
      chief__buf_printf(&b, "\", \"value\": %.9g}\n", value);
    else
      chief__buf_printf(&b, "\", \"value\": null}\n");
    if (b.oom) {
      if (!m->error) m->error = TSR_ENOMEM;
    } else if (fwrite(b.p, 1, b.len, m->jsonl) != b.len && !m->error) {
      m->error = errno ? -errno : TSR_EIO;
    }
    chief__buf_free(&b);
  }
  return rc ? rc : m->error;
}

int chief_metrics_session_start(chief_metrics *m, int64_t step) {
  double wall = tsr_wall_s();
  chief_series_purge_after(&m->series, step);
  chief_tb *ws[3] = {m->tb, m->tb_train, m->tb_val};
  for (int i = 0; i < 3; i++) {
    if (!ws[i]) continue;
    int r = chief_tb_session_start(ws[i], step, wall);
    if (r && !m->error) m->error = r;
  }
  if (m->jsonl) {
    if (fprintf(m->jsonl,
                "{\"wall_time\": %.3f, \"step\": %lld, \"event\": "
                "\"session_start\"}\n",
                wall, (long long)step) < 0 ||
        fflush(m->jsonl) != 0) {
      if (!m->error) m->error = errno ? -errno : TSR_EIO;
    }
  }
  return m->error;
}

int chief_metrics_flush(chief_metrics *m) {
  chief_tb *ws[3] = {m->tb, m->tb_train, m->tb_val};
  for (int i = 0; i < 3; i++) {
    if (!ws[i]) continue;
    int r = chief_tb_flush(ws[i]);
    if (r && !m->error) m->error = r;
  }
  if (m->jsonl && fflush(m->jsonl) != 0 && !m->error)
    m->error = errno ? -errno : TSR_EIO;
  return m->error;
}

const chief_series_set *chief_metrics_series(const chief_metrics *m) {
  return &m->series;
}

const char *chief_metrics_logdir(const chief_metrics *m) { return m->logdir; }

const char *chief_metrics_event_path(const chief_metrics *m) {
  return m->tb ? chief_tb_path(m->tb) : NULL;
}

int chief_metrics_close(chief_metrics *m) {
  if (!m) return 0;
  int rc = m->error;
  chief_tb *ws[3] = {m->tb, m->tb_train, m->tb_val};
  for (int i = 0; i < 3; i++) {
    int r = chief_tb_close(ws[i]);
    if (r && !rc) rc = r;
  }
  if (m->jsonl) {
    if (fflush(m->jsonl) != 0 && !rc) rc = errno ? -errno : TSR_EIO;
    if (fsync(fileno(m->jsonl)) != 0 && !rc) rc = -errno;
    if (fclose(m->jsonl) != 0 && !rc) rc = -errno;
  }
  chief_series_free(&m->series);
  free(m->logdir);
  free(m);
  return rc;
}
