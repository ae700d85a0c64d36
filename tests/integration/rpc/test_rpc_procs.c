/* Two real processes on a loopback port claimed for the test
 * (tests/ports/ports.h, so it is still free when the server is started
 * again on it after a kill): this test (the client)
 * and rpc_test_server (argv[1]). Many concurrent calls with payloads from
 * 0 B to 16 MiB plus one of 256 MiB arrive intact (CRC32C checked by the
 * server, echoes compared here); a deadline fires while the server sleeps;
 * a client with the wrong token is refused and the server logs it with
 * the client's address; a server killed mid-call fails every call at once
 * and the client reconnects when it comes back on the same port; a frozen
 * server is found dead by the heartbeat. Every
 * wait has a deadline; the server must stop cleanly on SIGTERM. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "../../unit/rpc/rpc_util.h"
#include "common/crc32c.h"
#include "common/log.h"
#include "ports.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>

enum { M_ECHO = 1, M_CHECKSUM = 2, M_SLEEP = 3 };

static const char *server_path;
static char log_path[64];
static pid_t server_pid = -1;
static int server_port;

/* Starts the server (on `port`) and reads the port it prints. */
static int start_server(int port) {
  int pfd[2];
  if (pipe(pfd)) return -1;
  int logfd = open(log_path, O_WRONLY | O_CREAT | O_APPEND, 0600);
  char portarg[16];
  snprintf(portarg, sizeof portarg, "%d", port);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(pfd[1], 1);
    dup2(logfd, 2);
    close(pfd[0]);
    setenv("TESSERA_TOKEN", TEST_TOKEN, 1);
    setenv("TESSERA_LOG", "info", 1);
    execl(server_path, server_path, "--port", portarg, (char *)NULL);
    _exit(127);
  }
  close(pfd[1]);
  close(logfd);
  char line[64] = "";
  size_t n = 0;
  uint64_t t0 = tsr_now_ms();
  while (n < sizeof line - 1 && !strchr(line, '\n') &&
         tsr_now_ms() - t0 < 10000) {
    struct pollfd p = {.fd = pfd[0], .events = POLLIN};
    if (poll(&p, 1, 200) <= 0) continue;
    ssize_t r = read(pfd[0], line + n, sizeof line - 1 - n);
    if (r <= 0) break;
    n += (size_t)r;
    line[n] = 0;
  }
  close(pfd[0]);
  int got = 0;
  if (sscanf(line, "PORT %d", &got) != 1 || got <= 0) {
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return -1;
  }
  server_pid = pid;
  server_port = got;
  return 0;
}

/* Waits for the server to exit (bounded); returns its wait status. */
static int reap(unsigned timeout_ms) {
  int st = -1;
  uint64_t t0 = tsr_now_ms();
  while (tsr_now_ms() - t0 < timeout_ms) {
    pid_t r = waitpid(server_pid, &st, WNOHANG);
    if (r == server_pid) {
      server_pid = -1;
      return st;
    }
    usleep(10000);
  }
  kill(server_pid, SIGKILL);
  waitpid(server_pid, &st, 0);
  server_pid = -1;
  return -1;
}

static int setup(void **state) {
  snprintf(log_path, sizeof log_path, "/tmp/tsr_rpc_server_%d.log",
           (int)getpid());
  unlink(log_path);
  assert_int_equal(start_server(test_port()), 0);
  return 0;
}

static int teardown(void **state) {
  if (server_pid > 0) {
    kill(server_pid, SIGTERM);
    int st = reap(5000);
    /* a clean stop: every handle closed, the loop closed */
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
  }
  unlink(log_path);
  char err[256];
  test_ports_release((long)getpid(), NULL, 0, err, sizeof err);
  return 0;
}

typedef struct cl {
  uv_loop_t loop;
  tsr_rpc_ctx *ctx;
  tsr_rpc_client *c;
} cl;

