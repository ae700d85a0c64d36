/* The RPC client: one connection to one peer, calls multiplexed by id.
 *
 * Happy path: the client resolves and connects at once, shakes hands, and
 * sends every call as one gathered write (header + meta + the caller's
 * payload buffers, not copied). Answers find their call by id; a response
 * payload lands straight in the caller's resp_buf when one was named.
 * Calls made before the connection is up wait in a queue. Everything runs
 * on the loop thread.
 * Failure modes: every call has a deadline (one timer, calls kept sorted
 * by deadline); past it the call fails with TSR_ETIMEOUT (or TSR_EUNAVAIL
 * if it never left because there was no connection, with the last
 * connection error in the message). A lost connection fails every call
 * written on it at once with TSR_ECLOSED, then the client reconnects with
 * exponential backoff and jitter. Over max_inflight a call fails at once
 * with TSR_EBUSY. A call's payload memory is in use until its write ends,
 * so a deadline that passes during the write is reported when the write
 * ends (at worst idle_timeout later, when a stuck peer is declared dead).
 */
#include "common/rpc/rpc_int.h"

#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"

#include <stdio.h>
#include <unistd.h>

enum { P_NEW, P_QUEUED, P_SENT, P_DONE };

typedef struct pcall {
  tsr_rpc_client *cl;
  tsr_rpc_request req;
  uv_buf_t small[4];
  uv_buf_t *bufs;
  tsr_rpc_call_cb cb;
  void *data;
  uint64_t id;
  uint64_t submit_ns, deadline_ns;
  int state;
  int writing;               /* its write is in flight */
  int deliver_pending;       /* completed, waiting for the write to end */
  int status, remote;
  char msg[256];
  uint8_t *rmeta;            /* response meta (allocated) */
  size_t rmeta_len;
  void *rpay;                /* response payload */
  size_t rpay_len;
  int rpay_pool;             /* rpay is a pooled buffer */
  tsr_list link;              /* cl->calls: live calls by deadline */
  tsr_list qlink;             /* cl->queue: waiting for a connection */
  uint8_t meta[];
} pcall;

typedef struct cconn {
  tsr_rpc__conn c;
  tsr_rpc_client *cl;
  uv_connect_t creq;
  int was_ready;
  int closing_msg;            /* the server's connection error (request id
                                 0) is in: acted on once its frame is whole
                                 (and its MAC verified) */
  char server_msg[300];
} cconn;

struct tsr_rpc_client {
  tsr_rpc_ctx *ctx;
  char addr[TSR_RPC_ADDR_MAX * 4];
  char host[256], port[16];
  uv_timer_t retry, deadline;
  uv_getaddrinfo_t gai;
  int resolving;
  int handles;
  cconn *conn;
  int ready;
  int unreachable;           /* the last attempt failed */
  unsigned attempt;
  char last_err[256];
  int closing;
  tsr_rpc_close_cb close_cb;
  void *close_data;
  tsr_rpc_state_cb state_cb;
  void *state_data;
  uint64_t next_id;
  uint32_t inflight;         /* submitted, not delivered */
  uint64_t live;             /* pcalls allocated on the loop's side */
  tsr_list calls;            /* pcall.link, by deadline */
  tsr_list queue;            /* pcall.qlink */
  pcall *receiving;
  tsr_rpc__idmap ids;
  tsr_rpc_stats st;
};

static void start_connect(tsr_rpc_client *cl);
static void retry_cb(uv_timer_t *t) { start_connect(t->data); }
static void maybe_finish(tsr_rpc_client *cl);
static void arm_deadline(tsr_rpc_client *cl);

/* ---- delivery ---------------------------------------------------------- */

static void pcall_free(tsr_rpc_client *cl, pcall *p) {
  if (p->rpay_pool) tsr_rpc__buf_put(cl->ctx, p->rpay, p->rpay_len);
  tsr_rpc__free(cl->ctx, p->rmeta);
  if (p->bufs != p->small) tsr_rpc__free(cl->ctx, p->bufs);
  tsr_rpc__free(cl->ctx, p);
}

