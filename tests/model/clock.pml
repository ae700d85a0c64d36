/* The parameter servers' clock protocol (ssp:S and sync) as a Spin model:
 * two PS (one sync shard each), NW workers, a chief that hands out
 * closures, and an environment that kills, cuts off and restarts any of
 * them a bounded number of times. Names follow the C code (ps/consist.c,
 * ps/gate.c, ps/service.c, worker/clock.c, chief/coord/); README.md maps them.
 *
 * Checked (run.sh): no assertion fails (ssp: no read is let through more
 * than S clocks ahead of a member; sync: every applied step sums the
 * gradient of every member that owes it, each exactly once, each computed
 * from that step's parameters in the PS's present era), no reachable state
 * where the run cannot finish (invalid end states: every process waits),
 * and, with -DNP, no cycle that never completes a step.
 *
 * No call has a deadline here: a state that only a deadline would end is
 * a hang.
 */

#ifndef NW
#define NW 2
#endif
#define NP 2
#ifndef CL
#define CL 2            /* steps per closure */
#endif
#ifndef TOTAL
#define TOTAL 4         /* steps in the run (the chief's count) */
#endif
#ifndef FAILS
#define FAILS 2         /* failures the environment injects at most */
#endif
#ifndef S
#define S 1             /* ssp staleness */
#endif
#define PS_MODE_SSP 1
#define PS_MODE_SYNC 2
#ifndef MODE
#define MODE PS_MODE_SYNC
#endif
#ifndef MAXINF
#define MAXINF 2        /* closures in flight per worker */
#endif
#define CL_MAX ((FAILS + 1) * (TOTAL + NW * MAXINF))
#ifndef CKPTS
#define CKPTS 1         /* checkpoints taken during the run, at most */
#endif
#define INBOX 8

#define IDX(p, w) ((p) * NW + (w))
#define SLOT(w, k) ((w) * MAXINF + (k))

mtype = { WK_JOB_CONFIGURE, WK_JOB_RUN, WK_READY, WK_DONE, WK_FAILED };

/* ---- parameter servers (ps/consist.c, ps/gate.c) ------------------------- */
byte ps_era[NP];          /* a fresh PS and every ps__cons_reset: a new one
                             (0: none; workers start with 0) */
byte ps_run[NP];          /* the run of the last reset (the chief's config) */
byte ps_base[NP];         /* the step of the last reset */
bool m_active[NP * NW];   /* ps_worker_clock: a member */
byte m_clock[NP * NW];
byte m_closure[NP * NW];  /* the closure it joined for */
byte m_left[NP * NW];     /* closures up to this one are over (LEAVE) */
/* the sync shard of each PS (ps_entry) */
byte sync_done[NP];       /* steps applied */
bool sync_queued[NP];     /* PS_OP_SYNC_APPLY queued or running */
bool ps_empty[NP];        /* started again and not restored yet: it holds
                             no shard, so every pull and push is refused */
byte sync_target[NP];
bool pushed[NP * NW];
byte n_pushed[NP];

/* ---- workers (worker/clock.c, worker/loop_step.c) ------------------------ */
byte w_clock[NW];         /* sync: next step to push; ssp: steps finished */
byte w_era[NP * NW];      /* the era each PS answered the last join with */
byte w_run[NW];           /* the run it is configured for (0: none) */
bool w_kill[NW];          /* kill -9 (the process restarts at once) */
byte rd_era[NP * NW];     /* ghosts: the parameters of the last read */
byte rd_step[NP * NW];
chan inbox[NW] = [INBOX] of { mtype, byte, byte, byte };
byte w_busy[NW];          /* ghost: closures queued or running */

/* ---- chief (chief/coord/) -------------------------------------------------- */
chan results = [INBOX] of { mtype, byte, byte, byte, byte };
byte runs;                /* allocator of run ids (the chief draws one) */
bool w_lost[NW];          /* the chief's connection to the worker failed */
bool restore_due;         /* a PS came back empty: the chief pauses,
                             waits for the closures out to end, then
                             restores every PS and rewinds */
