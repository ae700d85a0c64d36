/* Progress display and end-of-run summary: what a terminal and a log file
 * get, rates and ETA from the sample window, the summary JSON. Times are
 * passed in, so nothing here depends on how fast the machine is. */
#include "artifacts/monitor/monitor.h"
#include "../tmpdir.h"

#include <jansson.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

typedef struct {
  char *buf;
  size_t len;
  FILE *f;
} capture;

static void cap_open(capture *c) {
  c->buf = NULL;
  c->len = 0;
  c->f = open_memstream(&c->buf, &c->len);
  assert_non_null(c->f);
}
static void cap_close(capture *c) {
  fclose(c->f);
  free(c->buf);
}
/* A progress display writing into a fresh capture (o.out is set). */
static chief_progress *cap_progress(capture *c, chief_progress_opts o) {
  cap_open(c);
  o.out = c->f;
  chief_progress *p;
  assert_int_equal(chief_progress_create(&p, &o), 0);
  return p;
}
static void cap_done(capture *c, chief_progress *p) {
  chief_progress_free(p);
  cap_close(c);
}
static int count_char(const char *s, size_t n, char ch) {
  int k = 0;
  for (size_t i = 0; i < n; i++) k += s[i] == ch;
  return k;
}

static void test_bar_terminal(void **state) {
  capture c;
  chief_progress *p = cap_progress(&c, (chief_progress_opts){
      .mode = CHIEF_PROGRESS_BAR, .total_steps = 100, .width = 100});
  assert_int_equal(chief_progress_get_mode(p), CHIEF_PROGRESS_BAR);
  /* 10 steps/s of 32 examples each. */
  for (int s = 0; s <= 50; s++)
    chief_progress_update(p, s, s * 32, 1.0 / (s + 1), s * 0.1);
  fflush(c.f);
  assert_true(fabs(chief_progress_steps_per_sec(p) - 10) < 1e-6);
  assert_true(fabs(chief_progress_examples_per_sec(p) - 320) < 1e-6);
  /* Redrawn in place: every draw starts with '\r', none ends a line. */
  assert_int_equal(count_char(c.buf, c.len, '\n'), 0);
  int draws = count_char(c.buf, c.len, '\r');
  assert_int_equal(draws, 51); /* one per 0.1 s */
  const char *last = strrchr(c.buf, '\r');
  assert_non_null(strstr(last, "step 50/100 ["));
  assert_non_null(strstr(last, " 50%"));
  assert_non_null(strstr(last, "loss 0.01961"));
  assert_non_null(strstr(last, "320 ex/s"));
  assert_non_null(strstr(last, "ETA 5.0s")); /* 50 steps at 10/s */
  assert_non_null(strstr(last, "\033[K"));
  /* The line fits the terminal. */
  size_t visible = strcspn(last + 1, "\033");
  assert_true(visible <= 99);

  /* A note clears the bar, prints its line, and redraws. */
  chief_progress_note(p, "worker:1 is back (%d)", 1);
  fflush(c.f);
  assert_non_null(strstr(c.buf, "\r\033[Kworker:1 is back (1)\n\rstep 50/100"));
  chief_progress_update(p, 100, 3200, 0.5, 10.0);
  chief_progress_finish(p);
  fflush(c.f);
  assert_int_equal(c.buf[c.len - 1], '\n');
  assert_non_null(strstr(c.buf, "step 100/100"));
  assert_non_null(strstr(c.buf, "100%"));
  cap_done(&c, p);
}

static void test_bar_narrow_and_unknown_total(void **state) {
  capture c;
  chief_progress *p = cap_progress(&c, (chief_progress_opts){
      .mode = CHIEF_PROGRESS_BAR, .width = 40});
  chief_progress_update(p, 7, 70, NAN, 0);
  chief_progress_update(p, 9, 90, NAN, 1);
  chief_progress_finish(p);
  fflush(c.f);
  assert_non_null(strstr(c.buf, "step 9 "));
  assert_null(strstr(c.buf, "ETA"));   /* no total, no ETA */
  assert_null(strstr(c.buf, "loss")); /* no loss yet */
  assert_null(strstr(c.buf, "[#"));
  assert_null(strstr(c.buf, "[."));
  cap_done(&c, p);
}

