/* `tessera status`: shows a run's processes (role, address, state, steps,
 * rates, last heartbeat, restarts) from the status file the chief keeps in
 * its logdir. `--watch SECS` redraws until interrupted; `--json` prints
 * the file's content as is. Exit 1 when the file cannot be read (the
 * message names it), 2 on usage errors. */
#include "chief/cli.h"
#include "chief/monitor.h"
#include "common/clock.h"

#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
  fprintf(f, "usage: tessera status (--logdir DIR | FILE) [--json] "
             "[--watch SECS]\n"
             "  reads DIR/status.json, which the chief rewrites while it "
             "runs\n");
}

int chief_cmd_status(int argc, char **argv) {
  const char *logdir = NULL;
  bool json = false;
  double watch = 0;
  static const struct option opts[] = {{"logdir", required_argument, 0, 'l'},
                                       {"json", no_argument, 0, 'j'},
                                       {"watch", required_argument, 0, 'w'},
                                       {"help", no_argument, 0, 'h'},
                                       {0, 0, 0, 0}};
  int ch;
  optind = 1;
  while ((ch = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (ch) {
      case 'l': logdir = optarg; break;
      case 'j': json = true; break;
      case 'w': {
        char *end;
        watch = strtod(optarg, &end);
        if (*end || !(watch > 0)) {
          fprintf(stderr, "tessera status: --watch \"%s\" is not a positive "
                          "number of seconds\n", optarg);
          return 2;
        }
        break;
      }
      case 'h': usage(stdout); return 0;
      default: usage(stderr); return 2;
    }
  }
  char path[4096];
  if (logdir && optind == argc) {
    snprintf(path, sizeof path, "%s/%s", logdir, CHIEF_STATUS_JSON);
  } else if (!logdir && optind + 1 == argc) {
    snprintf(path, sizeof path, "%s", argv[optind]);
  } else {
    usage(stderr);
    return 2;
  }
  for (;;) {
    chief_run_status st;
    char err[1024];
    if (chief_status_read(path, &st, err, sizeof err)) {
      fprintf(stderr, "tessera status: %s\n", err);
      return 1;
    }
    if (watch > 0) fputs("\033[H\033[J", stdout);
    if (json) {
      FILE *f = fopen(path, "r");
      char buf[8192];
      size_t n;
      while (f && (n = fread(buf, 1, sizeof buf, f)) > 0)
        fwrite(buf, 1, n, stdout);
      if (f) fclose(f);
    } else {
      chief_status_print(stdout, &st, tsr_wall_s());
    }
    chief_status_free(&st);
    fflush(stdout);
    if (watch <= 0) return 0;
    tsr_sleep_ms((uint64_t)(watch * 1000));
  }
}
