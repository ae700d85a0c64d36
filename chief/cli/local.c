/* `tessera local`'s supervisor: starts the children, relays their output
 * (local_relay.c), restarts the ones that fail, and stops everything at
 * the end.
 *
 * Happy path: ports, token and binaries are resolved first (nothing is
 * started if any is missing); each child is forked with its stdout and
 * stderr on pipes read by libuv, its own process group, and
 * PR_SET_PDEATHSIG; SIGCHLD (a uv_signal_t) reaps them with waitpid. When
 * the chief exits, or SIGINT/SIGTERM arrives, every live child's group gets
 * SIGTERM and a timer sends SIGKILL after the grace period (an evaluator
 * finishing the last checkpoint after a chief that ended well is stopped
 * the same way once eval_drain_ms have passed). The loop ends
 * once every child is reaped and every pipe has reached EOF (a pipe kept
 * open by a stray grandchild is closed after a short drain delay).
 * Failure modes: fork or pipe failing for a restart is logged and counted
 * as a failed start (retried with backoff); a child that keeps failing is
 * left down after max_restarts, with a message, and the chief decides
 * whether the run can go on.
 */
#include "chief/cli/local_int.h"
#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <sodium.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>
#include <uv.h>

extern char **environ;

#define DRAIN_MS 500
#define BACKOFF_RESET_MS 10000

/* ---- starting and stopping children ----------------------------------- */
static void exit_name(int status, char *buf, size_t len) {
  if (WIFEXITED(status))
    snprintf(buf, len, "exited with status %d", WEXITSTATUS(status));
  else if (WIFSIGNALED(status))
    snprintf(buf, len, "was killed by signal %d (%s)", WTERMSIG(status),
             strsignal(WTERMSIG(status)));
  else
    snprintf(buf, len, "ended with wait status %d", status);
}

/* Builds argv/envp first: between fork and exec only async-signal-safe
 * calls happen. */
static int start_proc(proc *p) {
  sup *s = p->s;
  const chief_local_opts *o = s->o;
  bool chief_bin =
      p->role == CHIEF_LOCAL_CHIEF || p->role == CHIEF_LOCAL_EVALUATOR;
  int nargs = chief_bin ? o->n_chief_args : 0;
  char **argv = calloc((size_t)nargs + 2, sizeof *argv);
  char **envp = calloc((size_t)s->n_envp_base + 5, sizeof *envp);
  char *tf = NULL, *tok = NULL;
  int out[2] = {-1, -1}, errp[2] = {-1, -1};
  int rc = TSR_ENOMEM;
  if (!argv || !envp) goto fail;
  argv[0] = p->exe;
  for (int i = 0; i < nargs; i++) argv[i + 1] = o->chief_args[i];
  memcpy(envp, s->envp_base, (size_t)s->n_envp_base * sizeof *envp);
  int ne = s->n_envp_base;
  if (asprintf(&tf, "TF_CONFIG=%s", p->tf_config) < 0) {
    tf = NULL;
    goto fail;
  }
  if (asprintf(&tok, "TESSERA_TOKEN=%s", s->token) < 0) {
    tok = NULL;
    goto fail;
  }
  envp[ne++] = tf;
  envp[ne++] = tok;
  char cols[32];
  /* Only when both streams reach the terminal: the chief may draw on
   * either, and a bar must never end up in a log file. */
  if (p->role == CHIEF_LOCAL_CHIEF && s->relay_tty && s->err_tty) {
    envp[ne++] = (char *)"TESSERA_PROGRESS=bar";
    if (s->chief_columns > 0) {
      snprintf(cols, sizeof cols, "COLUMNS=%d", s->chief_columns);
      envp[ne++] = cols;
    }
  }
  envp[ne] = NULL;

  if (pipe2(out, O_CLOEXEC) != 0 || pipe2(errp, O_CLOEXEC) != 0) {
    rc = -errno;
    goto fail;
  }
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    rc = -errno;
    goto fail;
  }
  if (pid == 0) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    signal(SIGPIPE, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, 0);
    dup2(out[1], 1);
    dup2(errp[1], 2);
    execve(p->exe, argv, envp);
    static const char msg[] = "exec failed\n";
    if (write(2, msg, sizeof msg - 1) < 0) _exit(127);
    _exit(127);
  }
  setpgid(pid, pid); /* also here: a kill right after fork must find it */
  close(out[1]);
  close(errp[1]);
  p->pid = pid;
  p->started_ms = tsr_now_ms();
  chief_local__open_stream(s, p, out[0], false);
  chief_local__open_stream(s, p, errp[0], true);
  SLOG(s, TSR_LOG_INFO, "%s started (pid %ld)", p->name, (long)pid);
  free(argv);
  free(envp);
  free(tf);
  free(tok);
  return 0;
