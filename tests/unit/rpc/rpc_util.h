/* Helpers shared by the RPC unit tests: a loop that runs until a flag is
 * set or a deadline passes (a test never hangs), contexts with a test
 * token, a failing allocator, and a blocking raw client that speaks the
 * handshake itself so a test can send any bytes it likes. */
#ifndef TSR_TEST_RPC_UTIL_H
#define TSR_TEST_RPC_UTIL_H

#include "common/clock.h"
#include "common/err.h"
#include "common/rpc/rpc.h"
#include "common/rpc/rpc_int.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define TEST_TOKEN "test-cluster-token"

static inline void ru_guard_cb(uv_timer_t *t) { *(int *)t->data = 1; }

/* Runs the loop until *flag is non-zero or timeout_ms passed; returns
 * non-zero when the flag was set. */
static inline int ru_run_until(uv_loop_t *loop, volatile int *flag,
                        unsigned timeout_ms) {
  uv_timer_t guard;
  int expired = 0;
  uv_timer_init(loop, &guard);
  guard.data = &expired;
  uv_timer_start(&guard, ru_guard_cb, timeout_ms, 0);
  while (!*flag && !expired) uv_run(loop, UV_RUN_ONCE);
  uv_close((uv_handle_t *)&guard, NULL);
  uv_run(loop, UV_RUN_NOWAIT);
  return *flag != 0;
}

static inline void ru_set_flag(void *data) { *(int *)data = 1; }

static inline void ru_opts(tsr_rpc_opts *o, const char *name) {
  memset(o, 0, sizeof *o);
  o->name = name;
  o->token = TEST_TOKEN;
  o->token_len = strlen(TEST_TOKEN);
}

/* Allocator that fails the n-th allocation (counting from 1) when armed. */
typedef struct ru_failer {
  long count;
  long fail_at;   /* 0: never */
  long failures;
} ru_failer;

static inline void *ru_fail_alloc(void *ctx, size_t n) {
  ru_failer *f = ctx;
  long k = __atomic_add_fetch(&f->count, 1, __ATOMIC_RELAXED);
  if (f->fail_at && k == f->fail_at) {
    __atomic_add_fetch(&f->failures, 1, __ATOMIC_RELAXED);
    return NULL;
  }
  return malloc(n);
}
static inline void ru_fail_free(void *ctx, void *p) { free(p); }

/* ---- blocking raw client ------------------------------------------------ */

static inline int ru_connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  struct timeval tv = {.tv_sec = 5};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

/* The same over the server's same-host Unix socket: the abstract name
 * local.c gives a server bound to 127.0.0.1:port. */
static inline int ru_connect_unix(int port) {
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  int n = snprintf(a.sun_path + 1, sizeof a.sun_path - 1,
                   "tessera-rpc/127.0.0.1:%d", port);
  struct timeval tv = {.tv_sec = 5};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  if (connect(fd, (struct sockaddr *)&a,
              (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 +
                          (size_t)n)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

static inline int ru_write_all(int fd, const void *p, size_t n) {
  const uint8_t *b = p;
  while (n) {
    ssize_t w = write(fd, b, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    b += w;
    n -= (size_t)w;
  }
  return 0;
}

static inline int ru_read_all(int fd, void *p, size_t n) {
  uint8_t *b = p;
  while (n) {
    ssize_t r = read(fd, b, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    b += r;
    n -= (size_t)r;
  }
  return 0;
}

/* Runs the client side of the handshake on a blocking socket; records what
 * it sent (for replay tests) when rec is not NULL (>= HELLO+PROOF bytes). */
static inline int ru_handshake(int fd, const char *token, uint8_t *rec) {
  tsr_rpc__hs hs;
  uint8_t out[TSR_RPC__HS_OUT_MAX], in[256];
  size_t out_len, used, rec_len = 0;
  tsr_rpc__hs_init(&hs, TSR_RPC__CLIENT, token, strlen(token), "raw", out,
                   &out_len);
  for (;;) {
    if (out_len) {
      if (ru_write_all(fd, out, out_len)) return -1;
      if (rec) memcpy(rec + rec_len, out, out_len);
      rec_len += out_len;
    }
    ssize_t r = read(fd, in, sizeof in);
    if (r <= 0) return -1;
    int rc = tsr_rpc__hs_feed(&hs, in, (size_t)r, &used, out, &out_len);
    if (rc == 1) return 0;
    if (rc < 0) return rc;
  }
}

static inline size_t ru_frame(uint8_t *buf, unsigned kind, uint32_t method,
                       uint64_t id, const void *meta, uint32_t meta_len,
                       uint64_t payload_len) {
  tsr_rpc__hdr h = {.version = TSR_RPC_VERSION, .kind = (uint8_t)kind,
                    .method = method, .meta_len = meta_len, .id = id,
                    .payload_len = payload_len};
  tsr_rpc__hdr_encode(buf, &h);
  if (meta_len) memcpy(buf + TSR_RPC_HEADER_SIZE, meta, meta_len);
  return TSR_RPC_HEADER_SIZE + meta_len;
}

/* Reads one answer frame; returns its kind, fills the error code for an
 * error frame, skips its payload. -1 on EOF or timeout. */
static inline int ru_read_answer(int fd, tsr_rpc__hdr *h, int *code, char *msg,
                          size_t msgcap) {
  uint8_t hb[TSR_RPC_HEADER_SIZE];
  if (ru_read_all(fd, hb, sizeof hb)) return -1;
  tsr_rpc__limits lim = {1u << 20, (uint64_t)1 << 34};
  char m[200];
  if (tsr_rpc__hdr_decode(hb, &lim, h, m, sizeof m)) return -1;
  uint8_t *meta = malloc(h->meta_len + 1);
  if (ru_read_all(fd, meta, h->meta_len)) {
    free(meta);
    return -1;
  }
  if (h->kind == TSR_RPC__ERR && code)
    tsr_rpc__err_decode(meta, h->meta_len, code, msg, msgcap);
  free(meta);
  uint8_t sink[4096];
  uint64_t left = h->payload_len;
  while (left) {
    size_t n = left < sizeof sink ? (size_t)left : sizeof sink;
    if (ru_read_all(fd, sink, n)) return -1;
    left -= n;
  }
  return h->kind;
}

#endif
