/* The tf.train.Example decoder of the TFRecord reader (tfr_example.c):
 * decodes the features a data spec names straight from the serialized
 * bytes into one row of a batch (wk_row: the dense values, the label
 * and each sparse feature's ids in its own column), without allocating
 * (a column grows only when a row has more ids than it has room for).
 * wk_tfr__decode() fills a wk_rec the same way, through columns of its
 * own. Internal to the input pipeline.
 *
 * Contract: one decoder per reader; not thread-safe (it remembers the
 * order of the last record's features). The spec's names must outlive the
 * decoder (they are referenced, not copied).
 */
#ifndef TSR_WK_TFR_EXAMPLE_H
#define TSR_WK_TFR_EXAMPLE_H

#include "worker/input_int.h"

#define WK_TFR_PRED_MAX 256 /* map entries whose position predicts the slot */

enum { WK_TFR_DENSE = 0, WK_TFR_LABEL, WK_TFR_SPARSE };

typedef struct {
  const char *name;
  size_t len;
  int kind;         /* WK_TFR_DENSE, _LABEL or _SPARSE */
  int index;        /* dense feature index or sparse feature index */
  int64_t at;       /* dense: offset in x */
  int64_t size;     /* dense: values */
  wk_decode decode; /* dense: a bytes_list and how to read it */
  uint64_t word, mask; /* a name of up to 8 bytes as a little-endian word */
  /* dense float_list with one-byte lengths: its Feature's first 4 bytes
   * (0x12 L 0x0a L') as a little-endian word, and its length (SIZE_MAX:
   * none) */
  uint32_t head;
  size_t head_len;
  uint64_t id_lim;  /* sparse: ids (as unsigned) below it are in range */
  /* The whole map entry in its usual encoding, up to the values: 0x0a L
   * 0x0a KL key 0x12 VL, then 0x12 (dense floats) or 0x1a (sparse ids) L2
   * 0x0a L3. `pat` holds those bytes where `msk` is set (a length that
   * varies, only its high bit: one-byte lengths); `hlen` is their count;
   * 0: no such entry (a long name, long lengths, another kind). */
  uint64_t pat[3], msk[3];
  size_t hlen;
} wk_tfr_slot;

typedef struct {
  wk_tfr_slot *slots;    /* dense..., label, sparse... */
  int n_slots, n_sparse;
  int64_t n_dense;       /* values of x */
  const int64_t *vocab;  /* n_sparse; 0: unbounded */
  int *table;            /* open addressing: slot index + 1 */
  uint32_t table_mask;
  uint32_t *seen;        /* per slot: generation when last set */
  uint32_t gen;
  /* Per map entry position, the slot (+1) its key named in the last
   * record: writers emit a data set's features in one order, so the key
   * is checked against it before any hashing. */
  int pred[WK_TFR_PRED_MAX + 1]; /* the last stays 0 */
  /* pred[0..n_slots) names every slot once (then a record read through
   * the fast path from its first entry to its last has them all); pred
   * changed since that was worked out */
  bool pred_all, pred_changed;
  uint8_t *mark;         /* n_slots, scratch */
  /* wk_tfr__decode()'s own columns: one row each */
  int64_t **rec_ids;
  int64_t **rec_offs;    /* n_sparse pointers into rec_off */
  int64_t *rec_off;      /* 2 per sparse feature */
  size_t *rec_cap;
} wk_tfr_dec;

/* Builds the decoder for spec's dense features, label and sparse features
 * (vocab: n_sparse sizes, referenced). TSR_ECONFIG when a name is given
 * twice; TSR_ENOMEM. wk_tfr__dec_free() is safe after a failure. */
int wk_tfr__dec_init(wk_tfr_dec *d, const wk_input_spec *spec,
                     const int64_t *vocab, char *err, size_t errlen);
void wk_tfr__dec_free(wk_tfr_dec *d);

/* Decodes one serialized Example into the batch row `o` (input_int.h; an
 * absent sparse feature is an empty list, as tf.io.VarLenFeature). Errors name
 * `path` and the record's byte offset `off` and, where one is at fault,
 * the feature: TSR_EFORMAT (malformed protobuf: a varint or length past
 * the end, a bad wire type), TSR_ENOTFOUND (a dense feature or the label
 * absent), TSR_EDTYPE, TSR_ESHAPE, TSR_ERANGE (an id outside its
 * vocabulary), TSR_ENOMEM. A key given twice: the last one counts. After
 * an error the row holds partial values (the caller drops it). */
int wk_tfr__decode_row(wk_tfr_dec *d, const uint8_t *p, size_t n,
                       const wk_row *o, const char *path, uint64_t off,
                       char *err, size_t errlen);

/* The same into r (made by wk_rec__init with the decoder's n_dense and
 * n_sparse): its ids concatenated in the spec's order. */
int wk_tfr__decode(wk_tfr_dec *d, const uint8_t *p, size_t n, wk_rec *r,
                   const char *path, uint64_t off, char *err, size_t errlen);

#endif
