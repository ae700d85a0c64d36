/* Building a model: a Keras Sequential or Functional model.to_json()
 * document (Keras 2 and Keras 3 spellings) or {"builtin": "wide_deep",
 * ...}, with the loss and metrics resolved as Keras's compile() resolves
 * them; the variables' list and the summary.
 *
 * Happy path: the graph is parsed (model_graph.c, model_layers.c) into
 * nodes with the variables in Keras's order, names and initializers; then
 * the loss form is picked (a sigmoid or softmax output with a
 * cross-entropy loss is computed from the logits, as Keras does through the
 * output's _keras_logits).
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

int tsr_model__add_var(tsr_model *m, const char *layer, const char *vname,
                      int rank, const int64_t *shape,
                      const tsr_init_spec *in, tsr_var_kind kind) {
  if (rank < 1 || rank > TSR_MODEL_MAX_RANK) return TSR_EINVAL;
  /* sizes from a model file: checked, so none overflows later (the fans
   * tsr_var_set_init computes are at most the element count) */
  int64_t numel = 1;
  for (int i = 0; i < rank; i++)
    if (shape[i] < 1 || __builtin_mul_overflow(numel, shape[i], &numel) ||
        numel > ((int64_t)1 << 62))
      return TSR_ERANGE;
  char name[TSR_VAR_NAME_MAX];
  snprintf(name, sizeof name, "%s/%s", layer, vname);
  tsr_var v;
  int rc = tsr_var_set(&v, name, rank, shape, TSR_DT_FLOAT32, kind, NULL, 0);
  if (rc) return rc;
  tsr_var_set_init(&v, in);
  tsr_var *nv = realloc(m->vars, (size_t)(m->n_vars + 1) * sizeof *nv);
  if (!nv) return TSR_ENOMEM;
  m->vars = nv;
  nv[m->n_vars] = v;
  return m->n_vars++;
}

/* Keras initializer: a name string or {"class_name", "config"}. */
int tsr_model__parse_init(const json_t *j, const char *def, const char *where,
                         tsr_init_spec *out, char *err, size_t errlen) {
  const char *name = def;
  const json_t *cfg = NULL;
  if (j && json_is_string(j)) name = json_string_value(j);
  else if (j && json_is_object(j)) {
    name = json_string_value(json_object_get(j, "class_name"));
    cfg = json_object_get(j, "config");
  } else if (j && !json_is_null(j))
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "%s: initializer must be a name or an object",
                    where);
  if (!name || tsr_init_parse(name, out))
    return tsr_errf(err, errlen, TSR_EUNSUPPORTED,
                    "%s: initializer '%s' is not supported (supported: Zeros, "
                    "Ones, Constant, RandomUniform, RandomNormal, TruncatedNormal,"
                    " GlorotUniform, GlorotNormal, HeUniform, HeNormal, "
                    "Orthogonal)",
                    where, name ? name : "?");
  if (cfg && json_is_object(cfg)) {
    json_t *v;
    if (out->kind == TSR_INIT_UNIFORM) {
      if ((v = json_object_get(cfg, "minval")) && json_is_number(v))
        out->a = json_number_value(v);
      if ((v = json_object_get(cfg, "maxval")) && json_is_number(v))
        out->b = json_number_value(v);
    } else if (out->kind == TSR_INIT_NORMAL ||
               out->kind == TSR_INIT_TRUNCATED_NORMAL) {
      if ((v = json_object_get(cfg, "mean")) && json_is_number(v))
        out->a = json_number_value(v);
      if ((v = json_object_get(cfg, "stddev")) && json_is_number(v))
        out->b = json_number_value(v);
    } else if (out->kind == TSR_INIT_ORTHOGONAL) {
      if ((v = json_object_get(cfg, "gain")) && json_is_number(v))
        out->a = json_number_value(v);
    } else if (out->kind == TSR_INIT_CONSTANT) {
      if ((v = json_object_get(cfg, "value")) && json_is_number(v))
        out->a = json_number_value(v);
    }
  }
  return 0;
}

