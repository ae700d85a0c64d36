/* Convolutions through oneDNN (cpu_dnnl.h): primitives cached per
 * geometry and items of examples on the context's pool.
 *
 * Each cached entry is one primitive for one direction, geometry and
 * number of examples, with the kernel layout it chose (format "any") and
 * the reorder between that layout and Keras's hwio. A batch is cut into
 * items of `mb` examples (a power of two from the work per example); a
 * shorter last item gets its own primitive, made to take the kernel in
 * the main one's layout so one reordered kernel (or one layout of
 * partial gradients) serves every item. Scratchpads are the caller's
 * (oneDNN's "user" mode), one per pool thread, as are the streams: a
 * primitive may run on several threads at once.
 */
#include "kernels/cpu/cpu_dnnl.h"
#include "common/err.h"

#include <oneapi/dnnl/dnnl.h>
#include <omp.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { D_FWD = 0, D_BWD_DATA, D_BWD_W };
static const char *const kind_names[] = {"forward", "backward data",
                                         "backward weights"};

#define ITEM_MACS ((int64_t)1 << 23) /* multiply-adds an item should hold */
#define W_PARTS 16                   /* most partial kernel gradients */
#define W_PART_FLOATS ((int64_t)1 << 26) /* and the most floats they take */
#define CACHE_MAX 64

/* All int64_t: no padding, so keys compare with memcmp. */
typedef struct {
  int64_t kind;
  int64_t h, w, c, kh, kw, sh, sw, pt, pl, oh, ow, f, mb;
  int64_t main_mb;  /* 0: a main entry; else the main entry's mb */
  int64_t bias;
  int64_t relu;     /* forward: max(0, .) as a post-op */
} prim_key;

typedef struct {
  prim_key key;
  dnnl_primitive_t prim;
  dnnl_primitive_t reorder;  /* main entries: hwio -> wmd (wmd -> hwio for
                              * the kernel gradient) */
  dnnl_memory_desc_t wmd;    /* the kernel (gradient) as the primitive
                              * takes it */
  dnnl_memory_desc_t spmd;   /* its scratchpad */
} prim_ent;

struct kern__dnnl {
  dnnl_engine_t eng;
  int threads;
  dnnl_stream_t *st;        /* per pool thread */
  void **sp;                /* per pool thread: scratchpad */
  size_t *sp_n;
  prim_ent cache[CACHE_MAX];
  int n_cache;
  char name[32];
};

/* oneDNN's OpenMP runtime would start a team of omp_get_max_threads()
 * threads in every primitive: each thread that runs one asks for one. */
static void one_thread(void) {
  if (omp_get_max_threads() != 1) omp_set_num_threads(1);
}

static const char *status_name(dnnl_status_t s) {
  switch (s) {
    case dnnl_success: return "success";
    case dnnl_out_of_memory: return "out of memory";
    case dnnl_invalid_arguments: return "invalid arguments";
    case dnnl_unimplemented: return "unimplemented";
    case dnnl_iterator_ends: return "iterator ends";
    case dnnl_runtime_error: return "runtime error";
    case dnnl_not_required: return "not required";
  }
  return "unknown status";
}

static int fail(void *impl, dnnl_status_t s, int kind, const kern_win *g,
                int64_t f, int64_t mb, const char *what) {
  return kern__cpu_fail(impl, s == dnnl_out_of_memory ? TSR_ENOMEM : TSR_EIO,
                        "oneDNN convolution %s (%lldx%lldx%lld, kernel "
                        "%lldx%lld, stride %lldx%lld, %lld filters, %lld "
                        "examples): %s: %s",
                        kind_names[kind], (long long)g->h, (long long)g->w,
                        (long long)g->c, (long long)g->kh, (long long)g->kw,
                        (long long)g->sh, (long long)g->sw, (long long)f,
                        (long long)mb, what, status_name(s));
}

