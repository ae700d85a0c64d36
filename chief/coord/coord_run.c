/* tessera-chief's setup and teardown around the coordinator: read the
 * cluster, the job and the token, build the model's variable list and its
 * placement, make the state machine (coord_sm.h), open the clients, the
 * status service and the monitoring, tell the machine which checkpoints
 * are on disk, run the loop, then write the report, the trace and the
 * summary. Errors before the loop starts are configuration errors (exit
 * 2) named with their key or file.
 */
#include "artifacts/weights/export_keras.h"
#include "chief/coord/coord_io.h"
#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"
#include "common/trace.h"
#include "kernels/optim.h"
#include "worker/model.h"

#include <inttypes.h>
#include <math.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- setup ------------------------------------------------------------- */

/* dir/name in a new string (NULL when out of memory). */
static char *coord_join(const char *dir, const char *name) {
  size_t n = strlen(dir) + strlen(name) + 2;
  char *p = malloc(n);
  if (p) snprintf(p, n, "%s/%s", dir, name);
  return p;
}

/* Makes a relative path of the job file relative to its folder. */
static int coord_abs(const char *dir, char **path) {
  if ((*path)[0] == '/') return 0;
  char *abs = coord_join(dir, *path);
  if (!abs) return TSR_ENOMEM;
  free(*path);
  *path = abs;
  return 0;
}

static int coord_load(coord *co, char *err, size_t errlen) {
  int rc;
  co->cluster = *co->o->cluster; /* borrowed: tessera-chief frees it */
  if (!tsr_cluster_is_chief(&co->cluster)) {
    snprintf(err, errlen, "this task is %s:%d; tessera-chief runs as the "
             "chief (or as worker 0 when the cluster has no chief job)",
             tsr_task_type_name(co->cluster.task_type),
             co->cluster.task_index);
    return TSR_ECONFIG;
  }
  if (!co->o->job_path) {
    snprintf(err, errlen, "no job: pass --job JOB.json");
    return TSR_ECONFIG;
  }
  rc = tsr_job_load(co->o->job_path, co->o->overrides, &co->job, err, errlen);
  if (rc) return rc;
  /* dense "allreduce" needs a PS only for sparse tables (coord_plan) */
  if (!co->job.dense_allreduce &&
      (rc = tsr_cluster_check_ps_training(&co->cluster, err, errlen)))
    return rc;
  if (co->cluster.n[TSR_TASK_WORKER] < 1) {
    snprintf(err, errlen, "cluster.worker: training needs at least one "
             "worker task");
    return TSR_ECONFIG;
  }
  if (!co->job.model) {
    snprintf(err, errlen, "%s: no \"model\"", co->o->job_path);
    return TSR_ECONFIG;
  }
  if (!co->job.data || !json_object_get(co->job.data, "train")) {
    snprintf(err, errlen, "%s: no \"data\": {\"train\": ...}",
             co->o->job_path);
    return TSR_ECONFIG;
  }
  tsr_job_dir(&co->job, co->job_dir, sizeof co->job_dir);
  /* The job the workers get: the resolved model inline. */
  json_t *send = json_deep_copy(co->job.raw);
  json_object_set(send, "model", co->job.model);
  co->job_json = json_dumps(send, JSON_COMPACT);
  char *model_text = json_dumps(co->job.model, JSON_COMPACT | JSON_SORT_KEYS);
  json_decref(send);
  if (!co->job_json || !model_text) {
    free(model_text);
    return TSR_ENOMEM;
  }
  unsigned char h[8];
  crypto_generichash(h, sizeof h, (const unsigned char *)model_text,
                     strlen(model_text), NULL, 0);
  free(model_text);
  for (int i = 0; i < 8; i++)
    snprintf(co->model_digest + 2 * i, 3, "%02x", h[i]);
  if (co->job.checkpoint_dir) {
    if ((rc = coord_abs(co->job_dir, &co->job.checkpoint_dir))) return rc;
    if ((rc = chief_ckpt_check_writable(co->job.checkpoint_dir, err, errlen)))
      return rc;
  }
  return 0;
}

