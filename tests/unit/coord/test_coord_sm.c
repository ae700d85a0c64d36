/* The coordinator's state machine through the failure sequences that hung
 * or lost work in real clusters, one test each: a restarted chief on an
 * epochs job, a finished job run again, a restore that keeps failing, bad
 * data on a worker (in its configuration and in a closure), worker errors
 * in an epochs job, a full disk, a PS lost, a chief and a worker lost
 * together, both workers lost at once, a worker back in sync mode,
 * pruning, and runs where nothing answers any more. Every test runs on
 * the simulated cluster of sim.h, which checks the invariants at every
 * step. */
#include "sim.h"

static void start(sim *s) {
  sim_all_up(s);
  sim_answer(s, 0, -1, false, NULL); /* SETUP_PS */
}

/* A plain run: every closure answered, exact step count, shutdown. */
static void happy_path(void **state) {
  (void)state;
  coord_sm_config c = sim_config(2, 2, TSR_MODE_ASYNC, 95);
  sim s;
  sim_init(&s, &c, 0);
  start(&s);
  sim_run_calm(&s, 1000);
  assert_true(s.ended);
  assert_int_equal(s.status, 0);
  assert_int_equal(coord_sm_global_step(s.sm), 95);
  assert_int_equal(s.counted_steps, 95);
  assert_int_equal(s.count[COORD_ACT_SHUTDOWN], 1);
  sim_free(&s);
}

/* A chief restarted on an epochs job resumes at its checkpoint's step,
 * and only once the workers have said how much data they have (a rewind
 * before that clamped the step to a total of 0 and trained it all
 * again). */
static void restarted_chief_resumes_an_epochs_job(void **state) {
  (void)state;
  coord_sm_config c = sim_ckpt_config(2, 2, TSR_MODE_ASYNC, 0, 50);
  c.epochs = 20;
  sim s;
  sim_init(&s, &c, 0);
  sim_restart_on(&s, (const int64_t[]){0, 150}, 2);
  start(&s);
  assert_int_equal(s.last_restore, 150);
  sim_answer(&s, 0, -1, false, NULL); /* RESTORE */
  /* the total is not known yet: no rewind, no closure */
  assert_int_equal(s.count[COORD_ACT_DISPATCH], 0);
  assert_int_equal(s.count[COORD_ACT_REWIND], 0);
  sim_ready(&s, 0);
  sim_ready(&s, 1);
  /* 100 examples each, batch 10: 20 steps an epoch, 400 in all */
  assert_int_equal(coord_sm_total_steps(s.sm), 400);
  assert_int_equal(s.last_rewind, 150);
  assert_true(s.last_rewind_resumed);
  assert_int_equal(s.first_dispatch_step, 150);
  sim_run_calm(&s, 1000);
  assert_int_equal(s.status, 0);
  assert_int_equal(coord_sm_global_step(s.sm), 400);
  assert_int_equal(s.counted_steps, 250);
  assert_int_equal(coord_sm_resumed_from(s.sm), 150);
  sim_free(&s);
}

/* The same job run again on its checkpoint folder: it resumes at the end,
 * says so, evaluates and finishes without training or saving. */
static void finished_job_run_again(void **state) {
  (void)state;
  coord_sm_config c = sim_ckpt_config(1, 2, TSR_MODE_SYNC, 0, 0);
  c.epochs = 5;
  c.has_eval = true;
  sim s;
  sim_init(&s, &c, 0);
  /* 2 x 100 examples / 10 / 2 workers x 5 */
  sim_restart_on(&s, (const int64_t[]){50}, 1);
  start(&s);
  sim_answer(&s, 0, -1, false, NULL); /* RESTORE */
  sim_ready(&s, 0);
  sim_ready(&s, 1);
  assert_true(sim_noted(&s, "already done"));
  assert_int_equal(s.count[COORD_ACT_DISPATCH], 0);
  assert_true(s.op_active);
  assert_int_equal(s.op_kind, COORD_ACT_EVALUATE);
  sim_run_calm(&s, 100);
  assert_int_equal(s.status, 0);
  assert_int_equal(s.count[COORD_ACT_SAVE], 0);
  assert_int_equal(s.count[COORD_ACT_DISPATCH], 0);
  assert_int_equal(coord_sm_global_step(s.sm), 50);
  sim_free(&s);
}

/* A restore that fails: one note per try naming the PS and the reason, a
 * bounded number of tries, then the run fails with that reason. */
