/* The collective's life cycle and its group: the methods on the member's
 * server, the connections to both ring neighbours and their hellos, the
 * ring breaking (a neighbour lost, a message refused, an abort from the
 * left), and the timer that retries hellos and finds stalled operations.
 *
 * Happy path. tsr_coll_configure copies the member list, opens (or keeps)
 * a client to the right neighbour (which carries the data) and one to the
 * left (which only watches it; at N=2 both are the same peer), and sends
 * each a hello; a neighbour answers 0 once it is in the same group, so by
 * the time a rank sends data its right neighbour knows the group.
 *
 * Failure modes. A hello that cannot get through (no connection, a peer
 * still in an older group) is sent again every HELLO_RETRY_MS until
 * configure_timeout_ms; a neighbour in a newer group or with another
 * member list fails the configure at once. Once configured, a neighbour's
 * connection that drops breaks the group: every operation fails naming
 * that neighbour, and an abort goes to the right neighbour, which breaks
 * and passes it on, so the ring learns of a loss within one round.
 */
#include "common/coll/coll_int.h"
#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HELLO_RETRY_MS 50
#define ABORT_DEADLINE_MS 2000

static int mod(int64_t a, int n) {
  int64_t m = a % n;
  return (int)(m < 0 ? m + n : m);
}

void tsr_coll__who(const tsr_coll *c, int r, char *buf, size_t len) {
  if (r < 0 || r >= c->nranks || !c->addrs) {
    snprintf(buf, len, "rank %d", r);
    return;
  }
  snprintf(buf, len, "%s (%s)", c->names[r], c->addrs[r]);
}

/* ---- pool --------------------------------------------------------------- */

void *tsr_coll__pool_get(tsr_coll *c) {
  if (c->pool_n) return c->pool[--c->pool_n];
  void *p = NULL;
  if (posix_memalign(&p, 64, c->o.segment_bytes)) return NULL;
  return p;
}

void tsr_coll__pool_put(tsr_coll *c, void *p) {
  if (c->pool_n < c->pool_cap)
    c->pool[c->pool_n++] = p;
  else
    free(p);
}

/* ---- deliveries --------------------------------------------------------- */

void tsr_coll__wake(tsr_coll *c) {
  if (!c->closing) uv_async_send(&c->wake);
}

static void on_wake(uv_async_t *h) {
  tsr_coll *c = h->data;
  tsr_coll__subs_run(c);
  tsr_coll__deliver(c);
}

/* Marks the group broken with `code` (c->cause already written) and fails
 * every pending operation with that cause. */
static void fail_ops(tsr_coll *c, int code) {
  c->broken = true;
  c->broken_code = code;
  tsr_list_foreach_safe(it, tmp, &c->ops)
      tsr_coll__op_fail(tsr_list_entry(it, coll_op, node), code, "%s",
                        c->cause);
}

/* Ends a configure: its callback, on the next turn of the loop. */
static void cfg_finish(tsr_coll *c, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void cfg_finish(tsr_coll *c, int status, const char *fmt, ...) {
  if (!c->configuring) return;
  c->configuring = false;
  c->cfg_done = true;
  c->cfg_status = status;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->cfg_msg, sizeof c->cfg_msg, fmt, ap);
  va_end(ap);
  if (status == 0) {
    c->configured = true;
    tsr_coll__pump(c);
  } else if (!c->broken) {
    snprintf(c->cause, sizeof c->cause, "%s", c->cfg_msg);
    fail_ops(c, status);
  }
  tsr_coll__wake(c);
}

/* ---- breaking ----------------------------------------------------------- */

static void on_abort_sent(const tsr_rpc_result *r, void *data) {
  tsr_coll *c = data;
  if (c->closing) tsr_coll__deliver(c);
}

