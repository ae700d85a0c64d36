/* The multi-PS client (client.h, "tickets over a shard layout").
 *
 * Happy path: a submitting thread turns a request into one call per shard
 * under the mutex (a dense variable's row slice; a sparse variable's run of
 * sorted ids found by binary search), reserves a ticket slot, converts
 * bfloat16 gradients into a pooled staging buffer outside the mutex, then
 * queues the calls and wakes the loop with the async handle. The loop
 * issues every queued call through the per-PS ps_client (one connection
 * per PS, in submission order) and records each completion in its ticket
 * slot; the last one stamps the ticket done and wakes the waiters.
 * bfloat16 values are read into the first half of the caller's float
 * destination and widened there in place.
 * Failure modes: a call the client refuses at once and a call that fails
 * later both complete with their code; the ticket keeps the first failure
 * with a message naming the PS, its address, the variable and the shard,
 * and still waits for every call, so no buffer is touched after the
 * waiter moves on. A connection lost while calls are in flight in hold
 * mode resets every connection (on the next loop wake, never from inside a
 * client callback); calls failed by that reset report TSR_ECLOSED naming
 * the lost PS. Calls of a request that asked to check losses fail at issue
 * once any connection was lost since the count it gave.
 */
#include "ps/client_int.h"

#include "common/err.h"
#include "common/log.h"
#include "common/trace.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum {
  KV_PULL = 0,
  KV_PULL_ROWS,
  KV_PUSH,
  KV_PUSH_ROWS,
  KV_PUSH_PULL,
  KV_PUSH_PULL_ROWS,
  KV_CLOCK
} kv_kind;

typedef struct kv_call {
  struct kv_call *next;    /* issue queue */
  ps_kv *kv;
  uint32_t slot;
  kv_kind kind;
  int ps, var, shard;
  int64_t step, clock;
  ps_clock_op clock_op;
  uint64_t run, closure;   /* JOIN */
  ps_dtype wire;
  const int64_t *ids;
  size_t n_ids;
  const void *grad;        /* float32 caller buffer or bf16 staging */
  size_t grad_bytes;
  const float *grad_f32;   /* bf16: the source, converted at submit */
  size_t grad_floats;
  const int64_t *pull_ids;
  size_t n_pull;
  float *dst;
  size_t dst_floats;
  unsigned flags;
  uint64_t losses;
  uint32_t gen;            /* connection generation it was issued on */
} kv_call;

typedef struct kv_buf {
  struct kv_buf *next;
  size_t cap;
  uint16_t *data;
} kv_buf;

typedef struct {
  uint64_t id;             /* the ticket; 0: free */
  int pending;             /* calls not completed */
  int rc;
  char err[512];
  int64_t max_step, min_step, min_clock;
  int64_t submit_us, done_us;
  uint64_t bytes_out, bytes_in;
  kv_call *calls;
  int n_calls;
  kv_buf *buf;             /* bf16 staging, back to the pool at wait */
} kv_slot;

typedef struct {
  char *name;
  bool sparse;
  int64_t rows, row_dim;
  int n_shards;
  tsr_shard *shards;
} kv_var;

#define KV_SLOT_BITS 10
#define KV_SLOTS (1u << KV_SLOT_BITS)
_Static_assert(KV_SLOTS == PS_KV_MAX_TICKETS, "ticket slots");

struct ps_kv {
  tsr_rpc_ctx *ctx;
  uv_async_t async;
  /* loop thread */
  int n_ps;
  char **addrs;
  ps_client **cl;
  uint64_t *era;           /* per PS: the era its last JOIN answered */
  uint32_t gen;            /* bumped by every reset */
  bool reset_wanted;
  int open_handles;        /* clients and the async handle still open */
  bool closing;
  tsr_rpc_close_cb close_cb;
  void *close_data;

  pthread_mutex_t mu;
  pthread_cond_t cv;
  /* under mu */
  int worker;
  bool hold;
  ps_dtype wire;
  uint32_t deadline_ms;
  kv_var *vars;
  int n_vars;
  kv_call *q_head, *q_tail;
  kv_slot slots[KV_SLOTS];
  uint32_t cursor;         /* next slot to try */
  uint64_t seq;
  int open;                /* tickets not yet waited for */
  int inflight;            /* calls issued, not completed */
  uint64_t losses;
  char loss_msg[512];
  char lost[512];          /* why the last reset happened */
  kv_buf *pool;
  bool cancelled;
};

static const char *kind_name(kv_kind k) {
  switch (k) {
    case KV_PULL: return "pull";
    case KV_PULL_ROWS: return "pull rows";
    case KV_PUSH: return "push";
    case KV_PUSH_ROWS: return "push rows";
    case KV_PUSH_PULL: return "push-pull";
    case KV_PUSH_PULL_ROWS: return "push-pull rows";
    case KV_CLOCK: return "clock";
  }
  return "?";
}

