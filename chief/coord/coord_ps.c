/* The coordinator's side of the parameter servers: one ps_client each,
 * connection tracking (a PS lost during the run triggers recovery),
 * creating the variables' shards, checkpoints (save and restore) and
 * statistics for TensorBoard. Every call adds to co->pending; its callback
 * takes it off, records the first error in co->pending_msg, and pumps.
 */
#include "chief/coord/coord.h"
#include "common/err.h"
#include "common/log.h"
#include "common/trace.h"
#include "ps.pb-c.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  coord_ps *ps;
  ps_var_spec *specs; /* create: kept until the answer */
  const char *what;
} coord_ps_call;

static void coord_ps_on_state(tsr_rpc_client *c, int connected, int status,
                              void *data) {
  coord_ps *p = data;
  coord *co = p->co;
  (void)c;
  p->connected = connected != 0;
  if (connected) {
    if (p->ever_connected && p->lost)
      tsr_info("ps:%d (%s) is back", p->index, p->addr->addr);
    p->ever_connected = true;
  } else if (co->phase != COORD_CONNECT && co->phase != COORD_SHUTDOWN &&
             co->phase != COORD_DONE) {
    if (!p->lost)
      tsr_warn("lost ps:%d (%s): %s", p->index, p->addr->addr,
               tsr_strerror(status));
    p->lost = true;
  }
  coord__pump(co);
}

bool coord__ps_all_connected(const coord *co) {
  for (int i = 0; i < co->n_ps; i++)
    if (!co->ps[i].connected) return false;
  return true;
}

int coord__ps_open(coord *co) {
  co->ps = calloc((size_t)co->n_ps, sizeof *co->ps);
  if (!co->ps) return TSR_ENOMEM;
  for (int i = 0; i < co->n_ps; i++) {
    coord_ps *p = &co->ps[i];
    p->co = co;
    p->index = i;
    p->addr = &co->cluster.jobs[TSR_TASK_PS][i];
    int rc = ps_client_new(&p->cli, co->rpc, p->addr->addr);
    if (rc) {
      tsr_error("ps:%d (%s): %s", i, p->addr->addr, tsr_strerror(rc));
      return rc;
    }
    ps_client_set_deadline(p->cli, 120000);
    tsr_rpc_client_on_state(ps_client_rpc(p->cli), coord_ps_on_state, p);
  }
  return 0;
}

static void coord_ps_done(coord *co, coord_ps_call *call, int status,
                          const char *message) {
  co->pending--;
  if (status) {
    if (!co->pending_errors)
      snprintf(co->pending_msg, sizeof co->pending_msg, "ps:%d (%s) %s: %s",
               call->ps->index, call->ps->addr->addr, call->what, message);
    co->pending_errors++;
    if (status == TSR_ECLOSED || status == TSR_EUNAVAIL ||
        status == TSR_ETIMEOUT)
      call->ps->lost = true;
  }
  free(call->specs);
  free(call);
  coord__pump(co);
}

static void coord_ps_on_result(const ps_result *r, void *data) {
  coord_ps_call *call = data;
  coord_ps_done(call->ps->co, call, r->status, r->message);
}

static coord_ps_call *coord_ps_call_new(coord_ps *p, const char *what) {
  coord_ps_call *c = calloc(1, sizeof *c);
  if (c) {
    c->ps = p;
    c->what = what;
  }
  return c;
}

/* Starts one call; a call that cannot start counts as failed at once. */
static void coord_ps_started(coord *co, coord_ps_call *call, int rc) {
  co->pending++;
  if (rc) coord_ps_done(co, call, rc, tsr_strerror(rc));
}

static const char *coord_mode_text(const coord *co, char *buf, size_t len) {
  switch (co->job.mode) {
    case TSR_MODE_SYNC: return "sync";
    case TSR_MODE_SSP: snprintf(buf, len, "ssp:%d", co->job.staleness); return buf;
    default: return "async";
  }
}

void coord__ps_setup(coord *co) {
  char buf[32];
  const char *mode = coord_mode_text(co, buf, sizeof buf);
  co->pending_errors = 0;
  for (int i = 0; i < co->n_ps; i++) {
    coord_ps *p = &co->ps[i];
    coord_ps_call *call = coord_ps_call_new(p, "config");
    if (!call) {
      coord__fail(co, 1, "out of memory");
      return;
    }
    int32_t tpid = co->trace ? tsr_trace_pid(TSR_TASK_PS, i) : -1;
    /* a new era on every PS: nothing from before (this chief's own run
     * before a restart, another run) is taken from here on */
    coord_ps_started(co, call,
                     ps_client_config_run(p->cli, mode, false, tpid,
                                          co->run_id, coord_ps_on_result,
                                          call));
    size_t n = 0;
    for (size_t k = 0; k < co->n_shards; k++)
      if (co->shards[k].ps == i) n++;
    if (n == 0) continue;
    call = coord_ps_call_new(p, "create");
    ps_var_spec *specs = calloc(n, sizeof *specs);
    if (!call || !specs) {
      free(call);
      free(specs);
      coord__fail(co, 1, "out of memory");
      return;
    }
    call->specs = specs;
    size_t j = 0;
    int rc = 0;
    for (size_t k = 0; k < co->n_shards && !rc; k++) {
      const tsr_shard *s = &co->shards[k];
      if (s->ps != i) continue;
      const struct coord_var *v = &co->vars[s->var];
      rc = ps_var_spec_init(&specs[j], v->name, v->rank, v->shape, s->shard,
                            s->num_shards, kern_init_name(v->init.kind),
                            co->job.seed, &co->job.optimizer);
      specs[j].init = v->init;
      specs[j].sparse = v->sparse;
      specs[j].bounded = v->sparse;
      j++;
    }
    if (rc) {
      free(specs);
      free(call);
      coord__fail(co, 1, "variable spec: %s", tsr_strerror(rc));
      return;
    }
    p->vars_created = (int64_t)n;
    coord_ps_started(co, call, ps_client_create(p->cli, specs, n,
                                                coord_ps_on_result, call));
  }
  coord__pump(co);
}

