/* Shard checkpoint files.
 *
 * One file per saved shard part, named <var>.part-<k>-of-<n>.tshard (the
 * variable name with every byte outside [A-Za-z0-9._-] written as %XX):
 *
 *   offset 0    8 bytes  magic "TSRSHARD"
 *   offset 8    u32 LE   H, the header length
 *   offset 12   H bytes  header: a msgpack map (below)
 *   offset 12+H u32 LE   CRC32C of the header bytes
 *   offset 16+H          data: the sections back to back, little-endian
 *
 * Header keys: format "tessera-shard", version 1, name, shape (full
 * variable), sparse, bounded, shard, num_shards, row0, rows, width,
 * optimizer (Keras name), slots (slot names in order), step (applies, as
 * Adam's t), var_version, n_rows (rows stored), data_bytes, data_crc32c
 * (CRC32C of all data bytes), sections: a list of {name, dtype ("<f4" or
 * "<i8", numpy's spelling), shape, offset (from the data start), nbytes}.
 * Dense parts hold "value" [rows, ...] and one "slot/<name>" each; sparse
 * parts hold "ids" [n_rows] then "value" and the slots as [n_rows, width].
 * From Python:
 *   b = open(f, 'rb').read(); H = struct.unpack('<I', b[8:12])[0]
 *   h = msgpack.unpackb(b[12:12+H]); base = 16 + H
 *   for s in h['sections']: np.frombuffer(b, s['dtype'], offset=base +
 *       s['offset'], count=s['nbytes'] // np.dtype(s['dtype']).itemsize)
 *
 * Save writes <file>.tmp, fsyncs it, renames it over <file> and fsyncs
 * the folder. Restore gathers the rows a shard must hold from every part
 * of its variable, whatever sharding they were saved under; it checks the
 * size and both CRCs of every part it reads and builds a new shard aside,
 * so a truncated or corrupt file fails the restore whole.
 */
#include "ps/ps_int.h"
#include "common/crc32c.h"
#include "common/err.h"

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

static int ck_fail(char *err, size_t errlen, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int ck_fail(char *err, size_t errlen, int rc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
  return rc;
}

static void ck_enc_name(const char *name, char *out, size_t len) {
  size_t o = 0;
  for (const unsigned char *p = (const unsigned char *)name; *p && o + 4 < len;
       p++) {
    if ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
        (*p >= '0' && *p <= '9') || *p == '.' || *p == '_' || *p == '-')
      out[o++] = (char)*p;
    else
      o += (size_t)snprintf(out + o, len - o, "%%%02X", *p);
  }
  out[o] = 0;
}

int ps__ckpt_file_name(const ps_var_spec *s, char *buf, size_t len) {
  char enc[3 * PS_NAME_MAX + 1];
  ck_enc_name(s->name, enc, sizeof enc);
  int n = snprintf(buf, len, "%s.part-%d-of-%d.tshard", enc, s->shard,
                   s->num_shards);
  return n < 0 || (size_t)n >= len ? TSR_ERANGE : 0;
}

/* ---- save ------------------------------------------------------------------*/

static void pk_str(msgpack_packer *pk, const char *s) {
  size_t n = strlen(s);
  msgpack_pack_str(pk, n);
  msgpack_pack_str_body(pk, s, n);
}

static void pk_section(msgpack_packer *pk, const char *name, const char *dt,
                       int64_t d0, int64_t d1, uint64_t off, uint64_t nbytes) {
  msgpack_pack_map(pk, 5);
  pk_str(pk, "name");
  pk_str(pk, name);
  pk_str(pk, "dtype");
  pk_str(pk, dt);
  pk_str(pk, "shape");
  msgpack_pack_array(pk, d1 >= 0 ? 2 : 1);
  msgpack_pack_int64(pk, d0);
  if (d1 >= 0) msgpack_pack_int64(pk, d1);
  pk_str(pk, "offset");
  msgpack_pack_uint64(pk, off);
  pk_str(pk, "nbytes");
  msgpack_pack_uint64(pk, nbytes);
}

typedef struct {
  FILE *f;
  uint32_t crc;
  int section; /* -1 ids, 0 value, k slot k */
  size_t W;
  int err;
} ck_writer;

static void ck_put(ck_writer *w, const void *p, size_t n) {
  w->crc = tsr_crc32c(w->crc, p, n);
  if (w->f && fwrite(p, 1, n, w->f) != n) w->err = errno ? -errno : TSR_EIO;
}

