/* Models on in-memory batches: Keras JSON parsing and variable listing,
 * gradients of whole models (every layer kind, every loss) against central
 * differences, replicas whose summed gradients equal one replica's on the
 * whole batch, bad models and bad batches, training that converges, and
 * fp16 dynamic loss scaling. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/err.h"
#include "worker/metrics.h"
#include "worker/model_exec.h"
#include "worker/train.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TSR_TEST_SEED 0x2545F4914F6CDD1Dull
#include "../test_rand.h"

/* The Keras example, as Keras 2.x's model.to_json() writes it. */
static const char *keras_example =
    "{\"class_name\": \"Sequential\", \"config\": {\"name\": \"sequential\", "
    "\"layers\": [{\"class_name\": \"InputLayer\", \"config\": "
    "{\"batch_input_shape\": [null, 10], \"dtype\": \"float32\", \"sparse\": "
    "false, \"ragged\": false, \"name\": \"dense_input\"}}, {\"class_name\": "
    "\"Dense\", \"config\": {\"name\": \"dense\", \"trainable\": true, "
    "\"batch_input_shape\": [null, 10], \"dtype\": \"float32\", \"units\": 64, "
    "\"activation\": \"relu\", \"use_bias\": true, \"kernel_initializer\": "
    "{\"class_name\": \"GlorotUniform\", \"config\": {\"seed\": null}}, "
    "\"bias_initializer\": {\"class_name\": \"Zeros\", \"config\": {}}, "
    "\"kernel_regularizer\": null, \"bias_regularizer\": null, "
    "\"activity_regularizer\": null, \"kernel_constraint\": null, "
    "\"bias_constraint\": null}}, {\"class_name\": \"Dense\", \"config\": "
    "{\"name\": \"dense_1\", \"trainable\": true, \"dtype\": \"float32\", "
    "\"units\": 1, \"activation\": \"linear\", \"use_bias\": true, "
    "\"kernel_initializer\": {\"class_name\": \"GlorotUniform\", \"config\": "
    "{\"seed\": null}}, \"bias_initializer\": {\"class_name\": \"Zeros\", "
    "\"config\": {}}, \"kernel_regularizer\": null, \"bias_regularizer\": "
    "null, \"activity_regularizer\": null, \"kernel_constraint\": null, "
    "\"bias_constraint\": null}}]}, \"keras_version\": \"2.13.1\", "
    "\"backend\": \"tensorflow\"}";

static int build(const char *json, const char *loss, const char *metric,
                 const wk_input_schema *sc, tsr_model **m, char *err,
                 size_t len) {
  json_error_t je;
  json_t *j = json_loads(json, 0, &je);
  if (!j) fail_msg("test JSON: %s", je.text);
  char *mets[1] = {(char *)metric};
  int rc = tsr_model_build(j, loss, mets, metric ? 1 : 0, sc, m, err, len);
  json_decref(j);
  return rc;
}

/* A batch with n_dense features, optional sparse features (1..3 ids each
 * below vocab), labels from `label_kind`: 0 regression, 1 binary, k>1
 * classes. Integer features when int_vocab > 0 (Embedding inputs). */
typedef struct {
  wk_batch b;
  int64_t *ids[4], *off[4];
  int64_t *idsp[4], *offp[4];
} tbatch;

static void make_batch(tbatch *t, int64_t n, int64_t nd, int ns,
                       int64_t vocab, int label_kind, int64_t int_vocab) {
  memset(t, 0, sizeof *t);
  t->b.n = n;
  t->b.n_dense = nd;
  t->b.x = malloc((size_t)(n * (nd ? nd : 1)) * sizeof(float));
  t->b.y = malloc((size_t)n * sizeof(float));
  for (int64_t i = 0; i < n * nd; i++)
    t->b.x[i] = int_vocab ? (float)(int64_t)(urand() * int_vocab)
                          : (float)(urand() * 2 - 1);
  for (int64_t i = 0; i < n; i++)
    t->b.y[i] = label_kind == 0 ? (float)(urand() * 2 - 1)
                : label_kind == 1 ? (float)(urand() < 0.5)
                                  : (float)(int64_t)(urand() * label_kind);
  t->b.n_sparse = ns;
  for (int f = 0; f < ns; f++) {
    t->off[f] = malloc((size_t)(n + 1) * sizeof(int64_t));
    t->ids[f] = malloc((size_t)(n * 3) * sizeof(int64_t));
    t->off[f][0] = 0;
    for (int64_t i = 0; i < n; i++) {
      int64_t k = (int64_t)(urand() * 3); /* 0..2 ids; bags may be empty */
      for (int64_t j = 0; j < k; j++)
        t->ids[f][t->off[f][i] + j] = (int64_t)(urand() * vocab);
      t->off[f][i + 1] = t->off[f][i] + k;
    }
  }
  t->b.ids = t->ids;
  t->b.offsets = t->off;
}

