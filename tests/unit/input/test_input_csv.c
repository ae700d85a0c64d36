/* CSV reader and the data spec: files the test writes itself, the bad
 * inputs (each error names file, line, column and text), and the two real
 * sets in tests/data loaded through their job files with the every-5th-row
 * eval split. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>
#include <sys/stat.h>

#include "input_test.h"

/* Loads a job whose data.train is `train` (JSON text) and opens it. */
static int open_train(fx *f, const char *csv, const char *train,
                      int64_t batch, bool drop) {
  if (csv) twrites(f->dir, "d.csv", csv);
  char job[2048];
  snprintf(job, sizeof job, "{\"data\": {\"train\": %s}}", train);
  int rc = tjob(f->dir, job, &f->job, f->err, sizeof f->err);
  if (rc) return rc;
  wk_input_opts o = topts(1, 0, batch, 1, 7);
  o.drop_remainder = drop;
  return wk_input_open(&f->job, WK_SPLIT_TRAIN, &o, &f->in, f->err,
                       sizeof f->err);
}

static void csv_basic(void **state) {
  fx *f = *state;
  const char *csv = "a, b ,y\n1,2,3\n4,5.5,6\n-7,8e1,9\n10,11,12\n13,14,15\n";
  assert_int_equal(open_train(f, csv,
                              "{\"format\": \"csv\", \"paths\": \"d.csv\", "
                              "\"label\": \"y\"}",
                              2, false),
                   0);
  const wk_input_schema *s = wk_input_get_schema(f->in);
  assert_int_equal(s->n_dense, 2);
  assert_int_equal(s->n_examples, 5);
  assert_int_equal(s->n_classes, 1);
  assert_string_equal(s->dense_names[1], "b");
  const wk_batch *b;
  float want[5][3] = {{1, 2, 3}, {4, 5.5f, 6}, {-7, 80, 9}, {10, 11, 12},
                      {13, 14, 15}};
  int row = 0;
  int64_t sizes[3];
  for (int k = 0; k < 3; k++) {
    assert_int_equal(wk_input_next(f->in, &b), 0);
    sizes[k] = b->n;
    assert_int_equal(b->index, k);
    assert_int_equal(b->epoch, 0);
    for (int64_t i = 0; i < b->n; i++, row++) {
      assert_true(b->x[i * 2] == want[row][0]);
      assert_true(b->x[i * 2 + 1] == want[row][1]);
      assert_true(b->y[i] == want[row][2]);
    }
  }
  assert_int_equal(sizes[0], 2);
  assert_int_equal(sizes[2], 1); /* the remainder */
  assert_int_equal(wk_input_next(f->in, &b), TSR_EEOF);
  assert_int_equal(wk_input_next(f->in, &b), TSR_EEOF);
}

/* Every accepted spelling parses to what strtod gives (the reader has a
 * fast path for short decimals); bad ones are refused. */
static void csv_number_spellings(void **state) {
  fx *f = *state;
  static const char *good[] = {
      "0", "-0", "+3", "1.", ".5", "-.25", "1e3", "1E-5", "2.5e+2",
      "0.000123", "-123.456", "123456789012345", "1234567890123456789",
      "3.14159265358979323846", "1e-30", "7e22", "9.999999e-23", "0x10",
      " 42 ", "\"17\"", "00012.50", "3.4e38", "-3.4e38"};
  /* 1e39 and 4e38 are numbers float32 cannot hold: refused, not inf */
  static const char *bad[] = {"1e", "--1", "1.2.3", "e5", ".", "-", "1e400",
                              "nan", "12abc", "1e39", "-4e38",
                              "1000000000000000000000000000000000000000"};
  char csv[2048];
  size_t at = (size_t)sprintf(csv, "v,y\n");
  size_t ng = sizeof good / sizeof good[0];
  for (size_t i = 0; i < ng; i++) at += (size_t)sprintf(csv + at, "%s,1\n", good[i]);
  assert_int_equal(open_train(f, csv, "{\"format\": \"csv\", \"paths\": "
                                      "\"d.csv\", \"label\": \"y\"}",
                              64, false),
                   0);
  float x[64];
  assert_int_equal(tdrain(f->in, NULL, x, 64, NULL), (int64_t)ng);
  for (size_t i = 0; i < ng; i++) {
    char t[64];
    snprintf(t, sizeof t, "%s", good[i]);
    char *p = t;
    while (*p == ' ' || *p == '"') p++;
    float want = (float)strtod(p, NULL);
    if (x[i] != want) fail_msg("\"%s\": %.9g, want %.9g", good[i], x[i], want);
  }
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    wk_input_close(f->in);
    f->in = NULL;
    tsr_job_free(&f->job);
    snprintf(csv, sizeof csv, "v,y\n1,1\n%s,1\n", bad[i]);
    int rc = open_train(f, csv, "{\"format\": \"csv\", \"paths\": "
                                "\"d.csv\", \"label\": \"y\"}",
                        64, false);
    if (rc != TSR_EFORMAT) fail_msg("\"%s\" accepted", bad[i]);
  }
}

