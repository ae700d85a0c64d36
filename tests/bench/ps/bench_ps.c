/* Parameter-server benchmark, each figure against a baseline measured in
 * the same run:
 *   1. optimizer apply throughput on a 256 MiB shard, 1 and 2 threads, as
 *      bytes moved per second (SGD: w, g read, w written = 12 B/element;
 *      Adam: w, g, m, v read, w, m, v written = 28 B/element) over memcpy
 *      bandwidth (bytes read + written) with the same threads;
 *   2. end-to-end pull and push of a 64 MiB variable through the PS service
 *      over loopback TCP (server on its own loop thread) over raw TCP
 *      moving the same bytes between two threads with blocking sockets
 *      (a raw round before every PS round, best of each); the same over
 *      the same-host Unix socket against raw Unix sockets.
 * Prints a table, then `RATIO <name> <value> goal <goal>` lines.
 * Best of several repetitions; no absolute time is judged.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/err.h"
#include "kernels/optim.h"
#include "ps/client/client.h"
#include "ps/ps.h"
#include "ps.pb-c.h"

/* ---- 1. apply vs memcpy ------------------------------------------------------*/

typedef struct {
  int kind; /* 0 memcpy, 1 sgd, 2 adam */
  tsr_optim_spec *o;
  float *w, *g, *m, *v;
  size_t n;
  int64_t step;
} part;

static void *run_part(void *arg) {
  part *p = arg;
  if (p->kind == 0) {
    memcpy(p->w, p->g, p->n * 4);
  } else {
    float *slots[2] = {p->m, p->v};
    kern_optim_apply(p->o, p->step, p->w, p->g, 1.0f, slots, p->n);
  }
  return NULL;
}

/* Seconds for one pass over n elements split across `threads`. */
static double pass(int kind, tsr_optim_spec *o, float *w, float *g, float *m,
                   float *v, size_t n, int threads, int64_t step) {
  pthread_t th[2];
  part parts[2];
  size_t half = n / (size_t)threads;
  double t0 = tsr_now_s();
  for (int k = 0; k < threads; k++) {
    size_t off = half * (size_t)k, len = k == threads - 1 ? n - off : half;
    parts[k] = (part){kind, o, w + off, g + off, m ? m + off : NULL,
                      v ? v + off : NULL, len, step};
    if (threads == 1)
      run_part(&parts[k]);
    else
      pthread_create(&th[k], NULL, run_part, &parts[k]);
  }
  if (threads > 1)
    for (int k = 0; k < threads; k++) pthread_join(th[k], NULL);
  return tsr_now_s() - t0;
}

static double best(int kind, tsr_optim_spec *o, float *w, float *g, float *m,
                   float *v, size_t n, int threads) {
  double b = 1e30;
  for (int r = 0; r < 4; r++) {
    double t = pass(kind, o, w, g, m, v, n, threads, r + 1);
    if (t < b) b = t;
  }
  return b;
}

/* ---- 2. raw TCP baseline ------------------------------------------------------*/

typedef struct {
  int lfd;
  size_t bytes;
  char *buf;
  int rounds;
  int connected;             /* lfd is the connected end already */
} tcp_srv;

static void *tcp_server(void *arg) {
  tcp_srv *s = arg;
  int fd = s->connected ? s->lfd : accept(s->lfd, NULL, NULL);
  for (int r = 0; r < s->rounds; r++) {
    size_t got = 0;
    while (got < s->bytes) {
      ssize_t k = read(fd, s->buf + got, s->bytes - got);
      if (k <= 0) goto out;
      got += (size_t)k;
    }
    char ack = 1;
    if (write(fd, &ack, 1) != 1) break;
  }
out:
  close(fd);
  return NULL;
}

/* Best seconds to move `bytes` one way (and get a 1-byte answer), over
 * loopback TCP, or over a Unix socket (unix != 0). */