static void cl_up(cl *k, const char *token) {
  assert_int_equal(uv_loop_init(&k->loop), 0);
  tsr_rpc_opts o;
  ru_opts(&o, "itest");
  if (token) {
    o.token = token;
    o.token_len = strlen(token);
  }
  o.backoff_min_ms = 20;
  o.backoff_max_ms = 200;
  assert_int_equal(tsr_rpc_ctx_new(&k->ctx, &k->loop, &o), 0);
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", server_port);
  assert_int_equal(tsr_rpc_client_new(&k->c, k->ctx, addr), 0);
}

static void cl_down(cl *k) {
  int done = 0;
  tsr_rpc_client_close(k->c, ru_set_flag, &done);
  assert_true(ru_run_until(&k->loop, &done, 5000));
  assert_int_equal(tsr_rpc_ctx_free(k->ctx), 0);
  assert_int_equal(uv_loop_close(&k->loop), 0);
}

typedef struct job {
  int done, status, bad;
  char msg[300];
  uint64_t len;
  uint32_t crc;
  const uint8_t *want; /* echo: expected bytes */
  uint8_t *dst;
} job;

static void on_job(const tsr_rpc_result *r, void *data) {
  job *j = data;
  j->done = 1;
  j->status = r->status;
  snprintf(j->msg, sizeof j->msg, "%s", r->message);
  if (r->status) return;
  if (j->want) {
    if (r->payload != j->dst || r->payload_len != j->len ||
        (j->len && memcmp(j->dst, j->want, j->len)))
      j->bad = 1;
  } else {
    uint64_t n;
    uint32_t crc;
    if (r->meta_len != 12) {
      j->bad = 1;
      return;
    }
    memcpy(&n, r->meta, 8);
    memcpy(&crc, r->meta + 8, 4);
    if (n != j->len || crc != j->crc) j->bad = 1;
  }
}

static int all_done(job *j, int n) {
  for (int i = 0; i < n; i++)
    if (!j[i].done) return 0;
  return 1;
}

static void run_jobs(cl *k, job *j, int n, unsigned timeout_ms) {
  uint64_t t0 = tsr_now_ms();
  int z = 0;
  while (!all_done(j, n) && tsr_now_ms() - t0 < timeout_ms)
    ru_run_until(&k->loop, &z, 20);
}

static void test_payloads(void **state) {
  cl k;
  cl_up(&k, NULL);
  const size_t big = (size_t)256 << 20;
  uint8_t *src = malloc(big);
  assert_non_null(src);
  uint64_t x = 88172645463325252ull;
  for (size_t i = 0; i < big / 8; i++) { /* xorshift: not compressible */
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    memcpy(src + i * 8, &x, 8);
  }
  enum { NSUM = 48, NECHO = 8, N = NSUM + NECHO + 1 };
  job *j = calloc(N, sizeof *j);
  uv_buf_t bufs[N][2];
  for (int i = 0; i < N; i++) {
    size_t len, off = ((size_t)i * 7919 * 4096) % (big / 2);
    if (i == N - 1)
      len = big, off = 0;
    else if (i % 6 == 0)
      len = 0;
    else if (i < NSUM)
      len = (size_t)1 << (i % 25); /* 2 B .. 16 MiB */
    else
      len = ((size_t)i * 1000003) % (4u << 20);
    if (i % 5 == 1 && len > 10) len -= 3; /* odd sizes */
    j[i].len = len;
    tsr_rpc_request q = {.deadline_ms = 60000};
    /* payloads in two pieces: gathered on the way out */
    size_t h = len / 3;
    bufs[i][0] = uv_buf_init((char *)src + off, (unsigned)h);
    bufs[i][1] = uv_buf_init((char *)src + off + h, (unsigned)(len - h));
    q.payload = bufs[i];
    q.npayload = 2;
    if (i >= NSUM && i < N - 1) {
      q.method = M_ECHO;
      j[i].want = src + off;
      j[i].dst = malloc(len + 1);
      q.resp_buf = j[i].dst;
      q.resp_len = len;
    } else {
      q.method = M_CHECKSUM;
      j[i].crc = tsr_crc32c(0, src + off, len);
    }
    assert_int_equal(tsr_rpc_call(k.c, &q, on_job, &j[i]), 0);
  }
  run_jobs(&k, j, N, 60000);
  for (int i = 0; i < N; i++) {
    if (!j[i].done || j[i].status || j[i].bad)
      fail_msg("call %d (%llu bytes): done %d status %d bad %d: %s", i,
               (unsigned long long)j[i].len, j[i].done, j[i].status,
               j[i].bad, j[i].msg);
    free(j[i].dst);
  }
  free(j);
  free(src);
  tsr_rpc_stats st;
  tsr_rpc_client_stats(k.c, &st);
  assert_int_equal(st.calls, N);
  assert_int_equal(st.errors, 0);
  cl_down(&k);
}

