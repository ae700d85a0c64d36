/* The float64 reference of ref_model.h. Plain loops straight from the
 * definitions: TF's padding ("same": output ceil(i/s), padding
 * max((o-1)*s + k - i, 0) with the smaller half first), biased batch
 * variance, windows scanned row-major (the first maximum wins).
 */
#include "ref_model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  int rank;
  int64_t d[3];
  int64_t size;
  double *v; /* [n, size] */
} rt;

typedef struct {
  const ref_params *p;
  int64_t n;
  bool train;
  double reg;
  ref_result *r;
} rctx;

static int bad(const char *what, const char *name) {
  fprintf(stderr, "ref_model: %s (%s)\n", what, name ? name : "?");
  return -1;
}

static void mk(rt *t, int rank, const int64_t *d, int64_t n) {
  t->rank = rank;
  t->size = 1;
  for (int i = 0; i < rank; i++) {
    t->d[i] = d[i];
    t->size *= d[i];
  }
  t->v = calloc((size_t)(n * t->size), sizeof(double));
}

static const double *param(rctx *c, const char *layer, const char *v) {
  char nm[160];
  snprintf(nm, sizeof nm, "%s/%s", layer, v);
  for (int i = 0; i < c->p->n_vars; i++)
    if (!strcmp(c->p->names[i], nm)) return c->p->vals[i];
  return NULL;
}

static double cfg_num(const json_t *cfg, const char *k, double def) {
  const json_t *v = json_object_get(cfg, k);
  return v && json_is_number(v) ? json_number_value(v) : def;
}

static void pair(const json_t *cfg, const char *k, int64_t def0,
                 int64_t def1, int64_t out[2]) {
  const json_t *v = json_object_get(cfg, k);
  if (json_is_integer(v)) {
    out[0] = out[1] = json_integer_value(v);
  } else if (json_is_array(v)) {
    out[0] = json_integer_value(json_array_get(v, 0));
    out[1] = json_integer_value(json_array_get(v, 1));
  } else {
    out[0] = def0;
    out[1] = def1;
  }
}

/* regularizer of one variable (numel elements) added to c->reg */
static void reg(rctx *c, const json_t *cfg, const char *key,
                const double *w, int64_t numel) {
  const json_t *r = json_object_get(cfg, key);
  if (!r || json_is_null(r) || !w) return;
  const json_t *rc = json_object_get(r, "config");
  double l1 = cfg_num(rc, "l1", 0), l2 = cfg_num(rc, "l2", 0);
  for (int64_t i = 0; i < numel; i++)
    c->reg += l1 * fabs(w[i]) + l2 * w[i] * w[i];
}

/* activation over the last axis (softmax) or elementwise */
static int act(const char *a, double alpha, double *v, int64_t rows,
               int64_t d) {
  int64_t N = rows * d;
  if (!a || !strcmp(a, "linear")) return 0;
  if (!strcmp(a, "softmax")) {
    for (int64_t r = 0; r < rows; r++) {
      double *x = v + r * d, mx = x[0], s = 0;
      for (int64_t j = 1; j < d; j++) mx = fmax(mx, x[j]);
      for (int64_t j = 0; j < d; j++) s += (x[j] = exp(x[j] - mx));
      for (int64_t j = 0; j < d; j++) x[j] /= s;
    }
    return 0;
  }
  for (int64_t i = 0; i < N; i++) {
    double z = v[i];
    if (!strcmp(a, "relu")) v[i] = z > 0 ? z : 0;
    else if (!strcmp(a, "relu6")) v[i] = fmin(fmax(z, 0), 6);
    else if (!strcmp(a, "tanh")) v[i] = tanh(z);
    else if (!strcmp(a, "sigmoid")) v[i] = 1 / (1 + exp(-z));
    else if (!strcmp(a, "leaky_relu")) v[i] = z > 0 ? z : alpha * z;
    else if (!strcmp(a, "elu")) v[i] = z > 0 ? z : alpha * expm1(z);
    else return bad("activation", a);
  }
  return 0;
}

static const char *act_name(const json_t *cfg) {
  const json_t *a = json_object_get(cfg, "activation");
  return json_is_string(a) ? json_string_value(a) : "linear";
}

/* Keras's activation functions: leaky_relu's slope 0.2, elu's alpha 1 */
static double act_alpha(const json_t *cfg) {
  return !strcmp(act_name(cfg), "leaky_relu") ? 0.2 : 1.0;
}

