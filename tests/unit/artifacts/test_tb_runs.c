/* TensorBoard as Keras lays it out, read back from the files: training
 * scalars in logdir/train and eval scalars in logdir/validation under
 * Keras's tags (epoch_loss, epoch_accuracy, epoch_learning_rate), no
 * duplicate point at one step, weight histograms, the job file as a text
 * summary and the hparams plugin's experiment and session records in the
 * root run, and the summary cadence. */
#include "artifacts/monitor/monitor.h"
#include "common/err.h"
#include "common/job.h"
#include "event.pb-c.h"
#include "hparams.pb-c.h"
#include "../tmpdir.h"

#include <dirent.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

/* Every Event of the one event file in `dir` (TFRecord framing, lengths
 * trusted: the CRCs are checked by test_tb.c). */
static int events_in(const char *dir, Tensorflow__Event **out, int max) {
  DIR *d = opendir(dir);
  assert_non_null(d);
  struct dirent *e;
  char path[1024] = "";
  while ((e = readdir(d)))
    if (strstr(e->d_name, "tfevents"))
      snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
  closedir(d);
  assert_true(path[0]);
  size_t n = 0;
  uint8_t *buf = (uint8_t *)test_slurp(path, &n);
  assert_non_null(buf);
  int k = 0;
  for (size_t at = 0; at + 12 <= n && k < max;) {
    uint64_t len = 0;
    for (int i = 7; i >= 0; i--) len = (len << 8) | buf[at + i];
    out[k] = tensorflow__event__unpack(NULL, len, buf + at + 12);
    assert_non_null(out[k]);
    k++;
    at += 12 + len + 4;
  }
  free(buf);
  return k;
}

static void free_events(Tensorflow__Event **ev, int n) {
  for (int i = 0; i < n; i++) tensorflow__event__free_unpacked(ev[i], NULL);
}

static const Tensorflow__Summary__Value *val(const Tensorflow__Event *e) {
  return e->what_case == TENSORFLOW__EVENT__WHAT_SUMMARY &&
                 e->summary->n_value == 1
             ? e->summary->value[0]
             : NULL;
}

