/* Losses and metrics as Keras serializes them, reduced to one canonical
 * text the job keeps ("huber@delta=2", "auc@multi_label",
 * "categorical_crossentropy_from_logits"): the worker's model resolves
 * that text, and the input pipeline reads it to know whether labels are
 * class indices.
 *
 * Happy path: a string passes through unchanged (the model checks it); an
 * object {"class_name", "config", "module"?, "registered_name"?} maps its
 * Keras class to the snake-case name and appends the options that differ
 * from their defaults.
 * Failure modes: an unknown class, an unknown config key (named), an option
 * at a value Tessera does not implement (label_smoothing, a reduction other
 * than the mean, AUC's PR curve, Precision at top_k ...): "is not
 * supported", naming it.
 */
#include "common/job.h"
#include "common/conf.h"
#include "common/err.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  const char *cls, *name;
  const char *const *keys; /* config keys besides name, dtype, reduction */
} kn_class;

static const char *const k_none[] = {NULL};
static const char *const k_logits[] = {"from_logits", "label_smoothing",
                                       "axis", "ignore_class", NULL};
static const char *const k_huber[] = {"delta", NULL};
static const char *const k_auc[] = {
    "num_thresholds", "curve", "summation_method", "thresholds",
    "multi_label", "num_labels", "label_weights", "from_logits", NULL};
static const char *const k_pr[] = {"thresholds", "top_k", "class_id", NULL};
static const char *const k_topk[] = {"k", NULL};
static const char *const k_thr[] = {"threshold", NULL};

static const kn_class losses[] = {
    {"MeanSquaredError", "mse", k_none},
    {"MeanAbsoluteError", "mae", k_none},
    {"BinaryCrossentropy", "binary_crossentropy", k_logits},
    {"CategoricalCrossentropy", "categorical_crossentropy", k_logits},
    {"SparseCategoricalCrossentropy", "sparse_categorical_crossentropy",
     k_logits},
    {"Huber", "huber", k_huber},
    {"KLDivergence", "kld", k_none},
    {NULL, NULL, NULL}};

static const kn_class metrics[] = {
    {"BinaryAccuracy", "binary_accuracy", k_thr},
    {"CategoricalAccuracy", "categorical_accuracy", k_none},
    {"SparseCategoricalAccuracy", "sparse_categorical_accuracy", k_none},
    {"AUC", "auc", k_auc},
    {"Precision", "precision", k_pr},
    {"Recall", "recall", k_pr},
    {"TopKCategoricalAccuracy", "top_k_categorical_accuracy", k_topk},
    {"SparseTopKCategoricalAccuracy", "sparse_top_k_categorical_accuracy",
     k_topk},
    {"MeanSquaredError", "mse", k_none},
    {"MeanAbsoluteError", "mae", k_none},
    {NULL, NULL, NULL}};

static bool is_off(json_t *v) {
  return !v || json_is_null(v) || json_is_false(v) ||
         (json_is_number(v) && json_number_value(v) == 0);
}

static int unsupported(const char *what, const char *key, json_t *v,
                       const char *why, char *err, size_t errlen) {
  char *d = json_dumps(v, JSON_ENCODE_ANY | JSON_REAL_PRECISION(6));
  int rc = tsr_errf(err, errlen, TSR_EUNSUPPORTED,
                    "%s.config.%s = %s is not supported (%s)", what, key,
                    d ? d : "?", why);
  free(d);
  return rc;
}

/* Looks the class up and checks the config keys; *cfg may be NULL. */
static int kn_lookup(json_t *v, const char *what, const kn_class *table,
                     const kn_class **out, json_t **cfg, char *err,
                     size_t errlen) {
  const char *cls = json_string_value(json_object_get(v, "class_name"));
  *cfg = json_object_get(v, "config");
  if (!cls || (*cfg && !json_is_object(*cfg) && !json_is_null(*cfg)))
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "%s must be a name or Keras's serialized {\"class_name\": "
                    "..., \"config\": {...}}", what);
  static const char *const top[] = {"class_name", "config", "module",
                                    "registered_name", NULL};
  int rc = tsr_conf_check_keys(v, what, top, NULL, err, errlen);
  if (rc) return rc;
  const kn_class *c = NULL;
  for (const kn_class *t = table; t->cls; t++)
    if (!strcmp(t->cls, cls)) c = t;
  if (!c) {
    char list[512];
    size_t o = 0;
    for (const kn_class *t = table; t->cls && o < sizeof list; t++)
      o += (size_t)snprintf(list + o, sizeof list - o, "%s%s",
                            t == table ? "" : ", ", t->cls);
    return tsr_errf(err, errlen, TSR_EUNSUPPORTED,
                    "%s: class '%s' is not supported (supported: %s)", what,
                    cls, list);
  }
  if (json_is_object(*cfg)) {
    static const char *const common_keys[] = {"name", "dtype", "reduction",
                                              "fn", NULL};
    char where[160];
    snprintf(where, sizeof where, "%s.config", what);
    if ((rc = tsr_conf_check_keys(*cfg, where, c->keys, common_keys, err,
                                  errlen)))
      return rc;
    json_t *dt = json_object_get(*cfg, "dtype");
    if (dt && !json_is_null(dt) && !json_is_object(dt) &&
        !(json_is_string(dt) && !strcmp(json_string_value(dt), "float32")))
      return unsupported(what, "dtype", dt, "float32 only", err, errlen);
    json_t *rd = json_object_get(*cfg, "reduction");
    const char *r = json_string_value(rd);
    if (rd && !json_is_null(rd) &&
        !(r && (!strcmp(r, "sum_over_batch_size") || !strcmp(r, "auto") ||
                !strcmp(r, "mean"))))
      return unsupported(what, "reduction", rd,
                         "the mean over the batch, as Keras's default",
                         err, errlen);
  } else {
    *cfg = NULL;
  }
  *out = c;
  return 0;
}

