/* `tessera local` with stand-in binaries (fake_role): ports are distinct
 * and free, each child sees a TF_CONFIG naming itself and the shared
 * token, output lines carry their process's prefix, a crashed worker is
 * restarted (and left down after the restart limit), the chief's exit
 * status is the launcher's, SIGINT stops every child (SIGKILL after the
 * grace period for one that ignores SIGTERM) and leaves none behind.
 * Every wait has a deadline. Arguments: the tessera binary, fake_role. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <stdbool.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "../../unit/tmpdir.h"
#include "common/cluster.h"

static const char *tessera_bin, *fake_bin;

typedef struct {
  char dir[256];      /* the test's folder */
  char bindir[300];   /* tessera-ps/worker/chief -> fake_role */
  char recdir[300];   /* FAKE_DIR */
  char outpath[300];  /* tessera local's stdout and stderr */
} fixture;

typedef struct {
  char name[32];
  int port;
  char token[80];
  long pid;
  char args[256];
} record;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static void fixture_make(fixture *f) {
  test_tmpdir(f->dir, sizeof f->dir);
  snprintf(f->bindir, sizeof f->bindir, "%s/bin", f->dir);
  snprintf(f->recdir, sizeof f->recdir, "%s/rec", f->dir);
  snprintf(f->outpath, sizeof f->outpath, "%s/out.txt", f->dir);
  assert_int_equal(mkdir(f->bindir, 0777), 0);
  assert_int_equal(mkdir(f->recdir, 0777), 0);
  static const char *const names[] = {"tessera-ps", "tessera-worker",
                                      "tessera-chief"};
  for (int i = 0; i < 3; i++) {
    char p[400];
    snprintf(p, sizeof p, "%s/%s", f->bindir, names[i]);
    assert_int_equal(symlink(fake_bin, p), 0);
  }
  unsetenv("FAKE_CRASH_ONCE");
  unsetenv("FAKE_CRASH_ALWAYS");
  unsetenv("FAKE_IGNORE_TERM");
  unsetenv("FAKE_CHIEF");
  unsetenv("FAKE_CHIEF_WAIT");
  unsetenv("FAKE_EVAL");
  unsetenv("FAKE_PROGRESS");
  unsetenv("TESSERA_BIN_DIR");
  setenv("FAKE_DIR", f->recdir, 1);
  setenv("TESSERA_LOG", "info", 1);
}

/* Starts `tessera local ARGS...` with output to the fixture's file. */
static pid_t launch(fixture *f, const char *const *args) {
  const char *argv[32];
  int n = 0;
  argv[n++] = tessera_bin;
  argv[n++] = "local";
  for (; *args; args++) argv[n++] = *args;
  argv[n] = NULL;
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    int fd = open(f->outpath, O_WRONLY | O_CREAT | O_TRUNC, 0666);
    dup2(fd, 1);
    dup2(fd, 2);
    /* The launcher's private folder goes into the test's, so a launcher
     * killed with -9 leaves nothing in /tmp. */
    unsetenv("XDG_RUNTIME_DIR");
    setenv("TMPDIR", f->dir, 1);
    execv(tessera_bin, (char **)argv);
    _exit(127);
  }
  return pid;
}

/* Waits for `pid` until the deadline; kills it and fails after. */
static int wait_exit(pid_t pid, double deadline_s) {
  double end = now_s() + deadline_s;
  int st;
  while (now_s() < end) {
    pid_t r = waitpid(pid, &st, WNOHANG);
    if (r == pid) return st;
    sleep_ms(10);
  }
  kill(pid, SIGKILL);
  waitpid(pid, &st, 0);
  fail_msg("tessera local did not exit within %.0f s", deadline_s);
  return -1;
}

static int load_records(const fixture *f, record *out, int max) {
  DIR *d = opendir(f->recdir);
  assert_non_null(d);
  struct dirent *de;
  int n = 0;
  while ((de = readdir(d))) {
    if (strncmp(de->d_name, "rec.", 4)) continue;
    char p[600];
    snprintf(p, sizeof p, "%s/%s", f->recdir, de->d_name);
    char *text = test_slurp(p, NULL);
    assert_non_null(text);
    assert_true(n < max);
    record *r = &out[n++];
    memset(r, 0, sizeof *r);
    char *a = strstr(text, "args=");
    assert_int_equal(sscanf(text, "name=%31s\nport=%d\ntoken=%79s\npid=%ld",
                            r->name, &r->port, r->token, &r->pid), 4);
    if (a) sscanf(a + 5, "%255[^\n]", r->args);
    free(text);
  }
  closedir(d);
  return n;
}

