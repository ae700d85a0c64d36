/* Client side of the PS methods (see client.h). Each call packs its meta,
 * hands the caller's buffers to the RPC layer as payload (ids and
 * gradients as separate uv_buf_t, never copied) and names the caller's
 * destination as the response buffer, so pulled values are read straight
 * into it. The callback decodes the answer meta and reports.
 */
#include "ps/client/client.h"
#include "common/err.h"
#include "ps/client/client_int.h"

#include <stdlib.h>
#include <string.h>

struct ps_client {
  tsr_rpc_client *rpc;
  uint32_t deadline_ms;
  uint64_t era;
  uint64_t snapshot;   /* pulls read this evaluation snapshot (0: none) */
};

typedef struct {
  ps_client_cb cb;
  void *data;
  uint32_t method;
} ps__pending;

int ps_client_new(ps_client **out, tsr_rpc_ctx *ctx, const char *addr) {
  ps_client *c = calloc(1, sizeof *c);
  if (!c) return TSR_ENOMEM;
  int rc = tsr_rpc_client_new(&c->rpc, ctx, addr);
  if (rc) {
    free(c);
    return rc;
  }
  *out = c;
  return 0;
}

typedef struct {
  tsr_rpc_close_cb cb;
  void *data;
  ps_client *c;
} ps__closing;

static void ps__client_closed(void *data) {
  ps__closing *k = data;
  free(k->c);
  if (k->cb) k->cb(k->data);
  free(k);
}

void ps_client_close(ps_client *c, tsr_rpc_close_cb cb, void *data) {
  ps__closing *k = malloc(sizeof *k);
  if (!k) { /* still close; the struct leaks rather than dangles */
    tsr_rpc_client_close(c->rpc, cb, data);
    return;
  }
  k->cb = cb;
  k->data = data;
  k->c = c;
  tsr_rpc_client_close(c->rpc, ps__client_closed, k);
}

void ps_client_set_deadline(ps_client *c, uint32_t ms) { c->deadline_ms = ms; }
void ps_client_set_era(ps_client *c, uint64_t era) { c->era = era; }
void ps_client_set_snapshot(ps_client *c, uint64_t id) { c->snapshot = id; }
tsr_rpc_client *ps_client_rpc(ps_client *c) { return c->rpc; }

/* The answer meta of each method (NULL: its answer carries nothing the
 * caller reads). */
static const ProtobufCMessageDescriptor *ps__answer_type(uint32_t method) {
  switch (method) {
    case PS_M_PULL:
    case PS_M_PULL_ROWS:
    case PS_M_PUSH:
    case PS_M_PUSH_ROWS:
    case PS_M_PUSH_PULL:
      /* PullResponse and PushResponse share their fields */
      return &tessera__ps__pull_response__descriptor;
    case PS_M_CREATE: return &tessera__ps__create_response__descriptor;
    case PS_M_CLOCK: return &tessera__ps__clock_response__descriptor;
    case PS_M_SAVE:
    case PS_M_SAVE_WAIT: return &tessera__ps__save_response__descriptor;
    case PS_M_RESTORE: return &tessera__ps__restore_response__descriptor;
    case PS_M_CONFIG: return &tessera__ps__config_response__descriptor;
    case PS_M_STATS: return &tessera__ps__stats_response__descriptor;
    default: return NULL;
  }
}

