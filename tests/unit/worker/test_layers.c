/* Every layer against a float64 reference (ref_model.c, written from
 * Keras's definitions): the training loss and every variable's gradient
 * (sampled elements, central differences of the float64 loss), the
 * inference outputs, and BatchNormalization's batch statistics as they go
 * to the moving averages. Small models through Sequential and Functional
 * JSON, so parsing (shapes, padding, axes, names) is checked with them.
 * Then the Keras names and shapes of the new variables, the Functional
 * forms of Keras 2 and 3, and every refusal with its message. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/err.h"
#include "ref_model.h"
#include "worker/model_exec.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TSR_TEST_SEED 0x9E3779B97F4A7C15ull
#include "../test_rand.h"

/* JSON written with single quotes, for readability */
static json_t *jq(const char *s) {
  char *t = strdup(s);
  for (char *p = t; *p; p++)
    if (*p == '\'') *p = '"';
  json_error_t je;
  json_t *j = json_loads(t, 0, &je);
  if (!j) fail_msg("test JSON: %s at %d: %s", je.text, je.position, t);
  free(t);
  return j;
}

static char buf[8192];
/* Sequential with an input shape ("6, 6, 2") and layers */
static const char *seq(const char *shape, const char *layers) {
  snprintf(buf, sizeof buf,
           "{'class_name': 'Sequential', 'config': {'name': 's', 'layers': "
           "[{'class_name': 'InputLayer', 'config': {'batch_input_shape': "
           "[null, %s], 'name': 'in'}}, %s]}}", shape, layers);
  return buf;
}

typedef struct {
  int64_t nd;          /* dense columns */
  int labels;          /* 0 regression, k > 1 classes */
  int64_t ids;         /* columns [0, ids_cols) are ids below `ids` */
  int64_t ids_cols;
} bspec;

typedef struct {
  tsr_model *m;
  kern_ctx *c;
  wk_exec *e;
  int nv;
  const tsr_var *vi;
  float *p[32], *g[32];
  double *pd[32];
  const char *names[32];
  float *x, *y;
  int64_t n, nd;
  wk_batch b;
} fx;

static void fx_open(fx *f, const char *json, const char *loss,
                    const bspec *bs) {
  memset(f, 0, sizeof *f);
  char err[1024];
  json_t *j = jq(json);
  if (tsr_model_build(j, loss, NULL, 0, NULL, &f->m, err, sizeof err))
    fail_msg("build: %s", err);
  json_decref(j);
  kern_opts ko = {.device = KERN_DEVICE_CPU};
  assert_int_equal(kern_open(&ko, &f->c, err, sizeof err), 0);
  assert_int_equal(wk_exec_open(f->m, f->c, 8, KERN_F32, &f->e, err,
                                sizeof err), 0);
  f->n = 5;
  f->nd = bs->nd;
  f->x = malloc((size_t)(f->n * f->nd) * sizeof(float));
  f->y = malloc((size_t)f->n * sizeof(float));
  for (int64_t i = 0; i < f->n; i++) {
    for (int64_t k = 0; k < f->nd; k++)
      f->x[i * f->nd + k] = k < bs->ids_cols
                                ? (float)(int64_t)(urand() * bs->ids)
                                : (float)(urand() * 2 - 1);
    f->y[i] = bs->labels > 1 ? (float)(int64_t)(urand() * bs->labels)
                             : (float)(urand() * 2 - 1);
  }
  f->b = (wk_batch){.n = f->n, .n_dense = f->nd, .x = f->x, .y = f->y};
  if (wk_exec_prepare(f->e, &f->b, 0, f->n, NULL, err, sizeof err))
    fail_msg("prepare: %s", err);
  size_t nv;
  tsr_model_variables(f->m, &f->vi, &nv);
  f->nv = (int)nv;
  assert_true(nv <= 32);
  for (int v = 0; v < f->nv; v++) {
    const tsr_var *vi = &f->vi[v];
    f->names[v] = vi->name;
    float *full = malloc((size_t)vi->numel * sizeof(float));
    tsr_model_init_var(f->m, v, 7, 0, full, (size_t)vi->numel);
    f->pd[v] = malloc((size_t)vi->numel * sizeof(double));
    for (int64_t i = 0; i < vi->numel; i++) {
      /* off the initial values (zeros, ones) so every path counts */
      full[i] += (float)(urand() * 0.4 - 0.2);
      if (strstr(vi->name, "moving_variance")) full[i] = fabsf(full[i]) + 0.5f;
      f->pd[v][i] = full[i];
    }
    const int64_t *ids;
    int64_t nr;
    wk_exec_rows(f->e, v, &ids, &nr);
    int64_t ne = vi->kind == TSR_VAR_DENSE ? vi->numel : nr * vi->row_dim;
    f->g[v] = calloc((size_t)(ne ? ne : 1), sizeof(float));
    if (vi->kind == TSR_VAR_DENSE) {
      f->p[v] = full;
    } else {
      f->p[v] = malloc((size_t)(ne ? ne : 1) * sizeof(float));
      for (int64_t u = 0; u < nr; u++)
        memcpy(f->p[v] + u * vi->row_dim, full + ids[u] * vi->row_dim,
               (size_t)vi->row_dim * sizeof(float));
      free(full);
    }
  }
}

static void fx_close(fx *f) {
  for (int v = 0; v < f->nv; v++) {
    free(f->p[v]);
    free(f->g[v]);
    free(f->pd[v]);
  }
  free(f->x);
  free(f->y);
  wk_exec_close(f->e);
  kern_close(f->c);
  tsr_model_free(f->m);
}

