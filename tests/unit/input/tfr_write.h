/* Writes TFRecord files of tf.train.Example for the tests and the
 * benchmark: the Example is packed by protobuf-c (proto/example.proto), the
 * framing follows the TFRecord spec with a CRC32C computed here bit by bit,
 * independently of common/crc32c. */
#ifndef TSR_TEST_TFR_WRITE_H
#define TSR_TEST_TFR_WRITE_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "example.pb-c.h"

/* CRC32C (Castagnoli, reflected polynomial 0x82f63b78), one bit at a time. */
static inline uint32_t tfrw_crc32c(const void *data, size_t n) {
  const uint8_t *p = data;
  uint32_t c = 0xffffffffu;
  for (size_t i = 0; i < n; i++) {
    c ^= p[i];
    for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82f63b78u & (0u - (c & 1)));
  }
  return c ^ 0xffffffffu;
}

/* TFRecord's mask: rotate right by 15 and add a constant. */
static inline uint32_t tfrw_mask(uint32_t crc) {
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

enum { TFRW_BYTES = 1, TFRW_FLOAT = 2, TFRW_INT64 = 3 };

typedef struct {
  const char *name;
  int kind;
  size_t n;
  const float *f;     /* TFRW_BYTES: one value of n bytes at (const uint8_t
                         *)f; NULL: a fixed 10-byte text */
  const int64_t *i;
} tfrw_feat;

/* Packs an Example with protobuf-c; returns malloc'd bytes. */
static inline uint8_t *tfrw_pack(const tfrw_feat *fs, int n, size_t *len) {
  Tensorflow__Example ex = TENSORFLOW__EXAMPLE__INIT;
  Tensorflow__Features feats = TENSORFLOW__FEATURES__INIT;
  Tensorflow__Features__FeatureEntry ent[64], *pent[64];
  Tensorflow__Feature fe[64];
  Tensorflow__FloatList fl[64];
  Tensorflow__Int64List il[64];
  Tensorflow__BytesList bl[64];
  ProtobufCBinaryData bd[64];
  for (int k = 0; k < n; k++) {
    Tensorflow__Features__FeatureEntry e0 = TENSORFLOW__FEATURES__FEATURE_ENTRY__INIT;
    Tensorflow__Feature f0 = TENSORFLOW__FEATURE__INIT;
    Tensorflow__FloatList fl0 = TENSORFLOW__FLOAT_LIST__INIT;
    Tensorflow__Int64List il0 = TENSORFLOW__INT64_LIST__INIT;
    Tensorflow__BytesList bl0 = TENSORFLOW__BYTES_LIST__INIT;
    ent[k] = e0;
    fe[k] = f0;
    fl[k] = fl0;
    il[k] = il0;
    bl[k] = bl0;
    ent[k].key = (char *)fs[k].name;
    ent[k].value = &fe[k];
    if (fs[k].kind == TFRW_FLOAT) {
      fe[k].kind_case = TENSORFLOW__FEATURE__KIND_FLOAT_LIST;
      fl[k].n_value = fs[k].n;
      fl[k].value = (float *)fs[k].f;
      fe[k].float_list = &fl[k];
    } else if (fs[k].kind == TFRW_INT64) {
      fe[k].kind_case = TENSORFLOW__FEATURE__KIND_INT64_LIST;
      il[k].n_value = fs[k].n;
      il[k].value = (int64_t *)fs[k].i;
      fe[k].int64_list = &il[k];
    } else {
      fe[k].kind_case = TENSORFLOW__FEATURE__KIND_BYTES_LIST;
      bd[k].data = fs[k].f ? (uint8_t *)fs[k].f : (uint8_t *)"some bytes";
      bd[k].len = fs[k].f ? fs[k].n : 10;
      bl[k].n_value = 1;
      bl[k].value = &bd[k];
      fe[k].bytes_list = &bl[k];
    }
    pent[k] = &ent[k];
  }
  feats.n_feature = (size_t)n;
  feats.feature = pent;
  ex.features = &feats;
  *len = tensorflow__example__get_packed_size(&ex);
  uint8_t *out = malloc(*len ? *len : 1);
  if (out) tensorflow__example__pack(&ex, out);
  return out;
}

/* Appends one framed record: length, masked CRC of the length, data,
 * masked CRC of the data (all little-endian). */
static inline void tfrw_frame(FILE *fp, const uint8_t *data, size_t len) {
  uint8_t h[12], t[4];
  uint64_t l = len;
  for (int i = 0; i < 8; i++) h[i] = (uint8_t)(l >> (8 * i));
  uint32_t c = tfrw_mask(tfrw_crc32c(h, 8));
  for (int i = 0; i < 4; i++) h[8 + i] = (uint8_t)(c >> (8 * i));
  c = tfrw_mask(tfrw_crc32c(data, len));
  for (int i = 0; i < 4; i++) t[i] = (uint8_t)(c >> (8 * i));
  fwrite(h, 1, 12, fp);
  fwrite(data, 1, len, fp);
  fwrite(t, 1, 4, fp);
}

#endif
