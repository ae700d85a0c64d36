/* The coordinator's side of the workers: one RPC client each, connection
 * tracking (a lost worker's closures go back to the pool; a worker that
 * comes back is configured again), configuration, closures, evaluation and
 * shutdown, over the protocol of proto/worker.proto and worker/wire.h.
 */
#include "chief/coord/coord.h"
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

/* A worker that fails this many closures in a row with its own error (not
 * a lost connection) is left out of the run. */
#define COORD_MAX_CLOSURE_FAILURES 3

typedef struct {
  coord_wk *w;
  chief_closure c;
  bool eval;
  bool shutdown;
} coord_wk_call;

static void coord_wk_leave(coord_wk *w);

static void coord_wk_down(coord_wk *w, const char *why) {
  coord *co = w->co;
  int back = chief_sched_worker_down(co->sched, w->index);
  /* ssp/sync: a worker that is gone must not hold the others back; its
   * first pull or push when it returns joins it again */
  if (co->phase != COORD_SHUTDOWN && co->phase != COORD_DONE)
    coord_wk_leave(w);
  if (w->st == CW_READY || w->st == CW_CONFIGURING) {
    if (co->phase != COORD_SHUTDOWN && co->phase != COORD_DONE)
      coord__note(co, "lost worker:%d (%s): %s; %d closure(s) go back to "
                  "the queue", w->index, w->addr->addr, why, back);
  }
  w->st = CW_DOWN;
}

static void coord_wk_on_state(tsr_rpc_client *c, int connected, int status,
                              void *data) {
  coord_wk *w = data;
  coord *co = w->co;
  (void)c;
  if (connected) {
    if (w->st == CW_DOWN) {
      if (w->ever_ready) {
        w->restarts++;
        co->restarts_worker++;
        coord__note(co, "worker:%d (%s) is back", w->index, w->addr->addr);
      }
      w->st = CW_CONNECTED;
    }
  } else {
    coord_wk_down(w, tsr_strerror(status));
  }
  coord__pump(co);
}

int coord__wk_open(coord *co) {
  co->wk = calloc((size_t)co->n_wk, sizeof *co->wk);
  if (!co->wk) return TSR_ENOMEM;
  for (int i = 0; i < co->n_wk; i++) {
    coord_wk *w = &co->wk[i];
    w->co = co;
    w->index = i;
    w->addr = &co->cluster.jobs[TSR_TASK_WORKER][i];
    w->examples_share = -1;
    int rc = tsr_rpc_client_new(&w->cli, co->rpc, w->addr->addr);
    if (rc) {
      tsr_error("worker:%d (%s): %s", i, w->addr->addr, tsr_strerror(rc));
      return rc;
    }
    tsr_rpc_client_on_state(w->cli, coord_wk_on_state, w);
  }
  return 0;
}

int coord__wk_count(const coord *co, coord_wstate st) {
  int n = 0;
  for (int i = 0; i < co->n_wk; i++) n += co->wk[i].st == st;
  return n;
}

int coord__wk_inflight(const coord *co) {
  int n = 0;
  for (int i = 0; i < co->n_wk; i++) n += co->wk[i].inflight;
  return n;
}

/* Packs a protobuf-c message and sends it; the meta is copied by the RPC
 * layer, so the buffer is freed here. */
static int coord_wk_send(coord_wk *w, uint32_t method,
                         const ProtobufCMessage *msg, uint32_t deadline_ms,
                         tsr_rpc_call_cb cb, coord_wk_call *call) {
  size_t len = protobuf_c_message_get_packed_size(msg);
  uint8_t *buf = malloc(len ? len : 1);
  if (!buf) return TSR_ENOMEM;
  protobuf_c_message_pack(msg, buf);
  tsr_rpc_request req;
  memset(&req, 0, sizeof req);
  req.method = method;
  req.meta = buf;
  req.meta_len = len;
  req.deadline_ms = deadline_ms;
  int rc = tsr_rpc_call(w->cli, &req, cb, call);
  free(buf);
  if (rc == 0) w->inflight++;
  return rc;
}

static bool coord_wk_conn_error(const tsr_rpc_result *r) {
  if (r->remote) return false;
  return r->status == TSR_ECLOSED || r->status == TSR_EUNAVAIL ||
         r->status == TSR_ETIMEOUT || r->status == TSR_ESHUTDOWN;
}

/* ---- configure ----------------------------------------------------------*/

