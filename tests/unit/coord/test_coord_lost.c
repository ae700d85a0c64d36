/* The coordinator's state machine when a process is lost for good or
 * for a while, on the simulated cluster of sim.h: a worker killed and not
 * started again (its closures run on the others at once, in every mode,
 * long before any closure deadline), a closure that fails with its
 * connection before the connection's own loss, a worker alive but stuck
 * (named in the notes and coord_sm_waiting, ended by the deadline); in
 * async a PS restored alone (no pause, no rewind, nothing counted twice,
 * checkpoints held until it is whole), lost during a save, lost with every
 * other PS or failing its restores (the global recovery), and away for
 * good (the run fails naming it). */
#include "sim.h"

static void start(sim *s) {
  sim_all_up(s);
  sim_answer(s, 0, -1, false, NULL); /* SETUP_PS */
}

/* A worker lost for good, its closures never answered: they run on the
 * other worker at once, in every mode, and the run ends with the exact
 * count long before the closure deadline (the pause for the next
 * checkpoint waited for those closures until their deadline, ten minutes
 * by default). Time here is the simulation's. */
static void lost_worker_for_good(tsr_mode mode) {
  coord_sm_config c = sim_ckpt_config(2, 2, mode, 300, 40);
  c.closure_timeout_s = 1000;
  c.has_eval = true;
  sim s;
  sim_init(&s, &c, 0);
  start(&s);
  sim_run_past_ckpt(&s, 40, 5);
  assert_true(s.member[1]);
  int before = s.count[COORD_ACT_DISPATCH];
  double t0 = s.now;
  sim_wk_vanish(&s, 1);
  assert_false(s.member[1]);
  assert_true(sim_noted(&s, "run now on worker:0"));
  int64_t at = coord_sm_global_step(s.sm);
  /* worker 1 stays away */
  for (int r = 0; r < 100000 && !s.ended; r++) {
    if (s.n_fl)
      sim_closure_done(&s, 0, -1);
    else if (s.op_active)
      sim_answer(&s, 0, -1, false, NULL);
    else if (s.ck_active)
      sim_ck_answer(&s, 0, -1, false, NULL);
    else if (s.ev_active)
      sim_ev_answer(&s, 0, NULL);
    else
      sim_tick(&s, 0.1);
  }
  assert_int_equal(s.status, 0);
  assert_int_equal(coord_sm_global_step(s.sm), 300);
  assert_true(s.count[COORD_ACT_DISPATCH] > before);
  assert_true(sim_disk_newest(&s) == 300 && at < 300);
  SIM_CHECK(&s, s.now - t0 < 10, "the run took %.1f s after the loss",
            s.now - t0);
  assert_false(sim_noted(&s, "no answer to closure"));
  sim_free(&s);
}

static void lost_worker_async(void **state) {
  (void)state;
  lost_worker_for_good(TSR_MODE_ASYNC);
}
static void lost_worker_ssp(void **state) {
  (void)state;
  lost_worker_for_good(TSR_MODE_SSP);
}
static void lost_worker_sync(void **state) {
  (void)state;
  lost_worker_for_good(TSR_MODE_SYNC);
}

/* A closure that fails because its worker's connection is gone comes
 * before the connection's own WK_LOST: nothing more is sent to that worker
 * meanwhile (the closure sent then waited for a connection until its
 * deadline), and it takes part again once it is back. */
static void closure_lost_before_its_worker(void **state) {
  (void)state;
  coord_sm_config c = sim_config(1, 2, TSR_MODE_ASYNC, 200);
  sim s;
  sim_init(&s, &c, 0);
  start(&s);
  sim_ready(&s, 0);
  sim_ready(&s, 1);
  int k = 0, on1 = 0;
  for (int i = 0; i < s.n_fl; i++) on1 += s.fl[i].c.worker == 1;
  while (s.fl[k].c.worker != 1) k++;
  /* (sim.h checks that no DISPATCH goes to a worker that is no member) */
  sim_closure_fail(&s, k, COORD_ERR_LOST, "connection to 127.0.0.1:2 lost");
  assert_false(s.member[1]);
  int now1 = 0;
  for (int i = 0; i < s.n_fl; i++) now1 += s.fl[i].c.worker == 1;
  assert_int_equal(now1, on1 - 1);
  assert_true(sim_noted(&s, "lost worker:1"));
  uint64_t epoch = s.members_epoch;
  sim_wk_vanish(&s, 1); /* its WK_LOST: no second note, no second MEMBER */
  assert_int_equal(s.members_epoch, epoch);
  sim_wk_up(&s, 1);
  sim_ready(&s, 1);
  assert_true(s.member[1]);
  sim_run_calm(&s, 2000);
  assert_int_equal(s.status, 0);
  assert_int_equal(coord_sm_global_step(s.sm), 200);
  sim_free(&s);
}