static double ref_loss(fx *f, const json_t *j, const char *loss, bool train,
                       ref_result *r) {
  ref_params rp = {f->nv, f->names, f->pd};
  ref_result tmp;
  if (!r) r = &tmp;
  assert_int_equal(ref_run(j, loss, &rp, f->x, f->n, f->nd, f->y, train, r),
                   0);
  double l = r->loss_sum;
  if (r == &tmp) ref_result_free(r);
  return l;
}

static bool close_to(double a, double ref, double rel, double abs_tol) {
  return fabs(a - ref) <= rel * fabs(ref) + abs_tol;
}

/* The whole check of one model; see the file comment. */
static void check(const char *what, const char *json, const char *loss,
                  const bspec *bs) {
  json_t *j = jq(json);
  fx f;
  fx_open(&f, json, loss, bs);
  wk_run_opts o = {.train = true, .grad_scale = 1.0f, .seed = 3};
  wk_run_result rr;
  assert_int_equal(wk_exec_run(f.e, f.p, f.g, &o, &rr), 0);
  ref_result ref;
  double rl = ref_loss(&f, j, loss, true, &ref);
  if (!close_to(rr.loss_sum, rl, 1e-4, 1e-5))
    fail_msg("%s: training loss %.9g, float64 reference %.9g", what,
             rr.loss_sum, rl);
  /* BatchNormalization: the batch statistics, as the moving averages get
   * them (grad_scale 1: times the slice's n) */
  for (int v = 0; v < f.nv && ref.bn_stats; v++) {
    const tsr_var *vi = &f.vi[v];
    if (vi->trainable) continue;
    bool var = strstr(vi->name, "variance") != NULL;
    for (int64_t ch = 0; ch < vi->numel; ch++) {
      double want = ref.bn_stats[(var ? ref.bn_c : 0) + ch] * (double)f.n;
      if (!close_to(f.g[v][ch], want, 1e-4, 1e-5))
        fail_msg("%s: %s[%lld] pushed %g, batch statistic x n %g", what,
                 vi->name, (long long)ch, f.g[v][ch], want);
    }
    break; /* the first BN's pair */
  }
  ref_result_free(&ref);
  /* gradients against central differences of the float64 loss */
  for (int v = 0; v < f.nv; v++) {
    const tsr_var *vi = &f.vi[v];
    if (!vi->trainable) continue;
    const int64_t *ids;
    int64_t nr;
    wk_exec_rows(f.e, v, &ids, &nr);
    int64_t ne = vi->kind == TSR_VAR_DENSE ? vi->numel : nr * vi->row_dim;
    for (int s = 0; s < 8 && ne > 0; s++) {
      int64_t i = s == 0 ? 0 : s == 1 ? ne - 1 : (int64_t)(urand() * ne);
      int64_t full = vi->kind == TSR_VAR_DENSE
                         ? i
                         : ids[i / vi->row_dim] * vi->row_dim + i % vi->row_dim;
      double keep = f.pd[v][full];
      double h = 1e-5 * fmax(1.0, fabs(keep));
      f.pd[v][full] = keep + h;
      double lp = ref_loss(&f, j, loss, true, NULL);
      f.pd[v][full] = keep - h;
      double lm = ref_loss(&f, j, loss, true, NULL);
      f.pd[v][full] = keep;
      double fd = (lp - lm) / (2 * h), an = f.g[v][i];
      if (!close_to(an, fd, 2e-3, 2e-4))
        fail_msg("%s: d loss / d %s[%lld] = %.7g, float64 central "
                 "difference %.7g", what, vi->name, (long long)full, an, fd);
    }
  }
  /* inference (moving statistics, no dropout) against the reference */
  o.train = false;
  assert_int_equal(wk_exec_run(f.e, f.p, NULL, &o, &rr), 0);
  ref_loss(&f, j, loss, false, &ref);
  assert_int_equal(ref.out_dim, tsr_model_output_dim(f.m));
  for (int64_t i = 0; i < f.n * ref.out_dim; i++)
    if (!close_to(rr.pred[i], ref.out[i], 1e-4, 1e-5))
      fail_msg("%s: inference output %lld = %.7g, reference %.7g", what,
               (long long)i, rr.pred[i], ref.out[i]);
  ref_result_free(&ref);
  json_decref(j);
  fx_close(&f);
}

/* ---- the checks ----------------------------------------------------------*/

static const char *HEAD10 =
    "{'class_name': 'Flatten', 'config': {'name': 'flatten'}}, "
    "{'class_name': 'Dense', 'config': {'name': 'head', 'units': 3, "
    "'activation': 'softmax'}}";

static void test_conv2d(void **state) {
  bspec img = {.nd = 6 * 6 * 2, .labels = 3};
  char l[4096];
  snprintf(l, sizeof l,
           "{'class_name': 'Conv2D', 'config': {'name': 'conv', 'filters': 3, "
           "'kernel_size': [3, 3], 'activation': 'relu'}}, %s", HEAD10);
  check("Conv2D valid 3x3 relu", seq("6, 6, 2", l),
        "sparse_categorical_crossentropy", &img);
  bspec odd = {.nd = 7 * 5 * 2, .labels = 0};
  snprintf(l, sizeof l,
           "{'class_name': 'Conv2D', 'config': {'name': 'conv', 'filters': 4, "
           "'kernel_size': [3, 2], 'strides': [2, 2], 'padding': 'same', "
           "'use_bias': false, 'activation': 'tanh', 'kernel_regularizer': "
           "{'class_name': 'L2', 'config': {'l2': 0.05}}}}, "
           "{'class_name': 'Conv2D', 'config': {'name': 'conv_1', 'filters': 2,"
           " 'kernel_size': 2, 'strides': 1, 'padding': 'same', "
           "'bias_regularizer': {'class_name': 'L1L2', 'config': {'l1': 0.1, "
           "'l2': 0.02}}}}, "
           "{'class_name': 'GlobalAveragePooling2D', 'config': {'name': 'gap'}},"
           " {'class_name': 'Dense', 'config': {'name': 'out', 'units': 1}}");
  check("Conv2D same, strides 2, rectangular, regularized, GAP",
        seq("7, 5, 2", l), "mse", &odd);
  snprintf(l, sizeof l,
           "{'class_name': 'Conv2D', 'config': {'name': 'c1', 'filters': 3, "
           "'kernel_size': 1, 'activation': 'elu'}}, "
           "{'class_name': 'Conv2D', 'config': {'name': 'c2', 'filters': 2, "
           "'kernel_size': [1, 1], 'strides': [2, 2]}}, %s", HEAD10);
  check("Conv2D 1x1 (read as is) and 1x1 strided", seq("6, 6, 2", l),
        "sparse_categorical_crossentropy", &img);
}

