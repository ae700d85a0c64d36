/* Reading shard checkpoint files back (the format is in ckpt.c) and
 * restoring a shard from them.
 *
 * Happy path: ps__ckpt_load_shard lists the parts of the variable in the
 * folder, works out from the saved layout (TF's "div" row split, the same
 * the chief places with) which parts hold rows of the shard being
 * restored, maps and checks each of those whole (ps__ckpt_part_parse),
 * checks that they belong together (one checkpoint id and step, one
 * sharding, one variable) and copies their rows into a new shard built
 * aside; the caller swaps it in.
 * Failure modes, each refused with a message naming the file: a file
 * shorter or longer than its header says, a bad magic or CRC (header or
 * data), a header field of the wrong type or out of range, sizes whose
 * products overflow (a huge n_rows does not wrap to a small size), a part
 * whose row range is not its place in the saved layout (overlapping or
 * missing rows), ids outside the part's rows or of another shard, a row
 * id twice, a part of another variable, shape, optimizer or checkpoint, a
 * part missing. Every check comes before the first byte is copied.
 */
#include "ps/ps_int.h"
#include "ps/ckpt_file.h"
#include "common/crc32c.h"
#include "common/err.h"
#include "common/partition.h"
#include "common/size.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <msgpack.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define PS__MAGIC "TSRSHARD"
#define PS__MAX_PARTS 65536

/* ---- the header ----------------------------------------------------------*/