static void test_deadline(void **state) {
  cl k;
  cl_up(&k, NULL);
  uint32_t ms = 3000;
  job j[2];
  memset(j, 0, sizeof j);
  /* connected first: the 200 ms must time the call, not the connect and
   * handshake (slow on a loaded machine, which ends as unavailable) */
  tsr_rpc_request w = {.method = M_ECHO, .deadline_ms = 30000};
  j[0].want = (const uint8_t *)"";
  assert_int_equal(tsr_rpc_call(k.c, &w, on_job, &j[0]), 0);
  assert_true(ru_run_until(&k.loop, &j[0].done, 30000));
  assert_int_equal(j[0].status, 0);
  memset(j, 0, sizeof j);
  tsr_rpc_request q = {.method = M_SLEEP, .meta = &ms, .meta_len = 4,
                       .deadline_ms = 200};
  assert_int_equal(tsr_rpc_call(k.c, &q, on_job, &j[0]), 0);
  assert_true(ru_run_until(&k.loop, &j[0].done, 2500));
  assert_int_equal(j[0].status, TSR_ETIMEOUT);
  assert_non_null(strstr(j[0].msg, "deadline of 200 ms"));
  /* the connection is still good */
  tsr_rpc_request e = {.method = M_ECHO, .deadline_ms = 5000};
  j[1].want = (const uint8_t *)"";
  assert_int_equal(tsr_rpc_call(k.c, &e, on_job, &j[1]), 0);
  assert_true(ru_run_until(&k.loop, &j[1].done, 5000));
  assert_int_equal(j[1].status, 0);
  cl_down(&k);
}

static void test_wrong_token(void **state) {
  cl k;
  cl_up(&k, "a-token-from-another-cluster");
  job j;
  memset(&j, 0, sizeof j);
  tsr_rpc_request q = {.method = M_ECHO, .deadline_ms = 500};
  assert_int_equal(tsr_rpc_call(k.c, &q, on_job, &j), 0);
  assert_true(ru_run_until(&k.loop, &j.done, 3000));
  assert_int_equal(j.status, TSR_EUNAVAIL);
  assert_non_null(strstr(j.msg, "wrong cluster token"));
  cl_down(&k);
  /* the server logged the refusal with the client's address */
  FILE *f = fopen(log_path, "r");
  assert_non_null(f);
  char line[512], me[32];
  /* named by its address over TCP, by its pid over the same-host socket */
  snprintf(me, sizeof me, "unix:pid %d:", (int)getpid());
  int found = 0;
  while (fgets(line, sizeof line, f))
    if (strstr(line, "refused") &&
        (strstr(line, "127.0.0.1:") || strstr(line, me)) &&
        strstr(line, "wrong cluster token"))
      found = 1;
  if (!found) { /* say what the server did log */
    rewind(f);
    while (fgets(line, sizeof line, f)) fprintf(stderr, "server: %s", line);
  }
  fclose(f);
  assert_true(found);
}

static int ups;
static void on_state(tsr_rpc_client *c, int up, int status, void *data) {
  if (up) ups++;
}

