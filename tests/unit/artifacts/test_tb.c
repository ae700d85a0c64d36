/* TensorBoard event files and metrics.jsonl: files are written where and as
 * TensorFlow names them, and read back here by an independent TFRecord and
 * protobuf wire-format parser (bitwise CRC32C, hand-decoded fields), so a
 * mistake shared by the writer and protobuf-c's schema would still show. */
#include "artifacts/monitor/monitor.h"
#include "common/clock.h"
#include "../tmpdir.h"

#include <dirent.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <cmocka.h>

/* ---- independent reader --------------------------------------------- */
static uint32_t crc32c_bitwise(const uint8_t *p, size_t n) {
  uint32_t c = 0xffffffffu;
  for (size_t i = 0; i < n; i++) {
    c ^= p[i];
    for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82f63b78u & (0u - (c & 1)));
  }
  return ~c;
}
static uint32_t mask(uint32_t c) {
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}
static uint64_t le(const uint8_t *p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

typedef struct {
  double wall_time;
  int64_t step;
  char file_version[64];
  char tag[64];
  float simple_value;
  int has_value;
  int session_status; /* SessionLog.status, 0 when absent */
} ev_t;

static uint64_t varint(const uint8_t **p, const uint8_t *end) {
  uint64_t v = 0;
  for (int s = 0; *p < end && s < 64; s += 7) {
    uint8_t b = *(*p)++;
    v |= (uint64_t)(b & 0x7f) << s;
    if (!(b & 0x80)) return v;
  }
  fail_msg("truncated varint");
  return 0;
}

/* Walks one message; calls back on each field. */
typedef void (*field_cb)(void *ctx, int num, int wt, uint64_t v,
                         const uint8_t *data, size_t len);
static void walk(const uint8_t *p, size_t n, field_cb cb, void *ctx) {
  const uint8_t *end = p + n;
  while (p < end) {
    uint64_t key = varint(&p, end);
    int num = (int)(key >> 3), wt = (int)(key & 7);
    if (wt == 0) {
      cb(ctx, num, wt, varint(&p, end), NULL, 0);
    } else if (wt == 1) {
      assert_true(p + 8 <= end);
      cb(ctx, num, wt, le(p, 8), p, 8);
      p += 8;
    } else if (wt == 5) {
      assert_true(p + 4 <= end);
      cb(ctx, num, wt, le(p, 4), p, 4);
      p += 4;
    } else if (wt == 2) {
      uint64_t len = varint(&p, end);
      assert_true(p + len <= end);
      cb(ctx, num, wt, len, p, len);
      p += len;
    } else {
      fail_msg("unexpected wire type %d", wt);
    }
  }
}

static void value_cb(void *ctx, int num, int wt, uint64_t v,
                     const uint8_t *d, size_t len) {
  ev_t *e = ctx;
  if (num == 1 && wt == 2) {
    assert_true(len < sizeof e->tag);
    memcpy(e->tag, d, len);
    e->tag[len] = '\0';
  } else if (num == 2 && wt == 5) {
    uint32_t u = (uint32_t)v;
    memcpy(&e->simple_value, &u, 4);
    e->has_value = 1;
  }
}
static void summary_cb(void *ctx, int num, int wt, uint64_t v,
                       const uint8_t *d, size_t len) {
  assert_int_equal(num, 1);
  assert_int_equal(wt, 2);
  walk(d, len, value_cb, ctx);
}
static void session_cb(void *ctx, int num, int wt, uint64_t v,
                       const uint8_t *d, size_t len) {
  ev_t *e = ctx;
  if (num == 1 && wt == 0) e->session_status = (int)v;
}
static void event_cb(void *ctx, int num, int wt, uint64_t v,
                     const uint8_t *d, size_t len) {
  ev_t *e = ctx;
  if (num == 1) {
    assert_int_equal(wt, 1);
    memcpy(&e->wall_time, &v, 8);
  } else if (num == 2) {
    assert_int_equal(wt, 0);
    e->step = (int64_t)v;
  } else if (num == 3) {
    assert_int_equal(wt, 2);
    assert_true(len < sizeof e->file_version);
    memcpy(e->file_version, d, len);
    e->file_version[len] = '\0';
  } else if (num == 5) {
    assert_int_equal(wt, 2);
    walk(d, len, summary_cb, ctx);
  } else if (num == 7) {
    assert_int_equal(wt, 2);
    walk(d, len, session_cb, ctx);
  }
}

/* Parses a whole event file; returns the number of events. */
static int read_events(const char *path, ev_t *out, int max) {
  size_t n;
  uint8_t *buf = (uint8_t *)test_slurp(path, &n);
  assert_non_null(buf);
  size_t off = 0;
  int k = 0;
  while (off < n) {
    assert_true(off + 12 <= n);
    uint64_t len = le(buf + off, 8);
    assert_int_equal(le(buf + off + 8, 4), mask(crc32c_bitwise(buf + off, 8)));
    assert_true(off + 12 + len + 4 <= n);
    const uint8_t *data = buf + off + 12;
    assert_int_equal(le(data + len, 4), mask(crc32c_bitwise(data, len)));
    assert_true(k < max);
    memset(&out[k], 0, sizeof out[k]);
    walk(data, len, event_cb, &out[k]);
    k++;
    off += 12 + len + 4;
  }
  free(buf);
  return k;
}

static int find_event_file(const char *dir, char *path, size_t len) {
  DIR *d = opendir(dir);
  assert_non_null(d);
  struct dirent *de;
  int found = 0;
  while ((de = readdir(d))) {
    if (strncmp(de->d_name, "events.out.tfevents.", 20) == 0) {
      snprintf(path, len, "%s/%s", dir, de->d_name);
      found++;
    }
  }
  closedir(d);
  return found;
}

static off_t file_size(const char *p) {
  struct stat st;
  assert_int_equal(stat(p, &st), 0);
  return st.st_size;
}

/* ---- tests ------------------------------------------------------------ */
static void test_event_file_roundtrip(void **state) {
  char dir[256], logdir[300], path[600], err[512];
  test_tmpdir(dir, sizeof dir);
  snprintf(logdir, sizeof logdir, "%s/run/a", dir); /* parents created */
  chief_tb_opts o = {.host = "hostx", .wall_time = 1700000000.25};
  chief_tb *tb;
  assert_int_equal(chief_tb_open(&tb, logdir, &o, err, sizeof err), 0);
  for (int i = 1; i <= 100; i++)
    assert_int_equal(chief_tb_scalar(tb, "loss", i * 10, 1.0 / i,
                                     1700000000.0 + i), 0);
  assert_int_equal(chief_tb_scalar(tb, "eval/accuracy", 1000, 0.875, 0), 0);
  assert_int_equal(chief_tb_scalar(tb, "ps/1/bytes_in", 1000, 3e9, 0), 0);
  assert_int_equal(chief_tb_close(tb), 0);

  assert_int_equal(find_event_file(logdir, path, sizeof path), 1);
  char want[600];
  snprintf(want, sizeof want, "%s/events.out.tfevents.1700000000.hostx",
           logdir);
  assert_string_equal(path, want);

  static ev_t ev[200];
  int n = read_events(path, ev, 200);
  assert_int_equal(n, 103);
  assert_string_equal(ev[0].file_version, "brain.Event:2");
  assert_true(ev[0].wall_time == 1700000000.25);
  for (int i = 1; i <= 100; i++) {
    assert_string_equal(ev[i].tag, "loss");
    assert_int_equal(ev[i].step, i * 10);
    assert_true(ev[i].has_value);
    assert_true(ev[i].simple_value == (float)(1.0 / i));
    assert_true(ev[i].wall_time == 1700000000.0 + i);
  }
  assert_string_equal(ev[101].tag, "eval/accuracy");
  assert_true(ev[101].simple_value == 0.875f);
  assert_true(ev[101].wall_time > 1.6e9); /* 0 means now */
  assert_string_equal(ev[102].tag, "ps/1/bytes_in");
  assert_true(ev[102].simple_value == 3e9f);
  test_rmtree(dir);
}

static void test_flush_policy(void **state) {
  char dir[256], path[600], err[512];
  test_tmpdir(dir, sizeof dir);
  chief_tb_opts o = {.host = "h", .max_pending = 3, .flush_ms = 3600000};
  chief_tb *tb;
  assert_int_equal(chief_tb_open(&tb, dir, &o, err, sizeof err), 0);
  assert_int_equal(find_event_file(dir, path, sizeof path), 1);
  off_t header = file_size(path);
  assert_true(header > 16); /* the file_version record is on disk at once */
  chief_tb_scalar(tb, "a", 1, 1, 0);
  chief_tb_scalar(tb, "a", 2, 2, 0);
  assert_true(file_size(path) == header); /* buffered */
  chief_tb_scalar(tb, "a", 3, 3, 0);
  off_t three = file_size(path);
  assert_true(three > header); /* max_pending reached */
  chief_tb_scalar(tb, "a", 4, 4, 0);
  assert_true(file_size(path) == three);
  assert_int_equal(chief_tb_flush(tb), 0);
  assert_true(file_size(path) > three);
  assert_int_equal(chief_tb_close(tb), 0);

  /* Age: a record arriving flush_ms after the oldest buffered one writes. */
  test_rmtree(dir);
  test_tmpdir(dir, sizeof dir);
  chief_tb_opts o2 = {.host = "h", .max_pending = 1000, .flush_ms = 30};
  assert_int_equal(chief_tb_open(&tb, dir, &o2, err, sizeof err), 0);
  assert_int_equal(find_event_file(dir, path, sizeof path), 1);
  header = file_size(path);
  chief_tb_scalar(tb, "a", 1, 1, 0);
  assert_true(file_size(path) == header);
  tsr_sleep_ms(40);
  chief_tb_scalar(tb, "a", 2, 2, 0);
  assert_true(file_size(path) > header);
  static ev_t ev[8];
  assert_int_equal(read_events(path, ev, 8), 3);
  assert_int_equal(chief_tb_close(tb), 0);
  test_rmtree(dir);
}

static void test_two_files_same_second(void **state) {
  char dir[256], err[512];
  test_tmpdir(dir, sizeof dir);
  chief_tb_opts o = {.host = "h", .wall_time = 1700000000};
  chief_tb *a, *b;
  assert_int_equal(chief_tb_open(&a, dir, &o, err, sizeof err), 0);
  assert_int_equal(chief_tb_open(&b, dir, &o, err, sizeof err), 0);
  assert_string_not_equal(chief_tb_path(a), chief_tb_path(b));
  assert_non_null(strstr(chief_tb_path(b), "tfevents"));
  chief_tb_close(a);
  chief_tb_close(b);
  test_rmtree(dir);
}

static void test_unwritable_logdir(void **state) {
  char dir[256], logdir[300], err[512] = "";
  test_tmpdir(dir, sizeof dir);
  snprintf(logdir, sizeof logdir, "%s/file", dir);
  FILE *f = fopen(logdir, "w"); /* a file where the folder should be */
  fclose(f);
  chief_tb *tb = NULL;
  assert_true(chief_tb_open(&tb, logdir, NULL, err, sizeof err) < 0);
  assert_null(tb);
  assert_non_null(strstr(err, logdir));
  chief_metrics *m = NULL;
  assert_true(chief_metrics_open(&m, logdir, NULL, err, sizeof err) < 0);
  assert_null(m);
  test_rmtree(dir);
}

static void test_metrics_jsonl(void **state) {
  char dir[256], path[600], err[512];
  test_tmpdir(dir, sizeof dir);
  chief_metrics *m;
  chief_tb_opts o = {.host = "h"};
  assert_int_equal(chief_metrics_open(&m, dir, &o, err, sizeof err), 0);
  assert_string_equal(chief_metrics_logdir(m), dir);
  assert_int_equal(chief_metrics_scalar(m, "loss", 10, 2.5, 1700000000.5), 0);
  assert_int_equal(chief_metrics_scalar(m, "loss", 20, 1.25, 1700000001.5), 0);
  assert_int_equal(chief_metrics_scalar(m, "eval/acc\"x", 20, 0.5, 0), 0);
  assert_int_equal(chief_metrics_scalar(m, "staleness", 20, NAN, 0), 0);
  const chief_series *s = chief_series_find(chief_metrics_series(m), "loss");
  assert_non_null(s);
  assert_int_equal(s->n, 2);
  assert_true(s->pts[1].value == 1.25);
  char evpath[600], trpath[600];
  snprintf(evpath, sizeof evpath, "%s", chief_metrics_event_path(m));
  snprintf(trpath, sizeof trpath, "%s",
           chief_tb_path(chief_metrics_tb(m, CHIEF_RUN_TRAIN)));
  assert_int_equal(chief_metrics_close(m), 0);

  snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
  chief_series_set set;
  chief_series_init(&set);
  assert_int_equal(chief_series_load_jsonl(&set, path, err, sizeof err), 0);
  assert_int_equal(set.n, 3);
  s = chief_series_find(&set, "loss");
  assert_int_equal(s->n, 2);
  assert_int_equal(s->pts[0].step, 10);
  assert_true(s->pts[0].value == 2.5);
  assert_true(fabs(s->pts[1].wall_time - 1700000001.5) < 1e-3);
  s = chief_series_find(&set, "eval/acc\"x");
  assert_non_null(s);
  assert_true(s->pts[0].value == 0.5);
  s = chief_series_find(&set, "staleness");
  assert_true(isnan(s->pts[0].value));
  chief_series_free(&set);

  /* The same scalars are in the event files: the training loss in
   * logdir/train as Keras's epoch_loss, the cluster's own in logdir. */
  static ev_t ev[8];
  assert_int_equal(read_events(evpath, ev, 8), 2);
  assert_string_equal(ev[1].tag, "staleness");
  assert_non_null(strstr(trpath, "/train/events.out.tfevents."));
  assert_int_equal(read_events(trpath, ev, 8), 3);
  assert_string_equal(ev[2].tag, "epoch_loss");
  assert_true(ev[2].simple_value == 1.25f);

  /* A damaged line names the file and the line. */
  FILE *f = fopen(path, "a");
  fputs("{\"step\": 3, \"tag\": 7, \"value\": 1}\n", f);
  fclose(f);
  chief_series_init(&set);
  assert_true(chief_series_load_jsonl(&set, path, err, sizeof err) < 0);
  assert_non_null(strstr(err, ":5:"));
  assert_non_null(strstr(err, "\"tag\""));
  chief_series_free(&set);
  test_rmtree(dir);
}

/* A restart from the checkpoint of step 30: what the failed run logged
 * after 30 is dropped in memory, marked for TensorBoard, and dropped again
 * when metrics.jsonl is read back. */
static void test_session_start(void **state) {
  char dir[256], path[600], err[512], evpath[600];
  test_tmpdir(dir, sizeof dir);
  chief_metrics *m;
  chief_tb_opts o = {.host = "h"};
  assert_int_equal(chief_metrics_open(&m, dir, &o, err, sizeof err), 0);
  for (int s = 10; s <= 50; s += 10)
    chief_metrics_scalar(m, "loss", s, s, 0);
  chief_metrics_scalar(m, "eval/acc", 40, 0.5, 0);
  assert_int_equal(chief_metrics_session_start(m, 30), 0);
  const chief_series *ls = chief_series_find(chief_metrics_series(m), "loss");
  assert_int_equal(ls->n, 3);
  assert_int_equal(chief_series_find(chief_metrics_series(m), "eval/acc")->n,
                   0);
  for (int s = 40; s <= 60; s += 10)
    chief_metrics_scalar(m, "loss", s, 1000 + s, 0);
  snprintf(evpath, sizeof evpath, "%s",
           chief_tb_path(chief_metrics_tb(m, CHIEF_RUN_TRAIN)));
  assert_int_equal(chief_metrics_close(m), 0);

  static ev_t ev[16];
  int n = read_events(evpath, ev, 16);
  assert_int_equal(n, 1 + 5 + 1 + 3); /* eval/acc is in logdir/validation */
  assert_int_equal(ev[6].session_status, 1); /* START */
  assert_int_equal(ev[6].step, 30);

  snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
  chief_series_set set;
  chief_series_init(&set);
  assert_int_equal(chief_series_load_jsonl(&set, path, err, sizeof err), 0);
  ls = chief_series_find(&set, "loss");
  assert_int_equal(ls->n, 6);
  static const double want[] = {10, 20, 30, 1040, 1050, 1060};
  for (int i = 0; i < 6; i++) assert_true(ls->pts[i].value == want[i]);
  chief_series_free(&set);
  test_rmtree(dir);
}

static void test_metrics_memory_only(void **state) {
  char err[512];
  chief_metrics *m;
  assert_int_equal(chief_metrics_open(&m, NULL, NULL, err, sizeof err), 0);
  assert_null(chief_metrics_logdir(m));
  assert_null(chief_metrics_event_path(m));
  assert_int_equal(chief_metrics_scalar(m, "loss", 1, 3, 0), 0);
  assert_int_equal(chief_metrics_series(m)->n, 1);
  assert_int_equal(chief_metrics_flush(m), 0);
  assert_int_equal(chief_metrics_close(m), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_event_file_roundtrip),
      cmocka_unit_test(test_flush_policy),
      cmocka_unit_test(test_two_files_same_second),
      cmocka_unit_test(test_unwritable_logdir),
      cmocka_unit_test(test_metrics_jsonl),
      cmocka_unit_test(test_session_start),
      cmocka_unit_test(test_metrics_memory_only),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
