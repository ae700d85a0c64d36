/* tf.train.Example decoding for the TFRecord reader (proto/example.proto,
 * TensorFlow's field numbers): a hand-written scanner over the wire bytes,
 * no protobuf-c unpacking, no copies but the values themselves, no
 * allocation (the record's id array grows only when a record has more ids
 * than any before).
 *
 * Example{1: Features{1: map entry{1: key, 2: Feature{1: bytes_list,
 * 2: float_list, 3: int64_list}}}}; each list holds its values in field 1,
 * packed (one length-delimited run) or one value per tag, as protobuf
 * parsers must accept both.
 *
 * Happy path: each map entry's key is matched against the slot the entry
 * at the same position named in the record before (writers keep one
 * order), hashed only on a miss, and its values go straight to their
 * place in the batch row: a dense float feature of one-byte lengths is
 * checked against its expected 4-byte head and copied with one memcpy, a
 * sparse int64_list of one packed run is read by one tight varint loop
 * into its feature's column. Other Features in the usual shape (one list,
 * its values in one packed run) take a second fast path. Each sparse
 * feature has a column of its own, so the features may come in any order
 * and a key given twice simply rewrites its values (the last one counts).
 * Failure modes (each message names the file, the record's byte offset
 * and, where one is at fault, the feature): a varint running past its
 * message or longer than 10 bytes, a length past the end of its message,
 * an unknown wire type (TSR_EFORMAT, "malformed Example"); a dense feature
 * or the label absent (TSR_ENOTFOUND); the wrong list type (TSR_EDTYPE); a
 * wrong value count (TSR_ESHAPE); an id outside its vocabulary
 * (TSR_ERANGE). The fast paths take only well-formed input in the usual
 * shape; everything else goes through the general path, which makes every
 * check (every occurrence of a key given twice is checked). Unknown fields
 * are skipped at every level.
 */
#include "worker/tfr_example_int.h"

#include "common/err.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the slot table ---------------------------------------------------- */

static uint32_t hash_name(const uint8_t *p, size_t n) {
  uint32_t h = 2166136261u;
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 16777619u;
  return h;
}

static inline bool name_eq(const wk_tfr_slot *sl, const uint8_t *p,
                           size_t n) {
  if (sl->len != n) return false;
  for (size_t k = 0; k < n; k++) /* names are short: no call */
    if ((uint8_t)sl->name[k] != p[k]) return false;
  return true;
}

/* name_eq when `avail` >= 8 bytes may be read at p: names of up to 8
 * bytes compare as one masked word. */
static inline bool name_eq_w(const wk_tfr_slot *sl, const uint8_t *p,
                             size_t n, size_t avail) {
  if (sl->len != n) return false;
  if (n <= 8 && avail >= 8) {
    uint64_t w;
    memcpy(&w, p, 8);
    return (w & sl->mask) == sl->word;
  }
  return name_eq(sl, p, n);
}

static int lookup(const wk_tfr_dec *d, const uint8_t *p, size_t n) {
  uint32_t i = hash_name(p, n) & d->table_mask;
  for (;;) {
    int s = d->table[i];
    if (!s) return -1;
    if (name_eq(&d->slots[s - 1], p, n)) return s - 1;
    i = (i + 1) & d->table_mask;
  }
}

/* The slot a map entry's key names: the one at the same position in the
 * last record when the key matches it, else by hash. */
static inline int lookup_at(wk_tfr_dec *d, int pos, const uint8_t *p,
                            size_t n, size_t avail) {
  if (pos < WK_TFR_PRED_MAX) {
    int s = d->pred[pos] - 1;
    if (s >= 0 && name_eq_w(&d->slots[s], p, n, avail)) return s;
  }
  int s = lookup(d, p, n);
  if (pos < WK_TFR_PRED_MAX && d->pred[pos] != s + 1) {
    d->pred[pos] = s + 1;
    d->pred_changed = true;
  }
  return s;
}