static void coord_wk_on_configure(const tsr_rpc_result *r, void *data) {
  coord_wk_call *call = data;
  coord_wk *w = call->w;
  coord *co = w->co;
  free(call);
  w->inflight--;
  if (w->st != CW_CONFIGURING) {
    coord__pump(co);
    return;
  }
  if (r->status) {
    snprintf(w->last_error, sizeof w->last_error, "%s", r->message);
    if (coord_wk_conn_error(r)) {
      coord_wk_down(w, r->message);
    } else {
      w->st = CW_FAILED;
      coord__note(co, "worker:%d (%s) cannot take part: %s", w->index,
                  w->addr->addr, r->message);
    }
    coord__pump(co);
    return;
  }
  Tessera__Worker__ConfigureResponse *resp =
      tessera__worker__configure_response__unpack(NULL, r->meta_len, r->meta);
  if (resp) {
    w->examples_share = resp->examples;
    snprintf(w->device, sizeof w->device, "%s",
             resp->device ? resp->device : "?");
    tessera__worker__configure_response__free_unpacked(resp, NULL);
  }
  w->st = CW_READY;
  w->ever_ready = true;
  w->left = false; /* its configure joined the PS clocks (ssp, sync) */
  chief_sched_worker_up(co->sched, w->index);
  tsr_info("worker:%d (%s) ready on %s, %" PRId64 " examples per epoch",
           w->index, w->addr->addr, w->device, w->examples_share);
  coord__pump(co);
}

void coord__wk_configure_ready(coord *co) {
  for (int i = 0; i < co->n_wk; i++) {
    coord_wk *w = &co->wk[i];
    if (w->st != CW_CONNECTED) continue;
    Tessera__Worker__ConfigureRequest req =
        TESSERA__WORKER__CONFIGURE_REQUEST__INIT;
    req.run_id = co->run_id;
    req.format_version = WK_FORMAT_VERSION;
    req.worker_index = (uint32_t)i;
    req.num_workers = (uint32_t)co->n_wk;
    req.job_json = co->job_json;
    req.job_dir = co->job_dir;
    req.model_digest = co->model_digest;
    char **addrs = calloc((size_t)co->n_ps, sizeof *addrs);
    Tessera__Worker__Shard *sh = calloc(co->n_shards ? co->n_shards : 1,
                                        sizeof *sh);
    Tessera__Worker__Shard **shp = calloc(co->n_shards ? co->n_shards : 1,
                                          sizeof *shp);
    coord_wk_call *call = calloc(1, sizeof *call);
    if (!addrs || !sh || !shp || !call) {
      free(addrs);
      free(sh);
      free(shp);
      free(call);
      coord__fail(co, 1, "out of memory");
      return;
    }
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
    w->st = CW_CONFIGURING;
    int rc = coord_wk_send(w, WK_M_CONFIGURE, &req.base, 120000,
                           coord_wk_on_configure, call);
    free(addrs);
    free(sh);
    free(shp);
    if (rc) {
      free(call);
      w->st = CW_CONNECTED; /* try again on the next pump */
      tsr_debug("configure worker:%d: %s", i, tsr_strerror(rc));
    }
  }
}

/* ---- closures -----------------------------------------------------------*/