bool chief_kill;
bool finished;
byte ckpt;                /* step of the last committed checkpoint */
byte ckpts;               /* checkpoints taken (one at most) */
/* LEAVE messages on the chief's connection to each PS, not yet read */
bool leave_sent[NP * NW];
byte leave_cl[NP * NW];
byte leave_run[NP * NW];

/* ---- the PS side ------------------------------------------------------------ */

/* A new era: every member forgotten, the sync shard at `step`; a new run
 * also forgets which closures were over. */
inline ps__cons_reset(p, run_, step) {
  ps_era[p]++;   /* never one it had: the C code draws 64 random bits */
  for (i : 0 .. NW - 1) {
    m_active[IDX(p, i)] = false;
    m_clock[IDX(p, i)] = 0;
    m_closure[IDX(p, i)] = 0;
    if
    :: ps_run[p] != run_ -> m_left[IDX(p, i)] = 0
    :: else
    fi;
    pushed[IDX(p, i)] = false
  }
  ps_run[p] = run_;
  ps_base[p] = step;
  sync_done[p] = step;
  /* canonical form (changes nothing a worker can observe): an era a
   * worker holds that no PS has any more is as good as none, and a
   * worker with no era left has a clock no JOIN will look at */
  for (i : 0 .. NW - 1) {
    if
    :: w_era[IDX(p, i)] != ps_era[p] -> w_era[IDX(p, i)] = 0
    :: else
    fi;
    if
    :: w_era[IDX(0, i)] == 0 && w_era[IDX(1, i)] == 0 -> w_clock[i] = 0
    :: else
    fi
  };
  /* an apply still running belongs to the old era: it changes nothing
   * when it ends, and joins meanwhile start at the reset's step */
  if
  :: sync_queued[p] -> sync_target[p] = step
  :: else
  fi;
  n_pushed[p] = 0
}

/* The step a worker joining a sync shard starts at: the one being summed,
 * or the next when the sum is closed or already has its gradient. */
inline ps__sync_next(p, w, out) {
  if
  :: sync_queued[p] -> out = sync_target[p]
  :: !sync_queued[p] && pushed[IDX(p, w)] -> out = sync_done[p] + 1
  :: else -> out = sync_done[p]
  fi
}

/* JOIN: the clock a worker continues from (ps__cons_join). */
inline ps__cons_join(p, w, clock, era, cl, out) {
#if MODE == PS_MODE_SYNC
  ps__sync_next(p, w, out);
#else
  out = 255;
  for (i : 0 .. NW - 1) {
    if
    :: i != w && m_active[IDX(p, i)] && m_clock[IDX(p, i)] < out ->
       out = m_clock[IDX(p, i)]
    :: else
    fi
  }
  if
  :: out == 255 -> out = ps_base[p]
  :: else
  fi;
#endif
  if
  :: out < ps_base[p] -> out = ps_base[p]
  :: else
  fi;
  if
  :: era == ps_era[p] && clock > out -> out = clock
  :: else
  fi;
  if
  :: m_active[IDX(p, w)] && m_clock[IDX(p, w)] > out ->
     out = m_clock[IDX(p, w)]
  :: else
  fi;
  m_active[IDX(p, w)] = true;
  m_clock[IDX(p, w)] = out;
  m_closure[IDX(p, w)] = cl
}

/* LEAVE from the chief: closures up to cl of worker w are over. */
inline ps__cons_leave(p, w, run_, cl) {
  if
  :: ps_run[p] == run_ ->
     if
     :: cl > m_left[IDX(p, w)] -> m_left[IDX(p, w)] = cl
     :: else
     fi;
     if
     :: m_active[IDX(p, w)] && m_closure[IDX(p, w)] <= cl ->
        m_active[IDX(p, w)] = false;
        m_clock[IDX(p, w)] = 0;
        m_closure[IDX(p, w)] = 0
     :: else
     fi
  :: else   /* another run's chief, or a PS that lost its state anyway */
  fi
}

