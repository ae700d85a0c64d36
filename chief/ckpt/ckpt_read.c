/* Shard file reader; see ckpt_read.h. Files are read whole with one
 * read per file (they are written whole too). */
#include "chief/ckpt/ckpt_read.h"
#include "common/crc32c.h"
#include "common/err.h"
#include "common/grow.h"

#include <dirent.h>
#include <errno.h>
#include <msgpack.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  char name[256];
  int rank;
  int64_t shape[8];
  bool sparse;
  int shard, num_shards;
  int64_t row0, rows, width, step;
  uint64_t n_rows, data_bytes;
  uint32_t data_crc;
  char optimizer[16];
  int n_slots;
  char slots[4][32];
  /* sections we need */
  uint64_t ids_off, ids_bytes, val_off, val_bytes;
  bool has_ids, has_val;
} cr_hdr;

static const msgpack_object *cr_get(const msgpack_object *map, const char *k) {
  if (map->type != MSGPACK_OBJECT_MAP) return NULL;
  size_t kl = strlen(k);
  for (uint32_t i = 0; i < map->via.map.size; i++) {
    const msgpack_object_kv *kv = &map->via.map.ptr[i];
    if (kv->key.type == MSGPACK_OBJECT_STR && kv->key.via.str.size == kl &&
        memcmp(kv->key.via.str.ptr, k, kl) == 0)
      return &kv->val;
  }
  return NULL;
}

static bool cr_int(const msgpack_object *o, int64_t *out) {
  if (!o) return false;
  if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
    *out = (int64_t)o->via.u64;
    return true;
  }
  if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
    *out = o->via.i64;
    return true;
  }
  return false;
}

static bool cr_str(const msgpack_object *o, char *buf, size_t len) {
  if (!o || o->type != MSGPACK_OBJECT_STR || o->via.str.size >= len)
    return false;
  memcpy(buf, o->via.str.ptr, o->via.str.size);
  buf[o->via.str.size] = 0;
  return true;
}

/* Reads a whole file. */
static int cr_slurp(const char *path, uint8_t **data, size_t *len, char *err,
                    size_t errlen) {
  FILE *f = fopen(path, "rb");
  if (!f) return tsr_errf(err, errlen, -errno, "%s: %s", path, strerror(errno));
  if (fseek(f, 0, SEEK_END) != 0) {
    fclose(f);
    return tsr_errf(err, errlen, TSR_EIO, "%s: cannot seek", path);
  }
  long n = ftell(f);
  rewind(f);
  uint8_t *p = malloc(n > 0 ? (size_t)n : 1);
  if (!p) {
    fclose(f);
    return tsr_errf(err, errlen, TSR_ENOMEM, "%s: out of memory", path);
  }
  size_t r = fread(p, 1, (size_t)n, f);
  fclose(f);
  if (r != (size_t)n) {
    free(p);
    return tsr_errf(err, errlen, TSR_EIO, "%s: short read", path);
  }
  *data = p;
  *len = (size_t)n;
  return 0;
}

/* Parses and checks the header of a file held in memory; *base gets the
 * data offset. */