static void free_batch(tbatch *t) {
  free(t->b.x);
  free(t->b.y);
  for (int f = 0; f < 4; f++) {
    free(t->ids[f]);
    free(t->off[f]);
  }
}

/* Parameters for a prepared exec: dense from the initializer, sparse rows
 * from the (random) full tables. */
typedef struct {
  int nv;
  float *full[32];
  float *p[32], *g[32];
} tparams;

static void params_for(const tsr_model *m, wk_exec *e, tparams *tp) {
  const tsr_var *vi;
  size_t nv;
  tsr_model_variables(m, &vi, &nv);
  tp->nv = (int)nv;
  for (size_t v = 0; v < nv; v++) {
    if (!tp->full[v]) {
      tp->full[v] = malloc((size_t)vi[v].numel * sizeof(float));
      tsr_model_init_var(m, (int)v, 3, 0, tp->full[v], (size_t)vi[v].numel);
      /* biases and wide weights start at zero: move them off it */
      for (int64_t i = 0; i < vi[v].numel; i++)
        tp->full[v][i] += (float)(urand() * 0.2 - 0.1);
    }
    free(tp->p[v]);
    free(tp->g[v]);
    const int64_t *ids;
    int64_t nr;
    wk_exec_rows(e, (int)v, &ids, &nr);
    int64_t ne = vi[v].kind == TSR_VAR_DENSE ? vi[v].numel : nr * vi[v].row_dim;
    tp->p[v] = malloc((size_t)(ne ? ne : 1) * sizeof(float));
    tp->g[v] = malloc((size_t)(ne ? ne : 1) * sizeof(float));
    if (vi[v].kind == TSR_VAR_DENSE)
      memcpy(tp->p[v], tp->full[v], (size_t)ne * sizeof(float));
    else
      for (int64_t u = 0; u < nr; u++)
        memcpy(tp->p[v] + u * vi[v].row_dim, tp->full[v] + ids[u] * vi[v].row_dim,
               (size_t)vi[v].row_dim * sizeof(float));
  }
}

static void free_params(tparams *tp) {
  for (int v = 0; v < 32; v++) {
    free(tp->full[v]);
    free(tp->p[v]);
    free(tp->g[v]);
  }
}

static double run_loss(wk_exec *e, tparams *tp, bool train) {
  wk_run_opts o = {.train = train, .grad_scale = 1.0f, .seed = 11};
  wk_run_result r;
  assert_int_equal(wk_exec_run(e, tp->p, tp->g, &o, &r), 0);
  return r.loss_sum;
}

/* Central differences of the loss sum for a sample of every variable's
 * elements against the backward pass. */
static void grad_check(const char *what, const char *json, const char *loss,
                       int64_t nd, int ns, int label_kind, int64_t int_vocab) {
  char err[512];
  tsr_model *m = NULL;
  if (build(json, loss, NULL, NULL, &m, err, sizeof err))
    fail_msg("%s: %s", what, err);
  kern_opts ko = {.device = KERN_DEVICE_CPU};
  kern_ctx *c;
  assert_int_equal(kern_open(&ko, &c, err, sizeof err), 0);
  wk_exec *e;
  assert_int_equal(wk_exec_open(m, c, 16, KERN_F32, &e, err, sizeof err), 0);
  tbatch tb;
  make_batch(&tb, 6, nd, ns, 5, label_kind, int_vocab);
  if (wk_exec_prepare(e, &tb.b, 0, 6, NULL, err, sizeof err))
    fail_msg("%s: %s", what, err);
  tparams tp = {0};
  params_for(m, e, &tp);
  run_loss(e, &tp, true);
  const tsr_var *vi;
  size_t nv;
  tsr_model_variables(m, &vi, &nv);
  float *g0[32];
  int64_t nel[32];
  for (size_t v = 0; v < nv; v++) { /* every gradient before any probe */
    const int64_t *ids;
    int64_t nr;
    wk_exec_rows(e, (int)v, &ids, &nr);
    nel[v] = vi[v].kind == TSR_VAR_DENSE ? vi[v].numel : nr * vi[v].row_dim;
    g0[v] = malloc((size_t)(nel[v] ? nel[v] : 1) * sizeof(float));
    memcpy(g0[v], tp.g[v], (size_t)nel[v] * sizeof(float));
  }
  for (size_t v = 0; v < nv; v++) {
    const int64_t *ids;
    int64_t nr;
    wk_exec_rows(e, (int)v, &ids, &nr);
    int64_t ne = vi[v].kind == TSR_VAR_DENSE ? vi[v].numel : nr * vi[v].row_dim;
    for (int s = 0; s < 12 && ne > 0; s++) {
      int64_t i = (int64_t)(urand() * ne);
      float keep = tp.p[v][i];
      /* central differences at three step sizes: a kink of relu & co.
       * within one step of an example spoils that step only */
      double an = g0[v][i], fd = 0;
      bool ok = false;
      for (int k = 0; k < 3 && !ok; k++) {
        float h = (k == 0 ? 1e-3f : k == 1 ? 1e-4f : 3e-3f) *
                  fmaxf(1.0f, fabsf(keep));
        /* train mode: the same dropout mask as the backward pass */
        tp.p[v][i] = keep + h;
        double lp = run_loss(e, &tp, true);
        tp.p[v][i] = keep - h;
        double lm = run_loss(e, &tp, true);
        tp.p[v][i] = keep;
        fd = (lp - lm) / ((double)(keep + h) - (double)(keep - h));
        ok = fabs(an - fd) <= 2e-2 * fmax(fabs(fd), 0.05);
        if (getenv("GC_DEBUG") && !ok)
          print_message("%s %s[%lld] h %g: %.9g %.9g fd %g an %g\n", what,
                        vi[v].name, (long long)i, h, lp, lm, fd, an);
      }
      if (!ok)
        fail_msg("%s: d loss / d %s[%lld] = %g, finite difference %g", what,
                 vi[v].name, (long long)i, an, fd);
    }
    free(g0[v]);
  }
  free_params(&tp);
  free_batch(&tb);
  wk_exec_close(e);
  kern_close(c);
  tsr_model_free(m);
}