/* Every row is checked before the first step: a label that is not one of
 * the model's classes is named with its file, line and column. */
static void csv_validate_names_the_row(void **state) {
  fx *f = *state;
  const char *csv = "a,y\n1,0\n2,1\n3,9\n4,12\n";
  assert_int_equal(open_train(f, csv, "{\"format\": \"csv\", \"paths\": "
                                      "\"d.csv\", \"label\": \"y\"}",
                              64, false),
                   0);
  char err[512];
  assert_int_equal(wk_input_validate(f->in, 13, err, sizeof err), 0);
  assert_int_equal(wk_input_validate(f->in, 0, err, sizeof err), 0);
  assert_int_equal(wk_input_validate(f->in, 10, err, sizeof err), TSR_EDATA);
  if (!strstr(err, "d.csv: line 5") || !strstr(err, "column \"y\"") ||
      !strstr(err, "12 is not a class in [0, 10)"))
    fail_msg("%s", err);
}

/* A value that overflows float32 is refused with its line and column. */
static void csv_overflow_names_the_cell(void **state) {
  fx *f = *state;
  const char *csv = "a,b,y\n1,2,0\n1,2e39,1\n";
  assert_int_equal(open_train(f, csv, "{\"format\": \"csv\", \"paths\": "
                                      "\"d.csv\", \"label\": \"y\"}",
                              64, false),
                   TSR_EFORMAT);
}

static void csv_drop_remainder_and_features(void **state) {
  fx *f = *state;
  const char *csv = "a,b,y\n1,2,3\n4,5,6\n7,8,9\n";
  assert_int_equal(open_train(f, csv,
                              "{\"format\": \"csv\", \"paths\": \"d.csv\", "
                              "\"label\": \"y\", \"features\": [\"b\"]}",
                              2, true),
                   0);
  const wk_batch *b;
  assert_int_equal(wk_input_next(f->in, &b), 0);
  assert_int_equal(b->n, 2);
  assert_int_equal(b->n_dense, 1);
  assert_true(b->x[0] == 2 && b->x[1] == 5);
  assert_int_equal(wk_input_next(f->in, &b), TSR_EEOF);
}

/* RFC 4180: a quoted header cell holding the delimiter and a quote, quoted
 * numbers, a quoted text column with a line end inside (its line count
 * kept for messages); another delimiter by option; a file cut by ';'
 * read with ',' gets a hint; an unterminated quote is named. */
/* Closes the open input and job before the next open_train. */
static void reopen(fx *f) {
  wk_input_close(f->in);
  f->in = NULL;
  tsr_job_free(&f->job);
}