/* A worker that is connected but does not answer (alive and stuck): the
 * pause before a checkpoint (ssp: taken at a step boundary) says what it
 * waits for, in a note and in coord_sm_waiting, and the closure deadline
 * ends the wait. */
static void stuck_worker_is_named(void **state) {
  (void)state;
  coord_sm_config c = sim_ckpt_config(1, 2, TSR_MODE_SSP, 200, 40);
  sim s;
  sim_init(&s, &c, 0);
  start(&s);
  sim_run_past_ckpt(&s, 0, 1);
  /* worker 1 answers nothing from now on */
  for (int r = 0; r < 5000 && strcmp(coord_sm_phase(s.sm), "pause"); r++) {
    int k = 0;
    while (k < s.n_fl && s.fl[k].c.worker == 1) k++;
    if (k < s.n_fl)
      sim_closure_done(&s, k, -1);
    else if (s.op_active)
      sim_answer(&s, 0, -1, false, NULL);
    else
      sim_tick(&s, 0.1);
  }
  assert_string_equal(coord_sm_phase(s.sm), "pause");
  for (int t = 0; t < 12; t++) sim_tick(&s, 1);
  char w[COORD_MSG_MAX];
  assert_true(coord_sm_waiting(s.sm, w, sizeof w) > 0);
  assert_non_null(strstr(w, "worker:1 closure"));
  assert_non_null(strstr(w, "before the checkpoint"));
  assert_true(sim_noted(&s, "waiting for worker:1 closure"));
  /* past the deadline its steps go back and the run ends (worker 1's
   * later closures are answered again) */
  sim_tick(&s, c.closure_timeout_s * 1.2 + 5);
  assert_true(sim_noted(&s, "no answer to closure"));
  for (int k = 0; k < s.n_fl;)
    if (s.fl[k].c.worker == 1 && s.fl[k].at < s.now - 1)
      sim_take(&s, k);
    else
      k++;
  sim_run_calm(&s, 5000);
  assert_int_equal(s.status, 0);
  assert_int_equal(coord_sm_global_step(s.sm), 200);
  sim_free(&s);
}

/* async: a lost PS is restored alone. Training goes on while it is away
 * (closures still go out and are counted), nothing pauses, no PS but it
 * is set up again and the run does not rewind: every step is counted once
 * (the whole cluster went back to the checkpoint before). Checkpoints
 * wait until it is whole again, then go on. */
static void lost_ps_restored_alone(void **state) {
  (void)state;
  coord_sm_config c = sim_ckpt_config(3, 2, TSR_MODE_ASYNC, 300, 30);
  c.has_eval = true;
  c.eval_every_steps = 50;
  sim s;
  sim_init(&s, &c, 0);
  start(&s);
  int64_t good = sim_run_past_ckpt(&s, 60, 5);
  int64_t at = coord_sm_global_step(s.sm);
  int saves = s.count[COORD_ACT_SAVE], setups = s.count[COORD_ACT_SETUP_PS];
  sim_ps_lost(&s, 1);
  assert_true(sim_noted(&s, "training goes on with the other PS"));
  /* away for a while: training goes on past a checkpoint's step */
  for (int r = 0; r < 400 && coord_sm_global_step(s.sm) < at + 40; r++) {
    assert_false(s.op_active);
    if (s.n_fl)
      sim_closure_done(&s, 0, -1);
    else
      sim_tick(&s, 0.1);
  }
  assert_true(coord_sm_global_step(s.sm) >= at + 40);
  assert_int_equal(s.count[COORD_ACT_SAVE], saves);
  char w[COORD_MSG_MAX];
  assert_true(coord_sm_waiting(s.sm, w, sizeof w) > 0);
  assert_non_null(strstr(w, "ps:1 to come back"));
  sim_ps_up(&s, 1);
  assert_int_equal(sim_alone_out(&s), 1);
  assert_int_equal(s.alone_step[1], good);
  sim_alone_answer(&s, 1, 0, false, NULL);
  assert_true(sim_noted(&s, "ps:1 alone restored the checkpoint of step"));
  sim_run_calm(&s, 3000);
  assert_int_equal(s.status, 0);
  assert_int_equal(coord_sm_global_step(s.sm), 300);
  assert_int_equal(s.count[COORD_ACT_REWIND], 0);
  assert_int_equal(s.count[COORD_ACT_RESTORE], 0);
  assert_int_equal(s.count[COORD_ACT_SETUP_PS], setups);
  assert_int_equal(s.count[COORD_ACT_PAUSE] > 0, true); /* checkpoints */
  assert_int_equal(s.counted_steps, 300); /* none run twice */
  assert_true(s.count[COORD_ACT_SAVE] > saves);
  assert_int_equal(coord_sm_restarts_ps(s.sm), 1);
  sim_free(&s);
}

