/* The coordinator's checkpoints that do not stop training: async runs on
 * while a checkpoint is snapshotted, written and committed; sync pauses
 * only until every PS holds its snapshot; a checkpoint or an evaluation
 * whose snapshot a lost PS held ends there, the PS restored alone;
 * the run ends only once its last checkpoint is committed; an evaluation
 * reads a snapshot and pauses nothing either; dense "allreduce" takes
 * both at a step boundary. On the
 * simulated cluster of sim.h, which checks the invariants at every step. */
#include "sim.h"

static void start(sim *s) {
  sim_all_up(s);
  sim_answer(s, 0, -1, false, NULL); /* SETUP_PS */
}

/* Answers what is out except the checkpoint: a configuration, the op,
 * the oldest closure; else time passes. */
static void step_holding_ck(sim *s) {
  for (int w = 0; w < s->cfg.n_wk; w++)
    if (s->cfg_pending[w]) {
      sim_ready(s, w);
      return;
    }
  if (s->op_active) {
    sim_answer(s, 0, -1, false, NULL);
    return;
  }
  if (s->n_fl) {
    sim_closure_done(s, 0, -1);
    return;
  }
  sim_tick(s, 0.1);
}

/* Runs (answering every checkpoint stage but `hold`) until a checkpoint
 * past step 0 reaches that stage. */
static void run_to_stage(sim *s, coord_act_kind hold) {
  for (int r = 0; r < 100000 && !s->ended; r++) {
    if (s->ck_active && s->ck_step > 0 && s->ck_kind == hold) return;
    if (s->ck_active)
      sim_ck_answer(s, 0, -1, false, NULL);
    else
      step_holding_ck(s);
  }
  fail_msg("no checkpoint reached the stage");
}

/* Runs, answering every checkpoint stage and evaluation, until the
 * checkpoint of `step` reaches stage `kind` (or the run ends). */
static void run_to_checkpoint(sim *s, int64_t step, coord_act_kind kind) {
  for (int r = 0; r < 100000 && !s->ended; r++) {
    if (s->ck_active && s->ck_step == step && s->ck_kind == kind) return;
    if (s->ck_active)
      sim_ck_answer(s, 0, -1, false, NULL);
    else if (s->ev_active)
      sim_ev_answer(s, 0, NULL);
    else
      step_holding_ck(s);
  }
}

/* Async: while a checkpoint's snapshots, files or manifest are out,
 * closures keep going out and being counted, with no pause; the
 * checkpoint commits the step SAVE named. (Before, the machine drained
 * every closure and waited for the PS to write.) */
static void async_trains_through_a_checkpoint(void **state) {
  (void)state;
  coord_act_kind stages[3] = {COORD_ACT_SAVE, COORD_ACT_SAVE_WAIT,
                              COORD_ACT_COMMIT};
  for (int k = 0; k < 3; k++) {
    coord_sm_config c = sim_ckpt_config(2, 2, TSR_MODE_ASYNC, 400, 50);
    sim s;
    sim_init(&s, &c, (unsigned)k);
    start(&s);
    run_to_stage(&s, stages[k]);
    int64_t at = s.ck_step;
    int pauses = s.count[COORD_ACT_PAUSE];
    int dispatched = s.count[COORD_ACT_DISPATCH];
    for (int r = 0; r < 8; r++) step_holding_ck(&s);
    assert_true(s.ck_active); /* still held */
    assert_true(coord_sm_global_step(s.sm) >= at + 40);
    assert_true(s.count[COORD_ACT_DISPATCH] > dispatched + 4);
    assert_int_equal(s.count[COORD_ACT_PAUSE], pauses);
    assert_string_equal(coord_sm_phase(s.sm), "train");
    sim_ck_through(&s);
    assert_int_equal(sim_disk_newest(&s), at);
    for (int r = 0; r < 20000 && !s.ended; r++) sim_step(&s);
    assert_int_equal(s.status, 0);
    assert_int_equal(coord_sm_global_step(s.sm), 400);
    assert_int_equal(s.counted_steps, 400);
    sim_free(&s);
  }
}

/* Sync: drained to a step boundary, nothing goes out until every PS holds
 * its snapshot; then training goes on while the files are written. */
