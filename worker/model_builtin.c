/* The built-in wide-and-deep CTR model as a graph: the dense features and
 * the pooled embeddings of every sparse feature, concatenated, through
 * hidden Dense layers to one logit, plus the wide part (one weight per id of
 * every feature, summed into that logit), then a sigmoid.
 *
 *   {"builtin": "wide_deep", "dense_features": 13, "sparse_features": 26 or
 *    [{"name","vocab","dim"}...], "vocab": V, "embedding_dim": 8,
 *    "combiner": "mean"|"sum", "hidden": [256, 128], "activation": "relu",
 *    "wide": true}
 *
 * Variables, in this order: embedding_<feature>/embeddings per feature,
 * dense/kernel, dense/bias, dense_1/..., then wide/embeddings.
 * Failure modes: unknown keys, sizes below 1, a vocabulary smaller than
 * the data's ids, an unsupported activation or combiner; each named.
 */
#include "worker/model_int.h"

#include "common/conf.h"
#include "common/err.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int check_keys(const json_t *j, char *err, size_t errlen) {
  static const char *const keys[] = {
      "builtin", "dense_features", "sparse_features", "vocab",
      "embedding_dim", "combiner", "hidden", "activation", "wide", NULL};
  return tsr_conf_check_keys(j, "model", keys, NULL, err, errlen);
}

