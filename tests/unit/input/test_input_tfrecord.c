/* TFRecord reader: CRC32C known answer; files of tf.train.Example written
 * by protobuf-c and framed per the TFRecord spec (tfr_write.h, with its
 * own bitwise CRC); dense, label and sparse features read back exactly;
 * packed and unpacked encodings; gzip; and each bad input: bad length or
 * data CRC, truncation (file and byte offset in the error, or counted and
 * skipped with skip_corrupt), a feature absent, a dtype mismatch, a wrong
 * value count, an id outside its vocabulary. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>
#include <zlib.h>

#include "common/crc32c.h"
#include "input_test.h"
#include "tfr_write.h"

#define SPEC_FEATS                                                        \
  "\"label\": \"label\", \"features\": [{\"name\": \"x\", \"size\": 3}], " \
  "\"sparse_features\": [\"ids\", {\"name\": \"cat\", \"vocab\": 7}]"

static int open_spec(fx *f, const char *train, int64_t batch) {
  char job[4096];
  wk_input_close(f->in);
  f->in = NULL;
  tsr_job_free(&f->job);
  snprintf(job, sizeof job, "{\"data\": {\"train\": %s}}", train);
  int rc = tjob(f->dir, job, &f->job, f->err, sizeof f->err);
  if (rc) return rc;
  wk_input_opts o = topts(1, 0, batch, 1, 7);
  return wk_input_open(&f->job, WK_SPLIT_TRAIN, &o, &f->in, f->err,
                       sizeof f->err);
}

/* Example g: x = (g, g/2, -g), label = g % 4, ids = g*10 + k for
 * k < g % 4, cat = g % 7, and a bytes feature the reader ignores. */
static uint8_t *example(int64_t g, size_t *len) {
  float x[3] = {(float)g, (float)g * 0.5f, -(float)g};
  int64_t label = g % 4, cat = g % 7, ids[4];
  for (int k = 0; k < 4; k++) ids[k] = g * 10 + k;
  tfrw_feat fs[] = {{"note", TFRW_BYTES, 1, NULL, NULL},
                    {"x", TFRW_FLOAT, 3, x, NULL},
                    {"cat", TFRW_INT64, 1, NULL, &cat},
                    {"ids", TFRW_INT64, (size_t)(g % 4), NULL, ids},
                    {"label", TFRW_INT64, 1, NULL, &label}};
  return tfrw_pack(fs, 5, len);
}

/* Writes examples [first, first+count) and returns each record's offset. */
static void write_file(const char *path, int64_t first, int64_t count,
                       long *offsets) {
  FILE *fp = fopen(path, "wb");
  assert_non_null(fp);
  for (int64_t g = first; g < first + count; g++) {
    if (offsets) offsets[g - first] = ftell(fp);
    size_t len;
    uint8_t *d = example(g, &len);
    tfrw_frame(fp, d, len);
    free(d);
  }
  fclose(fp);
}

/* Checks one batch row against example g = x[0]. */
static int64_t check_row(const wk_batch *b, int64_t i) {
  int64_t g = (int64_t)b->x[i * 3];
  assert_true(b->x[i * 3 + 1] == (float)g * 0.5f);
  assert_true(b->x[i * 3 + 2] == -(float)g);
  assert_true(b->y[i] == (float)(g % 4));
  int64_t a = b->offsets[0][i], e = b->offsets[0][i + 1];
  assert_int_equal(e - a, g % 4);
  for (int64_t k = a; k < e; k++) assert_int_equal(b->ids[0][k], g * 10 + (k - a));
  assert_int_equal(b->offsets[1][i + 1] - b->offsets[1][i], 1);
  assert_int_equal(b->ids[1][b->offsets[1][i]], g % 7);
  return g;
}

static void crc32c_known_answer(void **state) {
  (void)state;
  const char *v = "123456789";
  assert_int_equal(tsr_crc32c(0, v, 9), 0xe3069283u);
  assert_int_equal(tfrw_crc32c(v, 9), 0xe3069283u);
  assert_int_equal(tsr_crc32c(tsr_crc32c(0, v, 4), v + 4, 5), 0xe3069283u);
  uint8_t buf[1000];
  for (int i = 0; i < 1000; i++) buf[i] = (uint8_t)(i * 31 + 7);
  assert_int_equal(tsr_crc32c(0, buf, 1000), tfrw_crc32c(buf, 1000));
  assert_int_equal(tsr_crc32c_mask(0xe3069283u), tfrw_mask(0xe3069283u));
  assert_int_equal(tsr_crc32c_unmask(tsr_crc32c_mask(0x12345678u)),
                   0x12345678u);
}

