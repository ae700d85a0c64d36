/* Who is at the other end of a same-host socket.
 *
 * Abstract Unix names have no owner: any local user may bind one. So each
 * end asks the kernel (SO_PEERCRED) and trusts only this process's uid or
 * one named in TESSERA_RPC_PEER_UIDS:
 *   - the uid list: parsed, bad values refused naming the variable;
 *   - a client of another uid (with the token, over the same-host socket)
 *     is served, but its frames carry a MAC; named in the server's
 *     TESSERA_RPC_PEER_UIDS it gets plain frames;
 *   - a name held by another uid (a squatter on the exact name beside a
 *     wildcard server) is not used: the client logs it, counts it, and
 *     reaches the server on its own wildcard name, with plain frames.
 * A second uid needs root: without it those cases are skipped. The other
 * process is forked before any loop exists and drops to uid 65534. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>
#include <cmocka.h>

#include "rpc_util.h"

#include "common/log.h"

#include <grp.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>

enum { M_ECHO = 7 };
#define OTHER_UID 65534
#define PLEN 5000

/* ---- the uid list ---------------------------------------------------------*/

static int ctx_with(const char *uids, tsr_rpc_ctx **ctx, uv_loop_t *loop) {
  tsr_rpc_opts o;
  ru_opts(&o, "x");
  if (uids)
    setenv("TESSERA_RPC_PEER_UIDS", uids, 1);
  else
    unsetenv("TESSERA_RPC_PEER_UIDS");
  int rc = tsr_rpc_ctx_new(ctx, loop, &o);
  unsetenv("TESSERA_RPC_PEER_UIDS");
  return rc;
}

static void uid_list(void **s) {
  uv_loop_t loop;
  assert_int_equal(uv_loop_init(&loop), 0);
  tsr_rpc_ctx *ctx;
  unsigned me = (unsigned)geteuid();
  unsigned other = me == 4242 ? 4343 : 4242;
  assert_int_equal(ctx_with(NULL, &ctx, &loop), 0);
  assert_true(tsr_rpc__local_uid_ok(ctx, me));
  assert_false(tsr_rpc__local_uid_ok(ctx, other));
  assert_false(tsr_rpc__local_uid_ok(ctx, OTHER_UID == me ? 1 : OTHER_UID));
  assert_int_equal(tsr_rpc_ctx_free(ctx), 0);
  assert_int_equal(ctx_with("4242,4343,0", &ctx, &loop), 0);
  assert_true(tsr_rpc__local_uid_ok(ctx, 4242));
  assert_true(tsr_rpc__local_uid_ok(ctx, 4343));
  assert_true(tsr_rpc__local_uid_ok(ctx, 0));
  assert_true(tsr_rpc__local_uid_ok(ctx, me));
  assert_false(tsr_rpc__local_uid_ok(ctx, 4244));
  assert_int_equal(tsr_rpc_ctx_free(ctx), 0);
  static const char *const bad[] = {"x", "12,", ",12", "1 2", "-1",
                                    "4294967295", "99999999999", "12,,13",
                                    "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,"
                                    "17"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
    assert_int_equal(ctx_with(bad[i], &ctx, &loop), TSR_ECONFIG);
  assert_int_equal(uv_loop_close(&loop), 0);
}

/* ---- a second process of another uid ------------------------------------ */

typedef struct {
  pid_t pid;
  int to[2];   /* parent -> child */
  int from[2]; /* child -> parent */
} other_proc;

static void drop_to_other_uid(void) {
  if (setgroups(0, NULL) || setresgid(OTHER_UID, OTHER_UID, OTHER_UID) ||
      setresuid(OTHER_UID, OTHER_UID, OTHER_UID))
    _exit(90);
}

/* Forks; the child drops to OTHER_UID and runs fn(its end of both pipes). */
static void other_start(other_proc *p, void (*fn)(int in, int out)) {
  assert_int_equal(pipe(p->to), 0);
  assert_int_equal(pipe(p->from), 0);
  fflush(stderr);
  p->pid = fork();
  assert_true(p->pid >= 0);
  if (p->pid == 0) {
    close(p->to[1]);
    close(p->from[0]);
    drop_to_other_uid();
    fn(p->to[0], p->from[1]);
    _exit(0);
  }
  close(p->to[0]);
  close(p->from[1]);
}

static void other_end(other_proc *p) {
  close(p->to[1]);
  close(p->from[0]);
  int st = 0;
  if (waitpid(p->pid, &st, WNOHANG) == 0) {
    kill(p->pid, SIGKILL);
    waitpid(p->pid, &st, 0);
  }
}

/* Runs `loop` until `fd` has `n` bytes for `out` (deadline 20 s). */
static int read_while_running(uv_loop_t *loop, int fd, void *out, size_t n) {
  size_t got = 0;
  uint64_t t0 = tsr_now_ms();
  while (got < n && tsr_now_ms() - t0 < 20000) {
    uv_run(loop, UV_RUN_NOWAIT);
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, 5) <= 0) continue;
    ssize_t r = read(fd, (uint8_t *)out + got, n - got);
    if (r <= 0) return -1;
    got += (size_t)r;
  }
  return got == n ? 0 : -1;
}