static size_t dsize(ps_dtype d) { return d == PS_DT_F32 ? 4 : 2; }

/* ---- layout ------------------------------------------------------------- */

static void free_vars(kv_var *v, int n) {
  for (int i = 0; i < n; i++) {
    free(v[i].name);
    free(v[i].shards);
  }
  free(v);
}

static int copy_vars(const ps_kv_config *c, int n_ps, kv_var **out,
                     char *err, size_t errlen) {
  *out = NULL;
  if (c->n_vars < 0 || c->n_vars > PS_KV_MAX_VARS || (c->n_vars && !c->vars))
    return tsr_errf(err, errlen, TSR_EINVAL, "layout: %d variables (at most %d)",
                    c->n_vars, PS_KV_MAX_VARS);
  kv_var *v = calloc((size_t)(c->n_vars ? c->n_vars : 1), sizeof *v);
  if (!v) return TSR_ENOMEM;
  for (int i = 0; i < c->n_vars; i++) {
    const ps_kv_var *s = &c->vars[i];
    const tsr_var *tv = s->var;
    const char *name = tv ? tv->name : "";
    if (!tv || !tv->name[0] || strlen(tv->name) >= PS_NAME_MAX ||
        tv->rank < 1 || tv->shape[0] < 1 || tv->row_dim < 1 ||
        s->n_shards < 1 || !s->shards) {
      free_vars(v, c->n_vars);
      return tsr_errf(err, errlen, TSR_EINVAL, "layout: variable %d (%.64s): needs a "
                      "name, rows >= 1, row_dim >= 1 and shards", i, name);
    }
    int64_t next = 0;
    for (int k = 0; k < s->n_shards; k++) {
      const tsr_shard *h = &s->shards[k];
      if (h->ps < 0 || h->ps >= n_ps || h->row0 != next || h->rows < 1) {
        free_vars(v, c->n_vars);
        return tsr_errf(err, errlen, TSR_EINVAL, "layout: %s shard %d: rows [%lld, "
                        "+%lld) on ps:%d (rows from %lld expected, %d PS)",
                        name, h->shard, (long long)h->row0,
                        (long long)h->rows, h->ps, (long long)next, n_ps);
      }
      next += h->rows;
    }
    if (next != tv->shape[0]) {
      free_vars(v, c->n_vars);
      return tsr_errf(err, errlen, TSR_EINVAL, "layout: %s: shards cover %lld of %lld "
                      "rows", name, (long long)next, (long long)tv->shape[0]);
    }
    v[i].name = strdup(tv->name);
    v[i].shards = malloc((size_t)s->n_shards * sizeof *v[i].shards);
    if (!v[i].name || !v[i].shards) {
      free_vars(v, c->n_vars);
      return TSR_ENOMEM;
    }
    memcpy(v[i].shards, s->shards, (size_t)s->n_shards * sizeof *s->shards);
    v[i].sparse = tv->kind == TSR_VAR_ROW_SPARSE;
    v[i].rows = tv->shape[0];
    v[i].row_dim = tv->row_dim;
    v[i].n_shards = s->n_shards;
  }
  *out = v;
  return 0;
}

int ps_kv_configure(ps_kv *kv, const ps_kv_config *cfg, char *err,
                    size_t errlen) {
  if (!cfg || (cfg->wire != PS_DT_F32 && cfg->wire != PS_DT_BF16))
    return tsr_errf(err, errlen, TSR_EINVAL, "wire dtype %d: float32 (0) or bfloat16 "
                    "(1)", cfg ? (int)cfg->wire : -1);
  kv_var *v;
  int rc = copy_vars(cfg, kv->n_ps, &v, err, errlen);
  if (rc) return rc;
  pthread_mutex_lock(&kv->mu);
  if (kv->open > 0) {
    pthread_mutex_unlock(&kv->mu);
    free_vars(v, cfg->n_vars);
    snprintf(err, errlen, "layout: %d tickets still open", kv->open);
    return TSR_EBUSY;
  }
  kv_var *old = kv->vars;
  int n_old = kv->n_vars;
  kv->vars = v;
  kv->n_vars = cfg->n_vars;
  kv->worker = cfg->worker;
  kv->hold = cfg->hold;
  kv->wire = cfg->wire;
  kv->deadline_ms = cfg->deadline_ms;
  pthread_mutex_unlock(&kv->mu);
  free_vars(old, n_old);
  return 0;
}

int ps_kv_num_ps(const ps_kv *kv) { return kv->n_ps; }
const char *ps_kv_addr(const ps_kv *kv, int ps) {
  return ps >= 0 && ps < kv->n_ps ? kv->addrs[ps] : "?";
}
ps_client *ps_kv_client(ps_kv *kv, int ps) {
  return ps >= 0 && ps < kv->n_ps ? kv->cl[ps] : NULL;
}

