/* Dense "allreduce" (hybrid training) on a worker: the dense variables
 * live here, identical on every worker of the ring, and only the sparse
 * tables on the PS.
 *
 * Happy path. Configure gives every dense variable its initial values
 * from the job's seed (the function of seed, name and element every
 * process uses, so every worker starts equal, and equal to the standalone
 * trainer) or from the job's initial_weights, its optimizer slots, and a
 * place in the fusion buffer of the gradient buckets (common/coll, fuse):
 * the backward pass writes each gradient there. A step: as the backward
 * pass makes a dense gradient final, its bucket is marked; a complete
 * bucket goes onto the ring at once (while the backward pass goes on).
 * The ring runs on while the training thread takes the next batch and
 * sends its sparse rows' pulls (a sync ring waits for its slowest member:
 * its wait then overlaps the round trips to the PS instead of adding to
 * them); then each bucket is waited for in order and the optimizer
 * (kernels/optim.c, the PS's own update rules) applied to its variables
 * with scale 1/N: the mean of the workers' gradients, as sync mode's PS
 * applies it. With clipnorm or global_clipnorm the whole mean gradient
 * comes first, right after the compute, is clipped, then applied.
 * Failure modes: dense variables that do not fit this worker's memory are
 * refused at configure with the bytes; a ring that cannot form fails the
 * configure naming the pair of workers (the collective's message); a step
 * that fails after posting part of its buckets aborts the ring, so every
 * other worker's step fails at once with this worker's reason.
 */
#include "worker/loop_run.h"

#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"
#include "common/mem.h"
#include "common/memlimit.h"
#include "kernels/kern_nccl.h"
#include "kernels/optim.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* How long a re-formed ring waits for its members. */
#define WK_RING_TIMEOUT_MS 10000

static bool dense_var(const wk_run *r, size_t v) {
  return r->vars[v].kind == TSR_VAR_DENSE;
}

uint64_t wk__hy_dense_bytes(const wk_run *r, const tsr_optim_spec *opt) {
  uint64_t b = 0;
  for (size_t v = 0; v < r->n_vars; v++) {
    if (!dense_var(r, v)) continue;
    tsr_optim_spec o;
    tsr_var_optimizer(&r->vars[v], opt, &o);
    /* values, gradients, slots */
    b += (uint64_t)r->vars[v].numel * sizeof(float) *
         (uint64_t)(2 + kern_optim_num_slots(&o));
  }
  return b;
}

int wk__hy_check_memory(const wk_run *r, uint64_t avail, const char *where,
                        char *err, size_t errlen) {
  uint64_t need = wk__hy_dense_bytes(r, &r->job.optimizer);
  if (need <= avail) return 0;
  return tsr_errf(err, errlen, TSR_EMEMLIMIT,
                  "dense \"allreduce\": the dense variables need %llu bytes "
                  "per worker (values, gradients, optimizer slots), this "
                  "worker has %llu: keep them on the PS (dense \"ps\") "
                  "[%s]",
                  (unsigned long long)need, (unsigned long long)avail, where);
}

void wk__hy_free(wk_run *r) {
  if (!r->hybrid) return;
  if (r->gpu_buf) kern_free(r->kc, r->gpu_buf);
  kern_nccl_close(r->nccl);
  r->gpu_buf = NULL;
  r->nccl = NULL;
  for (size_t v = 0; v < r->n_vars; v++) {
    if (!dense_var(r, v)) continue;
    /* the gradients are the fusion buffer's */
    if (r->grad) r->grad[v] = NULL;
    for (int k = 0; r->slots && r->slots[v] && k < KERN_OPTIM_MAX_SLOTS; k++)
      free(r->slots[v][k]);
    if (r->slots) free(r->slots[v]);
  }
  TSR_FREE_ALL(r->slots, r->vopt, r->nslots, r->dense_ix, r->dense_var,
               r->kv_var);
  tsr_coll_fuse_free(r->fuse);
  r->slots = NULL;
  r->fuse = NULL;
}

/* A raw float32 file of a variable's initial values (the chief's
 * initial_weights files). */
