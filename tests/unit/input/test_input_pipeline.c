/* The pipeline around the readers: sharding (W workers together see every
 * record exactly once per epoch under "file" and "data", for table and
 * streamed sources), the shuffle buffer (a permutation, reproducible with a
 * seed, reshuffled each epoch, never reaching further ahead than the
 * buffer), batching with drop_remainder over epochs, the prefetch ring
 * (batches in order whatever the consumer's pace; closing mid-stream;
 * pinned allocation), normalization from training statistics, and the two
 * synthetic generators. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>
#include <sched.h>
#include <time.h>

#include "common/clock.h"
#include "input_test.h"
#include "tfr_write.h"

static void load(fx *f, const char *data) {
  char job[4096];
  tsr_job_free(&f->job);
  snprintf(job, sizeof job, "{\"data\": %s}", data);
  assert_int_equal(tjob(f->dir, job, &f->job, f->err, sizeof f->err), 0);
}

static void load_default(fx *f, const char *data) {
  char job[4096];
  tsr_job_free(&f->job);
  snprintf(job, sizeof job, "{\"data\": %s}", data);
  assert_int_equal(tjob_default(f->dir, job, &f->job, f->err, sizeof f->err),
                   0);
}

static int open_opts(fx *f, wk_split split, wk_input_opts o) {
  wk_input_close(f->in);
  f->in = NULL;
  return wk_input_open(&f->job, split, &o, &f->in, f->err, sizeof f->err);
}

/* CSV files f0.csv.. with an "id" label (global row number) and v = id*2. */
static int64_t write_csvs(fx *f, int nfiles, const int *rows) {
  int64_t id = 0;
  for (int k = 0; k < nfiles; k++) {
    char name[32], *text = malloc(64 * (size_t)rows[k] + 16);
    size_t n = (size_t)sprintf(text, "v,id\n");
    for (int r = 0; r < rows[k]; r++, id++)
      n += (size_t)sprintf(text + n, "%lld,%lld\n", (long long)id * 2,
                           (long long)id);
    snprintf(name, sizeof name, "f%d.csv", k);
    twrite(f->dir, name, text, n);
    free(text);
  }
  return id;
}

/* TFRecord files t0.tfrecord.. with x = id and label = id. */
static int64_t write_tfrs(fx *f, int nfiles, const int *rows) {
  int64_t id = 0;
  for (int k = 0; k < nfiles; k++) {
    char name[32];
    snprintf(name, sizeof name, "t%d.tfrecord", k);
    FILE *fp = fopen(tpath(f->dir, name), "wb");
    for (int r = 0; r < rows[k]; r++, id++) {
      float x = (float)id;
      int64_t l = id;
      tfrw_feat fs[] = {{"x", TFRW_FLOAT, 1, &x, NULL},
                        {"label", TFRW_INT64, 1, NULL, &l}};
      size_t len;
      uint8_t *d = tfrw_pack(fs, 2, &len);
      tfrw_frame(fp, d, len);
      free(d);
    }
    fclose(fp);
  }
  return id;
}

static const char *list_paths(char *buf, const char *fmt, int n) {
  size_t at = 0;
  for (int k = 0; k < n; k++) {
    char one[32];
    snprintf(one, sizeof one, fmt, k);
    at += (size_t)sprintf(buf + at, "%s\"%s\"", k ? ", " : "", one);
  }
  return buf;
}

