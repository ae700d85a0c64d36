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
 * What the client and the server both speak (the method numbers, the
 * gradient dtypes, the shard spec ps_var_spec, bfloat16) is ps/wire/wire.h,
 * included here.
 */
#ifndef TSR_PS_CLIENT_H
#define TSR_PS_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/optim_spec.h"
#include "common/var.h"
#include "common/rpc/rpc.h"
#include "ps/wire/wire.h"

/* Fills a spec for shard `shard` of `num_shards` of a dense float32
 * variable with TF's "div" row layout, the Keras initializer `init` (fans
 * from the shape: the last two axes times the receptive field, for every
 * initializer) and the optimizer. TSR_EINVAL for an unknown initializer or
 * a bad shape. */
int ps_var_spec_init(ps_var_spec *s, const char *name, int rank,
                     const int64_t *shape, int shard, int num_shards,
                     const char *init, uint64_t seed,
                     const tsr_optim_spec *optim);

/* The spec of shard `sh` of variable `v` as the chief creates it: the
 * variable as it is (a row-sparse one bounded by the shard's rows), the
 * shard, the job's seed, the variable's update rule and, when init_path is
 * non-empty (NULL: none), the raw file every PS reads its initial values
 * from. TSR_EINVAL for a rank out of 0..TSR_MAX_RANK, a dimension <= 0, a
 * shard out of its variable's rows or of its count, a dtype other than
 * float32 (what the PS holds), an init_path of PS_INIT_PATH_MAX bytes or
 * more. */
int ps_var_spec_from_var(ps_var_spec *s, const tsr_var *v,
                         const tsr_shard *sh, uint64_t seed,
                         const tsr_optim_spec *optim, const char *init_path);

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
  const void *save;     /* save: Tessera__Ps__SaveResponse * (the files
                           written, each with its size and CRC32C) */
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
/* The same with the values on the wire in `dtype` (PS_DT_F32 or
 * PS_DT_BF16): dst receives exactly dst_bytes bytes of that dtype. */
int ps_client_pull_as(ps_client *c, const char *name, int shard, int worker,
                      int64_t clock, ps_dtype dtype, void *dst,
                      size_t dst_bytes, ps_client_cb cb, void *data);
/* Pulls rows by id into dst (n_ids * width floats). */
int ps_client_pull_rows(ps_client *c, const char *name, int shard, int worker,
                        int64_t clock, const int64_t *ids, size_t n_ids,
                        float *dst, size_t width, ps_client_cb cb, void *data);
/* Rows by id with the values on the wire in `dtype` (dst_bytes: n_ids *
 * width values of that dtype). */
int ps_client_pull_rows_as(ps_client *c, const char *name, int shard,
                           int worker, int64_t clock, ps_dtype dtype,
                           const int64_t *ids, size_t n_ids, void *dst,
                           size_t dst_bytes, ps_client_cb cb, void *data);
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
/* Fused push then pull, dense or rows (the PS knows the shard's kind),
 * with the pulled values on the wire in pull_dtype (dst_bytes of them). */
int ps_client_push_pull_as(ps_client *c, const char *name, int shard,
                           int worker, int64_t step, ps_dtype dtype,
                           const int64_t *ids, size_t n_ids,
                           const void *grad, size_t nbytes,
                           const int64_t *pull_ids, size_t n_pull,
                           ps_dtype pull_dtype, void *dst, size_t dst_bytes,
                           ps_client_cb cb, void *data);

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
/* Everything a configure carries. Every config starts a new era
 * (r->era). */
typedef struct {
  const char *mode;             /* NULL: "async" */
  bool allow_nonfinite;
  int32_t trace_pid;            /* >= 0: record applies on that track */
  const char *checkpoint_root;  /* the job's checkpoint folder (NULL: none):
                                   the PS saves and restores only under it,
                                   unless started with its own root */
  uint64_t run_id;              /* the chief's run: JOINs of another run
                                   are refused (0: any) */
  bool hold_until_restore;      /* pulls and pushes wait at the PS until a
                                   restore has swapped its shards in (a PS
                                   restarted alone, restored while the
                                   others train on) */
} ps_config;
int ps_client_configure(ps_client *c, const ps_config *cfg, ps_client_cb cb,
                        void *data);
