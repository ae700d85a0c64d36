/* Internals of the parameter server, shared by its files and its unit
 * tests: the shard store (store.c, rows.c), the consistency state machine
 * (consist.c) and shard checkpoints (ckpt.c). None of these take locks:
 * the service (service.c) runs at most one writer per shard at a time and
 * never lets a reader overlap a writer, so each function here may assume
 * it has the shard to itself (or shares it only with other readers).
 */
#ifndef TSR_PS_INT_H
#define TSR_PS_INT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/ckpt/shardfile.h"
#include "common/job.h"
#include "common/rpc/rpc.h"
#include "kernels/init.h"
#include "kernels/optim.h"
#include "ps/wire/wire.h"


bool ps__spec_equal(const ps_var_spec *a, const ps_var_spec *b);
/* Every field of a spec, as a request or a file may carry it: names, shape
 * (each dim in [1, 2^62]), shard and row ranges, sizes of rows and of the
 * shard computed with checked arithmetic (so nothing later can overflow),
 * known initializer and optimizer kinds, finite hyper-parameters in their
 * ranges. TSR_EINVAL / TSR_ERANGE with err naming the variable, the field
 * and the value. */
int ps__spec_validate(const ps_var_spec *s, char *err, size_t errlen);
/* Whether a sparse id belongs to this shard; TSR_ERANGE when not (the
 * message names the id and the range). */
int ps__spec_owns_id(const ps_var_spec *s, int64_t id);

/* Memory budget shared by every shard of a PS. Reservations are atomic so
 * pool threads creating rows may charge it concurrently. `al` is the
 * server's allocation hook (ps_server_opts.allocator; NULL: malloc/free):
 * every allocation the service makes goes through ps__alloc and friends,
 * from the loop and from pool threads alike, so a test can fail each in
 * turn. */
typedef struct {
  _Atomic size_t used;
  size_t limit;
  const tsr_rpc_allocator *al;
} ps_mem;

int ps__mem_reserve(ps_mem *m, size_t bytes);
void ps__mem_release(ps_mem *m, size_t bytes);

/* Allocations through m's hook (m may be NULL: malloc). A size of 0 gets
 * a 1-byte block; ps__calloc gives at least one zeroed element (n = 0
 * too) and refuses (NULL) a product that overflows;
 * ps__realloc moves `old` bytes into the new block and frees the old one
 * only on success. Memory from these is freed with ps__free. */
void *ps__alloc(const ps_mem *m, size_t n);
void *ps__calloc(const ps_mem *m, size_t n, size_t size);
void *ps__realloc(const ps_mem *m, void *p, size_t old, size_t n);
void ps__free(const ps_mem *m, void *p);

/* Open-addressing table from int64 id to a row number, and the rows
 * themselves in fixed chunks (value then each slot, `stride` floats). */
typedef struct {
  int64_t *keys;       /* PS__EMPTY_ID marks a free bucket */
  uint32_t *vals;
  size_t cap, count;   /* cap a power of two */
  float **chunks;
  size_t n_chunks, chunk_cap;
  size_t stride;       /* floats per row record */
} ps_rows;

#define PS_ROWS_PER_CHUNK 1024

/* One shard of one variable. */
typedef struct ps_shard {
  ps_var_spec spec;
  int64_t width;
  size_t numel;          /* dense: rows * width */
  int nslots;
  float *w;              /* dense values */
  float *slots[KERN_OPTIM_MAX_SLOTS];
  ps_rows rows;          /* sparse */
  uint64_t version;      /* bumped by every apply and restore */
  int64_t step;          /* applies so far (Adam's t) */
  size_t mem_bytes;      /* charged to the budget */
  /* sync mode: the sum of this step's gradients */
  float *acc;            /* dense */
  ps_rows acc_rows;      /* sparse: id -> summed gradient row */
  int acc_count;         /* pushes summed so far */
  int64_t acc_step;      /* the step being summed */
  /* stats */
  uint64_t applies, apply_ns, nonfinite;
} ps_shard;

/* Creates a shard and fills it with the deterministic initializer.
 * TSR_EINVAL (err names the field) for a bad spec, TSR_EMEMLIMIT when the
 * budget would be exceeded, TSR_ENOMEM. */
int ps__shard_new(const ps_var_spec *spec, ps_mem *mem, ps_shard **out,
                  char *err, size_t errlen);
void ps__shard_free(ps_shard *s, ps_mem *mem);