static int read_init(const char *path, float *dst, int64_t numel,
                     const char *name, char *err, size_t errlen) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return tsr_errf(err, errlen, TSR_EIO, "initial weights of %s: %s: cannot "
                    "open it", name, path);
  size_t got = fread(dst, sizeof(float), (size_t)numel, f);
  int extra = fgetc(f);
  fclose(f);
  if (got != (size_t)numel || extra != EOF)
    return tsr_errf(err, errlen, TSR_EFORMAT, "initial weights of %s: %s "
                    "does not hold %lld float32 values", name, path,
                    (long long)numel);
  return 0;
}

/* One collective op from the training thread, waited for. */
static int coll_do(wk_run *r, tsr_coll_req *q, char *err, size_t errlen) {
  tsr_coll_ticket t;
  int rc = tsr_coll_submit(r->coll, q, &t);
  if (rc) return tsr_errf(err, errlen, rc, "%s", tsr_strerror(rc));
  return tsr_coll_wait(r->coll, t, err, errlen);
}

/* GPU workers: NCCL among the ring's members when every one of them can
 * (they agree over the ring first: NCCL's setup blocks until all join),
 * its id made by rank 0 and broadcast over the ring. Not every member
 * able, or an id that cannot be made: the host ring, said in the log. */
static int nccl_setup(wk_run *r, int rank, char *err, size_t errlen) {
  char why[512] = "";
  float able = kern_nccl_available(r->kc, why, sizeof why) == 0 ? 1.0f : 0.0f;
  tsr_coll_req q = {.kind = TSR_COLL_ALLREDUCE, .buf = &able, .count = 1};
  int rc = coll_do(r, &q, err, errlen);
  if (rc) return rc;
  if (able < (float)r->group_size) {
    tsr_info("dense \"allreduce\": gradients on the host ring (%s)",
             why[0] ? why : "not every worker can use NCCL");
    return 0;
  }
  uint8_t idmsg[1 + KERN_NCCL_ID_BYTES] = {0};
  if (rank == 0 && kern_nccl_unique_id(r->kc, idmsg + 1, why, sizeof why) == 0)
    idmsg[0] = 1;
  q = (tsr_coll_req){.kind = TSR_COLL_BROADCAST, .buf = idmsg,
                     .count = sizeof idmsg, .root = 0};
  if ((rc = coll_do(r, &q, err, errlen))) return rc;
  if (!idmsg[0]) {
    tsr_info("dense \"allreduce\": gradients on the host ring (rank 0 "
             "could not make a NCCL id%s%s)", why[0] ? ": " : "", why);
    return 0;
  }
  size_t most = 0;
  for (int b = 0; b < tsr_coll_fuse_nbuckets(r->fuse); b++)
    if (tsr_coll_fuse_bucket_floats(r->fuse, b) > most)
      most = tsr_coll_fuse_bucket_floats(r->fuse, b);
  if ((rc = kern_nccl_open(r->kc, idmsg + 1, r->group_size, rank, &r->nccl,
                           err, errlen)))
    return rc;
  if (!(r->gpu_buf = kern_alloc(r->kc, (most ? most : 1) * sizeof(float))))
    return tsr_errf(err, errlen, TSR_ENOMEM, "dense \"allreduce\": no GPU "
                    "memory for a bucket of %zu floats", most);
  tsr_info("dense \"allreduce\": gradients through NCCL among %d GPUs",
           r->group_size);
  return 0;
}