/* The decoded answer `any` of `method` into res. */
static void ps__answer_fill(ps_result *res, uint32_t method,
                            const ProtobufCMessage *any,
                            const tsr_rpc_result *r) {
  switch (method) {
    case PS_M_CREATE: {
      const Tessera__Ps__CreateResponse *m = (const void *)any;
      for (size_t i = 0; i < m->n_created; i++) res->count += m->created[i];
      break;
    }
    case PS_M_CLOCK: {
      const Tessera__Ps__ClockResponse *m = (const void *)any;
      res->min_clock = m->min_clock;
      res->count = m->active;
      res->clock = m->clock;
      res->era = m->era;
      break;
    }
    case PS_M_SAVE:
    case PS_M_SAVE_WAIT: {
      const Tessera__Ps__SaveResponse *m = (const void *)any;
      res->count = m->shards;
      res->nbytes = m->bytes;
      res->save = m;
      break;
    }
    case PS_M_RESTORE: {
      const Tessera__Ps__RestoreResponse *m = (const void *)any;
      res->count = m->shards;
      res->era = m->era;
      break;
    }
    case PS_M_CONFIG:
      res->era = ((const Tessera__Ps__ConfigResponse *)(const void *)any)->era;
      break;
    case PS_M_STATS: res->stats = any; break;
    default: { /* pulls and pushes */
      const Tessera__Ps__PullResponse *m = (const void *)any;
      res->version = m->version;
      res->step = m->step;
      res->nbytes = r->payload_len;
      break;
    }
  }
}

static void ps__done(const tsr_rpc_result *r, void *data) {
  ps__pending *p = data;
  ps_result res;
  memset(&res, 0, sizeof res);
  res.status = r->status;
  res.message = r->message ? r->message : "";
  res.min_clock = -1;
  const ProtobufCMessageDescriptor *type = ps__answer_type(p->method);
  ProtobufCMessage *any = NULL;
  if (r->status == 0 && type) {
    any = protobuf_c_message_unpack(type, NULL, r->meta_len, r->meta);
    if (any) {
      ps__answer_fill(&res, p->method, any, r);
    } else if (p->method == PS_M_STATS) {
      res.status = TSR_EPROTO;
      res.message = "stats answer does not decode";
    } else if (p->method != PS_M_CONFIG) { /* a config without its era
                                              still took effect */
      res.status = TSR_EPROTO;
      res.message = "the PS's answer meta does not decode";
    }
    if (p->method == PS_M_STATS) {
      res.payload = r->payload;
      res.payload_len = r->payload_len;
    }
  }
  p->cb(&res, p->data);
  if (any) protobuf_c_message_free_unpacked(any, NULL);
  free(p);
}

static int ps__call(ps_client *c, uint32_t method, const ProtobufCMessage *m,
                    const uv_buf_t *bufs, unsigned nbufs, void *resp,
                    size_t resp_len, ps_client_cb cb, void *data) {
  if (!cb) return TSR_EINVAL;
  ps__pending *p = malloc(sizeof *p);
  if (!p) return TSR_ENOMEM;
  p->cb = cb;
  p->data = data;
  p->method = method;
  tsr_rpc_request req = {.method = method,
                         .payload = bufs,
                         .npayload = nbufs,
                         .resp_buf = resp,
                         .resp_len = resp_len,
                         .deadline_ms = c->deadline_ms};
  int rc = tsr_rpc_call_msg(c->rpc, &req, m, ps__done, p);
  if (rc) free(p);
  return rc;
}

int ps_client_create(ps_client *c, const ps_var_spec *specs, size_t n,
                     ps_client_cb cb, void *data) {
  Tessera__Ps__CreateRequest m = TESSERA__PS__CREATE_REQUEST__INIT;
  Tessera__Ps__VarSpec *v = calloc(n ? n : 1, sizeof *v);
  Tessera__Ps__VarSpec **vp = calloc(n ? n : 1, sizeof *vp);
  Tessera__Ps__Initializer *in = calloc(n ? n : 1, sizeof *in);
  Tessera__Ps__Optimizer *o = calloc(n ? n : 1, sizeof *o);
  Tessera__Ps__LrSchedule *sc = calloc(n ? n : 1, sizeof *sc);
  int64_t *shapes = calloc(n ? n * TSR_MAX_RANK : 1, sizeof *shapes);
  int rc = TSR_ENOMEM;
  if (!v || !vp || !in || !o || !sc || !shapes) goto out;
  for (size_t i = 0; i < n; i++) {
    ps__client_spec_to_proto(&specs[i], &v[i], &in[i], &o[i], &sc[i],
                             &shapes[i * TSR_MAX_RANK]);
    vp[i] = &v[i];
  }
  m.n_vars = n;
  m.vars = vp;
  rc = ps__call(c, PS_M_CREATE, &m.base, NULL, 0, NULL, 0, cb, data);
out:
  free(v);
  free(vp);
  free(in);
  free(o);
  free(sc);
  free(shapes);
  return rc;
}

