/* The job file: defaults are Keras's, every key is read, unknown keys are
 * errors naming the key, and flag overrides replace single keys. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"
#include "common/job.h"

static void defaults_are_keras(void **state) {
  (void)state;
  tsr_job j;
  char err[512];
  assert_int_equal(tsr_job_parse("{}", "job", NULL, NULL, &j, err, sizeof err), 0);
  assert_string_equal(j.loss, "mse");
  assert_int_equal(j.optimizer.kind, TSR_OPT_ADAM);
  assert_true(j.optimizer.learning_rate == 0.001);
  assert_true(j.optimizer.beta_1 == 0.9 && j.optimizer.beta_2 == 0.999);
  assert_true(j.optimizer.epsilon == 1e-7);
  assert_int_equal(j.batch_size, 32);
  assert_int_equal(j.epochs, 1);
  assert_int_equal(j.mode, TSR_MODE_ASYNC);
  assert_int_equal(j.partitioner.kind, TSR_PART_MIN_SIZE);
  assert_int_equal(j.partitioner.min_shard_bytes, 256 << 10);
  assert_int_equal(j.partitioner.max_shards, 0); /* one per PS at most */
  assert_int_equal(j.partitioner.placement, TSR_PLACE_BALANCED);
  tsr_job_free(&j);
  tsr_optim_spec o;
  json_t *sgd = json_string("sgd");
  assert_int_equal(tsr_optim_parse(sgd, &o, err, sizeof err), 0);
  json_decref(sgd);
  assert_true(o.learning_rate == 0.01 && o.momentum == 0 && !o.nesterov);
}

static void full_job_reads_every_key(void **state) {
  (void)state;
  const char *text =
      "{\"model\": {\"builtin\": \"mlp\"}, \"loss\": \"sparse_categorical_crossentropy\","
      " \"metrics\": [\"accuracy\"], \"optimizer\": {\"name\": \"sgd\", "
      "\"learning_rate\": 0.1, \"momentum\": 0.9, \"nesterov\": true},"
      " \"data\": {\"train\": {\"format\": \"csv\"}}, \"batch_size\": 64, \"steps\": 500,"
      " \"steps_per_closure\": 20, \"mode\": \"ssp:3\", \"partitioner\": {\"type\": "
      "\"max_size\", \"max_shard_bytes\": 65536, \"max_shards\": 8}, \"precision\": \"bf16\","
      " \"seed\": 42, \"checkpoint\": {\"dir\": \"/tmp/ck\", \"every_steps\": 100, "
      "\"keep\": 2}, \"logdir\": \"/tmp/logs\", \"eval_every_steps\": 50}";
  tsr_job j;
  char err[512];
  assert_int_equal(tsr_job_parse(text, "job", NULL, NULL, &j, err, sizeof err), 0);
  assert_string_equal(j.model_source, "inline");
  assert_string_equal(j.loss, "sparse_categorical_crossentropy");
  assert_int_equal(j.n_metrics, 1);
  assert_string_equal(j.metrics[0], "accuracy");
  assert_int_equal(j.optimizer.kind, TSR_OPT_SGD);
  assert_true(j.optimizer.momentum == 0.9 && j.optimizer.nesterov);
  assert_int_equal(j.batch_size, 64);
  assert_int_equal(j.steps, 500);
  assert_int_equal(j.epochs, 0);
  assert_int_equal(j.steps_per_closure, 20);
  assert_int_equal(j.mode, TSR_MODE_SSP);
  assert_int_equal(j.staleness, 3);
  assert_int_equal(j.partitioner.kind, TSR_PART_MAX_SIZE);
  assert_int_equal(j.partitioner.max_shard_bytes, 65536);
  assert_int_equal(j.precision, TSR_PREC_BF16);
  assert_int_equal(j.seed, 42);
  assert_string_equal(j.checkpoint_dir, "/tmp/ck");
  assert_int_equal(j.checkpoint_every_steps, 100);
  assert_int_equal(j.checkpoint_keep, 2);
  assert_string_equal(j.logdir, "/tmp/logs");
  assert_int_equal(j.eval_every_steps, 50);
  assert_non_null(json_object_get(j.data, "train"));
  tsr_job_free(&j);
}

typedef struct {
  const char *text;
  const char *needle;
} bad_t;