int kern__dnnl_open(struct kern__dnnl **out, int threads, char *err,
                    size_t len) {
  *out = NULL;
  struct kern__dnnl *d = calloc(1, sizeof *d);
  if (!d) return TSR_ENOMEM;
  d->threads = threads;
  d->st = calloc((size_t)threads, sizeof *d->st);
  d->sp = calloc((size_t)threads, sizeof *d->sp);
  d->sp_n = calloc((size_t)threads, sizeof *d->sp_n);
  if (!d->st || !d->sp || !d->sp_n) {
    kern__dnnl_close(d);
    return TSR_ENOMEM;
  }
  one_thread();
  dnnl_status_t s = dnnl_engine_create(&d->eng, dnnl_cpu, 0);
  for (int t = 0; s == dnnl_success && t < threads; t++)
    s = dnnl_stream_create(&d->st[t], d->eng, dnnl_stream_default_flags);
  if (s != dnnl_success) {
    kern__dnnl_close(d);
    return tsr_errf(err, len, TSR_EIO, "oneDNN: no CPU engine: %s",
                    status_name(s));
  }
  const dnnl_version_t *v = dnnl_version();
  snprintf(d->name, sizeof d->name, "oneDNN %d.%d.%d", v->major, v->minor,
           v->patch);
  *out = d;
  return 0;
}

static void drop_cache(struct kern__dnnl *d) {
  for (int i = 0; i < d->n_cache; i++) {
    dnnl_primitive_destroy(d->cache[i].prim);
    if (d->cache[i].reorder) dnnl_primitive_destroy(d->cache[i].reorder);
  }
  d->n_cache = 0;
}

void kern__dnnl_close(struct kern__dnnl *d) {
  if (!d) return;
  drop_cache(d);
  for (int t = 0; t < d->threads; t++) {
    if (d->st && d->st[t]) dnnl_stream_destroy(d->st[t]);
    if (d->sp) free(d->sp[t]);
  }
  if (d->eng) dnnl_engine_destroy(d->eng);
  free(d->st);
  free(d->sp);
  free(d->sp_n);
  free(d);
}

const char *kern__dnnl_name(void *impl) {
  return ((kern__cpu *)impl)->dnnl->name;
}

/* ---- primitives -------------------------------------------------------- */

static dnnl_status_t act_md(dnnl_memory_desc_t *md, int64_t n, int64_t c,
                            int64_t h, int64_t w) {
  dnnl_dims_t dims = {n, c, h, w};
  return dnnl_memory_desc_init_by_tag(md, 4, dims, dnnl_f32, dnnl_nhwc);
}

static dnnl_status_t kernel_md(dnnl_memory_desc_t *md, const kern_win *g,
                               int64_t f, dnnl_format_tag_t tag) {
  dnnl_dims_t dims = {f, g->c, g->kh, g->kw};
  return dnnl_memory_desc_init_by_tag(md, 4, dims, dnnl_f32, tag);
}

static int64_t pad_after(int64_t o, int64_t s, int64_t k, int64_t i,
                         int64_t before) {
  int64_t p = (o - 1) * s + k - i - before;
  return p > 0 ? p : 0;
}

/* The primitive descriptor of one direction; fixed: the kernel layout to
 * take (NULL: oneDNN's choice). */
