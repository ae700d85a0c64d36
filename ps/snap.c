/* Snapshots of a shard that applies do not wait for: what a checkpoint
 * writes while training goes on.
 *
 * Why copy-on-write per row. A checkpoint must hold each shard as it was
 * at one moment, and writing a materialized billion-parameter model takes
 * seconds per PS; applies that waited for it stopped the whole cluster.
 * Copying the shard first doubles the memory the model needs. fork() would
 * copy it lazily, but by 4 KiB page (2 MiB with transparent huge pages):
 * sparse pushes land on random rows, so within a few steps nearly every
 * page of a table is copied, the same double memory; and a fork of a
 * multithreaded process gets only the forking thread, with whatever locks
 * libuv's pool threads and the allocator held at that instant, and pool
 * threads caught halfway through an apply. Here the writer of a shard
 * (one at a time, the service's rule) keeps a row's record as it was
 * before its first change after the snapshot; the reader takes the kept
 * record where there is one and the live one elsewhere. The extra memory
 * is the rows changed while the checkpoint is written, at 4 bytes per
 * float: a few percent of a table for a sparse model.
 *
 * Happy path. ps__snap_take runs while nobody writes the shard (the
 * service queues it as a write): it notes the rows the view holds (rows
 * created later are not in it), a copy of the chunk pointers (the table's
 * own arrays may move as it grows), the step and version, and an empty
 * bitmap of kept rows. A sparse writer calls ps__snap_touch_row before it
 * changes a row (a bit test when the row is already kept or the view is
 * done); a dense writer calls ps__snap_touch_dense, which copies the
 * whole shard on its first apply. The reader copies rows out with
 * ps__snap_read, in row order, once each; it says it is done with
 * ps__snap_release, and from then on the writers keep nothing.
 * ps__snap_drop detaches the view (again with nobody writing).
 *
 * What is kept, and who waits. A row the reader has copied out already
 * (below its published place, `upto`) is not kept: the writer changes it
 * at once. An increment's view keeps only the rows it selected. So a
 * checkpoint keeps the rows changed ahead of its reader, not every row
 * changed while it is written. The reader copies the table's records
 * without the lock, then, under the lock, copies the kept record over
 * each row of the piece a writer kept meanwhile, and publishes its new
 * place: a writer that kept a row before that lock is seen there; one
 * that comes after changes the row only after the reader's copy (the
 * lock orders them), or finds it below `upto`. Writers wait on the lock
 * only for that scan of a piece's bits, not for its copy; the records
 * kept are freed (and the allocator's free pages returned) when the
 * reader releases the view.
 * Failure modes: a kept row or a dense copy that does not fit the memory
 * budget: the view is lost (the writer goes on, nothing waits) and the
 * reader's next read fails with TSR_EMEMLIMIT naming the shard and the
 * budget, so the checkpoint fails and training is untouched.
 */
#include "ps/ps_int.h"
#include "common/err.h"
#include "common/size.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#define SNAP_SIDE_CHUNK 1024 /* kept records per side allocation */

struct ps_snap {
  uv_mutex_t mu;
  ps_mem *mem;
  _Atomic int released;   /* the reader is done, or the view is lost */
  _Atomic int let_go;     /* the reader will not touch it again */
  _Atomic size_t upto;    /* rows below it are copied out by the reader:
                             writers keep none of them */
  int err;                /* why it was lost (0: it was not) */
  size_t err_bytes;       /* the reservation that failed */
  ps_snap_info info;
  /* sparse */
  size_t stride;
  unsigned shift;
  bool direct;
  int64_t row0;
  float **chunks;         /* the table's chunks, as at the snapshot */
  int64_t **idc;
  size_t n_chunks;
  /* dense */
  const float *w;
  const float *slots[KERN_OPTIM_MAX_SLOTS];
  size_t numel;
  float *dense_copy;      /* value then each slot, numel floats each */
  bool dense_kept;        /* the writer made it (its own flag: the fast
                             path reads it without the lock) */
  /* rows kept as they were: bit r of kept; their records in side chunks,
   * found by an open-addressing table from r + 1 (0: free) */
  uint64_t *kept;
  size_t kept_words;
  float **side;
  size_t n_side, side_cap, n_kept;
  uint64_t *hkey;
  uint32_t *hval;
  size_t hcap;
  size_t hcap_first;      /* where the index starts (the shard's last) */
  size_t hcap_peak;       /* the most it reached, kept for the shard */
  size_t charged;         /* bytes of the budget this view holds */
  /* an increment: only these rows, in order; the reader's place in them
   * (the cur_k-th selected row is row cur_r) */
  uint64_t *sel;
  size_t sel_words;
  size_t cur_k, cur_r;
  size_t n_all;           /* the rows of the table at the snapshot */
};