static const bad_t bad[] = {
    {"{\"stepz\": 10}", "stepz: unknown key; did you mean \"steps\"?"},
    {"{\"steps\": -1}", "steps = -1 is out of range"},
    {"{\"batch_size\": 0}", "batch_size = 0"},
    {"{\"batch_size\": \"big\"}", "batch_size must be an integer"},
    {"{\"optimizer\": \"lion\"}", "optimizer \"lion\" is not supported"},
    {"{\"optimizer\": {\"name\": \"adam\", \"beta1\": 0.8}}", "optimizer.beta1: unknown key; did you mean \"beta_1\"?"},
    {"{\"optimizer\": {\"name\": \"adam\", \"learning_rate\": -1}}", "learning_rate -1 must be >= 0"},
    {"{\"optimizer\": {\"name\": \"sgd\", \"momentum\": 1.5}}", "momentum 1.5"},
    {"{\"mode\": \"ssp\"}", "mode \"ssp\""},
    {"{\"mode\": \"semi\"}", "mode \"semi\""},
    {"{\"partitioner\": {\"type\": \"min_size\", \"min_shard_bytes\": 0}}", "min_shard_bytes 0"},
    {"{\"partitioner\": {\"type\": \"min_size\", \"max_shards\": -2}}", "max_shards -2"},
    {"{\"partitioner\": {\"type\": \"evenly\"}}", "partitioner.type \"evenly\""},
    {"{\"partitioner\": {\"type\": \"max_size\"}}", "max_shard_bytes is required"},
    {"{\"precision\": \"fp8\"}", "precision \"fp8\""},
    {"{\"wire_precision\": \"fp16\"}", "wire_precision \"fp16\" is not fp32 or bf16"},
    {"{\"checkpoint\": {\"dir\": \"x\", \"every\": 3}}", "checkpoint.every: unknown key"},
    {"{\"metrics\": [1]}", "metrics[0] must be a string"},
    {"{\"model\": 3}", "model must be"},
    {"{\"model\": \"/nonexistent/model.json\"}", "/nonexistent/model.json"},
    {"{\"steps\": 1, \"steps\": 2}", "malformed JSON"},
    {"{\"data\": [1]}", "data must be an object"},
    {"[]", "must be a JSON object"},
    {"{\"seed\": -4}", "seed must be"},
    {"{\"epochs\": 0}", "epochs = 0 is out of range [1, 1073741824]: it "
                         "trains nothing; to evaluate weights without "
                         "training, run `tessera evaluate --job"},
    {"{\"steps\": 5, \"epochs\": 0}", "epochs = 0 is out of range"},
    {"{\"epochs\": -2}", "epochs = -2 is out of range"},
    {"{\"epochs\": 1.5}", "epochs must be an integer"},
};

static void bad_jobs_name_the_key(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    tsr_job j;
    char err[512] = "";
    int rc = tsr_job_parse(bad[i].text, "job.json", NULL, NULL, &j, err,
                           sizeof err);
    if (rc == 0 || !strstr(err, bad[i].needle)) {
      print_error("case %zu: rc %d err \"%s\" lacks \"%s\"\n", i, rc, err,
                  bad[i].needle);
      fail();
    }
    assert_non_null(strstr(err, "job.json"));
  }
}

/* an override can give a job that says epochs 0 a length, and take it
 * away from one that has one */
static void epochs_zero_and_overrides(void **state) {
  (void)state;
  tsr_job j;
  char err[512];
  const char *ov[] = {"epochs=2", NULL};
  assert_int_equal(tsr_job_parse("{\"epochs\": 0}", "job", NULL, ov, &j,
                                 err, sizeof err), 0);
  assert_int_equal(j.epochs, 2);
  tsr_job_free(&j);
  const char *ov0[] = {"epochs=0", NULL};
  assert_int_equal(tsr_job_parse("{\"epochs\": 3}", "job", NULL, ov0, &j,
                                 err, sizeof err), TSR_ECONFIG);
  assert_non_null(strstr(err, "tessera-worker --standalone --evaluate"));
}

static void overrides_replace_single_keys(void **state) {
  (void)state;
  const char *ov[] = {"steps=7", "optimizer.learning_rate=0.5",
                      "logdir=/tmp/x y", "mode=sync", NULL};
  tsr_job j;
  char err[512];
  assert_int_equal(tsr_job_parse("{\"steps\": 100, \"optimizer\": {\"name\": \"sgd\"}}",
                                 "job", NULL, ov, &j, err, sizeof err), 0);
  assert_int_equal(j.steps, 7);
  assert_true(j.optimizer.learning_rate == 0.5);
  assert_int_equal(j.optimizer.kind, TSR_OPT_SGD);
  assert_string_equal(j.logdir, "/tmp/x y");
  assert_int_equal(j.mode, TSR_MODE_SYNC);
  tsr_job_free(&j);
}