static double raw_stream(size_t bytes, int rounds, int unix_sock) {
  int lfd, fd;
  if (unix_sock) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv)) abort();
    lfd = sv[1];
    fd = sv[0];
  } else {
    lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    bind(lfd, (struct sockaddr *)&a, sizeof a);
    getsockname(lfd, (struct sockaddr *)&a, &len);
    listen(lfd, 1);
    fd = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(fd, (struct sockaddr *)&a, sizeof a)) abort();
  }
  tcp_srv s = {lfd, bytes, malloc(bytes), rounds, unix_sock};
  memset(s.buf, 1, bytes);
  pthread_t th;
  pthread_create(&th, NULL, tcp_server, &s);
  char *src = malloc(bytes);
  memset(src, 2, bytes);
  double b = 1e30;
  for (int r = 0; r < rounds; r++) {
    double t0 = tsr_now_s();
    size_t sent = 0;
    while (sent < bytes) {
      ssize_t k = write(fd, src + sent, bytes - sent);
      if (k <= 0) abort();
      sent += (size_t)k;
    }
    char ack;
    if (read(fd, &ack, 1) != 1) abort();
    double t = tsr_now_s() - t0;
    if (t < b) b = t;
  }
  close(fd);
  pthread_join(th, NULL);
  if (!unix_sock) close(lfd);
  free(src);
  free(s.buf);
  return b;
}

/* ---- 2. the PS service ----------------------------------------------------------*/

typedef struct {
  uv_loop_t loop;
  tsr_rpc_ctx *ctx;
  ps_server *srv;
  int port;
  uv_async_t stop;
  volatile int ready;
} srv_thread;

static const char *TOKEN = "bench-token";

static void srv_closed(void *data) {
  srv_thread *t = data;
  uv_close((uv_handle_t *)&t->stop, NULL);
}

static void srv_stop(uv_async_t *a) {
  srv_thread *t = a->data;
  ps_server_close(t->srv, srv_closed, t);
}

static void *srv_main(void *arg) {
  srv_thread *t = arg;
  uv_loop_init(&t->loop);
  tsr_rpc_opts ro = {0};
  ro.name = "bench-ps";
  ro.token = TOKEN;
  ro.token_len = strlen(TOKEN);
  ro.max_payload_bytes = 1ull << 30;
  ro.max_write_queue = 512ull << 20;
  if (tsr_rpc_ctx_new(&t->ctx, &t->loop, &ro)) abort();
  if (ps_server_new(&t->srv, t->ctx, NULL)) abort();
  if (ps_server_listen(t->srv, "127.0.0.1:0")) abort();
  t->port = ps_server_port(t->srv);
  uv_async_init(&t->loop, &t->stop, srv_stop);
  t->stop.data = t;
  t->ready = 1;
  uv_run(&t->loop, UV_RUN_DEFAULT);
  tsr_rpc_ctx_free(t->ctx);
  uv_loop_close(&t->loop);
  return NULL;
}

typedef struct {
  int done, status;
  double apply_ms;
} cres;

static void ccb(const ps_result *r, void *data) {
  cres *c = data;
  c->done = 1;
  c->status = r->status;
  if (r->stats) {
    const Tessera__Ps__StatsResponse *s = r->stats;
    c->apply_ms = s->applies ? (double)s->apply_ns / 1e6 / (double)s->applies : 0;
  }
}

static void cwait(uv_loop_t *l, cres *c) {
  uint64_t end = tsr_now_ms() + 60000;
  while (!c->done && tsr_now_ms() < end) uv_run(l, UV_RUN_ONCE);
  if (!c->done || c->status) {
    fprintf(stderr, "bench call failed: %s\n", tsr_strerror(c->status));
    exit(1);
  }
}

static void client_closed(void *data) { *(int *)data = 1; }

/* Best pull and push seconds of a 64 MiB variable through the PS service,
 * the client on `transport` (the server offers both), and the mean apply
 * time the PS reports. */
