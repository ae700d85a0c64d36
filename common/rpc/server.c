/* The RPC server: methods, accepted connections, incoming calls, answers.
 *
 * Happy path: methods are registered, then the server listens; every
 * accepted connection shakes hands (conn.c) and its requests become calls:
 * the meta is copied into the call (and decoded when the method names a
 * request type), the payload lands where the method's allocator says or
 * in a pooled buffer, and the handler runs. It answers now or later; the
 * answer's header + meta + payload buffers go out in one gathered write and
 * the call is released when that write completes.
 * Failure modes: an unknown method, a meta that does not decode, a refused
 * or unallocatable payload are answered with an error and the connection
 * goes on (the payload is read and dropped). A request id reused while in
 * flight is answered with TSR_EDUPID and the connection closed (its
 * answers would be ambiguous). A request beyond max_inflight calls held on
 * its connection is answered TSR_EBUSY at once (the connection is still
 * read, so pings and a hang-up are still seen). A connection with more
 * than max_write_queue bytes of answers not yet taken by the peer, or
 * whose max_inflight calls are all answers waiting to go out, is no
 * longer read until it drains: a peer that stops reading costs TCP
 * window, not memory. Calls held when their connection dies are marked
 * dead; their answers are dropped and reported TSR_ECLOSED to done.
 */
#include "common/rpc/rpc_int.h"

#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"

#include <errno.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <sys/socket.h>
#include <unistd.h>

typedef struct method_ent {
  tsr_rpc_method m;
  char name[48];
  tsr_rpc_method_stats st;
} method_ent;

typedef struct sconn sconn;

enum { CALL_RECEIVING, CALL_HANDLING, CALL_ANSWERED };

typedef struct scall {
  tsr_rpc_incoming pub;
  tsr_rpc_server *s;
  sconn *sc;                 /* NULL once the connection is gone */
  method_ent *me;
  int state;
  int user_buf;              /* payload from the method's allocator */
  int is_error;
  tsr_rpc_done_cb done;
  void *done_data;
  uint64_t out_bytes;
  tsr_list link;             /* sc->calls, or the server's dead list */
  uint8_t meta[];
} scall;

struct sconn {
  tsr_rpc__conn c;           /* first: an sconn is its conn */
  tsr_rpc_server *s;
  tsr_rpc__idmap ids;
  tsr_list calls;            /* scall.link: handled, not answered */
  scall *receiving;          /* payload landing */
  int counted;               /* in s->st.connections */
  struct {                   /* a request refused before its handler,
                                answered once its frame is complete (and
                                its MAC verified: nothing is answered to
                                a frame a relay made up) */
    int pending, code;
    uint64_t id;
    uint32_t method;
    char msg[300];
  } refusal;
};

/* The connection whose conn.link is node `n` of the server's list. */
#define CONN_OF(n) ((sconn *)tsr_list_entry(n, tsr_rpc__conn, link))

struct tsr_rpc_server {
  tsr_rpc_ctx *ctx;
  uv_tcp_t listener;
  uv_pipe_t local;           /* the same-host Unix socket (local.c) */
  int local_open;            /* `local` is a handle to close */
  uv_idle_t idle;            /* runs done callbacks of dead answers */
  int handles;
  int listening;
  int closing;
  int idle_closing;
  int port;
  method_ent *methods;       /* sorted by number */
  size_t nmethods;
  tsr_list conns;            /* sconn.c.link */
  tsr_list dead;             /* scall.link: answered after their connection
                                died */
  uint64_t live_calls;
  tsr_rpc_stats st;
  tsr_rpc_close_cb close_cb;
  void *close_data;
};

static method_ent *find_method(tsr_rpc_server *s, uint32_t m) {
  size_t lo = 0, hi = s->nmethods;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (s->methods[mid].m.method == m) return &s->methods[mid];
    if (s->methods[mid].m.method < m)
      lo = mid + 1;
    else
      hi = mid;
  }
  return NULL;
}

static void maybe_finish(tsr_rpc_server *s);
static void handle_closed(uv_handle_t *h);

