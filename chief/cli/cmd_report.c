/* `tessera report LOGDIR`: (re)writes LOGDIR/report.html from
 * LOGDIR/metrics.jsonl, e.g. after a run that was killed before the chief
 * wrote it, or while a run is still going. Exit 1 when the metrics cannot
 * be read or the page cannot be written (the message names the file). */
#include "chief/cli/cli.h"
#include "artifacts/monitor/monitor.h"

#include <getopt.h>
#include <stdio.h>

int chief_cmd_report(int argc, char **argv) {
  chief_report_opts o = {0};
  static const struct option opts[] = {{"title", required_argument, 0, 't'},
                                       {"subtitle", required_argument, 0, 's'},
                                       {"help", no_argument, 0, 'h'},
                                       {0, 0, 0, 0}};
  int ch;
  optind = 1;
  while ((ch = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (ch) {
      case 't': o.title = optarg; break;
      case 's': o.subtitle = optarg; break;
      case 'h':
        printf("usage: tessera report LOGDIR [--title T] [--subtitle S]\n"
               "  writes LOGDIR/report.html from LOGDIR/metrics.jsonl\n");
        return 0;
      default: return 2;
    }
  }
  if (optind + 1 != argc) {
    fprintf(stderr, "usage: tessera report LOGDIR [--title T]\n");
    return 2;
  }
  char err[1024];
  if (chief_report_from_logdir(argv[optind], &o, err, sizeof err)) {
    fprintf(stderr, "tessera report: %s\n", err);
    return 1;
  }
  printf("%s/%s\n", argv[optind], CHIEF_REPORT_HTML);
  return 0;
}
