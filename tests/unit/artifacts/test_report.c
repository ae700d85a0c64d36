/* report.html: one self-contained page (nothing fetched, no script), the
 * charts grouped by the tag conventions, long curves thinned, non-finite
 * values drawn as gaps, text escaped, and the page rebuilt from
 * metrics.jsonl alone. */
#include "artifacts/monitor/monitor.h"
#include "../tmpdir.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

static int count(const char *hay, const char *needle) {
  int n = 0;
  for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle)) n++;
  return n;
}

/* Points in the polyline that follows `after` in `html`. */
static int polyline_points(const char *html, const char *after) {
  const char *p = strstr(html, after);
  assert_non_null(p);
  p = strstr(p, "points=\"");
  assert_non_null(p);
  p += 8;
  int n = 1;
  for (; *p && *p != '"'; p++) n += *p == ' ';
  return n;
}

static void fill(chief_series_set *set) {
  for (int s = 1; s <= 5000; s++) {
    chief_series_add(set, "loss", s, 2.0 / sqrt(s), 0);
    if (s % 500 == 0) {
      chief_series_add(set, "eval/loss", s, 2.2 / sqrt(s), 0);
      chief_series_add(set, "eval/accuracy", s, 1 - 1.0 / sqrt(s), 0);
    }
    if (s % 100 == 0) {
      chief_series_add(set, "examples_per_sec", s, 8000 + s % 700, 0);
      for (int w = 0; w < 2; w++) {
        char t[64];
        snprintf(t, sizeof t, "worker/%d/examples_per_sec", w);
        chief_series_add(set, t, s, 4000 + 100 * w, 0);
      }
      for (int p = 0; p < 3; p++) {
        char t[64];
        snprintf(t, sizeof t, "ps/%d/bytes_in", p);
        chief_series_add(set, t, s, 1e6 * (p + 1), 0);
        snprintf(t, sizeof t, "ps/%d/apply_ms", p);
        chief_series_add(set, t, s, 0.5 + p, 0);
      }
      chief_series_add(set, "staleness", s, s == 2500 ? NAN : 1.5, 0);
      chief_series_add(set, "steps_per_sec", s, 250, 0);
    }
  }
  chief_series_add(set, "eval/<b>&", 5000, 0.25, 0);
}

static void test_page(void **state) {
  chief_series_set set;
  chief_series_init(&set);
  fill(&set);
  char dir[256], path[300], err[512];
  test_tmpdir(dir, sizeof dir);
  snprintf(path, sizeof path, "%s/report.html", dir);
  chief_report_opts o = {.title = "MLP <fashion>",
                         .subtitle = "2 ps, 2 workers"};
  assert_int_equal(chief_report_write(path, &set, &o, err, sizeof err), 0);
  char *html = test_slurp(path, NULL);
  assert_non_null(html);
  assert_true(strncmp(html, "<!DOCTYPE html>", 15) == 0);
  /* Self-contained. */
  assert_int_equal(count(html, "<script"), 0);
  assert_int_equal(count(html, "src="), 0);
  assert_int_equal(count(html, "href="), 0);
  assert_int_equal(count(html, "url("), 0);
  assert_int_equal(count(html, "@import"), 0);
  assert_int_equal(count(html, "https:"), 0);
  /* http: appears only as the SVG namespace name. */
  assert_int_equal(count(html, "http:"),
                   count(html, "xmlns=\"http://www.w3.org/2000/svg\""));
  /* Charts: loss, eval/accuracy, eval/<b>&, examples/s, ps bytes_in and
   * its bars, ps apply_ms and its bars, staleness, steps_per_sec. */
  assert_int_equal(count(html, "<svg"), 10);
  assert_int_equal(count(html, "</svg>"), 10);
  /* The bars: the largest PS fills the width, the others in proportion
   * (ps/2 has 3e6 bytes, ps/0 1e6: a third of it). */
  const char *bars = strstr(html, "bytes_in per PS, last value");
  assert_non_null(bars);
  double w0 = 0, w2 = 0;
  const char *r0 = strstr(bars, "ps/0/bytes_in</text><rect");
  const char *r2 = strstr(bars, "ps/2/bytes_in</text><rect");
  assert_non_null(r0);
  assert_non_null(r2);
  assert_int_equal(sscanf(strstr(r0, "width=\"") + 7, "%lf", &w0), 1);
  assert_int_equal(sscanf(strstr(r2, "width=\"") + 7, "%lf", &w2), 1);
  assert_true(fabs(w0 * 3 - w2) < 0.5);
  assert_non_null(strstr(r2, ">3M</text>"));
  assert_non_null(strstr(html, "<title>MLP &lt;fashion&gt;</title>"));
  assert_non_null(strstr(html, "eval/&lt;b&gt;&amp;"));
  assert_null(strstr(html, "<b>"));
  assert_non_null(strstr(html, "bytes_in per PS"));
  assert_non_null(strstr(html, "apply_ms per PS"));
  assert_non_null(strstr(html, "ps/2/bytes_in"));
  assert_non_null(strstr(html, "worker/1/examples_per_sec"));
  /* The loss curve (5000 points) is thinned to about 1000. */
  int pts = polyline_points(html, "<figcaption>loss</figcaption>");
  assert_true(pts >= 900 && pts <= 1001);
  /* The NaN in staleness splits its curve in two. */
  const char *st = strstr(html, "<figcaption>staleness</figcaption>");
  const char *end = strstr(st, "</svg>");
  int lines = 0;
  for (const char *p = st; (p = strstr(p, "<polyline")) && p < end; p++)
    lines++;
  assert_int_equal(lines, 2);
  /* Every series is in the table of last values. */
  assert_non_null(strstr(html, "<td>loss</td><td>5000</td><td>5000</td>"));
  free(html);
  chief_series_free(&set);
  test_rmtree(dir);
}