/* Releases a call's memory (payload to the pool or back to the method). */
static void call_free(scall *k, int aborted, int status) {
  tsr_rpc_server *s = k->s;
  if (k->pub.payload) {
    if (!k->user_buf)
      tsr_rpc__buf_put(s->ctx, k->pub.payload, k->pub.payload_len);
    else if (aborted && k->me && k->me->m.payload_abort)
      k->me->m.payload_abort(&k->pub, k->pub.payload, status, k->me->m.data);
  }
  if (k->pub.request)
    protobuf_c_message_free_unpacked(k->pub.request, &s->ctx->pb_al);
  tsr_rpc__free(s->ctx, k);
  s->live_calls--;
  maybe_finish(s);
}

/* ---- answers ----------------------------------------------------------- */

static void answer_done(scall *k, int status) {
  tsr_rpc_server *s = k->s;
  method_ent *me = k->me;
  uint64_t ns = tsr_now_ns() - k->pub.recv_ns;
  int failed = k->is_error || status;
  s->st.calls++;
  if (failed) s->st.errors++;
  if (me) {
    me->st.calls++;
    if (failed) me->st.errors++;
    me->st.bytes_out += k->out_bytes;
    me->st.total_ns += ns;
    if (ns > me->st.max_ns) me->st.max_ns = ns;
  }
  if (k->done) k->done(status, k->done_data);
  call_free(k, 0, status);
}

static void reply_sent(tsr_rpc__conn *c, int status, void *data) {
  scall *k = data;
  sconn *sc = k->sc;
  if (sc) {
    tsr_list_remove(&k->link);
    k->sc = NULL;
    c->inflight--;
    k->s->st.inflight--;
  }
  answer_done(k, status);
}

static void idle_cb(uv_idle_t *h) {
  tsr_rpc_server *s = h->data;
  uv_idle_stop(h);
  tsr_list *n;
  while ((n = tsr_list_first(&s->dead))) {
    scall *k = tsr_list_entry(n, scall, link);
    tsr_list_remove(n);
    answer_done(k, TSR_ECLOSED);
  }
}

/* The answer cannot go out: report it from the loop, never from inside
 * the reply call. */
static void answer_later(scall *k) {
  tsr_list_push_front(&k->s->dead, &k->link);
  uv_idle_start(&k->s->idle, idle_cb);
}

static int send_answer(scall *k, const tsr_rpc__hdr *h, const void *meta,
                       const uv_buf_t *payload, unsigned npayload) {
  sconn *sc = k->sc;
  k->state = CALL_ANSWERED;
  k->out_bytes = h->meta_len;
  for (unsigned i = 0; i < npayload; i++) k->out_bytes += payload[i].len;
  if (!sc || sc->c.state != TSR_RPC__C_READY) {
    if (sc) {
      tsr_list_remove(&k->link);
      sc->c.inflight--;
      k->s->st.inflight--;
      k->sc = NULL;
    }
    answer_later(k);
    return 0;
  }
  tsr_rpc__idmap_del(&sc->ids, k->pub.id);
  int rc = tsr_rpc__conn_send(&sc->c, h, meta, payload, npayload,
                              reply_sent, k);
  if (rc) {
    /* the peer would wait for an answer that never comes: drop it so its
     * calls fail at once */
    char msg[200];
    snprintf(msg, sizeof msg, "cannot send the answer to request %llu: %s",
             (unsigned long long)k->pub.id, tsr_strerror(rc));
    tsr_error("rpc %s: peer %s: %s", k->s->ctx->name, sc->c.peer, msg);
    tsr_list_remove(&k->link);
    sc->c.inflight--;
    k->s->st.inflight--;
    k->sc = NULL;
    answer_later(k);
    tsr_rpc__conn_close(&sc->c, rc, msg);
  }
  return 0;
}

