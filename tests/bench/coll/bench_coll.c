/* bench_coll: ring all-reduce (common/coll) against raw TCP between the
 * same processes, in the same run.
 *
 * For N = 2 and 3 the bench forks N rank processes on 127.0.0.1. Each
 * opens a raw TCP ring (a blocking socket to its right neighbour, one
 * from its left) beside its RPC server and collective. Baseline: the
 * ring's link bandwidth with every link busy at once, as an all-reduce
 * keeps them: every rank writes B bytes to its right (a writer thread,
 * 1 MiB writes) while it reads B bytes from its left; link bandwidth =
 * B / time of the slowest rank. Ours: an all-reduce of S bytes of
 * float32; bus bandwidth = S / time * 2(N-1)/N (the bytes each link
 * carries; NCCL's busbw), time of the slowest rank. Each starts after a
 * ring barrier. The RPC takes the same path every call takes (the
 * same-host Unix socket, no frame MAC there: rpc.h); a second table runs
 * it over TCP with frame MACs (TESSERA_RPC_TRANSPORT=tcp), the way ranks
 * on two hosts talk.
 *
 * Paired rounds. On a shared machine the bandwidth either side gets
 * moves by 2x within seconds, so the two are never measured apart: each
 * round runs the baseline and the all-reduce back to back (which goes
 * first alternates from round to round, so neither always finds the
 * caches and the scheduler in the state the other left) and gives one
 * ratio, busbw / raw. RATIO is the median of the rounds' ratios; the line
 * before it has their minimum and maximum, how much the machine moved.
 * The table's GB/s columns are the medians of each side's rounds.
 *
 * CPU columns: the CPU time of every rank process together (all its
 * threads) over one side of a round, in ms per GiB the ranks sent (raw:
 * N B; the ring: 2(N-1) S), median of the rounds. A loaded machine moves
 * it far less than wall time, so it says what the ring costs per byte
 * against raw TCP, and what a segment size costs, when the GB/s cannot.
 *
 * Also printed: all-reduce bus bandwidth by size from 64 KiB to 64 MiB on
 * 2 ranks, the curve that sets the gradient bucket size (the smallest
 * size whose bus bandwidth is near the large-size figure), and the
 * segment size's effect at 64 MiB (median of rounds).
 *
 * Lines `RATIO allreduce_busbw_<S>_vs_tcp[_<N>w] value goal 0.8`; the
 * unsuffixed ones are the smaller of the 2- and 3-rank figures. */
#include "common/clock.h"
#include "common/coll/coll.h"
#include "common/err.h"
#include "common/log.h"
#include "common/rpc/rpc.h"
#include "tests/unit/coll/coll_util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define TOKEN "bench-coll-token"
#define MAXN 3
/* paired rounds per size (odd: the median is one round's ratio); fewer
 * over TCP with frame MACs, whose rounds take twice as long */
#define ROUNDS_4MIB 31
#define ROUNDS_64MIB 15
#define ROUNDS_4MIB_MAC 15
#define ROUNDS_64MIB_MAC 9
#define MAXROUNDS 31
/* the warm-up's size, at most */
#define WARMUP_MAX ((size_t)16 << 20)
/* the bucket-size curve and the segment table */
#define CURVE_ROUNDS 5
#define SEG_ROUNDS 3
#define WRITE_CHUNK ((size_t)1 << 20)
/* per round: [raw s, ring s, raw CPU s, ring CPU s] */
#define CELL 4

/* ---- one rank ------------------------------------------------------------ */

typedef struct {
  uv_loop_t loop;
  tsr_rpc_ctx *ctx;
  tsr_rpc_server *srv;
  tsr_coll *coll;
  int rank, n;
  int raw_l;            /* raw listener */
  int to_right, from_left;
  uint8_t *src, *sink;  /* raw buffers */
} rank_t;

typedef struct {
  int fd;
  const uint8_t *p;
  size_t n;
} wr_arg;

static void *writer(void *a) {
  wr_arg *w = a;
  for (size_t off = 0; off < w->n; off += WRITE_CHUNK) {
    size_t k = w->n - off < WRITE_CHUNK ? w->n - off : WRITE_CHUNK;
    if (cu_write_all(w->fd, w->p + off, k)) break;
  }
  return NULL;
}

/* A token around the raw ring: every rank has reached this point. */
static void raw_barrier(rank_t *r) {
  uint8_t t = 1;
  for (int i = 0; i < 2; i++) {
    cu_write_all(r->to_right, &t, 1);
    cu_read_all(r->from_left, &t, 1);
  }
}