static void read_back(void **state) {
  fx *f = *state;
  write_file(tpath(f->dir, "a.tfrecord"), 0, 40, NULL);
  write_file(tpath(f->dir, "b.tfrecord"), 40, 25, NULL);
  assert_int_equal(open_spec(f, "{\"paths\": [\"a.tfrecord\", \"b.tfrecord\"], "
                                SPEC_FEATS "}",
                             8),
                   0);
  const wk_input_schema *s = wk_input_get_schema(f->in);
  assert_int_equal(s->n_dense, 3);
  assert_int_equal(s->n_sparse, 2);
  assert_string_equal(s->sparse_names[1], "cat");
  assert_int_equal(s->vocab[1], 7);
  assert_string_equal(s->dense_names[2], "x[2]");
  assert_int_equal(s->n_examples, -1);
  const wk_batch *b;
  int64_t next = 0;
  while (wk_input_next(f->in, &b) == 0)
    for (int64_t i = 0; i < b->n; i++) assert_int_equal(check_row(b, i), next++);
  assert_int_equal(next, 65);
  assert_string_equal(wk_input_error(f->in), "");
  assert_int_equal(wk_input_skipped(f->in), 0);
}

/* The reader guesses each map entry's feature from its position in the
 * record before: records whose features come in another order each time
 * (and one without the bytes feature) still read back exactly. */
static void feature_order_varies(void **state) {
  fx *f = *state;
  FILE *fp = fopen(tpath(f->dir, "o.tfrecord"), "wb");
  assert_non_null(fp);
  for (int64_t g = 0; g < 30; g++) {
    float x[3] = {(float)g, (float)g * 0.5f, -(float)g};
    int64_t label = g % 4, cat = g % 7, ids[4];
    for (int k = 0; k < 4; k++) ids[k] = g * 10 + k;
    tfrw_feat all[] = {{"note", TFRW_BYTES, 1, NULL, NULL},
                       {"x", TFRW_FLOAT, 3, x, NULL},
                       {"cat", TFRW_INT64, 1, NULL, &cat},
                       {"ids", TFRW_INT64, (size_t)(g % 4), NULL, ids},
                       {"label", TFRW_INT64, 1, NULL, &label}};
    tfrw_feat fs[5];
    int n = 0;
    for (int k = 0; k < 5; k++) { /* rotated by g, "note" every third */
      tfrw_feat *e = &all[(k + g) % 5];
      if (e == &all[0] && g % 3 == 0) continue;
      fs[n++] = *e;
    }
    size_t len;
    uint8_t *d = tfrw_pack(fs, n, &len);
    tfrw_frame(fp, d, len);
    free(d);
  }
  fclose(fp);
  assert_int_equal(open_spec(f, "{\"paths\": \"o.tfrecord\", " SPEC_FEATS "}",
                             4),
                   0);
  const wk_batch *b;
  int64_t next = 0;
  while (wk_input_next(f->in, &b) == 0)
    for (int64_t i = 0; i < b->n; i++) assert_int_equal(check_row(b, i), next++);
  assert_int_equal(next, 30);
  assert_string_equal(wk_input_error(f->in), "");
}

/* Hand-encoded Example with unpacked repeated values (legal protobuf that
 * some writers produce): protobuf-c and the reader must agree. */