/* A LEAVE in flight reaches its PS (see Net). */
inline ps__deliver_leave(p, w) {
  leave_sent[IDX(p, w)] = false;
  ps__cons_leave(p, w, leave_run[IDX(p, w)], leave_cl[IDX(p, w)]);
  leave_run[IDX(p, w)] = 0;
  leave_cl[IDX(p, w)] = 0
}

/* ssp: may a read at clock c go through? (ps__cons_may_read) */
#define MEMBER_BEHIND(p, v, c) \
  (m_active[IDX(p, v)] && m_clock[IDX(p, v)] + S < (c))
#if NW == 2
#define PS_MAY_READ(p, c) (!MEMBER_BEHIND(p, 0, c) && !MEMBER_BEHIND(p, 1, c))
#else
#define PS_MAY_READ(p, c) (!MEMBER_BEHIND(p, 0, c) && \
  !MEMBER_BEHIND(p, 1, c) && !MEMBER_BEHIND(p, 2, c))
#endif

/* sync: a member owes the step being summed (ps__cons_sync_ready) */
#define OWES(p, v) (m_active[IDX(p, v)] && \
  m_clock[IDX(p, v)] <= sync_done[p] && !pushed[IDX(p, v)])
#define AHEAD(p, v) (m_active[IDX(p, v)] && m_clock[IDX(p, v)] > sync_done[p])
#if NW == 2
#define NONE_OWES(p) (!OWES(p, 0) && !OWES(p, 1))
#define ANY_AHEAD(p) (AHEAD(p, 0) || AHEAD(p, 1))
#else
#define NONE_OWES(p) (!OWES(p, 0) && !OWES(p, 1) && !OWES(p, 2))
#define ANY_AHEAD(p) (AHEAD(p, 0) || AHEAD(p, 1) || AHEAD(p, 2))
#endif
/* ps__sync_check: sum complete (or a step nobody owes, skipped) */
#define SYNC_READY(p) (!sync_queued[p] && NONE_OWES(p) && \
  (n_pushed[p] > 0 || ANY_AHEAD(p)))

/* PS_OP_SYNC_APPLY: queued when the sum is complete, applied later on the
 * pool; a reset in between leaves the new era alone. */
proctype PS(byte p) {
  byte qera, i, n;
end:
  do
  :: atomic {
       SYNC_READY(p) ->
       if
       :: n_pushed[p] > 0 -> sync_target[p] = sync_done[p] + 1
       :: else ->   /* every member is past this step: skip to the slowest */
          sync_target[p] = 255;
          for (i : 0 .. NW - 1) {
            if
            :: m_active[IDX(p, i)] && m_clock[IDX(p, i)] < sync_target[p] ->
               sync_target[p] = m_clock[IDX(p, i)]
            :: else
            fi
          }
       fi;
       /* safety: every member that owes this step has pushed it, once */
       n = 0;
       for (i : 0 .. NW - 1) {
         assert(!(m_active[IDX(p, i)] && m_clock[IDX(p, i)] <= sync_done[p]) ||
                pushed[IDX(p, i)]);
         if
         :: pushed[IDX(p, i)] -> n++
         :: else
         fi
       }
       assert(n == n_pushed[p]);
       sync_queued[p] = true;
       qera = ps_era[p]
     };
     atomic {
       if
       :: qera == ps_era[p] ->
          sync_done[p] = sync_target[p];
          n_pushed[p] = 0;
          for (i : 0 .. NW - 1) { pushed[IDX(p, i)] = false }
       :: else
       fi;
       sync_queued[p] = false;
       sync_target[p] = 0;
       qera = 0; i = 0; n = 0
     }
  od
}

/* ---- the worker side ------------------------------------------------------------ */

/* A call to a PS fails at once when the PS is down or its era is not the
 * one this worker joined in (the PS was reset: restored, reconfigured). */
#define GONE(p, w) (w_era[IDX(p, w)] != ps_era[p])
/* A pull or push is refused at once: the PS was reset or started again
 * since the worker joined it, holds no shard yet, or the worker is no
 * member there. */
#define REFUSED(p, w) (GONE(p, w) || ps_empty[p] || !m_active[IDX(p, w)])