static bool snap_charge(ps_snap *v, size_t bytes) {
  if (ps__mem_reserve(v->mem, bytes)) {
    v->err = TSR_EMEMLIMIT;
    v->err_bytes = bytes;
    return false;
  }
  v->charged += bytes;
  return true;
}

/* Bytes of one block of kept records. */
static size_t side_bytes(const ps_snap *v) {
  return SNAP_SIDE_CHUNK * v->stride * sizeof(float);
}

/* The blocks of kept records and the index go back to the PS's blocks
 * kept for the next view (keep.c); they stay charged there. */
static void snap_free_side(ps_snap *v) {
  for (size_t i = 0; i < v->n_side; i++)
    ps__keep_put(v->mem, v->side[i], side_bytes(v));
  ps__free(v->mem, v->side);
  ps__keep_put(v->mem, v->hkey, v->hcap * sizeof *v->hkey);
  ps__keep_put(v->mem, v->hval, v->hcap * sizeof *v->hval);
  ps__free(v->mem, v->dense_copy);
  v->side = NULL;
  v->hkey = NULL;
  v->hval = NULL;
  v->dense_copy = NULL;
  v->n_side = v->side_cap = v->hcap = v->n_kept = 0;
}

int ps__snap_take(const ps_shard *s, ps_mem *mem, ps_snap **out, char *err,
                  size_t errlen) {
  *out = NULL;
  ps_snap *v = ps__calloc(mem, 1, sizeof *v);
  if (v && uv_mutex_init(&v->mu)) {
    ps__free(mem, v);
    v = NULL;
  }
  if (!v)
    return tsr_errf(err, errlen, TSR_ENOMEM, "%s shard %d: out of memory for "
                    "a snapshot", s->spec.var.name, s->spec.shard.shard);
  v->mem = mem;
  v->info.spec = s->spec;
  v->info.width = s->width;
  v->info.nslots = s->nslots;
  v->info.step = s->step;
  v->info.version = s->version;
  v->info.sparse = ps_var_spec_sparse(&s->spec);
  v->hcap_first = s->snap_hcap > 1024 ? s->snap_hcap : 1024;
  size_t words = 0;
  if (v->info.sparse) {
    const ps_rows *t = &s->rows;
    v->info.n_rows = t->count;
    v->n_all = t->count;
    v->stride = t->stride;
    v->shift = t->shift;
    v->direct = t->direct;
    v->row0 = t->row0;
    size_t per = (size_t)1 << t->shift;
    v->n_chunks = (t->count + per - 1) / per;
    v->chunks = ps__calloc(mem, v->n_chunks, sizeof *v->chunks);
    v->idc = t->direct ? NULL : ps__calloc(mem, v->n_chunks, sizeof *v->idc);
    if (!v->chunks || (!t->direct && !v->idc)) goto nomem;
    for (size_t k = 0; k < v->n_chunks; k++) {
      v->chunks[k] = t->chunks[k];
      if (v->idc) v->idc[k] = t->idc[k];
    }
    words = (t->count + 63) / 64;
  } else {
    v->info.n_rows = (size_t)s->spec.shard.rows;
    v->stride = (size_t)s->width * (size_t)(1 + s->nslots);
    v->w = s->w;
    for (int k = 0; k < s->nslots; k++) v->slots[k] = s->slots[k];
    v->numel = s->numel;
  }
  if (words) {
    if (!snap_charge(v, words * sizeof(uint64_t))) {
      int rc = tsr_errf(err, errlen, TSR_EMEMLIMIT, "%s shard %d: the "
                        "snapshot's map of %zu rows (%zu bytes) would exceed "
                        "the memory limit (%zu of %zu bytes in use)",
                        s->spec.var.name, s->spec.shard.shard,
                        v->info.n_rows, words * sizeof(uint64_t),
                        atomic_load(&mem->used), mem->limit);
      ps__snap_free(v);
      return rc;
    }
    if (!(v->kept = ps__calloc(mem, words, sizeof *v->kept))) goto nomem;
    v->kept_words = words;
  }
  *out = v;
  return 0;
nomem:
  ps__snap_free(v);
  return tsr_errf(err, errlen, TSR_ENOMEM, "%s shard %d: out of memory for a "
                  "snapshot", s->spec.var.name, s->spec.shard.shard);
}

