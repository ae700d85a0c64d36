/* Chrome trace recorder (common/trace.h): threads appending at once lose
 * nothing, a full recorder drops and counts, drained events merge into
 * another recorder, files merge, and the output is trace-event JSON that
 * jansson parses back with every field Perfetto needs. */
#include "common/err.h"
#include "common/trace.h"
#include "../tmpdir.h"

#include <jansson.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#define THREADS 4
#define PER_THREAD 5000

typedef struct {
  tsr_trace *t;
  int tid;
} thr_arg;

static void *append_many(void *p) {
  thr_arg *a = p;
  static const char *const phases[] = {"input wait", "pull", "compute",
                                       "push"};
  for (int i = 0; i < PER_THREAD; i++)
    tsr_trace_complete(a->t, tsr_trace_pid(1, a->tid), 0, "step",
                       phases[i % 4], 1000000 + (int64_t)i * 10 + a->tid,
                       7);
  return NULL;
}

static json_t *load_events(const char *path) {
  json_error_t je;
  json_t *doc = json_load_file(path, 0, &je);
  if (!doc) fail_msg("%s:%d: %s", path, je.line, je.text);
  json_t *evs = json_object_get(doc, "traceEvents");
  assert_true(json_is_array(evs));
  json_incref(evs);
  json_decref(doc);
  return evs;
}

static void test_threads_and_format(void **state) {
  tsr_trace *t;
  assert_int_equal(tsr_trace_create(&t, 0), 0);
  pthread_t th[THREADS];
  thr_arg args[THREADS];
  for (int i = 0; i < THREADS; i++) {
    args[i] = (thr_arg){t, i};
    assert_int_equal(pthread_create(&th[i], NULL, append_many, &args[i]), 0);
  }
  for (int i = 0; i < THREADS; i++) pthread_join(th[i], NULL);
  assert_int_equal(tsr_trace_count(t), THREADS * PER_THREAD);
  assert_int_equal(tsr_trace_dropped(t), 0);
  for (int i = 0; i < THREADS; i++) {
    char n[32];
    snprintf(n, sizeof n, "worker:%d", i);
    assert_int_equal(tsr_trace_name_process(t, tsr_trace_pid(1, i), n), 0);
  }
  assert_int_equal(tsr_trace_name_thread(t, tsr_trace_pid(1, 0), 0, "loop"),
                   0);
  assert_int_equal(tsr_trace_name_process(t, 1, "chief \"main\""), 0);

  char dir[256], path[300], err[512];
  test_tmpdir(dir, sizeof dir);
  snprintf(path, sizeof path, "%s/trace.json", dir);
  assert_int_equal(tsr_trace_write(t, path, err, sizeof err), 0);
  json_t *evs = load_events(path);
  size_t nx = 0, nm = 0;
  int64_t last_ts = 0;
  int per_phase[4] = {0};
  size_t i;
  json_t *e;
  json_array_foreach(evs, i, e) {
    const char *ph = json_string_value(json_object_get(e, "ph"));
    assert_non_null(ph);
    if (!strcmp(ph, "M")) {
      nm++;
      const char *nm_name = json_string_value(
          json_object_get(json_object_get(e, "args"), "name"));
      assert_non_null(nm_name);
      continue;
    }
    assert_string_equal(ph, "X");
    nx++;
    int64_t ts = json_integer_value(json_object_get(e, "ts"));
    assert_true(ts >= last_ts); /* written in time order */
    last_ts = ts;
    assert_int_equal(json_integer_value(json_object_get(e, "dur")), 7);
    assert_string_equal(json_string_value(json_object_get(e, "cat")), "step");
    int pid = (int)json_integer_value(json_object_get(e, "pid"));
    assert_true(pid >= 1000 && pid < 1000 + THREADS);
    assert_true(json_is_integer(json_object_get(e, "tid")));
    const char *name = json_string_value(json_object_get(e, "name"));
    static const char *const phases[] = {"input wait", "pull", "compute",
                                         "push"};
    for (int k = 0; k < 4; k++) per_phase[k] += !strcmp(name, phases[k]);
  }
  assert_int_equal(nx, THREADS * PER_THREAD);
  assert_int_equal(nm, THREADS + 2);
  for (int k = 0; k < 4; k++)
    assert_int_equal(per_phase[k], THREADS * PER_THREAD / 4);
  json_decref(evs);
  tsr_trace_free(t);
  test_rmtree(dir);
}

