/* Saving a shard to its checkpoint file (the format and the writers are
 * common/ckpt/shardfile.h; ckpt_load.c restores from the files).
 *
 * Happy path: a snapshot of the shard (snap.c) gives the header's fields
 * (its variable, its place in the layout, the optimizer and its slots,
 * its step and version as they were) and its rows, block by block, in
 * row order, to tsr_shardfile_write_rows: one pass, each row copied once,
 * out of the snapshot straight into the file's staged sections, while the
 * shard's writer goes on.
 * Failure modes: those of the writer, each naming the file, and a
 * snapshot lost for want of memory (it names the shard and the limit).
 */
#include "ps/ps_int.h"
#include "common/err.h"

#include <stdio.h>
#include <string.h>

int ps__ckpt_file_name(const ps_var_spec *s, char *buf, size_t len) {
  return tsr_shardfile_name(s->var.name, s->shard.shard, s->shard.num_shards,
                            buf, len);
}

static int ck_rows(void *ctx, uint64_t r0, size_t n, unsigned char *ids,
                   unsigned char *const *secs, char *err, size_t errlen) {
  ps_snap *v = ctx;
  const ps_snap_info *in = ps__snap_info(v);
  ps_snap_dst d;
  memset(&d, 0, sizeof d);
  for (int k = 0; k <= in->nslots; k++) d.sec[k] = secs[k];
  d.step = (size_t)in->width * sizeof(float);
  d.ids = ids;
  return ps__snap_read_to(v, (size_t)r0, n, &d, err, errlen);
}

int ps__ckpt_save_snap(ps_snap *v, const char *dir, const ps_ckpt_ident *who,
                       tsr_shardfile_stage *stage, bool verify,
                       ps_ckpt_file *out, char *err, size_t errlen) {
  const ps_snap_info *in = ps__snap_info(v);
  const ps_var_spec *sp = &in->spec;
  tsr_shardfile_hdr h;
  memset(&h, 0, sizeof h);
  snprintf(h.ckpt_id, sizeof h.ckpt_id, "%s", who ? who->id : "");
  h.ckpt_step = who ? who->step : 0;
  snprintf(h.name, sizeof h.name, "%s", sp->var.name);
  h.rank = sp->var.rank;
  memcpy(h.shape, sp->var.shape, sizeof h.shape);
  h.sparse = in->sparse;
  h.bounded = sp->bounded;
  h.shard = sp->shard.shard;
  h.num_shards = sp->shard.num_shards;
  h.row0 = sp->shard.row0;
  h.rows = sp->shard.rows;
  h.width = in->width;
  h.n_rows = (int64_t)in->n_rows;
  h.step = in->step;
  h.var_version = in->version;
  snprintf(h.optimizer, sizeof h.optimizer, "%s",
           tsr_optim_name(sp->optim.kind));
  h.nslots = in->nslots;
  for (int k = 0; k < in->nslots; k++)
    snprintf(h.slots[k], sizeof h.slots[k], "%s",
             kern_optim_slot_name(&sp->optim, k));
  return tsr_shardfile_write_rows(dir, &h, "tessera-ps", ck_rows, v, stage,
                                  verify, out, err, errlen);
}

int ps__ckpt_save_shard(const ps_shard *s, const char *dir,
                        const ps_ckpt_ident *who, bool verify,
                        ps_ckpt_file *out, char *err, size_t errlen) {
  ps_mem m;
  memset(&m, 0, sizeof m);
  ps_snap *v;
  int rc = ps__snap_take(s, &m, &v, err, errlen);
  if (rc) return rc;
  rc = ps__ckpt_save_snap(v, dir, who, NULL, verify, out, err, errlen);
  ps__snap_free(v);
  return rc;
}
