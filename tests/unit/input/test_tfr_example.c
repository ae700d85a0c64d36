/* The tf.train.Example decoder (worker/tfr_example.c) on hand-encoded
 * bytes: packed and unpacked values decode alike (and as protobuf-c reads
 * them), unknown fields at every level and unknown features are skipped,
 * sparse features in any order (and a key given twice) land in the spec's
 * order, the fast paths and the general path agree on 1- to 10-byte
 * varints; damaged varints and lengths past the end are "malformed
 * Example" errors naming the file, the record's offset and the feature,
 * and every truncation and every one-byte change of a record is decoded
 * or refused without reading outside it (the suite runs under ASan). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "input_test.h"
#include "tfr_write.h"
#include "worker/tfr_example.h"

/* ---- a tiny protobuf writer -------------------------------------------- */

typedef struct {
  uint8_t b[4096];
  size_t n;
} pb;

static void pb_byte(pb *o, uint8_t v) {
  assert_true(o->n < sizeof o->b);
  o->b[o->n++] = v;
}
static void pb_varint(pb *o, uint64_t v) {
  while (v >= 0x80) {
    pb_byte(o, (uint8_t)(v | 0x80));
    v >>= 7;
  }
  pb_byte(o, (uint8_t)v);
}
static void pb_bytes(pb *o, const void *p, size_t n) {
  assert_true(o->n + n <= sizeof o->b);
  memcpy(o->b + o->n, p, n);
  o->n += n;
}
/* field `f`, wire type 2, holding `in` */
static void pb_sub(pb *o, int f, const pb *in) {
  pb_varint(o, (uint64_t)f << 3 | 2);
  pb_varint(o, in->n);
  pb_bytes(o, in->b, in->n);
}
static void pb_str(pb *o, int f, const char *s) {
  pb_varint(o, (uint64_t)f << 3 | 2);
  pb_varint(o, strlen(s));
  pb_bytes(o, s, strlen(s));
}
static void pb_f32(pb *o, float v) { pb_bytes(o, &v, 4); }

/* A map entry {key, Feature{kind: list}}; `list` holds the list's fields. */
static void entry(pb *feats, const char *key, int kind, const pb *list) {
  pb feat = {0}, ent = {0};
  pb_sub(&feat, kind, list);
  pb_str(&ent, 1, key);
  pb_sub(&ent, 2, &feat);
  pb_sub(feats, 1, &ent);
}
static void example(pb *ex, const pb *feats) {
  ex->n = 0;
  pb_sub(ex, 1, feats);
}
static void packed_floats(pb *l, const float *v, int n) {
  pb run = {0};
  for (int i = 0; i < n; i++) pb_f32(&run, v[i]);
  pb_sub(l, 1, &run);
}
static void packed_ints(pb *l, const int64_t *v, int n) {
  pb run = {0};
  for (int i = 0; i < n; i++) pb_varint(&run, (uint64_t)v[i]);
  pb_sub(l, 1, &run);
}
static void unpacked_ints(pb *l, const int64_t *v, int n) {
  for (int i = 0; i < n; i++) {
    pb_byte(l, 0x08);
    pb_varint(l, (uint64_t)v[i]);
  }
}

/* A map entry whose list is one packed run: `run`'s bytes in field 1. */
static void run_entry(pb *feats, const char *key, int kind, const pb *run) {
  pb list = {0};
  pb_sub(&list, 1, run);
  entry(feats, key, kind, &list);
}
/* A map entry of packed ints (kind 3) or floats (kind 2). */
static void ints_entry(pb *feats, const char *key, const int64_t *v, int n) {
  pb l = {0};
  packed_ints(&l, v, n);
  entry(feats, key, 3, &l);
}
static void floats_entry(pb *feats, const char *key, const float *v,
                         int n) {
  pb l = {0};
  packed_floats(&l, v, n);
  entry(feats, key, 2, &l);
}

/* ---- fixture: x (3 floats), label, ids (any), cat (vocab 7) ------------ */

typedef struct {
  wk_dense_feat dense[1];
  wk_sparse_feat sparse[2];
  wk_input_spec spec;
  int64_t vocab[2];
  wk_tfr_dec dec;
  wk_rec rec;
  char err[512];
} dx;