void tsr_coll__break(tsr_coll *c, int code, bool tell, const char *fmt, ...) {
  if (c->broken || c->closing) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->cause, sizeof c->cause, fmt, ap);
  va_end(ap);
  /* a member leaving between operations (a run's end) is no alarm */
  tsr_log(tsr_list_empty(&c->ops) ? TSR_LOG_INFO : TSR_LOG_WARN,
          "collective group %llu (rank %d of %d) broken: %s",
          (unsigned long long)c->epoch, c->rank, c->nranks, c->cause);
  snprintf(c->st.cause, sizeof c->st.cause, "%s", c->cause);
  fail_ops(c, code);
  tsr_coll__early_drop(c);
  if (c->configuring)
    cfg_finish(c, code, "%s", c->cause);
  if (!tell || c->nranks < 2 || !c->right.cl) return;
  Tessera__Coll__Abort a = TESSERA__COLL__ABORT__INIT;
  a.epoch = c->epoch;
  a.origin = (uint32_t)c->rank;
  a.code = code;
  a.message = c->cause;
  size_t ml = tessera__coll__abort__get_packed_size(&a);
  uint8_t *meta = malloc(ml ? ml : 1);
  if (!meta) return;
  tessera__coll__abort__pack(&a, meta);
  tsr_rpc_request q = {0};
  q.method = TSR_COLL_M_ABORT;
  q.meta = meta;
  q.meta_len = ml;
  q.deadline_ms = ABORT_DEADLINE_MS;
  tsr_rpc_call(c->right.cl, &q, on_abort_sent, c);
  free(meta);
}

void tsr_coll_abort(tsr_coll *c, int code, const char *message) {
  if (c->closing || !c->epoch) return;
  char me[160];
  tsr_coll__who(c, c->rank, me, sizeof me);
  tsr_coll__break(c, code < 0 ? code : TSR_ECANCELED, true, "%s: %s", me,
                  message ? message : "gave up");
}

static void on_abort(tsr_rpc_incoming *call, void *data) {
  tsr_coll *c = data;
  const Tessera__Coll__Abort *a = call->request;
  tsr_rpc_reply(call, NULL, 0, NULL, 0, NULL, NULL);
  if (c->closing || a->epoch != c->epoch || c->broken) return;
  int code = a->code < 0 ? a->code : TSR_EUNAVAIL;
  tsr_coll__break(c, code, true, "%s", a->message ? a->message : "aborted");
}

/* ---- hellos ------------------------------------------------------------- */

typedef struct {
  tsr_coll *c;
  coll_peer *p;
  uint64_t epoch;
} hello_call;

static void on_hello_answer(const tsr_rpc_result *r, void *data);

static void hello_send(tsr_coll *c, coll_peer *p) {
  Tessera__Coll__Hello h = TESSERA__COLL__HELLO__INIT;
  h.epoch = c->epoch;
  h.nranks = (uint32_t)c->nranks;
  h.from_rank = (uint32_t)c->rank;
  h.to_rank = (uint32_t)p->rank;
  h.digest = c->digest;
  h.segment_bytes = c->o.segment_bytes;
  uint8_t meta[96];
  size_t ml = tessera__coll__hello__get_packed_size(&h);
  if (ml > sizeof meta) return;
  tessera__coll__hello__pack(&h, meta);
  hello_call *hc = malloc(sizeof *hc);
  if (!hc) {
    cfg_finish(c, TSR_ENOMEM, "out of memory for a hello");
    return;
  }
  hc->c = c;
  hc->p = p;
  hc->epoch = c->epoch;
  uint64_t now = tsr_now_ms();
  uint64_t left = c->cfg_deadline_ms > now ? c->cfg_deadline_ms - now : 1;
  tsr_rpc_request q = {0};
  q.method = TSR_COLL_M_HELLO;
  q.meta = meta;
  q.meta_len = ml;
  q.deadline_ms = (uint32_t)(left < 1000 ? left : 1000);
  int rc = tsr_rpc_call(p->cl, &q, on_hello_answer, hc);
  if (rc) {
    free(hc);
    p->last_rc = rc;
    snprintf(p->last_msg, sizeof p->last_msg, "%s", tsr_strerror(rc));
    p->retry_ms = now + HELLO_RETRY_MS;
    return;
  }
  p->hello_inflight = true;
}

