/* Shards: creation with the deterministic initializer, gradients converted
 * to float32 and checked, optimizer applies, row gathers, and the sums of
 * sync mode.
 *
 * Happy path: ps__shard_new charges the budget, allocates the values and
 * the optimizer slots side by side and fills them; a push converts its
 * gradient (f32/bf16/f16) and calls kern_optim_apply over the whole shard
 * (dense) or row by row (sparse, each row with its own slots, so rows not
 * in the batch keep theirs: TF's lazy sparse updates).
 * Failure modes: a bad spec (TSR_EINVAL, err names the field), a budget
 * overrun (TSR_EMEMLIMIT; sparse applies check every id and reserve rows
 * before changing anything, so a rejected push changes nothing), an id the
 * shard does not own (TSR_ERANGE).
 */
#include "ps/ps_int.h"
#include "common/clock.h"
#include "common/err.h"
#include "common/size.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <sys/stat.h>
#include <unistd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool ps__spec_equal(const ps_var_spec *a, const ps_var_spec *b) {
  const tsr_var *va = &a->var, *vb = &b->var;
  const tsr_shard *sa = &a->shard, *sb = &b->shard;
  if (strcmp(va->name, vb->name) || va->rank != vb->rank ||
      va->kind != vb->kind || a->bounded != b->bounded ||
      sa->shard != sb->shard || sa->num_shards != sb->num_shards ||
      sa->row0 != sb->row0 || sa->rows != sb->rows || a->seed != b->seed ||
      strcmp(a->init_path, b->init_path))
    return false;
  for (int i = 0; i < va->rank; i++)
    if (va->shape[i] != vb->shape[i]) return false;
  if (va->init.kind != vb->init.kind || va->init.a != vb->init.a ||
      va->init.b != vb->init.b || va->init.fan_in != vb->init.fan_in ||
      va->init.fan_out != vb->init.fan_out)
    return false;
  return memcmp(&a->optim, &b->optim, sizeof a->optim) == 0;
}

int ps__spec_owns_id(const ps_var_spec *s, int64_t id) {
  if (id < 0) return TSR_ERANGE;
  /* row0 + rows fits: ps__spec_validate checked it against dim0 */
  const tsr_shard *sh = &s->shard;
  if (s->bounded)
    return id >= sh->row0 && id - sh->row0 < sh->rows ? 0 : TSR_ERANGE;
  return id % sh->num_shards == sh->shard ? 0 : TSR_ERANGE;
}

/* Initial values of elements [first, first+n): the spec's initializer, or
 * its initial_weights file. */
static int ps__init_fill(const ps_var_spec *spec, uint64_t first, float *out,
                         size_t n) {
  if (!spec->init_path[0]) {
    kern_init_fill(&spec->var.init, spec->seed,
                   kern_init_var_key(spec->var.name), first, out, n);
    return 0;
  }
  /* the real path of a regular file under the root (checked at create):
   * a link put in its place since is not followed, a FIFO not waited on */
  int fd = open(spec->init_path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW |
                                     O_NONBLOCK);
  if (fd < 0) return -errno;
  size_t want = n * sizeof(float), got = 0;
  while (got < want) {
    ssize_t r = pread(fd, (char *)out + got, want - got,
                      (off_t)(first * sizeof(float) + got));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += (size_t)r;
  }
  close(fd);
  return got == want ? 0 : TSR_EIO;
}

