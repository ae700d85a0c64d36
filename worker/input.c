/* The pipeline: spec -> source -> (scale, normalize) -> shuffle -> batch ->
 * a ring of prefetched batches filled by one reader thread.
 *
 * Happy path: wk_input_open() parses the spec, opens the source for this
 * worker's share, computes the training statistics when normalizing, and
 * starts the reader thread; the thread fills the ring's free slots in order
 * and wk_input_next() hands them out one at a time (the slot handed out
 * stays the caller's until the next call, so the ring holds prefetch + 1
 * slots and never grows).
 * Failure modes: a source error ends the stream; the batches before it are
 * still delivered, then wk_input_next() returns the error and
 * wk_input_error() says what and where. wk_input_close() stops the thread
 * wherever it waits.
 */
#include "worker/input_int.h"

#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct wk_slot {
  wk_batch b;
  struct wk_input *in; /* the owner, for allocating */
  float *x, *y;
  int64_t **ids;   /* n_sparse arrays */
  int64_t **offs;  /* n_sparse arrays of batch_size + 1 */
  size_t *ids_cap; /* n_sparse capacities (elements) */
  /* the columns' first memory: one block each for ids and offsets, each
   * column an odd number of cache lines after the one before, so that a
   * row's writes to every column do not fall into the same few L1 sets
   * (columns of a power-of-two size would) */
  int64_t *ids_block, *offs_block;
  size_t ids_stride;
} wk_slot;

struct wk_input {
  wk_input_spec spec;
  wk_input_opts opts;
  wk_src *src;
  wk_input_schema schema;
  float *xa, *xb;  /* x' = x * xa + xb per dense feature */
  bool identity;   /* xa == 1 and xb == 0: a plain copy */
  int64_t batch_size;
  bool drop;
  int64_t epochs;
  uint64_t seed;

  int nslots;
  wk_slot *slots;
  pthread_t thread;
  bool thread_started;
  pthread_mutex_t mu;
  pthread_cond_t cv_data, cv_space;
  int head, tail, nfull;
  bool held, done, stop;
  bool reader_waiting; /* the reader sleeps on cv_space */
  int done_rc;
  char perr[512]; /* the reader's error, published with done */
  char cerr[512]; /* what wk_input_error() shows */
  double wait_s;
  double reader_cpu_s; /* the reader thread's CPU time, once it is done */

  /* reader-thread state */
  wk_slot *fill; /* slot being filled, or NULL */
  int64_t batch_index;
};

static void *buf_alloc(wk_input *in, size_t bytes) {
  if (bytes == 0) bytes = 1;
  if (in->opts.pinned && in->opts.host_alloc_ctx)
    return in->opts.host_alloc_ctx(in->opts.host_ctx, bytes);
  if (in->opts.pinned && in->opts.host_alloc) return in->opts.host_alloc(bytes);
  return malloc(bytes);
}

static void buf_free(wk_input *in, void *p) {
  if (!p) return;
  if (in->opts.pinned && in->opts.host_alloc_ctx) {
    if (in->opts.host_free_ctx) in->opts.host_free_ctx(in->opts.host_ctx, p);
    return;
  }
  if (in->opts.pinned && in->opts.host_alloc) {
    if (in->opts.host_free) in->opts.host_free(p);
    return;
  }
  free(p);
}

/* Whether column f still lives in the slot's first block. */
static bool in_block(const wk_slot *s, int f) {
  return s->ids_block && s->ids[f] >= s->ids_block &&
         s->ids[f] < s->ids_block + s->ids_stride * (size_t)s->b.n_sparse;
}

/* Bytes rounded up to an odd number of 64-byte lines. */
static size_t odd_lines(size_t bytes) {
  return (((bytes + 63) / 64) | 1) * 64;
}

static void slot_free(wk_input *in, wk_slot *s) {
  buf_free(in, s->x);
  buf_free(in, s->y);
  for (int f = 0; s->ids && f < in->schema.n_sparse; f++)
    if (!in_block(s, f)) buf_free(in, s->ids[f]);
  buf_free(in, s->ids_block);
  buf_free(in, s->offs_block);
  free(s->ids);
  free(s->offs);
  free(s->ids_cap);
}

