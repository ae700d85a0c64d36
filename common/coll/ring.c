/* Operations around the ring: their geometry, the messages to the right
 * neighbour and what the left neighbour's messages do on arrival.
 *
 * Happy path (all-reduce of n floats on N ranks, rank r). The buffer is
 * cut into N chunks, each chunk into nseg segments. At step s in
 * 0..2N-3 rank r sends chunk (r - s) mod N and receives chunk
 * (r - 1 - s) mod N; steps 0..N-2 add what arrives into the buffer
 * (reduce-scatter: after them rank r holds the whole sum of chunk
 * (r + 1) mod N), steps N-1..2N-3 copy it (all-gather). A segment goes on
 * to step s+1 as soon as step s delivered it, so segments pipeline
 * through the ring. Broadcast: the rank at distance d from the root
 * receives step d-1 straight into the buffer and passes it on as step d.
 *
 * Send order. Only max_sends messages are in flight to the right
 * neighbour (default 2); the rest wait in two queues, and a segment to
 * pass on (fwdq: it just arrived and was added or landed) goes before
 * the operation's own first-step segments (sendq). So the bytes just
 * added are sent while they are still in the cache, instead of behind
 * every first-step segment of the operation (at 64 MiB on 2 ranks, 32
 * MiB of them): the kernel's copy of a forwarded segment then reads the
 * cache, not memory. Measured on 2 cores (bench_coll, CPU per GiB sent,
 * ring over raw TCP, 64 MiB): 1.07-1.25 before, 0.84-1.08 after on 2
 * ranks, 1.08-1.17 and 0.91-1.09 on 3; 2 in flight cost less CPU than 4
 * or 8 (a window past the L2 cache), and one segment in flight while the
 * other lands keeps the link busy.
 *
 * Where a payload lands. Reduce-scatter segments land in a pool buffer
 * and are added; all-gather and broadcast segments land straight in the
 * caller's buffer, except an all-gather segment whose bytes this rank is
 * still sending from (its reduce-scatter send of the same segment has not
 * completed): it lands in a pool buffer and is copied when that send
 * completes. A segment of an operation not posted here yet lands in a
 * pool buffer (counted against early_bytes_max) and is applied when the
 * operation is posted.
 *
 * Failure modes. A message whose geometry does not match (another
 * operation under the same number, a step or segment out of range, a
 * length not the expected one, a duplicate) is refused and breaks the
 * group; a send that fails breaks it (group.c). An operation completes,
 * even when failed, only once no send and no landing touches its buffer.
 */
#include "common/coll/coll_int.h"
#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int mod(int64_t a, int n) {
  int64_t m = a % n;
  return (int)(m < 0 ? m + n : m);
}

void tsr_coll__op_name(const coll_op *op, char *buf, size_t len) {
  unsigned long long seq = (unsigned long long)op->seq;
  if (op->barrier)
    snprintf(buf, len, "barrier #%llu", seq);
  else if (op->kind == TSR_COLL_BROADCAST)
    snprintf(buf, len, "broadcast #%llu (%zu bytes from rank %d)", seq,
             op->count, op->root);
  else
    snprintf(buf, len, "all-reduce #%llu (%zu floats)", seq, op->count);
}

void tsr_coll__span(size_t count, int nchunks, int chunk, uint32_t nseg,
                    uint32_t seg, size_t *off, size_t *len) {
  size_t base = count / (size_t)nchunks, extra = count % (size_t)nchunks;
  size_t ch = (size_t)chunk;
  size_t coff = ch * base + (ch < extra ? ch : extra);
  size_t clen = base + (ch < extra);
  size_t sbase = clen / nseg, sextra = clen % nseg;
  *off = coff + (size_t)seg * sbase + (seg < sextra ? seg : sextra);
  *len = sbase + (seg < sextra);
}

uint32_t tsr_coll__nseg(size_t count, size_t elem, int nchunks,
                        uint32_t segment_bytes) {
  size_t maxchunk = count / (size_t)nchunks + (count % (size_t)nchunks != 0);
  if (maxchunk > SIZE_MAX / elem - segment_bytes) return UINT32_MAX;
  size_t segs = (maxchunk * elem + segment_bytes - 1) / segment_bytes;
  if (segs < 1) segs = 1;
  return segs > UINT32_MAX ? UINT32_MAX : (uint32_t)segs;
}

