/* TFRecord forms TensorFlow users have: int64_list features read as
 * floats, bytes_list features decoded as raw uint8 / float32 (the
 * tutorial's image_raw) or as PNG / JPEG images (written here with libpng
 * and libjpeg), ZLIB-compressed files (and a plain file whose first bytes
 * happen to look like a zlib header), TFDS shard names recognised without
 * a format, and the errors of a bytes feature that does not fit. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <jpeglib.h>
#include <png.h>
#include <zlib.h>

#include "input_test.h"
#include "tfr_write.h"

static char *test_slurp_bytes(const char *path, size_t *n) {
  FILE *fp = fopen(path, "rb");
  assert_non_null(fp);
  fseek(fp, 0, SEEK_END);
  long sz = ftell(fp);
  fseek(fp, 0, SEEK_SET);
  char *b = malloc((size_t)sz + 1);
  assert_int_equal(fread(b, 1, (size_t)sz, fp), (size_t)sz);
  fclose(fp);
  *n = (size_t)sz;
  return b;
}

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

/* One record per image: "img" (bytes), "n" (int64 x2), "label". */
static void write_records(const char *path, const uint8_t *const *img,
                          const size_t *len, int count) {
  FILE *fp = fopen(path, "wb");
  assert_non_null(fp);
  for (int r = 0; r < count; r++) {
    int64_t n2[2] = {r, -3 * r}, label = r;
    tfrw_feat fs[] = {{"img", TFRW_BYTES, len[r], (const float *)img[r], NULL},
                      {"n", TFRW_INT64, 2, NULL, n2},
                      {"label", TFRW_INT64, 1, NULL, &label}};
    size_t dl;
    uint8_t *d = tfrw_pack(fs, 3, &dl);
    tfrw_frame(fp, d, dl);
    free(d);
  }
  fclose(fp);
}

static uint8_t *png_of(const uint8_t *px, int w, int h, int c, size_t *len) {
  png_image im;
  memset(&im, 0, sizeof im);
  im.version = PNG_IMAGE_VERSION;
  im.width = (png_uint_32)w;
  im.height = (png_uint_32)h;
  im.format = c == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB;
  png_alloc_size_t n = 0;
  assert_true(png_image_write_to_memory(&im, NULL, &n, 0, px, 0, NULL));
  uint8_t *out = malloc(n);
  assert_true(png_image_write_to_memory(&im, out, &n, 0, px, 0, NULL));
  *len = n;
  return out;
}

static uint8_t *jpeg_of(const uint8_t *px, int w, int h, size_t *len) {
  struct jpeg_compress_struct ci;
  struct jpeg_error_mgr je;
  ci.err = jpeg_std_error(&je);
  jpeg_create_compress(&ci);
  unsigned char *out = NULL;
  unsigned long n = 0;
  jpeg_mem_dest(&ci, &out, &n);
  ci.image_width = (JDIMENSION)w;
  ci.image_height = (JDIMENSION)h;
  ci.input_components = 1;
  ci.in_color_space = JCS_GRAYSCALE;
  jpeg_set_defaults(&ci);
  jpeg_set_quality(&ci, 100, TRUE);
  jpeg_start_compress(&ci, TRUE);
  while (ci.next_scanline < ci.image_height) {
    JSAMPROW row = (JSAMPROW)(px + (size_t)ci.next_scanline * (size_t)w);
    jpeg_write_scanlines(&ci, &row, 1);
  }
  jpeg_finish_compress(&ci);
  jpeg_destroy_compress(&ci);
  *len = n;
  return out;
}