/* ---- completions (loop thread) ------------------------------------------ */

static void finish(ps_kv *kv, kv_call *c, int status, const char *msg,
                   int64_t step, int64_t min_clock, size_t bytes_in) {
  pthread_mutex_lock(&kv->mu);
  kv->inflight--;
  kv_slot *s = &kv->slots[c->slot];
  if (status == TSR_ESHUTDOWN && c->gen != kv->gen && !kv->cancelled) {
    status = TSR_ECLOSED; /* a reset gave it up */
    msg = kv->lost;
  }
  if (status < 0 && s->rc == 0) {
    s->rc = status;
    const char *addr = ps_kv_addr(kv, c->ps);
    const char *why = msg && *msg ? msg : tsr_strerror(status);
    if (status == TSR_ECLOSED && msg == kv->lost)
      snprintf(s->err, sizeof s->err, "%s", kv->lost);
    else if (c->kind == KV_CLOCK)
      snprintf(s->err, sizeof s->err, "ps:%d (%s): clock: %s", c->ps, addr,
               why);
    else
      snprintf(s->err, sizeof s->err, "ps:%d (%s): %s %s shard %d: %s", c->ps,
               addr, kind_name(c->kind),
               c->var >= 0 && c->var < kv->n_vars ? kv->vars[c->var].name
                                                  : "?",
               c->shard, why);
  }
  if (status == 0) {
    if (step > s->max_step) s->max_step = step;
    if (step >= 0 && step < s->min_step) s->min_step = step;
    if (c->kind == KV_CLOCK && min_clock > s->min_clock)
      s->min_clock = min_clock;
    s->bytes_in += bytes_in;
  }
  if (--s->pending == 0) {
    s->done_us = tsr_trace_now_us();
    pthread_cond_broadcast(&kv->cv);
  }
  pthread_mutex_unlock(&kv->mu);
}

static bool is_pull(kv_kind k) {
  return k == KV_PULL || k == KV_PULL_ROWS || k == KV_PUSH_PULL ||
         k == KV_PUSH_PULL_ROWS;
}

static void on_result(const ps_result *r, void *data) {
  kv_call *c = data;
  if (r->status == 0 && c->wire == PS_DT_BF16 && is_pull(c->kind) &&
      c->dst_floats)
    ps__bf16_expand(c->dst, c->dst_floats);
  int64_t clock = r->min_clock;
  if (c->kind == KV_CLOCK && c->clock_op == PS_CLOCK_JOIN) {
    clock = r->clock;
    if (r->status == 0) c->kv->era[c->ps] = r->era; /* loop thread */
  }
  finish(c->kv, c, r->status, r->message, r->step, clock, r->nbytes);
}

/* ---- issuing (loop thread) ---------------------------------------------- */

static int issue(ps_kv *kv, kv_call *c, int worker) {
  ps_client *pc = c->ps >= 0 && c->ps < kv->n_ps ? kv->cl[c->ps] : NULL;
  if (!pc) return TSR_EUNAVAIL;
  const char *name = c->var >= 0 ? kv->vars[c->var].name : NULL;
  size_t pb = c->dst_floats * dsize(c->wire);
  ps_client_set_era(pc, c->flags & PS_KV_NO_ERA ? 0 : kv->era[c->ps]);
  switch (c->kind) {
    case KV_PULL:
      return ps_client_pull_as(pc, name, c->shard, worker, c->clock, c->wire,
                               c->dst, pb, on_result, c);
    case KV_PULL_ROWS:
      return ps_client_pull_rows_as(pc, name, c->shard, worker, c->clock,
                                    c->wire, c->pull_ids, c->n_pull, c->dst,
                                    pb, on_result, c);
    case KV_PUSH:
      return ps_client_push(pc, name, c->shard, worker, c->step, c->wire,
                            c->grad, c->grad_bytes, on_result, c);
    case KV_PUSH_ROWS:
      return ps_client_push_rows(pc, name, c->shard, worker, c->step, c->wire,
                                 c->ids, c->n_ids, c->grad, c->grad_bytes,
                                 on_result, c);
    case KV_PUSH_PULL:
    case KV_PUSH_PULL_ROWS:
      return ps_client_push_pull_as(pc, name, c->shard, worker, c->step,
                                    c->wire, c->ids, c->n_ids, c->grad,
                                    c->grad_bytes, c->pull_ids, c->n_pull,
                                    c->wire, c->dst, pb, on_result, c);
    case KV_CLOCK:
      if (c->clock_op == PS_CLOCK_JOIN)
        return ps_client_join(pc, worker, c->clock, c->run, c->closure,
                              on_result, c);
      return ps_client_clock(pc, worker, c->clock, c->clock_op, on_result, c);
  }
  return TSR_EINVAL;
}