/* Every pull: dense (no ids) or rows by id, values on the wire in
 * `dtype`, received into dst[0..dst_bytes). */
static int ps__pull(ps_client *c, uint32_t method, const char *name, int shard,
                    int worker, int64_t clock, ps_dtype dtype,
                    const int64_t *ids, size_t n_ids, void *dst,
                    size_t dst_bytes, ps_client_cb cb, void *data) {
  Tessera__Ps__PullRequest m = TESSERA__PS__PULL_REQUEST__INIT;
  m.name = (char *)name;
  m.shard = shard;
  m.worker = worker;
  m.clock = clock;
  m.n_ids = n_ids;
  m.dtype = dtype;
  m.era = c->era;
  m.snapshot = c->snapshot;
  uv_buf_t b = uv_buf_init((char *)ids, (unsigned)(n_ids * 8));
  return ps__call(c, method, &m.base, &b, n_ids ? 1 : 0, dst, dst_bytes, cb,
                  data);
}

int ps_client_pull(ps_client *c, const char *name, int shard, int worker,
                   int64_t clock, float *dst, size_t n_floats, ps_client_cb cb,
                   void *data) {
  return ps__pull(c, PS_M_PULL, name, shard, worker, clock, PS_DT_F32, NULL, 0,
                  dst, n_floats * 4, cb, data);
}

int ps_client_pull_as(ps_client *c, const char *name, int shard, int worker,
                      int64_t clock, ps_dtype dtype, void *dst,
                      size_t dst_bytes, ps_client_cb cb, void *data) {
  return ps__pull(c, PS_M_PULL, name, shard, worker, clock, dtype, NULL, 0, dst,
                  dst_bytes, cb, data);
}

int ps_client_pull_rows_as(ps_client *c, const char *name, int shard,
                           int worker, int64_t clock, ps_dtype dtype,
                           const int64_t *ids, size_t n_ids, void *dst,
                           size_t dst_bytes, ps_client_cb cb, void *data) {
  return ps__pull(c, PS_M_PULL_ROWS, name, shard, worker, clock, dtype, ids,
                  n_ids, dst, dst_bytes, cb, data);
}

int ps_client_pull_rows(ps_client *c, const char *name, int shard, int worker,
                        int64_t clock, const int64_t *ids, size_t n_ids,
                        float *dst, size_t width, ps_client_cb cb, void *data) {
  return ps__pull(c, PS_M_PULL_ROWS, name, shard, worker, clock, PS_DT_F32, ids,
                  n_ids, dst, n_ids * width * 4, cb, data);
}

static int ps__push(ps_client *c, uint32_t method, const char *name, int shard,
                    int worker, int64_t step, ps_dtype dtype,
                    const int64_t *ids, size_t n_ids, const void *grad,
                    size_t nbytes, const int64_t *pull_ids, size_t n_pull,
                    int64_t pull_clock, ps_dtype pull_dtype, void *dst,
                    size_t dst_bytes, ps_client_cb cb, void *data) {
  Tessera__Ps__PushRequest m = TESSERA__PS__PUSH_REQUEST__INIT;
  m.name = (char *)name;
  m.shard = shard;
  m.worker = worker;
  m.step = step;
  m.dtype = dtype;
  m.n_ids = n_ids;
  m.n_pull_ids = n_pull;
  m.pull_clock = pull_clock;
  m.era = c->era;
  m.pull_dtype = pull_dtype;
  uv_buf_t b[3];
  unsigned nb = 0;
  if (n_ids) b[nb++] = uv_buf_init((char *)ids, (unsigned)(n_ids * 8));
  if (nbytes) b[nb++] = uv_buf_init((char *)grad, (unsigned)nbytes);
  if (n_pull) b[nb++] = uv_buf_init((char *)pull_ids, (unsigned)(n_pull * 8));
  return ps__call(c, method, &m.base, b, nb, dst, dst_bytes, cb, data);
}

