/* The PS service core: per-shard operation queues, pulls and pushes.
 *
 * Happy path. A pull of a dense shard is answered on the loop with the
 * shard's own memory as the payload buffer (no copy) while the shard counts
 * one more reader; the reader count drops in the answer's done callback.
 * A push is checked on the loop (variable, shard, dtype, length), then
 * applied on libuv's thread pool as the shard's only writer, converting
 * bfloat16/float16 to float32 and refusing NaN/Inf first; the answer goes
 * out from the after-work callback on the loop. Writes wait for readers to
 * finish, so a pull never sees half an update. Fused push-then-pull turns
 * into a pull of the same shard once its write is done.
 * ssp pulls and sync pulls/pushes whose condition does not hold yet wait
 * on the server's list, re-checked after every apply, clock and
 * membership change, and every 200 ms (to drop calls whose peer is gone).
 * The conditions are the clock protocol of ps/consist.c (the Spin model
 * tests/model/clock.pml): in ssp and sync a push needs a member, and any
 * call of an era before the last reset (config, restore) is refused.
 * Failure modes: every bad request gets an error naming the variable,
 * shard and the problem, before anything is changed.
 */
#include "ps/svc_int.h"
#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"
#include "common/size.h"
#include "common/trace.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

ps_entry *ps__find(ps_server *s, const char *name, int shard) {
  for (int i = 0; i < s->n_ents; i++) {
    ps_entry *e = s->ents[i];
    if (e->spec.shard == shard && strcmp(e->spec.name, name) == 0) return e;
  }
  return NULL;
}

void ps__entry_free(ps_entry *e, ps_mem *mem) {
  if (!e) return;
  ps__shard_free(e->sh, mem);
  ps__free(mem, e->pushed);
  ps__free(mem, e->scratch);
  ps__free(mem, e);
}

static bool ps__is_write(ps_op_kind k) { return k >= PS_OP_PUSH; }

static void ps__op_free(ps_op *op) {
  ps_mem *m = &op->srv->mem;
  ps__free(m, op->out);
  ps__free(m, op->ids_copy);
  /* a restored shard whose swap never ran (the server closed first) */
  ps__shard_free(op->loaded, m);
  ps__free(m, op);
}

void ps__reply_msg(ps_server *s, tsr_rpc_incoming *call,
                   const ProtobufCMessage *m) {
  uint8_t small[256];
  size_t len = protobuf_c_message_get_packed_size(m);
  uint8_t *buf = len <= sizeof small ? small : ps__alloc(&s->mem, len);
  if (!buf) {
    tsr_rpc_reply_error(call, TSR_ENOMEM, "out of memory packing the answer");
    return;
  }
  protobuf_c_message_pack(m, buf);
  int rc = tsr_rpc_reply(call, buf, len, NULL, 0, NULL, NULL);
  if (rc) tsr_rpc_reply_error(call, rc, "answer refused by the RPC layer");
  if (buf != small) ps__free(&s->mem, buf);
}

void ps__batch_done(ps_server *s, ps_batch *b) {
  if (--b->pending > 0) return;
  ps__batch_finish(s, b);
}

void ps__op_fail(ps_server *s, ps_op *op, int rc, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (op->batch) {
    if (!op->batch->rc) {
      op->batch->rc = rc;
      snprintf(op->batch->err, sizeof op->batch->err, "%s", msg);
    }
    ps_batch *b = op->batch;
    ps__op_free(op);
    ps__batch_done(s, b);
    return;
  }
  if (op->call) tsr_rpc_reply_error(op->call, rc, msg);
  ps__op_free(op);
}

/* ---- answering pulls -------------------------------------------------------*/

typedef struct {
  ps_server *s;
  ps_entry *e;
} ps__read_ref;

static void ps__read_done(int status, void *data) {
  ps__read_ref *r = data;
  ps_server *s = r->s;
  ps_entry *e = r->e;
  ps__free(&s->mem, r);
  e->readers--;
  ps__dispatch(s, e);
  ps__maybe_finish(s);
}

static void ps__rows_sent(int status, void *data);

/* Answers with the shard's values in bfloat16: a converted copy the op
 * holds (made on the loop, where no write can run meanwhile), freed with
 * the op once written. */
static void ps__answer_dense_bf16(ps_server *s, ps_op *op) {
  ps_entry *e = op->e;
  size_t nbytes = e->numel * sizeof(uint16_t);
  op->out = ps__alloc(&s->mem, nbytes);
  if (!op->out) {
    ps__op_fail(s, op, TSR_ENOMEM, "%s shard %d: out of memory for a "
                "bfloat16 answer of %zu bytes", e->spec.name, e->spec.shard,
                nbytes);
    return;
  }
  op->out_len = nbytes;
  ps_bf16_from_f32((uint16_t *)op->out, e->sh->w, e->numel);
  Tessera__Ps__PullResponse m = TESSERA__PS__PULL_RESPONSE__INIT;
  m.version = e->sh->version;
  m.step = e->sh->step;
  m.nbytes = nbytes;
  uint8_t meta[64];
  size_t mlen = tessera__ps__pull_response__pack(&m, meta);
  uv_buf_t b = uv_buf_init((char *)op->out, (unsigned)nbytes);
  int rc = tsr_rpc_reply(op->call, meta, mlen, &b, nbytes ? 1 : 0,
                         ps__rows_sent, op);
  if (rc)
    ps__op_fail(s, op, rc, "%s shard %d: answer of %zu bytes refused",
                e->spec.name, e->spec.shard, nbytes);
}

