/* npy, npz and IDX readers against files the test writes (npz members
 * stored and deflated, IDX plain and gzipped), their bad inputs (dtype
 * mismatch, npz member missing, IDX magic wrong), and Fashion-MNIST from
 * Debian's dataset-fashion-mnist through tests/data/fashion_mnist_job.json. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "../cmocka_skip.h"

#include <math.h>
#include <sys/stat.h>
#include <zlib.h>

#include "input_test.h"

static int open_train(fx *f, const char *train, int64_t batch) {
  char job[2048];
  wk_input_close(f->in);
  f->in = NULL;
  tsr_job_free(&f->job);
  snprintf(job, sizeof job,
           "{\"loss\": \"sparse_categorical_crossentropy\", \"data\": "
           "{\"train\": %s}}",
           train);
  int rc = tjob(f->dir, job, &f->job, f->err, sizeof f->err);
  if (rc) return rc;
  wk_input_opts o = topts(1, 0, batch, 1, 7);
  return wk_input_open(&f->job, WK_SPLIT_TRAIN, &o, &f->in, f->err,
                       sizeof f->err);
}

/* An .npy image: header padded to 64 bytes, then the values. */
static size_t make_npy(uint8_t *out, const char *descr, const char *shape,
                       const void *data, size_t nbytes) {
  char h[256];
  int hl = snprintf(h, sizeof h,
                    "{'descr': '%s', 'fortran_order': False, 'shape': %s, }",
                    descr, shape);
  int total = 10 + hl + 1;
  int pad = (64 - total % 64) % 64;
  memcpy(out, "\x93NUMPY\x01\x00", 8);
  out[8] = (uint8_t)((hl + pad + 1) & 0xff);
  out[9] = (uint8_t)((hl + pad + 1) >> 8);
  memcpy(out + 10, h, (size_t)hl);
  memset(out + 10 + hl, ' ', (size_t)pad);
  out[10 + hl + pad] = '\n';
  memcpy(out + 10 + hl + pad + 1, data, nbytes);
  return (size_t)(10 + hl + pad + 1) + nbytes;
}

static void put16(uint8_t *p, uint32_t v) { p[0] = v & 0xff; p[1] = (v >> 8) & 0xff; }
static void put32(uint8_t *p, uint32_t v) { put16(p, v & 0xffff); put16(p + 2, v >> 16); }

/* A zip of (name, bytes) members; `deflate_them` picks method 8. */
static size_t make_zip(uint8_t *out, int n, const char *const *names,
                       const uint8_t *const *data, const size_t *len,
                       bool deflate_them) {
  size_t at = 0, lho[8], csz[8];
  uint32_t crcs[8];
  for (int i = 0; i < n; i++) {
    crcs[i] = (uint32_t)crc32(0, data[i], (uInt)len[i]);
    size_t fnl = strlen(names[i]);
    uint8_t *h = out + at;
    lho[i] = at;
    memset(h, 0, 30);
    put32(h, 0x04034b50);
    put16(h + 4, 20);
    put16(h + 8, deflate_them ? 8 : 0);
    put32(h + 14, crcs[i]);
    put32(h + 22, (uint32_t)len[i]);
    put16(h + 26, (uint32_t)fnl);
    memcpy(h + 30, names[i], fnl);
    uint8_t *d = h + 30 + fnl;
    if (deflate_them) {
      z_stream zs = {0};
      assert_int_equal(deflateInit2(&zs, 6, Z_DEFLATED, -15, 8,
                                    Z_DEFAULT_STRATEGY), Z_OK);
      zs.next_in = (Bytef *)data[i];
      zs.avail_in = (uInt)len[i];
      zs.next_out = d;
      zs.avail_out = (uInt)(len[i] + 1024);
      assert_int_equal(deflate(&zs, Z_FINISH), Z_STREAM_END);
      csz[i] = zs.total_out;
      deflateEnd(&zs);
    } else {
      memcpy(d, data[i], len[i]);
      csz[i] = len[i];
    }
    put32(h + 18, (uint32_t)csz[i]);
    at += 30 + fnl + csz[i];
  }
  size_t cd = at;
  for (int i = 0; i < n; i++) {
    size_t fnl = strlen(names[i]);
    uint8_t *h = out + at;
    memset(h, 0, 46);
    put32(h, 0x02014b50);
    put16(h + 4, 20);
    put16(h + 6, 20);
    put16(h + 10, deflate_them ? 8 : 0);
    put32(h + 16, crcs[i]);
    put32(h + 20, (uint32_t)csz[i]);
    put32(h + 24, (uint32_t)len[i]);
    put16(h + 28, (uint32_t)fnl);
    put32(h + 42, (uint32_t)lho[i]);
    memcpy(h + 46, names[i], fnl);
    at += 46 + fnl;
  }
  uint8_t *e = out + at;
  memset(e, 0, 22);
  put32(e, 0x06054b50);
  put16(e + 8, (uint32_t)n);
  put16(e + 10, (uint32_t)n);
  put32(e + 12, (uint32_t)(at - cd));
  put32(e + 16, (uint32_t)cd);
  return at + 22;
}