/* initial_weights: raw files the PS initialize from, in the checkpoint
 * root (a folder every PS can read, as checkpoints need). */
static int coord_initial_weights(coord *co, char *err, size_t errlen) {
  const char *dir = co->job.checkpoint_dir;
  if (!dir) {
    snprintf(err, errlen, "initial_weights: a cluster run needs checkpoint.dir"
             " (the parameter servers read the weights from there)");
    return TSR_ECONFIG;
  }
  char wp[4096];
  const char *w = co->job.initial_weights;
  if (w[0] != '/') snprintf(wp, sizeof wp, "%s/%s", co->job_dir, w);
  else snprintf(wp, sizeof wp, "%s", w);
  chief_import_var *iv = calloc(co->n_vars ? co->n_vars : 1, sizeof *iv);
  char *paths = calloc(co->n_vars ? co->n_vars : 1, 256);
  int rc = iv && paths ? 0 : TSR_ENOMEM;
  for (size_t i = 0; !rc && i < co->n_vars; i++)
    iv[i] = (chief_import_var){co->vars[i].name, co->vars[i].rank,
                               co->vars[i].shape, NULL};
  if (!rc)
    rc = chief_initial_weights_files(wp, co->job.model, dir, iv, co->n_vars,
                                     paths, 256, err, errlen);
  for (size_t i = 0; !rc && i < co->n_vars; i++)
    snprintf(co->var_init_path[i], sizeof co->var_init_path[i], "%s",
             paths + i * 256);
  if (!rc)
    tsr_info("initial weights from %s (%zu variables)", wp, co->n_vars);
  free(iv);
  free(paths);
  return rc;
}

/* Shards of the variables that live on the PS: every one, or with dense
 * "allreduce" the sparse tables only (the dense ones are the workers'). */
static int coord_place(coord *co, const int *slots, char *err,
                       size_t errlen) {
  int n_ps = co->cluster.n[TSR_TASK_PS];
  size_t n = co->n_vars, na = n ? n : 1, k = 0;
  if (!co->job.dense_allreduce)
    return tsr_partition_plan(&co->job.partitioner, co->vars, slots, n, n_ps,
                              &co->shards, &co->n_shards, err, errlen);
  tsr_var *sv = calloc(na, sizeof *sv);
  int *ss = calloc(na, sizeof *ss);
  size_t *map = calloc(na, sizeof *map);
  int rc = sv && ss && map ? 0 : TSR_ENOMEM;
  for (size_t v = 0; !rc && v < n; v++) {
    if (co->vars[v].kind != TSR_VAR_ROW_SPARSE) continue;
    sv[k] = co->vars[v];
    ss[k] = slots[v];
    map[k++] = v;
  }
  if (!rc && k > 0 && n_ps < 1) {
    rc = tsr_errf(err, errlen, TSR_ECONFIG, "cluster.ps: the model's %zu "
                  "sparse table(s) (%s, ...) live on parameter servers even "
                  "with dense \"allreduce\"; give the cluster at least one "
                  "ps task", k, sv[0].name);
  } else if (!rc && k > 0) {
    rc = tsr_partition_plan(&co->job.partitioner, sv, ss, k, n_ps,
                            &co->shards, &co->n_shards, err, errlen);
    for (size_t i = 0; !rc && i < co->n_shards; i++)
      co->shards[i].var = (int)map[co->shards[i].var];
  } else if (!rc) {
    co->shards = NULL;
    co->n_shards = 0;
    tsr_info("dense \"allreduce\" and no sparse table: every variable lives "
             "on the workers, no PS is needed%s",
             n_ps ? " (the cluster's PS stay idle)" : "");
  }
  if (!rc)
    tsr_info("dense \"allreduce\": %zu dense variable(s) on each of the %d "
             "worker(s), %zu sparse table(s) on %d PS", n - k,
             co->cluster.n[TSR_TASK_WORKER], k, n_ps);
  free(sv);
  free(ss);
  free(map);
  return rc;
}

