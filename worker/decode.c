/* bytes_list features into floats: raw uint8 or float32 bytes (the
 * tutorial's `image_raw`, tf.io.decode_raw), PNG with libpng's simplified
 * API and JPEG with libjpeg(-turbo), from memory.
 *
 * Happy path: check the byte count (raw) or the image's size against the
 * feature's `size` (H*W gray, H*W*3 RGB: the channels are chosen to fit,
 * as tf.io.decode_image(channels=...) would be asked), decode into a
 * scratch buffer of bytes, widen to float in place order (HWC, rows top
 * to bottom, as Keras reads images).
 * Failure modes: a byte count or pixel count that does not match
 * (TSR_ESHAPE, saying both), a corrupt or truncated image, an unknown
 * image type (TSR_EFORMAT, with the library's message). libjpeg reports
 * errors through longjmp, caught here; nothing leaks on either path.
 */
#include "worker/input_int.h"

#include "common/err.h"

#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>
#include <png.h>

static const char *const names[] = {"none", "raw_uint8", "raw_float32",
                                    "png", "jpeg", "image"};

const char *wk_decode__name(wk_decode d) {
  return (unsigned)d <= WK_DECODE_IMAGE ? names[d] : "?";
}

/* Channels that make w*h*c equal `size`, or 0. */
static int fit_channels(int64_t w, int64_t h, int64_t size) {
  if (w * h == size) return 1;
  if (w * h * 3 == size) return 3;
  return 0;
}

static int decode_png(const uint8_t *p, size_t len, float *out, int64_t size,
                      char *err, size_t errlen) {
  png_image im;
  memset(&im, 0, sizeof im);
  im.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_memory(&im, p, len))
    return tsr_errf(err, errlen, TSR_EFORMAT, "PNG: %s", im.message);
  int c = fit_channels(im.width, im.height, size);
  if (!c) {
    int64_t w = im.width, h = im.height;
    png_image_free(&im);
    return tsr_errf(err, errlen, TSR_ESHAPE,
                    "a %lldx%lld PNG does not give %lld values (H*W "
                    "gray or H*W*3 RGB)",
                    (long long)h, (long long)w, (long long)size);
  }
  im.format = c == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB;
  uint8_t *px = malloc((size_t)size);
  if (!px) {
    png_image_free(&im);
    return TSR_ENOMEM;
  }
  if (!png_image_finish_read(&im, NULL, px, 0, NULL)) {
    int rc = tsr_errf(err, errlen, TSR_EFORMAT, "PNG: %s", im.message);
    free(px);
    png_image_free(&im);
    return rc;
  }
  for (int64_t i = 0; i < size; i++) out[i] = px[i];
  free(px);
  return 0;
}

typedef struct {
  struct jpeg_error_mgr pub;
  jmp_buf jb;
  char msg[JMSG_LENGTH_MAX];
} jerr_mgr;

static void jerr_exit(j_common_ptr ci) {
  jerr_mgr *m = (jerr_mgr *)ci->err;
  (*ci->err->format_message)(ci, m->msg);
  longjmp(m->jb, 1);
}

static void jerr_quiet(j_common_ptr ci, int level) {
  (void)ci;
  (void)level; /* warnings (a corrupt stream) end as errors or pass */
}

static int decode_jpeg(const uint8_t *p, size_t len, float *out, int64_t size,
                       char *err, size_t errlen) {
  struct jpeg_decompress_struct ci;
  jerr_mgr jm;
  uint8_t *volatile row = NULL;
  volatile int rc = 0;
  memset(&ci, 0, sizeof ci);
  ci.err = jpeg_std_error(&jm.pub);
  jm.pub.error_exit = jerr_exit;
  jm.pub.emit_message = jerr_quiet;
  if (setjmp(jm.jb)) {
    rc = tsr_errf(err, errlen, TSR_EFORMAT, "JPEG: %s", jm.msg);
    goto out;
  }
  jpeg_create_decompress(&ci);
  jpeg_mem_src(&ci, p, (unsigned long)len);
  jpeg_read_header(&ci, TRUE);
  int c = fit_channels(ci.image_width, ci.image_height, size);
  if (!c) {
    rc = tsr_errf(err, errlen, TSR_ESHAPE,
                  "a %ux%u JPEG does not give %lld values (H*W gray "
                  "or H*W*3 RGB)",
                  ci.image_height, ci.image_width, (long long)size);
    goto out;
  }
  ci.out_color_space = c == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_start_decompress(&ci);
  size_t stride = (size_t)ci.output_width * (size_t)ci.output_components;
  row = malloc(stride);
  if (!row) {
    rc = TSR_ENOMEM;
    goto out;
  }
  while (ci.output_scanline < ci.output_height) {
    JSAMPROW rp = row;
    size_t y = ci.output_scanline;
    jpeg_read_scanlines(&ci, &rp, 1);
    for (size_t i = 0; i < stride; i++) out[y * stride + i] = row[i];
  }
  jpeg_finish_decompress(&ci);
out:
  jpeg_destroy_decompress(&ci);
  free(row);
  return rc;
}

int wk_decode__bytes(wk_decode d, const uint8_t *p, size_t len, float *out,
                     int64_t size, char *err, size_t errlen) {
  switch (d) {
    case WK_DECODE_RAW_U8:
      if ((int64_t)len != size)
        return tsr_errf(err, errlen, TSR_ESHAPE,
                        "%zu bytes of raw_uint8, expected %lld", len,
                        (long long)size);
      for (int64_t i = 0; i < size; i++) out[i] = p[i];
      return 0;
    case WK_DECODE_RAW_F32:
      if ((int64_t)len != 4 * size)
        return tsr_errf(err, errlen, TSR_ESHAPE,
                        "%zu bytes of raw_float32, expected %lld (%lld "
                        "values)", len, (long long)(4 * size),
                        (long long)size);
      memcpy(out, p, len); /* little-endian hosts only, as the PS */
      return 0;
    case WK_DECODE_PNG:
      return decode_png(p, len, out, size, err, errlen);
    case WK_DECODE_JPEG:
      return decode_jpeg(p, len, out, size, err, errlen);
    case WK_DECODE_IMAGE:
      if (len >= 8 && !memcmp(p, "\x89PNG\r\n\x1a\n", 8))
        return decode_png(p, len, out, size, err, errlen);
      if (len >= 3 && p[0] == 0xff && p[1] == 0xd8 && p[2] == 0xff)
        return decode_jpeg(p, len, out, size, err, errlen);
      return tsr_errf(err, errlen, TSR_EFORMAT,
                      "not a PNG or JPEG image (%zu bytes)", len);
    case WK_DECODE_NONE: break;
  }
  return TSR_EINVAL;
}
