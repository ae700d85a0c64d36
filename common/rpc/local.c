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
 * that address would reach the same namespace. A client that resolved
 * IP:PORT tries the exact name, then, when IP is a loopback address or an
 * address of one of this namespace's interfaces, the wildcard name; if
 * neither answers it connects over TCP as before.
 *
 * Who is at the other end. An abstract name has no owner and no
 * permissions: any process of the namespace, of any uid, may bind a name
 * no server holds (the exact name beside a wildcard listener, or any name
 * before the server starts) and relay what reaches it. So each end asks
 * the kernel who the other is (SO_PEERCRED: the credentials of the
 * process that called listen() or connect(), which no unprivileged
 * process can forge) and trusts a uid only when it is this process's own
 * or one named in TESSERA_RPC_PEER_UIDS (numbers separated by commas,
 * for clusters whose tasks run as several users). A client does not use
 * a socket whose listener runs as another uid: it logs the name and the
 * uid it found (one line per name per refuse_log_ms) and tries the next
 * name, then TCP. A server serves a peer of another uid, but never asks
 * it for plain frames, so its frames carry the MAC (a relay without the
 * token can then change nothing unseen). Frames go plain only when both
 * ends vetted each other this way (or both run with plain_frames).
 *
 * Why abstract names checked with SO_PEERCRED rather than filesystem
 * sockets in a folder only the cluster's user can enter: a socket file
 * lives in the mount namespace, not the network one, so it would be
 * found where TCP would reach another process (containers that share
 * /tmp but not their network) and missed where TCP reaches this one
 * (containers of a pod with their own roots); it needs a writable folder
 * every task of a job agrees on (read-only roots and no XDG_RUNTIME_DIR in
 * containers and batch jobs), a name that fits sun_path's 108 bytes, and
 * a sweep of files left by processes killed with SIGKILL. The check costs
 * one getsockopt per connection at each end.
 *
 * Failure modes. A name already taken (another server bound the same port
 * on another address of a wildcard-less host, a squatter, or a stale
 * namespace) leaves that server on TCP alone, logged; a connect that is
 * refused, or whose backlog is full, falls back to TCP; a listener of an
 * untrusted uid, or one whose credentials cannot be read, falls back to
 * the next name or TCP; opts.transport = TCP (or
 * TESSERA_RPC_TRANSPORT=tcp) turns the Unix side off at both ends.
 */
#include "common/rpc/rpc_int.h"

#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
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

int tsr_rpc__local_init(tsr_rpc_ctx *ctx) {
  ctx->self_uid = (unsigned)geteuid();
  ctx->npeer_uids = 0;
  const char *v = getenv("TESSERA_RPC_PEER_UIDS");
  if (!v || !*v) return 0;
  const char *p = v;
  for (;;) {
    char *end = NULL;
    unsigned long u = 0;
    int ok = *p >= '0' && *p <= '9';
    if (ok) {
      errno = 0;
      u = strtoul(p, &end, 10);
      ok = !errno && u < (unsigned long)(uid_t)-1 && (!*end || *end == ',');
    }
    if (!ok) {
      tsr_error("rpc: TESSERA_RPC_PEER_UIDS=\"%.100s\": expected numeric "
                "uids separated by commas (e.g. 1000,1001)", v);
      return TSR_ECONFIG;
    }
    if (ctx->npeer_uids == TSR_RPC__PEER_UIDS_MAX) {
      tsr_error("rpc: TESSERA_RPC_PEER_UIDS=\"%.100s\" names more than %d "
                "uids", v, TSR_RPC__PEER_UIDS_MAX);
      return TSR_ECONFIG;
    }
    ctx->peer_uids[ctx->npeer_uids++] = (unsigned)u;
    if (!*end) return 0;
    p = end + 1;
  }
}

int tsr_rpc__local_uid_ok(const tsr_rpc_ctx *ctx, unsigned uid) {
  if (uid == ctx->self_uid) return 1;
  for (unsigned i = 0; i < ctx->npeer_uids; i++)
    if (ctx->peer_uids[i] == uid) return 1;
  return 0;
}

/* The kernel's record of the process at the other end: 0 or -errno. */
static int peer_cred(int fd, struct ucred *cr) {
  socklen_t len = sizeof *cr;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, cr, &len)) return -errno;
  return len == sizeof *cr ? 0 : -EPROTO;
}

/* Whether a line about `key` is due (one per key per refuse_log_ms);
 * `more` gets the count of those not logged since, as a suffix. */