static void failed_restore_is_bounded(void **state) {
  (void)state;
  coord_sm_config c = sim_ckpt_config(2, 1, TSR_MODE_ASYNC, 100, 0);
  sim s;
  sim_init(&s, &c, 0);
  sim_restart_on(&s, (const int64_t[]){40}, 1);
  start(&s);
  for (int t = 0; t < 3; t++) {
    assert_true(s.op_active);
    assert_int_equal(s.op_kind, COORD_ACT_RESTORE);
    sim_answer(&s, -2, 1, false, "restore: cannot open shard dense.part-0");
    if (s.ended) break;
    assert_int_equal(s.op_kind, COORD_ACT_SETUP_PS);
    sim_answer(&s, 0, -1, false, NULL);
  }
  assert_true(s.ended);
  assert_int_equal(s.status, 1);
  assert_non_null(strstr(s.fail, "cannot open shard dense.part-0"));
  assert_non_null(strstr(s.fail, "ps:1"));
  assert_true(sim_noted(&s, "try 3 of 3"));
  assert_true(sim_noted(&s, "try 1 of 3"));
  sim_free(&s);
}

/* ... and with an older committed checkpoint it falls back to that one. */
static void failed_restore_falls_back(void **state) {
  (void)state;
  coord_sm_config c = sim_ckpt_config(2, 1, TSR_MODE_ASYNC, 100, 0);
  sim s;
  sim_init(&s, &c, 0);
  sim_restart_on(&s, (const int64_t[]){20, 40}, 2);
  start(&s);
  for (int t = 0; t < 3; t++) {
    assert_int_equal(s.last_restore, 40);
    sim_answer(&s, -2, 0, false, "restore: shard file truncated");
    sim_answer(&s, 0, -1, false, NULL); /* SETUP_PS again */
  }
  assert_int_equal(s.last_restore, 20);
  assert_true(sim_noted(&s, "falling back to the checkpoint of step 20"));
  sim_run_calm(&s, 1000);
  assert_int_equal(s.status, 0);
  assert_int_equal(coord_sm_global_step(s.sm), 100);
  assert_int_equal(coord_sm_resumed_from(s.sm), 20);
  sim_free(&s);
}

/* A worker whose data is bad fails the run with its message and the data
 * exit status, whether it says so configuring or in a closure. */
static void data_error_in_configure_fails_the_run(void **state) {
  (void)state;
  coord_sm_config c = sim_config(1, 2, TSR_MODE_ASYNC, 0);
  c.epochs = 3;
  sim s;
  sim_init(&s, &c, 0);
  start(&s);
  sim_ready(&s, 0);
  sim_cfg_fail(&s, 1, COORD_ERR_DATA,
               "training data: d.csv: line 7 (data row 5), column 3 (\"bmi\"):"
               " \"1e39\" overflows float32");
  assert_true(s.ended);
  assert_int_equal(s.status, COORD_EXIT_DATA);
  assert_non_null(strstr(s.fail, "d.csv: line 7"));
  assert_non_null(strstr(s.fail, "worker:1"));
  sim_free(&s);
}

static void data_error_in_a_closure_fails_the_run(void **state) {
  (void)state;
  coord_sm_config c = sim_config(1, 2, TSR_MODE_SSP, 1000);
  sim s;
  sim_init(&s, &c, 0);
  start(&s);
  sim_ready(&s, 0);
  sim_ready(&s, 1);
  assert_true(s.n_fl > 0);
  sim_closure_done(&s, 0, -1);
  sim_closure_fail(&s, 0, COORD_ERR_DATA, "e.csv: line 3, column 1: label 7 "
                   "is not a class in [0, 3)");
  assert_true(s.ended);
  assert_int_equal(s.status, COORD_EXIT_DATA);
  assert_non_null(strstr(s.fail, "label 7"));
  sim_free(&s);
}

/* Workers that cannot take part in an epochs job: the run fails with
 * their errors, not with "give steps". */
static void epochs_job_reports_the_workers_errors(void **state) {
  (void)state;
  coord_sm_config c = sim_config(1, 2, TSR_MODE_ASYNC, 0);
  c.epochs = 3;
  sim s;
  sim_init(&s, &c, 0);
  start(&s);
  sim_cfg_fail(&s, 0, COORD_ERR_OTHER, "model: layer dense_9 is unknown");
  sim_cfg_fail(&s, 1, COORD_ERR_OTHER, "model: layer dense_9 is unknown");
  assert_true(s.ended);
  assert_int_equal(s.status, 1);
  assert_non_null(strstr(s.fail, "dense_9"));
  assert_null(strstr(s.fail, "give \"steps\""));
  sim_free(&s);
}