static void sync_resumes_once_snapshotted(void **state) {
  (void)state;
  coord_sm_config c = sim_ckpt_config(2, 2, TSR_MODE_SYNC, 200, 40);
  sim s;
  sim_init(&s, &c, 0);
  start(&s);
  run_to_stage(&s, COORD_ACT_SAVE);
  int64_t at = s.ck_step;
  assert_int_equal(s.n_fl, 0); /* drained */
  assert_int_equal(coord_sm_global_step(s.sm), at);
  int dispatched = s.count[COORD_ACT_DISPATCH];
  for (int r = 0; r < 20; r++) step_holding_ck(&s);
  assert_int_equal(s.count[COORD_ACT_DISPATCH], dispatched);
  assert_string_equal(coord_sm_phase(s.sm), "save");
  sim_ck_answer(&s, 0, -1, false, NULL); /* every PS holds its snapshot */
  assert_true(s.ck_active);
  assert_int_equal(s.ck_kind, COORD_ACT_SAVE_WAIT);
  assert_true(s.count[COORD_ACT_DISPATCH] > dispatched);
  for (int r = 0; r < 40; r++) step_holding_ck(&s);
  assert_true(coord_sm_global_step(s.sm) > at);
  sim_ck_through(&s);
  assert_int_equal(sim_disk_newest(&s), at);
  for (int r = 0; r < 20000 && !s.ended; r++) sim_step(&s);
  assert_int_equal(s.status, 0);
  assert_int_equal(coord_sm_global_step(s.sm), 200);
  sim_free(&s);
}

/* Async, a PS lost while a checkpoint's snapshots are taken or its
 * files written: the PS is restored alone (no global recovery), but the
 * checkpoint read its snapshot, which went with it, so it is discarded
 * and named at once; a late answer to it (a call sent again to the
 * restarted PS answers well) takes it no further; the lost PS restores
 * the checkpoint before alone, the next checkpoint (the run's last one
 * too) is taken as usual once it has, and the run ends exact. */
static void lost_ps_discards_the_checkpoint_being_written(void **state) {
  (void)state;
  coord_act_kind stages[3] = {COORD_ACT_SAVE, COORD_ACT_SAVE_WAIT,
                              COORD_ACT_SAVE_WAIT};
  for (int k = 0; k < 3; k++) {
    coord_sm_config c = sim_ckpt_config(2, 2, TSR_MODE_ASYNC, 300, 60);
    sim s;
    sim_init(&s, &c, (unsigned)k);
    start(&s);
    run_to_stage(&s, stages[k]);
    /* k == 2: the run's last checkpoint, taken again once the PS is */
    while (k == 2 && s.ck_step < 300) {
      sim_ck_through(&s);
      run_to_stage(&s, stages[k]);
    }
    int64_t lost_step = s.ck_step, good = sim_disk_newest(&s);
    int restores = s.count[COORD_ACT_RESTORE];
    sim_ps_lost(&s, 1);
    assert_int_equal(s.count[COORD_ACT_DISCARD], 1);
    const coord_ckpt_failure *f;
    assert_int_equal(coord_sm_ckpt_failures(s.sm, &f), 1);
    assert_int_equal(f[0].step, lost_step);
    assert_non_null(strstr(f[0].reason, "lost"));
    sim_ck_answer(&s, 0, -1, false, NULL); /* late, and well */
    assert_false(s.ck_active);
    for (int r = 0; r < 20; r++) step_holding_ck(&s); /* training goes on */
    assert_false(s.ck_active);
    sim_ps_up(&s, 1);
    assert_true(s.alone_op[1] != 0);
    assert_int_equal(s.alone_step[1], good);
    sim_alone_answer(&s, 1, 0, false, NULL);
    for (int r = 0; r < 20000 && !s.ended; r++) sim_step(&s);
    assert_int_equal(s.status, 0);
    assert_int_equal(coord_sm_global_step(s.sm), 300);
    assert_int_equal(s.count[COORD_ACT_RESTORE], restores);
    assert_int_equal(coord_sm_ckpt_failures(s.sm, &f), 1);
    assert_true(sim_disk_newest(&s) > lost_step || lost_step == 300);
    assert_int_equal(sim_disk_newest(&s), 300);
    sim_free(&s);
  }
}

/* Dense "allreduce" (lockstep) over async tables, a PS lost while the
 * run's last checkpoint is snapshotted or written, the evaluation after
 * it on or off: the PS is restored alone and that checkpoint is taken
 * again; the run never ends on the one before. */
