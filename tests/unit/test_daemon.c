/* Daemon start-up (common/daemon.h): the shared flags are taken and the
 * rest left to the program; the cluster comes from TF_CONFIG with --task
 * over it; a task the program does not run is refused naming the program
 * and the types it runs; the token is read where the task needs one (from
 * TESSERA_TOKEN or --token-file) and a missing one is named; SIGPIPE ends
 * up ignored; free wipes the token; --frame-mac wins over
 * TESSERA_FRAME_MAC, MACs are on by default and a bad value is named. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/daemon.h"
#include "common/err.h"

#define CLUSTER                                                          \
  "{\"cluster\": {\"chief\": [\"127.0.0.1:1\"], \"worker\": "            \
  "[\"127.0.0.1:2\", \"127.0.0.1:3\"], \"ps\": [\"127.0.0.1:4\"]}, "       \
  "\"task\": {\"type\": \"ps\", \"index\": 0}}"

static const tsr_daemon_spec ps_spec = {"tessera-ps",
                                        TSR_TASK_BIT(TSR_TASK_PS),
                                        TSR_TASK_BIT(TSR_TASK_PS), NULL};

static int setup(void **state) {
  (void)state;
  setenv("TF_CONFIG", CLUSTER, 1);
  setenv("TESSERA_TOKEN", "sesame", 1);
  unsetenv("SLURM_PROCID");
  unsetenv("TESSERA_FRAME_MAC");
  signal(SIGPIPE, SIG_DFL);
  return 0;
}

static void flags_are_taken_others_left(void **state) {
  (void)state;
  tsr_daemon_flags f = {0};
  const char *listen = NULL;
  const tsr_arg opts[] = {TSR_DAEMON_ARGS(&f), TSR_ARG_STR("listen", &listen),
                          TSR_ARG_END};
  char *argv[] = {"tessera-ps", "--cluster", "c.json", "--task=ps:1",
                  "--token-file", "t", "--frame-mac", "off", "--listen",
                  "x", NULL};
  static const tsr_arg_cmd cmd = {.name = "tessera-ps"};
  assert_int_equal(tsr_arg_parse(&cmd, opts, 10, argv, NULL), 0);
  assert_string_equal(f.frame_mac, "off");
  assert_string_equal(f.cluster_file, "c.json");
  assert_string_equal(f.task, "ps:1");
  assert_string_equal(f.token_file, "t");
  assert_string_equal(listen, "x");
}

static void starts_a_ps(void **state) {
  (void)state;
  tsr_daemon_flags f = {0};
  tsr_daemon d;
  char err[512] = "";
  assert_int_equal(tsr_daemon_start(&d, &ps_spec, &f, err, sizeof err), 0);
  assert_string_equal(d.task, "ps:0");
  assert_int_equal(d.cluster.n[TSR_TASK_WORKER], 2);
  assert_int_equal(d.token_len, 6);
  assert_memory_equal(d.token, "sesame", 6);
  struct sigaction sa;
  assert_int_equal(sigaction(SIGPIPE, NULL, &sa), 0);
  assert_true(sa.sa_handler == SIG_IGN);
  tsr_daemon_free(&d);
  assert_int_equal(d.token_len, 0);
  assert_int_equal(d.token[0], 0);
  assert_null(d.cluster.jobs[TSR_TASK_PS]);
  tsr_daemon_free(&d); /* twice: harmless */
}