static void overrides_inside_short_forms(void **state) {
  (void)state;
  const char *ov[] = {"optimizer.learning_rate=0.002", "checkpoint.keep=7",
                      NULL};
  tsr_job j;
  char err[512];
  assert_int_equal(tsr_job_parse("{\"optimizer\": \"sgd\", \"checkpoint\": "
                                 "\"/tmp/ck\"}", "job", NULL, ov, &j, err,
                                 sizeof err), 0);
  assert_int_equal(j.optimizer.kind, TSR_OPT_SGD);
  assert_true(j.optimizer.learning_rate == 0.002);
  assert_string_equal(j.checkpoint_dir, "/tmp/ck");
  assert_int_equal(j.checkpoint_keep, 7);
  tsr_job_free(&j);
}

static void overrides_errors(void **state) {
  (void)state;
  const char *ov1[] = {"nokey", NULL};
  const char *ov2[] = {"steps.x=1", NULL};
  const char *ov3[] = {"stepss=1", NULL};
  tsr_job j;
  char err[512];
  assert_int_equal(tsr_job_parse("{}", "job", NULL, ov1, &j, err, sizeof err),
                   TSR_ECONFIG);
  assert_non_null(strstr(err, "key=value"));
  assert_int_equal(tsr_job_parse("{\"steps\":3}", "job", NULL, ov2, &j, err,
                                 sizeof err), TSR_ECONFIG);
  assert_non_null(strstr(err, "\"steps\" is not an object"));
  assert_int_equal(tsr_job_parse("{}", "job", NULL, ov3, &j, err, sizeof err),
                   TSR_ECONFIG);
  assert_non_null(strstr(err, "stepss"));
  /* keys that are not UTF-8 (found by fuzz_job: the new object was used
   * after jansson had refused and freed it) */
  const char *ov4[] = {"o\xa0ptimizer.learning_rate=0.5", NULL};
  const char *ov5[] = {"st\xffps=1", NULL};
  assert_int_equal(tsr_job_parse("{}", "job", NULL, ov4, &j, err, sizeof err),
                   TSR_ECONFIG);
  assert_non_null(strstr(err, "UTF-8"));
  assert_int_equal(tsr_job_parse("{}", "job", NULL, ov5, &j, err, sizeof err),
                   TSR_ECONFIG);
  assert_non_null(strstr(err, "UTF-8"));
  const char *ov6[] = {"optimizer.learning_rate=0\xae" "5", NULL};
  assert_int_equal(tsr_job_parse("{}", "job", NULL, ov6, &j, err, sizeof err),
                   TSR_ECONFIG);
  assert_non_null(strstr(err, "neither JSON nor UTF-8"));
}

static void model_path_is_relative_to_job(void **state) {
  (void)state;
  char dir[] = "/tmp/tsr_job_XXXXXX";
  assert_non_null(mkdtemp(dir));
  char p[256];
  snprintf(p, sizeof p, "%s/model.json", dir);
  FILE *f = fopen(p, "w");
  fputs("{\"class_name\": \"Sequential\", \"config\": {\"layers\": []}}", f);
  fclose(f);
  char jp[256];
  snprintf(jp, sizeof jp, "%s/job.json", dir);
  f = fopen(jp, "w");
  fputs("{\"model\": \"model.json\", \"steps\": 3}", f);
  fclose(f);
  tsr_job j;
  char err[512];
  assert_int_equal(tsr_job_load(jp, NULL, &j, err, sizeof err), 0);
  assert_string_equal(json_string_value(json_object_get(j.model, "class_name")),
                      "Sequential");
  assert_string_equal(j.model_source, p);
  tsr_job_free(&j);
  unlink(p);
  unlink(jp);
  rmdir(dir);
}

/* Precision names: Keras's policy names for the compute, bfloat16 on the
 * wire. */