static void unpacked_encoding(void **state) {
  fx *f = *state;
  uint8_t ex[256];
  size_t n = 0;
  uint8_t feat_x[64], feat_l[16], ent[2][96];
  size_t nx = 0, nl = 0, ne[2];
  /* Feature{float_list{value: 1.5 (tag 0x0d), value: -2, value: 4}} */
  uint8_t fl[32];
  size_t nfl = 0;
  float vals[3] = {1.5f, -2, 4};
  for (int i = 0; i < 3; i++) {
    fl[nfl++] = 0x0d;
    memcpy(fl + nfl, &vals[i], 4);
    nfl += 4;
  }
  feat_x[nx++] = 0x12; /* float_list, field 2 */
  feat_x[nx++] = (uint8_t)nfl;
  memcpy(feat_x + nx, fl, nfl);
  nx += nfl;
  /* Feature{int64_list{value: 3 (unpacked varint, tag 0x08)}} */
  feat_l[nl++] = 0x1a;
  feat_l[nl++] = 2;
  feat_l[nl++] = 0x08;
  feat_l[nl++] = 3;
  const char *keys[2] = {"x", "label"};
  const uint8_t *fv[2] = {feat_x, feat_l};
  size_t fn[2] = {nx, nl};
  for (int k = 0; k < 2; k++) {
    size_t m = 0, kl = strlen(keys[k]);
    ent[k][m++] = 0x0a;
    ent[k][m++] = (uint8_t)kl;
    memcpy(ent[k] + m, keys[k], kl);
    m += kl;
    ent[k][m++] = 0x12;
    ent[k][m++] = (uint8_t)fn[k];
    memcpy(ent[k] + m, fv[k], fn[k]);
    m += fn[k];
    ne[k] = m;
  }
  uint8_t feats[256];
  size_t nf = 0;
  for (int k = 0; k < 2; k++) {
    feats[nf++] = 0x0a;
    feats[nf++] = (uint8_t)ne[k];
    memcpy(feats + nf, ent[k], ne[k]);
    nf += ne[k];
  }
  ex[n++] = 0x0a;
  ex[n++] = (uint8_t)nf;
  memcpy(ex + n, feats, nf);
  n += nf;
  /* protobuf-c reads it as intended */
  Tensorflow__Example *pe = tensorflow__example__unpack(NULL, n, ex);
  assert_non_null(pe);
  assert_int_equal(pe->features->n_feature, 2);
  assert_int_equal(pe->features->feature[0]->value->float_list->n_value, 3);
  assert_true(pe->features->feature[0]->value->float_list->value[1] == -2);
  assert_int_equal(pe->features->feature[1]->value->int64_list->value[0], 3);
  tensorflow__example__free_unpacked(pe, NULL);
  FILE *fp = fopen(tpath(f->dir, "u.tfrecord"), "wb");
  tfrw_frame(fp, ex, n);
  fclose(fp);
  assert_int_equal(open_spec(f, "{\"format\": \"tfrecord\", \"paths\": "
                                "\"u.tfrecord\", \"label\": \"label\", "
                                "\"features\": [{\"name\": \"x\", \"size\": "
                                "3}]}",
                             4),
                   0);
  const wk_batch *b;
  assert_int_equal(wk_input_next(f->in, &b), 0);
  assert_int_equal(b->n, 1);
  assert_true(b->x[0] == 1.5f && b->x[1] == -2 && b->x[2] == 4);
  assert_true(b->y[0] == 3);
}

static void gzip_file(void **state) {
  fx *f = *state;
  write_file(tpath(f->dir, "a.tfrecord"), 0, 30, NULL);
  FILE *fp = fopen(tpath(f->dir, "a.tfrecord"), "rb");
  static uint8_t raw[1 << 16];
  size_t n = fread(raw, 1, sizeof raw, fp);
  fclose(fp);
  gzFile g = gzopen(tpath(f->dir, "a.tfrecord.gz"), "wb");
  gzwrite(g, raw, (unsigned)n);
  gzclose(g);
  assert_int_equal(open_spec(f, "{\"format\": \"tfrecord\", \"paths\": "
                                "\"a.tfrecord.gz\", " SPEC_FEATS "}",
                             4),
                   0);
  const wk_batch *b;
  int64_t next = 0;
  while (wk_input_next(f->in, &b) == 0)
    for (int64_t i = 0; i < b->n; i++) assert_int_equal(check_row(b, i), next++);
  assert_int_equal(next, 30);
}

/* Corrupts byte `at` of the file. */
static void flip(const char *path, long at) {
  FILE *fp = fopen(path, "r+b");
  fseek(fp, at, SEEK_SET);
  int c = fgetc(fp);
  fseek(fp, at, SEEK_SET);
  fputc(c ^ 0x20, fp);
  fclose(fp);
}