static int dense(rctx *c, const json_t *cfg, const char *nm, const rt *x,
                 rt *y) {
  int64_t u = json_integer_value(json_object_get(cfg, "units"));
  int64_t K = x->d[x->rank - 1], rows = c->n * (x->size / K);
  int64_t d[3];
  memcpy(d, x->d, sizeof d);
  d[x->rank - 1] = u;
  mk(y, x->rank, d, c->n);
  const double *W = param(c, nm, "kernel"), *b = param(c, nm, "bias");
  if (!W) return bad("no kernel", nm);
  for (int64_t r = 0; r < rows; r++)
    for (int64_t j = 0; j < u; j++) {
      double s = b ? b[j] : 0;
      for (int64_t k = 0; k < K; k++) s += x->v[r * K + k] * W[k * u + j];
      y->v[r * u + j] = s;
    }
  reg(c, cfg, "kernel_regularizer", W, K * u);
  reg(c, cfg, "bias_regularizer", b, u);
  return act(act_name(cfg), act_alpha(cfg), y->v, rows, u);
}

/* TF output size and leading padding */
static void geom(int64_t i, int64_t k, int64_t s, bool same, int64_t *o,
                 int64_t *pad) {
  if (same) {
    *o = (i + s - 1) / s;
    int64_t t = (*o - 1) * s + k - i;
    *pad = t > 0 ? t / 2 : 0;
  } else {
    *o = (i - k) / s + 1;
    *pad = 0;
  }
}

static bool is_same(const json_t *cfg) {
  const char *p = json_string_value(json_object_get(cfg, "padding"));
  return p && !strcmp(p, "same");
}

static int conv(rctx *c, const json_t *cfg, const char *nm, const rt *x,
                rt *y) {
  int64_t ks[2], st[2];
  pair(cfg, "kernel_size", 1, 1, ks);
  pair(cfg, "strides", 1, 1, st);
  int64_t F = json_integer_value(json_object_get(cfg, "filters"));
  int64_t H = x->d[0], Wd = x->d[1], C = x->d[2], oh, ow, pt, pl;
  bool same = is_same(cfg);
  geom(H, ks[0], st[0], same, &oh, &pt);
  geom(Wd, ks[1], st[1], same, &ow, &pl);
  int64_t d[3] = {oh, ow, F};
  mk(y, 3, d, c->n);
  const double *K = param(c, nm, "kernel"), *b = param(c, nm, "bias");
  if (!K) return bad("no kernel", nm);
  for (int64_t n = 0; n < c->n; n++)
    for (int64_t oy = 0; oy < oh; oy++)
      for (int64_t ox = 0; ox < ow; ox++)
        for (int64_t f = 0; f < F; f++) {
          double s = b ? b[f] : 0;
          for (int64_t ky = 0; ky < ks[0]; ky++)
            for (int64_t kx = 0; kx < ks[1]; kx++) {
              int64_t iy = oy * st[0] - pt + ky, ix = ox * st[1] - pl + kx;
              if (iy < 0 || iy >= H || ix < 0 || ix >= Wd) continue;
              for (int64_t ci = 0; ci < C; ci++)
                s += x->v[((n * H + iy) * Wd + ix) * C + ci] *
                     K[((ky * ks[1] + kx) * C + ci) * F + f];
            }
          y->v[((n * oh + oy) * ow + ox) * F + f] = s;
        }
  reg(c, cfg, "kernel_regularizer", K, ks[0] * ks[1] * C * F);
  reg(c, cfg, "bias_regularizer", b, F);
  return act(act_name(cfg), act_alpha(cfg), y->v, c->n * oh * ow, F);
}

static int pool(const json_t *cfg, bool mx, const rt *x, rt *y, int64_t n) {
  int64_t ps[2], st[2];
  pair(cfg, "pool_size", 2, 2, ps);
  const json_t *sv = json_object_get(cfg, "strides");
  if (!sv || json_is_null(sv)) memcpy(st, ps, sizeof st);
  else pair(cfg, "strides", ps[0], ps[1], st);
  int64_t H = x->d[0], Wd = x->d[1], C = x->d[2], oh, ow, pt, pl;
  bool same = is_same(cfg);
  geom(H, ps[0], st[0], same, &oh, &pt);
  geom(Wd, ps[1], st[1], same, &ow, &pl);
  int64_t d[3] = {oh, ow, C};
  mk(y, 3, d, n);
  for (int64_t b = 0; b < n; b++)
    for (int64_t oy = 0; oy < oh; oy++)
      for (int64_t ox = 0; ox < ow; ox++)
        for (int64_t ch = 0; ch < C; ch++) {
          double best = -INFINITY, s = 0;
          int cnt = 0;
          for (int64_t ky = 0; ky < ps[0]; ky++)
            for (int64_t kx = 0; kx < ps[1]; kx++) {
              int64_t iy = oy * st[0] - pt + ky, ix = ox * st[1] - pl + kx;
              if (iy < 0 || iy >= H || ix < 0 || ix >= Wd) continue;
              double v = x->v[((b * H + iy) * Wd + ix) * C + ch];
              best = fmax(best, v);
              s += v;
              cnt++;
            }
          y->v[((b * oh + oy) * ow + ox) * C + ch] = mx ? best : s / cnt;
        }
  return 0;
}