/* A worker's calls go to every PS at once and each PS answers on its
 * own; the PS are independent, so one atomic step per fan-out stands for
 * every order of the answers. A JOIN or TICK that fails on one PS still
 * runs on the others. A pull or push refused by one PS gives up the
 * worker's calls that another PS holds (ps/client/client_kv_loop.c: a lost
 * connection, or a call refused on its own, resets every connection):
 * nothing waits for a step that will not come now. The JOINs and the
 * TICKs that follow them are one step: the worker waits for nothing in
 * between. */

/* wk__clock_join: JOIN every PS; the closure continues from the largest
 * clock answered (ps__cons_join on each). */
inline wk__clock_join(w, cl) {
  J = 0;
  for (p : 0 .. NP - 1) {
    if   /* a LEAVE in flight may arrive first */
    :: leave_sent[IDX(p, w)] -> ps__deliver_leave(p, w)
    :: true
    fi;
    if
    /* a PS started again serves no run yet: it takes the JOIN */
    :: (ps_run[p] != 0 && ps_run[p] != w_run[w]) ||
       (cl != 0 && cl <= m_left[IDX(p, w)]) ->
       ok = false
    :: else ->
       ps__cons_join(p, w, w_clock[w], w_era[IDX(p, w)], cl, jp);
       w_era[IDX(p, w)] = ps_era[p];
       if
       :: jp > J -> J = jp
       :: else
       fi
    fi
  };
  w_clock[w] = J;
  jp = 0; p = 0
}

/* TICK on every PS (ps__cons_clock): raises this member's clock to c. */
inline wk__clock_tick(w, c) {
  for (p : 0 .. NP - 1) {
    if
    :: GONE(p, w) || !m_active[IDX(p, w)] -> ok = false
    :: else ->
       if
       :: m_clock[IDX(p, w)] < c -> m_clock[IDX(p, w)] = c
       :: else
       fi
    fi
  };
  p = 0
}

/* Pulls gated at clock c on every PS, held until every gate is open (a
 * gate that opened stays open in its era), or refused at once (a worker
 * that is no member any more is not held: nobody would move the gate for
 * it), which gives up the others; the guard comes first. */
#if MODE == PS_MODE_SYNC
#define PULL_GATE(p, c) (sync_done[p] >= (c))
#else
#define PULL_GATE(p, c) PS_MAY_READ(p, c)
#endif
#ifndef NO_GIVE_UP
#define PULLS_OPEN(w, c) (REFUSED(0, w) || REFUSED(1, w) || \
  (PULL_GATE(0, c) && PULL_GATE(1, c)))
#else /* a refusal gives up nothing (run.sh: the model finds the hang) */
#define PULLS_OPEN(w, c) ((REFUSED(0, w) || PULL_GATE(0, c)) && \
  (REFUSED(1, w) || PULL_GATE(1, c)))
#endif
/* A read on a PS whose gate is closed, in a fan-out another PS refused,
 * is given up, not made. */
inline wk__pull(w, c) {
  for (p : 0 .. NP - 1) {
    if
    :: REFUSED(p, w) -> ok = false
    :: !REFUSED(p, w) && !PULL_GATE(p, c) -> skip   /* held: given up */
    :: !REFUSED(p, w) && PULL_GATE(p, c) ->
#if MODE == PS_MODE_SSP
       /* safety: no member is more than S clocks behind the read */
       for (i : 0 .. NW - 1) {
         assert(!m_active[IDX(p, i)] || m_clock[IDX(p, i)] + S >= c)
       };
       i = 0;
#endif
#if MODE == PS_MODE_SYNC
       rd_era[IDX(p, w)] = ps_era[p];
       rd_step[IDX(p, w)] = sync_done[p]
#else
       skip
#endif
    fi
  };
  if
  :: !ok ->
     for (p : 0 .. NP - 1) { rd_era[IDX(p, w)] = 0; rd_step[IDX(p, w)] = 0 }
  :: else
  fi;
  p = 0
}

