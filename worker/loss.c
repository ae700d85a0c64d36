/* The model's loss and metrics, resolved as Keras's compile() resolves
 * them, from the job's names (Keras names, or the canonical text
 * common/keras_names.c makes of serialized objects: "huber@delta=2",
 * "auc@multi_label", "top_k_categorical_accuracy@k=3").
 *
 * Happy path: strip "_from_logits" and the "@" options, pick the kernel
 * loss (a sigmoid or softmax output with a cross-entropy loss is computed
 * from its logits, as Keras does through _keras_logits), then check that
 * the output width suits it; each metric likewise.
 * Failure modes: an unknown loss, metric or option (TSR_EUNSUPPORTED, with
 * the supported list), a width that does not suit (TSR_ESHAPE, naming the
 * output layer and its units).
 */
#include "worker/model_int.h"

#include "common/err.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LOSSES_SUPPORTED                                                    \
  "mse, mae, huber, kld, binary_crossentropy, categorical_crossentropy, "   \
  "sparse_categorical_crossentropy (append _from_logits for logit "        \
  "outputs), or their Keras classes"

static bool is(const char *s, const char *a, const char *b, const char *c) {
  return !strcmp(s, a) || (b && !strcmp(s, b)) || (c && !strcmp(s, c));
}

/* Splits "name@a=1@b" into name (in `base`) and options; returns the value
 * of option `key` (or "" for a flag) or NULL. */
static const char *opt(const char *full, const char *key, char *buf,
                       size_t len) {
  size_t kl = strlen(key);
  for (const char *p = strchr(full, '@'); p; p = strchr(p + 1, '@')) {
    if (strncmp(p + 1, key, kl)) continue;
    const char *e = p + 1 + kl;
    if (*e == '@' || !*e) return "";
    if (*e != '=') continue;
    size_t n = strcspn(e + 1, "@");
    if (n >= len) n = len - 1;
    memcpy(buf, e + 1, n);
    buf[n] = 0;
    return buf;
  }
  return NULL;
}

int tsr_model__resolve_loss(tsr_model *m, const char *loss, char *err,
                           size_t errlen) {
  char base[64];
  snprintf(base, sizeof base, "%s", loss ? loss : "mse");
  char *at = strchr(base, '@');
  if (at) *at = 0;
  bool from_logits = false;
  char *suf = strstr(base, "_from_logits");
  if (suf && suf[12] == 0) {
    *suf = 0;
    from_logits = true;
  }
  wk_layer *last = &m->layers[m->n_layers - 1];
  kern_act la = last->act;
  bool last_dense = tsr_model__has_logits(last);
  snprintf(m->loss_name, sizeof m->loss_name, "%s", loss ? loss : "mse");
  m->logit_out = from_logits;
  m->loss_param = 0;
  bool cls = false; /* labels are class indices */
  if (is(base, "mse", "mean_squared_error", "MeanSquaredError")) {
    m->loss = KERN_LOSS_MSE;
  } else if (is(base, "mae", "mean_absolute_error", "MeanAbsoluteError")) {
    m->loss = KERN_LOSS_MAE;
  } else if (is(base, "huber", "huber_loss", "Huber")) {
    m->loss = KERN_LOSS_HUBER;
    char b[64];
    const char *d = opt(loss, "delta", b, sizeof b);
    if (d) {
      char *e;
      m->loss_param = strtof(d, &e);
      if (*e || !(m->loss_param > 0))
        return tsr_errf(err, errlen, TSR_ECONFIG,
                        "loss %s: delta must be a number > 0",
                        loss);
    }
  } else if (is(base, "binary_crossentropy", "BinaryCrossentropy", NULL)) {
    if (from_logits) m->loss = KERN_LOSS_BCE_LOGITS;
    else if (la == KERN_ACT_SIGMOID && last_dense) {
      m->loss = KERN_LOSS_BCE_LOGITS;
      m->fused = true;
    } else m->loss = KERN_LOSS_BCE_PROBS;
  } else if (is(base, "categorical_crossentropy", "CategoricalCrossentropy",
                "sparse_categorical_crossentropy") ||
             !strcmp(base, "SparseCategoricalCrossentropy")) {
    bool sparse = strstr(base, "parse") != NULL;
    if (from_logits || (la == KERN_ACT_SOFTMAX && last_dense)) {
      m->loss = sparse ? KERN_LOSS_SPARSE_CCE_LOGITS : KERN_LOSS_CCE_LOGITS;
      m->fused = !from_logits;
    } else {
      m->loss = sparse ? KERN_LOSS_SPARSE_CCE_PROBS : KERN_LOSS_CCE_PROBS;
    }
    if (m->out_dim < 2)
      return tsr_errf(err, errlen, TSR_ESHAPE,
                      "loss %s needs an output of at least 2 classes;"
                      " the model's last layer '%s' has %lld unit(s)", loss,
                      last->name, (long long)m->out_dim);
    /* class indices from the data (one-hot rows are read as indices, see
     * worker/INPUT.md); the dense form is built here */
    m->onehot_labels = !sparse;
    cls = true;
  } else if (is(base, "kld", "kl_divergence", "kullback_leibler_divergence") ||
             is(base, "KLD", "KLDivergence", NULL)) {
    if (from_logits)
      return tsr_errf(err, errlen, TSR_EUNSUPPORTED,
                      "loss %s: kld takes probabilities; "
                      "_from_logits is not supported", loss);
    if (m->out_dim < 2)
      return tsr_errf(err, errlen, TSR_ESHAPE,
                      "loss %s compares distributions: it needs an "
                      "output of at least 2 units; the model's last layer '%s' "
                      "has %lld", loss, last->name, (long long)m->out_dim);
    m->loss = KERN_LOSS_KLD;
    m->onehot_labels = true;
    cls = true;
  } else {
    return tsr_errf(err, errlen, TSR_EUNSUPPORTED,
                    "loss '%s' is not supported (supported: %s)",
                    loss, LOSSES_SUPPORTED);
  }
  if (from_logits && !cls && m->loss != KERN_LOSS_BCE_LOGITS)
    return tsr_errf(err, errlen, TSR_EUNSUPPORTED,
                    "loss %s: _from_logits applies to the "
                    "cross-entropies only", loss);
  m->class_labels = cls;
  if (!cls && m->out_dim != 1)
    return tsr_errf(err, errlen, TSR_ESHAPE,
                    "loss %s: the model's output has %lld units but "
                    "the data has one label per example", loss,
                    (long long)m->out_dim);
  return 0;
}