static void on_state(tsr_rpc_client *rc, int connected, int status,
                     void *data);
static void on_client_closed(void *data);

/* Closes every client and makes a new one for the same address: calls in
 * flight fail with TSR_ESHUTDOWN (reported as the loss that caused it). */
static void reset_clients(ps_kv *kv) {
  pthread_mutex_lock(&kv->mu);
  kv->gen++;
  pthread_mutex_unlock(&kv->mu);
  for (int i = 0; i < kv->n_ps; i++) {
    ps_client *old = kv->cl[i];
    kv->cl[i] = NULL;
    if (ps_client_new(&kv->cl[i], kv->ctx, kv->addrs[i]) == 0) {
      kv->open_handles++;
      tsr_rpc_client_on_state(ps_client_rpc(kv->cl[i]), on_state, kv);
    } else {
      kv->cl[i] = NULL; /* its calls answer TSR_EUNAVAIL */
    }
    if (old) ps_client_close(old, on_client_closed, kv);
  }
}

static void on_async(uv_async_t *h) {
  ps_kv *kv = h->data;
  if (kv->reset_wanted) {
    kv->reset_wanted = false;
    if (!kv->closing) reset_clients(kv);
  }
  pthread_mutex_lock(&kv->mu);
  kv_call *list = kv->q_head;
  kv->q_head = kv->q_tail = NULL;
  int worker = kv->worker;
  uint32_t deadline = kv->deadline_ms;
  pthread_mutex_unlock(&kv->mu);
  for (int i = 0; i < kv->n_ps; i++)
    if (kv->cl[i]) ps_client_set_deadline(kv->cl[i], deadline);
  while (list) {
    kv_call *c = list;
    list = c->next;
    char msg[512];
    pthread_mutex_lock(&kv->mu);
    bool lost = (c->flags & PS_KV_CHECK_LOSSES) && c->losses != kv->losses;
    bool cancelled = kv->cancelled;
    if (lost) snprintf(msg, sizeof msg, "%s", kv->loss_msg);
    kv->inflight++;
    c->gen = kv->gen;
    pthread_mutex_unlock(&kv->mu);
    if (cancelled) {
      finish(kv, c, TSR_ESHUTDOWN, "the PS client is closing", -1, -1, 0);
      continue;
    }
    if (lost) {
      finish(kv, c, TSR_ECLOSED, msg, -1, -1, 0);
      continue;
    }
    int rc = issue(kv, c, worker);
    if (rc < 0)
      finish(kv, c, rc,
             rc == TSR_EUNAVAIL ? "not reachable (connection down, "
                                  "reconnecting)"
                                : tsr_strerror(rc),
             -1, -1, 0);
  }
}

static void on_state(tsr_rpc_client *rc, int connected, int status,
                     void *data) {
  ps_kv *kv = data;
  if (connected || kv->closing) return;
  int i = 0;
  while (i < kv->n_ps && (!kv->cl[i] || ps_client_rpc(kv->cl[i]) != rc)) i++;
  if (i == kv->n_ps) return;
  pthread_mutex_lock(&kv->mu);
  kv->losses++;
  snprintf(kv->loss_msg, sizeof kv->loss_msg,
           "ps:%d (%s) lost its connection (%s)", i, kv->addrs[i],
           tsr_strerror(status));
  bool reset = kv->hold && kv->inflight > 0;
  if (reset)
    snprintf(kv->lost, sizeof kv->lost,
             "ps:%d (%s) lost its connection (%s); the calls held on the "
             "other PS were given up", i, kv->addrs[i],
             tsr_strerror(status));
  pthread_mutex_unlock(&kv->mu);
  if (!reset) return;
  tsr_warn("%s", kv->lost);
  /* not from inside the client's own callback: on the next wake */
  kv->reset_wanted = true;
  uv_async_send(&kv->async);
}

/* ---- submission (any thread) -------------------------------------------- */

static int64_t lower_bound(const int64_t *ids, int64_t n, int64_t x) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    int64_t mid = lo + (hi - lo) / 2;
    if (ids[mid] < x)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

static bool ids_ok(const int64_t *ids, size_t n, int64_t rows) {
  if (n == 0) return true;
  if (!ids || ids[0] < 0 || ids[n - 1] >= rows) return false;
  for (size_t i = 1; i < n; i++)
    if (ids[i] <= ids[i - 1]) return false;
  return true;
}

/* Checks an item against its variable; counts its calls and the bf16
 * staging it needs (floats). */
