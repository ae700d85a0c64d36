/* tessera: the front door. Dispatches to a subcommand; unknown commands get
 * the list of known ones. */
#include "chief/cli/cli.h"
#include "common/log.h"
#include "tsr_config.h"

#include <stdio.h>
#include <string.h>

typedef struct {
  const char *name;
  int (*run)(int argc, char **argv);
  const char *help;
} tsr_cmd;

static const tsr_cmd cmds[] = {
    {"cluster", chief_cmd_cluster,
     "print the resolved cluster and this task (TF_CONFIG or --cluster)"},
    {"partition", chief_cmd_partition,
     "show how variables are split into shards and placed on the PS"},
    {"status", chief_cmd_status,
     "ask every process of the cluster how it is (chief, ps, workers)"},
    {"ckpt", chief_cmd_ckpt,
     "inspect a checkpoint, or export it to .npz for numpy and Keras"},
    {"local", chief_cmd_local,
     "start a whole cluster (ps, workers, chief) on this machine"},
    {"report", chief_cmd_report,
     "write LOGDIR/report.html from LOGDIR/metrics.jsonl"},
    {"evaluate", chief_cmd_evaluate,
     "a job's metrics for a checkpoint or Keras weights, without training"},
    {"predict", chief_cmd_predict,
     "a job's model outputs for a checkpoint or Keras weights, as .npy"},
};

static void usage(FILE *f) {
  fprintf(f, "usage: tessera COMMAND [ARGS]\n\ncommands:\n");
  for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
    fprintf(f, "  %-10s %s\n", cmds[i].name, cmds[i].help);
  fprintf(f, "\n`tessera COMMAND --help` describes one command.\n");
}

int main(int argc, char **argv) {
  tsr_log_init("tessera");
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") ||
      !strcmp(argv[1], "help")) {
    usage(stdout);
    return 0;
  }
  if (!strcmp(argv[1], "--version")) {
    printf("tessera %s\n", TSR_VERSION);
    return 0;
  }
  for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
    if (strcmp(argv[1], cmds[i].name) == 0)
      return cmds[i].run(argc - 1, argv + 1);
  fprintf(stderr, "tessera: unknown command \"%s\" (tessera --help lists "
                  "the commands)\n", argv[1]);
  return 2;
}