/* Steps, chunks and element size of an operation kind on N ranks. */
static void geometry(uint32_t kind, int n, uint32_t *nsteps, int *chunks,
                     size_t *elem) {
  if (kind == TSR_COLL_BROADCAST) {
    *nsteps = (uint32_t)(n - 1);
    *chunks = 1;
    *elem = 1;
  } else {
    *nsteps = (uint32_t)(2 * (n - 1));
    *chunks = n;
    *elem = sizeof(float);
  }
}

/* The chunk rank r receives (dir 0) or sends (dir 1) at `step`. */
static int step_chunk(uint32_t kind, int r, int n, uint32_t step, int send) {
  if (kind == TSR_COLL_BROADCAST) return 0;
  return mod((int64_t)r - (send ? 0 : 1) - (int64_t)step, n);
}

static void op_progress(coll_op *op) { op->progress_ns = tsr_now_ns(); }

/* ---- completion --------------------------------------------------------- */

static void land_free(tsr_coll *c, coll_land *l) {
  if (l->pool) tsr_coll__pool_put(c, l->pool);
  free(l->msg);
  free(l);
}

void tsr_coll__op_maybe_complete(coll_op *op) {
  tsr_coll *c = op->c;
  if (op->complete || op->refs > 0) return;
  if (!op->failed && (op->recv_left || op->send_left)) return;
  op->complete = true;
  tsr_list_remove(&op->node);
  tsr_list_push_back(&c->done, &op->node);
  c->st.op_ns += tsr_now_ns() - op->post_ns;
  if (op->failed) {
    c->st.failed++;
  } else {
    c->st.ops++;
    if (op->kind == TSR_COLL_ALLREDUCE) c->st.allreduce_floats += op->count;
  }
  if (c->st.inflight) c->st.inflight--;
  tsr_coll__wake(c);
}