int ps_client_push(ps_client *c, const char *name, int shard, int worker,
                   int64_t step, ps_dtype dtype, const void *grad,
                   size_t nbytes, ps_client_cb cb, void *data) {
  return ps__push(c, PS_M_PUSH, name, shard, worker, step, dtype, NULL, 0,
                  grad, nbytes, NULL, 0, 0, PS_DT_F32, NULL, 0, cb,
                  data);
}

int ps_client_push_rows(ps_client *c, const char *name, int shard, int worker,
                        int64_t step, ps_dtype dtype, const int64_t *ids,
                        size_t n_ids, const void *grad, size_t nbytes,
                        ps_client_cb cb, void *data) {
  return ps__push(c, PS_M_PUSH_ROWS, name, shard, worker, step, dtype, ids,
                  n_ids, grad, nbytes, NULL, 0, 0, PS_DT_F32, NULL, 0, cb,
                  data);
}

int ps_client_push_pull(ps_client *c, const char *name, int shard,
                        int worker, int64_t step, ps_dtype dtype,
                        const void *grad, size_t nbytes, float *dst,
                        size_t n_floats, ps_client_cb cb, void *data) {
  return ps__push(c, PS_M_PUSH_PULL, name, shard, worker, step, dtype, NULL, 0,
                  grad, nbytes, NULL, 0, step + 1, PS_DT_F32, dst,
                  n_floats * 4, cb, data);
}

int ps_client_push_pull_rows(ps_client *c, const char *name, int shard,
                             int worker, int64_t step, ps_dtype dtype,
                             const int64_t *ids, size_t n_ids,
                             const void *grad, size_t nbytes,
                             const int64_t *pull_ids, size_t n_pull,
                             float *dst, size_t width, ps_client_cb cb,
                             void *data) {
  return ps__push(c, PS_M_PUSH_PULL, name, shard, worker, step, dtype, ids,
                  n_ids, grad, nbytes, pull_ids, n_pull, step + 1,
                  PS_DT_F32, dst, n_pull * width * 4, cb, data);
}

int ps_client_push_pull_as(ps_client *c, const char *name, int shard,
                           int worker, int64_t step, ps_dtype dtype,
                           const int64_t *ids, size_t n_ids,
                           const void *grad, size_t nbytes,
                           const int64_t *pull_ids, size_t n_pull,
                           ps_dtype pull_dtype, void *dst, size_t dst_bytes,
                           ps_client_cb cb, void *data) {
  return ps__push(c, PS_M_PUSH_PULL, name, shard, worker, step, dtype, ids,
                  n_ids, grad, nbytes, pull_ids, n_pull, step + 1, pull_dtype,
                  dst, dst_bytes, cb, data);
}

static int ps__clock(ps_client *c, int worker, int64_t clock, ps_clock_op op,
                     uint64_t run, uint64_t closure, ps_client_cb cb,
                     void *data) {
  Tessera__Ps__ClockRequest m = TESSERA__PS__CLOCK_REQUEST__INIT;
  m.worker = worker;
  m.clock = clock;
  m.op = (Tessera__Ps__ClockRequest__Op)op;
  m.era = c->era;
  m.run_id = run;
  m.closure = closure;
  return ps__call(c, PS_M_CLOCK, &m.base, NULL, 0, NULL, 0, cb, data);
}

int ps_client_clock(ps_client *c, int worker, int64_t clock, ps_clock_op op,
                    ps_client_cb cb, void *data) {
  return ps__clock(c, worker, clock, op, 0, 0, cb, data);
}