/* async: a PS lost while a checkpoint is saved: the checkpoint fails and
 * is discarded, the PS is restored alone from the one before. */
static void ps_lost_during_a_save(void **state) {
  (void)state;
  coord_sm_config c = sim_ckpt_config(2, 2, TSR_MODE_ASYNC, 200, 40);
  sim s;
  sim_init(&s, &c, 0);
  start(&s);
  int64_t good = sim_run_past_ckpt(&s, 40, 1);
  while (!(s.ck_active && s.ck_kind == COORD_ACT_SAVE)) sim_step(&s);
  int64_t saving = s.ck_step;
  assert_true(saving > good);
  sim_ps_lost(&s, 0);
  sim_ck_answer(&s, -1, 0, true, "save: connection closed");
  assert_int_equal(s.count[COORD_ACT_DISCARD], 1);
  sim_ps_up(&s, 0);
  assert_int_equal(sim_alone_out(&s), 0);
  assert_int_equal(s.alone_step[0], good);
  sim_run_calm(&s, 3000);
  assert_int_equal(s.status, 0);
  assert_int_equal(coord_sm_global_step(s.sm), 200);
  assert_int_equal(s.count[COORD_ACT_REWIND], 0);
  assert_int_equal(s.counted_steps, 200);
  sim_free(&s);
}

/* async: the run's final checkpoint fails because its PS was lost, the
 * save's error arriving before the loss: once the PS is restored the
 * final checkpoint is taken again (the run ends with it on disk). */
static void final_save_failed_before_the_loss(void **state) {
  (void)state;
  coord_sm_config c = sim_ckpt_config(2, 2, TSR_MODE_ASYNC, 200, 40);
  sim s;
  sim_init(&s, &c, 0);
  start(&s);
  for (int r = 0; r < 100000 && !(s.ck_active && s.ck_kind ==
                                   COORD_ACT_SAVE && s.ck_step == 200); r++)
    sim_step(&s);
  assert_true(s.ck_active && s.ck_step == 200);
  sim_ck_answer(&s, -1, 0, true, "save: connection closed");
  assert_int_equal(s.count[COORD_ACT_DISCARD], 1);
  sim_ps_lost(&s, 0);
  sim_ps_up(&s, 0);
  assert_int_equal(sim_alone_out(&s), 0);
  sim_run_calm(&s, 3000);
  assert_int_equal(s.status, 0);
  assert_int_equal(coord_sm_global_step(s.sm), 200);
  assert_int_equal(sim_disk_newest(&s), 200);
  sim_free(&s);
}

/* async: every PS lost at once: nothing newer survives anywhere, so the
 * run goes back to the checkpoint as sync and ssp do (it costs nothing
 * more); and a PS whose restore alone keeps failing is restored with all
 * the others (which fall back to older checkpoints when theirs fails). */
static void async_ps_recovered_globally(void **state) {
  (void)state;
  for (int run = 0; run < 2; run++) {
    coord_sm_config c = sim_ckpt_config(2, 2, TSR_MODE_ASYNC, 200, 40);
    sim s;
    sim_init(&s, &c, (unsigned)run);
    start(&s);
    int64_t good = sim_run_past_ckpt(&s, 40, 10);
    if (run == 0) {
      assert_true(s.n_fl > 0);
      sim_ps_lost(&s, 0);
      sim_ps_lost(&s, 1);
      sim_tick(&s, 1);
      sim_ps_up(&s, 0);
      sim_ps_up(&s, 1);
      /* the closures out wait for the lost PS themselves: the setup goes
       * out without waiting for them, and holds their calls until the
       * restore */
      assert_true(s.n_fl > 0);
      assert_true(s.op_active);
      assert_int_equal(s.op_kind, COORD_ACT_SETUP_PS);
      assert_true(s.setup_hold);
      sim_run_calm(&s, 3000);
      assert_int_equal(s.count[COORD_ACT_RESTORE_PS], 0);
    } else {
      sim_ps_lost(&s, 1);
      sim_ps_up(&s, 1);
      for (int t = 0; t < c.restore_tries; t++) {
        assert_int_equal(sim_alone_out(&s), 1);
        sim_alone_answer(&s, 1, -5, false, "restore: shard file truncated");
      }
      assert_true(sim_noted(&s, "could not be restored alone"));
      sim_run_calm(&s, 3000);
    }
    assert_int_equal(s.status, 0);
    assert_int_equal(s.last_rewind, good);
    assert_int_equal(coord_sm_global_step(s.sm), 200);
    sim_free(&s);
  }
}