fail:
  for (int i = 0; i < 2; i++) {
    if (out[i] >= 0) close(out[i]);
    if (errp[i] >= 0) close(errp[i]);
  }
  free(argv);
  free(envp);
  free(tf);
  free(tok);
  return rc;
}

static void signal_all(sup *s, int sig) {
  for (int i = 0; i < s->n_procs; i++) {
    const proc *p = &s->procs[i];
    if (p->pid <= 0) continue;
    if (s->eval_drain && p->role == CHIEF_LOCAL_EVALUATOR) continue;
    kill(-p->pid, sig);
  }
}

static void on_grace(uv_timer_t *t) {
  sup *s = t->data;
  int left = 0; /* the ones the SIGKILL goes to */
  for (int i = 0; i < s->n_procs; i++)
    left += s->procs[i].pid > 0 &&
            !(s->eval_drain && s->procs[i].role == CHIEF_LOCAL_EVALUATOR);
  if (left > 0)
    SLOG(s, TSR_LOG_WARN,
         "%d process(es) still running %llu ms after SIGTERM: sending "
         "SIGKILL",
         left, (unsigned long long)s->o->grace_ms);
  s->killed = true;
  signal_all(s, SIGKILL);
}

/* The evaluator had its time to finish after the chief: stop it too. */
static void on_eval_limit(uv_timer_t *t) {
  sup *s = t->data;
  if (!s->eval_drain) return;
  s->eval_drain = false;
  SLOG(s, TSR_LOG_WARN,
       "the evaluator is still running %llu ms after the chief ended: "
       "stopping it (SIGTERM, SIGKILL after %llu ms)",
       (unsigned long long)s->o->eval_drain_ms,
       (unsigned long long)s->o->grace_ms);
  s->killed = false;
  signal_all(s, SIGTERM);
  uv_timer_start(&s->grace, on_grace, s->o->grace_ms, 0);
}

static void stop_all(sup *s, const char *why) {
  if (s->stopping) return;
  s->stopping = true;
  SLOG(s, TSR_LOG_INFO, "stopping the cluster: %s", why);
  for (int i = 0; i < s->n_procs; i++) {
    proc *p = &s->procs[i];
    if (p->restart_pending) {
      uv_timer_stop(&p->timer);
      p->restart_pending = false;
    }
  }
  signal_all(s, SIGTERM);
  uv_timer_start(&s->grace, on_grace, s->o->grace_ms, 0);
  chief_local__check_done(s);
}

static void on_restart_timer(uv_timer_t *t) {
  proc *p = t->data;
  sup *s = p->s;
  p->restart_pending = false;
  if (s->stopping) return;
  p->restarts++;
  s->res->restarts[p->role]++;
  int rc = start_proc(p);
  if (rc) {
    SLOG(s, TSR_LOG_ERROR, "%s: cannot start %s: %s", p->name, p->exe,
         tsr_strerror(rc));
    /* Count it as a failed run: try again later, within the budget. */
    if (p->restarts < s->o->max_restarts) {
      p->restart_pending = true;
      uv_timer_start(&p->timer, on_restart_timer, p->backoff_ms, 0);
    } else {
      p->gave_up = true;
      s->res->gave_up++;
      if (p->role == CHIEF_LOCAL_CHIEF) {
        s->res->chief_status = 1;
        stop_all(s, "the chief cannot be started");
      }
    }
  }
}

