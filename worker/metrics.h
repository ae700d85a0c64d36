/* Evaluation metrics over many batches, as Keras's compiled metrics:
 * the mean loss, accuracy (sparse categorical, categorical or binary,
 * chosen from the loss as Keras does), AUC (ROC, exact: from all scores of
 * the evaluation, ties counted half; several classes one-vs-rest, pooled
 * or, with multi_label, averaged per class), precision and recall (scores
 * above 0.5 against the labels, over every class of a one-hot view), top-k
 * accuracy, mse and mae. Logit outputs (the *_from_logits losses) are
 * turned into probabilities first.
 *
 * Happy path: open for a model, add every batch's predictions (the model's
 * outputs: probabilities, or logits for the *_from_logits losses), read the
 * results. Failure modes: allocation only.
 */
#ifndef TSR_WK_METRICS_H
#define TSR_WK_METRICS_H

#include <stdint.h>

#include "worker/model.h"

typedef struct wk_metrics wk_metrics;

int wk_metrics_open(const tsr_model *m, wk_metrics **out);
void wk_metrics_close(wk_metrics *mt);
void wk_metrics_reset(wk_metrics *mt);
/* pred [n, out_dim], labels [n] (class index or target). */
int wk_metrics_add(wk_metrics *mt, const float *pred, const float *labels,
                   int64_t n, double loss_sum);
/* Mean loss and one value per compiled metric (tsr_model_metric_name). */
void wk_metrics_result(wk_metrics *mt, double *loss, double *values);
int64_t wk_metrics_count(const wk_metrics *mt);

/* Area under the ROC curve of scores against 0/1 labels (0.5 when one
 * class is absent). Sorts a copy; returns a negative code on allocation
 * failure. */
int wk_auc(const float *score, const float *label, int64_t n, double *auc);

#endif