static void deliver(pcall *p) {
  tsr_rpc_client *cl = p->cl;
  uint64_t ns = tsr_now_ns() - p->submit_ns;
  tsr_rpc_result r = {
      .status = p->status, .remote = p->remote, .message = p->msg,
      .meta = p->status ? NULL : p->rmeta,
      .meta_len = p->status ? 0 : p->rmeta_len,
      .payload = p->status ? NULL : p->rpay,
      .payload_len = p->status ? 0 : p->rpay_len, .latency_ns = ns};
  cl->st.calls++;
  if (p->status) cl->st.errors++;
  if (p->cb) p->cb(&r, p->data);
  pcall_free(cl, p);
  cl->inflight--;
  cl->st.inflight--;
  cl->live--;
  maybe_finish(cl);
}

/* The live call with the nearest deadline, or NULL. */
static pcall *first_call(const tsr_rpc_client *cl) {
  tsr_list *n = tsr_list_first(&cl->calls);
  return n ? tsr_list_entry(n, pcall, link) : NULL;
}

/* Ends a call with a status (0 keeps what the answer set). */
static void complete(pcall *p, int status, int remote, const char *msg) {
  tsr_rpc_client *cl = p->cl;
  if (p->state == P_DONE) return;
  int was_head = first_call(cl) == p;
  tsr_list_remove(&p->link);
  if (p->state == P_QUEUED) tsr_list_remove(&p->qlink);
  if (p->state == P_SENT) tsr_rpc__idmap_del(&cl->ids, p->id);
  if (cl->receiving == p) {
    /* its destination must not be written once the caller has it back */
    if (cl->conn) tsr_rpc__rx_divert(&cl->conn->c.rx);
    cl->receiving = NULL;
  }
  p->state = P_DONE;
  if (status) {
    p->status = status;
    p->remote = remote;
    snprintf(p->msg, sizeof p->msg, "%s", msg);
  } else if (!p->status) {
    snprintf(p->msg, sizeof p->msg, "%s", "success");
  }
  if (was_head) arm_deadline(cl);
  if (p->writing)
    p->deliver_pending = 1;
  else
    deliver(p);
}

/* ---- deadlines --------------------------------------------------------- */

static void deadline_cb(uv_timer_t *t) {
  tsr_rpc_client *cl = t->data;
  uint64_t now = tsr_now_ns();
  char msg[256];
  pcall *p;
  while ((p = first_call(cl)) && p->deadline_ns <= now) {
    uint32_t ms = p->req.deadline_ms;
    if (p->state == P_SENT) {
      snprintf(msg, sizeof msg,
               "deadline of %u ms exceeded calling method %u on %s", ms,
               p->req.method, cl->addr);
      complete(p, TSR_ETIMEOUT, 0, msg);
    } else {
      snprintf(msg, sizeof msg,
               "no connection to %s within the deadline of %u ms (method "
               "%u): %s", cl->addr, ms, p->req.method,
               cl->last_err[0] ? cl->last_err : "still connecting");
      complete(p, TSR_EUNAVAIL, 0, msg);
    }
  }
  arm_deadline(cl);
}

static void arm_deadline(tsr_rpc_client *cl) {
  if (cl->closing) return;
  pcall *first = first_call(cl);
  if (!first) {
    uv_timer_stop(&cl->deadline);
    return;
  }
  uint64_t now = tsr_now_ns(), d = first->deadline_ns;
  uint64_t ms = d > now ? (d - now + 999999) / 1000000 : 0;
  uv_timer_start(&cl->deadline, deadline_cb, ms, 0);
}

static void insert_by_deadline(tsr_rpc_client *cl, pcall *p) {
  tsr_list *at = cl->calls.prev; /* deadlines mostly arrive in order */
  while (at != &cl->calls &&
         tsr_list_entry(at, pcall, link)->deadline_ns > p->deadline_ns)
    at = at->prev;
  tsr_list_insert_after(at, &p->link);
  if (first_call(cl) == p) arm_deadline(cl);
}

/* ---- sending ----------------------------------------------------------- */

static void req_sent(tsr_rpc__conn *c, int status, void *data) {
  pcall *p = data;
  p->writing = 0;
  if (p->deliver_pending) deliver(p);
}