static void lockstep_last_checkpoint_taken_again(void **state) {
  (void)state;
  coord_act_kind stages[2] = {COORD_ACT_SAVE, COORD_ACT_SAVE_WAIT};
  for (int k = 0; k < 8; k++) {
    coord_sm_config c = sim_ckpt_config(2, 2, TSR_MODE_ASYNC, 240, 70);
    c.lockstep = true;
    c.has_eval = k & 2;
    sim s;
    sim_init(&s, &c, (unsigned)k);
    start(&s);
    run_to_checkpoint(&s, 240, stages[k % 2]);
    assert_true(s.ck_active && s.ck_step == 240);
    int64_t good = sim_disk_newest(&s);
    sim_ps_lost(&s, 1);
    if (k & 4) sim_wk_lost(&s, 0); /* a worker with it */
    sim_ck_answer(&s, 0, -1, false, NULL); /* late, and well */
    sim_ps_up(&s, 1);
    assert_true(s.alone_op[1] != 0);
    assert_int_equal(s.alone_step[1], good);
    sim_alone_answer(&s, 1, 0, false, NULL);
    if (k & 4) sim_wk_up(&s, 0);
    for (int r = 0; r < 20000 && !s.ended; r++) sim_step(&s);
    assert_int_equal(s.status, 0);
    assert_int_equal(coord_sm_global_step(s.sm), 240);
    assert_int_equal(sim_disk_newest(&s), 240);
    sim_free(&s);
  }
}

/* Dense "allreduce" over async tables, the checkpoint before the last
 * still written when training ends (the last one waits for it), a PS
 * lost at each point from there to the last one's files: the PS is
 * restored alone and the last checkpoint is taken again. */
static void lockstep_last_checkpoint_after_a_slow_one(void **state) {
  (void)state;
  coord_act_kind holds[2] = {COORD_ACT_SAVE_WAIT, COORD_ACT_COMMIT};
  for (int k = 0; k < 48; k++) {
    int where = (k / 8) % 6; /* 0, 1: the one before held; 2..5: stages */
    coord_sm_config c = sim_ckpt_config(2, 2, TSR_MODE_ASYNC, 240, 70);
    c.lockstep = true;
    c.has_eval = k & 2;
    sim s;
    sim_init(&s, &c, (unsigned)k);
    start(&s);
    for (int r = 0; r < 100000 && !s.ended; r++) {
      if (s.ck_active && s.ck_step >= 150 && s.ck_step < 240 &&
          s.ck_kind == holds[k % 2])
        break;
      if (s.ck_active)
        sim_ck_answer(&s, 0, -1, false, NULL);
      else if (s.ev_active)
        sim_ev_answer(&s, 0, NULL);
      else
        step_holding_ck(&s);
    }
    if (!s.ck_active || s.ck_step < 150 || s.ck_step >= 240)
      fail_msg("case %d: no checkpoint held before the last (%d %lld)", k,
               s.ck_active, (long long)s.ck_step);
    /* training runs to its end meanwhile */
    for (int r = 0; r < 100000 && !s.ended &&
                    coord_sm_global_step(s.sm) < 240; r++) {
      if (s.ev_active)
        sim_ev_answer(&s, 0, NULL);
      else
        step_holding_ck(&s);
    }
    for (int r = 0; r < 50; r++) step_holding_ck(&s);
    assert_int_equal(coord_sm_global_step(s.sm), 240);
    if (where >= 2) { /* the one before done: the last one to a stage */
      coord_act_kind at[4] = {COORD_ACT_SAVE, COORD_ACT_SAVE_WAIT,
                              COORD_ACT_SAVE, COORD_ACT_SAVE_WAIT};
      run_to_checkpoint(&s, 240, at[where - 2]);
      assert_true(s.ck_active && s.ck_step == 240);
    }
    sim_ps_lost(&s, 1);
    if (k & 4) sim_wk_lost(&s, 0); /* a worker with it */
    /* odd points: the stage out answers late, and well */
    if (s.ck_active && (where & 1)) sim_ck_answer(&s, 0, -1, false, NULL);
    /* a commit is the chief's own: it ends, well */
    if (s.ck_active && s.ck_kind == COORD_ACT_COMMIT)
      sim_ck_answer(&s, 0, -1, false, NULL);
    int64_t good = sim_disk_newest(&s);
    sim_ps_up(&s, 1);
    assert_true(s.alone_op[1] != 0);
    if (s.alone_step[1] != good)
      fail_msg("case %d (where %d): restored from %lld, not %lld", k, where,
               (long long)s.alone_step[1], (long long)good);
    sim_alone_answer(&s, 1, 0, false, NULL);
    if (k & 4) sim_wk_up(&s, 0);
    for (int r = 0; r < 20000 && !s.ended; r++) sim_step(&s);
    assert_int_equal(s.status, 0);
    assert_int_equal(coord_sm_global_step(s.sm), 240);
    if (sim_disk_newest(&s) != 240)
      fail_msg("case %d (where %d): newest checkpoint %lld, not 240", k,
               where, (long long)sim_disk_newest(&s));
    sim_free(&s);
  }
}