static void npy_dtypes(void **state) {
  fx *f = *state;
  static uint8_t buf[4096];
  float xf[6] = {1.5f, -2, 3, 4, 5, 6.25f};
  double xd[6] = {1.5, -2, 3, 4, 5, 6.25};
  int32_t xi[6] = {1, -2, 3, 4, 5, 6};
  int64_t xl[6] = {1, -2, 3, 4, 5, 6};
  int64_t y[3] = {2, 0, 1};
  size_t n = make_npy(buf, "<i8", "(3,)", y, sizeof y);
  twrite(f->dir, "y.npy", buf, n);
  struct { const char *descr; const void *d; size_t nb; float want1; } c[] = {
      {"<f4", xf, sizeof xf, -2}, {"<f8", xd, sizeof xd, -2},
      {"<i4", xi, sizeof xi, -2}, {"<i8", xl, sizeof xl, -2}};
  for (size_t k = 0; k < 4; k++) {
    n = make_npy(buf, c[k].descr, "(3, 2)", c[k].d, c[k].nb);
    twrite(f->dir, "x.npy", buf, n);
    assert_int_equal(open_train(f, "{\"format\": \"npy\", \"paths\": "
                                   "\"x.npy\", \"labels\": \"y.npy\"}",
                                4),
                     0);
    const wk_input_schema *s = wk_input_get_schema(f->in);
    assert_int_equal(s->n_dense, 2);
    assert_int_equal(s->n_classes, 3);
    const wk_batch *b;
    assert_int_equal(wk_input_next(f->in, &b), 0);
    assert_int_equal(b->n, 3);
    assert_true(b->x[0] == (k < 2 ? 1.5f : 1.0f));
    assert_true(b->x[1] == c[k].want1 && b->x[4] == 5);
    assert_true(b->y[0] == 2 && b->y[1] == 0 && b->y[2] == 1);
  }
  /* uint8 images (N, 2, 2) flatten to 4 features */
  uint8_t img[12] = {0, 1, 2, 255, 4, 5, 6, 7, 8, 9, 10, 11};
  n = make_npy(buf, "|u1", "(3, 2, 2)", img, sizeof img);
  twrite(f->dir, "x.npy", buf, n);
  assert_int_equal(open_train(f, "{\"format\": \"npy\", \"paths\": \"x.npy\", "
                                 "\"labels\": \"y.npy\", \"scale\": 0.5}",
                              4),
                   0);
  const wk_batch *b;
  assert_int_equal(wk_input_next(f->in, &b), 0);
  assert_int_equal(b->n_dense, 4);
  assert_true(b->x[3] == 127.5f && b->x[11] == 5.5f);
}

/* keras.utils.to_categorical labels: (N, C) one-hot rows are class
 * indices; soft rows are refused with the row named. */
static void npy_onehot_labels(void **state) {
  fx *f = *state;
  static uint8_t buf[4096];
  float x[6] = {1, 2, 3, 4, 5, 6};
  float y[9] = {0, 0, 1, 1, 0, 0, 0, 1, 0};
  twrite(f->dir, "x.npy", buf, make_npy(buf, "<f4", "(3, 2)", x, sizeof x));
  twrite(f->dir, "y.npy", buf, make_npy(buf, "<f4", "(3, 3)", y, sizeof y));
  assert_int_equal(open_train(f, "{\"format\": \"npy\", \"paths\": "
                                 "\"x.npy\", \"labels\": \"y.npy\"}",
                              4),
                   0);
  assert_int_equal(wk_input_get_schema(f->in)->n_classes, 3);
  const wk_batch *b;
  assert_int_equal(wk_input_next(f->in, &b), 0);
  assert_true(b->y[0] == 2 && b->y[1] == 0 && b->y[2] == 1);
  y[4] = 0.5f; /* row 1 is now soft */
  twrite(f->dir, "y.npy", buf, make_npy(buf, "<f4", "(3, 3)", y, sizeof y));
  assert_int_equal(open_train(f, "{\"format\": \"npy\", \"paths\": "
                                 "\"x.npy\", \"labels\": \"y.npy\"}",
                              4),
                   TSR_EINVAL);
  assert_non_null(strstr(f->err, "row 1 of the (N, 3) labels is not one-hot"));
}

