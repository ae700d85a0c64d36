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
  const wk_model *m;
  double loss_sum;
  int64_t n;
  int64_t correct;
  double se, ae;
  float *score, *lab;
  int64_t cap;
};

int wk_metrics_open(const wk_model *m, wk_metrics **out) {
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
  mt->n = mt->correct = 0;
}

int64_t wk_metrics_count(const wk_metrics *mt) { return mt->n; }

int wk_metrics_add(wk_metrics *mt, const float *pred, const float *labels,
                   int64_t n, double loss_sum) {
  const wk_model *m = mt->m;
  int64_t d = m->out_dim;
  bool want_auc = false;
  for (int k = 0; k < m->n_metrics; k++) want_auc |= m->metrics[k] == WK_M_AUC;
  if (want_auc && mt->n + n > mt->cap) {
    int64_t nc = (mt->n + n) * 2;
    float *s = realloc(mt->score, (size_t)nc * sizeof *s);
    if (!s) return TSR_ENOMEM;
    mt->score = s;
    float *l = realloc(mt->lab, (size_t)nc * sizeof *l);
    if (!l) return TSR_ENOMEM;
    mt->lab = l;
    mt->cap = nc;
  }
  for (int64_t i = 0; i < n; i++) {
    const float *p = pred + i * d;
    float y = labels[i];
    if (d > 1) {
      int64_t am = 0;
      for (int64_t j = 1; j < d; j++) if (p[j] > p[am]) am = j;
      mt->correct += (float)am == y;
    } else {
      float prob = p[0];
      if (m->logit_out) prob = 1.0f / (1.0f + expf(-prob));
      bool pos = prob > 0.5f;
      mt->correct += pos == (y > 0.5f);
      double e = (double)p[0] - y;
      mt->se += e * e;
      mt->ae += fabs(e);
      if (want_auc) {
        mt->score[mt->n + i] = prob;
        mt->lab[mt->n + i] = y;
      }
    }
  }
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

void wk_metrics_result(wk_metrics *mt, double *loss, double *values) {
  const wk_model *m = mt->m;
  double n = mt->n > 0 ? (double)mt->n : 1.0;
  *loss = mt->loss_sum / n;
  for (int k = 0; k < m->n_metrics; k++) {
    switch (m->metrics[k]) {
      case WK_M_ACCURACY: values[k] = (double)mt->correct / n; break;
      case WK_M_MSE: values[k] = mt->se / n; break;
      case WK_M_MAE: values[k] = mt->ae / n; break;
      case WK_M_AUC:
        if (wk_auc(mt->score, mt->lab, mt->n, &values[k])) values[k] = NAN;
        break;
    }
  }
}
