/* A stand-in for tessera-ps, tessera-worker and tessera-chief in the
 * launcher's tests (linked under those names by the test). It reads
 * TF_CONFIG with the real parser, binds its own port to show it was free,
 * checks TESSERA_TOKEN, prints a line on stdout and one on stderr, and
 * records what it saw in $FAKE_DIR/rec.NAME.PID. Then, by environment:
 *   FAKE_CRASH_ONCE=NAME    that task aborts on its first start only
 *   FAKE_CRASH_ALWAYS=NAME  that task exits 1 on every start
 *   FAKE_IGNORE_TERM=NAME   that task ignores SIGTERM
 *   FAKE_CHIEF=exit:CODE    the chief waits until every ps, worker and
 *                           evaluator has recorded a start (and
 *                           FAKE_CHIEF_WAIT=NAME=K: until NAME has
 *                           started K times), then exits
 *                           CODE; exit 99 if that takes over 20 s
 *   FAKE_CHIEF=forever      the chief runs until killed
 *   FAKE_EVALUATORS=N       the chief also waits for N evaluator starts
 *   FAKE_EVAL=forever       the evaluator runs until killed; otherwise it
 *                           waits for the chief to end (the chief touches
 *                           $FAKE_DIR/chief-done before exiting), prints
 *                           "evaluated the last checkpoint" 300 ms later
 *                           and exits 0 (98 if the chief never ends)
 *   FAKE_PROGRESS=1         the chief (exit mode), once all have started,
 *                           prints what it got
 *                           in TESSERA_PROGRESS and COLUMNS, then on
 *                           stderr a progress bar ("\rstep N\033[K"), a
 *                           log line over it, and two more redraws
 * Exit codes 9-12 mean a check failed (TF_CONFIG, port, token, record).
 */
#include "common/cluster.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static int is_me(const char *var, const char *name) {
  const char *v = getenv(var);
  return v && strcmp(v, name) == 0;
}

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

/* Records of NAME in dir ("ps:" prefix counts distinct names when
 * `distinct`). */
