/* The standalone trainer on real data through the input pipeline, with the
 * job files shipped in deploy/jobs: the Keras example on diabetes (test MSE
 * <= 3500), Dense(64)+Dense(10) on digits (accuracy >= 0.96), an MLP on
 * Fashion-MNIST (>= 0.87; skipped where Debian's dataset-fashion-mnist is
 * not installed), wide_deep on synthetic CTR data (AUC >= 0.7). Bad jobs: a missing label column, NaN in the data, an
 * unsupported layer, shapes that do not chain. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "../cmocka_skip.h"

#include "common/err.h"
#include "common/job.h"
#include "worker/train.h"
#include "standalone_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char src_dir[2048];
static char tmp_dir[256];

static int setup(void **state) {
  const char *s = getenv("TSR_SOURCE_DIR");
  snprintf(src_dir, sizeof src_dir, "%s", s ? s : ".");
  snprintf(tmp_dir, sizeof tmp_dir, "/tmp/tsr_standalone_XXXXXX");
  if (!mkdtemp(tmp_dir)) return -1;
  return 0;
}

static int teardown(void **state) {
  char cmd[512];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_dir);
  return system(cmd) == 0 ? 0 : -1;
}

static void run_shipped(const char *name, wk_train_result *r) {
  char path[4096], err[1024];
  snprintf(path, sizeof path, "%s/deploy/jobs/%s", src_dir, name);
  int rc = run_job(path, NULL, r, err, sizeof err);
  if (rc) fail_msg("%s: %s", name, err);
  assert_true(r->has_eval);
  print_message("%s: eval loss %.4f", name, r->eval_loss);
  for (int i = 0; i < r->n_metrics; i++)
    print_message(", %s %.4f", r->metric_names[i], r->metrics[i]);
  print_message(" (%lld steps, %.0f examples/s)\n", (long long)r->steps,
                r->examples_per_sec);
}

static void test_diabetes_keras_example(void **state) {
  wk_train_result r;
  run_shipped("diabetes.json", &r);
  assert_int_equal(r.eval_examples, 88);
  assert_true(r.eval_loss <= 3500.0);
}

static void test_digits(void **state) {
  wk_train_result r;
  run_shipped("digits.json", &r);
  assert_int_equal(r.eval_examples, 359);
  assert_string_equal(r.metric_names[0], "accuracy");
  assert_true(r.metrics[0] >= 0.96);
}

static void test_fashion_mnist(void **state) {
  if (access("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz",
             R_OK))
    TSR_SKIP();
  wk_train_result r;
  run_shipped("fashion_mnist.json", &r);
  assert_int_equal(r.eval_examples, 10000);
  assert_true(r.metrics[0] >= 0.87);
}

/* wide_deep on the synthetic CTR data (sparse ids through the pipeline,
 * row-sparse gradients, lazy Adam on the touched rows) */
static void test_ctr_wide_deep(void **state) {
  wk_train_result r;
  run_shipped("ctr_wide_deep.json", &r);
  assert_string_equal(r.metric_names[0], "auc");
  assert_true(r.metrics[0] >= 0.7);
}

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

/* A job over a small CSV in the temporary folder. */
static int bad_job(const char *csv, const char *label, const char *model,
                   char *err, size_t len) {
  char p[512], j[4096];
  snprintf(p, sizeof p, "%s/d.csv", tmp_dir);
  write_file(p, csv);
  snprintf(j, sizeof j,
           "{\"model\": %s, \"loss\": \"mse\", \"batch_size\": 4, "
           "\"epochs\": 1, \"data\": {\"train\": {\"format\": \"csv\", "
           "\"paths\": \"d.csv\", \"label\": \"%s\"}}}",
           model, label);
  snprintf(p, sizeof p, "%s/job.json", tmp_dir);
  write_file(p, j);
  wk_train_result r;
  return run_job(p, NULL, &r, err, len);
}

static const char *small_model =
    "{\"class_name\": \"Sequential\", \"config\": {\"layers\": ["
    "{\"class_name\": \"InputLayer\", \"config\": {\"batch_input_shape\": "
    "[null, 2]}}, {\"class_name\": \"Dense\", \"config\": {\"units\": 1}}]}}";
static const char *csv_ok = "a,b,y\n1,2,3\n4,5,6\n7,8,9\n1,1,1\n";

static void test_bad_jobs(void **state) {
  char err[1024] = "";
  if (bad_job(csv_ok, "y", small_model, err, sizeof err))
    fail_msg("the good job fails: %s", err);
  int rc = bad_job(csv_ok, "target", small_model, err, sizeof err);
  print_message("missing label: %s\n", err);
  assert_true(rc < 0);
  assert_non_null(strstr(err, "target"));
  rc = bad_job("a,b,y\n1,2,3\n4,nan,6\n7,8,9\n", "y", small_model, err,
               sizeof err);
  print_message("NaN cell: %s\n", err);
  assert_true(rc < 0);
  assert_true(strstr(err, "NaN") || strstr(err, "nan"));
  assert_true(strstr(err, "row") || strstr(err, "example") ||
              strstr(err, "line"));
  rc = bad_job(csv_ok, "y",
               "{\"class_name\": \"Sequential\", \"config\": {\"layers\": ["
               "{\"class_name\": \"InputLayer\", \"config\": "
               "{\"batch_input_shape\": [null, 2]}}, {\"class_name\": "
               "\"SimpleRNN\", \"config\": {\"units\": 4}}]}}",
               err, sizeof err);
  print_message("unsupported layer: %s\n", err);
  assert_int_equal(rc, TSR_EUNSUPPORTED);
  assert_non_null(strstr(err, "SimpleRNN"));
  assert_non_null(strstr(err, "supported: "));
  rc = bad_job(csv_ok, "y",
               "{\"class_name\": \"Sequential\", \"config\": {\"layers\": ["
               "{\"class_name\": \"InputLayer\", \"config\": "
               "{\"batch_input_shape\": [null, 3]}}, {\"class_name\": "
               "\"Dense\", \"config\": {\"units\": 1}}]}}",
               err, sizeof err);
  print_message("shapes: %s\n", err);
  assert_int_equal(rc, TSR_ESHAPE);
  assert_non_null(strstr(err, "3 feature(s) but the data has 2"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_diabetes_keras_example),
      cmocka_unit_test(test_digits),
      cmocka_unit_test(test_fashion_mnist),
      cmocka_unit_test(test_ctr_wide_deep),
      cmocka_unit_test(test_bad_jobs),
  };
  return tsr_cmocka_exit(cmocka_run_group_tests(tests, setup, teardown));
}