static int check_item(const ps_kv *kv, ps_kv_kind kind, const ps_kv_item *it,
                      int *calls, size_t *stage) {
  if (it->var < 0 || it->var >= kv->n_vars) return TSR_EINVAL;
  const kv_var *v = &kv->vars[it->var];
  bool push = kind & PS_KV_PUSH, pull = kind & PS_KV_PULL;
  if (!v->sparse) {
    if ((push && !it->grad) || (pull && !it->dst)) return TSR_EINVAL;
    *calls += v->n_shards;
    if (push) *stage += (size_t)(v->rows * v->row_dim);
    return 0;
  }
  if (push && (!ids_ok(it->ids, it->n_ids, v->rows) ||
               (it->n_ids && !it->grad)))
    return TSR_EINVAL;
  if (pull && (!ids_ok(it->pull_ids, it->n_pull, v->rows) ||
               (it->n_pull && !it->dst)))
    return TSR_EINVAL;
  if (push) {
    *calls += v->n_shards; /* even with no rows: a sync PS counts the step */
    *stage += it->n_ids * (size_t)v->row_dim;
  } else {
    for (int k = 0; k < v->n_shards; k++) {
      const tsr_shard *h = &v->shards[k];
      int64_t lo = lower_bound(it->pull_ids, (int64_t)it->n_pull, h->row0);
      int64_t hi = lower_bound(it->pull_ids, (int64_t)it->n_pull,
                               h->row0 + h->rows);
      if (hi > lo) (*calls)++;
    }
  }
  return 0;
}

/* Appends the item's calls at *out (bf16 staging not yet filled). */
static kv_call *build_item(ps_kv *kv, const ps_kv_request *q,
                           const ps_kv_item *it, kv_call *out) {
  const kv_var *v = &kv->vars[it->var];
  bool push = q->kind & PS_KV_PUSH, pull = q->kind & PS_KV_PULL;
  size_t w = (size_t)v->row_dim;
  for (int k = 0; k < v->n_shards; k++) {
    const tsr_shard *h = &v->shards[k];
    kv_call c;
    memset(&c, 0, sizeof c);
    c.ps = h->ps;
    c.var = it->var;
    c.shard = h->shard;
    c.step = q->step;
    c.clock = q->clock;
    if (!v->sparse) {
      size_t off = (size_t)h->row0 * w, cnt = (size_t)h->rows * w;
      c.kind = push && pull ? KV_PUSH_PULL : push ? KV_PUSH : KV_PULL;
      if (push) {
        c.grad = c.grad_f32 = it->grad + off;
        c.grad_floats = cnt;
      }
      if (pull) {
        c.dst = it->dst + off;
        c.dst_floats = cnt;
      }
      *out++ = c;
      continue;
    }
    int64_t plo = 0, phi = 0, qlo = 0, qhi = 0;
    if (push) {
      plo = lower_bound(it->ids, (int64_t)it->n_ids, h->row0);
      phi = lower_bound(it->ids, (int64_t)it->n_ids, h->row0 + h->rows);
    }
    if (pull) {
      qlo = lower_bound(it->pull_ids, (int64_t)it->n_pull, h->row0);
      qhi = lower_bound(it->pull_ids, (int64_t)it->n_pull, h->row0 + h->rows);
    }
    bool do_pull = pull && qhi > qlo;
    if (!push && !do_pull) continue;
    c.kind = push && do_pull ? KV_PUSH_PULL_ROWS
             : push          ? KV_PUSH_ROWS
                             : KV_PULL_ROWS;
    if (push) {
      c.ids = it->ids + plo;
      c.n_ids = (size_t)(phi - plo);
      c.grad = c.grad_f32 = it->grad ? it->grad + (size_t)plo * w : NULL;
      c.grad_floats = (size_t)(phi - plo) * w;
    }
    if (do_pull) {
      c.pull_ids = it->pull_ids + qlo;
      c.n_pull = (size_t)(qhi - qlo);
      c.dst = it->dst + (size_t)qlo * w;
      c.dst_floats = (size_t)(qhi - qlo) * w;
    }
    *out++ = c;
  }
  return out;
}

/* Takes a free slot (mu held); TSR_EBUSY when none. */
static int take_slot(ps_kv *kv, uint32_t *idx) {
  if (kv->open >= (int)KV_SLOTS) return TSR_EBUSY;
  for (uint32_t i = 0; i < KV_SLOTS; i++) {
    uint32_t k = (kv->cursor + i) & (KV_SLOTS - 1);
    if (kv->slots[k].id == 0) {
      kv->cursor = (k + 1) & (KV_SLOTS - 1);
      *idx = k;
      return 0;
    }
  }
  return TSR_EBUSY;
}