/* Async, the run's last checkpoint and its last evaluation both out when
 * a PS is lost (the storm's case): the PS is restored alone, both are
 * taken again, and the run ends on them without waiting for anything. */
static void async_last_checkpoint_and_evaluation_lost_ps(void **state) {
  (void)state;
  coord_act_kind stages[2] = {COORD_ACT_SAVE, COORD_ACT_SAVE_WAIT};
  for (int k = 0; k < 8; k++) {
    coord_sm_config c = sim_ckpt_config(2, 2, TSR_MODE_ASYNC, 300, 60);
    c.has_eval = true;
    c.eval_every_steps = 100;
    sim s;
    sim_init(&s, &c, (unsigned)k);
    start(&s);
    run_to_checkpoint(&s, 300, stages[k % 2]);
    /* the last evaluation goes out beside it (its snapshot, or read) */
    for (int r = 0; r < 20 && !s.ev_active; r++) sim_tick(&s, 0.1);
    if (s.ev_active && (k & 2)) sim_ev_answer(&s, 0, NULL);
    for (int r = 0; r < 20 && !s.ev_active; r++) sim_tick(&s, 0.1);
    if (!(s.ck_active && s.ck_step == 300 &&
          (s.ev_active || s.ck_kind == COORD_ACT_SAVE)))
      fail_msg("case %d: the last checkpoint and evaluation are not both out "
               "(%d %lld %d)", k, s.ck_active, (long long)s.ck_step,
               s.ev_active);
    int64_t good = sim_disk_newest(&s);
    int evals = s.count[COORD_ACT_EVALUATE];
    sim_ps_lost(&s, 1);
    if (k & 4) { /* late answers, well */
      if (s.ck_active) sim_ck_answer(&s, 0, -1, false, NULL);
      if (s.ev_active) sim_ev_answer(&s, 0, NULL);
    }
    sim_ps_up(&s, 1);
    assert_true(s.alone_op[1] != 0);
    assert_int_equal(s.alone_step[1], good);
    sim_alone_answer(&s, 1, 0, false, NULL);
    double t0 = s.now;
    for (int r = 0; r < 20000 && !s.ended; r++) sim_step(&s);
    if (s.status || coord_sm_global_step(s.sm) != 300 ||
        sim_disk_newest(&s) != 300) {
      for (int i = s.n_notes > 64 ? s.n_notes - 64 : 0; i < s.n_notes; i++)
        fprintf(stderr, "  %s\n", s.notes[i % 64]);
      fail_msg("case %d: status %d, step %lld, newest checkpoint %lld, not "
               "0, 300, 300", k, s.status,
               (long long)coord_sm_global_step(s.sm),
               (long long)sim_disk_newest(&s));
    }
    if (sim_noted(&s, "skipped"))
      fail_msg("case %d: the last evaluation was skipped", k);
    assert_true(s.count[COORD_ACT_EVALUATE] > evals);
    if (s.now - t0 > 5)
      fail_msg("case %d: the end waited %.1f s", k, s.now - t0);
    sim_free(&s);
  }
}

/* The run's last checkpoint records its last evaluation: its manifest
 * (COMMIT) goes out only once the final evaluation has answered, whether
 * the files were written before that answer or after, and when the
 * evaluation fails (then without its figures); async and sync. */
