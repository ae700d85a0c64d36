/* Writes two shard files with known contents into the folder given as the
 * only argument, for read_ckpt.py to check from Python (msgpack + numpy):
 *   "dense/w:0" part 1 of 2 of a [7, 3] Adam variable (rows 4..6):
 *       value[r][c] = 0.5 * (row0 + r) + c, slot m = -value, slot v = value^2,
 *       step 9;
 *   "emb" (sparse, Adagrad, width 2), ids 5, 1000000007, 12:
 *       value = [id % 1000, -1], accumulator = [0.25, 0.5]. */
#include <stdio.h>
#include <string.h>

#include "common/err.h"
#include "ps/client/client.h"
#include "ps/ps_int.h"

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: ckpt_writer DIR\n");
    return 2;
  }
  char err[512];
  ps_mem mem = {0, 0, NULL, NULL};
  ps_ckpt_ident who = {"run-7", 9};
  tsr_optim_spec o;
  tsr_optim_defaults(TSR_OPT_ADAM, &o);
  ps_var_spec s;
  int64_t shape[2] = {7, 3};
  if (ps_var_spec_init(&s, "dense/w:0", 2, shape, 1, 2, "zeros", 1, &o))
    return 1;
  ps_shard *d;
  if (ps__shard_new(&s, &mem, &d, err, sizeof err)) {
    fprintf(stderr, "%s\n", err);
    return 1;
  }
  for (int64_t r = 0; r < s.shard.rows; r++)
    for (int c = 0; c < 3; c++) {
      float v = 0.5f * (float)(s.shard.row0 + r) + (float)c;
      d->w[r * 3 + c] = v;
      d->slots[0][r * 3 + c] = -v;
      d->slots[1][r * 3 + c] = v * v;
    }
  d->step = 9;
  if (ps__ckpt_save_shard(d, argv[1], &who, false, NULL, err, sizeof err)) {
    fprintf(stderr, "%s\n", err);
    return 1;
  }
  tsr_optim_defaults(TSR_OPT_ADAGRAD, &o);
  int64_t eshape[2] = {1, 2};
  if (ps_var_spec_init(&s, "emb", 2, eshape, 0, 1, "zeros", 1, &o)) return 1;
  s.var.kind = TSR_VAR_ROW_SPARSE;
  ps_shard *e;
  if (ps__shard_new(&s, &mem, &e, err, sizeof err)) return 1;
  int64_t ids[3] = {5, 1000000007, 12};
  for (int i = 0; i < 3; i++) {
    float *rec;
    int created;
    if (ps__rows_insert(&e->rows, &mem, ids[i], &rec, &created)) return 1;
    rec[0] = (float)(ids[i] % 1000);
    rec[1] = -1;
    rec[2] = 0.25f;
    rec[3] = 0.5f;
  }
  if (ps__ckpt_save_shard(e, argv[1], &who, false, NULL, err, sizeof err)) {
    fprintf(stderr, "%s\n", err);
    return 1;
  }
  ps__shard_free(d, &mem);
  ps__shard_free(e, &mem);
  return 0;
}
