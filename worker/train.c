/* The standalone trainer; see train.h.
 *
 * Variables live in host memory as full tables with their optimizer slots.
 * A step: plan the batch (sorted unique ids per row-sparse variable), copy
 * those rows into staging buffers, run the replicas (threads, one per GPU,
 * each on its slice of the batch; gradients of the global mean loss summed
 * with NCCL), then apply the optimizer to the dense variables and, row by
 * row, to the touched rows of the sparse ones (lazy, as the PS applies
 * sparse pushes). Failure modes are the model's batch errors, device errors
 * and allocation failures, each with a message in `err`.
 */
#include "worker/train.h"
#include "worker/model_int.h"

#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"
#include "common/mem.h"
#include "kernels/optim.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WK_MAX_REPS 16

struct wk_trainer {
  const tsr_model *m;
  tsr_optim_spec opt;
  tsr_optim_spec *vopt;    /* per variable: the job's, or the moving average */
  uint64_t seed;
  tsr_precision prec;
  int *nslots;             /* per variable */
  float **w;               /* full tables */
  float ***slots;          /* [var][slot] full size */
  float **p, **g;          /* staging: params (sparse rows) and gradients */
  int64_t *pcap;
  int nrep;
  kern_ctx *ctx[WK_MAX_REPS];
  wk_exec *ex[WK_MAX_REPS];
  kern_ctx *plan_ctx;      /* CPU planner of the whole batch (nrep > 1) */
  wk_exec *plan;
  int64_t step;            /* applied steps */
  int64_t skipped;
  int64_t runs;            /* all steps, for dropout seeds */
  float loss_scale;
  int good_steps;
};

static kern_prec to_kprec(tsr_precision p) {
  return p == TSR_PREC_BF16 ? KERN_BF16 : p == TSR_PREC_FP16 ? KERN_F16
                                                             : KERN_F32;
}

int wk_trainer_open(const tsr_model *m, const tsr_optim_spec *opt,
                    uint64_t seed, tsr_precision prec,
                    const wk_train_opts *o, int64_t batch, wk_trainer **out,
                    char *err, size_t errlen) {
  wk_train_opts dflt = {0};
  if (!o) o = &dflt;
  *out = NULL;
  wk_trainer *t = calloc(1, sizeof *t);
  if (!t) return TSR_ENOMEM;
  t->m = m;
  t->opt = *opt;
  t->seed = seed;
  t->prec = prec;
  t->loss_scale = prec == TSR_PREC_FP16 ? 32768.0f : 1.0f;
  int nv = m->n_vars, rc;
  t->vopt = calloc((size_t)nv, sizeof *t->vopt);
  t->nslots = calloc((size_t)nv, sizeof *t->nslots);
  if (!t->vopt || !t->nslots) goto nomem;
  t->w = calloc((size_t)nv, sizeof *t->w);
  t->slots = calloc((size_t)nv, sizeof *t->slots);
  t->p = calloc((size_t)nv, sizeof *t->p);
  t->g = calloc((size_t)nv, sizeof *t->g);
  t->pcap = calloc((size_t)nv, sizeof *t->pcap);
  if (!t->w || !t->slots || !t->p || !t->g || !t->pcap) goto nomem;
  for (int v = 0; v < nv; v++) {
    const tsr_var *vi = &m->vars[v];
    if (!(t->w[v] = malloc((size_t)vi->numel * sizeof(float)))) goto nomem;
    tsr_model_init_var(m, v, seed, 0, t->w[v], (size_t)vi->numel);
    if (!(t->slots[v] = calloc(KERN_OPTIM_MAX_SLOTS, sizeof(float *))))
      goto nomem;
    tsr_var_optimizer(vi, opt, &t->vopt[v]);
    t->nslots[v] = kern_optim_num_slots(&t->vopt[v]);
    for (int s = 0; s < t->nslots[v]; s++)
      if (!(t->slots[v][s] = malloc((size_t)vi->numel * sizeof(float))))
        goto nomem;
    kern_optim_init_slots(&t->vopt[v], t->slots[v], (size_t)vi->numel);
    if (vi->kind == TSR_VAR_DENSE) {
      t->p[v] = t->w[v];
      if (!(t->g[v] = malloc((size_t)vi->numel * sizeof(float)))) goto nomem;
    }
  }
  /* replicas */
  kern_opts ko = {.device = o->device, .cpu_threads = o->cpu_threads};
  int ngpu = 0;
  if (o->device != KERN_DEVICE_CPU) {
    char why[256];
    kern_gpu_count(&ko, &ngpu, why, sizeof why);
  }
  t->nrep = 1;
  if (ngpu > 1 && o->device != KERN_DEVICE_CPU) {
    t->nrep = o->max_gpus > 0 && o->max_gpus < ngpu ? o->max_gpus : ngpu;
    if (t->nrep > WK_MAX_REPS) t->nrep = WK_MAX_REPS;
    if (t->nrep > batch) t->nrep = (int)batch;
  }
  int64_t per = (batch + t->nrep - 1) / t->nrep;
  for (int r = 0; r < t->nrep; r++) {
    ko.gpu_index = r;
    if ((rc = kern_open(&ko, &t->ctx[r], err, errlen))) goto fail;
    if ((rc = wk_exec_open(m, t->ctx[r], per, to_kprec(prec), &t->ex[r], err,
                           errlen)))
      goto fail;
  }
  if (t->nrep > 1) {
    kern_opts co = {.device = KERN_DEVICE_CPU, .cpu_threads = o->cpu_threads};
    if ((rc = kern_open(&co, &t->plan_ctx, err, errlen)) ||
        (rc = wk_exec_open(m, t->plan_ctx, batch, KERN_F32, &t->plan, err,
                           errlen)))
      goto fail;
  }
  *out = t;
  return 0;
nomem:
  rc = tsr_errf(err, errlen, TSR_ENOMEM,
                "out of memory for the model's variables");
fail:
  wk_trainer_close(t);
  return rc;
}