/* Answers with the shard's values as the payload, no copy: the shard keeps
 * one more reader until the bytes are written. */
static void ps__answer_dense(ps_server *s, ps_op *op) {
  ps_entry *e = op->e;
  if (op->pull_dtype == PS_DT_BF16 &&
      (uint64_t)e->numel * sizeof(uint16_t) <= UINT32_MAX) {
    ps__answer_dense_bf16(s, op);
    return;
  }
  if ((uint64_t)e->numel * sizeof(float) > UINT32_MAX) {
    ps__op_fail(s, op, TSR_ETOOBIG, "%s shard %d: %zu bytes is more than one "
                "answer can carry (4 GiB): use more shards", e->spec.name,
                e->spec.shard, e->numel * sizeof(float));
    return;
  }
  ps__read_ref *ref = ps__alloc(&s->mem, sizeof *ref);
  if (!ref) {
    ps__op_fail(s, op, TSR_ENOMEM, "out of memory");
    return;
  }
  Tessera__Ps__PullResponse m = TESSERA__PS__PULL_RESPONSE__INIT;
  m.version = e->sh->version;
  m.step = e->sh->step;
  m.nbytes = e->numel * sizeof(float);
  uint8_t meta[64];
  size_t mlen = tessera__ps__pull_response__pack(&m, meta);
  uv_buf_t b = uv_buf_init((char *)e->sh->w, (unsigned)m.nbytes);
  ref->s = s;
  ref->e = e;
  e->readers++;
  int rc = tsr_rpc_reply(op->call, meta, mlen, &b, m.nbytes ? 1 : 0,
                         ps__read_done, ref);
  if (rc) {
    e->readers--;
    ps__free(&s->mem, ref);
    ps__op_fail(s, op, rc, "%s shard %d: answer of %" PRIu64 " bytes refused "
                "(over the peer's limit?)", e->spec.name, e->spec.shard,
                (uint64_t)m.nbytes);
    return;
  }
  ps__op_free(op);
}

/* The answer's rows are written: the op (which holds them) goes. */
static void ps__rows_sent(int status, void *data) { ps__op_free(data); }

static void ps__answer_rows(ps_server *s, ps_op *op) {
  Tessera__Ps__PullResponse m = TESSERA__PS__PULL_RESPONSE__INIT;
  m.version = op->version;
  m.step = op->shard_step;
  m.nbytes = op->out_len;
  uint8_t meta[64];
  size_t mlen = tessera__ps__pull_response__pack(&m, meta);
  uv_buf_t b = uv_buf_init((char *)op->out, (unsigned)op->out_len);
  int rc = tsr_rpc_reply(op->call, meta, mlen, &b, op->out_len ? 1 : 0,
                         ps__rows_sent, op);
  if (rc)
    ps__op_fail(s, op, rc, "%s: answer of %zu bytes refused", op->e->spec.name,
                op->out_len);
}

/* ---- the pool ---------------------------------------------------------------*/

static const int64_t *ps__ids(ps_op *op, const uint8_t *p, size_t n) {
  if (((uintptr_t)p & 7) == 0) return (const int64_t *)p;
  ps__free(&op->srv->mem, op->ids_copy);
  op->ids_copy = ps__calloc(&op->srv->mem, n, sizeof(int64_t));
  if (op->ids_copy) memcpy(op->ids_copy, p, n * sizeof(int64_t));
  return op->ids_copy;
}