static void raw_png_jpeg_int64(void **state) {
  fx *f = *state;
  enum { W = 4, H = 3 };
  uint8_t g[2][W * H], rgb[W * H * 3];
  for (int i = 0; i < W * H; i++) {
    g[0][i] = (uint8_t)(i * 20);
    g[1][i] = (uint8_t)(255 - i * 20);
  }
  for (int i = 0; i < W * H * 3; i++) rgb[i] = (uint8_t)(i * 7);
  /* raw uint8, with scale 1/255 */
  const uint8_t *im[2] = {g[0], g[1]};
  size_t len[2] = {W * H, W * H};
  write_records(tpath(f->dir, "r.tfrecord"), im, len, 2);
  assert_int_equal(open_spec(f, "{\"paths\": \"r.tfrecord\", \"label\": "
                                "\"label\", \"scale\": 0.5, \"features\": "
                                "[{\"name\": \"img\", \"size\": 12, \"decode\":"
                                " \"raw_uint8\"}, {\"name\": \"n\", \"size\": "
                                "2}]}", 2),
                   0);
  const wk_batch *b;
  assert_int_equal(wk_input_next(f->in, &b), 0);
  assert_int_equal(b->n_dense, 14);
  for (int r = 0; r < 2; r++) {
    for (int i = 0; i < W * H; i++)
      assert_true(b->x[r * 14 + i] == 0.5f * g[r][i]);
    /* int64_list read as floats (then scaled) */
    assert_true(b->x[r * 14 + 12] == 0.5f * r &&
                b->x[r * 14 + 13] == 0.5f * -3 * r);
  }
  /* raw float32 */
  float fv[3] = {1.5f, -2, 1e-3f};
  const uint8_t *fp[1] = {(const uint8_t *)fv};
  size_t fl[1] = {sizeof fv};
  write_records(tpath(f->dir, "f.tfrecord"), fp, fl, 1);
  assert_int_equal(open_spec(f, "{\"paths\": \"f.tfrecord\", \"label\": "
                                "\"label\", \"features\": [{\"name\": \"img\","
                                " \"size\": 3, \"decode\": \"raw_float32\"}]}",
                             1),
                   0);
  assert_int_equal(wk_input_next(f->in, &b), 0);
  assert_true(b->x[0] == 1.5f && b->x[1] == -2 && b->x[2] == 1e-3f);
  /* PNG gray, PNG RGB (the channels from the size), JPEG gray */
  size_t pl[3];
  uint8_t *p0 = png_of(g[0], W, H, 1, &pl[0]);
  uint8_t *p1 = png_of(rgb, W, H, 3, &pl[1]);
  uint8_t *p2 = jpeg_of(g[1], W, H, &pl[2]);
  const uint8_t *pp[3] = {p0, p1, p2};
  for (int k = 0; k < 3; k++) {
    const char *dec[] = {"png", "image", "jpeg"};
    int size = k == 1 ? W * H * 3 : W * H;
    write_records(tpath(f->dir, "i.tfrecord"), &pp[k], &pl[k], 1);
    char spec[512];
    snprintf(spec, sizeof spec,
             "{\"paths\": \"i.tfrecord\", \"label\": \"label\", \"features\": "
             "[{\"name\": \"img\", \"size\": %d, \"decode\": \"%s\"}]}", size,
             dec[k]);
    assert_int_equal(open_spec(f, spec, 1), 0);
    assert_int_equal(wk_input_next(f->in, &b), 0);
    const uint8_t *want = k == 0 ? g[0] : k == 1 ? rgb : g[1];
    for (int i = 0; i < size; i++)
      if (fabsf(b->x[i] - want[i]) > (k == 2 ? 4.0f : 0.0f))
        fail_msg("%s: value %d is %g, want %d", dec[k], i, b->x[i], want[i]);
  }
  /* an image that does not give `size` values; raw bytes of another size */
  snprintf(f->err, sizeof f->err, "%s", "");
  assert_int_equal(open_spec(f, "{\"paths\": \"i.tfrecord\", \"label\": "
                                "\"label\", \"features\": [{\"name\": \"img\","
                                " \"size\": 784, \"decode\": \"jpeg\"}]}", 1),
                   0);
  assert_int_equal(wk_input_next(f->in, &b), TSR_ESHAPE);
  assert_non_null(strstr(wk_input_error(f->in),
                         "feature \"img\": a 3x4 JPEG does not give 784"));
  assert_int_equal(open_spec(f, "{\"paths\": \"r.tfrecord\", \"label\": "
                                "\"label\", \"features\": [{\"name\": \"img\","
                                " \"size\": 13, \"decode\": \"raw_uint8\"}]}",
                             1),
                   0);
  assert_int_equal(wk_input_next(f->in, &b), TSR_ESHAPE);
  assert_non_null(strstr(wk_input_error(f->in),
                         "12 bytes of raw_uint8, expected 13"));
  assert_int_equal(open_spec(f, "{\"paths\": \"r.tfrecord\", \"label\": "
                                "\"label\", \"features\": [{\"name\": \"img\","
                                " \"size\": 12, \"decode\": \"webp\"}]}", 1),
                   TSR_ECONFIG);
  assert_non_null(strstr(f->err, "decode must be \"raw_uint8\""));
  free(p0);
  free(p1);
  free(p2);
}