int wk__hy_configure(wk_svc *s, wk_run *r,
                     const Tessera__Worker__ConfigureRequest *q, char *err,
                     size_t errlen) {
  size_t nv = r->n_vars;
  r->slots = calloc(nv, sizeof *r->slots);
  r->vopt = calloc(nv, sizeof *r->vopt);
  r->nslots = calloc(nv, sizeof *r->nslots);
  r->dense_ix = calloc(nv, sizeof *r->dense_ix);
  r->dense_var = calloc(nv ? nv : 1, sizeof *r->dense_var);
  size_t *counts = calloc(nv ? nv : 1, sizeof *counts);
  int nd = 0, rc = 0;
  if (!r->slots || !r->vopt || !r->nslots || !r->dense_ix || !r->dense_var ||
      !counts) {
    rc = tsr_errf(err, errlen, TSR_ENOMEM, "out of memory");
    goto out;
  }
  for (size_t v = 0; v < nv; v++) {
    r->dense_ix[v] = -1;
    if (!dense_var(r, v)) continue;
    const tsr_var *vi = &r->vars[v];
    r->dense_ix[v] = nd;
    r->dense_var[nd] = (int)v;
    counts[nd++] = (size_t)vi->numel;
    tsr_var_optimizer(vi, &r->job.optimizer, &r->vopt[v]);
    r->nslots[v] = kern_optim_num_slots(&r->vopt[v]);
    r->slots[v] = calloc(KERN_OPTIM_MAX_SLOTS, sizeof(float *));
    if (!r->slots[v] || !(r->param[v] = malloc((size_t)vi->numel *
                                                sizeof(float)))) {
      rc = tsr_errf(err, errlen, TSR_ENOMEM, "out of memory for %s (%lld "
                    "floats)", vi->name, (long long)vi->numel);
      goto out;
    }
    for (int k = 0; k < r->nslots[v]; k++)
      if (!(r->slots[v][k] = malloc((size_t)vi->numel * sizeof(float)))) {
        rc = tsr_errf(err, errlen, TSR_ENOMEM, "out of memory for the "
                      "optimizer slots of %s", vi->name);
        goto out;
      }
    kern_optim_init_slots(&r->vopt[v], r->slots[v], (size_t)vi->numel);
    const char *ip = v < q->n_init_paths ? q->init_paths[v] : NULL;
    if (ip && *ip) {
      if ((rc = read_init(ip, r->param[v], vi->numel, vi->name, err,
                          errlen)))
        goto out;
    } else {
      tsr_model_init_var(r->model, (int)v, r->job.seed, 0, r->param[v],
                         (size_t)vi->numel);
    }
  }
  /* dense gradients in buckets, in the order a backward pass makes them
   * final (the last layer first) */
  if ((rc = tsr_coll_fuse_new(&r->fuse, counts, NULL, nd,
                              (size_t)r->job.allreduce_bucket_bytes))) {
    tsr_errf(err, errlen, rc, "gradient buckets: %s", tsr_strerror(rc));
    goto out;
  }
  for (size_t v = 0; v < nv; v++)
    if (r->dense_ix[v] >= 0)
      r->grad[v] = tsr_coll_fuse_slot(r->fuse, r->dense_ix[v]);
  r->coll = s->coll;
  r->group_size = (int)q->n_group_addrs;
  r->group_epoch = q->group_epoch;
  if (!s->coll) {
    rc = tsr_errf(err, errlen, TSR_ESHUTDOWN, "no collective: shutting down");
    goto out;
  }
  if (q->group_epoch == 0) {
    /* configured while training goes on: the ring (and the dense state)
     * come with the first closure */
    r->group_size = 1;
    tsr_info("dense \"allreduce\": %d dense variable(s) here; the ring and "
             "the dense state come with the first closure", nd);
    goto out;
  }
  /* the ring of the workers */
  tsr_coll_group g = {.epoch = q->group_epoch,
                      .rank = (int)q->group_rank,
                      .nranks = (int)q->n_group_addrs,
                      .addrs = (const char *const *)q->group_addrs,
                      .names = q->n_group_names == q->n_group_addrs
                                   ? (const char *const *)q->group_names
                                   : NULL};
  if (g.nranks < 1 || g.rank >= g.nranks) {
    rc = tsr_errf(err, errlen, TSR_ECONFIG, "dense \"allreduce\": the chief "
                  "named no ring (%d workers, rank %d)", g.nranks, g.rank);
    goto out;
  }
  tsr_coll_ticket t;
  tsr_coll_req cq = {.kind = TSR_COLL_CONFIGURE, .group = &g};
  char cerr[TSR_COLL_ERR_MAX];
  if ((rc = tsr_coll_submit(s->coll, &cq, &t)) ||
      (rc = tsr_coll_wait(s->coll, t, cerr, sizeof cerr))) {
    tsr_errf(err, errlen, rc, "dense \"allreduce\": the ring of %d workers: "
             "%s", g.nranks, rc == TSR_ESHUTDOWN && !cerr[0]
                                 ? "shutting down" : cerr);
    goto out;
  }
  if (!kern_is_host(r->kc) && (rc = nccl_setup(r, g.rank, err, errlen)))
    goto out;
  double mb = (double)wk__hy_dense_bytes(r, &r->job.optimizer) / 1048576.0;
  tsr_info("dense \"allreduce\": %d dense variable(s) (%.1f MiB with "
           "gradients and slots) here, in %d gradient bucket(s) of up to "
           "%lld bytes; rank %d of a ring of %d workers (group %llu)", nd, mb,
           tsr_coll_fuse_nbuckets(r->fuse),
           (long long)r->job.allreduce_bucket_bytes, g.rank, g.nranks,
           (unsigned long long)g.epoch);
out:
  free(counts);
  return rc;
}

