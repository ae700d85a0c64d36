/* report.html: the run at a glance for people without TensorBoard.
 *
 * One self-contained page: inline CSS and inline SVG, no script, nothing
 * fetched, so it opens from a file:// URL, an e-mail attachment or a CI
 * artifact. Charts are grouped by the tag conventions of monitor.h (loss,
 * eval/, examples/s per worker, one chart per PS quantity with a line per
 * PS, then every other tag), followed by a table of the last values.
 * Failure modes: no series at all still writes a page that says so; an
 * unwritable path returns the error with the path.
 */
#include "artifacts/monitor/monitor.h"
#include "artifacts/monitor/monitor_int.h"
#include "common/err.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_POINTS 1000
#define MAX_LINES 64
#define W 680
#define H 300
#define ML 70
#define MR 20
#define MT 16
#define MB 40

static const char *const palette[] = {"#1f77b4", "#ff7f0e", "#2ca02c",
                                      "#d62728", "#9467bd", "#8c564b",
                                      "#e377c2", "#7f7f7f", "#bcbd22",
                                      "#17becf"};

typedef struct {
  const chief_series *s;
  const char *label;
} line;

/* 1, 2 or 5 times a power of ten, about range/target. */
static double nice_step(double range, int target) {
  double raw = range / target;
  double p = pow(10, floor(log10(raw)));
  double m = raw / p;
  return (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10) * p;
}

static void fmt_num(double v, char *buf, size_t len) {
  double a = fabs(v);
  if (a >= 1e12)
    snprintf(buf, len, "%.3g", v);
  else if (a >= 1e9)
    snprintf(buf, len, "%.4gG", v / 1e9);
  else if (a >= 1e6)
    snprintf(buf, len, "%.4gM", v / 1e6);
  else if (a != 0 && a < 1e-3)
    snprintf(buf, len, "%.3g", v);
  else
    snprintf(buf, len, "%.6g", v);
}