#define METRICS_SUPPORTED                                                   \
  "accuracy, auc, precision, recall, top_k_categorical_accuracy, "          \
  "sparse_top_k_categorical_accuracy, mse, mae, or their Keras classes"

int tsr_model__resolve_metrics(tsr_model *m, char *const *names, int n,
                              char *err, size_t errlen) {
  if (n > WK_MAX_METRICS)
    return tsr_errf(err, errlen, TSR_ERANGE,
                    "metrics: at most %d", WK_MAX_METRICS);
  for (int i = 0; i < n; i++) {
    const char *full = names[i];
    char s[TSR_METRIC_NAME_MAX];
    size_t base = strcspn(full, "@");
    /* a name is kept whole in every output: one that would not fit is
     * refused (every supported one fits) */
    if (base >= sizeof s)
      return tsr_errf(err, errlen, TSR_EUNSUPPORTED,
                      "metric '%s' is not supported (supported: %s)", full,
                      METRICS_SUPPORTED);
    snprintf(s, sizeof s, "%.*s", (int)base, full);
    char *at = strchr(s, '@');
    if (at) *at = 0;
    wk_metric *mt = &m->metrics[m->n_metrics];
    memset(mt, 0, sizeof *mt);
    char b[32];
    if (is(s, "accuracy", "acc", "sparse_categorical_accuracy") ||
        is(s, "categorical_accuracy", "binary_accuracy", NULL)) {
      mt->kind = WK_M_ACCURACY;
    } else if (is(s, "auc", "AUC", NULL)) {
      mt->kind = WK_M_AUC;
      mt->multi_label = opt(full, "multi_label", b, sizeof b) != NULL;
    } else if (is(s, "precision", "Precision", NULL)) {
      mt->kind = WK_M_PRECISION;
    } else if (is(s, "recall", "Recall", NULL)) {
      mt->kind = WK_M_RECALL;
    } else if (is(s, "top_k_categorical_accuracy",
                  "sparse_top_k_categorical_accuracy", NULL)) {
      mt->kind = WK_M_TOP_K;
      mt->k = 5;
      const char *k = opt(full, "k", b, sizeof b);
      if (k) mt->k = atoi(k);
      if (m->out_dim < 2)
        return tsr_errf(err, errlen, TSR_ESHAPE,
                        "metric %s: needs a multi-class output; the "
                        "model has %lld unit(s)", full, (long long)m->out_dim);
      if (mt->k < 1)
        return tsr_errf(err, errlen, TSR_ECONFIG,
                        "metric %s: k must be >= 1", full);
    } else if (is(s, "mse", "mean_squared_error", NULL)) {
      mt->kind = WK_M_MSE;
    } else if (is(s, "mae", "mean_absolute_error", NULL)) {
      mt->kind = WK_M_MAE;
    } else {
      return tsr_errf(err, errlen, TSR_EUNSUPPORTED,
                      "metric '%s' is not supported "
                      "(supported: %s)", full, METRICS_SUPPORTED);
    }
    mt->from_logits = opt(full, "from_logits", b, sizeof b) != NULL;
    if ((mt->kind == WK_M_MSE || mt->kind == WK_M_MAE) && m->out_dim != 1)
      return tsr_errf(err, errlen, TSR_EUNSUPPORTED,
                      "metric %s: needs a single output (one "
                      "label per example); the model has %lld", full,
                      (long long)m->out_dim);
    snprintf(m->metric_names[m->n_metrics], sizeof m->metric_names[0], "%s", s);
    m->n_metrics++;
  }
  return 0;
}