static void precision_names(void **state) {
  (void)state;
  static const struct {
    const char *text;
    tsr_precision prec, wire;
  } ok[] = {
      {"{\"precision\": \"mixed_float16\"}", TSR_PREC_FP16, TSR_PREC_FP32},
      {"{\"precision\": \"mixed_bfloat16\", \"wire_precision\": \"bfloat16\"}",
       TSR_PREC_BF16, TSR_PREC_BF16},
      {"{\"precision\": \"float32\", \"wire_precision\": \"fp32\"}",
       TSR_PREC_FP32, TSR_PREC_FP32},
  };
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
    tsr_job j;
    char err[512];
    assert_int_equal(
        tsr_job_parse(ok[i].text, "job", NULL, NULL, &j, err, sizeof err), 0);
    assert_int_equal(j.precision, ok[i].prec);
    assert_int_equal(j.wire_precision, ok[i].wire);
    tsr_job_free(&j);
  }
}

/* dense, sparse_rows and checkpoint.storage: each of a key's two names
 * sets its flag one way, anything else is refused naming the key. */
static void two_name_keys(void **state) {
  (void)state;
  static const struct {
    const char *text;
    int flag; /* -1: refused */
    const char *msg;
  } cases[] = {
      {"{\"dense\": \"ps\"}", 0, NULL},
      {"{\"dense\": \"allreduce\"}", 1, NULL},
      {"{\"dense\": 3}", -1, "dense 3 is not \"ps\" or \"allreduce\""},
      {"{\"sparse_rows\": \"on_touch\"}", 0, NULL},
      {"{\"sparse_rows\": \"materialized\"}", 1, NULL},
      {"{\"sparse_rows\": \"all\"}", -1, "sparse_rows must be"},
      {"{\"checkpoint\": {\"storage\": \"shared\"}}", 0, NULL},
      {"{\"checkpoint\": {\"storage\": \"per_ps\"}}", 1, NULL},
      {"{\"checkpoint\": {\"storage\": \"per-ps\"}}", -1,
       "checkpoint.storage must be"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    tsr_job j;
    char err[512] = "";
    int rc = tsr_job_parse(cases[i].text, "job", NULL, NULL, &j, err,
                           sizeof err);
    if (cases[i].flag < 0) {
      assert_int_equal(rc, TSR_ECONFIG);
      assert_non_null(strstr(err, cases[i].msg));
      continue;
    }
    assert_int_equal(rc, 0);
    bool flag = i < 3 ? j.dense_allreduce
                : i < 6 ? j.sparse_materialized
                        : j.checkpoint_per_ps;
    assert_int_equal(flag, cases[i].flag);
    tsr_job_free(&j);
  }
}

/* Folders named in a job resolve against the job file's folder. */
static void paths_resolve_from_the_job_folder(void **state) {
  (void)state;
  tsr_job j;
  memset(&j, 0, sizeof j);
  char dir[64], *r;
  j.path = "/jobs/a/job.json";
  tsr_job_dir(&j, dir, sizeof dir);
  assert_string_equal(dir, "/jobs/a");
  assert_non_null(r = tsr_job_resolve(&j, "ckpt", ""));
  assert_string_equal(r, "/jobs/a/ckpt");
  free(r);
  assert_non_null(r = tsr_job_resolve(&j, "/abs/logs", "/eval"));
  assert_string_equal(r, "/abs/logs/eval");
  free(r);
  j.path = "/job.json";
  assert_non_null(r = tsr_job_resolve(&j, "ckpt", ""));
  assert_string_equal(r, "/ckpt");
  free(r);
  j.path = "job.json"; /* no folder named: the current one */
  assert_non_null(r = tsr_job_resolve(&j, "logs", "/eval"));
  assert_string_equal(r, "./logs/eval");
  free(r);
  j.path = NULL; /* parsed from text */
  tsr_job_dir(&j, dir, sizeof dir);
  assert_string_equal(dir, ".");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(defaults_are_keras),
      cmocka_unit_test(full_job_reads_every_key),
      cmocka_unit_test(bad_jobs_name_the_key),
      cmocka_unit_test(epochs_zero_and_overrides),
      cmocka_unit_test(overrides_replace_single_keys),
      cmocka_unit_test(overrides_inside_short_forms),
      cmocka_unit_test(overrides_errors),
      cmocka_unit_test(model_path_is_relative_to_job),
      cmocka_unit_test(paths_resolve_from_the_job_folder),
      cmocka_unit_test(precision_names),
      cmocka_unit_test(two_name_keys),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