/* A ring of one: the sum is the gradient itself, nothing to post (each
 * bucket would only cost thread hand-offs). */
static bool alone(const wk_run *r) { return r->group_size <= 1; }

void wk__hy_start(wk_run *r) {
  /* with NCCL the buckets go after the compute (wk__hy_reduce) */
  tsr_coll_fuse_start(r->fuse, r->nccl || alone(r) ? NULL : r->coll);
}

void wk__hy_ready(wk_run *r, int v) {
  if (r->nccl || alone(r)) return;
  int rc = tsr_coll_fuse_ready(r->fuse, r->dense_ix[v]);
  if (rc && !r->xs.rc) {
    r->xs.rc = rc;
    snprintf(r->xs.err, sizeof r->xs.err, "all-reduce of %s's gradient "
             "bucket: %s", r->vars[v].name, tsr_strerror(rc));
  }
}

int wk__hy_post(wk_run *r) {
  if (r->nccl || alone(r)) return 0;
  int rc = tsr_coll_fuse_flush(r->fuse);
  if (rc && !r->xs.rc) {
    r->xs.rc = rc;
    snprintf(r->xs.err, sizeof r->xs.err, "all-reduce of the gradient "
             "buckets: %s", tsr_strerror(rc));
  }
  return rc;
}

/* The optimizer on dense variable v with the (summed) gradient times
 * `scale`. */
static void apply_var(wk_run *r, int v, float scale) {
  const tsr_var *vi = &r->vars[v];
  kern_optim_apply(&r->vopt[v], r->dense_step, r->param[v], r->grad[v],
                   scale, r->slots[v], (size_t)vi->numel);
}

void wk__hy_apply(wk_run *r, float scale) {
  r->dense_step++;
  for (size_t v = 0; v < r->n_vars; v++)
    if (r->dense_ix[v] >= 0) apply_var(r, (int)v, scale);
}

/* A bucket through NCCL: up to the GPU, summed there, back (the
 * gradients come off the GPU anyway for the host optimizer). */
static int nccl_bucket(wk_run *r, int b, char *err, size_t errlen) {
  int n;
  const int *m = tsr_coll_fuse_members(r->fuse, b, &n);
  float *host = tsr_coll_fuse_slot(r->fuse, m[0]);
  size_t bytes = tsr_coll_fuse_bucket_floats(r->fuse, b) * sizeof(float);
  int rc = kern_upload(r->kc, r->gpu_buf, host, bytes);
  if (!rc) rc = kern_nccl_allreduce(r->nccl, r->gpu_buf, bytes / sizeof(float));
  if (!rc) rc = kern_download(r->kc, host, r->gpu_buf, bytes);
  if (rc)
    tsr_errf(err, errlen, rc, "all-reduce of gradient bucket %d through "
             "NCCL: %s", b, kern_last_error(r->kc));
  return rc;
}

