/* Building a model: a Keras Sequential model.to_json() document (Keras 2
 * and Keras 3 spellings) or {"builtin": "wide_deep", ...}, with the loss
 * and metrics resolved as Keras's compile() resolves them.
 *
 * Happy path: walk config.layers, chain the widths, create the variables
 * with Keras's names and initializers, then pick the loss form (a sigmoid or
 * softmax output with a cross-entropy loss is computed from the logits, as
 * Keras does through the output's _keras_logits).
 * Failure modes: every unsupported class, activation, option or shape is a
 * TSR_EUNSUPPORTED / TSR_ESHAPE / TSR_ECONFIG error naming the layer, the
 * key and the value, and listing what is supported.
 */
#include "worker/model_int.h"

#include "common/err.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LAYERS_SUPPORTED \
  "InputLayer, Dense, Activation, Dropout, Embedding, Flatten, " \
  "GlobalAveragePooling1D"

int wk_model__fail(char *err, size_t len, int code, const char *fmt, ...) {
  if (err && len) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, len, fmt, ap);
    va_end(ap);
  }
  return code;
}
#define FAIL(code, ...) wk_model__fail(err, errlen, code, __VA_ARGS__)

static int add_var(wk_model *m, const char *layer, const char *vname,
                   int rank, int64_t d0, int64_t d1, const kern_init_spec *in,
                   wk_var_kind kind) {
  wk_var_info *nv = realloc(m->vars, (size_t)(m->n_vars + 1) * sizeof *nv);
  if (!nv) return TSR_ENOMEM;
  m->vars = nv;
  wk_var_info *v = &nv[m->n_vars];
  memset(v, 0, sizeof *v);
  snprintf(v->name, sizeof v->name, "%s/%s", layer, vname);
  v->rank = rank;
  v->shape[0] = d0;
  v->shape[1] = rank == 2 ? d1 : 1;
  v->numel = d0 * v->shape[1];
  v->row_dim = v->shape[1];
  v->dtype = "float32";
  v->init = *in;
  if (rank == 2 && (in->kind >= KERN_INIT_GLOROT_UNIFORM)) {
    v->init.fan_in = d0;   /* Keras: kernel [in, out] */
    v->init.fan_out = d1;
  }
  v->kind = kind;
  return m->n_vars++;
}

/* Keras initializer: a name string or {"class_name", "config"}. */
static int parse_init(const json_t *j, const char *def, const char *where,
                      kern_init_spec *out, char *err, size_t errlen) {
  const char *name = def;
  const json_t *cfg = NULL;
  if (j && json_is_string(j)) name = json_string_value(j);
  else if (j && json_is_object(j)) {
    name = json_string_value(json_object_get(j, "class_name"));
    cfg = json_object_get(j, "config");
  } else if (j && !json_is_null(j))
    return FAIL(TSR_ECONFIG, "%s: initializer must be a name or an object",
                where);
  if (!name || kern_init_parse(name, out))
    return FAIL(TSR_EUNSUPPORTED,
                "%s: initializer '%s' is not supported (supported: Zeros, "
                "Ones, Constant, RandomUniform, RandomNormal, TruncatedNormal,"
                " GlorotUniform, GlorotNormal, HeUniform, HeNormal)",
                where, name ? name : "?");
  if (cfg && json_is_object(cfg)) {
    json_t *v;
    if (out->kind == KERN_INIT_UNIFORM) {
      if ((v = json_object_get(cfg, "minval")) && json_is_number(v))
        out->a = json_number_value(v);
      if ((v = json_object_get(cfg, "maxval")) && json_is_number(v))
        out->b = json_number_value(v);
    } else if (out->kind == KERN_INIT_NORMAL ||
               out->kind == KERN_INIT_TRUNCATED_NORMAL) {
      if ((v = json_object_get(cfg, "mean")) && json_is_number(v))
        out->a = json_number_value(v);
      if ((v = json_object_get(cfg, "stddev")) && json_is_number(v))
        out->b = json_number_value(v);
    } else if (out->kind == KERN_INIT_CONSTANT) {
      if ((v = json_object_get(cfg, "value")) && json_is_number(v))
        out->a = json_number_value(v);
    }
  }
  return 0;
}