static char *seq_json(const char *layers, int64_t in) {
  static char buf[4096];
  snprintf(buf, sizeof buf,
           "{\"class_name\": \"Sequential\", \"config\": {\"name\": \"s\", "
           "\"layers\": [{\"class_name\": \"InputLayer\", \"config\": "
           "{\"batch_input_shape\": [null, %lld], \"name\": \"in\"}}, %s]}}",
           (long long)in, layers);
  return buf;
}

static void test_keras_example_variables(void **state) {
  char err[512];
  tsr_model *m;
  assert_int_equal(build(keras_example, "mse", NULL, NULL, &m, err, sizeof err), 0);
  const tsr_var *v;
  size_t n;
  tsr_model_variables(m, &v, &n);
  assert_int_equal(n, 4);
  assert_string_equal(v[0].name, "dense/kernel");
  assert_int_equal(v[0].shape[0], 10);
  assert_int_equal(v[0].shape[1], 64);
  assert_int_equal(v[0].init.kind, TSR_INIT_GLOROT_UNIFORM);
  assert_int_equal(v[0].init.fan_in, 10);
  assert_int_equal(v[0].init.fan_out, 64);
  assert_string_equal(v[1].name, "dense/bias");
  assert_int_equal(v[1].rank, 1);
  assert_int_equal(v[1].init.kind, TSR_INIT_ZEROS);
  assert_string_equal(v[2].name, "dense_1/kernel");
  assert_string_equal(v[3].name, "dense_1/bias");
  assert_int_equal(v[3].numel, 1);
  assert_int_equal(v[0].kind, TSR_VAR_DENSE);
  assert_int_equal(tsr_model_input_dense(m), 10);
  /* initial values are the counter-based generator's for that name */
  float a[640], b[640];
  tsr_model_init_var(m, 0, 42, 0, a, 640);
  kern_init_fill(&v[0].init, 42, kern_init_var_key("dense/kernel"), 0, b, 640);
  assert_memory_equal(a, b, sizeof a);
  double lim = sqrt(6.0 / 74);
  for (int i = 0; i < 640; i++) assert_true(fabs(a[i]) <= lim);
  tsr_model_free(m);
}

/* Keras 3's model.to_json(): InputLayer batch_shape, module and
 * registered_name keys, dtype policies; names left out get Keras's. */