int tsr_rpc_reply(tsr_rpc_incoming *call, const void *meta, size_t meta_len,
                  const uv_buf_t *payload, unsigned npayload,
                  tsr_rpc_done_cb done, void *data) {
  scall *k = (scall *)call;
  if (!call || k->state != CALL_HANDLING || (meta_len && !meta) ||
      (npayload && !payload))
    return TSR_EINVAL;
  const tsr_rpc_opts *o = &k->s->ctx->o;
  uint64_t plen = 0;
  for (unsigned i = 0; i < npayload; i++) plen += payload[i].len;
  if (meta_len > o->max_meta_bytes || plen > o->max_payload_bytes) {
    tsr_error("rpc %s: answer to method %u (meta %zu, payload %llu bytes) "
              "is over the limits (meta %u, payload %llu)",
              k->s->ctx->name, call->method, meta_len,
              (unsigned long long)plen, o->max_meta_bytes,
              (unsigned long long)o->max_payload_bytes);
    return TSR_ETOOBIG;
  }
  k->done = done;
  k->done_data = data;
  tsr_rpc__hdr h = {.version = TSR_RPC_VERSION, .kind = TSR_RPC__RESP,
                    .method = call->method, .meta_len = (uint32_t)meta_len,
                    .id = call->id, .payload_len = plen};
  return send_answer(k, &h, meta, payload, npayload);
}

int tsr_rpc_reply_error(tsr_rpc_incoming *call, int code,
                        const char *message) {
  scall *k = (scall *)call;
  if (!call || k->state != CALL_HANDLING) return TSR_EINVAL;
  if (code >= 0) code = TSR_EREMOTE;
  char cut[1024];
  snprintf(cut, sizeof cut, "%s", message ? message : tsr_strerror(code));
  uint8_t meta[1100];
  size_t n = tsr_rpc__err_encode(code, cut, meta);
  k->is_error = 1;
  k->done = NULL;
  tsr_rpc__hdr h = {.version = TSR_RPC_VERSION, .kind = TSR_RPC__ERR,
                    .method = call->method, .meta_len = (uint32_t)n,
                    .id = call->id};
  return send_answer(k, &h, meta, NULL, 0);
}

int tsr_rpc_incoming_dead(const tsr_rpc_incoming *call) {
  const scall *k = (const scall *)call;
  return !k->sc || k->sc->c.state != TSR_RPC__C_READY;
}

/* ---- requests ---------------------------------------------------------- */

/* A request refused before its handler: its payload is dropped, and it
 * is answered once the whole frame is in (s_on_frame). */
static int refuse(sconn *sc, const tsr_rpc__hdr *h, int code,
                  const char *msg) {
  sc->refusal.pending = 1;
  sc->refusal.code = code;
  sc->refusal.id = h->id;
  sc->refusal.method = h->method;
  snprintf(sc->refusal.msg, sizeof sc->refusal.msg, "%s", msg);
  return 0;
}

static void send_refusal(sconn *sc) {
  sc->refusal.pending = 0;
  tsr_debug("rpc %s: peer %s: request %llu: %s", sc->s->ctx->name,
            sc->c.peer, (unsigned long long)sc->refusal.id, sc->refusal.msg);
  sc->s->st.errors++;
  (void)tsr_rpc__conn_send_err(&sc->c, sc->refusal.id, sc->refusal.method,
                               sc->refusal.code, sc->refusal.msg, NULL, NULL);
}