static void npy_bad(void **state) {
  fx *f = *state;
  static uint8_t buf[4096];
  float x[6] = {0};
  int64_t y[3] = {0, 1, 2};
  twrite(f->dir, "y.npy", buf, make_npy(buf, "<i8", "(3,)", y, sizeof y));
  /* dtype mismatch: big-endian and half floats are refused by name */
  const char *bad[] = {">f4", "<f2"};
  for (int k = 0; k < 2; k++) {
    twrite(f->dir, "x.npy", buf, make_npy(buf, bad[k], "(3, 2)", x, 12));
    assert_int_equal(open_train(f, "{\"format\": \"npy\", \"paths\": "
                                   "\"x.npy\", \"labels\": \"y.npy\"}",
                                4),
                     TSR_EDTYPE);
    assert_non_null(strstr(f->err, "x.npy"));
    assert_non_null(strstr(f->err, bad[k]));
  }
  /* rows differ */
  twrite(f->dir, "x.npy", buf, make_npy(buf, "<f4", "(2, 3)", x, 24));
  assert_int_equal(open_train(f, "{\"format\": \"npy\", \"paths\": \"x.npy\", "
                                 "\"labels\": \"y.npy\"}",
                              4),
                   TSR_ESHAPE);
  /* truncated data */
  size_t n = make_npy(buf, "<f4", "(3, 2)", x, 24);
  twrite(f->dir, "x.npy", buf, n - 4);
  assert_int_equal(open_train(f, "{\"format\": \"npy\", \"paths\": \"x.npy\", "
                                 "\"labels\": \"y.npy\"}",
                              4),
                   TSR_EFORMAT);
  assert_non_null(strstr(f->err, "truncated"));
  /* not an npy */
  twrites(f->dir, "x.npy", "hello, world");
  assert_int_equal(open_train(f, "{\"format\": \"npy\", \"paths\": \"x.npy\", "
                                 "\"labels\": \"y.npy\"}",
                              4),
                   TSR_EFORMAT);
  assert_non_null(strstr(f->err, "magic"));
}

static void npz_members(void **state) {
  fx *f = *state;
  static uint8_t xb[4096], yb[4096], zip[16384];
  float x[400];
  int32_t y[100];
  for (int i = 0; i < 400; i++) x[i] = (float)i * 0.5f;
  for (int i = 0; i < 100; i++) y[i] = i % 10;
  size_t xl = make_npy(xb, "<f4", "(100, 4)", x, sizeof x);
  size_t yl = make_npy(yb, "<i4", "(100, 1)", y, sizeof y);
  const char *names[] = {"x_train.npy", "y_train.npy"};
  const uint8_t *data[] = {xb, yb};
  size_t lens[] = {xl, yl};
  for (int deflated = 0; deflated < 2; deflated++) {
    size_t zl = make_zip(zip, 2, names, data, lens, deflated);
    twrite(f->dir, "d.npz", zip, zl);
    assert_int_equal(open_train(f, "{\"format\": \"npz\", \"paths\": "
                                   "\"d.npz\", \"features\": \"x_train\", "
                                   "\"label\": \"y_train\"}",
                                64),
                     0);
    float ys[100], x0[100];
    assert_int_equal(tdrain(f->in, ys, x0, 100, NULL), 100);
    for (int i = 0; i < 100; i++) {
      assert_true(ys[i] == (float)(i % 10));
      assert_true(x0[i] == (float)(4 * i) * 0.5f);
    }
  }
  /* a member that is not there: named, with the members listed */
  assert_int_equal(open_train(f, "{\"format\": \"npz\", \"paths\": \"d.npz\", "
                                 "\"features\": \"x_train\"}",
                              64),
                   TSR_ENOTFOUND);
  assert_non_null(strstr(f->err, "d.npz: member \"y\" is not in the archive"));
  assert_non_null(strstr(f->err, "x_train.npy, y_train.npy"));
  /* a corrupt member fails its CRC */
  size_t zl = make_zip(zip, 2, names, data, lens, false);
  zip[200] ^= 0x40;
  twrite(f->dir, "d.npz", zip, zl);
  assert_int_equal(open_train(f, "{\"format\": \"npz\", \"paths\": \"d.npz\", "
                                 "\"features\": \"x_train\", \"label\": "
                                 "\"y_train\"}",
                              64),
                   TSR_ECORRUPT);
  assert_non_null(strstr(f->err, "CRC"));
}

