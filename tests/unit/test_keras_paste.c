/* Configs pasted as Keras writes them: every optimizer, learning-rate
 * schedule, loss and metric the README lists, as Keras 3 and tf_keras
 * write them with get_config() and serialize()
 * (tests/data/keras_configs.json, made by tests/data/keras_configs.py),
 * must resolve to the Tessera name Keras's class stands for: an
 * optimizer by its class, never by its instance's name ("adam_w",
 * "adam_1", "rm_sprop"), a zero learning rate where Keras allows it,
 * metric names whole. */
#include "common/job.h"
#include "common/optim_spec.h"

#include <jansson.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

static const char *g_path;

/* One entry; returns NULL when it resolves to what it must, else why. */
static const char *paste_one(json_t *e, char *why, size_t len) {
  const char *kind = json_string_value(json_object_get(e, "kind"));
  const char *expect = json_string_value(json_object_get(e, "expect"));
  json_t *v = json_object_get(e, "value");
  char err[512] = "", got[256] = "";
  int rc = -1;
  if (!kind || !expect || !v) {
    snprintf(why, len, "malformed entry");
    return why;
  }
  if (!strcmp(kind, "optimizer")) {
    tsr_optim_spec o;
    rc = tsr_optim_parse(v, &o, err, sizeof err);
    if (!rc) snprintf(got, sizeof got, "%s", tsr_optim_name(o.kind));
  } else if (!strcmp(kind, "schedule")) {
    tsr_lr_schedule s;
    rc = tsr_lr_schedule_parse(v, "learning_rate", &s, err, sizeof err);
    if (!rc) snprintf(got, sizeof got, "%s", tsr_lr_schedule_name(s.kind));
  } else if (!strcmp(kind, "loss")) {
    rc = tsr_loss_canon(v, got, sizeof got, err, sizeof err);
  } else if (!strcmp(kind, "metric")) {
    rc = tsr_metric_canon(v, got, sizeof got, err, sizeof err);
  }
  if (expect[0] == '!') {
    if (!rc) {
      snprintf(why, len, "accepted as \"%s\"; must be refused", got);
      return why;
    }
    if (!strstr(err, expect + 1)) {
      snprintf(why, len, "refused, but not for \"%s\": %s", expect + 1,
               err);
      return why;
    }
    return NULL;
  }
  if (rc) {
    snprintf(why, len, "refused: %s", err);
    return why;
  }
  if (strcmp(got, expect)) {
    snprintf(why, len, "resolved to \"%s\", not \"%s\"", got, expect);
    return why;
  }
  return NULL;
}

static void every_entry_resolves(void **state) {
  (void)state;
  json_error_t je;
  json_t *rows = json_load_file(g_path, 0, &je);
  if (!rows) fail_msg("%s: %s", g_path, je.text);
  assert_true(json_is_array(rows));
  /* both Keras 3 and tf_keras, every kind */
  int seen[2][4] = {{0}};
  const char *kinds[] = {"optimizer", "schedule", "loss", "metric"};
  size_t i, bad = 0;
  json_t *e;
  json_array_foreach(rows, i, e) {
    char why[700];
    const char *ver = json_string_value(json_object_get(e, "keras"));
    const char *kind = json_string_value(json_object_get(e, "kind"));
    for (int k = 0; k < 4; k++)
      if (kind && !strcmp(kind, kinds[k]))
        seen[ver && !strncmp(ver, "tf_keras", 8)][k]++;
    if (paste_one(e, why, sizeof why)) {
      char *d = json_dumps(json_object_get(e, "value"), JSON_COMPACT);
      print_error("%s %s %s (%s): %s\n  %s\n", ver ? ver : "?",
                  kind ? kind : "?",
                  json_string_value(json_object_get(e, "expect")),
                  json_string_value(json_object_get(e, "form")), why,
                  d ? d : "");
      free(d);
      bad++;
    }
  }
  json_decref(rows);
  for (int f = 0; f < 2; f++)
    for (int k = 0; k < 4; k++) assert_true(seen[f][k] > 0);
  assert_int_equal(bad, 0);
}

