/* Row tables of sparse (embedding) shards: an open-addressing hash from
 * int64 id to a row number (linear probing, at most half full), and the
 * row records in chunks of PS_ROWS_PER_CHUNK so growth never moves a row.
 * Every byte is charged to the PS memory budget before it is allocated;
 * a reservation that does not fit fails with TSR_EMEMLIMIT and leaves the
 * table as it was.
 */
#include "ps/ps_int.h"
#include "common/err.h"
#include "common/size.h"

#include <stdlib.h>
#include <string.h>

#define PS__EMPTY_ID INT64_MIN

int ps__mem_reserve(ps_mem *m, size_t bytes) {
  size_t cur = atomic_load(&m->used);
  for (;;) {
    if (m->limit && (bytes > m->limit || cur > m->limit - bytes))
      return TSR_EMEMLIMIT;
    if (atomic_compare_exchange_weak(&m->used, &cur, cur + bytes)) return 0;
  }
}

void ps__mem_release(ps_mem *m, size_t bytes) {
  atomic_fetch_sub(&m->used, bytes);
}

void *ps__alloc(const ps_mem *m, size_t n) {
  if (!n) n = 1;
  if (m && m->al) return m->al->alloc(m->al->ctx, n);
  return malloc(n);
}

void *ps__calloc(const ps_mem *m, size_t n, size_t size) {
  size_t b;
  if (tsr_mul_size(n ? n : 1, size, &b)) return NULL; /* one at least */
  void *p = ps__alloc(m, b);
  if (p) memset(p, 0, b ? b : 1);
  return p;
}

void *ps__realloc(const ps_mem *m, void *p, size_t old, size_t n) {
  if (!m || !m->al) return realloc(p, n ? n : 1);
  void *q = ps__alloc(m, n);
  if (!q) return NULL;
  if (p) {
    memcpy(q, p, old < n ? old : n);
    ps__free(m, p);
  }
  return q;
}

void ps__free(const ps_mem *m, void *p) {
  if (!p) return;
  if (m && m->al)
    m->al->free(m->al->ctx, p);
  else
    free(p);
}

static uint64_t ps__hash(int64_t id) {
  uint64_t z = (uint64_t)id * 0x9e3779b97f4a7c15ull;
  return z ^ (z >> 29);
}

int ps__rows_init(ps_rows *t, size_t stride) {
  memset(t, 0, sizeof *t);
  t->stride = stride;
  return 0;
}

size_t ps__rows_bytes(const ps_rows *t) {
  return t->cap * (sizeof(int64_t) + sizeof(uint32_t)) +
         t->n_chunks * PS_ROWS_PER_CHUNK * t->stride * sizeof(float) +
         t->chunk_cap * sizeof(float *);
}

void ps__rows_free(ps_rows *t, ps_mem *mem) {
  if (mem) ps__mem_release(mem, ps__rows_bytes(t));
  for (size_t i = 0; i < t->n_chunks; i++) ps__free(mem, t->chunks[i]);
  ps__free(mem, t->chunks);
  ps__free(mem, t->keys);
  ps__free(mem, t->vals);
  size_t stride = t->stride;
  memset(t, 0, sizeof *t);
  t->stride = stride;
}

void ps__rows_clear(ps_rows *t) {
  for (size_t i = 0; i < t->cap; i++) t->keys[i] = PS__EMPTY_ID;
  t->count = 0;
}

static float *ps__rec(const ps_rows *t, uint32_t r) {
  return t->chunks[r / PS_ROWS_PER_CHUNK] +
         (size_t)(r % PS_ROWS_PER_CHUNK) * t->stride;
}

float *ps__rows_find(const ps_rows *t, int64_t id) {
  if (!t->cap) return NULL;
  size_t mask = t->cap - 1;
  for (size_t i = ps__hash(id) & mask;; i = (i + 1) & mask) {
    if (t->keys[i] == id) return ps__rec(t, t->vals[i]);
    if (t->keys[i] == PS__EMPTY_ID) return NULL;
  }
}