static void ck_put_row(void *ctx, int64_t id, const float *rec) {
  ck_writer *w = ctx;
  if (w->section < 0)
    ck_put(w, &id, sizeof id);
  else
    ck_put(w, rec + (size_t)w->section * w->W, w->W * sizeof(float));
}

static int ck_fsync_dir(const char *dir) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY);
  if (fd < 0) return -errno;
  int rc = fsync(fd) ? -errno : 0;
  close(fd);
  return rc;
}

int ps__ckpt_save_shard(const ps_shard *s, const char *dir, char *err,
                        size_t errlen) {
  char fname[3 * PS_NAME_MAX + 64], path[4096], tmp[4200];
  int rc = ps__ckpt_file_name(&s->spec, fname, sizeof fname);
  if (rc) return ck_fail(err, errlen, rc, "%s: name too long", s->spec.name);
  snprintf(path, sizeof path, "%s/%s", dir, fname);
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  size_t W = (size_t)s->width;
  uint64_t nrows = s->spec.sparse ? s->rows.count : (uint64_t)s->spec.rows;
  uint64_t sec_bytes = nrows * W * sizeof(float);
  int nsec = 1 + s->nslots + (s->spec.sparse ? 1 : 0);
  uint64_t data_bytes = sec_bytes * (uint64_t)(1 + s->nslots) +
                        (s->spec.sparse ? nrows * 8 : 0);

  /* the data CRC goes in the header, so compute it first */
  uint32_t dcrc = 0;
  ck_writer w = {NULL, 0, 0, W, 0};
  if (s->spec.sparse) {
    /* a CRC-only pass: with no file nothing is written */
    for (w.section = -1; w.section <= s->nslots; w.section++)
      ps__rows_each(&s->rows, ck_put_row, &w);
    dcrc = w.crc;
  } else {
    dcrc = tsr_crc32c(dcrc, s->w, sec_bytes);
    for (int k = 0; k < s->nslots; k++)
      dcrc = tsr_crc32c(dcrc, s->slots[k], sec_bytes);
  }

  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 20);
  pk_str(&pk, "format"); pk_str(&pk, "tessera-shard");
  pk_str(&pk, "version"); msgpack_pack_int(&pk, 1);
  pk_str(&pk, "name"); pk_str(&pk, s->spec.name);
  pk_str(&pk, "shape");
  msgpack_pack_array(&pk, (size_t)s->spec.rank);
  for (int i = 0; i < s->spec.rank; i++) msgpack_pack_int64(&pk, s->spec.shape[i]);
  pk_str(&pk, "sparse");
  s->spec.sparse ? msgpack_pack_true(&pk) : msgpack_pack_false(&pk);
  pk_str(&pk, "bounded");
  s->spec.bounded ? msgpack_pack_true(&pk) : msgpack_pack_false(&pk);
  pk_str(&pk, "shard"); msgpack_pack_int(&pk, s->spec.shard);
  pk_str(&pk, "num_shards"); msgpack_pack_int(&pk, s->spec.num_shards);
  pk_str(&pk, "row0"); msgpack_pack_int64(&pk, s->spec.row0);
  pk_str(&pk, "rows"); msgpack_pack_int64(&pk, s->spec.rows);
  pk_str(&pk, "width"); msgpack_pack_int64(&pk, s->width);
  pk_str(&pk, "optimizer"); pk_str(&pk, tsr_optim_name(s->spec.optim.kind));
  pk_str(&pk, "slots");
  msgpack_pack_array(&pk, (size_t)s->nslots);
  for (int k = 0; k < s->nslots; k++)
    pk_str(&pk, kern_optim_slot_name(&s->spec.optim, k));
  pk_str(&pk, "step"); msgpack_pack_int64(&pk, s->step);
  pk_str(&pk, "var_version"); msgpack_pack_uint64(&pk, s->version);
  pk_str(&pk, "n_rows"); msgpack_pack_uint64(&pk, nrows);
  pk_str(&pk, "data_bytes"); msgpack_pack_uint64(&pk, data_bytes);
  pk_str(&pk, "data_crc32c"); msgpack_pack_uint32(&pk, dcrc);
  pk_str(&pk, "sections");
  msgpack_pack_array(&pk, (size_t)nsec);
  uint64_t off = 0;
  int64_t rows_dim = (int64_t)nrows;
  if (s->spec.sparse) {
    pk_section(&pk, "ids", "<i8", rows_dim, -1, off, nrows * 8);
    off += nrows * 8;
  }
  pk_section(&pk, "value", "<f4", rows_dim, (int64_t)W, off, sec_bytes);
  off += sec_bytes;
  for (int k = 0; k < s->nslots; k++) {
    char nm[64];
    snprintf(nm, sizeof nm, "slot/%s", kern_optim_slot_name(&s->spec.optim, k));
    pk_section(&pk, nm, "<f4", rows_dim, (int64_t)W, off, sec_bytes);
    off += sec_bytes;
  }
  pk_str(&pk, "written_by"); pk_str(&pk, "tessera-ps");

  FILE *f = fopen(tmp, "wb");
  if (!f) {
    rc = -errno;
    msgpack_sbuffer_destroy(&sb);
    return ck_fail(err, errlen, rc, "%s: cannot create: %s", tmp, strerror(-rc));
  }
  setvbuf(f, NULL, _IOFBF, 1 << 20);
  uint32_t hlen = (uint32_t)sb.size, hcrc = tsr_crc32c(0, sb.data, sb.size);
  w = (ck_writer){f, 0, 0, W, 0};
  ck_put(&w, PS__MAGIC, 8);
  ck_put(&w, &hlen, 4);
  ck_put(&w, sb.data, sb.size);
  ck_put(&w, &hcrc, 4);
  msgpack_sbuffer_destroy(&sb);
  if (s->spec.sparse) {
    for (w.section = -1; w.section <= s->nslots; w.section++)
      ps__rows_each(&s->rows, ck_put_row, &w);
  } else {
    ck_put(&w, s->w, sec_bytes);
    for (int k = 0; k < s->nslots; k++) ck_put(&w, s->slots[k], sec_bytes);
  }
  if (fflush(f) && !w.err) w.err = -errno;
  if (!w.err && fsync(fileno(f))) w.err = -errno;
  if (fclose(f) && !w.err) w.err = -errno;
  if (w.err) {
    unlink(tmp);
    return ck_fail(err, errlen, w.err, "%s: write failed: %s", tmp,
                   tsr_strerror(w.err));
  }
  if (rename(tmp, path)) {
    rc = -errno;
    unlink(tmp);
    return ck_fail(err, errlen, rc, "%s: rename failed: %s", path,
                   strerror(-rc));
  }
  if ((rc = ck_fsync_dir(dir)))
    return ck_fail(err, errlen, rc, "%s: fsync of the folder failed: %s", dir,
                   strerror(-rc));
  return 0;
}