static int slot_init(wk_input *in, wk_slot *s) {
  int64_t B = in->batch_size, d = in->schema.n_dense;
  s->in = in;
  int ns = in->schema.n_sparse;
  s->x = buf_alloc(in, (size_t)(B * d) * sizeof(float));
  s->y = buf_alloc(in, (size_t)B * sizeof(float));
  s->ids = calloc(ns ? ns : 1, sizeof *s->ids);
  s->offs = calloc(ns ? ns : 1, sizeof *s->offs);
  s->ids_cap = calloc(ns ? ns : 1, sizeof *s->ids_cap);
  if (!s->x || !s->y || !s->ids || !s->offs || !s->ids_cap) return TSR_ENOMEM;
  s->b.n_sparse = ns;
  s->ids_stride = odd_lines((size_t)B * 2 * sizeof(int64_t)) / 8;
  size_t offs_stride = odd_lines((size_t)(B + 1) * sizeof(int64_t)) / 8;
  if (ns) {
    s->ids_block = buf_alloc(in, s->ids_stride * (size_t)ns * 8);
    s->offs_block = buf_alloc(in, offs_stride * (size_t)ns * 8);
    if (!s->ids_block || !s->offs_block) return TSR_ENOMEM;
  }
  for (int f = 0; f < ns; f++) {
    s->ids_cap[f] = s->ids_stride;
    s->ids[f] = s->ids_block + s->ids_stride * (size_t)f;
    s->offs[f] = s->offs_block + offs_stride * (size_t)f;
  }
  s->b.x = s->x;
  s->b.y = s->y;
  s->b.n_dense = d;
  s->b.ids = s->ids;
  s->b.offsets = s->offs;
  return 0;
}

/* ---- the reader thread ------------------------------------------------- */

/* Publishes the filled slot. */
static void publish(wk_input *in) {
  pthread_mutex_lock(&in->mu);
  in->head = (in->head + 1) % in->nslots;
  in->nfull++;
  pthread_cond_signal(&in->cv_data);
  pthread_mutex_unlock(&in->mu);
  in->fill = NULL;
}

/* Waits for a free slot; TSR_ECANCELED when the pipeline is closing. */
static int acquire(wk_input *in) {
  pthread_mutex_lock(&in->mu);
  while (!in->stop && in->nfull + (in->held ? 1 : 0) >= in->nslots) {
    in->reader_waiting = true;
    pthread_cond_wait(&in->cv_space, &in->mu);
  }
  in->reader_waiting = false;
  bool stop = in->stop;
  wk_slot *s = &in->slots[in->head];
  pthread_mutex_unlock(&in->mu);
  if (stop) return TSR_ECANCELED;
  in->fill = s;
  s->b.n = 0;
  for (int f = 0; f < in->schema.n_sparse; f++) s->offs[f][0] = 0;
  return 0;
}

/* Makes sparse column f of slot `ctx` hold `need` ids (wk_row.grow). */
static int slot_grow(void *ctx, int f, size_t need) {
  wk_slot *s = ctx;
  size_t cap = s->ids_cap[f] * 2;
  while (cap < need) cap *= 2;
  int64_t *n = buf_alloc(s->in, cap * sizeof(int64_t));
  if (!n) return TSR_ENOMEM;
  /* all of it: a row being decoded may have written ids already */
  memcpy(n, s->ids[f], s->ids_cap[f] * sizeof(int64_t));
  if (!in_block(s, f)) buf_free(s->in, s->ids[f]);
  s->ids[f] = n;
  s->ids_cap[f] = cap;
  return 0;
}

/* Row s->b.n is filled: counts it, and publishes a full batch. */
static void row_done(wk_input *in, wk_slot *s, int64_t epoch) {
  s->b.n++;
  s->b.epoch = epoch;
  if (s->b.n == in->batch_size) {
    s->b.index = in->batch_index++;
    publish(in);
  }
}

