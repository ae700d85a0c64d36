/* The RPC context: options, the counting allocator, the receive buffer
 * pool, the cluster token, reconnect backoff and address parsing.
 *
 * Happy path: options are copied with defaults filled in; every byte the
 * library allocates goes through a wrapper that counts it (the stats show
 * what the library holds, a test can fail allocations through the hook);
 * receive buffers come back to power-of-two free lists so a steady stream
 * of megabyte payloads allocates nothing and faults no page.
 * Failure modes: options that make no sense (no token, a limit of the
 * wrong size) are refused at creation with a logged reason; the pool
 * never keeps more than opts.pool_bytes.
 */
#include "common/rpc/rpc_int.h"

#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"

#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#define PREFIX 16 /* keeps 16-byte alignment */
#define POOL_MIN_SHIFT 12

static void *sys_alloc(void *ctx, size_t n) { return malloc(n); }
static void sys_free(void *ctx, void *p) { free(p); }

static void *count_alloc(void *vctx, size_t n) {
  tsr_rpc_ctx *ctx = vctx;
  if (n > SIZE_MAX - PREFIX) return NULL;
  uint8_t *p = ctx->user_al.alloc(ctx->user_al.ctx, n + PREFIX);
  if (!p) return NULL;
  memcpy(p, &n, sizeof n);
  __atomic_add_fetch(&ctx->mem_bytes, n, __ATOMIC_RELAXED);
  return p + PREFIX;
}

static void count_free(void *vctx, void *vp) {
  tsr_rpc_ctx *ctx = vctx;
  if (!vp) return;
  uint8_t *p = (uint8_t *)vp - PREFIX;
  size_t n;
  memcpy(&n, p, sizeof n);
  __atomic_sub_fetch(&ctx->mem_bytes, n, __ATOMIC_RELAXED);
  ctx->user_al.free(ctx->user_al.ctx, p);
}

static void *pb_alloc(void *vctx, size_t n) { return count_alloc(vctx, n); }
static void pb_free(void *vctx, void *p) { count_free(vctx, p); }

void *tsr_rpc__alloc(tsr_rpc_ctx *ctx, size_t n) {
  return count_alloc(ctx, n);
}
void *tsr_rpc__calloc(tsr_rpc_ctx *ctx, size_t n) {
  void *p = count_alloc(ctx, n);
  if (p) memset(p, 0, n);
  return p;
}
void tsr_rpc__free(tsr_rpc_ctx *ctx, void *p) { count_free(ctx, p); }

char *tsr_rpc__strdup(tsr_rpc_ctx *ctx, const char *s) {
  size_t n = strlen(s) + 1;
  char *d = count_alloc(ctx, n);
  if (d) memcpy(d, s, n);
  return d;
}

uint64_t tsr_rpc__mem(const tsr_rpc_ctx *ctx) {
  return __atomic_load_n(&ctx->mem_bytes, __ATOMIC_RELAXED);
}

static int pool_class(size_t n) {
  int shift = POOL_MIN_SHIFT;
  while (((size_t)1 << shift) < n) shift++;
  return shift - POOL_MIN_SHIFT;
}

void *tsr_rpc__buf_get(tsr_rpc_ctx *ctx, size_t n) {
  if (n < ((size_t)1 << POOL_MIN_SHIFT)) return count_alloc(ctx, n ? n : 1);
  int c = pool_class(n);
  if (c >= TSR_RPC__POOL_CLASSES) return NULL;
  void *p = ctx->pool[c];
  if (p) {
    memcpy(&ctx->pool[c], p, sizeof(void *));
    ctx->pool_held -= (uint64_t)1 << (c + POOL_MIN_SHIFT);
    return p;
  }
  return count_alloc(ctx, (size_t)1 << (c + POOL_MIN_SHIFT));
}