void wk_trainer_close(wk_trainer *t) {
  if (!t) return;
  for (int r = 0; r < WK_MAX_REPS; r++) {
    wk_exec_close(t->ex[r]);
    kern_close(t->ctx[r]);
  }
  wk_exec_close(t->plan);
  kern_close(t->plan_ctx);
  for (int v = 0; t->w && v < t->m->n_vars; v++) {
    bool dense = t->m->vars[v].kind == TSR_VAR_DENSE;
    if (!dense) free(t->p[v]);
    free(t->g[v]);
    free(t->w[v]);
    for (int s = 0; t->slots[v] && s < t->nslots[v]; s++)
      free(t->slots[v][s]);
    free(t->slots[v]);
  }
  TSR_FREE_ALL(t->vopt, t->nslots, t->w, t->slots, t->p, t->g, t->pcap, t);
}

/* Copies the rows the batch touches into the staging buffers. */
static int stage_rows(wk_trainer *t, const wk_exec *planner) {
  for (int v = 0; v < t->m->n_vars; v++) {
    const tsr_var *vi = &t->m->vars[v];
    if (vi->kind == TSR_VAR_DENSE) continue;
    const int64_t *ids;
    int64_t n;
    wk_exec_rows(planner, v, &ids, &n);
    int64_t need = (n > 0 ? n : 1) * vi->row_dim;
    if (need > t->pcap[v]) {
      free(t->p[v]);
      free(t->g[v]);
      t->p[v] = malloc((size_t)need * 2 * sizeof(float));
      t->g[v] = malloc((size_t)need * 2 * sizeof(float));
      if (!t->p[v] || !t->g[v]) {
        t->pcap[v] = 0;
        return TSR_ENOMEM;
      }
      t->pcap[v] = need * 2;
    }
    for (int64_t u = 0; u < n; u++)
      memcpy(t->p[v] + u * vi->row_dim, t->w[v] + ids[u] * vi->row_dim,
             (size_t)vi->row_dim * sizeof(float));
  }
  return 0;
}

typedef struct {
  wk_trainer *t;
  int r;
  wk_run_opts o;
  wk_run_result res;
  int rc;
} wk_rep_job;

static void *rep_main(void *arg) {
  wk_rep_job *j = arg;
  j->rc = wk_exec_run(j->t->ex[j->r], j->t->p, j->t->g, &j->o, &j->res);
  return NULL;
}