static void coord_wk_on_run(const tsr_rpc_result *r, void *data) {
  coord_wk_call *call = data;
  coord_wk *w = call->w;
  coord *co = w->co;
  chief_closure c = call->c;
  free(call);
  w->inflight--;
  if (r->status) {
    chief_sched_failed(co->sched, c.id, c.generation);
    snprintf(w->last_error, sizeof w->last_error, "%s", r->message);
    if (coord_wk_conn_error(r) && w->st == CW_READY &&
        !tsr_rpc_client_connected(w->cli)) {
      coord_wk_down(w, r->message);
    } else if (c.generation == chief_sched_generation(co->sched)) {
      tsr_warn("worker:%d (%s) failed closure %" PRIu64 " (its steps go "
               "back to the queue): %s", w->index, w->addr->addr, c.id,
               r->message);
      /* a PS that cannot be reached is not the worker's fault: recovery
       * deals with it, and the worker stays in the run */
      bool ps_trouble = r->status == TSR_EUNAVAIL ||
                        r->status == TSR_ECLOSED ||
                        r->status == TSR_ETIMEOUT ||
                        r->status == TSR_ESHUTDOWN ||
                        /* sync: a worker back from the dead pushed a step
                         * the others finished without it; its next
                         * closure starts from the PS's step */
                        r->status == TSR_ESTALE;
      if (r->remote && !ps_trouble &&
          ++w->failures >= COORD_MAX_CLOSURE_FAILURES && w->st == CW_READY) {
        chief_sched_worker_down(co->sched, w->index);
        w->st = CW_FAILED;
        coord_wk_leave(w);
        coord__note(co, "worker:%d (%s) failed %d closures in a row and is "
                    "left out of the run: %s", w->index, w->addr->addr,
                    w->failures, r->message);
      }
    }
    coord__pump(co);
    return;
  }
  Tessera__Worker__RunResponse *resp =
      tessera__worker__run_response__unpack(NULL, r->meta_len, r->meta);
  if (!resp) {
    chief_sched_failed(co->sched, c.id, c.generation);
    tsr_warn("worker:%d sent a RunResponse that does not decode", w->index);
    coord__pump(co);
    return;
  }
  if (resp->steps_done == 0) {
    /* nothing run (its input gave nothing): counted as a failure, so a
     * worker that keeps doing it is left out instead of spinning */
    if (++w->failures >= COORD_MAX_CLOSURE_FAILURES && w->st == CW_READY) {
      chief_sched_worker_down(co->sched, w->index);
      w->st = CW_FAILED;
      coord_wk_leave(w);
      coord__note(co, "worker:%d (%s) ran no step in %d closures in a row "
                  "(its input gives no batch) and is left out of the run",
                  w->index, w->addr->addr, w->failures);
    }
  } else {
    w->failures = 0;
  }
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
      tsr_trace_event *ev = malloc(max * sizeof *ev);
      if (ev && tsr_trace_unpack(r->payload, r->payload_len, ev, max, &n) == 0)
        tsr_trace_append(co->trace, ev, n);
      free(ev);
    }
  }
  if (chief_sched_done(co->sched, c.id, c.generation, resp->steps_done)) {
    w->steps += resp->steps_done;
    w->examples += resp->examples;
    w->busy_s += resp->wall_s;
    w->input_s += resp->input_wait_s;
    w->pull_s += resp->pull_s;
    w->compute_s += resp->compute_s;
    w->push_s += resp->push_s;
    co->examples += resp->examples;
    if (resp->max_staleness > co->max_staleness)
      co->max_staleness = resp->max_staleness;
    if (resp->steps_done > 0 && isfinite(resp->loss_sum)) {
      co->loss_sum += resp->loss_sum;
      co->loss_n += resp->steps_done;
      co->recent_loss[co->recent_at] = resp->loss_sum;
      co->recent_steps[co->recent_at] = resp->steps_done;
      co->recent_at = (co->recent_at + 1) % 16;
      if (co->n_recent < 16) co->n_recent++;
    }
  }
  tessera__worker__run_response__free_unpacked(resp, NULL);
  coord__pump(co);
}

void coord__wk_dispatch(coord *co) {
  chief_closure c;
  while (chief_sched_next(co->sched, &c)) {
    coord_wk *w = &co->wk[c.worker];
    w->left = false; /* the closure joins the PS clocks again */
    w->last_closure = c.id;
    Tessera__Worker__RunRequest req = TESSERA__WORKER__RUN_REQUEST__INIT;
    req.closure_id = c.id;
    req.generation = c.generation;
    req.steps = c.steps;
    req.first_step = c.first_step;
    req.trace = co->trace != NULL;
    coord_wk_call *call = calloc(1, sizeof *call);
    if (!call) {
      chief_sched_failed(co->sched, c.id, c.generation);
      return;
    }
    call->w = w;
    call->c = c;
    int rc = coord_wk_send(w, WK_M_RUN, &req.base,
                           (uint32_t)(co->o->closure_timeout_s * 1000),
                           coord_wk_on_run, call);
    if (rc) {
      free(call);
      chief_sched_failed(co->sched, c.id, c.generation);
      if (rc == TSR_EUNAVAIL || rc == TSR_ESHUTDOWN) coord_wk_down(w, tsr_strerror(rc));
      return;
    }
  }
}

/* ---- membership (ssp, sync) ----------------------------------------------*/

static void coord_wk_on_leave(const ps_result *r, void *data) {
  coord_wk *w = data;
  if (r->status && r->status != TSR_ENOTFOUND)
    tsr_debug("worker:%d leaving a PS: %s", w->index, r->message);
}

/* Tells every PS that worker w's closures so far are over and it no
 * longer counts (ssp, sync: the model's coord__wk_leave). A closure of it
 * that is still queued or running is refused when it joins. */