static void last_checkpoint_waits_for_the_last_evaluation(void **state) {
  (void)state;
  for (int k = 0; k < 6; k++) {
    coord_sm_config c = sim_ckpt_config(
        2, 2, k % 2 ? TSR_MODE_SYNC : TSR_MODE_ASYNC, 300, 100);
    c.has_eval = true;
    c.eval_every_steps = 100;
    c.lockstep = k % 2;
    sim s;
    sim_init(&s, &c, (unsigned)k);
    start(&s);
    run_to_checkpoint(&s, 300, COORD_ACT_SAVE_WAIT);
    for (int r = 0; r < 20 && !s.ev_active; r++) sim_tick(&s, 0.1);
    if (!(s.ck_active && s.ck_kind == COORD_ACT_SAVE_WAIT && s.ev_active))
      fail_msg("case %d: the last checkpoint's files and the last "
               "evaluation are not both out", k);
    int evals = s.count[COORD_ACT_EVALUATE];
    bool failing = k >= 4;
    if (k < 2) { /* the files first: the manifest waits */
      sim_ck_answer(&s, 0, -1, false, NULL);
      if (s.ck_active)
        fail_msg("case %d: the manifest went out before the last "
                 "evaluation answered", k);
      sim_tick(&s, 5);
      assert_false(s.ck_active);
      assert_int_equal(s.status, 0);
      assert_false(sim_noted(&s, "failed"));
    }
    while (s.ev_active)
      sim_ev_answer(&s, failing && s.ev_kind == COORD_ACT_EVALUATE ? -1 : 0,
                    failing ? "worker:0: no memory" : NULL);
    assert_int_equal(s.count[COORD_ACT_EVALUATE], evals + 1);
    if (k < 2) { /* the answer lets it go */
      if (!(s.ck_active && s.ck_kind == COORD_ACT_COMMIT))
        fail_msg("case %d: no manifest once the evaluation answered", k);
    } else {     /* the files after: the manifest at once */
      sim_ck_answer(&s, 0, -1, false, NULL);
      if (!(s.ck_active && s.ck_kind == COORD_ACT_COMMIT))
        fail_msg("case %d: no manifest once the files were written", k);
    }
    sim_run_calm(&s, 3000);
    if (s.status || sim_disk_newest(&s) != 300)
      fail_msg("case %d: status %d, newest checkpoint %lld", k, s.status,
               (long long)sim_disk_newest(&s));
    assert_int_equal(s.count[COORD_ACT_EVALUATE], evals + 1);
    sim_free(&s);
  }
}

/* Async, a PS lost while an evaluation's snapshot is taken or read: the
 * PS is restored alone and the evaluation ends there (its snapshot went
 * with the PS: the others are told to drop theirs; a late answer, well,
 * takes it no further: no EVALUATE of it); the next one is taken once
 * the PS is restored, and the run ends exact. */
static void lost_ps_ends_the_evaluation(void **state) {
  (void)state;
  for (int k = 0; k < 2; k++) {
    coord_sm_config c = sim_ckpt_config(2, 2, TSR_MODE_ASYNC, 300, 50);
    c.has_eval = true;
    c.eval_every_steps = 60;
    sim s;
    sim_init(&s, &c, (unsigned)k);
    start(&s);
    for (int r = 0; r < 10000 && !s.ev_active; r++)
      if (s.ck_active)
        sim_ck_through(&s);
      else
        step_holding_ck(&s);
    assert_true(s.ev_active);
    sim_ck_through(&s); /* a checkpoint to restore the PS from */
    if (k == 1) {
      sim_ev_answer(&s, 0, NULL); /* every PS holds it */
      assert_int_equal(s.ev_kind, COORD_ACT_EVALUATE);
    }
    int un = s.count[COORD_ACT_UNSNAPSHOT];
    int evals = s.count[COORD_ACT_EVALUATE];
    sim_ps_lost(&s, 1);
    assert_int_equal(s.count[COORD_ACT_UNSNAPSHOT], un + 1);
    assert_true(sim_noted(&s, "abandoned"));
    sim_ev_answer(&s, 0, NULL); /* late, and well */
    assert_int_equal(s.count[COORD_ACT_EVALUATE], evals);
    for (int r = 0; r < 20; r++) step_holding_ck(&s);
    assert_false(s.ev_active);
    sim_ps_up(&s, 1);
    assert_true(s.alone_op[1] != 0);
    sim_alone_answer(&s, 1, 0, false, NULL);
    for (int r = 0; r < 10000 && !s.ev_active; r++)
      if (s.ck_active)
        sim_ck_through(&s);
      else
        step_holding_ck(&s);
    assert_int_equal(s.ev_kind, COORD_ACT_SNAPSHOT);
    for (int r = 0; r < 20000 && !s.ended; r++) sim_step(&s);
    assert_int_equal(s.status, 0);
    assert_int_equal(coord_sm_global_step(s.sm), 300);
    assert_true(s.count[COORD_ACT_EVALUATE] > evals);
    sim_free(&s);
  }
}