void wk_tfr__dec_free(wk_tfr_dec *d) {
  for (int f = 0; d->rec_ids && f < d->n_sparse; f++) free(d->rec_ids[f]);
  free(d->rec_ids);
  free(d->rec_offs);
  free(d->rec_off);
  free(d->rec_cap);
  free(d->mark);
  free(d->slots);
  free(d->table);
  free(d->seen);
  memset(d, 0, sizeof *d);
}

/* The head of a dense float_list Feature of `size` values with one-byte
 * lengths: 0x12 (float_list) 4*size+2, 0x0a (field 1, packed) 4*size. */
static void dense_head(wk_tfr_slot *sl) {
  sl->head_len = SIZE_MAX; /* no Feature is that long */
  if (sl->kind != WK_TFR_DENSE || sl->decode || sl->size * 4 + 2 >= 0x80)
    return;
  uint32_t nb = (uint32_t)sl->size * 4;
  sl->head = 0x12u | (nb + 2) << 8 | 0x0au << 16 | nb << 24;
  sl->head_len = nb + 4;
}

/* The slot's usual map entry as bytes and a mask (wk_tfr_slot.pat). */
static void entry_pattern(wk_tfr_slot *sl) {
  uint8_t pat[24] = {0}, msk[24] = {0};
  size_t kl = sl->len, h = 10 + kl;
  bool dense = sl->kind == WK_TFR_DENSE && sl->head_len != SIZE_MAX;
  /* a label: an int64_list of one value, shaped as ids are */
  if (h > sizeof pat || (!dense && sl->kind == WK_TFR_DENSE) ||
      (dense && kl + 8 + (size_t)sl->size * 4 >= 0x80))
    return;
  size_t l3 = dense ? (size_t)sl->size * 4 : 0; /* sparse: varies */
  uint8_t hdr[24] = {0x0a, (uint8_t)(kl + 8 + l3), 0x0a, (uint8_t)kl};
  memcpy(hdr + 4, sl->name, kl);
  hdr[4 + kl] = 0x12;
  hdr[5 + kl] = (uint8_t)(l3 + 4);
  hdr[6 + kl] = dense ? 0x12 : 0x1a;
  hdr[7 + kl] = (uint8_t)(l3 + 2);
  hdr[8 + kl] = 0x0a;
  hdr[9 + kl] = (uint8_t)l3;
  for (size_t i = 0; i < h; i++) {
    bool varies = !dense && (i == 1 || i == 5 + kl || i == 7 + kl ||
                             i == 9 + kl);
    pat[i] = varies ? 0 : hdr[i];
    msk[i] = varies ? 0x80 : 0xff;
  }
  memcpy(sl->pat, pat, sizeof pat);
  memcpy(sl->msk, msk, sizeof msk);
  sl->hlen = h;
}

static int init_rec_columns(wk_tfr_dec *d) {
  int ns = d->n_sparse;
  d->rec_ids = calloc((size_t)ns + 1, sizeof *d->rec_ids);
  d->rec_offs = calloc((size_t)ns + 1, sizeof *d->rec_offs);
  d->rec_off = calloc(2 * (size_t)ns + 2, sizeof *d->rec_off);
  d->rec_cap = calloc((size_t)ns + 1, sizeof *d->rec_cap);
  if (!d->rec_ids || !d->rec_offs || !d->rec_off || !d->rec_cap)
    return TSR_ENOMEM;
  for (int f = 0; f < ns; f++) {
    d->rec_offs[f] = d->rec_off + 2 * f;
    d->rec_cap[f] = 4;
    if (!(d->rec_ids[f] = malloc(d->rec_cap[f] * sizeof(int64_t))))
      return TSR_ENOMEM;
  }
  return 0;
}

