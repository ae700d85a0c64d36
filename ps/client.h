/* Client of the parameter server: one ps_client per PS, over one RPC
 * connection (common/rpc/rpc.h), with one function per PS method so the
 * worker and the chief never build PS frames by hand.
 *
 * Every call is asynchronous and runs on the RPC context's loop thread:
 * it returns 0 and later calls `cb` exactly once (with the status and, for
 * pulls, the values already in the caller's buffer), or returns a negative
 * code and never calls `cb`. Buffers passed in (gradients, ids, the
 * destination of a pull) must stay valid until `cb` has run: they are sent
 * from and received into directly, never copied.
 *
 * Also here: the shard spec (ps_var_spec) the chief sends on create, the
 * gradient dtypes and the method numbers, shared with the server.
 */
#ifndef TSR_PS_CLIENT_H
#define TSR_PS_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/job.h"
#include "common/rpc/rpc.h"
#include "kernels/init.h"

#define PS_NAME_MAX 256
#define PS_MAX_RANK 8

/* Method numbers of tessera-ps. */
enum {
  PS_M_CREATE = 0x401,
  PS_M_PULL = 0x402,
  PS_M_PULL_ROWS = 0x403,
  PS_M_PUSH = 0x404,
  PS_M_PUSH_ROWS = 0x405,
  PS_M_PUSH_PULL = 0x406,
  PS_M_CLOCK = 0x407,
  PS_M_CONFIG = 0x408,
  PS_M_SAVE = 0x409,
  PS_M_RESTORE = 0x40a,
  PS_M_STATS = 0x40b,
  PS_M_SHUTDOWN = 0x40c,
};

/* Wire dtypes of gradients (values are always float32 on the PS). */
typedef enum { PS_DT_F32 = 0, PS_DT_BF16 = 1, PS_DT_F16 = 2 } ps_dtype;

/* One shard of one variable: enough to build it, and to tell whether a
 * second create names the same thing. */
typedef struct {
  char name[PS_NAME_MAX];
  int rank;
  int64_t shape[PS_MAX_RANK]; /* the full variable */
  bool sparse;                /* rows by id, created on first touch */
  bool bounded;               /* sparse: ids in [row0, row0+rows);
                                 unbounded: id % num_shards == shard */
  int32_t shard, num_shards;
  int64_t row0, rows;         /* rows of this shard (dense, bounded) */
  kern_init_spec init;
  uint64_t seed;
  tsr_optim_spec optim;
} ps_var_spec;

/* Fills a spec for shard `shard` of `num_shards` of a variable with TF's
 * "div" row layout, the Keras initializer `init` (fans from the shape) and
 * the optimizer. TSR_EINVAL for an unknown initializer or a bad shape. */
int ps_var_spec_init(ps_var_spec *s, const char *name, int rank,
                     const int64_t *shape, int shard, int num_shards,
                     const char *init, uint64_t seed,
                     const tsr_optim_spec *optim);

/* Outcome of a call, valid during the callback only. */
typedef struct {
  int status;           /* 0 or a negative code (the PS's own on remote) */
  const char *message;  /* never NULL */
  uint64_t version;     /* shard version after the call (pull, push) */
  int64_t step;         /* shard applies so far */
  size_t nbytes;        /* bytes written to the destination (pulls) */
  int64_t min_clock;    /* clock: slowest active worker, -1 if none */
  int64_t clock;        /* join: the clock the worker goes on from */
  uint64_t era;         /* clock, config, restore: the PS's era */
  int32_t count;        /* create: how many were new; save/restore:
                           shards; clock: active workers */
  const void *stats;    /* stats: Tessera__Ps__StatsResponse * */
  const void *payload;  /* stats with drain: trace events (common/trace.h
                           wire form), valid during the callback */
  size_t payload_len;
} ps_result;

typedef void (*ps_client_cb)(const ps_result *r, void *data);

typedef struct ps_client ps_client;

/* Connects to the PS at "host:port" through `ctx` (which holds the token
 * and the limits); reconnects by itself (see rpc.h). */
int ps_client_new(ps_client **out, tsr_rpc_ctx *ctx, const char *addr);
/* Fails the calls in flight with TSR_ESHUTDOWN; `cb` runs when closed. */
void ps_client_close(ps_client *c, tsr_rpc_close_cb cb, void *data);
/* Deadline of every later call (0: the context's default). */
void ps_client_set_deadline(ps_client *c, uint32_t ms);
/* The era every later pull, push and tick carries (the one this PS's JOIN
 * answered; 0, the default: not checked). Loop thread. */
void ps_client_set_era(ps_client *c, uint64_t era);
tsr_rpc_client *ps_client_rpc(ps_client *c);

/* Creates shards (idempotent for an identical spec). */
int ps_client_create(ps_client *c, const ps_var_spec *specs, size_t n,
                     ps_client_cb cb, void *data);