static size_t make_idx(uint8_t *out, int type, int ndim, const uint32_t *dims,
                       const void *data, size_t nbytes) {
  out[0] = out[1] = 0;
  out[2] = (uint8_t)type;
  out[3] = (uint8_t)ndim;
  for (int i = 0; i < ndim; i++) {
    out[4 + 4 * i] = (uint8_t)(dims[i] >> 24);
    out[5 + 4 * i] = (uint8_t)(dims[i] >> 16);
    out[6 + 4 * i] = (uint8_t)(dims[i] >> 8);
    out[7 + 4 * i] = (uint8_t)dims[i];
  }
  memcpy(out + 4 + 4 * ndim, data, nbytes);
  return 4 + 4 * (size_t)ndim + nbytes;
}

static void gz_write(const char *path, const void *p, size_t n) {
  gzFile g = gzopen(path, "wb");
  assert_non_null(g);
  assert_int_equal(gzwrite(g, p, (unsigned)n), (int)n);
  gzclose(g);
}

static void idx_plain_and_gzip(void **state) {
  fx *f = *state;
  static uint8_t img[5 * 3 * 2], lab[5], buf[1024];
  for (int i = 0; i < 30; i++) img[i] = (uint8_t)(i * 7);
  for (int i = 0; i < 5; i++) lab[i] = (uint8_t)(4 - i);
  uint32_t di[3] = {5, 3, 2}, dl[1] = {5};
  size_t n = make_idx(buf, 0x08, 3, di, img, sizeof img);
  twrite(f->dir, "im-idx3-ubyte", buf, n);
  gz_write(tpath(f->dir, "im-idx3-ubyte.gz"), buf, n);
  n = make_idx(buf, 0x08, 1, dl, lab, sizeof lab);
  twrite(f->dir, "lb-idx1-ubyte", buf, n);
  gz_write(tpath(f->dir, "lb-idx1-ubyte.gz"), buf, n);
  const char *specs[] = {
      "{\"paths\": \"im-idx3-ubyte\", \"labels\": \"lb-idx1-ubyte\"}",
      "{\"format\": \"idx\", \"paths\": \"im-idx3-ubyte.gz\", \"labels\": "
      "\"lb-idx1-ubyte.gz\"}"};
  for (int k = 0; k < 2; k++) {
    assert_int_equal(open_train(f, specs[k], 2), 0);
    const wk_input_schema *s = wk_input_get_schema(f->in);
    assert_int_equal(s->n_dense, 6);
    assert_int_equal(s->n_examples, 5);
    assert_int_equal(s->n_classes, 5);
    const wk_batch *b;
    assert_int_equal(wk_input_next(f->in, &b), 0);
    assert_true(b->x[6 + 5] == (float)(11 * 7));
    assert_true(b->y[0] == 4 && b->y[1] == 3);
  }
  /* big-endian float images */
  float fv[2] = {1.25f, -3};
  uint8_t be[8];
  for (int i = 0; i < 2; i++) {
    uint32_t u;
    memcpy(&u, &fv[i], 4);
    be[4 * i] = (uint8_t)(u >> 24);
    be[4 * i + 1] = (uint8_t)(u >> 16);
    be[4 * i + 2] = (uint8_t)(u >> 8);
    be[4 * i + 3] = (uint8_t)u;
  }
  uint32_t df[2] = {2, 1}, dl2[1] = {2};
  twrite(f->dir, "f-idx2-float", buf, make_idx(buf, 0x0D, 2, df, be, 8));
  twrite(f->dir, "l2-idx1-ubyte", buf, make_idx(buf, 0x08, 1, dl2, lab, 2));
  assert_int_equal(open_train(f, "{\"format\": \"idx\", \"paths\": "
                                 "\"f-idx2-float\", \"labels\": "
                                 "\"l2-idx1-ubyte\"}",
                              2),
                   0);
  const wk_batch *b;
  assert_int_equal(wk_input_next(f->in, &b), 0);
  assert_true(b->x[0] == 1.25f && b->x[1] == -3);
}