void tsr_coll__op_fail(coll_op *op, int code, const char *fmt, ...) {
  if (op->failed || op->complete) return;
  tsr_coll *c = op->c;
  op->failed = true;
  op->status = code;
  char name[96], text[TSR_COLL_ERR_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  tsr_coll__op_name(op, name, sizeof name);
  /* a cause about this very operation names it already */
  if (strncmp(text, name, strlen(name)) == 0)
    snprintf(op->msg, sizeof op->msg, "%s", text);
  else
    snprintf(op->msg, sizeof op->msg, "%s: %s", name, text);
  /* messages not sent yet never will be */
  tsr_list *queues[2] = {&c->fwdq, &c->sendq};
  for (int q = 0; q < 2; q++)
    tsr_list_foreach_safe(it, tmp, queues[q]) {
      coll_msg *m = tsr_list_entry(it, coll_msg, node);
      if (m->op != op) continue;
      tsr_list_remove(&m->node);
      free(m);
    }
  tsr_list_foreach_safe(it, tmp, &op->deferred) {
    coll_land *l = tsr_list_entry(it, coll_land, node);
    tsr_list_remove(&l->node);
    land_free(c, l);
    op->refs--;
  }
  tsr_coll__op_maybe_complete(op);
}

void tsr_coll__deliver(tsr_coll *c) {
  if (c->cfg_done) {
    c->cfg_done = false;
    tsr_coll_cb cb = c->cfg_cb;
    void *data = c->cfg_data;
    c->cfg_cb = NULL;
    if (cb) cb(c->cfg_status, c->cfg_msg, data);
  }
  tsr_list *n;
  while ((n = tsr_list_first(&c->done))) {
    coll_op *op = tsr_list_entry(n, coll_op, node);
    tsr_list_remove(n);
    op->cb(op->failed ? op->status : 0, op->failed ? op->msg : "", op->data);
    free(op->got);
    free(op->sent);
    free(op);
  }
}

void tsr_coll__early_drop(tsr_coll *c) {
  tsr_list_foreach_safe(it, tmp, &c->early) {
    coll_land *l = tsr_list_entry(it, coll_land, node);
    tsr_list_remove(&l->node);
    land_free(c, l);
  }
  c->st.early_bytes = 0;
}

/* ---- sending ------------------------------------------------------------ */

/* Whether `step` is the first this rank sends in op (its own bytes, not
 * bytes that arrived). */
static bool first_step(const coll_op *op, uint32_t step) {
  if (op->kind != TSR_COLL_BROADCAST) return step == 0;
  return op->c->rank == op->root;
}

static void queue_send(coll_op *op, uint32_t step, uint32_t seg) {
  tsr_coll *c = op->c;
  coll_msg *m = calloc(1, sizeof *m);
  if (!m) {
    tsr_coll__break(c, TSR_ENOMEM, true, "out of memory queueing a message");
    return;
  }
  int chunks;
  uint32_t nsteps;
  size_t elem, off, len;
  geometry(op->kind, c->nranks, &nsteps, &chunks, &elem);
  tsr_coll__span(op->count, chunks,
                 step_chunk(op->kind, c->rank, c->nranks, step, 1), op->nseg,
                 seg, &off, &len);
  m->op = op;
  m->step = step;
  m->seg = seg;
  m->off = off * elem;
  m->len = len * elem;
  tsr_list_push_back(first_step(op, step) ? &c->sendq : &c->fwdq, &m->node);
}

static void on_sent(const tsr_rpc_result *r, void *data);

void tsr_coll__pump(tsr_coll *c) {
  if (!c->configured || c->closing) return;
  tsr_list *n;
  while (c->sending < c->o.max_sends &&
         ((n = tsr_list_first(&c->fwdq)) || (n = tsr_list_first(&c->sendq)))) {
    coll_msg *m = tsr_list_entry(n, coll_msg, node);
    tsr_list *from = first_step(m->op, m->step) ? &c->sendq : &c->fwdq;
    coll_op *op = m->op;
    Tessera__Coll__Data d = TESSERA__COLL__DATA__INIT;
    d.epoch = c->epoch;
    d.seq = op->seq;
    d.kind = (uint32_t)op->kind;
    d.count = op->count;
    d.root = (uint32_t)op->root;
    d.step = m->step;
    d.seg = m->seg;
    d.from_rank = (uint32_t)c->rank;
    uint8_t meta[96];
    size_t ml = tessera__coll__data__get_packed_size(&d);
    if (ml > sizeof meta) {
      tsr_coll__break(c, TSR_EINVAL, true, "data meta of %zu bytes", ml);
      return;
    }
    tessera__coll__data__pack(&d, meta);
    uv_buf_t b = uv_buf_init((char *)op->buf + m->off, (unsigned)m->len);
    tsr_rpc_request q = {0};
    q.method = TSR_COLL_M_DATA;
    q.meta = meta;
    q.meta_len = ml;
    q.payload = &b;
    q.npayload = m->len ? 1 : 0;
    q.deadline_ms = c->o.op_timeout_ms;
    tsr_list_remove(&m->node);
    int rc = tsr_rpc_call(c->right.cl, &q, on_sent, m);
    if (rc == TSR_EBUSY && c->sending > 0) {
      /* the connection's call limit: go on when a send completes */
      tsr_list_push_front(from, &m->node);
      return;
    }
    if (rc) {
      char who[160];
      tsr_coll__who(c, c->right.rank, who, sizeof who);
      free(m);
      op->send_left--;
      tsr_coll__break(c, rc, true, "sending to %s: %s", who,
                      tsr_strerror(rc));
      return;
    }
    m->inflight = true;
    c->sending++;
    op->refs++;
  }
}

static void apply(coll_op *op, coll_land *l);

static void on_sent(const tsr_rpc_result *r, void *data) {
  coll_msg *m = data;
  coll_op *op = m->op;
  tsr_coll *c = op->c;
  c->sending--;
  op->refs--;
  if (r->status == 0) {
    c->st.segs_sent++;
    c->st.bytes_sent += m->len;
    op->sent[(size_t)m->step * op->nseg + m->seg] = 1;
    op->send_left--;
    op_progress(op);
    /* an all-gather segment of the same bytes may wait for this send */
    if (op->kind == TSR_COLL_ALLREDUCE && !op->failed) {
      uint32_t ag = m->step + (uint32_t)(c->nranks - 1);
      tsr_list_foreach_safe(it, tmp, &op->deferred) {
        coll_land *l = tsr_list_entry(it, coll_land, node);
        if (l->step != ag || l->seg != m->seg) continue;
        tsr_list_remove(&l->node);
        op->refs--;
        apply(op, l);
      }
    }
  } else if (!op->failed) {
    char who[160];
    tsr_coll__who(c, c->right.rank, who, sizeof who);
    /* a refusal's message names its cause (land_prepare) */
    if (r->remote)
      tsr_coll__break(c, r->status, true, "%s", r->message);
    else
      tsr_coll__break(c, r->status, true, "sending to %s: %s", who,
                      r->message);
  }
  free(m);
  tsr_coll__op_maybe_complete(op);
  tsr_coll__pump(c);
  if (c->closing) tsr_coll__deliver(c);
}

/* ---- receiving ---------------------------------------------------------- */

static void add_f32(float *restrict dst, const float *restrict src,
                    size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] += src[i];
}

