/* Pieces shared by the Example scanner (tfr_example.c) and the Feature
 * decoder (tfr_feature.c): wire primitives, the error context, and the
 * general decoding of one Feature. Internal to the TFRecord reader.
 */
#ifndef TSR_WK_TFR_EXAMPLE_INT_H
#define TSR_WK_TFR_EXAMPLE_INT_H

#include "worker/tfr_example.h"

#include <string.h>

/* ---- wire primitives --------------------------------------------------- */

static inline int varint_slow(const uint8_t **p, const uint8_t *end,
                              uint64_t *v) {
  uint64_t x = 0;
  for (int s = 0; s < 64; s += 7) {
    if (*p >= end) return -1;
    uint8_t b = *(*p)++;
    x |= (uint64_t)(b & 0x7f) << s;
    if (!(b & 0x80)) {
      *v = x;
      return 0;
    }
  }
  return -1;
}

/* Tags and lengths are mostly one byte: that case inline. */
static inline int varint(const uint8_t **p, const uint8_t *end, uint64_t *v) {
  const uint8_t *q = *p;
  if (q < end && *q < 0x80) {
    *v = *q;
    *p = q + 1;
    return 0;
  }
  return varint_slow(p, end, v);
}

/* Ids: mostly up to three bytes, unrolled. */
static inline int varint3(const uint8_t **p, const uint8_t *end,
                          uint64_t *v) {
  const uint8_t *q = *p;
  if (q < end) {
    uint64_t b0 = q[0];
    if (b0 < 0x80) {
      *v = b0;
      *p = q + 1;
      return 0;
    }
    if (q + 1 < end) {
      uint64_t b1 = q[1];
      if (b1 < 0x80) {
        *v = (b0 & 0x7f) | b1 << 7;
        *p = q + 2;
        return 0;
      }
      if (q + 2 < end && q[2] < 0x80) {
        *v = (b0 & 0x7f) | (b1 & 0x7f) << 7 | (uint64_t)q[2] << 14;
        *p = q + 3;
        return 0;
      }
    }
  }
  return varint_slow(p, end, v);
}

static inline int skip_field(const uint8_t **p, const uint8_t *end, int wt) {
  uint64_t v;
  switch (wt) {
    case 0: return varint(p, end, &v);
    case 1: if (end - *p < 8) return -1; *p += 8; return 0;
    case 2:
      if (varint(p, end, &v) || v > (uint64_t)(end - *p)) return -1;
      *p += v;
      return 0;
    case 5: if (end - *p < 4) return -1; *p += 4; return 0;
  }
  return -1;
}

/* Where a record came from, for messages. */
typedef struct {
  const char *path;
  uint64_t off;
  char *err;
  size_t errlen;
} tfr_ctx;

static inline uint32_t load32(const uint8_t *p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v; /* little-endian hosts, as the PS */
}

static inline uint64_t load64(const uint8_t *p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}

/* Room for `need` ids in column f. */
static inline int col_reserve(const wk_row *o, int f, size_t need) {
  return need <= o->ids_cap[f] ? 0 : o->grow(o->ctx, f, need);
}

/* "malformed Example", naming the feature when sl is not NULL; "id ... is
 * outside its vocabulary". Both return the code (TSR_EFORMAT, TSR_ERANGE). */
int wk_tfr__malformed(const tfr_ctx *c, const wk_tfr_slot *sl);
int wk_tfr__out_of_vocab(const tfr_ctx *c, const wk_tfr_slot *sl,
                         uint64_t v);

/* The ids of one packed run [q, qe) into column f from `f0`: the row's
 * list then ends at f0 + the count. 0 or an error. */
__attribute__((always_inline)) static inline int
ids_run(const wk_tfr_slot *sl, const uint8_t *q, const uint8_t *qe,
        int64_t f0, const wk_row *o, const tfr_ctx *c) {
  int f = sl->index;
  /* a varint is at least one byte: as many ids as bytes at most */
  if (col_reserve(o, f, (size_t)f0 + (size_t)(qe - q))) return TSR_ENOMEM;
  int64_t *ids = o->ids[f] + f0, k = 0;
  uint64_t lim = sl->id_lim, v;
  while (q < qe) {
    if (varint3(&q, qe, &v)) return wk_tfr__malformed(c, sl);
    if (v >= lim) return wk_tfr__out_of_vocab(c, sl, v);
    ids[k++] = (int64_t)v;
  }
  o->offs[f][o->row + 1] = f0 + k;
  return 0;
}

/* Decodes one Feature [p, end) into the row per its slot: the usual shape
 * at once, any other legal encoding with every check. 0 or an error. */
int wk_tfr__feature(const wk_tfr_slot *sl, const uint8_t *p,
                    const uint8_t *end, const wk_row *o, const tfr_ctx *c);

#endif