static void test_keras3_and_default_names(void **state) {
  const char *k3 =
      "{\"module\": \"keras\", \"class_name\": \"Sequential\", \"config\": "
      "{\"name\": \"sequential\", \"trainable\": true, \"dtype\": {\"module\": "
      "\"keras\", \"class_name\": \"DTypePolicy\", \"config\": {\"name\": "
      "\"float32\"}, \"registered_name\": null}, \"layers\": [{\"module\": "
      "\"keras.layers\", \"class_name\": \"InputLayer\", \"config\": "
      "{\"batch_shape\": [null, 10], \"dtype\": \"float32\", \"sparse\": false, "
      "\"name\": \"input_layer\"}, \"registered_name\": null}, {\"module\": "
      "\"keras.layers\", \"class_name\": \"Dense\", \"config\": {\"name\": "
      "\"dense\", \"trainable\": true, \"units\": 64, \"activation\": \"relu\", "
      "\"use_bias\": true, \"kernel_initializer\": {\"module\": "
      "\"keras.initializers\", \"class_name\": \"GlorotUniform\", \"config\": "
      "{\"seed\": null}, \"registered_name\": null}, \"bias_initializer\": "
      "{\"module\": \"keras.initializers\", \"class_name\": \"Zeros\", "
      "\"config\": {}, \"registered_name\": null}, \"kernel_regularizer\": null,"
      " \"bias_regularizer\": null, \"kernel_constraint\": null, "
      "\"bias_constraint\": null}, \"registered_name\": null, \"build_config\": "
      "{\"input_shape\": [null, 10]}}, {\"module\": \"keras.layers\", "
      "\"class_name\": \"Dense\", \"config\": {\"name\": \"dense_1\", "
      "\"units\": 1, \"activation\": \"linear\", \"kernel_initializer\": "
      "{\"module\": \"keras.initializers\", \"class_name\": \"RandomUniform\", "
      "\"config\": {\"minval\": -0.5, \"maxval\": 0.25, \"seed\": null}}}}]}}";
  char err[512];
  tsr_model *m;
  if (build(k3, "mse", NULL, NULL, &m, err, sizeof err)) fail_msg("%s", err);
  const tsr_var *v;
  size_t n;
  tsr_model_variables(m, &v, &n);
  assert_int_equal(n, 4);
  assert_string_equal(v[0].name, "dense/kernel");
  assert_int_equal(v[0].shape[0], 10);
  assert_string_equal(v[2].name, "dense_1/kernel");
  assert_int_equal(v[2].init.kind, TSR_INIT_UNIFORM);
  assert_float_equal(v[2].init.a, -0.5, 0);
  assert_float_equal(v[2].init.b, 0.25, 0);
  tsr_model_free(m);
  /* no names: Keras's defaults, per class */
  const char *anon =
      "{\"class_name\": \"Sequential\", \"config\": {\"layers\": ["
      "{\"class_name\": \"InputLayer\", \"config\": {\"batch_input_shape\": "
      "[null, 6]}}, {\"class_name\": \"Embedding\", \"config\": "
      "{\"input_dim\": 9, \"output_dim\": 2}}, {\"class_name\": \"Flatten\", "
      "\"config\": {}}, {\"class_name\": \"Dense\", \"config\": {\"units\": 3}},"
      " {\"class_name\": \"Dropout\", \"config\": {\"rate\": 0.1}}, "
      "{\"class_name\": \"Dense\", \"config\": {\"units\": 1}}]}}";
  if (build(anon, "mse", NULL, NULL, &m, err, sizeof err)) fail_msg("%s", err);
  tsr_model_variables(m, &v, &n);
  assert_int_equal(n, 5);
  assert_string_equal(v[0].name, "embedding/embeddings");
  assert_int_equal(v[0].kind, TSR_VAR_ROW_SPARSE);
  assert_int_equal(v[0].init.kind, TSR_INIT_UNIFORM);
  assert_string_equal(v[1].name, "dense/kernel");
  assert_int_equal(v[1].shape[0], 12);
  assert_string_equal(v[3].name, "dense_1/kernel");
  tsr_model_free(m);
}

static void test_grad_dense_activations(void **state) {
  const char *acts[] = {"linear", "relu", "sigmoid", "tanh", "elu", "selu",
                        "gelu", "swish", "silu", "softplus", "softsign",
                        "leaky_relu", "relu6", "exponential"};
  for (size_t a = 0; a < sizeof acts / sizeof acts[0]; a++) {
    char layers[1024];
    snprintf(layers, sizeof layers,
             "{\"class_name\": \"Dense\", \"config\": {\"name\": \"dense\", "
             "\"units\": 5, \"activation\": \"%s\"}}, {\"class_name\": "
             "\"Dense\", \"config\": {\"name\": \"dense_1\", \"units\": 1}}",
             acts[a]);
    grad_check(acts[a], seq_json(layers, 4), "mse", 4, 0, 0, 0);
  }
}