/* Keras activation: a string, null, or a serialized function object. */
static int parse_act(const json_t *j, const char *layer, kern_act *act,
                     float *alpha, char *err, size_t errlen) {
  const char *name = "linear";
  if (j && json_is_string(j)) name = json_string_value(j);
  else if (j && json_is_object(j)) {
    const json_t *c = json_object_get(j, "config");
    name = json_string_value(json_object_get(j, "class_name"));
    if (c && json_is_string(c)) name = json_string_value(c);
  }
  if (kern_act_parse(name, act))
    return FAIL(TSR_EUNSUPPORTED,
                "layer '%s': activation '%s' is not supported (supported: %s)",
                layer, name ? name : "?", kern_act_list());
  *alpha = *act == KERN_ACT_LEAKY_RELU ? 0.2f : 1.0f;
  return 0;
}

/* Options Tessera does not implement must be absent or null/false. */
static int reject_opts(const json_t *cfg, const char *layer, char *err,
                       size_t errlen) {
  static const char *const keys[] = {
      "kernel_regularizer", "bias_regularizer", "activity_regularizer",
      "kernel_constraint", "bias_constraint", "embeddings_regularizer",
      "embeddings_constraint", "lora_rank", "noise_shape", NULL};
  for (int i = 0; keys[i]; i++) {
    json_t *v = json_object_get(cfg, keys[i]);
    if (v && !json_is_null(v))
      return FAIL(TSR_EUNSUPPORTED, "layer '%s': %s is not supported (it "
                  "must be null)", layer, keys[i]);
  }
  json_t *mz = json_object_get(cfg, "mask_zero");
  if (mz && json_is_true(mz))
    return FAIL(TSR_EUNSUPPORTED, "layer '%s': mask_zero=true is not "
                "supported", layer);
  return 0;
}

/* Width of an input shape [null, a, (b)]: the product after the batch. */
static int shape_width(const json_t *s, int64_t *w, int *rank) {
  if (!json_is_array(s) || json_array_size(s) < 2) return -1;
  int64_t p = 1;
  for (size_t i = 1; i < json_array_size(s); i++) {
    json_t *d = json_array_get(s, i);
    if (!json_is_integer(d) || json_integer_value(d) < 1) return -1;
    p *= json_integer_value(d);
  }
  *w = p;
  *rank = (int)json_array_size(s) - 1;
  return 0;
}

static const json_t *input_shape_of(const json_t *cfg) {
  const json_t *s = json_object_get(cfg, "batch_input_shape");
  if (!s) s = json_object_get(cfg, "batch_shape");
  return s;
}

/* Keras's default layer name: the class in snake case, then _1, _2 ...
 * for the second and later layers of that class ("dense", "dense_1"). */
static void keras_name(const char *cls, int nth, char *out, size_t len) {
  size_t o = 0;
  for (size_t i = 0; cls[i] && o + 2 < len; i++) {
    char c = cls[i];
    bool up = c >= 'A' && c <= 'Z';
    bool prev_low = i > 0 && ((cls[i - 1] >= 'a' && cls[i - 1] <= 'z'));
    bool next_low = cls[i + 1] >= 'a' && cls[i + 1] <= 'z';
    if (up && i > 0 && (prev_low || next_low) && cls[i - 1] != '_')
      out[o++] = '_';
    out[o++] = up ? (char)(c - 'A' + 'a') : c;
  }
  out[o] = 0;
  if (nth > 0 && o < len)
    snprintf(out + o, len - o, "_%d", nth);
}

