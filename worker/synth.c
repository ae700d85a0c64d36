/* Synthetic data: generated on demand from (data_seed, split, row), so any
 * row is reproducible on any worker without storing the data set.
 *
 * "synthetic": the Keras example's shape, `dense` (10) standard normal
 * features and a regression target y = w.x + b + noise * N(0, 1) with a
 * hidden w and b drawn from data_seed.
 * "synthetic_ctr": click-through-style data: `sparse` features each with
 * `ids_per_feature` ids drawn from a Zipf(zipf) law over its vocabulary
 * (rank r is mapped to id (r * a) mod vocab, so the hot ids spread over a
 * partitioned table as hashed ids do), plus `dense` standard normal
 * features. The label is drawn from a hidden logistic model:
 * p = sigmoid(b + sum of per-id weights + v.x), the per-id weights uniform
 * and the dense weights normal, scaled so that the logit's variance is 2.5
 * whatever the feature counts, and b set for the asked positive_rate
 * (approximately); its AUC on the generated
 * split is the best any model can reach and is exposed as best_auc.
 * Failure modes: none after open (the parameters are checked by the spec).
 */
#include "worker/input_int.h"

#include "common/err.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Zipf sampler by rejection-inversion (Hoermann and Derflinger 1996):
 * O(1) per draw, no table, exact for any exponent > 0. */
typedef struct {
  double q;  /* exponent */
  double n;  /* elements */
  double hx1, hn, s;
} zipf_t;

static double helper1(double x) {
  return fabs(x) > 1e-8 ? log1p(x) / x
                        : 1 - x * (0.5 - x * (1.0 / 3 - 0.25 * x));
}
static double helper2(double x) {
  return fabs(x) > 1e-8 ? expm1(x) / x
                        : 1 + x * 0.5 * (1 + x * (1.0 / 3) * (1 + 0.25 * x));
}
static double zh(const zipf_t *z, double x) { return exp(-z->q * log(x)); }
static double zH(const zipf_t *z, double x) {
  double lx = log(x);
  return helper2((1 - z->q) * lx) * lx;
}
static double zHinv(const zipf_t *z, double x) {
  double t = x * (1 - z->q);
  if (t < -1) t = -1;
  return exp(helper1(t) * x);
}
static void zipf_init(zipf_t *z, double q, int64_t n) {
  z->q = q;
  z->n = (double)n;
  z->hx1 = zH(z, 1.5) - 1;
  z->hn = zH(z, z->n + 0.5);
  z->s = 2 - zHinv(z, zH(z, 2.5) - zh(z, 2));
}
/* A rank in [1, n]. */
static int64_t zipf_draw(const zipf_t *z, uint64_t *st) {
  for (;;) {
    double u = z->hn + wk_rng_unit(st) * (z->hx1 - z->hn);
    double x = zHinv(z, u);
    double k = floor(x + 0.5);
    if (k < 1) k = 1;
    if (k > z->n) k = z->n;
    if (k - x <= z->s || u >= zH(z, k + 0.5) - zh(z, k)) return (int64_t)k;
  }
}

static double gauss(uint64_t *st) {
  double u1 = wk_rng_unit(st), u2 = wk_rng_unit(st);
  if (u1 < 1e-300) u1 = 1e-300;
  return sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2);
}

/* A standard normal value keyed by (seed, a, b): the dense weights. */
static double keyed_gauss(uint64_t seed, uint64_t a, uint64_t b) {
  uint64_t st = wk_mix64(seed ^ wk_mix64(a * 0x9e3779b97f4a7c15ull ^
                                         wk_mix64(b + 0x632be59bd9b4e019ull)));
  return gauss(&st);
}

/* A uniform value of variance 1 keyed by (seed, a, b): the per-id weights
 * (cheap: one hash, no transcendental function). */
static double keyed_unit(uint64_t seed, uint64_t a, uint64_t b) {
  uint64_t h = wk_mix64(seed ^ wk_mix64(a * 0x9e3779b97f4a7c15ull ^ b));
  return ((double)(h >> 11) * (2.0 / 9007199254740992.0) - 1) *
         1.7320508075688772;
}

/* Logit variance of the hidden CTR model: 2.25 from the ids, 0.25 from
 * the dense features, whatever their counts (an AUC near 0.8). */
#define SPARSE_VAR 2.25
#define DENSE_VAR 0.25

typedef struct {
  wk_src base;
  bool ctr;
  int64_t n;
  int stream;
  uint64_t seed;
  double noise, bias;
  double sig_sparse;  /* stddev of one id's weight */
  double *w;        /* dense weights */
  zipf_t *zipf;     /* per sparse feature */
  uint64_t *mult;   /* rank -> id multiplier per sparse feature */
  int ids_per;
} synth_src;

