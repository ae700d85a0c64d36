/* The rows of a sparse shard changed since each recent save: what an
 * incremental checkpoint writes.
 *
 * Happy path. Every apply notes its rows in a bitmap (one bit per row
 * number, grown with a table of rows made on first touch). A save's
 * snapshot takes that bitmap as the save's mark and starts a fresh one,
 * so the marks are, save by save, the rows changed in between. An
 * increment "since save X" is the union of the marks after X's: every row
 * changed since X's snapshot, whichever saves in between failed or were
 * discarded. Marks before X are dropped then (the chief never builds on
 * an older checkpoint than the one it names: a rewind restores, and a
 * restore starts the marks again from the checkpoint restored). At most
 * PS_DIRTY_HIST marks are kept; an increment since a save older than
 * them, or unknown here (this PS restarted since), is written whole.
 * Failure modes: a bitmap that does not fit the budget: the change is
 * marked lost, and no increment reaches back across it (the next save
 * of the shard is whole); the union's own bitmap not fitting fails the
 * save.
 */
#include "ps/ps_int.h"
#include "common/err.h"

#include <string.h>

/* Grows d's current bitmap to hold row r (and the rows the table holds,
 * rounded up). Its memory is a block the PS keeps warm (keep.c): each
 * save takes the bitmap as its mark and the next apply starts a new one,
 * which would otherwise be fresh pages, faulted and zeroed, every time. */
static int dirty_grow(ps_dirty *d, ps_mem *mem, size_t r, size_t rows) {
  size_t need = (r > rows ? r : rows) / 64 + 1;
  size_t words = d->words ? d->words : 64;
  while (words < need) words *= 2;
  int rc;
  uint64_t *b = ps__keep_get(mem, words * sizeof *b, &rc);
  if (!b) return rc;
  if (d->words) memcpy(b, d->bits, d->words * sizeof *b);
  memset(b + d->words, 0, (words - d->words) * sizeof *b);
  ps__keep_put(mem, d->bits, d->words * sizeof *b);
  d->charged += (words - d->words) * sizeof(uint64_t);
  d->bits = b;
  d->words = words;
  return 0;
}

void ps__dirty_note(ps_shard *s, ps_mem *mem, size_t r) {
  ps_dirty *d = &s->dirty;
  if (d->lost) return;
  if (r / 64 >= d->words && dirty_grow(d, mem, r, s->rows.count)) {
    d->lost = true;
    return;
  }
  d->bits[r / 64] |= (uint64_t)1 << (r & 63);
}

static void dirty_mark_free(ps_dirty *d, ps_mem *mem, ps_dirty_mark *m) {
  if (m->bits) {
    ps__keep_put(mem, m->bits, m->words * sizeof(uint64_t));
    d->charged -= m->words * sizeof(uint64_t);
  }
  m->bits = NULL;
  m->words = 0;
}

/* Drops the k oldest marks. */
static void dirty_drop(ps_dirty *d, ps_mem *mem, int k) {
  for (int i = 0; i < k; i++) dirty_mark_free(d, mem, &d->hist[i]);
  memmove(&d->hist[0], &d->hist[k], (size_t)(d->n_hist - k) * sizeof d->hist[0]);
  d->n_hist -= k;
}

static void dirty_push(ps_dirty *d, ps_mem *mem, const char *id,
                       uint64_t *bits, size_t words) {
  if (d->n_hist == PS_DIRTY_HIST) dirty_drop(d, mem, 1);
  ps_dirty_mark *m = &d->hist[d->n_hist++];
  memset(m, 0, sizeof *m);
  snprintf(m->id, sizeof m->id, "%s", id);
  m->bits = bits;
  m->words = words;
}

int ps__dirty_capture(ps_shard *s, ps_mem *mem, const char *save_id,
                      const char *since_id, uint64_t **sel, size_t *words,
                      size_t *sel_bytes) {
  ps_dirty *d = &s->dirty;
  *sel = NULL;
  *words = 0;
  *sel_bytes = 0;
  if (d->lost) { /* a change went unnoted: nothing before now is a base */
    for (int i = 0; i < d->n_hist; i++) dirty_mark_free(d, mem, &d->hist[i]);
    d->n_hist = 0;
    d->lost = false;
  }
  /* this save's mark: the rows changed since the save before */
  dirty_push(d, mem, save_id, d->bits, d->words);
  d->bits = NULL;
  d->words = 0;
  int at = -1;
  for (int i = 0; since_id && since_id[0] && i < d->n_hist - 1; i++)
    if (!strcmp(d->hist[i].id, since_id)) at = i;
  if (at < 0) return 0; /* whole */
  /* the marks after since_id's, joined; the older ones will not serve */
  dirty_drop(d, mem, at);
  dirty_mark_free(d, mem, &d->hist[0]); /* its rows are in since_id itself */
  size_t n = (s->rows.count + 63) / 64;
  size_t bytes = (n ? n : 1) * sizeof(uint64_t);
  if (ps__mem_reserve(mem, bytes)) return TSR_EMEMLIMIT;
  uint64_t *u = ps__calloc(mem, n ? n : 1, sizeof *u);
  if (!u) {
    ps__mem_release(mem, bytes);
    return TSR_ENOMEM;
  }
  for (int i = 1; i < d->n_hist; i++) {
    const ps_dirty_mark *m = &d->hist[i];
    size_t w = m->words < n ? m->words : n;
    for (size_t k = 0; k < w; k++) u[k] |= m->bits[k];
  }
  *sel = u;
  *words = n;
  *sel_bytes = bytes;
  return 1;
}

void ps__dirty_restored(ps_shard *s, ps_mem *mem, const char *id) {
  ps_dirty *d = &s->dirty;
  for (int i = 0; i < d->n_hist; i++) dirty_mark_free(d, mem, &d->hist[i]);
  d->n_hist = 0;
  d->lost = false;
  if (d->bits) memset(d->bits, 0, d->words * sizeof *d->bits);
  if (id && id[0]) dirty_push(d, mem, id, NULL, 0);
}

void ps__dirty_free(ps_dirty *d, ps_mem *mem) {
  for (int i = 0; i < d->n_hist; i++) dirty_mark_free(d, mem, &d->hist[i]);
  if (d->bits) {
    ps__keep_put(mem, d->bits, d->words * sizeof(uint64_t));
    d->charged -= d->words * sizeof(uint64_t);
  }
  memset(d, 0, sizeof *d);
}
