/* The PS's data methods (ps.Pull, ps.PullRows, ps.Push, ps.PushRows,
 * ps.PushPull): request decoding and checks, on the loop.
 *
 * Happy path. A request names a worker, a clock or step, a variable's
 * shard, a dtype and counts; every field is checked against the shard
 * (dense or sparse, n_ids, the payload's exact length, the answer's size
 * against the payload limit) with checked arithmetic, then the call
 * becomes an op handed to gate.c (ps__admit / ps__pull_ready).
 * Failure modes: nothing is changed before every check passed; a bad
 * request is answered with TSR_EINVAL, TSR_ESHAPE, TSR_EDTYPE, TSR_ETOOBIG
 * or TSR_ENOTFOUND and a message naming the field, its value, the
 * variable and the shard; out of memory answers TSR_ENOMEM.
 */
#include "ps/svc_int.h"
#include "common/err.h"
#include "common/size.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

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

/* Answers `call` with `code` and a message that names e's variable and
 * shard, then the reason; returns `code`. */
static int ps__refuse(tsr_rpc_incoming *call, const ps_entry *e, int code,
                      const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int ps__refuse(tsr_rpc_incoming *call, const ps_entry *e, int code,
                      const char *fmt, ...) {
  char msg[512];
  int n = snprintf(msg, sizeof msg, "%s shard %d: ", e->spec.var.name,
                   e->spec.shard.shard);
  if (n < 0 || (size_t)n >= sizeof msg) n = 0;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg + n, sizeof msg - (size_t)n, fmt, ap);
  va_end(ap);
  tsr_rpc_reply_error(call, code, msg);
  return code;
}

/* Answers a dense call on a sparse shard or the reverse, naming the
 * method to use instead. */
static void ps__refuse_kind(tsr_rpc_incoming *call, const ps_entry *e,
                            const char *method) {
  char msg[512];
  bool sparse = ps_var_spec_sparse(&e->spec);
  snprintf(msg, sizeof msg, "%s is %s: use %s%s", e->spec.var.name,
           sparse ? "sparse" : "dense", method, sparse ? " rows" : "");
  tsr_rpc_reply_error(call, TSR_EINVAL, msg);
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
  if (tsr_mul3_size((size_t)n, (size_t)e->width, sizeof(float), bytes) ||
      n > SIZE_MAX || *bytes > s->max_answer) {
    return ps__refuse(call, e, TSR_ETOOBIG,
                      "%s %" PRIu64 " rows of width %" PRId64
                      " would answer more than the payload limit of %zu bytes",
                      field, n, e->width, s->max_answer);
  }
  return 0;
}

/* Charges `bytes` of answer buffers (gathered rows, a bfloat16 copy, ids
 * copied for alignment) to the memory budget before any is built, so
 * answers count against --memory-limit like shards do. TSR_EMEMLIMIT
 * (answered, with the figures) when they do not fit. */
static int ps__reserve_answer(ps_server *s, tsr_rpc_incoming *call,
                              const ps_entry *e, size_t bytes) {
  if (!bytes || ps__mem_reserve(&s->mem, bytes) == 0) return 0;
  return ps__refuse(call, e, TSR_EMEMLIMIT,
                    "its answer needs %zu bytes, over the memory limit (%zu "
                    "of %zu bytes in use): ask for fewer rows at a time, or "
                    "start the parameter server with a larger --memory-limit",
                    bytes, atomic_load(&s->mem.used), s->mem.limit);
}

/* An op for the call, with `hold` bytes of memory reserved for its
 * answer (ps__reserve_answer); NULL with the call answered. */
