/* Monitoring for the chief: TensorBoard event files, JSON lines, the series
 * kept in memory for report.html, the progress display and the final
 * summary.
 *
 * The chief records every scalar once, through chief_metrics_scalar(): the
 * value goes to the TensorBoard event file, to metrics.jsonl and to the
 * in-memory series that report.html is drawn from. Each writer is also
 * usable on its own (chief_tb_* for a sidecar evaluator, chief_report_* to
 * redraw a report from an old metrics.jsonl).
 *
 * Tag conventions (what report.html groups by; TensorBoard shows any tag):
 *   loss                          training loss (mean over the logged steps)
 *   train/NAME                    training metrics and train/learning_rate
 *   eval/NAME                     eval metrics: eval/loss, eval/accuracy
 * In TensorBoard the training and eval tags are written as Keras writes
 * them (logdir/train and logdir/validation, "epoch_loss", "epoch_NAME"),
 * see chief_tb_route(); metrics.jsonl keeps the tags above.
 *   examples_per_sec, steps_per_sec   whole-cluster rates
 *   worker/I/examples_per_sec     per worker
 *   ps/I/bytes_in, ps/I/bytes_out, ps/I/apply_ms   per parameter server
 *   staleness                     mean version lag of applied pushes
 *
 * None of these functions is thread-safe: the chief calls them from its
 * loop thread. Writers never abort the run: an I/O error is returned and
 * the caller decides (the chief logs it and keeps training).
 */
#ifndef TSR_CHIEF_MONITOR_H
#define TSR_CHIEF_MONITOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common/job.h"

#define CHIEF_TAG_LOSS "loss"
#define CHIEF_TAG_EVAL_PREFIX "eval/"
#define CHIEF_TAG_EVALUATOR_PREFIX "evaluator/" /* report.html only */
#define CHIEF_TAG_EXAMPLES_PER_SEC "examples_per_sec"
#define CHIEF_TAG_STEPS_PER_SEC "steps_per_sec"
#define CHIEF_TAG_STALENESS "staleness"
#define CHIEF_TAG_SKIPPED "input/skipped_records" /* skip_corrupt's count */
#define CHIEF_TAG_WORKER_PREFIX "worker/"
#define CHIEF_TAG_PS_PREFIX "ps/"
#define CHIEF_METRICS_JSONL "metrics.jsonl"
#define CHIEF_REPORT_HTML "report.html"

/* ---- TensorBoard event files (tb_writer.c) ------------------------------
 * events.out.tfevents.<secs>.<host> in `logdir`, TFRecord framing, first
 * record Event{wall_time, file_version: "brain.Event:2"}, then one Event per
 * scalar. Records are buffered and written when `max_pending` are waiting
 * or when a record arrives `flush_ms` after the last write, and always on
 * chief_tb_flush/close, so a crash loses at most that window. */
typedef struct chief_tb chief_tb;

typedef struct {
  int max_pending;   /* records buffered before a write; 0: 64 */
  uint64_t flush_ms; /* age of the oldest buffered record that forces a
                        write; 0: 2000 */
  const char *host;  /* file name suffix; NULL: gethostname() */
  double wall_time;  /* seconds since the epoch for the file name and the
                        first record; 0: now */
  bool flat;         /* chief_metrics: one run (logdir) for every tag */
} chief_tb_opts;

/* Creates `logdir` (and its parents) when missing and opens a new event
 * file. `opts` may be NULL. On error `err` names the path and the cause. */
int chief_tb_open(chief_tb **out, const char *logdir,
                  const chief_tb_opts *opts, char *err, size_t errlen);
/* Appends Event{wall_time, step, summary{value{tag, simple_value}}}.
 * `wall_time` 0 means now. The value is stored as a float, as TensorBoard
 * keeps it. */
int chief_tb_scalar(chief_tb *tb, const char *tag, int64_t step, double value,
                    double wall_time);
/* Marks a restart from a checkpoint: Event{step, session_log{START}}, on
 * which TensorBoard drops the points of every tag with a larger step (they
 * were computed by the run that failed and are recomputed). Written at
 * once, not buffered. */