static int count_name(const record *r, int n, const char *name) {
  int k = 0;
  for (int i = 0; i < n; i++) k += !strcmp(r[i].name, name);
  return k;
}

static void assert_all_gone(const record *r, int n) {
  for (int i = 0; i < n; i++) {
    /* Reaped by the launcher, so not even a zombie is left. */
    errno = 0;
    int alive = kill((pid_t)r[i].pid, 0) == 0;
    assert_false(alive);
  }
}

/* The folder named in "tessera status --cluster DIR/cluster.json". */
static bool status_dir(const char *out, char *dir, size_t len) {
  const char *p = strstr(out, "tessera status --cluster ");
  if (!p) return false;
  p += strlen("tessera status --cluster ");
  const char *e = strstr(p, "/cluster.json");
  if (!e || (size_t)(e - p) >= len) return false;
  memcpy(dir, p, (size_t)(e - p));
  dir[e - p] = '\0';
  return true;
}

static void test_basic_cluster(void **state) {
  fixture f;
  fixture_make(&f);
  setenv("FAKE_CHIEF", "exit:7", 1);
  const char *args[] = {"--bin-dir", f.bindir, "--job", "x.json",
                        "--steps", "5", NULL};
  pid_t pid = launch(&f, args);
  int st = wait_exit(pid, 30);
  char *out = test_slurp(f.outpath, NULL);
  assert_non_null(out);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 7) fprintf(stderr, "%s", out);
  assert_true(WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), 7); /* the chief's status */

  record r[16];
  int n = load_records(&f, r, 16);
  assert_int_equal(n, 5);
  static const char *const names[] = {"chief:0", "ps:0", "ps:1", "worker:0",
                                      "worker:1"};
  for (int i = 0; i < 5; i++) assert_int_equal(count_name(r, n, names[i]), 1);
  for (int i = 0; i < n; i++) {
    assert_true(r[i].port > 0 && r[i].port < 65536);
    assert_string_equal(r[i].token, r[0].token);
    for (int j = 0; j < i; j++) assert_int_not_equal(r[i].port, r[j].port);
    if (!strcmp(r[i].name, "chief:0"))
      assert_string_equal(r[i].args, "--job x.json --steps 5");
    else
      assert_string_equal(r[i].args, "");
    char line[160];
    snprintf(line, sizeof line, "%-8.31s | hello from %.31s\n", r[i].name,
             r[i].name);
    assert_non_null(strstr(out, line));
    snprintf(line, sizeof line, "%-8.31s | stderr line from %.31s\n",
             r[i].name,
             r[i].name);
    assert_non_null(strstr(out, line));
  }
  assert_non_null(strstr(out, "chief:0  | chief args: --job x.json --steps 5"));
  assert_all_gone(r, n);
  /* The folder for `tessera status` is gone with the cluster. */
  char rundir[512];
  assert_true(status_dir(out, rundir, sizeof rundir));
  assert_int_not_equal(access(rundir, F_OK), 0);
  free(out);

  /* A second run draws a different token. */
  char first[80];
  snprintf(first, sizeof first, "%s", r[0].token);
  test_rmtree(f.recdir);
  assert_int_equal(mkdir(f.recdir, 0777), 0);
  pid = launch(&f, args);
  st = wait_exit(pid, 30);
  assert_int_equal(WEXITSTATUS(st), 7);
  n = load_records(&f, r, 16);
  assert_int_equal(n, 5);
  assert_string_not_equal(r[0].token, first);
  test_rmtree(f.dir);
}

static void test_crashed_worker_restarted(void **state) {
  fixture f;
  fixture_make(&f);
  setenv("FAKE_CHIEF", "exit:0", 1);
  setenv("FAKE_CHIEF_WAIT", "worker:1=2", 1);
  setenv("FAKE_CRASH_ONCE", "worker:1", 1);
  const char *args[] = {"--bin-dir", f.bindir, "--restart-backoff-ms", "20",
                        NULL};
  pid_t pid = launch(&f, args);
  int st = wait_exit(pid, 30);
  char *out = test_slurp(f.outpath, NULL);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) fprintf(stderr, "%s", out);
  assert_true(WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), 0);
  record r[16];
  int n = load_records(&f, r, 16);
  assert_int_equal(count_name(r, n, "worker:1"), 2);
  assert_int_equal(count_name(r, n, "worker:0"), 1);
  /* The restarted worker kept its address. */
  int p0 = -1;
  for (int i = 0; i < n; i++)
    if (!strcmp(r[i].name, "worker:1")) {
      if (p0 < 0) p0 = r[i].port;
      assert_int_equal(r[i].port, p0);
    }
  assert_non_null(strstr(out, "worker:1 was killed by signal"));
  assert_non_null(strstr(out, "restart 1 of 5"));
  assert_non_null(strstr(out, "1 worker"));
  assert_all_gone(r, n);
  free(out);
  test_rmtree(f.dir);
}