static void sharding(void **state) {
  fx *f = *state;
  int rows[5] = {3, 7, 2, 5, 4};
  int64_t total = write_csvs(f, 5, rows);
  write_tfrs(f, 5, rows);
  const char *pols[] = {"file", "data", "auto"};
  char data[2048], paths[512];
  for (int src = 0; src < 2; src++) {
    for (int p = 0; p < 3; p++) {
      for (int W = 1; W <= 5; W++) {
        if (src == 0)
          snprintf(data, sizeof data,
                   "{\"train\": {\"format\": \"csv\", \"paths\": [%s], "
                   "\"label\": \"id\", \"shard\": \"%s\", "
                   "\"shuffle_buffer\": 8}}",
                   list_paths(paths, "f%d.csv", 5), pols[p]);
        else
          snprintf(data, sizeof data,
                   "{\"train\": {\"format\": \"tfrecord\", \"paths\": [%s], "
                   "\"label\": \"label\", \"features\": [\"x\"], "
                   "\"shard\": \"%s\", \"shuffle_buffer\": 8}}",
                   list_paths(paths, "t%d.tfrecord", 5), pols[p]);
        load(f, data);
        int seen[64] = {0};
        int64_t sum_share = 0;
        for (int w = 0; w < W; w++) {
          assert_int_equal(open_opts(f, WK_SPLIT_TRAIN, topts(W, w, 4, 2, 9)),
                           0);
          float ys[128];
          int64_t n = tdrain(f->in, ys, NULL, 128, NULL);
          assert_true(n >= 0);
          for (int64_t i = 0; i < n; i++) seen[(int)ys[i]]++;
          int64_t share = wk_input_get_schema(f->in)->n_examples;
          if (src == 0) {
            assert_int_equal(share * 2, n);
            sum_share += share;
          }
        }
        for (int64_t id = 0; id < total; id++)
          if (seen[id] != 2) /* two epochs: exactly twice */
            fail_msg("%s, shard %s, W=%d: id %lld seen %d times",
                     src ? "tfrecord" : "csv", pols[p], W, (long long)id,
                     seen[id]);
        if (src == 0) assert_int_equal(sum_share, total);
      }
    }
  }
  /* file sharding needs a file per worker; auto falls back to data */
  snprintf(data, sizeof data,
           "{\"train\": {\"format\": \"csv\", \"paths\": [%s], "
           "\"label\": \"id\", \"shard\": \"file\"}}",
           list_paths(paths, "f%d.csv", 5));
  load(f, data);
  assert_int_equal(open_opts(f, WK_SPLIT_TRAIN, topts(6, 0, 4, 1, 9)),
                   TSR_ECONFIG);
  assert_non_null(strstr(f->err, "5 files for 6 workers"));
  /* "off": every worker reads everything */
  snprintf(data, sizeof data,
           "{\"train\": {\"format\": \"csv\", \"paths\": [%s], "
           "\"label\": \"id\", \"shard\": \"off\"}}",
           list_paths(paths, "f%d.csv", 5));
  load(f, data);
  assert_int_equal(open_opts(f, WK_SPLIT_TRAIN, topts(3, 2, 4, 1, 9)), 0);
  assert_int_equal(tdrain(f->in, NULL, NULL, 0, NULL), total);
}

static void glob_paths(void **state) {
  fx *f = *state;
  int rows[3] = {4, 5, 6};
  write_tfrs(f, 3, rows);
  /* t0, t1, t2 in sorted order: file sharding deals t0 and t2 to worker 0 */
  load(f, "{\"train\": {\"paths\": \"t*.tfrecord\", \"label\": \"label\", "
          "\"features\": [\"x\"], \"shard\": \"file\"}}");
  assert_int_equal(open_opts(f, WK_SPLIT_TRAIN, topts(2, 0, 100, 1, 1)), 0);
  float ys[32];
  assert_int_equal(tdrain(f->in, ys, NULL, 32, NULL), 10);
  assert_true(ys[0] == 0 && ys[3] == 3 && ys[4] == 9 && ys[9] == 14);
  load(f, "{\"train\": {\"paths\": [\"t0.tfrecord\", \"u*.tfrecord\"], "
          "\"label\": \"label\", \"features\": [\"x\"]}}");
  assert_int_equal(open_opts(f, WK_SPLIT_TRAIN, topts(1, 0, 100, 1, 1)),
                   TSR_ENOTFOUND);
  assert_non_null(strstr(f->err, "data.train.paths: \"u*.tfrecord\" matches "
                                  "no file"));
}

/* Output position p may only hold input rows < p + buffer (tf.data). */
static void check_shuffle(const float *ys, int64_t n, int64_t buffer) {
  char *seen = calloc((size_t)n, 1);
  int64_t moved = 0;
  for (int64_t p = 0; p < n; p++) {
    int64_t id = (int64_t)ys[p];
    assert_true(id >= 0 && id < n);
    assert_int_equal(seen[id], 0);
    seen[id] = 1;
    assert_true(id < p + buffer);
    moved += id != p;
  }
  assert_true(moved > n / 2); /* shuffled, not the identity */
  free(seen);
}