static int emit(wk_input *in, const wk_rec *r, int64_t epoch) {
  int rc;
  if (!in->fill && (rc = acquire(in))) return rc;
  wk_slot *s = in->fill;
  int64_t i = s->b.n, d = in->schema.n_dense;
  float *restrict x = s->x + i * d;
  const float *restrict rx = r->x, *restrict xa = in->xa, *restrict xb = in->xb;
  if (in->identity)
    memcpy(x, rx, (size_t)d * sizeof(float));
  else
    for (int64_t j = 0; j < d; j++) x[j] = rx[j] * xa[j] + xb[j];
  s->y[i] = r->y;
  const int64_t *restrict roff = r->off, *restrict rids = r->ids;
  int64_t o0 = roff[0];
  for (int f = 0; f < in->schema.n_sparse; f++) {
    int64_t o1 = roff[f + 1], k = o1 - o0;
    int64_t *restrict offs = s->offs[f];
    int64_t at = offs[i];
    if ((size_t)(at + k) > s->ids_cap[f] &&
        slot_grow(s, f, (size_t)(at + k)))
      return TSR_ENOMEM;
    int64_t *restrict dst = s->ids[f] + at;
    /* mostly one id per feature: no call for it */
    if (k == 1)
      *dst = rids[o0];
    else
      memcpy(dst, rids + o0, (size_t)k * sizeof(int64_t));
    offs[i + 1] = at + k;
    o0 = o1;
  }
  row_done(in, s, epoch);
  return 0;
}

/* A serialized record decoded by its source straight into the batch
 * row, then scaled (normalized) in place. */
static int emit_raw(wk_input *in, const wk_raw *r, int64_t epoch, char *err,
                    size_t errlen) {
  int rc;
  if (!in->fill && (rc = acquire(in))) return rc;
  wk_slot *s = in->fill;
  int64_t i = s->b.n, d = in->schema.n_dense;
  float *restrict x = s->x + i * d;
  const wk_row o = {x, &s->y[i], s->ids, s->offs, s->ids_cap, i,
                    slot_grow, s};
  if ((rc = in->src->ops->decode_raw(in->src, r, &o, err, errlen)))
    return rc;
  if (!in->identity) {
    const float *restrict xa = in->xa, *restrict xb = in->xb;
    for (int64_t j = 0; j < d; j++) x[j] = x[j] * xa[j] + xb[j];
  }
  row_done(in, s, epoch);
  return 0;
}

/* Row `row` of a random-access source into the batch: straight into the
 * slot when the source can write transformed dense rows (tables), else
 * through `rec`. */
static int emit_row(wk_input *in, int64_t row, wk_rec *rec, int64_t epoch,
                    char *err, size_t errlen) {
  wk_src *src = in->src;
  int rc;
  if (!src->ops->get_dense)
    return (rc = src->ops->get(src, row, rec, err, errlen)) ? rc
                                                            : emit(in, rec, epoch);
  if (!in->fill && (rc = acquire(in))) return rc;
  wk_slot *s = in->fill;
  int64_t i = s->b.n;
  src->ops->get_dense(src, row, in->identity ? NULL : in->xa, in->xb,
                      s->x + i * in->schema.n_dense, &s->y[i]);
  row_done(in, s, epoch);
  return 0;
}

static void end_epoch(wk_input *in) {
  if (!in->fill) return;
  if (in->drop) {
    in->fill->b.n = 0; /* keep the slot for the next epoch's first batch */
    return;
  }
  in->fill->b.index = in->batch_index++;
  publish(in);
}

static uint64_t epoch_seed(const wk_input *in, int64_t epoch) {
  return wk_mix64(in->seed ^ wk_mix64((uint64_t)epoch * 0x100000001b3ull +
                                      (uint64_t)in->opts.worker_index));
}

/* Random-access epoch: the tf.data shuffle-buffer algorithm applied to the
 * row numbers of this share. */