/* Workers that do not know their data size (streams): "give steps". */
static void epochs_job_without_sizes_asks_for_steps(void **state) {
  (void)state;
  coord_sm_config c = sim_config(1, 2, TSR_MODE_ASYNC, 0);
  c.epochs = 3;
  sim s;
  sim_init(&s, &c, 0);
  s.examples[0] = s.examples[1] = -1;
  start(&s);
  sim_ready(&s, 0);
  sim_ready(&s, 1);
  assert_true(s.ended);
  assert_int_equal(s.status, 2);
  assert_non_null(strstr(s.fail, "give \"steps\""));
  sim_free(&s);
}

/* A worker that never answers its configuration (alive, but stuck) in an
 * epochs job: the length of the run cannot be counted without its share of
 * the data, so the run fails naming it. It was counted over the others:
 * half the job, and a chief resumed past that half called the job done,
 * saved a checkpoint of a step below the one it resumed from and exited
 * 0. */
static void epochs_job_with_a_silent_worker_fails(void **state) {
  (void)state;
  coord_sm_config c = sim_ckpt_config(1, 2, TSR_MODE_ASYNC, 0, 50);
  c.epochs = 20; /* 2 x 100 examples, batch 10: 400 steps */
  sim s;
  sim_init(&s, &c, 0);
  sim_restart_on(&s, (const int64_t[]){300}, 1);
  start(&s);
  sim_answer(&s, 0, -1, false, NULL); /* RESTORE */
  sim_ready(&s, 0);
  for (int t = 0; t < 100 && !s.ended; t++) sim_tick(&s, 1);
  assert_true(s.ended);
  assert_int_equal(s.status, 1);
  assert_non_null(strstr(s.fail, "worker:1"));
  assert_non_null(strstr(s.fail, "size of its data"));
  assert_false(sim_noted(&s, "already done"));
  assert_int_equal(s.count[COORD_ACT_SAVE], 0);
  assert_int_equal(s.count[COORD_ACT_DISPATCH], 0);
  sim_free(&s);
}

/* A full disk: the failed checkpoints are discarded and remembered, the
 * last good one stays, training ends well. */
static void full_disk_is_named(void **state) {
  (void)state;
  coord_sm_config c = sim_ckpt_config(2, 2, TSR_MODE_ASYNC, 400, 20);
  sim s;
  sim_init(&s, &c, 0);
  start(&s);
  sim_answer(&s, 0, -1, false, NULL); /* SAVE of step 0 */
  sim_answer(&s, 0, -1, false, NULL); /* COMMIT */
  int full = 0;
  for (int r = 0; r < 20000 && !s.ended; r++) {
    /* the disk fills up after the first checkpoint past step 0 */
    if (s.op_active && s.op_kind == COORD_ACT_SAVE &&
        sim_disk_newest(&s) > 0) {
      sim_answer(&s, -28, 1, false, "save: No space left on device");
      full++;
    } else {
      sim_step(&s);
    }
  }
  assert_int_equal(s.status, 0);
  assert_int_equal(coord_sm_global_step(s.sm), 400);
  assert_true(full >= 3);
  const coord_ckpt_failure *f;
  size_t n = coord_sm_ckpt_failures(s.sm, &f);
  assert_int_equal(n, (size_t)full);
  assert_non_null(strstr(f[0].reason, "No space left"));
  int64_t good = sim_disk_newest(&s);
  assert_true(good > 0 && good < f[0].step);
  assert_int_equal(coord_sm_last_ckpt(s.sm), good);
  assert_int_equal(s.count[COORD_ACT_DISCARD], full);
  char want[64];
  snprintf(want, sizeof want, "the last good checkpoint is step %" PRId64,
           good);
  assert_true(sim_noted(&s, want));
  sim_free(&s);
}