static int dx_setup(void **state) {
  dx *f = calloc(1, sizeof *f);
  f->dense[0] = (wk_dense_feat){(char *)"x", 3, WK_DECODE_NONE};
  f->sparse[0] = (wk_sparse_feat){(char *)"ids", 0};
  f->sparse[1] = (wk_sparse_feat){(char *)"cat", 7};
  snprintf(f->spec.where, sizeof f->spec.where, "data.train");
  f->spec.dense = f->dense;
  f->spec.n_dense = 1;
  f->spec.label = (char *)"label";
  f->spec.sparse = f->sparse;
  f->spec.n_sparse = 2;
  f->vocab[0] = 0;
  f->vocab[1] = 7;
  if (wk_tfr__dec_init(&f->dec, &f->spec, f->vocab, f->err, sizeof f->err) ||
      wk_rec__init(&f->rec, 3, 2))
    return -1;
  *state = f;
  return 0;
}

static int dx_teardown(void **state) {
  dx *f = *state;
  wk_tfr__dec_free(&f->dec);
  wk_rec__free(&f->rec);
  free(f);
  return 0;
}

static int dec(dx *f, const pb *ex) {
  f->err[0] = 0;
  return wk_tfr__decode(&f->dec, ex->b, ex->n, &f->rec, "t.tfrecord", 96,
                        f->err, sizeof f->err);
}

/* The record holds x = (1.5, -2, 4), label 3, ids `ids`, cat `cat`. */
static void expect(dx *f, const int64_t *ids, int nids, int64_t cat) {
  wk_rec *r = &f->rec;
  assert_true(r->x[0] == 1.5f && r->x[1] == -2 && r->x[2] == 4);
  assert_true(r->y == 3);
  assert_int_equal(r->off[0], 0);
  assert_int_equal(r->off[1], nids);
  for (int i = 0; i < nids; i++) assert_int_equal(r->ids[i], ids[i]);
  if (cat < 0) {
    assert_int_equal(r->off[2], nids);
  } else {
    assert_int_equal(r->off[2], nids + 1);
    assert_int_equal(r->ids[nids], cat);
  }
}

static const float X[3] = {1.5f, -2, 4};

/* Appends the entries x = X and label = 3. */
static void x_and_label(pb *feats) {
  const int64_t y = 3;
  floats_entry(feats, "x", X, 3);
  ints_entry(feats, "label", &y, 1);
}

/* The usual Example: packed lists, in spec order. */
static void usual(pb *ex, const int64_t *ids, int nids, int64_t cat) {
  pb feats = {0};
  x_and_label(&feats);
  ints_entry(&feats, "ids", ids, nids);
  ints_entry(&feats, "cat", &cat, 1);
  example(ex, &feats);
}

static void packed_and_unpacked(void **state) {
  dx *f = *state;
  /* ids of 1, 2, 3, 5 and 10 varint bytes */
  int64_t ids[] = {5, 300, 70000, INT64_C(1) << 30, INT64_C(1) << 62};
  pb ex = {0};
  usual(&ex, ids, 5, 6);
  assert_int_equal(dec(f, &ex), 0);
  expect(f, ids, 5, 6);
  /* the same values one per tag, floats as fixed32 (tag 0x0d) */
  pb feats = {0}, l = {0};
  for (int i = 0; i < 3; i++) {
    pb_byte(&l, 0x0d);
    pb_f32(&l, X[i]);
  }
  entry(&feats, "x", 2, &l);
  l.n = 0;
  int64_t y = 3, cat = 6;
  unpacked_ints(&l, &y, 1);
  entry(&feats, "label", 3, &l);
  l.n = 0;
  unpacked_ints(&l, ids, 5);
  entry(&feats, "ids", 3, &l);
  l.n = 0;
  unpacked_ints(&l, &cat, 1);
  entry(&feats, "cat", 3, &l);
  example(&ex, &feats);
  memset(f->rec.x, 0, 3 * sizeof(float));
  assert_int_equal(dec(f, &ex), 0);
  expect(f, ids, 5, 6);
  /* protobuf-c reads the unpacked form the same way */
  Tensorflow__Example *pe = tensorflow__example__unpack(NULL, ex.n, ex.b);
  assert_non_null(pe);
  assert_int_equal(pe->features->feature[2]->value->int64_list->n_value, 5);
  assert_int_equal(pe->features->feature[2]->value->int64_list->value[4],
                   ids[4]);
  tensorflow__example__free_unpacked(pe, NULL);
  /* packed and unpacked runs mixed in one list, and a float label */
  feats.n = 0;
  l.n = 0;
  packed_floats(&l, X, 1);
  pb_byte(&l, 0x0d);
  pb_f32(&l, X[1]);
  packed_floats(&l, X + 2, 1);
  entry(&feats, "x", 2, &l);
  float fy = 3;
  floats_entry(&feats, "label", &fy, 1);
  example(&ex, &feats);
  assert_int_equal(dec(f, &ex), 0);
  expect(f, NULL, 0, -1);
  /* int64 values for a dense feature are read as floats */
  feats.n = 0;
  int64_t xi[3] = {7, -1, 300};
  ints_entry(&feats, "x", xi, 3);
  ints_entry(&feats, "label", &y, 1);
  example(&ex, &feats);
  assert_int_equal(dec(f, &ex), 0);
  assert_true(f->rec.x[0] == 7 && f->rec.x[1] == -1 && f->rec.x[2] == 300);
}