static void shuffle(void **state) {
  fx *f = *state;
  int rows[1] = {1000};
  write_csvs(f, 1, rows);
  write_tfrs(f, 1, rows);
  const char *specs[] = {
      "{\"train\": {\"format\": \"csv\", \"paths\": \"f0.csv\", \"label\": "
      "\"id\", \"shuffle_buffer\": 100}}",
      "{\"train\": {\"format\": \"tfrecord\", \"paths\": \"t0.tfrecord\", "
      "\"label\": \"label\", \"features\": [\"x\"], \"shuffle_buffer\": 100}}"};
  static float a[2000], b[2000], c[2000];
  for (int k = 0; k < 2; k++) {
    load(f, specs[k]);
    assert_int_equal(open_opts(f, WK_SPLIT_TRAIN, topts(1, 0, 64, 2, 11)), 0);
    assert_int_equal(tdrain(f->in, a, NULL, 2000, NULL), 2000);
    check_shuffle(a, 1000, 100);
    check_shuffle(a + 1000, 1000, 100);
    assert_true(memcmp(a, a + 1000, 1000 * sizeof(float)) != 0); /* reshuffled */
    assert_int_equal(open_opts(f, WK_SPLIT_TRAIN, topts(1, 0, 64, 2, 11)), 0);
    assert_int_equal(tdrain(f->in, b, NULL, 2000, NULL), 2000);
    assert_memory_equal(a, b, sizeof a); /* same seed, same order */
    assert_int_equal(open_opts(f, WK_SPLIT_TRAIN, topts(1, 0, 64, 2, 12)), 0);
    assert_int_equal(tdrain(f->in, c, NULL, 2000, NULL), 2000);
    assert_true(memcmp(a, c, sizeof a) != 0);
    check_shuffle(c, 1000, 100);
  }
  /* a buffer as large as the data: a full uniform shuffle, any distance */
  load(f, "{\"train\": {\"format\": \"csv\", \"paths\": \"f0.csv\", "
          "\"label\": \"id\", \"shuffle_buffer\": 5000}}");
  assert_int_equal(open_opts(f, WK_SPLIT_TRAIN, topts(1, 0, 64, 1, 11)), 0);
  assert_int_equal(tdrain(f->in, a, NULL, 1000, NULL), 1000);
  check_shuffle(a, 1000, 1000);
  assert_true(a[0] >= 100 || a[1] >= 100 || a[2] >= 100);
}

static void batching_over_epochs(void **state) {
  fx *f = *state;
  int rows[1] = {10};
  write_csvs(f, 1, rows);
  load(f, "{\"train\": {\"format\": \"csv\", \"paths\": \"f0.csv\", "
          "\"label\": \"id\"}}");
  for (int drop = 0; drop < 2; drop++) {
    wk_input_opts o = topts(1, 0, 4, 3, 1);
    o.drop_remainder = drop;
    assert_int_equal(open_opts(f, WK_SPLIT_TRAIN, o), 0);
    const wk_batch *b;
    int64_t nb = 0, n = 0;
    while (wk_input_next(f->in, &b) == 0) {
      assert_int_equal(b->index, nb);
      assert_int_equal(b->epoch, drop ? nb / 2 : nb / 3);
      assert_int_equal(b->n, drop || nb % 3 != 2 ? 4 : 2);
      assert_true(b->y[0] == (float)((drop ? nb % 2 : nb % 3) * 4));
      nb++;
      n += b->n;
    }
    assert_int_equal(nb, drop ? 6 : 9);
    assert_int_equal(n, drop ? 24 : 30);
  }
  /* the spec's keys win over the options */
  load(f, "{\"train\": {\"format\": \"csv\", \"paths\": \"f0.csv\", "
          "\"label\": \"id\", \"drop_remainder\": true, \"epochs\": 2}}");
  assert_int_equal(open_opts(f, WK_SPLIT_TRAIN, topts(1, 0, 4, 7, 1)), 0);
  assert_int_equal(tdrain(f->in, NULL, NULL, 0, NULL), 16);
}

static void sleep_us(long us) {
  struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
  nanosleep(&ts, NULL);
}

/* Batches arrive in order with the same content whatever the prefetch
 * depth and the consumer's pace (the reader thread runs ahead or waits). */
