/* The PS service around the data path: the server's life (new, listen,
 * close), create, clocks and membership, config, save, restore, stats,
 * shutdown.
 *
 * Happy path. Create adds a shard entry at once (so pushes that follow
 * queue behind it) and allocates and initialises it on the pool; a second
 * create with the same spec is a no-op, with another spec an error naming
 * the field. Save (save.c) snapshots every shard and writes the
 * snapshots while applies go on. Restore loads every shard aside on the pool first; only when all
 * loaded does each shard swap in as a write, so a bad file fails the
 * restore whole. Shutdown answers, then calls the host's on_shutdown.
 * Failure modes: conflicting create (TSR_EEXISTS), unknown mode
 * (TSR_EINVAL), checkpoint errors (the file and the reason).
 */
#include "ps/svc_int.h"
#include "common/clock.h"
#include "common/err.h"
#include "common/fs.h"
#include "common/log.h"
#include "common/size.h"
#include "common/trace.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ---- batches ----------------------------------------------------------------*/

ps_batch *ps__batch_new(ps_server *s, tsr_rpc_incoming *call, size_t n) {
  ps_batch *b = ps__calloc(&s->mem, 1, sizeof *b);
  if (!b) return NULL;
  b->call = call;
  b->method = (int)call->method;
  b->n = n;
  b->ents = ps__calloc(&s->mem, n, sizeof *b->ents);
  b->loaded = ps__calloc(&s->mem, n, sizeof *b->loaded);
  b->created = ps__calloc(&s->mem, n, sizeof *b->created);
  if (!b->ents || !b->loaded || !b->created) {
    ps__free(&s->mem, b->ents);
    ps__free(&s->mem, b->loaded);
    ps__free(&s->mem, b->created);
    ps__free(&s->mem, b);
    return NULL;
  }
  b->pending = 1; /* the caller's own reference, dropped by batch_done */
  return b;
}

void ps__batch_free(ps_server *s, ps_batch *b) {
  for (size_t i = 0; i < b->n; i++) ps__shard_free(b->loaded[i], &s->mem);
  ps__free(&s->mem, b->files);
  ps__free(&s->mem, b->snaps);
  ps__free(&s->mem, b->waiters);
  ps__free(&s->mem, b->chain);
  ps__free(&s->mem, b->chain_who);
  ps__free(&s->mem, b->ents);
  ps__free(&s->mem, b->loaded);
  ps__free(&s->mem, b->created);
  ps__free(&s->mem, b);
}

ps_op *ps__batch_op(ps_server *s, ps_batch *b, ps_entry *e, ps_op_kind k) {
  ps_op *op = ps__calloc(&s->mem, 1, sizeof *op);
  if (!op) return NULL;
  op->srv = s;
  op->e = e;
  op->kind = k;
  op->batch = b;
  op->method = b->method;
  b->pending++;
  return op;
}

void ps__batch_each_entry(ps_server *s, ps_batch *b, ps_op_kind k,
                          uint64_t snapshot, const char *what) {
  for (int i = 0; i < s->n_ents; i++) {
    b->ents[i] = s->ents[i];
    ps_op *op = ps__batch_op(s, b, s->ents[i], k);
    if (!op) {
      b->rc = TSR_ENOMEM;
      snprintf(b->err, sizeof b->err, "%s: out of memory", what);
      break;
    }
    op->idx = (size_t)i;
    op->snapshot = snapshot;
    ps__enqueue(s, op, false);
  }
}

static void ps__remove_entry(ps_server *s, ps_entry *e) {
  for (int i = 0; i < s->n_ents; i++)
    if (s->ents[i] == e) {
      s->ents[i] = s->ents[--s->n_ents];
      break;
    }
  while (e->head) {
    ps_op *op = e->head;
    e->head = op->next;
    ps__op_fail(s, op, TSR_ENOTFOUND, "%s shard %d: its creation failed",
                e->spec.var.name, e->spec.shard.shard);
  }
  ps__entry_free(e, &s->mem);
}

static void ps__restore_swap_all(ps_server *s, ps_batch *b);