static void csv_quoting_and_delimiter(void **state) {
  fx *f = *state;
  const char *csv = "\"size, cm\",\"say \"\"hi\"\"\",note,y\n"
                    "1.5,\"2\",\"a, b\",0\n"
                    "\"3\",4,\"two\nlines\",1\n"
                    "5,6,plain,1\n";
  assert_int_equal(open_train(f, csv,
                              "{\"format\": \"csv\", \"paths\": \"d.csv\", "
                              "\"label\": \"y\", \"features\": [\"size, cm\", "
                              "\"say \\\"hi\\\"\"]}",
                              8, false),
                   0);
  const wk_input_schema *s = wk_input_get_schema(f->in);
  assert_int_equal(s->n_examples, 3);
  assert_string_equal(s->dense_names[0], "size, cm");
  assert_string_equal(s->dense_names[1], "say \"hi\"");
  const wk_batch *b;
  assert_int_equal(wk_input_next(f->in, &b), 0);
  assert_int_equal(b->n, 3);
  assert_true(b->x[0] == 1.5f && b->x[1] == 2 && b->x[2] == 3 &&
              b->x[3] == 4 && b->x[5] == 6);
  assert_true(b->y[0] == 0 && b->y[1] == 1 && b->y[2] == 1);
  /* the line after the two-line record is line 5 */
  reopen(f);
  assert_int_equal(open_train(f, "a,t,y\n1,\"x\ny\",0\nq,z,1\n",
                              "{\"format\": \"csv\", \"paths\": \"d.csv\", "
                              "\"label\": \"y\", \"features\": [\"a\"]}",
                              8, false),
                   TSR_EFORMAT);
  assert_non_null(strstr(f->err, "line 4 (data row 1)"));
  /* semicolons, by option */
  reopen(f);
  assert_int_equal(open_train(f, "a;b;y\n1;2,5;3\n",
                              "{\"format\": \"csv\", \"paths\": \"d.csv\", "
                              "\"label\": \"y\", \"delimiter\": \";\", "
                              "\"features\": [\"a\"]}",
                              8, false),
                   0);
  assert_int_equal(wk_input_next(f->in, &b), 0);
  assert_true(b->x[0] == 1 && b->y[0] == 3);
  /* ... and without it, a hint */
  reopen(f);
  assert_int_equal(open_train(f, "a;b;y\n1;2;3\n",
                              "{\"format\": \"csv\", \"paths\": \"d.csv\", "
                              "\"label\": \"y\"}",
                              8, false),
                   TSR_ENOTFOUND);
  assert_non_null(strstr(f->err, "label column \"y\""));
  assert_non_null(strstr(f->err, "set \"delimiter\": \";\""));
  /* an unterminated quote */
  reopen(f);
  assert_int_equal(open_train(f, "a,y\n1,2\n\"3,4\n",
                              "{\"format\": \"csv\", \"paths\": \"d.csv\", "
                              "\"label\": \"y\"}",
                              8, false),
                   TSR_EFORMAT);
  assert_non_null(strstr(f->err, "line 3 (data row 1) opens a quote"));
  /* a bad delimiter option */
  reopen(f);
  assert_int_equal(open_train(f, NULL,
                              "{\"format\": \"csv\", \"paths\": \"d.csv\", "
                              "\"label\": \"y\", \"delimiter\": \";;\"}",
                              8, false),
                   TSR_ECONFIG);
  assert_non_null(strstr(f->err, "delimiter must be one character"));
}

static void csv_bad_cell(void **state) {
  fx *f = *state;
  const char *csv = "a,b,y\n1,2,3\n4,x5,6\n";
  int rc = open_train(f, csv,
                      "{\"format\": \"csv\", \"paths\": \"d.csv\", "
                      "\"label\": \"y\"}",
                      2, false);
  assert_int_equal(rc, TSR_EFORMAT);
  assert_non_null(strstr(f->err, "d.csv"));
  assert_non_null(strstr(f->err, "line 3"));
  assert_non_null(strstr(f->err, "data row 1"));
  assert_non_null(strstr(f->err, "column 2 (\"b\")"));
  assert_non_null(strstr(f->err, "\"x5\""));
  assert_null(f->in);
}

