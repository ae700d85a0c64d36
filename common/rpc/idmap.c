/* Request id -> object, for the calls in flight on a connection.
 *
 * Open addressing with linear probing and backward-shift deletion (no
 * tombstones, so a long-lived connection never degrades); the table grows
 * at half full. Ids are never 0, which marks an empty slot.
 * Failure modes: growth may fail (TSR_ENOMEM, nothing changed); an id
 * already present is refused with TSR_EDUPID.
 */
#include "common/rpc/rpc_int.h"

#include "common/err.h"

static size_t slot(uint64_t id, size_t cap) {
  return (size_t)((id * 0x9E3779B97F4A7C15ull) >> 17) & (cap - 1);
}

void tsr_rpc__idmap_init(tsr_rpc__idmap *m, tsr_rpc_ctx *ctx) {
  memset(m, 0, sizeof *m);
  m->ctx = ctx;
}

void tsr_rpc__idmap_free(tsr_rpc__idmap *m) {
  tsr_rpc__free(m->ctx, m->keys);
  tsr_rpc__free(m->ctx, m->vals);
  m->keys = NULL;
  m->vals = NULL;
  m->cap = m->len = 0;
}

static int grow(tsr_rpc__idmap *m) {
  size_t ncap = m->cap ? m->cap * 2 : 64;
  uint64_t *nk = tsr_rpc__calloc(m->ctx, ncap * sizeof *nk);
  void **nv = tsr_rpc__alloc(m->ctx, ncap * sizeof *nv);
  if (!nk || !nv) {
    tsr_rpc__free(m->ctx, nk);
    tsr_rpc__free(m->ctx, nv);
    return TSR_ENOMEM;
  }
  for (size_t i = 0; i < m->cap; i++) {
    if (!m->keys[i]) continue;
    size_t j = slot(m->keys[i], ncap);
    while (nk[j]) j = (j + 1) & (ncap - 1);
    nk[j] = m->keys[i];
    nv[j] = m->vals[i];
  }
  tsr_rpc__free(m->ctx, m->keys);
  tsr_rpc__free(m->ctx, m->vals);
  m->keys = nk;
  m->vals = nv;
  m->cap = ncap;
  return 0;
}

int tsr_rpc__idmap_put(tsr_rpc__idmap *m, uint64_t id, void *v) {
  if (id == 0) return TSR_EINVAL;
  if (tsr_rpc__idmap_get(m, id)) return TSR_EDUPID;
  if ((m->len + 1) * 2 > m->cap) {
    int rc = grow(m);
    if (rc) return rc;
  }
  size_t j = slot(id, m->cap);
  while (m->keys[j]) j = (j + 1) & (m->cap - 1);
  m->keys[j] = id;
  m->vals[j] = v;
  m->len++;
  return 0;
}

void *tsr_rpc__idmap_get(const tsr_rpc__idmap *m, uint64_t id) {
  if (!m->cap || id == 0) return NULL;
  size_t j = slot(id, m->cap);
  while (m->keys[j]) {
    if (m->keys[j] == id) return m->vals[j];
    j = (j + 1) & (m->cap - 1);
  }
  return NULL;
}

void *tsr_rpc__idmap_del(tsr_rpc__idmap *m, uint64_t id) {
  if (!m->cap || id == 0) return NULL;
  size_t mask = m->cap - 1, j = slot(id, m->cap);
  while (m->keys[j] && m->keys[j] != id) j = (j + 1) & mask;
  if (!m->keys[j]) return NULL;
  void *v = m->vals[j];
  m->len--;
  /* shift later members of the probe run back into the hole */
  size_t hole = j;
  for (size_t k = (j + 1) & mask; m->keys[k]; k = (k + 1) & mask) {
    size_t home = slot(m->keys[k], m->cap);
    /* k's entry may move to hole if hole lies cyclically in [home, k) */
    int move = hole <= k ? (home <= hole || home > k)
                         : (home <= hole && home > k);
    if (move) {
      m->keys[hole] = m->keys[k];
      m->vals[hole] = m->vals[k];
      hole = k;
    }
  }
  m->keys[hole] = 0;
  m->vals[hole] = NULL;
  return v;
}