/* The last checkpoint: the run shuts the cluster down only once it is
 * committed, and a write that fails is named in the summary. */
static void run_ends_after_its_last_checkpoint(void **state) {
  (void)state;
  for (int fail = 0; fail < 2; fail++) {
    coord_sm_config c = sim_ckpt_config(1, 1, TSR_MODE_ASYNC, 100, 0);
    sim s;
    sim_init(&s, &c, 0);
    start(&s);
    run_to_stage(&s, COORD_ACT_SAVE_WAIT);
    assert_int_equal(s.ck_step, 100);
    for (int r = 0; r < 50; r++) step_holding_ck(&s);
    assert_int_equal(s.count[COORD_ACT_SHUTDOWN], 0);
    assert_false(s.ended);
    if (fail)
      sim_ck_answer(&s, -28, 0, false, "save: No space left on device");
    else
      sim_ck_through(&s);
    for (int r = 0; r < 200 && !s.ended; r++) sim_step(&s);
    assert_int_equal(s.status, 0);
    assert_int_equal(s.count[COORD_ACT_SHUTDOWN], 1);
    assert_int_equal(sim_disk_newest(&s), fail ? 0 : 100);
    const coord_ckpt_failure *f;
    assert_int_equal(coord_sm_ckpt_failures(s.sm, &f), (size_t)fail);
    sim_free(&s);
  }
}

/* Increments (every third checkpoint whole) with one checkpoint kept:
 * pruning keeps the whole checkpoint and the increments the newest one
 * builds on, removes increments before the checkpoints they build on,
 * and never leaves a kept increment without its chain (sim.h checks it
 * at every PRUNE); a restore names a checkpoint whose chain is there. */
static void pruning_keeps_chains(void **state) {
  (void)state;
  coord_sm_config c = sim_ckpt_config(1, 2, TSR_MODE_ASYNC, 400, 20);
  c.ckpt_keep = 1;
  sim s;
  sim_init(&s, &c, 0);
  s.full_every = 3;
  start(&s);
  int most = 0, longest = 0;
  for (int r = 0; r < 20000 && !s.ended; r++) {
    sim_step(&s);
    if (s.n_disk > most) most = s.n_disk;
    for (int i = 0; i < s.n_disk; i++)
      if (s.disk_links[i] > longest) longest = s.disk_links[i];
  }
  assert_int_equal(s.status, 0);
  assert_int_equal(longest, 3);
  assert_int_equal(most, 3); /* a whole one and two increments on it */
  assert_true(s.count[COORD_ACT_PRUNE] >= 4);
  /* a lost PS, with the chain of three on disk: the restore takes the
   * newest; when it cannot be restored, the increment before it */
  sim_free(&s);
  sim_init(&s, &c, 1);
  s.full_every = 3;
  start(&s);
  for (int r = 0; r < 20000 && !s.ended; r++) {
    if (!s.ck_active && s.n_disk == 3) break;
    sim_step(&s);
  }
  assert_int_equal(s.n_disk, 3);
  int64_t newest = sim_disk_newest(&s);
  int at = sim_disk_at(&s, newest);
  assert_int_equal(s.disk_links[at], 3);
  sim_ps_lost(&s, 0);
  while (s.n_fl) sim_closure_fail(&s, 0, COORD_ERR_TRANSIENT, "ps:0 gone");
  sim_ps_up(&s, 0);
  for (int t = 0; t < c.restore_tries; t++) {
    assert_int_equal(s.op_kind, COORD_ACT_SETUP_PS);
    sim_answer(&s, 0, -1, false, NULL);
    assert_int_equal(s.op_kind, COORD_ACT_RESTORE);
    assert_int_equal(s.last_restore, newest);
    sim_answer(&s, -5, 0, false, "emb.part-0-of-1.tshard: data CRC32C "
               "mismatch");
  }
  assert_int_equal(s.op_kind, COORD_ACT_SETUP_PS);
  sim_answer(&s, 0, -1, false, NULL);
  assert_int_equal(s.op_kind, COORD_ACT_RESTORE);
  assert_true(s.last_restore < newest);
  assert_true(s.last_restore >= s.disk_base[at]);
  sim_answer(&s, 0, -1, false, NULL);
  for (int r = 0; r < 20000 && !s.ended; r++) sim_step(&s);
  assert_int_equal(s.status, 0);
  assert_int_equal(coord_sm_global_step(s.sm), 400);
  sim_free(&s);
}