static void test_restart_limit(void **state) {
  fixture f;
  fixture_make(&f);
  setenv("FAKE_CHIEF", "exit:4", 1);
  setenv("FAKE_CHIEF_WAIT", "ps:0=3", 1);
  setenv("FAKE_CRASH_ALWAYS", "ps:0", 1);
  const char *args[] = {"--bin-dir", f.bindir, "--ps", "1", "--workers", "1",
                        "--max-restarts", "2", "--restart-backoff-ms", "10",
                        NULL};
  pid_t pid = launch(&f, args);
  int st = wait_exit(pid, 30);
  char *out = test_slurp(f.outpath, NULL);
  assert_true(WIFEXITED(st));
  if (WEXITSTATUS(st) != 4) fprintf(stderr, "%s", out);
  assert_int_equal(WEXITSTATUS(st), 4);
  record r[16];
  int n = load_records(&f, r, 16);
  assert_int_equal(count_name(r, n, "ps:0"), 3); /* 1 start + 2 restarts */
  assert_int_equal(count_name(r, n, "ps:1"), 0);
  assert_int_equal(count_name(r, n, "worker:1"), 0);
  free(out);
  test_rmtree(f.dir);
}

static void test_sigint_stops_everything(void **state) {
  fixture f;
  fixture_make(&f);
  setenv("FAKE_CHIEF", "forever", 1);
  setenv("FAKE_IGNORE_TERM", "ps:1", 1);
  const char *args[] = {"--bin-dir", f.bindir, "--grace-ms", "300", NULL};
  pid_t pid = launch(&f, args);
  record r[16];
  int n = 0;
  for (double end = now_s() + 20; now_s() < end; sleep_ms(20)) {
    n = load_records(&f, r, 16);
    if (n == 5) break;
  }
  assert_int_equal(n, 5);
  /* While it runs, `tessera status` can find the cluster and the token. */
  char *early = test_slurp(f.outpath, NULL);
  char rundir[512], path[600];
  assert_true(status_dir(early, rundir, sizeof rundir));
  free(early);
  struct stat sb;
  assert_int_equal(stat(rundir, &sb), 0);
  assert_int_equal(sb.st_mode & 0777, 0700);
  snprintf(path, sizeof path, "%s/cluster.json", rundir);
  tsr_cluster c;
  char err[TSR_ERRBUF];
  if (tsr_cluster_load(path, "worker:0", &c, err, sizeof err))
    fail_msg("%s", err);
  assert_int_equal(c.n[TSR_TASK_PS], 2);
  assert_int_equal(c.n[TSR_TASK_WORKER], 2);
  for (int i = 0; i < n; i++) {
    char type[32];
    snprintf(type, sizeof type, "%s", r[i].name);
    *strchr(type, ':') = '\0';
    int idx = atoi(strchr(r[i].name, ':') + 1);
    const tsr_task_addr *a =
        tsr_cluster_find(&c, tsr_task_type_parse(type), idx);
    assert_non_null(a);
    assert_int_equal(a->port, r[i].port);
  }
  tsr_cluster_free(&c);
  snprintf(path, sizeof path, "%s/token", rundir);
  char *tok = test_slurp(path, NULL);
  assert_non_null(tok);
  assert_string_equal(tok, r[0].token);
  free(tok);
  sleep_ms(50); /* let ps:1 install its SIGTERM disposition */
  kill(pid, SIGINT);
  int st = wait_exit(pid, 15);
  char *out = test_slurp(f.outpath, NULL);
  assert_true(WIFEXITED(st));
  if (WEXITSTATUS(st) != 128 + SIGTERM) fprintf(stderr, "%s", out);
  /* The chief ended by the SIGTERM it was forwarded. */
  assert_int_equal(WEXITSTATUS(st), 128 + SIGTERM);
  assert_non_null(strstr(out, "sending SIGKILL"));
  assert_non_null(strstr(out, "ps:1 was killed by signal 9"));
  assert_all_gone(r, n);
  assert_int_not_equal(access(rundir, F_OK), 0);
  free(out);
  test_rmtree(f.dir);
}

