/* The coordinator's I/O core (coord_io.h): the event queue that feeds the
 * machine, the execution of its actions, the 100 ms tick (the machine's
 * timer, progress, TensorBoard scalars) and signals.
 *
 * Events are queued, never fed from inside a step: an action that fails
 * at once posts its answer, which the drain loop feeds after the current
 * step's actions are done. FAIL and FINISH stop the loop; nothing after
 * them is executed.
 */
#include "chief/coord/coord_io.h"
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

void chief_coord_opts_init(chief_coord_opts *o) {
  memset(o, 0, sizeof *o);
  o->wait_timeout_s = 300;
  o->ps_timeout_s = 600;
  o->closure_timeout_s = 600;
  o->heartbeat_timeout_s = 10;
}

static void coord_log_line(coord *co, int level, const char *line) {
  if (co->progress &&
      chief_progress_get_mode(co->progress) == CHIEF_PROGRESS_BAR &&
      level <= TSR_LOG_INFO)
    chief_progress_note(co->progress, "%s", line);
  tsr_log(level, "%s", line);
}

void coord__note(coord *co, int level, const char *fmt, ...) {
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  coord_log_line(co, level, line);
}

int64_t coord__step(const coord *co) {
  return co->sm ? coord_sm_global_step(co->sm) : 0;
}

/* ---- actions ------------------------------------------------------------ */

int coord__member_subscribe(coord *co, coord_member_cb cb, void *data) {
  if (co->n_member_subs >= COORD_MAX_MEMBER_SUBS) return TSR_EBUSY;
  co->member_subs[co->n_member_subs].cb = cb;
  co->member_subs[co->n_member_subs].data = data;
  co->n_member_subs++;
  return 0;
}

static void coord_member(coord *co, const coord_action *a) {
  coord_member_ev ev = {.worker = a->index, .up = a->up, .epoch = a->op,
                        .why = a->msg, .at = tsr_now_s()};
  for (int i = 0; i < co->n_member_subs; i++)
    co->member_subs[i].cb(co, &ev, co->member_subs[i].data);
}

static void coord_stop(coord *co, int status) {
  co->stopped = true;
  co->exit_status = status;
  uv_stop(&co->loop);
}

json_t *coord__ckpt_manifest(coord *co, int64_t step) {
  char dir[4096], err[512];
  int64_t s;
  json_t *m = NULL;
  if (chief_ckpt_dir(co->job.checkpoint_dir, step, dir, sizeof dir) ||
      chief_ckpt_read(dir, &s, &m, NULL, 0, err, sizeof err))
    return NULL;
  return m;
}

void coord__outcome_put(const coord *co, json_t *m) {
  double loss = coord__recent_loss(co);
  if (isfinite(loss)) json_object_set_new(m, "loss", json_real(loss));
  if (!co->n_eval) return;
  json_t *ev = json_object();
  for (size_t i = 0; i < co->n_eval; i++)
    if (isfinite(co->eval_vals[i].value))
      json_object_set_new(ev, co->eval_vals[i].name,
                          json_real(co->eval_vals[i].value));
  json_object_set_new(m, "eval", ev);
  json_object_set_new(m, "eval_step", json_integer(co->eval_step));
}

void coord__outcome_take(coord *co) {
  co->disk_loss = NAN;
  json_t *m = coord__ckpt_manifest(co, co->done_step);
  if (!m) return;
  json_t *ex = json_object_get(m, "examples");
  if (json_is_integer(ex)) co->examples = json_integer_value(ex);
  json_t *loss = json_object_get(m, "loss");
  if (json_is_number(loss)) co->disk_loss = json_number_value(loss);
  json_t *ev = json_object_get(m, "eval");
  json_t *es = json_object_get(m, "eval_step");
  if (!json_is_integer(es) || json_integer_value(es) != co->done_step)
    ev = NULL; /* an earlier evaluation's figures are not the run's last */
  const char *k;
  json_t *v;
  size_t n = 0;
  json_object_foreach(ev, k, v) {
    if (n >= sizeof co->eval_vals / sizeof co->eval_vals[0]) break;
    if (!json_is_number(v)) continue;
    snprintf(co->eval_names[n], sizeof co->eval_names[n], "%s", k);
    co->eval_vals[n].name = co->eval_names[n];
    co->eval_vals[n].value = json_number_value(v);
    n++;
  }
  co->n_eval = n;
  json_decref(m);
}

