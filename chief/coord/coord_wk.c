/* The coordinator's side of the workers (coord_io.h): one RPC client
 * each, over the protocol of proto/worker.proto and worker/wire.h.
 * Connection changes become WK_UP / WK_LOST; CONFIGURE, DISPATCH and
 * EVALUATE are sent and their answers become WK_READY / WK_CONFIG_FAILED,
 * CLOSURE_DONE / CLOSURE_FAILED and EVAL_DONE; COUNT adds a counted
 * closure's figures to the monitoring.
 *
 * How a failure reads (coord__wk_err_kind): the worker's TSR_EDATA is a
 * data error (the run stops); a PS it cannot reach or a stale sync step is
 * transient; a connection that is gone is the worker lost; anything else
 * is the worker's own error.
 */
#include "chief/coord/coord_io.h"
#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"
#include "common/trace.h"
#include "worker.pb-c.h"
#include "worker/wire.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  coord_wk *w;
  chief_closure c;
  uint64_t op;
  int64_t step;
  uint64_t epoch;        /* dense "allreduce": the closure's ring */
} coord_wk_call;

static void coord_wk_on_state(tsr_rpc_client *c, int connected, int status,
                              void *data) {
  coord_wk *w = data;
  (void)c;
  if (!connected && w->co->job.dense_allreduce)
    coord__ring_lost(w->co, w->index);
  if (connected)
    coord__post_simple(w->co, COORD_EV_WK_UP, w->index, NULL);
  else
    coord__post_simple(w->co, COORD_EV_WK_LOST, w->index,
                       tsr_strerror(status));
}

int coord__wk_open(coord *co) {
  co->wk = calloc((size_t)co->n_wk, sizeof *co->wk);
  if (!co->wk) return TSR_ENOMEM;
  for (int i = 0; i < co->n_wk; i++) {
    coord_wk *w = &co->wk[i];
    w->co = co;
    w->index = i;
    w->addr = &co->cluster.jobs[TSR_TASK_WORKER][i];
    int rc = tsr_rpc_client_new(&w->cli, co->rpc, w->addr->addr);
    if (rc) {
      tsr_error("worker:%d (%s): %s", i, w->addr->addr, tsr_strerror(rc));
      return rc;
    }
    tsr_rpc_client_on_state(w->cli, coord_wk_on_state, w);
  }
  return 0;
}

coord_err_kind coord__wk_err_kind(const coord_wk *w, const tsr_rpc_result *r) {
  int s = r->status;
  bool conn = s == TSR_ECLOSED || s == TSR_EUNAVAIL || s == TSR_ETIMEOUT ||
              s == TSR_ESHUTDOWN;
  if (!r->remote)
    return conn && !tsr_rpc_client_connected(w->cli) ? COORD_ERR_LOST
                                                     : COORD_ERR_TRANSIENT;
  if (s == TSR_EDATA) return COORD_ERR_DATA;
  /* a PS the worker cannot reach is not its fault (recovery deals with
   * it); sync: a worker back from the dead pushed a step the others
   * finished without it, and its next closure starts from the PS's step */
  if (conn || s == TSR_ESTALE || s == TSR_ECANCELED || s == TSR_EBUSY)
    return COORD_ERR_TRANSIENT;
  return COORD_ERR_OTHER;
}

int coord__wk_send(coord *co, int w, uint32_t method,
                   const ProtobufCMessage *msg, const uv_buf_t *payload,
                   uint32_t deadline_ms, tsr_rpc_call_cb cb, void *data) {
  tsr_rpc_request req = {.method = method,
                         .payload = payload,
                         .npayload = payload ? 1 : 0,
                         .deadline_ms = deadline_ms};
  return tsr_rpc_call_msg(co->wk[w].cli, &req, msg, cb, data);
}

/* A call of the machine's: counted in the worker's calls in flight. */
static int coord_wk_send(coord_wk *w, uint32_t method,
                         const ProtobufCMessage *msg, uint32_t deadline_ms,
                         tsr_rpc_call_cb cb, coord_wk_call *call) {
  int rc = coord__wk_send(w->co, w->index, method, msg, NULL, deadline_ms, cb,
                          call);
  if (rc == 0) w->inflight++;
  return rc;
}

