/* tessera-ps: resolves its place in the cluster (TF_CONFIG or
 * --cluster/--task) and reports it. The serving loop arrives with the
 * ps module; until then the binary refuses to run a job rather than
 * pretend to. */
#include "common/cluster.h"
#include "common/err.h"
#include "common/log.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
  fprintf(f, "usage: tessera-ps [--cluster FILE.json] [--task TYPE:INDEX]\n"
             "  The cluster comes from TF_CONFIG unless --cluster is given.\n");
}

int main(int argc, char **argv) {
  const char *cluster_file = NULL, *task = NULL;
  static const struct option opts[] = {{"cluster", required_argument, 0, 'c'},
                                       {"task", required_argument, 0, 't'},
                                       {"help", no_argument, 0, 'h'},
                                       {0, 0, 0, 0}};
  int ch;
  while ((ch = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (ch) {
      case 'c': cluster_file = optarg; break;
      case 't': task = optarg; break;
      case 'h': usage(stdout); return 0;
      default: usage(stderr); return 2;
    }
  }
  tsr_log_init("ps");
  tsr_cluster c;
  char err[TSR_ERRBUF];
  if (tsr_cluster_load(cluster_file, task, &c, err, sizeof err)) {
    tsr_error("%s", err);
    return 2;
  }
  tsr_error("tessera-ps is not implemented in this build: the cluster "
            "resolved, but no ps service is compiled in");
  tsr_cluster_free(&c);
  return 3;
}