static void maybe_configured(tsr_coll *c) {
  if (!c->right.hello_ok) return;
  if (c->nranks > 2 && !c->left.hello_ok) return;
  cfg_finish(c, 0, "%s", "");
}

static void on_hello_answer(const tsr_rpc_result *r, void *data) {
  hello_call *hc = data;
  tsr_coll *c = hc->c;
  coll_peer *p = hc->p;
  bool current = hc->epoch == c->epoch && c->configuring;
  free(hc);
  if (c->closing) {
    tsr_coll__deliver(c);
    return;
  }
  if (!current) return;
  p->hello_inflight = false;
  if (r->status == 0) {
    p->hello_ok = true;
    maybe_configured(c);
    return;
  }
  char me[160], them[160];
  tsr_coll__who(c, c->rank, me, sizeof me);
  tsr_coll__who(c, p->rank, them, sizeof them);
  if (r->remote && (r->status == TSR_ESTALE || r->status == TSR_ECONFIG)) {
    cfg_finish(c, r->status, "%s and %s disagree on the group: %s", me, them,
               r->message);
    return;
  }
  p->last_rc = r->status;
  snprintf(p->last_msg, sizeof p->last_msg, "%s%s",
           r->remote ? "it answered: " : "", r->message);
  p->retry_ms = tsr_now_ms() + HELLO_RETRY_MS;
}

static void on_hello(tsr_rpc_incoming *call, void *data) {
  tsr_coll *c = data;
  const Tessera__Coll__Hello *h = call->request;
  char me[160];
  tsr_coll__who(c, c->rank, me, sizeof me);
  if (c->closing) {
    tsr_rpc_reply_error(call, TSR_ESHUTDOWN, "shutting down");
    return;
  }
  char msg[TSR_COLL_ERR_MAX];
  if (!c->epoch || h->epoch > c->epoch) {
    snprintf(msg, sizeof msg, "%s is not in group %llu yet (in %llu)", me,
             (unsigned long long)h->epoch, (unsigned long long)c->epoch);
    tsr_rpc_reply_error(call, TSR_EUNAVAIL, msg);
    return;
  }
  if (h->epoch < c->epoch) {
    snprintf(msg, sizeof msg, "%s is in group %llu, newer than %llu", me,
             (unsigned long long)c->epoch, (unsigned long long)h->epoch);
    tsr_rpc_reply_error(call, TSR_ESTALE, msg);
    return;
  }
  int n = c->nranks;
  if (h->nranks != (uint32_t)n || h->digest != c->digest) {
    snprintf(msg, sizeof msg, "group %llu: %s has %d members at other "
             "addresses than rank %u's %u", (unsigned long long)h->epoch, me,
             n, h->from_rank, h->nranks);
  } else if (h->segment_bytes != c->o.segment_bytes) {
    snprintf(msg, sizeof msg, "%s cuts segments of %u bytes, rank %u of %u",
             me, c->o.segment_bytes, h->from_rank, h->segment_bytes);
  } else if (h->to_rank != (uint32_t)c->rank) {
    snprintf(msg, sizeof msg, "rank %u said hello to rank %u at %s, which "
             "is rank %d", h->from_rank, h->to_rank, c->addrs[c->rank],
             c->rank);
  } else if (h->from_rank != (uint32_t)mod((int64_t)c->rank - 1, n) &&
             h->from_rank != (uint32_t)mod((int64_t)c->rank + 1, n)) {
    snprintf(msg, sizeof msg, "rank %u is not a ring neighbour of %s",
             h->from_rank, me);
  } else {
    tsr_rpc_reply(call, NULL, 0, NULL, 0, NULL, NULL);
    return;
  }
  tsr_rpc_reply_error(call, TSR_ECONFIG, msg);
}