/* A send that failed at once: the kind the machine takes it as. */
static coord_err_kind coord_wk_send_kind(const coord_wk *w, int rc) {
  if ((rc == TSR_EUNAVAIL || rc == TSR_ESHUTDOWN || rc == TSR_ECLOSED) &&
      !tsr_rpc_client_connected(w->cli))
    return COORD_ERR_LOST;
  return COORD_ERR_TRANSIENT;
}

/* The answer to a configure or a run, unpacked with `desc`; NULL when the
 * call failed or its answer does not decode, once `ev` has been posted as
 * `failed` with the reason. */
static ProtobufCMessage *coord_wk_answer(coord_wk *w, const tsr_rpc_result *r,
                                         const ProtobufCMessageDescriptor *desc,
                                         coord_ev_kind failed,
                                         coord_event *ev) {
  ev->kind = failed;
  if (r->status) {
    ev->err_kind = coord__wk_err_kind(w, r);
    ev->status = r->status;
    ev->msg = r->message;
    coord__post(w->co, ev);
    return NULL;
  }
  ProtobufCMessage *m =
      protobuf_c_message_unpack(desc, NULL, r->meta_len, r->meta);
  if (!m) {
    char msg[COORD_MSG_MAX];
    snprintf(msg, sizeof msg, "its %s does not decode", desc->short_name);
    ev->err_kind = COORD_ERR_OTHER;
    ev->status = TSR_EPROTO;
    ev->msg = msg;
    coord__post(w->co, ev);
  }
  return m;
}

/* ---- configure ----------------------------------------------------------*/

static void coord_wk_on_configure(const tsr_rpc_result *r, void *data) {
  coord_wk_call *call = data;
  coord_wk *w = call->w;
  coord *co = w->co;
  free(call);
  w->inflight--;
  coord_event ev = {.index = w->index};
  Tessera__Worker__ConfigureResponse *resp =
      (Tessera__Worker__ConfigureResponse *)coord_wk_answer(
          w, r, &tessera__worker__configure_response__descriptor,
          COORD_EV_WK_CONFIG_FAILED, &ev);
  if (!resp) return;
  snprintf(w->device, sizeof w->device, "%s",
           resp->device ? resp->device : "?");
  if (!co->input_affine && resp->n_input_scale > 0 &&
      resp->n_input_scale == resp->n_input_shift) {
    json_t *sa = json_array(), *sb = json_array();
    for (size_t k = 0; k < resp->n_input_scale; k++) {
      json_array_append_new(sa, json_real(resp->input_scale[k]));
      json_array_append_new(sb, json_real(resp->input_shift[k]));
    }
    co->input_affine = json_pack("{soso}", "scale", sa, "shift", sb);
    if (co->input_affine && resp->n_input_names > 0 &&
        resp->n_input_names == resp->n_input_columns) {
      json_t *cols = json_object();
      for (size_t k = 0; k < resp->n_input_names; k++)
        json_object_set_new(cols, resp->input_names[k],
                            json_integer(resp->input_columns[k]));
      json_object_set_new(co->input_affine, "columns", cols);
    }
  }
  ev.kind = COORD_EV_WK_READY;
  ev.examples = resp->examples;
  tessera__worker__configure_response__free_unpacked(resp, NULL);
  tsr_info("worker:%d (%s) ready on %s, %" PRId64 " examples per epoch",
           w->index, w->addr->addr, w->device, ev.examples);
  /* dense "allreduce": a restored checkpoint's dense state first */
  if (co->job.dense_allreduce) {
    coord__ring_configured(co, w->index);
    coord__dense_ready(co, w->index, &ev);
  }
  else
    coord__post(co, &ev);
}

