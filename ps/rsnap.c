/* Snapshot: every shard as it is at one moment, for an evaluation that
 * reads it while training goes on (the chief used to drain the cluster
 * for one).
 *
 * Happy path. An RSNAP op per shard joins the shard's queue as a write
 * (after the writes queued before it) and runs on the loop with no apply
 * running: it takes a snapshot of the shard (snap.c) and attaches it as
 * the shard's evaluation snapshot, replacing one held before; the
 * shard's writers keep the rows they change for it from then on, beside
 * a save's snapshot. The call is answered once every shard has its
 * snapshot. Pulls that name the snapshot's id read it (service.c): a
 * dense shard's values as they were, a sparse shard's rows from the kept
 * records or the table, rows made since read as their initial values.
 * Release (or a new snapshot, or the snapshot's time running out: it
 * never outlives its ttl, so a chief that died mid-evaluation does not
 * leave the PS keeping rows for ever) drops it with a RUNSNAP op per
 * shard, a write, so no pull is reading it then.
 * Failure modes: a snapshot that cannot be taken (memory): the call fails
 * naming the shard and the others are dropped; rows kept beyond the
 * budget: the snapshot is lost and the pulls that name it fail, training
 * goes on.
 */
#include "ps/svc_int.h"
#include "common/err.h"
#include "common/log.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#define RS_TTL_DEFAULT_S 600

ps_snap *ps__snapshot_of(ps_entry *e, uint64_t id) {
  ps_snap *v = e->sh ? e->sh->rsnap : NULL;
  return v && ps__snap_info(v)->id == id ? v : NULL;
}

/* A RUNSNAP op for every shard, ahead of what is queued. */
static void rs_drop_all(ps_server *s) {
  s->rsnap_id = 0;
  for (int i = 0; i < s->n_ents; i++) {
    ps_op *op = ps__calloc(&s->mem, 1, sizeof *op);
    if (!op) continue; /* the next snapshot, or the shard's end, drops it */
    op->srv = s;
    op->e = s->ents[i];
    op->kind = PS_OP_RUNSNAP;
    ps__enqueue(s, op, true);
  }
}

void ps__rsnap_op(ps_server *s, ps_op *op) {
  ps_batch *b = op->batch;
  ps_entry *e = op->e;
  ps_shard *sh = e->sh;
  if (op->kind == PS_OP_RUNSNAP || (b && b->rc)) {
    if (sh) {
      ps__snap_free(sh->rsnap);
      sh->rsnap = NULL;
    }
  } else if (sh) {
    char err[512];
    ps_snap *v = NULL;
    int rc = ps__snap_take(sh, &s->mem, &v, err, sizeof err);
    ps__snap_free(sh->rsnap); /* a later one replaces it */
    sh->rsnap = NULL;
    if (rc) {
      b->rc = rc;
      snprintf(b->err, sizeof b->err, "snapshot: %s", err);
    } else {
      ps__snap_set_id(v, op->snapshot);
      sh->rsnap = v;
      b->count++;
    }
  }
  ps__free(&s->mem, op);
  ps__dispatch(s, e);
  if (b) ps__batch_done(s, b);
}

void ps__on_snapshot(tsr_rpc_incoming *call, void *data) {
  ps_server *s = data;
  Tessera__Ps__SnapshotRequest *r = call->request;
  if (r->release) {
    if (!r->id || r->id == s->rsnap_id) rs_drop_all(s);
    Tessera__Ps__SnapshotResponse m = TESSERA__PS__SNAPSHOT_RESPONSE__INIT;
    ps__reply_msg(s, call, &m.base);
    return;
  }
  if (!r->id) {
    tsr_rpc_reply_error(call, TSR_EINVAL, "snapshot: id 0 names no "
                        "snapshot (pulls with 0 read the live values)");
    return;
  }
  ps_batch *b = ps__batch_new(s, call, (size_t)s->n_ents);
  if (!b) {
    tsr_rpc_reply_error(call, TSR_ENOMEM, "out of memory");
    return;
  }
  uint32_t ttl = r->ttl_s ? r->ttl_s : RS_TTL_DEFAULT_S;
  s->rsnap_id = r->id;
  s->rsnap_until = uv_now(s->loop) + (uint64_t)ttl * 1000;
  ps__batch_each_entry(s, b, PS_OP_RSNAP, r->id, "snapshot");
  ps__batch_done(s, b);
}

void ps__snapshot_taken(ps_server *s, ps_batch *b) {
  if (b->rc) {
    rs_drop_all(s); /* all or none */
    tsr_rpc_reply_error(b->call, b->rc, b->err);
  } else {
    Tessera__Ps__SnapshotResponse m = TESSERA__PS__SNAPSHOT_RESPONSE__INIT;
    m.shards = b->count;
    ps__reply_msg(s, b->call, &m.base);
  }
  ps__batch_free(s, b);
}

void ps__snapshot_tick(ps_server *s) {
  if (s->rsnap_id && uv_now(s->loop) >= s->rsnap_until && !s->closing) {
    tsr_warn("evaluation snapshot %" PRIu64 " dropped: not released within "
             "its time", s->rsnap_id);
    rs_drop_all(s);
  }
}
