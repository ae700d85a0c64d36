/* Running a model on one compute context: device memory per node, batch
 * checks, the sparse row plan (ids sorted and de-duplicated per variable,
 * with the inverse lists the scatter-add needs), the loss and the
 * regularization loss; the nodes' forward and backward are model_nodes.c.
 *
 * Happy path: prepare() validates the slice on the host and builds the
 * plan; run() uploads parameters (nothing on the CPU: they are read in
 * place), runs the nodes and the loss, and writes gradients into the
 * caller's buffers (on the CPU directly, on a GPU by one download per
 * variable, or not at all when replicas reduce them first).
 * Failure modes: NaN/inf in features or labels, a class label out of range,
 * a sparse id outside its vocabulary (each error names the batch, the
 * example and the column or feature); device allocation failures.
 */
#include "worker/model_int.h"

#include "common/err.h"
#include "common/mem.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

kern_ctx *wk_exec_ctx(const wk_exec *e) { return e->ctx; }

static float *dalloc(wk_exec *e, int64_t n) {
  return kern_alloc(e->ctx, (size_t)(n > 0 ? n : 1) * sizeof(float));
}

/* Where each variable's gradient is final in a backward pass: the last
 * node (lowest index) whose backward writes it; row-sparse tables after
 * the scatters; regularized variables after the regularizers add theirs.
 * A variable no node writes is announced at the end of the run. */
static void ready_points(wk_exec *e) {
  const tsr_model *m = e->m;
  for (int v = 0; v < m->n_vars; v++)
    e->ready_at[v] = m->vars[v].kind == TSR_VAR_ROW_SPARSE ? WK_READY_SCATTER
                                                          : WK_READY_END;
  for (int k = m->n_layers - 1; k >= 0; k--) {
    const wk_layer *l = &m->layers[k];
    if (!l->needs_grad) continue;
    int vs[12];
    int nvs = tsr_model__node_vars(l, vs);
    for (int i = 0; i < nvs; i++)
      if (vs[i] >= 0 && m->vars[vs[i]].kind == TSR_VAR_DENSE)
        e->ready_at[vs[i]] = k;
  }
  for (int v = 0; v < m->n_vars; v++)
    if (m->vars[v].l1 > 0 || m->vars[v].l2 > 0) e->ready_at[v] = WK_READY_REG;
}

int wk_exec__need(wk_exec *e, const wk_run_opts *o, int v) {
  return e->host && o->param_need && v >= 0 ? o->param_need(o->hook_arg, v)
                                            : 0;
}

void wk_exec__done(wk_exec *e, const wk_run_opts *o, int k) {
  if (!e->host || !o->grad_ready) return;
  for (int v = 0; v < e->m->n_vars; v++)
    if (e->ready_at[v] == k && !e->readied[v]) {
      e->readied[v] = true;
      o->grad_ready(o->hook_arg, v);
    }
}

