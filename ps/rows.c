/* Row tables of sparse (embedding) shards, in one of two layouts, and the
 * PS memory budget with its allocation hooks.
 *
 * Rows created on first touch (the default): the row records in chunks of
 * PS_ROWS_PER_CHUNK so growth never moves a row, each row's id in chunks
 * beside them (row order is how a checkpoint walks a table, and a
 * snapshot walks the chunks while rows are added), and an open-addressing
 * hash (linear probing, at most half full) whose buckets hold a row
 * number and 32 bits of the id's hash: a probe compares the hash bits and
 * reads the id only where they match. A row costs its record, 8 bytes of
 * id and 16 to 32 bytes of hash (8 per bucket, 2 to 4 buckets per row).
 *
 * Materialized (a bounded table that holds every row from its creation):
 * row r is id row0 + r, so there is no hash and no id at all; the records
 * lie in chunks of 2^16 rows, each one allocation (large enough that the
 * allocator's own bytes vanish, small enough that a failed allocation is
 * not the whole table). A row costs its record.
 *
 * Every byte is charged to the PS memory budget before it is allocated; a
 * reservation that does not fit fails with TSR_EMEMLIMIT and leaves the
 * table as it was.
 */
#include "ps/ps_int.h"
#include "common/err.h"
#include "common/size.h"

#include <stdlib.h>
#include <string.h>

#define PS__FREE UINT32_MAX /* a bucket's row when it is free */
#define PS__HASH_SHIFT 10   /* PS_ROWS_PER_CHUNK */
#define PS__DIRECT_SHIFT 16