/* ps_client_configure for the chief's run `run_id`, without a checkpoint
 * root. */
int ps_client_config_run(ps_client *c, const char *mode,
                         bool allow_nonfinite, int32_t trace_pid,
                         uint64_t run_id, ps_client_cb cb, void *data);
/* Saves every shard into dir: a folder under the PS's checkpoint root,
 * named relative to it (or absolute inside it). */
int ps_client_save(ps_client *c, const char *dir, ps_client_cb cb,
                   void *data);
/* Restores every shard the PS holds from dir (re-cut as needed); the
 * consistency state starts a new era at step 0. */
int ps_client_restore(ps_client *c, const char *dir, ps_client_cb cb,
                      void *data);
/* The same at the checkpoint's `step` (sync: the next step to sum). */
int ps_client_restore_step(ps_client *c, const char *dir, int64_t step,
                           ps_client_cb cb, void *data);
/* Save as part of checkpoint `id` (at most 64 bytes of [A-Za-z0-9._-]) of
 * `step`: every file carries both; r->save lists the files written. With
 * `verify` each PS reads its files back (a folder the chief cannot see). */
int ps_client_save_ckpt(ps_client *c, const char *dir, const char *id,
                        int64_t step, bool verify, ps_client_cb cb,
                        void *data);
/* Restore refusing any file that is not of checkpoint `id` of `step` (id
 * NULL or "": any checkpoint); the consistency state starts a new era at
 * `step` as with ps_client_restore_step. */
int ps_client_restore_ckpt(ps_client *c, const char *dir, const char *id,
                           int64_t step, ps_client_cb cb, void *data);
/* r->stats points at the decoded StatsResponse during the callback. */
int ps_client_stats(ps_client *c, ps_client_cb cb, void *data);
/* Stats, and the apply events recorded since the last drain as
 * r->payload (the PS forgets them). */
int ps_client_stats_drain(ps_client *c, ps_client_cb cb, void *data);
/* Asks the PS to exit: with job_done (the chief ends a finished job) it
 * exits 0; without, a PS that holds variables exits non-zero, as a PS
 * leaving an unfinished job must (a supervisor starts it again). */
int ps_client_shutdown(ps_client *c, bool job_done, ps_client_cb cb,
                       void *data);

/* ---- the multi-PS client: tickets over a shard layout --------------------
 *
 * The shape of ps-lite's KVWorker. A ps_kv holds one connection per PS and
 * the layout of the variables (which rows of which variable live on which
 * PS). A caller describes a push, a pull or a fused push-pull over a set
 * of variables in one request struct; ps_kv_submit splits it into one call
 * per shard (a dense variable's slice, a sparse variable's run of sorted
 * ids), sends every call at once (shards on different PS move in
 * parallel) and returns a ticket; ps_kv_wait(ticket) blocks until every
 * call of the ticket has completed and reports the first failure, with a
 * message naming the PS, its address, the variable and the shard.
 *
 * Threads. ps_kv_new, ps_kv_cancel and ps_kv_close run on the RPC
 * context's loop thread; every other function may be called from any
 * thread, several at once (submissions from one thread go out in the order
 * they were made, per PS). Waiting blocks the caller, so the loop thread
 * never waits. Completions are recorded on the loop thread.
 *
 * Buffers. The request's buffers (gradients, ids, destinations) belong to
 * the caller and must stay valid until the ticket has been waited for:
 * float32 gradients are sent straight from them and float32 values read
 * straight into them. With the wire dtype PS_DT_BF16 the gradients are
 * converted at submission (their buffers are free again when submit
 * returns) and pulled values are converted into dst as they arrive; the
 * PS keeps and applies float32 either way.
 *
 * Connections. A lost connection is counted (ps_kv_losses); a request may
 * ask to fail at issue once any connection was lost after a count it
 * names (a closure computed against shards a restarted PS no longer
 * holds). With `hold` (ssp, sync: a PS may hold calls until the other
 * workers catch up), a connection lost while calls are in flight resets
 * every connection, so calls held on the other PS fail at once (TSR_ECLOSED
 * naming the lost PS) instead of waiting for a step that may never come.
 * A pull or push that fails on its own (refused by its PS, or not sent)
 * does the same, and counts as a loss: calls in flight are given up
 * naming that failure, calls checking losses fail at issue. With
 * `wait_lost` (async) a call to a PS that went away waits for it instead:
 * only the calls to that PS wait, and a closure goes on once the PS is
 * back and restored (a push in flight when it died is sent again to the
 * restored PS; one whose answer alone was lost, to a PS that did not
 * restart, is applied twice: at least once, as a closure run again).
 */
