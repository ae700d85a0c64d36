/* The optimizer as Keras writes it: get_config() output of Keras 3 and
 * tf_keras pasted as it is (null values meaning the default), the
 * serialize() form with a learning-rate schedule, the legacy decay, and
 * the options refused with a message saying they are not supported. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <string.h>

#include "common/err.h"
#include "common/job.h"

static int parse(const char *text, tsr_optim_spec *o, char *err,
                 size_t errlen) {
  json_error_t je;
  json_t *v = json_loads(text, JSON_DECODE_ANY, &je);
  if (!v) fail_msg("bad test JSON: %s", je.text);
  int rc = tsr_optim_parse(v, o, err, errlen);
  json_decref(v);
  return rc;
}

static void keras3_get_config_as_is(void **state) {
  (void)state;
  /* keras.optimizers.AdamW(learning_rate=2e-3).get_config(), Keras 3.6 */
  const char *cfg =
      "{\"name\": \"adamw\", \"learning_rate\": 0.0020000000949949026, "
      "\"weight_decay\": 0.004, \"clipnorm\": null, \"global_clipnorm\": "
      "null, \"clipvalue\": null, \"use_ema\": false, \"ema_momentum\": 0.99, "
      "\"ema_overwrite_frequency\": null, \"loss_scale_factor\": null, "
      "\"gradient_accumulation_steps\": null, \"beta_1\": 0.9, \"beta_2\": "
      "0.999, \"epsilon\": 1e-07, \"amsgrad\": false}";
  tsr_optim_spec o;
  char err[256] = "";
  assert_int_equal(parse(cfg, &o, err, sizeof err), 0);
  assert_int_equal(o.kind, TSR_OPT_ADAMW);
  assert_true(fabs(o.learning_rate - 0.002) < 1e-9);
  assert_true(o.weight_decay == 0.004 && o.clipnorm == 0);
  /* tf_keras 2.x Nadam, with jit_compile and is_legacy_optimizer */
  const char *tfk =
      "{\"name\": \"Nadam\", \"weight_decay\": null, \"clipnorm\": 1.0, "
      "\"global_clipnorm\": null, \"clipvalue\": null, \"use_ema\": false, "
      "\"ema_momentum\": 0.99, \"ema_overwrite_frequency\": null, "
      "\"jit_compile\": true, \"is_legacy_optimizer\": false, "
      "\"learning_rate\": 0.001, \"beta_1\": 0.9, \"beta_2\": 0.999, "
      "\"epsilon\": 1e-07}";
  assert_int_equal(parse(tfk, &o, err, sizeof err), 0);
  assert_int_equal(o.kind, TSR_OPT_NADAM);
  assert_true(o.clipnorm == 1.0 && o.weight_decay == 0);
  /* null for a value that has a default: the default */
  assert_int_equal(parse("{\"name\": \"SGD\", \"momentum\": null, "
                         "\"nesterov\": null, \"learning_rate\": null}",
                         &o, err, sizeof err), 0);
  assert_true(o.kind == TSR_OPT_SGD && o.learning_rate == 0.01);
  /* Adamax and the legacy (tf_keras < 2.11) Adam with decay */
  assert_int_equal(parse("\"Adamax\"", &o, err, sizeof err), 0);
  assert_int_equal(o.kind, TSR_OPT_ADAMAX);
  assert_int_equal(parse("{\"name\": \"Adam\", \"learning_rate\": 0.01, "
                         "\"decay\": 0.5, \"beta_1\": 0.9, \"beta_2\": 0.999,"
                         " \"epsilon\": 1e-07, \"amsgrad\": false}",
                         &o, err, sizeof err), 0);
  assert_int_equal(o.schedule.kind, TSR_LR_INVERSE_TIME);
  assert_true(fabs(tsr_optim_lr(&o, 4) - 0.01 / 3.0) < 1e-15);
}

static void serialized_with_schedule(void **state) {
  (void)state;
  /* keras.optimizers.serialize(SGD(ExponentialDecay(...))) */
  const char *s =
      "{\"module\": \"keras.optimizers\", \"class_name\": \"SGD\", "
      "\"config\": {\"name\": \"my_sgd\", \"learning_rate\": {\"module\": "
      "\"keras.optimizers.schedules\", \"class_name\": \"ExponentialDecay\", "
      "\"config\": {\"initial_learning_rate\": 0.1, \"decay_steps\": 100, "
      "\"decay_rate\": 0.5, \"staircase\": true, \"name\": "
      "\"ExponentialDecay\"}, \"registered_name\": null}, \"momentum\": 0.9, "
      "\"nesterov\": false, \"weight_decay\": null}, \"registered_name\": "
      "null}";
  tsr_optim_spec o;
  char err[256] = "";
  assert_int_equal(parse(s, &o, err, sizeof err), 0);
  assert_int_equal(o.kind, TSR_OPT_SGD);
  assert_true(o.momentum == 0.9);
  assert_int_equal(o.schedule.kind, TSR_LR_EXPONENTIAL);
  assert_true(tsr_optim_lr(&o, 99) == 0.1 && tsr_optim_lr(&o, 100) == 0.05);
  const char *pw =
      "{\"name\": \"adam\", \"learning_rate\": {\"class_name\": "
      "\"PiecewiseConstantDecay\", \"config\": {\"boundaries\": [10, 20], "
      "\"values\": [0.1, 0.01, 0.001], \"name\": null}}}";
  assert_int_equal(parse(pw, &o, err, sizeof err), 0);
  assert_true(tsr_optim_lr(&o, 10) == 0.1 && tsr_optim_lr(&o, 11) == 0.01 &&
              tsr_optim_lr(&o, 21) == 0.001);
  const char *cw =
      "{\"name\": \"adam\", \"learning_rate\": {\"class_name\": "
      "\"CosineDecay\", \"config\": {\"initial_learning_rate\": 0.0, "
      "\"decay_steps\": 10, \"alpha\": 0.0, \"warmup_target\": 0.1, "
      "\"warmup_steps\": 5, \"name\": \"CosineDecay\"}}}";
  /* Keras's warmup from a rate of 0 */
  assert_int_equal(parse(cw, &o, err, sizeof err), 0);
  assert_true(tsr_optim_lr(&o, 0) == 0.0);
  assert_true(tsr_optim_lr(&o, 5) == 0.1);
}