/* Pushes of step t's gradient to every PS. */
#if MODE == PS_MODE_SYNC
/* refused: as a pull, or stale (that step was applied without it) */
#define PUSH_REFUSED(p, w, t) (REFUSED(p, w) || (t) < sync_done[p])
/* held while the shard applies a step: an apply of the era before a
 * reset may still be running (one of this era waits for this push) */
#define PUSH_HELD(p, w, t) (!PUSH_REFUSED(p, w, t) && sync_queued[p])
#ifndef NO_GIVE_UP
#define PUSHES_GO(w, t) (PUSH_REFUSED(0, w, t) || PUSH_REFUSED(1, w, t) || \
  (!PUSH_HELD(0, w, t) && !PUSH_HELD(1, w, t)))
#else
#define PUSHES_GO(w, t) (!PUSH_HELD(0, w, t) && !PUSH_HELD(1, w, t))
#endif
#else
#define PUSH_REFUSED(p, w, t) REFUSED(p, w)
#define PUSH_HELD(p, w, t) false
#define PUSHES_GO(w, t) true
#endif
/* A push refused by one PS gives up the others: one that a PS holds is
 * never applied, one already through may have been applied first. */
inline wk__push(w, t) {
#ifndef NO_GIVE_UP
  gu = PUSH_REFUSED(0, w, t) || PUSH_REFUSED(1, w, t);
#endif
  for (p : 0 .. NP - 1) {
    if
    :: PUSH_REFUSED(p, w, t) -> ok = false
    :: !PUSH_REFUSED(p, w, t) && gu -> skip   /* given up */
#if MODE == PS_MODE_SYNC
    :: !PUSH_REFUSED(p, w, t) && (!gu || !PUSH_HELD(p, w, t)) ->
       /* the step is the one being summed, and has no gradient of it */
       assert(t == sync_done[p] && !sync_queued[p] && !pushed[IDX(p, w)]);
       /* safety: the gradient was computed from step t's parameters */
       assert(rd_era[IDX(p, w)] == ps_era[p] && rd_step[IDX(p, w)] == t);
       pushed[IDX(p, w)] = true;
       n_pushed[p]++
#else
    :: !PUSH_REFUSED(p, w, t) ->
       if
       :: m_clock[IDX(p, w)] < t + 1 -> m_clock[IDX(p, w)] = t + 1
       :: else
       fi
#endif
    fi;
    rd_era[IDX(p, w)] = 0;
    rd_step[IDX(p, w)] = 0
  };
  p = 0
}

/* The closure's answer; temporaries and ghosts back to zero (dead values
 * would split states). */
inline wk__answer(kind_) {
  w_busy[w]--;
  assert(nfull(results));
  results!kind_, w, cl, run_, (kind_ == WK_DONE -> n : 0);
  kind = 0; cl = 0; n = 0; run_ = 0; J = 0; k = 0; t = 0; ok = false;
  gu = false
}