static void test_grad_losses_and_layers(void **state) {
  const char *soft =
      "{\"class_name\": \"Dense\", \"config\": {\"name\": \"dense\", "
      "\"units\": 6, \"activation\": \"tanh\"}}, {\"class_name\": \"Dropout\","
      " \"config\": {\"name\": \"dropout\", \"rate\": 0.3}}, {\"class_name\": "
      "\"Dense\", \"config\": {\"name\": \"dense_1\", \"units\": 3, "
      "\"activation\": \"softmax\"}}";
  grad_check("sparse cce (softmax output, from logits)", seq_json(soft, 4),
             "sparse_categorical_crossentropy", 4, 0, 3, 0);
  grad_check("categorical cce", seq_json(soft, 4), "categorical_crossentropy",
             4, 0, 3, 0);
  const char *probs =
      "{\"class_name\": \"Dense\", \"config\": {\"name\": \"dense\", "
      "\"units\": 3, \"activation\": \"sigmoid\", \"use_bias\": false}}, "
      "{\"class_name\": \"Activation\", \"config\": {\"name\": \"act\", "
      "\"activation\": \"softplus\"}}";
  grad_check("cce on probabilities (no softmax output)", seq_json(probs, 4),
             "sparse_categorical_crossentropy", 4, 0, 3, 0);
  const char *lin = "{\"class_name\": \"Dense\", \"config\": {\"name\": "
                    "\"dense\", \"units\": 3}}";
  grad_check("sparse cce from logits", seq_json(lin, 4),
             "sparse_categorical_crossentropy_from_logits", 4, 0, 3, 0);
  const char *bin =
      "{\"class_name\": \"Dense\", \"config\": {\"name\": \"dense\", "
      "\"units\": 4, \"activation\": \"elu\"}}, {\"class_name\": \"Dense\", "
      "\"config\": {\"name\": \"dense_1\", \"units\": 1, \"activation\": "
      "\"sigmoid\"}}";
  grad_check("bce (sigmoid output)", seq_json(bin, 3), "binary_crossentropy",
             3, 0, 1, 0);
  const char *bin2 =
      "{\"class_name\": \"Dense\", \"config\": {\"name\": \"dense\", "
      "\"units\": 1, \"activation\": \"tanh\"}}, {\"class_name\": "
      "\"Activation\", \"config\": {\"name\": \"a\", \"activation\": "
      "\"sigmoid\"}}";
  grad_check("bce on probabilities", seq_json(bin2, 3), "binary_crossentropy",
             3, 0, 1, 0);
  const char *lin1 = "{\"class_name\": \"Dense\", \"config\": {\"name\": "
                     "\"dense\", \"units\": 1}}";
  grad_check("bce from logits", seq_json(lin1, 3),
             "binary_crossentropy_from_logits", 3, 0, 1, 0);
  grad_check("mae", seq_json(lin1, 3), "mae", 3, 0, 0, 0);
}

static void test_grad_embeddings(void **state) {
  const char *flat =
      "{\"class_name\": \"Embedding\", \"config\": {\"name\": \"embedding\", "
      "\"input_dim\": 7, \"output_dim\": 3, \"input_length\": 4}}, "
      "{\"class_name\": \"Flatten\", \"config\": {\"name\": \"flatten\"}}, "
      "{\"class_name\": \"Dense\", \"config\": {\"name\": \"dense\", "
      "\"units\": 1}}";
  grad_check("Embedding + Flatten", seq_json(flat, 4), "mse", 4, 0, 0, 7);
  const char *gap =
      "{\"class_name\": \"Embedding\", \"config\": {\"name\": \"embedding\", "
      "\"input_dim\": 5, \"output_dim\": 4}}, {\"class_name\": "
      "\"GlobalAveragePooling1D\", \"config\": {\"name\": \"gap\"}}, "
      "{\"class_name\": \"Dense\", \"config\": {\"name\": \"dense\", "
      "\"units\": 2, \"activation\": \"softmax\"}}";
  grad_check("Embedding + GlobalAveragePooling1D", seq_json(gap, 6),
             "sparse_categorical_crossentropy", 6, 0, 2, 5);
  grad_check("wide_deep mean",
             "{\"builtin\": \"wide_deep\", \"dense_features\": 3, "
             "\"sparse_features\": [{\"name\": \"a\", \"vocab\": 5, \"dim\": 3},"
             " {\"name\": \"b\", \"vocab\": 5, \"dim\": 2}], \"hidden\": [6, 4],"
             " \"activation\": \"tanh\"}",
             "binary_crossentropy", 3, 2, 1, 0);
  grad_check("wide_deep sum, no dense",
             "{\"builtin\": \"wide_deep\", \"dense_features\": 0, "
             "\"sparse_features\": 3, \"vocab\": 5, \"embedding_dim\": 2, "
             "\"combiner\": \"sum\", \"hidden\": [4]}",
             "binary_crossentropy", 0, 3, 1, 0);
}

/* MirroredStrategy: two replicas on halves of the batch, gradients summed,
 * equal one replica on the whole batch. */
