/* Cluster spec: who is in the cluster and which task this process is.
 *
 * Read exactly as TensorFlow reads TF_CONFIG:
 *   {"cluster": {"chief": ["h:p"], "worker": [...], "ps": [...],
 *                "evaluator": [...]},
 *    "task": {"type": "worker", "index": 0}}
 * A job may also be a map {"3": "h:p"} (sparse form; indexes need not be
 * dense). Rules (tensorflow/python/distribute/multi_worker_util.py):
 *   - job names are chief, worker, ps, evaluator;
 *   - the task type is one of those and is in the cluster (an evaluator may
 *     be outside it, as in TF: it is a sidecar);
 *   - the index is an integer (or an integer string, as int() takes) that
 *     names a task of that job;
 *   - at most one chief and at most one evaluator;
 *   - with no chief job, worker 0 is the chief.
 * Parameter-server training also needs at least one ps and one worker
 * (tsr_cluster_check_ps_training).
 *
 * `--cluster FILE.json` holds either a whole TF_CONFIG or only the cluster
 * map; `--task TYPE:INDEX` overrides the task. Errors are written to a
 * caller buffer as one line naming the key and the value.
 */
#ifndef TSR_CLUSTER_H
#define TSR_CLUSTER_H

#include <stdbool.h>
#include <stddef.h>

typedef enum {
  TSR_TASK_CHIEF = 0,
  TSR_TASK_WORKER,
  TSR_TASK_PS,
  TSR_TASK_EVALUATOR,
  TSR_TASK__COUNT,
  TSR_TASK_NONE = -1
} tsr_task_type;

typedef struct {
  int index;       /* index within its job (sparse jobs may skip some) */
  char host[256];  /* without brackets for IPv6 */
  int port;        /* 1..65535 */
  char addr[272];  /* "host:port" as written ([v6]:port) */
} tsr_task_addr;

typedef struct {
  tsr_task_addr *jobs[TSR_TASK__COUNT]; /* sorted by index */
  int n[TSR_TASK__COUNT];
  bool sparse[TSR_TASK__COUNT];
  tsr_task_type task_type;  /* TSR_TASK_NONE when no task was given */
  int task_index;
} tsr_cluster;

#define TSR_ERRBUF 512

const char *tsr_task_type_name(tsr_task_type t);
/* "chief" etc. to the enum; -1 when unknown. */
tsr_task_type tsr_task_type_parse(const char *s);

void tsr_cluster_init(tsr_cluster *c);
void tsr_cluster_free(tsr_cluster *c);

/* Parses a TF_CONFIG text. `require_cluster`: a missing "cluster" key is an
 * error. Returns 0 or TSR_EJSON/TSR_ECONFIG with `err` filled. On error `out`
 * is left freed. */
int tsr_cluster_parse(const char *json_text, const char *source,
                      tsr_cluster *out, char *err, size_t errlen);

/* Resolves the cluster for a process: `cluster_file` (may be NULL) or else
 * the TF_CONFIG environment variable; then `task_flag` ("worker:1", may be
 * NULL) overrides the task; then the whole result is validated. */
int tsr_cluster_load(const char *cluster_file, const char *task_flag,
                     tsr_cluster *out, char *err, size_t errlen);

/* Builds the cluster from a Slurm step, as TF's SlurmClusterResolver:
 * SLURM_PROCID, SLURM_(STEP|JOB)_NODELIST, SLURM_(STEP_)TASKS_PER_NODE;
 * the k-th task on a host listens on port_base + k; ranks are dealt in
 * order to `jobs` ("ps:2,worker:*", * = the rest; NULL: all workers, TF's
 * default). tsr_cluster_load() uses it when TF_CONFIG is unset and
 * SLURM_PROCID is set, with TESSERA_SLURM_JOBS and TESSERA_SLURM_PORT_BASE
 * (default 8888, TF's). */
int tsr_cluster_from_slurm(const char *jobs, int port_base, tsr_cluster *out,
                           char *err, size_t errlen);

/* Overrides the task from "TYPE:INDEX". */
int tsr_cluster_set_task(tsr_cluster *c, const char *task_flag, char *err,
                         size_t errlen);

/* Validation with TF's rules (see top). Called by parse and load. */
int tsr_cluster_validate(const tsr_cluster *c, char *err, size_t errlen);

/* At least one ps and one worker. */
int tsr_cluster_check_ps_training(const tsr_cluster *c, char *err,
                                  size_t errlen);

/* The task with that index, or NULL. */
const tsr_task_addr *tsr_cluster_find(const tsr_cluster *c, tsr_task_type t,
                                      int index);

/* True when this task acts as chief: the chief, or worker 0 when the
 * cluster has no chief job. */
bool tsr_cluster_is_chief(const tsr_cluster *c);

/* The chief's address: chief 0, or worker 0 when there is no chief job. */
const tsr_task_addr *tsr_cluster_chief(const tsr_cluster *c);

/* The address a task listens on: its own host when that is an IP literal
 * (a test's 127.0.0.1, an interface chosen on purpose), 127.0.0.1 for
 * "localhost", else (a name: a node, a pod, a container, a Swarm service
 * whose name may resolve to a virtual IP no interface holds) every
 * address, IPv6 and IPv4 alike: "[::]:port" (the RPC listens on 0.0.0.0
 * instead where the kernel has no IPv6). */
void tsr_task_listen_addr(const tsr_task_addr *a, char *out, size_t cap);

/* Splits "host:port" / "[v6]:port" into `a`. */
int tsr_addr_parse(const char *s, tsr_task_addr *a, char *err, size_t errlen);

/* Writes the resolved cluster as JSON (TF_CONFIG shape plus "is_chief");
 * the caller frees the string. */
char *tsr_cluster_to_json(const tsr_cluster *c);

#endif