static void csv_empty_and_nonfinite_cells(void **state) {
  fx *f = *state;
  int rc = open_train(f, "a,y\n1,2\n,3\n",
                      "{\"format\": \"csv\", \"paths\": \"d.csv\", "
                      "\"label\": \"y\"}",
                      2, false);
  assert_int_equal(rc, TSR_EFORMAT);
  assert_non_null(strstr(f->err, "line 3"));
  tsr_job_free(&f->job);
  rc = open_train(f, "a,y\n1,2\ninf,3\n",
                  "{\"format\": \"csv\", \"paths\": \"d.csv\", "
                  "\"label\": \"y\"}",
                  2, false);
  assert_int_equal(rc, TSR_EFORMAT);
  assert_non_null(strstr(f->err, "\"inf\""));
}

static void csv_ragged(void **state) {
  fx *f = *state;
  const char *csv = "a,b,y\n1,2,3\n4,5\n";
  int rc = open_train(f, csv,
                      "{\"format\": \"csv\", \"paths\": \"d.csv\", "
                      "\"label\": \"y\"}",
                      2, false);
  assert_int_equal(rc, TSR_EFORMAT);
  assert_non_null(strstr(f->err, "d.csv: line 3"));
  assert_non_null(strstr(f->err, "2 cells"));
  assert_non_null(strstr(f->err, "header has 3"));
}

static void csv_missing_label_column(void **state) {
  fx *f = *state;
  int rc = open_train(f, "a,b\n1,2\n",
                      "{\"format\": \"csv\", \"paths\": \"d.csv\", "
                      "\"label\": \"target\"}",
                      2, false);
  assert_int_equal(rc, TSR_ENOTFOUND);
  assert_non_null(strstr(f->err, "\"target\""));
  tsr_job_free(&f->job);
  rc = open_train(f, NULL,
                  "{\"format\": \"csv\", \"paths\": \"d.csv\", "
                  "\"label\": \"b\", \"features\": [\"a\", \"c\"]}",
                  2, false);
  assert_int_equal(rc, TSR_ENOTFOUND);
  assert_non_null(strstr(f->err, "\"c\""));
  assert_non_null(strstr(f->err, "features[1]"));
}

static void missing_file(void **state) {
  fx *f = *state;
  int rc = open_train(f, NULL,
                      "{\"format\": \"csv\", \"paths\": \"nope.csv\", "
                      "\"label\": \"y\"}",
                      2, false);
  assert_true(rc < 0);
  assert_non_null(strstr(f->err, "nope.csv"));
  assert_non_null(strstr(f->err, "No such file"));
}

static void unreadable_file(void **state) {
  fx *f = *state;
  /* a folder where a file should be: unreadable for everyone, root too */
  mkdir(tpath(f->dir, "sub.csv"), 0755);
  int rc = open_train(f, NULL,
                      "{\"format\": \"csv\", \"paths\": \"sub.csv\", "
                      "\"label\": \"y\"}",
                      2, false);
  assert_true(rc < 0);
  assert_non_null(strstr(f->err, "sub.csv"));
  assert_non_null(strstr(f->err, "Is a directory"));
  if (geteuid() != 0) { /* permissions do not stop root */
    tsr_job_free(&f->job);
    twrites(f->dir, "locked.csv", "a,y\n1,2\n");
    chmod(tpath(f->dir, "locked.csv"), 0);
    rc = open_train(f, NULL,
                    "{\"format\": \"csv\", \"paths\": \"locked.csv\", "
                    "\"label\": \"y\"}",
                    2, false);
    assert_true(rc < 0);
    assert_non_null(strstr(f->err, "Permission denied"));
  }
}