static dnnl_status_t make_pd(struct kern__dnnl *d, const prim_key *k,
                             const dnnl_memory_desc_t *fixed,
                             dnnl_primitive_desc_t *out) {
  kern_win g = {k->h, k->w, k->c, k->kh, k->kw, k->sh, k->sw,
                k->pt, k->pl, k->oh, k->ow};
  dnnl_memory_desc_t src, dst, wany, bmd;
  dnnl_dims_t strides = {k->sh, k->sw}, pl = {k->pt, k->pl};
  dnnl_dims_t pr = {pad_after(k->oh, k->sh, k->kh, k->h, k->pt),
                    pad_after(k->ow, k->sw, k->kw, k->w, k->pl)};
  dnnl_dims_t bdims = {k->f};
  dnnl_convolution_desc_t fd, bd;
  dnnl_primitive_desc_t hint = NULL;
  dnnl_primitive_attr_t attr = NULL;
  dnnl_status_t s;
  *out = NULL;
  if ((s = act_md(&src, k->mb, k->c, k->h, k->w)) ||
      (s = act_md(&dst, k->mb, k->f, k->oh, k->ow)) ||
      (s = kernel_md(&wany, &g, k->f, dnnl_format_tag_any)) ||
      (s = dnnl_memory_desc_init_by_tag(&bmd, 1, bdims, dnnl_f32, dnnl_x)))
    return s;
  const dnnl_memory_desc_t *wmd = fixed ? fixed : &wany;
  const dnnl_memory_desc_t *bias = k->bias ? &bmd : NULL;
  if ((s = dnnl_primitive_attr_create(&attr)) ||
      (s = dnnl_primitive_attr_set_scratchpad_mode(attr,
                                                   dnnl_scratchpad_mode_user)))
    goto out;
  if (k->relu) {
    dnnl_post_ops_t po;
    if ((s = dnnl_post_ops_create(&po))) goto out;
    s = dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_relu, 0.0f, 0.0f);
    if (!s) s = dnnl_primitive_attr_set_post_ops(attr, po);
    dnnl_post_ops_destroy(po);
    if (s) goto out;
  }
  if ((s = dnnl_convolution_forward_desc_init(
           &fd, dnnl_forward_training, dnnl_convolution_direct, &src,
           k->kind == D_FWD ? wmd : &wany, bias, &dst, strides, pl, pr)))
    goto out;
  if (k->kind == D_FWD) {
    s = dnnl_primitive_desc_create(out, &fd, attr, d->eng, NULL);
    goto out;
  }
  if ((s = dnnl_primitive_desc_create(&hint, &fd, NULL, d->eng, NULL)))
    goto out;
  if (k->kind == D_BWD_DATA)
    s = dnnl_convolution_backward_data_desc_init(
        &bd, dnnl_convolution_direct, &src, wmd, &dst, strides, pl, pr);
  else
    s = dnnl_convolution_backward_weights_desc_init(
        &bd, dnnl_convolution_direct, &src, wmd, bias, &dst, strides, pl,
        pr);
  if (!s) s = dnnl_primitive_desc_create(out, &bd, attr, d->eng, hint);
out:
  if (hint) dnnl_primitive_desc_destroy(hint);
  if (attr) dnnl_primitive_attr_destroy(attr);
  return s;
}

/* The reorder between Keras's hwio and the primitive's kernel layout. */
static dnnl_status_t make_reorder(struct kern__dnnl *d, const prim_key *k,
                                  const dnnl_memory_desc_t *wmd,
                                  dnnl_primitive_t *out) {
  kern_win g = {k->h, k->w, k->c, k->kh, k->kw, k->sh, k->sw,
                k->pt, k->pl, k->oh, k->ow};
  dnnl_memory_desc_t hwio;
  dnnl_primitive_desc_t pd;
  dnnl_status_t s = kernel_md(&hwio, &g, k->f, dnnl_hwio);
  if (s) return s;
  if (k->kind == D_BWD_W)
    s = dnnl_reorder_primitive_desc_create(&pd, wmd, d->eng, &hwio, d->eng,
                                           NULL);
  else
    s = dnnl_reorder_primitive_desc_create(&pd, &hwio, d->eng, wmd, d->eng,
                                           NULL);
  if (s) return s;
  s = dnnl_primitive_create(out, pd);
  dnnl_primitive_desc_destroy(pd);
  return s;
}

/* The cached entry for k, made when missing (fixed: see make_pd). */
static dnnl_status_t entry(struct kern__dnnl *d, const prim_key *k,
                           const dnnl_memory_desc_t *fixed,
                           const prim_ent **out) {
  for (int i = 0; i < d->n_cache; i++)
    if (!memcmp(&d->cache[i].key, k, sizeof *k)) {
      *out = &d->cache[i];
      return dnnl_success;
    }
  if (d->n_cache == CACHE_MAX) return dnnl_out_of_memory;
  prim_ent e;
  memset(&e, 0, sizeof e);
  e.key = *k;
  dnnl_primitive_desc_t pd;
  dnnl_status_t s = make_pd(d, k, fixed, &pd);
  if (s) return s;
  e.wmd = *dnnl_primitive_desc_query_md(
      pd, k->kind == D_BWD_W ? dnnl_query_diff_weights_md
                             : dnnl_query_weights_md, 0);
  e.spmd = *dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
  s = dnnl_primitive_create(&e.prim, pd);
  dnnl_primitive_desc_destroy(pd);
  if (s) return s;
  if (!k->main_mb && (s = make_reorder(d, k, &e.wmd, &e.reorder))) {
    dnnl_primitive_destroy(e.prim);
    return s;
  }
  d->cache[d->n_cache] = e;
  *out = &d->cache[d->n_cache++];
  return dnnl_success;
}