/* Keras activation: a string, null, or a serialized function object. */
int tsr_model__parse_act(const json_t *j, const char *layer, kern_act *act,
                        float *alpha, char *err, size_t errlen) {
  const char *name = "linear";
  if (j && json_is_string(j)) name = json_string_value(j);
  else if (j && json_is_object(j)) {
    const json_t *c = json_object_get(j, "config");
    name = json_string_value(json_object_get(j, "class_name"));
    if (c && json_is_string(c)) name = json_string_value(c);
  }
  if (kern_act_parse(name, act))
    return tsr_errf(err, errlen, TSR_EUNSUPPORTED,
                    "layer '%s': activation '%s' is not supported (supported: %s)",
                    layer, name ? name : "?", kern_act_list());
  *alpha = *act == KERN_ACT_LEAKY_RELU ? 0.2f : 1.0f;
  return 0;
}

int tsr_model_build(const json_t *model, const char *loss,
                   char *const *metrics, int n_metrics,
                   const wk_input_schema *sc, tsr_model **out, char *err,
                   size_t errlen) {
  *out = NULL;
  if (!json_is_object(model))
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "model: must be a JSON object (a Keras "
                    "model.to_json() document or {\"builtin\": ...})");
  tsr_model *m = calloc(1, sizeof *m);
  if (!m) return TSR_ENOMEM;
  int rc;
  const char *bi = json_string_value(json_object_get(model, "builtin"));
  const char *cls = json_string_value(json_object_get(model, "class_name"));
  if (bi) {
    if (strcmp(bi, "wide_deep")) {
      rc = tsr_errf(err, errlen, TSR_EUNSUPPORTED,
                    "model.builtin: '%s' is not a built-in "
                    "model (supported: wide_deep)", bi);
      goto fail;
    }
    rc = tsr_model__parse_wide_deep(m, model, sc, err, errlen);
  } else if (cls && !strcmp(cls, "Sequential")) {
    rc = tsr_model__parse_sequential(m, model, err, errlen);
  } else if (cls && (!strcmp(cls, "Functional") || !strcmp(cls, "Model"))) {
    rc = tsr_model__parse_functional(m, model, sc, err, errlen);
  } else {
    rc = tsr_errf(err, errlen, TSR_EUNSUPPORTED,
                  "model: class_name '%s' is not supported "
                  "(supported: Sequential, Functional, or {\"builtin\": "
                  "\"wide_deep\"})", cls ? cls : "(missing)");
  }
  if (rc == 0) rc = tsr_model__finish_graph(m, err, errlen);
  if (rc) goto fail;
  if ((rc = tsr_model__resolve_loss(m, loss, err, errlen)) ||
      (rc = tsr_model__resolve_metrics(m, metrics, n_metrics, err, errlen)))
    goto fail;
  if (sc) {
    if (m->n_dense != sc->n_dense && !(m->wide_deep && m->n_dense == 0)) {
      rc = tsr_errf(err, errlen, TSR_ESHAPE,
                    "shapes do not chain: the model's input takes "
                    "%lld feature(s) but the data has %lld", (long long)m->n_dense,
                    (long long)sc->n_dense);
      goto fail;
    }
    if (m->wide_deep && sc->n_sparse < m->n_sparse) {
      rc = tsr_errf(err, errlen, TSR_ESHAPE,
                    "shapes do not chain: the model reads %d sparse "
                    "feature(s) but the data has %d", m->n_sparse, sc->n_sparse);
      goto fail;
    }
    bool cls_loss = m->class_labels;
    if (cls_loss && sc->n_classes > 1 && sc->n_classes != m->out_dim) {
      rc = tsr_errf(err, errlen, TSR_ESHAPE,
                    "shapes do not chain: the data has %lld classes "
                    "but the output layer '%s' has %lld units",
                    (long long)sc->n_classes, m->layers[m->n_layers - 1].name,
                    (long long)m->out_dim);
      goto fail;
    }
  }
  *out = m;
  return 0;
fail:
  tsr_model_free(m);
  return rc;
}

int tsr_model_from_job(const tsr_job *job, const wk_input_schema *sc,
                      tsr_model **out, char *err, size_t errlen) {
  if (!job->model)
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "job %s: no model", job->path ? job->path : "");
  return tsr_model_build(job->model, job->loss, job->metrics, job->n_metrics,
                        sc, out, err, errlen);
}

