/* tessera-chief's coordinator: connects to every parameter server and
 * worker, creates the model's variables on the PS, configures the workers,
 * hands out closures, checkpoints, evaluates, recovers from failures and
 * reports.
 *
 * The decisions are a pure state machine (coord_sm.h, its phases and
 * failure modes are described there); coord_io.h is the side that talks
 * to the cluster and the disk and executes the machine's actions.
 *
 * Exit status: 0 the job is done; 1 the run failed (the reason is the
 * last line); 2 a configuration error; COORD_EXIT_DATA (3) the job's data
 * is bad (the worker's message names the file, line and column); 130
 * interrupted.
 */
#ifndef TSR_CHIEF_COORD_H
#define TSR_CHIEF_COORD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/cluster.h"

/* What tessera-chief's flags say. */
typedef struct {
  const char *job_path;
  const char *const *overrides;  /* "key=value", NULL-terminated */
  const tsr_cluster *cluster;    /* resolved at start-up (common/daemon.h);
                                    borrowed for the whole run */
  const void *token;             /* the cluster token, borrowed */
  size_t token_len;
  int plain_frames; /* --frame-mac off: tsr_rpc_opts.plain_frames */
  const char *summary_json;      /* --summary-json */
  double wait_timeout_s;         /* CONNECT; default 300 */
  double ps_timeout_s;           /* a dead PS; default 600 */
  double closure_timeout_s;      /* one closure; default 600 */
  bool keep_cluster;             /* do not shut PS and workers down */
  double heartbeat_timeout_s;    /* a silent peer is lost after this; 10 */
  const char *trace_path;        /* --trace: Chrome trace-event JSON */
  const char *test_folder_gate;  /* tests only (TESSERA_TEST_FOLDER_GATE):
                                    while this file exists, making a
                                    checkpoint's folder waits, having made
                                    the file <gate>.held */
} chief_coord_opts;

void chief_coord_opts_init(chief_coord_opts *o);

/* Runs the whole training; returns the process exit status (above),
 * having printed the reason. */
int chief_coord_run(const chief_coord_opts *o);

#endif