/* ---- load ------------------------------------------------------------------*/

typedef struct {
  char path[4096];
  void *map;
  size_t size;
  const uint8_t *data; /* start of the data region */
  msgpack_unpacked up;
  int shard, num_shards, nslots;
  int64_t row0, rows, width, step, n_rows;
  uint64_t var_version;
  bool sparse;
  int64_t shape[PS_MAX_RANK];
  int rank;
  char slots[KERN_OPTIM_MAX_SLOTS][32];
  uint64_t off_ids, off_value, off_slot[KERN_OPTIM_MAX_SLOTS];
} ck_part;

static const msgpack_object *ck_get(const msgpack_object *map, const char *k) {
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

static int ck_int(const msgpack_object *map, const char *k, int64_t *out) {
  const msgpack_object *o = ck_get(map, k);
  if (!o) return TSR_EFORMAT;
  if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
    if (o->via.u64 > INT64_MAX) return TSR_EFORMAT;
    *out = (int64_t)o->via.u64;
  } else if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
    *out = o->via.i64;
  } else {
    return TSR_EFORMAT;
  }
  return 0;
}

static bool ck_streq(const msgpack_object *o, const char *s) {
  return o && o->type == MSGPACK_OBJECT_STR && o->via.str.size == strlen(s) &&
         memcmp(o->via.str.ptr, s, o->via.str.size) == 0;
}

static void ck_part_close(ck_part *p) {
  if (p->map && p->map != MAP_FAILED) munmap(p->map, p->size);
  msgpack_unpacked_destroy(&p->up);
  p->map = NULL;
}

