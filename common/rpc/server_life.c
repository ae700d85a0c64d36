/* The RPC server's life (rpc.h): made, its methods registered (sorted by
 * number), listening on TCP and beside it on the same-host Unix socket,
 * accepting connections, closed, and its statistics. The calls on an
 * accepted connection are server.c's.
 *
 * Failure modes: a method registered twice or after listen, an address
 * that does not parse, resolve or bind: an error naming it, and nothing
 * changes. A connection that cannot be set up for want of memory is
 * accepted and closed at once. No same-host socket is only a warning:
 * peers on this host use TCP.
 */
#include "common/rpc/server_int.h"

#include "common/err.h"
#include "common/log.h"

#include <errno.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static void handle_closed(uv_handle_t *h);

method_ent *tsr_rpc__find_method(tsr_rpc_server *s, uint32_t m) {
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
                                &tsr_rpc__server_ops, s) != 0) {
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
  if (tsr_rpc__find_method(s, m->method)) {
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
void tsr_rpc__server_maybe_finish(tsr_rpc_server *s) {
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
  tsr_rpc__server_maybe_finish(s);
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
  tsr_rpc__server_maybe_finish(s);
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