static void ps__do_push(ps_server *s, ps_op *op) {
  ps_entry *e = op->e;
  ps_shard *sh = e->sh;
  size_t n = e->spec.sparse ? op->n_ids * (size_t)e->width : e->numel;
  const uint8_t *gp = op->payload + (e->spec.sparse ? op->n_ids * 8 : 0);
  const int64_t *ids = NULL;
  /* a push of no rows (a worker's step that touched none of this shard's
   * rows; sync counts it) has no payload and nothing to apply */
  if (e->spec.sparse && op->n_ids &&
      !(ids = ps__ids(op, op->payload, op->n_ids))) {
    op->rc = TSR_ENOMEM;
    return;
  }
  const float *g;
  int finite;
  if (op->dtype == PS_DT_F32 && ((uintptr_t)gp & 3) == 0) {
    g = (const float *)gp;
    finite = op->allow_nonfinite || ps__all_finite(g, n);
  } else {
    if (e->scratch_cap < n) {
      ps__free(&s->mem, e->scratch);
      e->scratch = ps__calloc(&s->mem, n, sizeof(float));
      e->scratch_cap = e->scratch ? n : 0;
      if (!e->scratch) {
        op->rc = TSR_ENOMEM;
        return;
      }
    }
    finite = ps__grad_to_f32(gp, op->dtype, n, e->scratch);
    g = e->scratch;
  }
  if (!finite && !op->allow_nonfinite) {
    size_t at = 0;
    while (at < n && ps__all_finite(g + at, 1)) at++;
    op->rc = TSR_ENONFINITE;
    snprintf(op->err, sizeof op->err,
             "%s shard %d: gradient from worker %d has a NaN or Inf (element "
             "%zu of %zu); refused, nothing applied", e->spec.name,
             e->spec.shard, op->worker, at, n);
    return;
  }
  if (op->sync) {
    op->rc = e->spec.sparse
                 ? ps__shard_accum_rows(sh, &s->mem, ids, op->n_ids, g, op->err,
                                        sizeof op->err)
                 : ps__shard_accum_dense(sh, &s->mem, g);
  } else if (e->spec.sparse) {
    op->rc = ps__shard_apply_rows(sh, &s->mem, ids, op->n_ids, g, 1.0f,
                                  op->err, sizeof op->err);
  } else {
    op->rc = ps__shard_apply_dense(sh, g, 1.0f);
  }
  if (op->rc && !op->err[0])
    snprintf(op->err, sizeof op->err, "%s shard %d: %s", e->spec.name,
             e->spec.shard, tsr_strerror(op->rc));
}

static void ps__do_gather(ps_server *s, ps_op *op) {
  ps_entry *e = op->e;
  size_t skip = op->kind == PS_OP_PULL_ROWS && op->fused
                    ? op->n_ids * 8 + op->n_ids * (size_t)e->width *
                                          ps__dtype_size(op->dtype)
                    : 0;
  size_t n = op->fused ? op->n_pull : op->n_ids;
  const int64_t *ids = ps__ids(op, op->payload + skip, n);
  /* op->out_len: n rows of the shard's width, checked by the handler */
  op->out = ps__alloc(&s->mem, op->out_len);
  if (!ids || !op->out) {
    op->rc = TSR_ENOMEM;
    return;
  }
  op->rc = ps__shard_gather(e->sh, &s->mem, ids, n, op->out, false, op->err,
                            sizeof op->err);
  if (op->rc == 0 && op->pull_dtype == PS_DT_BF16) {
    size_t k = n * (size_t)e->width; /* in place (see ps_bf16_from_f32) */
    ps_bf16_from_f32((uint16_t *)op->out, op->out, k);
    op->out_len = k * sizeof(uint16_t);
  }
}

static void ps__work_cb(uv_work_t *w) {
  ps_op *op = w->data;
  ps_server *s = op->srv;
  int64_t t0 = s->trace ? tsr_trace_now_us() : 0;
  switch (op->kind) {
    case PS_OP_PUSH: ps__do_push(s, op); break;
    case PS_OP_PULL_ROWS: ps__do_gather(s, op); break;
    case PS_OP_SYNC_APPLY: /* op->worker: the divisor, fixed on the loop */
      op->rc = op->worker > 0
                   ? ps__shard_accum_apply(op->e->sh, &s->mem, op->worker,
                                           op->err, sizeof op->err)
                   : 0; /* a step nobody took part in: skipped */
      break;
    case PS_OP_SYNC_CLEAR:
      ps__shard_accum_clear(op->e->sh);
      break;
    default: ps__admin_work(s, op); break;
  }
  if (s->trace && (op->kind == PS_OP_PUSH ||
                   (op->kind == PS_OP_SYNC_APPLY && op->worker > 0))) {
    char name[TSR_TRACE_NAME_MAX];
    snprintf(name, sizeof name, "apply %s", op->e->spec.name);
    tsr_trace_end(s->trace, s->trace_pid, 1 + op->e->spec.shard, "ps", name,
                  t0);
  }
  if (op->e->sh) {
    op->version = op->e->sh->version;
    op->shard_step = op->e->sh->step;
  }
}

static void ps__pull_ready(ps_server *s, ps_op *op, bool front);