void ps__batch_finish(ps_server *s, ps_batch *b) {
  if (b->method == PS_M_RESTORE && !b->rc && b->pending == 0 && b->ents[0] &&
      b->loaded[0]) {
    /* phase 2: every shard loaded, swap each in as a write */
    ps__restore_swap_all(s, b);
    return;
  }
  if (b->method == PS_M_SAVE) {
    ps__save_snapped(s, b);
    return;
  }
  if (b->method == PS_M_SNAPSHOT) {
    ps__snapshot_taken(s, b);
    return;
  }
  if (b->rc) {
    tsr_rpc_reply_error(b->call, b->rc, b->err);
    ps__batch_free(s, b);
    return;
  }
  switch (b->method) {
    case PS_M_CREATE: {
      Tessera__Ps__CreateResponse m = TESSERA__PS__CREATE_RESPONSE__INIT;
      protobuf_c_boolean *cr = ps__calloc(&s->mem, b->n, sizeof *cr);
      for (size_t i = 0; cr && i < b->n; i++) cr[i] = b->created[i];
      m.n_created = cr ? b->n : 0;
      m.created = cr;
      ps__reply_msg(s, b->call, &m.base);
      ps__free(&s->mem, cr);
      break;
    }
    case PS_M_RESTORE: {
      Tessera__Ps__RestoreResponse m = TESSERA__PS__RESTORE_RESPONSE__INIT;
      m.shards = b->count;
      m.era = s->cons.era;
      ps__reply_msg(s, b->call, &m.base);
      break;
    }
    default: tsr_rpc_reply_error(b->call, TSR_EINVAL, "unknown batch"); break;
  }
  ps__batch_free(s, b);
}

/* ---- pool work of create, save, restore --------------------------------------*/

void ps__admin_work(ps_server *s, ps_op *op) {
  ps_entry *e = op->e;
  switch (op->kind) {
    case PS_OP_CREATE:
      op->rc = ps__shard_new(&e->spec, &s->mem, &op->loaded, op->err,
                             sizeof op->err);
      break;
    default: op->rc = TSR_EINVAL; break;
  }
}

void ps__admin_after(ps_server *s, ps_op *op) {
  ps_batch *b = op->batch;
  ps_entry *e = op->e;
  if (op->kind == PS_OP_SNAP || op->kind == PS_OP_UNSNAP) {
    ps__save_op(s, op);
    return;
  }
  if (op->kind == PS_OP_RSNAP || op->kind == PS_OP_RUNSNAP) {
    ps__rsnap_op(s, op);
    return;
  }
  switch (op->kind) {
    case PS_OP_CREATE:
      if (op->rc) {
        if (!b->rc) {
          b->rc = op->rc;
          snprintf(b->err, sizeof b->err, "%s", op->err);
        }
        ps__remove_entry(s, e);
        e = NULL;
      } else {
        e->sh = op->loaded;
        e->version = e->sh->version;
      }
      break;
    case PS_OP_SWAP:
      ps__shard_free(e->sh, &s->mem);
      e->sh = op->loaded;
      /* it holds that checkpoint: increments may build on it */
      ps__dirty_restored(e->sh, &s->mem, b->who.id);
      e->version = e->sh->version;
      e->step = e->sh->step;
      e->n_pushed = 0;
      b->count++;
      break;
    default: break;
  }
  ps__free(&s->mem, op);
  if (e) ps__dispatch(s, e);
  ps__batch_done(s, b);
}

/* ---- create -------------------------------------------------------------------*/

