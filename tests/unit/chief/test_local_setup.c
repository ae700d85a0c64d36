/* What `tessera local` prepares: distinct free ports, a fresh token each
 * time, a TF_CONFIG per task that the real parser accepts and that names
 * that task (the evaluator outside the cluster map, as in TensorFlow), and
 * the binary search order with an error that lists where it looked. */
#include "chief/cli/local.h"
#include "common/cluster.h"
#include "common/err.h"
#include "../tmpdir.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <cmocka.h>

static void test_ports_and_token(void **state) {
  int ports[16];
  char err[256];
  assert_int_equal(chief_local_free_ports("127.0.0.1", 16, ports, err,
                                          sizeof err), 0);
  for (int i = 0; i < 16; i++) {
    assert_true(ports[i] > 0 && ports[i] < 65536);
    for (int j = 0; j < i; j++) assert_int_not_equal(ports[i], ports[j]);
  }
  assert_true(chief_local_free_ports("localhost.invalid", 1, ports, err,
                                     sizeof err) < 0);
  assert_non_null(strstr(err, "localhost.invalid"));

  char a[65], b[65];
  assert_int_equal(chief_local_token(a, sizeof a), 0);
  assert_int_equal(chief_local_token(b, sizeof b), 0);
  assert_int_equal(strlen(a), 64);
  assert_int_equal(strspn(a, "0123456789abcdef"), 64);
  assert_string_not_equal(a, b);
  char small[64];
  assert_int_equal(chief_local_token(small, sizeof small), TSR_EINVAL);
}

static void test_tf_config(void **state) {
  int ps[2] = {2001, 2002}, wk[3] = {3001, 3002, 3003};
  static const struct {
    chief_local_role role;
    int index;
    tsr_task_type type;
  } cases[] = {{CHIEF_LOCAL_CHIEF, 0, TSR_TASK_CHIEF},
               {CHIEF_LOCAL_PS, 1, TSR_TASK_PS},
               {CHIEF_LOCAL_WORKER, 2, TSR_TASK_WORKER},
               {CHIEF_LOCAL_EVALUATOR, 0, TSR_TASK_EVALUATOR}};
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    char *tf = chief_local_tf_config("127.0.0.1", 1000, ps, 2, wk, 3,
                                     cases[k].role, cases[k].index);
    assert_non_null(tf);
    tsr_cluster c;
    char err[TSR_ERRBUF];
    if (tsr_cluster_parse(tf, "TF_CONFIG", &c, err, sizeof err))
      fail_msg("%s: %s", tf, err);
    assert_int_equal(c.task_type, cases[k].type);
    assert_int_equal(c.task_index, cases[k].index);
    assert_int_equal(c.n[TSR_TASK_CHIEF], 1);
    assert_int_equal(c.n[TSR_TASK_PS], 2);
    assert_int_equal(c.n[TSR_TASK_WORKER], 3);
    assert_int_equal(c.n[TSR_TASK_EVALUATOR], 0);
    assert_int_equal(tsr_cluster_find(&c, TSR_TASK_PS, 1)->port, 2002);
    assert_int_equal(tsr_cluster_find(&c, TSR_TASK_WORKER, 2)->port, 3003);
    assert_int_equal(tsr_cluster_chief(&c)->port, 1000);
    assert_int_equal(tsr_cluster_is_chief(&c),
                     cases[k].type == TSR_TASK_CHIEF);
    tsr_cluster_free(&c);
    free(tf);
  }
}

/* The map alone, as `tessera status --cluster FILE` reads it. */
static void test_cluster_file(void **state) {
  int ps[2] = {2001, 2002}, wk[1] = {3001};
  char *map = chief_local_cluster_json("127.0.0.1", 1000, ps, 2, wk, 1);
  assert_non_null(map);
  assert_null(strstr(map, "task"));
  char dir[256], path[300], err[TSR_ERRBUF];
  test_tmpdir(dir, sizeof dir);
  snprintf(path, sizeof path, "%s/cluster.json", dir);
  FILE *f = fopen(path, "w");
  fputs(map, f);
  fclose(f);
  free(map);
  tsr_cluster c;
  if (tsr_cluster_load(path, "ps:1", &c, err, sizeof err)) fail_msg("%s", err);
  assert_int_equal(c.n[TSR_TASK_PS], 2);
  assert_int_equal(c.n[TSR_TASK_WORKER], 1);
  assert_int_equal(tsr_cluster_find(&c, TSR_TASK_PS, 1)->port, 2002);
  tsr_cluster_free(&c);
  test_rmtree(dir);
}