static void test_plain_lines(void **state) {
  capture c;
  chief_progress *p = cap_progress(&c, (chief_progress_opts){
      .mode = CHIEF_PROGRESS_LINES, .total_steps = 1000, .log_every_s = 10});
  for (int t = 0; t <= 25; t++) chief_progress_update(p, t * 10, t * 80, 2, t);
  fflush(c.f);
  assert_int_equal(count_char(c.buf, c.len, '\r'), 0);
  assert_int_equal(count_char(c.buf, c.len, '\n'), 3); /* t = 0, 10, 20 */
  assert_non_null(
      strstr(c.buf, "step 200/1000  20% loss 2 80 ex/s ETA 1m20s\n"));
  assert_null(strstr(c.buf, "[#"));
  cap_done(&c, p);
}

/* A rewind to a checkpoint does not show a negative rate. */
static void test_rewind(void **state) {
  capture c;
  chief_progress *p = cap_progress(&c, (chief_progress_opts){
      .mode = CHIEF_PROGRESS_LINES, .total_steps = 1000, .log_every_s = 1});
  for (int t = 0; t <= 5; t++) chief_progress_update(p, t * 100, t * 800, 1, t);
  assert_true(chief_progress_steps_per_sec(p) == 100);
  chief_progress_update(p, 200, 1600, 1, 6); /* back to the step-200 ckpt */
  chief_progress_update(p, 250, 2000, 1, 7);
  assert_true(chief_progress_steps_per_sec(p) == 50);
  assert_true(chief_progress_examples_per_sec(p) == 400);
  fflush(c.f);
  assert_null(strstr(c.buf, "-"));
  cap_done(&c, p);
}

static void test_mode_from_environment(void **state) {
  capture c;
  cap_open(&c);
  chief_progress_opts o = {.out = c.f};
  chief_progress *p;
  unsetenv("TESSERA_PROGRESS");
  assert_int_equal(chief_progress_create(&p, &o), 0);
  assert_int_equal(chief_progress_get_mode(p), CHIEF_PROGRESS_LINES);
  chief_progress_free(p);
  setenv("TESSERA_PROGRESS", "bar", 1);
  assert_int_equal(chief_progress_create(&p, &o), 0);
  assert_int_equal(chief_progress_get_mode(p), CHIEF_PROGRESS_BAR);
  chief_progress_free(p);
  setenv("TESSERA_PROGRESS", "off", 1);
  assert_int_equal(chief_progress_create(&p, &o), 0);
  chief_progress_update(p, 1, 1, 1, 0);
  chief_progress_finish(p);
  fflush(c.f);
  assert_int_equal(c.len, 0);
  chief_progress_free(p);
  unsetenv("TESSERA_PROGRESS");
  cap_close(&c);
}

static void test_durations(void **state) {
  char b[32];
  chief_format_duration(3725, b, sizeof b);
  assert_string_equal(b, "1h02m");
  chief_format_duration(185, b, sizeof b);
  assert_string_equal(b, "3m05s");
  chief_format_duration(12.4, b, sizeof b);
  assert_string_equal(b, "12s");
  chief_format_duration(0.46, b, sizeof b);
  assert_string_equal(b, "0.5s");
  chief_format_duration(NAN, b, sizeof b);
  assert_string_equal(b, "?");
}