/* ---- running over the pool --------------------------------------------- */

typedef struct {
  struct kern__dnnl *d;
  int kind;
  const prim_ent *main, *last;
  int64_t n, mb, isz, osz, f, wsz;
  const float *x, *dy, *bias;
  float *y, *dx, *tmp;
  void *wb;                 /* the kernel in wmd */
  float *pw, *pb;           /* kernel gradient: partials [items][wsz], [f] */
  float beta;
  _Atomic int err;          /* the first dnnl_status_t that failed */
} conv_job;

static dnnl_status_t mem(conv_job *j, dnnl_memory_t *m,
                         const dnnl_memory_desc_t *md, const void *p) {
  return dnnl_memory_create(m, md, j->d->eng, (void *)p);
}

static void conv_item(void *a, int64_t i, int tid) {
  conv_job *j = a;
  struct kern__dnnl *d = j->d;
  one_thread();
  int64_t b0 = i * j->mb, cnt = j->n - b0 < j->mb ? j->n - b0 : j->mb;
  const prim_ent *e = cnt == j->mb ? j->main : j->last;
  const prim_key *k = &e->key;
  dnnl_memory_desc_t imd, omd, bmd;
  dnnl_dims_t bdims = {j->f};
  dnnl_memory_t m[5] = {NULL, NULL, NULL, NULL, NULL};
  dnnl_exec_arg_t args[5];
  int na = 0;
  bool add = j->kind == D_BWD_DATA && j->beta != 0.0f;
  float *dst_x = add ? j->tmp : j->dx;
  dnnl_status_t s;
  if ((s = act_md(&imd, cnt, k->c, k->h, k->w)) ||
      (s = act_md(&omd, cnt, k->f, k->oh, k->ow)) ||
      (s = dnnl_memory_desc_init_by_tag(&bmd, 1, bdims, dnnl_f32, dnnl_x)))
    goto out;
#define ARG(id, md, p)                                  \
  do {                                                  \
    if ((s = mem(j, &m[na], (md), (p)))) goto out;      \
    args[na] = (dnnl_exec_arg_t){(id), m[na]};          \
    na++;                                               \
  } while (0)
  switch (j->kind) {
    case D_FWD:
      ARG(DNNL_ARG_SRC, &imd, j->x + b0 * j->isz);
      ARG(DNNL_ARG_WEIGHTS, &e->wmd, j->wb);
      if (j->bias) ARG(DNNL_ARG_BIAS, &bmd, j->bias);
      ARG(DNNL_ARG_DST, &omd, j->y + b0 * j->osz);
      break;
    case D_BWD_DATA:
      ARG(DNNL_ARG_DIFF_DST, &omd, j->dy + b0 * j->osz);
      ARG(DNNL_ARG_WEIGHTS, &e->wmd, j->wb);
      ARG(DNNL_ARG_DIFF_SRC, &imd, dst_x + b0 * j->isz);
      break;
    default:
      ARG(DNNL_ARG_SRC, &imd, j->x + b0 * j->isz);
      ARG(DNNL_ARG_DIFF_DST, &omd, j->dy + b0 * j->osz);
      ARG(DNNL_ARG_DIFF_WEIGHTS, &e->wmd, j->pw + i * j->wsz);
      if (j->pb) ARG(DNNL_ARG_DIFF_BIAS, &bmd, j->pb + i * j->f);
      break;
  }
  if (dnnl_memory_desc_get_size(&e->spmd) > 0)
    ARG(DNNL_ARG_SCRATCHPAD, &e->spmd, d->sp[tid]);
#undef ARG
  if ((s = dnnl_primitive_execute(e->prim, d->st[tid], na, args)) ||
      (s = dnnl_stream_wait(d->st[tid])))
    goto out;
  if (add) {
    float *o = j->dx + b0 * j->isz;
    const float *t = j->tmp + b0 * j->isz;
    for (int64_t q = 0; q < cnt * j->isz; q++) o[q] += t[q];
  }
out:
  for (int q = 0; q < na; q++) dnnl_memory_destroy(m[q]);
  if (s) {
    int none = 0;
    atomic_compare_exchange_strong(&j->err, &none, (int)s);
  }
}