static kv_buf *take_buf(ps_kv *kv, size_t floats) {
  kv_buf **pp = &kv->pool;
  while (*pp && (*pp)->cap < floats) pp = &(*pp)->next;
  kv_buf *b = *pp;
  if (b) {
    *pp = b->next;
    b->next = NULL;
    return b;
  }
  if (kv->pool) { /* none big enough: replace the first with a bigger one */
    b = kv->pool;
    kv->pool = b->next;
    free(b->data);
    free(b);
  }
  b = calloc(1, sizeof *b);
  if (!b) return NULL;
  b->data = malloc((floats ? floats : 1) * sizeof(uint16_t));
  if (!b->data) {
    free(b);
    return NULL;
  }
  b->cap = floats;
  return b;
}

static void queue_calls(ps_kv *kv, kv_call *calls, int n) {
  for (int i = 0; i < n; i++) {
    calls[i].next = NULL;
    if (kv->q_tail)
      kv->q_tail->next = &calls[i];
    else
      kv->q_head = &calls[i];
    kv->q_tail = &calls[i];
  }
}

static void slot_init(ps_kv *kv, kv_slot *s, uint32_t idx) {
  memset(s, 0, sizeof *s);
  kv->seq++;
  s->id = (kv->seq << KV_SLOT_BITS) | idx;
  s->max_step = -1;
  s->min_step = INT64_MAX;
  s->min_clock = -1;
  s->submit_us = tsr_trace_now_us();
  kv->open++;
}

int ps_kv_submit(ps_kv *kv, const ps_kv_request *q, ps_ticket *ticket) {
  if (!q || !ticket || (q->n_items && !q->items) || q->kind < PS_KV_PUSH ||
      q->kind > PS_KV_PUSH_PULL)
    return TSR_EINVAL;
  *ticket = 0;
  pthread_mutex_lock(&kv->mu);
  int rc = kv->cancelled ? TSR_ESHUTDOWN : 0;
  int n = 0;
  size_t stage = 0;
  for (size_t i = 0; !rc && i < q->n_items; i++)
    rc = check_item(kv, q->kind, &q->items[i], &n, &stage);
  ps_dtype wire = kv->wire;
  if (wire != PS_DT_BF16) stage = 0;
  uint32_t idx = 0;
  if (!rc) rc = take_slot(kv, &idx);
  kv_call *calls = NULL;
  kv_buf *buf = NULL;
  if (!rc && n > 0 && !(calls = calloc((size_t)n, sizeof *calls)))
    rc = TSR_ENOMEM;
  if (!rc && stage > 0 && !(buf = take_buf(kv, stage))) rc = TSR_ENOMEM;
  if (rc) {
    pthread_mutex_unlock(&kv->mu);
    free(calls);
    return rc;
  }
  kv_call *end = calls;
  for (size_t i = 0; i < q->n_items; i++)
    end = build_item(kv, q, &q->items[i], end);
  kv_slot *s = &kv->slots[idx];
  slot_init(kv, s, idx);
  s->calls = calls;
  s->n_calls = n;
  s->buf = buf;
  s->pending = n;
  *ticket = s->id;
  pthread_mutex_unlock(&kv->mu);

  /* outside the mutex: the slot is ours, nothing is queued yet */
  size_t at = 0;
  for (int i = 0; i < n; i++) {
    kv_call *c = &calls[i];
    c->kv = kv;
    c->slot = idx;
    c->wire = wire;
    c->flags = q->flags;
    c->losses = q->losses;
    if (c->grad_floats == 0) {
      c->grad = NULL; /* a push of no rows: no payload */
    } else {
      if (wire == PS_DT_BF16) {
        uint16_t *d = buf->data + at;
        ps_bf16_from_f32(d, c->grad_f32, c->grad_floats);
        c->grad = d;
        at += c->grad_floats;
      }
      c->grad_bytes = c->grad_floats * dsize(wire);
      s->bytes_out += c->grad_bytes;
    }
    s->bytes_out += (c->n_ids + c->n_pull) * sizeof(int64_t);
  }
  pthread_mutex_lock(&kv->mu);
  if (n == 0) {
    s->done_us = tsr_trace_now_us();
  } else if (kv->cancelled) {
    /* closed meanwhile: fail them here, the loop will not issue them */
    s->pending = 0;
    s->rc = TSR_ESHUTDOWN;
    snprintf(s->err, sizeof s->err, "the PS client is closing");
    s->done_us = tsr_trace_now_us();
  } else {
    queue_calls(kv, calls, n);
    uv_async_send(&kv->async); /* under mu: close cannot race it */
  }
  pthread_mutex_unlock(&kv->mu);
  return 0;
}

int ps_kv_push(ps_kv *kv, const ps_kv_item *items, size_t n, int64_t step,
               ps_ticket *ticket) {
  ps_kv_request q = {.kind = PS_KV_PUSH, .items = items, .n_items = n,
                     .step = step};
  return ps_kv_submit(kv, &q, ticket);
}