/* What a delivered segment makes next: the same segment one step on. */
static void forward(coll_op *op, uint32_t step, uint32_t seg) {
  tsr_coll *c = op->c;
  if (op->kind == TSR_COLL_ALLREDUCE) {
    if (step + 1 < op->nsteps) queue_send(op, step + 1, seg);
  } else {
    int d = mod((int64_t)c->rank - op->root, c->nranks);
    if (d <= c->nranks - 2) queue_send(op, step + 1, seg);
  }
}

/* Applies a landed segment to its operation (or defers an all-gather
 * segment whose bytes are still being sent from). Consumes l. */
static void apply(coll_op *op, coll_land *l) {
  tsr_coll *c = op->c;
  size_t idx = (size_t)l->step * op->nseg + l->seg;
  uint8_t *dst = op->buf + l->off;
  bool rs = op->kind == TSR_COLL_ALLREDUCE &&
            l->step < (uint32_t)(c->nranks - 1);
  if (rs) {
    if (l->len)
      add_f32((float *)(void *)dst, (const float *)(void *)l->pool,
              l->len / sizeof(float));
  } else if (l->pool) {
    if (op->kind == TSR_COLL_ALLREDUCE) {
      size_t prev = (size_t)(l->step - (uint32_t)(c->nranks - 1)) * op->nseg +
                    l->seg;
      if (!op->sent[prev]) {
        tsr_list_push_back(&op->deferred, &l->node);
        op->refs++;
        return;
      }
    }
    memcpy(dst, l->pool, l->len);
  }
  uint32_t step = l->step, seg = l->seg;
  land_free(c, l);
  op->got[idx] = 2;
  op->recv_left--;
  op_progress(op);
  forward(op, step, seg);
  tsr_coll__op_maybe_complete(op);
}

static coll_op *find_op(tsr_coll *c, uint64_t seq) {
  tsr_list_foreach(it, &c->ops) {
    coll_op *op = tsr_list_entry(it, coll_op, node);
    if (op->seq == seq) return op;
  }
  return NULL;
}

/* Whether a message's operation is the one posted here; the mismatch in
 * err otherwise. */
static int op_matches(tsr_coll *c, const coll_op *op, uint32_t kind,
                      uint64_t count, uint32_t root, char *err,
                      size_t errlen) {
  if (op->kind == kind && op->count == count &&
      (kind != TSR_COLL_BROADCAST || (uint32_t)op->root == root))
    return 0;
  char name[96], who[160];
  tsr_coll__op_name(op, name, sizeof name);
  tsr_coll__who(c, mod((int64_t)c->rank - 1, c->nranks), who, sizeof who);
  if (kind == TSR_COLL_BROADCAST)
    return tsr_errf(err, errlen, TSR_ESHAPE, "%s here, but %s sent a "
                    "broadcast of %llu bytes from rank %u under that number",
                    name, who, (unsigned long long)count, root);
  return tsr_errf(err, errlen, TSR_ESHAPE, "%s here, but %s sent an "
                  "all-reduce of %llu floats under that number", name, who,
                  (unsigned long long)count);
}