static int parse_sequential(wk_model *m, const json_t *root, char *err,
                            size_t errlen) {
  struct { char cls[32]; int n; } seen[16];
  int nseen = 0;
  const json_t *cfg = json_object_get(root, "config");
  const json_t *layers = cfg ? json_object_get(cfg, "layers") : NULL;
  if (!layers && json_is_array(cfg)) layers = cfg; /* very old Keras */
  if (!json_is_array(layers) || json_array_size(layers) == 0)
    return FAIL(TSR_ECONFIG, "model: config.layers must be a non-empty list");
  int64_t width = -1;  /* current flattened width; -1 unknown */
  bool pending_emb = false; /* Embedding output still 2-D (L, dim) */
  int rc;
  for (size_t i = 0; i < json_array_size(layers); i++) {
    const json_t *L = json_array_get(layers, i);
    const char *cls = json_string_value(json_object_get(L, "class_name"));
    const json_t *lc = json_object_get(L, "config");
    if (!cls || !json_is_object(lc))
      return FAIL(TSR_ECONFIG, "model: config.layers[%zu] needs class_name "
                  "and config", i);
    const char *lname = json_string_value(json_object_get(lc, "name"));
    char nm[64];
    int nth = 0, si;
    for (si = 0; si < nseen; si++)
      if (!strcmp(seen[si].cls, cls)) break;
    if (si < nseen) nth = seen[si].n++;
    else if (nseen < 16) {
      snprintf(seen[nseen].cls, sizeof seen[nseen].cls, "%s", cls);
      seen[nseen++].n = 1;
    }
    if (lname) snprintf(nm, sizeof nm, "%s", lname);
    else keras_name(cls, nth, nm, sizeof nm);
    if ((rc = reject_opts(lc, nm, err, errlen))) return rc;
    const json_t *shp = input_shape_of(lc);
    if (shp && width < 0 && m->n_layers == 0 && m->n_emb == 0) {
      int rank;
      if (shape_width(shp, &width, &rank))
        return FAIL(TSR_ESHAPE, "layer '%s': input shape must be [null, n] "
                    "with positive sizes", nm);
      if (strcmp(cls, "Embedding") && rank != 1)
        return FAIL(TSR_ESHAPE, "layer '%s': input shape of rank %d; only "
                    "flat inputs [null, n] are supported", nm, rank);
      m->n_dense = width;
    }
    if (!strcmp(cls, "InputLayer")) {
      if (m->n_layers || m->n_emb)
        return FAIL(TSR_ECONFIG, "layer '%s': InputLayer must come first", nm);
      if (!shp) return FAIL(TSR_ESHAPE, "layer '%s': no batch_input_shape", nm);
      continue;
    }
    if (!strcmp(cls, "Embedding")) {
      if (m->n_layers || m->n_emb)
        return FAIL(TSR_ESHAPE, "layer '%s': Embedding must be the first "
                    "layer (it reads integer ids from the input)", nm);
      json_t *idim = json_object_get(lc, "input_dim");
      json_t *odim = json_object_get(lc, "output_dim");
      json_t *ilen = json_object_get(lc, "input_length");
      if (!json_is_integer(idim) || !json_is_integer(odim) ||
          json_integer_value(idim) < 1 || json_integer_value(odim) < 1)
        return FAIL(TSR_ECONFIG, "layer '%s': input_dim and output_dim must "
                    "be positive integers", nm);
      int64_t len = ilen && json_is_integer(ilen) ? json_integer_value(ilen)
                                                  : width;
      if (len < 1)
        return FAIL(TSR_ESHAPE, "layer '%s': needs input_length or an input "
                    "shape [null, L]", nm);
      if (width > 0 && width != len)
        return FAIL(TSR_ESHAPE, "layer '%s': input_length %lld does not match "
                    "the input width %lld", nm, (long long)len,
                    (long long)width);
      kern_init_spec is;
      if ((rc = parse_init(json_object_get(lc, "embeddings_initializer"),
                           "uniform", nm, &is, err, errlen)))
        return rc;
      int v = add_var(m, nm, "embeddings", 2, json_integer_value(idim),
                      json_integer_value(odim), &is, WK_VAR_ROW_SPARSE);
      if (v < 0) return v;
      wk_embed *e = &m->emb[m->n_emb++];
      memset(e, 0, sizeof *e);
      e->var = v;
      e->dim = json_integer_value(odim);
      e->vocab = json_integer_value(idim);
      e->feature = -1;
      e->pool = KERN_POOL_SUM;
      e->per_id = true;
      m->seq_ids = len;
      m->n_dense = len;
      width = len * e->dim;
      m->emb_width = width;
      pending_emb = true;
      continue;
    }
    if (!strcmp(cls, "Flatten")) {
      pending_emb = false;
      continue;
    }
    if (!strcmp(cls, "GlobalAveragePooling1D")) {
      if (!pending_emb || m->n_layers)
        return FAIL(TSR_ESHAPE, "layer '%s': GlobalAveragePooling1D is "
                    "supported only right after Embedding", nm);
      m->emb[0].per_id = false;
      m->emb[0].pool = KERN_POOL_MEAN;
      width = m->emb[0].dim;
      m->emb_width = width;
      pending_emb = false;
      continue;
    }
    if (width < 0)
      return FAIL(TSR_ESHAPE, "layer '%s': the model's input shape is unknown "
                  "(give the first layer input_shape/batch_input_shape)", nm);
    if (pending_emb)
      return FAIL(TSR_ESHAPE, "layer '%s' (%s) after Embedding needs a "
                  "Flatten or GlobalAveragePooling1D between them", nm, cls);
    if (m->n_layers == WK_MAX_LAYERS)
      return FAIL(TSR_ERANGE, "model: more than %d layers", WK_MAX_LAYERS);
    wk_layer *ly = &m->layers[m->n_layers];
    memset(ly, 0, sizeof *ly);
    snprintf(ly->name, sizeof ly->name, "%s", nm);
    snprintf(ly->cls, sizeof ly->cls, "%s", cls);
    ly->in = width;
    ly->var_w = ly->var_b = -1;
    ly->alpha = 1.0f;
    if (!strcmp(cls, "Dense")) {
      json_t *u = json_object_get(lc, "units");
      if (!json_is_integer(u) || json_integer_value(u) < 1)
        return FAIL(TSR_ECONFIG, "layer '%s': units must be a positive "
                    "integer", nm);
      ly->kind = WK_L_DENSE;
      ly->out = json_integer_value(u);
      if ((rc = parse_act(json_object_get(lc, "activation"), nm, &ly->act,
                          &ly->alpha, err, errlen)))
        return rc;
      json_t *ub = json_object_get(lc, "use_bias");
      ly->use_bias = !ub || json_is_true(ub);
      kern_init_spec ki, bi;
      if ((rc = parse_init(json_object_get(lc, "kernel_initializer"),
                           "glorot_uniform", nm, &ki, err, errlen)) ||
          (rc = parse_init(json_object_get(lc, "bias_initializer"), "zeros",
                           nm, &bi, err, errlen)))
        return rc;
      if ((ly->var_w = add_var(m, nm, "kernel", 2, ly->in, ly->out, &ki,
                               WK_VAR_DENSE)) < 0)
        return ly->var_w;
      if (ly->use_bias &&
          (ly->var_b = add_var(m, nm, "bias", 1, ly->out, 1, &bi,
                               WK_VAR_DENSE)) < 0)
        return ly->var_b;
    } else if (!strcmp(cls, "Activation")) {
      ly->kind = WK_L_ACTIVATION;
      ly->out = width;
      if ((rc = parse_act(json_object_get(lc, "activation"), nm, &ly->act,
                          &ly->alpha, err, errlen)))
        return rc;
    } else if (!strcmp(cls, "Dropout")) {
      json_t *r = json_object_get(lc, "rate");
      if (!json_is_number(r) || json_number_value(r) < 0 ||
          json_number_value(r) >= 1)
        return FAIL(TSR_ECONFIG, "layer '%s': rate must be in [0, 1)", nm);
      ly->kind = WK_L_DROPOUT;
      ly->out = width;
      ly->rate = (float)json_number_value(r);
    } else {
      return FAIL(TSR_EUNSUPPORTED, "layer '%s': layer class '%s' is not "
                  "supported (supported: %s)", nm, cls, LAYERS_SUPPORTED);
    }
    width = ly->out;
    m->n_layers++;
  }
  if (m->n_layers == 0 || m->layers[0].kind != WK_L_DENSE)
    return FAIL(TSR_ESHAPE, "model: the first computing layer must be Dense");
  if (m->emb_width == 0 && m->n_dense < 1)
    return FAIL(TSR_ESHAPE, "model: unknown input width");
  m->out_dim = width;
  return 0;
}