/* ---- a server and its echo ----------------------------------------------- */

typedef struct {
  uv_loop_t loop;
  tsr_rpc_ctx *ctx;
  tsr_rpc_server *srv;
  int port;
  char last_peer[TSR_RPC_ADDR_MAX];
  int calls;
} srv_env;

static void h_echo(tsr_rpc_incoming *call, void *data) {
  srv_env *e = data;
  e->calls++;
  snprintf(e->last_peer, sizeof e->last_peer, "%s", call->peer);
  uv_buf_t b = uv_buf_init(call->payload, (unsigned)call->payload_len);
  if (tsr_rpc_reply(call, NULL, 0, &b, call->payload_len ? 1 : 0, NULL,
                    NULL))
    tsr_rpc_reply_error(call, TSR_EINVAL, "answer refused");
}

static void srv_up(srv_env *e, const char *listen, const char *peer_uids) {
  memset(e, 0, sizeof *e);
  assert_int_equal(uv_loop_init(&e->loop), 0);
  assert_int_equal(ctx_with(peer_uids, &e->ctx, &e->loop), 0);
  assert_int_equal(tsr_rpc_server_new(&e->srv, e->ctx), 0);
  assert_int_equal(tsr_rpc_server_register(e->srv, M_ECHO, h_echo, e), 0);
  assert_int_equal(tsr_rpc_server_listen(e->srv, listen), 0);
  e->port = tsr_rpc_server_port(e->srv);
}

static void srv_down(srv_env *e) {
  int a = 0;
  tsr_rpc_server_close(e->srv, ru_set_flag, &a);
  assert_true(ru_run_until(&e->loop, &a, 5000));
  assert_int_equal(tsr_rpc_ctx_free(e->ctx), 0);
  uv_run(&e->loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&e->loop), 0);
}

/* What a client saw, sent back to the parent. */
typedef struct {
  int status;
  int echo_ok;
  tsr_rpc_stats st;
} client_report;

typedef struct {
  int done, status, ok;
  uint8_t back[PLEN];
} call_res;

static uint8_t g_pat[PLEN];

static void on_res(const tsr_rpc_result *r, void *data) {
  call_res *c = data;
  c->done = 1;
  c->status = r->status;
  c->ok = r->status == 0 && r->payload_len == PLEN &&
          !memcmp(c->back, g_pat, PLEN);
}

/* A client of 127.0.0.1:port on `loop` (which may run a server too): one
 * echo call, its stats. */
static void client_once(uv_loop_t *loop, int port, client_report *rep) {
  memset(rep, 0, sizeof *rep);
  tsr_rpc_opts o;
  ru_opts(&o, "client");
  tsr_rpc_ctx *ctx;
  rep->status = tsr_rpc_ctx_new(&ctx, loop, &o);
  if (rep->status) return;
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
  tsr_rpc_client *cl;
  rep->status = tsr_rpc_client_new(&cl, ctx, addr);
  if (rep->status) {
    tsr_rpc_ctx_free(ctx);
    return;
  }
  call_res r;
  memset(&r, 0, sizeof r);
  uv_buf_t b = uv_buf_init((char *)g_pat, PLEN);
  tsr_rpc_request q = {0};
  q.method = M_ECHO;
  q.payload = &b;
  q.npayload = 1;
  q.resp_buf = r.back;
  q.resp_len = PLEN;
  q.deadline_ms = 10000;
  rep->status = tsr_rpc_call(cl, &q, on_res, &r);
  if (!rep->status) {
    ru_run_until(loop, &r.done, 15000);
    rep->status = r.done ? r.status : TSR_ETIMEOUT;
    rep->echo_ok = r.ok;
  }
  tsr_rpc_client_stats(cl, &rep->st);
  int a = 0;
  tsr_rpc_client_close(cl, ru_set_flag, &a);
  ru_run_until(loop, &a, 5000);
  tsr_rpc_ctx_free(ctx);
}