static void test_empty_and_flat(void **state) {
  chief_series_set set;
  chief_series_init(&set);
  char dir[256], path[300], err[512];
  test_tmpdir(dir, sizeof dir);
  snprintf(path, sizeof path, "%s/r.html", dir);
  assert_int_equal(chief_report_write(path, &set, NULL, err, sizeof err), 0);
  char *html = test_slurp(path, NULL);
  assert_non_null(strstr(html, "No scalars were recorded"));
  free(html);
  /* One point, a constant and an all-NaN series still draw; eval/loss
   * recorded first is still listed after loss. */
  chief_series_add(&set, "eval/loss", 7, 0.75, 0);
  chief_series_add(&set, "loss", 7, 0.5, 0);
  chief_series_add(&set, "steps_per_sec", 1, 3, 0);
  chief_series_add(&set, "steps_per_sec", 2, 3, 0);
  chief_series_add(&set, "staleness", 1, NAN, 0);
  assert_int_equal(chief_report_write(path, &set, NULL, err, sizeof err), 0);
  html = test_slurp(path, NULL);
  assert_non_null(strstr(html, "<circle"));
  /* A single step sits in the middle of the plot, not on its edge. */
  assert_non_null(strstr(html, "<circle cx=\"365.0\""));
  const char *lg = strstr(html, "<div class=\"legend\">");
  assert_non_null(lg);
  assert_true(strstr(lg, "</i>loss<") < strstr(lg, "</i>eval/loss<"));
  assert_non_null(strstr(html, "no finite values"));
  assert_null(strstr(html, "nan"));
  assert_null(strstr(html, "inf"));
  free(html);
  /* Unwritable path. */
  snprintf(path, sizeof path, "%s/none/r.html", dir);
  assert_true(chief_report_write(path, &set, NULL, err, sizeof err) < 0);
  assert_non_null(strstr(err, "none/r.html"));
  chief_series_free(&set);
  test_rmtree(dir);
}

static void test_from_logdir(void **state) {
  char dir[256], path[300], err[512];
  test_tmpdir(dir, sizeof dir);
  chief_metrics *m;
  chief_tb_opts o = {.host = "h"};
  assert_int_equal(chief_metrics_open(&m, dir, &o, err, sizeof err), 0);
  for (int s = 10; s <= 200; s += 10) {
    chief_metrics_scalar(m, "loss", s, 1.0 / s, 0);
    chief_metrics_scalar(m, "ps/0/bytes_out", s, 100.0 * s, 0);
  }
  assert_int_equal(chief_metrics_close(m), 0);
  assert_int_equal(chief_report_from_logdir(dir, NULL, err, sizeof err), 0);
  snprintf(path, sizeof path, "%s/report.html", dir);
  char *html = test_slurp(path, NULL);
  assert_non_null(html);
  assert_non_null(strstr(html, "Tessera training report"));
  assert_non_null(strstr(html, "bytes_out per PS"));
  assert_int_equal(count(html, "<svg"), 3); /* loss, bytes_out + bars */
  free(html);
  /* No metrics.jsonl: the error names it. */
  char empty[300];
  snprintf(empty, sizeof empty, "%s/empty", dir);
  mkdir(empty, 0777);
  assert_true(chief_report_from_logdir(empty, NULL, err, sizeof err) < 0);
  assert_non_null(strstr(err, "metrics.jsonl"));
  test_rmtree(dir);
}

/* The evaluator sidecar's logdir/eval/metrics.jsonl joins the page: its
 * loss in the loss chart beside the training loss, its metrics charted. */
static void test_evaluator_curve(void **state) {
  char dir[256], sub[300], path[300], err[512];
  test_tmpdir(dir, sizeof dir);
  snprintf(sub, sizeof sub, "%s/eval", dir);
  chief_metrics *m, *ev;
  chief_tb_opts o = {.host = "h"}, fo = {.host = "h", .flat = true};
  assert_int_equal(chief_metrics_open(&m, dir, &o, err, sizeof err), 0);
  assert_int_equal(chief_metrics_open(&ev, sub, &fo, err, sizeof err), 0);
  for (int s = 10; s <= 100; s += 10) {
    chief_metrics_scalar(m, "loss", s, 1.0 / s, 0);
    if (s % 50 == 0) {
      chief_metrics_scalar(ev, "eval/loss", s, 2.0 / s, 0);
      chief_metrics_scalar(ev, "eval/accuracy", s, 0.5, 0);
    }
  }
  assert_int_equal(chief_metrics_close(ev), 0);
  snprintf(path, sizeof path, "%s/report.html", dir);
  assert_int_equal(chief_report_write(path, chief_metrics_series(m), NULL,
                                      err, sizeof err), 0);
  char *html = test_slurp(path, NULL);
  const char *lg = strstr(html, "<div class=\"legend\">");
  assert_non_null(lg);
  assert_non_null(strstr(lg, "</i>evaluator/loss<"));
  assert_non_null(strstr(html, "evaluator/accuracy"));
  free(html);
  assert_int_equal(chief_metrics_close(m), 0);
  test_rmtree(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_evaluator_curve),
      cmocka_unit_test(test_page),
      cmocka_unit_test(test_empty_and_flat),
      cmocka_unit_test(test_from_logdir),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