/* A restarted chief: the examples seen up to the restored checkpoint. */
static void coord_resumed(coord *co, int64_t step) {
  json_t *m = coord__ckpt_manifest(co, step);
  if (m) {
    json_t *ex = json_object_get(m, "examples");
    if (json_is_integer(ex)) co->examples = json_integer_value(ex);
    json_decref(m);
  }
}

static void coord_exec(coord *co, const coord_action *a) {
  int32_t tpid = tsr_trace_pid(TSR_TASK_CHIEF, 0);
  switch (a->kind) {
    case COORD_ACT_SETUP_PS: coord__ps_setup(co, a->op, a->hold); break;
    case COORD_ACT_RESTORE:
      if (co->trace) co->trace_restore_us = tsr_trace_now_us();
      coord__ps_restore(co, a->op, a->step);
      break;
    case COORD_ACT_RESTORE_PS:
      coord__ps_restore_alone(co, a->op, a->index, a->step);
      break;
    case COORD_ACT_REWIND:
      if (a->resumed) coord_resumed(co, a->step);
      if (co->metrics) chief_metrics_session_start(co->metrics, a->step);
      if (co->trace && !a->resumed && co->trace_recover_us)
        tsr_trace_end(co->trace, tpid, 0, "chief", "recovery from a lost PS",
                      co->trace_recover_us);
      break;
    case COORD_ACT_PAUSE:
      if (a->index == 1) { /* a global recovery starts */
        if (co->trace) co->trace_recover_us = tsr_trace_now_us();
        coord__ring_break(co, "a parameter server was lost: the run goes "
                              "back to a checkpoint");
      }
      break;
    case COORD_ACT_SAVE:
      if (co->trace) co->trace_save_us = tsr_trace_now_us();
      coord__ps_save(co, a->op, a->step);
      break;
    case COORD_ACT_SAVE_WAIT: coord__ps_save_wait(co, a->op, a->step); break;
    case COORD_ACT_COMMIT:
      coord__ps_commit(co, a->op, a->step, a->total);
      break;
    case COORD_ACT_DISCARD: coord__fs_remove(co, a->step, "failed"); break;
    case COORD_ACT_PRUNE: coord__fs_remove(co, a->step, "pruned"); break;
    case COORD_ACT_CONFIGURE: coord__wk_configure(co, a->index); break;
    case COORD_ACT_DISPATCH: coord__wk_dispatch(co, &a->closure); break;
    case COORD_ACT_COUNT: coord__wk_count(co, a); break;
    case COORD_ACT_RELEASE: coord__ps_release(co, a->index); break;
    case COORD_ACT_SNAPSHOT: coord__ps_snapshot(co, a->op); break;
    case COORD_ACT_UNSNAPSHOT: coord__ps_unsnapshot(co, a->op); break;
    case COORD_ACT_MEMBER: coord_member(co, a); break;
    case COORD_ACT_EVALUATE:
      if (co->trace) co->trace_eval_us = tsr_trace_now_us();
      coord__wk_eval(co, a->op, a->index, a->step);
      break;
    case COORD_ACT_NOTE: coord_log_line(co, a->level, a->msg); break;
    case COORD_ACT_SHUTDOWN:
      co->shutdown_op = a->op;
      co->shutdown_pending = 0;
      coord__wk_shutdown(co);
      coord__ps_shutdown(co);
      if (co->shutdown_pending == 0) {
        coord_event ev = {.kind = COORD_EV_SHUTDOWN_DONE, .op = a->op};
        coord__post(co, &ev);
      }
      break;
    case COORD_ACT_FAIL:
      if (co->done_step > 0 && coord_sm_resumed_from(co->sm) <= 0 &&
          coord__step(co) == 0) {
        /* nothing restored or trained by this chief, and the job had
         * finished before it started: the cluster has stopped after it */
        co->finished_on_disk = true;
        coord__outcome_take(co);
        tsr_info("the job had finished: its last checkpoint (step %" PRId64
                 ") is committed and intact, and the cluster is gone (%s); "
                 "nothing is left to do", co->done_step, a->msg);
        coord_stop(co, 0);
        break;
      }
      tsr_error("%s", a->msg);
      coord_stop(co, a->status);
      break;
    case COORD_ACT_FINISH: coord_stop(co, a->status); break;
  }
}