void coord__wk_configure(coord *co, int i) {
  coord_wk *w = &co->wk[i];
  Tessera__Worker__ConfigureRequest req =
      TESSERA__WORKER__CONFIGURE_REQUEST__INIT;
  req.run_id = co->run_id;
  req.format_version = WK_FORMAT_VERSION;
  req.worker_index = (uint32_t)i;
  req.num_workers = (uint32_t)co->n_wk;
  req.job_json = co->job_json;
  req.job_dir = co->job_dir;
  req.model_digest = co->model_digest;
  char **addrs = calloc((size_t)(co->n_ps ? co->n_ps : 1), sizeof *addrs);
  /* dense "allreduce": the ring of every worker, in index order */
  char **gaddrs = NULL, **gnames = NULL, **inits = NULL;
  char (*gname)[32] = NULL;
  if (co->job.dense_allreduce) {
    gaddrs = calloc((size_t)co->n_wk, sizeof *gaddrs);
    gnames = calloc((size_t)co->n_wk, sizeof *gnames);
    gname = calloc((size_t)co->n_wk, sizeof *gname);
    inits = calloc(co->n_vars ? co->n_vars : 1, sizeof *inits);
    if (gaddrs && gnames && gname && inits) {
      for (int k = 0; k < co->n_wk; k++) {
        gaddrs[k] = (char *)co->cluster.jobs[TSR_TASK_WORKER][k].addr;
        snprintf(gname[k], sizeof gname[k], "worker:%d", k);
        gnames[k] = gname[k];
      }
      for (size_t v = 0; v < co->n_vars; v++) inits[v] = co->var_init_path[v];
      /* the first ring is every worker; one configured after closures
       * went out joins the ring its first closure names */
      if (!co->ring_started) {
        req.n_group_addrs = req.n_group_names = (size_t)co->n_wk;
        req.group_addrs = gaddrs;
        req.group_names = gnames;
        req.group_rank = (uint32_t)i;
        req.group_epoch = co->group_epoch;
      }
      req.n_init_paths = co->n_vars;
      req.init_paths = inits;
    }
  }
  Tessera__Worker__Shard *sh = calloc(co->n_shards ? co->n_shards : 1,
                                      sizeof *sh);
  Tessera__Worker__Shard **shp = calloc(co->n_shards ? co->n_shards : 1,
                                        sizeof *shp);
  coord_wk_call *call = calloc(1, sizeof *call);
  int rc = TSR_ENOMEM;
  if (addrs && sh && shp && call &&
      (!co->job.dense_allreduce || (gaddrs && gnames && gname && inits))) {
    for (int p = 0; p < co->n_ps; p++)
      addrs[p] = (char *)co->cluster.jobs[TSR_TASK_PS][p].addr;
    req.n_ps_addrs = (size_t)co->n_ps;
    req.ps_addrs = addrs;
    for (size_t k = 0; k < co->n_shards; k++) {
      tessera__worker__shard__init(&sh[k]);
      sh[k].var = (uint32_t)co->shards[k].var;
      sh[k].shard = (uint32_t)co->shards[k].shard;
      sh[k].num_shards = (uint32_t)co->shards[k].num_shards;
      sh[k].row0 = co->shards[k].row0;
      sh[k].rows = co->shards[k].rows;
      sh[k].ps = (uint32_t)co->shards[k].ps;
      shp[k] = &sh[k];
    }
    req.n_shards = co->n_shards;
    req.shards = shp;
    call->w = w;
    rc = coord_wk_send(w, WK_M_CONFIGURE, &req.base, 120000,
                       coord_wk_on_configure, call);
  }
  free(addrs);
  free(sh);
  free(shp);
  free(gaddrs);
  free(gnames);
  free(gname);
  free(inits);
  if (rc) {
    free(call);
    coord_event ev = {.kind = COORD_EV_WK_CONFIG_FAILED, .index = i,
                      .status = rc, .err_kind = coord_wk_send_kind(w, rc),
                      .msg = tsr_strerror(rc)};
    coord__post(co, &ev);
  }
}

/* ---- closures -----------------------------------------------------------*/