static int coord_plan(coord *co, char *err, size_t errlen) {
  tsr_model *m = NULL;
  int rc = tsr_model_from_job(&co->job, NULL, &m, err, errlen);
  if (rc) return rc;
  const tsr_var *vi;
  size_t n;
  tsr_model_variables(m, &vi, &n);
  size_t na = n ? n : 1;
  co->vars = calloc(na, sizeof *co->vars);
  co->var_optim = calloc(na, sizeof *co->var_optim);
  co->var_init_path = calloc(na, sizeof *co->var_init_path);
  int *slots = calloc(na, sizeof *slots);
  if (!co->vars || !co->var_optim || !co->var_init_path || !slots) {
    rc = TSR_ENOMEM;
    goto out;
  }
  for (size_t i = 0; i < n; i++) {
    co->vars[i] = vi[i];
    tsr_var_optimizer(&vi[i], &co->job.optimizer, &co->var_optim[i]);
    slots[i] = kern_optim_num_slots(&co->var_optim[i]);
  }
  co->n_vars = n;
  for (size_t i = 0; i < n; i++)
    for (size_t j = 0; j < i; j++)
      if (strcmp(co->vars[i].name, co->vars[j].name) == 0) {
        snprintf(err, errlen, "%s: the model has two variables named \"%s\"; "
                 "give its layers distinct names", co->job.model_source,
                 co->vars[i].name);
        rc = TSR_ECONFIG;
        goto out;
      }
  if (co->job.initial_weights && (rc = coord_initial_weights(co, err, errlen)))
    goto out;
  char summary[2048];
  tsr_model_summary(m, summary, sizeof summary);
  tsr_info("model (%s):\n%s", co->job.model_source, summary);
  rc = coord_place(co, slots, err, errlen);
out:
  free(slots);
  tsr_model_free(m);
  return rc;
}

/* The machine's configuration from the job and the flags. */
static int coord_machine(coord *co) {
  int n = co->n_ps + co->n_wk;
  co->names = calloc((size_t)n, sizeof *co->names);
  const char **ps_names = calloc((size_t)co->n_ps, sizeof *ps_names);
  const char **wk_names = calloc((size_t)co->n_wk, sizeof *wk_names);
  int rc = TSR_ENOMEM;
  if (!co->names || !ps_names || !wk_names) goto out;
  for (int i = 0; i < co->n_ps; i++) {
    snprintf(co->names[i], sizeof co->names[i], "ps:%d (%s)", i,
             co->cluster.jobs[TSR_TASK_PS][i].addr);
    ps_names[i] = co->names[i];
  }
  for (int i = 0; i < co->n_wk; i++) {
    snprintf(co->names[co->n_ps + i], sizeof co->names[0], "worker:%d (%s)",
             i, co->cluster.jobs[TSR_TASK_WORKER][i].addr);
    wk_names[i] = co->names[co->n_ps + i];
  }
  const chief_coord_opts *o = co->o;
  coord_sm_config c = {
      .n_ps = co->n_ps, .n_wk = co->n_wk,
      .ps_names = ps_names, .wk_names = wk_names,
      .job_path = co->job.path,
      .mode = co->job.mode,
      .steps = co->job.steps, .epochs = co->job.epochs,
      .batch_size = co->job.batch_size,
      .steps_per_closure = co->job.steps_per_closure,
      .max_inflight = 2,
      .ckpt = co->job.checkpoint_dir != NULL,
      .ckpt_every_steps = co->job.checkpoint_every_steps,
      .ckpt_every_secs = co->job.checkpoint_every_secs,
      .ckpt_keep = co->job.checkpoint_keep,
      .has_eval = json_object_get(co->job.data, "eval") != NULL,
      .eval_every_steps = co->job.eval_every_steps,
      .keep_cluster = o->keep_cluster,
      /* sync: a worker that comes back JOINs every PS and is handed its
       * next sync step (ps/consist.c), so it takes part again */
      .sync_rejoin = true,
      /* dense "allreduce": every step is a step of the whole ring */
      .lockstep = co->job.dense_allreduce,
      /* a job that had finished: a cluster that is not there within
       * seconds has stopped after it */
      .wait_timeout_s = co->done_step > 0 && o->wait_timeout_s > 10
                            ? 10
                            : o->wait_timeout_s,
      .ps_timeout_s = o->ps_timeout_s,
      .closure_timeout_s = o->closure_timeout_s,
  };
  rc = coord_sm_new(&co->sm, &c);
out:
  free(ps_names);
  free(wk_names);
  return rc;
}

