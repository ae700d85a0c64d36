/* Saving a shard to its checkpoint file (the format and the writer are
 * common/ckpt/shardfile.h; ckpt_load.c restores from the files).
 *
 * Happy path: the shard's header fields (its variable, its place in the
 * layout, the optimizer and its slots, the checkpoint it belongs to) and
 * its rows go to tsr_shardfile_write: a dense shard's value and slot
 * arrays as they are, a sparse shard's rows walked once per section (ids,
 * value, each slot) in the table's order, the same for every walk.
 * Failure modes: those of tsr_shardfile_write, each naming the file.
 */
#include "ps/ps_int.h"
#include "common/err.h"

#include <stdio.h>
#include <string.h>

int ps__ckpt_file_name(const ps_var_spec *s, char *buf, size_t len) {
  return tsr_shardfile_name(s->var.name, s->shard.shard, s->shard.num_shards,
                            buf, len);
}

typedef struct {
  const ps_shard *s;
  tsr_shardfile_writer *w;
  int section; /* -1 ids, 0 value, k slot k */
} ck_emit;

static void ck_put_row(void *ctx, int64_t id, const float *rec) {
  ck_emit *e = ctx;
  size_t W = (size_t)e->s->width;
  if (e->section < 0)
    tsr_shardfile_put(e->w, &id, sizeof id);
  else
    tsr_shardfile_put(e->w, rec + (size_t)e->section * W, W * sizeof(float));
}

static void ck_emit_data(void *ctx, tsr_shardfile_writer *w) {
  const ps_shard *s = ctx;
  if (ps_var_spec_sparse(&s->spec)) {
    ck_emit e = {s, w, -1};
    for (; e.section <= s->nslots; e.section++)
      ps__rows_each(&s->rows, ck_put_row, &e);
    return;
  }
  size_t bytes = (size_t)s->spec.shard.rows * (size_t)s->width * sizeof(float);
  tsr_shardfile_put(w, s->w, bytes);
  for (int k = 0; k < s->nslots; k++) tsr_shardfile_put(w, s->slots[k], bytes);
}

int ps__ckpt_save_shard(const ps_shard *s, const char *dir,
                        const ps_ckpt_ident *who, bool verify,
                        ps_ckpt_file *out, char *err, size_t errlen) {
  tsr_shardfile_hdr h;
  memset(&h, 0, sizeof h);
  snprintf(h.ckpt_id, sizeof h.ckpt_id, "%s", who ? who->id : "");
  h.ckpt_step = who ? who->step : 0;
  snprintf(h.name, sizeof h.name, "%s", s->spec.var.name);
  h.rank = s->spec.var.rank;
  memcpy(h.shape, s->spec.var.shape, sizeof h.shape);
  h.sparse = ps_var_spec_sparse(&s->spec);
  h.bounded = s->spec.bounded;
  h.shard = s->spec.shard.shard;
  h.num_shards = s->spec.shard.num_shards;
  h.row0 = s->spec.shard.row0;
  h.rows = s->spec.shard.rows;
  h.width = s->width;
  h.n_rows = h.sparse ? (int64_t)s->rows.count : s->spec.shard.rows;
  h.step = s->step;
  h.var_version = s->version;
  snprintf(h.optimizer, sizeof h.optimizer, "%s",
           tsr_optim_name(s->spec.optim.kind));
  h.nslots = s->nslots;
  for (int k = 0; k < s->nslots; k++)
    snprintf(h.slots[k], sizeof h.slots[k], "%s",
             kern_optim_slot_name(&s->spec.optim, k));
  return tsr_shardfile_write(dir, &h, "tessera-ps", ck_emit_data, (void *)s,
                             verify, out, err, errlen);
}