static void coord_wk_on_run(const tsr_rpc_result *r, void *data) {
  coord_wk_call *call = data;
  coord_wk *w = call->w;
  coord *co = w->co;
  chief_closure c = call->c;
  uint64_t epoch = call->epoch;
  free(call);
  if (co->job.dense_allreduce) {
    if (r->status)
      coord__ring_failed(co, w->index, epoch);
    else
      coord__ring_done(co, w->index);
  }
  w->inflight--;
  coord_event ev = {.index = w->index, .closure_id = c.id,
                    .generation = c.generation};
  Tessera__Worker__RunResponse *resp =
      (Tessera__Worker__RunResponse *)coord_wk_answer(
          w, r, &tessera__worker__run_response__descriptor,
          COORD_EV_CLOSURE_FAILED, &ev);
  if (!resp) return;
  if (co->trace) {
    int32_t pid = tsr_trace_pid(TSR_TASK_WORKER, w->index);
    char name[TSR_TRACE_NAME_MAX];
    snprintf(name, sizeof name, "closure of %lld steps",
             (long long)resp->steps_done);
    int64_t dur = (int64_t)(r->latency_ns / 1000);
    tsr_trace_complete(co->trace, pid, 0, "closure", name,
                       tsr_trace_now_us() - dur, dur);
    /* the worker's own step phases, when it sent them */
    size_t max = r->payload_len / TSR_TRACE_WIRE_SIZE, n = 0;
    if (max) {
      tsr_trace_event *tev = malloc(max * sizeof *tev);
      if (tev &&
          tsr_trace_unpack(r->payload, r->payload_len, tev, max, &n) == 0)
        tsr_trace_append(co->trace, tev, n);
      free(tev);
    }
  }
  /* monitoring only (not part of the machine's decisions): the corrupt
   * records the worker skipped, its training metrics, the scalars when due */
  co->skipped_records += resp->skipped_records >= w->skipped_seen
                             ? resp->skipped_records - w->skipped_seen
                             : resp->skipped_records;
  w->skipped_seen = resp->skipped_records;
  chief_train_acc_add(&co->train_acc, resp->metric_names,
                      resp->metric_values,
                      resp->n_metric_names < resp->n_metric_values
                          ? resp->n_metric_names
                          : resp->n_metric_values,
                      (double)resp->examples);
  ev.kind = COORD_EV_CLOSURE_DONE;
  ev.steps_done = resp->steps_done;
  ev.stats = (coord_closure_stats){
      .examples = resp->examples, .loss_sum = resp->loss_sum,
      .wall_s = resp->wall_s, .input_s = resp->input_wait_s,
      .pull_s = resp->pull_s, .compute_s = resp->compute_s,
      .push_s = resp->push_s, .max_staleness = resp->max_staleness,
      .allreduce_s = resp->allreduce_s,
      .allreduce_bytes = resp->allreduce_bytes,
      .latency_s = (double)r->latency_ns / 1e9};
  tessera__worker__run_response__free_unpacked(resp, NULL);
  coord__post(co, &ev);
  if (co->metrics && chief_summary_due(&co->sum_pol, coord__step(co),
                                       coord_sm_total_steps(co->sm),
                                       tsr_now_s()))
    coord__scalars(co, tsr_now_s());
}

void coord__wk_dispatch(coord *co, const chief_closure *c) {
  coord_wk *w = &co->wk[c->worker];
  if (co->job.dense_allreduce) { /* trained past */
    coord__dense_forget(co);
    co->dense_trained = true;
  }
  w->last_closure = c->id; /* a LEAVE says every closure up to it is over */
  Tessera__Worker__RunRequest req = TESSERA__WORKER__RUN_REQUEST__INIT;
  req.closure_id = c->id;
  req.generation = c->generation;
  req.steps = c->steps;
  req.first_step = c->first_step;
  req.trace = co->trace != NULL;
  /* a worker whose connection is gone gets nothing: the call would wait
   * for a connection until the closure's deadline (or be written to the
   * next process at that address before its configuration), and the
   * machine learns at once that the worker is lost */
  bool up = tsr_rpc_client_connected(w->cli);
  coord_wk_call *call = up ? calloc(1, sizeof *call) : NULL;
  char **ring = NULL;
  int rc = !up ? TSR_ECLOSED : call ? 0 : TSR_ENOMEM;
  /* dense "allreduce": the ring the closure runs in */
  if (!rc && co->job.dense_allreduce)
    rc = coord__ring_for(co, w->index, &req, &ring);
  if (!rc) {
    call->w = w;
    call->c = *c;
    call->epoch = req.group_epoch;
    rc = coord_wk_send(w, WK_M_RUN, &req.base,
                       (uint32_t)(co->o->closure_timeout_s * 1000),
                       coord_wk_on_run, call);
  }
  coord__ring_free(ring);
  if (rc) {
    free(call);
    coord_event ev = {.kind = COORD_EV_CLOSURE_FAILED, .index = w->index,
                      .closure_id = c->id, .generation = c->generation,
                      .status = rc, .err_kind = coord_wk_send_kind(w, rc),
                      .msg = tsr_strerror(rc)};
    coord__post(co, &ev);
  }
}