void tsr_rpc__buf_put(tsr_rpc_ctx *ctx, void *p, size_t n) {
  if (!p) return;
  if (n < ((size_t)1 << POOL_MIN_SHIFT)) {
    count_free(ctx, p);
    return;
  }
  int c = pool_class(n);
  uint64_t sz = (uint64_t)1 << (c + POOL_MIN_SHIFT);
  if (ctx->pool_held + sz > ctx->o.pool_bytes) {
    count_free(ctx, p);
    return;
  }
  memcpy(p, &ctx->pool[c], sizeof(void *));
  ctx->pool[c] = p;
  ctx->pool_held += sz;
}

static void pool_drain(tsr_rpc_ctx *ctx) {
  for (int c = 0; c < TSR_RPC__POOL_CLASSES; c++) {
    while (ctx->pool[c]) {
      void *p = ctx->pool[c];
      memcpy(&ctx->pool[c], p, sizeof(void *));
      count_free(ctx, p);
    }
  }
  ctx->pool_held = 0;
}

static void fill_defaults(tsr_rpc_opts *o) {
  if (!o->max_meta_bytes) o->max_meta_bytes = 1u << 20;
  if (!o->max_payload_bytes) o->max_payload_bytes = (uint64_t)1 << 30;
  if (!o->max_inflight) o->max_inflight = 1024;
  if (!o->max_write_queue) o->max_write_queue = (uint64_t)64 << 20;
  if (!o->handshake_timeout_ms) o->handshake_timeout_ms = 5000;
  if (!o->heartbeat_ms) o->heartbeat_ms = 1000;
  if (!o->idle_timeout_ms) o->idle_timeout_ms = 10000;
  if (!o->backoff_min_ms) o->backoff_min_ms = 50;
  if (!o->backoff_max_ms) o->backoff_max_ms = 5000;
  if (!o->default_deadline_ms) o->default_deadline_ms = 30000;
  if (!o->pool_bytes) o->pool_bytes = (uint64_t)256 << 20;
  if (!o->refuse_log_ms) o->refuse_log_ms = 10000;
}

int tsr_rpc_ctx_new(tsr_rpc_ctx **out, uv_loop_t *loop,
                    const tsr_rpc_opts *opts) {
  *out = NULL;
  if (!loop || !opts) return TSR_EINVAL;
  if (!opts->token || opts->token_len == 0) {
    tsr_error("rpc: no cluster token: set TESSERA_TOKEN or pass "
              "--token-file FILE");
    return TSR_ECONFIG;
  }
  if (opts->token_len > TSR_RPC_TOKEN_MAX) {
    tsr_error("rpc: cluster token of %zu bytes is longer than %d",
              opts->token_len, TSR_RPC_TOKEN_MAX);
    return TSR_ECONFIG;
  }
  tsr_rpc_opts o = *opts;
  fill_defaults(&o);
  if (o.max_payload_bytes > ((uint64_t)1 << 40)) {
    tsr_error("rpc: max_payload_bytes %llu is over 1 TiB",
              (unsigned long long)o.max_payload_bytes);
    return TSR_ECONFIG;
  }
  if (o.backoff_min_ms > o.backoff_max_ms) {
    tsr_error("rpc: backoff_min_ms %u is above backoff_max_ms %u",
              o.backoff_min_ms, o.backoff_max_ms);
    return TSR_ECONFIG;
  }
  if (o.transport != TSR_RPC_TRANSPORT_AUTO &&
      o.transport != TSR_RPC_TRANSPORT_TCP) {
    tsr_error("rpc: transport %d is neither AUTO (0) nor TCP (1)",
              o.transport);
    return TSR_ECONFIG;
  }
  const char *tr = getenv("TESSERA_RPC_TRANSPORT");
  if (tr && *tr) {
    if (!strcmp(tr, "tcp")) {
      o.transport = TSR_RPC_TRANSPORT_TCP;
    } else if (strcmp(tr, "auto")) {
      tsr_error("rpc: TESSERA_RPC_TRANSPORT=%s: \"auto\" (Unix sockets to "
                "peers on this host, TCP to others) or \"tcp\"", tr);
      return TSR_ECONFIG;
    }
  }
  if (o.heartbeat_ms >= o.idle_timeout_ms) {
    tsr_error("rpc: heartbeat_ms %u must be below idle_timeout_ms %u",
              o.heartbeat_ms, o.idle_timeout_ms);
    return TSR_ECONFIG;
  }
  if (sodium_init() < 0) {
    tsr_error("rpc: libsodium failed to initialise");
    return TSR_EAUTH;
  }
  tsr_rpc_allocator ual = {sys_alloc, sys_free, NULL};
  if (opts->allocator) ual = *opts->allocator;
  tsr_rpc_ctx *ctx = ual.alloc(ual.ctx, sizeof *ctx);
  if (!ctx) return TSR_ENOMEM;
  memset(ctx, 0, sizeof *ctx);
  ctx->loop = loop;
  ctx->user_al = ual;
  ctx->al.alloc = count_alloc;
  ctx->al.free = count_free;
  ctx->al.ctx = ctx;
  ctx->pb_al.alloc = pb_alloc;
  ctx->pb_al.free = pb_free;
  ctx->pb_al.allocator_data = ctx;
  memcpy(ctx->token, opts->token, opts->token_len);
  snprintf(ctx->name, sizeof ctx->name, "%s", opts->name ? opts->name : "");
  ctx->o = o;
  ctx->o.token = ctx->token;
  ctx->o.name = ctx->name;
  ctx->o.allocator = NULL;
  if (tsr_rpc__local_init(ctx)) {
    sodium_memzero(ctx->token, sizeof ctx->token);
    ual.free(ual.ctx, ctx);
    return TSR_ECONFIG;
  }
  *out = ctx;
  return 0;
}