/* Unknown fields at every level, unknown features, and features in
 * another order (cat before ids, label last), a key given twice. */
static void unknown_fields_and_order(void **state) {
  dx *f = *state;
  int64_t ids[] = {11, 12}, cat = 4;
  pb feats = {0}, l = {0}, ex = {0};
  pb_byte(&feats, 0x10); /* Features field 2, varint */
  pb_varint(&feats, 12345);
  l.n = 0;
  packed_ints(&l, &cat, 1);
  pb_byte(&l, 0x15); /* Int64List field 2, fixed32 */
  pb_f32(&l, 1);
  entry(&feats, "cat", 3, &l);
  floats_entry(&feats, "unknown", X, 3);
  /* a map entry with an unknown field and its value before its key */
  {
    pb feat = {0}, ent = {0}, run = {0};
    packed_ints(&run, ids, 2);
    pb_sub(&feat, 3, &run);
    pb_byte(&feat, 0x21); /* Feature field 4, fixed64 */
    pb_bytes(&feat, "12345678", 8);
    pb_sub(&ent, 2, &feat);
    pb_byte(&ent, 0x18); /* entry field 3, varint */
    pb_byte(&ent, 1);
    pb_str(&ent, 1, "ids");
    pb_sub(&feats, 1, &ent);
  }
  x_and_label(&feats);
  ex.n = 0;
  pb_byte(&ex, 0x15); /* Example field 2, fixed32, before Features */
  pb_f32(&ex, 0);
  pb_sub(&ex, 1, &feats);
  pb_str(&ex, 9, "trailing"); /* and a length-delimited one after */
  for (int k = 0; k < 3; k++) { /* the second and third time: predicted */
    assert_int_equal(dec(f, &ex), 0);
    expect(f, ids, 2, 4);
  }
  /* "cat" again at the end: the last one counts */
  int64_t cat2 = 6;
  ints_entry(&feats, "cat", &cat2, 1);
  pb ex2 = {0};
  pb_sub(&ex2, 1, &feats);
  assert_int_equal(dec(f, &ex2), 0);
  expect(f, ids, 2, 6);
  /* "ids" twice in spec order: the second counts */
  feats.n = 0;
  x_and_label(&feats);
  ints_entry(&feats, "ids", &cat, 1);
  ints_entry(&feats, "ids", ids, 2);
  example(&ex, &feats);
  assert_int_equal(dec(f, &ex), 0);
  expect(f, ids, 2, -1);
}

/* Encodes the usual Example, applies `damage` at byte `at` (its offset
 * from the start), decodes, and checks the error. */
static void expect_malformed(dx *f, const pb *ex, const char *feature) {
  assert_int_equal(dec(f, ex), TSR_EFORMAT);
  char want[128];
  snprintf(want, sizeof want, "t.tfrecord: record at byte offset 96: "
           "malformed Example%s%s%s", feature ? " (feature \"" : "",
           feature ? feature : "", feature ? "\")" : "");
  if (!strstr(f->err, want)) fail_msg("\"%s\" lacks \"%s\"", f->err, want);
}

/* The Example of `feats` is a malformed one (feature: the one named). */
static void feats_malformed(dx *f, const pb *feats, const char *feature) {
  pb ex = {0};
  example(&ex, feats);
  expect_malformed(f, &ex, feature);
}