/* A closure the machine counted: its figures join the run's. */
void coord__wk_count(coord *co, const coord_action *a) {
  coord_wk *w = &co->wk[a->index];
  const coord_closure_stats *s = &a->stats;
  w->steps += a->closure.steps;
  co->worker_steps_run += a->closure.steps;
  w->examples += s->examples;
  w->busy_s += s->wall_s;
  w->input_s += s->input_s;
  w->pull_s += s->pull_s;
  w->compute_s += s->compute_s;
  w->push_s += s->push_s;
  w->allreduce_s += s->allreduce_s;
  w->allreduce_bytes += s->allreduce_bytes;
  w->allreduce_steps += a->closure.steps;
  co->examples += s->examples;
  co->examples_run += s->examples;
  if (s->max_staleness > co->max_staleness)
    co->max_staleness = s->max_staleness;
  if (a->closure.steps > 0 && isfinite(s->loss_sum)) {
    co->loss_sum += s->loss_sum;
    co->loss_n += a->closure.steps;
    co->recent_loss[co->recent_at] = s->loss_sum;
    co->recent_steps[co->recent_at] = a->closure.steps;
    co->recent_at = (co->recent_at + 1) % 16;
    if (co->n_recent < 16) co->n_recent++;
  }
}

/* ---- evaluation ---------------------------------------------------------*/

static void coord_wk_on_eval(const tsr_rpc_result *r, void *data) {
  coord_wk_call *call = data;
  coord_wk *w = call->w;
  coord *co = w->co;
  int64_t step = call->step;
  coord_event ev = {.kind = COORD_EV_EVAL_DONE, .op = call->op,
                    .index = w->index};
  free(call);
  w->inflight--;
  if (co->trace)
    tsr_trace_end(co->trace, tsr_trace_pid(TSR_TASK_CHIEF, 0), 0, "chief",
                  "evaluation", co->trace_eval_us);
  if (r->status) {
    char msg[COORD_MSG_MAX];
    snprintf(msg, sizeof msg, "worker:%d: %s", w->index, r->message);
    ev.status = r->status;
    ev.msg = msg;
    coord__post(co, &ev);
    return;
  }
  Tessera__Worker__EvalResponse *resp =
      tessera__worker__eval_response__unpack(NULL, r->meta_len, r->meta);
  if (!resp) {
    ev.status = TSR_EPROTO;
    ev.msg = "EvalResponse does not decode";
    coord__post(co, &ev);
    return;
  }
  char line[512];
  size_t off = (size_t)snprintf(line, sizeof line, "eval at step %" PRId64
                                ": loss %.6g", step, resp->loss);
  snprintf(co->eval_names[0], sizeof co->eval_names[0], "loss");
  co->eval_vals[0].name = co->eval_names[0];
  co->eval_vals[0].value = resp->loss;
  co->n_eval = 1;
  co->eval_step = step;
  if (co->metrics)
    chief_metrics_scalar(co->metrics, "eval/loss", step, resp->loss, 0);
  size_t nm = resp->n_metric_names < resp->n_metric_values
                  ? resp->n_metric_names
                  : resp->n_metric_values;
  for (size_t i = 0; i < nm && co->n_eval < 16; i++) {
    snprintf(co->eval_names[co->n_eval], sizeof co->eval_names[0], "%s",
             resp->metric_names[i]);
    co->eval_vals[co->n_eval].name = co->eval_names[co->n_eval];
    co->eval_vals[co->n_eval].value = resp->metric_values[i];
    co->n_eval++;
    char tag[96];
    snprintf(tag, sizeof tag, "eval/%s", resp->metric_names[i]);
    if (co->metrics)
      chief_metrics_scalar(co->metrics, tag, step, resp->metric_values[i], 0);
    if (off < sizeof line)
      off += (size_t)snprintf(line + off, sizeof line - off, ", %s %.4f",
                              resp->metric_names[i], resp->metric_values[i]);
  }
  /* weight and gradient histograms, in the train run as Keras writes them */
  chief_tb *htb = co->metrics ? chief_metrics_tb(co->metrics, CHIEF_RUN_TRAIN)
                              : NULL;
  for (size_t i = 0; htb && i < resp->n_histograms; i++) {
    const Tessera__Worker__Histogram *h = resp->histograms[i];
    size_t nb = h->n_bucket < h->n_bucket_limit ? h->n_bucket
                                                : h->n_bucket_limit;
    chief_tb_histogram_counts(htb, h->tag, step, h->min, h->max, h->num,
                              h->sum, h->sum_squares, h->bucket_limit,
                              h->bucket, nb, 0);
  }
  tessera__worker__eval_response__free_unpacked(resp, NULL);
  coord__note(co, TSR_LOG_INFO, "%s", line);
  coord__post(co, &ev);
}

