/* Internals of the parameter server, shared by its files and its unit
 * tests: the shard store (store.c, rows.c), the consistency state machine
 * (consist.c) and shard checkpoints (ckpt.c). None of these take locks
 * but the snapshots (snap.c): the service (service.c) runs at most one
 * writer per shard at a time and never lets a reader overlap a writer, so
 * each function here may assume it has the shard to itself (or shares it
 * only with other readers), except that a save reads a snapshot of it
 * while its writer goes on; the two meet under the snapshot's lock.
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
typedef struct ps_keep ps_keep;
typedef struct {
  _Atomic size_t used;
  size_t limit;
  const tsr_rpc_allocator *al;
  ps_keep *keep; /* blocks snapshots keep rows in (keep.c); NULL: none
                    kept, each allocated and freed */
} ps_mem;

/* Charges bytes to the budget; TSR_EMEMLIMIT when they do not fit even
 * after the blocks kept for snapshots (m->keep) are freed. */
int ps__mem_reserve(ps_mem *m, size_t bytes);
void ps__mem_release(ps_mem *m, size_t bytes);

/* ---- blocks for the rows snapshots keep (keep.c) ------------------------ */

#define PS_KEEP_CLASSES 32 /* block sizes kept; others are not */
typedef struct ps_keep_class ps_keep_class;
struct ps_keep {
  uv_mutex_t mu;
  bool ready;
  struct ps_keep_class {
    size_t bytes;
    void **free;
    size_t n_free, cap_free;
    size_t out, peak;
  } cls[PS_KEEP_CLASSES];
  size_t kept_bytes;     /* held here, charged, handed to nobody */
  _Atomic size_t fresh;  /* blocks allocated new (not from here) */
};
int ps__keep_init(ps_keep *k);
/* Frees every block kept (their charge to m released). */
void ps__keep_free(ps_keep *k, ps_mem *m);
/* A block of `bytes` (charged to m's budget): one kept, or a new one;
 * NULL with *rc TSR_EMEMLIMIT or TSR_ENOMEM. Thread-safe. */
void *ps__keep_get(ps_mem *m, size_t bytes, int *rc);
/* Gives a block from ps__keep_get back (NULL: nothing). */
void ps__keep_put(ps_mem *m, void *p, size_t bytes);
/* After a save: keeps per size as many blocks as were out at once since
 * the last trim, frees the rest. */
void ps__keep_trim(ps_mem *m);
/* Frees every block kept (not those handed out); the bytes freed. */
size_t ps__keep_drop_all(ps_mem *m);
/* Blocks allocated new so far, bytes kept now (tests, logs). */
void ps__keep_stats(ps_mem *m, size_t *fresh, size_t *kept_bytes);

/* Allocations through m's hook (m may be NULL: malloc). A size of 0 gets
 * a 1-byte block; ps__calloc gives at least one zeroed element (n = 0
 * too) and refuses (NULL) a product that overflows;
 * ps__realloc moves `old` bytes into the new block and frees the old one
 * only on success. Memory from these is freed with ps__free. */
void *ps__alloc(const ps_mem *m, size_t n);
void *ps__calloc(const ps_mem *m, size_t n, size_t size);
void *ps__realloc(const ps_mem *m, void *p, size_t old, size_t n);
void ps__free(const ps_mem *m, void *p);

/* Row tables (rows.c): rows created on first touch, found through an
 * open-addressing hash from id to row number, or (direct) a materialized
 * bounded table whose row r is id row0 + r. Records (value then each slot,
 * `stride` floats) lie in chunks of 2^shift rows that never move; a
 * hashed table keeps each row's id beside its record. Rows are numbered
 * in the order they were made (direct: by id). */
typedef struct {
  uint32_t tag;        /* the low 32 bits of the id's hash */
  uint32_t row;        /* UINT32_MAX: a free bucket */
} ps_bucket;

typedef struct {
  ps_bucket *bk;       /* hashed: the id -> row index */
  size_t cap;          /* buckets, a power of two */
  size_t count;        /* rows held (direct: every row of the range) */
  float **chunks;
  int64_t **idc;       /* hashed: row ids, chunk by chunk */
  size_t n_chunks, chunk_cap;
  size_t stride;       /* floats per row record */
  unsigned shift;      /* rows per chunk: 1 << shift */
  bool direct;
  int64_t row0;        /* direct: the id of row 0 */
  size_t direct_bytes; /* direct: bytes charged */
} ps_rows;

#define PS_ROWS_PER_CHUNK 1024

typedef struct ps_snap ps_snap;

/* Rows of a sparse shard changed since the last save's snapshot, and the
 * same for each of the last saves (dirty.c): what an incremental save
 * writes. One bit per row number. */
#define PS_DIRTY_HIST 8
#define PS_CKPT_ID_LEN 65
typedef struct {
  char id[PS_CKPT_ID_LEN]; /* the save whose snapshot took them */
  uint64_t *bits;          /* the rows changed between the save before it
                              and it (NULL: none, or not kept) */
  size_t words;
} ps_dirty_mark;