/* The child: reads the port, trusts the parent's uid (so it does use the
 * parent's socket), calls once, reports. */
static unsigned g_parent_uid;

static void child_client(int in, int out) {
  int port;
  if (ru_read_all(in, &port, sizeof port)) _exit(91);
  char u[16];
  snprintf(u, sizeof u, "%u", g_parent_uid);
  setenv("TESSERA_RPC_PEER_UIDS", u, 1);
  uv_loop_t loop;
  if (uv_loop_init(&loop)) _exit(93);
  client_report rep;
  client_once(&loop, port, &rep);
  uv_run(&loop, UV_RUN_DEFAULT);
  uv_loop_close(&loop);
  if (ru_write_all(out, &rep, sizeof rep)) _exit(92);
}

static int need_root(void) {
  if (geteuid() == 0) return 1;
  print_message("a second uid needs root: skipped\n");
  return 0;
}

/* A peer of another uid, holding the token, over the same-host socket. */
static void other_uid_client(const char *server_uids, int want_plain) {
  g_parent_uid = (unsigned)geteuid();
  other_proc p;
  other_start(&p, child_client);
  srv_env e;
  srv_up(&e, "127.0.0.1:0", server_uids);
  assert_int_equal(ru_write_all(p.to[1], &e.port, sizeof e.port), 0);
  client_report rep;
  assert_int_equal(read_while_running(&e.loop, p.from[0], &rep, sizeof rep),
                   0);
  other_end(&p);
  tsr_rpc_stats ss;
  tsr_rpc_server_stats(e.srv, &ss);
  print_message("peer %s: client local %llu plain %llu, server local %llu "
                "plain %llu untrusted %llu\n", e.last_peer,
                (unsigned long long)rep.st.connects_local,
                (unsigned long long)rep.st.connects_plain,
                (unsigned long long)ss.connects_local,
                (unsigned long long)ss.connects_plain,
                (unsigned long long)ss.local_untrusted);
  assert_int_equal(rep.status, 0);
  assert_true(rep.echo_ok);
  /* it did come over the same-host socket ... */
  assert_int_equal(rep.st.connects_local, 1);
  assert_int_equal(ss.connects_local, 1);
  assert_int_equal(e.calls, 1);
  /* ... and frames went plain only where the server trusts its uid */
  assert_int_equal(rep.st.connects_plain, (uint64_t)want_plain);
  assert_int_equal(ss.connects_plain, (uint64_t)want_plain);
  assert_int_equal(ss.local_untrusted, (uint64_t)!want_plain);
  if (want_plain) {
    assert_null(strstr(e.last_peer, " uid "));
  } else {
    char want[32];
    snprintf(want, sizeof want, " uid %d", OTHER_UID);
    assert_non_null(strstr(e.last_peer, want));
  }
  srv_down(&e);
}

static void other_uid_peer_gets_mac(void **s) {
  if (!need_root()) skip();
  other_uid_client(NULL, 0);
}

static void named_uid_peer_gets_plain(void **s) {
  if (!need_root()) skip();
  char u[16];
  snprintf(u, sizeof u, "%d", OTHER_UID);
  other_uid_client(u, 1);
}

/* The child squats the exact name of a wildcard server's port, counts the
 * connections it gets until told to stop, and reports the count. */
