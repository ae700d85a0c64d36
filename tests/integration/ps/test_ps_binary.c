/* The real tessera-ps binary: started from a cluster file on a
 * 127.0.0.1 port claimed for the test (tests/ports/ports.h) with a token in TESSERA_TOKEN, it serves create, push,
 * pull, stats and save through ps_client; the shutdown method makes it
 * exit 0, and so does SIGTERM; a bad task or a missing token exits 2 with
 * a line naming the problem; a client with the wrong token is refused.
 * Every wait has a deadline; a process still running at the end is
 * killed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../unit/ps/ps_harness.h"
#include "kernels/init.h"
#include "ports.h"

static const char *TOKEN = "integration-token-ps";

static void binary(char *buf, size_t len) {
  const char *b = getenv("TSR_BUILD_DIR");
  snprintf(buf, len, "%s/ps/tessera-ps", b ? b : ".");
}

/* Starts tessera-ps as ps:0 of a cluster with one worker; stderr to a
 * file so the test can read it. */
static pid_t start_ps(int port, const char *task, const char *token,
                      const char *errfile) {
  char cluster[256], bin[1024];
  snprintf(cluster, sizeof cluster,
           "{\"cluster\": {\"worker\": [\"127.0.0.1:1\"], \"ps\": "
           "[\"127.0.0.1:%d\"]}, \"task\": {\"type\": \"%s\", \"index\": 0}}",
           port, task);
  binary(bin, sizeof bin);
  pid_t pid = fork();
  if (pid == 0) {
    setenv("TF_CONFIG", cluster, 1);
    if (token)
      setenv("TESSERA_TOKEN", token, 1);
    else
      unsetenv("TESSERA_TOKEN");
    FILE *f = freopen(errfile, "w", stderr);
    (void)f;
    execl(bin, "tessera-ps", "--memory-limit", "256M", (char *)NULL);
    _exit(127);
  }
  return pid;
}

/* Waits up to `ms` for the child; returns its exit status, or -1 (then it
 * is killed). */