int wk_exec_open(const tsr_model *m, kern_ctx *ctx, int64_t maxb,
                 kern_prec prec, wk_exec **out, char *err, size_t errlen) {
  *out = NULL;
  if (maxb < 1) return tsr_errf(err, errlen, TSR_EINVAL,
                                "batch size must be >= 1");
  wk_exec *e = calloc(1, sizeof *e);
  if (!e) return TSR_ENOMEM;
  e->m = m;
  e->ctx = ctx;
  e->host = kern_is_host(ctx);
  e->maxb = maxb;
  e->prec = prec;
  e->lab_w = m->onehot_labels ? m->out_dim : 1;
  int64_t maxw = 1, maxu = 1, scratch = 0, maskw = 0;
  for (int k = 0; k < m->n_layers; k++) {
    const wk_layer *l = &m->layers[k];
    if (l->size > maxw) maxw = l->size;
    if (l->kind == WK_L_RNN && l->units > maxu) maxu = l->units;
    int64_t wsn, sc;
    wk_exec__seq_sizes(m, l, maxb, &wsn, &sc);
    if (sc > scratch) scratch = sc;
    if (l->mask_zero && l->dim[0] > maskw) maskw = l->dim[0];
    if (l->kind == WK_L_INPUT && !l->ids) e->x_float = true;
  }
  e->hlab = malloc((size_t)(maxb * e->lab_w) * sizeof(float));
  e->hpred = malloc((size_t)(maxb * m->out_dim) * sizeof(float));
  e->hloss = malloc((size_t)maxb * sizeof(float));
  e->dp = calloc((size_t)m->n_vars, sizeof *e->dp);
  e->dg = calloc((size_t)m->n_vars, sizeof *e->dg);
  e->dcap = calloc((size_t)m->n_vars, sizeof *e->dcap);
  e->ready_at = calloc((size_t)m->n_vars + 1, sizeof *e->ready_at);
  e->readied = calloc((size_t)m->n_vars + 1, sizeof *e->readied);
  if (!e->hlab || !e->hpred || !e->hloss || !e->dp || !e->dg || !e->dcap ||
      !e->ready_at || !e->readied)
    goto nomem;
  ready_points(e);
  if (!e->host && e->x_float && m->n_dense > 0 &&
      !(e->x = dalloc(e, maxb * m->n_dense)))
    goto nomem;
  if (!e->host && !(e->lab = dalloc(e, maxb * e->lab_w))) goto nomem;
  if (!(e->exl = dalloc(e, maxb)) || !(e->acc = dalloc(e, maxb * maxw)) ||
      !(e->dz = dalloc(e, maxb * maxw)))
    goto nomem;
  if (scratch > 0 && !(e->seq_scratch = dalloc(e, scratch))) goto nomem;
  if (maskw > 0 && !(e->hmask = malloc((size_t)(maxb * maskw) *
                                       sizeof(float))))
    goto nomem;
  { /* zero initial states (and gradients) of recurrent nodes */
    float *z = calloc((size_t)(maxb * maxu), sizeof *z);
    if (!z || !(e->zeros = dalloc(e, maxb * maxu)) ||
        kern_upload(ctx, e->zeros, z, (size_t)(maxb * maxu) * sizeof *z)) {
      free(z);
      goto nomem;
    }
    free(z);
  }
  for (int k = 0; k < m->n_layers; k++) {
    const wk_layer *l = &m->layers[k];
    int64_t sz = maxb * l->size;
    bool direct = l->kind == WK_L_INPUT && l->x_off == 0 &&
                  l->size == m->n_dense;
    bool own = l->kind != WK_L_RESHAPE &&
               !(l->kind == WK_L_INPUT && (l->ids || direct));
    if (own) {
      if (!(e->y[k] = dalloc(e, sz))) goto nomem;
      e->own_y[k] = true;
    }
    /* a Conv2D's relu is fused into the convolution: no z */
    bool with_z = (l->kind == WK_L_DENSE || l->kind == WK_L_CONV2D) &&
                  l->act != KERN_ACT_LINEAR &&
                  !(l->kind == WK_L_CONV2D && l->act == KERN_ACT_RELU);
    if (with_z) {
      if (!(e->z[k] = dalloc(e, sz))) goto nomem;
      e->own_z[k] = true;
    } else {
      e->z[k] = e->y[k];
    }
    if (l->needs_grad && own && l->kind != WK_L_INPUT &&
        !(e->dy[k] = dalloc(e, sz)))
      goto nomem;
    if (l->kind == WK_L_DROPOUT && !(e->mask[k] = dalloc(e, sz))) goto nomem;
    if (l->kind == WK_L_POOL2D && l->pool == KERN_POOL2D_MAX &&
        !(e->arg[k] = kern_alloc(ctx, (size_t)sz * sizeof(int32_t))))
      goto nomem;
    if (l->kind == WK_L_BATCHNORM) {
      int64_t c = l->dim[l->rank - 1];
      if (!(e->st_a[k] = dalloc(e, c)) || !(e->st_b[k] = dalloc(e, c)))
        goto nomem;
    }
    int64_t wsn, sc;
    wk_exec__seq_sizes(m, l, maxb, &wsn, &sc);
    if (wsn > 0 && !(e->ws[k] = dalloc(e, wsn))) goto nomem;
    if (l->mask_zero && !(e->seqmask[k] = dalloc(e, maxb * l->dim[0])))
      goto nomem;
    if (l->kind == WK_L_LAYERNORM) {
      int64_t rows = maxb * (l->size / l->norm_w);
      if (!(e->st_a[k] = dalloc(e, rows)) || !(e->st_b[k] = dalloc(e, rows)))
        goto nomem;
    }
    if (l->kind == WK_L_CONV2D) {
      int64_t need = kern_conv2d_ws(e->ctx, &l->win, maxb,
                                    l->dim[l->rank - 1], e->prec);
      if (need > e->cols_n) e->cols_n = need;
    }
  }
  /* views share their root's memory */
  for (int k = 0; k < m->n_layers; k++) {
    int r = m->layers[k].root;
    if (r != k) {
      e->y[k] = e->z[k] = e->y[r];
      e->dy[k] = e->dy[r];
    }
  }
  if (e->cols_n > 0 && !(e->cols = dalloc(e, e->cols_n))) goto nomem;
  /* dense variables have fixed device buffers */
  for (int v = 0; v < m->n_vars; v++) {
    if (m->vars[v].kind != TSR_VAR_DENSE || e->host) continue;
    if (!(e->dp[v] = dalloc(e, m->vars[v].numel)) ||
        !(e->dg[v] = dalloc(e, m->vars[v].numel)))
      goto nomem;
    e->dcap[v] = m->vars[v].numel;
  }
  /* one plan per row-sparse variable */
  for (int i = 0; i < m->n_emb; i++) {
    int s;
    for (s = 0; s < e->n_sp; s++)
      if (e->sp[s].var == m->emb[i].var) break;
    if (s == e->n_sp) {
      wk_splan *p = &e->sp[e->n_sp++];
      p->var = m->emb[i].var;
      p->wide = m->emb[i].wide;
      p->dim = m->emb[i].dim;
      p->first_emb = i;
    }
  }
  *out = e;
  return 0;
nomem:
  wk_exec_close(e);
  return tsr_errf(err, errlen, TSR_ENOMEM, "out of %s memory for batch %lld",
                  kern_backend_name(ctx), (long long)maxb);
}

