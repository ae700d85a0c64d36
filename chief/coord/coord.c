/* The coordinator's state machine (see coord.h). Every callback updates the
 * state and calls coord__pump(), which moves the phase on; a 100 ms timer
 * also pumps, for deadlines, waits and monitoring. Nothing here blocks.
 */
#include "chief/coord/coord.h"
#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"
#include "common/trace.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const coord__phase_names[] = {
    "connect", "setup", "train", "pause", "save", "eval", "recover",
    "final", "shutdown", "done"};

void chief_coord_opts_init(chief_coord_opts *o) {
  memset(o, 0, sizeof *o);
  o->wait_timeout_s = 300;
  o->ps_timeout_s = 600;
  o->closure_timeout_s = 600;
  o->heartbeat_timeout_s = 10;
}

void coord__note(coord *co, const char *fmt, ...) {
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  if (co->progress &&
      chief_progress_get_mode(co->progress) == CHIEF_PROGRESS_BAR)
    chief_progress_note(co->progress, "%s", line);
  tsr_info("%s", line);
}

void coord__fail(coord *co, int status, const char *fmt, ...) {
  if (co->phase == COORD_DONE) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(co->fail_msg, sizeof co->fail_msg, fmt, ap);
  va_end(ap);
  tsr_error("%s", co->fail_msg);
  co->exit_status = status;
  co->phase = COORD_DONE;
  uv_stop(&co->loop);
}

void coord__set_phase(coord *co, coord_phase p) {
  if (co->phase == p) return;
  tsr_debug("phase %s -> %s", coord__phase_names[co->phase],
            coord__phase_names[p]);
  co->phase = p;
  co->t_phase = tsr_now_s();
  co->stage = 0;
}

int64_t coord__global_step(const coord *co) {
  int64_t done = chief_sched_done_steps(co->sched);
  if (co->job.mode == TSR_MODE_SYNC && co->n_wk > 0) return done / co->n_wk;
  return done;
}

/* ---- monitoring -------------------------------------------------------- */

/* Mean loss of the last closures (NaN before the first). */
double coord__recent_loss(const coord *co) {
  double sum = 0;
  int64_t n = 0;
  for (int i = 0; i < co->n_recent; i++) {
    sum += co->recent_loss[i];
    n += co->recent_steps[i];
  }
  return n > 0 ? sum / (double)n : NAN;
}

void coord__scalars(coord *co, double now) {
  if (!co->metrics) return;
  int64_t step = coord__global_step(co);
  if (co->loss_n > 0) {
    chief_metrics_scalar(co->metrics, CHIEF_TAG_LOSS, step,
                         co->loss_sum / (double)co->loss_n, 0);
    co->loss_sum = 0;
    co->loss_n = 0;
  }
  if (co->progress) {
    double eps = chief_progress_examples_per_sec(co->progress);
    double sps = chief_progress_steps_per_sec(co->progress);
    if (eps > 0)
      chief_metrics_scalar(co->metrics, CHIEF_TAG_EXAMPLES_PER_SEC, step, eps,
                           0);
    if (sps > 0)
      chief_metrics_scalar(co->metrics, CHIEF_TAG_STEPS_PER_SEC, step, sps, 0);
  }
  if (co->job.mode == TSR_MODE_ASYNC) {
    chief_metrics_scalar(co->metrics, CHIEF_TAG_STALENESS, step,
                         (double)co->max_staleness, 0);
    co->max_staleness = 0;
  }
  for (int i = 0; i < co->n_wk; i++) {
    coord_wk *w = &co->wk[i];
    if (w->busy_s <= 0) continue;
    char tag[64];
    snprintf(tag, sizeof tag, "worker/%d/examples_per_sec", i);
    chief_metrics_scalar(co->metrics, tag, step,
                         (double)w->examples / w->busy_s, 0);
    double net = w->pull_s + w->push_s, all = w->busy_s;
    snprintf(tag, sizeof tag, "worker/%d/network_wait_share", i);
    chief_metrics_scalar(co->metrics, tag, step, all > 0 ? net / all : 0, 0);
  }
  chief_metrics_flush(co->metrics);
  co->t_last_scalar = now;
}