/* Gradient as it arrived: `n` elements of `dtype` at `data` (any
 * alignment). ps__grad_to_f32 converts into `out` and reports whether
 * every value is finite (1) or not (0). */
int ps__grad_to_f32(const void *data, int dtype, size_t n, float *out);
/* Finite check of float32 data in place (aligned). */
int ps__all_finite(const float *p, size_t n);

/* Applies one dense gradient (float32, numel elements) with `scale`.
 * Bumps step and version. */
int ps__shard_apply_dense(ps_shard *s, const float *g, float scale);

/* Sparse apply: `n` ids and n*width float32 gradient values. Duplicate ids
 * are summed first (as TF's IndexedSlices). Rows missing are created with
 * the initializer. TSR_ERANGE for an id the shard does not own (nothing is
 * applied then), TSR_EMEMLIMIT when a new row does not fit. */
int ps__shard_apply_rows(ps_shard *s, ps_mem *mem, const int64_t *ids,
                         size_t n, const float *g, float scale, char *err,
                         size_t errlen);

/* Copies the rows for `ids` into out (n*width floats), creating missing
 * rows (create=true) or reading initializer values without storing them. */
int ps__shard_gather(ps_shard *s, ps_mem *mem, const int64_t *ids, size_t n,
                     float *out, bool create, char *err, size_t errlen);

/* Sync mode: adds a gradient to this step's sum. */
int ps__shard_accum_dense(ps_shard *s, ps_mem *mem, const float *g);
int ps__shard_accum_rows(ps_shard *s, ps_mem *mem, const int64_t *ids,
                         size_t n, const float *g, char *err, size_t errlen);
/* Drops the sum (a reset of the sync state). */
void ps__shard_accum_clear(ps_shard *s);
/* Applies the mean of the sum (divided by `workers`) and clears it; on
 * TSR_ENOMEM nothing is applied and the sum is kept for another try. */
int ps__shard_accum_apply(ps_shard *s, ps_mem *mem, int workers, char *err,
                          size_t errlen);

/* Row tables. */
int ps__rows_init(ps_rows *t, size_t stride);
void ps__rows_free(ps_rows *t, ps_mem *mem);
/* Row record for id, or NULL. */
float *ps__rows_find(const ps_rows *t, int64_t id);
/* Adds a zeroed record; *created = 1 when new. */
int ps__rows_insert(ps_rows *t, ps_mem *mem, int64_t id, float **rec,
                    int *created);
/* Calls fn for every row, in the table's order (the same for every walk
 * of an unchanged table); allocates nothing. */
void ps__rows_each(const ps_rows *t,
                   void (*fn)(void *ctx, int64_t id, const float *rec),
                   void *ctx);
/* Removes every row, keeping the table's memory. */
void ps__rows_clear(ps_rows *t);
size_t ps__rows_bytes(const ps_rows *t);

/* ---- consistency (consist.c) ------------------------------------------ */
/* The clock protocol of ssp:S and sync, written once as the Spin model
 * tests/model/clock.pml; the functions and fields below carry the model's
 * names (tests/model/README.md maps them). */

typedef enum { PS_MODE_ASYNC = 0, PS_MODE_SSP = 1, PS_MODE_SYNC = 2 } ps_mode;

typedef struct {
  int id;
  bool active;       /* a member: counts for the ssp gate and sync sums */
  int64_t clock;     /* ssp: steps finished; sync: the first step it owes */
  uint64_t closure;  /* the closure it joined for */
  uint64_t left;     /* closures up to this one are over (LEAVE): a JOIN
                        for one of them is refused */
} ps_worker_clock;

typedef struct {
  ps_mode mode;
  int staleness;
  uint64_t era;      /* drawn at random at start, +1 by every reset; calls
                        of another era are refused */
  uint64_t run;      /* the chief's run (0: none said: any run joins) */
  int64_t base;      /* the step of the last reset */
  ps_worker_clock *w;
  int n, cap;
  uint64_t epoch;    /* bumped on every change: waiters re-check */
} ps_consist;

/* What a JOIN says: the worker, its clock and the era it knows (its clock
 * counts only in that era), the run and closure it joins for. */
typedef struct {
  int worker;
  int64_t clock;
  uint64_t era;
  uint64_t run;
  uint64_t closure;
} ps_join_req;

