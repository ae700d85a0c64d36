/* Losses and metrics added for Keras parity: huber (with delta) and kld on
 * the CPU kernels against float64 formulas and central differences, the
 * serialized loss and metric objects of Keras, precision, recall, top-k
 * and multi-class AUC on a hand-computed example, and binary
 * cross-entropy's label check. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/err.h"
#include "common/job.h"
#include "kernels/kern.h"
#include "worker/metrics.h"
#include "worker/model_exec.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double ref_huber(const float *p, const float *y, int d, double delta) {
  double L = 0;
  for (int j = 0; j < d; j++) {
    double e = (double)p[j] - y[j];
    L += fabs(e) <= delta ? 0.5 * e * e : delta * (fabs(e) - 0.5 * delta);
  }
  return L / d;
}

static double ref_kld(const float *p, const float *y, int d) {
  double L = 0;
  for (int j = 0; j < d; j++) {
    double t = fmin(fmax(y[j], 1e-7), 1), q = fmin(fmax(p[j], 1e-7), 1);
    L += t * log(t / q);
  }
  return L;
}

static void huber_and_kld_kernels(void **state) {
  (void)state;
  kern_opts ko = {.device = KERN_DEVICE_CPU};
  kern_ctx *c;
  char err[256];
  assert_int_equal(kern_open(&ko, &c, err, sizeof err), 0);
  enum { N = 5, D = 4 };
  float p[N * D], y[N * D], ex[N], g[N * D];
  for (int i = 0; i < N * D; i++) {
    p[i] = (float)(0.05 + 0.9 * fabs(sin(1.7 * i)));
    y[i] = (float)(0.9 * fabs(cos(0.9 * i)));
  }
  p[3] = 3.0f; /* |e| > delta: the linear branch */
  for (int kind = 0; kind < 2; kind++) {
    kern_loss k = kind ? KERN_LOSS_KLD : KERN_LOSS_HUBER;
    float delta = 0.4f;
    assert_int_equal(kern_loss_eval_p(c, k, delta, p, y, N, D, 1.0f, ex, g),
                     0);
    for (int i = 0; i < N; i++) {
      double want = kind ? ref_kld(p + i * D, y + i * D, D)
                         : ref_huber(p + i * D, y + i * D, D, delta);
      if (fabs(ex[i] - want) > 1e-5 * (1 + fabs(want)))
        fail_msg("%s row %d: %g, want %g", kind ? "kld" : "huber", i, ex[i],
                 want);
      for (int j = 0; j < D; j++) {
        float q[D];
        memcpy(q, p + i * D, sizeof q);
        double h = 1e-3;
        q[j] = (float)(p[i * D + j] + h);
        double up = kind ? ref_kld(q, y + i * D, D)
                         : ref_huber(q, y + i * D, D, delta);
        q[j] = (float)(p[i * D + j] - h);
        double dn = kind ? ref_kld(q, y + i * D, D)
                         : ref_huber(q, y + i * D, D, delta);
        double fd = (up - dn) / (2 * h);
        if (fabs(g[i * D + j] - fd) > 2e-3 * (1 + fabs(fd)))
          fail_msg("%s row %d col %d: gradient %g, central difference %g",
                   kind ? "kld" : "huber", i, j, g[i * D + j], fd);
      }
    }
  }
  /* param <= 0 is huber's default delta 1, as kern_loss_eval gives */
  float ex2[N];
  assert_int_equal(kern_loss_eval_p(c, KERN_LOSS_HUBER, 0, p, y, N, D, 1.0f,
                                    ex, NULL), 0);
  assert_int_equal(kern_loss_eval(c, KERN_LOSS_HUBER, p, y, N, D, 1.0f, ex2,
                                  NULL), 0);
  for (int i = 0; i < N; i++) {
    assert_true(ex[i] == ex2[i]);
    assert_true(fabs(ex[i] - ref_huber(p + i * D, y + i * D, D, 1.0)) < 1e-5);
  }
  kern_close(c);
}

static const char *mlp =
    "{\"class_name\": \"Sequential\", \"config\": {\"layers\": ["
    "{\"class_name\": \"InputLayer\", \"config\": {\"batch_shape\": [null, 4]}},"
    "{\"class_name\": \"Dense\", \"config\": {\"units\": %d, \"activation\": "
    "\"%s\"}}]}}";