static void test_pooling(void **state) {
  bspec img = {.nd = 7 * 6 * 2, .labels = 3};
  char l[4096];
  snprintf(l, sizeof l,
           "{'class_name': 'Conv2D', 'config': {'name': 'conv', 'filters': 2, "
           "'kernel_size': 2, 'padding': 'same'}}, "
           "{'class_name': 'MaxPooling2D', 'config': {'name': 'mp', "
           "'pool_size': [2, 2], 'strides': [2, 2], 'padding': 'valid'}}, %s",
           HEAD10);
  check("MaxPooling2D valid", seq("7, 6, 2", l),
        "sparse_categorical_crossentropy", &img);
  snprintf(l, sizeof l,
           "{'class_name': 'Conv2D', 'config': {'name': 'conv', 'filters': 2, "
           "'kernel_size': 2}}, "
           "{'class_name': 'MaxPooling2D', 'config': {'name': 'mp', "
           "'pool_size': 3, 'strides': 2, 'padding': 'same'}}, %s", HEAD10);
  check("MaxPooling2D same 3/2", seq("7, 6, 2", l),
        "sparse_categorical_crossentropy", &img);
  snprintf(l, sizeof l,
           "{'class_name': 'Conv2D', 'config': {'name': 'conv', 'filters': 2, "
           "'kernel_size': 2}}, "
           "{'class_name': 'AveragePooling2D', 'config': {'name': 'ap', "
           "'pool_size': [3, 2], 'strides': [2, 1], 'padding': 'same'}}, "
           "{'class_name': 'AveragePooling2D', 'config': {'name': 'ap2', "
           "'pool_size': 2, 'strides': null}}, %s", HEAD10);
  check("AveragePooling2D same (padding left out) and valid",
        seq("7, 6, 2", l), "sparse_categorical_crossentropy", &img);
}

static void test_batchnorm(void **state) {
  bspec img = {.nd = 5 * 5 * 2, .labels = 3};
  char l[4096];
  snprintf(l, sizeof l,
           "{'class_name': 'Conv2D', 'config': {'name': 'conv', 'filters': 3, "
           "'kernel_size': 2, 'use_bias': false}}, "
           "{'class_name': 'BatchNormalization', 'config': {'name': 'bn', "
           "'axis': [3], 'momentum': 0.9, 'epsilon': 0.001, 'center': true, "
           "'scale': true, 'gamma_regularizer': {'class_name': 'L2', "
           "'config': {'l2': 0.01}}}}, "
           "{'class_name': 'ReLU', 'config': {'name': 're_lu'}}, %s", HEAD10);
  check("Conv2D + BatchNormalization (NHWC) + ReLU layer", seq("5, 5, 2", l),
        "sparse_categorical_crossentropy", &img);
  bspec flat = {.nd = 4, .labels = 0};
  check("Dense + BatchNormalization without center/scale + LeakyReLU",
        seq("4",
            "{'class_name': 'Dense', 'config': {'name': 'd', 'units': 5}}, "
            "{'class_name': 'BatchNormalization', 'config': {'name': 'bn', "
            "'axis': -1, 'center': false, 'scale': false, 'epsilon': 0.01}}, "
            "{'class_name': 'LeakyReLU', 'config': {'name': 'lr', "
            "'alpha': 0.1}}, "
            "{'class_name': 'BatchNormalization', 'config': {'name': 'bn2'}}, "
            "{'class_name': 'Dense', 'config': {'name': 'out', 'units': 1}}"),
        "mse", &flat);
}

static void test_layernorm_reshape(void **state) {
  bspec flat = {.nd = 12, .labels = 0};
  check("Reshape + LayerNormalization + Dense on the last axis",
        seq("12",
            "{'class_name': 'Dense', 'config': {'name': 'd', 'units': 12, "
            "'activation': 'tanh'}}, "
            "{'class_name': 'Reshape', 'config': {'name': 'r', "
            "'target_shape': [3, -1]}}, "
            "{'class_name': 'LayerNormalization', 'config': {'name': 'ln', "
            "'axis': -1, 'epsilon': 0.001}}, "
            "{'class_name': 'Dense', 'config': {'name': 'd2', 'units': 2, "
            "'activation': 'relu'}}, "
            "{'class_name': 'Dropout', 'config': {'name': 'dr', 'rate': 0.0}},"
            " {'class_name': 'Flatten', 'config': {'name': 'f'}}, "
            "{'class_name': 'Dense', 'config': {'name': 'out', 'units': 1}}"),
        "mse", &flat);
  bspec img = {.nd = 4 * 4 * 2, .labels = 3};
  char l[4096];
  snprintf(l, sizeof l,
           "{'class_name': 'Conv2D', 'config': {'name': 'conv', 'filters': 2, "
           "'kernel_size': 2}}, "
           "{'class_name': 'LayerNormalization', 'config': {'name': 'ln', "
           "'axis': [1, 2, 3], 'beta_regularizer': {'class_name': 'L1', "
           "'config': {'l1': 0.03}}}}, "
           "{'class_name': 'Activation', 'config': {'name': 'a', "
           "'activation': 'sigmoid'}}, %s", HEAD10);
  check("LayerNormalization over (rows, cols, channels)", seq("4, 4, 2", l),
        "sparse_categorical_crossentropy", &img);
}