/* An evaluation reads a snapshot: while its SNAPSHOT and its EVALUATE are
 * out, closures keep going out and being counted with no pause (sync
 * too: nothing drains); once it is answered the PS drop the snapshot; a
 * snapshot that fails skips that evaluation, and training goes on. */
static void evaluation_does_not_pause(void **state) {
  (void)state;
  for (int mode = 0; mode < 2; mode++) {
    coord_sm_config c = sim_config(1, 2, mode ? TSR_MODE_SYNC
                                              : TSR_MODE_ASYNC, 200);
    c.has_eval = true;
    c.eval_every_steps = 30;
    sim s;
    sim_init(&s, &c, 0);
    start(&s);
    for (int r = 0; r < 10000 && !s.ev_active; r++) step_holding_ck(&s);
    assert_true(s.ev_active);
    assert_int_equal(s.ev_kind, COORD_ACT_SNAPSHOT);
    for (int stage = 0; stage < 2; stage++) {
      int64_t at = coord_sm_global_step(s.sm);
      int pauses = s.count[COORD_ACT_PAUSE];
      for (int r = 0; r < 6; r++) step_holding_ck(&s);
      assert_true(coord_sm_global_step(s.sm) > at);
      assert_int_equal(s.count[COORD_ACT_PAUSE], pauses);
      if (stage == 0) {
        sim_ev_answer(&s, 0, NULL); /* every PS holds it */
        assert_int_equal(s.ev_kind, COORD_ACT_EVALUATE);
      }
    }
    int un = s.count[COORD_ACT_UNSNAPSHOT];
    sim_ev_answer(&s, 0, NULL);
    assert_int_equal(s.count[COORD_ACT_UNSNAPSHOT], un + 1);
    assert_false(s.snap_held);
    /* the next one's snapshot fails: skipped, named */
    for (int r = 0; r < 10000 && !s.ev_active; r++) step_holding_ck(&s);
    sim_ev_answer(&s, TSR_EMEMLIMIT, "ps:0: snapshot: no room");
    assert_false(s.ev_active);
    assert_true(sim_noted(&s, "no room"));
    for (int r = 0; r < 20000 && !s.ended; r++) sim_step(&s);
    assert_int_equal(s.status, 0);
    assert_int_equal(coord_sm_global_step(s.sm), 200);
    assert_true(s.count[COORD_ACT_EVALUATE] >= 2); /* and the final one */
    sim_free(&s);
  }
}

/* Dense "allreduce" (lockstep), even with async sparse tables: the dense
 * variables are the workers' own, changed by every step, so a checkpoint
 * is taken drained, as sync's, and nothing goes out until every PS holds
 * its snapshot (and the dense state is written); an evaluation still
 * reads a snapshot, taken drained, and the ring waits for it (phase
 * "eval") until the worker answers: the evaluating worker is a member
 * every step needs. (Before, both went on while closures were out.) */