/* raw_barrier, with the loop running while it waits (answers still
 * queued there go out). */
static int raw_barrier_live(rank_t *r) {
  uint8_t t = 1;
  for (int i = 0; i < 2; i++) {
    if (cu_write_all(r->to_right, &t, 1)) return -1;
    for (;;) {
      struct pollfd pf = {.fd = r->from_left, .events = POLLIN};
      int k = poll(&pf, 1, 1);
      if (k < 0 && errno != EINTR) return -1;
      if (k > 0) break;
      uv_run(&r->loop, UV_RUN_NOWAIT);
    }
    if (cu_read_all(r->from_left, &t, 1)) return -1;
  }
  return 0;
}

/* B bytes to the right while B bytes arrive from the left; seconds. */
/* CPU seconds of this process, every thread (the raw writer's too). */
static double cpu_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static double raw_shift(rank_t *r, size_t bytes) {
  raw_barrier(r);
  uint64_t t0 = tsr_now_ns();
  wr_arg w = {r->to_right, r->src, bytes};
  pthread_t th;
  pthread_create(&th, NULL, writer, &w);
  for (size_t off = 0; off < bytes; off += WRITE_CHUNK) {
    size_t k = bytes - off < WRITE_CHUNK ? bytes - off : WRITE_CHUNK;
    if (cu_read_all(r->from_left, r->sink, k)) break;
  }
  pthread_join(th, NULL);
  return (double)(tsr_now_ns() - t0) / 1e9;
}

static void on_done(int status, const char *msg, void *data) {
  int *d = data;
  *d = status ? status : 1;
  if (status) fprintf(stderr, "bench_coll: %s\n", msg);
}

static int run_op(rank_t *r, int (*post)(rank_t *, int *), int *flag) {
  *flag = 0;
  if (post(r, flag)) return -1;
  while (!*flag) uv_run(&r->loop, UV_RUN_ONCE);
  return *flag == 1 ? 0 : -1;
}

static float *g_buf;
static size_t g_count;

static int post_barrier(rank_t *r, int *flag) {
  return tsr_coll_barrier(r->coll, on_done, flag);
}
static int post_allreduce(rank_t *r, int *flag) {
  return tsr_coll_allreduce(r->coll, g_buf, g_count, on_done, flag);
}

/* One all-reduce of `bytes`; seconds. */
static double coll_time(rank_t *r, size_t bytes) {
  int flag;
  if (run_op(r, post_barrier, &flag)) return -1;
  g_count = bytes / sizeof(float);
  uint64_t t0 = tsr_now_ns();
  if (run_op(r, post_allreduce, &flag)) return -1;
  return (double)(tsr_now_ns() - t0) / 1e9;
}

static int listen_raw(int *port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(fd, (struct sockaddr *)&a, sizeof a) || listen(fd, 4)) return -1;
  socklen_t l = sizeof a;
  getsockname(fd, (struct sockaddr *)&a, &l);
  *port = ntohs(a.sin_port);
  return fd;
}

static int connect_raw(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, (struct sockaddr *)&a, sizeof a)) return -1;
  return fd;
}

/* What a rank is asked to measure. */
typedef struct {
  int n;
  uint32_t segment_bytes;
  int nsizes;
  size_t sizes[8];
  bool raw;            /* the baseline too, paired with each round */
  int rounds[8];       /* per size */
} plan_t;

/* Cells (rounds over every size) of a plan. */
static size_t plan_cells(const plan_t *p) {
  size_t k = 0;
  for (int s = 0; s < p->nsizes; s++) k += (size_t)p->rounds[s];
  return k;
}

typedef struct {
  char addr[64];
  int raw_port;
} hello_t;

/* Runs in the child: returns per round [raw, coll] seconds and the CPU
 * seconds of each. */