/* The launcher killed with -9 cannot stop anyone: its children still die
 * (PR_SET_PDEATHSIG). This test process becomes their subreaper so it can
 * see them end. */
static void test_launcher_killed(void **state) {
  fixture f;
  fixture_make(&f);
  setenv("FAKE_CHIEF", "forever", 1);
  assert_int_equal(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  const char *args[] = {"--bin-dir", f.bindir, NULL};
  pid_t pid = launch(&f, args);
  record r[16];
  int n = 0;
  for (double end = now_s() + 20; now_s() < end; sleep_ms(20)) {
    n = load_records(&f, r, 16);
    if (n == 5) break;
  }
  assert_int_equal(n, 5);
  kill(pid, SIGKILL);
  int st;
  assert_int_equal(waitpid(pid, &st, 0), pid);
  int reaped = 0;
  for (double end = now_s() + 15; reaped < 5 && now_s() < end;) {
    pid_t c = waitpid(-1, &st, WNOHANG);
    if (c > 0) {
      int known = 0;
      for (int i = 0; i < n; i++) known |= r[i].pid == c;
      assert_true(known);
      assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
      reaped++;
    } else {
      sleep_ms(10);
    }
  }
  prctl(PR_SET_CHILD_SUBREAPER, 0);
  for (int i = 0; i < n; i++) kill((pid_t)r[i].pid, SIGKILL); /* if any */
  assert_int_equal(reaped, 5);
  test_rmtree(f.dir);
}

static void test_chief_crash_restarts_chief(void **state) {
  fixture f;
  fixture_make(&f);
  setenv("FAKE_CHIEF", "exit:3", 1);
  setenv("FAKE_CRASH_ONCE", "chief:0", 1);
  const char *args[] = {"--bin-dir", f.bindir, "--ps", "1", "--workers", "1",
                        "--restart-backoff-ms", "10", NULL};
  pid_t pid = launch(&f, args);
  int st = wait_exit(pid, 30);
  assert_true(WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), 3);
  record r[16];
  int n = load_records(&f, r, 16);
  assert_int_equal(count_name(r, n, "chief:0"), 2);
  assert_int_equal(count_name(r, n, "ps:0"), 1);
  test_rmtree(f.dir);
}

/* Waits until `text` shows up in the fixture's output file. */
static bool wait_output(const fixture *f, const char *text, double secs) {
  for (double end = now_s() + secs; now_s() < end; sleep_ms(20)) {
    char *out = test_slurp(f->outpath, NULL);
    bool found = out && strstr(out, text);
    free(out);
    if (found) return true;
  }
  return false;
}

static void test_evaluator_finishes_after_chief(void **state) {
  fixture f;
  fixture_make(&f);
  setenv("FAKE_EVALUATORS", "1", 1); /* the chief waits for it */
  setenv("FAKE_CHIEF", "exit:0", 1);
  const char *args[] = {"--bin-dir", f.bindir, "--ps", "1", "--workers", "1",
                        "--evaluator", "--job", "j.json", NULL};
  pid_t pid = launch(&f, args);
  int st = wait_exit(pid, 30);
  char *out = test_slurp(f.outpath, NULL);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) fprintf(stderr, "%s", out);
  assert_int_equal(WEXITSTATUS(st), 0);
  record r[16];
  int n = load_records(&f, r, 16);
  assert_int_equal(n, 4);
  assert_int_equal(count_name(r, n, "evaluator:0"), 1);
  for (int i = 0; i < n; i++)
    if (!strcmp(r[i].name, "evaluator:0")) {
      assert_string_equal(r[i].args, "--job j.json"); /* the chief's */
      assert_string_equal(r[i].token, r[0].token);
    }
  /* It was let finish, not stopped with the PS and the worker. */
  assert_non_null(strstr(out, "evaluator:0 | evaluated the last checkpoint"));
  assert_non_null(strstr(out, "evaluator:0 exited with status 0"));
  assert_non_null(strstr(out, "ps:0 was killed by signal 15"));
  assert_all_gone(r, n);
  free(out);
  test_rmtree(f.dir);
  unsetenv("FAKE_EVALUATORS");
}