static void ps__on_create(tsr_rpc_incoming *call, void *data) {
  ps_server *s = data;
  Tessera__Ps__CreateRequest *r = call->request;
  char err[512];
  ps_var_spec *specs = ps__calloc(&s->mem, r->n_vars, sizeof *specs);
  ps_batch *b = ps__batch_new(s, call, r->n_vars);
  if (!specs || !b) {
    ps__free(&s->mem, specs);
    if (b) ps__batch_free(s, b);
    tsr_rpc_reply_error(call, TSR_ENOMEM, "out of memory");
    return;
  }
  /* check every spec before creating any; initial values are read only
   * from regular files under the checkpoint root */
  for (size_t i = 0; i < r->n_vars; i++) {
    int rc = ps__spec_from_proto(r->vars[i], &specs[i], err, sizeof err);
    if (!rc && specs[i].init_path[0]) {
      char what[TSR_VAR_NAME_MAX + 32];
      snprintf(what, sizeof what, "create: %s: init_path",
               specs[i].var.name);
      rc = ps__root_file(s, what, specs[i].init_path,
                         sizeof specs[i].init_path, err, sizeof err);
    }
    ps_entry *e =
        rc ? NULL : ps__find(s, specs[i].var.name, specs[i].shard.shard);
    if (!rc && e && !ps__spec_equal(&e->spec, &specs[i])) {
      snprintf(err, sizeof err,
               "%s shard %d already exists with another "
               "spec (shape, rows, initializer, seed or optimizer differ)",
               specs[i].var.name, specs[i].shard.shard);
      rc = TSR_EEXISTS;
    }
    if (rc) {
      tsr_rpc_reply_error(call, rc, err);
      ps__batch_free(s, b);
      ps__free(&s->mem, specs);
      return;
    }
  }
  for (size_t i = 0; i < r->n_vars; i++) {
    if (ps__find(s, specs[i].var.name, specs[i].shard.shard)) continue;
    if (s->n_ents == s->cap_ents) {
      int nc = s->cap_ents ? 2 * s->cap_ents : 16;
      ps_entry **ne = ps__realloc(&s->mem, s->ents,
                                  (size_t)s->cap_ents * sizeof *ne,
                                  (size_t)nc * sizeof *ne);
      if (ne) {
        s->ents = ne;
        s->cap_ents = nc;
      }
    }
    ps_entry *e = s->n_ents < s->cap_ents ? calloc(1, sizeof *e) : NULL;
    ps_op *op = e ? ps__batch_op(s, b, e, PS_OP_CREATE) : NULL;
    if (!op) {
      ps__free(&s->mem, e);
      b->rc = TSR_ENOMEM;
      snprintf(b->err, sizeof b->err, "out of memory creating %s",
               specs[i].var.name);
      break;
    }
    e->spec = specs[i];
    e->width = ps__spec_width(&specs[i]);
    e->numel = ps_var_spec_sparse(&specs[i])
                   ? 0
                   : (size_t)(specs[i].shard.rows * e->width);
    s->ents[s->n_ents++] = e;
    b->created[i] = true;
    ps__enqueue(s, op, false);
  }
  ps__free(&s->mem, specs);
  ps__batch_done(s, b);
}

/* ---- clocks and config -----------------------------------------------------------*/

/* JOIN, LEAVE and TICK (the model's ps__cons_join, ps__cons_leave and
 * ps__cons_clock). The answer carries the worker's clock (JOIN) and the
 * era. */
static void ps__on_clock(tsr_rpc_incoming *call, void *data) {
  ps_server *s = data;
  Tessera__Ps__ClockRequest *r = call->request;
  char msg[384] = "";
  int64_t clock = -1;
  int rc;
  if (r->op != TESSERA__PS__CLOCK_REQUEST__OP__CLOCK &&
      r->op != TESSERA__PS__CLOCK_REQUEST__OP__JOIN &&
      r->op != TESSERA__PS__CLOCK_REQUEST__OP__LEAVE) {
    snprintf(msg, sizeof msg, "clock: op %d is not CLOCK (0), JOIN (1) or "
             "LEAVE (2)", (int)r->op);
    tsr_rpc_reply_error(call, TSR_EINVAL, msg);
    return;
  }
  if (r->worker < 0 || r->worker > PS_WORKER_MAX || r->clock < 0 ||
      r->clock > TSR_STEP_MAX) {
    snprintf(msg, sizeof msg, "clock: worker %" PRId32 " (in [0, %d]) or "
             "clock %" PRId64 " (in [0, 2^62]) out of range", r->worker,
             PS_WORKER_MAX, r->clock);
    tsr_rpc_reply_error(call, TSR_EINVAL, msg);
    return;
  }
  switch (r->op) {
    case TESSERA__PS__CLOCK_REQUEST__OP__JOIN: {
      ps_join_req q = {.worker = r->worker, .clock = r->clock, .era = r->era,
                       .run = r->run_id, .closure = r->closure};
      int64_t next = s->cons.mode == PS_MODE_SYNC
                         ? ps__sync_next(s, r->worker) : 0;
      rc = ps__cons_join(&s->cons, &q, next, &clock, msg, sizeof msg);
      break;
    }
    case TESSERA__PS__CLOCK_REQUEST__OP__LEAVE:
      rc = ps__cons_leave(&s->cons, r->worker, r->run_id, r->closure);
      if (rc == TSR_ENOTFOUND) rc = 0; /* no member (any more): harmless */
      break;
    default:
      rc = ps__cons_clock(&s->cons, r->worker, r->clock, r->era);
      if (rc == TSR_ESTALE)
        snprintf(msg, sizeof msg, "clock: worker %d is no member of this "
                 "era (the parameter server was reset, or the worker left): "
                 "it joins again", r->worker);
      break;
  }
  if (rc) {
    if (!msg[0])
      snprintf(msg, sizeof msg, "clock: worker %d clock %" PRId64 " refused",
               r->worker, r->clock);
    tsr_rpc_reply_error(call, rc, msg);
    return;
  }
  ps__sync_check(s);
  ps__wake(s);
  Tessera__Ps__ClockResponse m = TESSERA__PS__CLOCK_RESPONSE__INIT;
  int64_t mc = ps__cons_min_clock(&s->cons);
  m.min_clock = mc == INT64_MAX ? -1 : mc;
  m.active = ps__cons_active(&s->cons);
  m.clock = clock;
  m.era = s->cons.era;
  ps__reply_msg(s, call, &m.base);
}