int ps_client_join(ps_client *c, int worker, int64_t clock, uint64_t run,
                   uint64_t closure, ps_client_cb cb, void *data) {
  return ps__clock(c, worker, clock, PS_CLOCK_JOIN, run, closure, cb, data);
}

int ps_client_leave(ps_client *c, int worker, uint64_t run, uint64_t closure,
                    ps_client_cb cb, void *data) {
  return ps__clock(c, worker, 0, PS_CLOCK_LEAVE, run, closure, cb, data);
}

int ps_client_config(ps_client *c, const char *mode, bool allow_nonfinite,
                     ps_client_cb cb, void *data) {
  return ps_client_config_run(c, mode, allow_nonfinite, -1, 0, cb, data);
}

int ps_client_config_trace(ps_client *c, const char *mode,
                           bool allow_nonfinite, int32_t trace_pid,
                           ps_client_cb cb, void *data) {
  return ps_client_config_run(c, mode, allow_nonfinite, trace_pid, 0, cb,
                              data);
}

int ps_client_config_run(ps_client *c, const char *mode,
                         bool allow_nonfinite, int32_t trace_pid,
                         uint64_t run_id, ps_client_cb cb, void *data) {
  ps_config cfg = {.mode = mode, .allow_nonfinite = allow_nonfinite,
                   .trace_pid = trace_pid, .run_id = run_id};
  return ps_client_configure(c, &cfg, cb, data);
}

int ps_client_configure(ps_client *c, const ps_config *cfg, ps_client_cb cb,
                        void *data) {
  Tessera__Ps__ConfigRequest m = TESSERA__PS__CONFIG_REQUEST__INIT;
  m.mode = (char *)(cfg->mode ? cfg->mode : "async");
  m.allow_nonfinite = cfg->allow_nonfinite;
  m.trace = cfg->trace_pid >= 0;
  m.trace_pid = cfg->trace_pid;
  if (cfg->checkpoint_root) m.checkpoint_root = (char *)cfg->checkpoint_root;
  m.run_id = cfg->run_id;
  m.hold_until_restore = cfg->hold_until_restore;
  return ps__call(c, PS_M_CONFIG, &m.base, NULL, 0, NULL, 0, cb, data);
}

int ps_client_save(ps_client *c, const char *dir, ps_client_cb cb,
                   void *data) {
  return ps_client_save_ckpt(c, dir, NULL, 0, false, cb, data);
}

int ps_client_save_ckpt(ps_client *c, const char *dir, const char *id,
                        int64_t step, bool verify, ps_client_cb cb,
                        void *data) {
  Tessera__Ps__SaveRequest m = TESSERA__PS__SAVE_REQUEST__INIT;
  m.dir = (char *)dir;
  m.checkpoint_id = (char *)(id ? id : "");
  m.step = step;
  m.verify = verify;
  return ps__call(c, PS_M_SAVE, &m.base, NULL, 0, NULL, 0, cb, data);
}

int ps_client_save_start(ps_client *c, const char *dir, const char *id,
                         int64_t step, bool verify, ps_client_cb cb,
                         void *data) {
  Tessera__Ps__SaveRequest m = TESSERA__PS__SAVE_REQUEST__INIT;
  m.dir = (char *)dir;
  m.checkpoint_id = (char *)(id ? id : "");
  m.step = step;
  m.verify = verify;
  m.background = true;
  return ps__call(c, PS_M_SAVE, &m.base, NULL, 0, NULL, 0, cb, data);
}

int ps_client_save_since(ps_client *c, const char *dir, const char *id,
                         int64_t step, bool verify, const char *since_id,
                         ps_client_cb cb, void *data) {
  Tessera__Ps__SaveRequest m = TESSERA__PS__SAVE_REQUEST__INIT;
  m.dir = (char *)dir;
  m.checkpoint_id = (char *)(id ? id : "");
  m.step = step;
  m.verify = verify;
  m.background = true;
  m.since_id = (char *)(since_id ? since_id : "");
  return ps__call(c, PS_M_SAVE, &m.base, NULL, 0, NULL, 0, cb, data);
}