int tsr_rpc_ctx_free(tsr_rpc_ctx *ctx) {
  if (!ctx) return 0;
  if (ctx->users) {
    tsr_error("rpc: context freed while %u servers or clients are open",
              ctx->users);
    return TSR_EBUSY;
  }
  pool_drain(ctx);
  sodium_memzero(ctx->token, sizeof ctx->token);
  tsr_rpc_allocator ual = ctx->user_al;
  ual.free(ual.ctx, ctx);
  return 0;
}

uv_loop_t *tsr_rpc_ctx_loop(const tsr_rpc_ctx *ctx) { return ctx->loop; }

void tsr_rpc_ctx_opts(const tsr_rpc_ctx *ctx, tsr_rpc_opts *out) {
  *out = ctx->o;
  out->token = NULL;
  out->token_len = 0;
}

int tsr_rpc_token_load(const char *path, void *buf, size_t cap, size_t *len,
                       char *err, size_t errlen) {
  *len = 0;
  if (path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      int e = errno;
      if (e == EACCES) /* a container's uid against a host file's mode */
        snprintf(err, errlen,
                 "token file %s: %s: this process runs as uid %u; make the "
                 "file readable by it (mode 0644, or owned by uid %u)",
                 path, strerror(e), (unsigned)geteuid(), (unsigned)geteuid());
      else
        snprintf(err, errlen, "token file %s: %s", path, strerror(e));
      return TSR_EIO;
    }
    size_t n = 0;
    uint8_t tmp[TSR_RPC_TOKEN_MAX + 3];
    for (;;) {
      ssize_t r = read(fd, tmp + n, sizeof tmp - n);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) {
        int e = errno;
        close(fd);
        snprintf(err, errlen, "token file %s: %s", path, strerror(e));
        return TSR_EIO;
      }
      if (r == 0) break;
      n += (size_t)r;
      if (n == sizeof tmp) break;
    }
    close(fd);
    if (n > 0 && tmp[n - 1] == '\n') n--;
    if (n > 0 && tmp[n - 1] == '\r') n--;
    if (n == 0) {
      snprintf(err, errlen, "token file %s is empty", path);
      return TSR_ECONFIG;
    }
    if (n > TSR_RPC_TOKEN_MAX || n > cap) {
      snprintf(err, errlen, "token file %s holds more than %zu bytes", path,
               cap < TSR_RPC_TOKEN_MAX ? cap : (size_t)TSR_RPC_TOKEN_MAX);
      return TSR_ETOOBIG;
    }
    memcpy(buf, tmp, n);
    sodium_memzero(tmp, sizeof tmp);
    *len = n;
    return 0;
  }
  const char *env = getenv("TESSERA_TOKEN");
  if (!env) {
    snprintf(err, errlen,
             "no cluster token: set TESSERA_TOKEN or pass --token-file FILE");
    return TSR_ECONFIG;
  }
  size_t n = strlen(env);
  if (n == 0) {
    snprintf(err, errlen, "TESSERA_TOKEN is set but empty");
    return TSR_ECONFIG;
  }
  if (n > TSR_RPC_TOKEN_MAX || n > cap) {
    snprintf(err, errlen, "TESSERA_TOKEN holds more than %zu bytes",
             cap < TSR_RPC_TOKEN_MAX ? cap : (size_t)TSR_RPC_TOKEN_MAX);
    return TSR_ETOOBIG;
  }
  memcpy(buf, env, n);
  *len = n;
  return 0;
}

