/* The RPC server's calls on accepted connections: incoming requests and
 * their answers (the server made, listening and closed: server_life.c).
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
#include "common/rpc/server_int.h"

#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

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
  tsr_rpc__server_maybe_finish(s);
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
  method_ent *me = tsr_rpc__find_method(s, h->method);
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
  method_ent *me = tsr_rpc__find_method(s, method);
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
  tsr_rpc__server_maybe_finish(s);
}

const tsr_rpc__conn_ops tsr_rpc__server_ops = {
    .rx = {s_on_head, s_on_frame},
    .on_ready = s_on_ready,
    .on_down = s_on_down,
    .on_freed = s_on_freed,
    .on_drain = s_on_drain,
};
