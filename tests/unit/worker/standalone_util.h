/* For the standalone trainer's tests: a job file loaded with its
 * overrides and trained on the CPU, quietly. */
#ifndef TSR_TEST_STANDALONE_UTIL_H
#define TSR_TEST_STANDALONE_UTIL_H

#include "common/job.h"
#include "worker/train.h"

static int run_job(const char *path, const char *const *ovr,
                   wk_train_result *r, char *err, size_t len) {
  tsr_job job;
  int rc = tsr_job_load(path, ovr, &job, err, len);
  if (rc) return rc;
  wk_train_opts o = {.device = KERN_DEVICE_CPU, .quiet = true};
  rc = wk_train_standalone(&job, &o, r, err, len);
  tsr_job_free(&job);
  return rc;
}

#endif /* TSR_TEST_STANDALONE_UTIL_H */
