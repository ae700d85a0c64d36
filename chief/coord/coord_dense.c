/* dense "allreduce" in checkpoints (coord_io.h): the dense variables live
 * on the workers, every one the same, so a checkpoint takes them from one
 * worker and the chief writes them into the checkpoint folder as shard
 * files like the PS's (one part per variable, its optimizer slots and
 * applies with it, listed in the manifest with ps -1): inspect, export,
 * verification and restore read them as they read the PS's.
 *
 * Happy path. SAVE: the lowest-numbered ready worker that holds the
 * ring's trained state answers it (WK_M_DENSE, between closures: the
 * machine has drained them; a worker configured since, a fresh process
 * with the initial values, is never asked), the
 * chief writes one file per dense variable (written, read back, checked)
 * and adds it to the checkpoint's list; before any closure (the step-0
 * checkpoint of a fresh run) the chief writes the initial state itself,
 * and a restored state not trained past yet is written back as it is. RESTORE: the chief reads those
 * files (each part's own checks, the model's shapes and slots) and sends
 * the state to every ready worker (WK_M_DENSE_SET); a worker configured
 * before training goes on gets it right after its configure.
 * Every worker that held the trained state lost (those configured since
 * hold none): the run goes on from the newest committed checkpoint's,
 * made the live state as a restored one (a worker configured now takes
 * it before any closure, so it can evaluate; a checkpoint writes it), or
 * from the initial values when there is none. A worker configured while
 * another holds the state is "fresh" (WK_READY): it evaluates nothing
 * until a closure gives it the ring's state.
 * Failure modes: a worker that holds the state not ready, a worker's
 * error, a file that cannot be written, a newest checkpoint that cannot
 * be read: the SAVE fails (the machine discards the checkpoint); a file
 * missing or damaged, a state a worker refuses: the RESTORE fails (the
 * machine tries an older checkpoint). Each names the worker or the file.
 */
#include "chief/coord/coord_io.h"
#include "common/ckpt/shardfile.h"
#include "common/err.h"
#include "common/log.h"
#include "kernels/init.h"
#include "kernels/optim.h"
#include "worker.pb-c.h"
#include "worker/wire.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  coord *co;
  uint64_t op;
  int64_t step;
  int w;
  bool for_ready;      /* a configure's follow-up: post `ready` after */
  bool rewind;         /* the run rewinds: the ring's steps are void */
  coord_event ready;
} dn_call;

static bool dn_dense(const coord *co, size_t v) {
  return co->vars[v].kind == TSR_VAR_DENSE;
}

static int dn_slots(const coord *co, size_t v) {
  return kern_optim_num_slots(&co->var_optim[v]);
}

#define DN_DIR_MAX 4096

/* The folder of the checkpoint of `step` into dir[DN_DIR_MAX]. */
static int dn_dir(const coord *co, int64_t step, char *dir, char *err,
                  size_t errlen) {
  if (chief_ckpt_dir(co->job.checkpoint_dir, step, dir, DN_DIR_MAX))
    return tsr_errf(err, errlen, TSR_ERANGE, "checkpoint path too long");
  return 0;
}

static int dn_send(coord *co, int w, uint32_t method,
                   const ProtobufCMessage *m, const uv_buf_t *payload,
                   tsr_rpc_call_cb cb, dn_call *call) {
  return coord__wk_send(co, w, method, m, payload, 120000, cb, call);
}

/* ---- save -------------------------------------------------------------- */

typedef struct {
  const float *value;
  size_t n;
  int nslots;
} dn_emit;

static void dn_emit_data(void *ctx, tsr_shardfile_writer *w) {
  const dn_emit *e = ctx;
  for (int k = 0; k <= e->nslots; k++)
    tsr_shardfile_put(w, e->value + (size_t)k * e->n, e->n * sizeof(float));
}