static void ps__after_cb(uv_work_t *w, int status) {
  ps_op *op = w->data;
  ps_server *s = op->srv;
  ps_entry *e = op->e;
  s->works--;
  if (ps__is_write(op->kind))
    e->writing = false;
  else
    e->readers--;
  if (e->sh) {
    e->version = e->sh->version;
    e->step = e->sh->step;
    e->applies = e->sh->applies;
    e->apply_ns = e->sh->apply_ns;
  }
  switch (op->kind) {
    case PS_OP_PUSH:
      if (op->rc) {
        if (op->rc == TSR_ENONFINITE) s->nonfinite++;
        ps__op_fail(s, op, op->rc, "%s", op->err);
      } else if (op->fused) {
        /* the pull half: the same shard, now that the write is done */
        op->kind = e->spec.sparse ? PS_OP_PULL_ROWS : PS_OP_PULL;
        ps__pull_ready(s, op, true);
      } else {
        Tessera__Ps__PushResponse m = TESSERA__PS__PUSH_RESPONSE__INIT;
        m.version = op->version;
        m.step = op->shard_step;
        ps__reply_msg(s, op->call, &m.base);
        ps__op_free(op);
      }
      break;
    case PS_OP_PULL_ROWS:
      if (op->rc)
        ps__op_fail(s, op, op->rc, "%s", op->err[0] ? op->err : tsr_strerror(op->rc));
      else
        ps__answer_rows(s, op);
      break;
    case PS_OP_SYNC_APPLY:
      if (op->rc == TSR_ENOMEM) {
        /* nothing applied, the sum kept: the timer tries again (unless a
         * reset since dropped the sum with its era) */
        tsr_warn("%s shard %d: sync step %" PRId64 ": %s; trying again",
                 e->spec.name, e->spec.shard, e->sync_done,
                 op->err[0] ? op->err : tsr_strerror(op->rc));
        e->sync_queued = false;
        e->sync_retry = op->era == s->cons.era;
        ps__op_free(op);
        break;
      }
      if (op->rc)
        tsr_error("%s shard %d: sync step %" PRId64 " failed: %s",
                  e->spec.name, e->spec.shard, e->sync_done,
                  op->err[0] ? op->err : tsr_strerror(op->rc));
      if (op->era == s->cons.era) { /* a reset since: the new era's step */
        e->sync_done = op->clock;
        e->n_pushed = 0;
      }
      e->sync_queued = false;
      ps__op_free(op);
      break;
    case PS_OP_SYNC_CLEAR:
      ps__op_free(op);
      break;
    default:
      ps__admin_after(s, op); /* may free the entry; it dispatches itself */
      e = NULL;
      break;
  }
  if (e) ps__dispatch(s, e);
  ps__sync_check(s);
  ps__wake(s);
  ps__maybe_finish(s);
}

static void ps__start(ps_server *s, ps_op *op) {
  ps_entry *e = op->e;
  if (ps__is_write(op->kind))
    e->writing = true;
  else
    e->readers++;
  if (op->kind == PS_OP_SWAP) { /* on the loop: nothing to compute */
    e->writing = false;
    ps__admin_after(s, op);
    return;
  }
  op->work.data = op;
  s->works++;
  int rc = uv_queue_work(s->loop, &op->work, ps__work_cb, ps__after_cb);
  if (rc) {
    s->works--;
    if (ps__is_write(op->kind))
      e->writing = false;
    else
      e->readers--;
    ps__op_fail(s, op, rc, "cannot queue work: %s", uv_strerror(rc));
  }
}

void ps__dispatch(ps_server *s, ps_entry *e) {
  while (e->head) {
    ps_op *op = e->head;
    if (ps__is_write(op->kind) ? (e->writing || e->readers) : e->writing) break;
    e->head = op->next;
    if (!e->head) e->tail = NULL;
    op->next = NULL;
    if (op->kind == PS_OP_PULL) {
      ps__answer_dense(s, op);
      continue;
    }
    ps__start(s, op);
  }
}

void ps__enqueue(ps_server *s, ps_op *op, bool front) {
  ps_entry *e = op->e;
  op->next = NULL;
  if (front) {
    op->next = e->head;
    e->head = op;
    if (!e->tail) e->tail = op;
  } else {
    if (e->tail)
      e->tail->next = op;
    else
      e->head = op;
    e->tail = op;
  }
  ps__dispatch(s, e);
}

/* ---- consistency gates ------------------------------------------------------*/

/* 1: may go now; 0: wait; negative: refuse (err filled). The questions
 * of the model's wk__pull and wk__push, asked of one shard. */
static int ps__gate(ps_server *s, ps_op *op) {
  ps_entry *e = op->e;
  ps_consist *c = &s->cons;
  if (c->mode != PS_MODE_ASYNC && !ps__cons_era_ok(c, op->era)) {
    snprintf(op->err, sizeof op->err,
             "%s shard %d: the parameter server was reset (a restore or a "
             "new configuration) since worker %d joined: it joins again",
             e->spec.name, e->spec.shard, op->worker);
    return TSR_ESTALE;
  }
  /* a call of a joined worker (its era set) that is no member any more:
   * the chief said its closures are over, nobody will move a gate for it */
  if (c->mode != PS_MODE_ASYNC && op->era && op->kind != PS_OP_PUSH &&
      !ps__cons_member(c, op->worker)) {
    snprintf(op->err, sizeof op->err,
             "%s shard %d: worker %d is no member here any more (its closures "
             "are over): it joins again", e->spec.name, e->spec.shard,
             op->worker);
    return TSR_ESTALE;
  }
  if (op->kind == PS_OP_PUSH) {
    if (c->mode == PS_MODE_ASYNC) return 1;
    if (!ps__cons_member(c, op->worker)) {
      snprintf(op->err, sizeof op->err,
               "%s shard %d: worker %d is no member here (it left, or "
               "never joined): it joins again", e->spec.name, e->spec.shard,
               op->worker);
      return TSR_ESTALE;
    }
    if (c->mode == PS_MODE_SSP) return 1;
    if (op->step < e->sync_done) {
      snprintf(op->err, sizeof op->err,
               "%s shard %d: push for sync step %" PRId64 " from worker %d "
               "arrived after that step was applied (now at %" PRId64 ")",
               e->spec.name, e->spec.shard, op->step, op->worker,
               e->sync_done);
      return TSR_ESTALE;
    }
    /* a step ahead, or an apply running (maybe of the era before a
     * reset): wait */
    if (op->step > e->sync_done || e->sync_queued) return 0;
    for (int i = 0; i < e->n_pushed; i++)
      if (e->pushed[i] == op->worker) return 0; /* twice in a step: next */
    return 1;
  }
  switch (c->mode) {
    case PS_MODE_SSP: {
      if (!ps__cons_may_read(c, op->clock)) return 0;
      /* how far ahead of the slowest worker a read was let through */
      int64_t mc = ps__cons_min_clock(c);
      if ((op->kind == PS_OP_PULL || op->kind == PS_OP_PULL_ROWS ||
           op->kind == PS_OP_PUSH) &&
          mc != INT64_MAX && op->clock - mc > s->max_read_lead)
        s->max_read_lead = op->clock - mc;
      return 1;
    }
    case PS_MODE_SYNC: return e->sync_done >= op->clock;
    default: return 1;
  }
}