/* Prepares every replica's slice and runs them; loss_sum over the batch. */
static int run_replicas(wk_trainer *t, const wk_batch *b, bool train,
                        double *loss_sum, wk_run_result *res0, char *err,
                        size_t errlen) {
  int rc;
  int64_t n = b->n;
  int nr = t->nrep < n ? t->nrep : (int)n;
  const wk_exec *global = NULL;
  if (nr > 1 || t->nrep > 1) {
    if ((rc = wk_exec_prepare(t->plan, b, 0, n, NULL, err, errlen))) return rc;
    global = t->plan;
  }
  int64_t lo = 0;
  for (int r = 0; r < nr; r++) {
    int64_t hi = lo + (n - lo) / (nr - r);
    if ((rc = wk_exec_prepare(t->ex[r], b, lo, hi, global, err, errlen)))
      return rc;
    lo = hi;
  }
  if ((rc = stage_rows(t, global ? global : t->ex[0])))
    return tsr_errf(err, errlen, rc, "out of memory staging embedding rows");
  wk_rep_job jobs[WK_MAX_REPS];
  pthread_t th[WK_MAX_REPS];
  for (int r = 0; r < nr; r++) {
    jobs[r].t = t;
    jobs[r].r = r;
    jobs[r].o = (wk_run_opts){
        .train = train,
        .grad_scale = t->loss_scale / (float)n,
        .seed = t->seed * 0x9e3779b97f4a7c15ull + (uint64_t)t->runs,
        .keep_on_device = nr > 1};
    jobs[r].rc = 0;
  }
  if (nr == 1) {
    rep_main(&jobs[0]);
  } else {
    /* a replica whose thread cannot start runs here, after the others
     * are started (only started threads are joined) */
    bool started[WK_MAX_REPS];
    for (int r = 0; r < nr; r++)
      started[r] = pthread_create(&th[r], NULL, rep_main, &jobs[r]) == 0;
    for (int r = 0; r < nr; r++)
      if (!started[r]) rep_main(&jobs[r]);
    for (int r = 0; r < nr; r++)
      if (started[r]) pthread_join(th[r], NULL);
  }
  *loss_sum = 0;
  for (int r = 0; r < nr; r++) {
    if (jobs[r].rc) {
      const char *why = kern_last_error(t->ctx[r]);
      return tsr_errf(err, errlen, jobs[r].rc, "replica %d (%s): %s", r,
                      kern_backend_name(t->ctx[r]),
                      *why ? why : tsr_strerror(jobs[r].rc));
    }
    *loss_sum += jobs[r].res.loss_sum;
  }
  if (res0) *res0 = jobs[0].res;
  if (train && nr > 1) {
    if ((rc = wk_exec_allreduce(t->ex, nr)) ||
        (rc = wk_exec_fetch_grads(t->ex[0], t->g)))
      return tsr_errf(err, errlen, rc,
                      "gradient all-reduce over %d replicas: %s", nr,
                      *kern_last_error(t->ctx[0]) ? kern_last_error(t->ctx[0])
                                                  : tsr_strerror(rc));
  }
  return 0;
}

static bool host_finite(const float *x, int64_t n) {
  float acc = 0;
  for (int64_t i = 0; i < n; i++) acc += x[i] - x[i];
  return acc == 0.0f;
}