/* A PS lost mid-run: pause, wait, setup, restore, rewind, exact count. */
static void lost_ps_recovers(void **state) {
  (void)state;
  coord_sm_config c = sim_ckpt_config(2, 2, TSR_MODE_SYNC, 100, 30);
  sim s;
  sim_init(&s, &c, 0);
  start(&s);
  int64_t good = sim_run_past_ckpt(&s, 30, 15);
  sim_ps_lost(&s, 1);
  while (s.n_fl) sim_closure_fail(&s, 0, COORD_ERR_TRANSIENT, "ps:1 gone");
  sim_tick(&s, 5);
  assert_false(s.op_active); /* waiting for the PS */
  sim_ps_up(&s, 1);
  assert_int_equal(s.op_kind, COORD_ACT_SETUP_PS);
  sim_answer(&s, 0, -1, false, NULL);
  assert_int_equal(s.op_kind, COORD_ACT_RESTORE);
  assert_int_equal(s.last_restore, good);
  sim_answer(&s, 0, -1, false, NULL);
  assert_int_equal(s.last_rewind, good);
  assert_false(s.last_rewind_resumed);
  sim_run_calm(&s, 2000);
  assert_int_equal(s.status, 0);
  assert_int_equal(coord_sm_global_step(s.sm), 100);
  assert_int_equal(coord_sm_restarts_ps(s.sm), 1);
  sim_free(&s);
}

/* Trains to `step` with every closure and op answered well. */
static void run_to(sim *s, int64_t step) {
  while (coord_sm_global_step(s->sm) < step && !s->ended) sim_step(s);
}

/* A PS lost, back, and set up again. */
static void lose_ps(sim *s, int i) {
  sim_ps_lost(s, i);
  while (s->n_fl) sim_closure_fail(s, 0, COORD_ERR_TRANSIENT, "ps gone");
  sim_tick(s, 1);
  sim_ps_up(s, i);
  assert_int_equal(s->op_kind, COORD_ACT_SETUP_PS);
  sim_answer(s, 0, -1, false, NULL);
}

/* A job with checkpoints whose first one failed (a full disk) loses a PS
 * after training began: its shards would start again from their initial
 * values, so the run fails naming it (it went on and exited 0). */
static void lost_ps_before_any_ckpt_fails(void **state) {
  (void)state;
  coord_sm_config c = sim_ckpt_config(2, 2, TSR_MODE_ASYNC, 100, 50);
  sim s;
  sim_init(&s, &c, 0);
  start(&s);
  assert_int_equal(s.op_kind, COORD_ACT_SAVE);
  sim_answer(&s, 0, -1, false, NULL);
  assert_int_equal(s.op_kind, COORD_ACT_COMMIT);
  sim_answer(&s, TSR_EIO, -1, false, "no space left on device");
  run_to(&s, 20);
  lose_ps(&s, 1);
  assert_true(s.ended);
  assert_int_equal(s.status, 1);
  assert_non_null(strstr(s.fail, "ps:1 was lost at step"));
  assert_non_null(strstr(s.fail, "no checkpoint was ever committed"));
  sim_free(&s);
}

/* A job without checkpoints goes on from the initial values, saying it
 * will exit 1 (the I/O side turns the count into the exit status). */
static void lost_ps_without_ckpts_goes_on(void **state) {
  (void)state;
  coord_sm_config c = sim_config(2, 2, TSR_MODE_ASYNC, 100);
  sim s;
  sim_init(&s, &c, 0);
  start(&s);
  run_to(&s, 30);
  lose_ps(&s, 1);
  assert_false(s.ended);
  assert_true(sim_noted(&s, "the run goes on and will exit 1"));
  sim_run_calm(&s, 2000);
  assert_int_equal(s.status, 0);
  assert_int_equal(coord_sm_global_step(s.sm), 100);
  assert_int_equal(coord_sm_initial_restarts(s.sm), 1);
  sim_free(&s);
}

/* The chief and a worker die together (sync): the new chief resumes from
 * the checkpoint, the worker comes back, the count is exact. */
static void chief_and_worker_die_together(void **state) {
  (void)state;
  coord_sm_config c = sim_ckpt_config(2, 2, TSR_MODE_SYNC, 200, 40);
  sim s;
  sim_init(&s, &c, 0);
  start(&s);
  int64_t good = sim_run_past_ckpt(&s, 40, 15);
  s.wk_up[1] = false;
  sim_restart_chief(&s);
  sim_ps_up(&s, 0);
  sim_ps_up(&s, 1);
  sim_wk_up(&s, 0);
  sim_tick(&s, 2);
  sim_wk_up(&s, 1);
  sim_answer(&s, 0, -1, false, NULL); /* SETUP_PS */
  assert_int_equal(s.last_restore, good);
  sim_run_calm(&s, 2000);
  assert_int_equal(s.status, 0);
  assert_int_equal(coord_sm_global_step(s.sm), 200);
  assert_int_equal(s.counted_steps, 2 * (200 - good));
  sim_free(&s);
}

