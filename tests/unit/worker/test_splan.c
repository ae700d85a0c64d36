/* The sparse plan of a batch (which table rows a step gathers and where
 * each id's gradient goes): a wide-and-deep model on ids with many
 * repeats and ids up to 2^22 and beyond, run three ways that build their
 * plans differently, which must agree exactly on what they compute:
 *   A. the whole batch at once (the sort by id over all its ids),
 *   B. one example at a time (a few ids: the small-slice sort),
 *   C. two slices of the whole batch's plan (replicas: rows found in the
 *      whole batch's list).
 * Row lists are checked sorted and unique and to hold exactly the batch's
 * ids; predictions and the gradient of every touched row must match. */
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

#define TSR_TEST_SEED 0x5EED5EEDull
#include "../test_rand.h"

#define NF 3            /* sparse features */
#define NB 64           /* examples */
#define ND 2            /* dense features */
#define VOCAB 5000000   /* 23 bits: three 11-bit digits */

static json_t *model_json(void) {
  char s[512];
  snprintf(s, sizeof s,
           "{\"builtin\": \"wide_deep\", \"dense_features\": %d, "
           "\"sparse_features\": %d, \"vocab\": %d, \"embedding_dim\": 3, "
           "\"hidden\": [4]}", ND, NF, VOCAB);
  json_error_t je;
  json_t *j = json_loads(s, 0, &je);
  if (!j) fail_msg("model JSON: %s", je.text);
  return j;
}

/* A parameter value as a function of (variable, row, column): every
 * plan reads the same table without storing it. */
static float pval(int v, int64_t row, int64_t col) {
  uint64_t h = (uint64_t)(v + 1) * 0x9e3779b97f4a7c15ull ^
               (uint64_t)row * 0xbf58476d1ce4e5b9ull ^ (uint64_t)col;
  h ^= h >> 31;
  h *= 0x94d049bb133111ebull;
  h ^= h >> 29;
  return (float)((double)(h >> 11) / 9007199254740992.0 - 0.5);
}

typedef struct {
  tsr_model *m;
  const tsr_var *vi;
  int nv;
  kern_ctx *c;
} env;

/* One run: params filled for the prepared rows, grads returned by row. */
typedef struct {
  float *p[16], *g[16];
  const int64_t *ids[16];
  int64_t nr[16];
} run_bufs;

static void run(env *v, wk_exec *e, run_bufs *rb, float *pred,
                double *loss) {
  for (int k = 0; k < v->nv; k++) {
    const tsr_var *vi = &v->vi[k];
    wk_exec_rows(e, k, &rb->ids[k], &rb->nr[k]);
    int64_t ne = vi->kind == TSR_VAR_DENSE ? vi->numel
                                           : rb->nr[k] * vi->row_dim;
    rb->p[k] = malloc((size_t)(ne ? ne : 1) * sizeof(float));
    rb->g[k] = calloc((size_t)(ne ? ne : 1), sizeof(float));
    for (int64_t i = 0; i < ne; i++)
      rb->p[k][i] = vi->kind == TSR_VAR_DENSE
                        ? pval(k, 0, i)
                        : pval(k, rb->ids[k][i / vi->row_dim],
                               i % vi->row_dim);
  }
  wk_run_opts o = {.train = true, .grad_scale = 1.0f, .seed = 1};
  wk_run_result r;
  assert_int_equal(wk_exec_run(e, rb->p, rb->g, &o, &r), 0);
  memcpy(pred, r.pred, (size_t)r.n * sizeof(float));
  *loss = r.loss_sum;
}

static void bufs_free(env *v, run_bufs *rb) {
  for (int k = 0; k < v->nv; k++) {
    free(rb->p[k]);
    free(rb->g[k]);
  }
}

/* The gradient of row `id` of sparse variable k in run rb (0 if absent). */
static float row_grad(env *v, run_bufs *rb, int k, int64_t id, int64_t col) {
  int64_t lo = 0, hi = rb->nr[k];
  while (lo < hi) {
    int64_t mid = (lo + hi) / 2;
    if (rb->ids[k][mid] < id) lo = mid + 1;
    else hi = mid;
  }
  if (lo == rb->nr[k] || rb->ids[k][lo] != id) return 0;
  return rb->g[k][lo * v->vi[k].row_dim + col];
}

/* Predictions pp and summed gradients gsum (A's row order) against run A;
 * gsum is zeroed for the next comparison. `how`: "alone", "in a slice". */
