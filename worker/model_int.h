/* Internals of the model module shared by its files: model.c (building,
 * losses, variables), model_layers.c (the Keras layer table), model_graph.c
 * (Sequential and Functional graphs, the built-in wide_deep), model_exec.c
 * (batches, sparse plans, running), model_nodes.c (each node's forward and
 * backward), metrics.c.
 *
 * A model is a graph of nodes in topological order (every input of node k
 * has a smaller index) ending in its one output node. Tensors are
 * [batch, dims...] row-major float32; an image is [batch, h, w, c].
 */
#ifndef TSR_WK_MODEL_INT_H
#define TSR_WK_MODEL_INT_H

#include "kernels/kern_nn.h"
#include "common/err.h"
#include "worker/model_exec.h"

#define WK_MAX_LAYERS 128 /* nodes */
#define WK_MAX_EMB 128 /* lookups: a feature's deep and wide ones count apart */
#define WK_MAX_METRICS 8
#define WK_MAX_IN 8       /* inputs of one node (Add, Concatenate) */
#define WK_MAX_DIMS 3     /* tensor axes after the batch */

typedef enum {
  WK_L_INPUT = 0,  /* columns [x_off, x_off + size) of the batch */
  WK_L_EMBED,      /* embedding lookups of row-sparse variables (wk_embed) */
  WK_L_DENSE,      /* on the last axis */
  WK_L_CONV2D,
  WK_L_ACTIVATION, /* Activation, ReLU, LeakyReLU, Softmax, ELU layers */
  WK_L_DROPOUT,
  WK_L_RESHAPE,    /* Flatten, Reshape: a view of its input's memory */
  WK_L_POOL2D,     /* MaxPooling2D, AveragePooling2D */
  WK_L_GPOOL,      /* GlobalAveragePooling1D/2D: mean over the middle axes */
  WK_L_BATCHNORM,
  WK_L_LAYERNORM,
  WK_L_ADD,        /* Add, Subtract, Average */
  WK_L_CONCAT,
  WK_L_MUL,        /* Multiply (and Bidirectional's merge_mode mul) */
  WK_L_RNN,        /* LSTM or GRU, one direction (a Bidirectional is two
                    * and a merge) */
  WK_L_MHA,        /* MultiHeadAttention over the last axis */
  WK_L_ATTN        /* Attention (dot-product) */
} wk_layer_kind;

typedef enum { WK_CELL_LSTM = 0, WK_CELL_GRU } wk_cell;

typedef struct {
  wk_layer_kind kind;
  char name[64];
  char cls[32];
  int in[WK_MAX_IN];     /* producing nodes */
  int n_in;
  int root;              /* the node whose memory holds this output: itself,
                          * or for a Flatten/Reshape the node it views */
  int rank;              /* output axes after the batch (1..WK_MAX_DIMS) */
  int64_t dim[WK_MAX_DIMS];
  int64_t size;          /* elements per example */
  kern_act act;
  float alpha;           /* leaky_relu slope, elu alpha */
  bool use_bias;
  int var_w, var_b;      /* kernel/gamma and bias/beta variables (-1: none) */
  int var_mm, var_mv;    /* BatchNormalization moving mean and variance */
  float rate;            /* Dropout */
  kern_win win;          /* Conv2D, pooling */
  kern_pool2d pool;
  float eps;             /* BatchNormalization, LayerNormalization */
  int64_t norm_w;        /* LayerNormalization: elements per normalized row */
  int64_t x_off;         /* Input: first column in the batch */
  bool ids;              /* Input read only as ids by Embedding layers */
  int addend;            /* Dense: node added to z before the activation
                          * (the wide logit of wide_deep); -1: none */
  int cat_axis;          /* Concatenate: axis after the batch, 0-based */
  float coef;            /* Add: the scale of every input (Average: 1/k);
                          * Subtract: -1 for the second */
  bool needs_grad;       /* a trainable variable lies upstream (or here) */
  /* sequences: masks of Embedding(mask_zero) ids */
  int mask_src;          /* the EMBED node whose mask this output carries
                          * (-1: none) */
  bool mask_zero;        /* EMBED: id 0 is padding (a mask of its own) */
  int use_mask;          /* RNN, GPOOL, MHA (query), ATTN (query): the EMBED
                          * node whose mask it applies (-1: none) */
  int use_mask2;         /* MHA, ATTN: the value's (keys') mask */
  wk_cell cell;          /* RNN */
  int64_t units;         /* RNN; MHA: the output's last axis */
  bool reverse;          /* RNN: reads the sequence from its end */
  bool ret_seq;          /* RNN: every step's output, else the last */
  bool rev_out;          /* RNN: the outputs in reading order (Keras's
                          * go_backwards), else aligned with the input */
  bool zero_masked;      /* RNN: masked steps output zeros (else the
                          * carried state) */
  int64_t heads, key_dim, value_dim; /* MHA */
  int var_x[8];          /* more variables: RNN recurrent_kernel; MHA
                          * query, key, value, output kernels and biases */
} wk_layer;