int wk_tfr__dec_init(wk_tfr_dec *d, const wk_input_spec *spec,
                     const int64_t *vocab, char *err, size_t errlen) {
  memset(d, 0, sizeof *d);
  d->n_slots = spec->n_dense + 1 + spec->n_sparse;
  d->n_sparse = spec->n_sparse;
  d->vocab = vocab;
  d->slots = calloc((size_t)d->n_slots, sizeof *d->slots);
  d->seen = calloc((size_t)d->n_slots, sizeof *d->seen);
  d->mark = calloc((size_t)d->n_slots, 1);
  uint32_t tsz = 16;
  while (tsz < (uint32_t)d->n_slots * 2) tsz *= 2;
  d->table = calloc(tsz, sizeof *d->table);
  d->table_mask = tsz - 1;
  if (!d->slots || !d->seen || !d->mark || !d->table || init_rec_columns(d))
    return tsr_errf(err, errlen, TSR_ENOMEM, "%s: out of memory",
                    spec->where);
  int k = 0;
  int64_t at = 0;
  for (int i = 0; i < spec->n_dense; i++, k++) {
    d->slots[k] = (wk_tfr_slot){.name = spec->dense[i].name,
                                .len = strlen(spec->dense[i].name),
                                .kind = WK_TFR_DENSE, .index = i, .at = at,
                                .size = spec->dense[i].size,
                                .decode = spec->dense[i].decode};
    at += spec->dense[i].size;
  }
  d->n_dense = at;
  d->slots[k++] = (wk_tfr_slot){.name = spec->label,
                                .len = strlen(spec->label),
                                .kind = WK_TFR_LABEL, .size = 1};
  for (int i = 0; i < spec->n_sparse; i++, k++)
    d->slots[k] = (wk_tfr_slot){
        .name = spec->sparse[i].name, .len = strlen(spec->sparse[i].name),
        .kind = WK_TFR_SPARSE, .index = i,
        /* ids are >= 0: as unsigned, a negative one is past any limit */
        .id_lim = vocab[i] > 0 ? (uint64_t)vocab[i] : UINT64_C(1) << 63};
  for (int i = 0; i < d->n_slots; i++) {
    wk_tfr_slot *sl = &d->slots[i];
    dense_head(sl);
    entry_pattern(sl);
    if (sl->len <= 8) { /* little-endian: byte k is bits 8k..8k+7 */
      sl->mask = sl->len == 8 ? ~UINT64_C(0)
                              : (UINT64_C(1) << (8 * sl->len)) - 1;
      for (size_t b = 0; b < sl->len; b++)
        sl->word |= (uint64_t)(uint8_t)sl->name[b] << (8 * b);
    }
    const uint8_t *nm = (const uint8_t *)sl->name;
    if (lookup(d, nm, sl->len) >= 0)
      return tsr_errf(err, errlen, TSR_ECONFIG,
                      "%s: feature \"%s\" is named twice (features, "
                      "label, sparse_features)",
                      spec->where, sl->name);
    uint32_t h = hash_name(nm, sl->len) & d->table_mask;
    while (d->table[h]) h = (h + 1) & d->table_mask;
    d->table[h] = i + 1;
  }
  return 0;
}


/* ---- Example ----------------------------------------------------------- */

/* The usual map entry at p: 0x0a L {0x0a KL key, 0x12 VL Feature} (or
 * the key alone), one-byte lengths, exactly filling L. */
__attribute__((always_inline)) static inline bool
usual_entry(const uint8_t *p, const uint8_t *fe, const uint8_t **me,
            const uint8_t **key, uint64_t *klen, const uint8_t **val,
            const uint8_t **vend) {
  if (fe - p < 4 || p[0] != 0x0a || p[1] < 2 || p[1] >= 0x80 ||
      p[1] > fe - p - 2 ||
      p[2] != 0x0a)
    return false;
  const uint8_t *e = p + 2 + p[1], *q = p + 3;
  if (*q >= 0x80 || *q > e - q - 1) return false;
  const uint8_t *v = q + 1 + *q;
  if (v == e) {
    *val = *vend = NULL;
  } else {
    if (e - v < 2 || v[0] != 0x12 || v[1] != e - v - 2) return false;
    *val = v + 2;
    *vend = e;
  }
  *me = e;
  *key = q + 1;
  *klen = *q;
  return true;
}

/* A map entry in any legal encoding: its key and Feature (either may be
 * absent); p is moved past it. 0, 1 for a field of Features that is not
 * a map entry (skipped), or an error. */