static void test_activation_layers(void **state) {
  bspec flat = {.nd = 4, .labels = 3};
  check("ELU, ReLU(negative_slope), Softmax layer as the output (fused)",
        seq("4",
            "{'class_name': 'Dense', 'config': {'name': 'd', 'units': 6}}, "
            "{'class_name': 'ELU', 'config': {'name': 'elu', 'alpha': 0.7}}, "
            "{'class_name': 'Dense', 'config': {'name': 'd2', 'units': 5}}, "
            "{'class_name': 'ReLU', 'config': {'name': 'r', "
            "'negative_slope': 0.05}}, "
            "{'class_name': 'Dense', 'config': {'name': 'd3', 'units': 3}}, "
            "{'class_name': 'Softmax', 'config': {'name': 'sm', 'axis': -1}}"),
        "sparse_categorical_crossentropy", &flat);
}

static const char *FUNC =
    "{'class_name': 'Functional', 'config': {'name': 'f', 'layers': [%s], "
    "'input_layers': [%s], 'output_layers': [['%s', 0, 0]]}}";
static char fbuf[8192];
static const char *func(const char *layers, const char *ins,
                        const char *out) {
  snprintf(fbuf, sizeof fbuf, FUNC, layers, ins, out);
  return fbuf;
}
#define IN(nm, shape)                                                        \
  "{'class_name': 'InputLayer', 'name': '" nm "', 'config': {'name': '" nm \
  "', 'batch_input_shape': [null, " shape "]}, 'inbound_nodes': []}"
#define LAY(cls, nm, cfg, ins)                                          \
  "{'class_name': '" cls "', 'name': '" nm "', 'config': {'name': '" nm \
  "'" cfg "}, 'inbound_nodes': [[" ins "]]}"
#define R(nm) "['" nm "', 0, 0, {}]"

static void test_functional(void **state) {
  bspec two = {.nd = 7, .labels = 3};
  check("Functional: two inputs, Add, Subtract, Average, Concatenate",
        func(IN("a", "3") ", " IN("b", "4") ", "
             LAY("Dense", "da", ", 'units': 4, 'activation': 'tanh'", R("a"))
             ", " LAY("Dense", "db", ", 'units': 4", R("b")) ", "
             LAY("Add", "add", "", R("da") ", " R("db") ", " R("b")) ", "
             LAY("Subtract", "sub", "", R("add") ", " R("da")) ", "
             LAY("Average", "avg", "", R("sub") ", " R("db")) ", "
             LAY("ELU", "elu", "", R("avg")) ", "
             LAY("Concatenate", "cat", ", 'axis': -1", R("elu") ", " R("b")
                 ", " R("a")) ", "
             LAY("Dense", "out", ", 'units': 3, 'activation': 'softmax'",
                 R("cat")),
             "['a', 0, 0], ['b', 0, 0]", "out"),
        "sparse_categorical_crossentropy", &two);
  bspec emb = {.nd = 2 + 3, .labels = 0, .ids = 6, .ids_cols = 2};
  check("Functional: Embedding ids input beside a numeric one",
        func(IN("ids", "2") ", " IN("num", "3") ", "
             LAY("Embedding", "emb", ", 'input_dim': 6, 'output_dim': 3",
                 R("ids")) ", "
             LAY("Flatten", "fl", "", R("emb")) ", "
             LAY("Dense", "dn", ", 'units': 2", R("num")) ", "
             LAY("Concatenate", "cat", "", R("fl") ", " R("dn")) ", "
             LAY("Dense", "out", ", 'units': 1", R("cat")),
             "['ids', 0, 0], ['num', 0, 0]", "out"),
        "mse", &emb);
  bspec seqs = {.nd = 4, .labels = 0, .ids = 5, .ids_cols = 4};
  check("Embedding -> Dense on (steps, dim) -> GlobalAveragePooling1D",
        seq("4",
            "{'class_name': 'Embedding', 'config': {'name': 'e', "
            "'input_dim': 5, 'output_dim': 3}}, "
            "{'class_name': 'Dense', 'config': {'name': 'd', 'units': 2, "
            "'activation': 'relu'}}, "
            "{'class_name': 'GlobalAveragePooling1D', 'config': {'name': "
            "'gap'}}, "
            "{'class_name': 'Dense', 'config': {'name': 'out', 'units': 1}}"),
        "mse", &seqs);
  bspec img = {.nd = 4 * 4 * 1, .labels = 3};
  check("Functional: a residual Conv2D block, Concatenate on channels",
        func(IN("img", "4, 4, 1") ", "
             LAY("Conv2D", "c1", ", 'filters': 2, 'kernel_size': 3, "
                 "'padding': 'same', 'activation': 'relu'", R("img")) ", "
             LAY("Conv2D", "c2", ", 'filters': 2, 'kernel_size': 3, "
                 "'padding': 'same'", R("c1")) ", "
             LAY("Add", "res", "", R("c1") ", " R("c2")) ", "
             LAY("Concatenate", "cat", ", 'axis': 3", R("res") ", " R("img"))
             ", " LAY("MaxPooling2D", "mp", "", R("cat")) ", "
             LAY("Flatten", "fl", "", R("mp")) ", "
             LAY("Dense", "out", ", 'units': 3, 'activation': 'softmax'",
                 R("fl")),
             "['img', 0, 0]", "out"),
        "sparse_categorical_crossentropy", &img);
}

/* Dropout after a Conv2D in training: the same mask forward and backward
 * (central differences in float32 with the mask fixed by the seed). */