static void on_exit_status(sup *s, proc *p, int status) {
  char how[128];
  exit_name(status, how, sizeof how);
  uint64_t ran = tsr_now_ms() - p->started_ms;
  p->pid = 0;
  int code = WIFEXITED(status)    ? WEXITSTATUS(status)
             : WIFSIGNALED(status) ? 128 + WTERMSIG(status)
                                   : 1;
  if (s->stopping) {
    SLOG(s, TSR_LOG_INFO, "%s %s", p->name, how);
    if (p->role == CHIEF_LOCAL_CHIEF) s->res->chief_status = code;
    chief_local__check_done(s);
    return;
  }
  bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  bool restart = p->role == CHIEF_LOCAL_CHIEF ? WIFSIGNALED(status) : failed;
  if (!restart) {
    if (p->role == CHIEF_LOCAL_CHIEF) {
      s->res->chief_status = code;
      SLOG(s, TSR_LOG_INFO, "chief %s", how);
      for (int i = 0; code == 0 && i < s->n_procs; i++)
        if (s->procs[i].role == CHIEF_LOCAL_EVALUATOR &&
            (s->procs[i].pid > 0 || s->procs[i].restart_pending)) {
          s->eval_drain = true;
          SLOG(s, TSR_LOG_INFO,
               "%s keeps running until it has evaluated the last checkpoint "
               "(at most %llu ms; Ctrl-C stops it)",
               s->procs[i].name, (unsigned long long)s->o->eval_drain_ms);
          uv_timer_start(&s->eval_limit, on_eval_limit, s->o->eval_drain_ms,
                         0);
        }
      stop_all(s, "the chief has ended");
    } else {
      SLOG(s, TSR_LOG_INFO, "%s %s; not restarted", p->name, how);
      chief_local__check_done(s);
    }
    return;
  }
  if (p->restarts >= s->o->max_restarts) {
    SLOG(s, TSR_LOG_ERROR,
         "%s %s; it failed %d time(s), the restart limit: leaving it "
         "down",
         p->name, how, p->restarts + 1);
    p->gave_up = true;
    s->res->gave_up++;
    if (p->role == CHIEF_LOCAL_CHIEF) {
      s->res->chief_status = code;
      stop_all(s, "the chief failed too often");
    }
    chief_local__check_done(s);
    return;
  }
  if (ran >= BACKOFF_RESET_MS) p->backoff_ms = s->o->backoff_ms;
  SLOG(s, TSR_LOG_WARN, "%s %s; restarting in %llu ms (restart %d of %d)",
       p->name, how, (unsigned long long)p->backoff_ms, p->restarts + 1,
       s->o->max_restarts);
  p->restart_pending = true;
  uv_timer_start(&p->timer, on_restart_timer, p->backoff_ms, 0);
  p->backoff_ms = p->backoff_ms * 2 > s->o->backoff_max_ms
                      ? s->o->backoff_max_ms
                      : p->backoff_ms * 2;
}

static void on_sigchld(uv_signal_t *h, int signum) {
  sup *s = h->data;
  (void)signum;
  for (;;) {
    int status;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid <= 0) break;
    for (int i = 0; i < s->n_procs; i++)
      if (s->procs[i].pid == pid) {
        on_exit_status(s, &s->procs[i], status);
        break;
      }
  }
}

static void on_stop_signal(uv_signal_t *h, int signum) {
  sup *s = h->data;
  s->res->interrupted = 1;
  if (s->stopping && s->eval_drain) {
    /* First signal while the evaluator finishes: stop it gently too. */
    s->eval_drain = false;
    SLOG(s, TSR_LOG_INFO, "%s received: stopping the evaluator",
         strsignal(signum));
    signal_all(s, SIGTERM);
    uv_timer_start(&s->grace, on_grace, s->o->grace_ms, 0);
    return;
  }
  if (s->stopping) {
    if (!s->killed) {
      SLOG(s, TSR_LOG_WARN, "second %s: sending SIGKILL", strsignal(signum));
      s->killed = true;
      signal_all(s, SIGKILL);
    }
    return;
  }
  char why[64];
  snprintf(why, sizeof why, "%s received", strsignal(signum));
  stop_all(s, why);
}