/* A loss or a metric: its name in messages, the message for a value of
 * the wrong shape, its classes. */
typedef struct {
  const char *what, *shape;
  const kn_class *table;
} kn_kind;

static const kn_kind kn_loss = {
    "loss",
    "loss must be a Keras name (\"mse\") or a serialized loss "
    "{\"class_name\": \"Huber\", \"config\": {...}}",
    losses};
static const kn_kind kn_metric = {
    "metric",
    "a metric must be a Keras name (\"accuracy\") or a serialized metric "
    "{\"class_name\": \"AUC\", \"config\": {...}}",
    metrics};

/* A plain name is copied to `out` (returns 1); a serialized object is
 * looked up (returns 0 with *c and *cfg set); anything else is refused. */
static int kn_name_or_lookup(json_t *v, const kn_kind *k, char *out,
                             size_t len, const kn_class **c, json_t **cfg,
                             char *err, size_t errlen) {
  if (json_is_string(v)) {
    snprintf(out, len, "%s", json_string_value(v));
    return 1;
  }
  if (!json_is_object(v))
    return tsr_errf(err, errlen, TSR_ECONFIG, "%s", k->shape);
  return kn_lookup(v, k->what, k->table, c, cfg, err, errlen);
}

int tsr_loss_canon(json_t *v, char *out, size_t len, char *err,
                   size_t errlen) {
  const kn_class *c;
  json_t *cfg, *x;
  int rc = kn_name_or_lookup(v, &kn_loss, out, len, &c, &cfg, err, errlen);
  if (rc) return rc > 0 ? 0 : rc;
  if ((x = json_object_get(cfg, "label_smoothing")) && !is_off(x))
    return unsupported("loss", "label_smoothing", x, "only 0", err, errlen);
  if ((x = json_object_get(cfg, "ignore_class")) && !json_is_null(x))
    return unsupported("loss", "ignore_class", x, "only null", err, errlen);
  if ((x = json_object_get(cfg, "axis")) && !json_is_null(x) &&
      !(json_is_integer(x) && json_integer_value(x) == -1))
    return unsupported("loss", "axis", x, "only -1", err, errlen);
  bool logits = json_is_true(json_object_get(cfg, "from_logits"));
  int n = snprintf(out, len, "%s%s", c->name, logits ? "_from_logits" : "");
  if ((x = json_object_get(cfg, "delta")) && !json_is_null(x)) {
    if (!json_is_number(x) || !(json_number_value(x) > 0))
      return tsr_errf(err, errlen, TSR_ECONFIG,
                      "loss.config.delta must be a number > 0");
    if (json_number_value(x) != 1.0)
      snprintf(out + n, len - (size_t)n, "@delta=%.17g",
               json_number_value(x));
  }
  return 0;
}

int tsr_metric_canon(json_t *v, char *out, size_t len, char *err,
                     size_t errlen) {
  const kn_class *c;
  json_t *cfg, *x;
  int rc = kn_name_or_lookup(v, &kn_metric, out, len, &c, &cfg, err, errlen);
  if (rc) return rc > 0 ? 0 : rc;
  int n = snprintf(out, len, "%s", c->name);
  const char *w = "metric";
  if ((x = json_object_get(cfg, "threshold")) && !json_is_null(x) &&
      !(json_is_number(x) && json_number_value(x) == 0.5))
    return unsupported(w, "threshold", x, "only 0.5", err, errlen);
  if ((x = json_object_get(cfg, "thresholds")) && !json_is_null(x) &&
      !(json_is_number(x) && json_number_value(x) == 0.5))
    return unsupported(w, "thresholds", x,
                       !strcmp(c->name, "auc")
                           ? "the curve is computed exactly, from every score"
                           : "only 0.5",
                       err, errlen);
  if ((x = json_object_get(cfg, "top_k")) && !json_is_null(x))
    return unsupported(w, "top_k", x, "only null", err, errlen);
  if ((x = json_object_get(cfg, "class_id")) && !json_is_null(x))
    return unsupported(w, "class_id", x, "only null", err, errlen);
  if ((x = json_object_get(cfg, "curve")) && !json_is_null(x) &&
      !(json_is_string(x) && !strcmp(json_string_value(x), "ROC")))
    return unsupported(w, "curve", x, "only ROC", err, errlen);
  if ((x = json_object_get(cfg, "summation_method")) && !json_is_null(x) &&
      !(json_is_string(x) && !strcmp(json_string_value(x), "interpolation")))
    return unsupported(w, "summation_method", x,
                       "the exact area, which interpolation approximates",
                       err, errlen);
  if ((x = json_object_get(cfg, "label_weights")) && !json_is_null(x))
    return unsupported(w, "label_weights", x, "only null", err, errlen);
  if ((x = json_object_get(cfg, "from_logits")) && json_is_true(x))
    n += snprintf(out + n, len - (size_t)n, "@from_logits");
  if ((x = json_object_get(cfg, "multi_label")) && json_is_true(x))
    n += snprintf(out + n, len - (size_t)n, "@multi_label");
  if ((x = json_object_get(cfg, "k")) && !json_is_null(x)) {
    if (!json_is_integer(x) || json_integer_value(x) < 1 ||
        json_integer_value(x) > 1000000)
      return tsr_errf(err, errlen, TSR_ECONFIG,
                      "metric.config.k must be a positive integer");
    if (json_integer_value(x) != 5)
      snprintf(out + n, len - (size_t)n, "@k=%lld",
               (long long)json_integer_value(x));
  }
  return 0;
}