bool ps__snap_let_go(const ps_snap *v) {
  return atomic_load(&((ps_snap *)v)->let_go) != 0;
}

int ps__snap_attach(ps_shard *s, ps_snap *v, char *err, size_t errlen) {
  if (s->snap && ps__snap_let_go(s->snap)) ps__snap_drop(s); /* done */
  if (s->snap)
    return tsr_errf(err, errlen, TSR_EBUSY, "%s shard %d: a snapshot of it "
                    "is still being read", s->spec.var.name,
                    s->spec.shard.shard);
  s->snap = v;
  return 0;
}

const ps_snap_info *ps__snap_info(const ps_snap *v) { return &v->info; }

/* The first selected row at or after r (SIZE_MAX: none). */
static size_t snap_sel_next(const ps_snap *v, size_t r) {
  size_t w = r >> 6;
  if (w >= v->sel_words || r >= v->n_all) return SIZE_MAX;
  uint64_t bits = v->sel[w] & (~(uint64_t)0 << (r & 63));
  while (!bits) {
    if (++w >= v->sel_words) return SIZE_MAX;
    bits = v->sel[w];
  }
  size_t q = w * 64 + (size_t)__builtin_ctzll(bits);
  return q < v->n_all ? q : SIZE_MAX;
}

void ps__snap_select(ps_snap *v, uint64_t *sel, size_t words, size_t bytes) {
  v->sel = sel;
  v->sel_words = words;
  v->charged += bytes;
  size_t n = 0;
  for (size_t w = 0; w < words; w++) n += (size_t)__builtin_popcountll(sel[w]);
  /* bits past the table's rows are none of its rows */
  for (size_t r = v->n_all; r < words * 64; r++)
    if (sel[r >> 6] >> (r & 63) & 1) n--;
  v->info.n_rows = n;
  v->info.increment = true;
  v->cur_k = 0;
  v->cur_r = snap_sel_next(v, 0);
}

void ps__snap_free(ps_snap *v) {
  if (!v) return;
  snap_free_side(v);
  ps__free(v->mem, v->sel);
  ps__free(v->mem, v->kept);
  ps__free(v->mem, v->chunks);
  ps__free(v->mem, v->idc);
  ps__mem_release(v->mem, v->charged);
  uv_mutex_destroy(&v->mu);
  ps__free(v->mem, v);
}

void ps__snap_drop(ps_shard *s) {
  ps_snap *v = s->snap;
  if (!v) return;
  s->snap = NULL;
  if (!v->err) s->snap_hcap = v->hcap_peak; /* the next one starts there */
  ps__snap_free(v);
}

void ps__snap_release(ps_snap *v) {
  uv_mutex_lock(&v->mu);
  atomic_store(&v->released, 1);
  /* the bitmap stays until the drop: a writer may still be testing it */
  snap_free_side(v);
  uv_mutex_unlock(&v->mu);
  atomic_store(&v->let_go, 1); /* the last touch: it may be freed now */
}

/* ---- the writer's side -------------------------------------------------- */

