/* Cluster spec: a table of TF_CONFIG texts, valid and invalid, in both job
 * forms, each with the expected result and (for errors) a fragment the
 * message must contain, so the error names the key and the value. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "common/cluster.h"
#include "common/err.h"

typedef struct {
  const char *json;
  int rc;              /* 0 or expected code */
  const char *needle;  /* substring of the error message */
  tsr_task_type type;  /* expected task */
  int index;
  int is_chief;
  int n_worker, n_ps;
} case_t;

#define OK(j, t, i, ch, nw, np) {j, 0, NULL, t, i, ch, nw, np}
#define BAD(j, rc, needle) {j, rc, needle, TSR_TASK_NONE, -1, 0, 0, 0}

static const case_t cases[] = {
    /* 1: the ParameterServerStrategy shape */
    OK("{\"cluster\":{\"chief\":[\"h0:2222\"],\"worker\":[\"h1:2222\",\"h2:2222\"],"
       "\"ps\":[\"h3:2222\"]},\"task\":{\"type\":\"worker\",\"index\":1}}",
       TSR_TASK_WORKER, 1, 0, 2, 1),
    /* 2: chief task */
    OK("{\"cluster\":{\"chief\":[\"h0:1\"],\"worker\":[\"h1:2\"],\"ps\":[\"h2:3\"]},"
       "\"task\":{\"type\":\"chief\",\"index\":0}}", TSR_TASK_CHIEF, 0, 1, 1, 1),
    /* 3: no chief job: worker 0 is the chief */
    OK("{\"cluster\":{\"worker\":[\"a:1\",\"b:2\"],\"ps\":[\"c:3\"]},"
       "\"task\":{\"type\":\"worker\",\"index\":0}}", TSR_TASK_WORKER, 0, 1, 2, 1),
    /* 4: no chief job: worker 1 is not */
    OK("{\"cluster\":{\"worker\":[\"a:1\",\"b:2\"],\"ps\":[\"c:3\"]},"
       "\"task\":{\"type\":\"worker\",\"index\":1}}", TSR_TASK_WORKER, 1, 0, 2, 1),
    /* 5: sparse map form */
    OK("{\"cluster\":{\"worker\":{\"3\":\"a:1\",\"7\":\"b:2\"},\"ps\":[\"c:3\"]},"
       "\"task\":{\"type\":\"worker\",\"index\":7}}", TSR_TASK_WORKER, 7, 0, 2, 1),
    /* 6: index given as a string, as int() accepts */
    OK("{\"cluster\":{\"worker\":[\"a:1\"],\"ps\":[\"c:3\",\"d:4\"]},"
       "\"task\":{\"type\":\"ps\",\"index\":\"1\"}}", TSR_TASK_PS, 1, 0, 1, 2),
    /* 7: index defaults to 0 */
    OK("{\"cluster\":{\"worker\":[\"a:1\"],\"ps\":[\"c:3\"]},"
       "\"task\":{\"type\":\"ps\"}}", TSR_TASK_PS, 0, 0, 1, 1),
    /* 8: evaluator outside the cluster is allowed (a sidecar, as in TF) */
    OK("{\"cluster\":{\"chief\":[\"a:1\"],\"worker\":[\"b:1\"],\"ps\":[\"c:1\"]},"
       "\"task\":{\"type\":\"evaluator\",\"index\":0}}", TSR_TASK_EVALUATOR, 0, 0, 1, 1),
    /* 9: IPv6 address */
    OK("{\"cluster\":{\"worker\":[\"[::1]:5000\"],\"ps\":[\"[::1]:5001\"]},"
       "\"task\":{\"type\":\"ps\",\"index\":0}}", TSR_TASK_PS, 0, 0, 1, 1),
    /* 10: rpc_layer and environment are accepted, as TF sets them */
    OK("{\"cluster\":{\"worker\":[\"a:1\"],\"ps\":[\"b:2\"]},\"rpc_layer\":\"grpc\","
       "\"environment\":\"cloud\",\"task\":{\"type\":\"worker\",\"index\":0}}",
       TSR_TASK_WORKER, 0, 1, 1, 1),
    /* 11: no task: cluster only */
    OK("{\"cluster\":{\"worker\":[\"a:1\"],\"ps\":[\"b:2\"]}}", TSR_TASK_NONE, -1, 0, 1, 1),
    /* 12: a bare cluster map (--cluster file form) */
    OK("{\"worker\":[\"a:1\"],\"ps\":[\"b:2\"]}", TSR_TASK_NONE, -1, 0, 1, 1),
    /* 13: malformed JSON */
    BAD("{\"cluster\":{\"worker\":[\"a:1\"}", TSR_EJSON, "malformed JSON"),
    /* 14: unknown task type */
    BAD("{\"cluster\":{\"worker\":[\"a:1\"]},\"task\":{\"type\":\"trainer\",\"index\":0}}",
        TSR_ECONFIG, "task.type \"trainer\""),
    /* 15: index out of range */
    BAD("{\"cluster\":{\"worker\":[\"a:1\",\"b:1\"]},\"task\":{\"type\":\"worker\",\"index\":2}}",
        TSR_ECONFIG, "task.index 2 is out of range"),
    /* 16: two chiefs */
    BAD("{\"cluster\":{\"chief\":[\"a:1\",\"b:1\"],\"worker\":[\"c:1\"]}}",
        TSR_ECONFIG, "at most one chief"),
    /* 17: two evaluators */
    BAD("{\"cluster\":{\"evaluator\":[\"a:1\",\"b:1\"],\"worker\":[\"c:1\"]}}",
        TSR_ECONFIG, "at most one evaluator"),
    /* 18: empty address */
    BAD("{\"cluster\":{\"worker\":[\"\"]}}", TSR_ECONFIG, "cluster.worker[0]: empty address"),
    /* 19: port out of range */
    BAD("{\"cluster\":{\"ps\":[\"h:70000\"]}}", TSR_ECONFIG, "port \"70000\""),
    /* 20: no port */
    BAD("{\"cluster\":{\"ps\":[\"hostonly\"]}}", TSR_ECONFIG, "expected host:port"),
    /* 21: unknown job name */
    BAD("{\"cluster\":{\"workers\":[\"a:1\"]}}", TSR_ECONFIG, "cluster job \"workers\""),
    /* 22: TF1 master */
    BAD("{\"cluster\":{\"master\":[\"a:1\"]}}", TSR_ECONFIG, "\"master\""),
    /* 23: task type not in the cluster */
    BAD("{\"cluster\":{\"worker\":[\"a:1\"]},\"task\":{\"type\":\"ps\",\"index\":0}}",
        TSR_ECONFIG, "task.type \"ps\" has no job"),
    /* 24: negative index */
    BAD("{\"cluster\":{\"worker\":[\"a:1\"]},\"task\":{\"type\":\"worker\",\"index\":-1}}",
        TSR_ECONFIG, "task.index -1"),
    /* 25: sparse form, index not present */
    BAD("{\"cluster\":{\"worker\":{\"1\":\"a:1\"}},\"task\":{\"type\":\"worker\",\"index\":0}}",
        TSR_ECONFIG, "task.index 0 is not a task of cluster.worker"),
    /* 26: sparse key not a number */
    BAD("{\"cluster\":{\"worker\":{\"one\":\"a:1\"}}}", TSR_ECONFIG, "key \"one\""),
    /* 27: job neither list nor map */
    BAD("{\"cluster\":{\"worker\":\"a:1\"}}", TSR_ECONFIG, "cluster.worker must be"),
    /* 28: address not a string */
    BAD("{\"cluster\":{\"worker\":[42]}}", TSR_ECONFIG, "cluster.worker[0] must be"),
    /* 29: unknown top-level key */
    BAD("{\"cluster\":{\"worker\":[\"a:1\"]},\"tasks\":{}}", TSR_ECONFIG, "unknown key \"tasks\""),
    /* 30: empty cluster */
    BAD("{\"cluster\":{}}", TSR_ECONFIG, "no tasks"),
    /* 31: index as a non-numeric string */
    BAD("{\"cluster\":{\"worker\":[\"a:1\"]},\"task\":{\"type\":\"worker\",\"index\":\"x\"}}",
        TSR_ECONFIG, "task.index \"x\""),
    /* 32: not an object */
    BAD("[1,2]", TSR_ECONFIG, "must be a JSON object"),
    /* 33: empty host */
    BAD("{\"cluster\":{\"worker\":[\":80\"]}}", TSR_ECONFIG, "empty host"),
    /* 34: port zero */
    BAD("{\"cluster\":{\"worker\":[\"a:0\"]}}", TSR_ECONFIG, "port \"0\""),
    /* 35: unbracketed IPv6 */
    BAD("{\"cluster\":{\"worker\":[\"::1:80\"]}}", TSR_ECONFIG, "brackets"),
    /* 36: sparse duplicate index ("01" and "1") */
    BAD("{\"cluster\":{\"worker\":{\"1\":\"a:1\",\"01\":\"b:1\"}}}", TSR_ECONFIG, "appears twice"),
};