void coord__wk_eval(coord *co, uint64_t op, int i, int64_t step) {
  coord_wk *w = &co->wk[i];
  Tessera__Worker__EvalRequest req = TESSERA__WORKER__EVAL_REQUEST__INIT;
  req.eval_id = (uint64_t)step + 1;
  req.step = step;
  req.snapshot = op; /* the PS snapshot SNAPSHOT took under this op */
  coord_wk_call *call = calloc(1, sizeof *call);
  int rc = TSR_ENOMEM;
  if (call) {
    call->w = w;
    call->op = op;
    call->step = step;
    rc = coord_wk_send(w, WK_M_EVAL, &req.base,
                       (uint32_t)(co->o->closure_timeout_s * 1000),
                       coord_wk_on_eval, call);
  }
  if (rc) {
    free(call);
    char msg[COORD_MSG_MAX];
    snprintf(msg, sizeof msg, "worker:%d: %s", i, tsr_strerror(rc));
    coord_event ev = {.kind = COORD_EV_EVAL_DONE, .op = op, .index = i,
                      .status = rc, .msg = msg};
    coord__post(co, &ev);
  }
}

/* ---- shutdown -----------------------------------------------------------*/

static void coord_wk_on_shutdown(const tsr_rpc_result *r, void *data) {
  coord_wk_call *call = data;
  coord_wk *w = call->w;
  coord *co = w->co;
  (void)r;
  free(call);
  w->inflight--;
  if (--co->shutdown_pending == 0) {
    coord_event ev = {.kind = COORD_EV_SHUTDOWN_DONE, .op = co->shutdown_op};
    coord__post(co, &ev);
  }
}

void coord__wk_shutdown(coord *co) {
  for (int i = 0; i < co->n_wk; i++) {
    coord_wk *w = &co->wk[i];
    if (!tsr_rpc_client_connected(w->cli)) continue;
    Tessera__Worker__ShutdownRequest req =
        TESSERA__WORKER__SHUTDOWN_REQUEST__INIT;
    coord_wk_call *call = calloc(1, sizeof *call);
    if (!call) return;
    call->w = w;
    if (coord_wk_send(w, WK_M_SHUTDOWN, &req.base, 5000, coord_wk_on_shutdown,
                      call) == 0)
      co->shutdown_pending++;
    else
      free(call);
  }
}

static void coord_wk_closed(void *data) { (void)data; }

void coord__wk_close(coord *co) {
  if (!co->wk) return;
  for (int i = 0; i < co->n_wk; i++)
    if (co->wk[i].cli) {
      tsr_rpc_client_close(co->wk[i].cli, coord_wk_closed, NULL);
      co->wk[i].cli = NULL;
    }
}
