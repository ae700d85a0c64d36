/* One TCP connection on libuv, shared by servers and clients.
 *
 * Happy path: once TCP is up the handshake runs (handshake.c) under a
 * timer; then frames flow: reads go where the receive machine (rx.c) says
 * (straight into payload destinations for large tensors), writes gather
 * header + meta + the caller's payload buffers + the frame's MAC (mac.c,
 * computed over the caller's buffers in place) into one uv_write. The
 * timer then drives heartbeats (a client pings an idle connection; a
 * server answers pings) and dead-peer detection.
 * A frame the kernel takes at once (uv_try_write) costs no write request
 * and no epoll change; its completion is reported from a check handle in
 * the same loop iteration, as libuv would report its own.
 * Failure modes: a refused or silent handshake, a bad frame, a dead or
 * closing peer all end in tsr_rpc__conn_close(): the owner's on_down fails
 * what hangs on the connection (once, with a message naming the peer), the
 * handles close, and on_freed runs from the last close callback. Refused
 * peers are logged at most once per address per interval, with a count of
 * the rest (ratelog.c); so are connections closed for a bad frame (one
 * that fails its integrity check or does not parse: a relay that changes
 * every frame costs one line per interval, not one per connection).
 * Refusals and protocol errors are written to the
 * peer first (close after flush, bounded by a one-second guard). Handles
 * are freed only in their close callbacks.
 */
#include "common/rpc/rpc_int.h"

#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"

#include <stdio.h>

#define STAGE_BYTES (64 * 1024)
#define TAG_SPLIT_MIN (256u * 1024u) /* payloads from this size: see send */
#define FLUSH_GUARD_MS 1000

typedef struct wreq {
  uv_write_t req;
  tsr_rpc__conn *c;
  tsr_rpc__sent_cb cb;
  void *data;
  tsr_list link;      /* c->done: written at once, waiting to be reported */
  size_t bytes;
  size_t queued;      /* bytes handed to uv_write */
  int waited;
  uint8_t head[]; /* header + meta, or handshake bytes */
} wreq;

static const char *who(const tsr_rpc__conn *c) {
  return c->role == TSR_RPC__SERVER ? "peer" : "server";
}

static void conn_rx_error(tsr_rpc__conn *c, int rc);
static void timer_cb(uv_timer_t *t);
static void write_finish(tsr_rpc__conn *c, wreq *w, int status);

/* Reports the writes that went out at once. */
static void flush_done(tsr_rpc__conn *c) {
  tsr_list *n;
  while ((n = tsr_list_first(&c->done))) {
    wreq *w = tsr_list_entry(n, wreq, link);
    tsr_list_remove(n);
    write_finish(c, w, 0);
  }
}

static void check_cb(uv_check_t *h) {
  tsr_rpc__conn *c = h->data;
  uv_check_stop(h);
  flush_done(c);
}

/* ---- frame hooks: pings are handled here, the rest goes to the owner --- */

static int c_on_head(tsr_rpc__rx *rx, const tsr_rpc__hdr *h,
                     const uint8_t *meta, void **dst) {
  tsr_rpc__conn *c = rx->owner;
  if (h->kind == TSR_RPC__PING || h->kind == TSR_RPC__PONG) return 0;
  return c->ops->rx.on_head(rx, h, meta, dst);
}

static int c_on_frame(tsr_rpc__rx *rx, const tsr_rpc__hdr *h,
                      void *payload) {
  tsr_rpc__conn *c = rx->owner;
  c->frames_in++;
  if (c->agg) c->agg->frames_in++;
  if (h->kind == TSR_RPC__PING) {
    tsr_rpc__hdr p = {.version = TSR_RPC_VERSION, .kind = TSR_RPC__PONG};
    /* a pong that cannot be sent is a missed heartbeat, nothing more */
    (void)tsr_rpc__conn_send(c, &p, NULL, NULL, 0, NULL, NULL);
    return 0;
  }
  if (h->kind == TSR_RPC__PONG) return 0;
  return c->ops->rx.on_frame(rx, h, payload);
}

static const tsr_rpc__rx_ops conn_rx_ops = {c_on_head, c_on_frame};

/* ---- close ------------------------------------------------------------- */

static void on_handle_closed(uv_handle_t *h) {
  tsr_rpc__conn *c = h->data;
  if (--c->handles > 0) return;
  flush_done(c); /* those bytes did leave */
  tsr_rpc__rx_free(&c->rx);
  tsr_rpc__mac_wipe(&c->txmac);
  c->ops->on_freed(c);
}