static void damaged_varints_and_lengths(void **state) {
  dx *f = *state;
  int64_t ids[] = {300};
  pb ex = {0}, feats = {0}, run = {0};
  /* an id varint of 11 bytes */
  x_and_label(&feats);
  size_t keep = feats.n;
  for (int i = 0; i < 10; i++) pb_byte(&run, 0x81);
  pb_byte(&run, 0x01);
  run_entry(&feats, "ids", 3, &run);
  feats_malformed(f, &feats, "ids");
  /* an id varint cut by the end of its run (continuation bit last) */
  feats.n = keep;
  run.n = 0;
  pb_byte(&run, 0x05);
  pb_byte(&run, 0x85);
  run_entry(&feats, "ids", 3, &run);
  feats_malformed(f, &feats, "ids");
  /* a packed float run that is not a multiple of 4 bytes */
  feats.n = 0;
  run.n = 0;
  pb_bytes(&run, "abcdefghij", 10);
  run_entry(&feats, "x", 2, &run);
  feats_malformed(f, &feats, "x");
  /* a wire type that does not exist (6) in a Feature */
  feats.n = 0;
  {
    pb feat = {0}, ent = {0};
    pb_byte(&feat, 0x0e);
    pb_byte(&feat, 0);
    pb_str(&ent, 1, "x");
    pb_sub(&ent, 2, &feat);
    pb_sub(&feats, 1, &ent);
  }
  feats_malformed(f, &feats, "x");
  /* lengths past the end: of the ids run inside its list, of a map entry
   * inside Features, of Features inside the Example */
  usual(&ex, ids, 1, 2);
  size_t at = 0;
  for (size_t i = 0; i + 3 < ex.n; i++) /* the ids key, then the run */
    if (!memcmp(ex.b + i, "ids", 3)) at = i;
  assert_true(at > 0);
  /* ids entry: "ids" 0x12 L 0x1a L 0x0a L id id */
  assert_int_equal(ex.b[at + 7], 0x0a);
  ex.b[at + 8] = 3; /* run of 2 bytes said to be 3 */
  expect_malformed(f, &ex, "ids");
  usual(&ex, ids, 1, 2);
  ex.b[3] = 0x7f; /* the first map entry's length */
  expect_malformed(f, &ex, NULL);
  usual(&ex, ids, 1, 2);
  ex.b[1] = (uint8_t)(ex.b[1] + 1); /* Features one byte longer */
  expect_malformed(f, &ex, NULL);
  /* a length varint of 11 bytes at the top */
  ex.n = 0;
  pb_byte(&ex, 0x0a);
  for (int i = 0; i < 10; i++) pb_byte(&ex, 0xff);
  pb_byte(&ex, 0x01);
  expect_malformed(f, &ex, NULL);
}

/* The usual shape and the general path give the same errors: a wrong
 * type, a wrong count, an id outside the vocabulary, a feature absent. */
/* Decoding `ex` fails with `code` and a message holding `want`. */
static void expect_err(dx *f, const pb *ex, int code, const char *want) {
  assert_int_equal(dec(f, ex), code);
  if (!strstr(f->err, want)) fail_msg("\"%s\" lacks \"%s\"", f->err, want);
}

static void checks_on_both_paths(void **state) {
  dx *f = *state;
  int64_t ids[] = {1};
  pb ex = {0};
  usual(&ex, ids, 1, 7);
  expect_err(f, &ex, TSR_ERANGE,
             "t.tfrecord: record at byte offset 96: feature \"cat\": id 7 "
             "is outside its vocabulary [0, 7)");
  int64_t neg[] = {-1};
  usual(&ex, neg, 1, 1); /* ids has no vocabulary, but ids are >= 0 */
  expect_err(f, &ex, TSR_ERANGE, "feature \"ids\": id -1 is outside");
  pb feats = {0};
  floats_entry(&feats, "x", X, 2);
  example(&ex, &feats);
  expect_err(f, &ex, TSR_ESHAPE, "feature \"x\" has 2 values, expected 3");
  feats.n = 0;
  floats_entry(&feats, "x", X, 3);
  example(&ex, &feats);
  expect_err(f, &ex, TSR_ENOTFOUND, "feature \"label\" is absent");
  floats_entry(&feats, "label", X, 1);
  floats_entry(&feats, "ids", X, 1);
  example(&ex, &feats);
  expect_err(f, &ex, TSR_EDTYPE,
             "feature \"ids\" is a float_list, expected int64_list");
}

/* ---- straight into a batch row ----------------------------------------- */

/* Four rows of a batch: x, y, and the columns of ids and cat, each given
 * room for one id so that rows grow them. */