/* ---- neighbours' connections -------------------------------------------- */

static void on_client_closed(void *data);

static void on_state(tsr_rpc_client *cl, int connected, int status,
                     void *data) {
  tsr_coll *c = data;
  coll_peer *p = cl == c->right.cl ? &c->right
                 : cl == c->left.cl ? &c->left : NULL;
  if (!p || c->closing) return;
  if (connected) {
    /* a hello waiting for its retry goes now */
    if (c->configuring && !p->hello_ok && !p->hello_inflight)
      hello_send(c, p);
    return;
  }
  if (!c->configured || c->broken) return;
  char who[160], me[160];
  tsr_coll__who(c, p->rank, who, sizeof who);
  tsr_coll__who(c, c->rank, me, sizeof me);
  tsr_coll__break(c, TSR_EUNAVAIL, true, "%s lost: %s (seen by %s)", who,
                  tsr_strerror(status), me);
}

static void peer_drop(tsr_coll *c, coll_peer *p) {
  if (!p->cl) return;
  c->clients_closing++;
  tsr_rpc_client_close(p->cl, on_client_closed, c);
  p->cl = NULL;
  p->addr[0] = 0;
}

static int peer_set(tsr_coll *c, coll_peer *p, int rank) {
  const char *addr = c->addrs[rank];
  p->c = c;
  p->rank = rank;
  p->hello_ok = false;
  p->hello_inflight = false;
  p->retry_ms = 0;
  p->last_rc = 0;
  p->last_msg[0] = 0;
  if (p->cl && strcmp(p->addr, addr) == 0) return 0;
  peer_drop(c, p);
  int rc = tsr_rpc_client_new(&p->cl, c->ctx, addr);
  if (rc) return rc;
  snprintf(p->addr, sizeof p->addr, "%s", addr);
  tsr_rpc_client_on_state(p->cl, on_state, c);
  return 0;
}

/* ---- the timer ---------------------------------------------------------- */

static void cfg_check(tsr_coll *c, uint64_t now) {
  coll_peer *ps[2] = {&c->right, c->nranks > 2 ? &c->left : NULL};
  for (int i = 0; i < 2 && c->configuring; i++) {
    coll_peer *p = ps[i];
    if (!p || p->hello_ok || p->hello_inflight) continue;
    if (now >= c->cfg_deadline_ms) {
      char me[160], them[160];
      tsr_coll__who(c, c->rank, me, sizeof me);
      tsr_coll__who(c, p->rank, them, sizeof them);
      if (p->last_rc == TSR_EUNAVAIL && strncmp(p->last_msg, "it answered",
                                                11) == 0)
        cfg_finish(c, TSR_ETIMEOUT, "%s reaches %s, which did not join group "
                   "%llu within %u ms (%s)", me, them,
                   (unsigned long long)c->epoch, c->cfg_timeout_ms,
                   p->last_msg);
      else
        cfg_finish(c, p->last_rc ? p->last_rc : TSR_ETIMEOUT,
                   "%s cannot reach %s within %u ms: %s", me, them,
                   c->cfg_timeout_ms,
                   p->last_msg[0] ? p->last_msg : "no answer");
      return;
    }
    if (now >= p->retry_ms) hello_send(c, p);
  }
}

static void on_tick(uv_timer_t *t) {
  tsr_coll *c = t->data;
  uint64_t now = tsr_now_ms();
  if (c->configuring) cfg_check(c, now);
  tsr_coll__check_timeouts(c, tsr_now_ns());
  tsr_coll__pump(c);
}

static void tick_period(tsr_coll *c) {
  uint64_t ms = c->configuring ? HELLO_RETRY_MS / 2
                               : (uint64_t)c->o.op_timeout_ms / 8;
  if (ms < 10) ms = 10;
  if (ms > 1000) ms = 1000;
  uv_timer_start(&c->tick, on_tick, ms, ms);
}

/* ---- life cycle --------------------------------------------------------- */