static void splan_free_dev(wk_exec *e, wk_splan *p) {
  if (e->host) return;
  kern_free(e->ctx, p->d_idx);
  kern_free(e->ctx, p->d_bag_off);
  kern_free(e->ctx, p->d_occ_off);
  kern_free(e->ctx, p->d_occ_bag);
  kern_free(e->ctx, p->d_occ_w);
}

void wk_exec_close(wk_exec *e) {
  if (!e) return;
  const tsr_model *m = e->m;
  kern_ctx *c = e->ctx;
  free(e->hlab);
  free(e->hpred);
  free(e->hloss);
  if (!e->host) {
    kern_free(c, e->x);
    kern_free(c, e->lab);
  }
  kern_free(c, e->exl);
  kern_free(c, e->acc);
  kern_free(c, e->dz);
  kern_free(c, e->cols);
  kern_free(c, e->seq_scratch);
  kern_free(c, e->zeros);
  free(e->hmask);
  for (int k = 0; k < m->n_layers; k++) {
    if (m->layers[k].root != k) continue;
    kern_free(c, e->ws[k]);
    kern_free(c, e->seqmask[k]);
    if (e->own_y[k]) kern_free(c, e->y[k]);
    if (e->own_z[k]) kern_free(c, e->z[k]);
    kern_free(c, e->dy[k]);
    kern_free(c, e->mask[k]);
    kern_free(c, e->arg[k]);
    kern_free(c, e->st_a[k]);
    kern_free(c, e->st_b[k]);
  }
  for (int v = 0; e->dp && v < m->n_vars; v++)
    if (!e->host) {
      kern_free(c, e->dp[v]);
      kern_free(c, e->dg[v]);
    }
  for (int s = 0; s < e->n_sp; s++) {
    wk_splan *p = &e->sp[s];
    splan_free_dev(e, p);
    TSR_FREE_ALL(p->uniq, p->pairs, p->pairs_tmp, p->idx, p->bag_off,
                 p->occ_off, p->occ_bag, p->occ_w);
  }
  TSR_FREE_ALL(e->dp, e->dg, e->dcap, e->ready_at, e->readied, e);
}

static int grow(void **p, int64_t *cap, int64_t need, size_t elem) {
  if (need <= *cap) return 0;
  int64_t nc = need + need / 2 + 16;
  void *np = realloc(*p, (size_t)nc * elem);
  if (!np) return TSR_ENOMEM;
  *p = np;
  *cap = nc;
  return 0;
}

/* Visits the ids of plan p for examples [lo, hi): fn(bag, id). Returns a
 * negative code from the visitor or from an invalid id. */
typedef int (*id_fn)(wk_splan *p, int64_t bag, int64_t id, void *arg);