static void test_dropout_anywhere(void **state) {
  char l[4096];
  snprintf(l, sizeof l,
           "{'class_name': 'Conv2D', 'config': {'name': 'conv', 'filters': 3, "
           "'kernel_size': 2}}, "
           "{'class_name': 'Dropout', 'config': {'name': 'drop', 'rate': 0.4,"
           " 'noise_shape': null, 'seed': null}}, %s", HEAD10);
  bspec img = {.nd = 4 * 4 * 2, .labels = 3};
  fx f;
  fx_open(&f, seq("4, 4, 2", l), "sparse_categorical_crossentropy", &img);
  wk_run_opts o = {.train = true, .grad_scale = 1.0f, .seed = 9};
  wk_run_result rr;
  assert_int_equal(wk_exec_run(f.e, f.p, f.g, &o, &rr), 0);
  float g0[64];
  memcpy(g0, f.g[0], sizeof g0 < (size_t)f.vi[0].numel * 4
                         ? sizeof g0 : (size_t)f.vi[0].numel * 4);
  int zeros = 0;
  for (int64_t i = 0; i < f.vi[0].numel && i < 64; i++) {
    float keep = f.p[0][i], h = 1e-2f;
    f.p[0][i] = keep + h;
    assert_int_equal(wk_exec_run(f.e, f.p, f.g, &o, &rr), 0);
    double lp = rr.loss_sum;
    f.p[0][i] = keep - h;
    assert_int_equal(wk_exec_run(f.e, f.p, f.g, &o, &rr), 0);
    double lm = rr.loss_sum;
    f.p[0][i] = keep;
    double fd = (lp - lm) / (2.0 * h);
    if (!close_to(g0[i], fd, 2e-2, 2e-3))
      fail_msg("dropout after Conv2D: d loss / d kernel[%lld] = %g, central "
               "difference %g", (long long)i, g0[i], fd);
    zeros += g0[i] == 0.0f;
  }
  (void)zeros;
  fx_close(&f);
}

/* ---- names, shapes, forms, refusals --------------------------------------*/

static tsr_model *build_ok(const char *json, const char *loss) {
  char err[1024];
  tsr_model *m = NULL;
  json_t *j = jq(json);
  if (tsr_model_build(j, loss, NULL, 0, NULL, &m, err, sizeof err))
    fail_msg("build: %s", err);
  json_decref(j);
  return m;
}

static void test_variables(void **state) {
  tsr_model *m = build_ok(
      seq("28, 28, 1",
          "{'class_name': 'Conv2D', 'config': {'filters': 32, 'kernel_size': "
          "[3, 3], 'activation': 'relu'}}, "
          "{'class_name': 'MaxPooling2D', 'config': {}}, "
          "{'class_name': 'BatchNormalization', 'config': {}}, "
          "{'class_name': 'Conv2D', 'config': {'filters': 64, 'kernel_size': "
          "3, 'kernel_initializer': 'he_normal'}}, "
          "{'class_name': 'LayerNormalization', 'config': {}}, "
          "{'class_name': 'Flatten', 'config': {}}, "
          "{'class_name': 'Dense', 'config': {'units': 10, 'activation': "
          "'softmax'}}"),
      "sparse_categorical_crossentropy");
  const tsr_var *v;
  size_t n;
  tsr_model_variables(m, &v, &n);
  const char *names[] = {
      "conv2d/kernel", "conv2d/bias", "batch_normalization/gamma",
      "batch_normalization/beta", "batch_normalization/moving_mean",
      "batch_normalization/moving_variance", "conv2d_1/kernel",
      "conv2d_1/bias", "layer_normalization/gamma",
      "layer_normalization/beta", "dense/kernel", "dense/bias"};
  assert_int_equal(n, 12);
  for (size_t i = 0; i < n; i++) assert_string_equal(v[i].name, names[i]);
  assert_int_equal(v[0].rank, 4);
  assert_int_equal(v[0].shape[0], 3);
  assert_int_equal(v[0].shape[1], 3);
  assert_int_equal(v[0].shape[2], 1);
  assert_int_equal(v[0].shape[3], 32);
  assert_int_equal(v[0].numel, 288);
  assert_int_equal(v[0].row_dim, 96);
  /* Keras's fans: receptive field times channels */
  assert_int_equal(v[0].init.fan_in, 9);
  assert_int_equal(v[0].init.fan_out, 288);
  assert_int_equal(v[6].init.kind, TSR_INIT_HE_NORMAL);
  assert_int_equal(v[6].init.fan_in, 288);
  assert_true(v[2].trainable && !v[4].trainable && !v[5].trainable);
  assert_float_equal(v[4].momentum, 0.99, 1e-12);
  assert_int_equal(v[5].init.kind, TSR_INIT_ONES);
  tsr_optim_spec job, vo;
  tsr_optim_defaults(TSR_OPT_ADAM, &job);
  tsr_var_optimizer(&v[4], &job, &vo);
  assert_int_equal(vo.kind, TSR_OPT_MOVING_AVERAGE);
  assert_float_equal(vo.learning_rate, 0.01, 1e-12);
  tsr_var_optimizer(&v[2], &job, &vo);
  assert_int_equal(vo.kind, TSR_OPT_ADAM);
  /* 28x28 -> 26x26x32 -> 13x13x32 -> 11x11x64 -> 7744 -> 10 */
  assert_int_equal(v[10].shape[0], 7744);
  assert_int_equal(tsr_model_input_dense(m), 784);
  char s[4096];
  tsr_model_summary(m, s, sizeof s);
  assert_non_null(strstr(s, "conv2d (Conv2D) 28x28x1 -> 26x26x32 relu"));
  assert_non_null(strstr(s, "max_pooling2d (MaxPooling2D) 26x26x32 -> 13x13x32"));
  assert_non_null(strstr(s, "dense (Dense) 7744 -> 10 softmax"));
  tsr_model_free(m);
}