static int run_rows(wk_input *in, int64_t epoch, wk_rec *rec, int64_t *buf,
                    char *err, size_t errlen) {
  wk_src *s = in->src;
  int64_t n = s->n_rows, B = in->spec.shuffle_buffer;
  if (B > n) B = n;
  uint64_t st = epoch_seed(in, epoch);
  int rc;
  if (B <= 1) {
    for (int64_t i = 0; i < n; i++) {
      if ((rc = emit_row(in, s->rows[i], rec, epoch, err, errlen))) return rc;
    }
    return 0;
  }
  /* draw k picks from the first `bound` entries of buf: B while rows
   * remain to refill it, then B, B-1, ..., 1 as it drains. Each pick is
   * drawn one step early so that its row can be prefetched. */
  memcpy(buf, s->rows, (size_t)B * sizeof(int64_t));
  int64_t j = (int64_t)wk_rng_below(&st, (uint64_t)B);
  for (int64_t k = 0; k < n; k++) {
    int64_t m = k < n - B ? B : n - k; /* this draw's bound */
    int64_t jn = 0;
    if (k + 1 < n) {
      int64_t mn = k + 1 < n - B ? B : n - k - 1;
      jn = (int64_t)wk_rng_below(&st, (uint64_t)mn);
      if (s->ops->prefetch && jn != j) s->ops->prefetch(s, buf[jn]);
    }
    if ((rc = emit_row(in, buf[j], rec, epoch, err, errlen))) return rc;
    buf[j] = k < n - B ? s->rows[B + k] : buf[m - 1];
    j = jn;
  }
  return 0;
}

/* A record kept serialized in the shuffle buffer. */
typedef struct {
  uint8_t *buf;
  size_t cap;
  wk_raw r;
} raw_copy;

static int raw_keep(raw_copy *c, const wk_raw *r) {
  if (r->n > c->cap) {
    free(c->buf);
    c->cap = r->n + r->n / 4 + 64; /* records of a set vary a little */
    if (!(c->buf = malloc(c->cap))) {
      c->cap = 0;
      return TSR_ENOMEM;
    }
  }
  memcpy(c->buf, r->p, r->n);
  c->r = *r;
  c->r.p = c->buf;
  return 0;
}

/* Streaming epoch (TFRecord): the same algorithm over copies of the
 * serialized records (as tf.data shuffles serialized Examples before
 * parsing them); each is decoded straight into its batch row when drawn.
 * Without shuffling the records are decoded where the source read them,
 * uncopied. */
static int run_stream(wk_input *in, int64_t epoch, raw_copy *keep,
                      char *err, size_t errlen) {
  wk_src *s = in->src;
  int64_t B = in->spec.shuffle_buffer > 1 ? in->spec.shuffle_buffer : 1;
  uint64_t st = epoch_seed(in, epoch);
  wk_raw r;
  int rc = s->ops->begin(s, err, errlen);
  if (rc) return rc;
  if (B == 1) {
    while (!(rc = s->ops->next_raw(s, &r, err, errlen)))
      if ((rc = emit_raw(in, &r, epoch, err, errlen))) return rc;
    return rc == TSR_EEOF ? 0 : rc;
  }
  int64_t m = 0;
  while (m < B) {
    rc = s->ops->next_raw(s, &r, err, errlen);
    if (rc == TSR_EEOF) break;
    if (rc || (rc = raw_keep(&keep[m], &r))) return rc;
    m++;
  }
  while (m > 0) {
    /* the record drawn is fetched into the cache while the next one is
     * read and checked */
    int64_t j = (int64_t)wk_rng_below(&st, (uint64_t)m);
    for (size_t k = 0; k < keep[j].r.n; k += 64)
      __builtin_prefetch(keep[j].buf + k);
    rc = s->ops->next_raw(s, &r, err, errlen);
    if (rc && rc != TSR_EEOF) return rc;
    int erc = emit_raw(in, &keep[j].r, epoch, err, errlen);
    if (erc) return erc;
    if (rc == TSR_EEOF) {
      raw_copy t = keep[j];
      keep[j] = keep[m - 1];
      keep[m - 1] = t;
      m--;
    } else if (rc || (rc = raw_keep(&keep[j], &r))) {
      return rc;
    }
  }
  return 0;
}

/* Keras shuffles the whole training set every epoch: tables in memory are
 * shuffled whole (a permutation of row numbers); a stream is shuffled
 * whole when its records fit WK_SHUFFLE_BUDGET, else through the largest
 * buffer that does. The log says which. */