static void coord_progress(coord *co, double now) {
  if (!co->progress && co->total_steps > 0) {
    /* created once the length of the run is known (epochs need the
     * workers' data sizes first) */
    chief_progress_opts po;
    memset(&po, 0, sizeof po);
    po.total_steps = co->total_steps;
    po.out = stderr;
    if (chief_progress_create(&co->progress, &po)) co->progress = NULL;
  }
  if (!co->progress) return;
  double loss = coord__recent_loss(co);
  chief_progress_update(co->progress, coord__global_step(co), co->examples,
                        loss, now);
}

/* ---- phases ------------------------------------------------------------ */

static bool coord_ckpt_enabled(const coord *co) {
  return co->job.checkpoint_dir != NULL;
}

/* Epoch-based runs learn their length from the workers' shares. */
static void coord_fix_total(coord *co) {
  if (co->total_steps > 0) return;
  int64_t per_epoch = 0;
  int known = 0;
  for (int i = 0; i < co->n_wk; i++) {
    coord_wk *w = &co->wk[i];
    if (w->st == CW_CONFIGURING || w->st == CW_CONNECTED ||
        (w->st == CW_DOWN && !w->ever_ready))
      return; /* wait until every worker has answered once */
    if (w->examples_share > 0) {
      per_epoch += (w->examples_share + co->job.batch_size - 1) /
                   co->job.batch_size;
      known++;
    }
  }
  if (known == 0) {
    coord__fail(co, 2, "%s: the job gives epochs but no worker knows the "
                "size of its data; give \"steps\"", co->job.path);
    return;
  }
  /* Workers that failed to configure still own a share of the data in a
   * file-sharded set; count the known ones only and say so. */
  if (known < co->n_wk)
    tsr_warn("%d of %d workers reported their data size; an epoch is "
             "counted over those", known, co->n_wk);
  if (co->job.mode == TSR_MODE_SYNC) per_epoch /= co->n_wk;
  if (per_epoch < 1) per_epoch = 1;
  co->total_steps = per_epoch * co->job.epochs;
  int64_t worker_steps = co->job.mode == TSR_MODE_SYNC
                             ? co->total_steps * co->n_wk
                             : co->total_steps;
  chief_sched_set_total(co->sched, worker_steps);
  coord__note(co, "%" PRId64 " epoch(s) of %" PRId64 " steps: %" PRId64
              " steps", co->job.epochs, per_epoch, co->total_steps);
}

static void coord_manifest_and_commit(coord *co) {
  json_t *m = json_object();
  json_object_set_new(m, "run_id", json_integer((json_int_t)co->run_id));
  json_object_set_new(m, "wall_time", json_real(tsr_wall_s()));
  json_object_set_new(m, "examples", json_integer(co->examples));
  json_object_set_new(m, "num_ps", json_integer(co->n_ps));
  json_object_set_new(m, "seed", json_integer((json_int_t)co->job.seed));
  json_object_set_new(m, "model_digest", json_string(co->model_digest));
  if (co->job.model) json_object_set(m, "model", co->job.model);
  json_object_set_new(m, "optimizer",
                      json_string(tsr_optim_name(co->job.optimizer.kind)));
  json_t *vars = json_array();
  for (size_t v = 0; v < co->n_vars; v++) {
    json_t *o = json_object();
    json_object_set_new(o, "name", json_string(co->vars[v].name));
    json_t *shape = json_array();
    for (int d = 0; d < co->vars[v].rank; d++)
      json_array_append_new(shape, json_integer(co->vars[v].shape[d]));
    json_object_set_new(o, "shape", shape);
    json_object_set_new(o, "kind", json_string(co->vars[v].sparse
                                                   ? "row_sparse"
                                                   : "dense"));
    int ns = 0;
    for (size_t k = 0; k < co->n_shards; k++)
      if ((size_t)co->shards[k].var == v) ns = co->shards[k].num_shards;
    json_object_set_new(o, "num_shards", json_integer(ns));
    json_t *init = json_object();
    json_object_set_new(init, "name",
                        json_string(kern_init_name(co->vars[v].init.kind)));
    json_object_set_new(init, "a", json_real(co->vars[v].init.a));
    json_object_set_new(init, "b", json_real(co->vars[v].init.b));
    json_object_set_new(init, "fan_in", json_integer(co->vars[v].init.fan_in));
    json_object_set_new(init, "fan_out",
                        json_integer(co->vars[v].init.fan_out));
    json_object_set_new(o, "init", init);
    json_array_append_new(vars, o);
  }
  json_object_set_new(m, "variables", vars);
  char err[512];
  int rc = chief_ckpt_commit(co->job.checkpoint_dir, co->save_step, m, err,
                             sizeof err);
  json_decref(m);
  if (rc) {
    tsr_warn("checkpoint of step %" PRId64 " not committed: %s",
             co->save_step, err);
    return;
  }
  co->have_ckpt = true;
  co->last_ckpt_step = co->save_step;
  co->t_last_ckpt = tsr_now_s();
  tsr_info("checkpoint of step %" PRId64 " committed", co->save_step);
  int removed = chief_ckpt_prune(co->job.checkpoint_dir,
                                 co->job.checkpoint_keep, err, sizeof err);
  if (removed < 0) tsr_warn("pruning checkpoints: %s", err);
}