static void runs_tags_histograms_hparams(void **state) {
  (void)state;
  char dir[256], sub[600], err[512];
  test_tmpdir(dir, sizeof dir);
  tsr_job job;
  const char *jt =
      "{\"model\": {\"builtin\": \"wide_deep\"}, \"batch_size\": 64, "
      "\"optimizer\": {\"name\": \"adamw\", \"learning_rate\": 0.003}, "
      "\"loss\": \"binary_crossentropy\", \"metrics\": [\"accuracy\", "
      "{\"class_name\": \"AUC\", \"config\": {\"name\": \"auc\"}}]}";
  assert_int_equal(tsr_job_parse(jt, "job.json", NULL, NULL, &job, err,
                                 sizeof err), 0);
  chief_metrics *m;
  assert_int_equal(chief_metrics_open(&m, dir, NULL, err, sizeof err), 0);
  assert_int_equal(chief_metrics_job_info(m, &job), 0);
  chief_metrics_scalar(m, "loss", 10, 0.7, 0);
  chief_metrics_scalar(m, "loss", 10, 0.6, 0); /* the same step: dropped */
  chief_metrics_scalar(m, "train/accuracy", 10, 0.55, 0);
  chief_metrics_scalar(m, "train/learning_rate", 10, 0.003, 0);
  chief_metrics_scalar(m, "eval/loss", 10, 0.65, 0);
  chief_metrics_scalar(m, "eval/accuracy", 10, 0.6, 0);
  chief_metrics_scalar(m, "examples_per_sec", 10, 1234, 0);
  float w[100];
  for (int i = 0; i < 100; i++) w[i] = (float)(i - 50) / 50.0f;
  assert_int_equal(chief_tb_histogram(chief_metrics_tb(m, CHIEF_RUN_TRAIN),
                                      "dense/kernel", 10, w, 100, 10, 0), 0);
  assert_int_equal(chief_metrics_close(m), 0);

  Tensorflow__Event *ev[32];
  /* train: version, epoch_loss, epoch_accuracy, epoch_learning_rate, histo */
  snprintf(sub, sizeof sub, "%s/train", dir);
  int n = events_in(sub, ev, 32);
  assert_int_equal(n, 5);
  assert_string_equal(val(ev[1])->tag, "epoch_loss");
  assert_true(val(ev[1])->simple_value == 0.7f && ev[1]->step == 10);
  assert_string_equal(val(ev[2])->tag, "epoch_accuracy");
  assert_string_equal(val(ev[3])->tag, "epoch_learning_rate");
  const Tensorflow__Summary__Value *h = val(ev[4]);
  assert_string_equal(h->tag, "dense/kernel");
  assert_int_equal(h->value_case, TENSORFLOW__SUMMARY__VALUE__VALUE_HISTO);
  assert_true(h->histo->num == 100 && h->histo->min == -1.0 &&
              h->histo->max == 0.98f);
  assert_int_equal(h->histo->n_bucket, 10);
  double total = 0;
  for (size_t i = 0; i < h->histo->n_bucket; i++) total += h->histo->bucket[i];
  assert_true(total == 100);
  free_events(ev, n);
  /* validation: version, epoch_loss, epoch_accuracy (same tags as train) */
  snprintf(sub, sizeof sub, "%s/validation", dir);
  n = events_in(sub, ev, 32);
  assert_int_equal(n, 3);
  assert_string_equal(val(ev[1])->tag, "epoch_loss");
  assert_string_equal(val(ev[2])->tag, "epoch_accuracy");
  free_events(ev, n);
  /* root: version, job text, hparams experiment + session, the rate */
  n = events_in(dir, ev, 32);
  assert_int_equal(n, 5);
  const Tensorflow__Summary__Value *t = val(ev[1]);
  assert_string_equal(t->tag, "job");
  assert_string_equal(t->metadata->plugin_data->plugin_name, "text");
  assert_int_equal(t->tensor->dtype, 7);
  assert_non_null(strstr((const char *)t->tensor->string_val[0].data,
                         "\"batch_size\": 64"));
  for (int k = 2; k <= 3; k++) {
    const Tensorflow__Summary__Value *hv = val(ev[k]);
    assert_string_equal(hv->metadata->plugin_data->plugin_name, "hparams");
    Tensorboard__HParamsPluginData *d = tensorboard__hparams_plugin_data__unpack(
        NULL, hv->metadata->plugin_data->content.len,
        hv->metadata->plugin_data->content.data);
    assert_non_null(d);
    if (k == 2) {
      assert_string_equal(hv->tag, "_hparams_/experiment");
      assert_int_equal(d->data_case,
                       TENSORBOARD__HPARAMS_PLUGIN_DATA__DATA_EXPERIMENT);
      bool found = false;
      for (size_t i = 0; i < d->experiment->n_metric_infos; i++) {
        const Tensorboard__MetricName *mn = d->experiment->metric_infos[i]->name;
        found |= !strcmp(mn->group, "validation") &&
                 !strcmp(mn->tag, "epoch_auc");
      }
      assert_true(found);
    } else {
      assert_string_equal(hv->tag, "_hparams_/session_start_info");
      bool opt = false, lr = false;
      for (size_t i = 0; i < d->session_start_info->n_hparams; i++) {
        const Tensorboard__SessionStartInfo__HparamsEntry *e =
            d->session_start_info->hparams[i];
        if (!strcmp(e->key, "optimizer"))
          opt = !strcmp(e->value->string_value, "adamw");
        if (!strcmp(e->key, "learning_rate"))
          lr = e->value->number_value == 0.003;
      }
      assert_true(opt && lr);
    }
    tensorboard__hparams_plugin_data__free_unpacked(d, NULL);
  }
  assert_string_equal(val(ev[4])->tag, "examples_per_sec");
  free_events(ev, n);
  tsr_job_free(&job);
  test_rmtree(dir);
}

static void cadence(void **state) {
  (void)state;
  chief_summary_policy p;
  /* default: a hundredth of a 300-step run, so about 100 points */
  chief_summary_policy_init(&p, 0, 0);
  int points = 0;
  for (int64_t s = 1; s <= 300; s++) points += chief_summary_due(&p, s, 300, 0);
  assert_true(points >= 99 && points <= 101);
  /* never twice for one step */
  assert_false(chief_summary_due(&p, 300, 300, 100));
  /* every 10 steps, or every 5 s */
  chief_summary_policy_init(&p, 10, 5);
  assert_true(chief_summary_due(&p, 1, 0, 0));
  assert_false(chief_summary_due(&p, 5, 0, 1));
  assert_true(chief_summary_due(&p, 11, 0, 2));
  assert_true(chief_summary_due(&p, 12, 0, 7.5));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(runs_tags_histograms_hparams),
      cmocka_unit_test(cadence),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