static int general_entry(const uint8_t **pp, const uint8_t *fe,
                         const uint8_t **key, uint64_t *klen,
                         const uint8_t **val, const uint8_t **vend,
                         const tfr_ctx *c) {
  const uint8_t *p = *pp;
  uint64_t tag, len;
  if (varint(&p, fe, &tag)) return wk_tfr__malformed(c, NULL);
  if (tag != ((1 << 3) | 2)) {
    if (skip_field(&p, fe, (int)(tag & 7))) return wk_tfr__malformed(c, NULL);
    *pp = p;
    return 1;
  }
  if (varint(&p, fe, &len) || len > (uint64_t)(fe - p))
    return wk_tfr__malformed(c, NULL);
  const uint8_t *me = p + len; /* map entry */
  while (p < me) {
    if (varint(&p, me, &tag)) return wk_tfr__malformed(c, NULL);
    int f = (int)(tag >> 3), wt = (int)(tag & 7);
    if ((f == 1 || f == 2) && wt == 2) {
      if (varint(&p, me, &len) || len > (uint64_t)(me - p))
        return wk_tfr__malformed(c, NULL);
      if (f == 1) {
        *key = p;
        *klen = len;
      } else {
        *val = p;
        *vend = p + len;
      }
      p += len;
    } else if (skip_field(&p, me, wt)) {
      return wk_tfr__malformed(c, NULL);
    }
  }
  *pp = p;
  return 0;
}

/* One map entry's Feature into the row. */
__attribute__((always_inline)) static inline int
decode_entry(const wk_tfr_slot *sl, const uint8_t *val, const uint8_t *vend,
             const wk_row *o, const tfr_ctx *c) {
  size_t vn = (size_t)(vend - val);
  if (vn == sl->head_len && load32(val) == sl->head) { /* dense floats */
    if (vn == 8) /* a scalar feature: no call */
      memcpy(o->x + sl->at, val + 4, 4);
    else
      memcpy(o->x + sl->at, val + 4, vn - 4);
    return 0;
  }
  if (sl->kind == WK_TFR_SPARSE && vn >= 4 && vn < 0x80 + 2 &&
      load32(val) == (0x1au | (uint32_t)(vn - 2) << 8 | 0x0au << 16 |
                      (uint32_t)(vn - 4) << 24))
    /* 0x1a L 0x0a L' ids: one packed int64_list */
    return ids_run(sl, val + 4, vend, o->offs[sl->index][o->row], o, c);
  return wk_tfr__feature(sl, val, vend, o, c);
}


typedef struct {
  const uint8_t *p; /* the next map entry */
  int pos;          /* its position */
  int nseen;        /* slots seen in this record */
} scan_at;

/* The run of map entries from at->p that are each their predicted slot's
 * usual entry (its key, one packed list of one-byte lengths, nothing
 * else): their values into the row, `at` moved past them. Stops at the
 * first other entry (the general scan decides) or at the end of Features
 * (fe). 0 or an error in the ids. Everything the loop reads is held in
 * locals: the build does not assume strict aliasing, so each store of a
 * value would otherwise reload them. */