int wk__hy_reduce(wk_run *r, bool apply, Tessera__Worker__RunResponse *o) {
  int nb = tsr_coll_fuse_nbuckets(r->fuse);
  float inv = 1.0f / (float)(r->group_size > 0 ? r->group_size : 1);
  char err[TSR_COLL_ERR_MAX];
  int rc = tsr_coll_fuse_flush(r->fuse);
  if (apply) r->dense_step++;
  /* trace times are wall-clock microseconds, the tickets' monotonic */
  int64_t wall0 = r->xs.tr ? tsr_trace_now_us() : 0;
  uint64_t mono0 = r->xs.tr ? tsr_now_ns() : 0;
  for (int b = 0; b < nb && !rc; b++) {
    double t0 = tsr_now_s();
    int64_t w0 = r->xs.tr ? tsr_trace_now_us() : 0;
    uint64_t post, done;
    if (alone(r)) {
      post = done = tsr_now_ns();
    } else if (r->nccl) {
      post = tsr_now_ns();
      rc = nccl_bucket(r, b, err, sizeof err);
      done = tsr_now_ns();
    } else {
      rc = tsr_coll_fuse_wait(r->fuse, b, err, sizeof err, &post, &done);
    }
    double dt = tsr_now_s() - t0;
    r->hy_wait_s += dt;
    if (o) o->allreduce_s += dt;
    if (rc) break;
    size_t fl = tsr_coll_fuse_bucket_floats(r->fuse, b);
    if (o && !alone(r)) {
      o->allreduce_bytes += fl * sizeof(float);
      o->allreduce_ops++;
    }
    if (r->xs.tr && !alone(r)) {
      char name[TSR_TRACE_NAME_MAX];
      snprintf(name, sizeof name, "all-reduce bucket %d (%.2f MiB)", b,
               (double)fl * sizeof(float) / 1048576.0);
      int64_t ts = wall0 + ((int64_t)post - (int64_t)mono0) / 1000;
      tsr_trace_complete(r->xs.tr, r->xs.tpid, 2, "coll", name, ts,
                         (int64_t)(done - post) / 1000);
      if (dt > 1e-5) {
        snprintf(name, sizeof name, "wait all-reduce bucket %d", b);
        tsr_trace_end(r->xs.tr, r->xs.tpid, 1, "wait", name, w0);
      }
    }
    int n;
    const int *m = tsr_coll_fuse_members(r->fuse, b, &n);
    for (int i = 0; i < n; i++) {
      int v = r->dense_var[m[i]];
      if (apply)
        apply_var(r, v, inv);
      else
        for (int64_t e = 0; e < r->vars[v].numel; e++) r->grad[v][e] *= inv;
    }
  }
  if (rc) {
    /* every posted bucket is waited for before the buffer is reused */
    tsr_coll_fuse_drain(r->fuse);
    if (!r->xs.rc) {
      r->xs.rc = rc;
      snprintf(r->xs.err, sizeof r->xs.err, "%s", err);
    }
  }
  return rc;
}

void wk__hy_fail(wk_run *r, int code, const char *why) {
  /* buckets already on the ring would wait for the rest for ever on the
   * other workers: they fail now, with this reason */
  tsr_coll_req q = {.kind = TSR_COLL_ABORT, .root = code, .message = why};
  tsr_coll_ticket t;
  if (!r->coll || !r->fuse) return;
  if (!tsr_coll_submit(r->coll, &q, &t)) tsr_coll_wait(r->coll, t, NULL, 0);
  tsr_coll_fuse_drain(r->fuse);
}

int wk__hy_get(wk_run *r, wk_job *j) {
  const Tessera__Worker__DenseRequest *q = j->call->request;
  char *err = j->err;
  size_t errlen = sizeof j->err;
  Tessera__Worker__DenseResponse *o = &j->out.dense;
  tessera__worker__dense_response__init(o);
  if (!r || !r->hybrid)
    return tsr_errf(err, errlen, TSR_EINVAL, "dense state: this worker holds "
                    "no dense variable (not configured with dense "
                    "\"allreduce\")");
  size_t nd = 0, floats = 0, names = 0;
  for (size_t v = 0; v < r->n_vars; v++) {
    if (r->dense_ix[v] < 0) continue;
    int ns = q->slots ? r->nslots[v] : 0;
    nd++;
    names += (size_t)ns;
    floats += (size_t)r->vars[v].numel * (size_t)(1 + ns);
  }
  j->dvars = calloc(nd ? nd : 1, sizeof *j->dvars);
  j->dvp = calloc(nd ? nd : 1, sizeof *j->dvp);
  j->dslot_names = calloc(names ? names : 1, sizeof *j->dslot_names);
  j->trace = malloc(floats ? floats * sizeof(float) : 1);
  if (!j->dvars || !j->dvp || !j->dslot_names || !j->trace)
    return tsr_errf(err, errlen, TSR_ENOMEM, "dense state: out of memory for "
                    "%zu floats", floats);
  float *p = (float *)(void *)j->trace;
  size_t k = 0, sn = 0;
  for (size_t v = 0; v < r->n_vars; v++) {
    if (r->dense_ix[v] < 0) continue;
    const tsr_var *vi = &r->vars[v];
    int ns = q->slots ? r->nslots[v] : 0;
    Tessera__Worker__DenseVar *d = &j->dvars[k];
    tessera__worker__dense_var__init(d);
    d->name = (char *)vi->name;
    d->numel = vi->numel;
    d->slots = j->dslot_names + sn;
    d->n_slots = (size_t)ns;
    memcpy(p, r->param[v], (size_t)vi->numel * sizeof(float));
    p += vi->numel;
    for (int s = 0; s < ns; s++) {
      j->dslot_names[sn++] = (char *)kern_optim_slot_name(&r->vopt[v], s);
      memcpy(p, r->slots[v][s], (size_t)vi->numel * sizeof(float));
      p += vi->numel;
    }
    j->dvp[k++] = d;
  }
  o->step = r->dense_step;
  o->n_vars = nd;
  o->vars = j->dvp;
  j->trace_len = floats * sizeof(float);
  return 0;
}