static void chart(chief__buf *b, const char *title, const line *ls, int n) {
  int64_t x0 = INT64_MAX, x1 = INT64_MIN;
  double y0 = INFINITY, y1 = -INFINITY;
  for (int i = 0; i < n; i++)
    for (size_t k = 0; k < ls[i].s->n; k++) {
      const chief_point *p = &ls[i].s->pts[k];
      if (p->step < x0) x0 = p->step;
      if (p->step > x1) x1 = p->step;
      if (isfinite(p->value)) {
        if (p->value < y0) y0 = p->value;
        if (p->value > y1) y1 = p->value;
      }
    }
  chief__buf_printf(b, "<figure>\n<figcaption>");
  chief__buf_html(b, title);
  chief__buf_printf(b, "</figcaption>\n");
  if (x0 > x1 || !isfinite(y0)) {
    chief__buf_printf(b, "<p class=\"empty\">no finite values</p></figure>\n");
    return;
  }
  if (x1 == x0) { /* one step: centre it */
    x0 -= 1;
    x1 += 1;
  }
  if (y1 - y0 < 1e-12 * (fabs(y0) + 1)) {
    double pad = fabs(y0) > 0 ? fabs(y0) * 0.1 : 1;
    y0 -= pad;
    y1 += pad;
  }
  double ys = nice_step(y1 - y0, 5);
  y0 = floor(y0 / ys) * ys;
  y1 = ceil(y1 / ys) * ys;
  double pw = W - ML - MR, ph = H - MT - MB;
#define PX(step) (ML + ((double)((step) - x0)) / (double)(x1 - x0) * pw)
#define PY(v) (MT + (1 - ((v) - y0) / (y1 - y0)) * ph)
  chief__buf_printf(b,
                    "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" "
                    "height=\"%d\" viewBox=\"0 0 %d %d\" role=\"img\">\n",
                    W, H, W, H);
  chief__buf_printf(b,
                    "<rect x=\"%d\" y=\"%d\" width=\"%.0f\" height=\"%.0f\" "
                    "class=\"plot\"/>\n",
                    ML, MT, pw, ph);
  char num[32];
  for (double v = y0; v <= y1 + ys * 1e-6; v += ys) {
    double y = PY(v);
    fmt_num(fabs(v) < ys * 1e-9 ? 0 : v, num, sizeof num);
    chief__buf_printf(b,
                      "<line x1=\"%d\" x2=\"%.0f\" y1=\"%.1f\" y2=\"%.1f\" "
                      "class=\"grid\"/><text x=\"%d\" y=\"%.1f\" "
                      "class=\"yl\">%s</text>\n",
                      ML, ML + pw, y, y, ML - 6, y + 4, num);
  }
  double xs = nice_step((double)(x1 - x0), 6);
  if (xs < 1) xs = 1;
  for (double v = ceil(x0 / xs) * xs; v <= x1; v += xs) {
    double x = ML + (v - (double)x0) / (double)(x1 - x0) * pw;
    chief__buf_printf(b,
                      "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%d\" y2=\"%.0f\" "
                      "class=\"grid\"/><text x=\"%.1f\" y=\"%.0f\" "
                      "class=\"xl\">%.0f</text>\n",
                      x, x, MT, MT + ph, x, MT + ph + 16, v);
  }
  chief__buf_printf(b,
                    "<text x=\"%.0f\" y=\"%d\" class=\"xt\">step</text>\n",
                    ML + pw / 2, H - 4);
  for (int i = 0; i < n; i++) {
    const chief_series *s = ls[i].s;
    size_t every = s->n > MAX_POINTS ? (s->n + MAX_POINTS - 1) / MAX_POINTS : 1;
    const char *color = palette[i % 10];
    bool open = false;
    for (size_t k = 0; k < s->n; k++) {
      if (k % every && k != s->n - 1) continue;
      const chief_point *p = &s->pts[k];
      if (!isfinite(p->value)) { /* a gap, not a dive to zero */
        if (open) chief__buf_printf(b, "\"/>\n");
        open = false;
        continue;
      }
      if (!open)
        chief__buf_printf(b, "<polyline class=\"l\" stroke=\"%s\" points=\"",
                          color);
      chief__buf_printf(b, "%s%.1f,%.1f", open ? " " : "", PX(p->step),
                        PY(p->value));
      open = true;
    }
    if (open) chief__buf_printf(b, "\"/>\n");
    if (s->n == 1 && isfinite(s->pts[0].value))
      chief__buf_printf(b,
                        "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" "
                        "fill=\"%s\"/>\n",
                        PX(s->pts[0].step), PY(s->pts[0].value), color);
  }
#undef PX
#undef PY
  chief__buf_printf(b, "</svg>\n<div class=\"legend\">");
  for (int i = 0; i < n; i++) {
    chief__buf_printf(b, "<span><i style=\"background:%s\"></i>",
                      palette[i % 10]);
    chief__buf_html(b, ls[i].label);
    chief__buf_printf(b, "</span>");
  }
  chief__buf_printf(b, "</div>\n</figure>\n");
}

/* Horizontal bars of each line's last finite value: how evenly the PS
 * share the load, at a glance. */
static void bars(chief__buf *b, const char *title, const line *ls, int n) {
  double vmax = 0;
  double *last = calloc((size_t)(n ? n : 1), sizeof *last);
  if (!last) {
    b->oom = 1;
    return;
  }
  for (int i = 0; i < n; i++) {
    last[i] = NAN;
    for (size_t k = ls[i].s->n; k-- > 0;)
      if (isfinite(ls[i].s->pts[k].value)) {
        last[i] = ls[i].s->pts[k].value;
        break;
      }
    if (isfinite(last[i]) && fabs(last[i]) > vmax) vmax = fabs(last[i]);
  }
  const int row = 26, label_w = 150, val_w = 80;
  int h = MT + n * row + 8;
  double bw = W - label_w - val_w - MR;
  chief__buf_printf(b, "<figure>\n<figcaption>");
  chief__buf_html(b, title);
  chief__buf_printf(b,
                    "</figcaption>\n<svg xmlns=\"http://www.w3.org/2000/svg\" "
                    "width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
                    "role=\"img\">\n",
                    W, h, W, h);
  for (int i = 0; i < n; i++) {
    double y = MT + i * row;
    double len = vmax > 0 && isfinite(last[i]) ? fabs(last[i]) / vmax * bw : 0;
    char num[32];
    if (isfinite(last[i]))
      fmt_num(last[i], num, sizeof num);
    else
      snprintf(num, sizeof num, "-");
    chief__buf_printf(b, "<text x=\"%d\" y=\"%.0f\" class=\"yl\">",
                      label_w - 8, y + 15);
    chief__buf_html(b, ls[i].label);
    chief__buf_printf(b,
                      "</text><rect x=\"%d\" y=\"%.0f\" width=\"%.1f\" "
                      "height=\"18\" fill=\"%s\"/><text x=\"%.1f\" "
                      "y=\"%.0f\" class=\"bl\">%s</text>\n",
                      label_w, y + 2, len, palette[i % 10],
                      label_w + len + 6, y + 15, num);
  }
  chief__buf_printf(b, "</svg>\n</figure>\n");
  free(last);
}

