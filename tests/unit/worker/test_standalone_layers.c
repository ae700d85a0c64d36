/* The shipped jobs of convolutional, normalized and Functional models in
 * the standalone trainer (their own test, so each suite stays short under
 * the sanitizers):
 *  - the Fashion-MNIST CNN (Conv2D, MaxPooling2D, Flatten, Dense, Dropout)
 *    on a few steps: the whole job is a benchmark-sized run (its accuracy on
 *    a local cluster is in the README); 80 steps of 64 already get three
 *    images in four right (0.75 on the build machines), where a broken
 *    convolution stays near chance; skipped where Debian's
 *    dataset-fashion-mnist is not installed;
 *  - BatchNormalization (moving statistics, inference with them) and a
 *    Functional model with inputs placed by feature name, whole jobs, with
 *    bounds near Keras's range on the same split (tf_keras, 5 seeds:
 *    digits accuracy 0.955-0.978, Tessera 0.961; diabetes MSE 3432-3619,
 *    Tessera 3686). */
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
#include <unistd.h>

static int run_shipped(const char *name, const char *const *ovr,
                       wk_train_result *r, char *err, size_t len) {
  const char *s = getenv("TSR_SOURCE_DIR");
  char path[4096];
  snprintf(path, sizeof path, "%s/deploy/jobs/%s", s ? s : ".", name);
  int rc = run_job(path, ovr, r, err, len);
  if (rc == 0)
    print_message("%s: eval loss %.4f, %s %.4f (%lld steps)\n", name,
                  r->eval_loss, r->metric_names[0], r->metrics[0],
                  (long long)r->steps);
  return rc;
}

static void test_fashion_mnist_cnn(void **state) {
  if (access("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz",
             R_OK))
    TSR_SKIP();
  char err[1024];
  const char *ovr[] = {"steps=80", "batch_size=64", NULL};
  wk_train_result r;
  if (run_shipped("fashion_mnist_cnn.json", ovr, &r, err, sizeof err))
    fail_msg("%s", err);
  assert_int_equal(r.eval_examples, 10000);
  assert_true(r.metrics[0] >= 0.70);
}

/* BatchNormalization (moving statistics, inference with them) and a
 * Functional model with inputs placed by feature name, whole jobs, against
 * Keras's range on the same split (tf_keras, 5 seeds: digits accuracy
 * 0.955-0.978; diabetes MSE 3432-3619). */
static void test_digits_cnn_bn(void **state) {
  wk_train_result r;
  char err[1024];
  if (run_shipped("digits_cnn_bn.json", NULL, &r, err, sizeof err))
    fail_msg("%s", err);
  assert_int_equal(r.eval_examples, 359);
  assert_true(r.metrics[0] >= 0.95);
}

static void test_diabetes_functional(void **state) {
  wk_train_result r;
  char err[1024];
  if (run_shipped("diabetes_functional.json", NULL, &r, err, sizeof err))
    fail_msg("%s", err);
  assert_int_equal(r.eval_examples, 88);
  assert_true(r.eval_loss <= 3800.0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fashion_mnist_cnn),
      cmocka_unit_test(test_digits_cnn_bn),
      cmocka_unit_test(test_diabetes_functional),
  };
  return tsr_cmocka_exit(cmocka_run_group_tests(tests, NULL, NULL));
}