int wk_trainer_step(wk_trainer *t, const wk_batch *b, double *loss,
                    bool *applied, char *err, size_t errlen) {
  double ls = 0;
  int rc;
  t->runs++;
  if ((rc = run_replicas(t, b, true, &ls, NULL, err, errlen))) return rc;
  *loss = ls / (double)b->n;
  const tsr_model *m = t->m;
  const wk_exec *planner = t->nrep > 1 ? t->plan : t->ex[0];
  if (t->prec == TSR_PREC_FP16) {
    bool fin = true;
    for (int v = 0; v < m->n_vars && fin; v++) {
      const int64_t *ids;
      int64_t nr;
      wk_exec_rows(planner, v, &ids, &nr);
      int64_t ne = m->vars[v].kind == TSR_VAR_DENSE ? m->vars[v].numel
                                                   : nr * m->vars[v].row_dim;
      fin = host_finite(t->g[v], ne);
    }
    if (!fin) {
      t->loss_scale = t->loss_scale > 1.0f ? t->loss_scale * 0.5f : 1.0f;
      t->good_steps = 0;
      t->skipped++;
      *applied = false;
      return 0;
    }
  }
  float scale = 1.0f / t->loss_scale;
  if (t->opt.clipnorm > 0 || t->opt.global_clipnorm > 0) {
    /* as the distributed worker clips before its push */
    float *gs[256];
    size_t ns[256];
    if (m->n_vars > 256)
      return tsr_errf(err, errlen, TSR_ERANGE,
                      "clipping: more than 256 variables");
    for (int v = 0; v < m->n_vars; v++) {
      const int64_t *ids;
      int64_t nr;
      wk_exec_rows(planner, v, &ids, &nr);
      gs[v] = t->g[v];
      ns[v] = (size_t)(m->vars[v].kind == TSR_VAR_DENSE
                           ? m->vars[v].numel
                           : nr * m->vars[v].row_dim);
    }
    kern_optim_clip_norm(&t->opt, gs, ns, m->n_vars, scale);
  }
  int64_t step = ++t->step;
  for (int v = 0; v < m->n_vars; v++) {
    const tsr_var *vi = &m->vars[v];
    if (vi->kind == TSR_VAR_DENSE) {
      kern_optim_apply(&t->vopt[v], step, t->w[v], t->g[v], scale,
                       t->slots[v], (size_t)vi->numel);
      continue;
    }
    const int64_t *ids;
    int64_t nr;
    wk_exec_rows(planner, v, &ids, &nr);
    for (int64_t u = 0; u < nr; u++) {
      int64_t off = ids[u] * vi->row_dim;
      float *sl[KERN_OPTIM_MAX_SLOTS];
      for (int s = 0; s < t->nslots[v]; s++) sl[s] = t->slots[v][s] + off;
      kern_optim_apply(&t->vopt[v], step, t->w[v] + off,
                       t->g[v] + u * vi->row_dim, scale, sl,
                       (size_t)vi->row_dim);
    }
  }
  if (t->prec == TSR_PREC_FP16 && ++t->good_steps >= 2000) {
    t->loss_scale *= 2.0f;
    t->good_steps = 0;
  }
  *applied = true;
  return 0;
}

int wk_trainer_eval(wk_trainer *t, const wk_batch *b, wk_metrics *mt,
                    char *err, size_t errlen) {
  return wk_trainer_predict(t, b, mt, NULL, NULL, err, errlen);
}

int wk_trainer_predict(wk_trainer *t, const wk_batch *b, wk_metrics *mt,
                       wk_output_fn on_out, void *out_data, char *err,
                       size_t errlen) {
  const tsr_model *m = t->m;
  int64_t n = b->n, per = (n + t->nrep - 1) / t->nrep;
  /* evaluate in replica-sized chunks on replica 0 (no gradients) */
  for (int64_t lo = 0; lo < n; lo += per) {
    int64_t hi = lo + per < n ? lo + per : n;
    int rc;
    if ((rc = wk_exec_prepare(t->ex[0], b, lo, hi, NULL, err, errlen)))
      return rc;
    if ((rc = stage_rows(t, t->ex[0])))
      return tsr_errf(err, errlen, rc, "out of memory staging embedding rows");
    wk_run_opts o = {.train = false, .grad_scale = 1.0f};
    wk_run_result res;
    if ((rc = wk_exec_run(t->ex[0], t->p, NULL, &o, &res)))
      return tsr_errf(err, errlen, rc,
                      "evaluation on %s: %s", kern_backend_name(t->ctx[0]),
                      *kern_last_error(t->ctx[0]) ? kern_last_error(t->ctx[0])
                                                  : tsr_strerror(rc));
    if (mt && (rc = wk_metrics_add(mt, res.pred, res.labels, res.n,
                                   res.loss_sum)))
      return tsr_errf(err, errlen, rc, "out of memory for metrics");
    if (on_out &&
        (rc = on_out(out_data, res.pred, res.n, m->out_dim, err, errlen)))
      return rc;
  }
  return 0;
}

float *wk_trainer_var(wk_trainer *t, int v) { return t->w[v]; }
float wk_trainer_loss_scale(const wk_trainer *t) { return t->loss_scale; }
int64_t wk_trainer_steps(const wk_trainer *t) { return t->step; }
int64_t wk_trainer_skipped(const wk_trainer *t) { return t->skipped; }
int wk_trainer_replicas(const wk_trainer *t) { return t->nrep; }
const char *wk_trainer_backend(const wk_trainer *t) {
  return kern_backend_name(t->ctx[0]);
}
int wk_trainer_threads(const wk_trainer *t) { return kern_threads(t->ctx[0]); }
const char *wk_trainer_conv_impl(const wk_trainer *t) {
  return kern_conv_impl(t->ctx[0]);
}