static int count_records(const char *dir, const char *prefix, int distinct) {
  DIR *d = opendir(dir);
  if (!d) return 0;
  struct dirent *de;
  int n = 0;
  char seen[64][32];
  int nseen = 0;
  size_t pl = strlen(prefix);
  while ((de = readdir(d))) {
    if (strncmp(de->d_name, "rec.", 4) || strncmp(de->d_name + 4, prefix, pl))
      continue;
    if (!distinct) {
      n++;
      continue;
    }
    char name[32];
    snprintf(name, sizeof name, "%s", de->d_name + 4);
    char *dot = strrchr(name, '.');
    if (dot) *dot = '\0';
    int dup = 0;
    for (int i = 0; i < nseen; i++) dup |= !strcmp(seen[i], name);
    if (!dup && nseen < 64) snprintf(seen[nseen++], 32, "%s", name);
  }
  closedir(d);
  return distinct ? nseen : n;
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  const char *dir = getenv("FAKE_DIR");
  tsr_cluster c;
  char err[TSR_ERRBUF];
  if (!dir || tsr_cluster_load(NULL, NULL, &c, err, sizeof err)) {
    fprintf(stderr, "fake: bad TF_CONFIG or no FAKE_DIR: %s\n", err);
    return 9;
  }
  char name[32];
  snprintf(name, sizeof name, "%s:%d", tsr_task_type_name(c.task_type),
           c.task_index);
  const tsr_task_addr *me = tsr_cluster_find(&c, c.task_type, c.task_index);
  if (c.task_type == TSR_TASK_EVALUATOR) {
    /* A sidecar outside the cluster map: no address, nothing to bind. */
    if (me) {
      fprintf(stderr, "fake %s: the evaluator is in the cluster map\n", name);
      return 9;
    }
    static const tsr_task_addr none = {.port = 0};
    me = &none;
  }
  int fd = me->port ? socket(AF_INET, SOCK_STREAM, 0) : -1;
  struct sockaddr_in sa = {.sin_family = AF_INET,
                           .sin_port = htons((uint16_t)me->port)};
  if (fd >= 0) {
    inet_pton(AF_INET, me->host, &sa.sin_addr);
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  }
  if (fd >= 0 && (bind(fd, (struct sockaddr *)&sa, sizeof sa) ||
                  listen(fd, 8))) {
    fprintf(stderr, "fake %s: port %d is not free\n", name, me->port);
    return 10;
  }
  const char *tok = getenv("TESSERA_TOKEN");
  if (!tok || strlen(tok) != 64 || strspn(tok, "0123456789abcdef") != 64) {
    fprintf(stderr, "fake %s: TESSERA_TOKEN missing or not 64 hex\n", name);
    return 11;
  }
  /* Output first: once the record exists, the lines are in the pipe. */
  printf("hello from %s\n", name);
  fprintf(stderr, "stderr line from %s\n", name);
  if (c.task_type == TSR_TASK_CHIEF) {
    printf("chief args:");
    for (int i = 1; i < argc; i++) printf(" %s", argv[i]);
    printf("\n");
  }
  char path[4096], tmp[4200];
  snprintf(path, sizeof path, "%s/rec.%s.%ld", dir, name, (long)getpid());
  snprintf(tmp, sizeof tmp, "%s/tmp.%ld", dir, (long)getpid());
  FILE *f = fopen(tmp, "w");
  if (!f) return 12;
  fprintf(f, "name=%s\nport=%d\ntoken=%s\npid=%ld\nargs=", name, me->port,
          tok, (long)getpid());
  for (int i = 1; i < argc; i++) fprintf(f, "%s%s", i > 1 ? " " : "", argv[i]);
  fprintf(f, "\n");
  if (fclose(f) || rename(tmp, path)) return 12;


  if (is_me("FAKE_IGNORE_TERM", name)) signal(SIGTERM, SIG_IGN);
  if (is_me("FAKE_CRASH_ALWAYS", name)) return 1;
  if (is_me("FAKE_CRASH_ONCE", name)) {
    char mark[4200];
    snprintf(mark, sizeof mark, "%s/crashed.%s", dir, name);
    if (access(mark, F_OK) != 0) {
      FILE *m = fopen(mark, "w");
      if (m) fclose(m);
      abort();
    }
  }
  const char *mode = getenv("FAKE_CHIEF");
  if (c.task_type == TSR_TASK_CHIEF && mode && !strncmp(mode, "exit:", 5)) {
    int code = atoi(mode + 5);
    char wname[32] = "";
    int wcount = 0;
    const char *w = getenv("FAKE_CHIEF_WAIT");
    if (w && strchr(w, '=')) {
      snprintf(wname, sizeof wname, "%.*s", (int)(strchr(w, '=') - w), w);
      wcount = atoi(strchr(w, '=') + 1);
    }
    int n_ps = c.n[TSR_TASK_PS], n_w = c.n[TSR_TASK_WORKER];
    /* As in TF, the cluster the chief is given has no evaluator: a test
     * that runs one says so (FAKE_EVALUATORS=1), or the chief could
     * end before the evaluator has started. */
    const char *fe = getenv("FAKE_EVALUATORS");
    int n_ev = fe ? atoi(fe) : c.n[TSR_TASK_EVALUATOR];
    for (int t = 0; t < 2000; t++) {
      char wprefix[40];
      snprintf(wprefix, sizeof wprefix, "%s.", wname);
      if (count_records(dir, "ps:", 1) >= n_ps &&
          count_records(dir, "worker:", 1) >= n_w &&
          count_records(dir, "evaluator:", 1) >= n_ev &&
          (!wcount || count_records(dir, wprefix, 0) >= wcount)) {
        /* Everyone has printed (a start is recorded after its output). */
        if (getenv("FAKE_PROGRESS")) {
          const char *pe = getenv("TESSERA_PROGRESS");
          const char *co = getenv("COLUMNS");
          printf("progress env: %s columns: %s\n", pe ? pe : "-",
                 co ? co : "-");
          fflush(stdout);
          sleep_ms(50); /* relayed before the bar, from its own pipe */
          /* On stderr, as the chief draws it, with a log line in between. */
          fprintf(stderr, "\rstep 1\033[K");
          sleep_ms(100);
          fprintf(stderr, "a log line\n");
          sleep_ms(100);
          fprintf(stderr, "\rstep 2\033[K");
          sleep_ms(100);
          fprintf(stderr, "\rstep 3\033[K\n");
        }
        printf("chief: all started, exiting %d\n", code);
        char done[4200];
        snprintf(done, sizeof done, "%s/chief-done", dir);
        FILE *d = fopen(done, "w");
        if (d) fclose(d);
        tsr_cluster_free(&c);
        return code;
      }
      sleep_ms(10);
    }
    fprintf(stderr, "fake chief: the cluster did not come up\n");
    return 99;
  }
  if (c.task_type == TSR_TASK_EVALUATOR &&
      !(getenv("FAKE_EVAL") && !strcmp(getenv("FAKE_EVAL"), "forever"))) {
    tsr_cluster_free(&c);
    char done[4200];
    snprintf(done, sizeof done, "%s/chief-done", dir);
    for (int t = 0; t < 2000; t++) {
      if (access(done, F_OK) == 0) {
        sleep_ms(300);
        printf("evaluated the last checkpoint\n");
        return 0;
      }
      sleep_ms(10);
    }
    return 98;
  }
  tsr_cluster_free(&c);
  for (;;) pause();
}