static void child_squatter(int in, int out) {
  int port;
  if (ru_read_all(in, &port, sizeof port)) _exit(91);
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  int n = snprintf(a.sun_path + 1, sizeof a.sun_path - 1,
                   "tessera-rpc/127.0.0.1:%d", port);
  if (fd < 0 ||
      bind(fd, (struct sockaddr *)&a,
           (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 +
                       (size_t)n)) ||
      listen(fd, 8))
    _exit(93);
  char ready = 'r';
  if (ru_write_all(out, &ready, 1)) _exit(92);
  int accepted = 0;
  for (;;) {
    struct pollfd p[2] = {{fd, POLLIN, 0}, {in, POLLIN, 0}};
    if (poll(p, 2, 20000) <= 0) break;
    if (p[1].revents) {
      /* told to stop: the client's connection may still sit in the
       * backlog (it came as the stop byte did, and poll saw both): count
       * what the kernel holds before reporting */
      fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
      int c;
      while ((c = accept(fd, NULL, NULL)) >= 0) {
        accepted++;
        close(c);
      }
      break;
    }
    int c = accept(fd, NULL, NULL);
    if (c >= 0) {
      accepted++;
      close(c);
    }
  }
  if (ru_write_all(out, &accepted, sizeof accepted)) _exit(92);
}

static void other_uid_listener_not_used(void **s) {
  if (!need_root()) skip();
  other_proc p;
  other_start(&p, child_squatter);
  srv_env e;
  srv_up(&e, "0.0.0.0:0", NULL);
  assert_int_equal(ru_write_all(p.to[1], &e.port, sizeof e.port), 0);
  char ready;
  assert_int_equal(read_while_running(&e.loop, p.from[0], &ready, 1), 0);
  /* a client of this uid, on the server's loop */
  tsr_log_level was = tsr_log_get_level();
  tsr_log_set_level(TSR_LOG_WARN);
  char path[] = "/tmp/tsr-local-XXXXXX";
  int lf = mkstemp(path);
  assert_true(lf >= 0);
  fflush(stderr);
  int saved = dup(2);
  dup2(lf, 2);
  client_report rep;
  client_once(&e.loop, e.port, &rep);
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  close(lf);
  tsr_log_set_level(was);
  char stop = 'q';
  assert_int_equal(ru_write_all(p.to[1], &stop, 1), 0);
  int accepted = -1;
  assert_int_equal(
      read_while_running(&e.loop, p.from[0], &accepted, sizeof accepted), 0);
  other_end(&p);
  tsr_rpc_stats ss;
  tsr_rpc_server_stats(e.srv, &ss);
  /* the log names the socket and the uid found there */
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  char line[1024], want_name[64], want_uid[32];
  snprintf(want_name, sizeof want_name, "@tessera-rpc/127.0.0.1:%d", e.port);
  snprintf(want_uid, sizeof want_uid, "uid %d", OTHER_UID);
  int named = 0;
  while (fgets(line, sizeof line, f))
    named += strstr(line, want_name) && strstr(line, want_uid);
  fclose(f);
  unlink(path);
  print_message("squatter accepted %d; client local %llu plain %llu "
                "untrusted %llu; %d log lines name the socket\n", accepted,
                (unsigned long long)rep.st.connects_local,
                (unsigned long long)rep.st.connects_plain,
                (unsigned long long)rep.st.local_untrusted, named);
  /* the client did try the squatter's name (first in its order) ... */
  assert_int_equal(accepted, 1);
  assert_int_equal(rep.st.local_untrusted, 1);
  assert_int_equal(named, 1);
  /* ... then reached the server on its own name, with plain frames */
  assert_int_equal(rep.status, 0);
  assert_true(rep.echo_ok);
  assert_int_equal(rep.st.connects_local, 1);
  assert_int_equal(rep.st.connects_plain, 1);
  assert_int_equal(ss.connects_plain, 1);
  assert_int_equal(ss.local_untrusted, 0);
  assert_int_equal(e.calls, 1);
  srv_down(&e);
}

int main(void) {
  setenv("TESSERA_LOG", "error", 0);
  tsr_log_init("test");
  signal(SIGPIPE, SIG_IGN);
  for (int i = 0; i < PLEN; i++) g_pat[i] = (uint8_t)(i * 11 + 3);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(uid_list),
      cmocka_unit_test(other_uid_peer_gets_mac),
      cmocka_unit_test(named_uid_peer_gets_plain),
      cmocka_unit_test(other_uid_listener_not_used),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
