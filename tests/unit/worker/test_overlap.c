/* The executor's overlap hooks (wk_run_opts param_need / grad_ready), which
 * the distributed worker uses to wait for each pull only when the forward
 * pass reaches its variable and to push each gradient as soon as the
 * backward pass has finished it: every variable is needed once before its
 * first read and ready once; dense layers are needed first layer first and
 * ready last layer first; at ready the gradient already holds its final
 * value; a failing need stops the run with its code; without hooks the
 * results are the same; once a dense variable is ready the pass never
 * reads its values again (the worker pulls the next step's values into
 * them right then, in async mode). On the wide-and-deep model
 * (embeddings, a wide part, three Dense layers) and on a model with a
 * regularized kernel and BatchNormalization.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/err.h"
#include "worker/model_exec.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NV_MAX 16
#define EV_MAX 64

typedef struct {
  char kind[EV_MAX];  /* 'n' need, 'r' ready */
  int var[EV_MAX];
  int n;
  float *snap[NV_MAX];   /* grads as they were at ready */
  float *const *grads;
  int64_t elems[NV_MAX];
  int fail_var;          /* need of this var fails (-1: none) */
} rec;

static int on_need(void *arg, int v) {
  rec *r = arg;
  r->kind[r->n] = 'n';
  r->var[r->n++] = v;
  return v == r->fail_var ? TSR_ECLOSED : 0;
}

static void on_ready(void *arg, int v) {
  rec *r = arg;
  r->kind[r->n] = 'r';
  r->var[r->n++] = v;
  r->snap[v] = malloc((size_t)r->elems[v] * sizeof(float));
  memcpy(r->snap[v], r->grads[v], (size_t)r->elems[v] * sizeof(float));
}

static const char *model_json =
    "{\"builtin\": \"wide_deep\", \"dense_features\": 3, "
    "\"sparse_features\": [{\"name\": \"a\", \"vocab\": 5, \"dim\": 3},"
    " {\"name\": \"b\", \"vocab\": 7, \"dim\": 2}], \"hidden\": [6, 4]}";

typedef struct {
  tsr_model *m;
  kern_ctx *c;
  wk_exec *e;
  const tsr_var *vi;
  size_t nv;
  float *p[NV_MAX], *g[NV_MAX];
  int64_t elems[NV_MAX];
  wk_batch b;
  float x[8 * 3], y[8];
  int64_t ida[16], offa[9], idb[16], offb[9];
  int64_t *ids[2], *offs[2];
} fx;

/* A Sequential model with an l2-regularized kernel (its gradient is final
 * only after the regularizers) and BatchNormalization (gamma, beta and the
 * moving statistics). */
static const char *reg_bn_json =
    "{\"class_name\": \"Sequential\", \"config\": {\"name\": \"s\", "
    "\"layers\": [{\"class_name\": \"InputLayer\", \"config\": "
    "{\"batch_input_shape\": [null, 3], \"name\": \"in\"}}, "
    "{\"class_name\": \"Dense\", \"config\": {\"name\": \"dense\", "
    "\"units\": 5, \"activation\": \"relu\", \"kernel_regularizer\": "
    "{\"class_name\": \"L2\", \"config\": {\"l2\": 0.01}}}}, "
    "{\"class_name\": \"BatchNormalization\", \"config\": {\"name\": "
    "\"bn\"}}, {\"class_name\": \"Dense\", \"config\": {\"name\": "
    "\"dense_1\", \"units\": 1}}]}}";