int ps__shard_new(const ps_var_spec *spec, ps_mem *mem, ps_shard **out,
                  char *err, size_t errlen) {
  int rc = ps__spec_validate(spec, err, errlen);
  if (rc) return rc;
  ps_shard *s = ps__calloc(mem, 1, sizeof *s);
  if (!s)
    return tsr_errf(err, errlen, TSR_ENOMEM, "%s shard %d: out of memory",
                    spec->var.name, spec->shard.shard);
  s->spec = *spec;
  s->width = ps__spec_width(spec);
  s->nslots = kern_optim_num_slots(&spec->optim);
  s->acc_step = -1;
  if (ps_var_spec_sparse(spec)) {
    ps__rows_init(&s->rows, (size_t)s->width * (size_t)(1 + s->nslots));
    ps__rows_init(&s->acc_rows, (size_t)s->width);
    *out = s;
    return 0;
  }
  size_t bytes;
  /* both checked by ps__spec_validate; computed checked all the same */
  if (tsr_mul_size((size_t)spec->shard.rows, (size_t)s->width, &s->numel) ||
      tsr_mul3_size(s->numel, sizeof(float), (size_t)(1 + s->nslots), &bytes)) {
    ps__free(mem, s);
    return tsr_errf(err, errlen, TSR_ERANGE, "%s shard %d: size overflows",
                    spec->var.name, spec->shard.shard);
  }
  if ((rc = ps__mem_reserve(mem, bytes))) {
    ps__free(mem, s);
    return tsr_errf(err, errlen, rc,
                    "%s shard %d: %zu bytes would exceed the memory limit "
                    "(%zu of %zu bytes in use)",
                    spec->var.name, spec->shard.shard, bytes,
                    atomic_load(&mem->used), mem->limit);
  }
  s->mem_bytes = bytes;
  size_t one = s->numel ? s->numel * sizeof(float) : 4;
  s->w = ps__alloc(mem, one);
  bool ok = s->w != NULL;
  for (int i = 0; i < s->nslots; i++) {
    s->slots[i] = ps__alloc(mem, one);
    ok = ok && s->slots[i];
  }
  if (!ok) {
    ps__shard_free(s, mem);
    return tsr_errf(err, errlen, TSR_ENOMEM, "%s: out of memory",
                    spec->var.name);
  }
  if (spec->init_path[0]) {
    /* the whole variable must be in the file */
    struct stat st;
    int64_t numel = 1, bytes_all = 0;
    if (tsr_dims_product(spec->var.shape, 0, spec->var.rank, &numel) ||
        tsr_mul_i64(numel, (int64_t)sizeof(float), &bytes_all))
      bytes_all = -1; /* no file has that size */
    if (stat(spec->init_path, &st) != 0 ||
        (int64_t)st.st_size != bytes_all) {
      int e = errno;
      ps__shard_free(s, mem);
      return tsr_errf(err, errlen, TSR_EINVAL, "%s: initial values %s: %s",
                      spec->var.name, spec->init_path,
                      e ? strerror(e) : "not the variable's size in float32");
    }
  }
  rc = ps__init_fill(spec, (uint64_t)(spec->shard.row0 * s->width), s->w,
                     s->numel);
  if (rc) {
    ps__shard_free(s, mem);
    return tsr_errf(err, errlen, rc,
                    "%s: cannot read initial values from "
                    "%s",
                    spec->var.name, spec->init_path);
  }
  kern_optim_init_slots(&spec->optim, s->slots, s->numel);
  *out = s;
  return 0;
}

void ps__shard_free(ps_shard *s, ps_mem *mem) {
  if (!s) return;
  ps__free(mem, s->w);
  for (int i = 0; i < KERN_OPTIM_MAX_SLOTS; i++) ps__free(mem, s->slots[i]);
  if (s->acc) {
    ps__free(mem, s->acc);
    ps__mem_release(mem, s->numel * sizeof(float));
  }
  ps__mem_release(mem, s->mem_bytes);
  ps__rows_free(&s->rows, mem);
  ps__rows_free(&s->acc_rows, mem);
  ps__free(mem, s);
}

/* ---- gradients ----------------------------------------------------------*/

static float ps__f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16;
  uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff, bits;
  if (e == 0) {
    if (m == 0) {
      bits = sign;
    } else { /* subnormal: normalise */
      e = 127 - 15 + 1;
      while (!(m & 0x400)) {
        m <<= 1;
        e--;
      }
      bits = sign | (e << 23) | ((m & 0x3ff) << 13);
    }
  } else if (e == 31) {
    bits = sign | 0x7f800000u | (m << 13);
  } else {
    bits = sign | ((e + 127 - 15) << 23) | (m << 13);
  }
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

/* One read pass; the optimize attribute lets -O2 vectorize it. */
#define PS__VEC __attribute__((optimize("tree-vectorize", \
                                        "vect-cost-model=dynamic")))