static int opts_fill(tsr_coll_opts *o) {
  if (!o->segment_bytes) o->segment_bytes = 512u << 10;
  if (!o->op_timeout_ms) o->op_timeout_ms = 60000;
  if (!o->configure_timeout_ms) o->configure_timeout_ms = 10000;
  if (!o->max_sends) o->max_sends = 2;
  if (!o->early_bytes_max) o->early_bytes_max = (uint64_t)256 << 20;
  if (o->segment_bytes < 4096 || o->segment_bytes > (64u << 20) ||
      o->segment_bytes % sizeof(float))
    return TSR_EINVAL;
  if (o->max_sends > 4096) return TSR_EINVAL;
  return 0;
}

static void handle_closed(uv_handle_t *h);

int tsr_coll_new(tsr_coll **out, tsr_rpc_ctx *ctx, tsr_rpc_server *srv,
                 const tsr_coll_opts *opts) {
  *out = NULL;
  tsr_coll *c = calloc(1, sizeof *c);
  if (!c) return TSR_ENOMEM;
  if (opts) c->o = *opts;
  int rc = opts_fill(&c->o);
  if (rc) {
    free(c);
    return rc;
  }
  c->ctx = ctx;
  c->loop = tsr_rpc_ctx_loop(ctx);
  tsr_rpc_opts ro;
  tsr_rpc_ctx_opts(ctx, &ro);
  snprintf(c->self_name, sizeof c->self_name, "%s",
           ro.name && *ro.name ? ro.name : "this rank");
  tsr_list_init(&c->ops);
  tsr_list_init(&c->done);
  tsr_list_init(&c->early);
  tsr_list_init(&c->fwdq);
  tsr_list_init(&c->sendq);
  tsr_list_init(&c->subq);
  c->pool_cap = 16;
  c->pool = calloc((size_t)c->pool_cap, sizeof *c->pool);
  if (!c->pool || pthread_mutex_init(&c->mu, NULL)) {
    free(c->pool);
    free(c);
    return TSR_ENOMEM;
  }
  pthread_cond_init(&c->cv, NULL);
  tsr_rpc_method m[3];
  memset(m, 0, sizeof m);
  m[0].method = TSR_COLL_M_HELLO;
  m[0].name = "coll.hello";
  m[0].handler = on_hello;
  m[0].request_type = &tessera__coll__hello__descriptor;
  m[1].method = TSR_COLL_M_DATA;
  m[1].name = "coll.data";
  m[1].handler = tsr_coll__on_data;
  m[1].request_type = &tessera__coll__data__descriptor;
  m[1].payload_alloc = tsr_coll__data_alloc;
  m[1].payload_abort = tsr_coll__data_abort;
  m[2].method = TSR_COLL_M_ABORT;
  m[2].name = "coll.abort";
  m[2].handler = on_abort;
  m[2].request_type = &tessera__coll__abort__descriptor;
  for (int i = 0; i < 3; i++) {
    m[i].data = c;
    if ((rc = tsr_rpc_server_register_method(srv, &m[i]))) {
      if (i == 0) {
        pthread_cond_destroy(&c->cv);
        pthread_mutex_destroy(&c->mu);
        free(c->pool);
        free(c);
        return rc;
      }
      /* a method already answers through c: c stays, closed */
      c->closing = true;
      c->mu_closing = true;
      *out = c;
      return rc;
    }
  }
  uv_async_init(c->loop, &c->wake, on_wake);
  uv_timer_init(c->loop, &c->tick);
  c->wake.data = c;
  c->tick.data = c;
  uv_unref((uv_handle_t *)&c->wake);
  uv_unref((uv_handle_t *)&c->tick);
  c->handles_open = 2;
  *out = c;
  return 0;
}