static void ps__on_config(tsr_rpc_incoming *call, void *data) {
  ps_server *s = data;
  Tessera__Ps__ConfigRequest *r = call->request;
  ps_mode mode;
  int st;
  if (ps__mode_parse(r->mode, &mode, &st)) {
    char msg[300];
    snprintf(msg, sizeof msg, "mode \"%.200s\" is not async, ssp:S or sync",
             r->mode ? r->mode : "");
    tsr_rpc_reply_error(call, TSR_EINVAL, msg);
    return;
  }
  if (r->trace && r->trace_pid < 0) {
    char msg[120];
    snprintf(msg, sizeof msg, "config: trace_pid %" PRId32 " must be >= 0",
             r->trace_pid);
    tsr_rpc_reply_error(call, TSR_EINVAL, msg);
    return;
  }
  int rc = r->checkpoint_root && r->checkpoint_root[0]
               ? ps__root_set(s, r->checkpoint_root, false)
               : 0;
  if (rc) {
    char msg[900];
    if (rc == TSR_EEXISTS)
      snprintf(msg, sizeof msg, "config: checkpoint_root \"%.300s\": this "
               "parameter server keeps %.300s, named by its first configure "
               "(the root never moves; start it with --checkpoint-root to name "
               "it)", r->checkpoint_root, s->ckpt_root);
    else
      snprintf(msg, sizeof msg, "config: checkpoint_root \"%.300s\" is not a "
               "usable folder (\"/\" never is)", r->checkpoint_root);
    tsr_rpc_reply_error(call, rc == TSR_EEXISTS ? TSR_EEXISTS : TSR_EINVAL,
                        msg);
    return;
  }
  ps__cons_set_mode(&s->cons, mode, st);
  /* a new era: whatever ran before (another chief's run, this chief
   * before it restarted) is refused from here on */
  ps__reset(s, r->run_id, 0);
  s->await_restore = r->hold_until_restore;
  s->allow_nonfinite = r->allow_nonfinite || s->opts.allow_nonfinite;
  if (r->trace && !s->trace && tsr_trace_create(&s->trace, 0) == 0) {
    s->trace_pid = r->trace_pid;
    tsr_trace_name_process(s->trace, s->trace_pid, "ps applies");
  }
  ps__sync_check(s);
  ps__wake(s);
  Tessera__Ps__ConfigResponse m = TESSERA__PS__CONFIG_RESPONSE__INIT;
  m.mode = r->mode && r->mode[0] ? r->mode : (char *)"async";
  m.era = s->cons.era;
  ps__reply_msg(s, call, &m.base);
}

/* ---- save and restore ------------------------------------------------------------*/

/* A checkpoint id as requests carry it: at most PS_CKPT_ID_MAX bytes of
 * [A-Za-z0-9._-] (it goes into file headers and logs), and its step. */