/* Checks a DATA message and chooses where its payload lands. */
static int land_check(tsr_coll *c, const tsr_rpc_incoming *call,
                      size_t len, coll_land **out, char *err,
                      size_t errlen) {
  const Tessera__Coll__Data *m = call->request;
  char me[160];
  tsr_coll__who(c, c->rank, me, sizeof me);
  *out = NULL;
  if (c->closing)
    return tsr_errf(err, errlen, TSR_ESHUTDOWN, "%s is shutting down", me);
  if (!c->epoch || m->epoch != c->epoch)
    return tsr_errf(err, errlen, TSR_ESTALE, "data of group %llu, but %s "
                    "is in group %llu", (unsigned long long)m->epoch,
                    me, (unsigned long long)c->epoch);
  if (c->broken) return tsr_errf(err, errlen, c->broken_code, "%s", c->cause);
  int n = c->nranks, r = c->rank;
  if (m->from_rank != (uint32_t)mod((int64_t)r - 1, n))
    return tsr_errf(err, errlen, TSR_EPROTO, "data from rank %u; rank %d "
                    "takes data from rank %d only", m->from_rank, r,
                    mod((int64_t)r - 1, n));
  if (m->kind != TSR_COLL_ALLREDUCE && m->kind != TSR_COLL_BROADCAST)
    return tsr_errf(err, errlen, TSR_EPROTO, "unknown operation kind %u",
                    m->kind);
  uint32_t nsteps;
  int chunks;
  size_t elem;
  geometry(m->kind, n, &nsteps, &chunks, &elem);
  if (m->kind == TSR_COLL_BROADCAST) {
    if (m->root >= (uint32_t)n)
      return tsr_errf(err, errlen, TSR_EPROTO, "broadcast root %u of %d "
                      "ranks", m->root, n);
    int d = mod((int64_t)r - m->root, n);
    if (d == 0 || m->step != (uint32_t)(d - 1))
      return tsr_errf(err, errlen, TSR_EPROTO, "broadcast step %u at "
                      "distance %d from its root", m->step, d);
  }
  if (m->step >= nsteps)
    return tsr_errf(err, errlen, TSR_EPROTO, "step %u of %u", m->step,
                    nsteps);
  if (m->count > SIZE_MAX / elem)
    return tsr_errf(err, errlen, TSR_EPROTO, "operation of %llu elements",
                    (unsigned long long)m->count);
  uint32_t nseg = tsr_coll__nseg((size_t)m->count, elem, chunks,
                                 c->o.segment_bytes);
  if (m->seg >= nseg)
    return tsr_errf(err, errlen, TSR_EPROTO, "segment %u of %u", m->seg,
                    nseg);
  size_t off, slen;
  tsr_coll__span((size_t)m->count, chunks,
                 step_chunk(m->kind, r, n, m->step, 0), nseg, m->seg, &off,
                 &slen);
  if (slen * elem != len)
    return tsr_errf(err, errlen, TSR_EPROTO, "segment of %zu bytes where "
                    "%zu belong", len, slen * elem);
  coll_land *l = calloc(1, sizeof *l);
  if (!l) return tsr_errf(err, errlen, TSR_ENOMEM, "out of memory");
  l->epoch = m->epoch;
  l->seq = m->seq;
  l->kind = m->kind;
  l->root = m->root;
  l->step = m->step;
  l->seg = m->seg;
  l->count = m->count;
  l->off = off * elem;
  l->len = len;
  int rc = 0;
  if (m->seq < c->next_seq) {
    coll_op *op = find_op(c, m->seq);
    if (!op) {
      rc = tsr_errf(err, errlen, TSR_EPROTO, "data for operation #%llu, "
                    "which is complete here", (unsigned long long)m->seq);
      goto fail;
    }
    if ((rc = op_matches(c, op, m->kind, m->count, m->root, err, errlen))) {
      tsr_coll__op_fail(op, rc, "%s", err);
      goto fail;
    }
    if (op->failed) {
      rc = tsr_errf(err, errlen, op->status, "%s", op->msg);
      goto fail;
    }
    size_t idx = (size_t)m->step * nseg + m->seg;
    if (op->got[idx]) {
      rc = tsr_errf(err, errlen, TSR_EPROTO, "segment %u of step %u of "
                    "operation #%llu twice", m->seg, m->step,
                    (unsigned long long)m->seq);
      goto fail;
    }
    op->got[idx] = 1;
    l->op = op;
    op->refs++;
    bool rs = m->kind == TSR_COLL_ALLREDUCE && m->step < (uint32_t)(n - 1);
    if (rs)
      l->mode = COLL_LAND_SCRATCH;
    else if (m->kind == TSR_COLL_ALLREDUCE &&
             !op->sent[(size_t)(m->step - (uint32_t)(n - 1)) * nseg + m->seg])
      l->mode = COLL_LAND_SCRATCH;
    else
      l->mode = COLL_LAND_DIRECT;
  } else {
    if (c->st.early_bytes + len > c->o.early_bytes_max) {
      rc = tsr_errf(err, errlen, TSR_ENOMEM, "%s holds %llu bytes for "
                    "operations it has not posted, %zu more would pass its "
                    "limit %llu; operation #%llu is %llu ahead", me,
                    (unsigned long long)c->st.early_bytes, len,
                    (unsigned long long)c->o.early_bytes_max,
                    (unsigned long long)m->seq,
                    (unsigned long long)(m->seq - c->next_seq + 1));
      goto fail;
    }
    l->mode = COLL_LAND_EARLY;
  }
  if (l->mode != COLL_LAND_DIRECT && len) {
    if (!(l->pool = tsr_coll__pool_get(c))) {
      if (l->op) {
        l->op->refs--;
        l->op->got[(size_t)m->step * nseg + m->seg] = 0;
      }
      rc = tsr_errf(err, errlen, TSR_ENOMEM, "out of memory for a segment");
      goto fail;
    }
  }
  *out = l;
  return 0;
fail:
  free(l);
  return rc;
}