static void coord_ps_dir_call(coord *co, int64_t step, bool save) {
  char dir[4096];
  if (chief_ckpt_dir(co->job.checkpoint_dir, step, dir, sizeof dir)) {
    coord__fail(co, 1, "checkpoint path too long under %s",
                co->job.checkpoint_dir);
    return;
  }
  co->pending_errors = 0;
  for (int i = 0; i < co->n_ps; i++) {
    coord_ps *p = &co->ps[i];
    coord_ps_call *call = coord_ps_call_new(p, save ? "save" : "restore");
    if (!call) {
      coord__fail(co, 1, "out of memory");
      return;
    }
    /* a restore starts the clocks at the checkpoint's step on every PS */
    int rc = save ? ps_client_save(p->cli, dir, coord_ps_on_result, call)
                  : ps_client_restore_step(p->cli, dir, step,
                                           coord_ps_on_result, call);
    coord_ps_started(co, call, rc);
  }
  coord__pump(co);
}

void coord__ps_save(coord *co, int64_t step) { coord_ps_dir_call(co, step, true); }

void coord__ps_restore(coord *co, int64_t step) {
  coord_ps_dir_call(co, step, false);
}

/* Statistics do not count as pending work: they never hold a phase. */
typedef struct {
  coord_ps *ps;
} coord_stats_call;

static void coord_ps_on_stats(const ps_result *r, void *data) {
  coord_stats_call *call = data;
  coord_ps *p = call->ps;
  coord *co = p->co;
  p->busy = false;
  free(call);
  if (r->status == 0 && co->trace && r->payload_len) {
    size_t max = r->payload_len / TSR_TRACE_WIRE_SIZE, n = 0;
    tsr_trace_event *ev = malloc((max ? max : 1) * sizeof *ev);
    if (ev && tsr_trace_unpack(r->payload, r->payload_len, ev, max, &n) == 0)
      tsr_trace_append(co->trace, ev, n);
    free(ev);
  }
  if (r->status || !r->stats || !co->metrics) return;
  const Tessera__Ps__StatsResponse *st = r->stats;
  int64_t step = coord__global_step(co);
  char tag[64];
  snprintf(tag, sizeof tag, "ps/%d/bytes_in", p->index);
  chief_metrics_scalar(co->metrics, tag, step, (double)st->bytes_in, 0);
  snprintf(tag, sizeof tag, "ps/%d/bytes_out", p->index);
  chief_metrics_scalar(co->metrics, tag, step, (double)st->bytes_out, 0);
  double apply_ms = st->applies ? (double)st->apply_ns / 1e6 /
                                      (double)st->applies
                                : 0;
  snprintf(tag, sizeof tag, "ps/%d/apply_ms", p->index);
  chief_metrics_scalar(co->metrics, tag, step, apply_ms, 0);
  snprintf(tag, sizeof tag, "ps/%d/mem_bytes", p->index);
  chief_metrics_scalar(co->metrics, tag, step, (double)st->mem_used, 0);
  p->bytes_in = st->bytes_in;
  p->bytes_out = st->bytes_out;
  p->apply_ms = apply_ms;
}

void coord__ps_stats(coord *co) {
  for (int i = 0; i < co->n_ps; i++) {
    coord_ps *p = &co->ps[i];
    if (!p->connected || p->busy) continue;
    coord_stats_call *call = calloc(1, sizeof *call);
    if (!call) return;
    call->ps = p;
    int rc = co->trace ? ps_client_stats_drain(p->cli, coord_ps_on_stats, call)
                       : ps_client_stats(p->cli, coord_ps_on_stats, call);
    if (rc == 0)
      p->busy = true;
    else
      free(call);
  }
}

void coord__ps_shutdown(coord *co) {
  for (int i = 0; i < co->n_ps; i++) {
    coord_ps *p = &co->ps[i];
    if (co->trace) {
      /* the last applies, answered before the shutdown sent after it */
      coord_stats_call *sc = calloc(1, sizeof *sc);
      if (sc) {
        sc->ps = p;
        if (ps_client_stats_drain(p->cli, coord_ps_on_stats, sc) == 0)
          p->busy = true;
        else
          free(sc);
      }
    }
    coord_ps_call *call = coord_ps_call_new(p, "shutdown");
    if (!call) return;
    int rc = ps_client_shutdown(p->cli, coord_ps_on_result, call);
    if (rc) {
      free(call);
      continue;
    }
    co->pending++;
  }
}

static void coord_ps_closed(void *data) { (void)data; }

void coord__ps_close(coord *co) {
  if (!co->ps) return;
  for (int i = 0; i < co->n_ps; i++)
    if (co->ps[i].cli) {
      ps_client_close(co->ps[i].cli, coord_ps_closed, NULL);
      co->ps[i].cli = NULL;
    }
}