static void test_replicas_sum(void **state) {
  char err[512];
  tsr_model *m;
  assert_int_equal(build("{\"builtin\": \"wide_deep\", \"dense_features\": 3,"
                         " \"sparse_features\": 2, \"vocab\": 6, "
                         "\"embedding_dim\": 2, \"hidden\": [5]}",
                         "binary_crossentropy", "auc", NULL, &m, err,
                         sizeof err), 0);
  kern_opts ko = {.device = KERN_DEVICE_CPU};
  kern_ctx *c[3];
  wk_exec *e[3];
  for (int i = 0; i < 3; i++) {
    assert_int_equal(kern_open(&ko, &c[i], err, sizeof err), 0);
    assert_int_equal(wk_exec_open(m, c[i], 10, KERN_F32, &e[i], err, sizeof err), 0);
  }
  tbatch tb;
  make_batch(&tb, 10, 3, 2, 6, 1, 0);
  assert_int_equal(wk_exec_prepare(e[0], &tb.b, 0, 10, NULL, err, sizeof err), 0);
  assert_int_equal(wk_exec_prepare(e[1], &tb.b, 0, 4, e[0], err, sizeof err), 0);
  assert_int_equal(wk_exec_prepare(e[2], &tb.b, 4, 10, e[0], err, sizeof err), 0);
  tparams one = {0}, r1 = {0}, r2 = {0};
  params_for(m, e[0], &one);
  for (int v = 0; v < one.nv; v++) { /* the same tables for every replica */
    r1.full[v] = one.full[v];
    r2.full[v] = one.full[v];
  }
  params_for(m, e[1], &r1);
  params_for(m, e[2], &r2);
  wk_run_opts o = {.train = true, .grad_scale = 0.1f, .seed = 1};
  wk_run_result rr;
  assert_int_equal(wk_exec_run(e[0], one.p, one.g, &o, &rr), 0);
  o.keep_on_device = true;
  assert_int_equal(wk_exec_run(e[1], r1.p, r1.g, &o, &rr), 0);
  assert_int_equal(wk_exec_run(e[2], r2.p, r2.g, &o, &rr), 0);
  wk_exec *reps[2] = {e[1], e[2]};
  assert_int_equal(wk_exec_allreduce(reps, 2), 0);
  assert_int_equal(wk_exec_fetch_grads(e[1], r1.g), 0);
  const tsr_var *vi;
  size_t nv;
  tsr_model_variables(m, &vi, &nv);
  for (size_t v = 0; v < nv; v++) {
    const int64_t *ids;
    int64_t nr;
    wk_exec_rows(e[0], (int)v, &ids, &nr);
    int64_t ne = vi[v].kind == TSR_VAR_DENSE ? vi[v].numel : nr * vi[v].row_dim;
    for (int64_t i = 0; i < ne; i++)
      if (fabsf(one.g[v][i] - r1.g[v][i]) > 1e-5f)
        fail_msg("%s[%lld]: one replica %g, two summed %g", vi[v].name,
                 (long long)i, one.g[v][i], r1.g[v][i]);
  }
  for (int v = 0; v < one.nv; v++) r1.full[v] = r2.full[v] = NULL;
  free_params(&one);
  free_params(&r1);
  free_params(&r2);
  free_batch(&tb);
  for (int i = 0; i < 3; i++) {
    wk_exec_close(e[i]);
    kern_close(c[i]);
  }
  tsr_model_free(m);
}

static void expect_build_error(const char *json, const char *loss,
                               const wk_input_schema *sc, int code,
                               const char *s1, const char *s2) {
  char err[1024] = "";
  tsr_model *m = NULL;
  int rc = build(json, loss, NULL, sc, &m, err, sizeof err);
  if (rc != code) fail_msg("expected %d, got %d (%s)", code, rc, err);
  assert_null(m);
  if (!strstr(err, s1) || (s2 && !strstr(err, s2)))
    fail_msg("error '%s' lacks '%s' / '%s'", err, s1, s2 ? s2 : "");
}