/* One variable's part into the folder; its entry into the list. */
static int dn_write(coord *co, const char *dir, size_t v, const float *data,
                    int64_t applies, int w, char *err, size_t errlen) {
  const tsr_var *vi = &co->vars[v];
  tsr_shardfile_hdr h;
  memset(&h, 0, sizeof h);
  snprintf(h.ckpt_id, sizeof h.ckpt_id, "%s", co->ckpt_files.id);
  h.ckpt_step = co->ckpt_files.step;
  snprintf(h.name, sizeof h.name, "%s", vi->name);
  h.rank = vi->rank;
  memcpy(h.shape, vi->shape, sizeof h.shape);
  h.shard = 0;
  h.num_shards = 1;
  h.rows = vi->rank ? vi->shape[0] : 1;
  h.width = vi->numel / (h.rows ? h.rows : 1);
  h.n_rows = h.rows;
  h.step = applies;
  h.var_version = (uint64_t)applies;
  snprintf(h.optimizer, sizeof h.optimizer, "%s",
           tsr_optim_name(co->var_optim[v].kind));
  h.nslots = dn_slots(co, v);
  for (int k = 0; k < h.nslots; k++)
    snprintf(h.slots[k], sizeof h.slots[k], "%s",
             kern_optim_slot_name(&co->var_optim[v], k));
  dn_emit e = {data, (size_t)vi->numel, h.nslots};
  char who[48];
  if (w >= 0)
    snprintf(who, sizeof who, "tessera-chief (worker:%d)", w);
  else
    snprintf(who, sizeof who, "tessera-chief");
  tsr_shardfile_written out;
  int rc = tsr_shardfile_write(dir, &h, who, dn_emit_data, &e, true, &out,
                               err, errlen);
  if (!rc)
    rc = chief_ckpt_files_add_own(&co->ckpt_files, out.name, out.bytes,
                                  out.crc32c, err, errlen);
  return rc;
}

static void dn_on_state(const tsr_rpc_result *r, void *data) {
  dn_call *call = data;
  coord *co = call->co;
  char err[COORD_MSG_MAX], what[64];
  snprintf(what, sizeof what, "dense state from worker:%d", call->w);
  int rc = r->status;
  Tessera__Worker__DenseResponse *d = NULL;
  if (rc) {
    snprintf(err, sizeof err, "%s", r->message);
    goto out;
  }
  d = tessera__worker__dense_response__unpack(NULL, r->meta_len, r->meta);
  if (!d) {
    rc = tsr_errf(err, sizeof err, TSR_EPROTO, "its answer does not decode");
    goto out;
  }
  char dir[DN_DIR_MAX];
  if ((rc = dn_dir(co, call->step, dir, err, sizeof err))) goto out;
  /* the worker's list is the model's dense variables, in order */
  const float *p = r->payload;
  size_t k = 0, used = 0;
  for (size_t v = 0; v < co->n_vars && !rc; v++) {
    if (!dn_dense(co, v)) continue;
    const Tessera__Worker__DenseVar *dv = k < d->n_vars ? d->vars[k] : NULL;
    size_t floats = (size_t)co->vars[v].numel * (size_t)(1 + dn_slots(co, v));
    if (!dv || !dv->name || strcmp(dv->name, co->vars[v].name) ||
        dv->numel != co->vars[v].numel ||
        dv->n_slots != (size_t)dn_slots(co, v) ||
        (used + floats) * sizeof(float) > r->payload_len) {
      rc = tsr_errf(err, sizeof err, TSR_ESHAPE, "its variable %zu is not %s "
                    "with %d slots, as the model's", k, co->vars[v].name,
                    dn_slots(co, v));
      break;
    }
    rc = dn_write(co, dir, v, p + used, d->step, call->w, err, sizeof err);
    used += floats;
    k++;
  }
  if (!rc && (k != d->n_vars || used * sizeof(float) != r->payload_len))
    rc = tsr_errf(err, sizeof err, TSR_ESHAPE, "%zu variables and %zu bytes, "
                  "the model's dense variables are %zu and %zu", d->n_vars,
                  r->payload_len, k, used * sizeof(float));
out:
  if (d) tessera__worker__dense_response__free_unpacked(d, NULL);
  coord__psop_answer(co, call->op, what, rc, rc ? err : NULL);
  free(call);
}

/* Before any closure of a fresh run the dense state is the initial one:
 * the same function of (seed, name, element) every process uses, or the
 * job's initial_weights, with fresh slots. Written from here. */