/* Examples per item: a power of two from the work of one example. */
static int64_t item_mb(const kern_win *g, int64_t f, int64_t n) {
  int64_t macs = g->oh * g->ow * f * kern_win_patch(g);
  int64_t mb = 1;
  while (mb * 2 * macs <= ITEM_MACS && mb * 2 <= n) mb *= 2;
  return mb;
}

/* The job's primitives for n examples, and the scratchpads they need. */
static int prepare(kern__cpu *c, conv_job *j, const kern_win *g, int64_t n,
                   int64_t f, bool bias, bool relu) {
  struct kern__dnnl *d = c->dnnl;
  one_thread();
  prim_key k = {j->kind, g->h, g->w, g->c, g->kh, g->kw, g->sh, g->sw,
                 g->pt, g->pl, g->oh, g->ow, f, j->mb, 0, bias, relu};
  dnnl_status_t s = entry(d, &k, NULL, &j->main);
  if (s == dnnl_out_of_memory && d->n_cache == CACHE_MAX) {
    drop_cache(d);
    s = entry(d, &k, NULL, &j->main);
  }
  if (s) return fail(c, s, j->kind, g, f, j->mb, "cannot make the primitive");
  j->last = j->main;
  if (n % j->mb) {
    k.main_mb = j->mb;
    k.mb = n % j->mb;
    if (d->n_cache == CACHE_MAX) {
      drop_cache(d);
      return prepare(c, j, g, n, f, bias, relu);
    }
    if ((s = entry(d, &k, &j->main->wmd, &j->last)))
      return fail(c, s, j->kind, g, f, k.mb, "cannot make the primitive");
  }
  size_t need = dnnl_memory_desc_get_size(&j->main->spmd);
  size_t need2 = dnnl_memory_desc_get_size(&j->last->spmd);
  if (need2 > need) need = need2;
  for (int t = 0; t < d->threads; t++)
    if (d->sp_n[t] < need) {
      free(d->sp[t]);
      d->sp_n[t] = 0;
      if (posix_memalign(&d->sp[t], 64, need)) {
        d->sp[t] = NULL;
        return kern__cpu_fail(c, TSR_ENOMEM, "oneDNN convolution: no "
                              "memory for a %zu-byte scratchpad", need);
      }
      d->sp_n[t] = need;
    }
  j->d = d;
  j->n = n;
  j->f = f;
  j->isz = g->h * g->w * g->c;
  j->osz = g->oh * g->ow * f;
  atomic_init(&j->err, 0);
  return 0;
}

static int reorder(kern__cpu *c, conv_job *j, const void *from, void *to,
                   const kern_win *g) {
  struct kern__dnnl *d = c->dnnl;
  dnnl_memory_desc_t hwio;
  dnnl_memory_t a = NULL, b = NULL;
  bool to_hwio = j->kind == D_BWD_W;
  dnnl_status_t s = kernel_md(&hwio, g, j->f, dnnl_hwio);
  if (!s) s = dnnl_memory_create(&a, to_hwio ? &j->main->wmd : &hwio,
                                 d->eng, (void *)from);
  if (!s) s = dnnl_memory_create(&b, to_hwio ? &hwio : &j->main->wmd,
                                 d->eng, to);
  if (!s) {
    dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, a}, {DNNL_ARG_TO, b}};
    s = dnnl_primitive_execute(j->main->reorder, d->st[0], 2, args);
  }
  if (!s) s = dnnl_stream_wait(d->st[0]);
  if (a) dnnl_memory_destroy(a);
  if (b) dnnl_memory_destroy(b);
  return s ? fail(c, s, j->kind, g, j->f, j->mb, "kernel reorder") : 0;
}

static int run(kern__cpu *c, conv_job *j, const kern_win *g) {
  kern__pool_run(c->pool, (j->n + j->mb - 1) / j->mb, conv_item, j);
  int s = atomic_load(&j->err);
  return s ? fail(c, (dnnl_status_t)s, j->kind, g, j->f, j->mb, "execute")
           : 0;
}