int ps_kv_pull(ps_kv *kv, const ps_kv_item *items, size_t n, int64_t clock,
               ps_ticket *ticket) {
  ps_kv_request q = {.kind = PS_KV_PULL, .items = items, .n_items = n,
                     .clock = clock};
  return ps_kv_submit(kv, &q, ticket);
}

int ps_kv_push_pull(ps_kv *kv, const ps_kv_item *items, size_t n,
                    int64_t step, ps_ticket *ticket) {
  ps_kv_request q = {.kind = PS_KV_PUSH_PULL, .items = items, .n_items = n,
                     .step = step, .clock = step + 1};
  return ps_kv_submit(kv, &q, ticket);
}

static int kv_clock(ps_kv *kv, ps_clock_op op, int64_t clock, uint64_t run,
                    uint64_t closure, unsigned flags, uint64_t losses,
                    ps_ticket *ticket) {
  if (!ticket) return TSR_EINVAL;
  *ticket = 0;
  int n = kv->n_ps;
  kv_call *calls = calloc((size_t)(n ? n : 1), sizeof *calls);
  if (!calls) return TSR_ENOMEM;
  pthread_mutex_lock(&kv->mu);
  uint32_t idx = 0;
  int rc = kv->cancelled ? TSR_ESHUTDOWN : take_slot(kv, &idx);
  if (rc) {
    pthread_mutex_unlock(&kv->mu);
    free(calls);
    return rc;
  }
  kv_slot *s = &kv->slots[idx];
  slot_init(kv, s, idx);
  for (int p = 0; p < n; p++) {
    kv_call *c = &calls[p];
    c->kv = kv;
    c->slot = idx;
    c->kind = KV_CLOCK;
    c->ps = p;
    c->var = -1;
    c->clock = clock;
    c->clock_op = op;
    c->run = run;
    c->closure = closure;
    c->flags = flags;
    c->losses = losses;
  }
  s->calls = calls;
  s->n_calls = n;
  s->pending = n;
  *ticket = s->id;
  if (n == 0) {
    s->done_us = tsr_trace_now_us();
  } else {
    queue_calls(kv, calls, n);
    uv_async_send(&kv->async);
  }
  pthread_mutex_unlock(&kv->mu);
  return 0;
}

int ps_kv_clock(ps_kv *kv, ps_clock_op op, int64_t clock, unsigned flags,
                uint64_t losses, ps_ticket *ticket) {
  return kv_clock(kv, op, clock, 0, 0, flags, losses, ticket);
}

int ps_kv_join(ps_kv *kv, int64_t clock, uint64_t run, uint64_t closure,
               unsigned flags, uint64_t losses, ps_ticket *ticket) {
  return kv_clock(kv, PS_CLOCK_JOIN, clock, run, closure, flags, losses,
                  ticket);
}

static kv_slot *find(ps_kv *kv, ps_ticket t) {
  if (t == 0) return NULL;
  kv_slot *s = &kv->slots[t & (KV_SLOTS - 1)];
  return s->id == t ? s : NULL;
}

int ps_kv_wait(ps_kv *kv, ps_ticket t, ps_kv_result *res) {
  pthread_mutex_lock(&kv->mu);
  kv_slot *s = find(kv, t);
  if (!s) {
    pthread_mutex_unlock(&kv->mu);
    if (res) {
      memset(res, 0, sizeof *res);
      res->rc = TSR_EINVAL;
      snprintf(res->err, sizeof res->err, "ticket %llu is not open",
               (unsigned long long)t);
    }
    return TSR_EINVAL;
  }
  while (s->pending > 0) pthread_cond_wait(&kv->cv, &kv->mu);
  int rc = s->rc;
  if (res) {
    res->rc = s->rc;
    snprintf(res->err, sizeof res->err, "%s", s->err);
    res->max_step = s->max_step;
    res->min_step = s->min_step;
    res->min_clock = s->min_clock;
    res->submit_us = s->submit_us;
    res->done_us = s->done_us;
    res->bytes_out = s->bytes_out;
    res->bytes_in = s->bytes_in;
  }
  kv_call *calls = s->calls;
  if (s->buf) {
    s->buf->next = kv->pool;
    kv->pool = s->buf;
  }
  s->calls = NULL;
  s->buf = NULL;
  s->id = 0;
  kv->open--;
  pthread_mutex_unlock(&kv->mu);
  free(calls);
  return rc;
}

bool ps_kv_done(ps_kv *kv, ps_ticket t) {
  pthread_mutex_lock(&kv->mu);
  kv_slot *s = find(kv, t);
  bool done = s && s->pending == 0;
  pthread_mutex_unlock(&kv->mu);
  return done;
}

uint64_t ps_kv_losses(ps_kv *kv, char *msg, size_t msglen) {
  pthread_mutex_lock(&kv->mu);
  uint64_t n = kv->losses;
  if (msg && msglen) snprintf(msg, msglen, "%s", kv->loss_msg);
  pthread_mutex_unlock(&kv->mu);
  return n;
}