static int ps__check_ckpt_id(const char *what, const char *id, int64_t step,
                             char *msg, size_t len) {
  size_t n = id ? strlen(id) : 0;
  bool ok = n <= PS_CKPT_ID_MAX;
  for (size_t i = 0; ok && i < n; i++) {
    char c = id[i];
    ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
  }
  if (!ok)
    return tsr_errf(msg, len, TSR_EINVAL, "%s: checkpoint_id \"%.80s\" is "
                    "not up to %d bytes of [A-Za-z0-9._-]", what, id,
                    PS_CKPT_ID_MAX);
  if (step < 0 || step > TSR_STEP_MAX)
    return tsr_errf(msg, len, TSR_EINVAL, "%s: step %" PRId64 " is not in "
                    "[0, 2^62]", what, step);
  return 0;
}

int ps__ckpt_request(ps_server *s, tsr_rpc_incoming *call, const char *what,
                     const char *dir, const char *id, int64_t step,
                     char *path, size_t pathlen) {
  char msg[1200];
  int rc = ps__root_resolve(s, what, dir, path, pathlen, msg, sizeof msg);
  if (!rc) rc = ps__check_ckpt_id(what, id, step, msg, sizeof msg);
  if (rc) tsr_rpc_reply_error(call, rc, msg);
  return rc;
}

ps_batch *ps__ckpt_batch(ps_server *s, tsr_rpc_incoming *call, size_t n,
                         const char *path, const char *id, int64_t step) {
  ps_batch *b = ps__batch_new(s, call, n);
  if (!b) {
    tsr_rpc_reply_error(call, TSR_ENOMEM, "out of memory");
    return NULL;
  }
  snprintf(b->dir, sizeof b->dir, "%s", path);
  snprintf(b->who.id, sizeof b->who.id, "%s", id);
  b->who.step = step;
  return b;
}

typedef struct {
  ps_server *s;
  ps_batch *b;
  size_t i;
  uv_work_t work;
  int rc;
  char err[512];
} ps__load_job;

static void ps__load_work(uv_work_t *w) {
  ps__load_job *j = w->data;
  ps_batch *b = j->b;
  ps_entry *e = b->ents[j->i];
  if (!b->n_chain) {
    j->rc = ps__ckpt_load_shard(&e->spec, &j->s->mem, b->dir, &b->who,
                                &b->loaded[j->i], j->err, sizeof j->err);
    return;
  }
  /* the whole checkpoint, each increment over it, then dir's */
  const char *dirs[PS_CHAIN_MAX + 1];
  ps_ckpt_ident who[PS_CHAIN_MAX + 1];
  for (size_t k = 0; k < b->n_chain; k++) {
    dirs[k] = b->chain[k];
    who[k] = b->chain_who[k];
  }
  dirs[b->n_chain] = b->dir;
  who[b->n_chain] = b->who;
  j->rc = ps__ckpt_load_chain(&e->spec, &j->s->mem, dirs, who, b->n_chain + 1,
                              &b->loaded[j->i], j->err, sizeof j->err);
}

static void ps__load_after(uv_work_t *w, int status) {
  ps__load_job *j = w->data;
  ps_server *s = j->s;
  ps_batch *b = j->b;
  s->works--;
  if (j->rc && !b->rc) {
    b->rc = j->rc;
    snprintf(b->err, sizeof b->err, "restore failed, nothing changed: %s",
             j->err);
  }
  ps__free(&s->mem, j);
  ps__batch_done(s, b);
  ps__maybe_finish(s);
}

static void ps__restore_swap_all(ps_server *s, ps_batch *b) {
  /* the restored values start a new era at the checkpoint's step: no call
   * from before lands on them (ps__cons_reset), and the swaps queue behind
   * what is queued already */
  ps__reset(s, s->cons.run, b->who.step);
  b->pending = 1;
  for (size_t i = 0; i < b->n; i++) {
    ps_op *op = ps__batch_op(s, b, b->ents[i], PS_OP_SWAP);
    if (!op) {
      /* cannot happen in practice; the shards stay as they were */
      b->rc = TSR_ENOMEM;
      snprintf(b->err, sizeof b->err, "out of memory during restore");
      break;
    }
    op->loaded = b->loaded[i];
    b->loaded[i] = NULL;
    ps__enqueue(s, op, false);
  }
  b->ents[0] = NULL; /* phase 2 started */
  ps__restored(s);
  ps__batch_done(s, b);
}