static void spec_errors(void **state) {
  fx *f = *state;
  static const struct {
    const char *train, *want;
  } cases[] = {
      {"{\"format\": \"csv\", \"paths\": \"d.csv\", \"label\": \"y\", "
       "\"shufle_buffer\": 4}",
       "data.train.shufle_buffer: unknown key; did you mean \"shuffle_buffer\"?"},
      {"{\"format\": \"parquet\", \"paths\": \"d.csv\"}",
       "data.train.format: unknown format \"parquet\""},
      {"{\"format\": \"csv\", \"paths\": \"d.csv\", \"label\": \"y\", "
       "\"shard\": \"rows\"}",
       "data.train.shard must be"},
      {"{\"format\": \"csv\", \"paths\": \"d.csv\", \"label\": \"y\", "
       "\"zipf\": 1.2}",
       "data.train.zipf: not used by format csv"},
      {"{\"format\": \"csv\", \"paths\": \"d.csv\"}", "data.train.label: missing"},
      {"{\"format\": \"csv\", \"paths\": [], \"label\": \"y\"}",
       "data.train.paths must be"},
      {"{\"format\": \"csv\", \"paths\": \"d.csv\", \"label\": \"y\", "
       "\"shuffle_buffer\": -1}",
       "data.train.shuffle_buffer: -1 is out of range"},
      {"{\"format\": \"idx\", \"paths\": \"a\"}", "data.train.labels: missing"},
      {"{\"format\": \"csv\", \"paths\": \"d.csv\", \"label\": \"y\", "
       "\"features\": [\"a\", \"y\"]}",
       "data.train.features[1]: \"y\" is the label"},
      {"{\"format\": \"tfrecord\", \"paths\": \"d.csv\", \"label\": \"y\", "
       "\"features\": [{\"name\": \"a\", \"sise\": 3}]}",
       "data.train.features[0].sise: unknown key; did you mean \"size\"?"},
      {"{\"format\": \"tfrecord\", \"paths\": \"d.csv\", \"label\": \"y\", "
       "\"features\": [\"a\"], \"sparse_features\": [{\"name\": \"s\", "
       "\"vocabulary\": 3}]}",
       "data.train.sparse_features[0].vocabulary: unknown key (known: name, "
       "vocab)"},
  };
  twrites(f->dir, "d.csv", "a,y\n1,2\n");
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    tsr_job_free(&f->job);
    int rc = open_train(f, NULL, cases[i].train, 2, false);
    assert_int_equal(rc, TSR_ECONFIG);
    if (!strstr(f->err, cases[i].want))
      fail_msg("case %zu: \"%s\" lacks \"%s\"", i, f->err, cases[i].want);
    assert_int_equal(wk_input_check(&f->job, f->err, sizeof f->err),
                     TSR_ECONFIG);
  }
  /* unknown top-level and eval keys */
  tsr_job_free(&f->job);
  assert_int_equal(tjob(f->dir,
                        "{\"data\": {\"train\": {\"format\": \"csv\", "
                        "\"paths\": \"d.csv\", \"label\": \"y\"}, "
                        "\"evl\": {}}}",
                        &f->job, f->err, sizeof f->err),
                   0);
  assert_int_equal(wk_input_check(&f->job, f->err, sizeof f->err),
                   TSR_ECONFIG);
  assert_non_null(strstr(f->err, "data.evl: unknown key; did you mean \"eval\"?"));
  tsr_job_free(&f->job);
  assert_int_equal(tjob(f->dir,
                        "{\"data\": {\"train\": {\"format\": \"csv\", "
                        "\"paths\": \"d.csv\", \"label\": \"y\"}, "
                        "\"eval\": {\"split\": \"every\", \"k\": 5, "
                        "\"index\": 5}}}",
                        &f->job, f->err, sizeof f->err),
                   0);
  assert_int_equal(wk_input_check(&f->job, f->err, sizeof f->err),
                   TSR_ECONFIG);
  assert_non_null(strstr(f->err, "data.eval.index: 5 must be below k"));
}

/* Reads column `col` of a CSV in tests/data with strtod, for comparison. */
static int64_t read_column(const char *path, int col, double *out,
                           int64_t cap) {
  FILE *fp = fopen(path, "r");
  assert_non_null(fp);
  char line[4096];
  int64_t n = 0;
  assert_non_null(fgets(line, sizeof line, fp));
  while (fgets(line, sizeof line, fp) && n < cap) {
    char *p = line;
    for (int c = 0; c < col; c++) p = strchr(p, ',') + 1;
    out[n++] = strtod(p, NULL);
  }
  fclose(fp);
  return n;
}

static void data_path(char *buf, size_t n, const char *name) {
  const char *src = getenv("TSR_SOURCE_DIR");
  snprintf(buf, n, "%s/tests/data/%s", src ? src : "..", name);
}