static int visit_ids(wk_exec *e, wk_splan *p, const wk_batch *b, int64_t lo,
                     int64_t hi, id_fn fn, void *arg, char *err,
                     size_t errlen) {
  const tsr_model *m = e->m;
  int rc;
  for (int i = p->first_emb; i < m->n_emb; i++) {
    const wk_embed *em = &m->emb[i];
    if (em->var != p->var) continue;
    for (int64_t r = lo; r < hi; r++) {
      if (em->feature < 0) { /* Keras Embedding: ids are x columns */
        const wk_layer *src = &m->layers[m->layers[em->node].in[0]];
        for (int64_t c = 0; c < src->size; c++) {
          float v = b->x[r * b->n_dense + src->x_off + c];
          if (!(v >= 0 && v < (float)em->vocab) || v != floorf(v))
            return tsr_errf(err, errlen, TSR_ERANGE,
                            "batch %lld (epoch %lld) example %lld "
                            "column %lld: %g is not an id in [0, %lld) for '%s'",
                            (long long)b->index, (long long)b->epoch, (long long)r,
                            (long long)(src->x_off + c), (double)v,
                            (long long)em->vocab, m->vars[em->var].name);
          int64_t bag = em->per_id ? (r - lo) * src->size + c : r - lo;
          if ((rc = fn(p, bag, (int64_t)v, arg))) return rc;
        }
      } else {
        const int64_t *ids = b->ids[em->feature];
        const int64_t *off = b->offsets[em->feature];
        for (int64_t j = off[r]; j < off[r + 1]; j++) {
          if (ids[j] < 0 || ids[j] >= em->vocab)
            return tsr_errf(err, errlen, TSR_ERANGE,
                            "batch %lld (epoch %lld) example %lld "
                            "sparse feature %d: id %lld outside [0, %lld)",
                            (long long)b->index, (long long)b->epoch, (long long)r,
                            em->feature, (long long)ids[j], (long long)em->vocab);
          if ((rc = fn(p, r - lo, ids[j] + em->id_offset, arg))) return rc;
        }
      }
    }
  }
  return 0;
}

/* Appends the occurrence (bag, id) in visit order; bags arrive in order
 * (the bag index never decreases within a feature), so bag_off[bag + 1]
 * counts the bag's ids. */
static int collect_pair(wk_splan *p, int64_t bag, int64_t id, void *arg) {
  (void)arg;
  if (p->n_idx >= p->cap_pairs) {
    /* both buffers keep the same capacity (the sort swaps them) */
    int64_t cap = p->cap_pairs;
    if (grow((void **)&p->pairs, &cap, p->n_idx + 1, sizeof *p->pairs))
      return TSR_ENOMEM;
    void *t = realloc(p->pairs_tmp, (size_t)cap * sizeof *p->pairs_tmp);
    if (!t) return TSR_ENOMEM; /* pairs is larger: cap_pairs stays right */
    p->pairs_tmp = t;
    p->cap_pairs = cap;
  }
  p->pairs[p->n_idx].id = id;
  p->pairs[p->n_idx].at = p->n_idx;
  p->bag_off[bag + 1]++;
  p->n_idx++;
  return 0;
}

/* Sorts p->pairs[0, n_idx) by id, stable: LSD radix sort by 11-bit digits
 * (ids are >= 0; only the digits up to the largest id's are sorted, and a
 * digit every id shares is skipped). */
#define RADIX_BITS 11
static void sort_pairs(wk_splan *p) {
  int64_t n = p->n_idx;
  if (n < 2) return;
  struct wk_idpos *a = p->pairs, *t = p->pairs_tmp;
  if (n <= 32) { /* insertion sort: small slices */
    for (int64_t i = 1; i < n; i++) {
      struct wk_idpos v = a[i];
      int64_t j = i;
      for (; j > 0 && a[j - 1].id > v.id; j--) a[j] = a[j - 1];
      a[j] = v;
    }
    return;
  }
  uint64_t max = 0;
  for (int64_t i = 0; i < n; i++)
    if ((uint64_t)a[i].id > max) max = (uint64_t)a[i].id;
  static const int nb = 1 << RADIX_BITS;
  int64_t cnt[1 << RADIX_BITS];
  for (int shift = 0; shift < 64 && (max >> shift); shift += RADIX_BITS) {
    memset(cnt, 0, sizeof cnt);
    for (int64_t i = 0; i < n; i++)
      cnt[((uint64_t)a[i].id >> shift) & (uint64_t)(nb - 1)]++;
    if (cnt[((uint64_t)a[0].id >> shift) & (uint64_t)(nb - 1)] == n) continue;
    int64_t sum = 0;
    for (int d = 0; d < nb; d++) {
      int64_t c = cnt[d];
      cnt[d] = sum;
      sum += c;
    }
    for (int64_t i = 0; i < n; i++)
      t[cnt[((uint64_t)a[i].id >> shift) & (uint64_t)(nb - 1)]++] = a[i];
    struct wk_idpos *sw = a;
    a = t;
    t = sw;
  }
  p->pairs = a;
  p->pairs_tmp = t;
}