int tsr_coll_configure(tsr_coll *c, const tsr_coll_group *g, tsr_coll_cb cb,
                       void *data) {
  if (c->closing) return TSR_ESHUTDOWN;
  /* the epoch only grows; the group whose configure failed here may be
   * configured again (a chief that retries it) */
  bool again = g && g->epoch == c->epoch && c->epoch && !c->configuring &&
               !c->configured;
  if (!g || !cb || !g->addrs || g->nranks < 1 ||
      g->nranks > TSR_COLL_MAX_RANKS || g->rank < 0 ||
      g->rank >= g->nranks || (g->epoch <= c->epoch && !again))
    return TSR_EINVAL;
  int n = g->nranks;
  for (int i = 0; i < n; i++)
    if (!g->addrs[i] || strlen(g->addrs[i]) >= TSR_RPC_ADDR_MAX)
      return TSR_EINVAL;
  char **addrs = calloc((size_t)n, sizeof *addrs);
  char **names = calloc((size_t)n, sizeof *names);
  bool ok = addrs && names;
  uint64_t digest = 1469598103934665603ull;
  for (int i = 0; ok && i < n; i++) {
    char nm[64];
    if (g->names && g->names[i])
      snprintf(nm, sizeof nm, "%s", g->names[i]);
    else
      snprintf(nm, sizeof nm, "rank %d", i);
    addrs[i] = strdup(g->addrs[i]);
    names[i] = strdup(nm);
    ok = addrs[i] && names[i];
    for (const char *s = g->addrs[i]; ok && *s; s++)
      digest = (digest ^ (uint8_t)*s) * 1099511628211ull;
    digest = (digest ^ '|') * 1099511628211ull;
  }
  if (!ok) {
    for (int i = 0; addrs && names && i < n; i++) {
      free(addrs[i]);
      free(names[i]);
    }
    free(addrs);
    free(names);
    return TSR_ENOMEM;
  }
  /* the old group ends here */
  if (c->configuring)
    cfg_finish(c, TSR_ECANCELED, "group %llu replaced by group %llu",
               (unsigned long long)c->epoch, (unsigned long long)g->epoch);
  tsr_list_foreach_safe(it, tmp, &c->ops)
      tsr_coll__op_fail(tsr_list_entry(it, coll_op, node), TSR_ECANCELED,
                        "group %llu replaced by group %llu",
                        (unsigned long long)c->epoch,
                        (unsigned long long)g->epoch);
  tsr_coll__early_drop(c);
  /* a configure finished above is delivered before this one's */
  for (int i = 0; c->addrs && i < c->nranks; i++) {
    free(c->addrs[i]);
    free(c->names[i]);
  }
  free(c->addrs);
  free(c->names);
  c->addrs = addrs;
  c->names = names;
  c->epoch = g->epoch;
  c->rank = g->rank;
  c->nranks = n;
  c->digest = digest ^ (uint64_t)n;
  c->broken = false;
  c->broken_code = 0;
  c->cause[0] = 0;
  c->st.cause[0] = 0;
  c->st.epoch = g->epoch;
  c->st.rank = g->rank;
  c->st.nranks = n;
  c->next_seq = 0;
  c->configured = false;
  c->configuring = true;
  if (c->cfg_done) tsr_coll__deliver(c);
  c->cfg_cb = cb;
  c->cfg_data = data;
  c->cfg_timeout_ms = g->timeout_ms ? g->timeout_ms : c->o.configure_timeout_ms;
  c->cfg_deadline_ms = tsr_now_ms() + c->cfg_timeout_ms;
  if (n == 1) {
    peer_drop(c, &c->right);
    peer_drop(c, &c->left);
    cfg_finish(c, 0, "%s", "");
    tick_period(c);
    return 0;
  }
  int rc = peer_set(c, &c->right, (c->rank + 1) % n);
  if (!rc && n > 2) rc = peer_set(c, &c->left, mod((int64_t)c->rank - 1, n));
  if (!rc && n <= 2) peer_drop(c, &c->left);
  if (rc) {
    cfg_finish(c, rc, "cannot open a connection: %s", tsr_strerror(rc));
    return 0;
  }
  hello_send(c, &c->right);
  if (n > 2) hello_send(c, &c->left);
  tick_period(c);
  return 0;
}