int chief_tb_session_start(chief_tb *tb, int64_t step, double wall_time);
/* Appends a histogram of `n` values (TensorBoard's HistogramProto, with
 * `buckets` equal-width buckets between the minimum and the maximum; 30
 * when 0, at most TSR_HISTO_MAX_BUCKETS), as the histograms dashboard
 * reads it. */
int chief_tb_histogram(chief_tb *tb, const char *tag, int64_t step,
                       const float *x, size_t n, int buckets,
                       double wall_time);
/* The same from a histogram already counted elsewhere (a worker's):
 * bucket_limit[i] is the right edge of bucket i. */
int chief_tb_histogram_counts(chief_tb *tb, const char *tag, int64_t step,
                              double min, double max, double num, double sum,
                              double sum_squares, const double *bucket_limit,
                              const double *bucket, size_t n_buckets,
                              double wall_time);
/* A text summary (the text plugin: a string tensor), e.g. the job file. */
int chief_tb_text(chief_tb *tb, const char *tag, int64_t step,
                  const char *text, double wall_time);
/* The hparams plugin's records for one run: the experiment (hparam and
 * metric names), the session start with the values, and the session end.
 * `metrics` are tags of the run's scalars ("epoch_loss"). Values are
 * numbers, or strings when `str` is non-NULL at that index. */
int chief_tb_hparams(chief_tb *tb, const char *const *names,
                     const double *values, const char *const *str, int n,
                     const char *const *metrics, int n_metrics,
                     double wall_time);
/* Writes the buffered records and fflush()es them to the kernel. */
int chief_tb_flush(chief_tb *tb);
/* Flushes, fsyncs and frees; returns the first error seen while writing.
 * NULL is accepted. */
int chief_tb_close(chief_tb *tb);
/* The event file's path (owned by `tb`). */
const char *chief_tb_path(const chief_tb *tb);

/* TFRecord framing of `len` bytes: `hdr12` gets the little-endian uint64
 * length and the masked CRC32C of those 8 bytes, `ftr4` the masked CRC32C
 * of the data. */
void chief_tb_frame(const void *data, size_t len, uint8_t *hdr12,
                    uint8_t *ftr4);

/* ---- series kept in memory (series.c) ---------------------------------- */
typedef struct {
  int64_t step;
  double value;     /* NaN when the value was not finite */
  double wall_time;
} chief_point;

typedef struct {
  char *tag;
  chief_point *pts; /* in the order recorded */
  size_t n, cap;
} chief_series;

typedef struct {
  chief_series *s; /* in order of first appearance */
  size_t n, cap;
} chief_series_set;

void chief_series_init(chief_series_set *set);
void chief_series_free(chief_series_set *set);
int chief_series_add(chief_series_set *set, const char *tag, int64_t step,
                     double value, double wall_time);
/* Drops every point with a step larger than `step` (a restart from the
 * checkpoint of that step), as TensorBoard does. */
void chief_series_purge_after(chief_series_set *set, int64_t step);
/* NULL when no point carries that tag. */
const chief_series *chief_series_find(const chief_series_set *set,
                                      const char *tag);
/* Appends every line of a metrics.jsonl file; a session_start line
 * ({"wall_time", "step", "event": "session_start"}) purges what came after
 * its step. A malformed line is an error naming the file and the line
 * number; nothing of that line is kept. */
int chief_series_load_jsonl(chief_series_set *set, const char *path,
                            char *err, size_t errlen);

/* ---- the recorder: TensorBoard + metrics.jsonl + series (metrics.c) ---- */
typedef struct chief_metrics chief_metrics;

/* `logdir` NULL keeps the series in memory only (no files), so the chief
 * can still print a summary when the job names no logdir. */
int chief_metrics_open(chief_metrics **out, const char *logdir,
                       const chief_tb_opts *tb_opts, char *err,
                       size_t errlen);
/* Runs of chief_tb_route(): logdir, logdir/train, logdir/validation. */
enum { CHIEF_RUN_ROOT = 0, CHIEF_RUN_TRAIN, CHIEF_RUN_VALIDATION };
/* The run and the TensorBoard tag of a recorder tag ("loss" -> train,
 * "epoch_loss"; "eval/accuracy" -> validation, "epoch_accuracy"). */