int ps_client_restore_chain(ps_client *c, const char *dir, const char *id,
                            int64_t step, const ps_chain_link *chain,
                            size_t n_chain, ps_client_cb cb, void *data) {
  enum { MAX = 64 };
  if (n_chain > MAX) return TSR_EINVAL;
  Tessera__Ps__ChainLink links[MAX], *lp[MAX];
  for (size_t i = 0; i < n_chain; i++) {
    tessera__ps__chain_link__init(&links[i]);
    links[i].dir = (char *)chain[i].dir;
    links[i].checkpoint_id = (char *)(chain[i].id ? chain[i].id : "");
    links[i].step = chain[i].step;
    lp[i] = &links[i];
  }
  Tessera__Ps__RestoreRequest m = TESSERA__PS__RESTORE_REQUEST__INIT;
  m.dir = (char *)dir;
  m.checkpoint_id = (char *)(id ? id : "");
  m.step = step;
  m.n_chain = n_chain;
  m.chain = lp;
  return ps__call(c, PS_M_RESTORE, &m.base, NULL, 0, NULL, 0, cb, data);
}

int ps_client_snapshot(ps_client *c, uint64_t id, bool release,
                       uint32_t ttl_s, ps_client_cb cb, void *data) {
  Tessera__Ps__SnapshotRequest m = TESSERA__PS__SNAPSHOT_REQUEST__INIT;
  m.id = id;
  m.release = release;
  m.ttl_s = ttl_s;
  return ps__call(c, PS_M_SNAPSHOT, &m.base, NULL, 0, NULL, 0, cb, data);
}

int ps_client_save_wait(ps_client *c, const char *id, ps_client_cb cb,
                        void *data) {
  Tessera__Ps__SaveWaitRequest m = TESSERA__PS__SAVE_WAIT_REQUEST__INIT;
  m.checkpoint_id = (char *)(id ? id : "");
  return ps__call(c, PS_M_SAVE_WAIT, &m.base, NULL, 0, NULL, 0, cb, data);
}

int ps_client_restore_ckpt(ps_client *c, const char *dir, const char *id,
                           int64_t step, ps_client_cb cb, void *data) {
  Tessera__Ps__RestoreRequest m = TESSERA__PS__RESTORE_REQUEST__INIT;
  m.dir = (char *)dir;
  m.checkpoint_id = (char *)(id ? id : "");
  m.step = step;
  return ps__call(c, PS_M_RESTORE, &m.base, NULL, 0, NULL, 0, cb, data);
}

int ps_client_restore(ps_client *c, const char *dir, ps_client_cb cb,
                      void *data) {
  return ps_client_restore_step(c, dir, 0, cb, data);
}

int ps_client_restore_step(ps_client *c, const char *dir, int64_t step,
                           ps_client_cb cb, void *data) {
  return ps_client_restore_ckpt(c, dir, NULL, step, cb, data);
}

int ps_client_stats(ps_client *c, ps_client_cb cb, void *data) {
  Tessera__Ps__StatsRequest m = TESSERA__PS__STATS_REQUEST__INIT;
  return ps__call(c, PS_M_STATS, &m.base, NULL, 0, NULL, 0, cb, data);
}

int ps_client_stats_drain(ps_client *c, ps_client_cb cb, void *data) {
  Tessera__Ps__StatsRequest m = TESSERA__PS__STATS_REQUEST__INIT;
  m.drain_trace = true;
  return ps__call(c, PS_M_STATS, &m.base, NULL, 0, NULL, 0, cb, data);
}

int ps_client_shutdown(ps_client *c, bool job_done, ps_client_cb cb,
                       void *data) {
  Tessera__Ps__ShutdownRequest m = TESSERA__PS__SHUTDOWN_REQUEST__INIT;
  m.job_done = job_done;
  return ps__call(c, PS_M_SHUTDOWN, &m.base, NULL, 0, NULL, 0, cb, data);
}