static void default_shuffle(wk_input *in) {
  wk_src *s = in->src;
  wk_input_spec *sp = &in->spec;
  if (s->rows) {
    sp->shuffle_buffer = s->n_rows;
    tsr_info("%s: shuffling all %lld examples of this share every epoch, as "
             "Keras does (\"shuffle_buffer\": 0 keeps the file order)",
             sp->where, (long long)s->n_rows);
    return;
  }
  int64_t rec = (s->n_dense + 8 * (int64_t)s->n_sparse) * 4 + 64;
  if (s->raw_bytes > 0) /* records are kept serialized */
    rec = s->raw_bytes + 64;
  int64_t cap = WK_SHUFFLE_BUDGET / rec;
  if (cap > WK_SHUFFLE_MAX) cap = WK_SHUFFLE_MAX;
  int64_t share = s->n_total > 0 ? (s->n_total + in->opts.num_workers - 1) /
                                       in->opts.num_workers
                                 : -1;
  if (share > 0 && share <= cap) {
    sp->shuffle_buffer = share;
    tsr_info("%s: shuffle buffer of %lld records, the whole share, "
             "reshuffled every epoch as Keras does", sp->where,
             (long long)share);
  } else {
    sp->shuffle_buffer = cap;
    tsr_info("%s: shuffle buffer of %lld records (%s, at most %d MiB or "
             "%d records); set shuffle_buffer to choose", sp->where,
             (long long)cap, share > 0 ? "the share does not fit"
                                       : "a stream of unknown length",
             (int)(WK_SHUFFLE_BUDGET >> 20), (int)WK_SHUFFLE_MAX);
  }
}

static void *reader_main(void *arg) {
  wk_input *in = arg;
  pthread_setname_np(pthread_self(), "tsr-input");
  char err[512] = "";
  int rc = 0;
  wk_src *s = in->src;
  int64_t nrec = s->rows ? 1 : (in->spec.shuffle_buffer > 1
                                    ? in->spec.shuffle_buffer
                                    : 1);
  wk_rec rec = {0};
  raw_copy *keep = s->rows ? NULL : calloc((size_t)nrec, sizeof *keep);
  int64_t *buf = NULL;
  if (s->rows) rc = wk_rec__init(&rec, s->n_dense, s->n_sparse);
  else if (!keep) rc = TSR_ENOMEM;
  if (!rc && s->rows && in->spec.shuffle_buffer > 1) {
    int64_t B = in->spec.shuffle_buffer < s->n_rows ? in->spec.shuffle_buffer
                                                    : s->n_rows;
    buf = malloc((size_t)(B > 0 ? B : 1) * sizeof(int64_t));
    if (!buf) rc = TSR_ENOMEM;
  }
  for (int64_t e = 0; !rc && (in->epochs < 0 || e < in->epochs); e++) {
    rc = s->rows ? run_rows(in, e, &rec, buf, err, sizeof err)
                 : run_stream(in, e, keep, err, sizeof err);
    if (!rc) end_epoch(in);
    /* an empty share repeated forever would spin: end it */
    if (!rc && in->epochs < 0 && in->batch_index == 0 && e >= 1) break;
  }
  wk_rec__free(&rec);
  for (int64_t i = 0; keep && i < nrec; i++) free(keep[i].buf);
  free(keep);
  free(buf);
  struct timespec cpu;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu);
  pthread_mutex_lock(&in->mu);
  in->reader_cpu_s = (double)cpu.tv_sec + 1e-9 * (double)cpu.tv_nsec;
  in->done = true;
  in->done_rc = rc ? rc : TSR_EEOF;
  if (rc && !err[0]) snprintf(err, sizeof err, "%s", tsr_strerror(rc));
  snprintf(in->perr, sizeof in->perr, "%s", rc ? err : "");
  pthread_cond_broadcast(&in->cv_data);
  pthread_mutex_unlock(&in->mu);
  return NULL;
}

/* ---- consumer side ----------------------------------------------------- */