/* The checkpoint's spans: its snapshots (SAVE out to every PS holding
 * one), its writing (SAVE out to every file written: "checkpoint"), its
 * commit (the chief's checks and the manifest). */
static void coord_trace_ckpt(coord *co, const coord_event *ev) {
  if (!co->trace || !co->trace_save_us || ev->status) return;
  int32_t tpid = tsr_trace_pid(TSR_TASK_CHIEF, 0);
  switch (ev->kind) {
    case COORD_EV_SAVE_DONE:
      tsr_trace_end(co->trace, tpid, 0, "chief", "checkpoint snapshot",
                    co->trace_save_us);
      break;
    case COORD_EV_SAVE_WRITTEN:
      tsr_trace_end(co->trace, tpid, 0, "chief", "checkpoint",
                    co->trace_save_us);
      co->trace_commit_us = tsr_trace_now_us();
      break;
    case COORD_EV_CKPT_COMMITTED:
      if (co->trace_commit_us)
        tsr_trace_end(co->trace, tpid, 0, "chief", "checkpoint commit",
                      co->trace_commit_us);
      co->trace_commit_us = 0;
      break;
    default: break;
  }
}

/* ---- the queue ---------------------------------------------------------- */

static void coord_drain(coord *co) {
  if (co->draining) return;
  co->draining = true;
  while (co->q_len > 0 && !co->stopped) {
    coord_qev e = co->q[co->q_head];
    co->q_head = (co->q_head + 1) % co->q_cap;
    co->q_len--;
    if (e.has_msg) e.ev.msg = e.msg;
    if (e.steps) e.ev.steps = e.steps;
    if (e.steps && e.has_bases) e.ev.bases = e.steps + e.ev.n_steps;
    e.ev.now = tsr_now_s();
    if (e.ev.kind == COORD_EV_RESTORE_DONE && co->trace &&
        co->trace_restore_us) { /* every PS has answered its restore */
      tsr_trace_end(co->trace, tsr_trace_pid(TSR_TASK_CHIEF, 0), 0, "chief",
                    "restore", co->trace_restore_us);
      co->trace_restore_us = 0;
    }
    coord_trace_ckpt(co, &e.ev);
    co->acts.n = 0;
    int rc = coord_sm_step(co->sm, &e.ev, &co->acts);
    free(e.steps);
    /* the actions are copied out: executing one may post events, and
     * the next step reuses the buffer */
    size_t n = co->acts.n;
    coord_action *list = NULL;
    if (n) {
      list = malloc(n * sizeof *list);
      if (list)
        memcpy(list, co->acts.a, n * sizeof *list);
      else
        rc = TSR_ENOMEM;
    }
    for (size_t i = 0; list && i < n && !co->stopped; i++)
      coord_exec(co, &list[i]);
    free(list);
    if (rc && !co->stopped) {
      tsr_error("the coordinator ran out of memory");
      coord_stop(co, 1);
    }
  }
  co->draining = false;
}

