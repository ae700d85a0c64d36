/* tessera-worker's dense "allreduce" ring when the chief changes, with
 * real tessera-worker processes on loopback and this program as the chief:
 *   newrun  2 workers in a ring; worker 1 runs a closure that worker 0
 *           never gets (the chief died between the two), so worker 1
 *           waits in its first all-reduce for worker 0. A new chief then
 *           configures both for a new run: the old run's ring breaks on
 *           both at once (worker 1's closure fails naming both runs, not
 *           by the ring's stall bound), both configure, and the new run's
 *           closures complete on both.
 *   rewind  2 workers in a ring, trained 2 steps. A dense state set
 *           without `rewind` (a worker that came back) leaves the ring as
 *           it is: the next closures run in it. Then worker 1 runs a
 *           closure worker 0 never gets (a lost PS rewound the run: the
 *           chief forgot the closures in flight and gives none until
 *           every worker took the checkpoint's state), so worker 1 waits
 *           in its all-reduce for worker 0. The checkpoint's state
 *           reaching worker 0 breaks the ring on both at once: worker 1's
 *           closure fails naming the rewind (not by the ring's stall
 *           bound) and takes the state next; closures of a new ring epoch
 *           complete on both from the restored state.
 *   break   2 workers in a ring, trained 2 steps; worker 1 runs a closure
 *           worker 0 never gets (a sync run lost a PS: the chief forgot the
 *           closures in flight and gives none while it recovers), so
 *           worker 1 waits in its all-reduce for worker 0. The chief's
 *           ring break reaching both makes that closure fail at once
 *           naming its reason (not by the ring's stall bound); the dense
 *           state is untouched (2 applies) and closures of a new ring
 *           epoch complete on both.
 * Every wait has a deadline; every worker must exit 0 on SIGTERM.
 */
#include "harness.h"

#include "common/err.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int test_newrun(const char *job_path) {
  h_cluster c;
  H_CHECK(h_start(&c, 0, 2, "async") == 0, "start");
  const char *ovr[] = {"data.train.shuffle_buffer=0", "batch_size=16",
                       "dense=\"allreduce\"", NULL};
  H_CHECK(h_load_job(&c, job_path, ovr, 0) == 0, "job");
  if (h_configure_all(&c, 61, 30000)) return 1;
  /* the old chief's last closure reaches worker 1 only */
  h_result lone;
  H_CHECK(h_run_start(&c, 1, 2, 5, false, &lone) == 0, "closure on worker 1");
  h_spin(&c, 500);
  H_CHECK(!lone.done, "worker 1's closure ended without worker 0: %s",
          lone.msg);
  /* a new chief: run 62. Worker 1's configure must not wait behind the
   * old closure for the ring's stall bound (60 s in a cluster). */
  c.group_epoch++;
  if (h_configure_all(&c, 62, 15000)) return 1;
  int rc = h_wait(&c, &lone, 5000);
  fprintf(stderr, "newrun: the old run's closure: %s: %s\n",
          tsr_err_name(rc), lone.msg);
  H_CHECK(rc != 0 && strstr(lone.msg, "run 61 is over") &&
              strstr(lone.msg, "run 62"),
          "the old closure fails naming both runs: %s", lone.msg);
  h_result_free(&lone);
  /* the new run's ring works */
  h_result r[2];
  for (int w = 0; w < 2; w++)
    H_CHECK(h_run_start(&c, w, 3 + (uint64_t)w, 4, false, &r[w]) == 0, "run");
  for (int w = 0; w < 2; w++) {
    rc = h_wait(&c, &r[w], 60000);
    H_CHECK(rc == 0, "run 62 closure on worker %d: %s", w, r[w].msg);
    Tessera__Worker__RunResponse *o =
        tessera__worker__run_response__unpack(NULL, r[w].meta_len,
                                              r[w].meta);
    H_CHECK(o && o->steps_done == 4 && o->allreduce_ops >= 4,
            "worker %d: %lld steps, %llu all-reduces", w,
            o ? (long long)o->steps_done : -1LL,
            o ? (unsigned long long)o->allreduce_ops : 0ULL);
    tessera__worker__run_response__free_unpacked(o, NULL);
    h_result_free(&r[w]);
  }
  H_CHECK(h_stop(&c) == 0, "clean stop");
  return 0;
}

