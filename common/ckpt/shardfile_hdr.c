/* The header of a shard file (FORMAT.md): its sections, and the msgpack
 * map both ways.
 *
 * Happy path: the layout (which sections, where, how large) follows from
 * the header's fields alone, so the writer packs exactly what a reader
 * expects. Unpacking reads every key with its type and range.
 * Failure modes: a key missing, of the wrong type or out of its range, a
 * width that is not the product of the shape, a part that is not its
 * place in the saved layout, sizes that overflow: TSR_EFORMAT naming the
 * file and the key.
 */
#include "common/ckpt/shardfile_int.h"
#include "common/err.h"
#include "common/partition.h"
#include "common/size.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

/* ---- the sections ---------------------------------------------------------*/

int tsr_shardfile_layout(const tsr_shardfile_hdr *h,
                         tsr_shardfile_section secs[TSR_SHARDFILE_MAX_SECTIONS],
                         int *n, uint64_t *data_bytes) {
  if (h->nslots < 0 || h->nslots > TSR_SHARDFILE_MAX_SLOTS || h->n_rows < 0 ||
      h->width < 1)
    return TSR_EINVAL;
  uint64_t rows = (uint64_t)h->n_rows, sec, ids = 0, off = 0;
  if (tsr_mul_u64(rows, (uint64_t)h->width, &sec) ||
      tsr_mul_u64(sec, sizeof(float), &sec) ||
      (h->sparse && tsr_mul_u64(rows, sizeof(int64_t), &ids)))
    return TSR_ERANGE;
  int k = 0;
  if (h->sparse) {
    secs[k] = (tsr_shardfile_section){"ids", "<i8", 1, {h->n_rows, 0}, off,
                                      ids};
    off = ids;
    k++;
  }
  for (int s = -1; s < h->nslots; s++, k++) {
    tsr_shardfile_section *x = &secs[k];
    memset(x, 0, sizeof *x);
    if (s < 0)
      snprintf(x->name, sizeof x->name, "value");
    else
      snprintf(x->name, sizeof x->name, "slot/%s", h->slots[s]);
    x->dtype = "<f4";
    x->rank = 2;
    x->shape[0] = h->n_rows;
    x->shape[1] = h->width;
    x->offset = off;
    x->nbytes = sec;
    if (tsr_add_u64(off, sec, &off)) return TSR_ERANGE;
  }
  *n = k;
  *data_bytes = off;
  return 0;
}

/* ---- packing --------------------------------------------------------------*/

static void pk_str(msgpack_packer *pk, const char *s) {
  size_t n = strlen(s);
  msgpack_pack_str(pk, n);
  msgpack_pack_str_body(pk, s, n);
}

static void pk_bool(msgpack_packer *pk, bool b) {
  if (b)
    msgpack_pack_true(pk);
  else
    msgpack_pack_false(pk);
}

static void pk_section(msgpack_packer *pk, const tsr_shardfile_section *s) {
  msgpack_pack_map(pk, 5);
  pk_str(pk, "name");
  pk_str(pk, s->name);
  pk_str(pk, "dtype");
  pk_str(pk, s->dtype);
  pk_str(pk, "shape");
  msgpack_pack_array(pk, (size_t)s->rank);
  for (int i = 0; i < s->rank; i++) msgpack_pack_int64(pk, s->shape[i]);
  pk_str(pk, "offset");
  msgpack_pack_uint64(pk, s->offset);
  pk_str(pk, "nbytes");
  msgpack_pack_uint64(pk, s->nbytes);
}

