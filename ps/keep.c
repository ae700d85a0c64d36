/* The memory snapshots keep rows in, kept warm from one checkpoint to the
 * next.
 *
 * Why. A checkpoint written while training goes on keeps, in a view of
 * each shard (snap.c), the rows changed ahead of its reader: a few
 * percent of a table, megabytes of blocks and of the index that finds
 * them. Allocated afresh per view and given back at its release, every
 * checkpoint paid the kernel a page fault and a page zeroed for each of
 * those pages (the largest part of the parameter server's CPU in a
 * checkpoint after the copies). The views of a PS are alike from one
 * checkpoint to the next (the same shards, the same pushes), so blocks
 * of the sizes they asked for are kept here when a view is done and
 * handed to the next one.
 *
 * Happy path. ps__keep_get(mem, bytes) gives a block of that size: one
 * kept, or a new one charged to the PS memory budget. ps__keep_put gives
 * it back; it stays charged (resident memory is counted). After each
 * save, ps__keep_trim keeps per size as many blocks as were out at once
 * during it, at most, and frees the others: what one checkpoint needed
 * stays for the next, nothing more.
 * Failure modes: a new block that does not fit the budget first frees
 * every block kept here, then tries again (TSR_EMEMLIMIT if it still
 * does not fit; TSR_ENOMEM when the allocation fails). Sizes beyond the
 * classes held (PS_KEEP_CLASSES) are not kept: allocated and freed. Any
 * reservation of the PS that does not fit frees the kept blocks first
 * (ps__mem_reserve).
 */
#include "ps/ps_int.h"
#include "common/err.h"

#include <stdlib.h>
#include <string.h>

int ps__keep_init(ps_keep *k) {
  memset(k, 0, sizeof *k);
  if (uv_mutex_init(&k->mu)) return TSR_ENOMEM;
  k->ready = true;
  return 0;
}

/* Frees the blocks of c beyond `keep`; the bytes freed. Under the lock. */
static size_t keep_shed(const ps_mem *m, ps_keep_class *c, size_t keep) {
  size_t freed = 0;
  while (c->n_free > keep) {
    ps__free(m, c->free[--c->n_free]);
    freed += c->bytes;
  }
  return freed;
}

void ps__keep_free(ps_keep *k, ps_mem *m) {
  if (!k->ready) return;
  size_t freed = 0;
  for (int i = 0; i < PS_KEEP_CLASSES; i++) {
    freed += keep_shed(m, &k->cls[i], 0);
    free(k->cls[i].free);
  }
  atomic_fetch_sub(&m->used, freed);
  uv_mutex_destroy(&k->mu);
  memset(k, 0, sizeof *k);
}

size_t ps__keep_drop_all(ps_mem *m) {
  ps_keep *k = m->keep;
  if (!k || !k->ready) return 0;
  size_t freed = 0;
  uv_mutex_lock(&k->mu);
  for (int i = 0; i < PS_KEEP_CLASSES; i++)
    freed += keep_shed(m, &k->cls[i], 0);
  k->kept_bytes -= freed;
  uv_mutex_unlock(&k->mu);
  atomic_fetch_sub(&m->used, freed);
  return freed;
}

/* The class of `bytes`, made when there is room; NULL: none. Under the
 * lock. */
static ps_keep_class *keep_class(ps_keep *k, size_t bytes) {
  ps_keep_class *spare = NULL;
  for (int i = 0; i < PS_KEEP_CLASSES; i++) {
    if (k->cls[i].bytes == bytes) return &k->cls[i];
    if (!spare && !k->cls[i].bytes) spare = &k->cls[i];
  }
  if (spare) spare->bytes = bytes;
  return spare;
}

void *ps__keep_get(ps_mem *m, size_t bytes, int *rc) {
  ps_keep *k = m->keep;
  *rc = 0;
  if (k && k->ready) {
    void *p = NULL;
    uv_mutex_lock(&k->mu);
    ps_keep_class *c = keep_class(k, bytes);
    if (c) {
      if (c->n_free) {
        p = c->free[--c->n_free];
        k->kept_bytes -= bytes;
      }
      if (++c->out > c->peak) c->peak = c->out;
    }
    uv_mutex_unlock(&k->mu);
    if (p) return p;
  }
  /* a new one: charged (ps__mem_reserve frees what is kept here first
   * when the budget is short) */
  if (ps__mem_reserve(m, bytes)) {
    *rc = TSR_EMEMLIMIT;
  } else {
    void *p = ps__alloc(m, bytes);
    if (p) {
      if (k && k->ready) atomic_fetch_add(&k->fresh, 1);
      return p;
    }
    ps__mem_release(m, bytes);
    *rc = TSR_ENOMEM;
  }
  if (k && k->ready) { /* not handed out after all */
    uv_mutex_lock(&k->mu);
    ps_keep_class *c = keep_class(k, bytes);
    if (c && c->out) c->out--;
    uv_mutex_unlock(&k->mu);
  }
  return NULL;
}

void ps__keep_put(ps_mem *m, void *p, size_t bytes) {
  if (!p) return;
  ps_keep *k = m->keep;
  if (k && k->ready) {
    bool kept = false;
    uv_mutex_lock(&k->mu);
    ps_keep_class *c = keep_class(k, bytes);
    if (c) {
      if (c->out) c->out--;
      if (c->n_free == c->cap_free) {
        size_t nc = c->cap_free ? c->cap_free * 2 : 64;
        void **f = realloc(c->free, nc * sizeof *f);
        if (f) {
          c->free = f;
          c->cap_free = nc;
        }
      }
      if (c->n_free < c->cap_free) {
        c->free[c->n_free++] = p;
        k->kept_bytes += bytes;
        kept = true;
      }
    }
    uv_mutex_unlock(&k->mu);
    if (kept) return;
  }
  ps__free(m, p);
  ps__mem_release(m, bytes);
}

void ps__keep_trim(ps_mem *m) {
  ps_keep *k = m->keep;
  if (!k || !k->ready) return;
  size_t freed = 0;
  uv_mutex_lock(&k->mu);
  for (int i = 0; i < PS_KEEP_CLASSES; i++) {
    ps_keep_class *c = &k->cls[i];
    if (!c->bytes) continue;
    size_t room = c->peak > c->out ? c->peak - c->out : 0;
    freed += keep_shed(m, c, room);
    c->peak = c->out;
    if (!c->out && !c->n_free) c->bytes = 0; /* the class is free again */
  }
  k->kept_bytes -= freed;
  uv_mutex_unlock(&k->mu);
  atomic_fetch_sub(&m->used, freed);
}

void ps__keep_stats(ps_mem *m, size_t *fresh, size_t *kept_bytes) {
  ps_keep *k = m->keep;
  *fresh = *kept_bytes = 0;
  if (!k || !k->ready) return;
  uv_mutex_lock(&k->mu);
  *fresh = atomic_load(&k->fresh);
  *kept_bytes = k->kept_bytes;
  uv_mutex_unlock(&k->mu);
}