static int rank_main(int rank, const plan_t *p, int up, int down) {
  alarm(600);
  signal(SIGPIPE, SIG_IGN);
  rank_t r;
  memset(&r, 0, sizeof r);
  r.rank = rank;
  r.n = p->n;
  uv_loop_init(&r.loop);
  char name[32];
  snprintf(name, sizeof name, "worker:%d", rank);
  tsr_rpc_opts ro;
  memset(&ro, 0, sizeof ro);
  ro.name = name;
  ro.token = TOKEN;
  ro.token_len = strlen(TOKEN);
  tsr_coll_opts co;
  memset(&co, 0, sizeof co);
  co.segment_bytes = p->segment_bytes;
  hello_t h;
  memset(&h, 0, sizeof h);
  if (tsr_rpc_ctx_new(&r.ctx, &r.loop, &ro) ||
      tsr_rpc_server_new(&r.srv, r.ctx) ||
      tsr_coll_new(&r.coll, r.ctx, r.srv, &co) ||
      tsr_rpc_server_listen(r.srv, "127.0.0.1:0"))
    return 2;
  snprintf(h.addr, sizeof h.addr, "127.0.0.1:%d", tsr_rpc_server_port(r.srv));
  if ((r.raw_l = listen_raw(&h.raw_port)) < 0) return 3;
  if (cu_write_all(up, &h, sizeof h)) return 4;
  hello_t all[MAXN];
  if (cu_read_all(down, all, sizeof(hello_t) * (size_t)p->n)) return 5;
  /* raw ring: connect right, accept left */
  if ((r.to_right = connect_raw(all[(rank + 1) % p->n].raw_port)) < 0)
    return 6;
  if ((r.from_left = accept(r.raw_l, NULL, NULL)) < 0) return 7;
  const char *addrs[MAXN];
  for (int i = 0; i < p->n; i++) addrs[i] = all[i].addr;
  tsr_coll_group g = {1, rank, p->n, addrs, NULL, 0};
  int flag = 0;
  if (tsr_coll_configure(r.coll, &g, on_done, &flag)) return 8;
  while (!flag) uv_run(&r.loop, UV_RUN_ONCE);
  if (flag != 1) return 9;
  size_t maxb = 0;
  for (int i = 0; i < p->nsizes; i++)
    if (p->sizes[i] > maxb) maxb = p->sizes[i];
  g_buf = malloc(maxb);
  r.src = malloc(maxb);
  r.sink = malloc(WRITE_CHUNK);
  memset(g_buf, 0, maxb);
  memset(r.src, 1, maxb);
  memset(r.sink, 0, WRITE_CHUNK);
  /* warm-up: connections, pools, socket buffers (the pages are touched
   * above) */
  size_t warm = maxb < WARMUP_MAX ? maxb : WARMUP_MAX;
  if (coll_time(&r, warm) < 0) return 10;
  if (p->raw) raw_shift(&r, warm);
  double *t = calloc(plan_cells(p) * CELL, sizeof(double));
  int k0 = 0;
  for (int s = 0; s < p->nsizes; s++) {
    for (int k = 0; k < p->rounds[s]; k++) {
      double *cell = t + ((size_t)(k0 + k)) * CELL, c0;
      /* the pair back to back, the first of them alternating */
      bool raw_first = p->raw && k % 2 == 0;
      if (raw_first) {
        c0 = cpu_now();
        cell[0] = raw_shift(&r, p->sizes[s]);
        cell[2] = cpu_now() - c0;
      }
      c0 = cpu_now();
      if ((cell[1] = coll_time(&r, p->sizes[s])) < 0) return 11;
      cell[3] = cpu_now() - c0;
      if (p->raw && !raw_first) {
        c0 = cpu_now();
        cell[0] = raw_shift(&r, p->sizes[s]);
        cell[2] = cpu_now() - c0;
      }
    }
    k0 += p->rounds[s];
  }
  /* No rank leaves while another may still wait for its answers: the
   * last all-reduce completes on a rank once its own sends are answered,
   * but a neighbour's answer may still be on its way out when the rank
   * that sent it leaves, and the kernel then drops it. A last barrier
   * completes on every rank only once each has answered its left
   * neighbour's messages, and the raw barrier keeps every process (its
   * loop running) until every rank has seen that. */
  int last;
  if (run_op(&r, post_barrier, &last) || raw_barrier_live(&r)) return 12;
  if (cu_write_all(up, t, sizeof(double) * plan_cells(p) * CELL))
    return 13;
  /* the process ends here: the kernel closes what is open */
  return 0;
}

/* Forks p->n ranks, returns per round (the rounds of size 0, then of size
 * 1, ...) in t: the slowest rank's [raw, coll] seconds, then the CPU
 * seconds of every rank together on each side. */