static int cr_header(const char *path, const uint8_t *b, size_t len,
                     cr_hdr *h, size_t *base, char *err, size_t errlen) {
  memset(h, 0, sizeof *h);
  if (len < 16 || memcmp(b, "TSRSHARD", 8) != 0)
    return tsr_errf(err, errlen, TSR_EFORMAT, "%s: not a shard file (magic)",
                    path);
  uint32_t H;
  memcpy(&H, b + 8, 4);
  if ((uint64_t)H + 16 > len)
    return tsr_errf(err, errlen, TSR_ECORRUPT,
                    "%s: truncated (header of %u bytes)", path, H);
  uint32_t hcrc;
  memcpy(&hcrc, b + 12 + H, 4);
  if (tsr_crc32c(0, b + 12, H) != hcrc)
    return tsr_errf(err, errlen, TSR_ECORRUPT, "%s: header CRC mismatch",
                    path);
  msgpack_unpacked u;
  msgpack_unpacked_init(&u);
  size_t off = 0;
  int rc = 0;
  if (msgpack_unpack_next(&u, (const char *)b + 12, H, &off) !=
      MSGPACK_UNPACK_SUCCESS) {
    rc = tsr_errf(err, errlen, TSR_ECORRUPT, "%s: header does not decode",
                  path);
    goto out;
  }
  const msgpack_object *m = &u.data, *o;
  int64_t x;
  char fmt[32];
  if (!cr_str(cr_get(m, "format"), fmt, sizeof fmt) ||
      strcmp(fmt, "tessera-shard") != 0 ||
      !cr_str(cr_get(m, "name"), h->name, sizeof h->name)) {
    rc = tsr_errf(err, errlen, TSR_EFORMAT, "%s: header lacks format/name",
                  path);
    goto out;
  }
  o = cr_get(m, "shape");
  if (!o || o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size > 8) {
    rc = tsr_errf(err, errlen, TSR_EFORMAT, "%s: bad shape", path);
    goto out;
  }
  h->rank = (int)o->via.array.size;
  for (int i = 0; i < h->rank; i++)
    if (!cr_int(&o->via.array.ptr[i], &h->shape[i]) || h->shape[i] < 0) {
      rc = tsr_errf(err, errlen, TSR_EFORMAT, "%s: bad shape", path);
      goto out;
    }
  o = cr_get(m, "sparse");
  h->sparse = o && o->type == MSGPACK_OBJECT_BOOLEAN && o->via.boolean;
  if (cr_int(cr_get(m, "shard"), &x)) h->shard = (int)x;
  if (cr_int(cr_get(m, "num_shards"), &x)) h->num_shards = (int)x;
  cr_int(cr_get(m, "row0"), &h->row0);
  cr_int(cr_get(m, "rows"), &h->rows);
  cr_int(cr_get(m, "width"), &h->width);
  cr_int(cr_get(m, "step"), &h->step);
  if (cr_int(cr_get(m, "n_rows"), &x)) h->n_rows = (uint64_t)x;
  if (cr_int(cr_get(m, "data_bytes"), &x)) h->data_bytes = (uint64_t)x;
  if (cr_int(cr_get(m, "data_crc32c"), &x)) h->data_crc = (uint32_t)x;
  cr_str(cr_get(m, "optimizer"), h->optimizer, sizeof h->optimizer);
  o = cr_get(m, "slots");
  if (o && o->type == MSGPACK_OBJECT_ARRAY)
    for (uint32_t i = 0; i < o->via.array.size && h->n_slots < 4; i++)
      if (cr_str(&o->via.array.ptr[i], h->slots[h->n_slots], 32))
        h->n_slots++;
  o = cr_get(m, "sections");
  if (o && o->type == MSGPACK_OBJECT_ARRAY) {
    for (uint32_t i = 0; i < o->via.array.size; i++) {
      const msgpack_object *s = &o->via.array.ptr[i];
      char nm[32];
      int64_t so, sb;
      if (!cr_str(cr_get(s, "name"), nm, sizeof nm) ||
          !cr_int(cr_get(s, "offset"), &so) ||
          !cr_int(cr_get(s, "nbytes"), &sb))
        continue;
      if (strcmp(nm, "ids") == 0) {
        h->has_ids = true;
        h->ids_off = (uint64_t)so;
        h->ids_bytes = (uint64_t)sb;
      } else if (strcmp(nm, "value") == 0) {
        h->has_val = true;
        h->val_off = (uint64_t)so;
        h->val_bytes = (uint64_t)sb;
      }
    }
  }
  *base = 16 + (size_t)H;
  if (h->width <= 0 || !h->has_val || (h->sparse && !h->has_ids)) {
    rc = tsr_errf(err, errlen, TSR_EFORMAT, "%s: header lacks width or "
                  "sections", path);
    goto out;
  }
  if (*base + h->data_bytes > len) {
    rc = tsr_errf(err, errlen, TSR_ECORRUPT,
                  "%s: truncated: %zu bytes, header says %llu", path, len,
                  (unsigned long long)(*base + h->data_bytes));
    goto out;
  }
  if (h->val_off + h->val_bytes > h->data_bytes ||
      h->ids_off + h->ids_bytes > h->data_bytes) {
    rc = tsr_errf(err, errlen, TSR_ECORRUPT, "%s: sections beyond the data",
                  path);
    goto out;
  }
out:
  msgpack_unpacked_destroy(&u);
  return rc;
}

void chief_ckpt_vars_free(chief_ckpt_var *vars, size_t n) {
  for (size_t i = 0; vars && i < n; i++) {
    for (int k = 0; k < vars[i].n_parts; k++) free(vars[i].files[k]);
    free(vars[i].files);
  }
  free(vars);
}