typedef struct {
  const char *text, *needle;
} bad_t;

static const bad_t bad[] = {
    {"{\"name\": \"adam\", \"use_ema\": true}", "use_ema = true is not supported"},
    {"{\"name\": \"adam\", \"amsgrad\": true}", "amsgrad = true is not supported"},
    {"{\"name\": \"adam\", \"loss_scale_factor\": 128}", "loss_scale_factor = 128 is not supported"},
    {"{\"name\": \"adam\", \"gradient_accumulation_steps\": 4}", "gradient_accumulation_steps = 4 is not supported"},
    {"{\"name\": \"adam\", \"clipnorm\": 1, \"clipvalue\": 1}", "only one of clipnorm, clipvalue and global_clipnorm"},
    {"{\"name\": \"adam\", \"clipnorm\": -1}", "must be >= 0"},
    {"{\"name\": \"ftrl\", \"weight_decay\": 0.1}", "weight_decay is not supported with ftrl"},
    {"{\"name\": \"adam\", \"momentum\": 0.9}", "optimizer.momentum: unknown key"},
    {"{\"name\": \"lamb\"}", "optimizer \"lamb\": not the name of a supported optimizer class (supported: sgd"},
    {"{\"class_name\": \"Lion\", \"config\": {}}", "optimizer \"Lion\" is not supported"},
    {"{\"name\": \"sgd\", \"learning_rate\": \"fast\"}", "learning_rate must be a number or a Keras schedule"},
    {"{\"name\": \"sgd\", \"learning_rate\": {\"class_name\": \"OneCycle\", \"config\": {}}}", "schedule 'OneCycle' is not supported (supported: ExponentialDecay"},
    {"{\"name\": \"sgd\", \"learning_rate\": {\"class_name\": \"ExponentialDecay\", \"config\": {\"initial_learning_rate\": 0.1, \"decay_steps\": 0, \"decay_rate\": 0.5}}}", "decay_steps 0 must be > 0"},
    {"{\"name\": \"sgd\", \"learning_rate\": {\"class_name\": \"ExponentialDecay\", \"config\": {\"initial_learning_rate\": 0.1, \"decay_steps\": 10}}}", "decay_rate is required"},
    {"{\"name\": \"sgd\", \"learning_rate\": {\"class_name\": \"ExponentialDecay\", \"config\": {\"initial_learning_rate\": 0.1, \"decay_step\": 10}}}", "did you mean \"decay_steps\""},
    {"{\"name\": \"sgd\", \"learning_rate\": {\"class_name\": \"PiecewiseConstantDecay\", \"config\": {\"boundaries\": [1, 2], \"values\": [1, 2]}}}", "values must have one more entry"},
    {"{\"name\": \"sgd\", \"learning_rate\": {\"class_name\": \"PiecewiseConstantDecay\", \"config\": {\"boundaries\": [2, 1], \"values\": [1, 2, 3]}}}", "boundaries must increase"},
    {"{\"name\": \"sgd\", \"decay\": 0.1, \"learning_rate\": {\"class_name\": \"InverseTimeDecay\", \"config\": {\"initial_learning_rate\": 0.1, \"decay_steps\": 1, \"decay_rate\": 1}}}", "decay and a learning-rate schedule"},
};

static void refused_with_a_reason(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    tsr_optim_spec o;
    char err[512] = "";
    int rc = parse(bad[i].text, &o, err, sizeof err);
    if (rc == 0 || !strstr(err, bad[i].needle))
      fail_msg("case %zu: rc %d err \"%s\" lacks \"%s\"", i, rc, err,
               bad[i].needle);
  }
  /* the piecewise limit is enforced */
  char big[4096];
  size_t k = (size_t)snprintf(big, sizeof big, "{\"name\": \"sgd\", "
      "\"learning_rate\": {\"class_name\": \"PiecewiseConstantDecay\", "
      "\"config\": {\"boundaries\": [");
  for (int i = 0; i <= TSR_LR_MAX_BOUNDARIES; i++)
    k += (size_t)snprintf(big + k, sizeof big - k, "%s%d", i ? "," : "", i);
  k += (size_t)snprintf(big + k, sizeof big - k, "], \"values\": [");
  for (int i = 0; i <= TSR_LR_MAX_BOUNDARIES + 1; i++)
    k += (size_t)snprintf(big + k, sizeof big - k, "%s1", i ? "," : "");
  snprintf(big + k, sizeof big - k, "]}}}");
  tsr_optim_spec o;
  char err[512] = "";
  assert_int_equal(parse(big, &o, err, sizeof err), TSR_ERANGE);
  assert_non_null(strstr(err, "at most 64"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(keras3_get_config_as_is),
      cmocka_unit_test(serialized_with_schedule),
      cmocka_unit_test(refused_with_a_reason),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