/* The folders an increment builds on, each under the checkpoint root
 * and with its checkpoint id and step checked as the restored one's: 0,
 * or the call answered with the error. */
static int ps__restore_chain(ps_server *s, tsr_rpc_incoming *call,
                             const Tessera__Ps__RestoreRequest *r,
                             ps_batch *b) {
  char msg[300];
  if (r->n_chain > PS_CHAIN_MAX) {
    snprintf(msg, sizeof msg, "restore: a chain of %zu checkpoints, more "
             "than %d", r->n_chain, PS_CHAIN_MAX);
    tsr_rpc_reply_error(call, TSR_EINVAL, msg);
    return TSR_EINVAL;
  }
  b->chain = ps__calloc(&s->mem, r->n_chain, sizeof *b->chain);
  b->chain_who = ps__calloc(&s->mem, r->n_chain, sizeof *b->chain_who);
  if (!b->chain || !b->chain_who) {
    tsr_rpc_reply_error(call, TSR_ENOMEM, "out of memory");
    return TSR_ENOMEM;
  }
  for (size_t k = 0; k < r->n_chain; k++) {
    const Tessera__Ps__ChainLink *l = r->chain[k];
    int rc = ps__ckpt_request(s, call, "restore chain", l->dir,
                              l->checkpoint_id, l->step, b->chain[k],
                              sizeof b->chain[k]);
    if (rc) return rc;
    snprintf(b->chain_who[k].id, sizeof b->chain_who[k].id, "%s",
             l->checkpoint_id ? l->checkpoint_id : "");
    b->chain_who[k].step = l->step;
  }
  b->n_chain = r->n_chain;
  return 0;
}

static void ps__on_restore(tsr_rpc_incoming *call, void *data) {
  ps_server *s = data;
  Tessera__Ps__RestoreRequest *r = call->request;
  char msg[1200], path[PS_PATH_MAX];
  int rc = ps__ckpt_request(s, call, "restore", r->dir, r->checkpoint_id,
                            r->step, path, sizeof path);
  if (rc) return;
  size_t n = r->n_shards ? r->n_shards : (size_t)s->n_ents;
  ps_batch *b = ps__ckpt_batch(s, call, n, path, r->checkpoint_id, r->step);
  if (!b) return;
  if (r->n_chain && ps__restore_chain(s, call, r, b)) {
    ps__batch_free(s, b);
    return;
  }
  for (size_t i = 0; i < n; i++) {
    ps_entry *e = r->n_shards ? ps__find(s, r->shards[i]->name,
                                         r->shards[i]->shard)
                              : s->ents[i];
    if (!e || !e->sh) {
      snprintf(msg, sizeof msg, "restore: %s shard %d is not created on this "
               "parameter server", r->n_shards ? r->shards[i]->name : "?",
               r->n_shards ? r->shards[i]->shard : -1);
      tsr_rpc_reply_error(call, TSR_ENOTFOUND, msg);
      ps__batch_free(s, b);
      return;
    }
    for (size_t j = 0; j < i; j++)
      if (b->ents[j] == e) {
        snprintf(msg, sizeof msg, "restore: shards[%zu] names %s shard %d "
                 "again", i, e->spec.var.name, e->spec.shard.shard);
        tsr_rpc_reply_error(call, TSR_EINVAL, msg);
        ps__batch_free(s, b);
        return;
      }
    b->ents[i] = e;
  }
  if (n == 0) {
    ps__reset(s, s->cons.run, b->who.step);
    ps__restored(s);
    ps__batch_done(s, b);
    return;
  }
  for (size_t i = 0; i < n; i++) {
    ps__load_job *j = ps__calloc(&s->mem, 1, sizeof *j);
    if (!j) {
      b->rc = TSR_ENOMEM;
      break;
    }
    j->s = s;
    j->b = b;
    j->i = i;
    j->work.data = j;
    b->pending++;
    s->works++;
    rc = uv_queue_work(s->loop, &j->work, ps__load_work, ps__load_after);
    if (rc) {
      s->works--;
      b->pending--;
      b->rc = rc;
      ps__free(&s->mem, j);
      break;
    }
  }
  ps__batch_done(s, b);
}