/* {"builtin": "wide_deep", "dense_features": 13, "sparse_features": 26 or
 *  [{"name","vocab","dim"}...], "vocab": V, "embedding_dim": 8,
 *  "combiner": "mean"|"sum", "hidden": [256, 128], "activation": "relu",
 *  "wide": true} */
static int parse_wide_deep(wk_model *m, const json_t *j,
                           const wk_input_schema *sc, char *err,
                           size_t errlen) {
  static const char *const keys[] = {
      "builtin", "dense_features", "sparse_features", "vocab",
      "embedding_dim", "combiner", "hidden", "activation", "wide", NULL};
  const char *k;
  json_t *v;
  json_object_foreach((json_t *)j, k, v) {
    int ok = 0;
    for (int i = 0; keys[i]; i++) ok |= !strcmp(keys[i], k);
    if (!ok)
      return FAIL(TSR_ECONFIG, "model.%s: unknown key for builtin wide_deep "
                  "(known: dense_features, sparse_features, vocab, "
                  "embedding_dim, combiner, hidden, activation, wide)", k);
  }
  m->wide_deep = true;
  json_t *nd = json_object_get(j, "dense_features");
  m->n_dense = nd ? json_integer_value(nd) : sc ? sc->n_dense : 0;
  if (m->n_dense < 0) return FAIL(TSR_ECONFIG, "model.dense_features < 0");
  json_t *sf = json_object_get(j, "sparse_features");
  int nsf = json_is_array(sf) ? (int)json_array_size(sf)
            : json_is_integer(sf) ? (int)json_integer_value(sf)
            : sc ? sc->n_sparse : 0;
  if (nsf < 1 || nsf > WK_MAX_EMB - 1)
    return FAIL(TSR_ECONFIG, "model.sparse_features: wide_deep needs 1..%d "
                "sparse features (got %d)", WK_MAX_EMB - 1, nsf);
  json_t *dv = json_object_get(j, "vocab");
  json_t *dd = json_object_get(j, "embedding_dim");
  int64_t def_dim = dd ? json_integer_value(dd) : 8;
  const char *comb = json_string_value(json_object_get(j, "combiner"));
  kern_pool pool = KERN_POOL_MEAN;
  if (comb && !strcmp(comb, "sum")) pool = KERN_POOL_SUM;
  else if (comb && strcmp(comb, "mean"))
    return FAIL(TSR_EUNSUPPORTED, "model.combiner: '%s' is not supported "
                "(supported: sum, mean)", comb);
  kern_init_spec ui;
  kern_init_parse("uniform", &ui);
  int64_t wide_total = 0;
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
      return FAIL(TSR_ECONFIG, "model: sparse feature '%s' needs a vocab "
                  "size and an embedding dim >= 1 (vocab %lld, dim %lld)",
                  name, (long long)voc, (long long)dim);
    if (sc && sc->vocab && sc->vocab[f] > voc)
      return FAIL(TSR_ESHAPE, "model: sparse feature '%s' has vocab %lld but "
                  "the data's ids go up to %lld", name, (long long)voc,
                  (long long)sc->vocab[f]);
    char lname[96];
    snprintf(lname, sizeof lname, "embedding_%s", name);
    int var = add_var(m, lname, "embeddings", 2, voc, dim, &ui,
                      WK_VAR_ROW_SPARSE);
    if (var < 0) return var;
    wk_embed *e = &m->emb[m->n_emb++];
    memset(e, 0, sizeof *e);
    e->var = var;
    e->dim = dim;
    e->vocab = voc;
    e->feature = f;
    e->pool = pool;
    e->out_off = m->emb_width;
    m->emb_width += dim;
    vocabs[f] = voc;
    wide_total += voc;
  }
  m->n_sparse = nsf;
  json_t *hid = json_object_get(j, "hidden");
  json_t *hl = hid ? hid : json_pack("[ii]", 256, 128);
  kern_act act = KERN_ACT_RELU;
  float alpha = 1;
  int rc = 0;
  if ((rc = parse_act(json_object_get(j, "activation"), "wide_deep", &act,
                      &alpha, err, errlen)))
    goto out;
  kern_init_spec gi, zi;
  kern_init_parse("glorot_uniform", &gi);
  kern_init_parse("zeros", &zi);
  int64_t width = m->n_dense + m->emb_width;
  size_t nh = json_is_array(hl) ? json_array_size(hl) : 0;
  for (size_t i = 0; i <= nh; i++) {
    wk_layer *ly = &m->layers[m->n_layers];
    memset(ly, 0, sizeof *ly);
    snprintf(ly->name, sizeof ly->name, i ? "dense_%zu" : "dense", i);
    snprintf(ly->cls, sizeof ly->cls, "Dense");
    ly->kind = WK_L_DENSE;
    ly->in = width;
    ly->out = i < nh ? json_integer_value(json_array_get(hl, i)) : 1;
    if (ly->out < 1) {
      rc = FAIL(TSR_ECONFIG, "model.hidden[%zu] must be a positive integer", i);
      goto out;
    }
    ly->act = i < nh ? act : KERN_ACT_SIGMOID;
    ly->alpha = alpha;
    ly->use_bias = true;
    if ((ly->var_w = add_var(m, ly->name, "kernel", 2, ly->in, ly->out, &gi,
                             WK_VAR_DENSE)) < 0 ||
        (ly->var_b = add_var(m, ly->name, "bias", 1, ly->out, 1, &zi,
                             WK_VAR_DENSE)) < 0) {
      rc = TSR_ENOMEM;
      goto out;
    }
    width = ly->out;
    m->n_layers++;
  }
  m->out_dim = 1;
  json_t *w = json_object_get(j, "wide");
  if (!w || json_is_true(w)) {
    int var = add_var(m, "wide", "embeddings", 2, wide_total, 1, &zi,
                      WK_VAR_ROW_SPARSE);
    if (var < 0) { rc = var; goto out; }
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
      off += vocabs[f];
    }
  }