static void go_down(tsr_rpc__conn *c, int status, const char *msg) {
  if (c->down) return;
  c->down = 1;
  c->ops->on_down(c, status, msg);
}

void tsr_rpc__conn_close(tsr_rpc__conn *c, int status, const char *msg) {
  if (c->state == TSR_RPC__C_CLOSING) return;
  go_down(c, status, msg);
  c->state = TSR_RPC__C_CLOSING;
  if (c->reading) uv_read_stop(&c->sock.stream);
  c->reading = 0;
  uv_timer_stop(&c->timer);
  uv_close(&c->sock.handle, on_handle_closed);
  uv_close((uv_handle_t *)&c->timer, on_handle_closed);
  uv_close((uv_handle_t *)&c->check, on_handle_closed);
}

void tsr_rpc__conn_close_after_flush(tsr_rpc__conn *c, int status,
                                     const char *msg) {
  if (c->state >= TSR_RPC__C_FLUSH) return;
  go_down(c, status, msg);
  if (c->reading) uv_read_stop(&c->sock.stream);
  c->reading = 0;
  if (c->writes == 0) {
    tsr_rpc__conn_close(c, status, msg);
    return;
  }
  c->state = TSR_RPC__C_FLUSH;
  uv_timer_stop(&c->timer);
  uv_timer_start(&c->timer, timer_cb, FLUSH_GUARD_MS, 0);
}

/* ---- writes ------------------------------------------------------------ */

static void write_cb(uv_write_t *req, int status) {
  wreq *w = (wreq *)req;
  w->c->uv_writes--;
  write_finish(w->c, w, status);
}

static void write_finish(tsr_rpc__conn *c, wreq *w, int status) {
  c->writes--;
  c->wq_bytes -= w->queued;
  if (status == 0 && w->waited) c->last_progress_ns = tsr_now_ns();
  if (status == UV_ECANCELED) status = TSR_ECLOSED;
  if (w->cb) w->cb(c, status, w->data);
  tsr_rpc__free(c->ctx, w);
  if (c->state == TSR_RPC__C_FLUSH && c->writes == 0)
    tsr_rpc__conn_close(c, TSR_ECLOSED, "closed after flush");
  else if (c->state == TSR_RPC__C_READY && c->ops->on_drain)
    c->ops->on_drain(c);
}

/* Sends w's bufs (an array the caller owns and lets us change): straight
 * to the kernel while nothing is queued, the rest through uv_write. */
static int raw_send(tsr_rpc__conn *c, wreq *w, uv_buf_t *bufs,
                    unsigned nbufs) {
  w->c = c;
  size_t left = w->bytes;
  if (c->uv_writes == 0 && w->bytes <= ((size_t)1 << 30)) {
    int n = uv_try_write(&c->sock.stream, bufs, nbufs);
    if (n > 0) {
      size_t skip = (size_t)n;
      left -= skip;
      while (nbufs && skip >= bufs[0].len) {
        skip -= bufs[0].len;
        bufs++;
        nbufs--;
      }
      if (nbufs) {
        bufs[0].base += skip;
        bufs[0].len -= skip;
      }
    }
  }
  if (left == 0) {
    tsr_list_push_back(&c->done, &w->link);
    uv_check_start(&c->check, check_cb);
  } else {
    int rc = uv_write(&w->req, &c->sock.stream, bufs, nbufs,
                      write_cb);
    if (rc) {
      int partial = left != w->bytes;
      tsr_rpc__free(c->ctx, w);
      /* part of a frame went out: the stream cannot be resumed */
      if (partial) tsr_rpc__conn_close(c, rc, "write failed");
      return rc;
    }
    w->queued = left;
    w->waited = uv_stream_get_write_queue_size(&c->sock.stream) > 0;
    c->uv_writes++;
    c->wq_bytes += left;
  }
  c->writes++;
  c->bytes_out += w->bytes;
  if (c->agg) c->agg->bytes_out += w->bytes;
  c->last_tx_ns = tsr_now_ns();
  return 0;
}

static int send_bytes(tsr_rpc__conn *c, const uint8_t *p, size_t n) {
  wreq *w = tsr_rpc__alloc(c->ctx, sizeof *w + n);
  if (!w) return TSR_ENOMEM;
  memset(w, 0, sizeof *w);
  memcpy(w->head, p, n);
  w->bytes = n;
  uv_buf_t b = uv_buf_init((char *)w->head, (unsigned)n);
  return raw_send(c, w, &b, 1);
}