static int by_tag(const void *a, const void *b) {
  return strverscmp((*(const line *)a).s->tag, (*(const line *)b).s->tag);
}

static bool starts(const char *s, const char *p) {
  return strncmp(s, p, strlen(p)) == 0;
}

/* "ps/3/bytes_in" -> "bytes_in" (the part after the index), or NULL. */
static const char *indexed_suffix(const char *tag, const char *prefix) {
  if (!starts(tag, prefix)) return NULL;
  const char *p = tag + strlen(prefix);
  if (*p < '0' || *p > '9') return NULL;
  while (*p >= '0' && *p <= '9') p++;
  return *p == '/' ? p + 1 : NULL;
}

static void section(chief__buf *b, const char *h) {
  chief__buf_printf(b, "<h2>");
  chief__buf_html(b, h);
  chief__buf_printf(b, "</h2>\n");
}

static void body(chief__buf *b, const chief_series_set *set) {
  size_t n = set->n;
  bool *used = calloc(n ? n : 1, sizeof *used);
  line *ls = calloc(n ? n : 1, sizeof *ls);
  if (!used || !ls) {
    b->oom = 1;
    goto out;
  }
  int k = 0;
  /* Loss: training loss, then eval loss and the evaluator sidecar's, in
   * the same chart. */
  static const char *const loss_tags[] = {CHIEF_TAG_LOSS,
                                          CHIEF_TAG_EVAL_PREFIX "loss",
                                          CHIEF_TAG_EVALUATOR_PREFIX "loss"};
  for (int j = 0; j < 3; j++)
    for (size_t i = 0; i < n; i++)
      if (!strcmp(set->s[i].tag, loss_tags[j])) {
        ls[k++] = (line){&set->s[i], set->s[i].tag};
        used[i] = true;
      }
  if (k) {
    section(b, "Loss");
    chart(b, "loss", ls, k);
  }
  /* Each other eval metric. */
  bool first = true;
  for (size_t i = 0; i < n; i++) {
    const char *t = set->s[i].tag;
    if (used[i] || (!starts(t, CHIEF_TAG_EVAL_PREFIX) &&
                    !starts(t, CHIEF_TAG_EVALUATOR_PREFIX)))
      continue;
    if (first) section(b, "Evaluation");
    first = false;
    line one = {&set->s[i], t};
    chart(b, t, &one, 1);
    used[i] = true;
  }
  /* Throughput: the cluster total and each worker. */
  k = 0;
  for (size_t i = 0; i < n && k < MAX_LINES; i++) {
    const char *t = set->s[i].tag;
    const char *suf = indexed_suffix(t, CHIEF_TAG_WORKER_PREFIX);
    if (!strcmp(t, CHIEF_TAG_EXAMPLES_PER_SEC) ||
        (suf && !strcmp(suf, CHIEF_TAG_EXAMPLES_PER_SEC))) {
      ls[k++] = (line){&set->s[i], t};
      used[i] = true;
    }
  }
  if (k) {
    qsort(ls, (size_t)k, sizeof *ls, by_tag);
    section(b, "Examples per second");
    chart(b, "examples/s (cluster and per worker)", ls, k);
  }
  /* Per-PS load: one chart per quantity, a line per PS. */
  first = true;
  for (size_t i = 0; i < n; i++) {
    const char *suf = indexed_suffix(set->s[i].tag, CHIEF_TAG_PS_PREFIX);
    if (used[i] || !suf) continue;
    k = 0;
    for (size_t j = i; j < n && k < MAX_LINES; j++) {
      const char *sj = indexed_suffix(set->s[j].tag, CHIEF_TAG_PS_PREFIX);
      if (!used[j] && sj && !strcmp(sj, suf)) {
        ls[k++] = (line){&set->s[j], set->s[j].tag};
        used[j] = true;
      }
    }
    qsort(ls, (size_t)k, sizeof *ls, by_tag);
    if (first) section(b, "Load per parameter server");
    first = false;
    char title[160];
    snprintf(title, sizeof title, "%s per PS", suf);
    chart(b, title, ls, k);
    snprintf(title, sizeof title, "%s per PS, last value", suf);
    bars(b, title, ls, k);
  }
  /* Everything else, one chart each (per-worker tags grouped as above). */
  first = true;
  for (size_t i = 0; i < n; i++) {
    if (used[i]) continue;
    const char *suf = indexed_suffix(set->s[i].tag, CHIEF_TAG_WORKER_PREFIX);
    k = 0;
    if (suf) {
      for (size_t j = i; j < n && k < MAX_LINES; j++) {
        const char *sj =
            indexed_suffix(set->s[j].tag, CHIEF_TAG_WORKER_PREFIX);
        if (!used[j] && sj && !strcmp(sj, suf)) {
          ls[k++] = (line){&set->s[j], set->s[j].tag};
          used[j] = true;
        }
      }
      qsort(ls, (size_t)k, sizeof *ls, by_tag);
    } else {
      ls[k++] = (line){&set->s[i], set->s[i].tag};
      used[i] = true;
    }
    if (first) section(b, "Other scalars");
    first = false;
    char title[160];
    snprintf(title, sizeof title, "%s%s", suf ? suf : set->s[i].tag,
             suf ? " per worker" : "");
    chart(b, title, ls, k);
  }
  /* Last values. */
  section(b, "Last values");
  chief__buf_printf(b, "<table><tr><th>tag</th><th>points</th><th>last "
                       "step</th><th>last</th><th>min</th><th>max</th></tr>\n");
  for (size_t i = 0; i < n; i++) {
    const chief_series *s = &set->s[i];
    double lo = INFINITY, hi = -INFINITY;
    for (size_t j = 0; j < s->n; j++)
      if (isfinite(s->pts[j].value)) {
        if (s->pts[j].value < lo) lo = s->pts[j].value;
        if (s->pts[j].value > hi) hi = s->pts[j].value;
      }
    char last[32], mn[32], mx[32];
    fmt_num(s->pts[s->n - 1].value, last, sizeof last);
    fmt_num(lo, mn, sizeof mn);
    fmt_num(hi, mx, sizeof mx);
    chief__buf_printf(b, "<tr><td>");
    chief__buf_html(b, s->tag);
    chief__buf_printf(b,
                      "</td><td>%zu</td><td>%lld</td><td>%s</td><td>%s</td>"
                      "<td>%s</td></tr>\n",
                      s->n, (long long)s->pts[s->n - 1].step,
                      isfinite(s->pts[s->n - 1].value) ? last : "-",
                      isfinite(lo) ? mn : "-", isfinite(hi) ? mx : "-");
  }
  chief__buf_printf(b, "</table>\n");
out:
  free(used);
  free(ls);
}