static void tf_config_table(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const case_t *c = &cases[i];
    tsr_cluster cl;
    char err[TSR_ERRBUF] = "";
    int rc = tsr_cluster_parse(c->json, "TF_CONFIG", &cl, err, sizeof err);
    if (rc != c->rc) {
      print_error("case %zu: rc %d (%s), want %d\n", i + 1, rc, err, c->rc);
      fail();
    }
    if (c->rc) {
      if (!strstr(err, c->needle)) {
        print_error("case %zu: error \"%s\" lacks \"%s\"\n", i + 1, err,
                    c->needle);
        fail();
      }
      continue;
    }
    assert_int_equal(cl.task_type, c->type);
    assert_int_equal(cl.task_index, c->index);
    assert_int_equal(tsr_cluster_is_chief(&cl), c->is_chief);
    assert_int_equal(cl.n[TSR_TASK_WORKER], c->n_worker);
    assert_int_equal(cl.n[TSR_TASK_PS], c->n_ps);
    tsr_cluster_free(&cl);
  }
  assert_true(sizeof cases / sizeof cases[0] >= 20);
}

static void sparse_form_is_sorted_and_found(void **state) {
  (void)state;
  tsr_cluster cl;
  char err[TSR_ERRBUF];
  assert_int_equal(tsr_cluster_parse("{\"cluster\":{\"worker\":{\"9\":\"z:9\","
                                     "\"2\":\"b:2\"},\"ps\":[\"p:1\"]}}",
                                     NULL, &cl, err, sizeof err), 0);
  assert_int_equal(cl.jobs[TSR_TASK_WORKER][0].index, 2);
  assert_int_equal(cl.jobs[TSR_TASK_WORKER][1].index, 9);
  assert_string_equal(tsr_cluster_find(&cl, TSR_TASK_WORKER, 9)->host, "z");
  assert_null(tsr_cluster_find(&cl, TSR_TASK_WORKER, 3));
  /* no chief job, no worker 0: no chief address */
  assert_null(tsr_cluster_chief(&cl));
  tsr_cluster_free(&cl);
}