void coord__post(coord *co, const coord_event *ev) {
  if (co->stopped) return;
  if (co->q_len == co->q_cap) {
    size_t cap = co->q_cap ? co->q_cap * 2 : 64;
    coord_qev *q = malloc(cap * sizeof *q);
    if (!q) {
      tsr_error("the coordinator ran out of memory");
      coord_stop(co, 1);
      return;
    }
    for (size_t i = 0; i < co->q_len; i++)
      q[i] = co->q[(co->q_head + i) % co->q_cap];
    free(co->q);
    co->q = q;
    co->q_cap = cap;
    co->q_head = 0;
  }
  coord_qev *e = &co->q[(co->q_head + co->q_len) % co->q_cap];
  memset(e, 0, sizeof *e);
  e->ev = *ev;
  e->ev.msg = NULL;
  e->ev.steps = NULL;
  e->ev.bases = NULL;
  if (ev->msg) {
    snprintf(e->msg, sizeof e->msg, "%s", ev->msg);
    e->has_msg = true;
  }
  if (ev->steps && ev->n_steps) {
    /* the steps, then their bases when given, in one block */
    size_t n = ev->n_steps;
    e->steps = malloc(2 * n * sizeof *e->steps);
    if (e->steps) {
      memcpy(e->steps, ev->steps, n * sizeof *e->steps);
      if (ev->bases) {
        memcpy(e->steps + n, ev->bases, n * sizeof *e->steps);
        e->has_bases = true;
      }
    } else {
      e->ev.n_steps = 0;
    }
  }
  co->q_len++;
  coord_drain(co);
}

void coord__post_simple(coord *co, coord_ev_kind kind, int index,
                        const char *msg) {
  coord_event ev = {.kind = kind, .index = index, .msg = msg};
  coord__post(co, &ev);
}

/* ---- monitoring --------------------------------------------------------- */

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
  int64_t step = coord__step(co);
  if (co->loss_n > 0) {
    chief_metrics_scalar(co->metrics, CHIEF_TAG_LOSS, step,
                         co->loss_sum / (double)co->loss_n, 0);
    co->loss_sum = 0;
    co->loss_n = 0;
  }
  chief_train_acc_flush(&co->train_acc, co->metrics, step);
  chief_metrics_scalar(co->metrics, "train/learning_rate", step,
                       tsr_optim_lr(&co->job.optimizer, step), 0);
  if (co->skipped_records > 0)
    chief_metrics_scalar(co->metrics, CHIEF_TAG_SKIPPED, step,
                         (double)co->skipped_records, 0);
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
    if (w->allreduce_steps > 0) {
      /* dense "allreduce": the share of the worker's time blocked on the
       * ring after its compute, and the bytes it all-reduces per step */
      snprintf(tag, sizeof tag, "worker/%d/allreduce_wait_share", i);
      chief_metrics_scalar(co->metrics, tag, step, w->allreduce_s / all, 0);
      snprintf(tag, sizeof tag, "worker/%d/allreduce_bytes_per_step", i);
      chief_metrics_scalar(co->metrics, tag, step,
                           (double)w->allreduce_bytes /
                               (double)w->allreduce_steps, 0);
    }
  }
  chief_metrics_flush(co->metrics);
  co->t_last_scalar = now;
}

static void coord_progress(coord *co, double now) {
  int64_t total = coord_sm_total_steps(co->sm);
  if (!co->progress && total > 0) {
    /* created once the length of the run is known (epochs need the
     * workers' data sizes first) */
    chief_progress_opts po;
    memset(&po, 0, sizeof po);
    po.total_steps = total;
    po.out = stderr;
    if (chief_progress_create(&co->progress, &po)) co->progress = NULL;
  }
  if (!co->progress) return;
  chief_progress_update(co->progress, coord__step(co), co->examples,
                        coord__recent_loss(co), now);
}

void coord__on_tick(uv_timer_t *t) {
  coord *co = t->data;
  double now = tsr_now_s();
  if (coord_sm_training(co->sm)) {
    coord_progress(co, now);
    if (chief_summary_due(&co->sum_pol, coord__step(co),
                          coord_sm_total_steps(co->sm), now))
      coord__scalars(co, now);
    if (now - co->t_last_ps >= 2.0) {
      co->t_last_ps = now;
      coord__ps_stats(co);
    }
  }
  coord__post_simple(co, COORD_EV_TIMER, -1, NULL);
}

void coord__on_signal(uv_signal_t *s, int signum) {
  coord *co = s->data;
  if (co->stop_requested) {
    tsr_warn("second signal: exiting now");
    exit(COORD_EXIT_SIGNAL);
  }
  tsr_warn("signal %d: stopping (a second one exits at once)", signum);
  co->stop_requested = true;
  coord__post_simple(co, COORD_EV_SIGNAL, -1, NULL);
}