static int batchnorm(rctx *c, const json_t *cfg, const char *nm,
                     const rt *x, rt *y) {
  mk(y, x->rank, x->d, c->n);
  int64_t C = x->d[x->rank - 1], rows = c->n * (x->size / C);
  double eps = cfg_num(cfg, "epsilon", 1e-3);
  const double *g = param(c, nm, "gamma"), *b = param(c, nm, "beta");
  const double *mm = param(c, nm, "moving_mean");
  const double *mv = param(c, nm, "moving_variance");
  double *mean = calloc((size_t)(2 * C), sizeof *mean), *var = mean + C;
  if (c->train) {
    for (int64_t r = 0; r < rows; r++)
      for (int64_t ch = 0; ch < C; ch++) mean[ch] += x->v[r * C + ch] / rows;
    for (int64_t r = 0; r < rows; r++)
      for (int64_t ch = 0; ch < C; ch++) {
        double t = x->v[r * C + ch] - mean[ch];
        var[ch] += t * t / rows;
      }
    if (!c->r->bn_stats) {
      c->r->bn_stats = malloc((size_t)(2 * C) * sizeof(double));
      memcpy(c->r->bn_stats, mean, (size_t)(2 * C) * sizeof(double));
      c->r->bn_c = C;
    }
  } else {
    memcpy(mean, mm, (size_t)C * sizeof *mean);
    memcpy(var, mv, (size_t)C * sizeof *var);
  }
  for (int64_t r = 0; r < rows; r++)
    for (int64_t ch = 0; ch < C; ch++)
      y->v[r * C + ch] = (x->v[r * C + ch] - mean[ch]) /
                             sqrt(var[ch] + eps) * (g ? g[ch] : 1) +
                         (b ? b[ch] : 0);
  reg(c, cfg, "gamma_regularizer", g, C);
  reg(c, cfg, "beta_regularizer", b, C);
  free(mean);
  return 0;
}

static int layernorm(rctx *c, const json_t *cfg, const char *nm,
                     const rt *x, rt *y) {
  mk(y, x->rank, x->d, c->n);
  const json_t *a = json_object_get(cfg, "axis");
  int k = json_is_array(a) ? (int)json_array_size(a) : 1;
  int64_t w = 1;
  for (int i = x->rank - k; i < x->rank; i++) w *= x->d[i];
  int64_t rows = c->n * (x->size / w);
  double eps = cfg_num(cfg, "epsilon", 1e-3);
  const double *g = param(c, nm, "gamma"), *b = param(c, nm, "beta");
  for (int64_t r = 0; r < rows; r++) {
    const double *xr = x->v + r * w;
    double mu = 0, var = 0;
    for (int64_t j = 0; j < w; j++) mu += xr[j] / w;
    for (int64_t j = 0; j < w; j++) var += (xr[j] - mu) * (xr[j] - mu) / w;
    for (int64_t j = 0; j < w; j++)
      y->v[r * w + j] = (xr[j] - mu) / sqrt(var + eps) * (g ? g[j] : 1) +
                        (b ? b[j] : 0);
  }
  reg(c, cfg, "gamma_regularizer", g, w);
  reg(c, cfg, "beta_regularizer", b, w);
  return 0;
}

static int embedding(rctx *c, const json_t *cfg, const char *nm, const rt *x,
                     rt *y) {
  int64_t dim = json_integer_value(json_object_get(cfg, "output_dim"));
  int64_t d[2] = {x->size, dim};
  mk(y, 2, d, c->n);
  const double *E = param(c, nm, "embeddings");
  if (!E) return bad("no embeddings", nm);
  for (int64_t i = 0; i < c->n * x->size; i++) {
    int64_t id = (int64_t)x->v[i];
    memcpy(y->v + i * dim, E + id * dim, (size_t)dim * sizeof(double));
  }
  return 0;
}