int tsr_model__parse_wide_deep(tsr_model *m, const json_t *j,
                              const wk_input_schema *sc, char *err,
                              size_t errlen) {
  int rc;
  if ((rc = check_keys(j, err, errlen))) return rc;
  m->wide_deep = true;
  json_t *nd = json_object_get(j, "dense_features");
  int64_t n_dense = nd ? json_integer_value(nd) : sc ? sc->n_dense : 0;
  if (n_dense < 0) return tsr_errf(err, errlen, TSR_ECONFIG,
                                   "model.dense_features < 0");
  json_t *sf = json_object_get(j, "sparse_features");
  int nsf = json_is_array(sf) ? (int)json_array_size(sf)
            : json_is_integer(sf) ? (int)json_integer_value(sf)
            : sc ? sc->n_sparse : 0;
  if (nsf < 1 || nsf > WK_MAX_EMB / 2 - 1)
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "model.sparse_features: wide_deep needs 1..%d "
                    "sparse features (got %d)", WK_MAX_EMB / 2 - 1, nsf);
  json_t *dv = json_object_get(j, "vocab");
  json_t *dd = json_object_get(j, "embedding_dim");
  int64_t def_dim = dd ? json_integer_value(dd) : 8;
  const char *comb = json_string_value(json_object_get(j, "combiner"));
  kern_pool pool = KERN_POOL_MEAN;
  if (comb && !strcmp(comb, "sum")) pool = KERN_POOL_SUM;
  else if (comb && strcmp(comb, "mean"))
    return tsr_errf(err, errlen, TSR_EUNSUPPORTED,
                    "model.combiner: '%s' is not supported "
                    "(supported: sum, mean)", comb);
  /* the hidden layers' activation: ReLU unless the spec names another */
  kern_act act = KERN_ACT_RELU;
  float alpha = 1;
  json_t *aj = json_object_get(j, "activation");
  if (aj && (rc = tsr_model__parse_act(aj, "wide_deep", &act, &alpha, err,
                                      errlen)))
    return rc;
  json_t *hid = json_object_get(j, "hidden");
  if (hid && !json_is_array(hid))
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "model.hidden must be a list of layer widths");
  size_t nh = hid ? json_array_size(hid) : 2;
  int64_t widths[WK_MAX_LAYERS];
  if (nh + 8 > WK_MAX_LAYERS)
    return tsr_errf(err, errlen, TSR_ERANGE,
                    "model.hidden: more than %d layers",
                    WK_MAX_LAYERS - 8);
  for (size_t i = 0; i < nh; i++) {
    json_t *w = hid ? json_array_get(hid, i) : NULL;
    widths[i] = hid ? (json_is_integer(w) ? json_integer_value(w) : 0)
                    : (i == 0 ? 256 : 128);
    if (widths[i] < 1)
      return tsr_errf(err, errlen, TSR_ECONFIG,
                      "model.hidden[%zu] must be a positive integer",
                      i);
  }

  tsr_init_spec ui, gi, zi;
  tsr_init_parse("uniform", &ui);
  tsr_init_parse("glorot_uniform", &gi);
  tsr_init_parse("zeros", &zi);
  int x = -1;
  if (n_dense > 0) {
    wk_layer *in = tsr_model__add_node(m, WK_L_INPUT, "dense_features",
                                      "InputLayer", NULL, 0, err, errlen);
    if (!in) return TSR_ERANGE;
    in->rank = 1;
    in->size = in->dim[0] = n_dense;
    x = m->n_layers - 1;
  }
  wk_layer *el = tsr_model__add_node(m, WK_L_EMBED, "embeddings", "Embedding",
                                    NULL, 0, err, errlen);
  if (!el) return TSR_ERANGE;
  int embn = m->n_layers - 1;
  int64_t wide_total = 0, emb_width = 0;
  int64_t vocabs[WK_MAX_EMB];
  for (int f = 0; f < nsf; f++) {
    json_t *fe = json_is_array(sf) ? json_array_get(sf, f) : NULL;
    char name[64];
    const char *fn = fe ? json_string_value(json_object_get(fe, "name")) : NULL;
    if (!fn && sc && f < sc->n_sparse && sc->sparse_names)
      fn = sc->sparse_names[f];
    if (fn) snprintf(name, sizeof name, "%s", fn);
    else snprintf(name, sizeof name, "c%d", f);
    int64_t voc = fe && json_object_get(fe, "vocab")
                      ? json_integer_value(json_object_get(fe, "vocab"))
                  : dv ? json_integer_value(dv)
                  : sc && sc->vocab ? sc->vocab[f] : 0;
    int64_t dim = fe && json_object_get(fe, "dim")
                      ? json_integer_value(json_object_get(fe, "dim"))
                      : def_dim;
    if (voc < 1 || dim < 1)
      return tsr_errf(err, errlen, TSR_ECONFIG,
                      "model: sparse feature '%s' needs a vocab "
                      "size and an embedding dim >= 1 (vocab %lld, dim %lld)",
                      name, (long long)voc, (long long)dim);
    if (sc && sc->vocab && sc->vocab[f] > voc)
      return tsr_errf(err, errlen, TSR_ESHAPE,
                      "model: sparse feature '%s' has vocab %lld but "
                      "the data's ids go up to %lld", name, (long long)voc,
                      (long long)sc->vocab[f]);
    char lname[96];
    snprintf(lname, sizeof lname, "embedding_%s", name);
    int64_t shape[2] = {voc, dim};
    int var = tsr_model__add_var(m, lname, "embeddings", 2, shape, &ui,
                                TSR_VAR_ROW_SPARSE);
    if (var == TSR_ERANGE)
      return tsr_errf(err, errlen, var, "model: %s: vocab %lld x dim %lld "
                      "is too large", lname, (long long)voc, (long long)dim);
    if (var < 0) return var;
    wk_embed *e = &m->emb[m->n_emb++];
    memset(e, 0, sizeof *e);
    e->var = var;
    e->dim = dim;
    e->vocab = voc;
    e->feature = f;
    e->pool = pool;
    e->node = embn;
    e->out_off = emb_width;
    emb_width += dim;
    vocabs[f] = voc;
    if (__builtin_add_overflow(wide_total, voc, &wide_total))
      return tsr_errf(err, errlen, TSR_ERANGE, "model: the sparse features' "
                      "vocab sizes add up past 2^63");
  }
  m->n_sparse = nsf;
  el = &m->layers[embn];
  el->rank = 1;
  el->size = el->dim[0] = emb_width;
  int cur = embn;
  if (x >= 0) {
    int in[2] = {x, embn};
    wk_layer *c = tsr_model__add_node(m, WK_L_CONCAT, "concatenate",
                                     "Concatenate", in, 2, err, errlen);
    if (!c) return TSR_ERANGE;
    c->rank = 1;
    c->size = c->dim[0] = n_dense + emb_width;
    c->cat_axis = 0;
    cur = m->n_layers - 1;
  }
  /* the wide logit is computed before the last Dense adds it; its
   * variable comes after the Dense ones */
  json_t *w = json_object_get(j, "wide");
  bool wide = !w || json_is_true(w);
  int widen = -1;
  if (wide) {
    wk_layer *wl = tsr_model__add_node(m, WK_L_EMBED, "wide", "Embedding",
                                      NULL, 0, err, errlen);
    if (!wl) return TSR_ERANGE;
    wl->rank = 1;
    wl->size = wl->dim[0] = 1;
    widen = m->n_layers - 1;
  }
  for (size_t i = 0; i <= nh; i++) {
    char nm[32];
    snprintf(nm, sizeof nm, i ? "dense_%zu" : "dense", i);
    wk_layer *l = tsr_model__add_node(m, WK_L_DENSE, nm, "Dense", &cur, 1,
                                     err, errlen);
    if (!l) return TSR_ERANGE;
    int64_t in_w = m->layers[cur].size;
    l->rank = 1;
    l->size = l->dim[0] = i < nh ? widths[i] : 1;
    l->act = i < nh ? act : KERN_ACT_SIGMOID;
    l->alpha = i < nh ? alpha : 1.0f;
    l->use_bias = true;
    if (i == nh) l->addend = widen;
    int64_t ks[2] = {in_w, l->size};
    int vw = tsr_model__add_var(m, nm, "kernel", 2, ks, &gi, TSR_VAR_DENSE);
    if (vw == TSR_ERANGE)
      return tsr_errf(err, errlen, vw, "model: %s kernel [%lld, %lld] is "
                      "too large", nm, (long long)in_w, (long long)l->size);
    if (vw < 0) return vw;
    int vb = tsr_model__add_var(m, nm, "bias", 1, &l->size, &zi, TSR_VAR_DENSE);
    if (vb < 0) return vb;
    l = &m->layers[m->n_layers - 1];
    l->var_w = vw;
    l->var_b = vb;
    cur = m->n_layers - 1;
  }
  if (wide) {
    int64_t shape[2] = {wide_total, 1};
    int var = tsr_model__add_var(m, "wide", "embeddings", 2, shape, &zi,
                                TSR_VAR_ROW_SPARSE);
    if (var == TSR_ERANGE)
      return tsr_errf(err, errlen, var, "model: the wide part's %lld rows are too many",
                  (long long)wide_total);
    if (var < 0) return var;
    int64_t off = 0;
    for (int f = 0; f < nsf; f++) {
      wk_embed *e = &m->emb[m->n_emb++];
      memset(e, 0, sizeof *e);
      e->var = var;
      e->dim = 1;
      e->vocab = vocabs[f];
      e->feature = f;
      e->id_offset = off;
      e->pool = KERN_POOL_SUM;
      e->wide = true;
      e->node = widen;
      off += vocabs[f];
    }
  }
  m->n_dense = n_dense;
  return 0;
}