static int entries_fast(const wk_tfr_dec *d, scan_at *at, const uint8_t *fe,
                        const uint8_t *end, const wk_row *o,
                        const tfr_ctx *c) {
  if (at->pos >= WK_TFR_PRED_MAX) return 0;
  const uint8_t *p = at->p;
  const int *pred = d->pred; /* pred[WK_TFR_PRED_MAX] is 0: a stop */
  const wk_tfr_slot *slots = d->slots;
  float *x = o->x;
  int64_t *const *offs = o->offs;
  const int64_t row = o->row;
  int pos = at->pos, rc = 0;
  uint8_t tail[24];
  while (p < fe) {
    int s = pred[pos] - 1;
    if (s < 0) break;
    const wk_tfr_slot *sl = &slots[s];
    size_t h = sl->hlen;
    const uint8_t *w = p; /* 24 bytes to compare */
    if ((size_t)(end - p) < 24) { /* the record's last entries */
      size_t r = (size_t)(end - p);
      if (h > r) break;
      memset(tail, 0, sizeof tail);
      memcpy(tail, p, r);
      w = tail;
    }
    if (!h || (((load64(w) ^ sl->pat[0]) & sl->msk[0]) |
               ((load64(w + 8) ^ sl->pat[1]) & sl->msk[1]) |
               ((load64(w + 16) ^ sl->pat[2]) & sl->msk[2])))
      break;
    size_t n = p[h - 1]; /* L3: the values' bytes */
    const uint8_t *e = p + h + n;
    if (e > fe) break;
    if (sl->kind == WK_TFR_DENSE) { /* every length is in the pattern */
      if (n == 4) /* a scalar feature: no call */
        memcpy(x + sl->at, p + h, 4);
      else
        memcpy(x + sl->at, p + h, n);
    } else {
      /* the lengths around the ids agree: L, VL, L2 */
      if (p[1] != sl->len + 8 + n || p[h - 5] != n + 4 || p[h - 3] != n + 2)
        break;
      if (sl->kind == WK_TFR_LABEL) { /* exactly one value */
        const uint8_t *q = p + h;
        uint64_t v;
        if (varint3(&q, e, &v) || q != e) break;
        *o->y = (float)(double)(int64_t)v;
        pos++;
        p = e;
        continue;
      }
      int f = sl->index;
      int64_t *of = offs[f], f0 = of[row];
      /* a varint is at least one byte: n ids at most */
      if ((size_t)f0 + n > o->ids_cap[f] &&
          (rc = o->grow(o->ctx, f, (size_t)f0 + n)))
        break;
      int64_t *ids = o->ids[f] + f0, k = 0;
      const uint8_t *q = p + h;
      uint64_t lim = sl->id_lim, v;
      while (q < e) {
        if (varint3(&q, e, &v)) {
          rc = wk_tfr__malformed(c, sl);
          break;
        }
        if (v >= lim) {
          rc = wk_tfr__out_of_vocab(c, sl, v);
          break;
        }
        ids[k++] = (int64_t)v;
      }
      if (rc) break;
      of[row + 1] = f0 + k;
    }
    pos++;
    p = e;
  }
  at->p = p;
  at->pos = pos;
  return rc;
}

/* Whether pred[0..n_slots) names every slot once. */
static bool pred_names_all(wk_tfr_dec *d) {
  if (d->n_slots > WK_TFR_PRED_MAX) return false;
  memset(d->mark, 0, (size_t)d->n_slots);
  for (int i = 0; i < d->n_slots; i++) {
    int s = d->pred[i] - 1;
    if (s < 0 || d->mark[s]) return false;
    d->mark[s] = 1;
  }
  return true;
}

/* Counts the slots of entries [from, to) that the fast path read as seen
 * (their slots are pred's): a whole record read that way from its first
 * entry, with pred naming every slot once, has them all. */
static int fast_seen(wk_tfr_dec *d, int from, int to, bool whole, int nseen,
                     uint32_t gen) {
  if (nseen == d->n_slots || from == to) return nseen;
  if (whole && from == 0 && nseen == 0 && to == d->n_slots) {
    if (d->pred_changed) {
      d->pred_all = pred_names_all(d);
      d->pred_changed = false;
    }
    if (d->pred_all) return d->n_slots;
  }
  for (int i = from; i < to; i++) {
    int s = d->pred[i] - 1;
    if (d->seen[s] != gen) {
      d->seen[s] = gen;
      nseen++;
    }
  }
  return nseen;
}