out:
  if (!hid) json_decref(hl);
  return rc;
}

static int resolve_loss(wk_model *m, const char *loss, char *err,
                        size_t errlen) {
  char base[64];
  snprintf(base, sizeof base, "%s", loss ? loss : "mse");
  bool from_logits = false;
  char *suf = strstr(base, "_from_logits");
  if (suf && suf[12] == 0) {
    *suf = 0;
    from_logits = true;
  }
  wk_layer *last = &m->layers[m->n_layers - 1];
  kern_act la = last->act;
  bool last_dense = last->kind == WK_L_DENSE;
  snprintf(m->loss_name, sizeof m->loss_name, "%s", loss ? loss : "mse");
  m->logit_out = from_logits;
  if (!strcmp(base, "mse") || !strcmp(base, "mean_squared_error") ||
      !strcmp(base, "MeanSquaredError")) {
    m->loss = KERN_LOSS_MSE;
  } else if (!strcmp(base, "mae") || !strcmp(base, "mean_absolute_error") ||
             !strcmp(base, "MeanAbsoluteError")) {
    m->loss = KERN_LOSS_MAE;
  } else if (!strcmp(base, "binary_crossentropy") ||
             !strcmp(base, "BinaryCrossentropy")) {
    if (from_logits) m->loss = KERN_LOSS_BCE_LOGITS;
    else if (la == KERN_ACT_SIGMOID && last_dense) {
      m->loss = KERN_LOSS_BCE_LOGITS;
      m->fused = true;
    } else m->loss = KERN_LOSS_BCE_PROBS;
  } else if (!strcmp(base, "categorical_crossentropy") ||
             !strcmp(base, "CategoricalCrossentropy") ||
             !strcmp(base, "sparse_categorical_crossentropy") ||
             !strcmp(base, "SparseCategoricalCrossentropy")) {
    bool sparse = strstr(base, "parse") != NULL;
    if (from_logits || (la == KERN_ACT_SOFTMAX && last_dense)) {
      m->loss = sparse ? KERN_LOSS_SPARSE_CCE_LOGITS : KERN_LOSS_CCE_LOGITS;
      m->fused = !from_logits;
    } else {
      m->loss = sparse ? KERN_LOSS_SPARSE_CCE_PROBS : KERN_LOSS_CCE_PROBS;
    }
    if (m->out_dim < 2)
      return FAIL(TSR_ESHAPE, "loss %s needs an output of at least 2 classes;"
                  " the model's last layer '%s' has %lld unit(s)", loss,
                  last->name, (long long)m->out_dim);
    m->onehot_labels = !sparse;
  } else {
    return FAIL(TSR_EUNSUPPORTED, "loss '%s' is not supported (supported: "
                "mse, mae, binary_crossentropy, categorical_crossentropy, "
                "sparse_categorical_crossentropy; append _from_logits for "
                "logit outputs)", loss);
  }
  bool ce = m->loss >= KERN_LOSS_CCE_LOGITS;
  if (!ce && m->out_dim != 1)
    return FAIL(TSR_ESHAPE, "loss %s: the model's output has %lld units but "
                "the data has one label per example", loss,
                (long long)m->out_dim);
  return 0;
}