int wk_input_next(wk_input *in, const wk_batch **out) {
  double t0 = tsr_now_s();
  *out = NULL;
  pthread_mutex_lock(&in->mu);
  bool wake = false;
  if (in->held) {
    in->held = false;
    in->tail = (in->tail + 1) % in->nslots;
    /* wake the reader only once half the ring is free: fewer wakeups, and
     * each one fills several batches */
    int free_slots = in->nslots - in->nfull;
    wake = in->reader_waiting && (free_slots * 2 >= in->nslots ||
                                  in->nfull == 0);
    if (wake) in->reader_waiting = false;
  }
  if (wake) {
    pthread_mutex_unlock(&in->mu);
    pthread_cond_signal(&in->cv_space);
    pthread_mutex_lock(&in->mu);
  }
  while (in->nfull == 0 && !in->done) {
    if (in->reader_waiting) { /* never sleep while the reader does */
      in->reader_waiting = false;
      pthread_cond_signal(&in->cv_space);
    }
    pthread_cond_wait(&in->cv_data, &in->mu);
  }
  int rc = 0;
  if (in->nfull > 0) {
    in->nfull--;
    in->held = true;
    *out = &in->slots[in->tail].b;
  } else {
    rc = in->done_rc;
    snprintf(in->cerr, sizeof in->cerr, "%s", in->perr);
  }
  in->wait_s += tsr_now_s() - t0;
  pthread_mutex_unlock(&in->mu);
  return rc;
}

const char *wk_input_error(const wk_input *in) { return in->cerr; }

double wk_input_wait_seconds(const wk_input *in) {
  wk_input *m = (wk_input *)in;
  pthread_mutex_lock(&m->mu);
  double w = m->wait_s;
  pthread_mutex_unlock(&m->mu);
  return w;
}

const wk_input_schema *wk_input_get_schema(const wk_input *in) {
  return &in->schema;
}

int64_t wk_input_affine(const wk_input *in, const float **a,
                        const float **b) {
  *a = *b = NULL;
  if (in->identity) return 0;
  *a = in->xa;
  *b = in->xb;
  return in->schema.n_dense;
}

double wk_input_best_auc(const wk_input *in) { return in->schema.best_auc; }

int64_t wk_input_skipped(const wk_input *in) {
  return __atomic_load_n(&in->src->skipped, __ATOMIC_RELAXED);
}

double wk_input_reader_cpu_seconds(const wk_input *in) {
  wk_input *m = (wk_input *)in;
  double v = 0;
  pthread_mutex_lock(&m->mu);
  if (m->done) {
    v = m->reader_cpu_s;
  } else if (m->thread_started) {
    /* the thread is joined only in close, so its clock stays valid */
    clockid_t cid;
    struct timespec ts;
    if (pthread_getcpuclockid(m->thread, &cid) == 0 &&
        clock_gettime(cid, &ts) == 0)
      v = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
  }
  pthread_mutex_unlock(&m->mu);
  return v;
}

void wk_input_close(wk_input *in) {
  if (!in) return;
  if (in->thread_started) {
    pthread_mutex_lock(&in->mu);
    in->stop = true;
    pthread_cond_broadcast(&in->cv_space);
    pthread_mutex_unlock(&in->mu);
    pthread_join(in->thread, NULL);
  }
  for (int i = 0; in->slots && i < in->nslots; i++)
    slot_free(in, &in->slots[i]);
  free(in->slots);
  wk_src__close(in->src);
  free(in->xa);
  free(in->xb);
  wk_input__spec_free(&in->spec);
  pthread_mutex_destroy(&in->mu);
  pthread_cond_destroy(&in->cv_data);
  pthread_cond_destroy(&in->cv_space);
  free(in);
}

/* ---- open -------------------------------------------------------------- */

/* Adds row number `cnt` (its d dense features, scaled) to the sums of
 * its differences from the first row (`shift`, set by row 0), which keep
 * the variance accurate where the values are far from 0. */
static void stats_add(const float *x, int64_t d, double scale, int64_t cnt,
                      double *shift, double *sum, double *sq) {
  for (int64_t j = 0; j < d; j++) {
    double v = (double)x[j] * scale;
    if (cnt == 0) shift[j] = v;
    sum[j] += v - shift[j];
    sq[j] += (v - shift[j]) * (v - shift[j]);
  }
}

/* Mean and standard deviation of the scaled dense features over the
 * training rows (all workers' rows, so every worker uses the same). */