static ps_op *ps__new_op(ps_server *s, tsr_rpc_incoming *call, ps_entry *e,
                         ps_op_kind k, size_t hold) {
  if (ps__reserve_answer(s, call, e, hold)) return NULL;
  ps_op *op = ps__calloc(&s->mem, 1, sizeof *op);
  if (!op) {
    ps__mem_release(&s->mem, hold);
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
  op->reserved = hold;
  return op;
}

/* What a pull's answer holds besides the shard itself: the rows gathered
 * and a copy of their ids (rows), or a bfloat16 copy (dense). */
static size_t ps__answer_bytes(const ps_entry *e, bool rows, size_t out_len,
                               uint64_t n_ids, int dtype) {
  if (rows) return out_len + (size_t)n_ids * 8; /* both checked by caller */
  return dtype == PS_DT_BF16 ? e->numel * sizeof(uint16_t) : 0;
}

static void ps__on_pull(tsr_rpc_incoming *call, void *data) {
  ps_server *s = data;
  Tessera__Ps__PullRequest *r = call->request;
  if (ps__check_who(call, "pull", r->worker, "clock", r->clock)) return;
  ps_entry *e = ps__lookup(s, call, r->name, r->shard);
  if (!e) return;
  bool rows = call->method == PS_M_PULL_ROWS;
  if (rows != ps_var_spec_sparse(&e->spec)) {
    ps__refuse_kind(call, e, "pull");
    return;
  }
  size_t want = 0, out_len = 0;
  if (!rows && r->n_ids) {
    ps__refuse(call, e, TSR_EINVAL,
               "n_ids %" PRIu64 " on a dense pull (must be 0)", r->n_ids);
    return;
  }
  if (rows && (r->n_ids > SIZE_MAX ||
               tsr_mul_size((size_t)r->n_ids, 8, &want) ||
               call->payload_len != want)) {
    ps__refuse(call, e, TSR_ESHAPE,
               "n_ids %" PRIu64
               " does not match a payload of %zu bytes (8 per id)",
               r->n_ids, call->payload_len);
    return;
  }
  if (rows && ps__rows_answer(s, call, e, "n_ids", r->n_ids, &out_len))
    return;
  if (!rows && call->payload_len != 0) {
    ps__refuse(call, e, TSR_ESHAPE,
               "a dense pull carries no payload, got %zu bytes",
               call->payload_len);
    return;
  }
  if (r->dtype != PS_DT_F32 && r->dtype != PS_DT_BF16) {
    ps__refuse(call, e, TSR_EDTYPE,
               "pull dtype %d is not one of float32 (0), bfloat16 (1)",
               r->dtype);
    return;
  }
  size_t hold = ps__answer_bytes(e, rows, out_len, r->n_ids, r->dtype);
  ps_op *op = ps__new_op(s, call, e, rows ? PS_OP_PULL_ROWS : PS_OP_PULL,
                         hold);
  if (!op) return;
  op->worker = r->worker;
  op->clock = r->clock;
  op->n_ids = r->n_ids;
  op->out_len = out_len;
  op->era = r->era;
  op->pull_dtype = r->dtype;
  op->snapshot = r->snapshot;
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
  bool fused = call->method == PS_M_PUSH_PULL;
  bool rows =
      call->method == PS_M_PUSH_ROWS || (fused && ps_var_spec_sparse(&e->spec));
  if (rows != ps_var_spec_sparse(&e->spec)) {
    ps__refuse_kind(call, e, "push");
    return;
  }
  size_t dsz = ps__dtype_size(r->dtype);
  if (!dsz) {
    ps__refuse(call, e, TSR_EDTYPE,
               "gradient dtype %d is not one of float32 (0), bfloat16 (1), "
               "float16 (2)",
               r->dtype);
    return;
  }
  if (fused && r->pull_dtype != PS_DT_F32 && r->pull_dtype != PS_DT_BF16) {
    ps__refuse(call, e, TSR_EDTYPE,
               "pull dtype %d is not one of float32 (0), bfloat16 (1)",
               r->pull_dtype);
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
    ps__refuse(call, e, TSR_EINVAL,
               "n_pull_ids %" PRIu64
               " on a push that pulls nothing (must be 0)",
               r->n_pull_ids);
    return;
  }
  if (!rows && r->n_ids) {
    ps__refuse(call, e, TSR_EINVAL,
               "n_ids %" PRIu64 " on a dense push (must be 0)", r->n_ids);
    return;
  }
  if (bad || call->payload_len != want) {
    if (rows)
      ps__refuse(call, e, TSR_ESHAPE,
                 "n_ids %" PRIu64 " rows of width %" PRId64
                 " in %s (and n_pull_ids %" PRIu64
                 ") do not match a payload of %zu bytes",
                 r->n_ids, e->width, ps__dtype_name(r->dtype), r->n_pull_ids,
                 call->payload_len);
    else
      ps__refuse(call, e, TSR_ESHAPE,
                 "gradient of %zu bytes does not match the shard's %zu "
                 "elements in %s (%zu bytes)",
                 call->payload_len, e->numel, ps__dtype_name(r->dtype), want);
    return;
  }
  if (fused && rows &&
      ps__rows_answer(s, call, e, "n_pull_ids", r->n_pull_ids, &out_len))
    return;
  /* the ids of a row push may be copied for alignment; a fused push then
   * answers like a pull */
  size_t hold = (rows ? (size_t)r->n_ids * 8 : 0) +
                (fused ? ps__answer_bytes(e, rows, out_len, r->n_pull_ids,
                                          r->pull_dtype)
                       : 0);
  ps_op *op = ps__new_op(s, call, e, PS_OP_PUSH, hold);
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