int ps__mem_reserve(ps_mem *m, size_t bytes) {
  size_t cur = atomic_load(&m->used);
  bool dropped = false;
  for (;;) {
    if (m->limit && (bytes > m->limit || cur > m->limit - bytes)) {
      /* the blocks kept warm for the next snapshot give way first */
      if (dropped || !ps__keep_drop_all(m)) return TSR_EMEMLIMIT;
      dropped = true;
      cur = atomic_load(&m->used);
      continue;
    }
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
  t->shift = PS__HASH_SHIFT;
  return 0;
}

/* Bytes of one chunk of `rows` records. */
static size_t ps__chunk_bytes(const ps_rows *t, size_t rows) {
  return rows * t->stride * sizeof(float);
}

size_t ps__rows_direct_bytes(size_t stride, size_t rows) {
  size_t per = (size_t)1 << PS__DIRECT_SHIFT;
  size_t n_chunks = (rows + per - 1) / per, recs, ptrs;
  if (tsr_mul3_size(rows, stride, sizeof(float), &recs) ||
      tsr_mul_size(n_chunks, sizeof(float *), &ptrs) || recs > SIZE_MAX - ptrs)
    return SIZE_MAX;
  return recs + ptrs;
}

int ps__rows_init_direct(ps_rows *t, ps_mem *mem, size_t stride, int64_t row0,
                         size_t rows) {
  memset(t, 0, sizeof *t);
  t->stride = stride;
  t->shift = PS__DIRECT_SHIFT;
  t->direct = true;
  t->row0 = row0;
  size_t bytes = ps__rows_direct_bytes(stride, rows);
  if (bytes == SIZE_MAX) return TSR_ERANGE;
  int rc = mem ? ps__mem_reserve(mem, bytes) : 0;
  if (rc) return rc;
  size_t per = (size_t)1 << t->shift, n = (rows + per - 1) / per;
  t->chunks = ps__calloc(mem, n, sizeof *t->chunks);
  if (!t->chunks) goto nomem;
  t->chunk_cap = n;
  for (size_t k = 0; k < n; k++) {
    size_t in = k + 1 < n ? per : rows - k * per;
    if (!(t->chunks[k] = ps__alloc(mem, ps__chunk_bytes(t, in)))) goto nomem;
    t->n_chunks++;
  }
  t->count = rows;
  t->direct_bytes = bytes;
  return 0;
nomem:
  for (size_t k = 0; k < t->n_chunks; k++) ps__free(mem, t->chunks[k]);
  ps__free(mem, t->chunks);
  if (mem) ps__mem_release(mem, bytes);
  memset(t, 0, sizeof *t);
  t->stride = stride;
  return TSR_ENOMEM;
}

size_t ps__rows_bytes(const ps_rows *t) {
  if (t->direct) return t->direct_bytes;
  size_t per = PS_ROWS_PER_CHUNK;
  return t->cap * sizeof(ps_bucket) +
         t->n_chunks * per * (t->stride * sizeof(float) + sizeof(int64_t)) +
         t->chunk_cap * 2 * sizeof(void *);
}

void ps__rows_free(ps_rows *t, ps_mem *mem) {
  if (mem) ps__mem_release(mem, ps__rows_bytes(t));
  for (size_t i = 0; i < t->n_chunks; i++) {
    ps__free(mem, t->chunks[i]);
    if (t->idc) ps__free(mem, t->idc[i]);
  }
  ps__free(mem, t->chunks);
  ps__free(mem, t->idc);
  ps__free(mem, t->bk);
  size_t stride = t->stride;
  unsigned shift = t->shift;
  memset(t, 0, sizeof *t);
  t->stride = stride;
  t->shift = shift;
}

void ps__rows_clear(ps_rows *t) {
  if (t->direct) return; /* every row is held for good */
  for (size_t i = 0; i < t->cap; i++) t->bk[i].row = PS__FREE;
  t->count = 0;
}

float *ps__rows_rec(const ps_rows *t, size_t r) {
  return t->chunks[r >> t->shift] +
         (r & (((size_t)1 << t->shift) - 1)) * t->stride;
}

int64_t ps__rows_id(const ps_rows *t, size_t r) {
  if (t->direct) return t->row0 + (int64_t)r;
  return t->idc[r >> PS__HASH_SHIFT][r & (PS_ROWS_PER_CHUNK - 1)];
}

float *ps__rows_find_r(const ps_rows *t, int64_t id, size_t *r) {
  if (t->direct) {
    if (id < t->row0 || (uint64_t)(id - t->row0) >= t->count) return NULL;
    *r = (size_t)(id - t->row0);
    return ps__rows_rec(t, *r);
  }
  if (!t->cap) return NULL;
  uint64_t h = ps__hash(id);
  uint32_t tag = (uint32_t)h;
  size_t mask = t->cap - 1;
  for (size_t i = h & mask;; i = (i + 1) & mask) {
    const ps_bucket *b = &t->bk[i];
    if (b->row == PS__FREE) return NULL;
    if (b->tag == tag && ps__rows_id(t, b->row) == id) {
      *r = b->row;
      return ps__rows_rec(t, *r);
    }
  }
}

float *ps__rows_find(const ps_rows *t, int64_t id) {
  size_t r;
  return ps__rows_find_r(t, id, &r);
}

static int ps__rows_grow(ps_rows *t, ps_mem *mem) {
  size_t ncap = t->cap ? t->cap * 2 : 64;
  size_t add = (ncap - t->cap) * sizeof(ps_bucket);
  int rc = mem ? ps__mem_reserve(mem, add) : 0;
  if (rc) return rc;
  ps_bucket *bk = ps__alloc(mem, ncap * sizeof *bk);
  if (!bk) {
    if (mem) ps__mem_release(mem, add);
    return TSR_ENOMEM;
  }
  for (size_t i = 0; i < ncap; i++) bk[i].row = PS__FREE;
  /* the tag is the hash's low 32 bits: enough to place a bucket in any
   * table of at most 2^32 buckets (rows are fewer than 2^32) */
  size_t mask = ncap - 1;
  for (size_t i = 0; i < t->cap; i++) {
    if (t->bk[i].row == PS__FREE) continue;
    size_t j = t->bk[i].tag & mask;
    while (bk[j].row != PS__FREE) j = (j + 1) & mask;
    bk[j] = t->bk[i];
  }
  ps__free(mem, t->bk);
  t->bk = bk;
  t->cap = ncap;
  return 0;
}

/* One more chunk of records and of ids (hashed tables). The chunk arrays
 * may move when they grow: a snapshot keeps its own copy of them. */
static int ps__rows_add_chunk(ps_rows *t, ps_mem *mem) {
  size_t bytes = PS_ROWS_PER_CHUNK * (t->stride * sizeof(float) +
                                      sizeof(int64_t));
  bool grow = t->n_chunks == t->chunk_cap;
  size_t ncap = t->chunk_cap ? t->chunk_cap * 2 : 16;
  size_t charge = bytes + (grow ? (ncap - t->chunk_cap) * 2 * sizeof(void *)
                                : 0);
  int rc = mem ? ps__mem_reserve(mem, charge) : 0;
  if (rc) return rc;
  float *chunk = NULL;
  int64_t *ids = NULL;
  if (grow) {
    float **c = ps__realloc(mem, t->chunks, t->chunk_cap * sizeof *c,
                            ncap * sizeof *c);
    if (!c) goto nomem;
    t->chunks = c;
    int64_t **d = ps__realloc(mem, t->idc, t->chunk_cap * sizeof *d,
                              ncap * sizeof *d);
    if (!d) goto nomem; /* chunks grew: harmless, charged again next time */
    t->idc = d;
    t->chunk_cap = ncap;
  }
  chunk = ps__alloc(mem, PS_ROWS_PER_CHUNK * t->stride * sizeof(float));
  ids = ps__alloc(mem, PS_ROWS_PER_CHUNK * sizeof(int64_t));
  if (!chunk || !ids) goto nomem;
  t->chunks[t->n_chunks] = chunk;
  t->idc[t->n_chunks] = ids;
  t->n_chunks++;
  return 0;
nomem:
  ps__free(mem, chunk);
  ps__free(mem, ids);
  if (mem) ps__mem_release(mem, charge);
  return TSR_ENOMEM;
}

int ps__rows_insert_r(ps_rows *t, ps_mem *mem, int64_t id, float **rec,
                      size_t *row, int *created) {
  *created = 0;
  float *f = ps__rows_find_r(t, id, row);
  if (f) {
    *rec = f;
    return 0;
  }
  if (t->direct) return TSR_ERANGE; /* every row of its range is held */
  if (t->count >= PS__FREE - 1) return TSR_EMEMLIMIT;
  int rc;
  if ((t->count + 1) * 2 > t->cap && (rc = ps__rows_grow(t, mem))) return rc;
  if (t->count == t->n_chunks * PS_ROWS_PER_CHUNK &&
      (rc = ps__rows_add_chunk(t, mem)))
    return rc;
  uint32_t r = (uint32_t)t->count++;
  uint32_t tag = (uint32_t)ps__hash(id);
  size_t mask = t->cap - 1;
  size_t i = tag & mask;
  while (t->bk[i].row != PS__FREE) i = (i + 1) & mask;
  t->bk[i].tag = tag;
  t->bk[i].row = r;
  t->idc[r >> PS__HASH_SHIFT][r & (PS_ROWS_PER_CHUNK - 1)] = id;
  f = ps__rows_rec(t, r);
  memset(f, 0, t->stride * sizeof(float));
  *rec = f;
  *row = r;
  *created = 1;
  return 0;
}

int ps__rows_insert(ps_rows *t, ps_mem *mem, int64_t id, float **rec,
                    int *created) {
  size_t r;
  return ps__rows_insert_r(t, mem, id, rec, &r, created);
}

void ps__rows_each(const ps_rows *t,
                   void (*fn)(void *ctx, int64_t id, const float *rec),
                   void *ctx) {
  /* row order: the same for two walks of an unchanged table, and no
   * allocation that could fail */
  for (size_t r = 0; r < t->count; r++)
    fn(ctx, ps__rows_id(t, r), ps__rows_rec(t, r));
}