static int train_stats(const tsr_job *job, wk_input *in, char *err,
                       size_t errlen) {
  wk_input_spec ts;
  wk_src *s = NULL;
  wk_rec r = {0};
  double *sum = NULL, *sq = NULL;
  int rc = wk_input__spec_parse(job, WK_SPLIT_TRAIN, &ts, err, errlen);
  if (rc) return rc;
  wk_sel sel = {.split_k = ts.split_k, .split_index = ts.split_index,
                .split_keep = ts.split_keep, .W = 1, .w = 0};
  if ((rc = wk_sel__resolve(&sel, WK_SHARD_OFF, ts.n_paths, err, errlen)))
    goto out;
  if ((rc = wk_src__open(&ts, &sel, &s, err, errlen))) goto out;
  int64_t d = s->n_dense;
  if (d != in->schema.n_dense) {
    rc = tsr_errf(err, errlen, TSR_ESHAPE,
                  "%s: %lld dense features, but the training data has "
                  "%lld",
                  in->spec.where, (long long)in->schema.n_dense,
                  (long long)d);
    goto out;
  }
  sum = calloc((size_t)(d ? d : 1), sizeof *sum);
  sq = calloc((size_t)(d ? d : 1), sizeof *sq);
  if (!sum || !sq || (rc = wk_rec__init(&r, d, s->n_sparse))) {
    rc = rc ? rc : TSR_ENOMEM;
    goto out;
  }
  double *shift = calloc((size_t)(d ? d : 1), sizeof *shift);
  if (!shift) {
    rc = TSR_ENOMEM;
    goto out;
  }
  int64_t cnt = 0;
  if (s->rows) {
    for (int64_t i = 0; i < s->n_rows && !rc; i++) {
      if ((rc = s->ops->get(s, s->rows[i], &r, err, errlen))) break;
      stats_add(r.x, d, ts.scale, cnt++, shift, sum, sq);
    }
  } else if (!(rc = s->ops->begin(s, err, errlen))) {
    while (!(rc = s->ops->next(s, &r, err, errlen)))
      stats_add(r.x, d, ts.scale, cnt++, shift, sum, sq);
    if (rc == TSR_EEOF) rc = 0;
  }
  if (!rc && cnt == 0)
    rc = tsr_errf(err, errlen, TSR_EINVAL,
                  "%s.normalize: the training data has no rows",
                  in->spec.where);
  for (int64_t j = 0; !rc && j < d; j++) {
    double mean = sum[j] / (double)cnt;
    double var = sq[j] / (double)cnt - mean * mean;
    double sd = var > 0 ? sqrt(var) : 0;
    if (!(sd > 1e-12 * (fabs(mean + shift[j]) + 1))) sd = 1; /* constant */
    in->xa[j] = (float)(in->spec.scale / sd);
    in->xb[j] = (float)(-(mean + shift[j]) / sd);
  }
  free(shift);
out:
  wk_rec__free(&r);
  free(sum);
  free(sq);
  wk_src__close(s);
  wk_input__spec_free(&ts);
  return rc;
}

static bool loss_is_categorical(const tsr_job *job) {
  return job->loss && (strstr(job->loss, "categorical") != NULL ||
                       strncmp(job->loss, "kl", 2) == 0 ||
                       strncmp(job->loss, "KL", 2) == 0);
}

int wk_input_validate(wk_input *in, int64_t n_classes, char *err,
                      size_t errlen) {
  wk_src *s = in->src;
  if (!s || !s->ops->validate) return 0;
  int rc = s->ops->validate(s, n_classes, err, errlen);
  return rc ? TSR_EDATA : 0;
}

int wk_input_check(const tsr_job *job, char *err, size_t errlen) {
  wk_input_spec s;
  int rc = wk_input__spec_parse(job, WK_SPLIT_TRAIN, &s, err, errlen);
  if (rc) return rc;
  wk_input__spec_free(&s);
  if (job->data && json_object_get(job->data, "eval")) {
    if ((rc = wk_input__spec_parse(job, WK_SPLIT_EVAL, &s, err, errlen)))
      return rc;
    wk_input__spec_free(&s);
  }
  return 0;
}