static uint64_t snap_hash(uint64_t k) {
  k *= 0x9e3779b97f4a7c15ull;
  return k ^ (k >> 29);
}

/* A block for the view: from those kept, or new and charged; NULL (the
 * view's error set) when it does not fit. */
static void *snap_block(ps_snap *v, size_t bytes) {
  int rc;
  void *p = ps__keep_get(v->mem, bytes, &rc);
  if (!p) {
    v->err = rc;
    v->err_bytes = bytes;
  }
  return p;
}

static bool snap_hgrow(ps_snap *v) {
  /* a checkpoint's view of a shard keeps about as many rows as the last
   * one: starting at that size takes one block of the index from those
   * kept (keep.c), not each size of a chain of doublings */
  size_t ncap = v->hcap ? v->hcap * 2 : v->hcap_first;
  uint64_t *k = snap_block(v, ncap * sizeof *k);
  uint32_t *val = k ? snap_block(v, ncap * sizeof *val) : NULL;
  if (!val) {
    ps__keep_put(v->mem, k, ncap * sizeof *k);
    return false;
  }
  memset(k, 0, ncap * sizeof *k);
  for (size_t i = 0; i < v->hcap; i++) {
    if (!v->hkey[i]) continue;
    size_t j = snap_hash(v->hkey[i]) & (ncap - 1);
    while (k[j]) j = (j + 1) & (ncap - 1);
    k[j] = v->hkey[i];
    val[j] = v->hval[i];
  }
  ps__keep_put(v->mem, v->hkey, v->hcap * sizeof *v->hkey);
  ps__keep_put(v->mem, v->hval, v->hcap * sizeof *v->hval);
  v->hkey = k;
  v->hval = val;
  v->hcap = ncap;
  if (ncap > v->hcap_peak) v->hcap_peak = ncap;
  return true;
}

/* Where row r's kept record is, or NULL. Under the lock. */
static const float *snap_side_find(const ps_snap *v, size_t r) {
  if (!v->hcap) return NULL;
  uint64_t key = (uint64_t)r + 1;
  for (size_t j = snap_hash(key) & (v->hcap - 1);; j = (j + 1) & (v->hcap - 1)) {
    if (v->hkey[j] == key) {
      uint32_t i = v->hval[j];
      return v->side[i / SNAP_SIDE_CHUNK] +
             (size_t)(i % SNAP_SIDE_CHUNK) * v->stride;
    }
    if (!v->hkey[j]) return NULL;
  }
}

/* Room for one more kept record; NULL (and the view lost) when there is
 * none. Under the lock. */
static float *snap_side_new(ps_snap *v, size_t r) {
  if ((v->n_kept + 1) * 2 > v->hcap && !snap_hgrow(v)) return NULL;
  if (v->n_kept == v->n_side * SNAP_SIDE_CHUNK) {
    if (v->n_side == v->side_cap) {
      size_t nc = v->side_cap ? v->side_cap * 2 : 16;
      if (!snap_charge(v, (nc - v->side_cap) * sizeof(float *))) return NULL;
      float **ns = ps__realloc(v->mem, v->side, v->side_cap * sizeof *ns,
                               nc * sizeof *ns);
      if (!ns) {
        v->err = TSR_ENOMEM;
        return NULL;
      }
      v->side = ns;
      v->side_cap = nc;
    }
    if (!(v->side[v->n_side] = snap_block(v, side_bytes(v)))) return NULL;
    v->n_side++;
  }
  uint32_t i = (uint32_t)v->n_kept++;
  uint64_t key = (uint64_t)r + 1;
  size_t j = snap_hash(key) & (v->hcap - 1);
  while (v->hkey[j]) j = (j + 1) & (v->hcap - 1);
  v->hkey[j] = key;
  v->hval[j] = i;
  return v->side[i / SNAP_SIDE_CHUNK] + (size_t)(i % SNAP_SIDE_CHUNK) * v->stride;
}