int chief_ckpt_scan(const char *folder, chief_ckpt_var **out, size_t *n_out,
                    char *err, size_t errlen) {
  *out = NULL;
  *n_out = 0;
  DIR *d = opendir(folder);
  if (!d) return tsr_errf(err, errlen, -errno, "%s: %s", folder,
                          strerror(errno));
  chief_ckpt_var *vars = NULL;
  size_t n = 0, cap = 0;
  struct dirent *e;
  int rc = 0;
  while ((e = readdir(d))) {
    size_t L = strlen(e->d_name);
    if (L < 7 || strcmp(e->d_name + L - 7, ".tshard") != 0) continue;
    size_t plen = strlen(folder) + L + 2;
    char *path = malloc(plen);
    if (!path) {
      rc = TSR_ENOMEM;
      break;
    }
    snprintf(path, plen, "%s/%s", folder, e->d_name);
    uint8_t *b;
    size_t len, base;
    cr_hdr h;
    if ((rc = cr_slurp(path, &b, &len, err, errlen)) == 0) {
      rc = cr_header(path, b, len, &h, &base, err, errlen);
      free(b);
    }
    if (rc) {
      free(path);
      break;
    }
    chief_ckpt_var *v = NULL;
    for (size_t i = 0; i < n; i++)
      if (strcmp(vars[i].name, h.name) == 0) v = &vars[i];
    if (!v) {
      if ((rc = tsr_grow(&vars, &cap, n, sizeof *vars, 16))) {
        free(path);
        break;
      }
      v = &vars[n++];
      memset(v, 0, sizeof *v);
      snprintf(v->name, sizeof v->name, "%s", h.name);
      v->rank = h.rank;
      memcpy(v->shape, h.shape, sizeof v->shape);
      v->sparse = h.sparse;
      v->width = h.width;
      v->num_shards = h.num_shards;
      snprintf(v->optimizer, sizeof v->optimizer, "%s", h.optimizer);
      v->n_slots = h.n_slots;
      memcpy(v->slots, h.slots, sizeof v->slots);
      v->files = calloc(CHIEF_CKPT_MAX_PARTS, sizeof *v->files);
      if (!v->files) {
        free(path);
        rc = TSR_ENOMEM;
        break;
      }
    }
    if (v->n_parts == CHIEF_CKPT_MAX_PARTS) {
      free(path);
      rc = tsr_errf(err, errlen, TSR_ERANGE, "%s: more than %d parts",
                    v->name, CHIEF_CKPT_MAX_PARTS);
      break;
    }
    if (h.shard == 0) v->step = h.step;
    v->files[v->n_parts++] = path;
    v->n_rows += h.n_rows;
    v->bytes += len;
  }
  closedir(d);
  if (rc) {
    chief_ckpt_vars_free(vars, n);
    return rc;
  }
  *out = vars;
  *n_out = n;
  return 0;
}

int chief_ckpt_load_value(const chief_ckpt_var *v, float *out,
                          uint8_t *present, char *err, size_t errlen) {
  int64_t dim0 = v->rank ? v->shape[0] : 1;
  uint8_t *have = present ? present : calloc((size_t)dim0, 1);
  if (!have) return TSR_ENOMEM;
  if (present) memset(present, 0, (size_t)dim0);
  int rc = 0;
  for (int k = 0; k < v->n_parts && !rc; k++) {
    const char *path = v->files[k];
    uint8_t *b;
    size_t len, base;
    cr_hdr h;
    if ((rc = cr_slurp(path, &b, &len, err, errlen))) break;
    rc = cr_header(path, b, len, &h, &base, err, errlen);
    if (!rc && tsr_crc32c(0, b + base, h.data_bytes) != h.data_crc)
      rc = tsr_errf(err, errlen, TSR_ECORRUPT, "%s: data CRC mismatch", path);
    if (!rc && h.width != v->width)
      rc = tsr_errf(err, errlen, TSR_EFORMAT, "%s: width %lld, other parts "
                    "%lld", path, (long long)h.width, (long long)v->width);
    size_t row_bytes = (size_t)v->width * sizeof(float);
    if (!rc && h.sparse) {
      uint64_t nr = h.ids_bytes / 8;
      if (h.val_bytes != nr * row_bytes)
        rc = tsr_errf(err, errlen, TSR_ECORRUPT, "%s: %llu ids but %llu value "
                      "bytes", path, (unsigned long long)nr,
                      (unsigned long long)h.val_bytes);
      for (uint64_t i = 0; !rc && i < nr; i++) {
        int64_t id;
        memcpy(&id, b + base + h.ids_off + i * 8, 8);
        if (id < 0 || id >= dim0) {
          rc = tsr_errf(err, errlen, TSR_ECORRUPT, "%s: id %lld outside "
                        "[0, %lld)", path, (long long)id, (long long)dim0);
          break;
        }
        memcpy(out + (size_t)id * (size_t)v->width,
               b + base + h.val_off + i * row_bytes, row_bytes);
        have[id] = 1;
      }
    } else if (!rc) {
      if (h.row0 < 0 || h.rows < 0 || h.row0 + h.rows > dim0 ||
          h.val_bytes != (uint64_t)h.rows * row_bytes)
        rc = tsr_errf(err, errlen, TSR_ECORRUPT, "%s: rows %lld+%lld do not "
                      "fit the variable", path, (long long)h.row0,
                      (long long)h.rows);
      else {
        memcpy(out + (size_t)h.row0 * (size_t)v->width, b + base + h.val_off,
               h.val_bytes);
        memset(have + h.row0, 1, (size_t)h.rows);
      }
    }
    free(b);
  }
  if (!rc && !v->sparse)
    for (int64_t r = 0; r < dim0; r++)
      if (!have[r]) {
        rc = tsr_errf(err, errlen, TSR_ECORRUPT, "%s: row %lld is in no part",
                      v->name, (long long)r);
        break;
      }
  if (!present) free(have);
  return rc;
}