static int ps__note_push(ps_server *s, ps_entry *e, int worker) {
  if (e->n_pushed == e->cap_pushed) {
    int ncap = e->cap_pushed ? 2 * e->cap_pushed : 8;
    int *p = ps__realloc(&s->mem, e->pushed,
                         (size_t)e->cap_pushed * sizeof *p,
                         (size_t)ncap * sizeof *p);
    if (!p) return TSR_ENOMEM;
    e->pushed = p;
    e->cap_pushed = ncap;
  }
  e->pushed[e->n_pushed++] = worker;
  return 0;
}

static void ps__hold(ps_server *s, ps_op *op) {
  op->next = s->waiting;
  s->waiting = op;
}

/* Sends an op on its way: queued now, held, or refused. */
static void ps__admit(ps_server *s, ps_op *op, bool front) {
  int g = ps__gate(s, op);
  if (g < 0) {
    ps__op_fail(s, op, g, "%s", op->err);
    return;
  }
  if (g == 0) {
    ps__hold(s, op);
    return;
  }
  if (op->kind == PS_OP_PUSH && op->sync && ps__note_push(s, op->e, op->worker)) {
    ps__op_fail(s, op, TSR_ENOMEM, "out of memory");
    return;
  }
  /* ssp: a gradient of step t means its worker finished t + 1 steps (in
   * sync a worker may still owe other shards of step t) */
  if (op->kind == PS_OP_PUSH && s->cons.mode == PS_MODE_SSP) {
    uint64_t ep = s->cons.epoch;
    ps__cons_clock(&s->cons, op->worker, op->step + 1, op->era);
    if (s->cons.epoch != ep) s->cons_changed = true;
  }
  ps__enqueue(s, op, front);
}

static void ps__pull_ready(ps_server *s, ps_op *op, bool front) {
  int g = ps__gate(s, op);
  if (g < 0) {
    ps__op_fail(s, op, g, "%s", op->err);
    return;
  }
  if (g == 0) {
    ps__hold(s, op);
    return;
  }
  if (op->kind == PS_OP_PULL && !op->e->writing && front) {
    ps__answer_dense(s, op);
    return;
  }
  ps__enqueue(s, op, front);
}

static void ps__wake_once(ps_server *s);

/* Re-checks every held call; a push let through may move an ssp clock,
 * which may let more through: again until nothing changes. */
void ps__wake(ps_server *s) {
  if (s->waking) {
    s->cons_changed = true;
    return;
  }
  s->waking = true;
  do {
    s->cons_changed = false;
    ps__wake_once(s);
  } while (s->cons_changed && !s->closing);
  s->waking = false;
}

static void ps__wake_once(ps_server *s) {
  ps_op **pp = &s->waiting, *ready = NULL, **rt = &ready;
  while (*pp) {
    ps_op *op = *pp;
    if (s->closing) {
      *pp = op->next;
      ps__op_fail(s, op, TSR_ESHUTDOWN, "the parameter server is shutting down");
      continue;
    }
    if (op->call && tsr_rpc_incoming_dead(op->call)) {
      *pp = op->next;
      ps__op_fail(s, op, TSR_ECLOSED, "caller gone");
      continue;
    }
    int g = ps__gate(s, op);
    if (g == 0) {
      pp = &op->next;
      continue;
    }
    *pp = op->next;
    op->next = NULL;
    *rt = op;
    rt = &op->next;
  }
  /* oldest first: the list is newest first */
  ps_op *rev = NULL;
  while (ready) {
    ps_op *n = ready->next;
    ready->next = rev;
    rev = ready;
    ready = n;
  }
  while (rev) {
    ps_op *n = rev->next;
    ps__admit(s, rev, false);
    rev = n;
  }
}

static bool ps__pushed(void *ctx, int worker) {
  ps_entry *e = ctx;
  for (int i = 0; i < e->n_pushed; i++)
    if (e->pushed[i] == worker) return true;
  return false;
}