typedef struct ps_kv ps_kv;

/* A ticket: 0 is never one. */
typedef uint64_t ps_ticket;

/* Open tickets at once (submitted and not yet waited for). */
#define PS_KV_MAX_TICKETS 1024
/* Variables in a layout. */
#define PS_KV_MAX_VARS 4096

/* One variable of a layout: the variable (its name, kind, shape[0] and
 * row_dim are read; row-sparse: pushes and pulls name sorted ids) and its
 * shards (each one's ps, shard, row0 and rows are read), both copied at
 * configure; the shards sorted by row0, covering [0, shape[0]) without
 * gaps. */
typedef struct {
  const tsr_var *var;
  int n_shards;
  const tsr_shard *shards;
} ps_kv_var;

typedef struct {
  int worker;          /* the worker's id on the PS; -1 for readers */
  bool hold;           /* ssp/sync: reset every connection on a loss */
  bool wait_lost;      /* async (not with hold): a pull or push to a PS
                          that went away (its connection dropped, or it is
                          back without its variables yet) is sent again
                          every 100 ms until the call's deadline from its
                          first sending; the PS holds it until restored */
  ps_dtype wire;       /* PS_DT_F32 (default) or PS_DT_BF16 */
  uint32_t deadline_ms;/* of every call (0: the context's default) */
  const ps_kv_var *vars;
  int n_vars;
} ps_kv_config;

typedef enum {
  PS_KV_PUSH = 1,
  PS_KV_PULL = 2,
  PS_KV_PUSH_PULL = 3,  /* fused: the pull half sees this push */
} ps_kv_kind;

/* One variable of a request. Dense: grad and dst are the whole variable
 * (rows * row_dim floats). Sparse: ids sorted, strictly increasing, grad
 * holds n_ids rows in that order; pull_ids likewise with dst holding
 * n_pull rows. */
typedef struct {
  int var;             /* index into the layout */
  const float *grad;   /* push */
  const int64_t *ids;
  size_t n_ids;
  float *dst;          /* pull */
  const int64_t *pull_ids;
  size_t n_pull;
} ps_kv_item;

enum {
  /* fail every call at issue once a connection was lost after `losses`
   * (ps_kv_losses) */
  PS_KV_CHECK_LOSSES = 1u << 0,
  /* calls carry era 0 (not checked): plain reads that are no part of the
   * clock protocol (evaluation) */
  PS_KV_NO_ERA = 1u << 1,
};

typedef struct {
  ps_kv_kind kind;
  const ps_kv_item *items; /* copied */
  size_t n_items;
  int64_t step;        /* push: the step the gradients belong to */
  int64_t clock;       /* pull: the gate (see ps_client_pull); a fused
                          push-pull gates its pull at step + 1 */
  unsigned flags;      /* PS_KV_* */
  uint64_t losses;     /* with PS_KV_CHECK_LOSSES */
} ps_kv_request;