typedef struct {
  double pull, push, apply_ms;
  double raw;                /* raw sockets of the same kind, one round
                                before every pull and push round (a load
                                that comes and goes hits both sides) */
  int local;                 /* the client used the same-host socket */
} ps_fig;

static ps_fig ps_figures(int transport, float *g, size_t bytes, int rounds) {
  size_t elems = bytes / 4;
  ps_fig f = {1e30, 1e30, 0, 1e30, 0};
  int unix_sock = transport != TSR_RPC_TRANSPORT_TCP;
  srv_thread st;
  memset(&st, 0, sizeof st);
  pthread_t sth;
  pthread_create(&sth, NULL, srv_main, &st);
  while (!st.ready) tsr_sleep_ms(1);
  uv_loop_t loop;
  uv_loop_init(&loop);
  tsr_rpc_ctx *ctx;
  tsr_rpc_opts ro = {0};
  ro.name = "bench-worker";
  ro.token = TOKEN;
  ro.token_len = strlen(TOKEN);
  ro.max_payload_bytes = 1ull << 30;
  ro.transport = transport;
  if (tsr_rpc_ctx_new(&ctx, &loop, &ro)) abort();
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", st.port);
  ps_client *c;
  if (ps_client_new(&c, ctx, addr)) abort();
  ps_client_set_deadline(c, 60000);
  tsr_optim_spec o;
  tsr_optim_defaults(TSR_OPT_SGD, &o);
  ps_var_spec spec;
  int64_t shape[2] = {(int64_t)elems / 1024, 1024};
  ps_var_spec_init(&spec, "bench/w", 2, shape, 0, 1, "zeros", 1, &o);
  cres r = {0};
  if (ps_client_create(c, &spec, 1, ccb, &r)) abort();
  cwait(&loop, &r);
  float *dst = malloc(bytes);
  memset(dst, 0, bytes); /* touched once, as the worker's buffers are */
  for (int k = 0; k < rounds; k++) {
    double tr = raw_stream(bytes, 1, unix_sock);
    if (tr < f.raw) f.raw = tr;
    r = (cres){0};
    double t0 = tsr_now_s();
    if (ps_client_pull(c, "bench/w", 0, 0, 0, dst, elems, ccb, &r)) abort();
    cwait(&loop, &r);
    double t = tsr_now_s() - t0;
    if (t < f.pull) f.pull = t;
  }
  for (int k = 0; k < rounds; k++) {
    double tr = raw_stream(bytes, 1, unix_sock);
    if (tr < f.raw) f.raw = tr;
    r = (cres){0};
    double t0 = tsr_now_s();
    if (ps_client_push(c, "bench/w", 0, 0, k, PS_DT_F32, g, bytes, ccb, &r))
      abort();
    cwait(&loop, &r);
    double t = tsr_now_s() - t0;
    if (t < f.push) f.push = t;
  }
  r = (cres){0};
  if (ps_client_stats(c, ccb, &r)) abort();
  cwait(&loop, &r);
  f.apply_ms = r.apply_ms;
  tsr_rpc_stats rs;
  tsr_rpc_client_stats(ps_client_rpc(c), &rs);
  f.local = rs.connects_local > 0;
  int closed = 0;
  ps_client_close(c, client_closed, &closed);
  while (!closed) uv_run(&loop, UV_RUN_ONCE);
  tsr_rpc_ctx_free(ctx);
  uv_run(&loop, UV_RUN_DEFAULT);
  uv_loop_close(&loop);
  uv_async_send(&st.stop);
  pthread_join(sth, NULL);
  free(dst);
  return f;
}