static void refuses_a_task_it_does_not_run(void **state) {
  (void)state;
  tsr_daemon_flags f = {.task = "worker:1"};
  tsr_daemon d;
  char err[512] = "";
  assert_int_equal(tsr_daemon_start(&d, &ps_spec, &f, err, sizeof err),
                   TSR_ECONFIG);
  assert_non_null(strstr(err, "this task is worker:1; tessera-ps runs a ps "
                              "task"));
  static const tsr_daemon_spec chief_spec = {
      "tessera-chief",
      TSR_TASK_BIT(TSR_TASK_CHIEF) | TSR_TASK_BIT(TSR_TASK_WORKER) |
          TSR_TASK_BIT(TSR_TASK_EVALUATOR),
      TSR_TASK_BIT(TSR_TASK_CHIEF), "chief"};
  f.task = "ps:0";
  assert_int_equal(tsr_daemon_start(&d, &chief_spec, &f, err, sizeof err),
                   TSR_ECONFIG);
  assert_non_null(strstr(err, "tessera-chief runs a chief, worker or "
                              "evaluator task"));
  /* a bad cluster: its own message */
  f.task = "ps:7";
  assert_true(tsr_daemon_start(&d, &ps_spec, &f, err, sizeof err) < 0);
  assert_non_null(strstr(err, "ps"));
}

static void token_only_where_needed(void **state) {
  (void)state;
  unsetenv("TESSERA_TOKEN");
  static const tsr_daemon_spec spec = {
      "tessera-chief",
      TSR_TASK_BIT(TSR_TASK_CHIEF) | TSR_TASK_BIT(TSR_TASK_EVALUATOR),
      TSR_TASK_BIT(TSR_TASK_CHIEF), "chief"};
  tsr_daemon_flags f = {.task = "evaluator:0"};
  tsr_daemon d;
  char err[512] = "";
  assert_int_equal(tsr_daemon_start(&d, &spec, &f, err, sizeof err), 0);
  assert_string_equal(d.task, "evaluator");
  assert_int_equal(d.token_len, 0);
  tsr_daemon_free(&d);
  f.task = "chief:0";
  assert_int_equal(tsr_daemon_start(&d, &spec, &f, err, sizeof err),
                   TSR_ECONFIG);
  assert_non_null(strstr(err, "TESSERA_TOKEN"));
  /* --token-file */
  char path[] = "/tmp/tsr_daemon_tok_XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, "from-file\n", 10), 10);
  close(fd);
  f.token_file = path;
  assert_int_equal(tsr_daemon_start(&d, &spec, &f, err, sizeof err), 0);
  assert_string_equal(d.task, "chief");
  assert_int_equal(d.token_len, 9);
  assert_memory_equal(d.token, "from-file", 9);
  tsr_daemon_free(&d);
  unlink(path);
}

static void frame_mac_flag(void **state) {
  (void)state;
  tsr_daemon_flags f = {0};
  tsr_daemon d;
  char err[512] = "";
  assert_int_equal(tsr_daemon_start(&d, &ps_spec, &f, err, sizeof err), 0);
  assert_int_equal(d.plain_frames, 0); /* on by default */
  tsr_daemon_free(&d);
  setenv("TESSERA_FRAME_MAC", "off", 1);
  assert_int_equal(tsr_daemon_start(&d, &ps_spec, &f, err, sizeof err), 0);
  assert_int_equal(d.plain_frames, 1);
  tsr_daemon_free(&d);
  f.frame_mac = "on"; /* the flag wins over the environment */
  assert_int_equal(tsr_daemon_start(&d, &ps_spec, &f, err, sizeof err), 0);
  assert_int_equal(d.plain_frames, 0);
  tsr_daemon_free(&d);
  f.frame_mac = "maybe";
  assert_int_equal(tsr_daemon_start(&d, &ps_spec, &f, err, sizeof err),
                   TSR_ECONFIG);
  assert_non_null(strstr(err, "--frame-mac \"maybe\" is not on or off"));
  unsetenv("TESSERA_FRAME_MAC");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(flags_are_taken_others_left),
      cmocka_unit_test_setup(starts_a_ps, setup),
      cmocka_unit_test_setup(refuses_a_task_it_does_not_run, setup),
      cmocka_unit_test_setup(token_only_where_needed, setup),
      cmocka_unit_test_setup(frame_mac_flag, setup),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