static void test_evaluator_stopped(void **state) {
  /* The chief failed: the evaluator is stopped with the others. */
  fixture f;
  fixture_make(&f);
  setenv("FAKE_EVALUATORS", "1", 1); /* the chief waits for it */
  setenv("FAKE_CHIEF", "exit:5", 1);
  setenv("FAKE_EVAL", "forever", 1);
  const char *args[] = {"--bin-dir", f.bindir, "--ps", "1", "--workers", "1",
                        "--evaluator", "--grace-ms", "2000", NULL};
  pid_t pid = launch(&f, args);
  int st = wait_exit(pid, 30);
  char *out = test_slurp(f.outpath, NULL);
  if (!strstr(out, "evaluator:0 was killed by signal 15"))
    fprintf(stderr, "%s", out);
  assert_int_equal(WEXITSTATUS(st), 5);
  assert_non_null(strstr(out, "evaluator:0 was killed by signal 15"));
  free(out);
  record r[16];
  int n = load_records(&f, r, 16);
  assert_all_gone(r, n);

  /* The chief ended well, the evaluator runs on: Ctrl-C stops it. */
  test_rmtree(f.recdir);
  assert_int_equal(mkdir(f.recdir, 0777), 0);
  setenv("FAKE_CHIEF", "exit:0", 1);
  pid = launch(&f, args);
  assert_true(wait_output(&f, "keeps running until it has evaluated", 20));
  kill(pid, SIGINT);
  st = wait_exit(pid, 15);
  out = test_slurp(f.outpath, NULL);
  assert_int_equal(WEXITSTATUS(st), 0); /* still the chief's status */
  assert_non_null(strstr(out, "stopping the evaluator"));
  assert_non_null(strstr(out, "evaluator:0 was killed by signal 15"));
  free(out);
  n = load_records(&f, r, 16);
  assert_int_equal(n, 4);
  assert_all_gone(r, n);
  unsetenv("FAKE_EVAL");
  test_rmtree(f.dir);
  unsetenv("FAKE_EVALUATORS");
}

/* The chief ended well but the evaluator never finishes: it is stopped
 * once --eval-drain-ms have passed (it was exempt from the SIGKILL the log
 * announced, and the launcher waited for it for ever). */
static void test_evaluator_drain_is_bounded(void **state) {
  fixture f;
  fixture_make(&f);
  setenv("FAKE_EVALUATORS", "1", 1); /* the chief waits for it */
  setenv("FAKE_CHIEF", "exit:0", 1);
  setenv("FAKE_EVAL", "forever", 1);
  const char *args[] = {"--bin-dir", f.bindir, "--ps", "1", "--workers", "1",
                        "--evaluator", "--grace-ms", "1000",
                        "--eval-drain-ms", "1500", NULL};
  pid_t pid = launch(&f, args);
  int st = wait_exit(pid, 20);
  char *out = test_slurp(f.outpath, NULL);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) fprintf(stderr, "%s", out);
  assert_true(WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), 0); /* the chief's */
  assert_non_null(strstr(out, "at most 1500 ms"));
  assert_non_null(strstr(out, "still running 1500 ms after the chief ended"));
  assert_non_null(strstr(out, "evaluator:0 was killed by signal 15"));
  free(out);
  record r[16];
  int n = load_records(&f, r, 16);
  assert_all_gone(r, n);
  unsetenv("FAKE_EVAL");
  test_rmtree(f.dir);
  unsetenv("FAKE_EVALUATORS");
}

static void test_missing_binary(void **state) {
  fixture f;
  fixture_make(&f);
  char empty[400];
  snprintf(empty, sizeof empty, "%s/empty", f.dir);
  assert_int_equal(mkdir(empty, 0777), 0);
  const char *args[] = {"--bin-dir", empty, NULL};
  pid_t pid = launch(&f, args);
  int st = wait_exit(pid, 30);
  assert_true(WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), 2);
  char *out = test_slurp(f.outpath, NULL);
  char want[500];
  snprintf(want, sizeof want, "%s/tessera-", empty);
  assert_non_null(strstr(out, want));
  free(out);
  /* --ps 0 is a hybrid job's; a negative count is refused */
  const char *bad[] = {"--bin-dir", f.bindir, "--ps", "-1", NULL};
  pid = launch(&f, bad);
  st = wait_exit(pid, 30);
  assert_int_equal(WEXITSTATUS(st), 2);
  out = test_slurp(f.outpath, NULL);
  assert_non_null(strstr(out, "--ps"));
  free(out);
  test_rmtree(f.dir);
}