static int send_call(tsr_rpc_client *cl, pcall *p) {
  tsr_rpc__conn *c = &cl->conn->c;
  uint64_t plen = 0;
  for (unsigned i = 0; i < p->req.npayload; i++) plen += p->bufs[i].len;
  uint64_t id = ++cl->next_id;
  int rc = tsr_rpc__idmap_put(&cl->ids, id, p);
  if (rc) return rc;
  tsr_rpc__hdr h = {.version = TSR_RPC_VERSION, .kind = TSR_RPC__REQ,
                    .method = p->req.method,
                    .meta_len = (uint32_t)p->req.meta_len, .id = id,
                    .payload_len = plen};
  rc = tsr_rpc__conn_send(c, &h, p->meta, p->bufs, p->req.npayload, req_sent,
                          p);
  if (rc) {
    tsr_rpc__idmap_del(&cl->ids, id);
    return rc;
  }
  p->id = id;
  p->state = P_SENT;
  p->writing = 1;
  return 0;
}

/* Puts a prepared call in flight (loop thread). 0 or a code; on a code the
 * call is untouched and not linked anywhere. */
static int submit(tsr_rpc_client *cl, pcall *p) {
  if (cl->ready) {
    int rc = send_call(cl, p);
    if (rc) return rc;
  } else {
    p->state = P_QUEUED;
    tsr_list_push_back(&cl->queue, &p->qlink);
  }
  cl->live++;
  cl->st.inflight++;
  insert_by_deadline(cl, p);
  return 0;
}

static int reserve_slot(tsr_rpc_client *cl) {
  if (cl->inflight >= cl->ctx->o.max_inflight) return TSR_EBUSY;
  cl->inflight++;
  return 0;
}

/* Checks and copies a request. */
static int prepare(tsr_rpc_client *cl, const tsr_rpc_request *req,
                   tsr_rpc_call_cb cb, void *data, pcall **out) {
  const tsr_rpc_opts *o = &cl->ctx->o;
  *out = NULL;
  if (!req || req->method == 0 || (req->meta_len && !req->meta) ||
      (req->npayload && !req->payload) || (req->resp_len && !req->resp_buf))
    return TSR_EINVAL;
  if (cl->closing) return TSR_ESHUTDOWN;
  uint64_t plen = 0;
  for (unsigned i = 0; i < req->npayload; i++) plen += req->payload[i].len;
  if (req->meta_len > o->max_meta_bytes || plen > o->max_payload_bytes)
    return TSR_ETOOBIG;
  if (o->fail_fast && cl->unreachable)
    return TSR_EUNAVAIL;
  int rc = reserve_slot(cl);
  if (rc) return rc;
  pcall *p = tsr_rpc__alloc(cl->ctx, sizeof *p + req->meta_len);
  if (!p) goto nomem;
  memset(p, 0, sizeof *p);
  p->cl = cl;
  p->req = *req;
  if (req->meta_len) memcpy(p->meta, req->meta, req->meta_len);
  p->req.meta = p->meta;
  p->bufs = p->small;
  if (req->npayload > 4) {
    p->bufs = tsr_rpc__alloc(cl->ctx, req->npayload * sizeof *p->bufs);
    if (!p->bufs) {
      tsr_rpc__free(cl->ctx, p);
      goto nomem;
    }
  }
  if (req->npayload)
    memcpy(p->bufs, req->payload, req->npayload * sizeof *p->bufs);
  p->req.payload = p->bufs;
  if (!p->req.deadline_ms) p->req.deadline_ms = o->default_deadline_ms;
  p->cb = cb;
  p->data = data;
  p->submit_ns = tsr_now_ns();
  p->deadline_ns = p->submit_ns + (uint64_t)p->req.deadline_ms * 1000000ull;
  *out = p;
  return 0;
nomem:
  cl->inflight--;
  return TSR_ENOMEM;
}

int tsr_rpc_call(tsr_rpc_client *cl, const tsr_rpc_request *req,
                 tsr_rpc_call_cb cb, void *data) {
  if (!cl) return TSR_EINVAL;
  pcall *p;
  int rc = prepare(cl, req, cb, data, &p);
  if (rc) return rc;
  rc = submit(cl, p);
  if (rc) {
    pcall_free(cl, p);
    cl->inflight--;
  }
  return rc;
}

