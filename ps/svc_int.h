/* Internals of the PS service shared by service.c (the per-shard queues,
 * the pool's work and its completion, pull answers), gate.c (consistency
 * gates, sync applies, resets), data.c (the pull and push methods) and
 * admin.c (create, clocks, config, checkpoints, stats, shutdown), and by
 * spec.c (VarSpec <-> ps_var_spec).
 *
 * Per shard, on the loop thread only: a FIFO of operations, a count of
 * readers (pulls whose bytes are being written straight from the shard,
 * saves, gathers) and a writing flag (one apply, create or swap at a time).
 * A write starts only with no reader and no writer; a read starts with no
 * writer. Operations whose consistency condition does not hold yet (ssp,
 * sync) wait on the server's list and are queued when it does.
 */
#ifndef TSR_PS_SVC_INT_H
#define TSR_PS_SVC_INT_H

#include <uv.h>

#include "ps/ps.h"
#include "ps/ps_int.h"
#include "ps.pb-c.h"

#define PS_PATH_MAX 4096
#define PS_CHAIN_MAX 64   /* checkpoints an increment may build on */

typedef struct ps_op ps_op;
typedef struct ps_entry ps_entry;

typedef enum {
  PS_OP_PULL = 0,   /* read, on the loop, bytes straight from the shard */
  PS_OP_PULL_ROWS,  /* read, gather on the pool */
  PS_OP_PUSH,       /* write on the pool (apply, or sum in sync mode) */
  PS_OP_SYNC_APPLY, /* write on the pool: the mean of a sync step */
  PS_OP_SYNC_CLEAR, /* write on the pool: drop a sum (a reset) */
  PS_OP_CREATE,     /* write on the pool: allocate and initialise */
  PS_OP_SWAP,       /* write on the loop: install a restored shard (waits
                       while a snapshot of the old one is being read) */
  PS_OP_SNAP,       /* write on the loop: a snapshot for a save */
  PS_OP_UNSNAP,     /* write on the loop: drop the save's snapshot */
  PS_OP_RSNAP,      /* write on the loop: an evaluation's snapshot */
  PS_OP_RUNSNAP     /* write on the loop: drop it */
} ps_op_kind;

/* A call answered once several shards are done (create, save, restore). */
typedef struct {
  tsr_rpc_incoming *call;
  int method;
  int pending;
  int rc;
  char err[512];
  int count;
  uint64_t bytes;
  size_t n;
  ps_entry **ents;     /* restore: the shards, and what was loaded */
  ps_shard **loaded;
  bool *created;       /* create: per requested spec */
  char dir[PS_PATH_MAX];
  ps_ckpt_ident who;   /* save: the files' checkpoint; restore: the one
                          asked for (id "": any, the files must agree),
                          and who.step the step the new era starts at */
  bool verify;         /* save: read every file back */
  ps_ckpt_file *files; /* save: what was written */
  size_t n_files;
  /* save (save.c): the snapshots, one per entry, then their writing on
   * the pool; a background save answers its call after the snapshots and
   * keeps its result for SaveWait */
  ps_snap **snaps;
  char since[PS_CKPT_ID_MAX + 1]; /* save: an increment since this save */
  bool incremental;    /* save: some shard was saved as an increment */
  double write_s, write_cpu_s; /* save: the writing job's wall and CPU
                                  seconds (its own thread's) */
  char (*chain)[PS_PATH_MAX];     /* restore: the folders dir builds on */
  ps_ckpt_ident *chain_who;
  size_t n_chain;
  ps_server *srv;
  char gate[PS_PATH_MAX]; /* the test hook's file ("" none) */
  bool background;
  int phase;           /* 0 snapshots, 1 writing, 2 written (or failed) */
  uv_work_t work;
  tsr_rpc_incoming **waiters;
  size_t n_waiters, cap_waiters;
} ps_batch;

struct ps_op {
  ps_op *next;
  ps_op_kind kind;
  ps_server *srv;
  ps_entry *e;
  tsr_rpc_incoming *call;   /* NULL for internal ops */
  ps_batch *batch;
  uv_work_t work;
  int method;
  /* pull / push */
  int worker;
  int64_t clock;            /* pulls: gate; fused: pull_clock */
  uint64_t era;             /* the era the caller joined in (0: none);
                               sync apply: the era it was queued in */
  int64_t step;             /* push: sync step */
  int dtype;
  int pull_dtype;           /* of the answered values (PS_DT_F32, _BF16) */
  size_t n_ids, n_pull;
  const uint8_t *payload;
  size_t payload_len;
  bool fused;
  bool sync;
  bool allow_nonfinite;     /* as configured when the push arrived */
  /* results */
  int rc;
  char err[384];
  float *out;               /* gathered rows */
  size_t out_len;
  size_t reserved;          /* bytes of the memory budget this op holds for
                               its answer (rows, a bfloat16 copy, ids
                               copied for alignment); released when freed */
  int64_t *ids_copy;
  ps_shard *loaded;         /* swap */
  size_t idx;               /* snap: the entry's place in its batch */
  uint64_t snapshot;        /* pull: read this evaluation snapshot (0: the
                               live values); rsnap: its id */
  uint64_t version;
  int64_t shard_step;
};