typedef struct {
  float x[4 * 3], y[4];
  int64_t *ids[2], offs0[5], offs1[5], *offs[2];
  size_t cap[2];
  int grown;
} rows;

static int rows_grow(void *ctx, int f, size_t need) {
  rows *b = ctx;
  int64_t *n = realloc(b->ids[f], need * sizeof(int64_t));
  if (!n) return TSR_ENOMEM;
  b->ids[f] = n;
  b->cap[f] = need;
  b->grown++;
  return 0;
}

static void rows_init(rows *b) {
  memset(b, 0, sizeof *b);
  for (int f = 0; f < 2; f++) {
    b->cap[f] = 1;
    b->ids[f] = malloc(sizeof(int64_t));
  }
  b->offs[0] = b->offs0;
  b->offs[1] = b->offs1;
}

static int dec_row(dx *f, rows *b, int row, const pb *ex) {
  const wk_row o = {b->x + 3 * row, b->y + row, b->ids, b->offs, b->cap,
                    row, rows_grow, b};
  f->err[0] = 0;
  return wk_tfr__decode_row(&f->dec, ex->b, ex->n, &o, "t.tfrecord", 96,
                            f->err, sizeof f->err);
}

/* Features in the usual order, in another order, with a sparse feature
 * absent and with keys given twice (the last counts) land in their
 * columns; rows that need more room grow a column and keep the rows
 * before. */
static void rows_any_order(void **state) {
  dx *f = *state;
  rows b;
  rows_init(&b);
  pb ex = {0}, feats = {0};
  int64_t ids0[] = {5, 300}, ids1[] = {7}, ids3[] = {8, 70000}, one = 1;
  int64_t cat[] = {6, 2, 1, 3}, y = 3;
  usual(&ex, ids0, 2, cat[0]);
  assert_int_equal(dec_row(f, &b, 0, &ex), 0);
  /* cat, ids, label, x */
  ints_entry(&feats, "cat", &cat[1], 1);
  ints_entry(&feats, "ids", ids1, 1);
  ints_entry(&feats, "label", &y, 1);
  floats_entry(&feats, "x", X, 3);
  example(&ex, &feats);
  assert_int_equal(dec_row(f, &b, 1, &ex), 0);
  /* ids absent: an empty list */
  feats.n = 0;
  x_and_label(&feats);
  ints_entry(&feats, "cat", &cat[2], 1);
  example(&ex, &feats);
  assert_int_equal(dec_row(f, &b, 2, &ex), 0);
  /* ids and x twice: the second of each counts */
  feats.n = 0;
  const float x0[3] = {9, 9, 9};
  floats_entry(&feats, "x", x0, 3);
  ints_entry(&feats, "ids", &one, 1);
  x_and_label(&feats);
  ints_entry(&feats, "ids", ids3, 2);
  ints_entry(&feats, "cat", &cat[3], 1);
  example(&ex, &feats);
  assert_int_equal(dec_row(f, &b, 3, &ex), 0);
  for (int r = 0; r < 4; r++) {
    assert_memory_equal(b.x + 3 * r, X, sizeof X);
    assert_true(b.y[r] == 3);
  }
  const int64_t want_ids[] = {5, 300, 7, 8, 70000}, want_offs[] = {0, 2, 3,
                                                                   3, 5};
  assert_memory_equal(b.offs0, want_offs, sizeof want_offs);
  assert_memory_equal(b.ids[0], want_ids, sizeof want_ids);
  for (int r = 0; r < 4; r++) {
    assert_int_equal(b.offs1[r + 1], r + 1);
    assert_int_equal(b.ids[1][r], cat[r]);
  }
  assert_true(b.grown > 0);
  free(b.ids[0]);
  free(b.ids[1]);
}

/* After the usual order has been learnt, a feature of the wrong length,
 * of the wrong type or absent at its usual place, and an ids run whose
 * length disagrees with its list's, are refused with the feature named. */