static int build_plan(wk_exec *e, wk_splan *p, const wk_batch *b, int64_t lo,
                      int64_t hi, const wk_exec *global, char *err,
                      size_t errlen) {
  const tsr_model *m = e->m;
  int rc;
  int64_t n = hi - lo;
  const wk_splan *g = NULL;
  if (global) {
    for (int s = 0; s < global->n_sp; s++)
      if (global->sp[s].var == p->var) g = &global->sp[s];
    if (!g) return TSR_EINVAL;
  }
  const wk_embed *em = &m->emb[p->first_emb];
  p->n_bags = em->per_id ? n * m->layers[em->node].dim[0] : n;
  if (grow((void **)&p->bag_off, &p->cap_bags, p->n_bags + 1,
           sizeof(int32_t)))
    return TSR_ENOMEM;
  memset(p->bag_off, 0, (size_t)(p->n_bags + 1) * sizeof(int32_t));
  p->n_idx = 0;
  if ((rc = visit_ids(e, p, b, lo, hi, collect_pair, NULL, err, errlen)))
    return rc;
  if (grow((void **)&p->idx, &p->cap_idx, p->n_idx, sizeof(int32_t)))
    return TSR_ENOMEM;
  /* sorted by id: the unique ids (or their places in the whole batch's
   * list, for a slice) and each occurrence's row index */
  sort_pairs(p);
  if (g) {
    if (grow((void **)&p->uniq, &p->cap_uniq, g->n_uniq, sizeof(int64_t)))
      return TSR_ENOMEM;
    memcpy(p->uniq, g->uniq, (size_t)g->n_uniq * sizeof(int64_t));
    p->n_uniq = g->n_uniq;
    int64_t u = 0;
    for (int64_t i = 0; i < p->n_idx; i++) {
      while (u < p->n_uniq && p->uniq[u] < p->pairs[i].id) u++;
      if (u == p->n_uniq || p->uniq[u] != p->pairs[i].id) return TSR_EINVAL;
      p->idx[p->pairs[i].at] = (int32_t)u;
    }
  } else {
    if (grow((void **)&p->uniq, &p->cap_uniq, p->n_idx, sizeof(int64_t)))
      return TSR_ENOMEM;
    int64_t k = 0;
    for (int64_t i = 0; i < p->n_idx; i++) {
      if (k == 0 || p->uniq[k - 1] != p->pairs[i].id)
        p->uniq[k++] = p->pairs[i].id;
      p->idx[p->pairs[i].at] = (int32_t)(k - 1);
    }
    p->n_uniq = k;
  }
  /* collect_pair counted per bag; the wide variable's features visit the same
   * bags feature by feature, so order the occurrences by bag */
  for (int64_t i = 0; i < p->n_bags; i++) p->bag_off[i + 1] += p->bag_off[i];
  if (p->wide && m->n_sparse > 1) {
    int32_t *tmp = malloc((size_t)(p->n_idx ? p->n_idx : 1) * sizeof *tmp);
    int32_t *fill = calloc((size_t)p->n_bags + 1, sizeof *fill);
    if (!tmp || !fill) {
      free(tmp);
      free(fill);
      return TSR_ENOMEM;
    }
    int64_t j = 0;
    for (int i = p->first_emb; i < m->n_emb; i++) {
      const wk_embed *w = &m->emb[i];
      if (w->var != p->var) continue;
      const int64_t *off = b->offsets[w->feature];
      for (int64_t r = lo; r < hi; r++)
        for (int64_t t = off[r]; t < off[r + 1]; t++, j++)
          tmp[p->bag_off[r - lo] + fill[r - lo]++] = p->idx[j];
    }
    memcpy(p->idx, tmp, (size_t)p->n_idx * sizeof *tmp);
    free(tmp);
    free(fill);
  }
  /* inverse lists for the scatter-add: counting sort by unique row */
  int64_t cu = p->n_uniq + 1, ci = p->n_idx;
  p->occ_off = realloc(p->occ_off, (size_t)(cu ? cu : 1) * sizeof(int32_t));
  p->occ_bag = realloc(p->occ_bag, (size_t)(ci ? ci : 1) * sizeof(int32_t));
  p->occ_w = realloc(p->occ_w, (size_t)(ci ? ci : 1) * sizeof(float));
  if (!p->occ_off || !p->occ_bag || !p->occ_w) return TSR_ENOMEM;
  memset(p->occ_off, 0, (size_t)cu * sizeof(int32_t));
  for (int64_t j = 0; j < p->n_idx; j++) p->occ_off[p->idx[j] + 1]++;
  for (int64_t u = 0; u < p->n_uniq; u++) p->occ_off[u + 1] += p->occ_off[u];
  int32_t *pos = malloc((size_t)(cu ? cu : 1) * sizeof *pos);
  if (!pos) return TSR_ENOMEM;
  memcpy(pos, p->occ_off, (size_t)cu * sizeof *pos);
  for (int64_t bg = 0; bg < p->n_bags; bg++) {
    int32_t cnt = p->bag_off[bg + 1] - p->bag_off[bg];
    float w = em->pool == KERN_POOL_MEAN && cnt > 0 ? 1.0f / (float)cnt : 1.0f;
    for (int32_t j = p->bag_off[bg]; j < p->bag_off[bg + 1]; j++) {
      int32_t q = pos[p->idx[j]]++;
      p->occ_bag[q] = (int32_t)bg;
      p->occ_w[q] = w;
    }
  }
  free(pos);
  /* device copies */
  if (e->host) {
    p->d_idx = p->idx;
    p->d_bag_off = p->bag_off;
    p->d_occ_off = p->occ_off;
    p->d_occ_bag = p->occ_bag;
    p->d_occ_w = p->occ_w;
    return 0;
  }
  if (p->dcap_idx < p->n_idx + 1 || p->dcap_bags < p->n_bags + 1 ||
      p->dcap_uniq < p->n_uniq + 1) {
    splan_free_dev(e, p);
    p->dcap_idx = (p->n_idx + 1) * 2;
    p->dcap_bags = (p->n_bags + 1) * 2;
    p->dcap_uniq = (p->n_uniq + 1) * 2;
    size_t si = (size_t)p->dcap_idx * 4, sb = (size_t)p->dcap_bags * 4,
           su = (size_t)p->dcap_uniq * 4;
    p->d_idx = kern_alloc(e->ctx, si);
    p->d_bag_off = kern_alloc(e->ctx, sb);
    p->d_occ_off = kern_alloc(e->ctx, su);
    p->d_occ_bag = kern_alloc(e->ctx, si);
    p->d_occ_w = kern_alloc(e->ctx, si);
    if (!p->d_idx || !p->d_bag_off || !p->d_occ_off || !p->d_occ_bag ||
        !p->d_occ_w) {
      p->d_idx = p->d_occ_bag = p->d_bag_off = p->d_occ_off = NULL;
      p->d_occ_w = NULL;
      p->dcap_idx = p->dcap_bags = p->dcap_uniq = 0;
      return TSR_ENOMEM;
    }
  }
  if ((rc = kern_upload(e->ctx, p->d_idx, p->idx, (size_t)p->n_idx * 4)) ||
      (rc = kern_upload(e->ctx, p->d_bag_off, p->bag_off,
                        (size_t)(p->n_bags + 1) * 4)) ||
      (rc = kern_upload(e->ctx, p->d_occ_off, p->occ_off,
                        (size_t)(p->n_uniq + 1) * 4)) ||
      (rc = kern_upload(e->ctx, p->d_occ_bag, p->occ_bag,
                        (size_t)p->n_idx * 4)) ||
      (rc = kern_upload(e->ctx, p->d_occ_w, p->occ_w, (size_t)p->n_idx * 4)))
    return rc;
  return 0;
}