void chief_tb_route(const char *tag, int *run, char *out, size_t len);
/* The event writer of a run (opened on first use), for histograms, text
 * and hparams; NULL without a logdir or after an open failure. */
chief_tb *chief_metrics_tb(chief_metrics *m, int run);
/* Records one scalar everywhere. `wall_time` 0 means now. A point at the
 * step of the tag's last one is dropped. Returns the first write error
 * (the point is still kept in memory). */
int chief_metrics_scalar(chief_metrics *m, const char *tag, int64_t step,
                         double value, double wall_time);
/* The run resumed from the checkpoint of `step` (chief restart, or a PS
 * failure recovered): the points after it are dropped from memory and from
 * TensorBoard's view, and metrics.jsonl gets a session_start line so a
 * report rebuilt from it does the same. */
int chief_metrics_session_start(chief_metrics *m, int64_t step);
int chief_metrics_flush(chief_metrics *m);
const chief_series_set *chief_metrics_series(const chief_metrics *m);
/* NULL when opened without a logdir. */
const char *chief_metrics_logdir(const chief_metrics *m);
const char *chief_metrics_event_path(const chief_metrics *m);
/* Flushes and frees; NULL accepted. Returns the first write error seen. */
int chief_metrics_close(chief_metrics *m);

/* ---- cadence, training metrics, job records (cadence.c) ---------------- */
typedef struct {
  int64_t every_steps;   /* job summary_every_steps; 0: total / 100 */
  double every_secs;     /* job summary_every_secs; 0: off */
  int64_t last_step;
  double last_s;
} chief_summary_policy;

void chief_summary_policy_init(chief_summary_policy *p, int64_t every_steps,
                               double every_secs);
/* True (and marked written) when scalars are due at global `step`:
 * every_steps steps since the last point (default total_steps / 100, at
 * least 1; every 2 s while the length is unknown), or every_secs seconds.
 * Never twice for one step. */
bool chief_summary_due(chief_summary_policy *p, int64_t step,
                       int64_t total_steps, double now);

#define CHIEF_TRAIN_MAX 16
/* Training metrics the workers report per closure, averaged over the
 * examples between two points. Zero-initialise it. */
typedef struct {
  char names[CHIEF_TRAIN_MAX][TSR_METRIC_NAME_MAX];
  double sum[CHIEF_TRAIN_MAX], n[CHIEF_TRAIN_MAX];
  int count;
} chief_train_acc;

void chief_train_acc_add(chief_train_acc *a, char *const *names,
                         const double *values, size_t n, double examples);
/* Writes train/NAME (the mean since the last flush) and starts again. */
int chief_train_acc_flush(chief_train_acc *a, chief_metrics *m,
                          int64_t step);
/* The job file as a text summary ("job") and the hparams plugin's
 * experiment and session records (optimizer, learning rate, batch size,
 * ..., with the train and validation epoch_ metrics), in the root run. */
int chief_metrics_job_info(chief_metrics *m, const tsr_job *job);

/* ---- report.html (report.c) ----------------------------------------------
 * One self-contained page: inline SVG line charts (loss and eval/loss,
 * each other eval metric, examples/s per worker with the cluster total,
 * one chart per PS quantity with a line per PS, then any other tag) and a
 * table of the last value of every tag. Nothing is fetched: no script, no
 * font, no stylesheet link. Curves over 1000 points are thinned by taking
 * every k-th point (the last one always kept). */
typedef struct {
  const char *title;      /* NULL: "Tessera training report" */
  const char *subtitle;   /* e.g. the job file and the cluster; may be NULL */
} chief_report_opts;

/* Writes the page to `path` through a temp file and rename(), so a reader
 * never sees half a page. */
int chief_report_write(const char *path, const chief_series_set *set,
                       const chief_report_opts *opts, char *err,
                       size_t errlen);
/* Re-reads `logdir`/metrics.jsonl and writes `logdir`/report.html. */
int chief_report_from_logdir(const char *logdir, const chief_report_opts *opts,
                             char *err, size_t errlen);