static int wait_exit(pid_t pid, int ms) {
  for (int waited = 0; waited < ms; waited += 10) {
    int st;
    pid_t r = waitpid(pid, &st, WNOHANG);
    if (r == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    tsr_sleep_ms(10);
  }
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  return -1;
}

static void client_env(h_env *e, int port, const char *token) {
  memset(e, 0, sizeof *e);
  if (uv_loop_init(&e->loop)) abort();
  tsr_rpc_opts ro = {0};
  ro.name = "itest";
  ro.token = token;
  ro.token_len = strlen(token);
  ro.default_deadline_ms = 10000;
  if (tsr_rpc_ctx_new(&e->ctx, &e->loop, &ro)) abort();
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
  if (ps_client_new(&e->cl[0], e->ctx, addr)) abort();
}

static void read_file(const char *path, char *buf, size_t len) {
  FILE *f = fopen(path, "r");
  size_t n = f ? fread(buf, 1, len - 1, f) : 0;
  buf[n] = 0;
  if (f) fclose(f);
}

/* A tessera-ps on a port claimed for this test (ports.h) with its stderr
 * in `errfile` (a template "...XXXXXX", made a fresh file), and a client
 * to it that presents `token`. */
static pid_t ps_up(h_env *e, char *errfile, const char *token) {
  int port = test_port();
  close(mkstemp(errfile));
  pid_t pid = start_ps(port, "ps", TOKEN, errfile);
  client_env(e, port, token);
  return pid;
}

/* Creates `v` on the PS of `e` (waiting for the connection while the
 * binary starts). */
static void create_on(h_env *e, const ps_var_spec *v) {
  h_res r;
  H_CALL(e, r, ps_client_create(e->cl[0], v, 1, h_cb, &r));
  assert_int_equal(r.status, 0);
}

static void serve_then_shutdown_rpc(void **state) {
  (void)state;
  char errfile[] = "/tmp/tsr-ps-itest-XXXXXX";
  h_env e;
  pid_t pid = ps_up(&e, errfile, TOKEN);
  h_res r;
  ps_var_spec v =
      h_spec("dense_1/kernel", 300, 70, 0, 1, "glorot_uniform", 9, TSR_OPT_ADAM);
  tsr_optim_spec o = v.optim;
  create_on(&e, &v);
  static float got[21000], want[21000], g[21000], m[21000], vv[21000];
  float *slots[2] = {m, vv};
  kern_init_fill(&v.var.init, 9, kern_init_var_key("dense_1/kernel"), 0, want,
                 21000);
  kern_optim_init_slots(&o, slots, 21000);
  for (int i = 0; i < 21000; i++) g[i] = cosf((float)i);
  H_CALL(&e, r, ps_client_push(e.cl[0], "dense_1/kernel", 0, 0, 0, PS_DT_F32,
                               g, sizeof g, h_cb, &r));
  assert_int_equal(r.status, 0);
  kern_optim_apply(&o, 1, want, g, 1.0f, slots, 21000);
  H_CALL(&e, r, ps_client_pull(e.cl[0], "dense_1/kernel", 0, 0, 0, got, 21000,
                               h_cb, &r));
  assert_int_equal(r.status, 0);
  assert_memory_equal(got, want, sizeof got);
  H_CALL(&e, r, ps_client_stats(e.cl[0], h_cb, &r));
  assert_int_equal(r.status, 0);
  assert_int_equal(r.applies, 1);
  assert_true(r.mem_used >= 3 * sizeof got);
  H_CALL(&e, r, ps_client_shutdown(e.cl[0], true, h_cb, &r));
  assert_int_equal(r.status, 0);
  assert_int_equal(wait_exit(pid, 10000), 0);
  assert_int_equal(h_down(&e), 0);
  unlink(errfile);
}

static void sigterm_exits_zero(void **state) {
  (void)state;
  char errfile[] = "/tmp/tsr-ps-itest-XXXXXX";
  h_env e;
  pid_t pid = ps_up(&e, errfile, TOKEN);
  h_res r;
  H_CALL(&e, r, ps_client_stats(e.cl[0], h_cb, &r)); /* it is serving */
  assert_int_equal(r.status, 0);
  kill(pid, SIGTERM);
  assert_int_equal(wait_exit(pid, 10000), 0);
  assert_int_equal(h_down(&e), 0);
  unlink(errfile);
}

/* A PS that holds variables and is told to leave while its job is not
 * done (SIGTERM, or a shutdown that does not say the job is done) exits 1,
 * so a supervisor (tessera local, restart: on-failure) starts it again;
 * before, it exited 0 and the chief waited --ps-timeout for nothing. */
static void leaving_a_job_exits_one(void **state) {
  (void)state;
  for (int how = 0; how < 2; how++) {
    char errfile[] = "/tmp/tsr-ps-itest-XXXXXX", text[4096];
    h_env e;
    pid_t pid = ps_up(&e, errfile, TOKEN);
    h_res r;
    ps_var_spec v = h_spec("dense/kernel", 4, 3, 0, 1, "zeros", 1, TSR_OPT_SGD);
    create_on(&e, &v);
    if (how == 0) {
      kill(pid, SIGTERM);
    } else {
      H_CALL(&e, r, ps_client_shutdown(e.cl[0], false, h_cb, &r));
      assert_int_equal(r.status, 0);
    }
    assert_int_equal(wait_exit(pid, 10000), 1);
    read_file(errfile, text, sizeof text);
    assert_non_null(strstr(text, "the job is not done"));
    assert_int_equal(h_down(&e), 0);
    unlink(errfile);
  }
}

static void wrong_token_refused(void **state) {
  (void)state;
  char errfile[] = "/tmp/tsr-ps-itest-XXXXXX";
  h_env e;
  pid_t pid = ps_up(&e, errfile, "not-the-token");
  ps_client_set_deadline(e.cl[0], 1500);
  h_res r;
  H_CALL(&e, r, ps_client_stats(e.cl[0], h_cb, &r));
  assert_int_not_equal(r.status, 0);
  kill(pid, SIGTERM);
  assert_int_equal(wait_exit(pid, 10000), 0);
  assert_int_equal(h_down(&e), 0);
  unlink(errfile);
}

static void bad_start_exits_two(void **state) {
  (void)state;
  char errfile[] = "/tmp/tsr-ps-itest-XXXXXX", text[4096];
  close(mkstemp(errfile));
  int port = test_port();
  /* a worker task given to tessera-ps */
  pid_t pid = start_ps(port, "worker", TOKEN, errfile);
  assert_int_equal(wait_exit(pid, 10000), 2);
  read_file(errfile, text, sizeof text);
  assert_non_null(strstr(text, "ps task"));
  /* no token anywhere */
  pid = start_ps(port, "ps", NULL, errfile);
  assert_int_equal(wait_exit(pid, 10000), 2);
  read_file(errfile, text, sizeof text);
  assert_non_null(strstr(text, "TESSERA_TOKEN"));
  unlink(errfile);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(serve_then_shutdown_rpc),
      cmocka_unit_test(sigterm_exits_zero),
      cmocka_unit_test(leaving_a_job_exits_one),
      cmocka_unit_test(wrong_token_refused),
      cmocka_unit_test(bad_start_exits_two),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  char err[256];
  test_ports_release((long)getpid(), NULL, 0, err, sizeof err);
  return rc;
}