static void prefetch_order(void **state) {
  fx *f = *state;
  static float ref[3 * 3000], got[3 * 3000];
  const int depth[] = {0, 1, 8};
  for (int k = 0; k < 3; k++) {
    char data[512];
    snprintf(data, sizeof data,
             "{\"train\": {\"format\": \"synthetic\", \"n\": 3000, "
             "\"shuffle_buffer\": 500, \"prefetch\": %d}}",
             depth[k]);
    load(f, data);
    assert_int_equal(open_opts(f, WK_SPLIT_TRAIN, topts(1, 0, 16, 3, 4)), 0);
    const wk_batch *b;
    int64_t nb = 0, n = 0;
    float *dst = k == 0 ? ref : got;
    /* the consumer's waiting time is counted inside wk_input_next only:
     * with the time spent outside it, it fits in the loop's wall time */
    double w0 = wk_input_wait_seconds(f->in), outside = 0;
    double t0 = tsr_now_s();
    while (wk_input_next(f->in, &b) == 0) {
      double o0 = tsr_now_s();
      assert_int_equal(b->index, nb);
      for (int64_t i = 0; i < b->n; i++) dst[n++] = b->y[i] + b->x[i * 10 + 3];
      if (k == 2 && nb % 16 == 0) sleep_us(2000); /* slow consumer */
      if (k == 1 && nb % 64 == 0) sched_yield();
      nb++;
      outside += tsr_now_s() - o0;
    }
    double wall = tsr_now_s() - t0;
    double wait = wk_input_wait_seconds(f->in) - w0;
    assert_int_equal(n, 9000);
    if (k) assert_memory_equal(ref, got, sizeof ref);
    assert_true(wait > 0);
    if (!(wait + outside <= wall + 1e-9))
      fail_msg("prefetch %d: waited %.6f s + %.6f s outside next() > %.6f s "
               "in the loop", depth[k], wait, outside, wall);
  }
}

static void close_midstream(void **state) {
  fx *f = *state;
  load(f, "{\"train\": {\"format\": \"synthetic\", \"n\": 100, "
          "\"prefetch\": 4, \"repeat\": true}}");
  for (int k = 0; k < 3; k++) {
    assert_int_equal(open_opts(f, WK_SPLIT_TRAIN, topts(1, 0, 8, 1, 4)), 0);
    const wk_batch *b;
    for (int i = 0; i < 40 * k; i++) /* 40 batches: past one epoch */
      assert_int_equal(wk_input_next(f->in, &b), 0);
    if (k == 2) assert_true(b->epoch >= 2);
    wk_input_close(f->in);
    f->in = NULL;
  }
}

/* Counts what a stand-in for the GPU backend's pinned allocator handed
 * out (no globals in the library; the test's own counters). */
static int64_t g_live, g_calls;
static void *count_alloc(size_t n) {
  g_live++;
  g_calls++;
  return malloc(n);
}
static void count_free(void *p) {
  g_live--;
  free(p);
}

static void pinned_memory(void **state) {
  fx *f = *state;
  load(f, "{\"train\": {\"format\": \"synthetic_ctr\", \"n\": 500, "
          "\"sparse\": 3, \"dense\": 2, \"vocab\": 1000, \"ids_per_feature\": "
          "5, \"prefetch\": 2}}");
  wk_input_opts o = topts(1, 0, 64, 2, 4);
  o.pinned = true;
  o.host_alloc = count_alloc;
  o.host_free = count_free;
  assert_int_equal(open_opts(f, WK_SPLIT_TRAIN, o), 0);
  assert_true(g_calls >= 3 * 4); /* per slot: x, y, the ids and offsets blocks */
  const wk_batch *b;
  int64_t n = 0;
  while (wk_input_next(f->in, &b) == 0) {
    for (int fe = 0; fe < 3; fe++)
      for (int64_t i = 0; i < b->n; i++)
        assert_int_equal(b->offsets[fe][i + 1] - b->offsets[fe][i], 5);
    n += b->n;
  }
  assert_int_equal(n, 1000);
  wk_input_close(f->in);
  f->in = NULL;
  assert_int_equal(g_live, 0);
}

/* The context form (the GPU backend's kern_ctx): the context reaches
 * every call, and wins over the plain hooks. */
typedef struct {
  int64_t live, calls;
} pin_ctx;
static void *ctx_alloc(void *c, size_t n) {
  ((pin_ctx *)c)->live++;
  ((pin_ctx *)c)->calls++;
  return malloc(n);
}
static void ctx_free(void *c, void *p) {
  ((pin_ctx *)c)->live--;
  free(p);
}