static void diabetes_job(void **state) {
  fx *f = *state;
  char path[4096], csv[4096];
  data_path(path, sizeof path, "diabetes_job.json");
  data_path(csv, sizeof csv, "diabetes.csv");
  assert_int_equal(tsr_job_load(path, NULL, &f->job, f->err, sizeof f->err),
                   0);
  double target[442];
  assert_int_equal(read_column(csv, 10, target, 442), 442);

  wk_input_opts o = topts(1, 0, 32, 1, 3);
  assert_int_equal(wk_input_open(&f->job, WK_SPLIT_TRAIN, &o, &f->in, f->err,
                                 sizeof f->err),
                   0);
  const wk_input_schema *s = wk_input_get_schema(f->in);
  assert_int_equal(s->n_dense, 10);
  assert_int_equal(s->n_examples, 354);
  assert_int_equal(s->n_classes, 1);
  /* normalized with the training rows: mean 0, std 1 over an epoch */
  double sum[10] = {0}, sq[10] = {0}, ysum = 0, want_y = 0;
  const wk_batch *b;
  int64_t n = 0;
  while (wk_input_next(f->in, &b) == 0) {
    for (int64_t i = 0; i < b->n; i++, n++) {
      for (int j = 0; j < 10; j++) {
        sum[j] += b->x[i * 10 + j];
        sq[j] += b->x[i * 10 + j] * b->x[i * 10 + j];
      }
      ysum += b->y[i];
    }
  }
  assert_int_equal(n, 354);
  for (int j = 0; j < 10; j++) {
    assert_true(fabs(sum[j] / n) < 1e-4);
    assert_true(fabs(sq[j] / n - 1) < 1e-3);
  }
  for (int i = 0; i < 442; i++)
    if (i % 5 != 4) want_y += target[i];
  assert_true(fabs(ysum - want_y) < 1e-2); /* shuffled, but the same rows */
  wk_input_close(f->in);
  f->in = NULL;

  /* eval: rows 4, 9, 14, ... in file order, with the training statistics */
  o = topts(1, 0, 100, 1, 3);
  assert_int_equal(wk_input_open(&f->job, WK_SPLIT_EVAL, &o, &f->in, f->err,
                                 sizeof f->err),
                   0);
  assert_int_equal(wk_input_get_schema(f->in)->n_examples, 88);
  float ys[88];
  int64_t got = tdrain(f->in, ys, NULL, 88, NULL);
  assert_int_equal(got, 88);
  for (int i = 0; i < 88; i++) assert_true(ys[i] == (float)target[5 * i + 4]);
}

/* Least squares on the training rows via the normal equations (d + 1
 * unknowns, Gauss-Jordan), then the mean squared error on the eval rows. */
static double ols_test_mse(const float *xtr, const float *ytr, int ntr,
                           const float *xte, const float *yte, int nte,
                           int d) {
  double A[11][12] = {{0}};
  for (int r = 0; r < ntr; r++) {
    double v[11];
    for (int j = 0; j < d; j++) v[j] = xtr[r * d + j];
    v[d] = 1;
    for (int i = 0; i <= d; i++) {
      for (int j = 0; j <= d; j++) A[i][j] += v[i] * v[j];
      A[i][d + 1] += v[i] * ytr[r];
    }
  }
  for (int c = 0; c <= d; c++)
    for (int r = 0; r <= d; r++)
      if (r != c) {
        double m = A[r][c] / A[c][c];
        for (int j = c; j <= d + 1; j++) A[r][j] -= m * A[c][j];
      }
  double se = 0;
  for (int r = 0; r < nte; r++) {
    double p = A[d][d + 1] / A[d][d];
    for (int j = 0; j < d; j++) p += A[j][d + 1] / A[j][j] * xte[r * d + j];
    se += (p - yte[r]) * (p - yte[r]);
  }
  return se / nte;
}

/* The reference figure of the shared data README: linear regression on
 * the training rows of diabetes has test MSE 3279 with this split. */