/* Closure `id` of `steps` steps on both workers in the ring they are in;
 * both must complete them. */
static int run_both(h_cluster *c, uint64_t id, int64_t steps) {
  h_result r[2];
  for (int w = 0; w < 2; w++)
    H_CHECK(h_run_start(c, w, id, steps, false, &r[w]) == 0, "run");
  for (int w = 0; w < 2; w++) {
    int rc = h_wait(c, &r[w], 60000);
    H_CHECK(rc == 0, "closure %llu on worker %d: %s",
            (unsigned long long)id, w, r[w].msg);
    h_result_free(&r[w]);
  }
  return 0;
}

static int test_rewind(const char *job_path) {
  h_cluster c;
  H_CHECK(h_start(&c, 0, 2, "async") == 0, "start");
  const char *ovr[] = {"data.train.shuffle_buffer=0", "batch_size=16",
                       "dense=\"allreduce\"", NULL};
  H_CHECK(h_load_job(&c, job_path, ovr, 0) == 0, "job");
  if (h_configure_all(&c, 71, 30000)) return 1;
  if (run_both(&c, 1, 2)) return 1;
  /* the "checkpoint": worker 0's state at 2 applies */
  h_result st;
  Tessera__Worker__DenseResponse *state;
  H_CHECK(h_dense_state(&c, 0, &st, &state) == 0, "dense state");
  H_CHECK(state->step == 2 && st.payload_len > 0,
          "the state after 2 steps: %lld applies, %zu bytes",
          (long long)state->step, st.payload_len);
  /* a state set without rewind: the ring holds */
  h_result set[2];
  for (int w = 0; w < 2; w++) {
    H_CHECK(h_dense_set_start(&c, w, state, st.payload, st.payload_len,
                              false, &set[w]) == 0, "dense set");
    int rc = h_wait(&c, &set[w], 10000);
    H_CHECK(rc == 0, "worker %d takes the state: %s", w, set[w].msg);
    h_result_free(&set[w]);
  }
  if (run_both(&c, 2, 2)) return 1;
  /* the closure in flight that worker 0 never gets */
  h_result lone;
  H_CHECK(h_run_start(&c, 1, 3, 3, false, &lone) == 0, "closure on worker 1");
  h_spin(&c, 500);
  H_CHECK(!lone.done, "worker 1's closure ended without worker 0: %s",
          lone.msg);
  /* the rewind reaches worker 0, idle, first */
  H_CHECK(h_dense_set_start(&c, 0, state, st.payload, st.payload_len, true,
                            &set[0]) == 0, "dense set");
  int rc = h_wait(&c, &set[0], 10000);
  H_CHECK(rc == 0, "worker 0 takes the rewound state: %s", set[0].msg);
  h_result_free(&set[0]);
  /* worker 1's closure fails now, not by the ring's stall bound */
  rc = h_wait(&c, &lone, 5000);
  fprintf(stderr, "rewind: the closure in flight: %s: %s\n",
          tsr_err_name(rc), lone.msg);
  H_CHECK(rc != 0 && strstr(lone.msg, "rewinds"),
          "the closure in flight fails naming the rewind: %s", lone.msg);
  h_result_free(&lone);
  H_CHECK(h_dense_set_start(&c, 1, state, st.payload, st.payload_len, true,
                            &set[1]) == 0, "dense set");
  rc = h_wait(&c, &set[1], 10000);
  H_CHECK(rc == 0, "worker 1 takes the rewound state: %s", set[1].msg);
  h_result_free(&set[1]);
  tessera__worker__dense_response__free_unpacked(state, NULL);
  h_result_free(&st);
  /* the next closures re-form the ring and run from the restored state */
  c.group_epoch++;
  h_result r[2];
  for (int w = 0; w < 2; w++)
    H_CHECK(h_run_ring_start(&c, w, 4, 4, 0, &r[w]) == 0, "run");
  for (int w = 0; w < 2; w++) {
    rc = h_wait(&c, &r[w], 60000);
    H_CHECK(rc == 0, "closure of the new ring on worker %d: %s", w,
            r[w].msg);
    h_result_free(&r[w]);
  }
  float *d[2];
  size_t n[2];
  int64_t applies[2];
  for (int w = 0; w < 2; w++)
    H_CHECK(h_dense(&c, w, &d[w], &n[w], &applies[w]) == 0, "dense");
  H_CHECK(applies[0] == 6 && applies[1] == 6,
          "2 restored applies and 4 since: %lld and %lld",
          (long long)applies[0], (long long)applies[1]);
  H_CHECK(n[0] == n[1] && memcmp(d[0], d[1], n[0] * sizeof(float)) == 0,
          "both workers hold the same dense values");
  free(d[0]);
  free(d[1]);
  H_CHECK(h_stop(&c) == 0, "clean stop");
  return 0;
}

