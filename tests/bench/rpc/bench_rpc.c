/* bench_rpc: Tessera RPC against raw TCP on loopback, in the same run (the
 * client stays on TCP; bench_ps compares the same-host Unix socket).
 *
 * Baseline: blocking sockets, a server thread that reads a 4-byte length
 * and the payload into one reused buffer and answers (an echo for round
 * trips, a 4-byte ack for bulk). Tessera: a server on its own loop thread
 * (echo method; a bulk method whose payload lands in a pooled buffer and
 * is answered with an empty response) and a client on the main loop.
 * Measured: 64 B round trips (median and p99 over 24000 each, one in
 * flight, raw and RPC alternating in blocks of 2000; all threads on one
 * CPU, then servers and clients on two), and bulk calls of 4 KiB, 1 MiB
 * and 16 MiB with 1 and 8 in flight (throughput on two CPUs, best of 5
 * runs each, raw and RPC alternating). Everything runs twice over: with
 * frame MACs (the default: every frame authenticated, Poly1305) and with
 * plain frames (both ends asked, as on a trusted network). Prints a table
 * and `RATIO <name> <value> goal <goal>` lines, higher better (latency as
 * raw/rpc); the plain figures carry a `_plain` suffix. */
#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"
#include "common/rpc/rpc.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#define TOKEN "bench-token"
enum { M_ECHO = 1, M_BULK = 2 };

static uint8_t *g_src; /* payload source, 16 MiB */
#define SRC_BYTES ((size_t)16 << 20)

/* Thread placement is the same for raw TCP and the RPC: where the
 * scheduler puts a woken thread otherwise decides a round trip more than
 * either does (a blocking read is woken onto its waker's CPU, an epoll
 * wait is not, and waking an idle CPU of this VM costs ~40 us). Round
 * trips run first with every thread on CPU 0, which shows what the
 * software costs, then with the servers on CPU 1 (as are the bulk runs:
 * each side its own CPU, as in a cluster). */
static int pin_thread(pthread_t t, int cpu) {
  if (sysconf(_SC_NPROCESSORS_ONLN) <= cpu) return -1;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(t, sizeof set, &set);
}
static void pin(int cpu) { pin_thread(pthread_self(), cpu); }

/* ---- raw TCP ------------------------------------------------------------ */

