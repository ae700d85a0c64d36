/* Internals of the layer parsers shared by model_layers.c (the table,
 * config helpers, layers with variables) and model_layers_plain.c
 * (activation layers, Dropout, merges). */
#ifndef TSR_WK_MODEL_LAYERS_INT_H
#define TSR_WK_MODEL_LAYERS_INT_H

#include "worker/model_int.h"
#include "common/err.h"

typedef struct {
  tsr_model *m;
  const char *cls;
  const json_t *cfg;
  const char *nm;
  const int *in;
  int n_in;
  int *out;
  char *err;
  size_t errlen;
  const char *vprefix;   /* its variables' names start with this (NULL:
                          * the layer's name); wrappers set it */
} lp; /* one layer being parsed */

/* the layer's first input node */
const wk_layer *tsr_layer__in0(const lp *p);
/* appends this layer's node (its inputs, name, class); NULL when full */
wk_layer *tsr_layer__node(lp *p, wk_layer_kind kind);
void tsr_layer__same_shape(wk_layer *l, const wk_layer *src);
/* tsr_layer__node with the first input's shape (a layer that keeps it,
 * or starts from it); NULL when full */
wk_layer *tsr_layer__node_same(lp *p, wk_layer_kind kind);
/* "(batch, 4, 4, 2)" */
void tsr_layer__shape_text(const wk_layer *l, char *buf, size_t len);
/* config values: `def` when absent or null; errors name the layer, key */
int tsr_layer__get_int(const lp *p, const char *key, int64_t def, int64_t lo,
                      int64_t *out);
int tsr_layer__get_num(const lp *p, const char *key, double def, double *out);
/* keys that must be absent, null or false */
int tsr_layer__no_opts(const lp *p, const char *const *keys);
int tsr_layer__get_bool(const lp *p, const char *key, bool def, bool *out);
/* kernel_size, strides, pool_size: an integer or a pair (def NULL:
 * required) */
int tsr_layer__get_pair(const lp *p, const char *key, const int64_t *def,
                        int64_t out[2]);
int tsr_layer__get_padding(const lp *p, bool *same);
int tsr_layer__channels_last(const lp *p);
/* the regularizer `key` of variable var (none when var < 0) */
int tsr_layer__set_reg(lp *p, int var, const char *key);
/* a dense variable of the layer (name vprefix/vname), its initializer from
 * the config's init_key (init_def when absent); its index or a code */
int tsr_layer__var(lp *p, const char *vname, int rank, const int64_t *shape,
                   const char *init_key, const char *init_def);
/* the first input's rank must be `rank` (what: the shape it needs) */
int tsr_layer__need_rank(const lp *p, int rank, const char *what);
/* the output window of a kernel or pool over the layer's image input */
int tsr_layer__window(lp *p, const char *what, const int64_t *ks,
                      const int64_t *st, bool same, kern_win *g);
/* appends a pooling node over window g; its output is the last `rank` (1
 * to 3) of (g->oh, g->ow, g->c): an image, a sequence, or channels */
int tsr_layer__pool_node(lp *p, const kern_win *g, kern_pool2d pool,
                         int rank);
int tsr_layer__p_dense(lp *p);
/* activation, use_bias, a kernel of kshape[krank] and a bias of units */
int tsr_layer__act_kernel_bias(lp *p, wk_layer *l, int krank,
                               const int64_t *kshape, const int64_t *units);

/* model_layers_seq.c: Conv1D, 1-D pooling, global max pooling, LSTM, GRU,
 * Bidirectional, TimeDistributed; model_layers_attn.c: MultiHeadAttention,
 * Attention */
int tsr_layer__p_conv1d(lp *p);
int tsr_layer__p_pool1d(lp *p);
int tsr_layer__p_gmaxpool(lp *p);
int tsr_layer__p_rnn(lp *p);
int tsr_layer__p_bidir(lp *p);
int tsr_layer__p_timedist(lp *p);
int tsr_layer__p_mha(lp *p);
int tsr_layer__p_attention(lp *p);
/* After a layer's parser: which mask its output carries (Embedding
 * mask_zero masks pass through Dense, Dropout, activation layers,
 * LayerNormalization, TimeDistributed and merges of one mask; the
 * layers that use one set it themselves), and a refusal for a layer that
 * would be given a mask it cannot take. */
int tsr_layer__mask_rule(lp *p, int node);
/* True when the config was written by Keras 3 (dtype as a policy object). */
bool tsr_layer__keras3(const json_t *cfg);

/* model_layers_plain.c */
int tsr_layer__p_activation(lp *p);
int tsr_layer__p_relu(lp *p);
int tsr_layer__p_leaky(lp *p);
int tsr_layer__p_elu(lp *p);
int tsr_layer__p_softmax(lp *p);
int tsr_layer__p_dropout(lp *p);
int tsr_layer__p_merge(lp *p);
int tsr_layer__p_concat(lp *p);

#endif