static void rows_refused(void **state) {
  dx *f = *state;
  rows b;
  rows_init(&b);
  int64_t ids[] = {5, 300}, cat = 2;
  pb ex = {0}, feats = {0};
  usual(&ex, ids, 2, cat);
  assert_int_equal(dec_row(f, &b, 0, &ex), 0);
  const int64_t y = 3;
  floats_entry(&feats, "x", X, 2);
  ints_entry(&feats, "label", &y, 1);
  ints_entry(&feats, "ids", ids, 2);
  ints_entry(&feats, "cat", &cat, 1);
  example(&ex, &feats);
  assert_int_equal(dec_row(f, &b, 1, &ex), TSR_ESHAPE);
  assert_non_null(strstr(f->err, "t.tfrecord: record at byte offset 96: "
                                 "feature \"x\" has 2 values, expected 3"));
  feats.n = 0;
  x_and_label(&feats);
  floats_entry(&feats, "ids", X, 2);
  example(&ex, &feats);
  assert_int_equal(dec_row(f, &b, 1, &ex), TSR_EDTYPE);
  assert_non_null(strstr(f->err, "feature \"ids\" is a float_list"));
  feats.n = 0;
  ints_entry(&feats, "label", &y, 1);
  ints_entry(&feats, "ids", ids, 2);
  example(&ex, &feats);
  assert_int_equal(dec_row(f, &b, 1, &ex), TSR_ENOTFOUND);
  assert_non_null(strstr(f->err, "t.tfrecord: record at byte offset 96: "
                                 "feature \"x\" is absent from the "
                                 "Example"));
  /* as many entries as features, one key twice and "x" absent: refused
   * also the second time, when every entry is where it was */
  feats.n = 0;
  ints_entry(&feats, "label", &y, 1);
  ints_entry(&feats, "ids", ids, 2);
  ints_entry(&feats, "cat", &cat, 1);
  ints_entry(&feats, "ids", ids, 2);
  example(&ex, &feats);
  for (int k = 0; k < 2; k++) {
    assert_int_equal(dec_row(f, &b, 1, &ex), TSR_ENOTFOUND);
    assert_non_null(strstr(f->err, "feature \"x\" is absent"));
  }
  /* ids entry: "ids" 0x12 VL 0x1a L2 0x0a L3 05 ac 02; L3 one short */
  usual(&ex, ids, 2, cat);
  size_t at = 0;
  for (size_t i = 0; i + 3 < ex.n; i++)
    if (!memcmp(ex.b + i, "ids", 3)) at = i;
  assert_int_equal(ex.b[at + 7], 0x0a);
  ex.b[at + 8]--;
  assert_int_equal(dec_row(f, &b, 1, &ex), TSR_EFORMAT);
  assert_non_null(strstr(f->err, "malformed Example (feature \"ids\")"));
  free(b.ids[0]);
  free(b.ids[1]);
}

/* Every prefix and every one-byte change of an Example: decoded or
 * refused with a known code, never read outside (ASan). The bytes are
 * copied to a buffer of exactly their size each time. */
static void every_truncation_and_flip(void **state) {
  dx *f = *state;
  int64_t ids[] = {5, 300, 70000};
  pb ex = {0};
  usual(&ex, ids, 3, 2);
  for (size_t n = 0; n <= ex.n; n++) {
    for (int flip = -1; flip < (int)n; flip++) {
      uint8_t *b = malloc(n ? n : 1);
      memcpy(b, ex.b, n);
      if (flip >= 0) b[flip] ^= (uint8_t)(0x80 | (flip * 37));
      f->err[0] = 0;
      int rc = wk_tfr__decode(&f->dec, b, n, &f->rec, "t.tfrecord", 0,
                              f->err, sizeof f->err);
      free(b);
      if (rc != 0 && rc != TSR_EFORMAT && rc != TSR_ENOTFOUND &&
          rc != TSR_ESHAPE && rc != TSR_EDTYPE && rc != TSR_ERANGE)
        fail_msg("length %zu, flip %d: %d %s", n, flip, rc, f->err);
      if (rc) assert_non_null(strstr(f->err, "t.tfrecord: record at"));
    }
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(packed_and_unpacked, dx_setup,
                                      dx_teardown),
      cmocka_unit_test_setup_teardown(unknown_fields_and_order, dx_setup,
                                      dx_teardown),
      cmocka_unit_test_setup_teardown(damaged_varints_and_lengths, dx_setup,
                                      dx_teardown),
      cmocka_unit_test_setup_teardown(checks_on_both_paths, dx_setup,
                                      dx_teardown),
      cmocka_unit_test_setup_teardown(every_truncation_and_flip, dx_setup,
                                      dx_teardown),
      cmocka_unit_test_setup_teardown(rows_any_order, dx_setup, dx_teardown),
      cmocka_unit_test_setup_teardown(rows_refused, dx_setup, dx_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