static void on_drain(uv_timer_t *t) {
  sup *s = t->data;
  SLOG(s, TSR_LOG_WARN,
       "output pipes still open after every process ended (a "
       "process they started may hold them): closing them");
  uv_walk(&s->loop, chief_local__close_stray_stream, NULL);
}

void chief_local__check_done(sup *s) {
  if (s->closing) return;
  bool any = false;
  for (int i = 0; i < s->n_procs; i++)
    any |= s->procs[i].pid > 0 || s->procs[i].restart_pending;
  if (any) return;
  if (!s->stopping) {
    /* Only possible when the chief is down for good. */
    s->stopping = true;
  }
  if (s->open_streams > 0) {
    if (!uv_is_active((uv_handle_t *)&s->drain))
      uv_timer_start(&s->drain, on_drain, DRAIN_MS, 0);
    return;
  }
  s->closing = true;
  uv_close((uv_handle_t *)&s->sig_chld, NULL);
  uv_close((uv_handle_t *)&s->sig_int, NULL);
  uv_close((uv_handle_t *)&s->sig_term, NULL);
  uv_close((uv_handle_t *)&s->grace, NULL);
  uv_close((uv_handle_t *)&s->drain, NULL);
  uv_close((uv_handle_t *)&s->eval_limit, NULL);
  for (int i = 0; i < s->n_procs; i++)
    uv_close((uv_handle_t *)&s->procs[i].timer, NULL);
}

/* ---- setup --------------------------------------------------------- */
void chief_local_opts_init(chief_local_opts *o) {
  memset(o, 0, sizeof *o);
  o->n_ps = 2;
  o->n_workers = 2;
  o->host = "127.0.0.1";
  o->max_restarts = 5;
  o->backoff_ms = 100;
  o->backoff_max_ms = 10000;
  o->grace_ms = 10000;
  o->eval_drain_ms = 120000;
  o->out_fd = 1;
  o->err_fd = 2;
}

static bool env_is_ours(const char *kv) {
  static const char *const ours[] = {"TF_CONFIG=", "TESSERA_TOKEN=",
                                     "TESSERA_PROGRESS=", "COLUMNS="};
  for (size_t i = 0; i < sizeof ours / sizeof ours[0]; i++)
    if (strncmp(kv, ours[i], strlen(ours[i])) == 0) return true;
  return false;
}

/* Writes `text` to DIR/name, readable by the owner only. */
static int write_private(const char *dir, const char *name, const char *text,
                         char *err, size_t errlen) {
  char path[4200];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  size_t n = strlen(text);
  if (fd < 0 || write(fd, text, n) != (ssize_t)n) {
    int e = errno;
    if (fd >= 0) close(fd);
    snprintf(err, errlen, "cannot write %s: %s", path, strerror(e));
    return -e;
  }
  return close(fd) ? -errno : 0;
}

/* The folder `tessera status` reads the cluster and the token from. */
static int make_rundir(sup *s, const int *ports, char *err, size_t errlen) {
  const chief_local_opts *o = s->o;
  const char *base = getenv("XDG_RUNTIME_DIR");
  if (!base || access(base, W_OK) != 0) base = getenv("TMPDIR");
  if (!base || access(base, W_OK) != 0) base = "/tmp";
  snprintf(s->rundir, sizeof s->rundir, "%s/tessera-local-XXXXXX", base);
  if (!mkdtemp(s->rundir)) {
    int e = errno;
    snprintf(err, errlen, "cannot create a folder in %s: %s", base,
             strerror(e));
    s->rundir[0] = '\0';
    return -e;
  }
  char *cluster = chief_local_cluster_json(o->host, ports[0], ports + 1,
                                           o->n_ps, ports + 1 + o->n_ps,
                                           o->n_workers);
  if (!cluster) return TSR_ENOMEM;
  int rc = write_private(s->rundir, "cluster.json", cluster, err, errlen);
  free(cluster);
  if (!rc) rc = write_private(s->rundir, "token", s->token, err, errlen);
  return rc;
}