int wk__hy_set(wk_run *r, wk_job *j) {
  const Tessera__Worker__DenseSetRequest *q = j->call->request;
  char *err = j->err;
  size_t errlen = sizeof j->err;
  tessera__worker__dense_set_response__init(&j->out.dense_set);
  if (!r || !r->hybrid)
    return tsr_errf(err, errlen, TSR_EINVAL, "dense state: this worker holds "
                    "no dense variable (not configured with dense "
                    "\"allreduce\")");
  /* every dense variable, in model order, with every slot, and the
   * payload exactly that long: checked before anything is taken */
  size_t k = 0, floats = 0;
  for (size_t v = 0; v < r->n_vars; v++) {
    if (r->dense_ix[v] < 0) continue;
    const tsr_var *vi = &r->vars[v];
    const Tessera__Worker__DenseVar *d = k < q->n_vars ? q->vars[k] : NULL;
    if (!d || !d->name || strcmp(d->name, vi->name) || d->numel != vi->numel ||
        d->n_slots != (size_t)r->nslots[v])
      return tsr_errf(err, errlen, TSR_ESHAPE, "dense state: variable %zu is "
                      "%s (%lld values, %d slots) here, %s (%lld, %zu) in the "
                      "state", k, vi->name, (long long)vi->numel,
                      r->nslots[v], d && d->name ? d->name : "missing",
                      d ? (long long)d->numel : 0LL, d ? d->n_slots : 0);
    for (int s = 0; s < r->nslots[v]; s++)
      if (strcmp(d->slots[s], kern_optim_slot_name(&r->vopt[v], s)))
        return tsr_errf(err, errlen, TSR_ESHAPE, "dense state: %s's slot %d "
                        "is %s here, %s in the state", vi->name, s,
                        kern_optim_slot_name(&r->vopt[v], s), d->slots[s]);
    floats += (size_t)vi->numel * (size_t)(1 + r->nslots[v]);
    k++;
  }
  if (k != q->n_vars || j->call->payload_len != floats * sizeof(float) ||
      q->step < 0)
    return tsr_errf(err, errlen, TSR_ESHAPE, "dense state: %zu variables and "
                    "%zu bytes (step %lld) where %zu and %zu belong",
                    q->n_vars, j->call->payload_len, (long long)q->step, k,
                    floats * sizeof(float));
  const float *p = j->call->payload;
  for (size_t v = 0; v < r->n_vars; v++) {
    if (r->dense_ix[v] < 0) continue;
    size_t n = (size_t)r->vars[v].numel;
    memcpy(r->param[v], p, n * sizeof(float));
    p += n;
    for (int s = 0; s < r->nslots[v]; s++, p += n)
      memcpy(r->slots[v][s], p, n * sizeof(float));
  }
  r->dense_step = q->step;
  tsr_info("dense state taken: %zu variables at %lld optimizer applies", k,
           (long long)q->step);
  return 0;
}

/* The dense state as one buffer: the applies (8 bytes), then every dense
 * variable's values and slots in model order. */
static size_t state_bytes(const wk_run *r) {
  size_t b = sizeof(int64_t);
  for (size_t v = 0; v < r->n_vars; v++)
    if (r->dense_ix[v] >= 0)
      b += (size_t)r->vars[v].numel * sizeof(float) *
           (size_t)(1 + r->nslots[v]);
  return b;
}