static void pinned_memory_with_context(void **state) {
  fx *f = *state;
  load(f, "{\"train\": {\"format\": \"synthetic\", \"n\": 300, "
          "\"prefetch\": 3}}");
  pin_ctx pc = {0, 0};
  wk_input_opts o = topts(1, 0, 32, 1, 4);
  o.pinned = true;
  o.host_alloc = count_alloc; /* not used: the context form wins */
  o.host_free = count_free;
  o.host_alloc_ctx = ctx_alloc;
  o.host_free_ctx = ctx_free;
  o.host_ctx = &pc;
  int64_t before = g_calls;
  assert_int_equal(open_opts(f, WK_SPLIT_TRAIN, o), 0);
  const wk_batch *b;
  int64_t n = 0;
  while (wk_input_next(f->in, &b) == 0) n += b->n;
  assert_int_equal(n, 300);
  wk_input_close(f->in);
  f->in = NULL;
  assert_true(pc.calls >= 3 * 2);
  assert_int_equal(pc.live, 0);
  assert_int_equal(g_calls, before);
}

/* A host allocator that fails at call number g_fail_at. */
static int64_t g_fail_at;
static void *failing_alloc(size_t n) {
  if (g_calls++ == g_fail_at) return NULL;
  g_live++;
  return malloc(n);
}

/* Every allocation of batch memory failing in turn: open fails cleanly
 * (no leak: the sanitizer build checks) or, once past them all, works. */
static void allocations_failing(void **state) {
  fx *f = *state;
  load(f, "{\"train\": {\"format\": \"synthetic_ctr\", \"n\": 50, "
          "\"sparse\": 2, \"dense\": 2, \"vocab\": 100, \"prefetch\": 1}}");
  int64_t k;
  for (k = 0; k < 100; k++) {
    wk_input_opts o = topts(1, 0, 16, 1, 4);
    o.pinned = true;
    o.host_alloc = failing_alloc;
    o.host_free = count_free;
    g_calls = g_live = 0;
    g_fail_at = k;
    int rc = open_opts(f, WK_SPLIT_TRAIN, o);
    if (rc == 0) break;
    assert_int_equal(rc, TSR_ENOMEM);
    assert_non_null(strstr(f->err, "out of memory"));
    assert_int_equal(g_live, 0);
  }
  assert_true(k > 4 && k < 100);
  assert_int_equal(tdrain(f->in, NULL, NULL, 0, NULL), 50);
  wk_input_close(f->in);
  f->in = NULL;
  assert_int_equal(g_live, 0);
}

static void normalize_streamed(void **state) {
  fx *f = *state;
  int rows[2] = {300, 200};
  write_tfrs(f, 2, rows);
  load(f, "{\"train\": {\"format\": \"tfrecord\", \"paths\": [\"t0.tfrecord\", "
          "\"t1.tfrecord\"], \"label\": \"label\", \"features\": [\"x\"], "
          "\"normalize\": true, \"shard\": \"file\"}}");
  /* worker 1 of 2 reads t1 only, but with the statistics of all rows */
  assert_int_equal(open_opts(f, WK_SPLIT_TRAIN, topts(2, 1, 50, 1, 1)), 0);
  float x[200], y[200];
  assert_int_equal(tdrain(f->in, y, x, 200, NULL), 200);
  double mean = 249.5, sd = sqrt((500.0 * 500.0 - 1) / 12);
  for (int i = 0; i < 200; i++)
    assert_true(fabs(x[i] - (y[i] - mean) / sd) < 1e-4);
}

/* Solves the 11x11 normal equations of y = w.x + b by elimination. */
static double fit_residual(const float *x, const float *y, int n) {
  double A[11][12] = {{0}};
  for (int r = 0; r < n; r++) {
    double v[11];
    for (int j = 0; j < 10; j++) v[j] = x[r * 10 + j];
    v[10] = 1;
    for (int i = 0; i < 11; i++) {
      for (int j = 0; j < 11; j++) A[i][j] += v[i] * v[j];
      A[i][11] += v[i] * y[r];
    }
  }
  for (int c = 0; c < 11; c++)
    for (int r = 0; r < 11; r++)
      if (r != c) {
        double m = A[r][c] / A[c][c];
        for (int j = c; j < 12; j++) A[r][j] -= m * A[c][j];
      }
  double res = 0;
  for (int r = 0; r < n; r++) {
    double p = A[10][11] / A[10][10];
    for (int j = 0; j < 10; j++) p += A[j][11] / A[j][j] * x[r * 10 + j];
    res += (p - y[r]) * (p - y[r]);
  }
  return sqrt(res / n);
}

