/* The chief's scalar recorder: one call records a value in the TensorBoard
 * event file, in metrics.jsonl and in memory (for report.html and the
 * summary).
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
#include "chief/monitor/monitor.h"
#include "chief/monitor/monitor_int.h"
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

int chief_metrics_scalar(chief_metrics *m, const char *tag, int64_t step,
                         double value, double wall_time) {
  if (wall_time <= 0) wall_time = tsr_wall_s();
  int rc = chief_series_add(&m->series, tag, step, value, wall_time);
  if (m->tb) {
    int r = chief_tb_scalar(m->tb, tag, step, value, wall_time);
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
  if (m->tb) {
    int r = chief_tb_session_start(m->tb, step, wall);
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
  if (m->tb) {
    int r = chief_tb_flush(m->tb);
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
  int r = chief_tb_close(m->tb);
  if (r && !rc) rc = r;
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