/* The model's PS process, first half: a shard whose step no member owes
 * queues its apply (the mean of what was pushed), or, pushed by nobody
 * and owed by nobody because every member is past it, skips to the
 * slowest member's clock. The set is closed while the apply runs (pushes
 * for the next step wait), and `sync_target` says where it ends, for the
 * joins meanwhile. */
void ps__sync_check(ps_server *s) {
  if (s->cons.mode != PS_MODE_SYNC || s->closing) return;
  for (int i = 0; i < s->n_ents; i++) {
    ps_entry *e = s->ents[i];
    if (!e->sh || e->sync_queued || e->sync_retry) continue;
    if (ps__cons_active(&s->cons) == 0 && e->n_pushed == 0) continue;
    if (!ps__cons_sync_ready(&s->cons, e->sync_done, ps__pushed, e)) continue;
    int64_t target = e->sync_done + 1;
    if (e->n_pushed == 0) {
      int64_t slowest = ps__cons_min_clock(&s->cons);
      if (slowest == INT64_MAX || slowest <= e->sync_done) continue;
      target = slowest;
    }
    ps_op *op = ps__calloc(&s->mem, 1, sizeof *op);
    if (!op) return; /* tried again at the next check */
    op->kind = PS_OP_SYNC_APPLY;
    op->e = e;
    op->srv = s;
    /* the mean of the gradients summed (0 pushes: nothing applied) */
    op->worker = e->n_pushed;
    op->clock = target;
    op->era = s->cons.era;
    e->sync_target = target;
    e->sync_queued = true;
    ps__enqueue(s, op, false);
  }
}

int64_t ps__sync_next(ps_server *s, int worker) {
  int64_t next = s->cons.base;
  for (int i = 0; i < s->n_ents; i++) {
    ps_entry *e = s->ents[i];
    int64_t n = e->sync_done;
    if (e->sync_queued)
      n = e->sync_target;
    else if (ps__pushed(e, worker))
      n = e->sync_done + 1;
    if (n > next) next = n;
  }
  return next;
}

int64_t ps__sync_step(const ps_server *s) {
  int64_t m = 0;
  for (int i = 0; i < s->n_ents; i++)
    if (s->ents[i]->sync_done > m) m = s->ents[i]->sync_done;
  return m;
}

void ps__reset(ps_server *s, uint64_t run, int64_t step) {
  ps__cons_reset(&s->cons, run, step);
  for (int i = 0; i < s->n_ents; i++) {
    ps_entry *e = s->ents[i];
    e->sync_done = s->cons.base;
    e->n_pushed = 0;
    e->sync_retry = false; /* the sum it kept goes with the old era */
    /* an apply still running belongs to the old era: it changes nothing
     * when it ends, and joins meanwhile start at the reset's step */
    if (e->sync_queued) e->sync_target = s->cons.base;
    /* the old era's sum goes, after the writes already queued */
    ps_op *op = e->sh ? ps__calloc(&s->mem, 1, sizeof *op) : NULL;
    if (op) {
      op->kind = PS_OP_SYNC_CLEAR;
      op->e = e;
      op->srv = s;
      ps__enqueue(s, op, false);
    }
  }
  ps__wake(s); /* held calls of the old era are refused */
  ps__sync_check(s);
}

/* ---- handlers -----------------------------------------------------------------*/

static ps_entry *ps__lookup(ps_server *s, tsr_rpc_incoming *call,
                            const char *name, int shard) {
  ps_entry *e = ps__find(s, name, shard);
  if (!e) {
    char msg[512];
    snprintf(msg, sizeof msg, "variable %s shard %d is not on this parameter "
             "server (create it first)", name, shard);
    tsr_rpc_reply_error(call, TSR_ENOTFOUND, msg);
  }
  return e;
}

static ps_op *ps__new_op(ps_server *s, tsr_rpc_incoming *call, ps_entry *e,
                         ps_op_kind k) {
  ps_op *op = ps__calloc(&s->mem, 1, sizeof *op);
  if (!op) {
    tsr_rpc_reply_error(call, TSR_ENOMEM, "out of memory");
    return NULL;
  }
  op->srv = s;
  op->call = call;
  op->e = e;
  op->kind = k;
  op->method = (int)call->method;
  op->payload = call->payload;
  op->payload_len = call->payload_len;
  return op;
}

/* Fields every pull and push carries: the worker (-1: a reader that is
 * no worker) and a step or clock. 0, or the call is answered with an
 * error naming the field and its value. */
static int ps__check_who(tsr_rpc_incoming *call, const char *what,
                         int32_t worker, const char *field, int64_t clock) {
  char msg[256];
  if (worker < -1 || worker > PS_WORKER_MAX) {
    snprintf(msg, sizeof msg, "%s: worker %" PRId32 " is not -1 or a worker "
             "index in [0, %d]", what, worker, PS_WORKER_MAX);
    tsr_rpc_reply_error(call, TSR_EINVAL, msg);
    return TSR_EINVAL;
  }
  if (clock < 0 || clock > TSR_STEP_MAX) {
    snprintf(msg, sizeof msg, "%s: %s %" PRId64 " is not in [0, 2^62]", what,
             field, clock);
    tsr_rpc_reply_error(call, TSR_EINVAL, msg);
    return TSR_EINVAL;
  }
  return 0;
}