/* The masks of Embedding(mask_zero) layers: 1 where the id is not 0. */
static int seq_masks(wk_exec *e, const wk_batch *b, int64_t lo, int64_t hi) {
  const tsr_model *m = e->m;
  for (int k = 0; k < m->n_layers; k++) {
    const wk_layer *l = &m->layers[k];
    if (!l->mask_zero) continue;
    const wk_layer *src = &m->layers[l->in[0]];
    int64_t L = l->dim[0];
    float *h = e->host ? e->seqmask[k] : e->hmask;
    for (int64_t r = lo; r < hi; r++)
      for (int64_t t = 0; t < L; t++)
        h[(r - lo) * L + t] =
            b->x[r * b->n_dense + src->x_off + t] != 0.0f ? 1.0f : 0.0f;
    if (!e->host) {
      int rc = kern_upload(e->ctx, e->seqmask[k], h,
                           (size_t)((hi - lo) * L) * sizeof(float));
      if (rc) return rc;
    }
  }
  return 0;
}

int wk_exec_prepare(wk_exec *e, const wk_batch *b, int64_t lo, int64_t hi,
                    const wk_exec *global, char *err, size_t errlen) {
  const tsr_model *m = e->m;
  int64_t n = hi - lo;
  if (lo < 0 || hi > b->n || n < 1 || n > e->maxb)
    return tsr_errf(err, errlen, TSR_EINVAL,
                    "batch slice [%lld, %lld) of %lld examples "
                    "(max %lld)", (long long)lo, (long long)hi, (long long)b->n,
                    (long long)e->maxb);
  if (b->n_dense != m->n_dense && !(m->wide_deep && m->n_dense == 0))
    return tsr_errf(err, errlen, TSR_ESHAPE,
                    "shapes do not chain: the model's input takes "
                    "%lld feature(s), the batch has %lld", (long long)m->n_dense,
                    (long long)b->n_dense);
  if (m->n_sparse > b->n_sparse)
    return tsr_errf(err, errlen, TSR_ESHAPE,
                    "shapes do not chain: the model reads %d sparse "
                    "feature(s), the batch has %d", m->n_sparse, b->n_sparse);
  for (int64_t r = lo; r < hi; r++) {
    const float *xr = b->x + r * b->n_dense;
    for (int64_t c = 0; c < b->n_dense; c++)
      if (!isfinite(xr[c]))
        return tsr_errf(err, errlen, TSR_ENONFINITE,
                        "batch %lld (epoch %lld) example %lld: "
                        "feature column %lld is %s", (long long)b->index,
                        (long long)b->epoch, (long long)r, (long long)c,
                        isnan(xr[c]) ? "NaN" : "infinite");
    float y = b->y[r];
    if (!isfinite(y))
      return tsr_errf(err, errlen, TSR_ENONFINITE,
                      "batch %lld (epoch %lld) example %lld: the "
                      "label is %s", (long long)b->index, (long long)b->epoch,
                      (long long)r, isnan(y) ? "NaN" : "infinite");
    if ((m->loss == KERN_LOSS_BCE_LOGITS || m->loss == KERN_LOSS_BCE_PROBS) &&
        !(y >= 0 && y <= 1))
      return tsr_errf(err, errlen, TSR_ERANGE,
                      "batch %lld (epoch %lld) example %lld: label "
                      "%g is outside [0, 1], which binary cross-entropy needs",
                      (long long)b->index, (long long)b->epoch, (long long)r,
                      (double)y);
    if (m->class_labels &&
        (!(y >= 0 && y < (float)m->out_dim) || y != floorf(y)))
      return tsr_errf(err, errlen, TSR_ERANGE,
                      "batch %lld (epoch %lld) example %lld: label "
                      "%g is not a class in [0, %lld)", (long long)b->index,
                      (long long)b->epoch, (long long)r, (double)y,
                      (long long)m->out_dim);
  }
  e->b = b;
  e->lo = lo;
  e->n = n;
  if (m->onehot_labels) {
    memset(e->hlab, 0, (size_t)(n * e->lab_w) * sizeof(float));
    for (int64_t r = 0; r < n; r++)
      e->hlab[r * e->lab_w + (int64_t)b->y[lo + r]] = 1.0f;
  } else {
    memcpy(e->hlab, b->y + lo, (size_t)n * sizeof(float));
  }
  int rc;
  if ((rc = seq_masks(e, b, lo, hi)))
    return tsr_errf(err, errlen, rc, "upload of the sequence masks failed");
  for (int s = 0; s < e->n_sp; s++)
    if ((rc = build_plan(e, &e->sp[s], b, lo, hi, global, err, errlen)))
      return rc == TSR_ENOMEM ? tsr_errf(err, errlen, rc,
                                         "out of memory for the sparse ids")
                              : rc;
  if (e->host) {
    e->x = e->x_float ? (float *)(b->x + lo * b->n_dense) : NULL;
    e->lab = e->hlab;
  } else {
    if (e->x_float &&
        (rc = kern_upload(e->ctx, e->x, b->x + lo * b->n_dense,
                          (size_t)(n * m->n_dense) * sizeof(float))))
      return tsr_errf(err, errlen, rc, "upload of the batch failed");
    if ((rc = kern_upload(e->ctx, e->lab, e->hlab,
                          (size_t)(n * e->lab_w) * sizeof(float))))
      return tsr_errf(err, errlen, rc, "upload of the labels failed");
  }
  return 0;
}