static void instance_names(void **state) {
  (void)state;
  /* what Keras 3 and tf_keras name instances, and what they stand for */
  static const struct {
    const char *name, *kind;
  } ok[] = {{"adam_w", "adamw"},   {"adam_w_12", "adamw"},
            {"rm_sprop", "rmsprop"}, {"RMSprop", "rmsprop"},
            {"adam_1", "adam"},     {"Nadam", "nadam"},
            {"sgd_3", "sgd"},       {"AdamW", "adamw"}};
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
    char buf[128], err[256];
    snprintf(buf, sizeof buf, "{\"name\": \"%s\"}", ok[i].name);
    json_t *v = json_loads(buf, 0, NULL);
    tsr_optim_spec o;
    int rc = tsr_optim_parse(v, &o, err, sizeof err);
    json_decref(v);
    if (rc) fail_msg("%s: %s", ok[i].name, err);
    assert_string_equal(tsr_optim_name(o.kind), ok[i].kind);
  }
  /* a name that is no class's: refused, pointing at the serialized form */
  json_t *v = json_loads("{\"name\": \"my_optimizer\"}", 0, NULL);
  tsr_optim_spec o;
  char err[512];
  assert_int_not_equal(tsr_optim_parse(v, &o, err, sizeof err), 0);
  json_decref(v);
  assert_non_null(strstr(err, "\"my_optimizer\""));
  assert_non_null(strstr(err, "class_name"));
  /* "adam_" and "_1" alone name nothing */
  v = json_loads("{\"name\": \"_1\"}", 0, NULL);
  assert_int_not_equal(tsr_optim_parse(v, &o, err, sizeof err), 0);
  json_decref(v);
  /* the serialized form decides by its class, whatever the instance's name */
  v = json_loads("{\"class_name\": \"SGD\", \"config\": {\"name\": \"adam\"}}",
                 0, NULL);
  assert_int_equal(tsr_optim_parse(v, &o, err, sizeof err), 0);
  json_decref(v);
  assert_int_equal(o.kind, TSR_OPT_SGD);
}

static void zero_learning_rates(void **state) {
  (void)state;
  char err[512];
  tsr_optim_spec o;
  json_t *v = json_loads("{\"name\": \"sgd\", \"learning_rate\": 0.0}", 0,
                         NULL);
  assert_int_equal(tsr_optim_parse(v, &o, err, sizeof err), 0);
  json_decref(v);
  assert_true(tsr_optim_lr(&o, 5) == 0.0);
  /* Keras's warmup example: from 0 up to 0.1 over 150 steps */
  v = json_loads(
      "{\"class_name\": \"CosineDecay\", \"config\": {\"initial_learning_"
      "rate\": 0.0, \"decay_steps\": 1000, \"warmup_target\": 0.1, "
      "\"warmup_steps\": 150}}",
      0, NULL);
  tsr_lr_schedule s;
  assert_int_equal(tsr_lr_schedule_parse(v, "lr", &s, err, sizeof err), 0);
  json_decref(v);
  assert_true(tsr_lr_schedule_at(&s, 0) == 0.0);
  assert_true(fabs(tsr_lr_schedule_at(&s, 75) - 0.05) < 1e-12);
  assert_true(fabs(tsr_lr_schedule_at(&s, 150) - 0.1) < 1e-12);
  /* negative stays refused, naming the value */
  v = json_loads("{\"name\": \"adam\", \"learning_rate\": -0.1}", 0, NULL);
  assert_int_not_equal(tsr_optim_parse(v, &o, err, sizeof err), 0);
  json_decref(v);
  assert_non_null(strstr(err, "-0.1"));
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s keras_configs.json\n", argv[0]);
    return 2;
  }
  g_path = argv[1];
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(every_entry_resolves),
      cmocka_unit_test(instance_names),
      cmocka_unit_test(zero_learning_rates),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