static int s_on_head(tsr_rpc__rx *rx, const tsr_rpc__hdr *h,
                     const uint8_t *meta, void **dst) {
  tsr_rpc__conn *c = rx->owner;
  sconn *sc = (sconn *)c;
  tsr_rpc_server *s = sc->s;
  char msg[300];
  if (tsr_rpc__idmap_get(&sc->ids, h->id)) {
    snprintf(msg, sizeof msg,
             "request id %llu is already in flight on this connection",
             (unsigned long long)h->id);
    tsr_warn("rpc %s: peer %s: %s; closing", s->ctx->name, c->peer, msg);
    (void)tsr_rpc__conn_send_err(c, h->id, h->method, TSR_EDUPID, msg, NULL,
                                 NULL);
    tsr_rpc__conn_close_after_flush(c, TSR_EDUPID, msg);
    return TSR_EDUPID;
  }
  if (c->inflight >= s->ctx->o.max_inflight) {
    snprintf(msg, sizeof msg,
             "%u calls already in flight on this connection (limit %u)",
             c->inflight, s->ctx->o.max_inflight);
    return refuse(sc, h, TSR_EBUSY, msg);
  }
  method_ent *me = find_method(s, h->method);
  if (!me) {
    snprintf(msg, sizeof msg, "unknown method %u", h->method);
    return refuse(sc, h, TSR_ENOMETHOD, msg);
  }
  me->st.bytes_in += h->meta_len + h->payload_len;
  scall *k = tsr_rpc__alloc(s->ctx, sizeof *k + h->meta_len);
  if (!k) {
    snprintf(msg, sizeof msg, "out of memory for a request of method %s",
             me->name);
    return refuse(sc, h, TSR_ENOMEM, msg);
  }
  memset(k, 0, sizeof *k);
  s->live_calls++;
  k->s = s;
  k->me = me;
  k->pub.method = h->method;
  k->pub.id = h->id;
  k->pub.meta_len = h->meta_len;
  k->pub.meta = h->meta_len ? k->meta : NULL;
  if (h->meta_len) memcpy(k->meta, meta, h->meta_len);
  k->pub.payload_len = h->payload_len;
  k->pub.peer = c->peer;
  k->pub.peer_name = c->peer_name;
  if (me->m.request_type) {
    k->pub.request = protobuf_c_message_unpack(
        me->m.request_type, &s->ctx->pb_al, h->meta_len, k->meta);
    if (!k->pub.request) {
      snprintf(msg, sizeof msg,
               "meta of %u bytes for method %s does not decode as %s",
               h->meta_len, me->name, me->m.request_type->name);
      k->pub.payload_len = 0;
      call_free(k, 0, 0);
      return refuse(sc, h, TSR_EPROTO, msg);
    }
  }
  if (h->payload_len) {
    void *buf = NULL;
    int rc = 0;
    if (me->m.payload_alloc)
      rc = me->m.payload_alloc(&k->pub, (size_t)h->payload_len, &buf,
                               me->m.data);
    if (rc < 0) {
      snprintf(msg, sizeof msg, "payload of %llu bytes for method %s "
               "refused: %s", (unsigned long long)h->payload_len, me->name,
               tsr_strerror(rc));
      k->pub.payload_len = 0;
      call_free(k, 0, 0);
      return refuse(sc, h, rc, msg);
    }
    if (buf) {
      k->user_buf = 1;
    } else {
      buf = tsr_rpc__buf_get(s->ctx, (size_t)h->payload_len);
      if (!buf) {
        snprintf(msg, sizeof msg,
                 "out of memory for a payload of %llu bytes (method %s)",
                 (unsigned long long)h->payload_len, me->name);
        k->pub.payload_len = 0;
        call_free(k, 0, 0);
        return refuse(sc, h, TSR_ENOMEM, msg);
      }
    }
    k->pub.payload = buf;
  }
  int rc = tsr_rpc__idmap_put(&sc->ids, h->id, k);
  if (rc) {
    call_free(k, 1, rc);
    snprintf(msg, sizeof msg, "out of memory tracking request %llu",
             (unsigned long long)h->id);
    return refuse(sc, h, rc, msg);
  }
  k->sc = sc;
  k->state = CALL_RECEIVING;
  sc->receiving = k;
  *dst = k->pub.payload;
  return 0;
}