static int layer(rctx *c, const char *cls, const json_t *cfg, const char *nm,
                 rt *in, int n_in, rt *y) {
  const rt *x = &in[0];
  if (!strcmp(cls, "Dense")) return dense(c, cfg, nm, x, y);
  if (!strcmp(cls, "Conv2D")) return conv(c, cfg, nm, x, y);
  if (!strcmp(cls, "MaxPooling2D")) return pool(cfg, true, x, y, c->n);
  if (!strcmp(cls, "AveragePooling2D")) return pool(cfg, false, x, y, c->n);
  if (!strcmp(cls, "BatchNormalization")) return batchnorm(c, cfg, nm, x, y);
  if (!strcmp(cls, "LayerNormalization")) return layernorm(c, cfg, nm, x, y);
  if (!strcmp(cls, "Embedding")) return embedding(c, cfg, nm, x, y);
  if (!strncmp(cls, "GlobalAveragePooling", 20)) {
    int64_t C = x->d[x->rank - 1], p = x->size / C;
    mk(y, 1, &C, c->n);
    for (int64_t b = 0; b < c->n; b++)
      for (int64_t i = 0; i < p; i++)
        for (int64_t ch = 0; ch < C; ch++)
          y->v[b * C + ch] += x->v[(b * p + i) * C + ch] / p;
    return 0;
  }
  if (!strcmp(cls, "Flatten") || !strcmp(cls, "Reshape") ||
      !strcmp(cls, "Dropout")) {
    int64_t d[3] = {x->size, 0, 0};
    int rank = 1;
    if (!strcmp(cls, "Dropout")) {
      rank = x->rank;
      memcpy(d, x->d, sizeof d);
    } else if (!strcmp(cls, "Reshape")) {
      const json_t *t = json_object_get(cfg, "target_shape");
      rank = (int)json_array_size(t);
      int64_t prod = 1;
      int free_at = -1;
      for (int i = 0; i < rank; i++) {
        d[i] = json_integer_value(json_array_get(t, i));
        if (d[i] == -1) free_at = i;
        else prod *= d[i];
      }
      if (free_at >= 0) d[free_at] = x->size / prod;
    }
    mk(y, rank, d, c->n);
    memcpy(y->v, x->v, (size_t)(c->n * x->size) * sizeof(double));
    return 0;
  }
  if (!strcmp(cls, "Activation") || !strcmp(cls, "ReLU") ||
      !strcmp(cls, "LeakyReLU") || !strcmp(cls, "ELU") ||
      !strcmp(cls, "Softmax")) {
    mk(y, x->rank, x->d, c->n);
    memcpy(y->v, x->v, (size_t)(c->n * x->size) * sizeof(double));
    const char *a = !strcmp(cls, "Activation") ? act_name(cfg)
                    : !strcmp(cls, "ReLU") ? "relu"
                    : !strcmp(cls, "LeakyReLU") ? "leaky_relu"
                    : !strcmp(cls, "ELU") ? "elu" : "softmax";
    double alpha = !strcmp(cls, "LeakyReLU")
                       ? cfg_num(cfg, "negative_slope", cfg_num(cfg, "alpha", 0.3))
                   : !strcmp(cls, "ELU") ? cfg_num(cfg, "alpha", 1.0) : 0.2;
    if (!strcmp(cls, "ReLU") && cfg_num(cfg, "negative_slope", 0) > 0) {
      a = "leaky_relu";
      alpha = cfg_num(cfg, "negative_slope", 0);
    }
    return act(a, alpha, y->v, c->n * (x->size / x->d[x->rank - 1]),
               x->d[x->rank - 1]);
  }
  if (!strcmp(cls, "Add") || !strcmp(cls, "Subtract") ||
      !strcmp(cls, "Average")) {
    mk(y, x->rank, x->d, c->n);
    for (int i = 0; i < n_in; i++)
      for (int64_t e = 0; e < c->n * x->size; e++) {
        double v = in[i].v[e];
        if (!strcmp(cls, "Subtract") && i == 1) v = -v;
        if (!strcmp(cls, "Average")) v /= n_in;
        y->v[e] += v;
      }
    return 0;
  }
  if (!strcmp(cls, "Concatenate")) {
    int64_t ax = (int64_t)cfg_num(cfg, "axis", -1);
    if (ax < 0) ax += x->rank + 1;
    int64_t d[3], outer = 1, tot = 0;
    memcpy(d, x->d, sizeof d);
    for (int i = 0; i < ax - 1; i++) outer *= x->d[i];
    for (int i = 0; i < n_in; i++) tot += in[i].d[ax - 1];
    d[ax - 1] = tot;
    mk(y, x->rank, d, c->n);
    int64_t wo = y->size / outer, off = 0;
    for (int i = 0; i < n_in; i++) {
      int64_t w = in[i].size / outer;
      for (int64_t r = 0; r < c->n * outer; r++)
        memcpy(y->v + r * wo + off, in[i].v + r * w, (size_t)w * sizeof(double));
      off += w;
    }
    return 0;
  }
  return bad("layer class", cls);
}