static void remove_rundir(sup *s) {
  if (!s->rundir[0]) return;
  static const char *const files[] = {"cluster.json", "token"};
  for (size_t i = 0; i < 2; i++) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", s->rundir, files[i]);
    unlink(path);
  }
  rmdir(s->rundir);
  s->rundir[0] = '\0';
}

static int prepare(sup *s, char *err, size_t errlen) {
  const chief_local_opts *o = s->o;
  if (o->n_evaluators < 0 || o->n_evaluators > 1) {
    snprintf(err, errlen, "%d evaluators: TF_CONFIG allows at most one",
             o->n_evaluators);
    return TSR_EINVAL;
  }
  /* --ps 0: a job with dense "allreduce" and no sparse table needs none
   * (the chief refuses it for any other job, naming cluster.ps) */
  if (o->n_ps < 0 || o->n_workers < 1 || o->n_ps > 1000 ||
      o->n_workers > 1000) {
    snprintf(err, errlen,
             "--ps %d --workers %d: --ps between 0 and 1000, --workers "
             "between 1 and 1000", o->n_ps, o->n_workers);
    return TSR_EINVAL;
  }
  if (o->max_restarts < 0) {
    snprintf(err, errlen, "max restarts %d must be >= 0", o->max_restarts);
    return TSR_EINVAL;
  }
  /* The evaluator listens nowhere: TF gives it no address. */
  int n_listen = 1 + o->n_ps + o->n_workers;
  s->n_procs = n_listen + o->n_evaluators;
  s->procs = calloc((size_t)s->n_procs, sizeof *s->procs);
  int *ports = calloc((size_t)s->n_procs, sizeof *ports);
  if (!s->procs || !ports) {
    free(ports);
    return TSR_ENOMEM;
  }
  int rc = chief_local_free_ports(o->host, n_listen, ports, err, errlen);
  if (rc) goto done;
  if (o->token) {
    snprintf(s->token, sizeof s->token, "%s", o->token);
  } else if ((rc = chief_local_token(s->token, sizeof s->token)) != 0) {
    snprintf(err, errlen, "cannot draw a cluster token: %s",
             tsr_strerror(rc));
    goto done;
  }
  /* procs[0] chief, then ps 0.., workers 0.. (ports in that order), then
   * the evaluator. */
  for (int i = 0; i < s->n_procs; i++) {
    proc *p = &s->procs[i];
    p->s = s;
    p->role = i == 0                     ? CHIEF_LOCAL_CHIEF
              : i <= o->n_ps             ? CHIEF_LOCAL_PS
              : i < n_listen             ? CHIEF_LOCAL_WORKER
                                         : CHIEF_LOCAL_EVALUATOR;
    p->index = i == 0                ? 0
               : i <= o->n_ps        ? i - 1
               : i < n_listen        ? i - 1 - o->n_ps
                                     : i - n_listen;
    snprintf(p->name, sizeof p->name, "%s:%d", chief_local_role_name(p->role),
             p->index);
    int w = (int)strlen(p->name);
    if (w > s->name_width) s->name_width = w;
    p->backoff_ms = o->backoff_ms;
    rc = chief_local_find_binary(o->bin_dir, p->role, p->exe, sizeof p->exe,
                                 err, errlen);
    if (rc) goto done;
    p->tf_config = chief_local_tf_config(o->host, ports[0], ports + 1,
                                         o->n_ps, ports + 1 + o->n_ps,
                                         o->n_workers, p->role, p->index);
    if (!p->tf_config) {
      rc = TSR_ENOMEM;
      goto done;
    }
  }
  rc = make_rundir(s, ports, err, errlen);
  if (rc) goto done;
  int n = 0;
  while (environ[n]) n++;
  s->envp_base = calloc((size_t)n + 1, sizeof *s->envp_base);
  if (!s->envp_base) {
    rc = TSR_ENOMEM;
    goto done;
  }
  for (int i = 0; i < n; i++)
    if (!env_is_ours(environ[i])) s->envp_base[s->n_envp_base++] = environ[i];
  tsr_info("cluster on %s: chief %s:%d, %d ps, %d worker(s)", o->host,
           o->host, ports[0], o->n_ps, o->n_workers);
  for (int i = 1; i < n_listen; i++)
    tsr_debug("%s at %s:%d", s->procs[i].name, o->host, ports[i]);
  if (o->n_evaluators) tsr_info("with an evaluator (checkpoint sidecar)");
  tsr_info("while it runs: tessera status --cluster %s/cluster.json "
           "--token-file %s/token",
           s->rundir, s->rundir);
done:
  free(ports);
  return rc;
}