static void snap_keep_row(ps_snap *v, const ps_shard *s, size_t r) {
  if (r >= v->n_all || (v->kept[r >> 6] >> (r & 63) & 1) ||
      r < atomic_load_explicit(&v->upto, memory_order_acquire) ||
      atomic_load_explicit(&v->released, memory_order_acquire))
    return;
  if (v->sel && !(v->sel[r >> 6] >> (r & 63) & 1)) return; /* not in it */
  uv_mutex_lock(&v->mu);
  if (!atomic_load(&v->released)) {
    float *dst = snap_side_new(v, r);
    if (dst) {
      memcpy(dst, ps__rows_rec(&s->rows, r), v->stride * sizeof(float));
      v->kept[r >> 6] |= (uint64_t)1 << (r & 63);
    } else {
      atomic_store(&v->released, 1); /* lost: the reader fails */
      snap_free_side(v);
    }
  }
  uv_mutex_unlock(&v->mu);
}

void ps__snap_touch_row(ps_shard *s, size_t r) {
  if (s->snap) snap_keep_row(s->snap, s, r);
  if (s->rsnap) snap_keep_row(s->rsnap, s, r);
}

static void snap_keep_dense(ps_snap *v) {
  if (!v || v->dense_kept ||
      atomic_load_explicit(&v->released, memory_order_acquire))
    return;
  uv_mutex_lock(&v->mu);
  v->dense_kept = true; /* kept, or lost: either way once */
  if (!atomic_load(&v->released)) {
    size_t n = v->numel * (size_t)(1 + v->info.nslots);
    float *c = snap_charge(v, n * sizeof(float))
                   ? ps__alloc(v->mem, n * sizeof(float))
                   : NULL;
    if (c) {
      memcpy(c, v->w, v->numel * sizeof(float));
      for (int k = 0; k < v->info.nslots; k++)
        memcpy(c + (size_t)(k + 1) * v->numel, v->slots[k],
               v->numel * sizeof(float));
      v->dense_copy = c;
    } else {
      if (!v->err) v->err = TSR_ENOMEM;
      atomic_store(&v->released, 1);
      snap_free_side(v);
    }
  }
  uv_mutex_unlock(&v->mu);
}

void ps__snap_touch_dense(ps_shard *s) {
  snap_keep_dense(s->snap);
  snap_keep_dense(s->rsnap);
}

/* ---- reads of an attached snapshot by a shard's readers ----------------- */

const float *ps__snap_row(ps_snap *v, size_t r, const float *live) {
  if (r >= v->n_all) return NULL;
  const float *rec = live;
  uv_mutex_lock(&v->mu);
  if (v->kept && (v->kept[r >> 6] >> (r & 63) & 1)) rec = snap_side_find(v, r);
  uv_mutex_unlock(&v->mu);
  return rec;
}

const float *ps__snap_dense(ps_snap *v) {
  uv_mutex_lock(&v->mu);
  const float *p = v->dense_copy ? v->dense_copy : v->w;
  uv_mutex_unlock(&v->mu);
  return p;
}

void ps__snap_set_id(ps_snap *v, uint64_t id) { v->info.id = id; }

bool ps__snap_lost(ps_snap *v) {
  uv_mutex_lock(&v->mu);
  bool lost = v->err != 0;
  uv_mutex_unlock(&v->mu);
  return lost;
}

/* ---- the reader's side --------------------------------------------------- */

static size_t per_of(const ps_snap *v) { return (size_t)1 << v->shift; }

/* d moved on by i rows. */
static ps_snap_dst dst_at(const ps_snap_dst *d, int nsec, size_t i) {
  ps_snap_dst o = *d;
  for (int k = 0; k < nsec; k++) o.sec[k] += i * d->step;
  if (o.ids) o.ids += i * sizeof(int64_t);
  return o;
}

/* Record rec (value, then each slot) as row i of d: one copy of each
 * part, straight to where it goes. */