static int dn_save_initial(coord *co, const char *dir, char *err,
                           size_t errlen) {
  int rc = 0;
  for (size_t v = 0; v < co->n_vars && !rc; v++) {
    if (!dn_dense(co, v)) continue;
    const tsr_var *vi = &co->vars[v];
    size_t n = (size_t)vi->numel;
    int ns = dn_slots(co, v);
    float *buf = malloc(n * (size_t)(1 + ns) * sizeof(float));
    float *slots[KERN_OPTIM_MAX_SLOTS];
    if (!buf)
      return tsr_errf(err, errlen, TSR_ENOMEM, "out of memory for %s",
                      vi->name);
    const char *ip = co->var_init_path[v];
    if (ip[0]) {
      FILE *f = fopen(ip, "rb");
      size_t got = f ? fread(buf, sizeof(float), n, f) : 0;
      if (f) fclose(f);
      if (got != n)
        rc = tsr_errf(err, errlen, TSR_EIO, "initial weights of %s: %s does "
                      "not hold %zu float32 values", vi->name, ip, n);
    } else {
      kern_init_fill(&vi->init, co->job.seed, kern_init_var_key(vi->name), 0,
                     buf, n);
    }
    for (int k = 0; k < ns; k++) slots[k] = buf + (size_t)(k + 1) * n;
    kern_optim_init_slots(&co->var_optim[v], slots, n);
    if (!rc) rc = dn_write(co, dir, v, buf, 0, -1, err, errlen);
    free(buf);
  }
  return rc;
}

/* A whole dense state (DenseSetRequest's order) written. */
static int dn_save_state(coord *co, const char *dir, const float *state,
                         int64_t applies, char *err, size_t errlen) {
  size_t at = 0;
  int rc = 0;
  for (size_t v = 0; v < co->n_vars && !rc; v++) {
    if (!dn_dense(co, v)) continue;
    rc = dn_write(co, dir, v, state + at, applies, -1, err, errlen);
    at += (size_t)co->vars[v].numel * (size_t)(1 + dn_slots(co, v));
  }
  return rc;
}

static int dn_read(coord *co, int64_t step, float **out, size_t *floats,
                   int64_t *applies, char *err, size_t errlen);

/* Every worker that held the dense state was lost: the run goes on from
 * the newest committed checkpoint's (the steps since are not rewound, as
 * a lost PS's shards in async mode), read into dense_state (not live): 1;
 * 0 with no checkpoint (from the initial values); -1 (err) when it
 * cannot be read. Each said in the log. */
static int dn_orphan_load(coord *co, char *err, size_t errlen) {
  int64_t step = -1;
  json_t *m = NULL;
  if (!co->job.checkpoint_dir ||
      chief_ckpt_latest(co->job.checkpoint_dir, &step, &m, err, errlen)) {
    coord__note(co, TSR_LOG_WARN, "dense \"allreduce\": every worker that "
                "held the dense variables was lost and there is no "
                "checkpoint: training goes on from their initial values");
    return 0;
  }
  json_decref(m);
  float *state;
  size_t floats;
  int64_t applies;
  int rc = co->dense_sending > 0
               ? tsr_errf(err, errlen, TSR_EBUSY, "an earlier state is "
                          "still being sent")
               : dn_read(co, step, &state, &floats, &applies, err, errlen);
  if (rc) {
    coord__note(co, TSR_LOG_WARN, "dense \"allreduce\": every worker that "
                "held the dense variables was lost, and the checkpoint of "
                "step %" PRId64 " cannot give them: %s", step, err);
    return -1;
  }
  coord__dense_forget(co);
  co->dense_state = state;
  co->dense_floats = floats;
  co->dense_step = applies;
  coord__note(co, TSR_LOG_WARN, "dense \"allreduce\": every worker that held "
              "the dense variables was lost: they go on from the checkpoint "
              "of step %" PRId64 " (the steps since are not rewound)", step);
  return 1;
}

/* Whether a worker holds the run's dense state. */
static bool dn_held(const coord *co) {
  for (int i = 0; i < co->n_wk; i++)
    if (co->wk[i].has_state) return true;
  return false;
}