/* Bytes of `n` gathered rows of e's width, refused (and answered) when
 * the product overflows or the answer would pass the payload limit. */
static int ps__rows_answer(ps_server *s, tsr_rpc_incoming *call,
                           const ps_entry *e, const char *field, uint64_t n,
                           size_t *bytes) {
  char msg[384];
  if (tsr_mul3_size((size_t)n, (size_t)e->width, sizeof(float), bytes) ||
      n > SIZE_MAX || *bytes > s->max_answer) {
    snprintf(msg, sizeof msg, "%s shard %d: %s %" PRIu64 " rows of width %"
             PRId64 " would answer more than the payload limit of %zu bytes",
             e->spec.name, e->spec.shard, field, n, e->width, s->max_answer);
    tsr_rpc_reply_error(call, TSR_ETOOBIG, msg);
    return TSR_ETOOBIG;
  }
  return 0;
}

static void ps__on_pull(tsr_rpc_incoming *call, void *data) {
  ps_server *s = data;
  Tessera__Ps__PullRequest *r = call->request;
  if (ps__check_who(call, "pull", r->worker, "clock", r->clock)) return;
  ps_entry *e = ps__lookup(s, call, r->name, r->shard);
  if (!e) return;
  char msg[512];
  bool rows = call->method == PS_M_PULL_ROWS;
  if (rows != e->spec.sparse) {
    snprintf(msg, sizeof msg, "%s is %s: use %s", e->spec.name,
             e->spec.sparse ? "sparse" : "dense",
             e->spec.sparse ? "pull rows" : "pull");
    tsr_rpc_reply_error(call, TSR_EINVAL, msg);
    return;
  }
  size_t want = 0, out_len = 0;
  if (!rows && r->n_ids) {
    snprintf(msg, sizeof msg, "%s shard %d: n_ids %" PRIu64 " on a dense "
             "pull (must be 0)", e->spec.name, e->spec.shard, r->n_ids);
    tsr_rpc_reply_error(call, TSR_EINVAL, msg);
    return;
  }
  if (rows && (r->n_ids > SIZE_MAX ||
               tsr_mul_size((size_t)r->n_ids, 8, &want) ||
               call->payload_len != want)) {
    snprintf(msg, sizeof msg, "%s shard %d: n_ids %" PRIu64 " does not match "
             "a payload of %zu bytes (8 per id)", e->spec.name, e->spec.shard,
             r->n_ids, call->payload_len);
    tsr_rpc_reply_error(call, TSR_ESHAPE, msg);
    return;
  }
  if (rows && ps__rows_answer(s, call, e, "n_ids", r->n_ids, &out_len))
    return;
  if (!rows && call->payload_len != 0) {
    snprintf(msg, sizeof msg, "%s shard %d: a dense pull carries no payload, "
             "got %zu bytes", e->spec.name, e->spec.shard, call->payload_len);
    tsr_rpc_reply_error(call, TSR_ESHAPE, msg);
    return;
  }
  if (r->dtype != PS_DT_F32 && r->dtype != PS_DT_BF16) {
    snprintf(msg, sizeof msg, "%s shard %d: pull dtype %d is not one of "
             "float32 (0), bfloat16 (1)", e->spec.name, e->spec.shard,
             r->dtype);
    tsr_rpc_reply_error(call, TSR_EDTYPE, msg);
    return;
  }
  ps_op *op = ps__new_op(s, call, e, rows ? PS_OP_PULL_ROWS : PS_OP_PULL);
  if (!op) return;
  op->worker = r->worker;
  op->clock = r->clock;
  op->n_ids = r->n_ids;
  op->out_len = out_len;
  op->era = r->era;
  op->pull_dtype = r->dtype;
  ps__pull_ready(s, op, false);
}