/* ssp: both workers die at once and come back: every step still runs. */
static void both_workers_die_at_once(void **state) {
  (void)state;
  coord_sm_config c = sim_config(1, 2, TSR_MODE_SSP, 120);
  sim s;
  sim_init(&s, &c, 0);
  start(&s);
  sim_ready(&s, 0);
  sim_ready(&s, 1);
  sim_closure_done(&s, 0, -1);
  sim_wk_lost(&s, 0);
  sim_wk_lost(&s, 1);
  while (s.n_fl) sim_closure_fail(&s, 0, COORD_ERR_LOST, "closed");
  sim_tick(&s, 3);
  sim_wk_up(&s, 1);
  sim_wk_up(&s, 0);
  sim_run_calm(&s, 2000);
  assert_int_equal(s.status, 0);
  assert_int_equal(coord_sm_global_step(s.sm), 120);
  assert_int_equal(coord_sm_restarts_worker(s.sm), 2);
  sim_free(&s);
}

/* sync: a worker that comes back mid-run sits it out unless rejoining is
 * on; either way the count is exact. */
static void sync_worker_back(bool rejoin) {
  coord_sm_config c = sim_config(1, 2, TSR_MODE_SYNC, 100);
  c.sync_rejoin = rejoin;
  sim s;
  sim_init(&s, &c, 0);
  start(&s);
  sim_ready(&s, 0);
  sim_ready(&s, 1);
  sim_closure_done(&s, 0, -1);
  sim_wk_lost(&s, 1);
  while (s.n_fl) {
    if (s.fl[0].lost)
      sim_closure_fail(&s, 0, COORD_ERR_LOST, "closed");
    else
      sim_closure_done(&s, 0, -1);
    if (coord_sm_global_step(s.sm) > 30) break;
  }
  sim_wk_up(&s, 1);
  sim_ready(&s, 1);
  assert_int_equal(coord_sm_wk_state(s.sm, 1),
                   rejoin ? COORD_WK_READY : COORD_WK_LEFT);
  sim_run_calm(&s, 2000);
  assert_int_equal(s.status, 0);
  assert_int_equal(coord_sm_global_step(s.sm), 100);
  sim_free(&s);
}

static void sync_worker_back_sits_out(void **state) {
  (void)state;
  sync_worker_back(false);
}

static void sync_worker_back_rejoins(void **state) {
  (void)state;
  sync_worker_back(true);
}

/* ssp: a worker still configuring (a slow link) is not handed over to the
 * first ready one: no closure goes out until it has answered, so each runs
 * its own share (the fast worker ran the whole job, and the slow one then
 * waited on an idle clock). */
static void ssp_start_waits_for_a_slow_worker(void **state) {
  (void)state;
  coord_sm_config c = sim_config(2, 2, TSR_MODE_SSP, 200);
  sim s;
  sim_init(&s, &c, 0);
  start(&s);
  sim_ready(&s, 0);
  for (int i = 0; i < 5; i++) sim_tick(&s, 1.0);
  assert_int_equal(s.count[COORD_ACT_DISPATCH], 0);
  sim_ready(&s, 1);
  assert_true(s.count[COORD_ACT_DISPATCH] > 0);
  int64_t per[2] = {0, 0};
  for (int r = 0; r < 5000 && !s.ended; r++) {
    if (s.n_fl) per[s.fl[0].c.worker] += s.fl[0].c.steps;
    sim_step(&s);
  }
  assert_int_equal(s.status, 0);
  assert_int_equal(per[0], 100);
  assert_int_equal(per[1], 100);
  sim_free(&s);
}

/* Pruning keeps `keep` checkpoints and never the newest away. */
static void pruning_keeps_the_newest(void **state) {
  (void)state;
  coord_sm_config c = sim_ckpt_config(1, 1, TSR_MODE_ASYNC, 200, 10);
  c.ckpt_keep = 2;
  sim s;
  sim_init(&s, &c, 0);
  start(&s);
  sim_run_calm(&s, 3000);
  assert_int_equal(s.status, 0);
  assert_int_equal(s.n_disk, 2);
  assert_int_equal(sim_disk_newest(&s), 200);
  assert_true(s.count[COORD_ACT_COMMIT] >= 8);
  assert_int_equal(s.count[COORD_ACT_PRUNE], s.count[COORD_ACT_COMMIT] - 2);
  sim_free(&s);
}