int tsr_shardfile__hdr_pack(const tsr_shardfile_hdr *h, const char *written_by,
                            uint32_t data_crc, msgpack_sbuffer *sb) {
  tsr_shardfile_section secs[TSR_SHARDFILE_MAX_SECTIONS];
  int nsec;
  uint64_t data_bytes;
  int rc = tsr_shardfile_layout(h, secs, &nsec, &data_bytes);
  if (rc) return rc;
  msgpack_packer pk;
  msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 22);
  pk_str(&pk, "format"); pk_str(&pk, "tessera-shard");
  pk_str(&pk, "version"); msgpack_pack_int(&pk, TSR_SHARDFILE_VERSION);
  pk_str(&pk, "checkpoint_id"); pk_str(&pk, h->ckpt_id);
  pk_str(&pk, "checkpoint_step"); msgpack_pack_int64(&pk, h->ckpt_step);
  pk_str(&pk, "name"); pk_str(&pk, h->name);
  pk_str(&pk, "shape");
  msgpack_pack_array(&pk, (size_t)h->rank);
  for (int i = 0; i < h->rank; i++) msgpack_pack_int64(&pk, h->shape[i]);
  pk_str(&pk, "sparse"); pk_bool(&pk, h->sparse);
  pk_str(&pk, "bounded"); pk_bool(&pk, h->bounded);
  pk_str(&pk, "shard"); msgpack_pack_int(&pk, h->shard);
  pk_str(&pk, "num_shards"); msgpack_pack_int(&pk, h->num_shards);
  pk_str(&pk, "row0"); msgpack_pack_int64(&pk, h->row0);
  pk_str(&pk, "rows"); msgpack_pack_int64(&pk, h->rows);
  pk_str(&pk, "width"); msgpack_pack_int64(&pk, h->width);
  pk_str(&pk, "optimizer"); pk_str(&pk, h->optimizer);
  pk_str(&pk, "slots");
  msgpack_pack_array(&pk, (size_t)h->nslots);
  for (int k = 0; k < h->nslots; k++) pk_str(&pk, h->slots[k]);
  pk_str(&pk, "step"); msgpack_pack_int64(&pk, h->step);
  pk_str(&pk, "var_version"); msgpack_pack_uint64(&pk, h->var_version);
  pk_str(&pk, "n_rows"); msgpack_pack_uint64(&pk, (uint64_t)h->n_rows);
  pk_str(&pk, "data_bytes"); msgpack_pack_uint64(&pk, data_bytes);
  /* fixed width: the header's length does not depend on the CRC, so a
   * writer can place the data before it knows it */
  pk_str(&pk, "data_crc32c"); msgpack_pack_fix_uint32(&pk, data_crc);
  pk_str(&pk, "sections");
  msgpack_pack_array(&pk, (size_t)nsec);
  for (int i = 0; i < nsec; i++) pk_section(&pk, &secs[i]);
  pk_str(&pk, "written_by"); pk_str(&pk, written_by ? written_by : "tessera");
  return 0;
}

/* ---- unpacking ------------------------------------------------------------*/

static const msgpack_object *sf_get(const msgpack_object *map, const char *k) {
  if (map->type != MSGPACK_OBJECT_MAP) return NULL;
  size_t n = strlen(k);
  for (uint32_t i = 0; i < map->via.map.size; i++) {
    const msgpack_object_kv *kv = &map->via.map.ptr[i];
    if (kv->key.type == MSGPACK_OBJECT_STR && kv->key.via.str.size == n &&
        memcmp(kv->key.via.str.ptr, k, n) == 0)
      return &kv->val;
  }
  return NULL;
}