static void fx_up_json(fx *f, const char *json, int n_sparse) {
  memset(f, 0, sizeof *f);
  char err[512];
  json_error_t je;
  json_t *j = json_loads(json, 0, &je);
  assert_non_null(j);
  if (tsr_model_build(j, "binary_crossentropy", NULL, 0, NULL, &f->m, err,
                     sizeof err))
    fail_msg("model: %s", err);
  json_decref(j);
  kern_opts ko = {.device = KERN_DEVICE_CPU};
  assert_int_equal(kern_open(&ko, &f->c, err, sizeof err), 0);
  assert_int_equal(wk_exec_open(f->m, f->c, 8, KERN_F32, &f->e, err,
                                sizeof err), 0);
  assert_int_equal(tsr_model_variables(f->m, &f->vi, &f->nv), 0);
  assert_true(f->nv <= NV_MAX);
  f->b.n = 8;
  f->b.n_dense = 3;
  f->b.x = f->x;
  f->b.y = f->y;
  for (int i = 0; i < 24; i++) f->x[i] = (float)((i * 7) % 11) / 11.0f - 0.5f;
  for (int i = 0; i < 8; i++) f->y[i] = (float)(i % 2);
  f->b.n_sparse = n_sparse;
  for (int i = 0; i <= 8; i++) f->offa[i] = f->offb[i] = i; /* one id each */
  for (int i = 0; i < 8; i++) {
    f->ida[i] = (i * 3) % 5;
    f->idb[i] = (i * 5) % 7;
  }
  f->ids[0] = f->ida;
  f->ids[1] = f->idb;
  f->offs[0] = f->offa;
  f->offs[1] = f->offb;
  f->b.ids = f->ids;
  f->b.offsets = f->offs;
  assert_int_equal(wk_exec_prepare(f->e, &f->b, 0, 8, NULL, err, sizeof err),
                   0);
  for (size_t v = 0; v < f->nv; v++) {
    const int64_t *ids;
    int64_t nr;
    wk_exec_rows(f->e, (int)v, &ids, &nr);
    f->elems[v] = f->vi[v].kind == TSR_VAR_DENSE ? f->vi[v].numel
                                                 : nr * f->vi[v].row_dim;
    f->p[v] = malloc((size_t)f->elems[v] * sizeof(float));
    f->g[v] = calloc((size_t)f->elems[v], sizeof(float));
    for (int64_t i = 0; i < f->elems[v]; i++)
      f->p[v][i] = (float)((i * 13 + (int64_t)v * 5) % 17) / 17.0f - 0.45f;
  }
}

static void fx_up(fx *f) { fx_up_json(f, model_json, 2); }

static void fx_down(fx *f) {
  for (size_t v = 0; v < f->nv; v++) {
    free(f->p[v]);
    free(f->g[v]);
  }
  wk_exec_close(f->e);
  kern_close(f->c);
  tsr_model_free(f->m);
}

/* Index of the layer a "dense_K/..." variable belongs to; -1 otherwise. */
static int dense_layer(const char *name) {
  if (strncmp(name, "dense/", 6) == 0) return 0;
  int k;
  if (sscanf(name, "dense_%d/", &k) == 1) return k;
  return -1;
}

/* One training run with the hooks recording into r; fail_var's need
 * fails (-1: none does). */
static int run_hooked(fx *f, rec *r, int fail_var, wk_run_result *res) {
  memset(r, 0, sizeof *r);
  r->grads = f->g;
  r->fail_var = fail_var;
  memcpy(r->elems, f->elems, sizeof r->elems);
  wk_run_opts o = {.train = true, .grad_scale = 1.0f / 8, .seed = 1,
                   .param_need = on_need, .grad_ready = on_ready,
                   .hook_arg = r};
  return wk_exec_run(f->e, f->p, f->g, &o, res);
}

static void hook_order(void **state) {
  (void)state;
  fx f;
  fx_up(&f);
  rec r;
  wk_run_result res;
  assert_int_equal(run_hooked(&f, &r, -1, &res), 0);

  int needs[NV_MAX] = {0}, readies[NV_MAX] = {0};
  int last_need_layer = -1, last_ready_layer = 1 << 20, first_ready = -1;
  for (int i = 0; i < r.n; i++) {
    int v = r.var[i];
    int layer = dense_layer(f.vi[v].name);
    if (r.kind[i] == 'n') {
      needs[v]++;
      assert_int_equal(readies[v], 0); /* needed before it is ever ready */
      if (layer >= 0) { /* first layer first */
        assert_true(layer >= last_need_layer);
        last_need_layer = layer;
      }
    } else {
      readies[v]++;
      if (first_ready < 0) first_ready = v;
      if (layer >= 0) { /* last layer first */
        assert_true(layer <= last_ready_layer);
        last_ready_layer = layer;
      }
    }
  }
  for (size_t v = 0; v < f.nv; v++) {
    assert_int_equal(needs[v], 1);
    assert_int_equal(readies[v], 1);
    /* the gradient was final when it was announced */
    assert_memory_equal(r.snap[v], f.g[v],
                        (size_t)f.elems[v] * sizeof(float));
    free(r.snap[v]);
  }
  /* the first gradient out is the output layer's, not an embedding's */
  assert_int_equal(dense_layer(f.vi[first_ready].name), 2);

  /* the same results without hooks */
  float *g2[NV_MAX];
  for (size_t v = 0; v < f.nv; v++) {
    g2[v] = malloc((size_t)f.elems[v] * sizeof(float));
    memcpy(g2[v], f.g[v], (size_t)f.elems[v] * sizeof(float));
  }
  double loss = res.loss_sum;
  wk_run_opts plain = {.train = true, .grad_scale = 1.0f / 8, .seed = 1};
  assert_int_equal(wk_exec_run(f.e, f.p, f.g, &plain, &res), 0);
  assert_true(res.loss_sum == loss);
  for (size_t v = 0; v < f.nv; v++) {
    assert_memory_equal(g2[v], f.g[v], (size_t)f.elems[v] * sizeof(float));
    free(g2[v]);
  }
  fx_down(&f);
}