/* async: a lost PS that does not come back fails the run after
 * ps_timeout_s, naming it; training went on until then. */
static void ps_away_for_good(void **state) {
  (void)state;
  coord_sm_config c = sim_ckpt_config(2, 1, TSR_MODE_ASYNC, 100000, 40);
  sim s;
  sim_init(&s, &c, 0);
  start(&s);
  sim_run_past_ckpt(&s, 40, 1);
  sim_ps_lost(&s, 1);
  for (int r = 0; r < 100000 && !s.ended; r++) {
    if (s.n_fl)
      sim_closure_done(&s, 0, -1);
    else
      sim_tick(&s, 1);
  }
  assert_true(s.ended);
  assert_int_equal(s.status, 1);
  assert_non_null(strstr(s.fail, "did not come back within 60 s"));
  assert_non_null(strstr(s.fail, "ps:1"));
  sim_free(&s);
}

/* A cluster that never comes up whole fails after wait_timeout_s naming
 * the PS not connected and the workers down, not the ones that are up. */
static void never_ready_names_missing(void **state) {
  (void)state;
  coord_sm_config c = sim_ckpt_config(2, 2, TSR_MODE_ASYNC, 100, 40);
  sim s;
  sim_init(&s, &c, 0);
  sim_ps_up(&s, 0);
  for (int r = 0; r < 100000 && !s.ended; r++) sim_tick(&s, 1);
  assert_true(s.ended);
  assert_int_equal(s.status, 1);
  assert_non_null(strstr(s.fail, "cluster not ready after"));
  assert_non_null(strstr(s.fail, "missing: ps:1"));
  assert_null(strstr(s.fail, "ps:0"));
  assert_non_null(strstr(s.fail, "worker:0"));
  assert_non_null(strstr(s.fail, "worker:1"));
  sim_free(&s);
}

/* coord_sm_waiting (what `tessera status` shows) names what each wait
 * waits for: the processes still missing at the start, a PS lost in sync
 * (paused until it is back), the setup and the restore that follow. */
static void waiting_is_named(void **state) {
  (void)state;
  coord_sm_config c = sim_ckpt_config(2, 2, TSR_MODE_SYNC, 200, 40);
  sim s;
  sim_init(&s, &c, 0);
  char w[COORD_MSG_MAX];
  sim_ps_up(&s, 0);
  sim_ps_up(&s, 1);
  sim_wk_up(&s, 0);
  sim_tick(&s, 2);
  assert_true(coord_sm_waiting(s.sm, w, sizeof w) > 0);
  assert_non_null(strstr(w, "worker:1 to answer"));
  assert_null(strstr(w, "ps:"));
  sim_wk_up(&s, 1);
  assert_true(coord_sm_waiting(s.sm, w, sizeof w) > 0);
  assert_non_null(strstr(w, "every PS to create the variables"));
  sim_answer(&s, 0, -1, false, NULL); /* SETUP_PS */
  sim_run_past_ckpt(&s, 40, 5);
  sim_ps_lost(&s, 1);
  while (s.n_fl) sim_closure_fail(&s, 0, COORD_ERR_TRANSIENT, "ps:1 gone");
  sim_tick(&s, 3);
  assert_true(coord_sm_waiting(s.sm, w, sizeof w) > 0);
  assert_non_null(strstr(w, "ps:1 to come back"));
  sim_ps_up(&s, 1);
  sim_answer(&s, 0, -1, false, NULL); /* SETUP_PS */
  assert_true(coord_sm_waiting(s.sm, w, sizeof w) > 0);
  assert_non_null(strstr(w, "to restore the checkpoint of step"));
  sim_run_calm(&s, 3000);
  assert_int_equal(s.status, 0);
  assert_int_equal(coord_sm_waiting(s.sm, w, sizeof w), 0);
  sim_free(&s);
}

int main(void) {
  tsr_log_set_level(TSR_LOG_ERROR);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(never_ready_names_missing),
      cmocka_unit_test(lost_worker_async),
      cmocka_unit_test(lost_worker_ssp),
      cmocka_unit_test(lost_worker_sync),
      cmocka_unit_test(closure_lost_before_its_worker),
      cmocka_unit_test(stuck_worker_is_named),
      cmocka_unit_test(lost_ps_restored_alone),
      cmocka_unit_test(ps_lost_during_a_save),
      cmocka_unit_test(final_save_failed_before_the_loss),
      cmocka_unit_test(async_ps_recovered_globally),
      cmocka_unit_test(ps_away_for_good),
      cmocka_unit_test(waiting_is_named),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