static int resolve_metrics(wk_model *m, char *const *names, int n, char *err,
                           size_t errlen) {
  if (n > WK_MAX_METRICS)
    return FAIL(TSR_ERANGE, "metrics: at most %d", WK_MAX_METRICS);
  for (int i = 0; i < n; i++) {
    const char *s = names[i];
    wk_metric_kind k;
    if (!strcmp(s, "accuracy") || !strcmp(s, "acc") ||
        !strcmp(s, "sparse_categorical_accuracy") ||
        !strcmp(s, "categorical_accuracy") || !strcmp(s, "binary_accuracy"))
      k = WK_M_ACCURACY;
    else if (!strcmp(s, "auc") || !strcmp(s, "AUC")) {
      if (m->out_dim != 1)
        return FAIL(TSR_EUNSUPPORTED, "metric %s: needs a single output "
                    "(binary classification); the model has %lld", s,
                    (long long)m->out_dim);
      k = WK_M_AUC;
    } else if (!strcmp(s, "mse") || !strcmp(s, "mean_squared_error"))
      k = WK_M_MSE;
    else if (!strcmp(s, "mae") || !strcmp(s, "mean_absolute_error"))
      k = WK_M_MAE;
    else
      return FAIL(TSR_EUNSUPPORTED, "metric '%s' is not supported (supported:"
                  " accuracy, auc, mse, mae)", s);
    m->metrics[m->n_metrics] = k;
    snprintf(m->metric_names[m->n_metrics], 32, "%s", s);
    m->n_metrics++;
  }
  return 0;
}