static void test_summary(void **state) {
  chief_metric_value ev[2] = {{"accuracy", 0.8725}, {"loss", NAN}};
  /* resumed at step 1200: the rate counts the 121600 examples this
   * process trained, not the 38400 restored */
  chief_summary s = {.steps = 5000, .examples = 160000,
                     .examples_run = 121600, .seconds = 80,
                     .has_loss = true, .final_loss = 0.3125, .eval = ev,
                     .n_eval = 2, .restarts_worker = 1, .restarts_ps = 2,
                     .resumed_from_step = 1200, .logdir = "/tmp/logs"};
  capture c;
  cap_open(&c);
  chief_summary_print(c.f, &s);
  fflush(c.f);
  assert_non_null(strstr(c.buf, "5000 steps, 160000 examples in 1m20s "
                              "(80.0 s), 1520.0 examples/s\n"));
  assert_non_null(strstr(c.buf, "final loss      0.3125"));
  assert_non_null(strstr(c.buf, "eval accuracy   0.8725"));
  assert_non_null(strstr(c.buf, "1 worker, 2 ps"));
  assert_non_null(strstr(c.buf, "resumed from    step 1200"));
  assert_non_null(strstr(c.buf, "tensorboard --logdir /tmp/logs"));
  cap_close(&c);
  chief_summary quick = {.steps = 10, .examples = 320, .seconds = 0.5,
                         .resumed_from_step = -1};
  cap_open(&c);
  chief_summary_print(c.f, &quick);
  fflush(c.f);
  assert_non_null(strstr(c.buf, "10 steps, 320 examples in 0.5s, 640.0 "
                              "examples/s\n"));
  assert_null(strstr(c.buf, "final loss"));
  assert_null(strstr(c.buf, "resumed"));
  cap_close(&c);
  /* a chief that found its job finished on disk trained nothing: no rate
   * (not every example since step 0 over its few seconds) */
  chief_summary done = {.steps = 6000, .examples = 192000, .seconds = 2,
                        .resumed_from_step = 6000};
  cap_open(&c);
  chief_summary_print(c.f, &done);
  fflush(c.f);
  assert_non_null(strstr(c.buf, "6000 steps, 192000 examples in 2.0s\n"));
  cap_close(&c);

  char dir[256], path[300], err[512];
  test_tmpdir(dir, sizeof dir);
  snprintf(path, sizeof path, "%s/summary.json", dir);
  assert_int_equal(chief_summary_write_json(path, &s, err, sizeof err), 0);
  json_error_t je;
  json_t *o = json_load_file(path, 0, &je);
  assert_non_null(o);
  assert_int_equal(json_integer_value(json_object_get(o, "steps")), 5000);
  assert_int_equal(json_integer_value(json_object_get(o, "examples")), 160000);
  assert_true(json_real_value(json_object_get(o, "seconds")) == 80);
  assert_true(json_real_value(json_object_get(o, "final_loss")) == 0.3125);
  assert_true(json_real_value(json_object_get(o, "examples_per_sec")) == 1520);
  assert_int_equal(json_integer_value(json_object_get(o, "examples_run")),
                   121600);
  json_t *e = json_object_get(o, "eval");
  assert_true(json_real_value(json_object_get(e, "accuracy")) == 0.8725);
  assert_true(json_is_null(json_object_get(e, "loss")));
  json_t *r = json_object_get(o, "restarts");
  assert_int_equal(json_integer_value(json_object_get(r, "worker")), 1);
  assert_int_equal(json_integer_value(json_object_get(r, "ps")), 2);
  assert_int_equal(json_integer_value(json_object_get(r, "chief")), 0);
  assert_int_equal(
      json_integer_value(json_object_get(o, "resumed_from_step")), 1200);
  assert_string_equal(json_string_value(json_object_get(o, "logdir")),
                      "/tmp/logs");
  assert_true(json_is_null(json_object_get(o, "checkpoint_dir")));
  json_decref(o);

  /* A folder that does not exist: the error names the path. */
  snprintf(path, sizeof path, "%s/no/such/summary.json", dir);
  assert_true(chief_summary_write_json(path, &s, err, sizeof err) < 0);
  assert_non_null(strstr(err, "/no/such/summary.json"));
  test_rmtree(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bar_terminal),
      cmocka_unit_test(test_bar_narrow_and_unknown_total),
      cmocka_unit_test(test_plain_lines),
      cmocka_unit_test(test_rewind),
      cmocka_unit_test(test_mode_from_environment),
      cmocka_unit_test(test_durations),
      cmocka_unit_test(test_summary),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