static void ps__on_push(tsr_rpc_incoming *call, void *data) {
  ps_server *s = data;
  Tessera__Ps__PushRequest *r = call->request;
  if (ps__check_who(call, "push", r->worker, "step", r->step) ||
      ps__check_who(call, "push", r->worker, "pull_clock", r->pull_clock))
    return;
  ps_entry *e = ps__lookup(s, call, r->name, r->shard);
  if (!e) return;
  char msg[512];
  bool fused = call->method == PS_M_PUSH_PULL;
  bool rows = call->method == PS_M_PUSH_ROWS || (fused && e->spec.sparse);
  if (rows != e->spec.sparse) {
    snprintf(msg, sizeof msg, "%s is %s: use %s", e->spec.name,
             e->spec.sparse ? "sparse" : "dense",
             e->spec.sparse ? "push rows" : "push");
    tsr_rpc_reply_error(call, TSR_EINVAL, msg);
    return;
  }
  size_t dsz = ps__dtype_size(r->dtype);
  if (!dsz) {
    snprintf(msg, sizeof msg, "%s shard %d: gradient dtype %d is not one of "
             "float32 (0), bfloat16 (1), float16 (2)", e->spec.name,
             e->spec.shard, r->dtype);
    tsr_rpc_reply_error(call, TSR_EDTYPE, msg);
    return;
  }
  if (fused && r->pull_dtype != PS_DT_F32 && r->pull_dtype != PS_DT_BF16) {
    snprintf(msg, sizeof msg, "%s shard %d: pull dtype %d is not one of "
             "float32 (0), bfloat16 (1)", e->spec.name, e->spec.shard,
             r->pull_dtype);
    tsr_rpc_reply_error(call, TSR_EDTYPE, msg);
    return;
  }
  size_t want = 0, ids_b, grad_b, pull_b = 0, out_len = 0;
  int bad;
  if (rows) {
    bad = r->n_ids > SIZE_MAX || r->n_pull_ids > SIZE_MAX ||
          tsr_mul_size((size_t)r->n_ids, 8, &ids_b) ||
          tsr_mul3_size((size_t)r->n_ids, (size_t)e->width, dsz, &grad_b) ||
          tsr_mul_size((size_t)r->n_pull_ids, fused ? 8 : 0, &pull_b) ||
          tsr_add_size(ids_b, grad_b, &want) ||
          tsr_add_size(want, pull_b, &want);
  } else {
    bad = tsr_mul_size(e->numel, dsz, &want);
  }
  if (!fused && r->n_pull_ids) {
    snprintf(msg, sizeof msg, "%s shard %d: n_pull_ids %" PRIu64 " on a push "
             "that pulls nothing (must be 0)", e->spec.name, e->spec.shard,
             r->n_pull_ids);
    tsr_rpc_reply_error(call, TSR_EINVAL, msg);
    return;
  }
  if (!rows && r->n_ids) {
    snprintf(msg, sizeof msg, "%s shard %d: n_ids %" PRIu64 " on a dense push "
             "(must be 0)", e->spec.name, e->spec.shard, r->n_ids);
    tsr_rpc_reply_error(call, TSR_EINVAL, msg);
    return;
  }
  if (bad || call->payload_len != want) {
    if (rows)
      snprintf(msg, sizeof msg, "%s shard %d: n_ids %" PRIu64 " rows of width "
               "%" PRId64 " in %s (and n_pull_ids %" PRIu64 ") do not match a "
               "payload of %zu bytes", e->spec.name, e->spec.shard, r->n_ids,
               e->width, ps__dtype_name(r->dtype), r->n_pull_ids,
               call->payload_len);
    else
      snprintf(msg, sizeof msg, "%s shard %d: gradient of %zu bytes does not "
               "match the shard's %zu elements in %s (%zu bytes)",
               e->spec.name, e->spec.shard, call->payload_len, e->numel,
               ps__dtype_name(r->dtype), want);
    tsr_rpc_reply_error(call, TSR_ESHAPE, msg);
    return;
  }
  if (fused && rows &&
      ps__rows_answer(s, call, e, "n_pull_ids", r->n_pull_ids, &out_len))
    return;
  ps_op *op = ps__new_op(s, call, e, PS_OP_PUSH);
  if (!op) return;
  op->worker = r->worker;
  op->step = r->step;
  op->dtype = r->dtype;
  op->n_ids = r->n_ids;
  op->n_pull = r->n_pull_ids;
  op->fused = fused;
  op->clock = r->pull_clock;
  op->out_len = out_len;
  op->pull_dtype = fused ? r->pull_dtype : PS_DT_F32;
  op->sync = s->cons.mode == PS_MODE_SYNC;
  op->allow_nonfinite = s->allow_nonfinite;
  op->era = r->era;
  s->cons_changed = false;
  ps__admit(s, op, false);
  if (s->cons_changed) ps__wake(s);
}

void ps__timer_cb(uv_timer_t *t) {
  ps_server *s = t->data;
  /* sync applies that ran out of memory, or could not be queued */
  for (int i = 0; i < s->n_ents; i++) s->ents[i]->sync_retry = false;
  ps__sync_check(s);
  ps__wake(s);
}

int ps__register_data(ps_server *s) {
  static const struct {
    uint32_t m;
    const char *name;
    bool push;
  } ms[] = {
      {PS_M_PULL, "ps.Pull", false},
      {PS_M_PULL_ROWS, "ps.PullRows", false},
      {PS_M_PUSH, "ps.Push", true},
      {PS_M_PUSH_ROWS, "ps.PushRows", true},
      {PS_M_PUSH_PULL, "ps.PushPull", true},
  };
  for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) {
    tsr_rpc_method m = {0};
    m.method = ms[i].m;
    m.name = ms[i].name;
    m.handler = ms[i].push ? ps__on_push : ps__on_pull;
    m.data = s;
    m.request_type = ms[i].push ? &tessera__ps__push_request__descriptor
                                : &tessera__ps__pull_request__descriptor;
    int rc = tsr_rpc_server_register_method(s->rpc, &m);
    if (rc) return rc;
  }
  return 0;
}