int wk_model_build(const json_t *model, const char *loss,
                   char *const *metrics, int n_metrics,
                   const wk_input_schema *sc, wk_model **out, char *err,
                   size_t errlen) {
  *out = NULL;
  if (!json_is_object(model))
    return FAIL(TSR_ECONFIG, "model: must be a JSON object (a Keras "
                "model.to_json() document or {\"builtin\": ...})");
  wk_model *m = calloc(1, sizeof *m);
  if (!m) return TSR_ENOMEM;
  int rc;
  const char *bi = json_string_value(json_object_get(model, "builtin"));
  const char *cls = json_string_value(json_object_get(model, "class_name"));
  if (bi) {
    if (strcmp(bi, "wide_deep")) {
      rc = FAIL(TSR_EUNSUPPORTED, "model.builtin: '%s' is not a built-in "
                "model (supported: wide_deep)", bi);
      goto fail;
    }
    rc = parse_wide_deep(m, model, sc, err, errlen);
  } else if (cls && !strcmp(cls, "Sequential")) {
    rc = parse_sequential(m, model, err, errlen);
  } else {
    rc = FAIL(TSR_EUNSUPPORTED, "model: class_name '%s' is not supported "
              "(supported: Sequential, or {\"builtin\": \"wide_deep\"})",
              cls ? cls : "(missing)");
  }
  if (rc) goto fail;
  if ((rc = resolve_loss(m, loss, err, errlen)) ||
      (rc = resolve_metrics(m, metrics, n_metrics, err, errlen)))
    goto fail;
  if (sc) {
    if (m->n_dense != sc->n_dense && !(m->wide_deep && m->n_dense == 0)) {
      rc = FAIL(TSR_ESHAPE, "shapes do not chain: the model's input takes "
                "%lld feature(s) but the data has %lld", (long long)m->n_dense,
                (long long)sc->n_dense);
      goto fail;
    }
    if (m->wide_deep && sc->n_sparse < m->n_sparse) {
      rc = FAIL(TSR_ESHAPE, "shapes do not chain: the model reads %d sparse "
                "feature(s) but the data has %d", m->n_sparse, sc->n_sparse);
      goto fail;
    }
    bool cls_loss = m->loss >= KERN_LOSS_CCE_LOGITS;
    if (cls_loss && sc->n_classes > 1 && sc->n_classes != m->out_dim) {
      rc = FAIL(TSR_ESHAPE, "shapes do not chain: the data has %lld classes "
                "but the output layer '%s' has %lld units",
                (long long)sc->n_classes, m->layers[m->n_layers - 1].name,
                (long long)m->out_dim);
      goto fail;
    }
  }
  *out = m;
  return 0;
fail:
  wk_model_free(m);
  return rc;
}