static int run_plan(const plan_t *p, double *t) {
  pid_t pid[MAXN];
  int up[MAXN], down[MAXN];
  for (int i = 0; i < p->n; i++) {
    int a[2], b[2];
    if (pipe(a) || pipe(b)) return -1;
    fflush(stdout);
    if ((pid[i] = fork()) == 0) {
      close(a[0]);
      close(b[1]);
      _exit(rank_main(i, p, a[1], b[0]));
    }
    close(a[1]);
    close(b[0]);
    up[i] = a[0];
    down[i] = b[1];
  }
  hello_t all[MAXN];
  int rc = 0;
  for (int i = 0; i < p->n; i++)
    if (cu_read_all(up[i], &all[i], sizeof all[i])) rc = -1;
  for (int i = 0; i < p->n && !rc; i++)
    if (cu_write_all(down[i], all, sizeof(hello_t) * (size_t)p->n)) rc = -1;
  size_t cells = plan_cells(p) * CELL;
  double *one = calloc(cells, sizeof(double));
  memset(t, 0, cells * sizeof(double));
  for (int i = 0; i < p->n; i++) {
    if (!rc && cu_read_all(up[i], one, cells * sizeof(double))) rc = -1;
    for (size_t c = 0; !rc && c < cells; c++) {
      if (c % CELL >= 2)
        t[c] += one[c];
      else if (one[c] > t[c])
        t[c] = one[c];
    }
  }
  free(one);
  for (int i = 0; i < p->n; i++) {
    int st;
    if (rc) kill(pid[i], SIGKILL);
    waitpid(pid[i], &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st)) {
      fprintf(stderr, "bench_coll: rank %d exited %d\n", i,
              WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st));
      rc = -1;
    }
    close(up[i]);
    close(down[i]);
  }
  return rc;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* What the rounds of one size say. */
typedef struct {
  int rounds;
  double raw, bus, alg;          /* GB/s, medians of the rounds */
  double raw_cpu, ring_cpu;      /* CPU ms per GiB the ranks sent */
  double ratio, rmin, rmax;      /* busbw / raw: median, min, max */
} stat_t;

/* The rounds t[0..rounds) (cells of CELL) of an all-reduce of `bytes`
 * on n ranks. */
static stat_t summarize(const double *t, int rounds, size_t bytes, int n) {
  double raw[MAXROUNDS], coll[MAXROUNDS], ratio[MAXROUNDS];
  double rcpu[MAXROUNDS], ccpu[MAXROUNDS];
  double f = 2.0 * (n - 1) / n, gib = (double)(1u << 30);
  stat_t st = {.rounds = rounds};
  for (int k = 0; k < rounds; k++) {
    const double *c = t + (size_t)k * CELL;
    raw[k] = c[0] > 0 ? (double)bytes / c[0] / 1e9 : 0;
    coll[k] = (double)bytes / c[1] / 1e9;
    ratio[k] = raw[k] > 0 ? coll[k] * f / raw[k] : 0;
    /* bytes sent: raw, every rank B; the ring, every rank 2(N-1)/N S */
    rcpu[k] = c[2] * 1e3 / ((double)bytes * n / gib);
    ccpu[k] = c[3] * 1e3 / ((double)bytes * f * n / gib);
  }
  st.raw = median(raw, rounds);
  st.alg = median(coll, rounds);
  st.raw_cpu = median(rcpu, rounds);
  st.ring_cpu = median(ccpu, rounds);
  st.bus = st.alg * f;
  st.ratio = median(ratio, rounds); /* sorted now */
  st.rmin = ratio[0];
  st.rmax = ratio[rounds - 1];
  return st;
}

static void print_ratio(const char *name, const stat_t *st) {
  printf("%s: %d paired rounds, per-round ratio min %.2f max %.2f\n", name,
         st->rounds, st->rmin, st->rmax);
  printf("RATIO %s %.2f goal 0.8\n", name, st->ratio);
}

static const char *mib(size_t b, char *buf, size_t len) {
  if (b >= ((size_t)1 << 20))
    snprintf(buf, len, "%zuMiB", b >> 20);
  else
    snprintf(buf, len, "%zuKiB", b >> 10);
  return buf;
}

static double since(uint64_t t0) {
  return (double)(tsr_now_ns() - t0) / 1e9;
}