int tsr_rpc_token_generate(char *buf, size_t len) {
  if (!buf || len < 33) return TSR_EINVAL;
  if (sodium_init() < 0) return TSR_EAUTH;
  static const char hex[] = "0123456789abcdef";
  for (size_t i = 0; i + 1 < len; i++)
    buf[i] = hex[randombytes_uniform(16)];
  buf[len - 1] = 0;
  return 0;
}

uint64_t tsr_rpc__backoff_ms(const tsr_rpc_opts *o, unsigned attempt) {
  uint64_t d = o->backoff_min_ms;
  for (unsigned i = 0; i < attempt && d < o->backoff_max_ms; i++) d *= 2;
  if (d > o->backoff_max_ms) d = o->backoff_max_ms;
  /* "equal jitter": half fixed, half random, so a cluster of clients that
   * lost the same server do not come back in lockstep */
  uint64_t half = d / 2;
  return half + (half ? randombytes_uniform((uint32_t)half + 1) : 0);
}

int tsr_rpc__split_addr(const char *addr, char *host, size_t hostcap,
                        char *port, size_t portcap, char *err,
                        size_t errlen) {
  if (!addr || !*addr) {
    snprintf(err, errlen, "empty address (expected host:port)");
    return TSR_EINVAL;
  }
  const char *colon, *hs = addr, *he;
  if (addr[0] == '[') {
    he = strchr(addr, ']');
    if (!he || he[1] != ':') {
      snprintf(err, errlen, "address '%s': expected [ipv6]:port", addr);
      return TSR_EINVAL;
    }
    hs = addr + 1;
    colon = he + 1;
  } else {
    colon = strrchr(addr, ':');
    if (!colon) {
      snprintf(err, errlen, "address '%s' has no port (expected host:port)",
               addr);
      return TSR_EINVAL;
    }
    if (memchr(addr, ':', (size_t)(colon - addr))) {
      snprintf(err, errlen,
               "address '%s': put an IPv6 address in brackets ([::1]:port)",
               addr);
      return TSR_EINVAL;
    }
    he = colon;
  }
  size_t hl = (size_t)(he - hs);
  const char *ps = colon + 1;
  size_t pl = strlen(ps);
  char *end;
  errno = 0;
  long pn = pl ? strtol(ps, &end, 10) : -1;
  if (hl == 0 || hl >= hostcap || pl == 0 || pl >= portcap || *end ||
      pn < 0 || pn > 65535 || errno) {
    snprintf(err, errlen, "address '%s': bad host or port (0-65535)", addr);
    return TSR_EINVAL;
  }
  memcpy(host, hs, hl);
  host[hl] = 0;
  memcpy(port, ps, pl + 1);
  return 0;
}