static const msgpack_object *cl_get(const msgpack_object *map, const char *k) {
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
static int cl_int(const msgpack_object *h, const char *k, int64_t lo,
                  int64_t hi, int64_t *out, const char *path, char *err,
                  size_t errlen) {
  const msgpack_object *o = cl_get(h, k);
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

static int cl_str(const msgpack_object *h, const char *k, char *buf,
                  size_t len, const char *path, char *err, size_t errlen) {
  const msgpack_object *o = cl_get(h, k);
  if (!o || o->type != MSGPACK_OBJECT_STR || o->via.str.size >= len ||
      memchr(o->via.str.ptr, 0, o->via.str.size))
    return tsr_errf(err, errlen, TSR_EFORMAT, "%s: header key %s is missing, "
                    "not a string or longer than %zu bytes", path, k, len - 1);
  memcpy(buf, o->via.str.ptr, o->via.str.size);
  buf[o->via.str.size] = 0;
  return 0;
}

static int cl_bool(const msgpack_object *h, const char *k, bool *out,
                   const char *path, char *err, size_t errlen) {
  const msgpack_object *o = cl_get(h, k);
  if (!o || o->type != MSGPACK_OBJECT_BOOLEAN)
    return tsr_errf(err, errlen, TSR_EFORMAT, "%s: header key %s is missing "
                    "or not a boolean", path, k);
  *out = o->via.boolean;
  return 0;
}

/* The header's fields, each typed and in range. */
static int cl_fields(ps_ckpt_part *p, const msgpack_object *h,
                     const char *path, char *err, size_t errlen) {
  char fmt[32];
  int64_t v, x;
  int rc;
  if ((rc = cl_str(h, "format", fmt, sizeof fmt, path, err, errlen)))
    return rc;
  if (strcmp(fmt, "tessera-shard"))
    return tsr_errf(err, errlen, TSR_EFORMAT, "%s: format \"%s\" is not "
                    "tessera-shard", path, fmt);
  if ((rc = cl_int(h, "version", 0, INT32_MAX, &v, path, err, errlen)))
    return rc;
  if (v != 2)
    return tsr_errf(err, errlen, TSR_EFORMAT, "%s: shard file version %" PRId64
                    "; this build reads version 2 (files of version 1 carry no "
                    "checkpoint id)", path, v);
  if ((rc = cl_str(h, "checkpoint_id", p->ckpt_id, sizeof p->ckpt_id, path,
                   err, errlen)) ||
      (rc = cl_int(h, "checkpoint_step", 0, TSR_STEP_MAX, &p->ckpt_step, path,
                   err, errlen)) ||
      (rc = cl_str(h, "name", p->name, sizeof p->name, path, err, errlen)) ||
      (rc = cl_bool(h, "sparse", &p->sparse, path, err, errlen)) ||
      (rc = cl_bool(h, "bounded", &p->bounded, path, err, errlen)) ||
      (rc = cl_int(h, "num_shards", 1, PS__MAX_PARTS, &v, path, err,
                   errlen)) ||
      (rc = cl_int(h, "shard", 0, v - 1, &x, path, err, errlen)))
    return rc;
  p->num_shards = (int32_t)v;
  p->shard = (int32_t)x;
  if (!p->name[0])
    return tsr_errf(err, errlen, TSR_EFORMAT, "%s: empty variable name", path);
  const msgpack_object *o = cl_get(h, "shape");
  if (!o || o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size > TSR_MAX_RANK)
    return tsr_errf(err, errlen, TSR_EFORMAT,
                    "%s: header shape is missing, "
                    "not a list or of rank over %d",
                    path, TSR_MAX_RANK);
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
  if ((rc = cl_int(h, "width", 1, INT64_MAX, &p->width, path, err, errlen)))
    return rc;
  if (p->width != width)
    return tsr_errf(err, errlen, TSR_EFORMAT, "%s: width %" PRId64 " is not "
                    "the product of shape[1:] (%" PRId64 ")", path, p->width,
                    width);
  int64_t dim0 = p->rank ? p->shape[0] : 1;
  if ((rc = cl_int(h, "row0", 0, TSR_STEP_MAX, &p->row0, path, err,
                   errlen)) ||
      (rc = cl_int(h, "rows", 0, TSR_STEP_MAX, &p->rows, path, err, errlen)) ||
      (rc = cl_int(h, "n_rows", 0, TSR_STEP_MAX, &p->n_rows, path, err,
                   errlen)) ||
      (rc = cl_int(h, "step", 0, TSR_STEP_MAX, &p->step, path, err,
                   errlen)) ||
      (rc = cl_int(h, "var_version", 0, INT64_MAX, &v, path, err, errlen)))
    return rc;
  p->var_version = (uint64_t)v;
  /* the part's place in the saved layout: parts never overlap, none is
   * missing from a complete set */
  if (!p->sparse || p->bounded) {
    if (p->num_shards > dim0)
      return tsr_errf(err, errlen, TSR_EFORMAT, "%s: %d shards of %" PRId64
                      " rows", path, p->num_shards, dim0);
    int64_t r0, rs;
    tsr_partition_rows(dim0, p->num_shards, p->shard, &r0, &rs);
    if (p->row0 != r0 || p->rows != rs)
      return tsr_errf(err, errlen, TSR_EFORMAT, "%s: rows [%" PRId64 ", +%"
                      PRId64 ") are not part %d of %d of %" PRId64 " rows "
                     "([%" PRId64 ", +%" PRId64 "))", path, p->row0, p->rows,
                     p->shard, p->num_shards, dim0, r0, rs);
    if (p->sparse ? p->n_rows > p->rows : p->n_rows != p->rows)
      return tsr_errf(err, errlen, TSR_EFORMAT, "%s: %" PRId64 " rows stored "
                      "in a part of %" PRId64 " rows", path, p->n_rows,
                      p->rows);
  }
  if ((rc = cl_str(h, "optimizer", p->optimizer, sizeof p->optimizer, path,
                   err, errlen)))
    return rc;
  o = cl_get(h, "slots");
  if (!o || o->type != MSGPACK_OBJECT_ARRAY ||
      o->via.array.size > KERN_OPTIM_MAX_SLOTS)
    return tsr_errf(err, errlen, TSR_EFORMAT, "%s: header slots is missing, "
                    "not a list or longer than %d", path, KERN_OPTIM_MAX_SLOTS);
  p->nslots = (int)o->via.array.size;
  for (int k = 0; k < p->nslots; k++) {
    const msgpack_object *n = &o->via.array.ptr[k];
    if (n->type != MSGPACK_OBJECT_STR || n->via.str.size >= 32)
      return tsr_errf(err, errlen, TSR_EFORMAT, "%s: slot %d has a bad name",
                      path, k);
    memcpy(p->slots[k], n->via.str.ptr, n->via.str.size);
    p->slots[k][n->via.str.size] = 0;
  }
  return 0;
}

int ps__ckpt_part_parse(const char *path, const uint8_t *b, size_t size,
                        ps_ckpt_part *p, char *err, size_t errlen) {
  memset(p, 0, sizeof *p);
  if (size < 16)
    return tsr_errf(err, errlen, TSR_ECORRUPT, "%s: truncated (%zu bytes, no "
                    "header)", path, size);
  if (memcmp(b, PS__MAGIC, 8))
    return tsr_errf(err, errlen, TSR_EFORMAT, "%s: not a tessera shard file "
                    "(bad magic)", path);
  uint32_t hlen, hcrc;
  memcpy(&hlen, b + 8, 4);
  if ((uint64_t)hlen + 16 > size)
    return tsr_errf(err, errlen, TSR_ECORRUPT, "%s: truncated (header of %u "
                    "bytes, file of %zu)", path, hlen, size);
  memcpy(&hcrc, b + 12 + hlen, 4);
  if (tsr_crc32c(0, b + 12, hlen) != hcrc)
    return tsr_errf(err, errlen, TSR_ECORRUPT, "%s: header CRC32C mismatch",
                    path);
  msgpack_unpacked up;
  msgpack_unpacked_init(&up);
  int rc = 0;
  if (msgpack_unpack_next(&up, (const char *)b + 12, hlen, NULL) !=
      MSGPACK_UNPACK_SUCCESS) {
    rc = tsr_errf(err, errlen, TSR_EFORMAT, "%s: header is not msgpack", path);
    goto out;
  }
  const msgpack_object *h = &up.data;
  if ((rc = cl_fields(p, h, path, err, errlen))) goto out;
  int64_t data_bytes, crc;
  if ((rc = cl_int(h, "data_bytes", 0, INT64_MAX, &data_bytes, path, err,
                   errlen)) ||
      (rc = cl_int(h, "data_crc32c", 0, UINT32_MAX, &crc, path, err, errlen)))
    goto out;
  /* what the rows and slots take, checked: a huge n_rows must not wrap */
  uint64_t sec, want, ids = 0;
  if (tsr_mul_u64((uint64_t)p->n_rows, (uint64_t)p->width, &sec) ||
      tsr_mul_u64(sec, 4, &sec) ||
      tsr_mul_u64(sec, (uint64_t)(1 + p->nslots), &want) ||
      (p->sparse && tsr_mul_u64((uint64_t)p->n_rows, 8, &ids)) ||
      tsr_add_u64(want, ids, &want)) {
    rc = tsr_errf(err, errlen, TSR_EFORMAT, "%s: %" PRId64 " rows of width %"
                  PRId64 " with %d slot(s) overflow a size", path, p->n_rows,
                  p->width, p->nslots);
    goto out;
  }
  if ((uint64_t)data_bytes != want) {
    rc = tsr_errf(err, errlen, TSR_EFORMAT, "%s: data_bytes %" PRId64 " does "
                  "not match the header's rows and slots (%" PRIu64 ")", path,
                  data_bytes, want);
    goto out;
  }
  uint64_t base = 16 + (uint64_t)hlen;
  if (want > size || base + want != size) {
    rc = tsr_errf(err, errlen, TSR_ECORRUPT, "%s: truncated or padded: %zu "
                  "bytes, the header says %" PRIu64, path, size,
                  want > size ? want : base + want);
    goto out;
  }
  p->data = b + base;
  p->data_bytes = want;
  if (tsr_crc32c(0, p->data, want) != (uint32_t)crc) {
    rc = tsr_errf(err, errlen, TSR_ECORRUPT, "%s: data CRC32C mismatch (file "
                  "damaged)", path);
    goto out;
  }
  p->off_ids = 0;
  p->off_value = ids;
  for (int k = 0; k < p->nslots; k++)
    p->off_slot[k] = ids + sec * (uint64_t)(k + 1);
  /* every id of a sparse part belongs to the part */
  for (int64_t r = 0; p->sparse && r < p->n_rows; r++) {
    int64_t id;
    memcpy(&id, p->data + (size_t)r * 8, 8);
    bool in = p->bounded ? id >= p->row0 && id - p->row0 < p->rows
                         : id >= 0 && id % p->num_shards == p->shard;
    if (!in) {
      rc = tsr_errf(err, errlen, TSR_EFORMAT, "%s: row id %" PRId64 " (row %"
                    PRId64 ") does not belong to part %d of %d", path, id, r,
                    p->shard, p->num_shards);
      goto out;
    }
  }
out:
  msgpack_unpacked_destroy(&up);
  return rc;
}

/* ---- restoring a shard -----------------------------------------------------*/

typedef struct {
  char path[4096];
  void *map;
  size_t size;
  int shard, num_shards; /* from the file name */
  ps_ckpt_part p;
} cl_file;

static void cl_unmap(cl_file *f) {
  if (f->map) munmap(f->map, f->size);
  f->map = NULL;
}

static int cl_map(cl_file *f, char *err, size_t errlen) {
  int fd = open(f->path, O_RDONLY);
  if (fd < 0)
    return tsr_errf(err, errlen, -errno, "%s: cannot open: %s", f->path,
                    strerror(errno));
  struct stat st;
  if (fstat(fd, &st)) {
    close(fd);
    return tsr_errf(err, errlen, TSR_EIO, "%s: cannot stat", f->path);
  }
  f->size = (size_t)st.st_size;
  if (f->size < 16) {
    close(fd);
    return tsr_errf(err, errlen, TSR_ECORRUPT, "%s: truncated (%zu bytes, no "
                    "header)", f->path, f->size);
  }
  f->map = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (f->map == MAP_FAILED) {
    f->map = NULL;
    return tsr_errf(err, errlen, TSR_EIO, "%s: mmap failed", f->path);
  }
  return 0;
}

/* The part agrees with the shard restored from it. */
static int cl_matches(const ps_ckpt_part *p, const char *path,
                      const ps_shard *s, char *err, size_t errlen) {
  if (strcmp(p->name, s->spec.var.name))
    return tsr_errf(err, errlen, TSR_ESHAPE,
                    "%s: holds variable \"%s\", not "
                    "%s",
                    path, p->name, s->spec.var.name);
  if (p->nslots != s->nslots)
    return tsr_errf(err, errlen, TSR_ESHAPE,
                    "%s: saved with %d optimizer slot(s), the %s optimizer of "
                    "%s has %d",
                    path, p->nslots, tsr_optim_name(s->spec.optim.kind),
                    s->spec.var.name, s->nslots);
  bool same = p->rank == s->spec.var.rank &&
              p->sparse == ps_var_spec_sparse(&s->spec) &&
              p->bounded == s->spec.bounded && p->width == s->width;
  for (int i = 0; same && i < p->rank; i++)
    same = p->shape[i] == s->spec.var.shape[i];
  if (!same)
    return tsr_errf(err, errlen, TSR_ESHAPE,
                    "%s: saved shape/kind does not match variable %s", path,
                    s->spec.var.name);
  for (int k = 0; k < p->nslots; k++)
    if (strcmp(p->slots[k], kern_optim_slot_name(&s->spec.optim, k)))
      return tsr_errf(err, errlen, TSR_ESHAPE,
                      "%s: saved slot %d is \"%s\", the optimizer of %s has "
                      "\"%s\"",
                      path, k, p->slots[k], s->spec.var.name,
                      kern_optim_slot_name(&s->spec.optim, k));
  return 0;
}

/* Whether saved part k of n can hold rows of the shard being restored. */
static bool cl_needed(const ps_var_spec *spec, int k, int n) {
  if (ps_var_spec_sparse(spec) && !spec->bounded)
    return n != spec->shard.num_shards || k == spec->shard.shard;
  int64_t dim0 = spec->var.rank ? spec->var.shape[0] : 1, r0, rs;
  tsr_partition_rows(dim0, n, k, &r0, &rs);
  return r0 < spec->shard.row0 + spec->shard.rows && spec->shard.row0 < r0 + rs;
}

static int cl_copy_rows(ps_shard *s, ps_mem *mem, const cl_file *f,
                        int64_t *covered, uint64_t *seen, char *err,
                        size_t errlen) {
  const ps_ckpt_part *p = &f->p;
  size_t W = (size_t)s->width;
  if (!ps_var_spec_sparse(&s->spec)) {
    int64_t lo = p->row0 > s->spec.shard.row0 ? p->row0 : s->spec.shard.row0;
    int64_t hi0 = p->row0 + p->n_rows,
            hi1 = s->spec.shard.row0 + s->spec.shard.rows;
    int64_t hi = hi0 < hi1 ? hi0 : hi1;
    if (hi <= lo) return 0;
    size_t cnt = (size_t)(hi - lo) * W * 4;
    size_t src = (size_t)(lo - p->row0) * W * 4,
           dst = (size_t)(lo - s->spec.shard.row0) * W;
    memcpy(s->w + dst, p->data + p->off_value + src, cnt);
    for (int k = 0; k < s->nslots; k++)
      memcpy(s->slots[k] + dst, p->data + p->off_slot[k] + src, cnt);
    *covered += hi - lo;
    return 0;
  }
  for (int64_t r = 0; r < p->n_rows; r++) {
    int64_t id;
    memcpy(&id, p->data + p->off_ids + (size_t)r * 8, 8);
    if (ps__spec_owns_id(&s->spec, id)) continue;
    float *rec;
    size_t at;
    int created, rc = ps__rows_insert_r(&s->rows, mem, id, &rec, &at, &created);
    if (!rc && seen) { /* a materialized table holds every row already */
      created = !(seen[at >> 6] >> (at & 63) & 1);
      seen[at >> 6] |= (uint64_t)1 << (at & 63);
    }
    if (rc)
      return tsr_errf(err, errlen, rc,
                      "%s: restoring row %" PRId64
                      " of %s: "
                      "%s",
                      f->path, id, s->spec.var.name, tsr_strerror(rc));
    if (!created)
      return tsr_errf(err, errlen, TSR_ECORRUPT,
                      "%s: row id %" PRId64
                      " of %s "
                      "is saved twice",
                      f->path, id, s->spec.var.name);
    size_t so = (size_t)r * W * 4;
    memcpy(rec, p->data + p->off_value + so, W * 4);
    for (int k = 0; k < s->nslots; k++)
      memcpy(rec + (size_t)(k + 1) * W, p->data + p->off_slot[k] + so, W * 4);
  }
  return 0;
}

/* "<enc>.part-<k>-of-<n>.tshard" -> k, n. */
static bool cl_part_name(const char *name, const char *prefix, size_t plen,
                         int *k, int *n) {
  size_t L = strlen(name);
  if (L <= plen + 7 || strncmp(name, prefix, plen) ||
      strcmp(name + L - 7, ".tshard"))
    return false;
  char tail[64];
  size_t tl = L - plen - 7;
  if (tl >= sizeof tail) return false;
  memcpy(tail, name + plen, tl);
  tail[tl] = 0;
  char *e1, *e2;
  long a = strtol(tail, &e1, 10);
  if (e1 == tail || strncmp(e1, "-of-", 4)) return false;
  long b = strtol(e1 + 4, &e2, 10);
  if (e2 == e1 + 4 || *e2 || b < 1 || b > PS__MAX_PARTS || a < 0 || a >= b)
    return false;
  *k = (int)a;
  *n = (int)b;
  return true;
}

int ps__ckpt_load_shard(const ps_var_spec *spec, ps_mem *mem, const char *dir,
                        const ps_ckpt_ident *want, ps_shard **out, char *err,
                        size_t errlen) {
  char enc[3 * TSR_VAR_NAME_MAX + 1], prefix[3 * TSR_VAR_NAME_MAX + 16];
  ps__ckpt_enc_name(spec->var.name, enc, sizeof enc);
  snprintf(prefix, sizeof prefix, "%s.part-", enc);
  size_t plen = strlen(prefix);
  DIR *d = opendir(dir);
  if (!d)
    return tsr_errf(err, errlen, -errno, "%s: cannot open checkpoint folder: "
                    "%s", dir, strerror(errno));
  cl_file *files = NULL;
  int n = 0, cap = 0, rc = 0, nsh = 0;
  ps_shard *s = NULL;
  uint64_t *seen = NULL; /* materialized: rows restored so far */
  struct dirent *e;
  /* the parts of this variable, by name */
  while ((e = readdir(d))) {
    int k, ns;
    if (!cl_part_name(e->d_name, prefix, plen, &k, &ns)) continue;
    if (n && ns != nsh) {
      rc = tsr_errf(err, errlen, TSR_ECORRUPT,
                    "%s: parts of %s saved under "
                    "%d and %d shards are mixed",
                    dir, spec->var.name, nsh, ns);
      goto out;
    }
    nsh = ns;
    if (n == cap) {
      int nc = cap ? cap * 2 : 8;
      cl_file *nf = ps__realloc(mem, files, (size_t)cap * sizeof *nf,
                                (size_t)nc * sizeof *nf);
      if (!nf) {
        rc = tsr_errf(err, errlen, TSR_ENOMEM, "out of memory listing %s", dir);
        goto out;
      }
      files = nf;
      cap = nc;
    }
    cl_file *f = &files[n++];
    memset(f, 0, sizeof *f);
    f->shard = k;
    f->num_shards = ns;
    snprintf(f->path, sizeof f->path, "%s/%s", dir, e->d_name);
  }
  if (n == 0) {
    rc = tsr_errf(err, errlen, TSR_ENOTFOUND, "%s: no saved parts of %s", dir,
                  spec->var.name);
    goto out;
  }
  /* the parts that hold rows of this shard: all there, each checked */
  for (int k = 0; k < nsh; k++) {
    if (!cl_needed(spec, k, nsh)) continue;
    cl_file *f = NULL;
    for (int i = 0; i < n; i++)
      if (files[i].shard == k) f = &files[i];
    if (!f) {
      rc = tsr_errf(err, errlen, TSR_ENOTFOUND,
                    "%s: part %d of %d of %s is "
                    "missing",
                    dir, k, nsh, spec->var.name);
      goto out;
    }
    if ((rc = cl_map(f, err, errlen)) ||
        (rc = ps__ckpt_part_parse(f->path, f->map, f->size, &f->p, err,
                                  errlen)))
      goto out;
    if (f->p.shard != f->shard || f->p.num_shards != f->num_shards) {
      rc = tsr_errf(err, errlen, TSR_EFORMAT, "%s: holds part %d of %d, its "
                    "name says %d of %d", f->path, f->p.shard, f->p.num_shards,
                    f->shard, f->num_shards);
      goto out;
    }
  }
  if ((rc = ps__shard_new(spec, mem, &s, err, errlen))) goto out;
  const ps_ckpt_part *first = NULL;
  for (int i = 0; i < n; i++) {
    if (!files[i].map) continue;
    const ps_ckpt_part *p = &files[i].p;
    if ((rc = cl_matches(p, files[i].path, s, err, errlen))) goto out;
    if (want && want->id[0] &&
        (strcmp(p->ckpt_id, want->id) || p->ckpt_step != want->step)) {
      rc = tsr_errf(err, errlen, TSR_ESTALE, "%s: belongs to checkpoint \"%s\" "
                    "of step %" PRId64 ", not \"%s\" of step %" PRId64 " (a "
                    "file from another checkpoint)", files[i].path, p->ckpt_id,
                    p->ckpt_step, want->id, want->step);
      goto out;
    }
    if (!first) first = p;
    if (strcmp(p->ckpt_id, first->ckpt_id) ||
        p->ckpt_step != first->ckpt_step) {
      rc = tsr_errf(err, errlen, TSR_ESTALE,
                    "%s: belongs to checkpoint \"%s\" "
                    "of step %" PRId64
                    ", other parts of %s to \"%s\" of step %" PRId64,
                    files[i].path, p->ckpt_id, p->ckpt_step, spec->var.name,
                    first->ckpt_id, first->ckpt_step);
      goto out;
    }
  }
  s->step = 0;
  s->version = 0;
  int64_t covered = 0;
  if (s->rows.direct &&
      !(seen = ps__calloc(mem, (s->rows.count + 63) / 64, sizeof *seen))) {
    rc = tsr_errf(err, errlen, TSR_ENOMEM, "%s: out of memory restoring %s",
                  dir, spec->var.name);
    goto out;
  }
  for (int i = 0; i < n; i++) {
    if (!files[i].map) continue;
    const ps_ckpt_part *p = &files[i].p;
    if (p->step > s->step) s->step = p->step;
    if (p->var_version > s->version) s->version = p->var_version;
    if ((rc = cl_copy_rows(s, mem, &files[i], &covered, seen, err, errlen)))
      goto out;
  }
  if (!ps_var_spec_sparse(&s->spec) && covered != s->spec.shard.rows) {
    rc = tsr_errf(err, errlen, TSR_ENOTFOUND,
                  "%s: the saved parts cover %" PRId64 " of rows [%" PRId64
                  ", %" PRId64 ")",
                  s->spec.var.name, covered, s->spec.shard.row0,
                  s->spec.shard.row0 + s->spec.shard.rows);
    goto out;
  }
  s->version++;
  *out = s;
  s = NULL;
out:
  ps__free(mem, seen);
  if (s) ps__shard_free(s, mem);
  for (int i = 0; i < n; i++) cl_unmap(&files[i]);
  ps__free(mem, files);
  closedir(d);
  return rc;
}

int ps_ckpt_file_check(const char *path, ps_ckpt_file_info *info, char *err,
                       size_t errlen) {
  cl_file f;
  memset(&f, 0, sizeof f);
  snprintf(f.path, sizeof f.path, "%s", path);
  int rc = cl_map(&f, err, errlen);
  if (!rc) rc = ps__ckpt_part_parse(f.path, f.map, f.size, &f.p, err, errlen);
  if (!rc && info) {
    memset(info, 0, sizeof *info);
    snprintf(info->name, sizeof info->name, "%s", f.p.name);
    snprintf(info->ckpt_id, sizeof info->ckpt_id, "%s", f.p.ckpt_id);
    info->ckpt_step = f.p.ckpt_step;
    info->shard = f.p.shard;
    info->num_shards = f.p.num_shards;
    info->sparse = f.p.sparse;
    info->n_rows = f.p.n_rows;
    info->bytes = f.size;
  }
  cl_unmap(&f);
  return rc;
}