PS__VEC int ps__all_finite(const float *p, size_t n) {
  const uint32_t *u = (const uint32_t *)p;
  uint32_t worst = 0;
  for (size_t i = 0; i < n; i++) {
    uint32_t e = u[i] & 0x7f800000u;
    worst = e > worst ? e : worst;
  }
  return worst != 0x7f800000u;
}

int ps__grad_to_f32(const void *data, int dtype, size_t n, float *out) {
  const unsigned char *b = data;
  switch (dtype) {
    case PS_DT_F32:
      if (out != data) memcpy(out, data, n * 4);
      break;
    case PS_DT_BF16:
      for (size_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, b + 2 * i, 2);
        uint32_t u = (uint32_t)h << 16;
        memcpy(&out[i], &u, 4);
      }
      break;
    case PS_DT_F16:
      for (size_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, b + 2 * i, 2);
        out[i] = ps__f16_to_f32(h);
      }
      break;
    default: return TSR_EDTYPE;
  }
  return ps__all_finite(out, n);
}

/* ---- applies -------------------------------------------------------------*/

int ps__shard_apply_dense(ps_shard *s, const float *g, float scale) {
  uint64_t t0 = tsr_now_ns();
  int rc = kern_optim_apply(&s->spec.optim, s->step + 1, s->w, g, scale,
                            s->slots, s->numel);
  if (rc) return rc;
  s->step++;
  s->version++;
  s->applies++;
  s->apply_ns += tsr_now_ns() - t0;
  return 0;
}

static void ps__row_init(const ps_shard *s, int64_t id, float *rec) {
  if (ps__init_fill(&s->spec, (uint64_t)id * (uint64_t)s->width, rec,
                    (size_t)s->width))
    memset(rec, 0, (size_t)s->width * sizeof(float)); /* checked at create */
  float *slots[KERN_OPTIM_MAX_SLOTS];
  for (int k = 0; k < s->nslots; k++) slots[k] = rec + (size_t)(k + 1) * s->width;
  kern_optim_init_slots(&s->spec.optim, slots, (size_t)s->width);
}

static int ps__check_ids(const ps_shard *s, const int64_t *ids, size_t n,
                         char *err, size_t errlen) {
  for (size_t i = 0; i < n; i++)
    if (ps__spec_owns_id(&s->spec, ids[i])) {
      if (s->spec.bounded)
        return tsr_errf(err, errlen, TSR_ERANGE,
                        "%s shard %d: row id %" PRId64
                        " (index %zu) is "
                        "outside its rows [%" PRId64 ", %" PRId64 ")",
                        s->spec.var.name, s->spec.shard.shard, ids[i], i,
                        s->spec.shard.row0,
                        s->spec.shard.row0 + s->spec.shard.rows);
      return tsr_errf(err, errlen, TSR_ERANGE,
                      "%s shard %d of %d: row id %" PRId64
                      " (index %zu) "
                      "belongs to another shard or is negative",
                      s->spec.var.name, s->spec.shard.shard,
                      s->spec.shard.num_shards, ids[i], i);
    }
  return 0;
}

/* Looks up or creates every row first so a budget failure changes nothing
 * but the (harmless) creation of initializer-valued rows. */
/* Row `id`, created with its initial values when it is not held yet; a
 * failure names the row and the memory in use. */
static int ps__row_get(ps_shard *s, ps_mem *mem, int64_t id, float **rec,
                       char *err, size_t errlen) {
  int created;
  int rc = ps__rows_insert(&s->rows, mem, id, rec, &created);
  if (rc)
    return tsr_errf(err, errlen, rc,
                    "%s shard %d: cannot create row %" PRId64 " (%zu rows "
                    "held, %zu of %zu bytes in use): %s",
                    s->spec.var.name, s->spec.shard.shard, id, s->rows.count,
                    atomic_load(&mem->used), mem->limit, tsr_strerror(rc));
  if (created) ps__row_init(s, id, *rec);
  return 0;
}