/* An integer key in [lo, hi]. */
static int sf_int(const msgpack_object *h, const char *k, int64_t lo,
                  int64_t hi, int64_t *out, const char *path, char *err,
                  size_t errlen) {
  const msgpack_object *o = sf_get(h, k);
  int64_t v;
  if (o && o->type == MSGPACK_OBJECT_POSITIVE_INTEGER &&
      o->via.u64 <= INT64_MAX)
    v = (int64_t)o->via.u64;
  else if (o && o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
    v = o->via.i64;
  else
    return tsr_errf(err, errlen, TSR_EFORMAT, "%s: header key %s is missing "
                    "or not an integer", path, k);
  if (v < lo || v > hi)
    return tsr_errf(err, errlen, TSR_EFORMAT, "%s: header %s %" PRId64
                    " is not in [%" PRId64 ", %" PRId64 "]", path, k, v, lo,
                    hi);
  *out = v;
  return 0;
}

static int sf_str(const msgpack_object *h, const char *k, char *buf,
                  size_t len, const char *path, char *err, size_t errlen) {
  const msgpack_object *o = sf_get(h, k);
  if (!o || o->type != MSGPACK_OBJECT_STR || o->via.str.size >= len ||
      memchr(o->via.str.ptr, 0, o->via.str.size))
    return tsr_errf(err, errlen, TSR_EFORMAT, "%s: header key %s is missing, "
                    "not a string or longer than %zu bytes", path, k, len - 1);
  memcpy(buf, o->via.str.ptr, o->via.str.size);
  buf[o->via.str.size] = 0;
  return 0;
}

static int sf_bool(const msgpack_object *h, const char *k, bool *out,
                   const char *path, char *err, size_t errlen) {
  const msgpack_object *o = sf_get(h, k);
  if (!o || o->type != MSGPACK_OBJECT_BOOLEAN)
    return tsr_errf(err, errlen, TSR_EFORMAT, "%s: header key %s is missing "
                    "or not a boolean", path, k);
  *out = o->via.boolean;
  return 0;
}

/* The shape, and the width that must be the product of shape[1:]. */
static int sf_shape(tsr_shardfile_hdr *p, const msgpack_object *h,
                    const char *path, char *err, size_t errlen) {
  const msgpack_object *o = sf_get(h, "shape");
  if (!o || o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size > TSR_MAX_RANK)
    return tsr_errf(err, errlen, TSR_EFORMAT, "%s: header shape is missing, "
                    "not a list or of rank over %d", path, TSR_MAX_RANK);
  p->rank = (int)o->via.array.size;
  for (int i = 0; i < p->rank; i++) {
    const msgpack_object *d = &o->via.array.ptr[i];
    if (d->type != MSGPACK_OBJECT_POSITIVE_INTEGER || d->via.u64 < 1 ||
        d->via.u64 > (uint64_t)TSR_STEP_MAX)
      return tsr_errf(err, errlen, TSR_EFORMAT, "%s: shape[%d] is not an "
                      "integer in [1, 2^62]", path, i);
    p->shape[i] = (int64_t)d->via.u64;
  }
  if (p->sparse && p->rank < 1)
    return tsr_errf(err, errlen, TSR_EFORMAT, "%s: a sparse part of rank 0",
                    path);
  int64_t width;
  if (tsr_dims_product(p->shape, 1, p->rank, &width))
    return tsr_errf(err, errlen, TSR_EFORMAT, "%s: shape[1:] overflows",
                    path);
  int rc = sf_int(h, "width", 1, INT64_MAX, &p->width, path, err, errlen);
  if (rc) return rc;
  if (p->width != width)
    return tsr_errf(err, errlen, TSR_EFORMAT, "%s: width %" PRId64 " is not "
                    "the product of shape[1:] (%" PRId64 ")", path, p->width,
                    width);
  return 0;
}

/* The part's place in the saved layout: parts never overlap, none is
 * missing from a complete set. */
static int sf_place(const tsr_shardfile_hdr *p, const char *path, char *err,
                    size_t errlen) {
  if (p->sparse && !p->bounded) return 0;
  int64_t dim0 = p->rank ? p->shape[0] : 1;
  if (p->num_shards > dim0)
    return tsr_errf(err, errlen, TSR_EFORMAT, "%s: %d shards of %" PRId64
                    " rows", path, p->num_shards, dim0);
  int64_t r0, rs;
  tsr_partition_rows(dim0, p->num_shards, p->shard, &r0, &rs);
  if (p->row0 != r0 || p->rows != rs)
    return tsr_errf(err, errlen, TSR_EFORMAT, "%s: rows [%" PRId64 ", +%"
                    PRId64 ") are not part %d of %d of %" PRId64 " rows ([%"
                    PRId64 ", +%" PRId64 "))", path, p->row0, p->rows,
                    p->shard, p->num_shards, dim0, r0, rs);
  if (p->sparse ? p->n_rows > p->rows : p->n_rows != p->rows)
    return tsr_errf(err, errlen, TSR_EFORMAT, "%s: %" PRId64 " rows stored "
                    "in a part of %" PRId64 " rows", path, p->n_rows,
                    p->rows);
  return 0;
}

static int sf_slots(tsr_shardfile_hdr *p, const msgpack_object *h,
                    const char *path, char *err, size_t errlen) {
  const msgpack_object *o = sf_get(h, "slots");
  if (!o || o->type != MSGPACK_OBJECT_ARRAY ||
      o->via.array.size > TSR_SHARDFILE_MAX_SLOTS)
    return tsr_errf(err, errlen, TSR_EFORMAT, "%s: header slots is missing, "
                    "not a list or longer than %d", path,
                    TSR_SHARDFILE_MAX_SLOTS);
  p->nslots = (int)o->via.array.size;
  for (int k = 0; k < p->nslots; k++) {
    const msgpack_object *n = &o->via.array.ptr[k];
    if (n->type != MSGPACK_OBJECT_STR ||
        n->via.str.size >= TSR_SHARDFILE_SLOT_MAX)
      return tsr_errf(err, errlen, TSR_EFORMAT, "%s: slot %d has a bad name",
                      path, k);
    bool ok = n->via.str.size > 0;
    for (uint32_t c = 0; ok && c < n->via.str.size; c++) {
      char ch = n->via.str.ptr[c];
      ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
           (ch >= '0' && ch <= '9') || ch == '_';
    }
    if (!ok)
      return tsr_errf(err, errlen, TSR_EFORMAT, "%s: slot %d is not a name "
                      "of [A-Za-z0-9_]", path, k);
    memcpy(p->slots[k], n->via.str.ptr, n->via.str.size);
    p->slots[k][n->via.str.size] = 0;
    for (int j = 0; j < k; j++)
      if (!strcmp(p->slots[j], p->slots[k]))
        return tsr_errf(err, errlen, TSR_EFORMAT, "%s: slot \"%s\" is listed "
                        "twice", path, p->slots[k]);
  }
  return 0;
}

/* A map of at most `max` keys, each a string, none twice: a reader that
 * takes the last of two keys (Python's msgpack) must read what this one
 * reads. */
static int sf_keys(const msgpack_object *m, uint32_t max, const char *what,
                   const char *path, char *err, size_t errlen) {
  if (m->type != MSGPACK_OBJECT_MAP)
    return tsr_errf(err, errlen, TSR_EFORMAT, "%s: %s is not a map", path,
                    what);
  if (m->via.map.size > max)
    return tsr_errf(err, errlen, TSR_EFORMAT, "%s: %s has %u keys, at most "
                    "%u are read", path, what, m->via.map.size, max);
  for (uint32_t i = 0; i < m->via.map.size; i++) {
    const msgpack_object *a = &m->via.map.ptr[i].key;
    if (a->type != MSGPACK_OBJECT_STR)
      return tsr_errf(err, errlen, TSR_EFORMAT, "%s: %s has a key that is "
                      "not a string", path, what);
    for (uint32_t j = 0; j < i; j++) {
      const msgpack_object *b = &m->via.map.ptr[j].key;
      if (a->via.str.size == b->via.str.size &&
          !memcmp(a->via.str.ptr, b->via.str.ptr, a->via.str.size))
        return tsr_errf(err, errlen, TSR_EFORMAT, "%s: %s has key %.*s "
                        "twice", path, what, (int)(a->via.str.size > 64
                        ? 64 : a->via.str.size), a->via.str.ptr);
    }
  }
  return 0;
}

static bool sf_str_is(const msgpack_object *o, const char *s) {
  return o && o->type == MSGPACK_OBJECT_STR && o->via.str.size == strlen(s) &&
         !memcmp(o->via.str.ptr, s, o->via.str.size);
}

static bool sf_u64_is(const msgpack_object *o, uint64_t v) {
  return o && o->type == MSGPACK_OBJECT_POSITIVE_INTEGER && o->via.u64 == v;
}

/* A string of the header for a message: at most 64 bytes of it. */
#define SF_SHOW(o)                                                       \
  (int)((o) && (o)->type == MSGPACK_OBJECT_STR                           \
            ? ((o)->via.str.size > 64 ? 64 : (o)->via.str.size) : 1),   \
      ((o) && (o)->type == MSGPACK_OBJECT_STR ? (o)->via.str.ptr : "?")

/* Entry i of the sections list against the one the layout says. */
static int sf_section(const msgpack_object *m, uint32_t i,
                      const tsr_shardfile_section *x, const char *path,
                      char *err, size_t errlen) {
  char what[48];
  snprintf(what, sizeof what, "section %u", i);
  int rc = sf_keys(m, 16, what, path, err, errlen);
  if (rc) return rc;
  const msgpack_object *name = sf_get(m, "name"), *dt = sf_get(m, "dtype"),
                       *sh = sf_get(m, "shape"), *off = sf_get(m, "offset"),
                       *nb = sf_get(m, "nbytes");
  if (!sf_str_is(name, x->name))
    return tsr_errf(err, errlen, TSR_EFORMAT, "%s: section %u is \"%.*s\", "
                    "the header's rows and slots say \"%s\"", path, i,
                    SF_SHOW(name), x->name);
  if (!sf_str_is(dt, x->dtype))
    return tsr_errf(err, errlen, TSR_EFORMAT, "%s: section \"%s\" has dtype "
                    "\"%.*s\", not \"%s\"", path, x->name, SF_SHOW(dt),
                    x->dtype);
  bool shape_ok = sh && sh->type == MSGPACK_OBJECT_ARRAY &&
                  sh->via.array.size == (uint32_t)x->rank;
  for (int d = 0; shape_ok && d < x->rank; d++)
    shape_ok = sf_u64_is(&sh->via.array.ptr[d], (uint64_t)x->shape[d]);
  if (!shape_ok) {
    char want[64];
    if (x->rank > 1)
      snprintf(want, sizeof want, "[%" PRId64 ", %" PRId64 "]", x->shape[0],
               x->shape[1]);
    else
      snprintf(want, sizeof want, "[%" PRId64 "]", x->shape[0]);
    return tsr_errf(err, errlen, TSR_EFORMAT, "%s: section \"%s\" has "
                    "another shape than %s", path, x->name, want);
  }
  if (!sf_u64_is(off, x->offset) || !sf_u64_is(nb, x->nbytes)) {
    char got[64];
    if (off && nb && off->type == MSGPACK_OBJECT_POSITIVE_INTEGER &&
        nb->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
      snprintf(got, sizeof got, "offset %" PRIu64 " with %" PRIu64 " bytes",
               off->via.u64, nb->via.u64);
    else
      snprintf(got, sizeof got, "no integer offset and nbytes");
    return tsr_errf(err, errlen, TSR_EFORMAT, "%s: section \"%s\" says %s; "
                    "its shape puts it at offset %" PRIu64 " with %" PRIu64
                    " bytes, right after the one before it", path, x->name,
                    got, x->offset, x->nbytes);
  }
  return 0;
}

int tsr_shardfile__layout_read(const tsr_shardfile_hdr *h, const char *path,
                               tsr_shardfile_section *secs, int *nsec,
                               uint64_t *data_bytes, char *err,
                               size_t errlen) {
  if (tsr_shardfile_layout(h, secs, nsec, data_bytes))
    return tsr_errf(err, errlen, TSR_EFORMAT, "%s: %" PRId64 " rows of width %"
                    PRId64 " with %d slot(s) overflow a size", path, h->n_rows,
                    h->width, h->nslots);
  return 0;
}

/* The sections list is exactly what the header's other keys imply, so a
 * reader following FORMAT.md reads the arrays a restore reads. */
static int sf_sections_list(const msgpack_object *h,
                            const tsr_shardfile_hdr *p, const char *path,
                            char *err, size_t errlen) {
  tsr_shardfile_section secs[TSR_SHARDFILE_MAX_SECTIONS];
  int nsec;
  uint64_t bytes;
  int rc = tsr_shardfile__layout_read(p, path, secs, &nsec, &bytes, err,
                                      errlen);
  if (rc) return rc;
  const msgpack_object *o = sf_get(h, "sections");
  if (!o || o->type != MSGPACK_OBJECT_ARRAY)
    return tsr_errf(err, errlen, TSR_EFORMAT, "%s: header key sections is "
                    "missing or not a list", path);
  if (o->via.array.size != (uint32_t)nsec)
    return tsr_errf(err, errlen, TSR_EFORMAT, "%s: the header lists %u "
                    "sections; a %s part with %d slot(s) holds %d", path,
                    o->via.array.size, p->sparse ? "sparse" : "dense",
                    p->nslots, nsec);
  for (int i = 0; i < nsec; i++)
    if ((rc = sf_section(&o->via.array.ptr[i], (uint32_t)i, &secs[i], path,
                         err, errlen)))
      return rc;
  return 0;
}

int tsr_shardfile__hdr_unpack(const msgpack_object *h, const char *path,
                              tsr_shardfile_hdr *p, uint64_t *data_bytes,
                              uint32_t *data_crc, char *err, size_t errlen) {
  char fmt[32];
  int64_t v, x;
  int rc;
  memset(p, 0, sizeof *p);
  if ((rc = sf_keys(h, 64, "the header", path, err, errlen)) ||
      (rc = sf_str(h, "format", fmt, sizeof fmt, path, err, errlen)))
    return rc;
  if (strcmp(fmt, "tessera-shard"))
    return tsr_errf(err, errlen, TSR_EFORMAT, "%s: format \"%s\" is not "
                    "tessera-shard", path, fmt);
  if ((rc = sf_int(h, "version", 0, INT32_MAX, &v, path, err, errlen)))
    return rc;
  if (v != TSR_SHARDFILE_VERSION)
    return tsr_errf(err, errlen, TSR_EFORMAT, "%s: shard file version %" PRId64
                    "; this build reads version 2 (files of version 1 carry no "
                    "checkpoint id)", path, v);
  if ((rc = sf_str(h, "checkpoint_id", p->ckpt_id, sizeof p->ckpt_id, path,
                   err, errlen)) ||
      (rc = sf_int(h, "checkpoint_step", 0, TSR_STEP_MAX, &p->ckpt_step, path,
                   err, errlen)) ||
      (rc = sf_str(h, "name", p->name, sizeof p->name, path, err, errlen)) ||
      (rc = sf_bool(h, "sparse", &p->sparse, path, err, errlen)) ||
      (rc = sf_bool(h, "bounded", &p->bounded, path, err, errlen)) ||
      (rc = sf_int(h, "num_shards", 1, TSR_SHARDFILE_MAX_PARTS, &v, path, err,
                   errlen)) ||
      (rc = sf_int(h, "shard", 0, v - 1, &x, path, err, errlen)))
    return rc;
  p->num_shards = (int32_t)v;
  p->shard = (int32_t)x;
  if (!p->name[0])
    return tsr_errf(err, errlen, TSR_EFORMAT, "%s: empty variable name", path);
  if ((rc = sf_shape(p, h, path, err, errlen)) ||
      (rc = sf_int(h, "row0", 0, TSR_STEP_MAX, &p->row0, path, err,
                   errlen)) ||
      (rc = sf_int(h, "rows", 0, TSR_STEP_MAX, &p->rows, path, err, errlen)) ||
      (rc = sf_int(h, "n_rows", 0, TSR_STEP_MAX, &p->n_rows, path, err,
                   errlen)) ||
      (rc = sf_int(h, "step", 0, TSR_STEP_MAX, &p->step, path, err,
                   errlen)) ||
      (rc = sf_int(h, "var_version", 0, INT64_MAX, &v, path, err, errlen)))
    return rc;
  p->var_version = (uint64_t)v;
  if ((rc = sf_place(p, path, err, errlen)) ||
      (rc = sf_str(h, "optimizer", p->optimizer, sizeof p->optimizer, path,
                   err, errlen)) ||
      (rc = sf_slots(p, h, path, err, errlen)) ||
      (rc = sf_sections_list(h, p, path, err, errlen)) ||
      (rc = sf_int(h, "data_bytes", 0, INT64_MAX, &v, path, err, errlen)) ||
      (rc = sf_int(h, "data_crc32c", 0, UINT32_MAX, &x, path, err, errlen)))
    return rc;
  *data_bytes = (uint64_t)v;
  *data_crc = (uint32_t)x;
  return 0;
}
