/* Internals shared by the Keras exporter and importer (export_keras.c,
 * keras_in.c): the saving layout of a Sequential model. */
#ifndef TSR_CHIEF_KERAS_INT_H
#define TSR_CHIEF_KERAS_INT_H

#include "chief/ckpt/export_keras.h"

#include <stdint.h>

#define EK_MAX_LAYERS 256

typedef struct {
  char path[96];          /* "dense_1" */
  const json_t *cfg;      /* the layer object */
  int first, count;       /* its variables: order[first .. first+count) */
} ek_layer;

typedef struct {
  ek_layer l[EK_MAX_LAYERS];
  int n;
  const chief_export_var **order;
  size_t n_order;
  const json_t *input_layer;  /* InputLayer object, or NULL */
  int64_t in_width;           /* flat input width, -1 unknown */
} ek_plan;

/* Each layer's saving path and its variables (by name prefix "<layer
 * name>/", in the given order). Fills p->order (the caller frees it). */
int chief__keras_plan(const json_t *model, const chief_export_var *vars,
                      size_t n, ek_plan *p, char *err, size_t errlen);

#endif
