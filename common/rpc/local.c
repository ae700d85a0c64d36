/* The same-host transport: a Unix domain socket beside every TCP listener,
 * for peers in the same network namespace (tessera local, several
 * processes per node). Only the stream differs: the handshake, the frames
 * and everything above them are the ones TCP carries.
 *
 * Happy path. A server that listened on TCP also listens on an abstract
 * Unix socket named after the address it bound: "tessera-rpc/IP:PORT",
 * or "tessera-rpc/any:PORT" when it bound the wildcard address. Abstract
 * names belong to the network namespace (no file, nothing left behind when
 * a process dies, never shared with a container or a namespace that has
 * its own network), so a name exists exactly when a TCP connection to
 * that address would reach the same process. A client that resolved
 * IP:PORT tries the exact name, then, when IP is a loopback address or an
 * address of one of this namespace's interfaces, the wildcard name; if
 * neither answers it connects over TCP as before.
 *
 * Failure modes. A name already taken (another server bound the same port
 * on another address of a wildcard-less host, or a stale namespace) leaves
 * that server on TCP alone, logged; a connect that is refused, or whose
 * backlog is full, falls back to TCP; opts.transport = TCP (or
 * TESSERA_RPC_TRANSPORT=tcp) turns the Unix side off at both ends.
 */
#include "common/rpc/rpc_int.h"

#include "common/err.h"
#include "common/log.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define LOCAL_PREFIX "tessera-rpc/"

/* The abstract name for an address (wildcard: "any"); its length, with the
 * leading NUL, is what bind/connect take. */
static socklen_t local_addr(struct sockaddr_un *un, const char *host,
                            int port) {
  memset(un, 0, sizeof *un);
  un->sun_family = AF_UNIX;
  int n = snprintf(un->sun_path + 1, sizeof un->sun_path - 1,
                   LOCAL_PREFIX "%s:%d", host, port);
  if (n < 0 || (size_t)n >= sizeof un->sun_path - 1) return 0;
  return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

/* "ip" text of an address and its port; wildcard addresses give "any". */
static int host_of(const struct sockaddr *sa, char *host, size_t cap,
                   int *port) {
  if (sa->sa_family == AF_INET) {
    const struct sockaddr_in *s4 = (const struct sockaddr_in *)sa;
    *port = ntohs(s4->sin_port);
    if (s4->sin_addr.s_addr == htonl(INADDR_ANY)) {
      snprintf(host, cap, "any");
      return 0;
    }
    return uv_ip4_name(s4, host, cap);
  }
  if (sa->sa_family == AF_INET6) {
    const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)sa;
    *port = ntohs(s6->sin6_port);
    if (!memcmp(&s6->sin6_addr, &in6addr_any, sizeof in6addr_any)) {
      snprintf(host, cap, "any");
      return 0;
    }
    int rc = uv_ip6_name(s6, host, cap);
    if (rc) return rc;
    size_t n = strlen(host);
    if (n + 3 > cap) return UV_ENOBUFS;
    memmove(host + 1, host, n + 1);
    host[0] = '[';
    host[n + 1] = ']';
    host[n + 2] = 0;
    return 0;
  }
  return UV_EAFNOSUPPORT;
}

int tsr_rpc__local_wanted(const tsr_rpc_ctx *ctx) {
  return ctx->o.transport != TSR_RPC_TRANSPORT_TCP;
}

int tsr_rpc__local_listen(tsr_rpc_ctx *ctx, const struct sockaddr *bound,
                          uv_pipe_t *pipe, uv_connection_cb cb, char *name,
                          size_t namecap) {
  uv_pipe_init(ctx->loop, pipe, 0); /* the caller closes it in any case */
  char host[INET6_ADDRSTRLEN + 3];
  int port;
  int rc = host_of(bound, host, sizeof host, &port);
  if (rc) return rc;
  struct sockaddr_un un;
  socklen_t len = local_addr(&un, host, port);
  if (!len) return UV_ENAMETOOLONG;
  snprintf(name, namecap, "@%s", un.sun_path + 1);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -errno;
  if (bind(fd, (struct sockaddr *)&un, len) || listen(fd, 511) ||
      (rc = uv_pipe_open(pipe, fd))) {
    rc = rc ? rc : -errno;
    close(fd); /* not the handle's yet */
    return rc;
  }
  return uv_listen((uv_stream_t *)pipe, 511, cb);
}

/* Loopback, or an address of an interface of this network namespace. */
static int is_local(const struct sockaddr *sa) {
  if (sa->sa_family == AF_INET) {
    uint32_t a = ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr);
    if ((a >> 24) == 127) return 1;
  } else if (sa->sa_family == AF_INET6) {
    const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
    if (IN6_IS_ADDR_LOOPBACK(a)) return 1;
  } else {
    return 0;
  }
  uv_interface_address_t *ifs;
  int n;
  if (uv_interface_addresses(&ifs, &n)) return 0;
  int found = 0;
  for (int i = 0; i < n && !found; i++) {
    const struct sockaddr *ia = (const struct sockaddr *)&ifs[i].address;
    if (ia->sa_family != sa->sa_family) continue;
    if (sa->sa_family == AF_INET)
      found = ((const struct sockaddr_in *)ia)->sin_addr.s_addr ==
              ((const struct sockaddr_in *)sa)->sin_addr.s_addr;
    else
      found = !memcmp(&((const struct sockaddr_in6 *)ia)->sin6_addr,
                      &((const struct sockaddr_in6 *)sa)->sin6_addr,
                      sizeof(struct in6_addr));
  }
  uv_free_interface_addresses(ifs, n);
  return found;
}

/* One non-blocking connect; a Unix connect completes at once or fails. */
static int try_name(const char *host, int port, char *name, size_t namecap) {
  struct sockaddr_un un;
  socklen_t len = local_addr(&un, host, port);
  if (!len) return -1;
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  if (connect(fd, (struct sockaddr *)&un, len)) {
    close(fd); /* refused, no such name, or a full backlog: TCP */
    return -1;
  }
  snprintf(name, namecap, "@%s", un.sun_path + 1);
  return fd;
}

int tsr_rpc__local_connect(const tsr_rpc_ctx *ctx,
                           const struct sockaddr *peer, char *name,
                           size_t namecap) {
  if (!tsr_rpc__local_wanted(ctx)) return -1;
  char host[INET6_ADDRSTRLEN + 3];
  int port;
  if (host_of(peer, host, sizeof host, &port)) return -1;
  int fd = -1;
  if (strcmp(host, "any")) fd = try_name(host, port, name, namecap);
  if (fd < 0 && is_local(peer)) fd = try_name("any", port, name, namecap);
  return fd;
}

void tsr_rpc__local_peer(uv_pipe_t *pipe, char *out, size_t cap) {
  uv_os_fd_t fd;
  struct ucred cr;
  socklen_t len = sizeof cr;
  if (uv_fileno((uv_handle_t *)pipe, &fd) == 0 &&
      getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) == 0)
    snprintf(out, cap, "unix:pid %d", (int)cr.pid);
  else
    snprintf(out, cap, "unix");
}