static uint64_t gcd64(uint64_t a, uint64_t b) {
  while (b) {
    uint64_t t = a % b;
    a = b;
    b = t;
  }
  return a;
}

/* Generates row `row` and returns the hidden logit (ctr) or mean (regression). */
static double gen(synth_src *g, int64_t row, wk_rec *r, double *u_label) {
  uint64_t st = wk_mix64(g->seed ^ wk_mix64(((uint64_t)g->stream << 48) ^
                                            (uint64_t)row));
  wk_src *s = &g->base;
  double t = g->bias;
  for (int64_t j = 0; j < s->n_dense; j += 2) { /* Box-Muller pairs */
    double u1 = wk_rng_unit(&st), u2 = wk_rng_unit(&st);
    if (u1 < 1e-300) u1 = 1e-300;
    double rad = sqrt(-2 * log(u1)), a = 6.283185307179586 * u2;
    double v0 = rad * cos(a), v1 = rad * sin(a);
    r->x[j] = (float)v0;
    t += g->w[j] * v0;
    if (j + 1 < s->n_dense) {
      r->x[j + 1] = (float)v1;
      t += g->w[j + 1] * v1;
    }
  }
  r->off[0] = 0;
  for (int f = 0; f < s->n_sparse; f++) {
    int64_t at = r->off[f];
    for (int k = 0; k < g->ids_per; k++) {
      uint64_t rank = (uint64_t)zipf_draw(&g->zipf[f], &st) - 1;
      uint64_t v = (uint64_t)s->vocab[f]; /* rank and mult are < v */
      uint64_t id = v <= UINT32_MAX
                        ? rank * g->mult[f] % v
                        : (uint64_t)(((unsigned __int128)rank * g->mult[f]) % v);
      r->ids[at + k] = (int64_t)id;
      t += g->sig_sparse * keyed_unit(g->seed, (uint64_t)f + 1, id);
    }
    r->off[f + 1] = at + g->ids_per;
  }
  *u_label = g->ctr ? wk_rng_unit(&st) : gauss(&st);
  return t;
}

static int synth_get(wk_src *s, int64_t row, wk_rec *r, char *err,
                     size_t errlen) {
  synth_src *g = (synth_src *)s;
  if (wk_rec__reserve(r, (size_t)s->n_sparse * (size_t)g->ids_per))
    return TSR_ENOMEM;
  double u;
  double t = gen(g, row, r, &u);
  if (g->ctr)
    r->y = u < 1 / (1 + exp(-t)) ? 1.0f : 0.0f;
  else
    r->y = (float)(t + g->noise * u);
  return 0;
}

static void free_names(char **v, int64_t n) {
  for (int64_t i = 0; v && i < n; i++) free(v[i]);
  free(v);
}

static void synth_destroy(wk_src *s) {
  synth_src *g = (synth_src *)s;
  free(g->w);
  free(g->zipf);
  free(g->mult);
  free(s->rows);
  free_names(s->dense_names, s->n_dense);
  free_names(s->sparse_names, s->n_sparse);
  free(s->vocab);
  free(g);
}

static int cmp_pair(const void *a, const void *b) {
  const double *x = a, *y = b;
  return (x[0] > y[0]) - (x[0] < y[0]);
}

/* AUC of the hidden logit against the drawn labels over the split's rows
 * (Mann-Whitney, ties counted half). */
static int best_auc(synth_src *g, const wk_sel *sel, double *out) {
  wk_src *s = &g->base;
  wk_rec r;
  int64_t m = 0;
  double *p = malloc((size_t)(g->n ? g->n : 1) * 2 * sizeof(double));
  int rc = wk_rec__init(&r, s->n_dense, s->n_sparse);
  if (!rc && wk_rec__reserve(&r, (size_t)s->n_sparse * (size_t)g->ids_per))
    rc = TSR_ENOMEM;
  if (!p || rc) {
    free(p);
    wk_rec__free(&r);
    return TSR_ENOMEM;
  }
  for (int64_t i = 0; i < g->n; i++) {
    if (!wk_sel__split_ok(sel, i)) continue;
    double u;
    double t = gen(g, i, &r, &u);
    p[2 * m] = t;
    p[2 * m + 1] = u < 1 / (1 + exp(-t)) ? 1 : 0;
    m++;
  }
  wk_rec__free(&r);
  qsort(p, (size_t)m, 2 * sizeof(double), cmp_pair);
  double pos = 0, rank_sum = 0;
  for (int64_t i = 0; i < m;) {
    int64_t j = i;
    while (j < m && p[2 * j] == p[2 * i]) j++;
    double avg = (double)(i + j + 1) / 2; /* ranks i+1 .. j */
    for (int64_t k = i; k < j; k++)
      if (p[2 * k + 1] > 0) {
        pos++;
        rank_sum += avg;
      }
    i = j;
  }
  double neg = (double)m - pos;
  *out = pos > 0 && neg > 0 ? (rank_sum - pos * (pos + 1) / 2) / (pos * neg)
                            : NAN;
  free(p);
  return 0;
}