static void test_bad_models(void **state) {
  expect_build_error(seq_json("{\"class_name\": \"SimpleRNN\", \"config\": "
                              "{\"name\": \"rnn\", \"units\": 3}}", 4),
                     "mse", NULL, TSR_EUNSUPPORTED, "SimpleRNN",
                     "supported: InputLayer, Dense, Conv2D");
  expect_build_error(seq_json("{\"class_name\": \"Dense\", \"config\": "
                              "{\"name\": \"dense\", \"units\": 1, "
                              "\"activation\": \"mish\"}}", 4),
                     "mse", NULL, TSR_EUNSUPPORTED, "'mish'", "gelu");
  expect_build_error(keras_example, "hinge", NULL, TSR_EUNSUPPORTED, "hinge",
                     "sparse_categorical_crossentropy");
  /* more sparse features than embedding slots (found by fuzz_job: an
   * index out of bounds) */
  expect_build_error("{\"builtin\": \"wide_deep\", \"dense_features\": 1, "
                     "\"sparse_features\": 70, \"vocab\": 5}",
                     "binary_crossentropy", NULL, TSR_ECONFIG,
                     "sparse_features", "1..63");
  /* a kernel of 4 x 2^62 elements: its size overflowed (UBSan) */
  expect_build_error(seq_json("{\"class_name\": \"Dense\", \"config\": "
                              "{\"name\": \"big\", \"units\": "
                              "4611686018427387904}}", 4),
                     "mse", NULL, TSR_ERANGE, "layer 'big'", "too large");
  wk_input_schema sc = {.n_dense = 9, .n_classes = 1};
  expect_build_error(keras_example, "mse", &sc, TSR_ESHAPE,
                     "shapes do not chain", "10 feature(s) but the data has 9");
  wk_input_schema sc10 = {.n_dense = 10, .n_classes = 10};
  expect_build_error(seq_json("{\"class_name\": \"Dense\", \"config\": "
                              "{\"name\": \"out\", \"units\": 3, "
                              "\"activation\": \"softmax\"}}", 10),
                     "sparse_categorical_crossentropy", &sc10, TSR_ESHAPE,
                     "10 classes", "'out' has 3 units");
  expect_build_error(seq_json("{\"class_name\": \"Dense\", \"config\": "
                              "{\"name\": \"out\", \"units\": 3}}", 10),
                     "mse", NULL, TSR_ESHAPE, "3 units", "one label");
  expect_build_error(seq_json("{\"class_name\": \"Embedding\", \"config\": "
                              "{\"name\": \"e\", \"input_dim\": 4, "
                              "\"output_dim\": 2}}, {\"class_name\": \"Dense\","
                              " \"config\": {\"name\": \"d\", \"units\": 1}}", 3),
                     "mse", NULL, TSR_ESHAPE, "Flatten", NULL);
  expect_build_error(seq_json("{\"class_name\": \"Dense\", \"config\": "
                              "{\"name\": \"d\", \"units\": 1, "
                              "\"activity_regularizer\": {\"class_name\": "
                              "\"L2\"}}}", 3),
                     "mse", NULL, TSR_EUNSUPPORTED, "activity_regularizer",
                     "not supported");
  expect_build_error("{\"class_name\": \"Subclassed\", \"config\": {}}",
                     "mse", NULL, TSR_EUNSUPPORTED, "Subclassed",
                     "Sequential, Functional");
}

static void test_bad_batches(void **state) {
  char err[512];
  tsr_model *m;
  assert_int_equal(build(seq_json("{\"class_name\": \"Dense\", \"config\": "
                                  "{\"name\": \"d\", \"units\": 3, "
                                  "\"activation\": \"softmax\"}}", 4),
                         "sparse_categorical_crossentropy", "accuracy", NULL,
                         &m, err, sizeof err), 0);
  kern_opts ko = {.device = KERN_DEVICE_CPU};
  kern_ctx *c;
  wk_exec *e;
  assert_int_equal(kern_open(&ko, &c, err, sizeof err), 0);
  assert_int_equal(wk_exec_open(m, c, 8, KERN_F32, &e, err, sizeof err), 0);
  tbatch tb;
  make_batch(&tb, 8, 4, 0, 0, 3, 0);
  tb.b.index = 17;
  tb.b.x[3 * 4 + 2] = NAN;
  assert_int_equal(wk_exec_prepare(e, &tb.b, 0, 8, NULL, err, sizeof err),
                   TSR_ENONFINITE);
  assert_non_null(strstr(err, "batch 17"));
  assert_non_null(strstr(err, "example 3"));
  assert_non_null(strstr(err, "column 2 is NaN"));
  tb.b.x[3 * 4 + 2] = 0;
  tb.b.y[5] = 3;
  assert_int_equal(wk_exec_prepare(e, &tb.b, 0, 8, NULL, err, sizeof err),
                   TSR_ERANGE);
  assert_non_null(strstr(err, "example 5: label 3"));
  tb.b.y[5] = 1;
  tb.b.n_dense = 5;
  assert_int_equal(wk_exec_prepare(e, &tb.b, 0, 8, NULL, err, sizeof err),
                   TSR_ESHAPE);
  free_batch(&tb);
  wk_exec_close(e);
  kern_close(c);
  /* a GPU asked for where there is none */
  wk_train_opts to = {.device = KERN_DEVICE_GPU, .quiet = true};
  tsr_optim_spec opt;
  tsr_optim_defaults(TSR_OPT_ADAM, &opt);
  wk_trainer *t = NULL;
  int n = 0;
  kern_gpu_count(NULL, &n, err, sizeof err);
  if (n == 0) {
    assert_int_equal(wk_trainer_open(m, &opt, 1, TSR_PREC_FP32, &to, 8, &t,
                                     err, sizeof err), TSR_ENODEVICE);
    assert_null(t);
    assert_non_null(strstr(err, "no usable GPU"));
  }
  tsr_model_free(m);
}