static inline void put_rec(const ps_snap_dst *d, int nsec, size_t W,
                           size_t i, const float *rec) {
  /* the usual widths (an embedding's 16, a wide weight's 1): a fixed
   * size copies inline, a call per part costs as much as the copy */
  if (W == 16) {
    for (int k = 0; k < nsec; k++)
      memcpy(d->sec[k] + i * d->step, rec + (size_t)k * 16, 64);
    return;
  }
  if (W == 1) {
    for (int k = 0; k < nsec; k++)
      memcpy(d->sec[k] + i * d->step, rec + k, sizeof(float));
    return;
  }
  for (int k = 0; k < nsec; k++)
    memcpy(d->sec[k] + i * d->step, rec + (size_t)k * W, W * sizeof(float));
}

static inline void put_id(const ps_snap_dst *d, size_t i, int64_t id) {
  if (d->ids) memcpy(d->ids + i * sizeof id, &id, sizeof id);
}

/* ps__snap_read_to of a piece, under the lock. */
static int snap_read_locked(ps_snap *v, size_t r0, size_t n,
                            const ps_snap_dst *d, char *err, size_t errlen) {
  size_t W = (size_t)v->info.width, S = v->stride;
  int nsec = 1 + v->info.nslots;
  int rc = 0;
  if (v->err || atomic_load(&v->released)) {
    const ps_snap_info *in = &v->info;
    if (v->err == TSR_EMEMLIMIT)
      rc = tsr_errf(err, errlen, TSR_EMEMLIMIT, "%s shard %d: no room to keep "
                    "the rows changed while it was written (%zu more bytes "
                    "would exceed the memory limit of %zu): give the PS "
                    "more memory or checkpoint less often",
                    in->spec.var.name, in->spec.shard.shard, v->err_bytes,
                    v->mem->limit);
    else
      rc = tsr_errf(err, errlen, v->err ? v->err : TSR_ECANCELED,
                    "%s shard %d: the snapshot was %s", in->spec.var.name,
                    in->spec.shard.shard,
                    v->err ? "lost (out of memory)" : "already released");
    goto out;
  }
  if (!v->info.sparse) { /* a part at a time: one copy each */
    for (int k = 0; k < nsec; k++) {
      const float *src = v->dense_copy
                             ? v->dense_copy + (size_t)k * v->numel
                             : k ? v->slots[k - 1] : v->w;
      src += r0 * W;
      if (d->step == W * sizeof(float)) {
        memcpy(d->sec[k], src, n * W * sizeof(float));
      } else {
        for (size_t i = 0; i < n; i++)
          memcpy(d->sec[k] + i * d->step, src + i * W, W * sizeof(float));
      }
    }
    goto out;
  }
  if (v->sel) { /* an increment: the selected rows, in order */
    while (v->cur_k < r0 && v->cur_r != SIZE_MAX) {
      v->cur_r = snap_sel_next(v, v->cur_r + 1);
      v->cur_k++;
    }
    for (size_t i = 0; i < n; i++) {
      size_t q = v->cur_r;
      if (q == SIZE_MAX) { /* cannot happen: n_rows counts them */
        rc = tsr_errf(err, errlen, TSR_ERANGE, "%s shard %d: increment row "
                      "%zu is past its rows", v->info.spec.var.name,
                      v->info.spec.shard.shard, r0 + i);
        goto out;
      }
      size_t k = q >> v->shift, at = q & (per_of(v) - 1);
      const float *src = v->kept[q >> 6] >> (q & 63) & 1
                             ? snap_side_find(v, q)
                             : v->chunks[k] + at * S;
      if (src) put_rec(d, nsec, W, i, src);
      put_id(d, i, v->direct ? v->row0 + (int64_t)q : v->idc[k][at]);
      v->cur_r = snap_sel_next(v, q + 1);
      v->cur_k++;
    }
    goto out;
  }
  /* the table's records are copied already (snap_copy_live); the rows
   * kept since are copied over them, a word of the map at a time */
  for (size_t i = 0; i < n;) {
    size_t q = r0 + i;
    uint64_t bits = v->kept[q >> 6] >> (q & 63);
    size_t span = 64 - (q & 63) < n - i ? 64 - (q & 63) : n - i;
    if (span < 64) bits &= ((uint64_t)1 << span) - 1;
    while (bits) {
      size_t j = (size_t)__builtin_ctzll(bits);
      bits &= bits - 1;
      const float *old = snap_side_find(v, q + j);
      if (old) put_rec(d, nsec, W, i + j, old);
    }
    i += span;
  }
out:
  return rc;
}

