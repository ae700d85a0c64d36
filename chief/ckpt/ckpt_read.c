/* Variables of a checkpoint folder from its shard files; see ckpt_read.h.
 * Every file is mapped and checked whole (tsr_shardfile_open) each time
 * it is read: once for the listing, once for the values. */
#include "chief/ckpt/ckpt_read.h"
#include "common/ckpt/shardfile.h"
#include "common/err.h"
#include "common/grow.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(sizeof(((chief_ckpt_var *)0)->shape) ==
                   sizeof(((tsr_shardfile_hdr *)0)->shape),
               "a variable's shape is the file's");
_Static_assert(sizeof(((chief_ckpt_var *)0)->slots) ==
                   sizeof(((tsr_shardfile_hdr *)0)->slots),
               "a variable's slots are the file's");

void chief_ckpt_vars_free(chief_ckpt_var *vars, size_t n) {
  for (size_t i = 0; vars && i < n; i++) {
    for (int k = 0; k < vars[i].n_parts; k++) free(vars[i].files[k]);
    free(vars[i].files);
  }
  free(vars);
}

/* Whether part `h` is of the variable `v` found so far. */
static bool cr_same(const chief_ckpt_var *v, const tsr_shardfile_hdr *h) {
  if (v->rank != h->rank || v->sparse != h->sparse ||
      v->num_shards != h->num_shards || v->width != h->width)
    return false;
  for (int i = 0; i < h->rank; i++)
    if (v->shape[i] != h->shape[i]) return false;
  return true;
}

/* Notes one checked part of a variable, found under the name `fname`;
 * takes `path` on success. */
static int cr_note(chief_ckpt_var **vars, size_t *n, size_t *cap,
                   const tsr_shardfile *f, const char *fname, char *path,
                   char *err, size_t errlen) {
  const tsr_shardfile_hdr *h = &f->p.h;
  char canon[TSR_SHARDFILE_NAME_MAX] = "";
  if (tsr_shardfile_name(h->name, h->shard, h->num_shards, canon,
                         sizeof canon) || strcmp(canon, fname))
    return tsr_errf(err, errlen, TSR_EFORMAT, "%s holds part %d of %d of %s, "
                    "whose file is named %s", f->path, h->shard,
                    h->num_shards, h->name, canon);
  chief_ckpt_var *v = NULL;
  for (size_t i = 0; i < *n; i++)
    if (strcmp((*vars)[i].name, h->name) == 0) v = &(*vars)[i];
  if (!v) {
    if (tsr_grow(vars, cap, *n, sizeof **vars, 16))
      return tsr_errf(err, errlen, TSR_ENOMEM, "out of memory");
    v = &(*vars)[*n];
    memset(v, 0, sizeof *v);
    snprintf(v->name, sizeof v->name, "%s", h->name);
    v->rank = h->rank;
    memcpy(v->shape, h->shape, sizeof v->shape);
    v->sparse = h->sparse;
    v->width = h->width;
    v->num_shards = h->num_shards;
    snprintf(v->optimizer, sizeof v->optimizer, "%s", h->optimizer);
    v->n_slots = h->nslots;
    memcpy(v->slots, h->slots, sizeof v->slots);
    if (!(v->files = calloc(CHIEF_CKPT_MAX_PARTS, sizeof *v->files)))
      return tsr_errf(err, errlen, TSR_ENOMEM, "out of memory");
    (*n)++;
  }
  if (!cr_same(v, h))
    return tsr_errf(err, errlen, TSR_ECORRUPT, "%s: part %d of %d of %s has "
                    "another shape, kind or sharding than its other parts",
                    f->path, h->shard, h->num_shards, h->name);
  if (v->n_parts == CHIEF_CKPT_MAX_PARTS)
    return tsr_errf(err, errlen, TSR_ERANGE, "%s: more than %d parts",
                    v->name, CHIEF_CKPT_MAX_PARTS);
  if (h->shard == 0) v->step = h->step;
  v->files[v->n_parts++] = path;
  v->n_rows += (uint64_t)h->n_rows;
  v->bytes += f->size;
  return 0;
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
  while (!rc && (e = readdir(d))) {
    size_t L = strlen(e->d_name);
    if (L < 7 || strcmp(e->d_name + L - 7, ".tshard") != 0) continue;
    size_t plen = strlen(folder) + L + 2;
    char *path = malloc(plen);
    if (!path) {
      rc = tsr_errf(err, errlen, TSR_ENOMEM, "out of memory");
      break;
    }
    snprintf(path, plen, "%s/%s", folder, e->d_name);
    tsr_shardfile f;
    if (!(rc = tsr_shardfile_open(&f, path, err, errlen))) {
      rc = cr_note(&vars, &n, &cap, &f, e->d_name, path, err, errlen);
      tsr_shardfile_close(&f);
    }
    if (rc) free(path);
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

/* Copies the rows of one checked part into the variable's value. */
static int cr_copy(const chief_ckpt_var *v, const tsr_shardfile *f,
                   float *out, uint8_t *have, char *err, size_t errlen) {
  const tsr_shardfile_part *p = &f->p;
  const tsr_shardfile_hdr *h = &p->h;
  int64_t dim0 = v->rank ? v->shape[0] : 1;
  size_t row_bytes = (size_t)v->width * sizeof(float);
  if (!cr_same(v, h))
    return tsr_errf(err, errlen, TSR_ECORRUPT, "%s: another shape, kind or "
                    "sharding than the other parts of %s", f->path, v->name);
  if (!h->sparse) {
    /* the file's own checks put its rows in the layout of dim0 rows */
    memcpy(out + (size_t)h->row0 * (size_t)v->width, p->data + p->off_value,
           (size_t)h->n_rows * row_bytes);
    memset(have + h->row0, 1, (size_t)h->n_rows);
    return 0;
  }
  for (int64_t i = 0; i < h->n_rows; i++) {
    int64_t id;
    memcpy(&id, p->data + p->off_ids + (size_t)i * 8, 8);
    if (id < 0 || id >= dim0)
      return tsr_errf(err, errlen, TSR_ECORRUPT, "%s: id %" PRId64 " outside "
                      "[0, %" PRId64 ")", f->path, id, dim0);
    memcpy(out + (size_t)id * (size_t)v->width,
           p->data + p->off_value + (size_t)i * row_bytes, row_bytes);
    have[id] = 1;
  }
  return 0;
}

int chief_ckpt_load_value(const chief_ckpt_var *v, float *out,
                          uint8_t *present, char *err, size_t errlen) {
  int64_t dim0 = v->rank ? v->shape[0] : 1;
  uint8_t *have = present ? present : calloc((size_t)dim0, 1);
  if (!have) return tsr_errf(err, errlen, TSR_ENOMEM, "out of memory");
  if (present) memset(present, 0, (size_t)dim0);
  int rc = 0;
  for (int k = 0; k < v->n_parts && !rc; k++) {
    tsr_shardfile f;
    if ((rc = tsr_shardfile_open(&f, v->files[k], err, errlen))) break;
    rc = cr_copy(v, &f, out, have, err, errlen);
    tsr_shardfile_close(&f);
  }
  if (!rc && !v->sparse)
    for (int64_t r = 0; r < dim0; r++)
      if (!have[r]) {
        rc = tsr_errf(err, errlen, TSR_ECORRUPT, "%s: row %" PRId64 " is in "
                      "no part", v->name, r);
        break;
      }
  if (!present) free(have);
  return rc;
}
