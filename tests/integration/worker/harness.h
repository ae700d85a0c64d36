/* Test harness of the worker integration tests: a small cluster of real
 * tessera-ps and tessera-worker processes on 127.0.0.1 ports claimed for
 * the test (tests/ports/ports.h), and a driver that plays the chief
 * (creates the variables on the PS, configures the workers, runs closures)
 * through blocking helpers that run the driver's own loop until an answer
 * or a deadline.
 */
#ifndef TSR_TEST_WK_HARNESS_H
#define TSR_TEST_WK_HARNESS_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/job.h"
#include "common/partition.h"
#include "common/rpc/rpc.h"
#include "ps/client/client.h"
#include "worker/model.h"
#include "worker/wire.h"

#include "worker.pb-c.h"

#define H_MAX_PROCS 4

typedef struct {
  const char *build_dir, *source_dir;
  int n_ps, n_workers;
  int ps_port[H_MAX_PROCS], wk_port[H_MAX_PROCS];
  char ps_addr[H_MAX_PROCS][32], wk_addr[H_MAX_PROCS][32];
  pid_t ps_pid[H_MAX_PROCS], wk_pid[H_MAX_PROCS];
  char cluster_json[1024];
  uv_loop_t loop;
  uv_timer_t tick;          /* keeps uv_run(ONCE) returning */
  tsr_rpc_ctx *ctx;
  ps_client *ps[H_MAX_PROCS];
  tsr_rpc_client *wk[H_MAX_PROCS];
  /* the job and the chief's layout */
  tsr_job job;
  char *job_text;
  tsr_model *model;
  const tsr_var *vars;
  size_t n_vars;
  tsr_shard *shards;
  size_t n_shards;
  size_t drop_shards;       /* h_configure leaves out the last ones */
  uint64_t group_epoch;     /* dense "allreduce": the ring h_configure
                               names (every worker, in index order) */
} h_cluster;

/* A finished call. */
typedef struct {
  bool done;
  int status;
  char msg[1024];
  uint8_t *meta;            /* response meta (malloc'd) */
  size_t meta_len;
  int64_t step;             /* ps: shard step */
  size_t payload_len;       /* response payload bytes */
  uint8_t *payload;         /* a copy of them (malloc'd) */
  size_t trace_events;      /* of them, trace events that decode */
} h_result;

#define H_CHECK(cond, ...)                                              \
  do {                                                                  \
    if (!(cond)) {                                                      \
      fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);   \
      fprintf(stderr, __VA_ARGS__);                                     \
      fprintf(stderr, "\n");                                            \
      return 1;                                                         \
    }                                                                   \
  } while (0)

/* Picks ports, starts n_ps PS and n_workers workers (extra worker argv
 * may be NULL), connects the driver. 0 or a negative code (logged). */
int h_start(h_cluster *c, int n_ps, int n_workers, const char *ps_mode);
/* Deadline of the workers' PS calls for the next h_start (default 5 s). */
void h_set_ps_deadline(int ms);
/* Starts PS i again on its port. */
int h_start_ps(h_cluster *c, int i, const char *ps_mode);
/* SIGTERM every process, checks each exits 0 within the deadline; closes
 * the driver and checks uv_loop_close() == 0. Returns 0 when all did. */
int h_stop(h_cluster *c);
/* Sends `sig` to a process and waits (deadline) for it to end; returns
 * its exit status (128+signal when killed), or -1 on timeout. */
int h_kill(pid_t pid, int sig, int timeout_ms);

/* Loads a job file, builds the model (schema from the training input of
 * worker 0 of 1) and plans its shards over the PS with `parts` shards per
 * variable (0: the job's partitioner); with dense "allreduce" the sparse
 * variables only, as the chief places them. */
int h_load_job(h_cluster *c, const char *path, const char *const *overrides,
               int parts);
/* Creates every shard on its PS and sets the PS mode. */
int h_create_vars(h_cluster *c, const char *mode);

/* Worker calls: pack `req`, call, wait up to timeout_ms; res->meta holds
 * the answer on status 0. */
int h_call(h_cluster *c, int w, uint32_t method, const ProtobufCMessage *req,
           h_result *res, int timeout_ms);
/* Starts a call and returns at once; h_wait waits for it. */
int h_call_start(h_cluster *c, int w, uint32_t method,
                 const ProtobufCMessage *req, h_result *res);
/* The same with a payload: `payload` must stay valid until the call ends. */
int h_call_start_payload(h_cluster *c, int w, uint32_t method,
                         const ProtobufCMessage *req, const void *payload,
                         size_t payload_len, h_result *res);
int h_wait(h_cluster *c, h_result *res, int timeout_ms);
void h_result_free(h_result *res);

/* Configure request for worker w (format version and job as given); with
 * dense "allreduce" it names the ring of every worker, group_epoch. */
int h_configure(h_cluster *c, int w, uint64_t run_id, uint32_t version,
                const char *job_text, h_result *res);
/* The same, returning at once (h_wait): ring members configure together. */
int h_configure_start(h_cluster *c, int w, uint64_t run_id, uint32_t version,
                      const char *job_text, h_result *res);

/* Configures every worker for run_id at once (the ring's members wait
 * for each other) and waits up to timeout_ms for each; 0 when all did. */
int h_configure_all(h_cluster *c, uint64_t run_id, int timeout_ms);

/* Starts closure `id` of `steps` steps on worker w (h_wait waits for it);
 * with `trace` the answer carries the closure's step phases. */
int h_run_start(h_cluster *c, int w, uint64_t id, int64_t steps, bool trace,
                h_result *res);
/* dense "allreduce": the same in the ring of every worker under
 * c->group_epoch (a new epoch re-forms it), every member taking the dense
 * state of rank state_root. */
int h_run_ring_start(h_cluster *c, int w, uint64_t id, int64_t steps,
                     uint32_t state_root, h_result *res);

/* The start of a test program's main: one test name in argv[1] and
 * TSR_SOURCE_DIR set (else "usage: USAGE (TSR_SOURCE_DIR, TSR_BUILD_DIR
 * set)" and NULL); SIGPIPE ignored (a worker that goes away gives EPIPE);
 * the path of tests/data/diabetes_job.json in job_path. Returns the
 * source folder. */
const char *h_main_start(int argc, char **argv, const char *usage,
                         char *job_path, size_t len);

/* Pulls the whole value of variable v from the PS into out (numel). */
int h_pull_var(h_cluster *c, int v, float *out, int64_t *step);

/* dense "allreduce": worker w's dense values (model order of the dense
 * variables, each numel floats) into a malloc'd *out, and its optimizer
 * applies. */
int h_dense(h_cluster *c, int w, float **out, size_t *n, int64_t *step);
/* Worker w's whole dense state, slots too: *state unpacked from res's
 * meta (free it, then res), its floats in res->payload. */
int h_dense_state(h_cluster *c, int w, h_result *res,
                  Tessera__Worker__DenseResponse **state);
/* Starts breaking worker w's ring (WK_M_RING_BREAK), naming `why`. */
int h_ring_break_start(h_cluster *c, int w, const char *why, h_result *res);
/* Starts setting worker w's dense state to `state` and its payload (as
 * h_dense_state gave them); `rewind`: the run rewinds to it. */
int h_dense_set_start(h_cluster *c, int w,
                      const Tessera__Worker__DenseResponse *state,
                      const void *payload, size_t payload_len, bool rewind,
                      h_result *res);

/* Runs the driver loop for about ms milliseconds. */
void h_spin(h_cluster *c, int ms);

#endif