/* A chief started after its job had finished (killed once it had told
 * the cluster to stop): the newest committed checkpoint says it is the
 * job's last (its step is its manifest's total_steps) and is intact. Its
 * step, or 0. Quiet: a damaged one is said once, by the list of intact
 * checkpoints the restart posts (coord_post_checkpoints). */
static int64_t coord_done_step(const coord *co) {
  const char *root = co->job.checkpoint_dir;
  if (!root) return 0;
  char err[512], dir[4096];
  int64_t step;
  json_t *m = NULL;
  if (chief_ckpt_latest(root, &step, &m, err, sizeof err)) return 0;
  json_t *t = json_object_get(m, "total_steps");
  bool done = json_is_integer(t) && json_integer_value(t) > 0 &&
              step >= json_integer_value(t) &&
              chief_ckpt_dir(root, step, dir, sizeof dir) == 0 &&
              chief_ckpt_verify(dir, m, err, sizeof err) == 0 &&
              chief_ckpt_verify_chain(root, step, m, err, sizeof err) == 0;
  json_decref(m);
  return done ? step : 0;
}

/* Whether `path` holds a summary of more steps than `steps` (a finished
 * run's, which a later chief that got less far must not replace), or,
 * with `or_as_many` (a chief that found the job finished and ran no step),
 * of as many: the run's own summary says more than that chief knows. */
static bool coord_summary_has_more(const char *path, int64_t steps,
                                   bool or_as_many) {
  json_error_t je;
  json_t *old = json_load_file(path, 0, &je);
  json_t *st = json_object_get(old, "steps");
  bool more = json_is_integer(st) &&
              (json_integer_value(st) > steps ||
               (or_as_many && json_integer_value(st) == steps));
  json_decref(old);
  return more;
}

/* A restarted chief: the committed checkpoints on disk that are intact
 * (damaged ones are skipped, saying why), newest first; when none is,
 * every committed one, so the restores fail with their reasons. */
static void coord_post_checkpoints(coord *co) {
  if (!co->job.checkpoint_dir) return;
  int64_t *steps = NULL;
  size_t n = 0;
  char err[512];
  if (chief_ckpt_list_intact(co->job.checkpoint_dir, &steps, &n, err,
                             sizeof err)) {
    tsr_warn("%s", err);
    return;
  }
  if (n == 0) { /* none intact: the restores fail and say why, the run too */
    free(steps);
    steps = NULL;
    if (chief_ckpt_list(co->job.checkpoint_dir, &steps, &n, err, sizeof err)) {
      tsr_warn("%s", err);
      return;
    }
  }
  /* each one's base: pruning keeps what a kept increment builds on */
  int64_t *bases = n ? malloc(n * sizeof *bases) : NULL;
  for (size_t i = 0; bases && i < n; i++) {
    char dir[4096];
    int64_t st;
    json_t *m = NULL;
    bases[i] = steps[i];
    if (chief_ckpt_dir(co->job.checkpoint_dir, steps[i], dir, sizeof dir) ==
            0 &&
        chief_ckpt_read(dir, &st, &m, NULL, 0, err, sizeof err) == 0)
      bases[i] = chief_ckpt_base_step(m, steps[i]);
    json_decref(m);
  }
  if (n) {
    coord_event ev = {.kind = COORD_EV_CHECKPOINTS, .steps = steps,
                      .n_steps = n, .bases = bases};
    coord__post(co, &ev);
  }
  free(bases);
  free(steps);
}