/* ---- progress display (progress.c) --------------------------------------
 * BAR: one line redrawn in place with '\r' (step/total, a bar, loss,
 * examples/s, ETA), at most every `min_redraw_s`; LINES: a plain log line
 * every `log_every_s`; AUTO picks BAR when `out` is a terminal, else LINES.
 * TESSERA_PROGRESS=bar|lines|off overrides AUTO (tessera local sets it for
 * a chief whose output it relays to a terminal). */
typedef enum {
  CHIEF_PROGRESS_AUTO = 0,
  CHIEF_PROGRESS_BAR,
  CHIEF_PROGRESS_LINES,
  CHIEF_PROGRESS_OFF
} chief_progress_mode;

typedef struct {
  FILE *out;               /* NULL: stdout */
  chief_progress_mode mode;
  int64_t total_steps;     /* 0: unknown (no bar fill, no ETA) */
  double log_every_s;      /* LINES; 0: 10 s */
  double min_redraw_s;     /* BAR; 0: 0.1 s */
  int width;               /* BAR; 0: $COLUMNS or 80 */
} chief_progress_opts;

typedef struct chief_progress chief_progress;

int chief_progress_create(chief_progress **out, const chief_progress_opts *o);
/* The mode after AUTO and TESSERA_PROGRESS were resolved. */
chief_progress_mode chief_progress_get_mode(const chief_progress *p);
/* `examples` is the cumulative count; `loss` NaN when unknown; `now_s` a
 * monotonic time (tsr_now_s()). Rates are measured over the last ~10 s. */
void chief_progress_update(chief_progress *p, int64_t step, int64_t examples,
                           double loss, double now_s);
/* Prints one line above the bar (or as a plain line) without tearing it. */
void chief_progress_note(chief_progress *p, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Draws the last state and ends the bar's line. */
void chief_progress_finish(chief_progress *p);
/* Last measured rates (0 before two samples); for the TensorBoard scalars. */
double chief_progress_examples_per_sec(const chief_progress *p);
double chief_progress_steps_per_sec(const chief_progress *p);
void chief_progress_free(chief_progress *p);

/* Formats seconds as "1h02m", "3m05s" or "12s" into `buf`. */
void chief_format_duration(double s, char *buf, size_t len);

/* ---- final summary (summary.c) ---------------------------------------- */
typedef struct {
  const char *name;  /* "accuracy", "loss" (without the eval/ prefix) */
  double value;
} chief_metric_value;

typedef struct {
  int64_t steps;
  int64_t steps_run;     /* trained by this process (a resumed run: not
                            the restored ones); -1 unknown */
  int64_t examples;      /* since step 0 (a resumed run: the restored
                            ones too) */
  int64_t examples_run;  /* trained by this process: what the rate counts
                            when the run resumed (resumed_from_step >= 0);
                            a run that did not resume counts examples */
  double seconds;
  bool has_loss;
  double final_loss;
  const chief_metric_value *eval;  /* last evaluation; may be NULL */
  size_t n_eval;
  int restarts_worker;   /* worker processes that came back */
  int restarts_ps;       /* PS failures recovered from a checkpoint */
  int restarts_chief;    /* chief restarts (resumed from a checkpoint) */
  int64_t skipped_records; /* corrupt input records skipped (skip_corrupt) */
  int64_t resumed_from_step;  /* -1 when the run started fresh */
  const char *logdir;    /* may be NULL */
  const char *checkpoint_dir; /* may be NULL */
  int64_t last_ckpt_step;     /* newest committed checkpoint, -1 none */
  size_t n_failed_ckpts;      /* checkpoints that failed (disk full...) */
  const int64_t *failed_ckpt_steps;
  const char *const *failed_ckpt_reasons;
  int exit_status;            /* 0: the job is done */
  const char *error;          /* why it failed; NULL when it did not */
} chief_summary;

/* Human summary, a few lines. */
void chief_summary_print(FILE *out, const chief_summary *s);
/* JSON object with the same fields (eval as {"name": value}), written to a
 * temp file and renamed over `path`. Non-finite numbers become null. */
int chief_summary_write_json(const char *path, const chief_summary *s,
                             char *err, size_t errlen);

#endif /* TSR_CHIEF_MONITOR_H */