int wk_exec_rows(const wk_exec *e, int v, const int64_t **ids, int64_t *n) {
  *ids = NULL;
  *n = 0;
  for (int s = 0; s < e->n_sp; s++)
    if (e->sp[s].var == v) {
      *ids = e->sp[s].uniq;
      *n = e->sp[s].n_uniq;
    }
  return 0;
}

static int64_t var_elems(const wk_exec *e, int v) {
  const tsr_var *vi = &e->m->vars[v];
  if (vi->kind == TSR_VAR_DENSE) return vi->numel;
  for (int s = 0; s < e->n_sp; s++)
    if (e->sp[s].var == v) return e->sp[s].n_uniq * vi->row_dim;
  return 0;
}

/* Points dp/dg at the parameters: the caller's on the CPU, uploaded
 * copies on a GPU (sparse buffers grown to the batch's rows). */
static int bind_params(wk_exec *e, float *const *params, float *const *grads,
                       bool resident, const wk_run_opts *o) {
  const tsr_model *m = e->m;
  int rc;
  for (int v = 0; v < m->n_vars; v++) {
    int64_t ne = var_elems(e, v);
    if (!e->host && o->param_need && (rc = o->param_need(o->hook_arg, v)))
      return rc;
    if (e->host) {
      e->dp[v] = params[v];
      e->dg[v] = grads ? grads[v] : NULL;
      continue;
    }
    bool fresh = false; /* a new buffer holds nothing yet */
    if (ne > e->dcap[v]) {
      fresh = true;
      kern_free(e->ctx, e->dp[v]);
      kern_free(e->ctx, e->dg[v]);
      int64_t cap = ne + ne / 2;
      e->dp[v] = dalloc(e, cap);
      e->dg[v] = dalloc(e, cap);
      if (!e->dp[v] || !e->dg[v]) {
        e->dcap[v] = 0;
        return TSR_ENOMEM;
      }
      e->dcap[v] = cap;
    }
    if (resident && !fresh) continue;
    if ((rc = kern_upload(e->ctx, e->dp[v], params[v],
                          (size_t)ne * sizeof(float))))
      return rc;
  }
  return 0;
}