/* Drains with batch size 1: returns the rows delivered before the end. */
static int64_t drain_rows(fx *f, int *rc) {
  const wk_batch *b;
  int64_t n = 0;
  while ((*rc = wk_input_next(f->in, &b)) == 0) n += b->n;
  return n;
}

static void corrupt_records(void **state) {
  fx *f = *state;
  long off[10];
  char want[256];
  int rc;
  const char *spec = "{\"format\": \"tfrecord\", \"paths\": \"c.tfrecord\", "
                     SPEC_FEATS "}";
  const char *skip = "{\"format\": \"tfrecord\", \"paths\": \"c.tfrecord\", "
                     "\"skip_corrupt\": true, " SPEC_FEATS "}";
  /* data CRC: record 3's data changed */
  write_file(tpath(f->dir, "c.tfrecord"), 0, 10, off);
  flip(tpath(f->dir, "c.tfrecord"), off[3] + 12 + 5);
  assert_int_equal(open_spec(f, spec, 1), 0);
  assert_int_equal(drain_rows(f, &rc), 3);
  assert_int_equal(rc, TSR_ECORRUPT);
  snprintf(want, sizeof want, "c.tfrecord: byte offset %ld: corrupt record "
           "(data CRC mismatch)", off[3]);
  assert_non_null(strstr(wk_input_error(f->in), want));
  assert_int_equal(wk_input_skipped(f->in), 0);
  assert_int_equal(open_spec(f, skip, 1), 0);
  assert_int_equal(drain_rows(f, &rc), 9);
  assert_int_equal(rc, TSR_EEOF);
  assert_int_equal(wk_input_skipped(f->in), 1);

  /* length CRC: record 5's length changed; skipping finds record 6's
   * header and goes on */
  write_file(tpath(f->dir, "c.tfrecord"), 0, 10, off);
  flip(tpath(f->dir, "c.tfrecord"), off[5] + 1);
  assert_int_equal(open_spec(f, spec, 1), 0);
  assert_int_equal(drain_rows(f, &rc), 5);
  assert_int_equal(rc, TSR_ECORRUPT);
  snprintf(want, sizeof want, "c.tfrecord: byte offset %ld: corrupt record "
           "(length CRC mismatch)", off[5]);
  assert_non_null(strstr(wk_input_error(f->in), want));
  assert_int_equal(open_spec(f, skip, 1), 0);
  assert_int_equal(drain_rows(f, &rc), 9);
  assert_int_equal(rc, TSR_EEOF);
  assert_int_equal(wk_input_skipped(f->in), 1);

  /* truncated: the file ends inside record 7's data, then in a header */
  for (int k = 0; k < 2; k++) {
    write_file(tpath(f->dir, "c.tfrecord"), 0, 8, off);
    assert_int_equal(truncate(tpath(f->dir, "c.tfrecord"),
                              k == 0 ? off[7] + 20 : off[7] + 5),
                     0);
    assert_int_equal(open_spec(f, spec, 1), 0);
    assert_int_equal(drain_rows(f, &rc), 7);
    assert_int_equal(rc, TSR_ECORRUPT);
    snprintf(want, sizeof want, "c.tfrecord: byte offset %ld: truncated "
             "record", off[7]);
    assert_non_null(strstr(wk_input_error(f->in), want));
    assert_int_equal(open_spec(f, skip, 1), 0);
    assert_int_equal(drain_rows(f, &rc), 7);
    assert_int_equal(rc, TSR_EEOF);
    assert_int_equal(wk_input_skipped(f->in), 1);
  }
}

/* Through a shuffle buffer (records kept serialized, each decoded into
 * its batch row when drawn): every record once per epoch, exactly, in an
 * order that is not the file's; a bad record still names its file and
 * byte offset when it is drawn, after the batches before it. */