/* A PS was lost: anything but SETUP/CONNECT goes to RECOVER. */
static bool coord_ps_lost(coord *co) {
  for (int i = 0; i < co->n_ps; i++)
    if (co->ps[i].lost) return true;
  return false;
}

static void coord_enter_recover(coord *co) {
  if (co->phase == COORD_RECOVER) return;
  chief_sched_pause(co->sched, true);
  /* forget the closures in flight: they ran against a PS that is gone */
  chief_sched_rewind(co->sched, chief_sched_done_steps(co->sched));
  coord__set_phase(co, COORD_RECOVER);
  if (co->trace) co->trace_recover_us = tsr_trace_now_us();
  co->t_last_wait_note = 0;
  for (int i = 0; i < co->n_ps; i++)
    if (co->ps[i].lost)
      coord__note(co, "ps:%d (%s) was lost: training paused until it is "
                  "back", i, co->ps[i].addr->addr);
}

/* " ps:1 (addr) worker:0 (addr)": who has not answered yet. */
static void coord_missing(const coord *co, char *buf, size_t len) {
  size_t off = 0;
  buf[0] = 0;
  for (int i = 0; i < co->n_ps && off + 64 < len; i++)
    if (!co->ps[i].connected)
      off += (size_t)snprintf(buf + off, len - off, " ps:%d (%s)", i,
                              co->ps[i].addr->addr);
  for (int i = 0; i < co->n_wk && off + 64 < len; i++)
    if (co->wk[i].st == CW_DOWN)
      off += (size_t)snprintf(buf + off, len - off, " worker:%d (%s)", i,
                              co->wk[i].addr->addr);
}

static void coord_pump_connect(coord *co, double now) {
  bool ps_ok = coord__ps_all_connected(co);
  int wk_up = co->n_wk - coord__wk_count(co, CW_DOWN);
  if (ps_ok && wk_up == co->n_wk) {
    coord__note(co, "cluster ready: %d ps, %d worker(s)", co->n_ps, co->n_wk);
    coord__set_phase(co, COORD_SETUP);
    return;
  }
  double waited = now - co->t_phase;
  if (waited > co->o->wait_timeout_s) {
    if (ps_ok && wk_up > 0) {
      tsr_warn("starting with %d of %d workers after %.0f s; the others get "
               "work when they come up", wk_up, co->n_wk, waited);
      coord__set_phase(co, COORD_SETUP);
      return;
    }
    char missing[512];
    coord_missing(co, missing, sizeof missing);
    coord__fail(co, 1, "cluster not ready after %.0f s; missing:%s", waited,
                missing);
    return;
  }
  if (now - co->t_last_wait_note >= 5.0) {
    co->t_last_wait_note = now;
    char missing[512];
    coord_missing(co, missing, sizeof missing);
    if (waited >= 1.0)
      coord__note(co, "waiting for:%s (%.0f s of %.0f s)", missing, waited,
                  co->o->wait_timeout_s);
  }
}