#define CK(x) do { if ((rc = (x))) return rc; } while (0)

/* l1*sum|w| + l2*sum w^2 of every regularized variable, from the host
 * parameters (in float64). */
static double reg_loss(const tsr_model *m, float *const *params) {
  double t = 0;
  for (int v = 0; v < m->n_vars; v++) {
    const tsr_var *vi = &m->vars[v];
    if (!(vi->l1 > 0 || vi->l2 > 0)) continue;
    double a = 0, q = 0;
    for (int64_t i = 0; i < vi->numel; i++) {
      double w = params[v][i];
      a += fabs(w);
      q += w * w;
    }
    t += vi->l1 * a + vi->l2 * q;
  }
  return t;
}

int wk_exec_run(wk_exec *e, float *const *params, float *const *grads,
                const wk_run_opts *o, wk_run_result *r) {
  const tsr_model *m = e->m;
  int rc;
  if (!e->b) return TSR_EINVAL;
  if (o->train && !grads && !o->keep_on_device) return TSR_EINVAL;
  CK(bind_params(e, params, o->train ? grads : NULL, o->params_resident, o));
  memset(e->readied, 0, (size_t)m->n_vars * sizeof *e->readied);
  CK(wk_exec__forward(e, o));
  /* the penalty of the values this step computed with, before the hooks
   * let the next step's values land in them */
  e->reg = m->has_reg ? reg_loss(m, params) : 0;
  int last = m->n_layers - 1;
  const wk_layer *out = &m->layers[last];
  const float *pl = e->y[last];
  if (m->fused)
    pl = out->kind == WK_L_ACTIVATION ? e->y[m->layers[out->in[0]].root]
                                      : e->z[last];
  CK(kern_loss_eval_p(e->ctx, m->loss, m->loss_param, pl, e->lab, e->n,
                      m->out_dim, o->grad_scale, e->exl,
                      o->train ? e->dy[last] : NULL));
  if (o->train) CK(wk_exec__backward(e, o));
  CK(kern_download(e->ctx, e->hloss, e->exl, (size_t)e->n * sizeof(float)));
  CK(kern_download(e->ctx, e->hpred, e->y[last],
                   (size_t)(e->n * m->out_dim) * sizeof(float)));
  if (o->train && !o->keep_on_device && !e->host) {
    CK(wk_exec_fetch_grads(e, grads));
    for (int v = 0; o->grad_ready && v < m->n_vars; v++)
      o->grad_ready(o->hook_arg, v);
  }
  if (o->train) wk_exec__done(e, o, WK_READY_END);
  double s = 0;
  for (int64_t i = 0; i < e->n; i++) s += e->hloss[i];
  r->loss_sum = s + e->reg * (double)e->n;
  r->n = e->n;
  r->pred = e->hpred;
  r->labels = e->b->y + e->lo;
  return 0;
}

int wk_exec_fetch_grads(wk_exec *e, float *const *grads) {
  int rc;
  for (int v = 0; v < e->m->n_vars; v++) {
    if (e->host && grads[v] == e->dg[v]) continue;
    CK(kern_download(e->ctx, grads[v], e->dg[v],
                     (size_t)var_elems(e, v) * sizeof(float)));
  }
  return 0;
}

int wk_exec_allreduce(wk_exec *const *reps, int n) {
  if (n <= 1) return 0;
  kern_ctx *ctxs[64];
  float *bufs[64];
  if (n > 64) return TSR_ERANGE;
  int rc;
  for (int v = 0; v < reps[0]->m->n_vars; v++) {
    for (int r = 0; r < n; r++) {
      ctxs[r] = reps[r]->ctx;
      bufs[r] = reps[r]->dg[v];
    }
    CK(kern_allreduce_sum(ctxs, bufs, n, (size_t)var_elems(reps[0], v)));
  }
  return 0;
}