/* Maps a part, checks its sizes and CRCs, and reads its header. */
static int ck_part_open(ck_part *p, const char *path, char *err,
                        size_t errlen) {
  memset(p, 0, sizeof *p);
  msgpack_unpacked_init(&p->up);
  snprintf(p->path, sizeof p->path, "%s", path);
  int fd = open(path, O_RDONLY);
  if (fd < 0)
    return ck_fail(err, errlen, -errno, "%s: cannot open: %s", path,
                   strerror(errno));
  struct stat st;
  if (fstat(fd, &st)) {
    close(fd);
    return ck_fail(err, errlen, TSR_EIO, "%s: cannot stat", path);
  }
  p->size = (size_t)st.st_size;
  if (p->size < 16) {
    close(fd);
    return ck_fail(err, errlen, TSR_ECORRUPT,
                   "%s: truncated (%zu bytes, no header)", path, p->size);
  }
  p->map = mmap(NULL, p->size, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (p->map == MAP_FAILED) {
    p->map = NULL;
    return ck_fail(err, errlen, TSR_EIO, "%s: mmap failed", path);
  }
  const uint8_t *b = p->map;
  if (memcmp(b, PS__MAGIC, 8))
    return ck_fail(err, errlen, TSR_EFORMAT, "%s: not a tessera shard file "
                   "(bad magic)", path);
  uint32_t hlen, hcrc;
  memcpy(&hlen, b + 8, 4);
  if ((uint64_t)hlen + 16 > p->size)
    return ck_fail(err, errlen, TSR_ECORRUPT,
                   "%s: truncated (header of %u bytes, file of %zu)", path,
                   hlen, p->size);
  memcpy(&hcrc, b + 12 + hlen, 4);
  if (tsr_crc32c(0, b + 12, hlen) != hcrc)
    return ck_fail(err, errlen, TSR_ECORRUPT, "%s: header CRC32C mismatch",
                   path);
  if (msgpack_unpack_next(&p->up, (const char *)b + 12, hlen, NULL) !=
      MSGPACK_UNPACK_SUCCESS)
    return ck_fail(err, errlen, TSR_EFORMAT, "%s: header is not msgpack", path);
  const msgpack_object *h = &p->up.data;
  int64_t v, data_bytes, crc, sh, ns;
  if (!ck_streq(ck_get(h, "format"), "tessera-shard") ||
      ck_int(h, "version", &v) || v != 1)
    return ck_fail(err, errlen, TSR_EFORMAT,
                   "%s: not a version-1 tessera-shard header", path);
  if (ck_int(h, "shard", &sh) || ck_int(h, "num_shards", &ns) ||
      ck_int(h, "row0", &p->row0) || ck_int(h, "rows", &p->rows) ||
      ck_int(h, "width", &p->width) || ck_int(h, "step", &p->step) ||
      ck_int(h, "n_rows", &p->n_rows) || ck_int(h, "data_bytes", &data_bytes) ||
      ck_int(h, "data_crc32c", &crc) || ck_int(h, "var_version", &v))
    return ck_fail(err, errlen, TSR_EFORMAT, "%s: header misses a key", path);
  p->shard = (int)sh;
  p->num_shards = (int)ns;
  p->var_version = (uint64_t)v;
  const msgpack_object *sp = ck_get(h, "sparse"), *shp = ck_get(h, "shape"),
                       *sl = ck_get(h, "slots");
  if (!sp || sp->type != MSGPACK_OBJECT_BOOLEAN || !shp ||
      shp->type != MSGPACK_OBJECT_ARRAY || shp->via.array.size > PS_MAX_RANK ||
      !sl || sl->type != MSGPACK_OBJECT_ARRAY ||
      sl->via.array.size > KERN_OPTIM_MAX_SLOTS || p->width < 1 ||
      p->n_rows < 0)
    return ck_fail(err, errlen, TSR_EFORMAT, "%s: header has a bad sparse, "
                   "shape, slots or width", path);
  p->sparse = sp->via.boolean;
  p->rank = (int)shp->via.array.size;
  for (int i = 0; i < p->rank; i++) {
    const msgpack_object *d = &shp->via.array.ptr[i];
    if (d->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
      return ck_fail(err, errlen, TSR_EFORMAT, "%s: bad shape", path);
    p->shape[i] = (int64_t)d->via.u64;
  }
  p->nslots = (int)sl->via.array.size;
  for (int k = 0; k < p->nslots; k++) {
    const msgpack_object *o = &sl->via.array.ptr[k];
    if (o->type != MSGPACK_OBJECT_STR || o->via.str.size >= 32)
      return ck_fail(err, errlen, TSR_EFORMAT, "%s: bad slot name", path);
    memcpy(p->slots[k], o->via.str.ptr, o->via.str.size);
    p->slots[k][o->via.str.size] = 0;
  }
  uint64_t sec = (uint64_t)p->n_rows * (uint64_t)p->width * 4;
  uint64_t want = sec * (uint64_t)(1 + p->nslots) +
                  (p->sparse ? (uint64_t)p->n_rows * 8 : 0);
  if ((uint64_t)data_bytes != want)
    return ck_fail(err, errlen, TSR_EFORMAT,
                   "%s: data_bytes %" PRId64 " does not match the header's "
                   "rows and slots (%" PRIu64 ")", path, data_bytes, want);
  uint64_t base = 16 + (uint64_t)hlen;
  if (base + want != p->size)
    return ck_fail(err, errlen, TSR_ECORRUPT,
                   "%s: truncated or padded: %zu bytes, the header says "
                   "%" PRIu64, path, p->size, base + want);
  p->data = b + base;
  if (tsr_crc32c(0, p->data, want) != (uint32_t)crc)
    return ck_fail(err, errlen, TSR_ECORRUPT, "%s: data CRC32C mismatch "
                   "(file damaged)", path);
  uint64_t off = 0;
  if (p->sparse) {
    p->off_ids = 0;
    off = (uint64_t)p->n_rows * 8;
  }
  p->off_value = off;
  for (int k = 0; k < p->nslots; k++) p->off_slot[k] = off + sec * (uint64_t)(k + 1);
  return 0;
}

/* The part agrees with the shard that restores from it. */
static int ck_part_check(const ck_part *p, const ps_shard *s, char *err,
                         size_t errlen) {
  if (p->nslots != s->nslots)
    return ck_fail(err, errlen, TSR_ESHAPE,
                   "%s: saved with %d optimizer slot(s), the %s optimizer of "
                   "%s has %d", p->path, p->nslots,
                   tsr_optim_name(s->spec.optim.kind), s->spec.name, s->nslots);
  bool same = p->rank == s->spec.rank && p->sparse == s->spec.sparse &&
              p->width == s->width;
  for (int i = 1; same && i < p->rank; i++)
    same = p->shape[i] == s->spec.shape[i];
  if (same && (!p->sparse || s->spec.bounded))
    same = p->shape[0] == s->spec.shape[0];
  if (!same)
    return ck_fail(err, errlen, TSR_ESHAPE,
                   "%s: saved shape/kind does not match variable %s",
                   p->path, s->spec.name);
  for (int k = 0; k < p->nslots; k++)
    if (strcmp(p->slots[k], kern_optim_slot_name(&s->spec.optim, k)))
      return ck_fail(err, errlen, TSR_ESHAPE,
                     "%s: saved slot %d is \"%s\", the optimizer of %s has "
                     "\"%s\"", p->path, k, p->slots[k], s->spec.name,
                     kern_optim_slot_name(&s->spec.optim, k));
  return 0;
}

static int ck_restore_parts(ps_shard *s, ps_mem *mem, ck_part *parts, int n,
                            char *err, size_t errlen) {
  size_t W = (size_t)s->width;
  int64_t covered = 0;
  for (int i = 0; i < n; i++) {
    ck_part *p = &parts[i];
    if (p->step > s->step) s->step = p->step;
    if (p->var_version > s->version) s->version = p->var_version;
    if (!s->spec.sparse) {
      int64_t lo = p->row0 > s->spec.row0 ? p->row0 : s->spec.row0;
      int64_t hi0 = p->row0 + p->n_rows, hi1 = s->spec.row0 + s->spec.rows;
      int64_t hi = hi0 < hi1 ? hi0 : hi1;
      if (hi <= lo) continue;
      size_t cnt = (size_t)(hi - lo) * W * 4;
      size_t src = (size_t)(lo - p->row0) * W * 4,
             dst = (size_t)(lo - s->spec.row0) * W;
      memcpy(s->w + dst, p->data + p->off_value + src, cnt);
      for (int k = 0; k < s->nslots; k++)
        memcpy(s->slots[k] + dst, p->data + p->off_slot[k] + src, cnt);
      covered += hi - lo;
      continue;
    }
    for (int64_t r = 0; r < p->n_rows; r++) {
      int64_t id;
      memcpy(&id, p->data + p->off_ids + (size_t)r * 8, 8);
      if (ps__spec_owns_id(&s->spec, id)) continue;
      float *rec;
      int created, rc = ps__rows_insert(&s->rows, mem, id, &rec, &created);
      if (rc)
        return ck_fail(err, errlen, rc, "%s: restoring row %" PRId64
                       " of %s: %s", p->path, id, s->spec.name,
                       tsr_strerror(rc));
      size_t so = (size_t)r * W * 4;
      memcpy(rec, p->data + p->off_value + so, W * 4);
      for (int k = 0; k < s->nslots; k++)
        memcpy(rec + (size_t)(k + 1) * W, p->data + p->off_slot[k] + so, W * 4);
    }
  }
  if (!s->spec.sparse && covered != s->spec.rows)
    return ck_fail(err, errlen, TSR_ENOTFOUND,
                   "%s: the saved parts cover %" PRId64 " of rows [%" PRId64
                   ", %" PRId64 ")", s->spec.name, covered, s->spec.row0,
                   s->spec.row0 + s->spec.rows);
  return 0;
}

int ps__ckpt_load_shard(const ps_var_spec *spec, ps_mem *mem, const char *dir,
                        ps_shard **out, char *err, size_t errlen) {
  char enc[3 * PS_NAME_MAX + 1], prefix[3 * PS_NAME_MAX + 16];
  ck_enc_name(spec->name, enc, sizeof enc);
  snprintf(prefix, sizeof prefix, "%s.part-", enc);
  size_t plen = strlen(prefix);
  DIR *d = opendir(dir);
  if (!d)
    return ck_fail(err, errlen, -errno, "%s: cannot open checkpoint folder: "
                   "%s", dir, strerror(errno));
  ck_part *parts = NULL;
  int n = 0, cap = 0, rc = 0;
  ps_shard *s = NULL;
  struct dirent *e;
  while ((e = readdir(d))) {
    size_t L = strlen(e->d_name);
    if (L <= plen + 7 || strncmp(e->d_name, prefix, plen) ||
        strcmp(e->d_name + L - 7, ".tshard"))
      continue;
    if (n == cap) {
      cap = cap ? cap * 2 : 8;
      ck_part *np = ps__realloc(mem, parts, (size_t)n * sizeof *np,
                                (size_t)cap * sizeof *np);
      if (!np) {
        rc = TSR_ENOMEM;
        goto out;
      }
      parts = np;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    rc = ck_part_open(&parts[n], path, err, errlen);
    n++;
    if (rc) goto out;
  }
  if (n == 0) {
    rc = ck_fail(err, errlen, TSR_ENOTFOUND, "%s: no saved parts of %s",
                 dir, spec->name);
    goto out;
  }
  for (int i = 0; i < n; i++) {
    if (parts[i].num_shards != parts[0].num_shards) {
      rc = ck_fail(err, errlen, TSR_ECORRUPT,
                   "%s: parts of %s saved under %d and %d shards are mixed",
                   dir, spec->name, parts[0].num_shards,
                   parts[i].num_shards);
      goto out;
    }
    for (int j = 0; j < i; j++)
      if (parts[j].shard == parts[i].shard) {
        rc = ck_fail(err, errlen, TSR_ECORRUPT, "%s: part %d of %s twice", dir,
                     parts[i].shard, spec->name);
        goto out;
      }
  }
  if (n != parts[0].num_shards) {
    rc = ck_fail(err, errlen, TSR_ENOTFOUND,
                 "%s: %d of the %d saved parts of %s are present", dir, n,
                 parts[0].num_shards, spec->name);
    goto out;
  }
  if ((rc = ps__shard_new(spec, mem, &s, err, errlen))) goto out;
  for (int i = 0; i < n; i++)
    if ((rc = ck_part_check(&parts[i], s, err, errlen))) goto out;
  s->step = 0;
  s->version = 0;
  if ((rc = ck_restore_parts(s, mem, parts, n, err, errlen))) goto out;
  s->version++;
  *out = s;
  s = NULL;
out:
  if (s) ps__shard_free(s, mem);
  for (int i = 0; i < n; i++) ck_part_close(&parts[i]);
  ps__free(mem, parts);
  closedir(d);
  return rc;
}