/* Keras 3's Functional form: __keras_tensor__ references with
 * keras_history, merge layers called on a list, batch_shape. */
static void test_keras3_functional(void **state) {
  const char *k3 =
      "{'module': 'keras.src.models.functional', 'class_name': 'Functional', "
      "'config': {'name': 'functional', 'trainable': true, 'layers': ["
      "{'module': 'keras.layers', 'class_name': 'InputLayer', 'config': "
      "{'batch_shape': [null, 3], 'dtype': 'float32', 'sparse': false, "
      "'name': 'input_layer'}, 'registered_name': null, 'name': "
      "'input_layer', 'inbound_nodes': []}, "
      "{'module': 'keras.layers', 'class_name': 'Dense', 'config': {'name': "
      "'dense', 'units': 4, 'activation': 'relu'}, 'registered_name': null, "
      "'build_config': {'input_shape': [null, 3]}, 'name': 'dense', "
      "'inbound_nodes': [{'args': [{'class_name': '__keras_tensor__', "
      "'config': {'shape': [null, 3], 'dtype': 'float32', 'keras_history': "
      "['input_layer', 0, 0]}}], 'kwargs': {}}]}, "
      "{'class_name': 'Dense', 'config': {'name': 'dense_1', 'units': 4}, "
      "'name': 'dense_1', 'inbound_nodes': [{'args': [{'class_name': "
      "'__keras_tensor__', 'config': {'keras_history': ['dense', 0, 0]}}], "
      "'kwargs': {'mask': null}}]}, "
      "{'class_name': 'Add', 'config': {'name': 'add'}, 'name': 'add', "
      "'inbound_nodes': [{'args': [[{'class_name': '__keras_tensor__', "
      "'config': {'keras_history': ['dense', 0, 0]}}, {'class_name': "
      "'__keras_tensor__', 'config': {'keras_history': ['dense_1', 0, 0]}}]],"
      " 'kwargs': {}}]}, "
      "{'class_name': 'Dense', 'config': {'name': 'out', 'units': 1, "
      "'activation': 'sigmoid'}, 'name': 'out', 'inbound_nodes': [{'args': "
      "[{'class_name': '__keras_tensor__', 'config': {'keras_history': "
      "['add', 0, 0]}}], 'kwargs': {}}]}], "
      "'input_layers': [['input_layer', 0, 0]], 'output_layers': [['out', 0, "
      "0]]}}";
  tsr_model *m = build_ok(k3, "binary_crossentropy");
  const tsr_var *v;
  size_t n;
  tsr_model_variables(m, &v, &n);
  assert_int_equal(n, 6);
  assert_string_equal(v[4].name, "out/kernel");
  assert_int_equal(v[4].shape[0], 4);
  char s[2048];
  tsr_model_summary(m, s, sizeof s);
  assert_non_null(strstr(s, "add (Add) 4 + 4 -> 4"));
  assert_non_null(strstr(s, "computed from logits"));
  tsr_model_free(m);
}

/* Inputs placed by the data's feature names, in any order. */
static void test_named_inputs(void **state) {
  char *names[5] = {"age", "img[0]", "img[1]", "img[2]", "bmi"};
  wk_input_schema sc = {.n_dense = 5, .n_classes = 1, .dense_names = names};
  char err[1024];
  json_t *j = jq(func(IN("img", "3") ", " IN("bmi", "1") ", "
                      LAY("Concatenate", "cat", "", R("img") ", " R("bmi"))
                      ", " LAY("Dense", "out", ", 'units': 1", R("cat")),
                      "['img', 0, 0], ['bmi', 0, 0]", "out"));
  tsr_model *m = NULL;
  if (tsr_model_build(j, "mse", NULL, 0, &sc, &m, err, sizeof err))
    fail_msg("%s", err);
  assert_int_equal(tsr_model_input_dense(m), 5);
  /* out = w . [img0 img1 img2 bmi]: check with a one-hot kernel */
  kern_opts ko = {.device = KERN_DEVICE_CPU};
  kern_ctx *c;
  wk_exec *e;
  assert_int_equal(kern_open(&ko, &c, err, sizeof err), 0);
  assert_int_equal(wk_exec_open(m, c, 2, KERN_F32, &e, err, sizeof err), 0);
  float x[10] = {10, 1, 2, 3, 4, 20, 5, 6, 7, 8}, y[2] = {0, 0};
  wk_batch b = {.n = 2, .n_dense = 5, .x = x, .y = y};
  assert_int_equal(wk_exec_prepare(e, &b, 0, 2, NULL, err, sizeof err), 0);
  float k[4] = {0, 0, 1, 100}, bias[1] = {0};
  float *p[2] = {k, bias};
  wk_run_opts o = {.train = false, .grad_scale = 1};
  wk_run_result r;
  assert_int_equal(wk_exec_run(e, p, NULL, &o, &r), 0);
  assert_float_equal(r.pred[0], 3 + 400, 1e-4);  /* img[2], bmi */
  assert_float_equal(r.pred[1], 7 + 800, 1e-4);
  wk_exec_close(e);
  kern_close(c);
  tsr_model_free(m);
  /* a name the data does not have, when others match */
  char *names2[5] = {"age", "img[0]", "img[1]", "img[2]", "height"};
  sc.dense_names = names2;
  assert_int_equal(tsr_model_build(j, "mse", NULL, 0, &sc, &m, err, sizeof err),
                   TSR_ESHAPE);
  assert_non_null(strstr(err, "model input 'bmi'"));
  json_decref(j);
}

