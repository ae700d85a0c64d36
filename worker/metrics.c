/* Metrics accumulated over evaluation batches; see metrics.h. AUC keeps
 * every (score, label) pair of the evaluation and sorts once at the end,
 * which is exact where Keras's 200 thresholds interpolate. */
#include "worker/metrics.h"
#include "worker/model_int.h"

#include "common/err.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct wk_metrics {
  const tsr_model *m;
  double loss_sum;
  int64_t n;
  int64_t correct;
  double se, ae;
  int64_t tp, fp, fn;       /* precision, recall (threshold 0.5) */
  int64_t topk[WK_MAX_METRICS]; /* per top-k metric: hits */
  float *score, *lab;       /* auc: probabilities [n, d] and labels [n] */
  int64_t cap;
};

int wk_metrics_open(const tsr_model *m, wk_metrics **out) {
  wk_metrics *mt = calloc(1, sizeof *mt);
  if (!mt) return TSR_ENOMEM;
  mt->m = m;
  *out = mt;
  return 0;
}

void wk_metrics_close(wk_metrics *mt) {
  if (!mt) return;
  free(mt->score);
  free(mt->lab);
  free(mt);
}

void wk_metrics_reset(wk_metrics *mt) {
  mt->loss_sum = mt->se = mt->ae = 0;
  mt->n = mt->correct = mt->tp = mt->fp = mt->fn = 0;
  memset(mt->topk, 0, sizeof mt->topk);
}

int64_t wk_metrics_count(const wk_metrics *mt) { return mt->n; }

/* Probabilities of one output row (the model's outputs are logits with
 * the *_from_logits losses: sigmoid for one unit, softmax for several). */
static void probs(const tsr_model *m, const float *p, int64_t d, float *q) {
  if (!m->logit_out) {
    memcpy(q, p, (size_t)d * sizeof *q);
    return;
  }
  if (d == 1) {
    q[0] = 1.0f / (1.0f + expf(-p[0]));
    return;
  }
  float mx = p[0];
  for (int64_t j = 1; j < d; j++) mx = p[j] > mx ? p[j] : mx;
  double sum = 0;
  for (int64_t j = 0; j < d; j++) sum += exp((double)(p[j] - mx));
  for (int64_t j = 0; j < d; j++)
    q[j] = (float)(exp((double)(p[j] - mx)) / sum);
}

int wk_metrics_add(wk_metrics *mt, const float *pred, const float *labels,
                   int64_t n, double loss_sum) {
  const tsr_model *m = mt->m;
  int64_t d = m->out_dim;
  bool want_auc = false;
  for (int k = 0; k < m->n_metrics; k++)
    want_auc |= m->metrics[k].kind == WK_M_AUC;
  if (want_auc && mt->n + n > mt->cap) {
    int64_t nc = (mt->n + n) * 2;
    float *sc = realloc(mt->score, (size_t)(nc * d) * sizeof *sc);
    if (!sc) return TSR_ENOMEM;
    mt->score = sc;
    float *l = realloc(mt->lab, (size_t)nc * sizeof *l);
    if (!l) return TSR_ENOMEM;
    mt->lab = l;
    mt->cap = nc;
  }
  float qs[64], *q = d <= 64 ? qs : malloc((size_t)d * sizeof *q);
  if (!q) return TSR_ENOMEM;
  for (int64_t i = 0; i < n; i++) {
    const float *p = pred + i * d;
    float y = labels[i];
    probs(m, p, d, q);
    if (d > 1) {
      int64_t am = 0, cls = (int64_t)y;
      for (int64_t j = 1; j < d; j++) if (p[j] > p[am]) am = j;
      mt->correct += (float)am == y;
      /* top-k: the true class is among the k largest */
      int64_t above = 0;
      for (int64_t j = 0; j < d; j++) above += cls >= 0 && cls < d && p[j] > p[cls];
      for (int k = 0; k < m->n_metrics; k++)
        if (m->metrics[k].kind == WK_M_TOP_K && above < m->metrics[k].k)
          mt->topk[k]++;
      /* precision / recall over every (example, class) pair, as Keras
       * thresholds one-hot labels elementwise */
      for (int64_t j = 0; j < d; j++) {
        bool pos = q[j] > 0.5f, t = j == cls;
        mt->tp += pos && t;
        mt->fp += pos && !t;
        mt->fn += !pos && t;
      }
    } else {
      bool pos = q[0] > 0.5f, t = y > 0.5f;
      mt->correct += pos == t;
      mt->tp += pos && t;
      mt->fp += pos && !t;
      mt->fn += !pos && t;
      double e = (double)p[0] - y;
      mt->se += e * e;
      mt->ae += fabs(e);
    }
    if (want_auc) {
      memcpy(mt->score + (mt->n + i) * d, q, (size_t)d * sizeof *q);
      mt->lab[mt->n + i] = y;
    }
  }
  if (q != qs) free(q);
  mt->n += n;
  mt->loss_sum += loss_sum;
  return 0;
}