const struct addrinfo *tsr_rpc__pick_addr(const struct addrinfo *res) {
  for (const struct addrinfo *a = res; a; a = a->ai_next)
    if (a->ai_family == AF_INET) return a;
  return res;
}

void tsr_rpc__fmt_sockaddr(const struct sockaddr *sa, char *out, size_t cap) {
  char ip[64] = "?";
  int port = 0;
  if (sa->sa_family == AF_INET) {
    const struct sockaddr_in *s4 = (const struct sockaddr_in *)sa;
    uv_ip4_name(s4, ip, sizeof ip);
    port = ntohs(s4->sin_port);
    snprintf(out, cap, "%s:%d", ip, port);
  } else if (sa->sa_family == AF_INET6) {
    const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)sa;
    uv_ip6_name(s6, ip, sizeof ip);
    port = ntohs(s6->sin6_port);
    snprintf(out, cap, "[%s]:%d", ip, port);
  } else {
    snprintf(out, cap, "?");
  }
}

int tsr_rpc_frame_mac_setting(const char *flag, int *plain, char *err,
                              size_t errlen) {
  const char *v = flag, *where = "--frame-mac";
  if (!v) {
    v = getenv("TESSERA_FRAME_MAC");
    where = "TESSERA_FRAME_MAC";
  }
  *plain = 0;
  if (!v || !v[0]) return 0;
  static const char *const on[] = {"on", "1", "true", "yes"};
  static const char *const off[] = {"off", "0", "false", "no"};
  for (size_t i = 0; i < 4; i++) {
    if (strcasecmp(v, on[i]) == 0) return 0;
    if (strcasecmp(v, off[i]) == 0) {
      *plain = 1;
      return 0;
    }
  }
  return tsr_errf(err, errlen, TSR_ECONFIG, "%s \"%.100s\" is not on or off",
                  where, v);
}

/* One line about a peer, rate limited per address in `rl`: "rpc NAME:
 * PREFIX TEXT", then the count of the lines not logged for that address
 * since its last one, as "(and N more WHAT of HOST ...)". */
static void log_limited(tsr_rpc_ctx *ctx, tsr_rpc__ratelog *rl,
                        const char *peer, const char *prefix,
                        const char *what, const char *fmt, va_list ap) {
  uint64_t suppressed = 0;
  char host[TSR_RPC_ADDR_MAX];
  if (!tsr_rpc__ratelog_note(rl, peer, tsr_now_ns(),
                             (uint64_t)ctx->o.refuse_log_ms * 1000000ull,
                             &suppressed, host, sizeof host))
    return;
  char text[400];
  vsnprintf(text, sizeof text, fmt, ap);
  if (suppressed)
    tsr_warn("rpc %s: %s%s (and %llu more %s %s in the %u ms before, not "
             "logged)", ctx->name, prefix, text,
             (unsigned long long)suppressed, what, host,
             ctx->o.refuse_log_ms);
  else
    tsr_warn("rpc %s: %s%s", ctx->name, prefix, text);
}

void tsr_rpc__log_refused(tsr_rpc_ctx *ctx, const char *peer,
                          const char *fmt, ...) {
  char prefix[TSR_RPC_ADDR_MAX + 20];
  snprintf(prefix, sizeof prefix, "refused peer %s: ", peer);
  va_list ap;
  va_start(ap, fmt);
  log_limited(ctx, &ctx->refused, peer, prefix, "refusals of", fmt, ap);
  va_end(ap);
}

void tsr_rpc__log_bad_frame(tsr_rpc_ctx *ctx, const char *peer,
                            const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  log_limited(ctx, &ctx->bad_frames, peer, "", "bad frames from",
              fmt, ap);
  va_end(ap);
}