static void need_failure_stops(void **state) {
  (void)state;
  fx f;
  fx_up(&f);
  int fail_var = -1;
  for (size_t v = 0; v < f.nv; v++)
    if (dense_layer(f.vi[v].name) == 1) fail_var = (int)v;
  assert_true(fail_var >= 0);
  rec r;
  wk_run_result res;
  assert_int_equal(run_hooked(&f, &r, fail_var, &res), TSR_ECLOSED);
  for (int i = 0; i < r.n; i++) assert_int_equal(r.kind[i], 'n');
  fx_down(&f);
}

/* Every gradient is announced once, final (a regularized kernel only
 * after its regularizer, BatchNormalization's variables after its node). */
static void regularized_and_bn(void **state) {
  (void)state;
  fx f;
  fx_up_json(&f, reg_bn_json, 0);
  rec r;
  wk_run_result res;
  assert_int_equal(run_hooked(&f, &r, -1, &res), 0);
  int readies[NV_MAX] = {0};
  for (int i = 0; i < r.n; i++)
    if (r.kind[i] == 'r') readies[r.var[i]]++;
  for (size_t v = 0; v < f.nv; v++) {
    assert_int_equal(readies[v], 1);
    assert_memory_equal(r.snap[v], f.g[v],
                        (size_t)f.elems[v] * sizeof(float));
    free(r.snap[v]);
  }
  fx_down(&f);
}

/* At ready, a dense variable's values are overwritten with NaN, as an
 * early pull would overwrite them with the next step's: the loss and
 * every gradient are still those of a run that kept them. */
typedef struct {
  float *const *params;
  const fx *f;
  int poisoned;
} poison;

static void on_ready_poison(void *arg, int v) {
  poison *p = arg;
  if (p->f->vi[v].kind != TSR_VAR_DENSE) return;
  for (int64_t i = 0; i < p->f->elems[v]; i++) p->params[v][i] = NAN;
  p->poisoned++;
}

static void values_unread_after_ready_case(const char *json, int n_sparse) {
  fx f;
  fx_up_json(&f, json, n_sparse);
  float *p0[NV_MAX], *g0[NV_MAX];
  for (size_t v = 0; v < f.nv; v++) {
    size_t bytes = (size_t)f.elems[v] * sizeof(float);
    p0[v] = malloc(bytes);
    memcpy(p0[v], f.p[v], bytes);
  }
  wk_run_result res;
  wk_run_opts plain = {.train = true, .grad_scale = 1.0f / 8, .seed = 1};
  assert_int_equal(wk_exec_run(f.e, f.p, f.g, &plain, &res), 0);
  double loss = res.loss_sum;
  for (size_t v = 0; v < f.nv; v++) {
    size_t bytes = (size_t)f.elems[v] * sizeof(float);
    g0[v] = malloc(bytes);
    memcpy(g0[v], f.g[v], bytes);
    memcpy(f.p[v], p0[v], bytes); /* the run may update moving stats */
    memset(f.g[v], 0, bytes);
  }
  poison ps = {.params = f.p, .f = &f};
  wk_run_opts o = {.train = true, .grad_scale = 1.0f / 8, .seed = 1,
                   .grad_ready = on_ready_poison, .hook_arg = &ps};
  assert_int_equal(wk_exec_run(f.e, f.p, f.g, &o, &res), 0);
  assert_true(ps.poisoned > 0);
  if (res.loss_sum != loss)
    fail_msg("%.40s...: loss %g, %g with the values kept", json,
             res.loss_sum, loss);
  for (size_t v = 0; v < f.nv; v++) {
    assert_memory_equal(g0[v], f.g[v], (size_t)f.elems[v] * sizeof(float));
    free(g0[v]);
    free(p0[v]);
  }
  fx_down(&f);
}

static void values_unread_after_ready(void **state) {
  (void)state;
  values_unread_after_ready_case(model_json, 2);
  values_unread_after_ready_case(reg_bn_json, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(hook_order),
      cmocka_unit_test(regularized_and_bn),
      cmocka_unit_test(need_failure_stops),
      cmocka_unit_test(values_unread_after_ready),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