static void coord_pump_setup(coord *co) {
  if (co->pending > 0) return;
  if (co->pending_errors) {
    if (coord_ps_lost(co)) {
      co->pending_errors = 0;
      coord__set_phase(co, COORD_CONNECT);
      return;
    }
    coord__fail(co, 1, "%s", co->pending_msg);
    return;
  }
  char err[512];
  switch (co->stage) {
    case 0: /* create the variables */
      co->stage = 1;
      coord__ps_setup(co);
      return;
    case 1: { /* resume from a checkpoint, or take the first one */
      co->stage = 2;
      if (!coord_ckpt_enabled(co)) return;
      int64_t step;
      json_t *m = NULL;
      int rc = chief_ckpt_latest(co->job.checkpoint_dir, &step, &m, err,
                                 sizeof err);
      if (rc == 0) {
        json_t *dig = json_object_get(m, "model_digest");
        if (json_is_string(dig) &&
            strcmp(json_string_value(dig), co->model_digest) != 0)
          tsr_warn("the checkpoint of step %" PRId64 " was made with "
                   "another model (digest %s, now %s); restoring it anyway",
                   step, json_string_value(dig), co->model_digest);
        json_t *ex = json_object_get(m, "examples");
        if (json_is_integer(ex)) co->examples = json_integer_value(ex);
        json_decref(m);
        co->resumed_from = step;
        co->have_ckpt = true;
        co->last_ckpt_step = step;
        coord__note(co, "resuming from the checkpoint of step %" PRId64,
                    step);
        if (co->metrics) chief_metrics_session_start(co->metrics, step);
        coord__ps_restore(co, step);
        return;
      }
      if (rc != TSR_ENOTFOUND) tsr_warn("%s", err);
      /* the first checkpoint, so a lost PS always has one to go back to */
      co->save_step = 0;
      if (chief_ckpt_prepare(co->job.checkpoint_dir, 0, err, sizeof err)) {
        coord__fail(co, 1, "%s", err);
        return;
      }
      coord__ps_save(co, 0);
      co->stage = 3;
      return;
    }
    case 3:
      coord_manifest_and_commit(co);
      /* fall through */
    case 2: {
      int64_t start = co->resumed_from > 0 ? co->resumed_from : 0;
      int64_t wsteps = co->job.mode == TSR_MODE_SYNC ? start * co->n_wk
                                                     : start;
      chief_sched_rewind(co->sched, wsteps);
      int64_t every = co->job.checkpoint_every_steps;
      co->next_ckpt_step = every > 0 ? start + every : INT64_MAX;
      int64_t ev = co->job.eval_every_steps;
      co->next_eval_step = ev > 0 && co->has_eval ? start + ev : INT64_MAX;
      co->t_train_start = tsr_now_s();
      co->t_last_ckpt = co->t_train_start;
      chief_sched_pause(co->sched, false);
      coord__set_phase(co, COORD_TRAIN);
      return;
    }
    default:
      return;
  }
}

static void coord_pump_train(coord *co, double now) {
  coord__wk_configure_ready(co);
  if (co->phase != COORD_TRAIN) return;
  coord_fix_total(co);
  if (co->phase != COORD_TRAIN) return;
  int ready = coord__wk_count(co, CW_READY);
  int configuring = coord__wk_count(co, CW_CONFIGURING);
  int failed = coord__wk_count(co, CW_FAILED);
  if (failed == co->n_wk) {
    coord__fail(co, 1, "no worker could be configured; last error: %s",
                co->wk[0].last_error[0] ? co->wk[0].last_error : "?");
    return;
  }
  if (co->total_steps == 0) return; /* still learning the epoch size */
  if (chief_sched_finished(co->sched)) {
    co->t_train_end = now;
    coord__set_phase(co, COORD_FINAL);
    return;
  }
  int64_t step = coord__global_step(co);
  if (coord_ckpt_enabled(co) &&
      (step >= co->next_ckpt_step ||
       (co->job.checkpoint_every_secs > 0 &&
        now - co->t_last_ckpt >= co->job.checkpoint_every_secs))) {
    co->ckpt_due = true;
  }
  if (step >= co->next_eval_step) co->eval_due = true;
  if (co->ckpt_due || co->eval_due) {
    co->resume_phase = COORD_TRAIN;
    chief_sched_pause(co->sched, true);
    coord__set_phase(co, COORD_PAUSE);
    return;
  }
  /* sync: every step needs every worker, so none starts before all that
   * are coming have answered their configuration (one that starts early
   * runs steps alone that the others then push too late) */
  if (co->job.mode == TSR_MODE_SYNC &&
      configuring + coord__wk_count(co, CW_CONNECTED) > 0 &&
      chief_sched_inflight(co->sched, -1) == 0 &&
      chief_sched_done_steps(co->sched) == 0)
    return;
  if (ready == 0 && configuring == 0 && now - co->t_phase > 1.0 &&
      now - co->t_last_wait_note >= 10.0) {
    co->t_last_wait_note = now;
    coord__note(co, "no worker is ready; waiting for one to come back");
  }
  coord__wk_dispatch(co);
  coord__wk_release_idle(co);
}