/* The kernel in the main primitive's layout (scratch slot 3). */
static int kernel_in(kern__cpu *c, conv_job *j, const kern_win *g,
                     const float *w) {
  size_t bytes = dnnl_memory_desc_get_size(&j->main->wmd);
  if (!(j->wb = kern__cpu_scratch(c, 3, bytes / sizeof(float) + 1)))
    return kern__cpu_fail(c, TSR_ENOMEM, "oneDNN convolution: no memory "
                          "for the kernel (%zu bytes)", bytes);
  return reorder(c, j, w, j->wb, g);
}

int kern__dnnl_conv_fwd(void *impl, const kern_win *g, int64_t n, int64_t f,
                        const float *x, const float *w, const float *bias,
                        bool relu, float *y) {
  kern__cpu *c = impl;
  conv_job j = {.kind = D_FWD, .mb = item_mb(g, f, n), .x = x, .y = y,
                .bias = bias};
  int rc = prepare(c, &j, g, n, f, bias != NULL, relu);
  if (!rc) rc = kernel_in(c, &j, g, w);
  return rc ? rc : run(c, &j, g);
}

int kern__dnnl_conv_bwd_data(void *impl, const kern_win *g, int64_t n,
                             int64_t f, const float *dy, const float *w,
                             float beta, float *dx) {
  kern__cpu *c = impl;
  conv_job j = {.kind = D_BWD_DATA, .mb = item_mb(g, f, n), .dy = dy,
                .dx = dx, .beta = beta};
  int rc = prepare(c, &j, g, n, f, false, false);
  if (!rc) rc = kernel_in(c, &j, g, w);
  if (!rc && beta != 0.0f &&
      !(j.tmp = kern__cpu_scratch(c, 2, (size_t)(n * j.isz))))
    rc = kern__cpu_fail(c, TSR_ENOMEM, "oneDNN convolution: no memory for "
                        "an input gradient of %lld floats",
                        (long long)(n * j.isz));
  return rc ? rc : run(c, &j, g);
}

typedef struct {
  float *p;
  int64_t parts, len;
} sum_job;

/* p[0][t] = the sum of p[i][t] over the parts, in part order */
KERN__HOT static void sum_parts(void *a, int64_t t0, int64_t t1, int tid) {
  const sum_job *s = a;
  for (int64_t i = 1; i < s->parts; i++) {
    const float *q = s->p + i * s->len;
    for (int64_t t = t0; t < t1; t++) s->p[t] += q[t];
  }
}

int kern__dnnl_conv_bwd_filter(void *impl, const kern_win *g, int64_t n,
                               int64_t f, const float *x, const float *dy,
                               float *dw, float *db) {
  kern__cpu *c = impl;
  int64_t mb = item_mb(g, f, n);
  /* at most W_PARTS partial gradients, and at most W_PART_FLOATS */
  int64_t wfl = kern_win_patch(g) * f, cap = W_PART_FLOATS / wfl;
  if (cap > W_PARTS) cap = W_PARTS;
  if (cap < 1) cap = 1;
  while ((n + mb - 1) / mb > cap) mb *= 2;
  conv_job j = {.kind = D_BWD_W, .mb = mb, .x = x, .dy = dy};
  int rc = prepare(c, &j, g, n, f, db != NULL, false);
  if (rc) return rc;
  int64_t parts = (n + mb - 1) / mb;
  j.wsz = (int64_t)(dnnl_memory_desc_get_size(&j.main->wmd) / sizeof(float));
  j.wsz = (j.wsz + 15) / 16 * 16;
  if (!(j.pw = kern__cpu_scratch(c, 2, (size_t)(parts * (j.wsz + f)))))
    return kern__cpu_fail(c, TSR_ENOMEM, "oneDNN convolution: no memory for "
                          "%lld partial kernel gradients",
                          (long long)parts);
  if (db) j.pb = j.pw + parts * j.wsz;
  if ((rc = run(c, &j, g))) return rc;
  sum_job sw = {j.pw, parts, j.wsz};
  kern__cpu_par(c, j.wsz, 1 << 14, sum_parts, &sw);
  if (db) {
    for (int64_t t = 0; t < f; t++) db[t] = j.pb[t];
    for (int64_t i = 1; i < parts; i++)
      for (int64_t t = 0; t < f; t++) db[t] += j.pb[i * f + t];
  }
  return reorder(c, &j, j.pw, dw, g);
}