static void diabetes_reference_figure(void **state) {
  fx *f = *state;
  char path[4096];
  data_path(path, sizeof path, "diabetes_job.json");
  assert_int_equal(tsr_job_load(path, NULL, &f->job, f->err, sizeof f->err),
                   0);
  static float x[2][442 * 10], y[2][442];
  int n[2] = {0, 0};
  for (int split = 0; split < 2; split++) {
    wk_input_opts o = topts(1, 0, 500, 1, 3);
    assert_int_equal(wk_input_open(&f->job, split, &o, &f->in, f->err,
                                   sizeof f->err),
                     0);
    const wk_batch *b;
    assert_int_equal(wk_input_next(f->in, &b), 0);
    n[split] = (int)b->n;
    memcpy(x[split], b->x, (size_t)b->n * 10 * sizeof(float));
    memcpy(y[split], b->y, (size_t)b->n * sizeof(float));
    wk_input_close(f->in);
    f->in = NULL;
  }
  assert_int_equal(n[0], 354);
  assert_int_equal(n[1], 88);
  double mse = ols_test_mse(x[0], y[0], n[0], x[1], y[1], n[1], 10);
  print_message("diabetes linear regression test MSE %.1f\n", mse);
  assert_true(mse > 3279 - 5 && mse < 3279 + 5);
}

static void digits_job(void **state) {
  fx *f = *state;
  char path[4096];
  data_path(path, sizeof path, "digits_job.json");
  assert_int_equal(tsr_job_load(path, NULL, &f->job, f->err, sizeof f->err),
                   0);
  wk_input_opts o = topts(1, 0, 64, 2, 3);
  assert_int_equal(wk_input_open(&f->job, WK_SPLIT_TRAIN, &o, &f->in, f->err,
                                 sizeof f->err),
                   0);
  const wk_input_schema *s = wk_input_get_schema(f->in);
  assert_int_equal(s->n_dense, 64);
  assert_int_equal(s->n_examples, 1438);
  assert_int_equal(s->n_classes, 10);
  const wk_batch *b;
  int64_t n = 0, last_epoch = -1;
  float mx = 0;
  while (wk_input_next(f->in, &b) == 0) {
    assert_true(b->epoch >= last_epoch);
    last_epoch = b->epoch;
    for (int64_t i = 0; i < b->n * 64; i++)
      if (b->x[i] > mx) mx = b->x[i];
    for (int64_t i = 0; i < b->n; i++)
      assert_true(b->y[i] >= 0 && b->y[i] <= 9 && b->y[i] == floorf(b->y[i]));
    n += b->n;
  }
  assert_int_equal(n, 2 * 1438);
  assert_int_equal(last_epoch, 1);
  assert_true(mx == 1.0f); /* pixel / 16 */
  wk_input_close(f->in);
  f->in = NULL;
  assert_int_equal(wk_input_open(&f->job, WK_SPLIT_EVAL, &o, &f->in, f->err,
                                 sizeof f->err),
                   0);
  assert_int_equal(wk_input_get_schema(f->in)->n_examples, 359);
  assert_int_equal(wk_input_get_schema(f->in)->n_classes, 10);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(csv_basic, setup, teardown),
      cmocka_unit_test_setup_teardown(csv_number_spellings, setup, teardown),
      cmocka_unit_test_setup_teardown(csv_validate_names_the_row, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(csv_overflow_names_the_cell, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(csv_drop_remainder_and_features, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(csv_bad_cell, setup, teardown),
      cmocka_unit_test_setup_teardown(csv_quoting_and_delimiter, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(csv_empty_and_nonfinite_cells, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(csv_ragged, setup, teardown),
      cmocka_unit_test_setup_teardown(csv_missing_label_column, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(missing_file, setup, teardown),
      cmocka_unit_test_setup_teardown(unreadable_file, setup, teardown),
      cmocka_unit_test_setup_teardown(spec_errors, setup, teardown),
      cmocka_unit_test_setup_teardown(diabetes_job, setup, teardown),
      cmocka_unit_test_setup_teardown(diabetes_reference_figure, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(digits_job, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