static void task_flag_overrides(void **state) {
  (void)state;
  tsr_cluster cl;
  char err[TSR_ERRBUF];
  setenv("TF_CONFIG", "{\"cluster\":{\"worker\":[\"a:1\",\"b:2\"],\"ps\":[\"c:3\"]},"
                      "\"task\":{\"type\":\"worker\",\"index\":0}}", 1);
  assert_int_equal(tsr_cluster_load(NULL, "ps:0", &cl, err, sizeof err), 0);
  assert_int_equal(cl.task_type, TSR_TASK_PS);
  assert_string_equal(tsr_cluster_find(&cl, TSR_TASK_PS, 0)->addr, "c:3");
  tsr_cluster_free(&cl);
  assert_int_equal(tsr_cluster_load(NULL, "ps:4", &cl, err, sizeof err),
                   TSR_ECONFIG);
  assert_non_null(strstr(err, "task.index 4"));
  assert_int_equal(tsr_cluster_load(NULL, "boss:0", &cl, err, sizeof err),
                   TSR_ECONFIG);
  assert_non_null(strstr(err, "\"boss\""));
  assert_int_equal(tsr_cluster_load(NULL, "worker", &cl, err, sizeof err),
                   TSR_ECONFIG);
  assert_non_null(strstr(err, "TYPE:INDEX"));
  assert_int_equal(tsr_cluster_load(NULL, "worker:x", &cl, err, sizeof err),
                   TSR_ECONFIG);
  unsetenv("TF_CONFIG");
  assert_int_equal(tsr_cluster_load(NULL, NULL, &cl, err, sizeof err),
                   TSR_ECONFIG);
  assert_non_null(strstr(err, "TF_CONFIG"));
  assert_int_equal(tsr_cluster_load("/nonexistent/c.json", NULL, &cl, err,
                                    sizeof err), TSR_EIO);
  assert_non_null(strstr(err, "/nonexistent/c.json"));
}