/* Output relayed to a terminal: the chief is asked for a progress bar
 * sized to what the prefix leaves, and its redraws stay on one line. */
static void test_terminal_progress(void **state) {
  fixture f;
  fixture_make(&f);
  setenv("FAKE_CHIEF", "exit:0", 1);
  setenv("FAKE_PROGRESS", "1", 1);
  int master = posix_openpt(O_RDWR | O_NOCTTY);
  assert_true(master >= 0);
  assert_int_equal(grantpt(master), 0);
  assert_int_equal(unlockpt(master), 0);
  struct winsize ws = {.ws_row = 40, .ws_col = 100};
  assert_int_equal(ioctl(master, TIOCSWINSZ, &ws), 0);
  char slave[256];
  snprintf(slave, sizeof slave, "%s", ptsname(master));
  const char *argv[] = {tessera_bin, "local", "--bin-dir", f.bindir, "--ps",
                        "1", "--workers", "1", NULL};
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    int fd = open(slave, O_RDWR);
    dup2(fd, 1);
    dup2(fd, 2);
    close(master);
    unsetenv("XDG_RUNTIME_DIR");
    setenv("TMPDIR", f.dir, 1);
    execv(tessera_bin, (char **)argv);
    _exit(127);
  }
  size_t cap = 1 << 16, len = 0;
  char *out = malloc(cap);
  int st = -1;
  bool exited = false;
  for (double end = now_s() + 30; now_s() < end;) {
    struct pollfd pfd = {.fd = master, .events = POLLIN};
    if (poll(&pfd, 1, 20) > 0) {
      ssize_t r = read(master, out + len, cap - 1 - len);
      if (r > 0) len += (size_t)r;
      if (r <= 0 && exited) break; /* EIO: the last writer is gone */
    } else if (exited) {
      break;
    }
    if (!exited && waitpid(pid, &st, WNOHANG) == pid) exited = true;
  }
  if (!exited) {
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    fail_msg("tessera local did not exit");
  }
  out[len] = '\0';
  close(master);
  assert_int_equal(WEXITSTATUS(st), 0);
  /* 100 columns less "worker:0 | ". */
  if (!strstr(out, "progress env: bar columns: 89")) fprintf(stderr, "%s", out);
  assert_non_null(strstr(out, "progress env: bar columns: 89"));
  /* Each output piece shows at once, in place; the log line replaces the
   * bar instead of running into it; the last redraw stays and ends with
   * the newline (the terminal writes "\r\n" for it). */
  if (!strstr(out, "step 1\033[K\r\033[Kchief:0  | a log line\r\n"))
    for (const char *c = out; *c; c++)
      fprintf(stderr, *c == '\r' ? "\\r" : *c == '\033' ? "\\e" : "%c", *c);
  assert_non_null(strstr(out, "chief:0  | step 1\033[K\r\033[Kchief:0  | "
                              "a log line\r\n"));
  assert_non_null(strstr(out, "chief:0  | step 2\033[K\r\033[Kchief:0  | "
                              "step 3\033[K\r\n"));
  assert_null(strstr(out, "step 1\033[K\r\n")); /* redrawn, not scrolled */
  free(out);
  unsetenv("FAKE_PROGRESS");
  test_rmtree(f.dir);
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s TESSERA FAKE_ROLE\n", argv[0]);
    return 2;
  }
  /* meson passes paths relative to the build folder; the links need
   * absolute ones. */
  static char t[4096], fk[4096];
  if (!realpath(argv[1], t) || !realpath(argv[2], fk)) {
    perror("realpath");
    return 2;
  }
  tessera_bin = t;
  fake_bin = fk;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_basic_cluster),
      cmocka_unit_test(test_crashed_worker_restarted),
      cmocka_unit_test(test_restart_limit),
      cmocka_unit_test(test_sigint_stops_everything),
      cmocka_unit_test(test_chief_crash_restarts_chief),
      cmocka_unit_test(test_launcher_killed),
      cmocka_unit_test(test_evaluator_finishes_after_chief),
      cmocka_unit_test(test_evaluator_stopped),
      cmocka_unit_test(test_evaluator_drain_is_bounded),
      cmocka_unit_test(test_missing_binary),
      cmocka_unit_test(test_terminal_progress),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