/* A linear target learned by the Keras example with Adam; and fp16 loss
 * scaling: overflowing gradients are skipped and halve the scale. */
static void train_regression(tsr_precision prec, float label_scale,
                             int steps, wk_trainer **out_t, tsr_model **out_m,
                             double *first, double *last) {
  char err[512];
  tsr_model *m;
  assert_int_equal(build(keras_example, "mse", "mae", NULL, &m, err, sizeof err), 0);
  tsr_optim_spec opt;
  tsr_optim_defaults(TSR_OPT_ADAM, &opt);
  opt.learning_rate = 0.01;
  wk_train_opts to = {.device = KERN_DEVICE_CPU, .quiet = true};
  wk_trainer *t;
  assert_int_equal(wk_trainer_open(m, &opt, 5, prec, &to, 32, &t, err, sizeof err), 0);
  tbatch tb;
  make_batch(&tb, 32, 10, 0, 0, 0, 0);
  *first = *last = 0;
  for (int s = 0; s < steps; s++) {
    for (int i = 0; i < 32; i++) {
      double y = 0;
      for (int j = 0; j < 10; j++) {
        tb.b.x[i * 10 + j] = (float)(urand() * 2 - 1);
        y += (j - 4.5) * 0.3 * tb.b.x[i * 10 + j];
      }
      tb.b.y[i] = (float)y * label_scale;
    }
    double loss;
    bool applied;
    assert_int_equal(wk_trainer_step(t, &tb.b, &loss, &applied, err, sizeof err), 0);
    if (s < 10) *first += loss / 10;
    if (s >= steps - 10) *last += loss / 10;
  }
  free_batch(&tb);
  *out_t = t;
  *out_m = m;
}

static void test_train_converges(void **state) {
  wk_trainer *t;
  tsr_model *m;
  double first, last;
  train_regression(TSR_PREC_FP32, 1.0f, 400, &t, &m, &first, &last);
  print_message("fp32: loss %.4f -> %.4f\n", first, last);
  assert_true(last < first * 0.05);
  wk_trainer_close(t);
  tsr_model_free(m);
  train_regression(TSR_PREC_BF16, 1.0f, 400, &t, &m, &first, &last);
  print_message("bf16: loss %.4f -> %.4f\n", first, last);
  assert_true(last < first * 0.05);
  wk_trainer_close(t);
  tsr_model_free(m);
}

static void test_fp16_loss_scale(void **state) {
  wk_trainer *t;
  tsr_model *m;
  double first, last;
  /* labels of ~1e3: dL/dy * 2^15 overflows fp16 until the scale drops */
  train_regression(TSR_PREC_FP16, 1000.0f, 60, &t, &m, &first, &last);
  print_message("fp16 big labels: %lld skipped, scale %g\n",
                (long long)wk_trainer_skipped(t), wk_trainer_loss_scale(t));
  assert_true(wk_trainer_skipped(t) > 0);
  assert_true(wk_trainer_loss_scale(t) < 32768.0f);
  assert_int_equal(wk_trainer_steps(t) + wk_trainer_skipped(t), 60);
  wk_trainer_close(t);
  tsr_model_free(m);
  /* small labels: no overflow, the scale doubles after 2000 finite steps */
  train_regression(TSR_PREC_FP16, 0.01f, 2001, &t, &m, &first, &last);
  assert_int_equal(wk_trainer_skipped(t), 0);
  assert_float_equal(wk_trainer_loss_scale(t), 65536.0f, 0);
  wk_trainer_close(t);
  tsr_model_free(m);
}

static void test_metrics(void **state) {
  float s[6] = {0.1f, 0.4f, 0.35f, 0.8f, 0.8f, 0.5f};
  float y[6] = {0, 0, 1, 1, 0, 1};
  double auc;
  assert_int_equal(wk_auc(s, y, 6, &auc), 0);
  /* pairs (pos, neg): 0.35>0.1, 0.35<0.4, 0.35<0.8; 0.8>0.1, 0.8>0.4,
   * 0.8=0.8 (half); 0.5>0.1, 0.5>0.4, 0.5<0.8 -> 5.5/9 */
  assert_float_equal(auc, 5.5 / 9, 1e-12);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_keras_example_variables),
      cmocka_unit_test(test_keras3_and_default_names),
      cmocka_unit_test(test_grad_dense_activations),
      cmocka_unit_test(test_grad_losses_and_layers),
      cmocka_unit_test(test_grad_embeddings),
      cmocka_unit_test(test_replicas_sum),
      cmocka_unit_test(test_bad_models),
      cmocka_unit_test(test_bad_batches),
      cmocka_unit_test(test_train_converges),
      cmocka_unit_test(test_fp16_loss_scale),
      cmocka_unit_test(test_metrics),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
