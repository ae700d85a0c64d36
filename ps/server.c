/* The PS service's life: made with every method registered before it
 * listens (a request must never find no handler), and closed in order:
 * held and queued calls are answered with TSR_ESHUTDOWN, the RPC server
 * closes once every call is answered, running pool jobs finish, the timer
 * closes, then everything is freed and the host's callback runs.
 */
#include "ps/svc_int.h"
#include "common/err.h"
#include "common/trace.h"
#include "common/log.h"

#include <sodium.h>
#include <stdlib.h>
#include <string.h>

/* Frees the server itself, through the hook it was allocated with. */
static void ps__free_self(ps_server *s) {
  ps_mem m = {0};
  ps__keep_free(&s->keep, &s->mem); /* freed already by a full close */
  m.al = s->mem.al;
  ps__free(&m, s);
}

static void ps__free_owner(uv_handle_t *h) { ps__free_self(h->data); }
/* The idle handle closes first; its callback closes the timer, whose
 * callback frees: the server's memory holds both handles. */
static void ps__idle_closed_free(uv_handle_t *h) {
  ps_server *s = h->data;
  uv_close((uv_handle_t *)&s->timer, ps__free_owner);
}

int ps_server_new(ps_server **out, tsr_rpc_ctx *ctx, const ps_server_opts *o) {
  ps_mem m0 = {0};
  m0.al = o ? o->allocator : NULL;
  ps_server *s = ps__calloc(&m0, 1, sizeof *s);
  if (!s) return TSR_ENOMEM;
  s->mem.al = m0.al;
  s->ctx = ctx;
  s->loop = tsr_rpc_ctx_loop(ctx);
  if (o) s->opts = *o;
  s->allow_nonfinite = s->opts.allow_nonfinite;
  s->mem.limit = s->opts.memory_limit;
  if (!ps__keep_init(&s->keep)) s->mem.keep = &s->keep; /* else none kept */
  tsr_rpc_opts ro;
  tsr_rpc_ctx_opts(ctx, &ro);
  s->max_answer = ro.max_payload_bytes > SIZE_MAX ? SIZE_MAX
                                                  : (size_t)ro.max_payload_bytes;
  /* a random first era: calls from before a restart are never taken for
   * calls of this process's eras */
  uint64_t era0;
  randombytes_buf(&era0, sizeof era0);
  ps__cons_init(&s->cons, era0 >> 1);
  ps_mode mode;
  int st, rc;
  if ((rc = ps__mode_parse(s->opts.mode, &mode, &st))) {
    tsr_error("mode \"%s\" is not async, ssp:S or sync", s->opts.mode);
    ps__free_self(s);
    return TSR_EINVAL;
  }
  ps__cons_set_mode(&s->cons, mode, st);
  s->opts.checkpoint_root = NULL; /* not kept: copied below */
  if (o && o->checkpoint_root && (rc = ps__root_set(s, o->checkpoint_root,
                                                    true))) {
    tsr_error("checkpoint root \"%s\": %s", o->checkpoint_root,
              tsr_strerror(rc));
    ps__free_self(s);
    return TSR_EINVAL;
  }
  if ((rc = uv_timer_init(s->loop, &s->timer))) {
    ps__free_self(s);
    return rc;
  }
  s->timer.data = s;
  uv_unref((uv_handle_t *)&s->timer);
  uv_idle_init(s->loop, &s->idle);
  s->idle.data = s;
  if ((rc = tsr_rpc_server_new(&s->rpc, ctx))) {
    uv_close((uv_handle_t *)&s->idle, ps__idle_closed_free);
    return rc;
  }
  if ((rc = ps__register_data(s)) || (rc = ps__register_admin(s)) ||
      (rc = uv_timer_start(&s->timer, ps__timer_cb, 200, 200))) {
    tsr_error("ps: cannot register the methods: %s", tsr_strerror(rc));
    ps_server_close(s, NULL, NULL);
    return rc;
  }
  *out = s;
  return 0;
}

int ps_server_listen(ps_server *s, const char *addr) {
  return tsr_rpc_server_listen(s->rpc, addr);
}

bool ps_server_job_finished(const ps_server *s) {
  return s->job_done || s->n_ents == 0;
}

int ps_server_port(const ps_server *s) { return tsr_rpc_server_port(s->rpc); }

static void ps__free_all(ps_server *s) {
  ps__save_close(s);
  for (int i = 0; i < s->n_ents; i++) ps__entry_free(s->ents[i], &s->mem);
  ps__free(&s->mem, s->ents);
  s->mem.keep = NULL;
  ps__keep_free(&s->keep, &s->mem);
  ps__cons_free(&s->cons);
  tsr_trace_free(s->trace);
  void (*cb)(void *) = s->close_cb;
  void *data = s->close_data;
  ps__free_self(s);
  if (cb) cb(data);
}

static void ps__timer_closed(uv_handle_t *h) {
  ps_server *s = h->data;
  s->timer_closed = true;
  ps__free_all(s);
}

static void ps__idle_closed(uv_handle_t *h) {
  ps_server *s = h->data;
  uv_close((uv_handle_t *)&s->timer, ps__timer_closed);
}

void ps__maybe_finish(ps_server *s) {
  if (!s->closing || !s->rpc_closed || s->works > 0) return;
  for (int i = 0; i < s->n_ents; i++)
    if (s->ents[i]->readers || s->ents[i]->writing) return;
  if (uv_is_closing((uv_handle_t *)&s->idle)) return;
  uv_close((uv_handle_t *)&s->idle, ps__idle_closed);
}

static void ps__rpc_closed(void *data) {
  ps_server *s = data;
  s->rpc_closed = true;
  ps__maybe_finish(s);
}

void ps_server_close(ps_server *s, void (*cb)(void *data), void *data) {
  if (s->closing) return;
  s->closing = true;
  s->close_cb = cb;
  s->close_data = data;
  ps__wake(s); /* answers every held call */
  for (int i = 0; i < s->n_ents; i++) {
    ps_entry *e = s->ents[i];
    while (e->head) {
      ps_op *op = e->head;
      e->head = op->next;
      if (!e->head) e->tail = NULL;
      ps__op_fail(s, op, TSR_ESHUTDOWN, "the parameter server is shutting down");
    }
  }
  tsr_rpc_server_close(s->rpc, ps__rpc_closed, s);
}