int tsr_rpc_call_msg(tsr_rpc_client *cl, const tsr_rpc_request *req,
                     const ProtobufCMessage *msg, tsr_rpc_call_cb cb,
                     void *data) {
  uint8_t small[512];
  size_t len = protobuf_c_message_get_packed_size(msg);
  uint8_t *buf = len <= sizeof small ? small : malloc(len);
  if (!buf) return TSR_ENOMEM;
  protobuf_c_message_pack(msg, buf);
  tsr_rpc_request r = *req;
  r.meta = buf; /* copied by tsr_rpc_call */
  r.meta_len = len;
  int rc = tsr_rpc_call(cl, &r, cb, data);
  if (buf != small) free(buf);
  return rc;
}

/* ---- answers ----------------------------------------------------------- */

static int c_on_head(tsr_rpc__rx *rx, const tsr_rpc__hdr *h,
                     const uint8_t *meta, void **dst) {
  cconn *cc = rx->owner;
  tsr_rpc_client *cl = cc->cl;
  if (h->kind == TSR_RPC__ERR && h->id == 0) {
    int code;
    char m[200];
    if (tsr_rpc__err_decode(meta, h->meta_len, &code, m, sizeof m)) code =
        TSR_EPROTO;
    snprintf(cc->server_msg, sizeof cc->server_msg,
             "server %s closed the connection: %s", cl->addr, m);
    cc->closing_msg = 1;
    return 0;
  }
  pcall *p = tsr_rpc__idmap_get(&cl->ids, h->id);
  if (!p) {
    tsr_debug("rpc %s: answer to request %llu from %s after its call "
              "ended: dropped", cl->ctx->name, (unsigned long long)h->id,
              cl->addr);
    return 0;
  }
  cl->receiving = p;
  if (h->kind == TSR_RPC__ERR) {
    int code;
    if (tsr_rpc__err_decode(meta, h->meta_len, &code, p->msg,
                            sizeof p->msg)) {
      snprintf(p->msg, sizeof p->msg,
               "undecodable error answer from %s (method %u)", cl->addr,
               h->method);
      p->status = TSR_EPROTO;
    } else {
      p->status = code;
      p->remote = 1;
    }
    return 0;
  }
  if (h->meta_len) {
    p->rmeta = tsr_rpc__alloc(cl->ctx, h->meta_len);
    if (!p->rmeta) goto nomem;
    memcpy(p->rmeta, meta, h->meta_len);
    p->rmeta_len = h->meta_len;
  }
  if (p->req.resp_buf) {
    int fits = (p->req.flags & TSR_RPC_RESP_UPTO)
                   ? h->payload_len <= p->req.resp_len
                   : h->payload_len == p->req.resp_len;
    if (!fits) {
      p->status = TSR_ESHAPE;
      snprintf(p->msg, sizeof p->msg,
               "answer payload of %llu bytes from %s does not fit the "
               "destination of %zu bytes (method %u)",
               (unsigned long long)h->payload_len, cl->addr,
               p->req.resp_len, h->method);
      return 0;
    }
    p->rpay = p->req.resp_buf;
    p->rpay_len = (size_t)h->payload_len;
    *dst = p->rpay;
  } else if (h->payload_len) {
    p->rpay = tsr_rpc__buf_get(cl->ctx, (size_t)h->payload_len);
    if (!p->rpay) goto nomem;
    p->rpay_pool = 1;
    p->rpay_len = (size_t)h->payload_len;
    *dst = p->rpay;
  }
  return 0;
nomem:
  p->status = TSR_ENOMEM;
  snprintf(p->msg, sizeof p->msg,
           "out of memory for an answer of %llu bytes from %s (method %u)",
           (unsigned long long)(h->meta_len + h->payload_len), cl->addr,
           h->method);
  return 0;
}

