/* The local cluster launcher behind `tessera local`.
 *
 * Starts one chief, N parameter servers and M workers on one host: each
 * child gets a port found free by binding port 0, a TF_CONFIG naming the
 * whole cluster and itself, and the same fresh random cluster token in
 * TESSERA_TOKEN. Children run in their own process groups (so a Ctrl-C in
 * the terminal reaches only the launcher, which then stops them in order)
 * and die with the launcher even when it is killed (PR_SET_PDEATHSIG).
 * Their stdout and stderr come back through pipes and are relayed line by
 * line with a prefix ("ps:0   | ..."), each line in one write(). While it
 * runs, a private folder (mode 0700, removed at the end) holds the
 * cluster map and the token, so `tessera status --cluster DIR/cluster.json
 * --token-file DIR/token` can look at the running cluster; the launcher
 * prints that command.
 *
 * Supervision follows docker-compose's `restart: on-failure` with a
 * maximum retry count: a ps or worker that exits non-zero or dies by a
 * signal is started again after a backoff that doubles from `backoff_ms` to
 * `backoff_max_ms` (reset after 10 s of good running); a process that
 * exits 0 stays down. The chief ends the run: when it exits, the others
 * get SIGTERM and, after `grace_ms`, SIGKILL, and the launcher returns the
 * chief's status. A chief killed by a signal the launcher did not send is
 * restarted like the others (it resumes from its last checkpoint). SIGINT
 * or SIGTERM to the launcher stops everyone the same way; a second one
 * sends SIGKILL at once.
 *
 * With an evaluator (TF's sidecar: tessera-chief whose task is evaluator,
 * outside the cluster map, with the chief's arguments), a chief that ends
 * with status 0 leaves the evaluator running until it has evaluated the
 * last checkpoint and exits on its own; any other end stops it with the
 * rest (a SIGINT while it finishes stops it too).
 */
#ifndef TSR_CHIEF_LOCAL_H
#define TSR_CHIEF_LOCAL_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
  CHIEF_LOCAL_CHIEF = 0,
  CHIEF_LOCAL_PS,
  CHIEF_LOCAL_WORKER,
  CHIEF_LOCAL_EVALUATOR,  /* tessera-chief as TF_CONFIG's evaluator task */
  CHIEF_LOCAL__ROLES
} chief_local_role;

typedef struct {
  int n_ps;                 /* >= 1; default 2 */
  int n_workers;            /* >= 1; default 2 */
  int n_evaluators;         /* 0 or 1; default 0 */
  const char *host;         /* IPv4 literal; default "127.0.0.1" */
  /* Folder holding tessera-ps, tessera-worker and tessera-chief. NULL:
   * $TESSERA_BIN_DIR, else next to this executable (and, in a build tree,
   * in ../ps, ../worker and ../chief from it), else $PATH. */
  const char *bin_dir;
  char *const *chief_args;  /* passed to tessera-chief after its name */
  int n_chief_args;
  int max_restarts;         /* per process; default 5; 0: never restart */
  uint64_t backoff_ms;      /* first restart delay; default 100 */
  uint64_t backoff_max_ms;  /* default 10000 */
  uint64_t grace_ms;        /* SIGTERM to SIGKILL; default 10000 */
  /* After the chief ends well, the evaluator may finish the last
   * checkpoint for this long before it is stopped too; default 120000 */
  uint64_t eval_drain_ms;
  int out_fd;               /* children's stdout goes here; default 1 */
  int err_fd;               /* children's stderr goes here; default 2 */
  const char *token;        /* NULL: 32 random bytes as hex */
} chief_local_opts;

typedef struct {
  int chief_status;         /* exit code, or 128 + signal number */
  int restarts[CHIEF_LOCAL__ROLES];
  int gave_up;              /* processes that used up max_restarts */
  int interrupted;          /* stopped by SIGINT/SIGTERM */
} chief_local_result;

/* Fills the defaults above (out_fd 1, err_fd 2). */
void chief_local_opts_init(chief_local_opts *o);

/* Runs the cluster until the chief ends or a signal stops it; returns 0
 * with `res` filled, or a negative code with `err` naming the problem
 * (a binary not found, no free port, a bad option) before anything was
 * started. Installs SIGINT/SIGTERM/SIGCHLD handlers for its duration and
 * ignores SIGPIPE; must not run concurrently with other child management
 * in the same process. */
int chief_local_run(const chief_local_opts *o, chief_local_result *res,
                    char *err, size_t errlen);

/* ---- building blocks, public for tests and for tessera's other
 * launchers ----------------------------------------------------------- */

/* `n` distinct ports on `host` that were free a moment ago: all are bound
 * at once (port 0) before any is released. */
int chief_local_free_ports(const char *host, int n, int *ports, char *err,
                           size_t errlen);

/* A fresh cluster token: 32 bytes from libsodium's randombytes, as 64 hex
 * digits and a NUL in `hex` (>= 65 bytes). */
int chief_local_token(char *hex, size_t len);

/* TF_CONFIG text for one task of a local cluster; the caller frees. NULL
 * when out of memory. */
char *chief_local_tf_config(const char *host, int chief_port,
                            const int *ps_ports, int n_ps,
                            const int *worker_ports, int n_workers,
                            chief_local_role role, int index);

/* The cluster map alone ({"chief": [...], "ps": [...], "worker": [...]}),
 * as `--cluster FILE.json` takes it; the caller frees. */
char *chief_local_cluster_json(const char *host, int chief_port,
                               const int *ps_ports, int n_ps,
                               const int *worker_ports, int n_workers);

/* Resolves the executable for `role` (see bin_dir above) into `out`. The
 * error lists every place that was looked at. */
int chief_local_find_binary(const char *bin_dir, chief_local_role role,
                            char *out, size_t len, char *err, size_t errlen);

/* "chief", "ps", "worker", "evaluator". */
const char *chief_local_role_name(chief_local_role role);

#endif /* TSR_CHIEF_LOCAL_H */