void tsr_model_free(tsr_model *m) {
  if (!m) return;
  free(m->vars);
  free(m);
}

int tsr_model_variables(const tsr_model *m, const tsr_var **out, size_t *n) {
  *out = m->vars;
  *n = (size_t)m->n_vars;
  return 0;
}

void tsr_model_init_var(const tsr_model *m, int v, uint64_t seed,
                       uint64_t first, float *out, size_t n) {
  const tsr_var *vi = &m->vars[v];
  kern_init_fill(&vi->init, seed, kern_init_var_key(vi->name), first, out, n);
}

static void shape_str(const wk_layer *l, char *buf, size_t len) {
  size_t o = 0;
  buf[0] = 0;
  for (int i = 0; i < l->rank && o < len; i++)
    o += (size_t)snprintf(buf + o, len - o, "%s%lld", i ? "x" : "",
                          (long long)l->dim[i]);
}

void tsr_model_summary(const tsr_model *m, char *buf, size_t len) {
  size_t o = 0;
  buf[0] = 0;
#define PUT(...) \
  do { if (o < len) o += (size_t)snprintf(buf + o, len - o, __VA_ARGS__); } while (0)
  for (int i = 0; i < m->n_emb; i++) {
    const wk_embed *e = &m->emb[i];
    PUT("%s: vocab %lld dim %lld %s\n", m->vars[e->var].name,
        (long long)e->vocab, (long long)e->dim,
        e->wide ? "(wide, summed into the logit)"
        : e->per_id ? "per id"
        : e->pool == KERN_POOL_MEAN ? "mean" : "sum");
    if (e->wide) break;
  }
  for (int i = 0; i < m->n_layers; i++) {
    const wk_layer *l = &m->layers[i];
    if (l->kind == WK_L_INPUT || l->kind == WK_L_EMBED) continue;
    char a[64], b[64] = "";
    if (l->n_in > 0) shape_str(&m->layers[l->in[0]], a, sizeof a);
    else snprintf(a, sizeof a, "?");
    for (int k = 1; k < l->n_in && strlen(a) + 20 < sizeof a; k++) {
      shape_str(&m->layers[l->in[k]], b, sizeof b);
      size_t al = strlen(a);
      snprintf(a + al, sizeof a - al, " + %s", b);
    }
    shape_str(l, b, sizeof b);
    bool has_act = l->kind == WK_L_DENSE || l->kind == WK_L_CONV2D ||
                   l->kind == WK_L_ACTIVATION;
    PUT("%s (%s) %s -> %s%s%s\n", l->name, l->cls, a, b, has_act ? " " : "",
        has_act ? kern_act_name(l->act) : "");
  }
  PUT("loss %s%s", m->loss_name, m->fused ? " (computed from logits)" : "");
#undef PUT
}

int64_t tsr_model_input_dense(const tsr_model *m) { return m->n_dense; }

int tsr_model_inputs(const tsr_model *m, const char **names, int64_t *first,
                    int max) {
  int n = 0;
  for (int k = 0; k < m->n_layers; k++) {
    const wk_layer *l = &m->layers[k];
    if (l->kind != WK_L_INPUT || l->ids) continue;
    if (n < max) {
      names[n] = l->name;
      first[n] = l->x_off;
    }
    n++;
  }
  return n;
}
int64_t tsr_model_output_dim(const tsr_model *m) { return m->out_dim; }
int tsr_model_output_shape(const tsr_model *m, int64_t *dims, int max) {
  const wk_layer *out = &m->layers[m->n_layers - 1];
  int64_t prod = 1;
  for (int d = 0; d < out->rank; d++) prod *= out->dim[d];
  if (out->rank < 1 || prod != m->out_dim) { /* as the loss sees it */
    if (max > 0) dims[0] = m->out_dim;
    return 1;
  }
  for (int d = 0; d < out->rank && d < max; d++) dims[d] = out->dim[d];
  return out->rank;
}
int64_t tsr_model_num_classes(const tsr_model *m) {
  return m->loss >= KERN_LOSS_CCE_LOGITS ? m->out_dim : 0;
}
int tsr_model_num_metrics(const tsr_model *m) { return m->n_metrics; }
const char *tsr_model_metric_name(const tsr_model *m, int i) {
  return m->metric_names[i];
}
