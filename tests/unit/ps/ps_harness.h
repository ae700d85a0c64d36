/* In-process harness for the PS service tests: one loop, one RPC context,
 * any number of PS servers on 127.0.0.1:0 and clients to them, and a
 * blocking "call and wait" built on running the loop with a deadline. */
#ifndef TSR_TEST_PS_HARNESS_H
#define TSR_TEST_PS_HARNESS_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/err.h"
#include "ps/client/client.h"
#include "ps/ps.h"
#include "kernels/optim.h"
#include "ps.pb-c.h"
#include "ps_spec_test.h"

#define H_MAX 6

typedef struct {
  uv_loop_t loop;
  tsr_rpc_ctx *ctx;
  ps_server *srv[H_MAX];
  ps_client *cl[H_MAX];
  int n;
  int closed;
} h_env;

typedef struct {
  int done;
  int status;
  char message[512];
  uint64_t version;
  int64_t step;
  size_t nbytes;
  int64_t min_clock;
  int64_t clock;
  uint64_t era;
  int64_t sync_step;
  int32_t count;
  uint64_t nonfinite, mem_used, applies;
  char mode[32];
} h_res;

/* The free of a test allocator (tsr_rpc_allocator) whose blocks come
 * from malloc. */
static inline void h_malloc_free(void *ctx, void *p) {
  (void)ctx;
  free(p);
}

static inline void h_cb(const ps_result *r, void *data) {
  h_res *o = data;
  o->done = 1;
  o->status = r->status;
  snprintf(o->message, sizeof o->message, "%s", r->message);
  o->version = r->version;
  o->step = r->step;
  o->nbytes = r->nbytes;
  o->min_clock = r->min_clock;
  o->clock = r->clock;
  o->era = r->era;
  o->count = r->count;
  if (r->stats) {
    const Tessera__Ps__StatsResponse *s = r->stats;
    o->era = s->era;
    o->sync_step = s->sync_step;
    o->nonfinite = s->nonfinite_rejected;
    o->mem_used = s->mem_used;
    o->applies = s->applies;
    o->min_clock = s->min_clock;
    snprintf(o->mode, sizeof o->mode, "%s", s->mode);
  }
}

/* Runs the loop until *flag or 20 s pass; returns *flag. */
static inline int h_wait(h_env *e, int *flag) {
  uint64_t end = tsr_now_ms() + 20000;
  while (!*flag && tsr_now_ms() < end) uv_run(&e->loop, UV_RUN_NOWAIT);
  return *flag;
}

/* Runs the loop for a few round trips without waiting on anything. */
static inline void h_spin(h_env *e, int rounds) {
  for (int i = 0; i < rounds; i++) {
    uv_run(&e->loop, UV_RUN_NOWAIT);
    tsr_sleep_ms(1);
  }
}

/* Servers on ports[i] (NULL, or a 0 in it: a port the kernel picks; a test
 * that starts a server again on its port claims it first: tests/ports). */
static inline void h_up_on(h_env *e, int n, const ps_server_opts *o,
                           const int *ports) {
  memset(e, 0, sizeof *e);
  if (uv_loop_init(&e->loop)) abort();
  tsr_rpc_opts ro = {0};
  ro.name = "test";
  ro.token = "unit-test-token";
  ro.token_len = strlen("unit-test-token");
  ro.max_payload_bytes = 1ull << 30;
  if (tsr_rpc_ctx_new(&e->ctx, &e->loop, &ro)) abort();
  e->n = n;
  for (int i = 0; i < n; i++) {
    if (ps_server_new(&e->srv[i], e->ctx, o)) abort();
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", ports ? ports[i] : 0);
    if (ps_server_listen(e->srv[i], addr)) abort();
    snprintf(addr, sizeof addr, "127.0.0.1:%d", ps_server_port(e->srv[i]));
    if (ps_client_new(&e->cl[i], e->ctx, addr)) abort();
  }
}

static inline void h_up(h_env *e, int n, const ps_server_opts *o) {
  h_up_on(e, n, o, NULL);
}

static inline void h_closed(void *data) { (*(int *)data)++; }

/* Closes clients and servers; returns uv_loop_close(). */
static inline int h_down(h_env *e) {
  int want = 0;
  e->closed = 0;
  for (int i = 0; i < H_MAX; i++) {
    if (e->cl[i]) {
      ps_client_close(e->cl[i], h_closed, &e->closed);
      want++;
    }
    if (e->srv[i]) {
      ps_server_close(e->srv[i], h_closed, &e->closed);
      want++;
    }
  }
  uint64_t end = tsr_now_ms() + 20000;
  while (e->closed < want && tsr_now_ms() < end) uv_run(&e->loop, UV_RUN_NOWAIT);
  if (e->closed < want) return -1;
  if (tsr_rpc_ctx_free(e->ctx)) return -2;
  uv_run(&e->loop, UV_RUN_DEFAULT);
  return uv_loop_close(&e->loop);
}

#define H_CALL(env, res, expr)                                    \
  do {                                                            \
    memset(&(res), 0, sizeof(res));                               \
    int h_rc_ = (expr);                                           \
    if (h_rc_) fail_msg("%s returned %s", #expr, tsr_err_name(h_rc_)); \
    if (!h_wait((env), &(res).done)) fail_msg("%s: no answer", #expr); \
  } while (0)

/* One PS (h_up without options) with `v` created on it. */
static inline void h_up_var(h_env *e, const ps_var_spec *v) {
  h_up(e, 1, NULL);
  h_res r;
  H_CALL(e, r, ps_client_create(e->cl[0], v, 1, h_cb, &r));
  if (r.status) fail_msg("create %s: %s", v->var.name, r.message);
}

#endif
