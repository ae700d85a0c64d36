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
} lp; /* one layer being parsed */

/* the layer's first input node */
const wk_layer *tsr_layer__in0(const lp *p);
/* appends this layer's node (its inputs, name, class); NULL when full */
wk_layer *tsr_layer__node(lp *p, wk_layer_kind kind);
void tsr_layer__same_shape(wk_layer *l, const wk_layer *src);
/* "(batch, 4, 4, 2)" */
void tsr_layer__shape_text(const wk_layer *l, char *buf, size_t len);
/* config values: `def` when absent or null; errors name the layer, key */
int tsr_layer__get_int(const lp *p, const char *key, int64_t def, int64_t lo,
                      int64_t *out);
int tsr_layer__get_num(const lp *p, const char *key, double def, double *out);
/* keys that must be absent, null or false */
int tsr_layer__no_opts(const lp *p, const char *const *keys);

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