int tsr_rpc__server_inject(tsr_rpc_server *s, uint32_t method, uint64_t id,
                           const void *meta, size_t meta_len,
                           const void *payload, size_t payload_len) {
  if (s->closing) return TSR_ESHUTDOWN;
  method_ent *me = find_method(s, method);
  if (!me) return TSR_ENOMETHOD;
  if (meta_len > s->ctx->o.max_meta_bytes ||
      payload_len > s->ctx->o.max_payload_bytes)
    return TSR_ETOOBIG;
  scall *k = tsr_rpc__alloc(s->ctx, sizeof *k + meta_len);
  if (!k) return TSR_ENOMEM;
  memset(k, 0, sizeof *k);
  s->live_calls++;
  k->s = s;
  k->me = me;
  k->pub.method = method;
  k->pub.id = id;
  k->pub.meta_len = meta_len;
  k->pub.meta = meta_len ? k->meta : NULL;
  if (meta_len) memcpy(k->meta, meta, meta_len);
  k->pub.payload_len = payload_len;
  k->pub.peer = "injected";
  k->pub.peer_name = "injected";
  if (me->m.request_type &&
      !(k->pub.request = protobuf_c_message_unpack(
            me->m.request_type, &s->ctx->pb_al, meta_len, k->meta))) {
    k->pub.payload_len = 0;
    call_free(k, 0, 0);
    return TSR_EPROTO;
  }
  if (payload_len) {
    void *buf = NULL;
    int rc = me->m.payload_alloc ? me->m.payload_alloc(&k->pub, payload_len,
                                                       &buf, me->m.data)
                                 : 0;
    if (rc < 0) {
      k->pub.payload_len = 0;
      call_free(k, 0, 0);
      return rc;
    }
    if (buf)
      k->user_buf = 1;
    else if (!(buf = tsr_rpc__buf_get(s->ctx, payload_len))) {
      k->pub.payload_len = 0;
      call_free(k, 0, 0);
      return TSR_ENOMEM;
    }
    memcpy(buf, payload, payload_len);
    k->pub.payload = buf;
  }
  k->state = CALL_HANDLING;
  k->pub.recv_ns = tsr_now_ns();
  me->m.handler(&k->pub, me->m.data);
  return 0;
}

/* The peer is not taking its answers: too many bytes wait, or all the
 * calls it may have in flight are answers waiting to go out. */
static int stuck(const tsr_rpc__conn *c, const tsr_rpc_server *s) {
  return c->wq_bytes > s->ctx->o.max_write_queue ||
         (c->wq_bytes > 0 && c->inflight >= s->ctx->o.max_inflight);
}

static int s_on_frame(tsr_rpc__rx *rx, const tsr_rpc__hdr *h,
                      void *payload) {
  tsr_rpc__conn *c = rx->owner;
  sconn *sc = (sconn *)c;
  tsr_rpc_server *s = sc->s;
  scall *k = sc->receiving;
  if (!k) { /* refused: its payload has been dropped */
    if (sc->refusal.pending) send_refusal(sc);
    return c->state == TSR_RPC__C_READY ? 0 : TSR_ECLOSED;
  }
  sc->receiving = NULL;
  k->state = CALL_HANDLING;
  k->pub.recv_ns = tsr_now_ns();
  tsr_list_push_front(&sc->calls, &k->link);
  c->inflight++;
  c->calls++;
  s->st.inflight++;
  k->me->m.handler(&k->pub, k->me->m.data);
  if (c->state != TSR_RPC__C_READY) return TSR_ECLOSED;
  if (stuck(c, s)) {
    tsr_debug("rpc %s: peer %s: %llu bytes of answers not taken: not "
              "reading until it drains",
              s->ctx->name, c->peer, (unsigned long long)c->wq_bytes);
    tsr_rpc__conn_pause(c);
    return 1;
  }
  return 0;
}

static void s_on_drain(tsr_rpc__conn *c) {
  tsr_rpc_server *s = ((sconn *)c)->s;
  if (c->paused && c->wq_bytes <= s->ctx->o.max_write_queue / 2 &&
      !stuck(c, s))
    tsr_rpc__conn_resume(c);
}

static void s_on_ready(tsr_rpc__conn *c) {
  sconn *sc = (sconn *)c;
  sc->counted = 1;
  sc->s->st.connections++;
  sc->s->st.connects++;
  if (c->local) sc->s->st.connects_local++;
  if (c->local && !c->local_trusted) sc->s->st.local_untrusted++;
  if (!c->hs.mac) sc->s->st.connects_plain++;
  tsr_debug("rpc %s: accepted %s (%s)", sc->s->ctx->name, c->peer,
            c->peer_name);
}

static void s_on_down(tsr_rpc__conn *c, int status, const char *msg) {
  sconn *sc = (sconn *)c;
  tsr_rpc_server *s = sc->s;
  if (sc->counted) {
    s->st.connections--;
    sc->counted = 0;
    tsr_debug("rpc %s: connection from %s closed: %s", s->ctx->name,
              c->peer, msg);
  }
  if (sc->receiving) {
    scall *k = sc->receiving;
    sc->receiving = NULL;
    call_free(k, 1, status);
  }
  tsr_list *n;
  while ((n = tsr_list_first(&sc->calls))) {
    scall *k = tsr_list_entry(n, scall, link);
    tsr_list_remove(n);
    k->sc = NULL;
    s->st.inflight--;
  }
  c->inflight = 0;
  tsr_rpc__idmap_free(&sc->ids);
}