int wk_input_open(const tsr_job *job, wk_split split,
                  const wk_input_opts *opts, wk_input **out, char *err,
                  size_t errlen) {
  *out = NULL;
  if (err && errlen) err[0] = 0;
  if (!opts || opts->batch_size < 1 || opts->num_workers < 1 ||
      opts->worker_index < 0 || opts->worker_index >= opts->num_workers)
    return tsr_errf(err, errlen, TSR_EINVAL,
                    "input options: batch_size >= 1 and 0 <= "
                    "worker_index < num_workers needed");
  wk_input *in = calloc(1, sizeof *in);
  if (!in) return TSR_ENOMEM;
  pthread_mutex_init(&in->mu, NULL);
  pthread_cond_init(&in->cv_data, NULL);
  pthread_cond_init(&in->cv_space, NULL);
  in->opts = *opts;
  int rc = wk_input__spec_parse(job, split, &in->spec, err, errlen);
  if (rc) goto fail;
  wk_input_spec *sp = &in->spec;
  in->batch_size = opts->batch_size;
  in->drop = sp->drop_remainder >= 0 ? sp->drop_remainder
                                     : opts->drop_remainder;
  in->epochs = sp->epochs != -2 ? sp->epochs : opts->epochs;
  in->seed = sp->has_seed ? sp->seed : opts->seed;

  wk_sel sel = {.split_k = sp->split_k, .split_index = sp->split_index,
                .split_keep = sp->split_keep, .W = opts->num_workers,
                .w = opts->worker_index};
  if ((rc = wk_sel__resolve(&sel, sp->shard, sp->n_paths, err, errlen)))
    goto fail;
  if ((rc = wk_src__open(sp, &sel, &in->src, err, errlen))) goto fail;
  wk_src *s = in->src;
  if (sp->shuffle_buffer < 0) default_shuffle(in);

  wk_input_schema *sc = &in->schema;
  sc->n_dense = s->n_dense;
  sc->n_sparse = s->n_sparse;
  sc->sparse_names = s->sparse_names;
  sc->vocab = s->vocab;
  sc->dense_names = s->dense_names;
  sc->n_examples = s->rows ? s->n_rows : -1;
  sc->n_total = s->n_total;
  sc->best_auc = s->best_auc;
  sc->n_classes = 1;
  if (sp->n_classes > 0) {
    sc->n_classes = sp->n_classes;
  } else if (loss_is_categorical(job)) {
    if (!s->rows)
      rc = tsr_errf(err, errlen, TSR_ECONFIG,
                    "%s.n_classes: missing (needed by loss %s for "
                    "streamed %s data)",
                    sp->where, job->loss, "tfrecord");
    else if (!s->labels_integral)
      rc = tsr_errf(err, errlen, TSR_EINVAL,
                    "%s: loss %s needs class indices as labels, but "
                    "some labels are not integers >= 0",
                    sp->where, job->loss);
    else
      sc->n_classes = (int64_t)s->label_max + 1;
    if (rc) goto fail;
  }

  int64_t d = sc->n_dense;
  in->xa = malloc((size_t)(d ? d : 1) * sizeof(float));
  in->xb = calloc((size_t)(d ? d : 1), sizeof(float));
  if (!in->xa || !in->xb) {
    rc = TSR_ENOMEM;
    goto fail;
  }
  for (int64_t j = 0; j < d; j++) in->xa[j] = (float)sp->scale;
  if (sp->normalize && (rc = train_stats(job, in, err, errlen))) goto fail;

  in->identity = true;
  for (int64_t j = 0; j < d; j++)
    if (in->xa[j] != 1.0f || in->xb[j] != 0.0f) in->identity = false;

  in->nslots = (sp->prefetch > 0 ? sp->prefetch : 1) + 1;
  in->slots = calloc((size_t)in->nslots, sizeof *in->slots);
  if (!in->slots) {
    rc = TSR_ENOMEM;
    goto fail;
  }
  for (int i = 0; i < in->nslots; i++)
    if ((rc = slot_init(in, &in->slots[i]))) goto fail;
  if (pthread_create(&in->thread, NULL, reader_main, in) != 0) {
    rc = tsr_errf(err, errlen, TSR_ENOMEM,
                  "input: cannot start the reader thread");
    goto fail;
  }
  in->thread_started = true;
  *out = in;
  return 0;
fail:
  if (rc == TSR_ENOMEM && err && errlen && !err[0])
    snprintf(err, errlen, "%s: out of memory", in->spec.where);
  wk_input_close(in);
  return rc;
}