/* One embedding lookup writing into an EMBED node's output. */
typedef struct {
  int var;               /* its row-sparse variable */
  int64_t dim, vocab;
  int feature;           /* sparse feature index; -1: ids are x columns */
  int64_t x_off;         /* feature -1: first id column */
  int64_t id_offset;     /* added to ids (the shared wide table) */
  kern_pool pool;
  bool per_id;           /* one bag per id (Keras Embedding: [L, dim]) */
  int node;              /* the EMBED node it writes */
  int64_t out_off;       /* column in that node's output row */
  bool wide;             /* the wide logit (a [1] node) */
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

struct tsr_model {
  bool wide_deep;
  int64_t n_dense;       /* dense columns the batch must have */
  bool named_inputs;     /* inputs placed by feature name (else in order) */
  wk_embed emb[WK_MAX_EMB];
  int n_emb;             /* including the wide ones */
  int n_sparse;          /* sparse features read from the batch */
  wk_layer layers[WK_MAX_LAYERS];
  int n_layers;          /* the output is layers[n_layers - 1] */
  tsr_var *vars;
  int n_vars;
  bool has_reg;          /* some variable has an l1/l2 regularizer */
  kern_loss loss;
  bool fused;            /* the loss takes the output's pre-activation */
  char loss_name[64];
  int64_t out_dim;
  bool onehot_labels;    /* categorical_crossentropy on class indices */
  bool class_labels;     /* labels are class indices in [0, out_dim) */
  float loss_param;      /* huber's delta (0: the default) */
  bool logit_out;        /* the output is a logit (from_logits losses) */
  int n_metrics;
  wk_metric metrics[WK_MAX_METRICS];
  char metric_names[WK_MAX_METRICS][TSR_METRIC_NAME_MAX];
};

/* ---- building (model.c, model_layers.c, model_graph.c) ------------------ */

/* Appends a variable; returns its index or a negative code. Conv kernels
 * get Keras's fans (receptive field times channels). */
int tsr_model__add_var(tsr_model *m, const char *layer, const char *vname,
                      int rank, const int64_t *shape,
                      const tsr_init_spec *init, tsr_var_kind kind);
/* Appends a node with the given inputs, its name and class; NULL when the
 * graph is full (the error is in err). */
wk_layer *tsr_model__add_node(tsr_model *m, wk_layer_kind kind,
                             const char *name, const char *cls,
                             const int *in, int n_in, char *err,
                             size_t errlen);
/* Keras's default layer name for the nth layer of a class. */
void tsr_model__keras_name(const char *cls, int nth, char *out, size_t len);
/* Keras activation (a name, null, or a serialized function). */
int tsr_model__parse_act(const json_t *j, const char *layer, kern_act *act,
                        float *alpha, char *err, size_t errlen);
/* Keras initializer (a name or {"class_name", "config"}). */
int tsr_model__parse_init(const json_t *j, const char *def, const char *where,
                         tsr_init_spec *out, char *err, size_t errlen);

/* Parses one Keras layer (class_name and config) onto the graph, reading
 * the nodes `in` (n_in of them; the Sequential's previous node, or the
 * Functional's inbound tensors). Keras 2 and 3 spellings; an unknown class
 * or an option Tessera does not implement is an error that names the
 * layer, the key and what is supported. Sets *out to the new node, or to
 * the input itself for layers that compute nothing (InputLayer is handled
 * by the callers). */
int tsr_model__parse_layer(tsr_model *m, const char *cls, const json_t *cfg,
                          const char *name, const int *in, int n_in,
                          int *out, char *err, size_t errlen);
/* "InputLayer, Dense, Conv2D, ..." from the layer table, for messages. */
void tsr_model__layers_supported(char *buf, size_t len);

int tsr_model__parse_sequential(tsr_model *m, const json_t *root, char *err,
                               size_t errlen);
int tsr_model__parse_functional(tsr_model *m, const json_t *root,
                               const wk_input_schema *sc, char *err,
                               size_t errlen);
int tsr_model__parse_wide_deep(tsr_model *m, const json_t *j,
                              const wk_input_schema *sc, char *err,
                              size_t errlen);
/* After parsing: roots of views, needs_grad, checks that every node leads
 * to the output. */
int tsr_model__finish_graph(tsr_model *m, char *err, size_t errlen);

/* True when the node applies its activation to a buffer of its own (the
 * "logits" a fused cross-entropy reads): Dense, Conv2D, Activation. */
bool tsr_model__has_logits(const wk_layer *l);

/* ---- running (model_exec.c, model_nodes.c) ------------------------------ */

typedef struct {           /* per row-sparse variable */
  int var;
  bool wide;
  int64_t dim;
  int first_emb;           /* its first wk_embed */
  int64_t *uniq;           /* sorted unique ids */
  int64_t n_uniq, cap_uniq;
  /* the slice's (id, occurrence) pairs and the radix sort's second buffer */
  struct wk_idpos { int64_t id; int64_t at; } *pairs, *pairs_tmp;
  int64_t cap_pairs;
  /* gather: bags and their local row indices */
  int32_t *idx, *bag_off;
  int64_t n_idx, cap_idx, n_bags, cap_bags;
  /* scatter: per unique row its (bag, weight) occurrences */
  int32_t *occ_off, *occ_bag;
  float *occ_w;
  /* device copies (aliases on the CPU) */
  int32_t *d_idx, *d_bag_off, *d_occ_off, *d_occ_bag;
  float *d_occ_w;
  int64_t dcap_idx, dcap_bags, dcap_uniq;
} wk_splan;

struct wk_exec {
  const tsr_model *m;
  kern_ctx *ctx;
  bool host;
  int64_t maxb;
  kern_prec prec;
  bool x_float;            /* some input is read as numbers */
  /* prepared slice */
  const wk_batch *b;
  int64_t lo, n;
  float *hlab, *hpred, *hloss;
  int64_t lab_w;           /* label columns on the device */
  wk_splan sp[WK_MAX_EMB];
  int n_sp;
  /* device tensors, per node (views share their root's) */
  float *x;                /* the slice's dense columns [n, n_dense] */
  float *lab, *exl;
  float *y[WK_MAX_LAYERS], *z[WK_MAX_LAYERS], *dy[WK_MAX_LAYERS];
  bool own_y[WK_MAX_LAYERS], own_z[WK_MAX_LAYERS];
  float *mask[WK_MAX_LAYERS];          /* Dropout */
  int32_t *arg[WK_MAX_LAYERS];         /* MaxPooling2D winners */
  float *st_a[WK_MAX_LAYERS], *st_b[WK_MAX_LAYERS]; /* BN mean/var, LN
                                                     * mean/rstd */
  float *ws[WK_MAX_LAYERS];            /* RNN, MHA, ATTN: what the forward
                                        * keeps for the backward */
  float *seqmask[WK_MAX_LAYERS];       /* EMBED with mask_zero: [n, L] */
  float *hmask;                        /* host staging of those masks */
  float *seq_scratch;                  /* backward scratch of sequence
                                        * nodes (the largest one's) */
  float *zeros;                        /* zeros: initial states */
  bool dy_set[WK_MAX_LAYERS];          /* written this backward pass */
  float *acc;              /* a gradient to add where one is already */
  float *dz;               /* activation gradients */
  float *cols;             /* convolution workspace (kern_conv2d_ws) */
  int64_t cols_n;          /* floats in cols */
  /* parameters and gradients on the device */
  float **dp, **dg;
  int64_t *dcap;           /* allocated elements of dp/dg (sparse grow) */
  double reg;              /* regularization loss of the last run */
  /* overlap hooks (wk_run_opts): per variable, the node whose backward
   * pass finishes its gradient (WK_READY_* for the later points), and
   * whether grad_ready ran this pass */
  int *ready_at;
  bool *readied;
};

#define WK_READY_SCATTER (-1) /* row-sparse: after the scatters */
#define WK_READY_REG (-2)     /* regularized: after the regularizers */
#define WK_READY_END (-3)     /* no node writes it: at the end of the run */

/* The overlap hooks (model_exec.c), on the CPU only (a GPU run calls them
 * around its uploads and downloads): need(v) before v is first read;
 * after node k's backward pass, done(k) says ready for every variable
 * finished there (k may be a WK_READY_* point). */
int wk_exec__need(wk_exec *e, const wk_run_opts *o, int v);
void wk_exec__done(wk_exec *e, const wk_run_opts *o, int k);

/* model_nodes_seq.c: the sequence nodes (RNN, MHA, ATTN, MUL, masked
 * GlobalAveragePooling1D). Floats of a node's own workspace (*ws) and of
 * the backward scratch it needs (*scratch), for batches of maxb, both 0 for
 * a node that is not a sequence node; forward and backward. */
void wk_exec__seq_sizes(const tsr_model *m, const wk_layer *l, int64_t maxb,
                        int64_t *ws, int64_t *scratch);
int wk_exec__seq_fwd(wk_exec *e, const wk_layer *l, int k,
                     const wk_run_opts *o);
int wk_exec__seq_bwd(wk_exec *e, const wk_layer *l, int k);
/* Every variable of a node (var_w, var_b, the moving statistics, var_x),
 * -1 where none; returns how many slots it filled (12). */
int tsr_model__node_vars(const wk_layer *l, int out[12]);

int wk_exec__forward(wk_exec *e, const wk_run_opts *o);
int wk_exec__backward(wk_exec *e, const wk_run_opts *o);

/* loss.c: the loss and the metrics from the job's names (the model's
 * layers are built first: the output width and activation decide). */
int tsr_model__resolve_loss(tsr_model *m, const char *loss, char *err,
                           size_t errlen);
int tsr_model__resolve_metrics(tsr_model *m, char *const *names, int n,
                              char *err, size_t errlen);

#endif