static void release(sup *s) {
  for (int i = 0; s->procs && i < s->n_procs; i++) free(s->procs[i].tf_config);
  free(s->procs);
  free(s->envp_base);
  remove_rundir(s);
  sodium_memzero(s->token, sizeof s->token);
}

int chief_local_run(const chief_local_opts *o, chief_local_result *res,
                    char *err, size_t errlen) {
  sup s;
  memset(&s, 0, sizeof s);
  memset(res, 0, sizeof *res);
  s.o = o;
  s.res = res;
  int rc = prepare(&s, err, errlen);
  if (rc) goto out;
  s.relay_tty = isatty(o->out_fd) == 1;
  s.err_tty = isatty(o->err_fd) == 1;
  struct winsize ws;
  if (s.relay_tty && ioctl(o->out_fd, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0)
    s.chief_columns = ws.ws_col - s.name_width - 3;
  signal(SIGPIPE, SIG_IGN);

  rc = uv_loop_init(&s.loop);
  if (rc) {
    snprintf(err, errlen, "uv_loop_init: %s", uv_strerror(rc));
    goto out;
  }
  uv_signal_t *sigs[3] = {&s.sig_chld, &s.sig_int, &s.sig_term};
  for (int i = 0; i < 3; i++) {
    uv_signal_init(&s.loop, sigs[i]);
    sigs[i]->data = &s;
  }
  uv_signal_start(&s.sig_chld, on_sigchld, SIGCHLD);
  uv_signal_start(&s.sig_int, on_stop_signal, SIGINT);
  uv_signal_start(&s.sig_term, on_stop_signal, SIGTERM);
  uv_timer_init(&s.loop, &s.grace);
  uv_timer_init(&s.loop, &s.drain);
  uv_timer_init(&s.loop, &s.eval_limit);
  s.grace.data = s.drain.data = s.eval_limit.data = &s;
  for (int i = 0; i < s.n_procs; i++) {
    uv_timer_init(&s.loop, &s.procs[i].timer);
    s.procs[i].timer.data = &s.procs[i];
  }
  /* PS first, then workers (and the evaluator), then the chief: the order
   * a person would start them in; the chief waits for the others with a
   * deadline anyway. */
  for (int k = 1; k <= s.n_procs; k++) {
    proc *p = &s.procs[k % s.n_procs];
    int r = start_proc(p);
    if (r) {
      snprintf(err, errlen, "cannot start %s (%s): %s", p->name, p->exe,
               tsr_strerror(r));
      rc = r;
      res->chief_status = 1;
      stop_all(&s, "a process could not be started");
      break;
    }
  }
  uv_run(&s.loop, UV_RUN_DEFAULT);
  int lc = uv_loop_close(&s.loop);
  if (lc) tsr_warn("uv_loop_close: %s", uv_strerror(lc));
  /* Put the default dispositions back for the caller. */
  signal(SIGPIPE, SIG_DFL);
out:
  release(&s);
  return rc;
}
