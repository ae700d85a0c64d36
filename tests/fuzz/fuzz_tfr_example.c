/* libFuzzer target: the TFRecord reader's tf.train.Example decoder
 * (worker/tfr_example.c), a hand-written scanner over untrusted bytes.
 *
 * The input is one serialized Example, copied to a buffer of exactly its
 * size (ASan then sees any read past it). It is decoded twice with one
 * decoder, for the features of a CTR-like spec: a dense float feature of
 * 3 values, an int64 label and two sparse id lists (one with a
 * vocabulary of 7); the second pass runs with the feature order learnt
 * from the first. It is then decoded as rows 0 and 1 of a batch whose id
 * columns start with room for one id (so rows grow them). Every input
 * must be decoded or refused with a message; nothing may crash, read
 * outside the input or leak. */
#include "common/err.h"
#include "worker/tfr_example.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
  int64_t *ids[2];
  size_t cap[2];
} cols;

static int cols_grow(void *ctx, int f, size_t need) {
  cols *c = ctx;
  int64_t *n = realloc(c->ids[f], need * sizeof(int64_t));
  if (!n) return TSR_ENOMEM;
  c->ids[f] = n;
  c->cap[f] = need;
  return 0;
}

/* Rows 0 and 1 of a batch: offsets rise, ids stay inside their columns. */
static void as_rows(wk_tfr_dec *d, const uint8_t *buf, size_t size) {
  float x[6], y[2];
  int64_t o0[3] = {0}, o1[3] = {0}, *offs[2] = {o0, o1};
  cols c = {{malloc(8), malloc(8)}, {1, 1}};
  char err[512];
  if (c.ids[0] && c.ids[1])
    for (int row = 0; row < 2; row++) {
      const wk_row o = {x + 3 * row, y + row, c.ids, offs, c.cap, row,
                        cols_grow, &c};
      err[0] = 0;
      int rc = wk_tfr__decode_row(d, buf, size, &o, "fuzz", 0, err,
                                  sizeof err);
      if (rc != 0 && !err[0] && rc != TSR_ENOMEM) abort();
      if (rc) break;
      for (int f = 0; f < 2; f++)
        if (offs[f][row + 1] < offs[f][row] ||
            (size_t)offs[f][row + 1] > c.cap[f])
          abort();
    }
  free(c.ids[0]);
  free(c.ids[1]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  wk_dense_feat dense[1] = {{(char *)"x", 3, WK_DECODE_NONE}};
  wk_sparse_feat sparse[2] = {{(char *)"ids", 0}, {(char *)"cat", 7}};
  wk_input_spec spec;
  memset(&spec, 0, sizeof spec);
  strcpy(spec.where, "fuzz");
  spec.dense = dense;
  spec.n_dense = 1;
  spec.label = (char *)"label";
  spec.sparse = sparse;
  spec.n_sparse = 2;
  int64_t vocab[2] = {0, 7};
  wk_tfr_dec d;
  wk_rec r;
  char err[512];
  uint8_t *buf = malloc(size ? size : 1);
  if (!buf) return 0;
  memcpy(buf, data, size);
  if (wk_tfr__dec_init(&d, &spec, vocab, err, sizeof err) == 0 &&
      wk_rec__init(&r, 3, 2) == 0) {
    for (int pass = 0; pass < 2; pass++) {
      int rc = wk_tfr__decode(&d, buf, size, &r, "fuzz", 0, err, sizeof err);
      if (rc == 0 && (r.off[0] != 0 || r.off[1] < 0 || r.off[2] < r.off[1] ||
                      (size_t)r.off[2] > r.ids_cap))
        abort(); /* a decoded record is consistent */
      if (rc != 0 && !err[0]) abort(); /* a refusal says why */
    }
    wk_rec__free(&r);
    as_rows(&d, buf, size);
  }
  wk_tfr__dec_free(&d);
  free(buf);
  return 0;
}