static void ps_training_needs_ps_and_worker(void **state) {
  (void)state;
  tsr_cluster cl;
  char err[TSR_ERRBUF];
  assert_int_equal(tsr_cluster_parse("{\"cluster\":{\"worker\":[\"a:1\"]}}",
                                     NULL, &cl, err, sizeof err), 0);
  assert_int_equal(tsr_cluster_check_ps_training(&cl, err, sizeof err),
                   TSR_ECONFIG);
  assert_non_null(strstr(err, "cluster.ps"));
  tsr_cluster_free(&cl);
  assert_int_equal(tsr_cluster_parse("{\"cluster\":{\"ps\":[\"a:1\"]}}",
                                     NULL, &cl, err, sizeof err), 0);
  assert_int_equal(tsr_cluster_check_ps_training(&cl, err, sizeof err),
                   TSR_ECONFIG);
  assert_non_null(strstr(err, "cluster.worker"));
  tsr_cluster_free(&cl);
}

static void json_round_trip(void **state) {
  (void)state;
  tsr_cluster cl, back;
  char err[TSR_ERRBUF];
  assert_int_equal(tsr_cluster_parse(cases[0].json, NULL, &cl, err,
                                     sizeof err), 0);
  char *s = tsr_cluster_to_json(&cl);
  assert_non_null(s);
  assert_non_null(strstr(s, "\"is_chief\": false"));
  /* the printed form carries extra keys; re-read only its cluster+task */
  assert_int_equal(tsr_cluster_parse("{\"cluster\":{\"chief\":[\"h0:2222\"],"
                                     "\"worker\":[\"h1:2222\",\"h2:2222\"],"
                                     "\"ps\":[\"h3:2222\"]}}", NULL, &back,
                                     err, sizeof err), 0);
  assert_non_null(strstr(s, "h3:2222"));
  free(s);
  tsr_cluster_free(&back);
  tsr_cluster_free(&cl);
}