static int decode_row(wk_tfr_dec *d, const uint8_t *p, const uint8_t *end,
                      const wk_row *o, const tfr_ctx *c) {
  int rc, nseen = 0;
  if (++d->gen == 0) {
    memset(d->seen, 0, (size_t)d->n_slots * sizeof *d->seen);
    d->gen = 1;
  }
  uint32_t gen = d->gen;
  while (p < end) {
    uint64_t tag, len;
    if (varint(&p, end, &tag)) return wk_tfr__malformed(c, NULL);
    if (tag != ((1 << 3) | 2)) {
      if (skip_field(&p, end, (int)(tag & 7)))
        return wk_tfr__malformed(c, NULL);
      continue;
    }
    if (varint(&p, end, &len) || len > (uint64_t)(end - p))
      return wk_tfr__malformed(c, NULL);
    const uint8_t *fe = p + len; /* Features */
    scan_at at = {p, 0, nseen};
    for (;;) {
      int pos0 = at.pos;
      rc = entries_fast(d, &at, fe, end, o, c);
      p = at.p;
      nseen = at.nseen = fast_seen(d, pos0, at.pos, p >= fe, nseen, gen);
      if (rc) return rc;
      int pos = at.pos; /* map entry position */
      if (p >= fe) break;
      const uint8_t *me, *key = NULL, *val = NULL, *vend = NULL;
      uint64_t klen = 0;
      if (usual_entry(p, fe, &me, &key, &klen, &val, &vend)) {
        p = me;
      } else if ((rc = general_entry(&p, fe, &key, &klen, &val, &vend, c))) {
        if (rc < 0) return rc;
        at.p = p;
        continue;
      }
      at.p = p;
      if (!key) continue;
      at.pos = pos + 1;
      int s = lookup_at(d, pos, key, (size_t)klen, (size_t)(end - key));
      if (s < 0) continue;
      if (nseen < d->n_slots && d->seen[s] != gen) {
        d->seen[s] = gen;
        at.nseen = ++nseen;
      }
      if (!val) val = vend = key; /* an empty Feature */
      if ((rc = decode_entry(&d->slots[s], val, vend, o, c))) return rc;
    }
  }
  if (nseen == d->n_slots) return 0;
  int sp0 = d->n_slots - d->n_sparse;
  for (int i = 0; i < sp0; i++) /* dense and label */
    if (d->seen[i] != gen)
      return tsr_errf(c->err, c->errlen, TSR_ENOTFOUND,
                      "%s: record at byte offset %llu: feature \"%s\" "
                      "is absent from the Example",
                      c->path, (unsigned long long)c->off, d->slots[i].name);
  /* absent sparse features are empty (as tf.io.VarLenFeature) */
  for (int f = 0; f < d->n_sparse; f++)
    if (d->seen[sp0 + f] != gen) o->offs[f][o->row + 1] = o->offs[f][o->row];
  return 0;
}

int wk_tfr__decode_row(wk_tfr_dec *d, const uint8_t *p, size_t n,
                       const wk_row *o, const char *path, uint64_t off,
                       char *err, size_t errlen) {
  const tfr_ctx c = {path, off, err, errlen};
  return decode_row(d, p, p + n, o, &c);
}

/* wk_tfr__decode()'s columns grow by doubling. */
static int rec_grow(void *ctx, int f, size_t need) {
  wk_tfr_dec *d = ctx;
  size_t cap = d->rec_cap[f] * 2;
  while (cap < need) cap *= 2;
  int64_t *n = realloc(d->rec_ids[f], cap * sizeof(int64_t));
  if (!n) return TSR_ENOMEM;
  d->rec_ids[f] = n;
  d->rec_cap[f] = cap;
  return 0;
}

int wk_tfr__decode(wk_tfr_dec *d, const uint8_t *p, size_t n, wk_rec *r,
                   const char *path, uint64_t off, char *err,
                   size_t errlen) {
  const wk_row o = {r->x, &r->y, d->rec_ids, d->rec_offs, d->rec_cap,
                        0, rec_grow, d};
  int rc = wk_tfr__decode_row(d, p, n, &o, path, off, err, errlen);
  if (rc) return rc;
  size_t total = 0;
  for (int f = 0; f < d->n_sparse; f++)
    total += (size_t)d->rec_offs[f][1];
  if (wk_rec__reserve(r, total)) return TSR_ENOMEM;
  r->off[0] = 0;
  for (int f = 0; f < d->n_sparse; f++) {
    int64_t k = d->rec_offs[f][1];
    memcpy(r->ids + r->off[f], d->rec_ids[f], (size_t)k * sizeof(int64_t));
    r->off[f + 1] = r->off[f] + k;
  }
  return 0;
}