/* Outcome of a ticket. */
typedef struct {
  int rc;              /* 0 or the first failure */
  char err[512];       /* names the PS, its address, variable and shard */
  int64_t max_step;    /* largest shard step answered (-1: none) */
  int64_t min_step;    /* smallest (INT64_MAX: none) */
  int64_t min_clock;   /* clock tickets: the largest of the PS's answers
                          (-1: none) */
  int64_t submit_us;   /* tsr_trace_now_us() at submission */
  int64_t done_us;     /* when the last call completed */
  uint64_t bytes_out;  /* payload bytes sent, and received */
  uint64_t bytes_in;
} ps_kv_result;

/* Connects to the n PS at addrs (copied) through ctx. Loop thread. */
int ps_kv_new(ps_kv **out, tsr_rpc_ctx *ctx, char *const *addrs, int n);
/* Sets the worker id, the mode and the layout. Any thread, with no ticket
 * open (TSR_EBUSY otherwise). TSR_EINVAL names the bad variable or shard
 * in err. */
int ps_kv_configure(ps_kv *kv, const ps_kv_config *cfg, char *err,
                    size_t errlen);
const char *ps_kv_addr(const ps_kv *kv, int ps);
/* The per-PS client (loop thread), for the calls the layout does not
 * cover (create, stats). */
ps_client *ps_kv_client(ps_kv *kv, int ps);

/* Splits the request over the shards and sends it; *ticket to wait for.
 * TSR_EINVAL (a variable out of range, a missing buffer, ids not sorted),
 * TSR_EBUSY (PS_KV_MAX_TICKETS open), TSR_ESHUTDOWN (cancelled), with
 * nothing sent. */
int ps_kv_submit(ps_kv *kv, const ps_kv_request *q, ps_ticket *ticket);
/* Shorthands. */
int ps_kv_push(ps_kv *kv, const ps_kv_item *items, size_t n, int64_t step,
               ps_ticket *ticket);
int ps_kv_pull(ps_kv *kv, const ps_kv_item *items, size_t n, int64_t clock,
               ps_ticket *ticket);
int ps_kv_push_pull(ps_kv *kv, const ps_kv_item *items, size_t n,
                    int64_t step, ps_ticket *ticket);
/* A clock report (tick, join, leave) to every PS. */
int ps_kv_clock(ps_kv *kv, ps_clock_op op, int64_t clock, unsigned flags,
                uint64_t losses, ps_ticket *ticket);
/* JOIN on every PS (ssp, sync: the clock protocol, see ps_client_join):
 * this worker's `clock`, its run and closure, and the era each PS answered
 * last. Each PS's answer sets the era every later call to it carries;
 * result.min_clock is the largest clock answered. */
int ps_kv_join(ps_kv *kv, int64_t clock, uint64_t run, uint64_t closure,
               unsigned flags, uint64_t losses, ps_ticket *ticket);
/* Blocks until every call of the ticket has completed; fills *res (may be
 * NULL) and returns res->rc. The ticket is spent (TSR_EINVAL for one that
 * is not open). */
int ps_kv_wait(ps_kv *kv, ps_ticket ticket, ps_kv_result *res);
/* Whether the ticket has completed (it stays open). */
bool ps_kv_done(ps_kv *kv, ps_ticket ticket);

/* Connection losses so far, and the last one's text (msg may be NULL). */
uint64_t ps_kv_losses(ps_kv *kv, char *msg, size_t msglen);
/* wait_lost: calls sent again to a PS that went away, so far. */
uint64_t ps_kv_resent(ps_kv *kv);

/* Fails every call not yet completed with TSR_ESHUTDOWN and every later
 * submission at once; waiters wake. The struct stays valid. Loop thread. */
void ps_kv_cancel(ps_kv *kv);
/* Cancels, closes every connection and frees the client once all are
 * closed (`cb` then runs). No thread may use it from then on. Loop
 * thread. */
void ps_kv_close(ps_kv *kv, tsr_rpc_close_cb cb, void *data);

#endif