static void lockstep_takes_them_at_a_boundary(void **state) {
  (void)state;
  coord_sm_config c = sim_ckpt_config(1, 2, TSR_MODE_ASYNC, 240, 40);
  c.lockstep = true;
  c.has_eval = true;
  c.eval_every_steps = 30;
  sim s;
  sim_init(&s, &c, 0);
  start(&s);
  int saves = 0, evals = 0;
  for (int r = 0; r < 100000 && !s.ended; r++) {
    bool save = s.ck_active && s.ck_step > 0 && s.ck_kind == COORD_ACT_SAVE;
    if (save || (s.ev_active && s.ev_kind == COORD_ACT_SNAPSHOT)) {
      int64_t at = coord_sm_global_step(s.sm);
      assert_int_equal(s.n_fl, 0); /* drained */
      int dispatched = s.count[COORD_ACT_DISPATCH];
      for (int k = 0; k < 10; k++) step_holding_ck(&s);
      assert_int_equal(s.count[COORD_ACT_DISPATCH], dispatched);
      assert_int_equal(coord_sm_global_step(s.sm), at);
      if (save) {
        assert_string_equal(coord_sm_phase(s.sm), "save");
        sim_ck_answer(&s, 0, -1, false, NULL); /* snapshots held */
        saves++;
        continue;
      }
      sim_ev_answer(&s, 0, NULL); /* every PS holds it */
      assert_int_equal(s.ev_kind, COORD_ACT_EVALUATE);
      for (int k = 0; k < 10; k++) step_holding_ck(&s);
      assert_int_equal(s.count[COORD_ACT_DISPATCH], dispatched);
      /* the last one comes after training, in phase "final" */
      const char *ph = coord_sm_phase(s.sm);
      if (at < 240) assert_string_equal(ph, "eval");
      else assert_true(!strcmp(ph, "eval") || !strcmp(ph, "final"));
      sim_ev_answer(&s, 0, NULL);
      assert_false(s.ev_active);
      evals++;
      continue;
    }
    if (s.ck_active)
      sim_ck_answer(&s, 0, -1, false, NULL);
    else if (s.ev_active)
      sim_ev_answer(&s, 0, NULL);
    else
      step_holding_ck(&s);
  }
  assert_int_equal(s.status, 0);
  assert_int_equal(coord_sm_global_step(s.sm), 240);
  assert_true(saves >= 4);
  assert_true(evals >= 4);
  sim_free(&s);
}

/* Dense "allreduce": a worker configured again while the run's last
 * checkpoint is taken (a fresh process: the initial values, until a
 * closure gives it the ring's state; none comes, the run is over) is
 * configured during the pause, and the final evaluation runs on the
 * worker that holds the state, never on it (the sim checks every
 * EVALUATE), for either worker coming back. */
static void lockstep_fresh_worker_evaluates_nothing(void **state) {
  (void)state;
  for (int back = 0; back < 2; back++) {
    coord_sm_config c = sim_ckpt_config(1, 2, TSR_MODE_ASYNC, 240, 40);
    c.lockstep = true;
    c.has_eval = true;
    sim s;
    sim_init(&s, &c, (unsigned)back);
    start(&s);
    run_to_checkpoint(&s, 240, COORD_ACT_SAVE);
    assert_true(s.ck_active && s.ck_step == 240);
    sim_wk_lost(&s, back);
    s.fresh_next[back] = true;
    sim_wk_up(&s, back);
    assert_true(s.cfg_pending[back]); /* configured in the pause */
    sim_ready(&s, back);
    assert_true(s.fresh[back]);
    for (int r = 0; r < 100 && !s.ev_active; r++) {
      if (s.ck_active) sim_ck_answer(&s, 0, -1, false, NULL);
      else sim_tick(&s, 0.1);
    }
    assert_true(s.ev_active && s.ev_kind == COORD_ACT_SNAPSHOT);
    sim_ev_answer(&s, 0, NULL);
    assert_true(s.ev_active && s.ev_kind == COORD_ACT_EVALUATE);
    assert_int_equal(s.ev_worker, 1 - back);
    for (int r = 0; r < 100000 && !s.ended; r++) sim_step(&s);
    assert_int_equal(s.status, 0);
    assert_int_equal(coord_sm_global_step(s.sm), 240);
    assert_int_equal(sim_disk_newest(&s), 240);
    sim_free(&s);
  }
}

int main(void) {
  tsr_log_set_level(TSR_LOG_ERROR);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(async_trains_through_a_checkpoint),
      cmocka_unit_test(sync_resumes_once_snapshotted),
      cmocka_unit_test(lost_ps_discards_the_checkpoint_being_written),
      cmocka_unit_test(lockstep_last_checkpoint_taken_again),
      cmocka_unit_test(lockstep_last_checkpoint_after_a_slow_one),
      cmocka_unit_test(async_last_checkpoint_and_evaluation_lost_ps),
      cmocka_unit_test(last_checkpoint_waits_for_the_last_evaluation),
      cmocka_unit_test(lost_ps_ends_the_evaluation),
      cmocka_unit_test(run_ends_after_its_last_checkpoint),
      cmocka_unit_test(pruning_keeps_chains),
      cmocka_unit_test(evaluation_does_not_pause),
      cmocka_unit_test(lockstep_takes_them_at_a_boundary),
      cmocka_unit_test(lockstep_fresh_worker_evaluates_nothing),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