static void s_on_freed(tsr_rpc__conn *c) {
  sconn *sc = (sconn *)c;
  tsr_rpc_server *s = sc->s;
  tsr_list_remove(&c->link);
  tsr_rpc__free(s->ctx, sc);
  maybe_finish(s);
}

static const tsr_rpc__conn_ops server_ops = {
    .rx = {s_on_head, s_on_frame},
    .on_ready = s_on_ready,
    .on_down = s_on_down,
    .on_freed = s_on_freed,
    .on_drain = s_on_drain,
};

/* ---- listening --------------------------------------------------------- */

static void free_tmp(uv_handle_t *h) { tsr_rpc__free(h->data, h); }

static void on_connection(uv_stream_t *l, int status) {
  tsr_rpc_server *s = l->data;
  if (status < 0) {
    tsr_warn("rpc %s: accept failed: %s", s->ctx->name, uv_strerror(status));
    return;
  }
  if (s->closing) return;
  int local = l == (uv_stream_t *)&s->local;
  sconn *sc = tsr_rpc__calloc(s->ctx, sizeof *sc);
  if (sc) sc->c.local = local;
  if (!sc || tsr_rpc__conn_init(&sc->c, s->ctx, TSR_RPC__SERVER,
                                &server_ops, s) != 0) {
    /* accept and drop, or the listener would report it forever */
    tsr_rpc__free(s->ctx, sc);
    tsr_rpc__sock *tmp = tsr_rpc__alloc(s->ctx, sizeof *tmp);
    tsr_error("rpc %s: out of memory for a new connection: refused",
              s->ctx->name);
    if (!tmp) return;
    if (local)
      uv_pipe_init(s->ctx->loop, &tmp->pipe, 0);
    else
      uv_tcp_init(s->ctx->loop, &tmp->tcp);
    uv_accept(l, &tmp->stream);
    tmp->handle.data = s->ctx;
    uv_close(&tmp->handle, free_tmp);
    return;
  }
  sc->s = s;
  tsr_rpc__idmap_init(&sc->ids, s->ctx);
  sc->c.agg = &s->st;
  tsr_list_init(&sc->calls);
  tsr_list_push_front(&s->conns, &sc->c.link);
  int rc = uv_accept(l, &sc->c.sock.stream);
  if (!rc) rc = tsr_rpc__conn_start(&sc->c);
  if (rc) {
    tsr_warn("rpc %s: cannot start an accepted connection: %s",
             s->ctx->name, uv_strerror(rc));
    tsr_rpc__conn_close(&sc->c, rc, "accept failed");
  }
}

int tsr_rpc_server_new(tsr_rpc_server **out, tsr_rpc_ctx *ctx) {
  *out = NULL;
  if (!ctx) return TSR_EINVAL;
  tsr_rpc_server *s = tsr_rpc__calloc(ctx, sizeof *s);
  if (!s) return TSR_ENOMEM;
  s->ctx = ctx;
  tsr_list_init(&s->conns);
  tsr_list_init(&s->dead);
  uv_idle_init(ctx->loop, &s->idle);
  s->idle.data = s;
  s->handles = 1;
  ctx->users++;
  *out = s;
  return 0;
}