static void idx_bad(void **state) {
  fx *f = *state;
  static uint8_t buf[256];
  uint8_t lab[3] = {0, 1, 2};
  uint32_t dl[1] = {3}, di[3] = {3, 2, 2};
  twrite(f->dir, "lb-idx1-ubyte", buf, make_idx(buf, 0x08, 1, dl, lab, 3));
  uint8_t img[12] = {0};
  size_t n = make_idx(buf, 0x08, 3, di, img, 12);
  buf[1] = 0x08; /* magic wrong */
  twrite(f->dir, "im-idx3-ubyte", buf, n);
  assert_int_equal(open_train(f, "{\"format\": \"idx\", \"paths\": "
                                 "\"im-idx3-ubyte\", \"labels\": "
                                 "\"lb-idx1-ubyte\"}",
                              2),
                   TSR_EFORMAT);
  assert_non_null(strstr(f->err, "im-idx3-ubyte: not an IDX file"));
  assert_non_null(strstr(f->err, "0x00080803"));
  /* counts differ */
  uint32_t di4[3] = {4, 2, 2};
  uint8_t img4[16] = {0};
  twrite(f->dir, "im-idx3-ubyte", buf, make_idx(buf, 0x08, 3, di4, img4, 16));
  assert_int_equal(open_train(f, "{\"format\": \"idx\", \"paths\": "
                                 "\"im-idx3-ubyte\", \"labels\": "
                                 "\"lb-idx1-ubyte\"}",
                              2),
                   TSR_ESHAPE);
  assert_non_null(strstr(f->err, "4 items"));
  /* truncated */
  n = make_idx(buf, 0x08, 3, di, img, 12);
  twrite(f->dir, "im-idx3-ubyte", buf, n - 1);
  assert_int_equal(open_train(f, "{\"format\": \"idx\", \"paths\": "
                                 "\"im-idx3-ubyte\", \"labels\": "
                                 "\"lb-idx1-ubyte\"}",
                              2),
                   TSR_EFORMAT);
  assert_non_null(strstr(f->err, "truncated"));
}

static void fashion_mnist_job(void **state) {
  fx *f = *state;
  struct stat st;
  if (stat("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz",
           &st) != 0) {
    print_message("Fashion-MNIST is not installed (Debian package "
                  "dataset-fashion-mnist)\n");
    TSR_SKIP();
  }
  char path[4096];
  const char *src = getenv("TSR_SOURCE_DIR");
  snprintf(path, sizeof path, "%s/tests/data/fashion_mnist_job.json",
           src ? src : "..");
  assert_int_equal(tsr_job_load(path, NULL, &f->job, f->err, sizeof f->err),
                   0);
  /* two workers under "auto" (one file pair: data sharding) */
  wk_input_opts o = topts(2, 1, 1000, 1, 5);
  assert_int_equal(wk_input_open(&f->job, WK_SPLIT_TRAIN, &o, &f->in, f->err,
                                 sizeof f->err),
                   0);
  const wk_input_schema *s = wk_input_get_schema(f->in);
  assert_int_equal(s->n_dense, 784);
  assert_int_equal(s->n_classes, 10);
  assert_int_equal(s->n_examples, 30000);
  assert_int_equal(s->n_total, 60000);
  const wk_batch *b;
  int64_t counts[10] = {0}, n = 0;
  float mx = 0;
  while (wk_input_next(f->in, &b) == 0) {
    for (int64_t i = 0; i < b->n; i++) counts[(int)b->y[i]]++;
    for (int64_t i = 0; i < b->n * 784; i++)
      if (b->x[i] > mx) mx = b->x[i];
    n += b->n;
  }
  assert_int_equal(n, 30000);
  assert_true(mx <= 1.0f && mx > 0.99f); /* pixel / 255 */
  for (int c = 0; c < 10; c++) /* 6000 per class, about half here */
    assert_true(counts[c] > 2700 && counts[c] < 3300);
  wk_input_close(f->in);
  f->in = NULL;
  o = topts(1, 0, 1000, 1, 5);
  assert_int_equal(wk_input_open(&f->job, WK_SPLIT_EVAL, &o, &f->in, f->err,
                                 sizeof f->err),
                   0);
  assert_int_equal(wk_input_get_schema(f->in)->n_examples, 10000);
  assert_int_equal(tdrain(f->in, NULL, NULL, 0, NULL), 10000);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(npy_dtypes, setup, teardown),
      cmocka_unit_test_setup_teardown(npy_onehot_labels, setup, teardown),
      cmocka_unit_test_setup_teardown(npy_bad, setup, teardown),
      cmocka_unit_test_setup_teardown(npz_members, setup, teardown),
      cmocka_unit_test_setup_teardown(idx_plain_and_gzip, setup, teardown),
      cmocka_unit_test_setup_teardown(idx_bad, setup, teardown),
      cmocka_unit_test_setup_teardown(fashion_mnist_job, setup, teardown),
  };
  return tsr_cmocka_exit(cmocka_run_group_tests(tests, NULL, NULL));
}