static void test_bounded(void **state) {
  tsr_trace *t;
  assert_int_equal(tsr_trace_create(&t, 10), 0);
  int busy = 0;
  for (int i = 0; i < 15; i++)
    busy += tsr_trace_complete(t, 2000, 0, "ps", "apply", i, 1) == TSR_EBUSY;
  assert_int_equal(busy, 5);
  assert_int_equal(tsr_trace_count(t), 10);
  assert_int_equal(tsr_trace_dropped(t), 5);
  /* Draining makes room again. */
  tsr_trace_event out[4];
  assert_int_equal(tsr_trace_drain(t, out, 4), 4);
  assert_int_equal(out[0].ts_us, 0);
  assert_int_equal(out[3].ts_us, 3);
  assert_int_equal(tsr_trace_count(t), 6);
  assert_int_equal(tsr_trace_complete(t, 2000, 0, "ps", "apply", 99, 1), 0);
  tsr_trace_free(t);
}

static void test_drain_merge_and_files(void **state) {
  /* A worker and a PS record; the chief takes their events in batches. */
  tsr_trace *w, *ps, *chief;
  assert_int_equal(tsr_trace_create(&w, 0), 0);
  assert_int_equal(tsr_trace_create(&ps, 0), 0);
  assert_int_equal(tsr_trace_create(&chief, 0), 0);
  int64_t t0 = tsr_trace_now_us();
  assert_true(t0 > 1600000000LL * 1000000);
  int64_t start = tsr_trace_now_us();
  assert_int_equal(tsr_trace_end(w, tsr_trace_pid(1, 0), 1, "input",
                                 "input wait", start), 0);
  tsr_trace_event one;
  assert_int_equal(tsr_trace_drain(w, &one, 1), 1);
  assert_int_equal(one.ts_us, start);
  assert_true(one.dur_us >= 0);
  assert_string_equal(one.name, "input wait");
  assert_int_equal(one.tid, 1);
  tsr_trace_complete(w, tsr_trace_pid(1, 0), 0, "step", "pull", t0, 100);
  tsr_trace_complete(w, tsr_trace_pid(1, 0), 0, "step", "compute", t0 + 100,
                     300);
  tsr_trace_complete(ps, tsr_trace_pid(2, 1), 3,
                     "ps", "apply a name longer than the thirty-one bytes",
                     t0 + 50, 20);
  tsr_trace_event batch[1];
  size_t k;
  while ((k = tsr_trace_drain(w, batch, 1)) > 0)
    assert_int_equal(tsr_trace_append(chief, batch, k), 0);
  while ((k = tsr_trace_drain(ps, batch, 1)) > 0)
    assert_int_equal(tsr_trace_append(chief, batch, k), 0);
  assert_int_equal(tsr_trace_count(w), 0);
  assert_int_equal(tsr_trace_count(chief), 3);

  char dir[256], a[300], b[300], m[300], bad[300], err[512];
  test_tmpdir(dir, sizeof dir);
  snprintf(a, sizeof a, "%s/a.json", dir);
  snprintf(b, sizeof b, "%s/b.json", dir);
  snprintf(m, sizeof m, "%s/merged.json", dir);
  assert_int_equal(tsr_trace_write(chief, a, err, sizeof err), 0);
  json_t *evs = load_events(a);
  assert_int_equal(json_array_size(evs), 3);
  /* Sorted: pull (t0), apply (t0+50), compute (t0+100). */
  assert_string_equal(
      json_string_value(json_object_get(json_array_get(evs, 1), "name")),
      "apply a name longer than the th");
  assert_int_equal(
      json_integer_value(json_object_get(json_array_get(evs, 1), "pid")),
      2001);
  json_decref(evs);

  tsr_trace_name_process(ps, tsr_trace_pid(2, 1), "ps:1");
  tsr_trace_complete(ps, tsr_trace_pid(2, 1), 0, "ps", "apply", t0 + 500, 9);
  assert_int_equal(tsr_trace_write(ps, b, err, sizeof err), 0);
  const char *in[] = {a, b};
  assert_int_equal(tsr_trace_merge_files(in, 2, m, err, sizeof err), 0);
  evs = load_events(m);
  assert_int_equal(json_array_size(evs), 5); /* 3 + metadata + 1 */
  json_decref(evs);

  /* Not a trace: the error names the file. */
  snprintf(bad, sizeof bad, "%s/bad.json", dir);
  FILE *f = fopen(bad, "w");
  fputs("{\"x\": 1}", f);
  fclose(f);
  const char *in2[] = {a, bad};
  assert_true(tsr_trace_merge_files(in2, 2, m, err, sizeof err) < 0);
  assert_non_null(strstr(err, bad));
  /* Unwritable destination. */
  snprintf(bad, sizeof bad, "%s/missing/t.json", dir);
  assert_true(tsr_trace_write(chief, bad, err, sizeof err) < 0);
  assert_non_null(strstr(err, "missing/t.json"));

  tsr_trace_free(w);
  tsr_trace_free(ps);
  tsr_trace_free(chief);
  test_rmtree(dir);
}

