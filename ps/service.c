/* The PS service core: per-shard operation queues, the pool's work and
 * what happens when it is done (the op completion switch), and the
 * answers of pulls.
 *
 * Happy path. A pull of a dense shard is answered on the loop with the
 * shard's own memory as the payload buffer (no copy) while the shard counts
 * one more reader; the reader count drops in the answer's done callback.
 * A push (checked on the loop by data.c, admitted by gate.c) is applied on
 * libuv's thread pool as the shard's only writer, converting
 * bfloat16/float16 to float32 and refusing NaN/Inf first; the answer goes
 * out from the after-work callback on the loop. Writes wait for readers to
 * finish, so a pull never sees half an update. Fused push-then-pull turns
 * into a pull of the same shard once its write is done. A sync apply that
 * ran out of memory keeps its sum and is marked for the timer to retry
 * (in its own era only).
 * Failure modes: a failed write answers its code with a message naming
 * the variable and shard; an answer the RPC layer refuses (over the peer's
 * limit, 4 GiB) is an error naming the byte count; out of memory anywhere
 * fails the one op, never the server.
 */
#include "ps/svc_int.h"
#include "common/clock.h"
#include "common/err.h"
#include "common/list.h"
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
    if (e->spec.shard.shard == shard && strcmp(e->spec.var.name, name) == 0)
      return e;
  }
  return NULL;
}

void ps__entry_free(ps_entry *e, ps_mem *mem) {
  if (!e) return;
  ps__shard_free(e->sh, mem);
  ps__free(mem, e->pushed);
  ps__free(mem, e->scratch);
  ps__mem_release(mem, e->scratch_cap * sizeof(float));
  ps__free(mem, e);
}

static bool ps__is_write(ps_op_kind k) { return k >= PS_OP_PUSH; }

static void ps__op_free(ps_op *op) {
  ps_mem *m = &op->srv->mem;
  ps__free(m, op->out);
  ps__free(m, op->ids_copy);
  ps__mem_release(m, op->reserved);
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
static void ps__answer_dense_bf16(ps_server *s, ps_op *op, const float *w) {
  ps_entry *e = op->e;
  size_t nbytes = e->numel * sizeof(uint16_t);
  op->out = ps__alloc(&s->mem, nbytes);
  if (!op->out) {
    ps__op_fail(s, op, TSR_ENOMEM,
                "%s shard %d: out of memory for a "
                "bfloat16 answer of %zu bytes",
                e->spec.var.name, e->spec.shard.shard, nbytes);
    return;
  }
  op->out_len = nbytes;
  ps_bf16_from_f32((uint16_t *)op->out, w, e->numel);
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
                e->spec.var.name, e->spec.shard.shard, nbytes);
}

/* Answers with the shard's values as the payload, no copy: the shard keeps
 * one more reader until the bytes are written. */