void coord__dense_save(coord *co, uint64_t op, int64_t step) {
  coord__psop_add(co, op);
  char err[COORD_MSG_MAX];
  bool initial = !co->dense_trained;
  if (!co->dense_live && !initial && !dn_held(co)) {
    /* no worker holds it: the state the run goes on from, which every
     * worker configured from now on takes */
    int got = dn_orphan_load(co, err, sizeof err);
    if (got < 0) {
      coord__psop_answer(co, op, "dense state", TSR_EUNAVAIL, err);
      return;
    }
    co->dense_live = got > 0;
    initial = got == 0;
  }
  if (co->dense_live || initial) {
    char dir[DN_DIR_MAX];
    int rc = dn_dir(co, step, dir, err, sizeof err);
    if (!rc)
      rc = co->dense_live ? dn_save_state(co, dir, co->dense_state,
                                          co->dense_step, err, sizeof err)
                          : dn_save_initial(co, dir, err, sizeof err);
    coord__psop_answer(co, op, "dense state", rc, rc ? err : NULL);
    return;
  }
  int w = -1;
  for (int i = 0; i < co->n_wk && w < 0; i++)
    if (co->wk[i].has_state &&
        coord_sm_wk_state(co->sm, i) == COORD_WK_READY)
      w = i;
  if (w < 0) {
    coord__psop_answer(co, op, "dense state", TSR_EUNAVAIL,
                       "dense \"allreduce\": no worker that holds the dense "
                       "variables is ready to give them");
    return;
  }
  dn_call *call = calloc(1, sizeof *call);
  Tessera__Worker__DenseRequest q = TESSERA__WORKER__DENSE_REQUEST__INIT;
  q.slots = true;
  int rc = call ? 0 : TSR_ENOMEM;
  if (call) {
    *call = (dn_call){.co = co, .op = op, .step = step, .w = w};
    rc = dn_send(co, w, WK_M_DENSE, &q.base, NULL, dn_on_state, call);
  }
  if (rc) {
    free(call);
    coord__psop_answer(co, op, "dense state", rc, tsr_strerror(rc));
  }
}

/* ---- restore ----------------------------------------------------------- */

/* The checkpoint's dense parts, checked against the model, into one
 * buffer in DenseSetRequest's order. */
static int dn_read(coord *co, int64_t step, float **out, size_t *floats,
                   int64_t *applies, char *err, size_t errlen) {
  char dir[DN_DIR_MAX];
  int rc = dn_dir(co, step, dir, err, errlen);
  if (rc) return rc;
  size_t total = 0;
  for (size_t v = 0; v < co->n_vars; v++)
    if (dn_dense(co, v))
      total += (size_t)co->vars[v].numel * (size_t)(1 + dn_slots(co, v));
  float *buf = malloc((total ? total : 1) * sizeof(float));
  if (!buf) return tsr_errf(err, errlen, TSR_ENOMEM, "out of memory for %zu "
                            "floats of dense state", total);
  size_t at = 0;
  int64_t st = -1;
  for (size_t v = 0; v < co->n_vars && !rc; v++) {
    if (!dn_dense(co, v)) continue;
    const tsr_var *vi = &co->vars[v];
    char name[TSR_SHARDFILE_NAME_MAX], path[4400];
    tsr_shardfile f;
    memset(&f, 0, sizeof f);
    if ((rc = tsr_shardfile_name(vi->name, 0, 1, name, sizeof name))) {
      tsr_errf(err, errlen, rc, "%s: name too long", vi->name);
      break;
    }
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if ((rc = tsr_shardfile_open(&f, path, err, errlen))) break;
    const tsr_shardfile_part *p = &f.p;
    int ns = dn_slots(co, v);
    bool same = !p->h.sparse && p->h.num_shards == 1 && p->h.nslots == ns &&
                p->h.rank == vi->rank;
    for (int d = 0; same && d < vi->rank; d++)
      same = p->h.shape[d] == vi->shape[d];
    for (int k = 0; same && k < ns; k++)
      same = !strcmp(p->h.slots[k],
                     kern_optim_slot_name(&co->var_optim[v], k));
    if (!same) {
      rc = tsr_errf(err, errlen, TSR_ESHAPE, "%s: not %s as the model has it "
                    "(dense, one part, %d optimizer slots)", path, vi->name,
                    ns);
    } else if (st >= 0 && p->h.step != st) {
      rc = tsr_errf(err, errlen, TSR_ECORRUPT, "%s: %" PRId64 " optimizer "
                    "applies, the other dense variables %" PRId64, path,
                    p->h.step, st);
    } else {
      size_t n = (size_t)vi->numel;
      memcpy(buf + at, p->data + p->off_value, n * sizeof(float));
      for (int k = 0; k < ns; k++)
        memcpy(buf + at + (size_t)(k + 1) * n, p->data + p->off_slot[k],
               n * sizeof(float));
      at += n * (size_t)(1 + ns);
      st = p->h.step;
    }
    tsr_shardfile_close(&f);
  }
  if (rc) {
    free(buf);
    return rc;
  }
  *out = buf;
  *floats = total;
  *applies = st < 0 ? 0 : st;
  return 0;
}