int tsr_rpc__conn_send(tsr_rpc__conn *c, const tsr_rpc__hdr *h,
                       const void *meta, const uv_buf_t *payload,
                       unsigned npayload, tsr_rpc__sent_cb cb, void *data) {
  if (c->state != TSR_RPC__C_READY) return TSR_ECLOSED;
  size_t head = TSR_RPC_HEADER_SIZE + h->meta_len;
  size_t tag = c->txmac.on ? TSR_RPC__TAG_SIZE : 0;
  wreq *w = tsr_rpc__alloc(c->ctx, sizeof *w + head + tag);
  if (!w) return TSR_ENOMEM;
  memset(w, 0, sizeof *w);
  w->cb = cb;
  w->data = data;
  tsr_rpc__hdr_encode(w->head, h);
  if (h->meta_len) memcpy(w->head + TSR_RPC_HEADER_SIZE, meta, h->meta_len);
  uv_buf_t small[10], *bufs = small;
  if (npayload + 2 > 10) {
    bufs = tsr_rpc__alloc(c->ctx, (npayload + 2) * sizeof *bufs);
    if (!bufs) {
      tsr_rpc__free(c->ctx, w);
      return TSR_ENOMEM;
    }
  }
  bufs[0] = uv_buf_init((char *)w->head, (unsigned)head);
  unsigned n = 1;
  w->bytes = head;
  if (tag) {
    uint64_t total = head;
    for (unsigned i = 0; i < npayload; i++) total += payload[i].len;
    tsr_rpc__mac_begin(&c->txmac, total);
    tsr_rpc__mac_update(&c->txmac, w->head, head);
  }
  uint64_t plen = 0;
  for (unsigned i = 0; i < npayload; i++) plen += payload[i].len;
  /* a large payload leaves before its MAC is computed: the peer reads and
   * checks it while this side hashes it, and the tag follows in a write of
   * its own (the frame's bytes stay in order: writes are queued in order) */
  int split = tag && plen >= TAG_SPLIT_MIN;
  for (unsigned i = 0; i < npayload; i++) {
    if (!payload[i].len) continue;
    bufs[n++] = payload[i];
    w->bytes += payload[i].len;
    if (tag && !split)
      tsr_rpc__mac_update(&c->txmac, payload[i].base, payload[i].len);
  }
  if (split) {
    uint8_t t[TSR_RPC__TAG_SIZE];
    int rc = raw_send(c, w, bufs, n);
    if (bufs != small) tsr_rpc__free(c->ctx, bufs);
    if (rc) {
      if (c->state != TSR_RPC__C_CLOSING)
        tsr_rpc__conn_close(c, rc, "write failed");
      return rc;
    }
    for (unsigned i = 0; i < npayload; i++)
      tsr_rpc__mac_update(&c->txmac, payload[i].base, payload[i].len);
    tsr_rpc__mac_final(&c->txmac, t);
    c->frames_out++;
    if (c->agg) c->agg->frames_out++;
    if ((rc = send_bytes(c, t, sizeof t)) && c->state != TSR_RPC__C_CLOSING)
      tsr_rpc__conn_close(c, rc, "write failed");
    return 0; /* the frame is on its way; a failed tag closes the link */
  }
  if (tag) {
    /* the tag follows the payload: in the head block when there is none */
    uint8_t *t = w->head + head;
    tsr_rpc__mac_final(&c->txmac, t);
    if (n == 1)
      bufs[0].len += TSR_RPC__TAG_SIZE;
    else
      bufs[n++] = uv_buf_init((char *)t, TSR_RPC__TAG_SIZE);
    w->bytes += TSR_RPC__TAG_SIZE;
  }
  int rc = raw_send(c, w, bufs, n); /* libuv copies the array */
  if (bufs != small) tsr_rpc__free(c->ctx, bufs);
  if (rc == 0) {
    c->frames_out++;
    if (c->agg) c->agg->frames_out++;
  } else if (tag && c->state != TSR_RPC__C_CLOSING) {
    /* the frame's number is spent: the peer would refuse every later one */
    tsr_rpc__conn_close(c, rc, "write failed");
  }
  return rc;
}

