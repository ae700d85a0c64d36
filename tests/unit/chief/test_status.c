/* The live status file: written whole and read back field by field, the
 * table shows every process, a file the chief stopped rewriting is called
 * stale, and a damaged file names the key. */
#include "chief/monitor.h"
#include "tmpdir.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

static void fill(chief_run_status *st, chief_proc_status *p) {
  memset(st, 0, sizeof *st);
  snprintf(st->run_id, sizeof st->run_id, "run-42");
  snprintf(st->phase, sizeof st->phase, "waiting for ps:1");
  st->step = 1200;
  st->total_steps = 5000;
  st->loss = 0.4375;
  st->examples_per_sec = 16000;
  st->elapsed_s = 75;
  st->updated_at = 1700000000;
  st->interval_s = 2;
  memset(p, 0, 3 * sizeof *p);
  p[0] = (chief_proc_status){.role = "worker", .index = 0,
                             .addr = "127.0.0.1:4001", .state = "running",
                             .steps = 610, .steps_per_sec = 125,
                             .examples_per_sec = 8000, .last_seen_s = 0.5};
  p[1] = (chief_proc_status){.role = "ps", .index = 1,
                             .addr = "127.0.0.1:4003", .state = "lost",
                             .steps = 2400, .steps_per_sec = NAN,
                             .bytes_per_sec = 2.5e8, .last_seen_s = 12,
                             .restarts = 1};
  p[2] = (chief_proc_status){.role = "chief", .index = 0,
                             .addr = "127.0.0.1:4000", .state = "waiting",
                             .last_seen_s = -1};
  st->procs = p;
  st->n_procs = 3;
}

static void test_roundtrip_and_table(void **state) {
  chief_run_status st, back;
  chief_proc_status p[3];
  fill(&st, p);
  char dir[256], path[300], err[512];
  test_tmpdir(dir, sizeof dir);
  snprintf(path, sizeof path, "%s/status.json", dir);
  assert_int_equal(chief_status_write(path, &st, err, sizeof err), 0);
  assert_int_equal(chief_status_read(path, &back, err, sizeof err), 0);
  assert_string_equal(back.run_id, "run-42");
  assert_string_equal(back.phase, "waiting for ps:1");
  assert_int_equal(back.step, 1200);
  assert_int_equal(back.total_steps, 5000);
  assert_true(back.loss == 0.4375);
  assert_true(back.updated_at == 1700000000);
  assert_int_equal(back.n_procs, 3);
  assert_string_equal(back.procs[1].role, "ps");
  assert_int_equal(back.procs[1].index, 1);
  assert_string_equal(back.procs[1].state, "lost");
  assert_true(isnan(back.procs[1].steps_per_sec));
  assert_true(back.procs[1].bytes_per_sec == 2.5e8);
  assert_int_equal(back.procs[1].restarts, 1);

  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  chief_status_print(f, &back, 1700000003);
  fclose(f);
  assert_non_null(strstr(buf, "run run-42: waiting for ps:1, step 1200/5000, "
                              "loss 0.4375, 16.0k examples/s, running 1m15s "
                              "(updated 3.0s ago)"));
  assert_null(strstr(buf, "warning"));
  assert_non_null(strstr(buf, "worker:0     127.0.0.1:4001         running"));
  assert_non_null(strstr(buf, "250.0MB"));
  assert_non_null(strstr(buf, "12s ago"));
  free(buf);

  /* Not rewritten for a minute: stale. */
  f = open_memstream(&buf, &len);
  chief_status_print(f, &back, 1700000060);
  fclose(f);
  assert_non_null(strstr(buf, "warning: the status has not been updated for "
                              "1m00s"));
  free(buf);
  chief_status_free(&back);
  test_rmtree(dir);
}

static void test_bad_files(void **state) {
  char dir[256], path[300], err[512];
  chief_run_status st;
  test_tmpdir(dir, sizeof dir);
  snprintf(path, sizeof path, "%s/status.json", dir);
  assert_true(chief_status_read(path, &st, err, sizeof err) < 0);
  assert_non_null(strstr(err, path));
  static const struct {
    const char *text, *want;
  } cases[] = {
      {"{", "status.json"},
      {"{\"run_id\": 3}", "\"run_id\""},
      {"{\"run_id\": \"r\", \"phase\": \"x\", \"step\": 1, \"total_steps\": "
       "2, \"loss\": 1, \"examples_per_sec\": 1, \"elapsed_s\": 1, "
       "\"updated_at\": 1, \"interval_s\": 1}",
       "\"processes\""},
      {"{\"run_id\": \"r\", \"phase\": \"x\", \"step\": 1, \"total_steps\": "
       "2, \"loss\": 1, \"examples_per_sec\": 1, \"elapsed_s\": 1, "
       "\"updated_at\": 1, \"interval_s\": 1, \"processes\": [{\"role\": "
       "\"ps\", \"index\": \"0\"}]}",
       "processes[0].\"index\""},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    FILE *f = fopen(path, "w");
    fputs(cases[i].text, f);
    fclose(f);
    err[0] = '\0';
    assert_true(chief_status_read(path, &st, err, sizeof err) < 0);
    if (!strstr(err, cases[i].want)) fail_msg("case %zu: %s", i, err);
    assert_null(st.procs);
  }
  test_rmtree(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_roundtrip_and_table),
      cmocka_unit_test(test_bad_files),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