static void dn_release(coord *co) {
  if (co->dense_live || co->dense_sending > 0) return;
  free(co->dense_state);
  co->dense_state = NULL;
  co->dense_floats = 0;
}

static void dn_on_set(const tsr_rpc_result *r, void *data) {
  dn_call *call = data;
  coord *co = call->co;
  co->dense_sending--; /* the payload is no longer in use */
  if (call->for_ready) {
    coord_event ev = call->ready;
    if (r->status) {
      ev.kind = COORD_EV_WK_CONFIG_FAILED;
      ev.status = r->status;
      ev.err_kind = coord__wk_err_kind(&co->wk[call->w], r);
      ev.msg = r->message;
    } else {
      /* it holds the run's state: the restored one, not trained past */
      co->wk[call->w].has_state = true;
      ev.fresh = false;
    }
    coord__post(co, &ev);
  } else {
    char what[64];
    snprintf(what, sizeof what, "dense state to worker:%d", call->w);
    coord__psop_answer(co, call->op, what, r->status,
                       r->status ? r->message : NULL);
  }
  free(call);
  dn_release(co);
}

/* Sends the restored state to worker w. */
static int dn_set_cb(coord *co, int w, dn_call *call, tsr_rpc_call_cb cb);
static void dn_on_set(const tsr_rpc_result *r, void *data);

static int dn_set(coord *co, int w, dn_call *call) {
  return dn_set_cb(co, w, call, dn_on_set);
}

static int dn_set_cb(coord *co, int w, dn_call *call, tsr_rpc_call_cb cb) {
  size_t n = 0;
  for (size_t v = 0; v < co->n_vars; v++) n += dn_dense(co, v);
  Tessera__Worker__DenseVar *dv = calloc(n ? n : 1, sizeof *dv);
  Tessera__Worker__DenseVar **dp = calloc(n ? n : 1, sizeof *dp);
  char **names = calloc(n * KERN_OPTIM_MAX_SLOTS + 1, sizeof *names);
  int rc = dv && dp && names ? 0 : TSR_ENOMEM;
  size_t k = 0, sn = 0;
  for (size_t v = 0; !rc && v < co->n_vars; v++) {
    if (!dn_dense(co, v)) continue;
    tessera__worker__dense_var__init(&dv[k]);
    dv[k].name = co->vars[v].name;
    dv[k].numel = co->vars[v].numel;
    dv[k].slots = names + sn;
    dv[k].n_slots = (size_t)dn_slots(co, v);
    for (int s = 0; s < dn_slots(co, v); s++)
      names[sn++] = (char *)kern_optim_slot_name(&co->var_optim[v], s);
    dp[k] = &dv[k];
    k++;
  }
  if (!rc) {
    Tessera__Worker__DenseSetRequest q =
        TESSERA__WORKER__DENSE_SET_REQUEST__INIT;
    q.step = co->dense_step;
    q.rewind = call->rewind;
    q.n_vars = k;
    q.vars = dp;
    uv_buf_t b = uv_buf_init((char *)co->dense_state,
                             (unsigned)(co->dense_floats * sizeof(float)));
    rc = dn_send(co, w, WK_M_DENSE_SET, &q.base, &b, cb, call);
    if (!rc) co->dense_sending++;
  }
  free(dv);
  free(dp);
  free(names);
  return rc;
}