static void refused(const char *json, const char *loss, int code,
                    const char *s1, const char *s2) {
  char err[1024] = "";
  tsr_model *m = NULL;
  json_t *j = jq(json);
  int rc = tsr_model_build(j, loss, NULL, 0, NULL, &m, err, sizeof err);
  json_decref(j);
  if (rc != code) fail_msg("expected %d, got %d (%s)", code, rc, err);
  assert_null(m);
  if (!strstr(err, s1) || (s2 && !strstr(err, s2)))
    fail_msg("error '%s' lacks '%s' / '%s'", err, s1, s2 ? s2 : "");
}

static void test_refusals(void **state) {
  const char *mse = "mse";
  refused(seq("8, 8, 1", "{'class_name': 'Conv2D', 'config': {'name': 'c', "
              "'filters': 2, 'kernel_size': 3, 'dilation_rate': [2, 2]}}"),
          mse, TSR_EUNSUPPORTED, "layer 'c'", "dilation_rate (2, 2)");
  refused(seq("8, 8, 1", "{'class_name': 'Conv2D', 'config': {'name': 'c', "
              "'filters': 2, 'kernel_size': 3, 'data_format': "
              "'channels_first'}}"),
          mse, TSR_EUNSUPPORTED, "data_format 'channels_first'", "NHWC");
  refused(seq("8, 8, 1", "{'class_name': 'Conv2D', 'config': {'name': 'c', "
              "'filters': 2, 'kernel_size': 3, 'groups': 2}}"),
          mse, TSR_EUNSUPPORTED, "groups 2", NULL);
  refused(seq("8, 8, 1", "{'class_name': 'Conv2D', 'config': {'name': 'c', "
              "'filters': 2, 'kernel_size': 3, 'padding': 'causal'}}"),
          mse, TSR_EUNSUPPORTED, "padding 'causal'", "valid, same");
  refused(seq("2, 2, 1", "{'class_name': 'Conv2D', 'config': {'name': 'c', "
              "'filters': 2, 'kernel_size': 3}}"),
          mse, TSR_ESHAPE, "does not fit", NULL);
  refused(seq("8", "{'class_name': 'Conv2D', 'config': {'name': 'c', "
              "'filters': 2, 'kernel_size': 3}}"),
          mse, TSR_ESHAPE, "layer 'c' (Conv2D)", "needs an image");
  refused(seq("8, 8, 1", "{'class_name': 'Conv2D', 'config': {'name': 'c', "
              "'filters': 2, 'kernel_size': 3}}"),
          mse, TSR_ESHAPE, "output must be flat", "Flatten");
  refused(seq("4, 3", "{'class_name': 'BatchNormalization', 'config': "
              "{'name': 'bn', 'axis': 1}}"),
          mse, TSR_EUNSUPPORTED, "axis 1", "must end at the last");
  refused(seq("4", "{'class_name': 'BatchNormalization', 'config': "
              "{'name': 'bn', 'renorm': true}}"),
          mse, TSR_EUNSUPPORTED, "renorm", NULL);
  refused(seq("4", "{'class_name': 'BatchNormalization', 'config': "
              "{'name': 'bn', 'virtual_batch_size': 8}}"),
          mse, TSR_EUNSUPPORTED, "virtual_batch_size", NULL);
  refused(seq("4", "{'class_name': 'LayerNormalization', 'config': "
              "{'name': 'ln', 'rms_scaling': true}}"),
          mse, TSR_EUNSUPPORTED, "rms_scaling", NULL);
  /* a wrapper's layer: present, and one it can wrap */
  refused(seq("5, 3", "{'class_name': 'Bidirectional', 'config': "
              "{'name': 'bi', 'layer': {'class_name': 'LSTM'}}}"),
          mse, TSR_ECONFIG, "layer 'bi' (Bidirectional)",
          "config.layer needs class_name and config");
  refused(seq("5, 3", "{'class_name': 'Bidirectional', 'config': "
              "{'name': 'bi', 'layer': {'class_name': 'SimpleRNN', "
              "'config': {'units': 2}}}}"),
          mse, TSR_EUNSUPPORTED, "wrapping a SimpleRNN is not supported",
          "(supported: LSTM, GRU)");
  refused(seq("5, 3", "{'class_name': 'TimeDistributed', 'config': "
              "{'name': 'td', 'layer': {'class_name': 'Conv1D', "
              "'config': {'filters': 2}}}}"),
          mse, TSR_EUNSUPPORTED, "layer 'td' (TimeDistributed): wrapping a "
          "Conv1D", "(supported: Dense)");
  refused(seq("4", "{'class_name': 'Dense', 'config': {'name': 'd', "
              "'units': 1, 'kernel_regularizer': {'class_name': "
              "'OrthogonalRegularizer', 'config': {}}}}"),
          mse, TSR_EUNSUPPORTED, "kernel_regularizer 'OrthogonalRegularizer'",
          "L1, L2, L1L2");
  refused(seq("4", "{'class_name': 'Dense', 'config': {'name': 'd', "
              "'units': 1, 'kernel_constraint': {'class_name': 'MaxNorm'}}}"),
          mse, TSR_EUNSUPPORTED, "kernel_constraint", NULL);
  refused(seq("4", "{'class_name': 'Dense', 'config': {'name': 'd', "
              "'units': 1, 'trainable': false}}"),
          mse, TSR_EUNSUPPORTED, "trainable=false", NULL);
  refused(seq("4", "{'class_name': 'Dropout', 'config': {'name': 'dr', "
              "'rate': 0.5, 'noise_shape': [null, 1]}}, {'class_name': "
              "'Dense', 'config': {'name': 'd', 'units': 1}}"),
          mse, TSR_EUNSUPPORTED, "noise_shape", NULL);
  refused(seq("4", "{'class_name': 'ReLU', 'config': {'name': 'r', "
              "'threshold': 0.5}}"),
          mse, TSR_EUNSUPPORTED, "ReLU with", "threshold 0.5");
  refused(seq("4", "{'class_name': 'PReLU', 'config': {'name': 'p'}}"),
          mse, TSR_EUNSUPPORTED, "layer class 'PReLU'", "LeakyReLU");
  refused(seq("12", "{'class_name': 'Reshape', 'config': {'name': 'r', "
              "'target_shape': [5, -1]}}"),
          mse, TSR_ESHAPE, "layer 'r'", "-1");
  /* Functional */
  refused(func(IN("a", "2") ", "
               LAY("Dense", "d", ", 'units': 2", R("a")) ", "
               "{'class_name': 'Dense', 'name': 'e', 'config': {'name': 'e', "
               "'units': 1}, 'inbound_nodes': [[" R("d") "], [" R("a") "]]}",
               "['a', 0, 0]", "e"),
          mse, TSR_EUNSUPPORTED, "called 2 times", "shared layers");
  refused("{'class_name': 'Functional', 'config': {'layers': ["
          IN("a", "2") ", " LAY("Dense", "d", ", 'units': 1", R("a")) ", "
          LAY("Dense", "e", ", 'units': 1", R("a")) "], 'input_layers': "
          "[['a', 0, 0]], 'output_layers': [['d', 0, 0], ['e', 0, 0]]}}",
          mse, TSR_EUNSUPPORTED, "2 outputs", "several outputs");
  refused(func(IN("a", "2") ", " LAY("Dense", "d", ", 'units': 1", R("zz")),
               "['a', 0, 0]", "d"),
          mse, TSR_ECONFIG, "layer 'd' reads layer 'zz'", NULL);
  refused(func(IN("a", "2") ", " LAY("Dense", "d", ", 'units': 1", R("e"))
               ", " LAY("Dense", "e", ", 'units': 1", R("d")),
               "['a', 0, 0]", "e"),
          mse, TSR_ECONFIG, "cycle", NULL);
  refused(func(IN("a", "2") ", " LAY("Dense", "d", ", 'units': 1", R("a"))
               ", " LAY("Dense", "e", ", 'units': 1", R("a")),
               "['a', 0, 0]", "d"),
          mse, TSR_ESHAPE, "layer 'e'", "does not feed it");
  refused(func(IN("a", "2") ", " IN("b", "3") ", "
               LAY("Add", "s", "", R("a") ", " R("b")),
               "['a', 0, 0], ['b', 0, 0]", "s"),
          mse, TSR_ESHAPE, "layer 's' (Add)", "(batch, 2) and (batch, 3)");
  refused(func(IN("a", "2, 3") ", " IN("b", "4, 5") ", "
               LAY("Concatenate", "cat", "", R("a") ", " R("b")),
               "['a', 0, 0], ['b', 0, 0]", "cat"),
          mse, TSR_ESHAPE, "layer 'cat' (Concatenate on axis 2): inputs of "
          "shapes (batch, 2, 3) and (batch, 4, 5)", NULL);
  refused(func(IN("a", "2") ", " LAY("Dense", "d", ", 'units': 1",
                                     "['a', 0, 0, {'scale': 2}]"),
               "['a', 0, 0]", "d"),
          mse, TSR_EUNSUPPORTED, "layer 'd' (Dense): the call argument scale",
          "supported: the input tensors");
  refused(func("{'class_name': 'InputLayer', 'name': 'a', 'config': {'name':"
               " 'a', 'batch_input_shape': [null, 2], 'sparse': true}, "
               "'inbound_nodes': []}, " LAY("Dense", "d", ", 'units': 1",
                                            R("a")),
               "['a', 0, 0]", "d"),
          mse, TSR_EUNSUPPORTED, "sparse inputs", NULL);
}