/* Rows [r, r+n) of a whole sparse view as the table holds them now, and
 * their ids; without the lock (rows kept meanwhile are copied over them
 * under it). */
static void snap_copy_live(const ps_snap *v, size_t r, size_t n,
                           const ps_snap_dst *d) {
  size_t S = v->stride, W = (size_t)v->info.width, per = per_of(v);
  int nsec = 1 + v->info.nslots;
  for (size_t i = 0; i < n;) {
    size_t q = r + i, k = q >> v->shift, at = q & (per - 1);
    size_t run = per - at < n - i ? per - at : n - i;
    if (d->ids) {
      if (v->direct)
        for (size_t j = 0; j < run; j++)
          put_id(d, i + j, v->row0 + (int64_t)(q + j));
      else
        memcpy(d->ids + i * sizeof(int64_t), v->idc[k] + at,
               run * sizeof(int64_t));
    }
    const float *src = v->chunks[k] + at * S;
    for (size_t j = 0; j < run; j++) put_rec(d, nsec, W, i + j, src + j * S);
    i += run;
  }
}

int ps__snap_read_to(ps_snap *v, size_t r0, size_t n, const ps_snap_dst *d,
                     char *err, size_t errlen) {
  /* a piece at a time: the lock is held for a piece's kept rows (an
   * increment's rows are scattered: a few hundred of them; contiguous
   * ones: 32 KiB), and the place published after each */
  bool whole = v->info.sparse && !v->sel;
  size_t S = v->stride;
  int nsec = 1 + v->info.nslots;
  size_t P = v->sel ? 256 : (32u << 10) / (S * sizeof(float));
  if (P < 1) P = 1;
  if (v->info.sparse && !atomic_load(&v->released) &&
      r0 < (v->sel ? v->cur_k : atomic_load(&v->upto)))
    return tsr_errf(err, errlen, TSR_EINVAL, "%s shard %d: snapshot row %zu "
                    "read again: its rows are read once each, in order "
                    "(those read are let change)", v->info.spec.var.name,
                    v->info.spec.shard.shard, r0);
  int rc = 0;
  for (size_t i = 0; i < n && !rc; i += P) {
    size_t k = n - i < P ? n - i : P;
    ps_snap_dst at = dst_at(d, nsec, i);
    if (whole) {
      if (r0 + i + k > v->n_all)
        return tsr_errf(err, errlen, TSR_ERANGE, "%s shard %d: rows [%zu, "
                        "%zu) are past the snapshot's %zu",
                        v->info.spec.var.name, v->info.spec.shard.shard,
                        r0 + i, r0 + i + k, v->n_all);
      snap_copy_live(v, r0 + i, k, &at);
    }
    uv_mutex_lock(&v->mu);
    rc = snap_read_locked(v, r0 + i, k, &at, err, errlen);
    if (!rc && v->info.sparse) /* the rows read are let change */
      atomic_store_explicit(&v->upto, v->sel ? (v->cur_r == SIZE_MAX
                                                    ? v->n_all : v->cur_r)
                                             : r0 + i + k,
                            memory_order_release);
    uv_mutex_unlock(&v->mu);
  }
  return rc;
}

int ps__snap_read(ps_snap *v, size_t r0, size_t n, float *recs, int64_t *ids,
                  char *err, size_t errlen) {
  ps_snap_dst d;
  memset(&d, 0, sizeof d);
  size_t W = (size_t)v->info.width;
  for (int k = 0; k <= v->info.nslots; k++)
    d.sec[k] = (unsigned char *)(recs + (size_t)k * W);
  d.step = v->stride * sizeof(float);
  d.ids = (unsigned char *)ids;
  return ps__snap_read_to(v, r0, n, &d, err, errlen);
}