static int c_on_frame(tsr_rpc__rx *rx, const tsr_rpc__hdr *h,
                      void *payload) {
  cconn *cc = rx->owner;
  tsr_rpc_client *cl = cc->cl;
  if (cc->closing_msg) {
    /* the server closes for a bad frame (what a relay that changes
     * frames causes): one line per interval, not one per connection */
    tsr_rpc__log_bad_frame(cl->ctx, cl->addr, "%s", cc->server_msg);
    cc->c.quiet_down = 1;
    tsr_rpc__conn_close(&cc->c, TSR_ECLOSED, cc->server_msg);
    return TSR_ECLOSED;
  }
  pcall *p = cl->receiving;
  if (!p) return 0;
  cl->receiving = NULL;
  complete(p, 0, 0, NULL);
  return cc->c.state == TSR_RPC__C_READY ? 0 : TSR_ECLOSED;
}

/* ---- connection life --------------------------------------------------- */

static void c_on_ready(tsr_rpc__conn *c) {
  cconn *cc = (cconn *)c;
  tsr_rpc_client *cl = cc->cl;
  cc->was_ready = 1;
  cl->ready = 1;
  cl->attempt = 0;
  cl->unreachable = 0;
  cl->last_err[0] = 0;
  cl->st.connects++;
  if (c->local) cl->st.connects_local++;
  if (!c->hs.mac) cl->st.connects_plain++;
  cl->st.connections = 1;
  tsr_debug("rpc %s: connected to %s (%s)", cl->ctx->name, cl->addr,
            c->peer_name);
  while (!tsr_list_empty(&cl->queue) && c->state == TSR_RPC__C_READY) {
    pcall *p = tsr_list_entry(cl->queue.next, pcall, qlink);
    tsr_list_remove(&p->qlink);
    p->state = P_NEW;
    int rc = send_call(cl, p);
    if (rc) {
      char msg[200];
      snprintf(msg, sizeof msg, "cannot send to %s: %s", cl->addr,
               tsr_strerror(rc));
      complete(p, rc, 0, msg);
    }
  }
  if (cl->state_cb && !cl->closing) cl->state_cb(cl, 1, 0, cl->state_data);
}

static void c_on_down(tsr_rpc__conn *c, int status, const char *msg) {
  cconn *cc = (cconn *)c;
  tsr_rpc_client *cl = cc->cl;
  cl->ready = 0;
  cl->st.connections = 0;
  cl->unreachable = 1;
  snprintf(cl->last_err, sizeof cl->last_err, "%s", msg);
  char m[400];
  snprintf(m, sizeof m, "connection to %s lost: %s", cl->addr, msg);
  if (cc->was_ready && !cl->closing && !c->quiet_down)
    tsr_warn("rpc %s: %s", cl->ctx->name, m);
  /* every call written on this connection fails now */
  tsr_list_foreach_safe(n, next, &cl->calls) {
    pcall *p = tsr_list_entry(n, pcall, link);
    if (p->state == P_SENT)
      complete(p, cl->closing ? TSR_ESHUTDOWN : TSR_ECLOSED, 0, m);
    else if (p->state == P_QUEUED && cl->ctx->o.fail_fast && !cl->closing)
      complete(p, TSR_EUNAVAIL, 0, m);
  }
  if (cc->was_ready && cl->state_cb && !cl->closing)
    cl->state_cb(cl, 0, status, cl->state_data);
}

static void c_on_freed(tsr_rpc__conn *c) {
  cconn *cc = (cconn *)c;
  tsr_rpc_client *cl = cc->cl;
  tsr_rpc__free(cl->ctx, cc);
  cl->conn = NULL;
  if (cl->closing) {
    maybe_finish(cl);
    return;
  }
  uint64_t ms = tsr_rpc__backoff_ms(&cl->ctx->o, cl->attempt);
  if (cl->attempt < 32) cl->attempt++;
  uv_timer_start(&cl->retry, retry_cb, ms, 0);
}

static const tsr_rpc__conn_ops client_ops = {
    .rx = {c_on_head, c_on_frame},
    .on_ready = c_on_ready,
    .on_down = c_on_down,
    .on_freed = c_on_freed,
    .on_drain = NULL,
};