int tsr_rpc__conn_send_err(tsr_rpc__conn *c, uint64_t id, uint32_t method,
                           int code, const char *msg, tsr_rpc__sent_cb cb,
                           void *data) {
  char cut[1024];
  snprintf(cut, sizeof cut, "%s", msg ? msg : tsr_strerror(code));
  size_t n = tsr_rpc__err_size(code, cut);
  uint8_t meta[1100];
  tsr_rpc__err_encode(code, cut, meta);
  tsr_rpc__hdr h = {.version = TSR_RPC_VERSION, .kind = TSR_RPC__ERR,
                    .method = method, .meta_len = (uint32_t)n, .id = id};
  return tsr_rpc__conn_send(c, &h, meta, NULL, 0, cb, data);
}

/* ---- reads ------------------------------------------------------------- */

static void alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  tsr_rpc__conn *c = h->data;
  uint8_t *p;
  size_t n;
  tsr_rpc__rx_buf(&c->rx, &p, &n);
  buf->base = (char *)p;
  buf->len = n;
}

static void hs_done(tsr_rpc__conn *c, const uint8_t *rest, size_t n) {
  if (c->hs.mac) {
    tsr_rpc__mac_init(&c->txmac, c->hs.key_tx);
    tsr_rpc__rx_mac_on(&c->rx, c->hs.key_rx);
  } else {
    tsr_debug("rpc %s: %s %s: plain frames (both ends asked%s)",
              c->ctx->name, who(c), c->peer,
              c->local_trusted ? ", the kernel vouching for the peer" : "");
  }
  sodium_memzero(c->hs.key_tx, sizeof c->hs.key_tx);
  sodium_memzero(c->hs.key_rx, sizeof c->hs.key_rx);
  c->state = TSR_RPC__C_READY;
  c->ready_ns = tsr_now_ns();
  c->last_rx_ns = c->ready_ns;
  snprintf(c->peer_name, sizeof c->peer_name, "%s", c->hs.peer_name);
  uint64_t tick = c->ctx->o.heartbeat_ms;
  if (tick > c->ctx->o.idle_timeout_ms / 4)
    tick = c->ctx->o.idle_timeout_ms / 4;
  if (tick < 5) tick = 5;
  uv_timer_stop(&c->timer);
  uv_timer_start(&c->timer, timer_cb, tick, tick);
  c->ops->on_ready(c);
  if (c->state != TSR_RPC__C_READY) return;
  if (n) {
    tsr_rpc__rx_push(&c->rx, rest, n);
    int rc = tsr_rpc__rx_process(&c->rx);
    if (rc && c->state == TSR_RPC__C_READY) conn_rx_error(c, rc);
  }
}

static void hs_log_failure(tsr_rpc__conn *c, int rc, char *msg,
                           size_t cap) {
  snprintf(msg, cap, "%s %s: %s", who(c), c->peer,
           c->hs.msg[0] ? c->hs.msg : tsr_strerror(rc));
  if (c->role == TSR_RPC__SERVER) {
    tsr_rpc__log_refused(c->ctx, c->peer, "%s",
                         c->hs.msg[0] ? c->hs.msg : tsr_strerror(rc));
    if (c->agg) c->agg->refused++;
  } else {
    tsr_warn("rpc %s: %s", c->ctx->name, msg);
  }
}

static void hs_read(tsr_rpc__conn *c, const uint8_t *p, size_t n) {
  uint8_t out[TSR_RPC__HS_OUT_MAX];
  size_t used, out_len;
  int rc = tsr_rpc__hs_feed(&c->hs, p, n, &used, out, &out_len);
  char msg[300];
  /* A refusal is logged before its answer leaves: whoever reads the
   * answer can count on the server's log line being there. */
  if (rc < 0) hs_log_failure(c, rc, msg, sizeof msg);
  if (out_len) {
    int src = send_bytes(c, out, out_len);
    if (src && rc >= 0) {
      rc = src;
      hs_log_failure(c, rc, msg, sizeof msg);
    }
  }
  if (rc == 1) {
    hs_done(c, p + used, n - used);
    return;
  }
  if (rc == 0) return;
  if (c->hs.close_after_send)
    tsr_rpc__conn_close_after_flush(c, rc, msg);
  else
    tsr_rpc__conn_close(c, rc, msg);
}

/* A bad frame: tell the peer what was wrong where that still makes sense,
 * then close. */
static void conn_rx_error(tsr_rpc__conn *c, int rc) {
  if (c->state != TSR_RPC__C_READY) return; /* the owner closed it */
  char msg[300];
  snprintf(msg, sizeof msg, "%s %s: %s", who(c), c->peer,
           c->rx.msg[0] ? c->rx.msg : tsr_strerror(rc));
  tsr_rpc__log_bad_frame(c->ctx, c->peer, "closing connection: %s", msg);
  c->quiet_down = 1;
  if (c->role == TSR_RPC__SERVER)
    tsr_rpc__conn_send_err(c, c->rx.err_id, c->rx.h.method, rc,
                           c->rx.msg[0] ? c->rx.msg : tsr_strerror(rc), NULL,
                           NULL);
  tsr_rpc__conn_close_after_flush(c, rc, msg);
}