static void coord_pump_pause(coord *co) {
  /* pinned (ssp, sync): bring every worker level before the pause holds;
   * one with nothing to run meanwhile must not hold the others back */
  coord__wk_dispatch(co);
  coord__wk_release_idle(co);
  if (coord__wk_inflight(co) > 0) return;
  if (co->ckpt_due) {
    char err[512];
    co->save_step = coord__global_step(co);
    if (co->have_ckpt && co->save_step == co->last_ckpt_step) {
      co->ckpt_due = false; /* nothing new since */
      co->next_ckpt_step = co->save_step + co->job.checkpoint_every_steps;
      coord_pump_pause(co);
      return;
    }
    if (chief_ckpt_prepare(co->job.checkpoint_dir, co->save_step, err,
                           sizeof err)) {
      tsr_warn("checkpoint skipped: %s", err);
      co->ckpt_due = false;
      coord__set_phase(co, co->resume_phase);
      return;
    }
    coord__set_phase(co, COORD_SAVE);
    if (co->trace) co->trace_save_us = tsr_trace_now_us();
    coord__ps_save(co, co->save_step);
    return;
  }
  if (co->eval_due) {
    coord__set_phase(co, COORD_EVAL);
    if (co->trace) co->trace_eval_us = tsr_trace_now_us();
    coord__wk_eval(co, coord__global_step(co));
    return;
  }
  chief_sched_pause(co->sched, false);
  coord__set_phase(co, co->resume_phase);
}

static void coord_pump_save(coord *co) {
  if (co->pending > 0) return;
  if (co->trace)
    tsr_trace_end(co->trace, tsr_trace_pid(TSR_TASK_CHIEF, 0), 0, "chief",
                  "checkpoint", co->trace_save_us);
  co->ckpt_due = false;
  int64_t every = co->job.checkpoint_every_steps;
  co->next_ckpt_step = every > 0 ? co->save_step + every : INT64_MAX;
  if (co->pending_errors) {
    tsr_warn("checkpoint of step %" PRId64 " failed: %s", co->save_step,
             co->pending_msg);
    co->pending_errors = 0;
    co->t_last_ckpt = tsr_now_s();
  } else {
    coord_manifest_and_commit(co);
  }
  if (coord_ps_lost(co)) {
    coord_enter_recover(co);
    return;
  }
  coord__set_phase(co, COORD_PAUSE);
  coord_pump_pause(co);
}

static void coord_pump_eval(coord *co) {
  if (co->pending > 0) return;
  if (co->trace)
    tsr_trace_end(co->trace, tsr_trace_pid(TSR_TASK_CHIEF, 0), 0, "chief",
                  "evaluation", co->trace_eval_us);
  co->eval_due = false;
  int64_t ev = co->job.eval_every_steps;
  int64_t step = coord__global_step(co);
  co->next_eval_step = ev > 0 ? step + ev : INT64_MAX;
  if (co->pending_errors) {
    tsr_warn("evaluation at step %" PRId64 " failed: %s", step,
             co->pending_msg);
    co->pending_errors = 0;
  }
  if (coord_ps_lost(co)) {
    coord_enter_recover(co);
    return;
  }
  coord__set_phase(co, COORD_PAUSE);
  coord_pump_pause(co);
}