static void state_pack(const wk_run *r, uint8_t *p) {
  memcpy(p, &r->dense_step, sizeof(int64_t));
  p += sizeof(int64_t);
  for (size_t v = 0; v < r->n_vars; v++) {
    if (r->dense_ix[v] < 0) continue;
    size_t n = (size_t)r->vars[v].numel * sizeof(float);
    memcpy(p, r->param[v], n);
    p += n;
    for (int s = 0; s < r->nslots[v]; s++, p += n)
      memcpy(p, r->slots[v][s], n);
  }
}

static void state_unpack(wk_run *r, const uint8_t *p) {
  memcpy(&r->dense_step, p, sizeof(int64_t));
  p += sizeof(int64_t);
  for (size_t v = 0; v < r->n_vars; v++) {
    if (r->dense_ix[v] < 0) continue;
    size_t n = (size_t)r->vars[v].numel * sizeof(float);
    memcpy(r->param[v], p, n);
    p += n;
    for (int s = 0; s < r->nslots[v]; s++, p += n)
      memcpy(r->slots[v][s], p, n);
  }
}

int wk__hy_ring(wk_run *r, const Tessera__Worker__RunRequest *q, char *err,
                size_t errlen) {
  if (!q->group_epoch || q->group_epoch == r->group_epoch) return 0;
  int n = (int)q->n_group_addrs;
  if (n < 1 || q->group_rank >= (uint32_t)n || q->state_root >= (uint32_t)n)
    return tsr_errf(err, errlen, TSR_EINVAL, "closure %llu: a ring of %d "
                    "workers with rank %u and state from rank %u",
                    (unsigned long long)q->closure_id, n, q->group_rank,
                    q->state_root);
  /* the members are given their closures together (the chief lets the
   * old ring's closures end first): one that does not come soon is gone */
  tsr_coll_group g = {.epoch = q->group_epoch,
                      .rank = (int)q->group_rank,
                      .nranks = n,
                      .addrs = (const char *const *)q->group_addrs,
                      .names = q->n_group_names == q->n_group_addrs
                                   ? (const char *const *)q->group_names
                                   : NULL,
                      .timeout_ms = WK_RING_TIMEOUT_MS};
  tsr_coll_req cq = {.kind = TSR_COLL_CONFIGURE, .group = &g};
  char cerr[TSR_COLL_ERR_MAX];
  if (r->nccl) {
    /* NCCL's communicator is of the old members: the host ring from here */
    kern_nccl_close(r->nccl);
    kern_free(r->kc, r->gpu_buf);
    r->nccl = NULL;
    r->gpu_buf = NULL;
    tsr_info("dense \"allreduce\": the ring re-forms; gradients on the host "
             "ring from here");
  }
  int rc = coll_do(r, &cq, cerr, sizeof cerr);
  if (rc)
    return tsr_errf(err, errlen, rc, "dense \"allreduce\": the ring of %d "
                    "workers (group %llu): %s", n,
                    (unsigned long long)q->group_epoch, cerr);
  /* every member takes one member's state: after a loss the members may
   * differ by the step the ring broke in; a joining one has none */
  size_t bytes = state_bytes(r);
  uint8_t *buf = malloc(bytes);
  if (!buf)
    return tsr_errf(err, errlen, TSR_ENOMEM, "out of memory for %zu bytes "
                    "of dense state", bytes);
  if (q->group_rank == q->state_root) state_pack(r, buf);
  cq = (tsr_coll_req){.kind = TSR_COLL_BROADCAST, .buf = buf,
                      .count = bytes, .root = (int)q->state_root};
  rc = coll_do(r, &cq, cerr, sizeof cerr);
  if (!rc && q->group_rank != q->state_root) state_unpack(r, buf);
  free(buf);
  if (rc)
    return tsr_errf(err, errlen, rc, "dense \"allreduce\": the dense state "
                    "from rank %u of the new ring: %s", q->state_root, cerr);
  r->group_size = n;
  r->group_epoch = q->group_epoch;
  tsr_info("dense \"allreduce\": rank %u of a ring of %d workers (group "
           "%llu), dense state from rank %u at %lld optimizer applies",
           q->group_rank, n, (unsigned long long)q->group_epoch,
           q->state_root, (long long)r->dense_step);
  return 0;
}
