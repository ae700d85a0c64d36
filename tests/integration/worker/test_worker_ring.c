/* tessera-worker's dense "allreduce" ring when the chief changes, with
 * real tessera-worker processes on loopback and this program as the chief:
 *   newrun  2 workers in a ring; worker 1 runs a closure that worker 0
 *           never gets (the chief died between the two), so worker 1
 *           waits in its first all-reduce for worker 0. A new chief then
 *           configures both for a new run: the old run's ring breaks on
 *           both at once (worker 1's closure fails naming both runs, not
 *           by the ring's stall bound), both configure, and the new run's
 *           closures complete on both.
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

int main(int argc, char **argv) {
  char job_path[1024];
  if (!h_main_start(argc, argv, "test_worker_ring newrun", job_path,
                    sizeof job_path))
    return 2;
  if (strcmp(argv[1], "newrun") == 0) return test_newrun(job_path);
  fprintf(stderr, "unknown test %s\n", argv[1]);
  return 2;
}
