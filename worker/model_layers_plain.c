/* The Keras layers without variables: Activation, ReLU, LeakyReLU, ELU,
 * Softmax, Dropout, and the Functional merges Add, Subtract, Average and
 * Concatenate (entries of model_layers.c's table).
 *
 * Happy path: read the layer's options as Keras 2 and 3 write them, append
 * one node with its output shape. Failure modes: options Tessera does not
 * implement (a ReLU threshold, a Softmax axis other than the last,
 * noise_shape) and inputs whose shapes do not merge, each an error naming
 * the layer and the value.
 */
#include "worker/model_layers_int.h"

#include "common/err.h"

#include <stdio.h>
#include <string.h>

/* An activation layer applying `act` with parameter `alpha`. */
static int act_layer(lp *p, kern_act act, double alpha) {
  wk_layer *l = tsr_layer__node_same(p, WK_L_ACTIVATION);
  if (!l) return TSR_ERANGE;
  l->act = act;
  l->alpha = (float)alpha;
  return 0;
}

int tsr_layer__p_activation(lp *p) {
  wk_layer *l = tsr_layer__node_same(p, WK_L_ACTIVATION);
  if (!l) return TSR_ERANGE;
  return tsr_model__parse_act(json_object_get(p->cfg, "activation"), p->nm,
                             &l->act, &l->alpha, p->err, p->errlen);
}

int tsr_layer__p_relu(lp *p) {
  double mx, slope, thr;
  int rc;
  if ((rc = tsr_layer__get_num(p, "max_value", -1, &mx)) ||
      (rc = tsr_layer__get_num(p, "negative_slope", 0, &slope)) ||
      (rc = tsr_layer__get_num(p, "threshold", 0, &thr)))
    return rc;
  kern_act a;
  if (thr == 0 && slope == 0 && mx < 0) a = KERN_ACT_RELU;
  else if (thr == 0 && slope == 0 && mx == 6) a = KERN_ACT_RELU6;
  else if (thr == 0 && slope > 0 && mx < 0) a = KERN_ACT_LEAKY_RELU;
  else
    return tsr_errf(p->err, p->errlen, TSR_EUNSUPPORTED,
                    "layer '%s': ReLU with max_value %g, "
                    "negative_slope %g, threshold %g is not supported (supported:"
                    " the defaults, max_value 6, or a negative_slope alone)",
                    p->nm, mx, slope, thr);
  return act_layer(p, a, slope);
}

int tsr_layer__p_leaky(lp *p) {
  double a;
  int rc;
  /* Keras 3: negative_slope; Keras 2: alpha; both default 0.3 */
  if (json_object_get(p->cfg, "negative_slope"))
    rc = tsr_layer__get_num(p, "negative_slope", 0.3, &a);
  else
    rc = tsr_layer__get_num(p, "alpha", 0.3, &a);
  if (rc) return rc;
  return act_layer(p, KERN_ACT_LEAKY_RELU, a);
}

int tsr_layer__p_elu(lp *p) {
  double a;
  int rc = tsr_layer__get_num(p, "alpha", 1.0, &a);
  if (rc) return rc;
  return act_layer(p, KERN_ACT_ELU, a);
}

int tsr_layer__p_softmax(lp *p) {
  const json_t *a = json_object_get(p->cfg, "axis");
  int64_t ax = -1;
  if (json_is_integer(a)) ax = json_integer_value(a);
  else if (json_is_array(a) && json_array_size(a) == 1)
    ax = json_integer_value(json_array_get(a, 0));
  if (ax != -1 && ax != tsr_layer__in0(p)->rank)
    return tsr_errf(p->err, p->errlen, TSR_EUNSUPPORTED,
                    "layer '%s': Softmax over axis %lld is "
                    "not supported (only the last, -1)", p->nm, (long long)ax);
  wk_layer *l = tsr_layer__node_same(p, WK_L_ACTIVATION);
  if (!l) return TSR_ERANGE;
  l->act = KERN_ACT_SOFTMAX;
  return 0;
}