static void same_as_batch(env *v, const run_bufs *ra, const float *pa,
                          const float *pp, float **gsum, const char *how) {
  for (int i = 0; i < NB; i++)
    if (fabsf(pa[i] - pp[i]) > 1e-6f)
      fail_msg("example %d: prediction %.9g %s, %.9g in the batch", i, pp[i],
               how, pa[i]);
  for (int q = 0; q < v->nv; q++) {
    const tsr_var *vi = &v->vi[q];
    int64_t ne = vi->kind == TSR_VAR_DENSE ? vi->numel
                                           : ra->nr[q] * vi->row_dim;
    for (int64_t e = 0; e < ne; e++)
      if (fabsf(gsum[q][e] - ra->g[q][e]) > 1e-5f * (1 + fabsf(ra->g[q][e])))
        fail_msg("%s[%lld]: gradient %.9g summed over examples %s, %.9g "
                 "from the batch", vi->name, (long long)e, gsum[q][e], how,
                 ra->g[q][e]);
    memset(gsum[q], 0, (size_t)ne * sizeof(float));
  }
}

static void test_plans_agree(void **state) {
  (void)state;
  char err[1024];
  env v = {0};
  json_t *j = model_json();
  if (tsr_model_build(j, "binary_crossentropy", NULL, 0, NULL, &v.m, err,
                      sizeof err))
    fail_msg("build: %s", err);
  json_decref(j);
  size_t nv;
  tsr_model_variables(v.m, &v.vi, &nv);
  v.nv = (int)nv;
  assert_true(nv <= 16);
  kern_opts ko = {.device = KERN_DEVICE_CPU};
  assert_int_equal(kern_open(&ko, &v.c, err, sizeof err), 0);

  /* the batch: 1-4 ids per example and feature, most from a few hot ids,
   * the rest anywhere below VOCAB */
  float x[NB * ND], y[NB];
  int64_t *ids[NF], *off[NF];
  for (int f = 0; f < NF; f++) {
    ids[f] = malloc(NB * 4 * sizeof(int64_t));
    off[f] = malloc((NB + 1) * sizeof(int64_t));
    off[f][0] = 0;
    for (int i = 0; i < NB; i++) {
      int cnt = 1 + (int)(urand() * 4);
      for (int t = 0; t < cnt; t++)
        ids[f][off[f][i] + t] = urand() < 0.7
                                    ? (int64_t)(urand() * 12)
                                    : (int64_t)(urand() * VOCAB);
      off[f][i + 1] = off[f][i] + cnt;
    }
  }
  ids[1][0] = VOCAB - 1; /* the largest id */
  for (int i = 0; i < NB * ND; i++) x[i] = (float)(urand() * 2 - 1);
  for (int i = 0; i < NB; i++) y[i] = urand() < 0.3 ? 1.0f : 0.0f;
  wk_batch b = {.n = NB, .n_dense = ND, .x = x, .y = y, .n_sparse = NF,
                .ids = ids, .offsets = off};

  /* A: the whole batch */
  wk_exec *ea, *eb, *ec;
  assert_int_equal(wk_exec_open(v.m, v.c, NB, KERN_F32, &ea, err, sizeof err),
                   0);
  assert_int_equal(wk_exec_open(v.m, v.c, NB, KERN_F32, &eb, err, sizeof err),
                   0);
  assert_int_equal(wk_exec_open(v.m, v.c, NB, KERN_F32, &ec, err, sizeof err),
                   0);
  if (wk_exec_prepare(ea, &b, 0, NB, NULL, err, sizeof err))
    fail_msg("prepare: %s", err);
  run_bufs ra = {0};
  float pa[NB], pp[NB];
  double la, l;
  run(&v, ea, &ra, pa, &la);
  /* its row lists: sorted, unique; an embedding's holds exactly its
   * feature's ids; the wide table's as many rows as the features'
   * distinct ids together */
  int n_sparse_vars = 0;
  int64_t distinct_total = 0;
  for (int f = 0; f < NF; f++) {
    int64_t *s = malloc((size_t)off[f][NB] * sizeof(int64_t));
    memcpy(s, ids[f], (size_t)off[f][NB] * sizeof(int64_t));
    for (int64_t a = 1; a < off[f][NB]; a++) /* insertion sort */
      for (int64_t c = a; c > 0 && s[c - 1] > s[c]; c--) {
        int64_t t = s[c]; s[c] = s[c - 1]; s[c - 1] = t;
      }
    int64_t k = 0;
    for (int64_t a = 0; a < off[f][NB]; a++)
      if (k == 0 || s[k - 1] != s[a]) s[k++] = s[a];
    distinct_total += k;
    char name[64];
    snprintf(name, sizeof name, "embedding_c%d/embeddings", f);
    int var = -1;
    for (int q = 0; q < v.nv; q++)
      if (!strcmp(v.vi[q].name, name)) var = q;
    assert_true(var >= 0);
    assert_int_equal(ra.nr[var], k);
    for (int64_t a = 0; a < k; a++) assert_int_equal(ra.ids[var][a], s[a]);
    free(s);
  }
  for (int q = 0; q < v.nv; q++) {
    if (v.vi[q].kind == TSR_VAR_DENSE) continue;
    n_sparse_vars++;
    for (int64_t a = 1; a < ra.nr[q]; a++)
      assert_true(ra.ids[q][a - 1] < ra.ids[q][a]);
    if (!strcmp(v.vi[q].name, "wide/embeddings"))
      assert_int_equal(ra.nr[q], distinct_total);
  }
  assert_int_equal(n_sparse_vars, NF + 1);

  /* B: one example at a time; gradients summed by row */
  float *gsum[16] = {0};
  for (int q = 0; q < v.nv; q++)
    if (v.vi[q].kind == TSR_VAR_DENSE)
      gsum[q] = calloc((size_t)v.vi[q].numel, sizeof(float));
    else
      gsum[q] = calloc((size_t)(ra.nr[q] * v.vi[q].row_dim + 1),
                       sizeof(float));
  for (int i = 0; i < NB; i++) {
    if (wk_exec_prepare(eb, &b, i, i + 1, NULL, err, sizeof err))
      fail_msg("prepare example %d: %s", i, err);
    run_bufs rb = {0};
    run(&v, eb, &rb, &pp[i], &l);
    for (int q = 0; q < v.nv; q++) {
      const tsr_var *vi = &v.vi[q];
      if (vi->kind == TSR_VAR_DENSE) {
        for (int64_t e = 0; e < vi->numel; e++) gsum[q][e] += rb.g[q][e];
        continue;
      }
      for (int64_t u = 0; u < rb.nr[q]; u++) {
        int64_t at = 0; /* the row's place in A's list */
        while (ra.ids[q][at] != rb.ids[q][u]) {
          at++;
          assert_true(at < ra.nr[q]);
        }
        for (int64_t c = 0; c < vi->row_dim; c++)
          gsum[q][at * vi->row_dim + c] += rb.g[q][u * vi->row_dim + c];
      }
    }
    bufs_free(&v, &rb);
  }
  same_as_batch(&v, &ra, pa, pp, gsum, "alone");

  /* C: two slices with the whole batch's row lists */
  int64_t cut[3] = {0, 23, NB};
  for (int s = 0; s < 2; s++) {
    if (wk_exec_prepare(ec, &b, cut[s], cut[s + 1], ea, err, sizeof err))
      fail_msg("prepare slice %d: %s", s, err);
    run_bufs rc = {0};
    run(&v, ec, &rc, &pp[cut[s]], &l);
    for (int q = 0; q < v.nv; q++) {
      const tsr_var *vi = &v.vi[q];
      if (vi->kind != TSR_VAR_DENSE) {
        assert_int_equal(rc.nr[q], ra.nr[q]); /* the whole batch's rows */
        for (int64_t u = 0; u < rc.nr[q]; u++)
          for (int64_t c = 0; c < vi->row_dim; c++)
            assert_true(row_grad(&v, &rc, q, ra.ids[q][u], c) ==
                        rc.g[q][u * vi->row_dim + c]);
      }
      int64_t ne = vi->kind == TSR_VAR_DENSE ? vi->numel
                                             : ra.nr[q] * vi->row_dim;
      for (int64_t e = 0; e < ne; e++) gsum[q][e] += rc.g[q][e];
    }
    bufs_free(&v, &rc);
  }
  same_as_batch(&v, &ra, pa, pp, gsum, "in slices");
  for (int q = 0; q < v.nv; q++) free(gsum[q]);
  (void)la;
  bufs_free(&v, &ra);
  wk_exec_close(ea);
  wk_exec_close(eb);
  wk_exec_close(ec);
  for (int f = 0; f < NF; f++) {
    free(ids[f]);
    free(off[f]);
  }
  kern_close(v.c);
  tsr_model_free(v.m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_plans_agree),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