/* ---- stats and shutdown -----------------------------------------------------------*/

/* The trace answer's bytes, freed once written. */
typedef struct {
  ps_server *s;
  uint8_t bytes[];
} ps__wire;

static void ps__trace_sent(int status, void *data) {
  (void)status;
  ps__wire *w = data;
  ps__free(&w->s->mem, w);
}

/* The stats answer with the recorded apply events as its payload. */
static void ps__reply_trace(ps_server *s, tsr_rpc_incoming *call,
                            Tessera__Ps__StatsResponse *m) {
  enum { MAX_EV = 65536 };
  tsr_trace_event *ev = ps__alloc(&s->mem, MAX_EV * sizeof *ev);
  size_t n = ev ? tsr_trace_drain(s->trace, ev, MAX_EV) : 0;
  ps__wire *wire = ps__alloc(&s->mem, sizeof *wire + n * TSR_TRACE_WIRE_SIZE);
  size_t len = protobuf_c_message_get_packed_size(&m->base) + 16;
  uint8_t *meta = ps__alloc(&s->mem, len);
  if (!ev || !wire || !meta) {
    ps__free(&s->mem, ev);
    ps__free(&s->mem, wire);
    ps__free(&s->mem, meta);
    tsr_rpc_reply_error(call, TSR_ENOMEM, "out of memory");
    return;
  }
  wire->s = s;
  tsr_trace_pack(ev, n, wire->bytes);
  ps__free(&s->mem, ev);
  m->trace_events = n;
  len = protobuf_c_message_pack(&m->base, meta);
  uv_buf_t b = uv_buf_init((char *)wire->bytes,
                           (unsigned)(n * TSR_TRACE_WIRE_SIZE));
  if (tsr_rpc_reply(call, meta, len, &b, 1, ps__trace_sent, wire)) {
    ps__free(&s->mem, wire);
    tsr_rpc_reply_error(call, TSR_ETOOBIG, "trace answer refused");
  }
  ps__free(&s->mem, meta);
}

static void ps__on_stats(tsr_rpc_incoming *call, void *data) {
  ps_server *s = data;
  Tessera__Ps__StatsResponse m = TESSERA__PS__STATS_RESPONSE__INIT;
  tsr_rpc_stats rs;
  tsr_rpc_server_stats(s->rpc, &rs);
  m.bytes_in = rs.bytes_in;
  m.bytes_out = rs.bytes_out;
  tsr_rpc_method_stats ms[32];
  size_t nm = tsr_rpc_server_method_stats(s->rpc, ms, 32);
  if (nm > 32) nm = 32;
  Tessera__Ps__MethodStats mst[32], *mp[32];
  for (size_t i = 0; i < nm; i++) {
    tessera__ps__method_stats__init(&mst[i]);
    mst[i].name = (char *)ms[i].name;
    mst[i].calls = ms[i].calls;
    mst[i].errors = ms[i].errors;
    mst[i].bytes_in = ms[i].bytes_in;
    mst[i].bytes_out = ms[i].bytes_out;
    mst[i].total_ns = ms[i].total_ns;
    mp[i] = &mst[i];
  }
  m.n_methods = nm;
  m.methods = mp;
  size_t ns = (size_t)s->n_ents;
  Tessera__Ps__ShardStats *sst = ps__calloc(&s->mem, ns, sizeof *sst);
  Tessera__Ps__ShardStats **sp = ps__calloc(&s->mem, ns, sizeof *sp);
  if (!sst || !sp) {
    ps__free(&s->mem, sst);
    ps__free(&s->mem, sp);
    tsr_rpc_reply_error(call, TSR_ENOMEM, "out of memory");
    return;
  }
  for (size_t i = 0; i < ns; i++) {
    ps_entry *e = s->ents[i];
    tessera__ps__shard_stats__init(&sst[i]);
    sst[i].name = e->spec.var.name;
    sst[i].shard = e->spec.shard.shard;
    sst[i].version = e->version;
    sst[i].step = e->step;
    sst[i].applies = e->applies;
    sst[i].apply_ns = e->apply_ns;
    m.applies += e->applies;
    m.apply_ns += e->apply_ns;
    if (e->sh && !e->writing) { /* a running writer owns these fields */
      sst[i].rows = e->sh->rows.count;
      sst[i].mem_bytes = e->sh->mem_bytes + ps__rows_bytes(&e->sh->rows);
    }
    sp[i] = &sst[i];
  }
  m.n_shards = ns;
  m.shards = sp;
  m.mem_used = atomic_load(&s->mem.used);
  m.mem_limit = s->mem.limit;
  m.nonfinite_rejected = s->nonfinite;
  m.max_read_lead = s->max_read_lead;
  char mode[32];
  if (s->cons.mode == PS_MODE_SSP)
    snprintf(mode, sizeof mode, "ssp:%d", s->cons.staleness);
  else
    snprintf(mode, sizeof mode, "%s", s->cons.mode == PS_MODE_SYNC ? "sync" : "async");
  m.mode = mode;
  int64_t mc = ps__cons_min_clock(&s->cons);
  m.min_clock = mc == INT64_MAX ? -1 : mc;
  m.workers_active = ps__cons_active(&s->cons);
  m.era = s->cons.era;
  m.sync_step = ps__sync_step(s);
  Tessera__Ps__StatsRequest *req = call->request;
  if (req && req->drain_trace && s->trace)
    ps__reply_trace(s, call, &m);
  else
    ps__reply_msg(s, call, &m.base);
  ps__free(&s->mem, sst);
  ps__free(&s->mem, sp);
}