int main(int argc, char **argv) {
  (void)argc;
  (void)argv;
  signal(SIGPIPE, SIG_IGN);
  tsr_log_set_level(TSR_LOG_WARN);
  const char *tr = getenv("TESSERA_RPC_TRANSPORT");
  uint64_t t_start = tsr_now_ns();
  printf("bench_coll: ring all-reduce vs raw TCP ring, %ld CPUs, transport "
         "%s; paired rounds, medians\n", sysconf(_SC_NPROCESSORS_ONLN),
         tr && *tr ? tr : "auto");
  stat_t worst[2];
  bool have[2] = {false, false};
  for (int pass = 0; pass < 2; pass++) {
    if (pass == 1) setenv("TESSERA_RPC_TRANSPORT", "tcp", 1);
    printf("\n%s (at %.1f s)\n", pass ? "RPC over TCP with frame MACs "
           "(ranks on two hosts)" : "RPC as on one host (same-host socket)",
           since(t_start));
    printf("%-6s %-7s %12s %12s %12s %7s %9s %9s\n", "ranks", "size",
           "raw GB/s", "busbw GB/s", "algbw GB/s", "ratio", "raw CPU",
           "ring CPU");
    for (int n = 2; n <= 3; n++) {
      plan_t p;
      memset(&p, 0, sizeof p);
      p.n = n;
      p.nsizes = 2;
      p.sizes[0] = (size_t)4 << 20;
      p.sizes[1] = (size_t)64 << 20;
      p.rounds[0] = pass ? ROUNDS_4MIB_MAC : ROUNDS_4MIB;
      p.rounds[1] = pass ? ROUNDS_64MIB_MAC : ROUNDS_64MIB;
      p.raw = true;
      double t[(ROUNDS_4MIB + ROUNDS_64MIB) * CELL];
      if (run_plan(&p, t)) return 1;
      int k0 = 0;
      for (int s = 0; s < 2; s++) {
        stat_t st = summarize(t + CELL * k0, p.rounds[s], p.sizes[s], n);
        k0 += p.rounds[s];
        char b[16], name[96];
        printf("%-6d %-7s %12.3f %12.3f %12.3f %7.2f %9.0f %9.0f\n", n,
               mib(p.sizes[s], b, sizeof b), st.raw, st.bus, st.alg,
               st.ratio, st.raw_cpu, st.ring_cpu);
        snprintf(name, sizeof name, "allreduce_busbw_%s_vs_tcp_%dw%s", b, n,
                 pass ? "_tcpmac" : "");
        print_ratio(name, &st);
        if (pass == 0 && (!have[s] || st.ratio < worst[s].ratio)) {
          worst[s] = st;
          have[s] = true;
        }
      }
    }
  }
  unsetenv("TESSERA_RPC_TRANSPORT");
  if (tr) setenv("TESSERA_RPC_TRANSPORT", tr, 1);

  /* the bucket-size curve, 2 ranks */
  printf("\nall-reduce bus bandwidth by size (2 ranks, median of %d; at "
         "%.1f s)\n", CURVE_ROUNDS, since(t_start));
  plan_t c;
  memset(&c, 0, sizeof c);
  c.n = 2;
  size_t curve[] = {64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20,
                    64 << 20};
  c.nsizes = 6;
  for (int i = 0; i < 6; i++) {
    c.sizes[i] = curve[i];
    c.rounds[i] = CURVE_ROUNDS;
  }
  double tc[6 * CURVE_ROUNDS * CELL];
  if (run_plan(&c, tc)) return 1;
  printf("%-8s %10s %12s %9s\n", "size", "time ms", "busbw GB/s",
         "ring CPU");
  for (int s = 0; s < 6; s++) {
    stat_t st = summarize(tc + CELL * s * CURVE_ROUNDS, CURVE_ROUNDS,
                          curve[s], 2);
    char b[16];
    printf("%-8s %10.3f %12.3f %9.0f\n", mib(curve[s], b, sizeof b),
           (double)curve[s] / st.alg / 1e6, st.bus, st.ring_cpu);
  }

  /* segment size at 64 MiB, 3 ranks */
  printf("\nsegment size at 64MiB (3 ranks, median of %d; at %.1f s)\n",
         SEG_ROUNDS, since(t_start));
  printf("%-8s %12s %9s\n", "segment", "busbw GB/s", "ring CPU");
  uint32_t segs[] = {64 << 10, 256 << 10, 512 << 10, 2 << 20, 8 << 20};
  for (int i = 0; i < 5; i++) {
    plan_t q;
    memset(&q, 0, sizeof q);
    q.n = 3;
    q.nsizes = 1;
    q.sizes[0] = (size_t)64 << 20;
    q.rounds[0] = SEG_ROUNDS;
    q.segment_bytes = segs[i];
    double tq[SEG_ROUNDS * CELL];
    if (run_plan(&q, tq)) return 1;
    stat_t st = summarize(tq, SEG_ROUNDS, q.sizes[0], 3);
    char b[16];
    printf("%-8s %12.3f %9.0f\n", mib(segs[i], b, sizeof b), st.bus,
           st.ring_cpu);
  }
  printf("\nbench_coll: %.1f s in all\n", since(t_start));
  print_ratio("allreduce_busbw_4MiB_vs_tcp", &worst[0]);
  print_ratio("allreduce_busbw_64MiB_vs_tcp", &worst[1]);
  return 0;
}
