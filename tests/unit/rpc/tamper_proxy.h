/* A relay on the path between an RPC client and its server, for the frame
 * integrity tests: it holds no token, passes the handshake through, then
 * cuts each direction into frames (header, meta, payload, 16-byte tag) and
 * can change one frame of one direction: flip a byte, drop it, send it
 * twice, or swap it with the next. It serves one connection at a time on
 * its own thread (blocking sockets and poll) and tampers once; later
 * connections (the client reconnecting) pass untouched, unless `every`
 * asks it to change every frame that counts, on every connection. */
#ifndef TSR_TEST_TAMPER_PROXY_H
#define TSR_TEST_TAMPER_PROXY_H

#include "common/rpc/rpc_int.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

enum { TP_PASS, TP_FLIP, TP_DROP, TP_REPLAY, TP_SWAP };
enum { TP_C2S = 0, TP_S2C = 1 };

typedef struct tp_dir {
  uint8_t *buf;
  size_t len, cap;
  size_t hs_left;      /* handshake bytes still to pass through */
  uint64_t frames;     /* frames seen after the handshake */
  uint8_t *held;       /* swap: the frame held back */
  size_t held_len;
} tp_dir;

typedef struct tamper_proxy {
  int lfd, port, target_port;
  pthread_t th;
  atomic_int stop;
  /* what to do, to which frame of which direction, once */
  int mode, dir;
  uint64_t at;         /* frame index in that direction (0: first) */
  long flip_off;       /* TP_FLIP: byte of the frame; < 0 from its end
                          (-17: the last payload byte, before the tag) */
  size_t min_payload;  /* only frames with at least this much payload
                          count (0: every frame, pings included) */
  int plain;           /* frames without a tag */
  int every;           /* TP_FLIP every frame that counts, always */
  size_t tag;
  atomic_int done;     /* the tampering happened */
  atomic_int conns;    /* connections relayed */
} tamper_proxy;

static inline int tp_write_all(int fd, const uint8_t *p, size_t n) {
  while (n) {
    ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w <= 0) return -1;
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

/* Forwards whole frames from d->buf, tampering as asked. -1: write error. */
static inline int tp_forward(tamper_proxy *t, tp_dir *d, int which, int out) {
  size_t pos = 0;
  if (d->hs_left) {
    size_t n = d->len < d->hs_left ? d->len : d->hs_left;
    if (tp_write_all(out, d->buf, n)) return -1;
    d->hs_left -= n;
    pos = n;
  }
  while (!d->hs_left && d->len - pos >= TSR_RPC_HEADER_SIZE) {
    const uint8_t *h = d->buf + pos;
    uint32_t meta = tsr_rpc__get32(h + 12);
    uint64_t pay = tsr_rpc__get64(h + 24);
    size_t flen = TSR_RPC_HEADER_SIZE + meta + (size_t)pay + t->tag;
    if (d->len - pos < flen) break;
    uint8_t *f = d->buf + pos;
    pos += flen;
    int counts = pay >= t->min_payload;
    int hit = counts && which == t->dir && t->mode != TP_PASS &&
              (t->every || (!atomic_load(&t->done) && d->frames == t->at));
    if (counts) d->frames++;
    if (d->held) { /* swap: this frame first, then the one held back */
      int rc = tp_write_all(out, f, flen) ||
               tp_write_all(out, d->held, d->held_len);
      free(d->held);
      d->held = NULL;
      atomic_store(&t->done, 1);
      if (rc) return -1;
      continue;
    }
    if (!hit) {
      if (tp_write_all(out, f, flen)) return -1;
      continue;
    }
    switch (t->mode) {
      case TP_FLIP: {
        long off = t->flip_off >= 0 ? t->flip_off : (long)flen + t->flip_off;
        f[off] ^= 0x04;
        atomic_store(&t->done, 1);
        if (tp_write_all(out, f, flen)) return -1;
        break;
      }
      case TP_DROP: atomic_store(&t->done, 1); break;
      case TP_REPLAY:
        atomic_store(&t->done, 1);
        if (tp_write_all(out, f, flen) || tp_write_all(out, f, flen))
          return -1;
        break;
      case TP_SWAP:
        d->held = malloc(flen);
        memcpy(d->held, f, flen);
        d->held_len = flen;
        break;
    }
  }
  memmove(d->buf, d->buf + pos, d->len - pos);
  d->len -= pos;
  return 0;
}

static inline void tp_relay(tamper_proxy *t, int cfd) {
  int sfd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_port = htons((uint16_t)t->target_port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int one = 1;
  setsockopt(sfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  setsockopt(cfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (connect(sfd, (struct sockaddr *)&a, sizeof a)) {
    close(sfd);
    return;
  }
  atomic_fetch_add(&t->conns, 1);
  tp_dir d[2];
  memset(d, 0, sizeof d);
  d[TP_C2S].hs_left = TSR_RPC__HELLO_SIZE + TSR_RPC__PROOF_SIZE;
  d[TP_S2C].hs_left = TSR_RPC__HELLO_SIZE + TSR_RPC__VERDICT_SIZE;
  int fds[2] = {cfd, sfd};
  while (!atomic_load(&t->stop)) {
    struct pollfd p[2] = {{cfd, POLLIN, 0}, {sfd, POLLIN, 0}};
    if (poll(p, 2, 50) < 0) break;
    int gone = 0;
    for (int i = 0; i < 2 && !gone; i++) {
      if (!(p[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      tp_dir *dd = &d[i];
      if (dd->cap - dd->len < 65536) {
        dd->cap = dd->cap ? dd->cap * 2 : 1 << 20;
        dd->buf = realloc(dd->buf, dd->cap);
      }
      ssize_t r = recv(fds[i], dd->buf + dd->len, dd->cap - dd->len, 0);
      if (r <= 0) {
        gone = 1;
        break;
      }
      dd->len += (size_t)r;
      if (tp_forward(t, dd, i, fds[1 - i])) gone = 1;
    }
    if (gone) break;
  }
  for (int i = 0; i < 2; i++) {
    free(d[i].buf);
    free(d[i].held);
  }
  close(sfd);
}

static inline void *tp_main(void *arg) {
  tamper_proxy *t = arg;
  while (!atomic_load(&t->stop)) {
    struct pollfd p = {t->lfd, POLLIN, 0};
    if (poll(&p, 1, 50) <= 0) continue;
    int cfd = accept(t->lfd, NULL, NULL);
    if (cfd < 0) continue;
    tp_relay(t, cfd);
    close(cfd);
  }
  return NULL;
}

/* Starts a proxy to 127.0.0.1:target_port doing what t's fields say
 * (mode, dir, at, flip_off, min_payload, plain, every; the rest zero);
 * t->port is
 * where to connect. */
static inline int tp_start(tamper_proxy *t, int target_port) {
  t->target_port = target_port;
  t->tag = t->plain ? 0 : TSR_RPC__TAG_SIZE;
  t->lfd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t al = sizeof a;
  if (bind(t->lfd, (struct sockaddr *)&a, sizeof a) || listen(t->lfd, 8) ||
      getsockname(t->lfd, (struct sockaddr *)&a, &al))
    return -1;
  t->port = ntohs(a.sin_port);
  return pthread_create(&t->th, NULL, tp_main, t);
}

static inline void tp_stop(tamper_proxy *t) {
  atomic_store(&t->stop, 1);
  pthread_join(t->th, NULL);
  close(t->lfd);
}

#endif
