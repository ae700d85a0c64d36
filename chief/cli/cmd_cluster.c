/* `tessera cluster`: resolves the cluster as any process would (TF_CONFIG,
 * --cluster FILE, --task TYPE:INDEX) and prints it, or prints the error and
 * exits 2. */
#include "chief/cli/cli.h"
#include "common/arg.h"
#include "common/cluster.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

static void usage(FILE *f, const void *data) {
  (void)data;
  fprintf(f, "usage: tessera cluster [--cluster FILE.json] [--task "
             "TYPE:INDEX] [--json | --task-only]\n"
             "  --task-only prints this task as TYPE:INDEX (for launch "
             "scripts)\n");
}

int chief_cmd_cluster(int argc, char **argv) {
  const char *file = NULL, *task = NULL;
  bool json = false, task_only = false;
  const tsr_arg opts[] = {TSR_ARG_STR("cluster", &file),
                          TSR_ARG_STR("task", &task),
                          TSR_ARG_FLAG("json", &json),
                          TSR_ARG_FLAG("task-only", &task_only),
                          TSR_ARG_END};
  static const tsr_arg_cmd cmd = {.name = "tessera cluster", .usage = usage};
  int rc = tsr_arg_parse(&cmd, opts, argc, argv, NULL);
  if (rc) return tsr_arg_status(rc);
  tsr_cluster c;
  char err[TSR_ERRBUF];
  if (tsr_cluster_load(file, task, &c, err, sizeof err)) {
    fprintf(stderr, "tessera cluster: %s\n", err);
    return 2;
  }
  if (task_only) {
    if (c.task_type == TSR_TASK_NONE) {
      fprintf(stderr, "tessera cluster: no task given (TF_CONFIG's \"task\", "
                      "--task, or SLURM_PROCID)\n");
      tsr_cluster_free(&c);
      return 2;
    }
    printf("%s:%d\n", tsr_task_type_name(c.task_type), c.task_index);
  } else if (json) {
    char *s = tsr_cluster_to_json(&c);
    printf("%s\n", s ? s : "{}");
    free(s);
  } else {
    static const tsr_task_type order[] = {TSR_TASK_CHIEF, TSR_TASK_WORKER,
                                          TSR_TASK_PS, TSR_TASK_EVALUATOR};
    printf("%-10s %-6s %-28s %s\n", "JOB", "INDEX", "ADDRESS", "");
    for (int k = 0; k < 4; k++) {
      tsr_task_type t = order[k];
      for (int i = 0; i < c.n[t]; i++) {
        const tsr_task_addr *a = &c.jobs[t][i];
        bool me = c.task_type == t && c.task_index == a->index;
        bool chief = (t == TSR_TASK_CHIEF) ||
                     (c.n[TSR_TASK_CHIEF] == 0 && t == TSR_TASK_WORKER &&
                      a->index == 0);
        printf("%-10s %-6d %-28s %s%s\n", tsr_task_type_name(t), a->index,
               a->addr, me ? "<- this task" : "",
               chief && t != TSR_TASK_CHIEF ? (me ? " (acts as chief)"
                                                  : "(acts as chief)")
                                            : "");
      }
    }
    if (c.task_type == TSR_TASK_NONE)
      printf("task: none given (set TF_CONFIG's \"task\" or --task)\n");
    else
      printf("task: %s:%d%s\n", tsr_task_type_name(c.task_type), c.task_index,
             tsr_cluster_is_chief(&c) ? " (chief)" : "");
    char perr[TSR_ERRBUF];
    if (tsr_cluster_check_ps_training(&c, perr, sizeof perr))
      printf("note: %s\n", perr);
  }
  tsr_cluster_free(&c);
  return 0;
}