typedef struct {
  uint64_t *bits;          /* since the last save's snapshot */
  size_t words;
  bool lost;               /* a change could not be noted (no memory): no
                              increment reaches back before the next save */
  ps_dirty_mark hist[PS_DIRTY_HIST]; /* oldest first */
  int n_hist;
  size_t charged;
} ps_dirty;

/* One shard of one variable. */
typedef struct ps_shard {
  ps_var_spec spec;
  int64_t width;
  size_t numel;          /* dense: rows * width */
  int nslots;
  float *w;              /* dense values */
  float *slots[KERN_OPTIM_MAX_SLOTS];
  ps_rows rows;          /* sparse */
  ps_snap *snap;         /* a save's snapshot (snap.c), or NULL */
  size_t snap_hcap;      /* the index of kept rows its last one needed:
                            the next starts there, not at 1024 doubled */
  ps_snap *rsnap;        /* an evaluation's: read by pulls, or NULL */
  ps_dirty dirty;        /* sparse: rows changed since the saves (dirty.c) */
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

/* The same as an evaluation's snapshot v of s holds them (the caller is
 * one of s's readers); TSR_EMEMLIMIT when the snapshot was lost. */
int ps__shard_gather_snap(ps_shard *s, ps_snap *v, const int64_t *ids,
                          size_t n, float *out, char *err, size_t errlen);

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
/* A materialized table of `rows` rows from id row0: every record
 * allocated (contents undefined: the caller fills them), its bytes
 * (ps__rows_direct_bytes, SIZE_MAX when they overflow) charged first.
 * TSR_EMEMLIMIT (nothing allocated), TSR_ENOMEM, TSR_ERANGE. */
int ps__rows_init_direct(ps_rows *t, ps_mem *mem, size_t stride, int64_t row0,
                         size_t rows);
size_t ps__rows_direct_bytes(size_t stride, size_t rows);
void ps__rows_free(ps_rows *t, ps_mem *mem);
/* Row record for id, or NULL; _r also gives its row number. */
float *ps__rows_find(const ps_rows *t, int64_t id);
float *ps__rows_find_r(const ps_rows *t, int64_t id, size_t *r);
/* Adds a zeroed record; *created = 1 when new. A direct table holds every
 * row of its range (TSR_ERANGE outside it). */
int ps__rows_insert(ps_rows *t, ps_mem *mem, int64_t id, float **rec,
                    int *created);
int ps__rows_insert_r(ps_rows *t, ps_mem *mem, int64_t id, float **rec,
                      size_t *r, int *created);
/* Row r's record and id (r < count). */
float *ps__rows_rec(const ps_rows *t, size_t r);
int64_t ps__rows_id(const ps_rows *t, size_t r);
/* Calls fn for every row, in row order; allocates nothing. */
void ps__rows_each(const ps_rows *t,
                   void (*fn)(void *ctx, int64_t id, const float *rec),
                   void *ctx);
/* Removes every row, keeping the table's memory (a direct table keeps its
 * rows). */
void ps__rows_clear(ps_rows *t);
size_t ps__rows_bytes(const ps_rows *t);

/* ---- rows changed since a save (dirty.c) ---------------------------------
 * Only the shard's writer (or the loop with no writer running) calls
 * these. */

/* Row r of sparse shard s is about to change. Never fails: a note that
 * does not fit the budget marks the changes lost (the next save of s is
 * whole). */
void ps__dirty_note(ps_shard *s, ps_mem *mem, size_t r);
/* At the snapshot of save `save_id`: the rows changed since the last
 * save become that save's mark. With `since_id` ("": a whole save), the
 * rows changed since save since_id (every mark after it) go to *sel
 * (words of bits over the rows, owned by the caller, its bytes charged
 * and returned in *sel_bytes) and 1 is returned; 0 when the shard must be
 * saved whole (since_id unknown here, or changes lost since), a negative
 * code when the map cannot be had (memory). */
int ps__dirty_capture(ps_shard *s, ps_mem *mem, const char *save_id,
                      const char *since_id, uint64_t **sel, size_t *words,
                      size_t *sel_bytes);
/* s holds checkpoint `id` exactly (a restore): increments may build on
 * it. */
void ps__dirty_restored(ps_shard *s, ps_mem *mem, const char *id);
void ps__dirty_free(ps_dirty *d, ps_mem *mem);

/* ---- snapshots (snap.c) --------------------------------------------------
 * A shard as it was at one moment, read while its writer goes on: the
 * writer keeps the old record of each row before its first change. */

/* What a snapshot holds, as at the moment it was taken. */
typedef struct {
  ps_var_spec spec;
  int64_t width;
  int nslots;
  bool sparse;
  size_t n_rows;      /* sparse: rows held (selected); dense: its rows */
  bool increment;     /* only the rows changed since a save (selected) */
  uint64_t id;        /* an evaluation's snapshot: the id pulls name */
  int64_t step;
  uint64_t version;
} ps_snap_info;

/* Takes a snapshot of s while no apply runs. Unattached, s must not
 * change while it is read; ps__snap_attach makes s's writers keep rows for
 * it (s->snap; one its reader has let go is dropped first; TSR_EBUSY when
 * one is still being read). TSR_EMEMLIMIT /
 * TSR_ENOMEM with err naming the shard. */
int ps__snap_take(const ps_shard *s, ps_mem *mem, ps_snap **out, char *err,
                  size_t errlen);
int ps__snap_attach(ps_shard *s, ps_snap *v, char *err, size_t errlen);
const ps_snap_info *ps__snap_info(const ps_snap *v);
/* Writers: before changing row r of a sparse shard (r any row number), or
 * any value of a dense one: for each snapshot attached (a save's, an
 * evaluation's). Never wait for the reader beyond one copy. */
void ps__snap_touch_row(ps_shard *s, size_t r);
void ps__snap_touch_dense(ps_shard *s);
/* Only the rows whose bits are set in `sel` (words of bits, owned and
 * freed by the snapshot, `bytes` charged to its budget) are in the view,
 * in row order: info.n_rows becomes their count, and reads number them
 * 0.. in that order (an increment). Before any read. */
void ps__snap_select(ps_snap *v, uint64_t *sel, size_t words, size_t bytes);
/* The reader (any thread): rows [r0, r0+n) as records of
 * width * (1 + nslots) floats (value, then each slot), and their ids
 * (sparse; ids may be NULL). A sparse view's rows are read once each, in
 * order: the writers keep no row below the last one read, and a row read
 * again is refused (TSR_EINVAL). Fails (err names the shard) when the view
 * was lost for want of memory. */
int ps__snap_read(ps_snap *v, size_t r0, size_t n, float *recs, int64_t *ids,
                  char *err, size_t errlen);
/* Where ps__snap_read_to puts rows: part k (the value, then each slot)
 * of row i at sec[k] + i * step, its id at ids + i * 8 (ids NULL: none);
 * any alignment (stored with memcpy). A checkpoint file's staged
 * sections take the rows this way, with no copy of the records between. */
typedef struct {
  unsigned char *sec[1 + KERN_OPTIM_MAX_SLOTS];
  size_t step;
  unsigned char *ids;
} ps_snap_dst;
/* ps__snap_read into the places d names. */
int ps__snap_read_to(ps_snap *v, size_t r0, size_t n, const ps_snap_dst *d,
                     char *err, size_t errlen);
/* The reader is done: writers keep nothing more, the kept rows go. */
void ps__snap_release(ps_snap *v);
/* Whether the reader has released it and will not touch it again (it
 * may be dropped, its shard freed). */
bool ps__snap_let_go(const ps_snap *v);
/* A shard's reader (no writer running) reading an evaluation's snapshot
 * v: row r's record as the snapshot holds it (`live`: the table's record
 * now; NULL: the row was made after it), a dense shard's values. */
const float *ps__snap_row(ps_snap *v, size_t r, const float *live);
const float *ps__snap_dense(ps_snap *v);
void ps__snap_set_id(ps_snap *v, uint64_t id);
/* Whether a kept row did not fit the budget (the view is lost). */
bool ps__snap_lost(ps_snap *v);
/* Detaches and frees s's snapshot (no writer running). */
void ps__snap_drop(ps_shard *s);
/* Frees a snapshot that is not attached. */
void ps__snap_free(ps_snap *v);

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

/* Writes one shard as a snapshot holds it to dir (temp file, fsync,
 * rename, fsync dir), tagged with `who` (may be NULL: no id, step 0).
 * `out` (may be NULL) gets the file's name, size and CRC. `verify`: read
 * the file back and check it. */
int ps__ckpt_save_snap(ps_snap *v, const char *dir, const ps_ckpt_ident *who,
                       tsr_shardfile_stage *stage, bool verify,
                       ps_ckpt_file *out, char *err, size_t errlen);
/* The same for a shard nobody changes meanwhile (a snapshot of it is
 * taken and dropped around the write, outside any budget). */
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
/* The same over a chain: dirs[0] holds a whole checkpoint, each later
 * folder an increment over the one before (its sparse parts hold the rows
 * changed since, its dense parts the whole shard), want[i] the checkpoint
 * each must be. A part missing from any of them is named. */
int ps__ckpt_load_chain(const ps_var_spec *spec, ps_mem *mem,
                        const char *const *dirs, const ps_ckpt_ident *want,
                        size_t n, ps_shard **out, char *err, size_t errlen);
/* File name of a shard part (without the folder). */
int ps__ckpt_file_name(const ps_var_spec *s, char *buf, size_t len);

#endif
