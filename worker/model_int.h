/* Internals of the model module shared by its files: model.c (building
 * from JSON), model_exec.c (running on a compute context), metrics.c. */
#ifndef TSR_WK_MODEL_INT_H
#define TSR_WK_MODEL_INT_H

#include "worker/model.h"

#define WK_MAX_LAYERS 64
#define WK_MAX_EMB 64
#define WK_MAX_METRICS 8

typedef enum {
  WK_L_DENSE = 0,
  WK_L_ACTIVATION,
  WK_L_DROPOUT
} wk_layer_kind;

typedef struct {
  wk_layer_kind kind;
  char name[64];
  char cls[32];
  int64_t in, out;       /* widths */
  kern_act act;
  float alpha;           /* leaky_relu slope, elu alpha */
  bool use_bias;
  int var_w, var_b;      /* variable indices (-1 when none) */
  float rate;            /* dropout */
} wk_layer;

/* One embedding lookup feeding the first Dense layer (or the wide logit). */
typedef struct {
  int var;               /* its row-sparse variable */
  int64_t dim, vocab;
  int feature;           /* sparse feature index; -1: ids are x columns */
  int64_t id_offset;     /* added to ids (the shared wide table) */
  kern_pool pool;
  bool per_id;           /* one bag per id (Sequential Embedding + Flatten) */
  int64_t out_off;       /* column in the embedding block */
  bool wide;             /* adds to the output logit instead */
} wk_embed;

typedef enum {
  WK_M_ACCURACY = 0,
  WK_M_AUC,
  WK_M_MSE,
  WK_M_MAE,
  WK_M_PRECISION,
  WK_M_RECALL,
  WK_M_TOP_K
} wk_metric_kind;

typedef struct {
  wk_metric_kind kind;
  int k;                 /* top-k */
  bool multi_label;      /* auc: mean of per-class AUCs (else pooled) */
  bool from_logits;      /* auc, precision, recall: scores are logits */
} wk_metric;

struct wk_model {
  bool wide_deep;
  int64_t n_dense;       /* dense features read from x (0: none used) */
  int64_t seq_ids;       /* Sequential Embedding: ids per example (x columns) */
  int64_t emb_width;     /* width of the embedding block fed to layer 0 */
  wk_embed emb[WK_MAX_EMB];
  int n_emb;             /* including the wide one */
  int n_sparse;          /* sparse features read from the batch */
  wk_layer layers[WK_MAX_LAYERS];
  int n_layers;
  wk_var_info *vars;
  int n_vars;
  kern_loss loss;
  bool fused;            /* the loss takes the last Dense layer's z */
  char loss_name[64];
  int64_t out_dim;
  bool onehot_labels;    /* categorical_crossentropy on class indices */
  bool class_labels;     /* labels are class indices in [0, out_dim) */
  float loss_param;      /* huber's delta (0: the default) */
  bool logit_out;        /* the output is a logit (from_logits losses) */
  int n_metrics;
  wk_metric metrics[WK_MAX_METRICS];
  char metric_names[WK_MAX_METRICS][32];
};

int wk_model__fail(char *err, size_t len, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* loss.c: the loss and the metrics from the job's names (the model's
 * layers are built first: the output width and activation decide). */
int wk_model__resolve_loss(wk_model *m, const char *loss, char *err,
                           size_t errlen);
int wk_model__resolve_metrics(wk_model *m, char *const *names, int n,
                              char *err, size_t errlen);

#endif