/* The built-in wide_deep: hidden layers are ReLU unless the spec says
 * otherwise (the activation key left out used to make them linear). */
static void test_wide_deep_relu(void **state) {
  tsr_model *m = build_ok("{'builtin': 'wide_deep', 'dense_features': 13, "
                         "'sparse_features': 2, 'vocab': 10, "
                         "'embedding_dim': 64, 'hidden': [128, 64]}",
                         "binary_crossentropy");
  char s[4096];
  tsr_model_summary(m, s, sizeof s);
  assert_non_null(strstr(s, "dense (Dense) 141 -> 128 relu"));
  assert_non_null(strstr(s, "dense_1 (Dense) 128 -> 64 relu"));
  assert_non_null(strstr(s, "dense_2 (Dense) 64 -> 1 sigmoid"));
  const tsr_var *v;
  size_t n;
  tsr_model_variables(m, &v, &n);
  assert_string_equal(v[0].name, "embedding_c0/embeddings");
  assert_string_equal(v[2].name, "dense/kernel");
  assert_string_equal(v[n - 1].name, "wide/embeddings");
  tsr_model_free(m);
  m = build_ok("{'builtin': 'wide_deep', 'dense_features': 3, "
               "'sparse_features': 1, 'vocab': 10, 'activation': 'tanh', "
               "'hidden': [4]}", "binary_crossentropy");
  tsr_model_summary(m, s, sizeof s);
  assert_non_null(strstr(s, "dense (Dense) 11 -> 4 tanh"));
  tsr_model_free(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_conv2d),
      cmocka_unit_test(test_pooling),
      cmocka_unit_test(test_batchnorm),
      cmocka_unit_test(test_layernorm_reshape),
      cmocka_unit_test(test_activation_layers),
      cmocka_unit_test(test_functional),
      cmocka_unit_test(test_dropout_anywhere),
      cmocka_unit_test(test_variables),
      cmocka_unit_test(test_keras3_functional),
      cmocka_unit_test(test_named_inputs),
      cmocka_unit_test(test_refusals),
      cmocka_unit_test(test_wide_deep_relu),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