static void on_connect(uv_connect_t *req, int status) {
  cconn *cc = req->data;
  if (status == UV_ECANCELED || cc->c.state != TSR_RPC__C_HS) return;
  char msg[300];
  if (status < 0) {
    snprintf(msg, sizeof msg, "cannot connect to %s: %s", cc->cl->addr,
             uv_strerror(status));
    tsr_debug("rpc %s: %s", cc->cl->ctx->name, msg);
    tsr_rpc__conn_close(&cc->c, TSR_EUNAVAIL, msg);
    return;
  }
  int rc = tsr_rpc__conn_start(&cc->c);
  if (rc) {
    snprintf(msg, sizeof msg, "cannot start the connection to %s: %s",
             cc->cl->addr, tsr_strerror(rc));
    tsr_rpc__conn_close(&cc->c, TSR_EUNAVAIL, msg);
  }
}

static void retry_later(tsr_rpc_client *cl, const char *msg) {
  snprintf(cl->last_err, sizeof cl->last_err, "%s", msg);
  cl->unreachable = 1;
  if (cl->ctx->o.fail_fast) {
    tsr_list_foreach_safe(n, next, &cl->calls) {
      pcall *p = tsr_list_entry(n, pcall, link);
      if (p->state == P_QUEUED) complete(p, TSR_EUNAVAIL, 0, msg);
    }
  }
  uint64_t ms = tsr_rpc__backoff_ms(&cl->ctx->o, cl->attempt);
  if (cl->attempt < 32) cl->attempt++;
  uv_timer_start(&cl->retry, retry_cb, ms, 0);
}

static void on_resolved(uv_getaddrinfo_t *req, int status,
                        struct addrinfo *res) {
  tsr_rpc_client *cl = req->data;
  cl->resolving = 0;
  if (cl->closing) {
    if (res) uv_freeaddrinfo(res);
    maybe_finish(cl);
    return;
  }
  char msg[300];
  if (status < 0 || !res) {
    snprintf(msg, sizeof msg, "cannot resolve %s: %s", cl->addr,
             uv_strerror(status));
    if (res) uv_freeaddrinfo(res);
    retry_later(cl, msg);
    return;
  }
  /* a peer in this network namespace: its Unix socket, else TCP */
  char lname[128];
  int lfd = tsr_rpc__local_connect(cl->ctx, tsr_rpc__pick_addr(res)->ai_addr,
                                   lname, sizeof lname,
                                   &cl->st.local_untrusted);
  cconn *cc = tsr_rpc__calloc(cl->ctx, sizeof *cc);
  if (cc) cc->c.local = lfd >= 0;
  if (!cc || tsr_rpc__conn_init(&cc->c, cl->ctx, TSR_RPC__CLIENT,
                                &client_ops, cl) != 0) {
    tsr_rpc__free(cl->ctx, cc);
    uv_freeaddrinfo(res);
    if (lfd >= 0) close(lfd);
    retry_later(cl, "out of memory for a connection");
    return;
  }
  cc->cl = cl;
  cc->c.agg = &cl->st;
  snprintf(cc->c.peer, sizeof cc->c.peer, "%s", cl->addr);
  cl->conn = cc;
  cc->creq.data = cc;
  tsr_rpc__conn_watch(&cc->c);
  int rc;
  if (lfd >= 0) {
    uv_freeaddrinfo(res);
    tsr_debug("rpc %s: %s over the same-host socket %s", cl->ctx->name,
              cl->addr, lname);
    rc = uv_pipe_open(&cc->c.sock.pipe, lfd);
    if (rc) {
      close(lfd);
    } else {
      /* a Unix connect is complete when connect() returns */
      cc->creq.data = cc;
      on_connect(&cc->creq, 0);
      return;
    }
  } else {
    rc = uv_tcp_connect(&cc->creq, &cc->c.sock.tcp,
                        tsr_rpc__pick_addr(res)->ai_addr, on_connect);
    uv_freeaddrinfo(res);
  }
  if (rc) {
    snprintf(msg, sizeof msg, "cannot connect to %s: %s", cl->addr,
             uv_strerror(rc));
    tsr_rpc__conn_close(&cc->c, TSR_EUNAVAIL, msg);
  }
}

