/* Restoring a shard from checkpoint files (the format and its checks are
 * common/ckpt/shardfile.h).
 *
 * Happy path: ps__ckpt_load_shard lists the parts of the variable in the
 * folder (ps__ckpt_load_chain: in each folder of a chain, the whole
 * checkpoint first, then each increment over it), works out from the saved layout (TF's "div" row split, the same
 * the chief places with) which parts hold rows of the shard being
 * restored, maps and checks each of those whole (tsr_shardfile_open),
 * checks that they belong together (one checkpoint id and step, one
 * sharding, one variable) and copies their rows into a new shard built
 * aside; the caller swaps it in. The check and the copy release the
 * file's pages behind them (tsr_shardfile_drop): a restoring PS holds
 * its shards and a few MiB of each file, not the files whole.
 * Failure modes, each refused with a message naming the file: any a part
 * file's own checks find (size, CRCs, header, layout, ids), a part whose
 * name says another place than its header, a row id twice, a part of
 * another variable, shape, optimizer or checkpoint, a part missing. Every
 * check comes before the first byte is copied.
 */
#include "ps/ps_int.h"
#include "common/err.h"
#include "common/fs.h"
#include "common/partition.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- restoring a shard -----------------------------------------------------*/

typedef struct {
  int32_t shard, num_shards; /* from the file name */
  char name[TSR_SHARDFILE_NAME_MAX];
  tsr_shardfile f;           /* mapped and checked when it is needed */
} cl_file;

/* The part agrees with the shard restored from it. */
static int cl_matches(const tsr_shardfile_hdr *p, const char *path,
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

/* The row numbers one checkpoint's parts have restored so far: a row saved
 * twice is refused (the table may hold it already: a materialized one
 * holds every row, an increment overlays rows restored before). */
typedef struct {
  uint64_t *w;
  size_t words;
} cl_seen;

static int cl_seen_set(ps_mem *mem, cl_seen *m, size_t r, bool *was) {
  if (r / 64 >= m->words) {
    size_t words = m->words ? m->words : 64;
    while (words <= r / 64) words *= 2;
    uint64_t *w = ps__realloc(mem, m->w, m->words * sizeof *w,
                              words * sizeof *w);
    if (!w) return TSR_ENOMEM;
    memset(w + m->words, 0, (words - m->words) * sizeof *w);
    m->w = w;
    m->words = words;
  }
  *was = m->w[r / 64] >> (r & 63) & 1;
  m->w[r / 64] |= (uint64_t)1 << (r & 63);
  return 0;
}

/* Rows of a sparse part copied between releases of the pages behind them:
 * the part's map holds only about this many rows' pages resident. */
#define CL_DROP_ROWS 65536

/* Releases rows [r0, r1) of each section of a sparse part (the pages
 * wholly inside them) from the map. */
static void cl_drop_rows(const cl_file *f, int nslots, size_t W, int64_t r0,
                         int64_t r1) {
  const tsr_shardfile_part *d = &f->f.p;
  size_t a = (size_t)r0, n = (size_t)(r1 - r0);
  tsr_shardfile_drop(&f->f, d->data + d->off_ids + a * 8, n * 8);
  tsr_shardfile_drop(&f->f, d->data + d->off_value + a * W * 4, n * W * 4);
  for (int k = 0; k < nslots; k++)
    tsr_shardfile_drop(&f->f, d->data + d->off_slot[k] + a * W * 4, n * W * 4);
}

static int cl_copy_rows(ps_shard *s, ps_mem *mem, const cl_file *f,
                        int64_t *covered, cl_seen *seen, char *err,
                        size_t errlen) {
  const tsr_shardfile_hdr *p = &f->f.p.h;
  const tsr_shardfile_part *d = &f->f.p;
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
    memcpy(s->w + dst, d->data + d->off_value + src, cnt);
    tsr_shardfile_drop(&f->f, d->data + d->off_value + src, cnt);
    for (int k = 0; k < s->nslots; k++) {
      memcpy(s->slots[k] + dst, d->data + d->off_slot[k] + src, cnt);
      tsr_shardfile_drop(&f->f, d->data + d->off_slot[k] + src, cnt);
    }
    *covered += hi - lo;
    return 0;
  }
  int64_t done = 0;
  for (int64_t r = 0; r < p->n_rows; r++) {
    if (r - done >= CL_DROP_ROWS) {
      cl_drop_rows(f, s->nslots, W, done, r);
      done = r;
    }
    int64_t id;
    memcpy(&id, d->data + d->off_ids + (size_t)r * 8, 8);
    if (ps__spec_owns_id(&s->spec, id)) continue;
    float *rec;
    size_t at;
    bool twice = false;
    int created, rc = ps__rows_insert_r(&s->rows, mem, id, &rec, &at, &created);
    if (!rc) rc = cl_seen_set(mem, seen, at, &twice);
    if (rc)
      return tsr_errf(err, errlen, rc,
                      "%s: restoring row %" PRId64
                      " of %s: "
                      "%s",
                      f->f.path, id, s->spec.var.name, tsr_strerror(rc));
    if (twice)
      return tsr_errf(err, errlen, TSR_ECORRUPT,
                      "%s: row id %" PRId64
                      " of %s "
                      "is saved twice",
                      f->f.path, id, s->spec.var.name);
    size_t so = (size_t)r * W * 4;
    memcpy(rec, d->data + d->off_value + so, W * 4);
    for (int k = 0; k < s->nslots; k++)
      memcpy(rec + (size_t)(k + 1) * W, d->data + d->off_slot[k] + so, W * 4);
  }
  cl_drop_rows(f, s->nslots, W, done, p->n_rows);
  return 0;
}