static void shuffled_read_back(void **state) {
  fx *f = *state;
  write_file(tpath(f->dir, "a.tfrecord"), 0, 40, NULL);
  write_file(tpath(f->dir, "b.tfrecord"), 40, 25, NULL);
  assert_int_equal(open_spec(f, "{\"paths\": [\"a.tfrecord\", \"b.tfrecord\"], "
                                "\"shuffle_buffer\": 7, \"epochs\": 2, "
                                SPEC_FEATS "}",
                             8),
                   0);
  const wk_batch *b;
  int seen[2][65] = {{0}};
  int64_t n = 0, in_order = 0;
  while (wk_input_next(f->in, &b) == 0)
    for (int64_t i = 0; i < b->n; i++, n++) {
      int64_t g = check_row(b, i);
      assert_true(g >= 0 && g < 65 && b->epoch >= 0 && b->epoch < 2);
      seen[b->epoch][g]++;
      in_order += g == n % 65;
    }
  assert_int_equal(n, 130);
  for (int e = 0; e < 2; e++)
    for (int g = 0; g < 65; g++) assert_int_equal(seen[e][g], 1);
  assert_true(in_order < 65);
  assert_string_equal(wk_input_error(f->in), "");
  /* record 30 of a.tfrecord lacks "x" */
  FILE *fp = fopen(tpath(f->dir, "a.tfrecord"), "wb");
  assert_non_null(fp);
  long bad = 0;
  for (int64_t g = 0; g < 40; g++) {
    size_t len;
    uint8_t *d;
    if (g == 30) {
      int64_t one = 1;
      tfrw_feat fs[] = {{"label", TFRW_INT64, 1, NULL, &one}};
      bad = ftell(fp);
      d = tfrw_pack(fs, 1, &len);
    } else {
      d = example(g, &len);
    }
    tfrw_frame(fp, d, len);
    free(d);
  }
  fclose(fp);
  assert_int_equal(open_spec(f, "{\"paths\": \"a.tfrecord\", "
                                "\"shuffle_buffer\": 7, " SPEC_FEATS "}",
                             1),
                   0);
  int rc;
  int64_t rows = drain_rows(f, &rc);
  assert_int_equal(rc, TSR_ENOTFOUND);
  assert_true(rows >= 30 - 7 && rows < 40);
  char want[128];
  snprintf(want, sizeof want, "a.tfrecord: record at byte offset %ld: "
           "feature \"x\" is absent", bad);
  if (!strstr(wk_input_error(f->in), want))
    fail_msg("\"%s\" lacks \"%s\"", wk_input_error(f->in), want);
}

/* One file with a good record, then a bad one built from `fs`. */
static void write_bad(fx *f, const tfrw_feat *fs, int n, long *bad_off) {
  FILE *fp = fopen(tpath(f->dir, "e.tfrecord"), "wb");
  size_t len;
  uint8_t *d = example(1, &len);
  tfrw_frame(fp, d, len);
  free(d);
  *bad_off = ftell(fp);
  d = tfrw_pack(fs, n, &len);
  tfrw_frame(fp, d, len);
  free(d);
  fclose(fp);
}

static void bad_examples(void **state) {
  fx *f = *state;
  float x3[3] = {1, 2, 3}, x2[2] = {1, 2};
  int64_t one = 1, big = 7;
  const char *spec = "{\"format\": \"tfrecord\", \"paths\": \"e.tfrecord\", "
                     "\"skip_corrupt\": true, " SPEC_FEATS "}";
  struct {
    tfrw_feat fs[3];
    int n, code;
    const char *want;
  } cases[] = {
      {{{"label", TFRW_INT64, 1, NULL, &one}}, 1, TSR_ENOTFOUND,
       "feature \"x\" is absent from the Example"},
      {{{"x", TFRW_FLOAT, 3, x3, NULL}}, 1, TSR_ENOTFOUND,
       "feature \"label\" is absent"},
      {{{"x", TFRW_BYTES, 1, NULL, NULL}, {"label", TFRW_INT64, 1, NULL, &one}},
       2, TSR_EDTYPE,
       "feature \"x\" is a bytes_list, expected a float_list or int64_list "
       "(or set \"decode\" for bytes)"},
      {{{"x", TFRW_FLOAT, 3, x3, NULL}, {"label", TFRW_BYTES, 1, NULL, NULL}},
       2, TSR_EDTYPE, "feature \"label\" is a bytes_list"},
      {{{"x", TFRW_FLOAT, 3, x3, NULL}, {"label", TFRW_INT64, 1, NULL, &one},
        {"ids", TFRW_FLOAT, 2, x2, NULL}},
       3, TSR_EDTYPE, "feature \"ids\" is a float_list, expected int64_list"},
      {{{"x", TFRW_FLOAT, 2, x2, NULL}, {"label", TFRW_INT64, 1, NULL, &one}},
       2, TSR_ESHAPE, "feature \"x\" has 2 values, expected 3"},
      {{{"x", TFRW_FLOAT, 3, x3, NULL}, {"label", TFRW_INT64, 1, NULL, &one},
        {"cat", TFRW_INT64, 1, NULL, &big}},
       3, TSR_ERANGE, "id 7 is outside its vocabulary [0, 7)"},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    long bad;
    write_bad(f, cases[k].fs, cases[k].n, &bad);
    assert_int_equal(open_spec(f, spec, 1), 0);
    int rc;
    assert_int_equal(drain_rows(f, &rc), 1);
    assert_int_equal(rc, cases[k].code);
    char where[128];
    snprintf(where, sizeof where, "e.tfrecord: record at byte offset %ld",
             bad);
    if (!strstr(wk_input_error(f->in), cases[k].want) ||
        !strstr(wk_input_error(f->in), where))
      fail_msg("case %zu: \"%s\"", k, wk_input_error(f->in));
  }
}

