/* The start-up the long-running programs share (tessera-ps,
 * tessera-worker, tessera-chief): the flags that place a process in the
 * cluster, the cluster itself, the cluster token, the log's task name and
 * SIGPIPE.
 *
 * Happy path: put TSR_DAEMON_ARGS in the program's option table
 * (common/arg.h); then tsr_daemon_start() resolves the cluster
 * (--cluster/--task over TF_CONFIG or Slurm, as tsr_cluster_load), checks that this task is one the program
 * runs, names the log's task, reads the token (--token-file or
 * TESSERA_TOKEN), settles the frame MAC (--frame-mac over
 * TESSERA_FRAME_MAC, on by default; a warning when off) and ignores
 * SIGPIPE, so a peer that goes away while we write gives EPIPE on that
 * connection instead of ending the process.
 * Failure modes: a bad cluster spec, a task the program does not run, a
 * missing or unreadable token, a --frame-mac that is neither on nor off:
 * a negative code and one line in `err` naming the problem (the program
 * exits 2); nothing is left to free.
 *
 * Threads: the main thread, before any other starts (SIGPIPE, the log).
 */
#ifndef TSR_DAEMON_H
#define TSR_DAEMON_H

#include <stddef.h>
#include <stdint.h>

#include "common/cluster.h"
#include "common/arg.h"
#include "common/rpc/rpc.h"

/* The shared flags' entries of a tsr_arg table (common/arg.h), filling
 * the tsr_daemon_flags at `f`. */
#define TSR_DAEMON_ARGS(f)                          \
  TSR_ARG_STR("cluster", &(f)->cluster_file),       \
  TSR_ARG_STR("task", &(f)->task),                  \
  TSR_ARG_STR("token-file", &(f)->token_file),      \
  TSR_ARG_STR("frame-mac", &(f)->frame_mac)

/* Their lines of a usage text. */
#define TSR_DAEMON_USAGE                                                  \
  "  --cluster FILE.json     cluster spec (default: TF_CONFIG, or Slurm)\n" \
  "  --task TYPE:INDEX       this task (default: from TF_CONFIG)\n"        \
  "  --token-file FILE       cluster token (default: TESSERA_TOKEN)\n"    \
  "  --frame-mac on|off      off: frames without a MAC where the peer asks\n" \
  "                          too, trusted networks only (default: on, or\n" \
  "                          TESSERA_FRAME_MAC)\n"

typedef struct {
  const char *cluster_file; /* NULL: TF_CONFIG (or Slurm) */
  const char *task;         /* NULL: TF_CONFIG's task */
  const char *token_file;   /* NULL: TESSERA_TOKEN */
  const char *frame_mac;    /* "on"/"off"; NULL: TESSERA_FRAME_MAC, on */
} tsr_daemon_flags;

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
  int plain_frames; /* tsr_rpc_opts.plain_frames: --frame-mac off */
} tsr_daemon;

int tsr_daemon_start(tsr_daemon *d, const tsr_daemon_spec *spec,
                     const tsr_daemon_flags *f, char *err, size_t errlen);
/* Frees the cluster and wipes the token; safe on a zeroed or freed one. */
void tsr_daemon_free(tsr_daemon *d);

#endif /* TSR_DAEMON_H */