proctype Worker(byte w) {
  mtype kind;
  byte cl, n, run_, J, jp, p, i, k, t;
  bool ok, gu;
end_restart:
  do
  :: {
end:   do
       :: atomic {
            inbox[w]?kind, cl, n, run_ ->
            if
            :: kind == WK_JOB_CONFIGURE ->   /* do_configure */
               w_run[w] = run_;
               /* a configured worker is a member from the start, so the
                * first steps of a sync run wait for every worker */
               ok = true;
               wk__clock_join(w, 0);
               assert(nfull(results));
               if
               :: ok -> results!WK_READY, w, 0, run_, 0
               :: else -> w_run[w] = 0   /* not configured; the chief tries
                                            again when it configures anew */
               fi;
               w_busy[w]--;
               kind = 0; run_ = 0; J = 0; ok = false
            :: kind == WK_JOB_RUN ->   /* wk__run_closure */
               ok = w_run[w] != 0;
               if
               :: ok -> wk__clock_join(w, cl)
               :: else
               fi;
               if
               :: ok -> wk__clock_tick(w, J)
               :: else
               fi;
               J = 0;
               if
               :: !ok -> wk__answer(WK_FAILED)
               :: else
               fi
            fi
          }
          /* its steps: pull at the clock, compute, push */
          do
          :: atomic {
               ok && PULLS_OPEN(w, w_clock[w]) ->
               wk__pull(w, w_clock[w]);
               if
               :: !ok -> wk__answer(WK_FAILED)
               :: else
               fi
             }
             if
             :: ok ->
                atomic {
                  PUSHES_GO(w, w_clock[w]) ->
                  t = w_clock[w];
                  w_clock[w] = t + 1;   /* a failed push spends its step */
                  wk__push(w, t);
                  k++;
                  t = 0;
                  if
                  :: !ok -> wk__answer(WK_FAILED)
                  :: ok && k == n -> wk__answer(WK_DONE)
                  :: else
                  fi
                }
             :: else
             fi
          :: !ok -> break
          od
       od
     } unless {
       atomic {
         w_kill[w] ->
         w_kill[w] = false;
         do
         :: nempty(inbox[w]) -> inbox[w]?_, _, _, _
         :: empty(inbox[w]) -> break
         od;
         w_clock[w] = 0;
         w_run[w] = 0;
         w_busy[w] = 0;
         for (p : 0 .. NP - 1) {
           w_era[IDX(p, w)] = 0; rd_era[IDX(p, w)] = 0; rd_step[IDX(p, w)] = 0
         };
         p = 0;
         kind = 0; cl = 0; n = 0; run_ = 0; J = 0; k = 0; t = 0; ok = false;
         gu = false;
         w_lost[w] = true   /* the chief sees the connection drop */
       }
     }
  od
}

/* ---- the chief ---------------------------------------------------------------------- */

/* Every event the chief handles is one atomic step: it runs on one loop
 * and sends as it goes, which is the same as sending at the end. */

/* coord__wk_leave: LEAVE on every PS, closures up to the last one handed
 * to the worker (sent now, read by each PS whenever the network says). */
inline coord__wk_leave(w) {
  left[w] = true;
  for (p : 0 .. NP - 1) {
    leave_cl[IDX(p, w)] = last_cl[w];
    leave_run[IDX(p, w)] = run_;
    leave_sent[IDX(p, w)] = true;
    if   /* see Net: only a JOIN of a closure sent before it can race it */
    :: w_busy[w] == 0 -> ps__deliver_leave(p, w)
    :: else
    fi
  };
  p = 0
}

/* chief_sched_worker_down and coord_wk_down: the worker's closures go
 * back, it no longer counts on the PS, it is configured again. */
inline coord__wk_down(w) {
  for (k : 0 .. MAXINF - 1) {
    if
    :: inf_cl[SLOT(w, k)] != 0 ->
       pool = pool + inf_steps[SLOT(w, k)];
       inf_cl[SLOT(w, k)] = 0
    :: else
    fi
  };
  k = 0;
  load[w] = 0;
  wup[w] = false;
  if
  :: !left[w] -> coord__wk_leave(w)
  :: else
  fi;
  assert(nfull(inbox[w]));
  inbox[w]!WK_JOB_CONFIGURE, 0, 0, run_;
  w_busy[w]++
}

/* chief_sched_rewind: back to the checkpoint's step, the closures in
 * flight forgotten, and every worker told its closures so far are over
 * (some may still run: a PS that restarted has no memory of what was
 * over, so one could join it again and hold the others for ever). */
inline coord__rewind() {
  done = ckpt;
  pool = TOTAL - ckpt;
  for (w : 0 .. NW - 1) {
    for (k : 0 .. MAXINF - 1) { inf_cl[SLOT(w, k)] = 0 };
    load[w] = 0;
    coord__wk_leave(w)
  };
  w = 0; k = 0
}

/* The chief's setup (and the restore after a lost PS): every PS reset to
 * the checkpoint's step (config, restore) before any closure goes out.
 * The resets are one step: a closure still running from before sees the
 * PS mixed, and whatever it does on a PS not reset yet is wiped by that
 * PS's reset. */