/* A worker whose closures keep failing with its own error is left out;
 * the others finish its share. */
static void failing_worker_is_left_out(void **state) {
  (void)state;
  coord_sm_config c = sim_config(1, 2, TSR_MODE_ASYNC, 200);
  sim s;
  sim_init(&s, &c, 0);
  start(&s);
  sim_ready(&s, 0);
  sim_ready(&s, 1);
  for (int r = 0; r < 5000 && !s.ended; r++) {
    if (s.n_fl == 0) {
      sim_run_calm(&s, 1);
      continue;
    }
    if (s.fl[0].c.worker == 1)
      sim_closure_fail(&s, 0, COORD_ERR_OTHER, "compute failed: out of memory");
    else
      sim_closure_done(&s, 0, -1);
  }
  assert_int_equal(s.status, 0);
  assert_int_equal(coord_sm_wk_state(s.sm, 1), COORD_WK_LEFT);
  assert_int_equal(coord_sm_global_step(s.sm), 200);
  assert_true(sim_noted(&s, "left out of the run"));
  sim_free(&s);
}

/* Nothing answers any more: every waiting state reaches an end, with a
 * message naming what it waited for. */
static void nothing_answers(int stage) {
  coord_sm_config c = sim_ckpt_config(2, 2, TSR_MODE_SYNC, 100, 20);
  c.has_eval = true;
  c.eval_every_steps = 30;
  sim s;
  sim_init(&s, &c, (unsigned)stage);
  if (stage >= 1) sim_all_up(&s);
  if (stage >= 2) sim_answer(&s, 0, -1, false, NULL);
  for (int r = 0; r < stage * 7 && !s.ended; r++) sim_run_calm(&s, 1);
  if (stage == 5) sim_ps_lost(&s, 0);
  for (int i = 0; i < 100000 && !s.ended; i++) sim_tick(&s, 1.0);
  assert_true(s.ended);
  if (s.status) assert_true(s.fail[0] != 0);
  sim_free(&s);
}

static void nothing_answers_at_any_stage(void **state) {
  (void)state;
  for (int stage = 0; stage < 12; stage++) nothing_answers(stage);
}

/* A signal ends the run at once with 130. */
static void signal_interrupts(void **state) {
  (void)state;
  coord_sm_config c = sim_config(1, 1, TSR_MODE_ASYNC, 100);
  sim s;
  sim_init(&s, &c, 0);
  start(&s);
  sim_ev(&s, (coord_event){.kind = COORD_EV_SIGNAL});
  assert_true(s.ended);
  assert_int_equal(s.status, COORD_EXIT_SIGNAL);
  assert_non_null(strstr(s.fail, "interrupted at step"));
  sim_free(&s);
}

int main(void) {
  tsr_log_set_level(TSR_LOG_ERROR);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(happy_path),
      cmocka_unit_test(restarted_chief_resumes_an_epochs_job),
      cmocka_unit_test(finished_job_run_again),
      cmocka_unit_test(failed_restore_is_bounded),
      cmocka_unit_test(failed_restore_falls_back),
      cmocka_unit_test(data_error_in_configure_fails_the_run),
      cmocka_unit_test(data_error_in_a_closure_fails_the_run),
      cmocka_unit_test(epochs_job_reports_the_workers_errors),
      cmocka_unit_test(epochs_job_without_sizes_asks_for_steps),
      cmocka_unit_test(epochs_job_with_a_silent_worker_fails),
      cmocka_unit_test(full_disk_is_named),
      cmocka_unit_test(lost_ps_recovers),
      cmocka_unit_test(lost_ps_before_any_ckpt_fails),
      cmocka_unit_test(lost_ps_without_ckpts_goes_on),
      cmocka_unit_test(chief_and_worker_die_together),
      cmocka_unit_test(both_workers_die_at_once),
      cmocka_unit_test(sync_worker_back_sits_out),
      cmocka_unit_test(sync_worker_back_rejoins),
      cmocka_unit_test(ssp_start_waits_for_a_slow_worker),
      cmocka_unit_test(pruning_keeps_the_newest),
      cmocka_unit_test(failing_worker_is_left_out),
      cmocka_unit_test(nothing_answers_at_any_stage),
      cmocka_unit_test(signal_interrupts),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