static void synthetic_regression(void **state) {
  fx *f = *state;
  load(f, "{\"train\": {\"format\": \"synthetic\", \"n\": 400, \"noise\": "
          "0.1}, \"eval\": {\"n\": 100}}");
  assert_int_equal(open_opts(f, WK_SPLIT_TRAIN, topts(1, 0, 400, 1, 1)), 0);
  const wk_input_schema *s = wk_input_get_schema(f->in);
  assert_int_equal(s->n_dense, 10);
  assert_int_equal(s->n_classes, 1);
  assert_true(isnan(s->best_auc));
  const wk_batch *b;
  assert_int_equal(wk_input_next(f->in, &b), 0);
  static float x[4000], y[400];
  memcpy(x, b->x, sizeof x);
  memcpy(y, b->y, sizeof y);
  double r = fit_residual(x, y, 400);
  assert_true(r > 0.07 && r < 0.13); /* the noise, and only the noise */
  /* worker 1 of 2 (data sharding) gets rows 1, 3, 5, ... unchanged */
  assert_int_equal(open_opts(f, WK_SPLIT_TRAIN, topts(2, 1, 200, 1, 1)), 0);
  assert_int_equal(wk_input_next(f->in, &b), 0);
  assert_int_equal(b->n, 200);
  for (int i = 0; i < 200; i++) {
    assert_true(b->y[i] == y[2 * i + 1]);
    assert_memory_equal(b->x + 10 * i, x + 10 * (2 * i + 1), 40);
  }
  /* eval: other examples of the same hidden model */
  assert_int_equal(open_opts(f, WK_SPLIT_EVAL, topts(1, 0, 100, 1, 1)), 0);
  assert_int_equal(wk_input_next(f->in, &b), 0);
  assert_int_equal(b->n, 100);
  assert_true(b->y[0] != y[0]);
  static float x2[4400], y2[440];
  memcpy(x2, x, 4000 * sizeof(float));
  memcpy(y2, y, 400 * sizeof(float));
  memcpy(x2 + 4000, b->x, 400 * sizeof(float));
  memcpy(y2 + 400, b->y, 40 * sizeof(float));
  assert_true(fit_residual(x2, y2, 440) < 0.13);
}

static void synthetic_ctr(void **state) {
  fx *f = *state;
  load(f, "{\"train\": {\"format\": \"synthetic_ctr\", \"n\": 20000, "
          "\"dense\": 3, \"sparse\": 4, \"vocab\": [10, 1000, 100000, 50], "
          "\"zipf\": 1.2, \"ids_per_feature\": 2}}");
  assert_int_equal(open_opts(f, WK_SPLIT_TRAIN, topts(1, 0, 1000, 1, 1)), 0);
  const wk_input_schema *s = wk_input_get_schema(f->in);
  assert_int_equal(s->n_sparse, 4);
  assert_int_equal(s->n_dense, 3);
  assert_int_equal(s->vocab[2], 100000);
  assert_string_equal(s->sparse_names[3], "c3");
  double auc = s->best_auc;
  assert_true(auc > 0.65 && auc < 0.98);
  static int64_t hist[1000];
  const wk_batch *b;
  int64_t pos = 0, n = 0;
  while (wk_input_next(f->in, &b) == 0) {
    for (int fe = 0; fe < 4; fe++)
      for (int64_t k = 0; k < b->offsets[fe][b->n]; k++) {
        assert_true(b->ids[fe][k] >= 0 && b->ids[fe][k] < s->vocab[fe]);
        if (fe == 1) hist[b->ids[fe][k]]++;
      }
    for (int64_t i = 0; i < b->n; i++) {
      assert_true(b->y[i] == 0 || b->y[i] == 1);
      pos += b->y[i] == 1;
    }
    n += b->n;
  }
  assert_int_equal(n, 20000);
  assert_true(pos > 0.18 * n && pos < 0.32 * n); /* positive_rate 0.25 */
  /* Zipf: the two most frequent ids' counts are in ratio 2^1.2 = 2.30 */
  int64_t c1 = 0, c2 = 0;
  for (int i = 0; i < 1000; i++) {
    if (hist[i] > c1) {
      c2 = c1;
      c1 = hist[i];
    } else if (hist[i] > c2) {
      c2 = hist[i];
    }
  }
  double ratio = (double)c1 / (double)c2;
  assert_true(ratio > 2.05 && ratio < 2.55);
  /* every worker computes the same best AUC (the split, not the share) */
  assert_int_equal(open_opts(f, WK_SPLIT_TRAIN, topts(3, 2, 1000, 1, 1)), 0);
  assert_true(wk_input_best_auc(f->in) == auc);
  assert_int_equal(wk_input_get_schema(f->in)->n_examples, 6666);
}

