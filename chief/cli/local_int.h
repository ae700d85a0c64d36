/* `tessera local`'s supervisor, private to local.c (starting, reaping,
 * restarting and stopping the children) and local_relay.c (relaying their
 * output, each line prefixed with the child's name).
 *
 * Threads: the supervisor's loop thread only.
 */
#ifndef CHIEF_LOCAL_INT_H
#define CHIEF_LOCAL_INT_H

#include "chief/cli/local.h"
#include "common/log.h"

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

typedef struct sup sup;
typedef struct proc proc;

typedef struct {
  uv_pipe_t pipe;
  proc *p;
  bool is_err;
  char *line;
  size_t len;
  bool after_cr;  /* the text held in `line` began with '\r' */
  bool drawn;     /* this stream's last output was an in-place line */
} stream;

struct proc {
  sup *s;
  chief_local_role role;
  int index;
  char name[32];
  char exe[PATH_MAX];
  char *tf_config;
  pid_t pid;            /* 0 when not running */
  int restarts;
  uint64_t backoff_ms;
  uint64_t started_ms;
  bool restart_pending;
  bool gave_up;
  uv_timer_t timer;
};

struct sup {
  const chief_local_opts *o;
  chief_local_result *res;
  uv_loop_t loop;
  uv_signal_t sig_chld, sig_int, sig_term;
  uv_timer_t grace, drain, eval_limit;
  proc *procs;
  int n_procs;
  int open_streams;
  bool stopping, killed, done, closing;
  bool eval_drain;      /* the chief ended well: the evaluator finishes */
  bool relay_tty;       /* out_fd is a terminal: '\r' lines redraw in place */
  bool err_tty;         /* err_fd is a terminal (clears a shown bar) */
  int chief_columns;    /* terminal width left after the prefix; 0 unknown */
  bool bar_shown;
  int name_width;
  char token[80];
  char rundir[4096];    /* cluster.json and token for `tessera status` */
  char **envp_base;     /* environ minus the variables set per child */
  int n_envp_base;
  char rbuf[65536];
};

/* local_relay.c */
/* Reads child fd (its stdout, or its stderr when is_err) on the loop and
 * relays each line; the fd is the stream's (closed on failure). Counted
 * in s->open_streams until its pipe has closed. */
int chief_local__open_stream(sup *s, proc *p, int fd, bool is_err);
/* uv_walk callback: closes a relay pipe still open (a stray grandchild
 * holding it), relaying what it held. */
void chief_local__close_stray_stream(uv_handle_t *h, void *arg);
/* The launcher's own log lines go to stderr directly: end a progress line
 * shown on the terminal first, so they do not run into it. */
void chief_local__end_bar(sup *s);
#define SLOG(s, lvl, ...)                                  \
  do {                                                     \
    if (TSR_LOG_ENABLED(lvl)) {                            \
      chief_local__end_bar(s);                             \
      tsr_log(lvl, __VA_ARGS__);                           \
    }                                                      \
  } while (0)

/* local.c */
/* Ends the loop's work once every child is down for good and every relay
 * pipe has closed (a drain timer first, while pipes stay open). */
void chief_local__check_done(sup *s);

#endif /* CHIEF_LOCAL_INT_H */