static void read_cb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
  tsr_rpc__conn *c = s->data;
  if (nread == 0) return;
  if (nread < 0) {
    char msg[300];
    if (nread == UV_EOF)
      snprintf(msg, sizeof msg, "%s %s closed the connection", who(c),
               c->peer);
    else
      snprintf(msg, sizeof msg, "connection to %s %s failed: %s", who(c),
               c->peer, uv_strerror((int)nread));
    if (c->state == TSR_RPC__C_HS && c->role == TSR_RPC__SERVER) {
      tsr_rpc__log_refused(c->ctx, c->peer, "it left during the handshake");
      if (c->agg) c->agg->refused++;
    }
    tsr_rpc__conn_close(c, TSR_ECLOSED, msg);
    return;
  }
  uint64_t now = tsr_now_ns();
  c->last_rx_ns = now;
  c->bytes_in += (uint64_t)nread;
  if (c->agg) c->agg->bytes_in += (uint64_t)nread;
  if (c->state == TSR_RPC__C_HS) {
    hs_read(c, (const uint8_t *)buf->base, (size_t)nread);
    return;
  }
  if (c->state != TSR_RPC__C_READY) return;
  int rc = tsr_rpc__rx_done(&c->rx, (size_t)nread);
  if (rc) conn_rx_error(c, rc);
}

/* ---- timer: handshake deadline, heartbeats, dead peers ----------------- */

static void timer_cb(uv_timer_t *t) {
  tsr_rpc__conn *c = t->data;
  char msg[300];
  if (c->state == TSR_RPC__C_FLUSH) {
    tsr_rpc__conn_close(c, TSR_ECLOSED, "closed after flush");
    return;
  }
  if (c->state == TSR_RPC__C_HS) {
    snprintf(msg, sizeof msg, "%s %s: no handshake within %u ms, dropped",
             who(c), c->peer, c->ctx->o.handshake_timeout_ms);
    if (c->role == TSR_RPC__SERVER) {
      tsr_rpc__log_refused(c->ctx, c->peer, "no handshake within %u ms",
                           c->ctx->o.handshake_timeout_ms);
      if (c->agg) c->agg->refused++;
    } else {
      tsr_warn("rpc %s: %s", c->ctx->name, msg);
    }
    tsr_rpc__conn_close(c, TSR_ETIMEOUT, msg);
    return;
  }
  if (c->state != TSR_RPC__C_READY) return;
  uint64_t now = tsr_now_ns();
  uint64_t alive = c->last_rx_ns > c->last_progress_ns ? c->last_rx_ns
                                                       : c->last_progress_ns;
  /* a paused server connection hears nothing by choice, but its queued
   * answers drain while the peer lives (last_progress_ns) */
  if (now - alive > (uint64_t)c->ctx->o.idle_timeout_ms * 1000000ull) {
    snprintf(msg, sizeof msg, "%s %s silent for %llu ms (idle timeout %u "
             "ms): connection considered dead",
             who(c), c->peer, (unsigned long long)((now - alive) / 1000000),
             c->ctx->o.idle_timeout_ms);
    tsr_warn("rpc %s: %s", c->ctx->name, msg);
    tsr_rpc__conn_close(c, TSR_ECLOSED, msg);
    return;
  }
  if (c->role == TSR_RPC__CLIENT &&
      now - c->last_tx_ns >= (uint64_t)c->ctx->o.heartbeat_ms * 1000000ull &&
      c->writes == 0) {
    tsr_rpc__hdr p = {.version = TSR_RPC_VERSION, .kind = TSR_RPC__PING};
    tsr_rpc__conn_send(c, &p, NULL, NULL, 0, NULL, NULL);
  }
}

/* ---- setup ------------------------------------------------------------- */