/* Vocabularies both sides of 2^32 (ids mapped from Zipf ranks by a 64-bit
 * product below it, a 128-bit one above): every id in range, the hottest
 * rank's id (rank 0 is id 0) the most frequent, and ids above 2^32 drawn
 * from the large vocabulary. */
static void synthetic_ctr_vocab_sizes(void **state) {
  fx *f = *state;
  load(f, "{\"train\": {\"format\": \"synthetic_ctr\", \"n\": 3000, "
          "\"dense\": 1, \"sparse\": 2, \"vocab\": [4294967295, "
          "12884901888], \"zipf\": 1.1, \"ids_per_feature\": 2}}");
  assert_int_equal(open_opts(f, WK_SPLIT_TRAIN, topts(1, 0, 500, 1, 1)), 0);
  const wk_input_schema *s = wk_input_get_schema(f->in);
  const wk_batch *b;
  int64_t zero[2] = {0, 0}, above = 0, n = 0;
  while (wk_input_next(f->in, &b) == 0) {
    for (int fe = 0; fe < 2; fe++)
      for (int64_t k = 0; k < b->offsets[fe][b->n]; k++) {
        int64_t id = b->ids[fe][k];
        assert_true(id >= 0 && id < s->vocab[fe]);
        zero[fe] += id == 0;
        if (fe == 1 && id > 4294967296ll) above++;
        n++;
      }
  }
  assert_int_equal(n, 3000 * 2 * 2);
  /* rank 0 of Zipf(1.1) over ~1e10 ids: about 1 / zeta(1.1) ~ 9 % */
  for (int fe = 0; fe < 2; fe++)
    assert_true(zero[fe] > 0.05 * 6000 && zero[fe] < 0.15 * 6000);
  assert_true(above > 1000);
}

static int cmp_pair(const void *a, const void *b) {
  const double *x = a, *y = b;
  return (x[0] > y[0]) - (x[0] < y[0]);
}

/* Mann-Whitney AUC of (score, label) pairs (no ties expected). */
static double auc_of(double *p, int64_t n) {
  qsort(p, (size_t)n, 2 * sizeof(double), cmp_pair);
  double pos = 0, rank_sum = 0;
  for (int64_t i = 0; i < n; i++)
    if (p[2 * i + 1] > 0) {
      pos++;
      rank_sum += (double)(i + 1);
    }
  return (rank_sum - pos * (pos + 1) / 2) / (pos * ((double)n - pos));
}

/* A logistic model (one weight per id, per dense feature, and a bias)
 * trained by SGD on the training split reaches close to the eval split's
 * best AUC, and not above it: the known ceiling is right. */
static void synthetic_ctr_learnable(void **state) {
  fx *f = *state;
  load(f, "{\"train\": {\"format\": \"synthetic_ctr\", \"n\": 40000, "
          "\"dense\": 2, \"sparse\": 2, \"vocab\": 40, \"zipf\": 0.8, "
          "\"shuffle_buffer\": 40000}, \"eval\": {\"n\": 20000}}");
  static double w[2 * 40 + 2 + 1];
  memset(w, 0, sizeof w);
  assert_int_equal(open_opts(f, WK_SPLIT_TRAIN, topts(1, 0, 64, 4, 1)), 0);
  const wk_batch *b;
  int64_t step = 0;
  while (wk_input_next(f->in, &b) == 0) /* SGD, one example at a time */
    for (int64_t i = 0; i < b->n; i++) {
      int64_t id0 = b->ids[0][b->offsets[0][i]], id1 = b->ids[1][b->offsets[1][i]];
      const float *x = b->x + 2 * i;
      double z = w[82] + w[id0] + w[40 + id1] + w[80] * x[0] + w[81] * x[1];
      double g = 1 / (1 + exp(-z)) - b->y[i];
      double lr = step++ < 80000 ? 0.05 : 0.01;
      w[id0] -= lr * g;
      w[40 + id1] -= lr * g;
      w[80] -= lr * g * x[0];
      w[81] -= lr * g * x[1];
      w[82] -= lr * g;
    }
  assert_int_equal(open_opts(f, WK_SPLIT_EVAL, topts(1, 0, 1000, 1, 1)), 0);
  double best = wk_input_best_auc(f->in);
  static double p[2 * 20000];
  int64_t n = 0;
  while (wk_input_next(f->in, &b) == 0)
    for (int64_t i = 0; i < b->n; i++, n++) {
      double z = w[82];
      for (int fe = 0; fe < 2; fe++) z += w[fe * 40 + b->ids[fe][b->offsets[fe][i]]];
      for (int j = 0; j < 2; j++) z += w[80 + j] * b->x[i * 2 + j];
      p[2 * n] = z;
      p[2 * n + 1] = b->y[i];
    }
  assert_int_equal(n, 20000);
  double auc = auc_of(p, n);
  print_message("learned AUC %.4f, best AUC %.4f\n", auc, best);
  assert_true(auc > best - 0.02);
  assert_true(auc < best + 0.005);
}