/* ---- life cycle (loop thread) ------------------------------------------- */

int ps_kv_new(ps_kv **out, tsr_rpc_ctx *ctx, char *const *addrs, int n) {
  *out = NULL;
  if (n < 0 || (n && !addrs)) return TSR_EINVAL;
  ps_kv *kv = calloc(1, sizeof *kv);
  if (!kv) return TSR_ENOMEM;
  kv->ctx = ctx;
  kv->worker = -1;
  kv->addrs = calloc((size_t)(n ? n : 1), sizeof *kv->addrs);
  kv->cl = calloc((size_t)(n ? n : 1), sizeof *kv->cl);
  kv->era = calloc((size_t)(n ? n : 1), sizeof *kv->era);
  int rc = kv->addrs && kv->cl && kv->era ? 0 : TSR_ENOMEM;
  if (!rc && (rc = pthread_mutex_init(&kv->mu, NULL))) rc = TSR_ENOMEM;
  bool mu = !rc;
  if (!rc && pthread_cond_init(&kv->cv, NULL)) rc = TSR_ENOMEM;
  bool cv = !rc;
  if (!rc) rc = uv_async_init(tsr_rpc_ctx_loop(ctx), &kv->async, on_async);
  if (rc) {
    if (cv) pthread_cond_destroy(&kv->cv);
    if (mu) pthread_mutex_destroy(&kv->mu);
    free(kv->addrs);
    free(kv->cl);
    free(kv->era);
    free(kv);
    return rc;
  }
  kv->async.data = kv;
  kv->open_handles = 1;
  kv->n_ps = n;
  for (int i = 0; i < n && !rc; i++) {
    if (!(kv->addrs[i] = strdup(addrs[i]))) {
      rc = TSR_ENOMEM;
      break;
    }
    if ((rc = ps_client_new(&kv->cl[i], ctx, addrs[i]))) break;
    kv->open_handles++;
    tsr_rpc_client_on_state(ps_client_rpc(kv->cl[i]), on_state, kv);
  }
  if (rc) {
    ps_kv_close(kv, NULL, NULL);
    return rc;
  }
  *out = kv;
  return 0;
}

static void kv_free(ps_kv *kv) {
  for (int i = 0; i < kv->n_ps; i++) free(kv->addrs[i]);
  free(kv->addrs);
  free(kv->cl);
  free(kv->era);
  for (uint32_t i = 0; i < KV_SLOTS; i++) {
    free(kv->slots[i].calls);
    if (kv->slots[i].buf) {
      free(kv->slots[i].buf->data);
      free(kv->slots[i].buf);
    }
  }
  while (kv->pool) {
    kv_buf *b = kv->pool;
    kv->pool = b->next;
    free(b->data);
    free(b);
  }
  free_vars(kv->vars, kv->n_vars);
  pthread_cond_destroy(&kv->cv);
  pthread_mutex_destroy(&kv->mu);
  tsr_rpc_close_cb cb = kv->close_cb;
  void *data = kv->close_data;
  free(kv);
  if (cb) cb(data);
}

static void on_client_closed(void *data) {
  ps_kv *kv = data;
  if (--kv->open_handles == 0 && kv->closing) kv_free(kv);
}

static void on_async_closed(uv_handle_t *h) {
  ps_kv *kv = h->data;
  if (--kv->open_handles == 0 && kv->closing) kv_free(kv);
}

void ps_kv_cancel(ps_kv *kv) {
  pthread_mutex_lock(&kv->mu);
  if (kv->cancelled) {
    pthread_mutex_unlock(&kv->mu);
    return;
  }
  kv->cancelled = true;
  kv_call *list = kv->q_head;
  kv->q_head = kv->q_tail = NULL;
  pthread_mutex_unlock(&kv->mu);
  while (list) { /* queued, never issued */
    kv_call *c = list;
    list = c->next;
    pthread_mutex_lock(&kv->mu);
    kv->inflight++;
    pthread_mutex_unlock(&kv->mu);
    finish(kv, c, TSR_ESHUTDOWN, "the PS client is closing", -1, -1, 0);
  }
  /* in flight: failed by their clients' close */
  for (int i = 0; i < kv->n_ps; i++) {
    ps_client *c = kv->cl[i];
    kv->cl[i] = NULL;
    if (c) ps_client_close(c, on_client_closed, kv);
  }
}

void ps_kv_close(ps_kv *kv, tsr_rpc_close_cb cb, void *data) {
  if (kv->closing) return;
  ps_kv_cancel(kv);
  kv->closing = true;
  kv->close_cb = cb;
  kv->close_data = data;
  uv_close((uv_handle_t *)&kv->async, on_async_closed);
}