static int ps__touch_rows(ps_shard *s, ps_mem *mem, const int64_t *ids,
                          size_t n, float **recs, char *err, size_t errlen) {
  for (size_t i = 0; i < n; i++) {
    int rc = ps__row_get(s, mem, ids[i], &recs[i], err, errlen);
    if (rc) return rc;
  }
  return 0;
}

typedef struct {
  int64_t id;
  size_t at; /* position in the push */
} ps__id_at;

static int ps__cmp_id_at(const void *a, const void *b) {
  const ps__id_at *x = a, *y = b;
  if (x->id != y->id) return x->id < y->id ? -1 : 1;
  return x->at < y->at ? -1 : x->at > y->at;
}

static void ps__apply_row(ps_shard *s, float *rec, const float *g,
                          float scale) {
  size_t W = (size_t)s->width;
  float *slots[KERN_OPTIM_MAX_SLOTS];
  for (int k = 0; k < s->nslots; k++) slots[k] = rec + (size_t)(k + 1) * W;
  kern_optim_apply(&s->spec.optim, s->step + 1, rec, g, scale, slots, W);
}

int ps__shard_apply_rows(ps_shard *s, ps_mem *mem, const int64_t *ids,
                         size_t n, const float *g, float scale, char *err,
                         size_t errlen) {
  uint64_t t0 = tsr_now_ns();
  int rc = ps__check_ids(s, ids, n, err, errlen);
  if (rc) return rc;
  size_t W = (size_t)s->width;
  /* Ids in increasing order (what the client sends) name each row once.
   * Otherwise the pushes of one id are summed in the order they came,
   * then applied once: found by sorting (id, position) pairs, so a push
   * of many unsorted ids costs n log n, not n^2. */
  bool sorted = true;
  for (size_t i = 1; i < n && sorted; i++) sorted = ids[i] > ids[i - 1];
  /* every allocation before the first row changes: a failure applies
   * nothing (rows touched meanwhile hold their initial values) */
  float **recs = ps__calloc(mem, n, sizeof *recs);
  float *sum = ps__calloc(mem, W, sizeof *sum);
  ps__id_at *ord = sorted ? NULL : ps__calloc(mem, n, sizeof *ord);
  if (!recs || !sum || (!sorted && !ord)) {
    rc = tsr_errf(err, errlen, TSR_ENOMEM,
                  "%s shard %d: out of memory for %zu rows",
                  s->spec.var.name, s->spec.shard.shard, n);
    goto out;
  }
  if ((rc = ps__touch_rows(s, mem, ids, n, recs, err, errlen))) goto out;
  if (sorted) {
    for (size_t i = 0; i < n; i++) ps__apply_row(s, recs[i], g + i * W, scale);
  } else {
    for (size_t i = 0; i < n; i++) ord[i] = (ps__id_at){ids[i], i};
    qsort(ord, n, sizeof *ord, ps__cmp_id_at);
    for (size_t a = 0, b; a < n; a = b) {
      const float *gi = g + ord[a].at * W;
      for (b = a + 1; b < n && ord[b].id == ord[a].id; b++) {
        if (gi != sum) {
          memcpy(sum, gi, W * sizeof *sum);
          gi = sum;
        }
        for (size_t k = 0; k < W; k++) sum[k] += g[ord[b].at * W + k];
      }
      ps__apply_row(s, recs[ord[a].at], gi, scale);
    }
  }
  s->step++;
  s->version++;
  s->applies++;
  s->apply_ns += tsr_now_ns() - t0;
out:
  ps__free(mem, ord);
  ps__free(mem, sum);
  ps__free(mem, recs);
  return rc;
}

int ps__shard_gather(ps_shard *s, ps_mem *mem, const int64_t *ids, size_t n,
                     float *out, bool create, char *err, size_t errlen) {
  int rc = ps__check_ids(s, ids, n, err, errlen);
  if (rc) return rc;
  size_t W = (size_t)s->width;
  for (size_t i = 0; i < n; i++) {
    float *rec = ps__rows_find(&s->rows, ids[i]);
    if (!rec && create) {
      rc = ps__row_get(s, mem, ids[i], &rec, err, errlen);
      if (rc) return rc;
    }
    if (rec)
      memcpy(out + i * W, rec, W * sizeof(float));
    else
      if (ps__init_fill(&s->spec, (uint64_t)ids[i] * (uint64_t)W, out + i * W,
                        W))
        memset(out + i * W, 0, W * sizeof(float));
  }
  return 0;
}