int wk_model_from_job(const tsr_job *job, const wk_input_schema *sc,
                      wk_model **out, char *err, size_t errlen) {
  if (!job->model)
    return FAIL(TSR_ECONFIG, "job %s: no model", job->path ? job->path : "");
  return wk_model_build(job->model, job->loss, job->metrics, job->n_metrics,
                        sc, out, err, errlen);
}

void wk_model_free(wk_model *m) {
  if (!m) return;
  free(m->vars);
  free(m);
}

int wk_model_variables(const wk_model *m, const wk_var_info **out, size_t *n) {
  *out = m->vars;
  *n = (size_t)m->n_vars;
  return 0;
}

void wk_model_init_var(const wk_model *m, int v, uint64_t seed,
                       uint64_t first, float *out, size_t n) {
  const wk_var_info *vi = &m->vars[v];
  kern_init_fill(&vi->init, seed, kern_init_var_key(vi->name), first, out, n);
}

void wk_model_summary(const wk_model *m, char *buf, size_t len) {
  size_t o = 0;
  buf[0] = 0;
#define PUT(...) \
  do { if (o < len) o += (size_t)snprintf(buf + o, len - o, __VA_ARGS__); } while (0)
  for (int i = 0; i < m->n_emb; i++) {
    const wk_embed *e = &m->emb[i];
    PUT("%s: vocab %lld dim %lld %s\n", m->vars[e->var].name,
        (long long)e->vocab, (long long)e->dim,
        e->wide ? "(wide, summed into the logit)"
                : e->pool == KERN_POOL_MEAN ? "mean" : "sum");
    if (e->wide) break;
  }
  for (int i = 0; i < m->n_layers; i++) {
    const wk_layer *l = &m->layers[i];
    PUT("%s (%s) %lld -> %lld %s\n", l->name, l->cls, (long long)l->in,
        (long long)l->out, l->kind == WK_L_DROPOUT ? "" : kern_act_name(l->act));
  }
  PUT("loss %s%s", m->loss_name, m->fused ? " (computed from logits)" : "");
#undef PUT
}

int64_t wk_model_input_dense(const wk_model *m) { return m->n_dense; }
int64_t wk_model_num_classes(const wk_model *m) {
  return m->loss >= KERN_LOSS_CCE_LOGITS ? m->out_dim : 0;
}
int wk_model_num_metrics(const wk_model *m) { return m->n_metrics; }
const char *wk_model_metric_name(const wk_model *m, int i) {
  return m->metric_names[i];
}