int tsr_rpc__conn_init(tsr_rpc__conn *c, tsr_rpc_ctx *ctx, int role,
                       const tsr_rpc__conn_ops *ops, void *owner) {
  int local = c->local;
  memset(c, 0, sizeof *c);
  c->local = local;
  tsr_list_init(&c->done);
  c->ctx = ctx;
  c->ops = ops;
  c->owner = owner;
  c->role = role;
  c->state = TSR_RPC__C_HS;
  snprintf(c->peer, sizeof c->peer, "?");
  tsr_rpc__limits lim = {ctx->o.max_meta_bytes, ctx->o.max_payload_bytes};
  uint32_t accept =
      role == TSR_RPC__SERVER
          ? TSR_RPC__KIND_BIT(TSR_RPC__REQ) | TSR_RPC__KIND_BIT(TSR_RPC__PING)
          : TSR_RPC__KIND_BIT(TSR_RPC__RESP) | TSR_RPC__KIND_BIT(TSR_RPC__ERR) |
                TSR_RPC__KIND_BIT(TSR_RPC__PONG);
  int rc = tsr_rpc__rx_init(&c->rx, &conn_rx_ops, c, &lim, accept, &ctx->al,
                            STAGE_BYTES);
  if (rc) return rc;
  if (c->local)
    uv_pipe_init(ctx->loop, &c->sock.pipe, 0);
  else
    uv_tcp_init(ctx->loop, &c->sock.tcp);
  uv_timer_init(ctx->loop, &c->timer);
  uv_check_init(ctx->loop, &c->check);
  c->sock.handle.data = c;
  c->timer.data = c;
  c->check.data = c;
  c->handles = 3;
  c->started_ns = tsr_now_ns();
  return 0;
}

int tsr_rpc__conn_start(tsr_rpc__conn *c) {
  if (c->local) {
    /* the kernel says who the other end is (a client keeps the address
     * it was given as the peer's name, and vetted the listener before it
     * connected: this is the same answer) */
    c->local_trusted = tsr_rpc__local_vet(
        c->ctx, &c->sock.pipe, c->role == TSR_RPC__SERVER ? c->peer : NULL,
        sizeof c->peer);
  } else {
    struct sockaddr_storage ss;
    int len = sizeof ss;
    if (uv_tcp_getpeername(&c->sock.tcp, (struct sockaddr *)&ss, &len) == 0)
      tsr_rpc__fmt_sockaddr((struct sockaddr *)&ss, c->peer, sizeof c->peer);
    uv_tcp_nodelay(&c->sock.tcp, 1);
    unsigned ka = c->ctx->o.idle_timeout_ms / 1000;
    uv_tcp_keepalive(&c->sock.tcp, 1, ka ? ka : 1);
  }
  uint8_t out[TSR_RPC__HS_OUT_MAX];
  size_t out_len;
  /* plain frames are asked for on a trusted network (plain_frames), or
   * over a same-host socket whose other end the kernel vouches for; they
   * are used only when both ends ask */
  tsr_rpc__hs_init(&c->hs, c->role, c->ctx->token, c->ctx->o.token_len,
                   c->ctx->name, c->ctx->o.plain_frames || c->local_trusted,
                   out, &out_len);
  int rc = 0;
  if (out_len) rc = send_bytes(c, out, out_len);
  if (!rc) rc = uv_read_start(&c->sock.stream, alloc_cb, read_cb);
  if (rc) return rc;
  c->reading = 1;
  /* the deadline counts from the connection attempt (conn_watch) */
  uint64_t spent = (tsr_now_ns() - c->started_ns) / 1000000;
  uint64_t hs_ms = c->ctx->o.handshake_timeout_ms;
  uv_timer_start(&c->timer, timer_cb, spent < hs_ms ? hs_ms - spent : 1, 0);
  return 0;
}

void tsr_rpc__conn_watch(tsr_rpc__conn *c) {
  c->started_ns = tsr_now_ns();
  uv_timer_start(&c->timer, timer_cb, c->ctx->o.handshake_timeout_ms, 0);
}

void tsr_rpc__conn_pause(tsr_rpc__conn *c) {
  if (c->paused) return;
  c->paused = 1;
  if (c->reading) uv_read_stop(&c->sock.stream);
  c->reading = 0;
}

void tsr_rpc__conn_resume(tsr_rpc__conn *c) {
  if (!c->paused || c->state != TSR_RPC__C_READY) return;
  c->paused = 0;
  c->rx.paused = 0;
  int rc = tsr_rpc__rx_process(&c->rx);
  if (rc) {
    conn_rx_error(c, rc);
    return;
  }
  if (c->rx.paused || c->paused || c->state != TSR_RPC__C_READY) {
    c->paused = 1;
    return;
  }
  if (!c->reading &&
      uv_read_start(&c->sock.stream, alloc_cb, read_cb) == 0) {
    c->reading = 1;
    c->last_rx_ns = tsr_now_ns();
  }
}