static int build(int units, const char *act, const char *loss,
                 char **metrics, int nm, tsr_model **m, char *err,
                 size_t len) {
  char text[1024];
  snprintf(text, sizeof text, mlp, units, act);
  json_error_t je;
  json_t *j = json_loads(text, 0, &je);
  if (!j) fail_msg("test JSON: %s", je.text);
  int rc = tsr_model_build(j, loss, metrics, nm, NULL, m, err, len);
  json_decref(j);
  return rc;
}

static void loss_objects(void **state) {
  (void)state;
  struct {
    const char *json, *canon;
  } ok[] = {
      {"{\"module\": \"keras.losses\", \"class_name\": \"Huber\", \"config\": "
       "{\"name\": \"huber_loss\", \"reduction\": \"sum_over_batch_size\", "
       "\"delta\": 2.5}, \"registered_name\": null}", "huber@delta=2.5"},
      {"{\"class_name\": \"Huber\", \"config\": {\"delta\": 1.0}}", "huber"},
      {"{\"class_name\": \"CategoricalCrossentropy\", \"config\": "
       "{\"from_logits\": true, \"label_smoothing\": 0.0, \"axis\": -1, "
       "\"reduction\": \"sum_over_batch_size\", \"name\": "
       "\"categorical_crossentropy\"}}", "categorical_crossentropy_from_logits"},
      {"{\"class_name\": \"KLDivergence\", \"config\": {\"name\": "
       "\"kl_divergence\", \"reduction\": \"auto\"}}", "kld"},
  };
  char out[256], err[512];
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
    json_t *v = json_loads(ok[i].json, 0, NULL);
    assert_non_null(v);
    if (tsr_loss_canon(v, out, sizeof out, err, sizeof err))
      fail_msg("case %zu: %s", i, err);
    assert_string_equal(out, ok[i].canon);
    json_decref(v);
  }
  struct {
    const char *json, *needle;
  } bad[] = {
      {"{\"class_name\": \"CategoricalCrossentropy\", \"config\": "
       "{\"label_smoothing\": 0.1}}", "label_smoothing = 0.1 is not supported"},
      {"{\"class_name\": \"MeanSquaredError\", \"config\": {\"reduction\": "
       "\"sum\"}}", "reduction = \"sum\" is not supported"},
      {"{\"class_name\": \"Poisson\", \"config\": {}}",
       "class 'Poisson' is not supported (supported: MeanSquaredError"},
      {"{\"class_name\": \"Huber\", \"config\": {\"delt\": 1}}",
       "config.delt: unknown key; did you mean \"delta\"?"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    json_t *v = json_loads(bad[i].json, 0, NULL);
    int rc = tsr_loss_canon(v, out, sizeof out, err, sizeof err);
    json_decref(v);
    if (rc == 0 || !strstr(err, bad[i].needle))
      fail_msg("bad case %zu: rc %d \"%s\" lacks \"%s\"", i, rc, err,
               bad[i].needle);
  }
  /* the model takes the canonical text */
  tsr_model *m = NULL;
  assert_int_equal(build(1, "linear", "huber@delta=2.5", NULL, 0, &m, err,
                         sizeof err), 0);
  tsr_model_free(m);
  assert_int_equal(build(3, "softmax", "kld", NULL, 0, &m, err, sizeof err),
                   0);
  tsr_model_free(m);
  assert_int_equal(build(1, "sigmoid", "kld", NULL, 0, &m, err, sizeof err),
                   TSR_ESHAPE);
  assert_non_null(strstr(err, "at least 2 units"));
  assert_int_equal(build(3, "linear", "huber", NULL, 0, &m, err, sizeof err),
                   TSR_ESHAPE);
  assert_int_equal(build(1, "linear", "poisson", NULL, 0, &m, err,
                         sizeof err), TSR_EUNSUPPORTED);
  assert_non_null(strstr(err, "huber, kld"));
}