static void slurm_step_as_tf_resolves_it(void **state) {
  (void)state;
  tsr_cluster cl;
  char err[TSR_ERRBUF];
  unsetenv("TF_CONFIG");
  unsetenv("SLURM_STEP_NODELIST");
  unsetenv("SLURM_STEP_TASKS_PER_NODE");
  setenv("SLURM_JOB_NODELIST", "node[01-02],gpu5", 1);
  setenv("SLURM_TASKS_PER_NODE", "2(x2),1", 1);
  setenv("SLURM_PROCID", "3", 1);
  assert_int_equal(tsr_cluster_from_slurm("ps:2,worker:*", 8888, &cl, err,
                                          sizeof err), 0);
  assert_int_equal(cl.n[TSR_TASK_PS], 2);
  assert_int_equal(cl.n[TSR_TASK_WORKER], 3);
  assert_string_equal(cl.jobs[TSR_TASK_PS][1].addr, "node01:8889");
  assert_string_equal(cl.jobs[TSR_TASK_WORKER][0].addr, "node02:8888");
  assert_string_equal(cl.jobs[TSR_TASK_WORKER][2].addr, "gpu5:8888");
  assert_int_equal(cl.task_type, TSR_TASK_WORKER);
  assert_int_equal(cl.task_index, 1);
  tsr_cluster_free(&cl);
  /* TF's default: all workers; and tsr_cluster_load picks Slurm up */
  setenv("TESSERA_SLURM_PORT_BASE", "9000", 1);
  assert_int_equal(tsr_cluster_load(NULL, NULL, &cl, err, sizeof err), 0);
  assert_int_equal(cl.n[TSR_TASK_WORKER], 5);
  assert_int_equal(cl.task_index, 3);
  assert_string_equal(cl.jobs[TSR_TASK_WORKER][3].addr, "node02:9001");
  tsr_cluster_free(&cl);
  /* the step variables win over the job's */
  setenv("SLURM_STEP_NODELIST", "a[7-8]", 1);
  setenv("SLURM_STEP_TASKS_PER_NODE", "1(x2)", 1);
  setenv("SLURM_PROCID", "0", 1);
  assert_int_equal(tsr_cluster_from_slurm("chief:1,ps:1", 8888, &cl, err,
                                          sizeof err), 0);
  assert_string_equal(cl.jobs[TSR_TASK_PS][0].addr, "a8:8888");
  assert_int_equal(cl.task_type, TSR_TASK_CHIEF);
  tsr_cluster_free(&cl);
  /* errors name the problem */
  assert_int_equal(tsr_cluster_from_slurm("ps:3,worker:1", 8888, &cl, err,
                                          sizeof err), TSR_ECONFIG);
  assert_non_null(strstr(err, "ask for 4 tasks; the step has 2"));
  assert_int_equal(tsr_cluster_from_slurm("boss:*", 8888, &cl, err,
                                          sizeof err), TSR_ECONFIG);
  assert_non_null(strstr(err, "\"boss\""));
  setenv("SLURM_PROCID", "9", 1);
  assert_int_equal(tsr_cluster_from_slurm(NULL, 8888, &cl, err, sizeof err),
                   TSR_ECONFIG);
  assert_non_null(strstr(err, "SLURM_PROCID 9"));
  setenv("SLURM_PROCID", "0", 1);
  setenv("SLURM_STEP_NODELIST", "a[9-7]", 1);
  assert_int_equal(tsr_cluster_from_slurm(NULL, 8888, &cl, err, sizeof err),
                   TSR_ECONFIG);
  assert_non_null(strstr(err, "9-7"));
  setenv("SLURM_STEP_NODELIST", "a[1-3]", 1);
  setenv("SLURM_STEP_TASKS_PER_NODE", "1(x2)", 1);
  assert_int_equal(tsr_cluster_from_slurm(NULL, 8888, &cl, err, sizeof err),
                   TSR_ECONFIG);
  assert_non_null(strstr(err, "covers 2 nodes, the node list has 3"));
  unsetenv("SLURM_PROCID");
  unsetenv("SLURM_JOB_NODELIST");
  unsetenv("SLURM_TASKS_PER_NODE");
  unsetenv("SLURM_STEP_NODELIST");
  unsetenv("SLURM_STEP_TASKS_PER_NODE");
  unsetenv("TESSERA_SLURM_PORT_BASE");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(tf_config_table),
      cmocka_unit_test(sparse_form_is_sorted_and_found),
      cmocka_unit_test(task_flag_overrides),
      cmocka_unit_test(ps_training_needs_ps_and_worker),
      cmocka_unit_test(json_round_trip),
      cmocka_unit_test(slurm_step_as_tf_resolves_it),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