/* land_check, with a refusal's message made to stand alone (it travels
 * back to the sender, who adopts it as the group's cause), and the group
 * broken here unless the message only came too late. */
static int land_prepare(tsr_coll *c, const tsr_rpc_incoming *call,
                        size_t len, coll_land **out, char *err,
                        size_t errlen) {
  char why[TSR_COLL_ERR_MAX];
  int rc = land_check(c, call, len, out, why, sizeof why);
  if (!rc) return 0;
  if (rc == TSR_EPROTO) {
    char me[160], left[160];
    tsr_coll__who(c, c->rank, me, sizeof me);
    tsr_coll__who(c, mod((int64_t)c->rank - 1, c->nranks), left,
                  sizeof left);
    snprintf(err, errlen, "%s refused data from %s: %s", me, left, why);
  } else {
    snprintf(err, errlen, "%s", why);
  }
  if (rc != TSR_ESTALE && rc != TSR_ESHUTDOWN && !c->broken)
    tsr_coll__break(c, rc, true, "%s", err);
  return rc;
}

/* A refused message whose payload still arrives (into a pool buffer, so
 * a connection lost on the way hands it back): the handler answers with
 * the reason. */
static coll_land *land_refusal(tsr_coll *c, int rc, const char *err,
                               size_t len) {
  coll_land *l = calloc(1, sizeof *l);
  if (!l) return NULL;
  l->mode = COLL_LAND_REFUSED;
  l->status = rc;
  l->msg = strdup(err);
  l->len = len;
  if (!l->msg || (len && !(l->pool = tsr_coll__pool_get(c)))) {
    free(l->msg);
    free(l);
    return NULL;
  }
  return l;
}

int tsr_coll__data_alloc(tsr_rpc_incoming *call, size_t len, void **buf,
                         void *data) {
  tsr_coll *c = data;
  coll_land *l;
  char err[TSR_COLL_ERR_MAX];
  int rc = land_prepare(c, call, len, &l, err, sizeof err);
  if (rc) {
    if (len > c->o.segment_bytes || !(l = land_refusal(c, rc, err, len)))
      return rc;
  }
  call->user = l;
  c->st.landing++;
  *buf = l->pool ? (void *)l->pool : (void *)(l->op->buf + l->off);
  return 0;
}