static void metrics_by_hand(void **state) {
  (void)state;
  /* 4 examples, 3 classes (worked out in the comments) */
  const float pred[12] = {0.7f, 0.2f, 0.1f,  0.3f, 0.6f, 0.1f,
                          0.2f, 0.2f, 0.6f,  0.1f, 0.5f, 0.4f};
  const float lab[4] = {0, 2, 2, 1};
  json_t *v = json_loads("{\"class_name\": \"TopKCategoricalAccuracy\", "
                         "\"config\": {\"k\": 2, \"name\": \"top2\"}}", 0,
                         NULL);
  char topk[128], err[512];
  assert_int_equal(tsr_metric_canon(v, topk, sizeof topk, err, sizeof err), 0);
  json_decref(v);
  assert_string_equal(topk, "top_k_categorical_accuracy@k=2");
  char *names[] = {"accuracy", "precision", "recall", topk, "auc",
                   "auc@multi_label"};
  tsr_model *m = NULL;
  assert_int_equal(build(3, "softmax", "sparse_categorical_crossentropy",
                         names, 6, &m, err, sizeof err), 0);
  wk_metrics *mt;
  assert_int_equal(wk_metrics_open(m, &mt), 0);
  /* in two batches: the AUC keeps every score */
  assert_int_equal(wk_metrics_add(mt, pred, lab, 1, 0.5), 0);
  assert_int_equal(wk_metrics_add(mt, pred + 3, lab + 1, 3, 1.5), 0);
  double loss, val[6];
  wk_metrics_result(mt, &loss, val);
  assert_true(fabs(loss - 0.5) < 1e-12);
  /* argmax hits e0, e2, e3 */
  assert_true(fabs(val[0] - 0.75) < 1e-12);
  /* scores > 0.5: e0c0 (true), e1c1 (false), e2c2 (true) */
  assert_true(fabs(val[1] - 2.0 / 3) < 1e-12);
  /* missed: e1c2 (0.1), e3c1 (0.5 is not above the threshold) */
  assert_true(fabs(val[2] - 0.5) < 1e-12);
  /* top 2: all but e1, whose class has the smallest score */
  assert_true(fabs(val[3] - 0.75) < 1e-12);
  /* pooled one-vs-rest: 4 positive and 8 negative pairs, 23.5 of 32 won */
  assert_true(fabs(val[4] - 23.5 / 32) < 1e-12);
  /* per class: 1, 2/3, 2.5/4 */
  assert_true(fabs(val[5] - (1 + 2.0 / 3 + 0.625) / 3) < 1e-12);
  wk_metrics_close(mt);
  tsr_model_free(m);
  /* refused with a reason */
  v = json_loads("{\"class_name\": \"Precision\", \"config\": {\"top_k\": 3}}",
                 0, NULL);
  assert_int_equal(tsr_metric_canon(v, topk, sizeof topk, err, sizeof err),
                   TSR_EUNSUPPORTED);
  assert_non_null(strstr(err, "top_k = 3 is not supported"));
  json_decref(v);
  char *bad[] = {"f1_score"};
  assert_int_equal(build(3, "softmax", "sparse_categorical_crossentropy", bad,
                         1, &m, err, sizeof err), TSR_EUNSUPPORTED);
  assert_non_null(strstr(err, "precision, recall"));
}

static void bce_labels_checked(void **state) {
  (void)state;
  tsr_model *m = NULL;
  char err[512];
  assert_int_equal(build(1, "sigmoid", "binary_crossentropy", NULL, 0, &m,
                         err, sizeof err), 0);
  kern_opts ko = {.device = KERN_DEVICE_CPU};
  kern_ctx *c;
  assert_int_equal(kern_open(&ko, &c, err, sizeof err), 0);
  wk_exec *e;
  assert_int_equal(wk_exec_open(m, c, 8, KERN_F32, &e, err, sizeof err), 0);
  float x[12] = {0}, y[3] = {0, 1, 2};
  wk_batch b = {.n = 3, .n_dense = 4, .x = x, .y = y};
  assert_int_equal(wk_exec_prepare(e, &b, 0, 3, NULL, err, sizeof err),
                   TSR_ERANGE);
  assert_non_null(strstr(err, "example 2: label 2 is outside [0, 1]"));
  y[2] = 0.25f; /* soft labels are fine, as in Keras */
  assert_int_equal(wk_exec_prepare(e, &b, 0, 3, NULL, err, sizeof err), 0);
  wk_exec_close(e);
  kern_close(c);
  tsr_model_free(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(huber_and_kld_kernels),
      cmocka_unit_test(loss_objects),
      cmocka_unit_test(metrics_by_hand),
      cmocka_unit_test(bce_labels_checked),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