/* Without shuffle_buffer the training split is shuffled whole every epoch
 * (Keras's default), tables and streams alike; eval keeps its order. */
static void shuffle_default(void **state) {
  fx *f = *state;
  int rows[2] = {60, 40};
  int64_t n = write_csvs(f, 2, rows);
  write_tfrs(f, 2, rows);
  const char *specs[] = {
      "{\"train\": {\"format\": \"csv\", \"paths\": [\"f0.csv\", "
      "\"f1.csv\"], \"label\": \"id\"}, \"eval\": {\"paths\": "
      "\"f0.csv\"}}",
      "{\"train\": {\"format\": \"tfrecord\", \"paths\": [\"t0.tfrecord\", "
      "\"t1.tfrecord\"], \"label\": \"label\", \"features\": [\"x\"]}, "
      "\"eval\": {\"paths\": \"t0.tfrecord\"}}"};
  for (int k = 0; k < 2; k++) {
    load_default(f, specs[k]);
    assert_int_equal(open_opts(f, WK_SPLIT_TRAIN, topts(1, 0, 7, 2, 3)), 0);
    float ys[400], x0[400];
    int64_t nb;
    int64_t got = tdrain(f->in, ys, x0, 400, &nb);
    assert_int_equal(got, 2 * n);
    /* each epoch a permutation, not the file order, and not the other's */
    int inplace = 0, same = 0;
    for (int e = 0; e < 2; e++) {
      int seen[100] = {0};
      for (int64_t i = 0; i < n; i++) {
        int id = (int)ys[e * n + i];
        assert_true(id >= 0 && id < n && !seen[id]);
        seen[id] = 1;
        inplace += id == i;
      }
    }
    for (int64_t i = 0; i < n; i++) same += ys[i] == ys[n + i];
    if (inplace > 20 || same > 20)
      fail_msg("spec %d: %d rows in file order, %d in the same place in both "
               "epochs", k, inplace, same);
    /* the eval split is read in order */
    assert_int_equal(open_opts(f, WK_SPLIT_EVAL, topts(1, 0, 7, 1, 3)), 0);
    got = tdrain(f->in, ys, x0, 400, &nb);
    assert_int_equal(got, 60);
    for (int64_t i = 0; i < got; i++) assert_true(ys[i] == (float)i);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(sharding, setup, teardown),
      cmocka_unit_test_setup_teardown(glob_paths, setup, teardown),
      cmocka_unit_test_setup_teardown(shuffle, setup, teardown),
      cmocka_unit_test_setup_teardown(shuffle_default, setup, teardown),
      cmocka_unit_test_setup_teardown(batching_over_epochs, setup, teardown),
      cmocka_unit_test_setup_teardown(prefetch_order, setup, teardown),
      cmocka_unit_test_setup_teardown(close_midstream, setup, teardown),
      cmocka_unit_test_setup_teardown(pinned_memory, setup, teardown),
      cmocka_unit_test_setup_teardown(pinned_memory_with_context, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(allocations_failing, setup, teardown),
      cmocka_unit_test_setup_teardown(normalize_streamed, setup, teardown),
      cmocka_unit_test_setup_teardown(synthetic_regression, setup, teardown),
      cmocka_unit_test_setup_teardown(synthetic_ctr, setup, teardown),
      cmocka_unit_test_setup_teardown(synthetic_ctr_vocab_sizes, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(synthetic_ctr_learnable, setup,
                                      teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