/* The parts of checkpoint `want` in dir that hold rows of spec's shard,
 * into a new shard (into NULL: *out) or over `into` (an increment: its
 * rows replace those restored before, its dense parts the whole shard). */
static int cl_load(const ps_var_spec *spec, ps_mem *mem, const char *dir,
                   const ps_ckpt_ident *want, ps_shard *into, ps_shard **out,
                   char *err, size_t errlen) {
  char enc[3 * TSR_VAR_NAME_MAX + 1];
  tsr_shardfile_enc_name(spec->var.name, enc, sizeof enc);
  DIR *d = opendir(dir);
  if (!d)
    return tsr_errf(err, errlen, -errno, "%s: cannot open checkpoint folder: "
                    "%s", dir, strerror(errno));
  cl_file *files = NULL;
  int n = 0, cap = 0, rc = 0, nsh = 0;
  ps_shard *s = into;
  cl_seen seen = {NULL, 0};
  struct dirent *e;
  /* the parts of this variable, by name */
  while ((e = readdir(d))) {
    int32_t k, ns;
    if (!tsr_shardfile_name_parse(e->d_name, enc, &k, &ns)) continue;
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
    snprintf(f->name, sizeof f->name, "%s", e->d_name);
  }
  if (n == 0) {
    rc = tsr_errf(err, errlen, TSR_ENOTFOUND, "%s: no saved parts of %s (no "
                  "file %s.part-*-of-*.tshard)", dir, spec->var.name, enc);
    goto out;
  }
  /* the parts that hold rows of this shard: all there, each checked */
  for (int k = 0; k < nsh; k++) {
    if (!cl_needed(spec, k, nsh)) continue;
    cl_file *f = NULL;
    for (int i = 0; i < n; i++)
      if (files[i].shard == k) f = &files[i];
    if (!f) {
      char fname[TSR_SHARDFILE_NAME_MAX];
      tsr_shardfile_name(spec->var.name, k, nsh, fname, sizeof fname);
      rc = tsr_errf(err, errlen, TSR_ENOTFOUND,
                    "%s/%s: part %d of %d of %s is missing", dir, fname, k,
                    nsh, spec->var.name);
      goto out;
    }
    char path[TSR_PATH_MAX];
    if (snprintf(path, sizeof path, "%s/%s", dir, f->name) >=
        (int)sizeof path) {
      rc = tsr_errf(err, errlen, TSR_ERANGE, "%s/%s: path too long", dir,
                    f->name);
      goto out;
    }
    if ((rc = tsr_shardfile_open(&f->f, path, err, errlen))) goto out;
    const tsr_shardfile_hdr *h = &f->f.p.h;
    if (h->shard != f->shard || h->num_shards != f->num_shards) {
      rc = tsr_errf(err, errlen, TSR_EFORMAT, "%s: holds part %d of %d, its "
                    "name says %d of %d", path, h->shard, h->num_shards,
                    f->shard, f->num_shards);
      goto out;
    }
  }
  if (!s && (rc = ps__shard_new(spec, mem, &s, err, errlen))) goto out;
  const tsr_shardfile_hdr *first = NULL;
  for (int i = 0; i < n; i++) {
    if (!files[i].f.map) continue;
    const tsr_shardfile_hdr *p = &files[i].f.p.h;
    const char *path = files[i].f.path;
    if ((rc = cl_matches(p, path, s, err, errlen))) goto out;
    if (want && want->id[0] &&
        (strcmp(p->ckpt_id, want->id) || p->ckpt_step != want->step)) {
      rc = tsr_errf(err, errlen, TSR_ESTALE, "%s: belongs to checkpoint \"%s\" "
                    "of step %" PRId64 ", not \"%s\" of step %" PRId64 " (a "
                    "file from another checkpoint)", path, p->ckpt_id,
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
                    path, p->ckpt_id, p->ckpt_step, spec->var.name,
                    first->ckpt_id, first->ckpt_step);
      goto out;
    }
  }
  s->step = 0;
  s->version = 0;
  int64_t covered = 0;
  for (int i = 0; i < n; i++) {
    if (!files[i].f.map) continue;
    const tsr_shardfile_hdr *p = &files[i].f.p.h;
    if (p->step > s->step) s->step = p->step;
    if (p->var_version > s->version) s->version = p->var_version;
    if ((rc = cl_copy_rows(s, mem, &files[i], &covered, &seen, err, errlen)))
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
  if (out) *out = s;
  s = NULL;
out:
  ps__free(mem, seen.w);
  if (s && s != into) ps__shard_free(s, mem);
  for (int i = 0; i < n; i++) tsr_shardfile_close(&files[i].f);
  ps__free(mem, files);
  closedir(d);
  return rc;
}

int ps__ckpt_load_shard(const ps_var_spec *spec, ps_mem *mem, const char *dir,
                        const ps_ckpt_ident *want, ps_shard **out, char *err,
                        size_t errlen) {
  return cl_load(spec, mem, dir, want, NULL, out, err, errlen);
}

int ps__ckpt_load_chain(const ps_var_spec *spec, ps_mem *mem,
                        const char *const *dirs, const ps_ckpt_ident *want,
                        size_t n, ps_shard **out, char *err, size_t errlen) {
  ps_shard *s = NULL;
  int rc = n ? cl_load(spec, mem, dirs[0], &want[0], NULL, &s, err, errlen)
             : TSR_EINVAL;
  for (size_t i = 1; !rc && i < n; i++)
    rc = cl_load(spec, mem, dirs[i], &want[i], s, NULL, err, errlen);
  if (rc) {
    ps__shard_free(s, mem);
    return rc;
  }
  *out = s;
  return 0;
}