/* `worker` is the worker's task index (-1 for a reader that is no worker:
 * the chief, an evaluator); `clock` the step it is about to compute, which
 * gates the pull (ssp: the slowest worker has finished clock - S steps;
 * sync: `clock` steps are applied); async ignores it. `step` of a push is
 * the step its gradient belongs to.
 * Pulls a dense shard into dst (exactly its rows*width floats). */
int ps_client_pull(ps_client *c, const char *name, int shard, int worker,
                   int64_t clock, float *dst, size_t n_floats,
                   ps_client_cb cb, void *data);
/* Pulls rows by id into dst (n_ids * width floats). */
int ps_client_pull_rows(ps_client *c, const char *name, int shard, int worker,
                        int64_t clock, const int64_t *ids, size_t n_ids,
                        float *dst, size_t width, ps_client_cb cb, void *data);
/* Pushes a dense gradient of `nbytes` in `dtype` for step `step`. */
int ps_client_push(ps_client *c, const char *name, int shard, int worker,
                   int64_t step, ps_dtype dtype, const void *grad,
                   size_t nbytes, ps_client_cb cb, void *data);
/* Pushes row gradients: n_ids ids, then n_ids rows in `dtype`. */
int ps_client_push_rows(ps_client *c, const char *name, int shard, int worker,
                        int64_t step, ps_dtype dtype, const int64_t *ids,
                        size_t n_ids, const void *grad, size_t nbytes,
                        ps_client_cb cb, void *data);
/* Fused push then pull of a dense shard: dst receives the values after
 * this push (sync: after step `step` is applied everywhere). */
int ps_client_push_pull(ps_client *c, const char *name, int shard,
                        int worker, int64_t step, ps_dtype dtype,
                        const void *grad, size_t nbytes, float *dst,
                        size_t n_floats, ps_client_cb cb, void *data);
/* Fused push of rows then pull of other rows (pull_ids into dst). */
int ps_client_push_pull_rows(ps_client *c, const char *name, int shard,
                             int worker, int64_t step, ps_dtype dtype,
                             const int64_t *ids, size_t n_ids,
                             const void *grad, size_t nbytes,
                             const int64_t *pull_ids, size_t n_pull,
                             float *dst, size_t width, ps_client_cb cb,
                             void *data);

typedef enum { PS_CLOCK_TICK = 0, PS_CLOCK_JOIN = 1, PS_CLOCK_LEAVE = 2 } ps_clock_op;
/* The clock protocol (ps/consist.c, tests/model/). TICK raises a member's
 * clock; JOIN and LEAVE with run 0 and closure 0 (tests, tools). */
int ps_client_clock(ps_client *c, int worker, int64_t clock, ps_clock_op op,
                    ps_client_cb cb, void *data);
/* JOIN for closure `closure` of run `run`: r->clock is the clock to go on
 * from, r->era the era to set (ps_client_set_era). `clock` counts when the
 * client's era is the PS's. TSR_ESTALE: another run, or a closure the
 * chief gave up. */
int ps_client_join(ps_client *c, int worker, int64_t clock, uint64_t run,
                   uint64_t closure, ps_client_cb cb, void *data);
/* LEAVE (the chief): closures up to `closure` of `worker` are over. */
int ps_client_leave(ps_client *c, int worker, uint64_t run, uint64_t closure,
                    ps_client_cb cb, void *data);
/* Sets the consistency mode ("async", "ssp:S", "sync") and whether
 * non-finite gradients are applied (default: rejected). */
int ps_client_config(ps_client *c, const char *mode, bool allow_nonfinite,
                     ps_client_cb cb, void *data);
/* The same, and when trace_pid >= 0 the PS records every apply as a trace
 * event on that track, for ps_client_stats_drain to collect. */
int ps_client_config_trace(ps_client *c, const char *mode,
                           bool allow_nonfinite, int32_t trace_pid,
                           ps_client_cb cb, void *data);
/* The same for the chief's run `run_id` (JOINs of another run are
 * refused). Every config starts a new era (r->era). */
int ps_client_config_run(ps_client *c, const char *mode,
                         bool allow_nonfinite, int32_t trace_pid,
                         uint64_t run_id, ps_client_cb cb, void *data);
int ps_client_save(ps_client *c, const char *dir, ps_client_cb cb,
                   void *data);
/* Restores every shard the PS holds from dir (re-cut as needed); the
 * consistency state starts a new era at step 0. */
int ps_client_restore(ps_client *c, const char *dir, ps_client_cb cb,
                      void *data);
/* The same at the checkpoint's `step` (sync: the next step to sum). */
int ps_client_restore_step(ps_client *c, const char *dir, int64_t step,
                           ps_client_cb cb, void *data);
/* r->stats points at the decoded StatsResponse during the callback. */
int ps_client_stats(ps_client *c, ps_client_cb cb, void *data);
/* Stats, and the apply events recorded since the last drain as
 * r->payload (the PS forgets them). */
int ps_client_stats_drain(ps_client *c, ps_client_cb cb, void *data);
/* Asks the PS to exit (status 0). */
int ps_client_shutdown(ps_client *c, ps_client_cb cb, void *data);

#endif
