/* `tessera report LOGDIR`: (re)writes LOGDIR/report.html from
 * LOGDIR/metrics.jsonl, e.g. after a run that was killed before the chief
 * wrote it, or while a run is still going. Exit 1 when the metrics cannot
 * be read or the page cannot be written (the message names the file). */
#include "chief/cli/cli.h"
#include "artifacts/monitor/monitor.h"
#include "common/arg.h"

#include <stdio.h>

static void usage(FILE *f, const void *data) {
  (void)data;
  fprintf(f, "usage: tessera report LOGDIR [--title T] [--subtitle S]\n"
             "  writes LOGDIR/report.html from LOGDIR/metrics.jsonl\n");
}

int chief_cmd_report(int argc, char **argv) {
  chief_report_opts o = {0};
  const tsr_arg opts[] = {TSR_ARG_STR("title", &o.title),
                          TSR_ARG_STR("subtitle", &o.subtitle), TSR_ARG_END};
  static const tsr_arg_cmd cmd = {.name = "tessera report", .usage = usage};
  int n_args;
  int rc = tsr_arg_parse(&cmd, opts, argc, argv, &n_args);
  if (rc) return tsr_arg_status(rc);
  if (n_args != 1) {
    fprintf(stderr, "usage: tessera report LOGDIR [--title T]\n");
    return 2;
  }
  char err[1024];
  if (chief_report_from_logdir(argv[1], &o, err, sizeof err)) {
    fprintf(stderr, "tessera report: %s\n", err);
    return 1;
  }
  printf("%s/%s\n", argv[1], CHIEF_REPORT_HTML);
  return 0;
}