void ps__answer_dense(ps_server *s, ps_op *op) {
  ps_entry *e = op->e;
  /* an evaluation's pull: the values its snapshot holds */
  const float *w = e->sh->w;
  if (op->snapshot) {
    ps_snap *v = ps__snapshot_of(e, op->snapshot);
    if (!v) {
      ps__op_fail(s, op, TSR_ENOTFOUND, "%s shard %d: no snapshot %" PRIu64
                  " (released, replaced, or this parameter server "
                  "restarted since it was taken)", e->spec.var.name,
                  e->spec.shard.shard, op->snapshot);
      return;
    }
    w = ps__snap_dense(v);
  }
  if (op->pull_dtype == PS_DT_BF16 &&
      (uint64_t)e->numel * sizeof(uint16_t) <= UINT32_MAX) {
    ps__answer_dense_bf16(s, op, w);
    return;
  }
  if ((uint64_t)e->numel * sizeof(float) > UINT32_MAX) {
    ps__op_fail(s, op, TSR_ETOOBIG,
                "%s shard %d: %zu bytes is more than one "
                "answer can carry (4 GiB): use more shards",
                e->spec.var.name, e->spec.shard.shard,
                e->numel * sizeof(float));
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
  uv_buf_t b = uv_buf_init((char *)w, (unsigned)m.nbytes);
  ref->s = s;
  ref->e = e;
  e->readers++;
  int rc = tsr_rpc_reply(op->call, meta, mlen, &b, m.nbytes ? 1 : 0,
                         ps__read_done, ref);
  if (rc) {
    e->readers--;
    ps__free(&s->mem, ref);
    ps__op_fail(s, op, rc,
                "%s shard %d: answer of %" PRIu64
                " bytes refused "
                "(over the peer's limit?)",
                e->spec.var.name, e->spec.shard.shard, (uint64_t)m.nbytes);
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
    ps__op_fail(s, op, rc, "%s: answer of %zu bytes refused",
                op->e->spec.var.name, op->out_len);
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
  size_t n =
      ps_var_spec_sparse(&e->spec) ? op->n_ids * (size_t)e->width : e->numel;
  /* a push of no rows carries no payload at all: no offset from NULL */
  const uint8_t *gp =
      op->payload && ps_var_spec_sparse(&e->spec) ? op->payload + op->n_ids * 8
                                                  : op->payload;
  const int64_t *ids = NULL;
  /* a push of no rows (a worker's step that touched none of this shard's
   * rows; sync counts it) has no payload and nothing to apply */
  if (ps_var_spec_sparse(&e->spec) && op->n_ids &&
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
      /* the shard's only writer runs here: the buffer is its own */
      ps__free(&s->mem, e->scratch);
      ps__mem_release(&s->mem, e->scratch_cap * sizeof(float));
      e->scratch = NULL;
      e->scratch_cap = 0;
      if (ps__mem_reserve(&s->mem, n * sizeof(float))) {
        op->rc = TSR_EMEMLIMIT;
        snprintf(op->err, sizeof op->err, "%s shard %d: converting a "
                 "gradient of %s needs %zu bytes, over the memory limit (%zu "
                 "of %zu bytes in use)", e->spec.var.name,
                 e->spec.shard.shard, ps__dtype_name(op->dtype),
                 n * sizeof(float), atomic_load(&s->mem.used), s->mem.limit);
        return;
      }
      e->scratch = ps__calloc(&s->mem, n, sizeof(float));
      if (!e->scratch) {
        ps__mem_release(&s->mem, n * sizeof(float));
        op->rc = TSR_ENOMEM;
        return;
      }
      e->scratch_cap = n;
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
             "%zu of %zu); refused, nothing applied",
             e->spec.var.name, e->spec.shard.shard, op->worker, at, n);
    return;
  }
  if (op->sync) {
    op->rc = ps_var_spec_sparse(&e->spec)
                 ? ps__shard_accum_rows(sh, &s->mem, ids, op->n_ids, g, op->err,
                                        sizeof op->err)
                 : ps__shard_accum_dense(sh, &s->mem, g);
  } else if (ps_var_spec_sparse(&e->spec)) {
    op->rc = ps__shard_apply_rows(sh, &s->mem, ids, op->n_ids, g, 1.0f,
                                  op->err, sizeof op->err);
  } else {
    op->rc = ps__shard_apply_dense(sh, g, 1.0f);
  }
  if (op->rc && !op->err[0])
    snprintf(op->err, sizeof op->err, "%s shard %d: %s", e->spec.var.name,
             e->spec.shard.shard, tsr_strerror(op->rc));
}

static void ps__do_gather(ps_server *s, ps_op *op) {
  ps_entry *e = op->e;
  size_t skip = op->kind == PS_OP_PULL_ROWS && op->fused
                    ? op->n_ids * 8 + op->n_ids * (size_t)e->width *
                                          ps__dtype_size(op->dtype)
                    : 0;
  size_t n = op->fused ? op->n_pull : op->n_ids;
  const int64_t *ids = ps__ids(op, op->payload ? op->payload + skip : NULL, n);
  /* op->out_len: n rows of the shard's width, checked by the handler */
  op->out = ps__alloc(&s->mem, op->out_len);
  if (!ids || !op->out) {
    op->rc = TSR_ENOMEM;
    return;
  }
  if (op->snapshot) { /* an evaluation's pull: as its snapshot holds them */
    ps_snap *v = ps__snapshot_of(e, op->snapshot);
    op->rc = v ? ps__shard_gather_snap(e->sh, v, ids, n, op->out, op->err,
                                       sizeof op->err)
               : tsr_errf(op->err, sizeof op->err, TSR_ENOTFOUND,
                          "%s shard %d: no snapshot %" PRIu64 " (released, "
                          "replaced, or this parameter server restarted "
                          "since it was taken)", e->spec.var.name,
                          e->spec.shard.shard, op->snapshot);
  } else {
    op->rc = ps__shard_gather(e->sh, &s->mem, ids, n, op->out, false,
                              op->err, sizeof op->err);
  }
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
    snprintf(name, sizeof name, "apply %s", op->e->spec.var.name);
    tsr_trace_end(s->trace, s->trace_pid, 1 + op->e->spec.shard.shard, "ps",
                  name, t0);
  }
  if (op->e->sh) {
    op->version = op->e->sh->version;
    op->shard_step = op->e->sh->step;
  }
}


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
        op->kind = ps_var_spec_sparse(&e->spec) ? PS_OP_PULL_ROWS : PS_OP_PULL;
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
        e->sync_queued = false;
        e->sync_retry = op->era == s->cons.era;
        tsr_warn("%s shard %d: sync step %" PRId64 ": %s; %s", e->spec.var.name,
                 e->spec.shard.shard, e->sync_done,
                 op->err[0] ? op->err : tsr_strerror(op->rc),
                 e->sync_retry ? "trying again"
                               : "dropped with its era (a reset since)");
        ps__op_free(op);
        break;
      }
      if (op->rc)
        tsr_error("%s shard %d: sync step %" PRId64 " failed: %s",
                  e->spec.var.name, e->spec.shard.shard, e->sync_done,
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

/* Ops of at most this many values run on the loop thread, from its idle
 * callback, instead of on libuv's pool: for them the two hand-offs
 * between threads (a futex wake there, an eventfd write back) cost more
 * than the work, and on a machine whose cores the workers use every
 * hand-off is a context switch. A few microseconds of work each, so the
 * loop's other connections barely wait. */
#define PS__INLINE_VALUES 65536

static bool ps__runs_inline(const ps_op *op) {
  const ps_entry *e = op->e;
  size_t w = (size_t)e->width;
  switch (op->kind) {
    case PS_OP_PUSH:
      return (ps_var_spec_sparse(&e->spec) ? op->n_ids * w : e->numel) <=
             PS__INLINE_VALUES;
    case PS_OP_PULL_ROWS:
      return (op->fused ? op->n_pull : op->n_ids) * w <= PS__INLINE_VALUES;
    default:
      return false;
  }
}

/* The idle callback: every small op queued so far, its work then what
 * the pool's after-work callback would do, at the top of the loop (never
 * inside a caller of ps__dispatch). Ops these queue wait for the next
 * round; the handle stops when none is left. */
static void ps__idle_cb(uv_idle_t *h) {
  ps_server *s = h->data;
  ps_op *op = s->inl_head;
  s->inl_head = s->inl_tail = NULL;
  while (op) {
    ps_op *next = op->next;
    op->next = NULL;
    ps__work_cb(&op->work);
    ps__after_cb(&op->work, 0);
    op = next;
  }
  if (!s->inl_head) uv_idle_stop(&s->idle);
}

static void ps__start(ps_server *s, ps_op *op) {
  ps_entry *e = op->e;
  if (ps__is_write(op->kind))
    e->writing = true;
  else
    e->readers++;
  if (op->kind == PS_OP_SWAP || op->kind == PS_OP_SNAP ||
      op->kind == PS_OP_UNSNAP || op->kind == PS_OP_RSNAP ||
      op->kind == PS_OP_RUNSNAP) { /* on the loop: nothing to compute */
    e->writing = false;
    ps__admin_after(s, op);
    return;
  }
  op->work.data = op;
  s->works++;
  if (ps__runs_inline(op)) {
    tsr_fifo_append(s->inl_head, s->inl_tail, op);
    uv_idle_start(&s->idle, ps__idle_cb);
    return;
  }
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
    /* the old shard goes with the swap: not while a snapshot reads it */
    if (op->kind == PS_OP_SWAP && e->sh && e->sh->snap &&
        !ps__snap_let_go(e->sh->snap))
      break;
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