static int write_all(int fd, const void *p, size_t n) {
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

static int read_all(int fd, void *p, size_t n) {
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

typedef struct raw_srv {
  int lfd, port;
  pthread_t th;
} raw_srv;

/* Serves one connection: [u32 len][u8 echo][payload] -> echo: the same
 * frame back; else a 4-byte ack. */
static void *raw_serve(void *arg) {
  raw_srv *s = arg;
  pin(0);
  int fd = accept(s->lfd, NULL, NULL);
  if (fd < 0) return NULL;
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  uint8_t *buf = malloc(SRC_BYTES + 8);
  memset(buf, 0, SRC_BYTES + 8);
  for (;;) {
    uint8_t hdr[5];
    if (read_all(fd, hdr, 5)) break;
    uint32_t len;
    memcpy(&len, hdr, 4);
    if (len > SRC_BYTES || read_all(fd, buf, len)) break;
    if (hdr[4]) {
      struct iovec iov[2] = {{hdr, 5}, {buf, len}};
      if (writev(fd, iov, 2) != (ssize_t)(5 + len)) break;
    } else {
      if (write_all(fd, hdr, 4)) break;
    }
  }
  free(buf);
  close(fd);
  return NULL;
}

static int raw_start(raw_srv *s) {
  s->lfd = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(s->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = {.sin_family = AF_INET};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(s->lfd, (struct sockaddr *)&a, sizeof a) || listen(s->lfd, 4))
    return -1;
  socklen_t l = sizeof a;
  getsockname(s->lfd, (struct sockaddr *)&a, &l);
  s->port = ntohs(a.sin_port);
  return pthread_create(&s->th, NULL, raw_serve, s);
}

static int raw_connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (connect(fd, (struct sockaddr *)&a, sizeof a)) return -1;
  return fd;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

static void raw_rtt(int fd, int n, uint64_t *lat) {
  uint8_t msg[5 + 64], back[5 + 64];
  uint32_t len = 64;
  memcpy(msg, &len, 4);
  msg[4] = 1;
  memcpy(msg + 5, g_src, 64);
  for (int i = 0; i < n; i++) {
    uint64_t t0 = tsr_now_ns();
    write_all(fd, msg, sizeof msg);
    read_all(fd, back, sizeof back);
    lat[i] = tsr_now_ns() - t0;
  }
}

/* n messages of `size` bytes, `depth` in flight; returns bytes/s. */
static double raw_bulk(int fd, size_t size, int depth, int n) {
  uint8_t hdr[5];
  uint32_t len = (uint32_t)size;
  memcpy(hdr, &len, 4);
  hdr[4] = 0;
  uint64_t t0 = tsr_now_ns();
  int sent = 0, acked = 0;
  while (acked < n) {
    while (sent < n && sent - acked < depth) {
      struct iovec iov[2] = {{hdr, 5}, {g_src, size}};
      size_t want = 5 + size, done = 0;
      while (done < want) { /* writev may be partial */
        ssize_t w = writev(fd, iov, 2);
        if (w <= 0) return 0;
        done += (size_t)w;
        size_t k = (size_t)w;
        for (int i = 0; i < 2 && k; i++) {
          size_t t = k < iov[i].iov_len ? k : iov[i].iov_len;
          iov[i].iov_base = (uint8_t *)iov[i].iov_base + t;
          iov[i].iov_len -= t;
          k -= t;
        }
      }
      sent++;
    }
    uint8_t ack[4];
    if (read_all(fd, ack, 4)) return 0;
    acked++;
  }
  double s = (double)(tsr_now_ns() - t0) / 1e9;
  return (double)size * n / s;
}

/* ---- Tessera RPC ------------------------------------------------------- */

typedef struct rpc_srv {
  uv_loop_t loop;
  tsr_rpc_ctx *ctx;
  tsr_rpc_server *s;
  uv_async_t stop;
  pthread_t th;
  int port;
} rpc_srv;

static void h_echo(tsr_rpc_incoming *call, void *data) {
  uv_buf_t b = uv_buf_init(call->payload, (unsigned)call->payload_len);
  tsr_rpc_reply(call, NULL, 0, &b, call->payload_len ? 1 : 0, NULL, NULL);
}

static void h_bulk(tsr_rpc_incoming *call, void *data) {
  tsr_rpc_reply(call, NULL, 0, NULL, 0, NULL, NULL);
}

static void srv_closed(void *data) {
  rpc_srv *s = data;
  uv_close((uv_handle_t *)&s->stop, NULL);
}
static void srv_stop(uv_async_t *a) {
  rpc_srv *s = a->data;
  tsr_rpc_server_close(s->s, srv_closed, s);
}
static void *srv_main(void *arg) {
  rpc_srv *s = arg;
  pin(0);
  uv_run(&s->loop, UV_RUN_DEFAULT);
  return NULL;
}

static int rpc_start(rpc_srv *s, int plain) {
  uv_loop_init(&s->loop);
  /* two setups take turns: the one waiting must not be dropped as idle */
  /* TCP against TCP (the same-host socket is bench_ps's comparison) */
  tsr_rpc_opts o = {.name = "bench-server", .token = TOKEN,
                    .token_len = strlen(TOKEN), .plain_frames = plain,
                    .idle_timeout_ms = 3600000,
                    .transport = TSR_RPC_TRANSPORT_TCP};
  if (tsr_rpc_ctx_new(&s->ctx, &s->loop, &o) ||
      tsr_rpc_server_new(&s->s, s->ctx) ||
      tsr_rpc_server_register(s->s, M_ECHO, h_echo, s) ||
      tsr_rpc_server_register(s->s, M_BULK, h_bulk, s) ||
      tsr_rpc_server_listen(s->s, "127.0.0.1:0"))
    return -1;
  s->port = tsr_rpc_server_port(s->s);
  uv_async_init(&s->loop, &s->stop, srv_stop);
  s->stop.data = s;
  return pthread_create(&s->th, NULL, srv_main, s);
}

typedef struct cli {
  uv_loop_t loop;
  tsr_rpc_ctx *ctx;
  tsr_rpc_client *c;
  /* a run */
  uint32_t method;
  size_t size;
  int n, sent, done, depth, fails;
  uint64_t *lat;
  uint64_t t0;
} cli;

static void issue(cli *k);

static void on_done(const tsr_rpc_result *r, void *data) {
  cli *k = data;
  if (r->status) {
    if (!k->fails) fprintf(stderr, "call failed: %s\n", r->message);
    k->fails++;
  }
  if (k->lat) k->lat[k->done] = r->latency_ns;
  k->done++;
  while (k->sent < k->n && k->sent - k->done < k->depth) issue(k);
}

static void issue(cli *k) {
  uv_buf_t b = uv_buf_init((char *)g_src, (unsigned)k->size);
  tsr_rpc_request q = {.method = k->method, .payload = &b, .npayload = 1,
                       .deadline_ms = 60000};
  if (tsr_rpc_call(k->c, &q, on_done, k) == 0)
    k->sent++;
  else
    k->fails++, k->sent++, k->done++;
}

static void rpc_run(cli *k, uint32_t method, size_t size, int depth, int n,
                    uint64_t *lat) {
  k->method = method;
  k->size = size;
  k->depth = depth;
  k->n = n;
  k->sent = k->done = k->fails = 0;
  k->lat = lat;
  k->t0 = tsr_now_ns();
  while (k->sent < n && k->sent - k->done < depth) issue(k);
  while (k->done < n) uv_run(&k->loop, UV_RUN_ONCE);
}

static double rpc_bulk(cli *k, size_t size, int depth, int n) {
  rpc_run(k, M_BULK, size, depth, n, NULL);
  double s = (double)(tsr_now_ns() - k->t0) / 1e9;
  return k->fails ? 0 : (double)size * n / s;
}

static void wait_connected(cli *k) {
  uint64_t t0 = tsr_now_ms();
  while (!tsr_rpc_client_connected(k->c) && tsr_now_ms() - t0 < 5000)
    uv_run(&k->loop, UV_RUN_ONCE);
}

static void closed_flag(void *d) { *(int *)d = 1; }

/* 64 B round trips: raw and RPC alternate in blocks so both see the same
 * load from whatever else runs on the machine. */
static void rtt_pair(cli *k, int rfd, double *raw_med, double *raw_p99,
                     double *rpc_med, double *rpc_p99) {
  enum { BLOCK = 2000, NBLOCK = 12, NRTT = BLOCK * NBLOCK, WARM = 2000 };
  uint64_t *lr = malloc(NRTT * sizeof *lr), *lt = malloc(NRTT * sizeof *lt);
  raw_rtt(rfd, WARM, lr);
  rpc_run(k, M_ECHO, 64, 1, WARM, lt);
  for (int b = 0; b < NBLOCK; b++) {
    raw_rtt(rfd, BLOCK, lr + b * BLOCK);
    rpc_run(k, M_ECHO, 64, 1, BLOCK, lt + b * BLOCK);
  }
  qsort(lr, NRTT, sizeof *lr, cmp_u64);
  qsort(lt, NRTT, sizeof *lt, cmp_u64);
  *raw_med = lr[NRTT / 2] / 1e3;
  *raw_p99 = lr[NRTT * 99 / 100] / 1e3;
  *rpc_med = lt[NRTT / 2] / 1e3;
  *rpc_p99 = lt[NRTT * 99 / 100] / 1e3;
  free(lr);
  free(lt);
}

static int cli_start(cli *k, int port, int plain) {
  memset(k, 0, sizeof *k);
  uv_loop_init(&k->loop);
  /* TCP against TCP (the same-host socket is bench_ps's comparison) */
  tsr_rpc_opts o = {.name = "bench-client", .token = TOKEN,
                    .token_len = strlen(TOKEN), .plain_frames = plain,
                    .idle_timeout_ms = 3600000,
                    .transport = TSR_RPC_TRANSPORT_TCP};
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
  if (tsr_rpc_ctx_new(&k->ctx, &k->loop, &o) ||
      tsr_rpc_client_new(&k->c, k->ctx, addr))
    return -1;
  wait_connected(k);
  return 0;
}

static int cli_stop(cli *k) {
  int done = 0;
  tsr_rpc_client_close(k->c, closed_flag, &done);
  while (!done) uv_run(&k->loop, UV_RUN_ONCE);
  tsr_rpc_ctx_free(k->ctx);
  return uv_loop_close(&k->loop);
}

static int srv_stop_join(rpc_srv *s) {
  uv_async_send(&s->stop);
  pthread_join(s->th, NULL);
  tsr_rpc_ctx_free(s->ctx);
  return uv_loop_close(&s->loop);
}

/* Round trips and bulk of one RPC setup (MAC or plain) against raw TCP. */
typedef struct {
  double med, p99, x_med, x_p99;          /* RPC round trips */
  double r_med, r_p99, r_x_med, r_x_p99;  /* raw, measured beside them */
  double bulk[3][2];                      /* ratios */
} figures;

static const struct {
  const char *name;
  size_t size;
  int n;
} sizes[] = {{"4KiB", 4096, 16384}, {"1MiB", 1 << 20, 384},
             {"16MiB", 16 << 20, 24}};
static const int depths[] = {1, 8};

static void print_figures(const char *tag, const figures *f, int cross) {
  printf("%-28s %12s %12s %8s\n", tag, "raw TCP", "Tessera", "ratio");
  printf("%-28s %9.1f us %9.1f us %8.2f\n", "rtt 64 B median", f->r_med,
         f->med, f->r_med / f->med);
  printf("%-28s %9.1f us %9.1f us %8.2f\n", "rtt 64 B p99", f->r_p99, f->p99,
         f->r_p99 / f->p99);
  if (cross) {
    printf("%-28s %9.1f us %9.1f us %8.2f\n", "rtt median, 2 CPUs",
           f->r_x_med, f->x_med, f->r_x_med / f->x_med);
    printf("%-28s %9.1f us %9.1f us %8.2f\n", "rtt p99, 2 CPUs", f->r_x_p99,
           f->x_p99, f->r_x_p99 / f->x_p99);
  }
}

int main(void) {
  tsr_log_init("bench");
  signal(SIGPIPE, SIG_IGN);
  pin(0);
  g_src = malloc(SRC_BYTES);
  for (size_t i = 0; i < SRC_BYTES; i++) g_src[i] = (uint8_t)(i * 131);

  raw_srv rs;
  if (raw_start(&rs)) return 1;
  int rfd = raw_connect(rs.port);
  /* [0]: frames with their MAC (the default), [1]: plain frames */
  rpc_srv ss[2];
  cli k[2];
  figures fig[2];
  memset(ss, 0, sizeof ss);
  memset(fig, 0, sizeof fig);
  for (int m = 0; m < 2; m++)
    if (rpc_start(&ss[m], m) || cli_start(&k[m], ss[m].port, m)) return 1;

  for (int m = 0; m < 2; m++)
    rtt_pair(&k[m], rfd, &fig[m].r_med, &fig[m].r_p99, &fig[m].med,
             &fig[m].p99);
  /* the same round trips with the servers on another CPU; the bulk
   * figures too, each side with its own CPU as in a cluster */
  int cross = pin_thread(rs.th, 1) == 0 && pin_thread(ss[0].th, 1) == 0 &&
              pin_thread(ss[1].th, 1) == 0;
  if (cross)
    for (int m = 0; m < 2; m++)
      rtt_pair(&k[m], rfd, &fig[m].r_x_med, &fig[m].r_x_p99, &fig[m].x_med,
               &fig[m].x_p99);
  print_figures("round trips (frame MAC)", &fig[0], cross);
  print_figures("round trips (plain frames)", &fig[1], cross);
  printf("%-28s %12s %12s %12s %6s %6s\n", "bulk", "raw TCP", "MAC",
         "plain", "MAC", "plain");
  for (int si = 0; si < 3; si++)
    for (int di = 0; di < 2; di++) {
      size_t sz = sizes[si].size;
      int n = sizes[si].n, d = depths[di];
      raw_bulk(rfd, sz, d, n / 8 + 1); /* warm */
      rpc_bulk(&k[0], sz, d, n / 8 + 1);
      rpc_bulk(&k[1], sz, d, n / 8 + 1);
      double best_raw = 0, best[2] = {0, 0};
      for (int rep = 0; rep < 5; rep++) {
        double r = raw_bulk(rfd, sz, d, n);
        best_raw = r > best_raw ? r : best_raw;
        for (int m = 0; m < 2; m++) {
          double t = rpc_bulk(&k[m], sz, d, n);
          best[m] = t > best[m] ? t : best[m];
        }
      }
      for (int m = 0; m < 2; m++)
        fig[m].bulk[si][di] = best_raw > 0 ? best[m] / best_raw : 0;
      char label[40];
      snprintf(label, sizeof label, "bulk %s x%d", sizes[si].name, d);
      printf("%-28s %7.0f MB/s %7.0f MB/s %7.0f MB/s %6.2f %6.2f\n", label,
             best_raw / 1e6, best[0] / 1e6, best[1] / 1e6,
             fig[0].bulk[si][di], fig[1].bulk[si][di]);
    }
  for (int m = 0; m < 2; m++) {
    const char *sfx = m ? "_plain" : "";
    const figures *f = &fig[m];
    printf("RATIO rpc_rtt64_median%s %.3f goal 0.667\n", sfx, f->r_med / f->med);
    printf("RATIO rpc_rtt64_p99%s %.3f goal 0.667\n", sfx, f->r_p99 / f->p99);
    if (cross) {
      printf("RATIO rpc_rtt64_median_2cpu%s %.3f goal 0.667\n", sfx,
             f->r_x_med / f->x_med);
      printf("RATIO rpc_rtt64_p99_2cpu%s %.3f goal 0.667\n", sfx,
             f->r_x_p99 / f->x_p99);
    }
    /* with every frame authenticated the goal is 0.7 of raw TCP */
    for (int si = 0; si < 3; si++)
      for (int di = 0; di < 2; di++)
        printf("RATIO rpc_bulk_%s_x%d%s %.3f goal %s\n", sizes[si].name,
               depths[di], sfx, f->bulk[si][di], m ? "0.8" : "0.7");
  }

  int bad = 0;
  for (int m = 0; m < 2; m++) bad |= cli_stop(&k[m]) | srv_stop_join(&ss[m]);
  close(rfd);
  pthread_join(rs.th, NULL);
  close(rs.lfd);
  free(g_src);
  return bad ? 1 : 0;
}