int tsr_coll_allreduce(tsr_coll *c, float *buf, size_t n, tsr_coll_cb cb,
                       void *data) {
  return tsr_coll__post(c, TSR_COLL_ALLREDUCE, false, buf, n, 0, cb, data);
}

int tsr_coll_broadcast(tsr_coll *c, int root, void *buf, size_t bytes,
                       tsr_coll_cb cb, void *data) {
  return tsr_coll__post(c, TSR_COLL_BROADCAST, false, buf, bytes, root, cb,
                        data);
}

int tsr_coll_barrier(tsr_coll *c, tsr_coll_cb cb, void *data) {
  return tsr_coll__post(c, TSR_COLL_ALLREDUCE, true, NULL, 0, 0, cb, data);
}

static void maybe_closed(tsr_coll *c) {
  if (c->handles_open || c->clients_closing || !c->close_cb) return;
  tsr_coll__deliver(c);
  tsr_rpc_close_cb cb = c->close_cb;
  c->close_cb = NULL;
  cb(c->close_data);
}

static void on_client_closed(void *data) {
  tsr_coll *c = data;
  c->clients_closing--;
  if (c->closing) {
    tsr_coll__deliver(c);
    maybe_closed(c);
  }
}

static void handle_closed(uv_handle_t *h) {
  tsr_coll *c = h->data;
  c->handles_open--;
  maybe_closed(c);
}

void tsr_coll_close(tsr_coll *c, tsr_rpc_close_cb cb, void *data) {
  if (c->close_called) return;
  c->close_called = true;
  pthread_mutex_lock(&c->mu);
  c->mu_closing = true;
  pthread_mutex_unlock(&c->mu);
  if (c->configuring) cfg_finish(c, TSR_ESHUTDOWN, "collective closing");
  c->closing = true;
  tsr_list_foreach_safe(it, tmp, &c->ops)
      tsr_coll__op_fail(tsr_list_entry(it, coll_op, node), TSR_ESHUTDOWN,
                        "%s is closing its collective", c->self_name);
  tsr_coll__early_drop(c);
  tsr_coll__subs_fail(c);
  peer_drop(c, &c->right);
  peer_drop(c, &c->left);
  if (c->handles_open == 2) {
    uv_close((uv_handle_t *)&c->wake, handle_closed);
    uv_close((uv_handle_t *)&c->tick, handle_closed);
  }
  c->close_cb = cb;
  c->close_data = data;
  tsr_coll__deliver(c);
  maybe_closed(c);
}

void tsr_coll_free(tsr_coll *c) {
  if (!c) return;
  tsr_coll__deliver(c);
  /* operations whose last landing the server's close aborted */
  tsr_list_foreach_safe(it, tmp, &c->ops) {
    coll_op *op = tsr_list_entry(it, coll_op, node);
    tsr_list_remove(&op->node);
    free(op->got);
    free(op->sent);
    free(op);
  }
  tsr_list *queues[2] = {&c->fwdq, &c->sendq};
  for (int q = 0; q < 2; q++)
    tsr_list_foreach_safe(it, tmp, queues[q]) {
      coll_msg *m = tsr_list_entry(it, coll_msg, node);
      tsr_list_remove(&m->node);
      free(m);
    }
  tsr_coll__early_drop(c);
  for (int i = 0; i < c->pool_n; i++) free(c->pool[i]);
  free(c->pool);
  for (int i = 0; c->addrs && i < c->nranks; i++) {
    free(c->addrs[i]);
    free(c->names[i]);
  }
  free(c->addrs);
  free(c->names);
  pthread_cond_destroy(&c->cv);
  pthread_mutex_destroy(&c->mu);
  free(c);
}

void tsr_coll_get_stats(const tsr_coll *c, tsr_coll_stats *out) {
  *out = c->st;
  out->broken = c->broken;
}