static void split_and_classes(void **state) {
  fx *f = *state;
  write_file(tpath(f->dir, "a.tfrecord"), 0, 20, NULL);
  char job[1024];
  snprintf(job, sizeof job,
           "{\"loss\": \"sparse_categorical_crossentropy\", \"data\": "
           "{\"train\": {\"paths\": \"a.tfrecord\", " SPEC_FEATS "}, "
           "\"eval\": {\"split\": \"every\", \"k\": 4, \"index\": 1}}}");
  assert_int_equal(tjob(f->dir, job, &f->job, f->err, sizeof f->err), 0);
  wk_input_opts o = topts(1, 0, 3, 1, 1);
  assert_int_equal(wk_input_open(&f->job, WK_SPLIT_EVAL, &o, &f->in, f->err,
                                 sizeof f->err),
                   TSR_ECONFIG);
  assert_non_null(strstr(f->err, "data.eval.n_classes: missing"));
  tsr_job_free(&f->job);
  snprintf(job, sizeof job,
           "{\"loss\": \"sparse_categorical_crossentropy\", \"data\": "
           "{\"train\": {\"paths\": \"a.tfrecord\", \"n_classes\": 4, "
           SPEC_FEATS "}, "
           "\"eval\": {\"split\": \"every\", \"k\": 4, \"index\": 1}}}");
  assert_int_equal(tjob(f->dir, job, &f->job, f->err, sizeof f->err), 0);
  for (int split = 0; split < 2; split++) {
    assert_int_equal(wk_input_open(&f->job, split, &o, &f->in, f->err,
                                   sizeof f->err),
                     0);
    assert_int_equal(wk_input_get_schema(f->in)->n_classes, 4);
    const wk_batch *b;
    int64_t n = 0;
    while (wk_input_next(f->in, &b) == 0)
      for (int64_t i = 0; i < b->n; i++, n++) {
        int64_t g = check_row(b, i);
        assert_int_equal(g % 4 == 1, split == WK_SPLIT_EVAL);
      }
    assert_int_equal(n, split == WK_SPLIT_EVAL ? 5 : 15);
    wk_input_close(f->in);
    f->in = NULL;
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(crc32c_known_answer),
      cmocka_unit_test_setup_teardown(read_back, setup, teardown),
      cmocka_unit_test_setup_teardown(feature_order_varies, setup, teardown),
      cmocka_unit_test_setup_teardown(shuffled_read_back, setup, teardown),
      cmocka_unit_test_setup_teardown(unpacked_encoding, setup, teardown),
      cmocka_unit_test_setup_teardown(gzip_file, setup, teardown),
      cmocka_unit_test_setup_teardown(corrupt_records, setup, teardown),
      cmocka_unit_test_setup_teardown(bad_examples, setup, teardown),
      cmocka_unit_test_setup_teardown(split_and_classes, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