static void coord_pump_recover(coord *co, double now) {
  if (co->pending > 0) return;
  if (co->stage == 0) {
    if (coord__wk_inflight(co) > 0 && now - co->t_phase < 60) return;
    if (!coord__ps_all_connected(co)) {
      if (now - co->t_phase > co->o->ps_timeout_s) {
        coord__fail(co, 1, "a lost parameter server did not come back within "
                    "%.0f s", co->o->ps_timeout_s);
        return;
      }
      if (now - co->t_last_wait_note >= 5.0) {
        co->t_last_wait_note = now;
        for (int i = 0; i < co->n_ps; i++)
          if (!co->ps[i].connected)
            coord__note(co, "waiting for ps:%d (%s) to come back (%.0f s)",
                        i, co->ps[i].addr->addr, now - co->t_phase);
      }
      return;
    }
    co->stage = 1;
    co->pending_errors = 0;
    coord__ps_setup(co);
    return;
  }
  if (co->pending_errors) {
    /* lost again while recovering: start over */
    co->pending_errors = 0;
    co->stage = 0;
    co->t_phase = now;
    return;
  }
  if (co->stage == 1) {
    co->stage = 2;
    if (co->have_ckpt) {
      coord__ps_restore(co, co->last_ckpt_step);
      return;
    }
    tsr_warn("no checkpoint to restore: the lost PS starts its shards from "
             "their initial values");
  }
  if (co->stage == 2) {
    int64_t step = co->have_ckpt ? co->last_ckpt_step
                                 : coord__global_step(co);
    int64_t wsteps = co->job.mode == TSR_MODE_SYNC ? step * co->n_wk : step;
    chief_sched_rewind(co->sched, wsteps);
    coord__wk_leave_all(co);
    for (int i = 0; i < co->n_ps; i++) co->ps[i].lost = false;
    co->restarts_ps++;
    coord__note(co, "recovered: every PS restored the checkpoint of step "
                "%" PRId64 "; resuming from there", step);
    if (co->metrics) chief_metrics_session_start(co->metrics, step);
    if (co->trace)
      tsr_trace_end(co->trace, tsr_trace_pid(TSR_TASK_CHIEF, 0), 0, "chief",
                    "recovery from a lost PS", co->trace_recover_us);
    int64_t every = co->job.checkpoint_every_steps;
    co->next_ckpt_step = every > 0 ? step + every : INT64_MAX;
    chief_sched_pause(co->sched, false);
    coord__set_phase(co, COORD_TRAIN);
  }
}

static void coord_pump_final(coord *co) {
  if (!co->final_ckpt_done) {
    co->final_ckpt_done = true;
    if (coord_ckpt_enabled(co) &&
        !(co->have_ckpt && co->last_ckpt_step == coord__global_step(co))) {
      co->ckpt_due = true;
      co->resume_phase = COORD_FINAL;
      coord__set_phase(co, COORD_PAUSE);
      coord_pump_pause(co);
      return;
    }
  }
  if (!co->final_eval_done) {
    co->final_eval_done = true;
    if (co->has_eval) {
      co->eval_due = true;
      co->resume_phase = COORD_FINAL;
      coord__set_phase(co, COORD_PAUSE);
      coord_pump_pause(co);
      return;
    }
  }
  coord__set_phase(co, COORD_SHUTDOWN);
  if (!co->o->keep_cluster) {
    coord__wk_shutdown(co);
    coord__ps_shutdown(co);
  }
}

void coord__pump(coord *co) {
  double now = tsr_now_s();
  if (co->phase == COORD_DONE) return;
  if (co->stop_requested) {
    coord__fail(co, 130, "interrupted at step %" PRId64,
                coord__global_step(co));
    return;
  }
  if (coord_ps_lost(co) &&
      (co->phase == COORD_TRAIN || co->phase == COORD_PAUSE ||
       co->phase == COORD_FINAL))
    coord_enter_recover(co);
  switch (co->phase) {
    case COORD_CONNECT: coord_pump_connect(co, now); break;
    case COORD_SETUP: coord_pump_setup(co); break;
    case COORD_TRAIN: coord_pump_train(co, now); break;
    case COORD_PAUSE: coord_pump_pause(co); break;
    case COORD_SAVE: coord_pump_save(co); break;
    case COORD_EVAL: coord_pump_eval(co); break;
    case COORD_RECOVER: coord_pump_recover(co, now); break;
    case COORD_FINAL: coord_pump_final(co); break;
    case COORD_SHUTDOWN:
      if (co->pending == 0) {
        co->phase = COORD_DONE;
        uv_stop(&co->loop);
      }
      break;
    case COORD_DONE: break;
  }
}

void coord__on_tick(uv_timer_t *t) {
  coord *co = t->data;
  double now = tsr_now_s();
  if (co->phase >= COORD_TRAIN && co->phase <= COORD_FINAL) {
    coord_progress(co, now);
    if (now - co->t_last_scalar >= 2.0) {
      coord__scalars(co, now);
      coord__ps_stats(co);
    }
  }
  coord__pump(co);
}

void coord__on_signal(uv_signal_t *s, int signum) {
  coord *co = s->data;
  if (co->stop_requested) {
    tsr_warn("second signal: exiting now");
    exit(130);
  }
  tsr_warn("signal %d: stopping (a second one exits at once)", signum);
  co->stop_requested = true;
  coord__pump(co);
}