static void test_kill_midcall(void **state) {
  cl k;
  cl_up(&k, NULL);
  ups = 0;
  tsr_rpc_client_on_state(k.c, on_state, NULL);
  uint32_t ms = 20000;
  enum { N = 4 };
  job j[N + 1];
  memset(j, 0, sizeof j);
  for (int i = 0; i < N; i++) {
    tsr_rpc_request q = {.method = M_SLEEP, .meta = &ms, .meta_len = 4,
                         .deadline_ms = 30000};
    assert_int_equal(tsr_rpc_call(k.c, &q, on_job, &j[i]), 0);
  }
  int z = 0;
  for (int t = 0; t < 100 && ups == 0; t++) ru_run_until(&k.loop, &z, 10);
  ru_run_until(&k.loop, &z, 100); /* the server now holds them */
  int port = server_port;
  kill(server_pid, SIGKILL);
  reap(5000);
  /* every call fails at once, long before its deadline */
  run_jobs(&k, j, N, 5000);
  for (int i = 0; i < N; i++) {
    assert_true(j[i].done);
    assert_int_equal(j[i].status, TSR_ECLOSED);
    assert_non_null(strstr(j[i].msg, "lost"));
  }
  /* back on the same port: the client reconnects by itself */
  assert_int_equal(start_server(port), 0);
  assert_int_equal(server_port, port);
  tsr_rpc_request e = {.method = M_ECHO, .deadline_ms = 10000};
  j[N].want = (const uint8_t *)"";
  assert_int_equal(tsr_rpc_call(k.c, &e, on_job, &j[N]), 0);
  assert_true(ru_run_until(&k.loop, &j[N].done, 10000));
  assert_int_equal(j[N].status, 0);
  assert_true(ups >= 2);
  cl_down(&k);
}

/* A frozen server (SIGSTOP: the TCP connection stays up, nothing answers)
 * is found dead by the heartbeat within idle_timeout, not at the call's
 * deadline; the client is back once the server runs again. */
static void test_frozen_server(void **state) {
  cl k;
  assert_int_equal(uv_loop_init(&k.loop), 0);
  tsr_rpc_opts o;
  ru_opts(&o, "itest");
  o.heartbeat_ms = 100;
  o.idle_timeout_ms = 600;
  o.backoff_min_ms = 20;
  o.backoff_max_ms = 100;
  assert_int_equal(tsr_rpc_ctx_new(&k.ctx, &k.loop, &o), 0);
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", server_port);
  assert_int_equal(tsr_rpc_client_new(&k.c, k.ctx, addr), 0);
  job j[2];
  memset(j, 0, sizeof j);
  tsr_rpc_request e = {.method = M_ECHO, .deadline_ms = 5000};
  j[0].want = (const uint8_t *)"";
  assert_int_equal(tsr_rpc_call(k.c, &e, on_job, &j[0]), 0);
  assert_true(ru_run_until(&k.loop, &j[0].done, 5000));
  assert_int_equal(j[0].status, 0);
  kill(server_pid, SIGSTOP);
  uint32_t ms = 10;
  tsr_rpc_request q = {.method = M_SLEEP, .meta = &ms, .meta_len = 4,
                       .deadline_ms = 30000};
  assert_int_equal(tsr_rpc_call(k.c, &q, on_job, &j[1]), 0);
  int ok = ru_run_until(&k.loop, &j[1].done, 10000);
  kill(server_pid, SIGCONT);
  assert_true(ok);
  assert_int_equal(j[1].status, TSR_ECLOSED);
  assert_non_null(strstr(j[1].msg, "silent"));
  memset(j, 0, sizeof j);
  j[0].want = (const uint8_t *)"";
  assert_int_equal(tsr_rpc_call(k.c, &e, on_job, &j[0]), 0);
  assert_true(ru_run_until(&k.loop, &j[0].done, 5000));
  assert_int_equal(j[0].status, 0);
  cl_down(&k);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: test_rpc_procs PATH/rpc_test_server\n");
    return 2;
  }
  server_path = argv[1];
  signal(SIGPIPE, SIG_IGN);
  tsr_log_init("itest");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_payloads),
      cmocka_unit_test(test_deadline),
      cmocka_unit_test(test_wrong_token),
      cmocka_unit_test(test_kill_midcall),
      cmocka_unit_test(test_frozen_server),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