int tsr_rpc_server_register_method(tsr_rpc_server *s,
                                   const tsr_rpc_method *m) {
  if (!s || !m || !m->handler || m->method == 0) return TSR_EINVAL;
  if (s->listening || s->closing) {
    tsr_error("rpc %s: method %u registered after listen: every handler "
              "must be registered before the server listens",
              s->ctx->name, m->method);
    return TSR_EINVAL;
  }
  if (find_method(s, m->method)) {
    tsr_error("rpc %s: method %u registered twice", s->ctx->name,
              m->method);
    return TSR_EEXISTS;
  }
  method_ent *nm = tsr_rpc__alloc(s->ctx, (s->nmethods + 1) * sizeof *nm);
  if (!nm) return TSR_ENOMEM;
  size_t at = 0;
  while (at < s->nmethods && s->methods[at].m.method < m->method) at++;
  if (s->nmethods) {
    memcpy(nm, s->methods, at * sizeof *nm);
    memcpy(nm + at + 1, s->methods + at, (s->nmethods - at) * sizeof *nm);
  }
  method_ent *e = &nm[at];
  memset(e, 0, sizeof *e);
  e->m = *m;
  if (m->name)
    snprintf(e->name, sizeof e->name, "%s", m->name);
  else
    snprintf(e->name, sizeof e->name, "%u", m->method);
  e->m.name = e->name;
  e->st.method = m->method;
  tsr_rpc__free(s->ctx, s->methods);
  s->methods = nm;
  s->nmethods++;
  for (size_t i = 0; i < s->nmethods; i++) {
    s->methods[i].m.name = s->methods[i].name;
    s->methods[i].st.name = s->methods[i].name;
  }
  return 0;
}

int tsr_rpc_server_register(tsr_rpc_server *s, uint32_t method,
                            tsr_rpc_handler handler, void *data) {
  tsr_rpc_method m = {.method = method, .handler = handler, .data = data};
  return tsr_rpc_server_register_method(s, &m);
}

static bool is_any6(const struct sockaddr *sa) {
  return sa->sa_family == AF_INET6 &&
         !memcmp(&((const struct sockaddr_in6 *)sa)->sin6_addr, &in6addr_any,
                 sizeof in6addr_any);
}

/* False when the kernel was built or booted without IPv6. */
static bool have_ipv6(void) {
  int fd = socket(AF_INET6, SOCK_STREAM, 0);
  if (fd < 0) return errno != EAFNOSUPPORT;
  close(fd);
  return true;
}

int tsr_rpc_server_listen(tsr_rpc_server *s, const char *addr) {
  char host[256], port[16], err[300];
  if (!s || s->listening || s->closing) return TSR_EINVAL;
  int rc = tsr_rpc__split_addr(addr, host, sizeof host, port, sizeof port,
                               err, sizeof err);
  if (rc) {
    tsr_error("rpc %s: listen: %s", s->ctx->name, err);
    return rc;
  }
  if (s->nmethods == 0)
    tsr_warn("rpc %s: listening on %s with no method registered",
             s->ctx->name, addr);
  uv_getaddrinfo_t gai;
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                           .ai_flags = AI_PASSIVE};
  rc = uv_getaddrinfo(s->ctx->loop, &gai, NULL, host, port, &hints);
  if (rc) {
    tsr_error("rpc %s: listen on %s: cannot resolve '%s': %s", s->ctx->name,
              addr, host, uv_strerror(rc));
    return rc;
  }
  uv_tcp_init(s->ctx->loop, &s->listener);
  s->listener.data = s;
  s->handles++;
  s->listening = 1; /* from here the listener handle must be closed */
  const struct sockaddr *sa = tsr_rpc__pick_addr(gai.addrinfo)->ai_addr;
  struct sockaddr_in any4;
  if (is_any6(sa) && !have_ipv6()) {
    /* "[::]" (every address) where the kernel has no IPv6 */
    uv_ip4_addr("0.0.0.0", ntohs(((const struct sockaddr_in6 *)sa)->sin6_port),
                &any4);
    sa = (const struct sockaddr *)&any4;
    tsr_info("rpc %s: no IPv6 here: listening on 0.0.0.0 for %s",
             s->ctx->name, addr);
  }
  /* flags 0: an IPv6 wildcard takes IPv4 peers too (dual stack) */
  rc = uv_tcp_bind(&s->listener, sa, 0);
  uv_freeaddrinfo(gai.addrinfo);
  if (!rc) rc = uv_listen((uv_stream_t *)&s->listener, 511, on_connection);
  if (rc) {
    tsr_error("rpc %s: listen on %s: %s", s->ctx->name, addr,
              uv_strerror(rc));
    return rc;
  }
  struct sockaddr_storage ss;
  int len = sizeof ss;
  if (uv_tcp_getsockname(&s->listener, (struct sockaddr *)&ss, &len) == 0) {
    if (ss.ss_family == AF_INET)
      s->port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
    else if (ss.ss_family == AF_INET6)
      s->port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
  }
  tsr_info("rpc %s: listening on %s (port %d)", s->ctx->name, addr, s->port);
  if (tsr_rpc__local_wanted(s->ctx) && s->port) {
    char name[128] = "?";
    s->local.data = s;
    s->local_open = 1;
    s->handles++;
    rc = tsr_rpc__local_listen(s->ctx, (struct sockaddr *)&ss, &s->local,
                               on_connection, name, sizeof name);
    if (rc) {
      tsr_warn("rpc %s: no same-host socket beside %s (%s: %s): peers on "
               "this host use TCP", s->ctx->name, addr, name,
               uv_strerror(rc));
      s->local_open = 0;
      uv_close((uv_handle_t *)&s->local, handle_closed);
    } else {
      tsr_debug("rpc %s: same-host peers on %s", s->ctx->name, name);
    }
  }
  return 0;
}

