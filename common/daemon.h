/* The start-up the long-running programs share (tessera-ps,
 * tessera-worker, tessera-chief): the flags that place a process in the
 * cluster, the cluster itself, the cluster token, the log's task name and
 * SIGPIPE.
 *
 * Happy path: put TSR_DAEMON_OPTIONS in the getopt_long table and hand
 * every option to tsr_daemon_flag() before the program's own; then
 * tsr_daemon_start() resolves the cluster (--cluster/--task over TF_CONFIG
 * or Slurm, as tsr_cluster_load), checks that this task is one the program
 * runs, names the log's task, reads the token (--token-file or
 * TESSERA_TOKEN) and ignores SIGPIPE, so a peer that goes away while we
 * write gives EPIPE on that connection instead of ending the process.
 * Failure modes: a bad cluster spec, a task the program does not run, a
 * missing or unreadable token: a negative code and one line in `err`
 * naming the problem (the program exits 2); nothing is left to free.
 *
 * Threads: the main thread, before any other starts (SIGPIPE, the log).
 */
#ifndef TSR_DAEMON_H
#define TSR_DAEMON_H

#include <getopt.h>
#include <stddef.h>
#include <stdint.h>

#include "common/cluster.h"
#include "common/rpc/rpc.h"

/* getopt_long values of the shared flags, above any short option. */
enum {
  TSR_DAEMON_OPT_CLUSTER = 0x1000,
  TSR_DAEMON_OPT_TASK,
  TSR_DAEMON_OPT_TOKEN_FILE
};

#define TSR_DAEMON_OPTIONS                                          \
  {"cluster", required_argument, 0, TSR_DAEMON_OPT_CLUSTER},        \
  {"task", required_argument, 0, TSR_DAEMON_OPT_TASK},              \
  {"token-file", required_argument, 0, TSR_DAEMON_OPT_TOKEN_FILE}

/* Their lines of a usage text. */
#define TSR_DAEMON_USAGE                                                  \
  "  --cluster FILE.json     cluster spec (default: TF_CONFIG, or Slurm)\n" \
  "  --task TYPE:INDEX       this task (default: from TF_CONFIG)\n"        \
  "  --token-file FILE       cluster token (default: TESSERA_TOKEN)\n"

typedef struct {
  const char *cluster_file; /* NULL: TF_CONFIG (or Slurm) */
  const char *task;         /* NULL: TF_CONFIG's task */
  const char *token_file;   /* NULL: TESSERA_TOKEN */
} tsr_daemon_flags;

/* Stores `arg` when `opt` is one of the shared flags and returns 1; else
 * returns 0 (the program's own option). */
int tsr_daemon_flag(tsr_daemon_flags *f, int opt, const char *arg);

#define TSR_TASK_BIT(type) (1u << (type))

typedef struct {
  const char *program;  /* "tessera-ps", in messages */
  unsigned runs;        /* TSR_TASK_BIT of each task type it runs */
  unsigned token_for;   /* the types among those that need the token */
  const char *log_task; /* the log's task name; NULL: "ps:0", ... */
} tsr_daemon_spec;

typedef struct {
  tsr_cluster cluster;              /* owned */
  char task[32];                    /* "ps:0", "worker:1", "chief" */
  uint8_t token[TSR_RPC_TOKEN_MAX]; /* wiped by tsr_daemon_free */
  size_t token_len;                 /* 0: this task type needs none */
} tsr_daemon;

int tsr_daemon_start(tsr_daemon *d, const tsr_daemon_spec *spec,
                     const tsr_daemon_flags *f, char *err, size_t errlen);
/* Frees the cluster and wipes the token; safe on a zeroed or freed one. */
void tsr_daemon_free(tsr_daemon *d);

#endif /* TSR_DAEMON_H */