static int test_break(const char *job_path) {
  h_cluster c;
  H_CHECK(h_start(&c, 0, 2, "async") == 0, "start");
  const char *ovr[] = {"data.train.shuffle_buffer=0", "batch_size=16",
                       "dense=\"allreduce\"", NULL};
  H_CHECK(h_load_job(&c, job_path, ovr, 0) == 0, "job");
  if (h_configure_all(&c, 81, 30000)) return 1;
  if (run_both(&c, 1, 2)) return 1;
  h_result lone;
  H_CHECK(h_run_start(&c, 1, 2, 3, false, &lone) == 0, "closure on worker 1");
  h_spin(&c, 500);
  H_CHECK(!lone.done, "worker 1's closure ended without worker 0: %s",
          lone.msg);
  h_result br[2];
  for (int w = 0; w < 2; w++) {
    H_CHECK(h_ring_break_start(&c, w, "ps:1 was lost", &br[w]) == 0,
            "ring break");
    int rc = h_wait(&c, &br[w], 5000);
    H_CHECK(rc == 0, "worker %d breaks its ring: %s", w, br[w].msg);
    h_result_free(&br[w]);
  }
  int rc = h_wait(&c, &lone, 5000);
  fprintf(stderr, "break: the closure in flight: %s: %s\n",
          tsr_err_name(rc), lone.msg);
  H_CHECK(rc != 0 && strstr(lone.msg, "ps:1 was lost"),
          "the closure in flight fails naming the break: %s", lone.msg);
  h_result_free(&lone);
  /* nothing else changed: the next closures form a new ring */
  c.group_epoch++;
  h_result r[2];
  for (int w = 0; w < 2; w++)
    H_CHECK(h_run_ring_start(&c, w, 3, 4, 0, &r[w]) == 0, "run");
  for (int w = 0; w < 2; w++) {
    rc = h_wait(&c, &r[w], 60000);
    H_CHECK(rc == 0, "closure of the new ring on worker %d: %s", w,
            r[w].msg);
    h_result_free(&r[w]);
  }
  float *d[2];
  size_t n[2];
  int64_t applies[2];
  for (int w = 0; w < 2; w++)
    H_CHECK(h_dense(&c, w, &d[w], &n[w], &applies[w]) == 0, "dense");
  H_CHECK(applies[0] == 6 && applies[1] == 6,
          "2 applies before the break and 4 after: %lld and %lld",
          (long long)applies[0], (long long)applies[1]);
  H_CHECK(n[0] == n[1] && memcmp(d[0], d[1], n[0] * sizeof(float)) == 0,
          "both workers hold the same dense values");
  free(d[0]);
  free(d[1]);
  H_CHECK(h_stop(&c) == 0, "clean stop");
  return 0;
}

int main(int argc, char **argv) {
  char job_path[1024];
  if (!h_main_start(argc, argv, "test_worker_ring newrun|rewind|break", job_path,
                    sizeof job_path))
    return 2;
  if (strcmp(argv[1], "newrun") == 0) return test_newrun(job_path);
  if (strcmp(argv[1], "rewind") == 0) return test_rewind(job_path);
  if (strcmp(argv[1], "break") == 0) return test_break(job_path);
  fprintf(stderr, "unknown test %s\n", argv[1]);
  return 2;
}