static void start_connect(tsr_rpc_client *cl) {
  if (cl->closing || cl->conn || cl->resolving) return;
  struct addrinfo hints = {.ai_family = AF_UNSPEC,
                           .ai_socktype = SOCK_STREAM};
  cl->gai.data = cl;
  int rc = uv_getaddrinfo(cl->ctx->loop, &cl->gai, on_resolved, cl->host,
                          cl->port, &hints);
  if (rc) {
    char msg[300];
    snprintf(msg, sizeof msg, "cannot resolve %s: %s", cl->addr,
             uv_strerror(rc));
    retry_later(cl, msg);
    return;
  }
  cl->resolving = 1;
}

/* ---- creation, close, stats -------------------------------------------- */

int tsr_rpc_client_new(tsr_rpc_client **out, tsr_rpc_ctx *ctx,
                       const char *addr) {
  *out = NULL;
  if (!ctx || !addr) return TSR_EINVAL;
  char err[300];
  tsr_rpc_client *cl = tsr_rpc__calloc(ctx, sizeof *cl);
  if (!cl) return TSR_ENOMEM;
  tsr_list_init(&cl->calls);
  tsr_list_init(&cl->queue);
  int rc = tsr_rpc__split_addr(addr, cl->host, sizeof cl->host, cl->port,
                               sizeof cl->port, err, sizeof err);
  if (!rc && strlen(addr) >= sizeof cl->addr) {
    snprintf(err, sizeof err, "address %.64s... is longer than %zu bytes",
             addr, sizeof cl->addr - 1);
    rc = TSR_EINVAL;
  }
  if (rc) {
    tsr_error("rpc %s: client: %s", ctx->name, err);
    tsr_rpc__free(ctx, cl);
    return rc;
  }
  snprintf(cl->addr, sizeof cl->addr, "%s", addr);
  cl->ctx = ctx;
  tsr_rpc__idmap_init(&cl->ids, ctx);
  uv_timer_init(ctx->loop, &cl->retry);
  uv_timer_init(ctx->loop, &cl->deadline);
  cl->retry.data = cl->deadline.data = cl;
  cl->handles = 2;
  ctx->users++;
  start_connect(cl);
  *out = cl;
  return 0;
}

void tsr_rpc_client_on_state(tsr_rpc_client *cl, tsr_rpc_state_cb cb,
                             void *data) {
  cl->state_cb = cb;
  cl->state_data = data;
}

int tsr_rpc_client_connected(const tsr_rpc_client *cl) { return cl->ready; }

static void maybe_finish(tsr_rpc_client *cl) {
  if (!cl->closing || cl->handles || cl->conn || cl->resolving || cl->live)
    return;
  tsr_rpc_ctx *ctx = cl->ctx;
  tsr_rpc_close_cb cb = cl->close_cb;
  void *data = cl->close_data;
  tsr_rpc__idmap_free(&cl->ids);
  tsr_rpc__free(ctx, cl);
  ctx->users--;
  if (cb) cb(data);
}

static void handle_closed(uv_handle_t *h) {
  tsr_rpc_client *cl = h->data;
  cl->handles--;
  maybe_finish(cl);
}

void tsr_rpc_client_close(tsr_rpc_client *cl, tsr_rpc_close_cb cb,
                          void *data) {
  if (!cl || cl->closing) return;
  cl->closing = 1;
  cl->close_cb = cb;
  cl->close_data = data;
  cl->live++; /* keep the client while callbacks run */
  char msg[300];
  snprintf(msg, sizeof msg, "client of %s closing", cl->addr);
  pcall *p;
  while ((p = first_call(cl))) complete(p, TSR_ESHUTDOWN, 0, msg);
  if (cl->resolving) uv_cancel((uv_req_t *)&cl->gai);
  if (cl->conn) tsr_rpc__conn_close(&cl->conn->c, TSR_ESHUTDOWN, msg);
  uv_close((uv_handle_t *)&cl->retry, handle_closed);
  uv_close((uv_handle_t *)&cl->deadline, handle_closed);
  cl->live--;
  maybe_finish(cl);
}

void tsr_rpc_client_stats(const tsr_rpc_client *cl, tsr_rpc_stats *out) {
  *out = cl->st;
  out->mem_bytes = tsr_rpc__mem(cl->ctx);
}