/* A file compressed whole with zlib (TFRecordOptions("ZLIB")). */
static void zlib_files_and_tfds_names(void **state) {
  fx *f = *state;
  uint8_t px[6][8];
  const uint8_t *im[6];
  size_t len[6];
  for (int r = 0; r < 6; r++) {
    for (int i = 0; i < 8; i++) px[r][i] = (uint8_t)(r * 8 + i);
    im[r] = px[r];
    len[r] = 8;
  }
  write_records(tpath(f->dir, "plain.tfrecord"), im, len, 6);
  size_t n;
  uint8_t *raw = (uint8_t *)test_slurp_bytes(tpath(f->dir, "plain.tfrecord"),
                                             &n);
  uLongf zn = compressBound(n);
  uint8_t *z = malloc(zn);
  assert_int_equal(compress2(z, &zn, raw, n, 6), Z_OK);
  assert_true(z[0] == 0x78);
  /* the TFDS shard name carries no ".tfrecord" suffix */
  twrite(f->dir, "mnist-train.tfrecord-00000-of-00001", z, zn);
  assert_int_equal(open_spec(f, "{\"paths\": "
                                "\"mnist-train.tfrecord-00000-of-00001\", "
                                "\"label\": \"label\", \"features\": [{\"name\""
                                ": \"img\", \"size\": 8, \"decode\": "
                                "\"raw_uint8\"}]}", 6),
                   0);
  const wk_batch *b;
  assert_int_equal(wk_input_next(f->in, &b), 0);
  assert_int_equal(b->n, 6);
  for (int i = 0; i < 48; i++) assert_true(b->x[i] == (float)i);
  /* cut short: a clear error */
  twrite(f->dir, "mnist-train.tfrecord-00000-of-00001", z, zn / 2);
  assert_int_equal(open_spec(f, "{\"paths\": "
                                "\"mnist-train.tfrecord-00000-of-00001\", "
                                "\"label\": \"label\", \"features\": [{\"name\""
                                ": \"img\", \"size\": 8, \"decode\": "
                                "\"raw_uint8\"}]}", 6),
                   0);
  assert_int_equal(wk_input_next(f->in, &b), TSR_ECORRUPT);
  assert_non_null(strstr(wk_input_error(f->in), "ZLIB"));
  free(z);
  free(raw);
  /* a plain file whose first record is 0x178 bytes long starts 78 01, a
   * valid zlib header: its valid record header keeps it plain */
  for (size_t pad = 300; pad < 400; pad++) {
    uint8_t big[400] = {0};
    const uint8_t *bp[1] = {big};
    size_t bl[1] = {pad};
    write_records(tpath(f->dir, "x.tfrecord"), bp, bl, 1);
    size_t xn;
    uint8_t *x = (uint8_t *)test_slurp_bytes(tpath(f->dir, "x.tfrecord"), &xn);
    bool hit = x[0] == 0x78 && x[1] == 0x01;
    free(x);
    if (!hit) continue;
    char spec[256];
    snprintf(spec, sizeof spec, "{\"paths\": \"x.tfrecord\", \"label\": "
             "\"label\", \"features\": [{\"name\": \"img\", \"size\": %zu, "
             "\"decode\": \"raw_uint8\"}]}", pad);
    assert_int_equal(open_spec(f, spec, 1), 0);
    assert_int_equal(wk_input_next(f->in, &b), 0);
    return;
  }
  fail_msg("no padding gave a record of 0x178 bytes");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(raw_png_jpeg_int64, setup, teardown),
      cmocka_unit_test_setup_teardown(zlib_files_and_tfds_names, setup,
                                      teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