void tsr_coll__data_abort(tsr_rpc_incoming *call, void *buf, int status,
                          void *data) {
  tsr_coll *c = data;
  coll_land *l = call->user;
  call->user = NULL;
  if (!l) return;
  c->st.landing--;
  coll_op *op = l->op;
  if (op) {
    op->refs--;
    op->got[(size_t)l->step * op->nseg + l->seg] = 0;
  }
  bool refusal = l->mode == COLL_LAND_REFUSED;
  land_free(c, l);
  if (!refusal && !c->broken && !c->closing) {
    char who[160];
    tsr_coll__who(c, mod((int64_t)c->rank - 1, c->nranks), who, sizeof who);
    tsr_coll__break(c, status, true, "%s lost in the middle of a segment: "
                    "%s", who, tsr_strerror(status));
  }
  if (op) tsr_coll__op_maybe_complete(op);
  if (c->closing) tsr_coll__deliver(c);
}

static bool early_apply(tsr_coll *c, coll_op *op, coll_land *l);

void tsr_coll__on_data(tsr_rpc_incoming *call, void *data) {
  tsr_coll *c = data;
  coll_land *l = call->user;
  char err[TSR_COLL_ERR_MAX];
  int rc = 0;
  call->user = NULL;
  if (l) c->st.landing--;
  if (!l) {
    /* an empty segment: no payload_alloc ran */
    rc = land_prepare(c, call, call->payload_len, &l, err, sizeof err);
    if (rc) {
      tsr_rpc_reply_error(call, rc, err);
      if (c->closing) tsr_coll__deliver(c);
      return;
    }
  }
  if (l->mode == COLL_LAND_REFUSED) {
    tsr_rpc_reply_error(call, l->status, l->msg);
    land_free(c, l);
    if (c->closing) tsr_coll__deliver(c);
    return;
  }
  c->st.segs_recv++;
  c->st.bytes_recv += l->len;
  coll_op *op = l->op;
  if (!op && (l->epoch != c->epoch || c->broken || c->closing)) {
    /* the group changed while the payload was on its way */
    rc = TSR_ESTALE;
    snprintf(err, sizeof err, "data of group %llu came after its end",
             (unsigned long long)l->epoch);
    land_free(c, l);
  } else if (!op && l->seq < c->next_seq) {
    /* posted while the payload was on its way: applied now, or dropped
     * when its operation is over (failed) */
    coll_op *late = find_op(c, l->seq);
    if (late)
      early_apply(c, late, l);
    else
      land_free(c, l);
  } else if (!op) {
    tsr_list_push_back(&c->early, &l->node);
    c->st.early_bytes += l->len;
  } else {
    op->refs--;
    if (op->failed) {
      rc = op->status;
      snprintf(err, sizeof err, "%s", op->msg);
      land_free(c, l);
      tsr_coll__op_maybe_complete(op);
    } else {
      apply(op, l);
    }
  }
  tsr_coll__pump(c);
  if (rc)
    tsr_rpc_reply_error(call, rc, err);
  else if (tsr_rpc_reply(call, NULL, 0, NULL, 0, NULL, NULL))
    tsr_rpc_reply_error(call, TSR_EINVAL, "answer refused");
  if (c->closing) tsr_coll__deliver(c);
}

/* ---- posting ------------------------------------------------------------ */

/* Applies a segment that arrived before op was posted (consumes l);
 * false when it broke the group. */
static bool early_apply(tsr_coll *c, coll_op *op, coll_land *l) {
  char err[TSR_COLL_ERR_MAX];
  int rc = op_matches(c, op, l->kind, l->count, l->root, err, sizeof err);
  size_t idx = (size_t)l->step * op->nseg + l->seg;
  if (!rc && op->got[idx])
    rc = tsr_errf(err, sizeof err, TSR_EPROTO, "segment %u of step %u "
                  "twice", l->seg, l->step);
  if (rc) {
    land_free(c, l);
    tsr_coll__op_fail(op, rc, "%s", err);
    tsr_coll__break(c, rc, true, "%s", err);
    return false;
  }
  if (op->failed) {
    land_free(c, l);
    return true;
  }
  op->got[idx] = 1;
  l->op = op;
  l->mode = COLL_LAND_SCRATCH;
  apply(op, l);
  return true;
}