struct ps_entry {
  ps_var_spec spec;
  ps_shard *sh;             /* NULL while being created */
  int64_t width;
  size_t numel;
  int readers;
  bool writing;
  ps_op *head, *tail;
  /* sync mode */
  int64_t sync_done;        /* steps applied */
  int64_t sync_target;      /* sync_done once the queued apply is done */
  bool sync_queued;
  bool sync_retry;          /* its apply ran out of memory: the timer
                               queues it again */
  int *pushed;
  int n_pushed, cap_pushed;
  /* writer-only conversion buffer (charged to the memory budget) */
  float *scratch;
  size_t scratch_cap;
  /* mirrors for stats, updated on the loop after every write, so stats
   * never wait for (or race with) a running writer */
  uint64_t version;
  int64_t step;
  uint64_t applies, apply_ns;
};

struct ps_server {
  uv_loop_t *loop;
  tsr_rpc_ctx *ctx;
  tsr_rpc_server *rpc;
  ps_server_opts opts;
  bool allow_nonfinite;
  ps_mem mem;
  char ckpt_root[PS_PATH_MAX]; /* Save/Restore only under it ("" none yet) */
  bool root_fixed;          /* given at start: configure does not move it */
  size_t max_answer;        /* largest payload an answer may carry (the
                               context's max_payload_bytes) */
  ps_consist cons;
  bool await_restore;       /* config said a restore follows: pulls and
                               pushes wait in the gate until it swapped in */
  ps_entry **ents;
  int n_ents, cap_ents;
  ps_op *waiting;
  bool waking;              /* ps__wake running: a nested call repeats it */
  bool cons_changed;        /* an ssp clock moved while admitting */
  int works;
  uv_timer_t timer;
  uv_idle_t idle;           /* runs the small ops (ps__start) on the loop */
  ps_op *inl_head, *inl_tail; /* those waiting for it, oldest first */
  bool closing, rpc_closed, timer_closed;
  uint64_t nonfinite;
  bool job_done;            /* the chief's shutdown said the job is done */
  ps_batch *save;           /* the save being written, or the last
                               background one (its result for SaveWait) */
  ps_keep keep;             /* blocks snapshots keep rows in, kept warm
                               from one checkpoint to the next (keep.c);
                               mem.keep points here */
  tsr_shardfile_stage *ckpt_stage; /* save.c: the files' write buffers,
                               kept warm from save to save (the writing
                               job alone uses them, one save at a time) */
  uint64_t rsnap_id;        /* the evaluation snapshot held (0: none) */
  uint64_t rsnap_until;     /* dropped then (uv_now, ms) */
  int64_t max_read_lead;    /* ssp: largest clock - slowest clock of a read
                               let through (<= staleness) */
  struct tsr_trace *trace;  /* applies as trace events, when asked (config) */
  int32_t trace_pid;        /* their track (config_trace) */
  void (*close_cb)(void *data);
  void *close_data;
};

/* service.c */
ps_entry *ps__find(ps_server *s, const char *name, int shard);
void ps__enqueue(ps_server *s, ps_op *op, bool front);
void ps__dispatch(ps_server *s, ps_entry *e);
/* Answers a dense pull from the shard's memory (or a bfloat16 copy); the
 * op is the answer's from then on (freed when written, or on failure). */