static const json_t *shape_of(const json_t *cfg) {
  const json_t *s = json_object_get(cfg, "batch_input_shape");
  return s ? s : json_object_get(cfg, "batch_shape");
}

static void input_from(rt *t, const json_t *shp, const float *x, int64_t n,
                       int64_t nd, int64_t off) {
  int64_t d[3] = {1, 1, 1};
  int rank = (int)json_array_size(shp) - 1;
  for (int i = 0; i < rank; i++) d[i] = json_integer_value(json_array_get(shp, i + 1));
  mk(t, rank, d, n);
  for (int64_t b = 0; b < n; b++)
    for (int64_t j = 0; j < t->size; j++)
      t->v[b * t->size + j] = x[b * nd + off + j];
}

int ref_run(const json_t *model, const char *loss, const ref_params *p,
            const float *x, int64_t n, int64_t nd, const float *y,
            bool train, ref_result *r) {
  memset(r, 0, sizeof *r);
  rctx c = {p, n, train, 0, r};
  const json_t *cfg = json_object_get(model, "config");
  const json_t *layers = json_object_get(cfg, "layers");
  size_t nl = json_array_size(layers);
  rt *t = calloc(nl, sizeof *t);
  bool functional = !strcmp(json_string_value(json_object_get(model,
                                                              "class_name")),
                            "Functional");
  int rc = 0, last = -1;
  int64_t off = 0;
  for (size_t i = 0; i < nl && !rc; i++) {
    const json_t *L = json_array_get(layers, i);
    const char *cls = json_string_value(json_object_get(L, "class_name"));
    const json_t *lc = json_object_get(L, "config");
    const char *nm = json_string_value(json_object_get(lc, "name"));
    if (!strcmp(cls, "InputLayer")) {
      input_from(&t[i], shape_of(lc), x, n, nd, off);
      off += t[i].size;
      last = (int)i;
      continue;
    }
    rt in[8];
    int n_in = 0;
    if (functional) {
      const json_t *ib = json_array_get(json_object_get(L, "inbound_nodes"), 0);
      for (size_t k = 0; k < json_array_size(ib); k++) {
        const char *src = json_string_value(json_array_get(json_array_get(ib, k), 0));
        for (size_t j = 0; j < i; j++) {
          const json_t *Lj = json_array_get(layers, j);
          if (!strcmp(json_string_value(json_object_get(
                          json_object_get(Lj, "config"), "name")), src))
            in[n_in++] = t[j];
        }
      }
    } else {
      in[n_in++] = t[last];
    }
    rc = layer(&c, cls, lc, nm, in, n_in, &t[i]);
    last = (int)i;
  }
  if (!rc) {
    const rt *o = &t[last];
    r->out_dim = o->size;
    r->out = malloc((size_t)(n * o->size) * sizeof(double));
    memcpy(r->out, o->v, (size_t)(n * o->size) * sizeof(double));
    double s = 0;
    for (int64_t b = 0; b < n; b++) {
      const double *ob = o->v + b * o->size;
      if (!strcmp(loss, "mse")) {
        double e = 0;
        for (int64_t j = 0; j < o->size; j++) e += (ob[j] - y[b]) * (ob[j] - y[b]);
        s += e / o->size;
      } else {
        s += -log(ob[(int64_t)y[b]]);
      }
    }
    r->loss_sum = s + n * c.reg;
  }
  for (size_t i = 0; i < nl; i++) free(t[i].v);
  free(t);
  return rc;
}

void ref_result_free(ref_result *r) {
  free(r->out);
  free(r->bn_stats);
  memset(r, 0, sizeof *r);
}