int tsr_rpc_server_port(const tsr_rpc_server *s) { return s->port; }

/* ---- close and stats --------------------------------------------------- */

/* The idle handle stays open while calls live: a dead answer reports
 * through it. */
static void maybe_finish(tsr_rpc_server *s) {
  if (!s->closing || !tsr_list_empty(&s->conns) || s->live_calls) return;
  if (!s->idle_closing) {
    s->idle_closing = 1;
    uv_close((uv_handle_t *)&s->idle, handle_closed);
    return;
  }
  if (s->handles) return;
  tsr_rpc_ctx *ctx = s->ctx;
  tsr_rpc_close_cb cb = s->close_cb;
  void *data = s->close_data;
  tsr_rpc__free(ctx, s->methods);
  tsr_rpc__free(ctx, s);
  ctx->users--;
  if (cb) cb(data);
}

static void handle_closed(uv_handle_t *h) {
  tsr_rpc_server *s = h->data;
  s->handles--;
  maybe_finish(s);
}

void tsr_rpc_server_close(tsr_rpc_server *s, tsr_rpc_close_cb cb,
                          void *data) {
  if (!s || s->closing) return;
  s->closing = 1;
  s->close_cb = cb;
  s->close_data = data;
  if (s->listening) uv_close((uv_handle_t *)&s->listener, handle_closed);
  if (s->local_open) uv_close((uv_handle_t *)&s->local, handle_closed);
  tsr_list_foreach(n, &s->conns)
    tsr_rpc__conn_close(&CONN_OF(n)->c, TSR_ESHUTDOWN, "server closing");
  maybe_finish(s);
}

void tsr_rpc_server_stats(const tsr_rpc_server *s, tsr_rpc_stats *out) {
  *out = s->st;
  out->paused = 0;
  tsr_list_foreach(n, &s->conns) {
    const sconn *sc = CONN_OF(n);
    if (sc->c.paused && sc->c.state == TSR_RPC__C_READY) out->paused++;
  }
  out->mem_bytes = tsr_rpc__mem(s->ctx);
}

size_t tsr_rpc_server_method_stats(const tsr_rpc_server *s,
                                   tsr_rpc_method_stats *out, size_t cap) {
  for (size_t i = 0; i < s->nmethods && i < cap; i++)
    out[i] = s->methods[i].st;
  return s->nmethods;
}

size_t tsr_rpc_server_foreach_conn(const tsr_rpc_server *s,
                                   void (*cb)(const tsr_rpc_conn_info *info,
                                              void *data),
                                   void *data) {
  size_t n = 0;
  tsr_list_foreach(it, &s->conns) {
    const sconn *sc = CONN_OF(it);
    if (sc->c.state != TSR_RPC__C_READY) continue;
    tsr_rpc_conn_info in = {
        .peer = sc->c.peer, .peer_name = sc->c.peer_name,
        .bytes_in = sc->c.bytes_in, .bytes_out = sc->c.bytes_out,
        .calls = sc->c.calls, .inflight = sc->c.inflight,
        .paused = sc->c.paused, .connected_ns = sc->c.ready_ns};
    if (cb) cb(&in, data);
    n++;
  }
  return n;
}