static int ps__rows_grow(ps_rows *t, ps_mem *mem) {
  size_t ncap = t->cap ? t->cap * 2 : 64;
  size_t add = (ncap - t->cap) * (sizeof(int64_t) + sizeof(uint32_t));
  int rc = mem ? ps__mem_reserve(mem, add) : 0;
  if (rc) return rc;
  int64_t *keys = ps__alloc(mem, ncap * sizeof *keys);
  uint32_t *vals = ps__alloc(mem, ncap * sizeof *vals);
  if (!keys || !vals) {
    ps__free(mem, keys);
    ps__free(mem, vals);
    if (mem) ps__mem_release(mem, add);
    return TSR_ENOMEM;
  }
  for (size_t i = 0; i < ncap; i++) keys[i] = PS__EMPTY_ID;
  size_t mask = ncap - 1;
  for (size_t i = 0; i < t->cap; i++) {
    if (t->keys[i] == PS__EMPTY_ID) continue;
    size_t j = ps__hash(t->keys[i]) & mask;
    while (keys[j] != PS__EMPTY_ID) j = (j + 1) & mask;
    keys[j] = t->keys[i];
    vals[j] = t->vals[i];
  }
  ps__free(mem, t->keys);
  ps__free(mem, t->vals);
  t->keys = keys;
  t->vals = vals;
  t->cap = ncap;
  return 0;
}

static int ps__rows_add_chunk(ps_rows *t, ps_mem *mem) {
  size_t bytes = PS_ROWS_PER_CHUNK * t->stride * sizeof(float);
  size_t grow_ptrs = t->n_chunks == t->chunk_cap;
  size_t ncap = t->chunk_cap ? t->chunk_cap * 2 : 16;
  size_t charge = bytes + (grow_ptrs ? (ncap - t->chunk_cap) * sizeof(float *) : 0);
  int rc = mem ? ps__mem_reserve(mem, charge) : 0;
  if (rc) return rc;
  if (grow_ptrs) {
    float **c = ps__realloc(mem, t->chunks, t->chunk_cap * sizeof *c,
                            ncap * sizeof *c);
    if (!c) goto nomem;
    t->chunks = c;
    t->chunk_cap = ncap;
  }
  float *chunk = ps__alloc(mem, bytes);
  if (!chunk) goto nomem;
  t->chunks[t->n_chunks++] = chunk;
  return 0;
nomem:
  if (mem) ps__mem_release(mem, charge);
  return TSR_ENOMEM;
}

int ps__rows_insert(ps_rows *t, ps_mem *mem, int64_t id, float **rec,
                    int *created) {
  *created = 0;
  if (id == PS__EMPTY_ID) return TSR_ERANGE;
  float *f = ps__rows_find(t, id);
  if (f) {
    *rec = f;
    return 0;
  }
  if (t->count >= UINT32_MAX - 1) return TSR_EMEMLIMIT;
  int rc;
  if ((t->count + 1) * 2 > t->cap && (rc = ps__rows_grow(t, mem))) return rc;
  if (t->count == t->n_chunks * PS_ROWS_PER_CHUNK &&
      (rc = ps__rows_add_chunk(t, mem)))
    return rc;
  uint32_t r = (uint32_t)t->count++;
  size_t mask = t->cap - 1;
  size_t i = ps__hash(id) & mask;
  while (t->keys[i] != PS__EMPTY_ID) i = (i + 1) & mask;
  t->keys[i] = id;
  t->vals[i] = r;
  f = ps__rec(t, r);
  memset(f, 0, t->stride * sizeof(float));
  *rec = f;
  *created = 1;
  return 0;
}

void ps__rows_each(const ps_rows *t,
                   void (*fn)(void *ctx, int64_t id, const float *rec),
                   void *ctx) {
  /* table order: the same for two walks of an unchanged table (a save's
   * CRC pass and its write pass), and no allocation that could fail */
  for (size_t i = 0; t->count && i < t->cap; i++)
    if (t->keys[i] != PS__EMPTY_ID)
      fn(ctx, t->keys[i], ps__rec(t, t->vals[i]));
}