void ps__answer_dense(ps_server *s, ps_op *op);
void ps__op_fail(ps_server *s, ps_op *op, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void ps__batch_done(ps_server *s, ps_batch *b);
void ps__entry_free(ps_entry *e, ps_mem *mem);
void ps__reply_msg(ps_server *s, tsr_rpc_incoming *call,
                   const ProtobufCMessage *m);
void ps__maybe_finish(ps_server *s);

/* gate.c */
/* Sends a push (or any op) on its way: queued now, held until its
 * consistency condition holds, or refused (answered). */
void ps__admit(ps_server *s, ps_op *op, bool front);
/* The same for a pull; a dense pull that may go is answered at once. */
void ps__pull_ready(ps_server *s, ps_op *op, bool front);
/* Re-checks every held call (until no ssp clock moves). */
void ps__wake(ps_server *s);
/* Sync: queues the apply of every shard whose step no member owes. */
void ps__sync_check(ps_server *s);
/* A new consistency era at `step` (config, restore): members forgotten,
 * every sync shard at `step`, held calls of the old era refused. */
void ps__reset(ps_server *s, uint64_t run, int64_t step);
/* A restore swapped its shards in (queued, so every call let through now
 * comes after them): the pulls and pushes held for it go on. */
void ps__restored(ps_server *s);
/* Sync: the step a joining worker owes next, over every shard. */
int64_t ps__sync_next(ps_server *s, int worker);
/* The furthest shard's applied steps (sync), for stats. */
int64_t ps__sync_step(const ps_server *s);
/* Every 200 ms: sync applies to try again, held calls to re-check. */
void ps__timer_cb(uv_timer_t *t);

/* data.c */
int ps__register_data(ps_server *s);

/* admin.c */
/* The folder (under the checkpoint root), checkpoint id and step of a
 * save or restore: 0 with `path` set, or the call answered with the
 * error. */
int ps__ckpt_request(ps_server *s, tsr_rpc_incoming *call, const char *what,
                     const char *dir, const char *id, int64_t step,
                     char *path, size_t pathlen);
ps_batch *ps__batch_new(ps_server *s, tsr_rpc_incoming *call, size_t n);
/* A batch of n shards for the save or restore of checkpoint (id, step)
 * in `path` (ps__ckpt_request's); NULL with the call answered when out of
 * memory. */
ps_batch *ps__ckpt_batch(ps_server *s, tsr_rpc_incoming *call, size_t n,
                         const char *path, const char *id, int64_t step);
void ps__batch_free(ps_server *s, ps_batch *b);
ps_op *ps__batch_op(ps_server *s, ps_batch *b, ps_entry *e, ps_op_kind k);
/* One op of kind k for each of the server's entries, in their order
 * (b->ents holds them), each with its place in the batch (idx) and
 * `snapshot`, queued behind what its entry has queued. Out of memory
 * stops there, b->rc and b->err ("WHAT: out of memory") saying so; b
 * needs room for n_ents entries. */
void ps__batch_each_entry(ps_server *s, ps_batch *b, ps_op_kind k,
                          uint64_t snapshot, const char *what);
int ps__register_admin(ps_server *s);
void ps__admin_work(ps_server *s, ps_op *op);
void ps__admin_after(ps_server *s, ps_op *op);
/* Answers a batch once its last shard is done, and frees it. */
void ps__batch_finish(ps_server *s, ps_batch *b);

/* save.c */
void ps__on_save(tsr_rpc_incoming *call, void *data);
void ps__on_save_wait(tsr_rpc_incoming *call, void *data);
/* Every shard of a save snapshotted (or one failed): the writing starts
 * on the pool (a background save answers now), or the save fails whole
 * and its snapshots go. */
void ps__save_snapped(ps_server *s, ps_batch *b);
/* SNAP and UNSNAP, on the loop with no writer running. */
void ps__save_op(ps_server *s, ps_op *op);
/* At close: the last save's result and its waiters (answered
 * TSR_ESHUTDOWN). */
void ps__save_close(ps_server *s);
/* rsnap.c */
void ps__on_snapshot(tsr_rpc_incoming *call, void *data);
/* RSNAP and RUNSNAP, on the loop with no writer running. */
void ps__rsnap_op(ps_server *s, ps_op *op);
/* Every shard made its evaluation snapshot (or one failed). */
void ps__snapshot_taken(ps_server *s, ps_batch *b);
/* The timer: an evaluation snapshot past its time is dropped. */
void ps__snapshot_tick(ps_server *s);
/* The evaluation snapshot `id` of e's shard, for one of its readers
 * (NULL: none such: released, replaced, or never taken here). */
ps_snap *ps__snapshot_of(ps_entry *e, uint64_t id);

/* ckroot.c */
/* Sets the checkpoint root (normalized to an absolute path) when there is
 * none yet. Once set it stays: the same root again is fine, another one is
 * logged and ignored when the root was given at start (fixed; the chief's
 * path for the folder may differ) and refused with TSR_EEXISTS when it
 * came from a configure. TSR_EINVAL for "" or "/". */
int ps__root_set(ps_server *s, const char *root, bool fixed);
/* The path of a Save/Restore folder `dir` (relative to the root, or
 * absolute inside it) into out; refuses anything that is not under the
 * root (err names `what`, the path and the root). */
int ps__root_resolve(const ps_server *s, const char *what, const char *dir,
                     char *out, size_t len, char *err, size_t errlen);
/* A file a request names (Create's init_path), confined like a folder
 * (ps__root_resolve) and then required to be a regular file; `path` (len
 * bytes) is replaced by its real path. Refusals of a path outside the
 * root never say whether it exists. */
int ps__root_file(const ps_server *s, const char *what, char *path,
                  size_t len, char *err, size_t errlen);

/* spec.c */
int ps__spec_from_proto(const Tessera__Ps__VarSpec *v, ps_var_spec *out,
                        char *err, size_t errlen);
int ps__mode_parse(const char *s, ps_mode *mode, int *staleness);

#endif
