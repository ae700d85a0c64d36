/* The multi-PS client (client.h, "tickets over a shard layout"): the
 * layout and the submitting side (any thread). The loop's side (issuing,
 * completions, connection resets, life cycle) is client_kv_loop.c.
 *
 * Happy path: a submitting thread turns a request into one call per shard
 * under the mutex (a dense variable's row slice; a sparse variable's run of
 * sorted ids found by binary search), reserves a ticket slot, converts
 * bfloat16 gradients into a pooled staging buffer outside the mutex, then
 * queues the calls and wakes the loop with the async handle. A waiter
 * sleeps on the condition variable until the ticket's last call is done,
 * then takes its result and frees the slot.
 * Failure modes: a request that does not fit the layout (unknown variable,
 * unsorted or out-of-range ids, a missing buffer) is refused with
 * TSR_EINVAL before anything is queued; no free slot is TSR_EBUSY; a
 * closing client refuses new tickets with TSR_ESHUTDOWN and fails the
 * calls of a ticket submitted meanwhile; a layout is refused while
 * tickets are open. A ticket keeps the first failure of its calls (see
 * client_kv_loop.c) and still waits for every call, so no buffer is
 * touched after the waiter moves on.
 */
#include "ps/client/client_int.h"

#include "common/err.h"
#include "common/list.h"
#include "common/trace.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- layout ------------------------------------------------------------- */

void ps__kv_free_vars(kv_var *v, int n) {
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
    if (!tv || !tv->name[0] || strlen(tv->name) >= TSR_VAR_NAME_MAX ||
        tv->rank < 1 || tv->shape[0] < 1 || tv->row_dim < 1 ||
        s->n_shards < 1 || !s->shards) {
      ps__kv_free_vars(v, c->n_vars);
      return tsr_errf(err, errlen, TSR_EINVAL, "layout: variable %d (%.64s): needs a "
                      "name, rows >= 1, row_dim >= 1 and shards", i, name);
    }
    int64_t next = 0;
    for (int k = 0; k < s->n_shards; k++) {
      const tsr_shard *h = &s->shards[k];
      if (h->ps < 0 || h->ps >= n_ps || h->row0 != next || h->rows < 1) {
        ps__kv_free_vars(v, c->n_vars);
        return tsr_errf(err, errlen, TSR_EINVAL, "layout: %s shard %d: rows [%lld, "
                        "+%lld) on ps:%d (rows from %lld expected, %d PS)",
                        name, h->shard, (long long)h->row0,
                        (long long)h->rows, h->ps, (long long)next, n_ps);
      }
      next += h->rows;
    }
    if (next != tv->shape[0]) {
      ps__kv_free_vars(v, c->n_vars);
      return tsr_errf(err, errlen, TSR_EINVAL, "layout: %s: shards cover %lld of %lld "
                      "rows", name, (long long)next, (long long)tv->shape[0]);
    }
    v[i].name = strdup(tv->name);
    v[i].shards = malloc((size_t)s->n_shards * sizeof *v[i].shards);
    if (!v[i].name || !v[i].shards) {
      ps__kv_free_vars(v, c->n_vars);
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
    ps__kv_free_vars(v, cfg->n_vars);
    snprintf(err, errlen, "layout: %d tickets still open", kv->open);
    return TSR_EBUSY;
  }
  kv_var *old = kv->vars;
  int n_old = kv->n_vars;
  kv->vars = v;
  kv->n_vars = cfg->n_vars;
  kv->worker = cfg->worker;
  kv->hold = cfg->hold;
  kv->wait_lost = cfg->wait_lost && !cfg->hold;
  kv->wire = cfg->wire;
  kv->deadline_ms = cfg->deadline_ms;
  pthread_mutex_unlock(&kv->mu);
  ps__kv_free_vars(old, n_old);
  return 0;
}

const char *ps_kv_addr(const ps_kv *kv, int ps) {
  return ps >= 0 && ps < kv->n_ps ? kv->addrs[ps] : "?";
}
ps_client *ps_kv_client(ps_kv *kv, int ps) {
  return ps >= 0 && ps < kv->n_ps ? kv->cl[ps] : NULL;
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
  for (int i = 0; i < n; i++)
    tsr_fifo_append(kv->q_head, kv->q_tail, &calls[i]);
}

static void slot_init(ps_kv *kv, kv_slot *s, uint32_t idx) {
  memset(s, 0, sizeof *s);
  kv->seq++;
  s->id = (kv->seq << KV_SLOT_BITS) | idx;
  s->res.max_step = -1;
  s->res.min_step = INT64_MAX;
  s->res.min_clock = -1;
  s->res.submit_us = tsr_trace_now_us();
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
    c->snapshot = q->snapshot;
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
      c->grad_bytes = c->grad_floats * ps__dtype_size(wire);
      s->res.bytes_out += c->grad_bytes;
    }
    s->res.bytes_out += (c->n_ids + c->n_pull) * sizeof(int64_t);
  }
  pthread_mutex_lock(&kv->mu);
  if (n == 0) {
    s->res.done_us = tsr_trace_now_us();
  } else if (kv->cancelled) {
    /* closed meanwhile: fail them here, the loop will not issue them */
    s->pending = 0;
    s->res.rc = TSR_ESHUTDOWN;
    snprintf(s->res.err, sizeof s->res.err, "the PS client is closing");
    s->res.done_us = tsr_trace_now_us();
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
    s->res.done_us = tsr_trace_now_us();
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
  int rc = s->res.rc;
  if (res) *res = s->res;
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

uint64_t ps_kv_resent(ps_kv *kv) {
  pthread_mutex_lock(&kv->mu);
  uint64_t n = kv->resent;
  pthread_mutex_unlock(&kv->mu);
  return n;
}