typedef struct { float s, y; } wk_pair;
static int cmp_pair(const void *a, const void *b) {
  float x = ((const wk_pair *)a)->s, y = ((const wk_pair *)b)->s;
  return (x > y) - (x < y);
}

int wk_auc(const float *score, const float *label, int64_t n, double *auc) {
  *auc = 0.5;
  if (n < 1) return 0;
  wk_pair *p = malloc((size_t)n * sizeof *p);
  if (!p) return TSR_ENOMEM;
  for (int64_t i = 0; i < n; i++) {
    p[i].s = score[i];
    p[i].y = label[i];
  }
  qsort(p, (size_t)n, sizeof *p, cmp_pair);
  /* Mann-Whitney: sum of positive ranks, ties get the mean rank */
  double rank_sum = 0, npos = 0;
  for (int64_t i = 0; i < n;) {
    int64_t j = i;
    double pos = 0;
    while (j < n && p[j].s == p[i].s) pos += p[j++].y > 0.5f;
    rank_sum += pos * ((double)(i + 1) + (double)j) / 2.0;
    npos += pos;
    i = j;
  }
  double nneg = (double)n - npos;
  if (npos > 0 && nneg > 0)
    *auc = (rank_sum - npos * (npos + 1) / 2.0) / (npos * nneg);
  free(p);
  return 0;
}

/* Multi-class AUC, one-vs-rest as Keras computes it on one-hot labels:
 * pooled over every (example, class) pair (Keras's default
 * multi_label=False), or the mean of the per-class AUCs (multi_label). */
static int auc_multi(const float *score, const float *lab, int64_t n,
                     int64_t d, bool per_class, double *out) {
  int64_t total = per_class ? n : n * d;
  float *s = malloc((size_t)(total ? total : 1) * sizeof *s);
  float *y = malloc((size_t)(total ? total : 1) * sizeof *y);
  int rc = 0;
  if (!s || !y) {
    rc = TSR_ENOMEM;
    goto out;
  }
  if (!per_class) {
    for (int64_t i = 0; i < n; i++)
      for (int64_t j = 0; j < d; j++) {
        s[i * d + j] = score[i * d + j];
        y[i * d + j] = (float)((int64_t)lab[i] == j);
      }
    rc = wk_auc(s, y, total, out);
    goto out;
  }
  double sum = 0;
  for (int64_t j = 0; j < d && !rc; j++) {
    for (int64_t i = 0; i < n; i++) {
      s[i] = score[i * d + j];
      y[i] = (float)((int64_t)lab[i] == j);
    }
    double a;
    rc = wk_auc(s, y, n, &a);
    sum += a;
  }
  *out = sum / (double)d;
out:
  free(s);
  free(y);
  return rc;
}

void wk_metrics_result(wk_metrics *mt, double *loss, double *values) {
  const tsr_model *m = mt->m;
  double n = mt->n > 0 ? (double)mt->n : 1.0;
  *loss = mt->loss_sum / n;
  for (int k = 0; k < m->n_metrics; k++) {
    const wk_metric *me = &m->metrics[k];
    switch (me->kind) {
      case WK_M_ACCURACY: values[k] = (double)mt->correct / n; break;
      case WK_M_MSE: values[k] = mt->se / n; break;
      case WK_M_MAE: values[k] = mt->ae / n; break;
      case WK_M_PRECISION:
        values[k] = mt->tp + mt->fp ? (double)mt->tp / (double)(mt->tp + mt->fp)
                                    : 0.0;
        break;
      case WK_M_RECALL:
        values[k] = mt->tp + mt->fn ? (double)mt->tp / (double)(mt->tp + mt->fn)
                                    : 0.0;
        break;
      case WK_M_TOP_K: values[k] = (double)mt->topk[k] / n; break;
      case WK_M_AUC: {
        int rc = m->out_dim == 1
                     ? wk_auc(mt->score, mt->lab, mt->n, &values[k])
                     : auc_multi(mt->score, mt->lab, mt->n, m->out_dim,
                                 me->multi_label, &values[k]);
        if (rc) values[k] = NAN;
        break;
      }
    }
  }
}