inline coord__ps_restore() {
  for (p : 0 .. NP - 1) { ps__cons_reset(p, run_, ckpt); ps_empty[p] = false };
  restore_due = false;
  p = 0; i = 0
}

inline coord__wk_dispatch(w) {
  k = 0;
  do
  :: inf_cl[SLOT(w, k)] != 0 -> k++
  :: else -> break
  od;
  n = (pool < CL -> pool : CL);
  pool = pool - n;
  cl_next++;
  /* retries are bounded: every failure costs a few closures at most, so
   * more than this many is a closure failing for ever (a livelock) */
  assert(cl_next <= CL_MAX);
  inf_cl[SLOT(w, k)] = cl_next;
  inf_steps[SLOT(w, k)] = n;
  load[w]++;
  left[w] = false;   /* the closure joins again */
  last_cl[w] = cl_next;
  assert(nfull(inbox[w]));
  inbox[w]!WK_JOB_RUN, cl_next, n, run_;
  w_busy[w]++;
  k = 0; n = 0
}

/* A closure's answer (coord_wk_on_run); coord__wk_release_idle: a worker
 * with no closure in flight no longer counts on the PS. */
inline coord__on_result() {
  if
  :: r != run_ -> skip              /* an earlier chief's */
  :: r == run_ && kind == WK_READY ->
     wup[w] = true;
     left[w] = false    /* the configure joined it */
  :: r == run_ && kind != WK_READY ->
     found = false;
     for (k : 0 .. MAXINF - 1) {
       if
       :: !found && inf_cl[SLOT(w, k)] == cl && cl != 0 ->
          found = true;
          inf_cl[SLOT(w, k)] = 0;
          load[w]--;
          if
          :: kind == WK_DONE -> done = done + n; gained = true
          :: else -> pool = pool + inf_steps[SLOT(w, k)]
          fi
       :: else
       fi
     };
     skip
  fi;
  kind = 0; w = 0; cl = 0; r = 0; n = 0; k = 0; found = false
}

#define DISPATCH(W) \
  :: atomic { !ckpt_due && pool > 0 && wup[W] && !w_lost[W] && \
              !restore_due && load[W] < MAXINF -> \
       coord__wk_dispatch(W) }
/* coord__wk_release_idle: a configured worker with no closure in flight
 * and none to be handed now stops counting */
#define RELEASE_IDLE(W) \
  :: atomic { wup[W] && !left[W] && load[W] == 0 && !w_lost[W] && \
              !restore_due && (pool == 0 || ckpt_due) -> \
       coord__wk_leave(W) }
#define NOTICE_WORKER(W) \
  :: atomic { w_lost[W] -> \
       w_lost[W] = false; coord__wk_down(W) }
#if NW == 2
#define ALL_IDLE (load[0] == 0 && load[1] == 0)
#else
#define ALL_IDLE (load[0] == 0 && load[1] == 0 && load[2] == 0)
#endif