static void coord_wk_leave(coord_wk *w) {
  coord *co = w->co;
  if (co->job.mode == TSR_MODE_ASYNC || w->left || !co->ps) return;
  w->left = true;
  for (int p = 0; p < co->n_ps; p++)
    if (co->ps[p].cli)
      ps_client_leave(co->ps[p].cli, w->index, co->run_id, w->last_closure,
                      coord_wk_on_leave, w);
}

/* A worker with no closure in flight waits for nothing: it stops counting
 * (the model's coord__wk_release_idle), else the PS would hold the others
 * back for it (ssp) or wait for its gradient (sync) for ever. Its next
 * closure joins again. */
void coord__wk_release_idle(coord *co) {
  if (co->job.mode == TSR_MODE_ASYNC) return;
  for (int i = 0; i < co->n_wk; i++) {
    coord_wk *w = &co->wk[i];
    if (w->left || w->st != CW_READY ||
        chief_sched_inflight(co->sched, i) > 0)
      continue;
    tsr_debug("worker:%d has no closure in flight: it leaves the PS clocks",
              i);
    coord_wk_leave(w);
  }
}

/* After every PS restored a checkpoint: every worker's closures so far are
 * over, whatever the chief thought of it (a PS that restarted has no
 * memory of it, and a closure still queued in a worker cut off earlier
 * would join it and hold the others for ever). */
void coord__wk_leave_all(coord *co) {
  for (int i = 0; i < co->n_wk; i++) {
    co->wk[i].left = false;
    coord_wk_leave(&co->wk[i]);
  }
}

/* ---- evaluation ---------------------------------------------------------*/

static void coord_wk_on_eval(const tsr_rpc_result *r, void *data) {
  coord_wk_call *call = data;
  coord_wk *w = call->w;
  coord *co = w->co;
  int64_t step = call->c.first_step;
  free(call);
  w->inflight--;
  co->pending--;
  if (r->status) {
    co->pending_errors++;
    snprintf(co->pending_msg, sizeof co->pending_msg, "worker:%d: %s",
             w->index, r->message);
    coord__pump(co);
    return;
  }
  Tessera__Worker__EvalResponse *resp =
      tessera__worker__eval_response__unpack(NULL, r->meta_len, r->meta);
  if (!resp) {
    co->pending_errors++;
    snprintf(co->pending_msg, sizeof co->pending_msg,
             "worker:%d: EvalResponse does not decode", w->index);
    coord__pump(co);
    return;
  }
  char line[512];
  size_t off = (size_t)snprintf(line, sizeof line, "eval at step %" PRId64
                                ": loss %.6g", step, resp->loss);
  co->n_eval = 0;
  snprintf(co->eval_names[0], sizeof co->eval_names[0], "loss");
  co->eval_vals[0].name = co->eval_names[0];
  co->eval_vals[0].value = resp->loss;
  co->n_eval = 1;
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
  tessera__worker__eval_response__free_unpacked(resp, NULL);
  coord__note(co, "%s", line);
  coord__pump(co);
}

void coord__wk_eval(coord *co, int64_t step) {
  co->pending_errors = 0;
  for (int k = 0; k < co->n_wk; k++) {
    int i = (co->eval_worker + k) % co->n_wk;
    coord_wk *w = &co->wk[i];
    if (w->st != CW_READY) continue;
    Tessera__Worker__EvalRequest req = TESSERA__WORKER__EVAL_REQUEST__INIT;
    req.eval_id = (uint64_t)step + 1;
    req.step = step;
    coord_wk_call *call = calloc(1, sizeof *call);
    if (!call) break;
    call->w = w;
    call->eval = true;
    call->c.first_step = step;
    int rc = coord_wk_send(w, WK_M_EVAL, &req.base,
                           (uint32_t)(co->o->closure_timeout_s * 1000),
                           coord_wk_on_eval, call);
    if (rc) {
      free(call);
      continue;
    }
    co->pending++;
    co->eval_worker = i + 1;
    coord__pump(co);
    return;
  }
  co->pending_errors++;
  snprintf(co->pending_msg, sizeof co->pending_msg,
           "no worker is ready to evaluate");
  coord__pump(co);
}

/* ---- shutdown -----------------------------------------------------------*/

static void coord_wk_on_shutdown(const tsr_rpc_result *r, void *data) {
  coord_wk_call *call = data;
  coord_wk *w = call->w;
  coord *co = w->co;
  (void)r;
  free(call);
  w->inflight--;
  co->pending--;
  coord__pump(co);
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
    call->shutdown = true;
    if (coord_wk_send(w, WK_M_SHUTDOWN, &req.base, 5000, coord_wk_on_shutdown,
                      call) == 0)
      co->pending++;
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