static int line_due(tsr_rpc_ctx *ctx, const char *key, char *more,
                    size_t cap) {
  uint64_t suppressed = 0;
  more[0] = 0;
  if (!tsr_rpc__ratelog_note_key(&ctx->local_log, key, tsr_now_ns(),
                                 (uint64_t)ctx->o.refuse_log_ms * 1000000ull,
                                 &suppressed))
    return 0;
  if (suppressed)
    snprintf(more, cap, " (and %llu more of %s in the %u ms before, not "
             "logged)", (unsigned long long)suppressed, key,
             ctx->o.refuse_log_ms);
  return 1;
}

/* Logs a same-host socket this client will not use. */
static void log_untrusted(tsr_rpc_ctx *ctx, const char *name,
                          const struct ucred *cr, int err, const char *next) {
  char more[200];
  if (!line_due(ctx, name, more, sizeof more)) return;
  if (err)
    tsr_warn("rpc %s: same-host socket %s not used: cannot tell who listens "
             "on it (%s); %s instead%s", ctx->name, name, strerror(-err),
             next, more);
  else
    tsr_warn("rpc %s: same-host socket %s not used: its listener runs as "
             "uid %u (pid %d), not as this process's uid %u or one named "
             "in TESSERA_RPC_PEER_UIDS (another local user may be sitting "
             "on the name); %s instead%s", ctx->name, name,
             (unsigned)cr->uid, (int)cr->pid, ctx->self_uid, next, more);
}

/* One non-blocking connect; a Unix connect completes at once or fails.
 * The socket, when its listener runs as a trusted uid; else -1 (nobody
 * listens: *untrusted stays 0; an untrusted listener: 1, logged). */
static int try_name(tsr_rpc_ctx *ctx, const char *host, int port,
                    const char *next, char *name, size_t namecap,
                    int *untrusted) {
  *untrusted = 0;
  struct sockaddr_un un;
  socklen_t len = local_addr(&un, host, port);
  if (!len) return -1;
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  if (connect(fd, (struct sockaddr *)&un, len)) {
    close(fd); /* refused, no such name, or a full backlog: TCP */
    return -1;
  }
  char nm[128];
  snprintf(nm, sizeof nm, "@%s", un.sun_path + 1);
  struct ucred cr;
  int err = peer_cred(fd, &cr);
  if (err || !tsr_rpc__local_uid_ok(ctx, (unsigned)cr.uid)) {
    close(fd);
    *untrusted = 1;
    log_untrusted(ctx, nm, &cr, err, next);
    return -1;
  }
  snprintf(name, namecap, "%s", nm);
  return fd;
}

int tsr_rpc__local_connect(tsr_rpc_ctx *ctx, const struct sockaddr *peer,
                           char *name, size_t namecap, uint64_t *untrusted) {
  if (!tsr_rpc__local_wanted(ctx)) return -1;
  char host[INET6_ADDRSTRLEN + 3];
  int port;
  if (host_of(peer, host, sizeof host, &port)) return -1;
  int fd = -1, bad = 0;
  int wildcard = is_local(peer);
  if (strcmp(host, "any")) {
    fd = try_name(ctx, host, port,
                  wildcard ? "the wildcard name, then TCP," : "TCP", name,
                  namecap, &bad);
    *untrusted += (uint64_t)bad;
  }
  if (fd < 0 && wildcard) {
    fd = try_name(ctx, "any", port, "TCP", name, namecap, &bad);
    *untrusted += (uint64_t)bad;
  }
  return fd;
}

int tsr_rpc__local_vet(tsr_rpc_ctx *ctx, uv_pipe_t *pipe, char *peer,
                       size_t cap) {
  uv_os_fd_t fd;
  struct ucred cr;
  int err = uv_fileno((uv_handle_t *)pipe, &fd);
  if (!err) err = peer_cred(fd, &cr);
  int ok = !err && tsr_rpc__local_uid_ok(ctx, (unsigned)cr.uid);
  if (!peer) return ok;
  if (err) {
    snprintf(peer, cap, "unix");
  } else if (ok) {
    snprintf(peer, cap, "unix:pid %d", (int)cr.pid);
  } else {
    snprintf(peer, cap, "unix:pid %d uid %u", (int)cr.pid,
             (unsigned)cr.uid);
  }
  if (ok) return 1;
  /* served, with a MAC on every frame: a peer of another uid may hold the
   * token (a cluster of several users that did not name them all), or be
   * a relay that does not */
  char key[32], more[200];
  if (err)
    snprintf(key, sizeof key, "peers of unknown uid");
  else
    snprintf(key, sizeof key, "peers of uid %u", (unsigned)cr.uid);
  if (!line_due(ctx, key, more, sizeof more)) return 0;
  tsr_warn("rpc %s: same-host peer %s %s%s%s: its frames carry a MAC%s",
           ctx->name, peer,
           err ? "whose uid cannot be read (" : "is not this process's uid "
                                               "or one named in "
                                               "TESSERA_RPC_PEER_UIDS",
           err ? strerror(-err) : "", err ? ")" : "", more);
  return 0;
}