proctype Chief() {
  mtype kind;
  byte w, cl, r, n, p, i, k, run_, done, pool, cl_next;
  byte load[NW], last_cl[NW], inf_cl[NW * MAXINF], inf_steps[NW * MAXINF];
  bool wup[NW], left[NW], ckpt_due, found, gained;
restart:
  atomic {
    runs++;
    run_ = runs;
    cl_next = 0;
    ckpt_due = false;
    for (w : 0 .. NW - 1) {
      load[w] = 0; last_cl[w] = 0; wup[w] = false; left[w] = false;
      for (k : 0 .. MAXINF - 1) { inf_cl[SLOT(w, k)] = 0; inf_steps[SLOT(w, k)] = 0 }
    };
    w = 0; k = 0; cl = 0; r = 0; n = 0; kind = 0; found = false; gained = false
  }
  {
    atomic {
      coord__ps_restore();
      done = ckpt;
      pool = TOTAL - ckpt;
      for (w : 0 .. NW - 1) {
        assert(nfull(inbox[w]));
        inbox[w]!WK_JOB_CONFIGURE, 0, 0, run_;
        w_busy[w]++
      };
      w = 0
    }
    do
    :: atomic { nempty(results) ->
                 results?kind, w, cl, r, n; coord__on_result() };
       if
       :: gained -> progress: gained = false
       :: else
       fi
    DISPATCH(0)
    DISPATCH(1)
#if NW > 2
    DISPATCH(2)
#endif
    RELEASE_IDLE(0)
    RELEASE_IDLE(1)
#if NW > 2
    RELEASE_IDLE(2)
#endif
    NOTICE_WORKER(0)
    NOTICE_WORKER(1)
#if NW > 2
    NOTICE_WORKER(2)
#endif
    /* sm_pump_recover: once the closures out have ended (or failed on the
     * empty PS), every PS restores the checkpoint, then the rewind */
    :: atomic { restore_due && ALL_IDLE -> coord__ps_restore(); coord__rewind() }
    :: atomic { !ckpt_due && ckpts < CKPTS && done > ckpt && done < TOTAL &&
                !restore_due ->
         ckpt_due = true }         /* a checkpoint: pause, drain, save */
    :: atomic { ckpt_due && ALL_IDLE && !restore_due ->
         ckpt = done; ckpts++; ckpt_due = false }
    :: atomic { done == TOTAL && ALL_IDLE && !restore_due -> finished = true };
       break
    od
  } unless {
    atomic { chief_kill -> chief_kill = false }
  };
  if
  :: !finished -> goto restart
  :: else
  fi
}

/* ---- the network and the environment ----------------------------------------------- */

/* A LEAVE for a worker that still has closures queued or running reaches
 * its PS late: right before or after that worker's next JOIN there (both
 * orders are explored, see wk__clock_join), or when nothing else can move
 * (Spin's timeout). For a worker with nothing queued it arrives at once:
 * the next JOIN is then for a closure sent after it, and a JOIN in the
 * same era ends the same whichever comes first. Delivering it at any
 * other moment changes no assertion (a membership change only opens
 * gates) and multiplies the states. */
#define DELIVER(P, W) \
  :: atomic { \
       timeout && leave_sent[IDX(P, W)] -> ps__deliver_leave(P, W) \
     }
proctype Net() {
end:
  do
  DELIVER(0, 0)
  DELIVER(0, 1)
  DELIVER(1, 0)
  DELIVER(1, 1)
#if NW > 2
  DELIVER(0, 2)
  DELIVER(1, 2)
#endif
  od
}

/* A PS killed and started again: a fresh process (a new era, no member,
 * no run, no memory of which closures were over, no shard), which the
 * chief sees at once: it pauses (no closure goes out) and, once the
 * closures out have ended, restores every PS (coord__ps_restore: the same
 * resets it makes at setup) and rewinds. Meanwhile the workers may JOIN
 * the empty PS (it serves no run) and their pulls and pushes there are
 * refused, while the other PS may hold their calls for the other
 * workers. */
inline env_crash_ps(p) {
  ps__cons_reset(p, 0, 0);
  ps_empty[p] = true;
  restore_due = true
}

/* The workers are alike and so are the PS (the chief serves them in any
 * order, the workers call every PS at once): a failure of worker 0 or of
 * PS 0 stands for a failure of any of them. */
proctype Env() {
  byte budget = FAILS, i;
end:
  do
  :: budget > 0 && !finished ->
     atomic {
       budget--;
       if
#ifndef NO_KILL
       :: w_kill[0] = true                  /* kill -9, started again */
#endif
#ifndef NO_CUT
       :: w_lost[0] = true                  /* cut off from the chief, alive */
#endif
#ifndef NO_PS
       :: env_crash_ps(0)
#endif
#ifndef NO_CHIEF
       :: chief_kill = true
#endif
       fi
     }
  od
}

init {
  byte i;
  atomic {
    for (i : 0 .. NP - 1) { ps_era[i] = 1 }
#if MODE == PS_MODE_SYNC
    run PS(0);
    run PS(1);
#endif
    for (i : 0 .. NW - 1) { run Worker(i) }
    run Chief();
    run Net();
    run Env()
  }
}