static void make_exe(const char *path) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs("#!/bin/sh\n", f);
  fclose(f);
  assert_int_equal(chmod(path, 0755), 0);
}

static void test_find_binary(void **state) {
  char dir[256], p[400], out[4096], err[1024];
  test_tmpdir(dir, sizeof dir);
  unsetenv("TESSERA_BIN_DIR");
  /* --bin-dir: only there, and the error names the file. */
  assert_int_equal(chief_local_find_binary(dir, CHIEF_LOCAL_PS, out,
                                           sizeof out, err, sizeof err),
                   TSR_ENOTFOUND);
  assert_non_null(strstr(err, "tessera-ps"));
  assert_non_null(strstr(err, dir));
  snprintf(p, sizeof p, "%s/tessera-ps", dir);
  make_exe(p);
  assert_int_equal(chief_local_find_binary(dir, CHIEF_LOCAL_PS, out,
                                           sizeof out, err, sizeof err), 0);
  assert_string_equal(out, p);
  /* A file that is not executable does not count. */
  snprintf(p, sizeof p, "%s/tessera-worker", dir);
  FILE *f = fopen(p, "w");
  fclose(f);
  assert_true(chief_local_find_binary(dir, CHIEF_LOCAL_WORKER, out,
                                      sizeof out, err, sizeof err) < 0);
  /* TESSERA_BIN_DIR when no folder is given; the evaluator is
   * tessera-chief. */
  snprintf(p, sizeof p, "%s/tessera-chief", dir);
  make_exe(p);
  setenv("TESSERA_BIN_DIR", dir, 1);
  assert_int_equal(chief_local_find_binary(NULL, CHIEF_LOCAL_EVALUATOR, out,
                                           sizeof out, err, sizeof err), 0);
  assert_string_equal(out, p);
  unsetenv("TESSERA_BIN_DIR");
  /* $PATH last (nothing named tessera-ps sits beside this test). */
  const char *old = getenv("PATH");
  char *saved = old ? strdup(old) : NULL;
  setenv("PATH", dir, 1);
  assert_int_equal(chief_local_find_binary(NULL, CHIEF_LOCAL_PS, out,
                                           sizeof out, err, sizeof err), 0);
  snprintf(p, sizeof p, "%s/tessera-ps", dir);
  assert_string_equal(out, p);
  setenv("PATH", "/nonexistent", 1);
  assert_true(chief_local_find_binary(NULL, CHIEF_LOCAL_PS, out, sizeof out,
                                      err, sizeof err) < 0);
  assert_non_null(strstr(err, "$PATH"));
  assert_non_null(strstr(err, "--bin-dir"));
  if (saved) {
    setenv("PATH", saved, 1);
    free(saved);
  }
  test_rmtree(dir);
}

static void test_bad_options(void **state) {
  chief_local_opts o;
  chief_local_opts_init(&o);
  assert_int_equal(o.n_ps, 2);
  assert_int_equal(o.n_workers, 2);
  assert_int_equal(o.n_evaluators, 0);
  chief_local_result res;
  char err[512] = "";
  /* no PS is a hybrid job's way; fewer is no cluster */
  o.n_ps = -1;
  assert_int_equal(chief_local_run(&o, &res, err, sizeof err), TSR_EINVAL);
  assert_non_null(strstr(err, "--ps -1"));
  o.n_ps = 1;
  o.n_workers = 0;
  assert_int_equal(chief_local_run(&o, &res, err, sizeof err), TSR_EINVAL);
  assert_non_null(strstr(err, "--workers 0"));
  o.n_workers = 2;
  o.n_ps = 1;
  o.n_evaluators = 2;
  assert_int_equal(chief_local_run(&o, &res, err, sizeof err), TSR_EINVAL);
  assert_non_null(strstr(err, "evaluator"));
  o.n_evaluators = 0;
  o.host = "::1";
  assert_true(chief_local_run(&o, &res, err, sizeof err) < 0);
  assert_non_null(strstr(err, "::1"));
  assert_string_equal(chief_local_role_name(CHIEF_LOCAL_WORKER), "worker");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_ports_and_token),
      cmocka_unit_test(test_tf_config),
      cmocka_unit_test(test_cluster_file),
      cmocka_unit_test(test_find_binary),
      cmocka_unit_test(test_bad_options),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