static const char css[] =
    "body{font:14px/1.4 system-ui,-apple-system,'Segoe UI',sans-serif;"
    "margin:24px auto;max-width:1440px;padding:0 16px;color:#222}"
    "h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;"
    "border-bottom:1px solid #ddd;width:100%}"
    ".sub{color:#666;margin:0 0 12px}"
    "figure{display:inline-block;margin:0 16px 16px 0;vertical-align:top}"
    "figcaption{font-weight:600;margin:0 0 4px}"
    "svg{background:#fff;border:1px solid #e4e4e4;border-radius:4px;"
    "max-width:100%;height:auto}"
    ".plot{fill:#fcfcfc}.grid{stroke:#e8e8e8;stroke-width:1}"
    ".yl{font-size:11px;fill:#555;text-anchor:end}"
    ".xl{font-size:11px;fill:#555;text-anchor:middle}"
    ".xt{font-size:12px;fill:#333;text-anchor:middle}"
    ".bl{font-size:11px;fill:#333}"
    ".l{fill:none;stroke-width:1.6;stroke-linejoin:round}"
    ".legend span{margin-right:14px;font-size:12px;white-space:nowrap}"
    ".legend i{display:inline-block;width:12px;height:3px;margin-right:5px;"
    "vertical-align:middle}"
    ".empty{color:#999}"
    "table{border-collapse:collapse;font-size:13px}"
    "td,th{border-bottom:1px solid #eee;padding:3px 12px;text-align:right}"
    "td:first-child,th:first-child{text-align:left}";

/* The evaluator sidecar writes logdir/eval/metrics.jsonl: its eval/ tags
 * join the chief's series as evaluator/NAME, so the page shows its curve.
 * Returns `set` itself when there is no such file (or it cannot be read:
 * the page is still drawn from what the chief has). */