/* Applies the segments that arrived before op was posted. */
static void take_early(tsr_coll *c, coll_op *op) {
  tsr_list_foreach_safe(it, tmp, &c->early) {
    coll_land *l = tsr_list_entry(it, coll_land, node);
    if (l->seq != op->seq) continue;
    tsr_list_remove(&l->node);
    c->st.early_bytes -= l->len;
    if (!early_apply(c, op, l)) return;
  }
}

int tsr_coll__post(tsr_coll *c, tsr_coll_kind kind, bool barrier, void *buf,
                   size_t count, int root, tsr_coll_cb cb, void *data) {
  if (c->closing) return TSR_ESHUTDOWN;
  if (!cb || (count && !buf)) return TSR_EINVAL;
  if (!c->epoch) return TSR_ESTALE;
  int n = c->nranks;
  if (kind == TSR_COLL_BROADCAST && (root < 0 || root >= n))
    return TSR_EINVAL;
  uint32_t nsteps;
  int chunks;
  size_t elem;
  geometry((uint32_t)kind, n, &nsteps, &chunks, &elem);
  if (count > SIZE_MAX / elem) return TSR_EINVAL;
  coll_op *op = calloc(1, sizeof *op);
  if (!op) return TSR_ENOMEM;
  op->c = c;
  op->kind = kind;
  op->barrier = barrier;
  op->buf = buf;
  op->count = count;
  op->root = kind == TSR_COLL_BROADCAST ? root : 0;
  op->cb = cb;
  op->data = data;
  op->nsteps = nsteps;
  op->nseg = tsr_coll__nseg(count, elem, chunks, c->o.segment_bytes);
  tsr_list_init(&op->deferred);
  size_t cells = (size_t)nsteps * op->nseg;
  if (cells) {
    op->got = calloc(cells, 1);
    op->sent = calloc(cells, 1);
    if (!op->got || !op->sent) {
      free(op->got);
      free(op->sent);
      free(op);
      return TSR_ENOMEM;
    }
  }
  op->seq = c->next_seq++;
  op->post_ns = op->progress_ns = tsr_now_ns();
  tsr_list_push_back(&c->ops, &op->node);
  c->st.inflight++;
  if (kind == TSR_COLL_ALLREDUCE) {
    op->recv_left = op->send_left = (uint32_t)cells;
  } else if (n > 1) {
    int d = mod((int64_t)c->rank - root, n);
    op->recv_left = d == 0 ? 0 : op->nseg;
    op->send_left = d <= n - 2 ? op->nseg : 0;
  }
  if (c->broken) {
    tsr_coll__op_fail(op, c->broken_code, "%s", c->cause);
    return 0;
  }
  /* the first step's messages: every segment, at once */
  if (kind == TSR_COLL_ALLREDUCE || (n > 1 && c->rank == root))
    for (uint32_t s = 0; s < op->nseg && cells; s++) queue_send(op, 0, s);
  take_early(c, op);
  tsr_coll__op_maybe_complete(op);
  tsr_coll__pump(c);
  return 0;
}

void tsr_coll__check_timeouts(tsr_coll *c, uint64_t now) {
  if (!c->configured || c->broken) return;
  uint64_t limit = (uint64_t)c->o.op_timeout_ms * 1000000u;
  tsr_list_foreach(it, &c->ops) {
    coll_op *op = tsr_list_entry(it, coll_op, node);
    if (op->failed || now < op->progress_ns || now - op->progress_ns < limit)
      continue;
    char name[96], who[160];
    tsr_coll__op_name(op, name, sizeof name);
    if (op->recv_left) {
      tsr_coll__who(c, mod((int64_t)c->rank - 1, c->nranks), who,
                    sizeof who);
      tsr_coll__break(c, TSR_ETIMEOUT, true, "%s: nothing from %s for %u ms "
                      "(a rank that has not posted it, or a stalled ring)",
                      name, who, c->o.op_timeout_ms);
    } else {
      tsr_coll__who(c, c->right.rank, who, sizeof who);
      tsr_coll__break(c, TSR_ETIMEOUT, true, "%s: %s did not take its "
                      "segments for %u ms", name, who, c->o.op_timeout_ms);
    }
    return;
  }
}