void coord__dense_restore(coord *co, uint64_t op, int64_t step) {
  char err[COORD_MSG_MAX];
  coord__psop_add(co, op);
  float *state;
  size_t floats;
  int64_t applies;
  int rc = dn_read(co, step, &state, &floats, &applies, err, sizeof err);
  if (rc) {
    coord__psop_answer(co, op, "dense state", rc, err);
    return;
  }
  if (co->dense_sending > 0) {
    /* an older state still on its way to a worker: it keeps its buffer */
    free(state);
    coord__psop_answer(co, op, "dense state", TSR_EBUSY, "dense "
                       "\"allreduce\": an earlier restored state is still "
                       "being sent");
    return;
  }
  coord__dense_forget(co);
  co->dense_state = state;
  co->dense_floats = floats;
  co->dense_step = applies;
  co->dense_live = true;
  tsr_info("dense \"allreduce\": the checkpoint of step %" PRId64 " holds "
           "the dense variables at %" PRId64 " optimizer applies", step,
           co->dense_step);
  /* the run rewinds (a lost PS's global recovery): once closures have
   * run, the ring's steps in flight are void. Each worker breaks its ring
   * as this state arrives (a closure in flight may wait on a member that
   * has none left, and nothing is dispatched until every member took the
   * state), and the next closures re-form it */
  if (co->ring_started) co->ring_dirty = true;
  for (int i = 0; i < co->n_wk; i++) {
    if (coord_sm_wk_state(co->sm, i) != COORD_WK_READY) continue;
    dn_call *call = calloc(1, sizeof *call);
    coord__psop_add(co, op);
    if (call)
      *call = (dn_call){.co = co, .op = op, .step = step, .w = i,
                        .rewind = co->ring_started};
    rc = call ? dn_set(co, i, call) : TSR_ENOMEM;
    if (rc) {
      free(call);
      coord__psop_answer(co, op, "dense state", rc, tsr_strerror(rc));
    }
  }
  coord__psop_answer(co, op, "dense state", 0, NULL);
}

static void dn_on_set_logged(const tsr_rpc_result *r, void *data) {
  dn_call *call = data;
  coord *co = call->co;
  co->dense_sending--;
  if (r->status)
    tsr_warn("dense \"allreduce\": worker:%d did not take the checkpoint's "
             "dense state: %s", call->w, r->message);
  free(call);
  dn_release(co);
}

void coord__dense_from_ckpt(coord *co) {
  char err[COORD_MSG_MAX];
  if (dn_orphan_load(co, err, sizeof err) <= 0) return;
  for (int i = 0; i < co->n_wk; i++) {
    if (!co->wk[i].in_ring) continue;
    dn_call *call = calloc(1, sizeof *call);
    if (!call) continue;
    *call = (dn_call){.co = co, .w = i};
    if (dn_set_cb(co, i, call, dn_on_set_logged)) free(call);
  }
}

void coord__dense_ready(coord *co, int w, const coord_event *ready) {
  /* every worker that held the dense state lost: worker w (and each one
   * configured after it) takes the newest checkpoint's before any
   * closure, so it can evaluate and be checkpointed; with no checkpoint
   * the initial values it holds are the run's */
  if (!co->dense_live && co->ring_started && !dn_held(co)) {
    char err[COORD_MSG_MAX];
    int got = dn_orphan_load(co, err, sizeof err);
    co->dense_live = got > 0;
    if (got == 0) co->wk[w].has_state = true;
  }
  if (!co->dense_live) {
    coord_event ev = *ready;
    ev.fresh = !co->wk[w].has_state;
    coord__post(co, &ev);
    return;
  }
  dn_call *call = calloc(1, sizeof *call);
  int rc = TSR_ENOMEM;
  if (call) {
    *call = (dn_call){.co = co, .w = w, .for_ready = true, .ready = *ready};
    rc = dn_set(co, w, call);
  }
  if (rc) {
    free(call);
    coord_event ev = *ready;
    ev.kind = COORD_EV_WK_CONFIG_FAILED;
    ev.status = rc;
    ev.err_kind = COORD_ERR_TRANSIENT;
    ev.msg = "cannot send the restored dense state";
    coord__post(co, &ev);
  }
}

void coord__dense_forget(coord *co) {
  co->dense_live = false;
  dn_release(co);
}