/* era0: the first era (random; never 0). */
void ps__cons_init(ps_consist *c, uint64_t era0);
void ps__cons_free(ps_consist *c);
int ps__cons_set_mode(ps_consist *c, ps_mode mode, int staleness);
/* A new era at `step` for run `run`: every member forgotten (what closures
 * were over too, when the run changes). The service resets the sync
 * shards and refuses the calls of the old era. */
void ps__cons_reset(ps_consist *c, uint64_t run, int64_t step);
/* Calls of era `era` may go on (0: not checked). */
bool ps__cons_era_ok(const ps_consist *c, uint64_t era);
bool ps__cons_member(const ps_consist *c, int worker);
/* JOIN. *out is the clock the worker goes on from: sync: the step every
 * shard still sums with it (sync_next: the largest over the shards, from
 * the service); ssp: the slowest member's clock (it holds nobody back);
 * never below the reset's step, and its own clock when it knows this era
 * or is a member. TSR_ESTALE (msg filled) for another run or a closure
 * that is over. */
int ps__cons_join(ps_consist *c, const ps_join_req *q, int64_t sync_next,
                  int64_t *out, char *msg, size_t msglen);
/* LEAVE from the chief: closures up to `closure` of `worker` are over; a
 * member that joined for one of them stops counting. Another run's LEAVE
 * changes nothing. TSR_ENOTFOUND when it was no member. */
int ps__cons_leave(ps_consist *c, int worker, uint64_t run,
                   uint64_t closure);
/* TICK: a member's clock rises to `clock` (never moves back). TSR_ESTALE
 * for another era or a worker that is no member. */
int ps__cons_clock(ps_consist *c, int worker, int64_t clock, uint64_t era);
/* Slowest active clock; INT64_MAX when no worker is active. */
int64_t ps__cons_min_clock(const ps_consist *c);
int ps__cons_active(const ps_consist *c);
/* SSP/async/sync gate for a read by `worker` at clock c: true when it may
 * proceed (ssp: min clock >= c - S). */
bool ps__cons_may_read(const ps_consist *c, int64_t clock);
/* Sync: the step-t sum of a shard may be applied when no member owes it:
 * every member whose clock is <= t has pushed it (pushed(worker) true). */
bool ps__cons_sync_ready(const ps_consist *c, int64_t step,
                         bool (*pushed)(void *ctx, int worker), void *ctx);

/* ---- checkpoints (ckpt.c writes, ckpt_load.c reads) ---------------------- */
/* The file format, its writer and its checks are common/ckpt/shardfile.h;
 * what is here is the PS's side: which shard goes in a file, and which
 * files a shard is rebuilt from. */

#define PS_CKPT_ID_MAX TSR_SHARDFILE_ID_MAX /* longest checkpoint id */
_Static_assert(KERN_OPTIM_MAX_SLOTS <= TSR_SHARDFILE_MAX_SLOTS,
               "a shard file holds every optimizer slot");

/* Which checkpoint a file belongs to: the chief's id for it and its step. */
typedef struct {
  char id[PS_CKPT_ID_MAX + 1];  /* "" when none is given */
  int64_t step;
} ps_ckpt_ident;

/* A file written, as the manifest lists it. */
typedef tsr_shardfile_written ps_ckpt_file;

/* Writes one shard to dir (temp file, fsync, rename, fsync dir), tagged
 * with `who` (may be NULL: no id, step 0). `out` (may be NULL) gets the
 * file's name, size and CRC. `verify`: read the file back and check it. */
int ps__ckpt_save_shard(const ps_shard *s, const char *dir,
                        const ps_ckpt_ident *who, bool verify,
                        ps_ckpt_file *out, char *err, size_t errlen);
/* Builds the contents of `spec`'s shard from the saved parts of its
 * variable in dir that hold its rows, whatever sharding they were saved
 * under. Every part read is checked whole (tsr_shardfile_open): sizes,
 * both CRCs, the variable, its shape and kind, its place in the saved
 * layout (so parts never overlap and none is missing), its ids, and that
 * it belongs to checkpoint `want` (want->id "": the parts must agree on
 * one). On success *out is a new shard to swap in; on any error nothing. */
int ps__ckpt_load_shard(const ps_var_spec *spec, ps_mem *mem, const char *dir,
                        const ps_ckpt_ident *want, ps_shard **out, char *err,
                        size_t errlen);
/* File name of a shard part (without the folder). */
int ps__ckpt_file_name(const ps_var_spec *s, char *buf, size_t len);

#endif