/* The summary's checkpoint lines: the last good one and the failed. The
 * arrays are the caller's to free. */
static void coord_summary_ckpts(coord *co, chief_summary *s, int64_t **steps,
                                const char ***reasons) {
  const coord_ckpt_failure *f;
  size_t n = coord_sm_ckpt_failures(co->sm, &f);
  s->last_ckpt_step = coord_sm_last_ckpt(co->sm);
  *steps = NULL;
  *reasons = NULL;
  if (!n) return;
  *steps = calloc(n, sizeof **steps);
  *reasons = calloc(n, sizeof **reasons);
  if (!*steps || !*reasons) return;
  for (size_t i = 0; i < n; i++) {
    (*steps)[i] = f[i].step;
    (*reasons)[i] = f[i].reason;
  }
  s->n_failed_ckpts = n;
  s->failed_ckpt_steps = *steps;
  s->failed_ckpt_reasons = *reasons;
}

int chief_coord_run(const chief_coord_opts *o) {
  coord *co = calloc(1, sizeof *co);
  if (!co) return 1;
  co->o = o;
  co->exit_status = 1;
  co->save_step = -1;
  tsr_job_init(&co->job);
  tsr_cluster_init(&co->cluster);
  coord_actions_init(&co->acts);
  char err[1024];
  int status = 2;
  int rc = coord_load(co, err, sizeof err);
  if (rc == 0) rc = coord_plan(co, err, sizeof err);
  if (rc) {
    tsr_error("%s", err);
    goto out_free;
  }
  randombytes_buf(&co->run_id, sizeof co->run_id);
  co->run_id >>= 1; /* keep it positive in JSON */
  /* dense "allreduce": the ring's group, above any earlier chief's */
  co->group_epoch = (uint64_t)(tsr_wall_s() * 1000.0);
  co->n_ps = co->cluster.n[TSR_TASK_PS];
  co->n_wk = co->cluster.n[TSR_TASK_WORKER];
  if ((co->done_step = coord_done_step(co)) > 0)
    tsr_info("the checkpoint of step %" PRId64 " is the job's last: the job "
             "has finished unless the cluster says otherwise", co->done_step);
  if ((rc = coord_machine(co))) {
    tsr_error("%s: %s", co->job.path, tsr_strerror(rc));
    goto out_free;
  }
  if (uv_loop_init(&co->loop)) goto out_free;
  status = 1;
  tsr_rpc_opts ro;
  memset(&ro, 0, sizeof ro);
  ro.name = "chief";
  ro.token = o->token;
  ro.token_len = o->token_len;
  ro.default_deadline_ms = 60000;
  ro.idle_timeout_ms = (uint32_t)(o->heartbeat_timeout_s * 1000);
  ro.heartbeat_ms = ro.idle_timeout_ms / 4 ? ro.idle_timeout_ms / 4 : 1;
  /* a PS or worker started again is seen within a second (the default
   * backoff let a restarted PS wait up to 5 s for its restore) */
  ro.backoff_max_ms = 1000;
  ro.plain_frames = o->plain_frames;
  if (tsr_rpc_ctx_new(&co->rpc, &co->loop, &ro)) goto out_loop;
  if (co->job.logdir && coord_abs(co->job_dir, &co->job.logdir)) goto out_rpc;
  if (chief_metrics_open(&co->metrics, co->job.logdir, NULL, err,
                         sizeof err)) {
    tsr_warn("TensorBoard logs disabled: %s", err);
    co->metrics = NULL;
    chief_metrics_open(&co->metrics, NULL, NULL, err, sizeof err);
  }
  chief_summary_policy_init(&co->sum_pol, co->job.summary_every_steps,
                            co->job.summary_every_secs);
  if (co->metrics) chief_metrics_job_info(co->metrics, &co->job);
  if (o->trace_path) {
    if (tsr_trace_create(&co->trace, 0)) {
      tsr_error("--trace: out of memory");
      goto out_rpc;
    }
    tsr_trace_name_process(co->trace, tsr_trace_pid(TSR_TASK_CHIEF, 0),
                           "chief");
    for (int i = 0; i < co->cluster.n[TSR_TASK_WORKER]; i++) {
      char nm[32];
      snprintf(nm, sizeof nm, "worker:%d", i);
      tsr_trace_name_process(co->trace, tsr_trace_pid(TSR_TASK_WORKER, i), nm);
    }
    for (int i = 0; i < co->cluster.n[TSR_TASK_PS]; i++) {
      char nm[32];
      snprintf(nm, sizeof nm, "ps:%d", i);
      tsr_trace_name_process(co->trace, tsr_trace_pid(TSR_TASK_PS, i), nm);
    }
  }
  co->t_start = tsr_now_s();
  if (coord__ps_open(co) || coord__wk_open(co) || coord__status_open(co))
    goto out_clients;
  uv_timer_init(&co->loop, &co->tick);
  co->tick.data = co;
  uv_timer_start(&co->tick, coord__on_tick, 100, 100);
  uv_signal_init(&co->loop, &co->sigint);
  uv_signal_init(&co->loop, &co->sigterm);
  co->sigint.data = co->sigterm.data = co;
  uv_signal_start(&co->sigint, coord__on_signal, SIGINT);
  uv_signal_start(&co->sigterm, coord__on_signal, SIGTERM);
  coord__note(co, TSR_LOG_INFO,
              "run %016" PRIx64 ": %zu variable(s) in %zu shard(s) over "
              "%d ps; %d worker(s); mode %s", co->run_id, co->n_vars,
              co->n_shards, co->n_ps, co->n_wk,
              co->job.mode == TSR_MODE_ASYNC ? "async"
              : co->job.mode == TSR_MODE_SYNC ? "sync" : "ssp");
  coord_post_checkpoints(co);
  if (!co->stopped) uv_run(&co->loop, UV_RUN_DEFAULT);
  status = co->stopped ? co->exit_status : 1;
  uv_timer_stop(&co->tick);
  uv_close((uv_handle_t *)&co->tick, NULL);
  uv_close((uv_handle_t *)&co->sigint, NULL);
  uv_close((uv_handle_t *)&co->sigterm, NULL);
out_clients:
  coord__status_close(co);
  coord__wk_close(co);
  coord__ps_close(co);
  uv_run(&co->loop, UV_RUN_DEFAULT);
  if (co->progress) chief_progress_finish(co->progress);
  if (co->metrics) {
    coord__scalars(co, tsr_now_s());
    if (co->job.logdir) {
      chief_report_opts rep = {NULL, co->job.path};
      char *rp = coord_join(co->job.logdir, CHIEF_REPORT_HTML);
      if (rp && chief_report_write(rp, chief_metrics_series(co->metrics),
                                   &rep, err, sizeof err))
        tsr_warn("report.html: %s", err);
      free(rp);
    }
  }
  /* a run that lost a PS and went on from initial values, or that asked
   * for checkpoints and committed none, did not end well */
  char bad_end[512] = "";
  if (status == 0 && !co->finished_on_disk && co->sm) {
    if (coord_sm_initial_restarts(co->sm) > 0)
      snprintf(bad_end, sizeof bad_end, "a lost PS started its shards again "
               "from their initial values %d time(s) (the job keeps no "
               "checkpoint): what they had learned was lost",
               coord_sm_initial_restarts(co->sm));
    else if (co->job.checkpoint_dir && coord_sm_last_ckpt(co->sm) < 0)
      snprintf(bad_end, sizeof bad_end, "no checkpoint was committed under "
               "%s although the job asked for checkpoints (every save "
               "failed)", co->job.checkpoint_dir);
    if (bad_end[0]) {
      tsr_error("%s", bad_end);
      status = 1;
    }
  }
  {
    chief_summary s;
    memset(&s, 0, sizeof s);
    s.steps = co->finished_on_disk ? co->done_step : coord__step(co);
    s.steps_run = (co->job.mode == TSR_MODE_SYNC ||
                   co->job.dense_allreduce) && co->n_wk > 0
                      ? co->worker_steps_run / co->n_wk
                      : co->worker_steps_run;
    s.examples = co->examples;
    s.examples_run = co->examples_run;
    /* training time, from the first closure to the last step: setup,
     * the final checkpoint and evaluation are not in the rate */
    double t0 = coord_sm_train_start(co->sm), t1 = coord_sm_train_end(co->sm);
    s.seconds = t1 > 0 && t0 > 0 ? t1 - t0 : tsr_now_s() - co->t_start;
    double last_loss = coord__recent_loss(co);
    if (isnan(last_loss) && co->finished_on_disk) last_loss = co->disk_loss;
    s.has_loss = !isnan(last_loss);
    s.final_loss = last_loss;
    s.eval = co->eval_vals;
    s.n_eval = co->n_eval;
    s.restarts_worker = coord_sm_restarts_worker(co->sm);
    s.restarts_ps = coord_sm_restarts_ps(co->sm);
    s.skipped_records = co->skipped_records;
    int64_t resumed = co->finished_on_disk ? co->done_step
                                           : coord_sm_resumed_from(co->sm);
    s.restarts_chief = resumed > 0 ? 1 : 0;
    s.resumed_from_step = resumed;
    s.logdir = co->job.logdir;
    s.checkpoint_dir = co->job.checkpoint_dir;
    s.exit_status = status;
    s.error = bad_end[0] ? bad_end : status ? coord_sm_fail_msg(co->sm) : NULL;
    int64_t *fsteps;
    const char **freasons;
    coord_summary_ckpts(co, &s, &fsteps, &freasons);
    if (status == 0) chief_summary_print(stdout, &s);
    if (o->summary_json && coord_summary_has_more(o->summary_json, s.steps,
                                                  co->finished_on_disk)) {
      if (co->finished_on_disk)
        tsr_info("--summary-json: %s is kept: it is the finished run's own, "
                 "of its %" PRId64 " steps", o->summary_json, s.steps);
      else
        tsr_warn("--summary-json: %s is kept: it reports more steps than "
                 "the %" PRId64 " this run reached", o->summary_json,
                 s.steps);
    } else if (o->summary_json &&
             chief_summary_write_json(o->summary_json, &s, err, sizeof err))
      tsr_warn("--summary-json: %s", err);
    free(fsteps);
    free(freasons);
  }
  if (co->trace) {
    if (tsr_trace_write(co->trace, o->trace_path, err, sizeof err))
      tsr_warn("--trace: %s", err);
    else
      tsr_info("trace of %zu events written to %s (open it in "
               "https://ui.perfetto.dev or chrome://tracing)",
               tsr_trace_count(co->trace), o->trace_path);
    tsr_trace_free(co->trace);
  }
  if (co->metrics) chief_metrics_close(co->metrics);
  json_decref(co->input_affine);
  if (co->progress) chief_progress_free(co->progress);
out_rpc:
  if (co->rpc) tsr_rpc_ctx_free(co->rpc);
out_loop:
  uv_run(&co->loop, UV_RUN_DEFAULT);
  if (uv_loop_close(&co->loop)) tsr_warn("event loop closed with handles open");
out_free:
  co->dense_live = false;
  co->dense_sending = 0; /* the loop is over: no call holds it */
  coord__dense_forget(co);
  chief_ckpt_files_free(&co->ckpt_files);
  free(co->ps);
  free(co->wk);
  coord_sm_free(co->sm);
  coord_actions_free(&co->acts);
  for (size_t i = 0; i < co->q_len; i++)
    free(co->q[(co->q_head + i) % co->q_cap].steps);
  free(co->q);
  free(co->names);
  free(co->vars);
  free(co->var_optim);
  free(co->var_init_path);
  free(co->shards);
  free(co->job_json);
  tsr_job_free(&co->job);
  free(co);
  return status;
}
