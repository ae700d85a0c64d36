/* libFuzzer target: the TFRecord reader's tf.train.Example decoder
 * (worker/tfr_example.c), a hand-written scanner over untrusted bytes.
 *
 * The input is one serialized Example, copied to a buffer of exactly its
 * size (ASan then sees any read past it). It is decoded twice with one
 * decoder, for the features of a CTR-like spec: a dense float feature of
 * 3 values, an int64 label and two sparse id lists (one with a
 * vocabulary of 7); the second pass runs with the feature order learnt
 * from the first. Every input must be decoded or refused with a message;
 * nothing may crash, read outside the input or leak. */
#include "common/err.h"
#include "worker/tfr_example.h"

#include <stdlib.h>
#include <string.h>

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
  }
  wk_tfr__dec_free(&d);
  free(buf);
  return 0;
}