static const wk_src_ops synth_ops = {.get = synth_get,
                                     .destroy = synth_destroy};

static char **names(const char *prefix, int64_t n) {
  char **v = calloc((size_t)(n ? n : 1), sizeof *v);
  for (int64_t i = 0; v && i < n; i++) {
    char b[32];
    snprintf(b, sizeof b, "%s%lld", prefix, (long long)i);
    if (!(v[i] = strdup(b))) {
      free_names(v, i);
      return NULL;
    }
  }
  return v;
}

int wk_synth__src(const wk_input_spec *spec, const wk_sel *sel, wk_src **out,
                  char *err, size_t errlen) {
  synth_src *g = calloc(1, sizeof *g);
  if (!g) return TSR_ENOMEM;
  wk_src *s = &g->base;
  s->ops = &synth_ops;
  g->ctr = spec->format == WK_FMT_SYNTHETIC_CTR;
  g->n = spec->n;
  g->stream = spec->syn_stream;
  g->seed = wk_mix64(spec->data_seed ^ (g->ctr ? 0x5ca1ab1eull : 0));
  g->noise = spec->noise;
  g->ids_per = spec->ids_per_feature;
  s->n_dense = spec->syn_dense;
  s->n_sparse = g->ctr ? spec->syn_sparse : 0;
  s->best_auc = NAN;
  int rc = TSR_ENOMEM;
  g->w = calloc((size_t)(s->n_dense ? s->n_dense : 1), sizeof(double));
  s->dense_names = names(g->ctr ? "d" : "x", s->n_dense);
  s->sparse_names = names("c", s->n_sparse);
  s->vocab = calloc((size_t)s->n_sparse + 1, sizeof(int64_t));
  g->zipf = calloc((size_t)s->n_sparse + 1, sizeof(zipf_t));
  g->mult = calloc((size_t)s->n_sparse + 1, sizeof(uint64_t));
  s->rows = malloc((size_t)(g->n ? g->n : 1) * sizeof(int64_t));
  if (!g->w || !s->dense_names || !s->sparse_names || !s->vocab ||
      !g->zipf || !g->mult || !s->rows)
    goto fail;
  double sigma = 1.0;
  if (g->ctr) {
    sigma = s->n_dense ? sqrt(DENSE_VAR / (double)s->n_dense) : 0;
    int64_t nid = (int64_t)s->n_sparse * g->ids_per;
    g->sig_sparse = nid > 0 ? sqrt(SPARSE_VAR / (double)nid) : 0;
  }
  for (int64_t j = 0; j < s->n_dense; j++)
    g->w[j] = sigma * keyed_gauss(g->seed, 0, (uint64_t)j);
  if (g->ctr) {
    /* E[sigmoid(b + N(0, v))] ~ sigmoid(b / sqrt(1 + pi v / 8)) */
    double v = (s->n_dense ? DENSE_VAR : 0) +
               (s->n_sparse > 0 ? SPARSE_VAR : 0);
    g->bias = log(spec->positive_rate / (1 - spec->positive_rate)) *
              sqrt(1 + 3.141592653589793 * v / 8);
  } else {
    g->bias = keyed_gauss(g->seed, 0, UINT64_MAX);
  }
  for (int f = 0; f < s->n_sparse; f++) {
    uint64_t v = (uint64_t)spec->syn_vocab[f];
    s->vocab[f] = (int64_t)v;
    zipf_init(&g->zipf[f], spec->zipf, (int64_t)v);
    uint64_t m = (wk_mix64(g->seed + (uint64_t)f) % v) | 1;
    while (gcd64(m, v) != 1) m = (m + 2) % v;
    g->mult[f] = m;
  }
  int64_t pos = 0;
  for (int64_t i = 0; i < g->n; i++) {
    if (!wk_sel__split_ok(sel, i)) continue;
    if (wk_sel__data_ok(sel, pos)) s->rows[s->n_rows++] = i;
    pos++;
  }
  s->n_total = pos;
  s->labels_integral = g->ctr;
  s->label_max = g->ctr ? 1 : 0;
  if (g->ctr && (rc = best_auc(g, sel, &s->best_auc))) goto fail;
  *out = s;
  return 0;
fail:
  synth_destroy(s);
  return tsr_errf(err, errlen, rc, "%s: out of memory generating %lld "
                  "examples", spec->where, (long long)spec->n);
}