static const chief_series_set *with_evaluator(const char *path,
                                              const chief_series_set *set,
                                              chief_series_set *merged) {
  const char *slash = strrchr(path, '/');
  size_t dl = slash ? (size_t)(slash - path) : 0;
  char p[4096];
  snprintf(p, sizeof p, "%.*s%seval/" CHIEF_METRICS_JSONL, (int)dl, path,
           slash ? "/" : "");
  FILE *f = fopen(p, "r");
  if (!f) return set;
  fclose(f);
  chief_series_set ev;
  chief_series_init(&ev);
  char err[256];
  if (chief_series_load_jsonl(&ev, p, err, sizeof err)) {
    chief_series_free(&ev);
    return set;
  }
  chief_series_init(merged);
  int rc = 0;
  for (size_t i = 0; i < set->n && !rc; i++)
    for (size_t k = 0; k < set->s[i].n && !rc; k++)
      rc = chief_series_add(merged, set->s[i].tag, set->s[i].pts[k].step,
                            set->s[i].pts[k].value, set->s[i].pts[k].wall_time);
  for (size_t i = 0; i < ev.n && !rc; i++) {
    const char *t = ev.s[i].tag;
    if (!starts(t, CHIEF_TAG_EVAL_PREFIX)) continue;
    char tag[160];
    snprintf(tag, sizeof tag, CHIEF_TAG_EVALUATOR_PREFIX "%s",
             t + strlen(CHIEF_TAG_EVAL_PREFIX));
    for (size_t k = 0; k < ev.s[i].n && !rc; k++)
      rc = chief_series_add(merged, tag, ev.s[i].pts[k].step,
                            ev.s[i].pts[k].value, ev.s[i].pts[k].wall_time);
  }
  chief_series_free(&ev);
  if (rc) {
    chief_series_free(merged);
    return set;
  }
  return merged;
}

int chief_report_write(const char *path, const chief_series_set *set_in,
                       const chief_report_opts *opts, char *err,
                       size_t errlen) {
  chief_series_set merged;
  memset(&merged, 0, sizeof merged);
  const chief_series_set *set = with_evaluator(path, set_in, &merged);
  const char *title = opts && opts->title ? opts->title
                                          : "Tessera training report";
  chief__buf b = {0};
  chief__buf_printf(&b,
                    "<!DOCTYPE html>\n<html lang=\"en\"><head><meta "
                    "charset=\"utf-8\"><meta name=\"viewport\" "
                    "content=\"width=device-width\"><title>");
  chief__buf_html(&b, title);
  chief__buf_printf(&b, "</title><style>%s</style></head><body>\n<h1>", css);
  chief__buf_html(&b, title);
  chief__buf_printf(&b, "</h1>\n<p class=\"sub\">");
  if (opts && opts->subtitle) {
    chief__buf_html(&b, opts->subtitle);
    chief__buf_printf(&b, " &middot; ");
  }
  char when[64];
  time_t now = time(NULL);
  struct tm tm;
  gmtime_r(&now, &tm);
  strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", &tm);
  chief__buf_printf(&b, "written %s</p>\n", when);
  if (set->n == 0)
    chief__buf_printf(&b, "<p class=\"empty\">No scalars were recorded.</p>\n");
  else
    body(&b, set);
  chief__buf_printf(&b, "</body></html>\n");
  int rc;
  if (b.oom) {
    snprintf(err, errlen, "out of memory building %s", path);
    rc = TSR_ENOMEM;
  } else {
    rc = tsr_write_atomic(path, b.p, b.len, err, errlen);
  }
  chief__buf_free(&b);
  if (set != set_in) chief_series_free(&merged);
  return rc;
}

int chief_report_from_logdir(const char *logdir, const chief_report_opts *opts,
                             char *err, size_t errlen) {
  size_t plen = strlen(logdir) + 32;
  char *in = malloc(plen), *out = malloc(plen);
  int rc = TSR_ENOMEM;
  chief_series_set set;
  chief_series_init(&set);
  if (!in || !out) goto done;
  snprintf(in, plen, "%s/%s", logdir, CHIEF_METRICS_JSONL);
  snprintf(out, plen, "%s/%s", logdir, CHIEF_REPORT_HTML);
  rc = chief_series_load_jsonl(&set, in, err, errlen);
  if (!rc) rc = chief_report_write(out, &set, opts, err, errlen);
done:
  chief_series_free(&set);
  free(in);
  free(out);
  return rc;
}