int main(void) {
  /* ---- 1 ---- */
  size_t n = (256u << 20) / 4;
  float *w = malloc(n * 4), *g = malloc(n * 4), *m = malloc(n * 4),
        *v = malloc(n * 4);
  if (!w || !g || !m || !v) {
    fprintf(stderr, "bench: cannot allocate 1 GiB\n");
    return 1;
  }
  for (size_t i = 0; i < n; i++) {
    w[i] = 0.5f;
    g[i] = 1e-3f * (float)(i & 1023);
    m[i] = 0;
    v[i] = 0;
  }
  tsr_optim_spec sgd, adam;
  tsr_optim_defaults(TSR_OPT_SGD, &sgd);
  tsr_optim_defaults(TSR_OPT_ADAM, &adam);
  printf("%-28s %10s %12s %12s\n", "apply on a 256 MiB shard", "threads",
         "GB/s moved", "memcpy GB/s");
  char lines[8][96];
  int nl = 0;
  for (int threads = 1; threads <= 2; threads++) {
    double tc = best(0, NULL, m, g, NULL, NULL, n, threads);
    double mc = 2.0 * (double)n * 4 / tc;
    double ts = best(1, &sgd, w, g, NULL, NULL, n, threads);
    double sg = 3.0 * (double)n * 4 / ts;
    for (size_t i = 0; i < n; i++) m[i] = 0; /* Adam's slots back to zero */
    double ta = best(2, &adam, w, g, m, v, n, threads);
    double ad = 7.0 * (double)n * 4 / ta;
    printf("%-28s %10d %12.2f %12.2f\n", "sgd", threads, sg / 1e9, mc / 1e9);
    printf("%-28s %10d %12.2f %12.2f\n", "adam", threads, ad / 1e9, mc / 1e9);
    snprintf(lines[nl++], sizeof lines[0], "RATIO ps_apply_sgd_%dt %.3f goal 0.6",
             threads, sg / mc);
    snprintf(lines[nl++], sizeof lines[0], "RATIO ps_apply_adam_%dt %.3f goal 0.6",
             threads, ad / mc);
  }
  free(m);
  free(v);
  free(w);

  /* ---- 2 ---- */
  size_t bytes = 64u << 20, elems = bytes / 4;
  int rounds = 5;
  for (size_t i = 0; i < elems; i++) g[i] = 1e-6f;
  ps_fig ft = ps_figures(TSR_RPC_TRANSPORT_TCP, g, bytes, rounds);
  ps_fig fu = ps_figures(TSR_RPC_TRANSPORT_AUTO, g, bytes, rounds);
  double t_tcp = ft.raw, t_unix = fu.raw;
  free(g);
  printf("\n%-34s %12s %12s\n", "64 MiB on this host, GB/s", "TCP",
         "Unix socket");
  printf("%-34s %12.2f %12.2f\n", "raw (one way)", (double)bytes / t_tcp / 1e9,
         (double)bytes / t_unix / 1e9);
  printf("%-34s %12.2f %12.2f\n", "ps pull", (double)bytes / ft.pull / 1e9,
         (double)bytes / fu.pull / 1e9);
  printf("%-34s %12.2f %12.2f\n", "ps push (incl. SGD apply)",
         (double)bytes / ft.push / 1e9, (double)bytes / fu.push / 1e9);
  printf("%-34s %12.2f %12.2f\n", "  of which apply, ms", ft.apply_ms,
         fu.apply_ms);
  printf("%-34s %12.2f %12.2f\n", "  push, ms", ft.push * 1e3,
         fu.push * 1e3);
  if (!fu.local)
    printf("(the Unix column went over TCP: TESSERA_RPC_TRANSPORT=tcp?)\n");
  printf("\n");
  for (int i = 0; i < nl; i++) printf("%s\n", lines[i]);
  printf("RATIO ps_pull_64MiB %.3f goal 0.7\n", t_tcp / ft.pull);
  printf("RATIO ps_push_64MiB %.3f goal 0.8\n", t_tcp / ft.push);
  printf("RATIO ps_pull_64MiB_unix %.3f goal 0.7\n", t_unix / fu.pull);
  printf("RATIO ps_push_64MiB_unix %.3f goal 0.8\n", t_unix / fu.push);
  return 0;
}