/* Events cross the wire and come back the same; bad batches are refused
 * whole. */
static void test_wire(void **state) {
  tsr_trace_event ev[3];
  memset(ev, 0, sizeof ev);
  snprintf(ev[0].name, sizeof ev[0].name, "pull");
  snprintf(ev[0].cat, sizeof ev[0].cat, "step");
  ev[0].pid = 1001;
  ev[0].tid = -1;
  ev[0].ts_us = 1764600000123456LL;
  ev[0].dur_us = 250;
  snprintf(ev[1].name, sizeof ev[1].name, "a name of exactly 31 bytes long");
  ev[1].pid = 2000;
  ev[2] = ev[0];
  ev[2].dur_us = 0;
  uint8_t buf[3 * TSR_TRACE_WIRE_SIZE];
  tsr_trace_pack(ev, 3, buf);
  tsr_trace_event back[3];
  size_t n = 99;
  assert_int_equal(tsr_trace_unpack(buf, sizeof buf, back, 3, &n), 0);
  assert_int_equal(n, 3);
  for (int i = 0; i < 3; i++) {
    assert_string_equal(back[i].name, ev[i].name);
    assert_string_equal(back[i].cat, ev[i].cat);
    assert_int_equal(back[i].pid, ev[i].pid);
    assert_int_equal(back[i].tid, ev[i].tid);
    assert_int_equal(back[i].ts_us, ev[i].ts_us);
    assert_int_equal(back[i].dur_us, ev[i].dur_us);
  }
  /* Little-endian on the wire, whatever the host. */
  assert_int_equal(buf[48], 1001 & 0xff);
  assert_int_equal(buf[49], 1001 >> 8);
  assert_int_equal(tsr_trace_unpack(buf, sizeof buf, back, 2, &n),
                   TSR_ETOOBIG);
  assert_int_equal(tsr_trace_unpack(buf, sizeof buf - 1, back, 3, &n),
                   TSR_ECORRUPT);
  assert_int_equal(n, 0);
  uint8_t bad[TSR_TRACE_WIRE_SIZE];
  memcpy(bad, buf, sizeof bad);
  memset(bad, 'x', TSR_TRACE_NAME_MAX); /* no NUL in the name */
  assert_int_equal(tsr_trace_unpack(bad, sizeof bad, back, 3, &n),
                   TSR_ECORRUPT);
  memcpy(bad, buf, sizeof bad);
  bad[71] = 0x80; /* negative duration */
  assert_int_equal(tsr_trace_unpack(bad, sizeof bad, back, 3, &n),
                   TSR_ECORRUPT);
  assert_int_equal(tsr_trace_unpack(buf, 0, back, 3, &n), 0);
  assert_int_equal(n, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_threads_and_format),
      cmocka_unit_test(test_bounded),
      cmocka_unit_test(test_drain_merge_and_files),
      cmocka_unit_test(test_wire),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