static void ps__shutdown_sent(int status, void *data) {
  ps_server *s = data;
  tsr_info("shutdown requested: exiting");
  if (s->opts.on_shutdown) s->opts.on_shutdown(s, s->opts.data);
}

static void ps__on_shutdown(tsr_rpc_incoming *call, void *data) {
  ps_server *s = data;
  const Tessera__Ps__ShutdownRequest *q = call->request;
  if (q && q->job_done) s->job_done = true;
  Tessera__Ps__ShutdownResponse m = TESSERA__PS__SHUTDOWN_RESPONSE__INIT;
  uint8_t buf[16];
  size_t len = tessera__ps__shutdown_response__pack(&m, buf);
  if (tsr_rpc_reply(call, buf, len, NULL, 0, ps__shutdown_sent, s))
    tsr_rpc_reply_error(call, TSR_EINVAL, "answer refused");
}

int ps__register_admin(ps_server *s) {
  const struct {
    uint32_t m;
    const char *name;
    tsr_rpc_handler h;
    const ProtobufCMessageDescriptor *d;
  } ms[] = {
      {PS_M_CREATE, "ps.Create", ps__on_create,
       &tessera__ps__create_request__descriptor},
      {PS_M_CLOCK, "ps.Clock", ps__on_clock,
       &tessera__ps__clock_request__descriptor},
      {PS_M_CONFIG, "ps.Config", ps__on_config,
       &tessera__ps__config_request__descriptor},
      {PS_M_SAVE, "ps.Save", ps__on_save, &tessera__ps__save_request__descriptor},
      {PS_M_SAVE_WAIT, "ps.SaveWait", ps__on_save_wait,
       &tessera__ps__save_wait_request__descriptor},
      {PS_M_SNAPSHOT, "ps.Snapshot", ps__on_snapshot,
       &tessera__ps__snapshot_request__descriptor},
      {PS_M_RESTORE, "ps.Restore", ps__on_restore,
       &tessera__ps__restore_request__descriptor},
      {PS_M_STATS, "ps.Stats", ps__on_stats,
       &tessera__ps__stats_request__descriptor},
      {PS_M_SHUTDOWN, "ps.Shutdown", ps__on_shutdown,
       &tessera__ps__shutdown_request__descriptor},
  };
  for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) {
    tsr_rpc_method m = {0};
    m.method = ms[i].m;
    m.name = ms[i].name;
    m.handler = ms[i].h;
    m.data = s;
    m.request_type = ms[i].d;
    int rc = tsr_rpc_server_register_method(s->rpc, &m);
    if (rc) return rc;
  }
  return 0;
}