/* ---- sync-mode sums -------------------------------------------------------*/

PS__VEC static void ps__add(float *restrict a, const float *restrict g,
                            size_t n) {
  for (size_t i = 0; i < n; i++) a[i] += g[i];
}

int ps__shard_accum_dense(ps_shard *s, ps_mem *mem, const float *g) {
  if (!s->acc) {
    int rc = ps__mem_reserve(mem, s->numel * sizeof(float));
    if (rc) return rc;
    s->acc = ps__calloc(mem, s->numel, sizeof(float));
    if (!s->acc) {
      ps__mem_release(mem, s->numel * sizeof(float));
      return TSR_ENOMEM;
    }
  } else if (s->acc_count == 0) {
    memset(s->acc, 0, s->numel * sizeof(float));
  }
  ps__add(s->acc, g, s->numel);
  s->acc_count++;
  return 0;
}

int ps__shard_accum_rows(ps_shard *s, ps_mem *mem, const int64_t *ids,
                         size_t n, const float *g, char *err, size_t errlen) {
  int rc = ps__check_ids(s, ids, n, err, errlen);
  if (rc) return rc;
  if (s->acc_count == 0) ps__rows_clear(&s->acc_rows);
  size_t W = (size_t)s->width;
  for (size_t i = 0; i < n; i++) {
    float *rec;
    int created;
    if ((rc = ps__rows_insert(&s->acc_rows, mem, ids[i], &rec, &created)))
      return tsr_errf(err, errlen, rc,
                      "%s: cannot hold the step's sum for "
                      "row %" PRId64 ": %s",
                      s->spec.var.name, ids[i], tsr_strerror(rc));
    for (size_t k = 0; k < W; k++) rec[k] += g[i * W + k];
  }
  s->acc_count++;
  return 0;
}

typedef struct {
  int64_t *ids;
  float *g;
  size_t n, W;
} ps__acc_collect;

static void ps__collect(void *ctx, int64_t id, const float *rec) {
  ps__acc_collect *c = ctx;
  c->ids[c->n] = id;
  memcpy(c->g + c->n * c->W, rec, c->W * sizeof(float));
  c->n++;
}

void ps__shard_accum_clear(ps_shard *s) {
  if (s) s->acc_count = 0; /* the next gradient starts a fresh sum */
}

int ps__shard_accum_apply(ps_shard *s, ps_mem *mem, int workers, char *err,
                          size_t errlen) {
  float scale = 1.0f / (float)(workers > 0 ? workers : 1);
  int rc = 0;
  if (!ps_var_spec_sparse(&s->spec)) {
    if (s->acc_count == 0) {
      /* nobody pushed this step: the mean is zero, the step still counts */
      s->version++;
      return 0;
    }
    rc = ps__shard_apply_dense(s, s->acc, scale);
  } else {
    size_t n = s->acc_count ? s->acc_rows.count : 0;
    ps__acc_collect c = {ps__calloc(mem, n, sizeof(int64_t)),
                         ps__calloc(mem, n * (size_t)s->width, sizeof(float)),
                         0, (size_t)s->width};
    if (!c.ids || !c.g) {
      rc = tsr_errf(err, errlen, TSR_ENOMEM,
                    "%s shard %d: out of memory "
                    "collecting %zu summed rows",
                    s->spec.var.name, s->spec.shard.shard, n);
    } else {
      if (n) ps__rows_each(&s->acc_rows, ps__collect, &c);
      rc = ps__shard_apply_rows(s, mem, c.ids, c.n, c.g, scale, err, errlen);
    }
    ps__free(mem, c.ids);
    ps__free(mem, c.g);
  }
  /* out of memory changed nothing: the sum stays for another try */
  if (rc != TSR_ENOMEM) s->acc_count = 0;
  return rc;
}
