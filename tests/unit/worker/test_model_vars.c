/* The variable list the chief's coordinator derives from a job (the model
 * description alone: no data, no executor) equals the one a worker trains:
 * the model built against the schema of the job's training input and
 * bound to an executor on the CPU. Every shipped job (every .json in deploy/jobs)
 * and the jobs of the Keras models in tests/data, every field of every
 * variable (name, shape, sizes, dtype, kind, initializer and its fans,
 * trainable, momentum, regularizers) and the update rule the chief gives
 * the PS. A job whose training data is not on this machine is named and
 * passed over; none checked at all is a skip (77). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/job.h"
#include "common/var.h"
#include "kernels/kern.h"
#include "kernels/optim.h"
#include "worker/input.h"
#include "worker/model_exec.h"

/* Compares two lists field by field; fills why with the first difference. */
static int same_vars(const tsr_var *a, size_t na, const tsr_var *b, size_t nb,
                     char *why, size_t len) {
  if (na != nb) {
    snprintf(why, len, "%zu variables derived, %zu built", na, nb);
    return 0;
  }
  for (size_t i = 0; i < na; i++) {
    const tsr_var *x = &a[i], *y = &b[i];
    const char *f = NULL;
    if (strcmp(x->name, y->name)) f = "name";
    else if (x->rank != y->rank) f = "rank";
    else if (memcmp(x->shape, y->shape, sizeof x->shape)) f = "shape";
    else if (x->numel != y->numel || x->row_dim != y->row_dim) f = "sizes";
    else if (x->dtype != y->dtype) f = "dtype";
    else if (x->kind != y->kind) f = "kind";
    else if (x->init.kind != y->init.kind || x->init.a != y->init.a ||
             x->init.b != y->init.b || x->init.fan_in != y->init.fan_in ||
             x->init.fan_out != y->init.fan_out)
      f = "initializer";
    else if (x->trainable != y->trainable || x->momentum != y->momentum)
      f = "trainable/momentum";
    else if (x->l1 != y->l1 || x->l2 != y->l2) f = "regularizer";
    if (f) {
      snprintf(why, len, "variable %zu (%s / %s): %s differs", i, x->name,
               y->name, f);
      return 0;
    }
  }
  return 1;
}

/* One job: 1 checked, 0 passed over (no data here); fails the test on a
 * difference. */
static int check_job(const char *path) {
  char err[1024] = "";
  tsr_job job;
  if (tsr_job_load(path, NULL, &job, err, sizeof err)) {
    print_error("%s: %s\n", path, err);
    fail();
  }
  /* the coordinator's list: the job's model alone */
  tsr_model *desc = NULL;
  if (tsr_model_from_job(&job, NULL, &desc, err, sizeof err)) {
    print_error("%s: model description: %s\n", path, err);
    fail();
  }
  /* the worker's: against its training input's schema, with an executor */
  wk_input_opts io = {.worker_index = 0, .num_workers = 1,
                      .batch_size = job.batch_size, .epochs = 1};
  wk_input *in = NULL;
  if (wk_input_open(&job, WK_SPLIT_TRAIN, &io, &in, err, sizeof err)) {
    printf("passed over %s: its training data cannot be read here (%s)\n",
           path, err);
    tsr_model_free(desc);
    tsr_job_free(&job);
    return 0;
  }
  tsr_model *m = NULL;
  int rc = tsr_model_from_job(&job, wk_input_get_schema(in), &m, err,
                              sizeof err);
  wk_input_close(in);
  if (rc) {
    print_error("%s: worker model: %s\n", path, err);
    fail();
  }
  kern_opts ko = {.device = KERN_DEVICE_CPU};
  kern_ctx *ctx = NULL;
  wk_exec *ex = NULL;
  assert_int_equal(kern_open(&ko, &ctx, err, sizeof err), 0);
  if (wk_exec_open(m, ctx, job.batch_size, KERN_F32, &ex, err, sizeof err)) {
    print_error("%s: executor: %s\n", path, err);
    fail();
  }
  const tsr_var *a, *b;
  size_t na, nb;
  tsr_model_variables(desc, &a, &na);
  tsr_model_variables(m, &b, &nb);
  char why[512] = "";
  if (!same_vars(a, na, b, nb, why, sizeof why)) {
    print_error("%s: %s\n", path, why);
    fail();
  }
  assert_true(na > 0);
  for (size_t i = 0; i < na; i++) {
    tsr_optim_spec oa, ob;
    tsr_var_optimizer(&a[i], &job.optimizer, &oa);
    tsr_var_optimizer(&b[i], &job.optimizer, &ob);
    assert_memory_equal(&oa, &ob, sizeof oa);
  }
  printf("%s: %zu variables agree\n", path, na);
  wk_exec_close(ex);
  kern_close(ctx);
  tsr_model_free(m);
  tsr_model_free(desc);
  tsr_job_free(&job);
  return 1;
}

static int checked, seen;

static void check_glob(const char *pattern) {
  glob_t g;
  if (glob(pattern, 0, NULL, &g) != 0) {
    print_error("no file matches %s\n", pattern);
    fail();
  }
  for (size_t i = 0; i < g.gl_pathc; i++) {
    seen++;
    checked += check_job(g.gl_pathv[i]);
  }
  globfree(&g);
}

static void shipped_jobs(void **state) {
  (void)state;
  const char *src = getenv("TSR_SOURCE_DIR");
  if (!src) src = ".";
  char pat[4096];
  snprintf(pat, sizeof pat, "%s/deploy/jobs/*.json", src);
  check_glob(pat);
  snprintf(pat, sizeof pat, "%s/tests/data/*_job.json", src);
  check_glob(pat);
  printf("%d of %d jobs checked\n", checked, seen);
}

/* The checker itself tells lists apart: one field changed at a time. */
static void a_difference_is_seen(void **state) {
  (void)state;
  static const int64_t shape[2] = {3, 4};
  tsr_var a, b;
  char why[256];
  assert_int_equal(tsr_var_set(&a, "d/kernel", 2, shape, TSR_DT_FLOAT32,
                               TSR_VAR_DENSE, NULL, 0), 0);
  b = a;
  assert_true(same_vars(&a, 1, &b, 1, why, sizeof why));
  b.shape[1] = 5;
  assert_false(same_vars(&a, 1, &b, 1, why, sizeof why));
  assert_non_null(strstr(why, "shape"));
  b = a;
  b.init.fan_in = 7;
  assert_false(same_vars(&a, 1, &b, 1, why, sizeof why));
  assert_non_null(strstr(why, "initializer"));
  b = a;
  b.kind = TSR_VAR_ROW_SPARSE;
  assert_false(same_vars(&a, 1, &b, 1, why, sizeof why));
  assert_false(same_vars(&a, 1, &b, 0, why, sizeof why));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(a_difference_is_seen),
      cmocka_unit_test(shipped_jobs),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  if (rc == 0 && checked == 0) return 77;
  return rc;
}