int tsr_layer__p_dropout(lp *p) {
  static const char *const no[] = {"noise_shape", NULL};
  double r;
  int rc;
  if ((rc = tsr_layer__no_opts(p, no)) || (rc = tsr_layer__get_num(p, "rate", -1, &r))) return rc;
  if (!(r >= 0 && r < 1))
    return tsr_errf(p->err, p->errlen, TSR_ECONFIG,
                    "layer '%s': rate must be in [0, 1)", p->nm);
  wk_layer *l = tsr_layer__node_same(p, WK_L_DROPOUT);
  if (!l) return TSR_ERANGE;
  l->rate = (float)r;
  return 0;
}

/* Inputs a and b of layer `what` whose shapes do not fit, named with
 * both shapes, then `tail`. */
static int inputs_differ(lp *p, const char *what, const wk_layer *a,
                         const wk_layer *b, const char *tail) {
  char s1[96], s2[96];
  tsr_layer__shape_text(a, s1, sizeof s1);
  tsr_layer__shape_text(b, s2, sizeof s2);
  return tsr_errf(p->err, p->errlen, TSR_ESHAPE,
                  "layer '%s' (%s): inputs of shapes %s and %s%s", p->nm,
                  what, s1, s2, tail);
}

int tsr_layer__p_merge(lp *p) {
  if (p->n_in < 2)
    return tsr_errf(p->err, p->errlen, TSR_ESHAPE,
                    "layer '%s' (%s) needs at least 2 inputs, it "
                    "has %d", p->nm, p->cls, p->n_in);
  bool sub = !strcmp(p->cls, "Subtract");
  if (sub && p->n_in != 2)
    return tsr_errf(p->err, p->errlen, TSR_ESHAPE,
                    "layer '%s': Subtract takes exactly 2 inputs, "
                    "it has %d", p->nm, p->n_in);
  const wk_layer *a = tsr_layer__in0(p);
  for (int i = 1; i < p->n_in; i++) {
    const wk_layer *b = &p->m->layers[p->in[i]];
    bool same = a->rank == b->rank;
    for (int d = 0; same && d < a->rank; d++) same = a->dim[d] == b->dim[d];
    if (!same) {
      char tail[96];
      snprintf(tail, sizeof tail, " (%s needs equal shapes)", p->cls);
      return inputs_differ(p, p->cls, a, b, tail);
    }
  }
  wk_layer *l = tsr_layer__node(p, WK_L_ADD);
  if (!l) return TSR_ERANGE;
  tsr_layer__same_shape(l, a);
  l->coef = !strcmp(p->cls, "Average") ? 1.0f / (float)p->n_in
            : sub ? -1.0f : 1.0f;
  return 0;
}

int tsr_layer__p_concat(lp *p) {
  int64_t ax;
  int rc;
  const json_t *av = json_object_get(p->cfg, "axis");
  if (av && !json_is_integer(av))
    return tsr_errf(p->err, p->errlen, TSR_ECONFIG,
                    "layer '%s': axis must be an integer", p->nm);
  if ((rc = tsr_layer__get_int(p, "axis", -1, INT32_MIN, &ax))) return rc;
  if (p->n_in < 2)
    return tsr_errf(p->err, p->errlen, TSR_ESHAPE,
                    "layer '%s' (Concatenate) needs at least 2 "
                    "inputs, it has %d", p->nm, p->n_in);
  const wk_layer *a = tsr_layer__in0(p);
  int r = a->rank;
  if (ax < 0) ax += r + 1;
  if (ax < 1 || ax > r)
    return tsr_errf(p->err, p->errlen, TSR_ESHAPE,
                    "layer '%s': axis %lld is outside the inputs' "
                    "axes 1..%d", p->nm, (long long)ax, r);
  int64_t tot = 0;
  for (int i = 0; i < p->n_in; i++) {
    const wk_layer *b = &p->m->layers[p->in[i]];
    bool ok = b->rank == r;
    for (int d = 0; ok && d < r; d++)
      ok = d == ax - 1 || b->dim[d] == a->dim[d];
    if (!ok) {
      char what[64];
      snprintf(what, sizeof what, "Concatenate on axis %lld", (long long)ax);
      return inputs_differ(p, what, a, b, "");
    }
    tot += b->dim[ax - 1];
  }
  wk_layer *l = tsr_layer__node(p, WK_L_CONCAT);
  if (!l) return TSR_ERANGE;
  tsr_layer__same_shape(l, a);
  l->cat_axis = (int)ax - 1;
  l->dim[ax - 1] = tot;
  l->size = a->size / a->dim[ax - 1] * tot;
  return 0;
}

