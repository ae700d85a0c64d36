/* RPC server and client on one loop over loopback: echo with payloads of
 * many sizes, remote errors, unknown methods, metas that do not decode,
 * deadlines, response destinations (exact and mismatched), the in-flight
 * bound, reconnection to a restarted server, a wrong token, payload
 * allocators, and allocation failures in turn; the same-host Unix socket
 * (for a server bound to one address and to every address, and its
 * absence for a client that asks for TCP). The whole table runs twice:
 * with the same-host socket (every call above then goes over it) and with
 * TESSERA_RPC_TRANSPORT=tcp.
 * Every test ends with every handle closed and uv_loop_close() == 0. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "common/log.h"
#include "ports.h"
#include "rpc_util.h"
#include "rpc.pb-c.h"

#include <signal.h>

enum { M_ECHO = 1, M_FAIL = 2, M_SLEEP = 3, M_TYPED = 4, M_SINK = 5,
       M_DELAY = 6 };

typedef struct env {
  uv_loop_t loop;
  tsr_rpc_ctx *sctx, *cctx;
  tsr_rpc_server *srv;
  tsr_rpc_client *cli;
  int port;
  uint8_t sink[1 << 16];
  int sink_used, sink_aborts;
  uv_timer_t sleeper;
  tsr_rpc_incoming *held;
  uv_timer_t ticker;           /* answers M_DELAY calls when due */
  tsr_rpc_incoming *delayed[512];
  uint64_t due[512];
  int ndelayed;
} env;

static void h_echo(tsr_rpc_incoming *call, void *data) {
  uv_buf_t b = uv_buf_init(call->payload, (unsigned)call->payload_len);
  assert_int_equal(tsr_rpc_reply(call, call->meta, call->meta_len, &b,
                                 call->payload_len ? 1 : 0, NULL, NULL),
                   0);
}

static void h_fail(tsr_rpc_incoming *call, void *data) {
  tsr_rpc_reply_error(call, TSR_ESHAPE, "shape [3,4] does not match [4,3]");
}

static void sleeper_cb(uv_timer_t *t) {
  env *e = t->data;
  if (e->held) tsr_rpc_reply(e->held, "late", 4, NULL, 0, NULL, NULL);
  e->held = NULL;
}

static void h_sleep(tsr_rpc_incoming *call, void *data) {
  env *e = data;
  e->held = call;
  uv_timer_start(&e->sleeper, sleeper_cb, 300, 0);
}

static void h_typed(tsr_rpc_incoming *call, void *data) {
  Tessera__Rpc__RpcError *m = call->request;
  assert_non_null(m);
  tsr_rpc_reply(call, m->message, strlen(m->message), NULL, 0, NULL, NULL);
}

static void ticker_cb(uv_timer_t *t) {
  env *e = t->data;
  uint64_t now = tsr_now_ns();
  for (int i = 0; i < e->ndelayed;) {
    if (e->due[i] > now) {
      i++;
      continue;
    }
    tsr_rpc_incoming *call = e->delayed[i];
    e->delayed[i] = e->delayed[--e->ndelayed];
    e->due[i] = e->due[e->ndelayed];
    uv_buf_t b = uv_buf_init(call->payload, (unsigned)call->payload_len);
    tsr_rpc_reply(call, NULL, 0, &b, call->payload_len ? 1 : 0, NULL, NULL);
  }
}

/* Echo after the milliseconds in the first meta byte. */
static void h_delay(tsr_rpc_incoming *call, void *data) {
  env *e = data;
  if (e->ndelayed == 512 || call->meta_len < 1) {
    tsr_rpc_reply_error(call, TSR_EBUSY, NULL);
    return;
  }
  e->delayed[e->ndelayed] = call;
  e->due[e->ndelayed++] = tsr_now_ns() + call->meta[0] * 1000000ull;
}

static int sink_alloc(tsr_rpc_incoming *call, size_t len, void **buf,
                      void *data) {
  env *e = data;
  if (len > sizeof e->sink) return TSR_ETOOBIG;
  *buf = e->sink;
  return 0;
}
static void sink_abort(tsr_rpc_incoming *call, void *buf, int status,
                       void *data) {
  ((env *)data)->sink_aborts++;
}
static void h_sink(tsr_rpc_incoming *call, void *data) {
  env *e = data;
  assert_ptr_equal(call->payload, e->sink);
  e->sink_used++;
  uint32_t sum = 0;
  for (size_t i = 0; i < call->payload_len; i++)
    sum = sum * 31 + ((uint8_t *)call->payload)[i];
  tsr_rpc_reply(call, &sum, sizeof sum, NULL, 0, NULL, NULL);
}

static void env_server(env *e, tsr_rpc_opts *so, int port) {
  assert_int_equal(tsr_rpc_ctx_new(&e->sctx, &e->loop, so), 0);
  assert_int_equal(tsr_rpc_server_new(&e->srv, e->sctx), 0);
  assert_int_equal(tsr_rpc_server_register(e->srv, M_ECHO, h_echo, e), 0);
  assert_int_equal(tsr_rpc_server_register(e->srv, M_FAIL, h_fail, e), 0);
  assert_int_equal(tsr_rpc_server_register(e->srv, M_SLEEP, h_sleep, e), 0);
  assert_int_equal(tsr_rpc_server_register(e->srv, M_DELAY, h_delay, e), 0);
  tsr_rpc_method tm = {.method = M_TYPED, .name = "typed",
                       .handler = h_typed, .data = e,
                       .request_type = &tessera__rpc__rpc_error__descriptor};
  assert_int_equal(tsr_rpc_server_register_method(e->srv, &tm), 0);
  tsr_rpc_method sm = {.method = M_SINK, .name = "sink", .handler = h_sink,
                       .data = e, .payload_alloc = sink_alloc,
                       .payload_abort = sink_abort};
  assert_int_equal(tsr_rpc_server_register_method(e->srv, &sm), 0);
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
  assert_int_equal(tsr_rpc_server_listen(e->srv, addr), 0);
  e->port = tsr_rpc_server_port(e->srv);
  assert_true(e->port > 0);
  /* registration after listen is refused */
  assert_int_equal(tsr_rpc_server_register(e->srv, 99, h_echo, e),
                   TSR_EINVAL);
}

/* A server on `port` (0: any) and a client to it. */
static void env_up_on(env *e, tsr_rpc_opts *so, tsr_rpc_opts *co, int port) {
  memset(e, 0, sizeof *e);
  assert_int_equal(uv_loop_init(&e->loop), 0);
  uv_timer_init(&e->loop, &e->sleeper);
  e->sleeper.data = e;
  uv_timer_init(&e->loop, &e->ticker);
  e->ticker.data = e;
  uv_timer_start(&e->ticker, ticker_cb, 1, 1);
  tsr_rpc_opts d1, d2;
  ru_opts(&d1, "server");
  ru_opts(&d2, "client");
  env_server(e, so ? so : &d1, port);
  assert_int_equal(tsr_rpc_ctx_new(&e->cctx, &e->loop, co ? co : &d2), 0);
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", e->port);
  assert_int_equal(tsr_rpc_client_new(&e->cli, e->cctx, addr), 0);
}

static void env_up(env *e, tsr_rpc_opts *so, tsr_rpc_opts *co) {
  env_up_on(e, so, co, 0);
}

static void env_down(env *e) {
  int sdone = !e->srv, cdone = !e->cli;
  if (e->cli) tsr_rpc_client_close(e->cli, ru_set_flag, &cdone);
  if (e->srv) tsr_rpc_server_close(e->srv, ru_set_flag, &sdone);
  assert_true(ru_run_until(&e->loop, &cdone, 5000));
  assert_true(ru_run_until(&e->loop, &sdone, 5000));
  assert_int_equal(e->ndelayed, 0);
  assert_int_equal(tsr_rpc_ctx_free(e->cctx), 0);
  if (e->sctx) assert_int_equal(tsr_rpc_ctx_free(e->sctx), 0);
  uv_close((uv_handle_t *)&e->sleeper, NULL);
  uv_close((uv_handle_t *)&e->ticker, NULL);
  uv_run(&e->loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&e->loop), 0);
}

typedef struct res {
  int done, status, remote;
  char msg[300];
  char meta[64];
  size_t meta_len, payload_len;
  uint32_t sum;
} res;

static uint32_t checksum(const void *p, size_t n) {
  uint32_t s = 0;
  for (size_t i = 0; i < n; i++) s = s * 31 + ((const uint8_t *)p)[i];
  return s;
}

static void on_res(const tsr_rpc_result *r, void *data) {
  res *x = data;
  x->done = 1;
  x->status = r->status;
  x->remote = r->remote;
  snprintf(x->msg, sizeof x->msg, "%s", r->message);
  x->meta_len = r->meta_len;
  if (r->meta_len && r->meta_len < sizeof x->meta)
    memcpy(x->meta, r->meta, r->meta_len);
  x->payload_len = r->payload_len;
  x->sum = checksum(r->payload, r->payload_len);
}

static int call(env *e, uint32_t method, const void *meta, size_t meta_len,
                const void *payload, size_t plen, void *dst, size_t dlen,
                uint32_t deadline_ms, res *r) {
  memset(r, 0, sizeof *r);
  uv_buf_t b = uv_buf_init((char *)payload, (unsigned)plen);
  tsr_rpc_request q = {.method = method, .meta = meta, .meta_len = meta_len,
                       .payload = plen ? &b : NULL, .npayload = plen ? 1 : 0,
                       .resp_buf = dst, .resp_len = dlen,
                       .deadline_ms = deadline_ms};
  int rc = tsr_rpc_call(e->cli, &q, on_res, r);
  if (rc) return rc;
  assert_false(r->done); /* never from inside tsr_rpc_call */
  assert_true(ru_run_until(&e->loop, &r->done, 10000));
  return 0;
}

static void test_echo(void **state) {
  env e;
  env_up(&e, NULL, NULL);
  res r;
  uint8_t pl[1000];
  for (size_t i = 0; i < sizeof pl; i++) pl[i] = (uint8_t)(i * 7);
  assert_int_equal(call(&e, M_ECHO, "hello", 5, pl, sizeof pl, NULL, 0, 0,
                        &r), 0);
  assert_int_equal(r.status, 0);
  assert_int_equal(r.meta_len, 5);
  assert_memory_equal(r.meta, "hello", 5);
  assert_int_equal(r.payload_len, sizeof pl);
  assert_int_equal(r.sum, checksum(pl, sizeof pl));
  /* an empty call */
  assert_int_equal(call(&e, M_ECHO, NULL, 0, NULL, 0, NULL, 0, 0, &r), 0);
  assert_int_equal(r.status, 0);
  assert_int_equal(r.payload_len, 0);
  tsr_rpc_stats st;
  tsr_rpc_server_stats(e.srv, &st);
  assert_int_equal(st.calls, 2);
  assert_int_equal(st.connections, 1);
  assert_true(st.bytes_in > sizeof pl);
  tsr_rpc_method_stats ms[8];
  size_t n = tsr_rpc_server_method_stats(e.srv, ms, 8);
  assert_int_equal(n, 6);
  assert_int_equal(ms[0].method, M_ECHO);
  assert_int_equal(ms[0].calls, 2);
  assert_int_equal(tsr_rpc_server_foreach_conn(e.srv, NULL, NULL), 1);
  env_down(&e);
}

/* Names resolve on both ends: a server on "localhost" meets a client of
 * "localhost" whatever the resolver lists first. */
static void test_localhost(void **state) {
  uv_loop_t loop;
  assert_int_equal(uv_loop_init(&loop), 0);
  tsr_rpc_opts o;
  ru_opts(&o, "both");
  tsr_rpc_ctx *ctx;
  tsr_rpc_server *s;
  tsr_rpc_client *c;
  assert_int_equal(tsr_rpc_ctx_new(&ctx, &loop, &o), 0);
  assert_int_equal(tsr_rpc_server_new(&s, ctx), 0);
  assert_int_equal(tsr_rpc_server_register(s, M_ECHO, h_echo, NULL), 0);
  assert_int_equal(tsr_rpc_server_listen(s, "localhost:0"), 0);
  char addr[64];
  snprintf(addr, sizeof addr, "localhost:%d", tsr_rpc_server_port(s));
  assert_int_equal(tsr_rpc_client_new(&c, ctx, addr), 0);
  res r;
  memset(&r, 0, sizeof r);
  tsr_rpc_request q = {.method = M_ECHO, .meta = "lh", .meta_len = 2};
  assert_int_equal(tsr_rpc_call(c, &q, on_res, &r), 0);
  assert_true(ru_run_until(&loop, &r.done, 5000));
  assert_int_equal(r.status, 0);
  int cd = 0, sd = 0;
  tsr_rpc_client_close(c, ru_set_flag, &cd);
  tsr_rpc_server_close(s, ru_set_flag, &sd);
  assert_true(ru_run_until(&loop, &cd, 3000));
  assert_true(ru_run_until(&loop, &sd, 3000));
  assert_int_equal(tsr_rpc_ctx_free(ctx), 0);
  uv_run(&loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&loop), 0);
}

/* Many calls in flight at once, payloads from 0 B to 8 MiB, every one
 * checked; responses land in destinations the caller named. */
typedef struct many {
  int left, bad;
  uint8_t *dst[40];
  size_t len[40];
  uint32_t want[40];
} many;

typedef struct slot {
  many *m;
  int i;
} slot;

static void on_slot(const tsr_rpc_result *r, void *data) {
  slot *s = data;
  many *m = s->m;
  m->left--;
  if (r->status || r->payload != m->dst[s->i] ||
      r->payload_len != m->len[s->i] ||
      checksum(r->payload, r->payload_len) != m->want[s->i])
    m->bad++;
}

static void test_many_sizes(void **state) {
  env e;
  env_up(&e, NULL, NULL);
  static const size_t sizes[] = {0, 1, 7, 64, 1000, 4096, 32767, 32768,
                                 65536, 65537, 200000, 1 << 20,
                                 (1 << 20) + 3, 8 << 20};
  int n = (int)(sizeof sizes / sizeof sizes[0]);
  many m = {.left = 0};
  slot sl[40];
  uint8_t *src[40];
  for (int i = 0; i < n; i++) {
    src[i] = malloc(sizes[i] + 1);
    m.dst[i] = malloc(sizes[i] + 1);
    for (size_t j = 0; j < sizes[i]; j++) src[i][j] = (uint8_t)(j * 13 + i);
    m.len[i] = sizes[i];
    m.want[i] = checksum(src[i], sizes[i]);
    sl[i].m = &m;
    sl[i].i = i;
    uv_buf_t b = uv_buf_init((char *)src[i], (unsigned)sizes[i]);
    tsr_rpc_request q = {.method = M_ECHO, .payload = &b, .npayload = 1,
                         .resp_buf = m.dst[i], .resp_len = sizes[i]};
    assert_int_equal(tsr_rpc_call(e.cli, &q, on_slot, &sl[i]), 0);
    m.left++;
  }
  int guard = 0;
  for (int k = 0; k < 1000 && m.left; k++) ru_run_until(&e.loop, &guard, 10);
  assert_int_equal(m.left, 0);
  assert_int_equal(m.bad, 0);
  for (int i = 0; i < n; i++) {
    free(src[i]);
    free(m.dst[i]);
  }
  env_down(&e);
}

static void test_remote_error(void **state) {
  env e;
  env_up(&e, NULL, NULL);
  res r;
  assert_int_equal(call(&e, M_FAIL, NULL, 0, NULL, 0, NULL, 0, 0, &r), 0);
  assert_int_equal(r.status, TSR_ESHAPE);
  assert_true(r.remote);
  assert_non_null(strstr(r.msg, "shape [3,4]"));
  /* unknown method: answered, the connection goes on */
  assert_int_equal(call(&e, 777, NULL, 0, "x", 1, NULL, 0, 0, &r), 0);
  assert_int_equal(r.status, TSR_ENOMETHOD);
  assert_non_null(strstr(r.msg, "777"));
  assert_int_equal(call(&e, M_ECHO, "ok", 2, NULL, 0, NULL, 0, 0, &r), 0);
  assert_int_equal(r.status, 0);
  env_down(&e);
}

static void test_typed_meta(void **state) {
  env e;
  env_up(&e, NULL, NULL);
  Tessera__Rpc__RpcError m = TESSERA__RPC__RPC_ERROR__INIT;
  m.code = -1;
  m.message = "decoded";
  uint8_t buf[64];
  size_t n = tessera__rpc__rpc_error__pack(&m, buf);
  res r;
  assert_int_equal(call(&e, M_TYPED, buf, n, NULL, 0, NULL, 0, 0, &r), 0);
  assert_int_equal(r.status, 0);
  assert_int_equal(r.meta_len, 7);
  assert_memory_equal(r.meta, "decoded", 7);
  /* a meta that does not decode never reaches the handler */
  static const uint8_t junk[] = {0xff, 0xff, 0xff, 0xff, 0x0f, 0x12, 0x80};
  assert_int_equal(call(&e, M_TYPED, junk, sizeof junk, "p", 1, NULL, 0, 0,
                        &r), 0);
  assert_int_equal(r.status, TSR_EPROTO);
  assert_non_null(strstr(r.msg, "does not decode"));
  assert_int_equal(call(&e, M_ECHO, "ok", 2, NULL, 0, NULL, 0, 0, &r), 0);
  assert_int_equal(r.status, 0);
  env_down(&e);
}

/* A message packed by tsr_rpc_call_msg arrives as the meta, small or
 * larger than the stack buffer; req->meta is not read. */
static void test_call_msg(void **state) {
  env e;
  env_up(&e, NULL, NULL);
  static char big[3000];
  memset(big, 'x', sizeof big - 1);
  const char *texts[] = {"packed", big};
  for (int i = 0; i < 2; i++) {
    Tessera__Rpc__RpcError m = TESSERA__RPC__RPC_ERROR__INIT;
    m.message = (char *)texts[i];
    tsr_rpc_request q = {.method = M_TYPED, .meta = "junk", .meta_len = 4};
    res r;
    memset(&r, 0, sizeof r);
    assert_int_equal(tsr_rpc_call_msg(e.cli, &q, &m.base, on_res, &r), 0);
    assert_true(ru_run_until(&e.loop, &r.done, 10000));
    assert_int_equal(r.status, 0);
    assert_int_equal(r.meta_len, strlen(texts[i]));
    if (r.meta_len < sizeof r.meta)
      assert_memory_equal(r.meta, texts[i], r.meta_len);
  }
  env_down(&e);
}

static void test_deadline(void **state) {
  env e;
  env_up(&e, NULL, NULL);
  res r;
  /* connected first: a call that never left would be TSR_EUNAVAIL (the
   * handshake alone can take more than 50 ms on a loaded machine) */
  assert_int_equal(call(&e, M_ECHO, "up", 2, NULL, 0, NULL, 0, 0, &r), 0);
  assert_int_equal(r.status, 0);
  assert_int_equal(call(&e, M_SLEEP, NULL, 0, NULL, 0, NULL, 0, 50, &r), 0);
  assert_int_equal(r.status, TSR_ETIMEOUT);
  assert_false(r.remote);
  assert_non_null(strstr(r.msg, "deadline of 50 ms"));
  /* it did not wait for the answer: the server still holds the call */
  assert_non_null(e.held);
  int late = 0;
  ru_run_until(&e.loop, &late, 400); /* the late answer arrives, dropped */
  assert_null(e.held);
  assert_int_equal(call(&e, M_ECHO, "ok", 2, NULL, 0, NULL, 0, 0, &r), 0);
  assert_int_equal(r.status, 0);
  env_down(&e);
}

static void test_resp_buf(void **state) {
  env e;
  env_up(&e, NULL, NULL);
  res r;
  uint8_t src[5000], dst[5000], small[100];
  for (size_t i = 0; i < sizeof src; i++) src[i] = (uint8_t)i;
  assert_int_equal(call(&e, M_ECHO, NULL, 0, src, sizeof src, dst,
                        sizeof dst, 0, &r), 0);
  assert_int_equal(r.status, 0);
  assert_memory_equal(src, dst, sizeof src);
  assert_int_equal(call(&e, M_ECHO, NULL, 0, src, sizeof src, small,
                        sizeof small, 0, &r), 0);
  assert_int_equal(r.status, TSR_ESHAPE);
  assert_non_null(strstr(r.msg, "5000 bytes"));
  /* "up to" accepts a shorter answer */
  uint8_t big[8000];
  tsr_rpc_request q = {.method = M_ECHO,
                       .payload = &(uv_buf_t){.base = (char *)src,
                                              .len = sizeof src},
                       .npayload = 1, .resp_buf = big,
                       .resp_len = sizeof big, .flags = TSR_RPC_RESP_UPTO};
  memset(&r, 0, sizeof r);
  assert_int_equal(tsr_rpc_call(e.cli, &q, on_res, &r), 0);
  assert_true(ru_run_until(&e.loop, &r.done, 5000));
  assert_int_equal(r.status, 0);
  assert_int_equal(r.payload_len, sizeof src);
  assert_memory_equal(big, src, sizeof src);
  env_down(&e);
}

static void test_sink(void **state) {
  env e;
  env_up(&e, NULL, NULL);
  res r;
  uint8_t src[40000];
  for (size_t i = 0; i < sizeof src; i++) src[i] = (uint8_t)(i * 3);
  assert_int_equal(call(&e, M_SINK, NULL, 0, src, sizeof src, NULL, 0, 0,
                        &r), 0);
  assert_int_equal(r.status, 0);
  uint32_t want = checksum(src, sizeof src), got;
  memcpy(&got, r.meta, 4);
  assert_int_equal(got, want);
  assert_int_equal(e.sink_used, 1);
  /* the allocator refuses: the call is answered with its code */
  uint8_t *huge = calloc(1, 100000);
  assert_int_equal(call(&e, M_SINK, NULL, 0, huge, 100000, NULL, 0, 0, &r),
                   0);
  assert_int_equal(r.status, TSR_ETOOBIG);
  free(huge);
  env_down(&e);
}

static void test_busy(void **state) {
  tsr_rpc_opts co;
  ru_opts(&co, "client");
  co.max_inflight = 4;
  env e;
  env_up(&e, NULL, &co);
  res r[5];
  tsr_rpc_request q = {.method = M_ECHO};
  for (int i = 0; i < 4; i++)
    assert_int_equal(tsr_rpc_call(e.cli, &q, on_res, &r[i]), 0);
  memset(r, 0, sizeof r);
  assert_int_equal(tsr_rpc_call(e.cli, &q, on_res, &r[4]), TSR_EBUSY);
  for (int i = 0; i < 4; i++)
    assert_true(ru_run_until(&e.loop, &r[i].done, 5000));
  assert_int_equal(tsr_rpc_call(e.cli, &q, on_res, &r[4]), 0);
  assert_true(ru_run_until(&e.loop, &r[4].done, 5000));
  /* over the payload limit: refused at once */
  tsr_rpc_opts o;
  tsr_rpc_ctx_opts(e.cctx, &o);
  uv_buf_t b = uv_buf_init(NULL, 0);
  b.len = (size_t)o.max_payload_bytes + 1;
  q.payload = &b;
  q.npayload = 1;
  assert_int_equal(tsr_rpc_call(e.cli, &q, on_res, &r[0]), TSR_ETOOBIG);
  env_down(&e);
}

static int state_ups, state_downs;
static void on_state(tsr_rpc_client *c, int up, int status, void *data) {
  if (up)
    state_ups++;
  else
    state_downs++;
}

static void test_reconnect(void **state) {
  tsr_rpc_opts co;
  ru_opts(&co, "client");
  co.backoff_min_ms = 10;
  co.backoff_max_ms = 40;
  env e;
  /* a port claimed for this test (ports.h): still free when the server
   * comes back on it, whatever other tests bind meanwhile */
  env_up_on(&e, NULL, &co, test_port());
  state_ups = state_downs = 0;
  tsr_rpc_client_on_state(e.cli, on_state, NULL);
  res r;
  assert_int_equal(call(&e, M_ECHO, NULL, 0, NULL, 0, NULL, 0, 0, &r), 0);
  assert_int_equal(r.status, 0);
  assert_true(tsr_rpc_client_connected(e.cli));
  /* a call held by the server when it goes away fails at once */
  res held;
  memset(&held, 0, sizeof held);
  tsr_rpc_request q = {.method = M_SLEEP};
  assert_int_equal(tsr_rpc_call(e.cli, &q, on_res, &held), 0);
  int spin = 0;
  while (!e.held && spin++ < 100) ru_run_until(&e.loop, &spin, 10);
  assert_non_null(e.held);
  int sdone = 0;
  tsr_rpc_server_close(e.srv, ru_set_flag, &sdone);
  assert_true(ru_run_until(&e.loop, &held.done, 3000));
  assert_int_equal(held.status, TSR_ECLOSED);
  assert_non_null(strstr(held.msg, "lost"));
  /* the held call is answered after its connection died: dropped */
  uv_timer_stop(&e.sleeper);
  tsr_rpc_reply_error(e.held, TSR_ESHUTDOWN, NULL);
  e.held = NULL;
  assert_true(ru_run_until(&e.loop, &sdone, 3000));
  assert_int_equal(tsr_rpc_ctx_free(e.sctx), 0);
  /* the client keeps trying; the server comes back on the same port */
  int wait = 0;
  ru_run_until(&e.loop, &wait, 100);
  tsr_rpc_opts so;
  ru_opts(&so, "server2");
  env_server(&e, &so, e.port);
  assert_int_equal(call(&e, M_ECHO, "back", 4, NULL, 0, NULL, 0, 3000, &r),
                   0);
  assert_int_equal(r.status, 0);
  assert_true(state_ups >= 2);
  assert_true(state_downs >= 1);
  tsr_rpc_stats st;
  tsr_rpc_client_stats(e.cli, &st);
  assert_true(st.connects >= 2);
  env_down(&e);
  char err[256];
  test_ports_release((long)getpid(), NULL, 0, err, sizeof err);
}

static void test_wrong_token(void **state) {
  tsr_rpc_opts co;
  ru_opts(&co, "stranger");
  co.token = "not-the-token";
  co.token_len = strlen(co.token);
  co.backoff_min_ms = 20;
  co.backoff_max_ms = 50;
  env e;
  env_up(&e, NULL, &co);
  res r;
  assert_int_equal(call(&e, M_ECHO, NULL, 0, NULL, 0, NULL, 0, 300, &r), 0);
  assert_int_equal(r.status, TSR_EUNAVAIL);
  assert_non_null(strstr(r.msg, "wrong cluster token"));
  tsr_rpc_stats st;
  tsr_rpc_server_stats(e.srv, &st);
  assert_true(st.refused >= 1);
  assert_int_equal(st.calls, 0);
  env_down(&e);
}

static void test_fail_fast(void **state) {
  tsr_rpc_opts co;
  ru_opts(&co, "client");
  co.fail_fast = 1;
  co.backoff_min_ms = 1000;
  co.backoff_max_ms = 2000;
  env e;
  env_up(&e, NULL, &co);
  int sdone = 0;
  tsr_rpc_server_close(e.srv, ru_set_flag, &sdone);
  e.srv = NULL;
  assert_true(ru_run_until(&e.loop, &sdone, 3000));
  res r;
  memset(&r, 0, sizeof r);
  tsr_rpc_request q = {.method = M_ECHO};
  int rc = tsr_rpc_call(e.cli, &q, on_res, &r);
  if (rc == 0) { /* queued before the first attempt failed */
    assert_true(ru_run_until(&e.loop, &r.done, 3000));
    assert_int_equal(r.status, TSR_EUNAVAIL);
    rc = tsr_rpc_call(e.cli, &q, on_res, &r);
  }
  assert_int_equal(rc, TSR_EUNAVAIL);
  env_down(&e);
}

/* Deadlines racing answers: many calls whose answers come around their
 * deadlines, some while the payload is landing in the caller's buffer.
 * A call that failed must never see its buffer written afterwards: each
 * one is filled with a canary when its callback runs, checked at the end
 * when every late answer has arrived. */
typedef struct race {
  uint8_t *dst;
  size_t len;
  int done, status;
  uint32_t want;
  uint8_t delay;
  uint32_t deadline_ms;
} race;

typedef struct racer {
  env *e;
  race *x;
  int next;
  const uint8_t *src;
} racer;

static void on_race(const tsr_rpc_result *rr, void *data) {
  race *x = data;
  x->done = 1;
  x->status = rr->status;
  if (rr->status == 0) {
    if (checksum(x->dst, x->len) != x->want) x->status = 12345;
  } else {
    memset(x->dst, 0xEE, x->len);
  }
}

static void race_issue(racer *r) {
  race *x = &r->x[r->next++];
  uv_buf_t b = uv_buf_init((char *)r->src + (x - r->x), (unsigned)x->len);
  tsr_rpc_request q = {.method = M_DELAY, .meta = &x->delay, .meta_len = 1,
                       .payload = &b, .npayload = 1, .resp_buf = x->dst,
                       .resp_len = x->len, .deadline_ms = x->deadline_ms};
  assert_int_equal(tsr_rpc_call(r->e->cli, &q, on_race, x), 0);
}

/* Runs calls [from, to) with `depth` in flight until all are done. */
static void race_run(env *e, racer *r, int from, int to, int depth) {
  int z = 0, done = 0;
  r->next = from;
  for (int k = 0; k < 20000 && done < to - from; k++) {
    done = 0;
    int pending = 0;
    for (int i = from; i < r->next; i++) {
      if (r->x[i].done)
        done++;
      else
        pending++;
    }
    while (r->next < to && pending < depth) {
      race_issue(r);
      pending++;
    }
    if (done < to - from) ru_run_until(&e->loop, &z, 1);
  }
  assert_int_equal(done, to - from);
}

static void test_deadline_race(void **state) {
  env e;
  env_up(&e, NULL, NULL);
  enum { N = 240, NBIG = 12 };
  race *x = calloc(N + NBIG, sizeof *x);
  size_t src_len = (24u << 20) + N + NBIG;
  uint8_t *src = malloc(src_len);
  for (size_t i = 0; i < src_len; i++) src[i] = (uint8_t)(i * 29 + 1);
  int z = 0;
  for (int k = 0; k < 500 && !tsr_rpc_client_connected(e.cli); k++)
    ru_run_until(&e.loop, &z, 5);
  assert_true(tsr_rpc_client_connected(e.cli));
  unsigned seed = 7;
  for (int i = 0; i < N + NBIG; i++) {
    seed = seed * 1103515245 + 12345;
    x[i].len = (seed >> 8) % (512u << 10);
    x[i].delay = (uint8_t)((seed >> 4) % 10);
    x[i].deadline_ms = 2 + (seed >> 12) % 12;
    if (i >= N) { /* big, alone: the deadline falls while bytes move */
      x[i].len = (8u << 20) + (seed >> 6) % (16u << 20);
      x[i].delay = 0;
      x[i].deadline_ms = 2 + (seed >> 10) % 40;
    }
    x[i].dst = malloc(x[i].len + 1);
    x[i].want = checksum(src + i, x[i].len);
  }
  racer r = {.e = &e, .x = x, .src = src};
  race_run(&e, &r, 0, N, 8);
  race_run(&e, &r, N, N + NBIG, 1);
  /* let every late answer arrive and be dropped */
  for (int k = 0; k < 200 && e.ndelayed; k++) ru_run_until(&e.loop, &z, 5);
  ru_run_until(&e.loop, &z, 100);
  int ok = 0, late = 0;
  for (int i = 0; i < N + NBIG; i++) {
    if (x[i].status == 0) {
      if (i < N) ok++;
    } else {
      assert_int_equal(x[i].status, TSR_ETIMEOUT);
      if (i < N) late++;
      for (size_t j = 0; j < x[i].len; j++)
        if (x[i].dst[j] != 0xEE)
          fail_msg("call %d: buffer written after its deadline", i);
    }
    free(x[i].dst);
  }
  if (!ok || !late) fail_msg("%d answered, %d timed out: no race", ok, late);
  free(src);
  free(x);
  env_down(&e);
}

/* An address that splits into host and port but is longer than the client
 * keeps is refused, and the logged reason says so. */
static void test_long_address(void **state) {
  uv_loop_t loop;
  assert_int_equal(uv_loop_init(&loop), 0);
  tsr_rpc_opts o;
  ru_opts(&o, "client");
  tsr_rpc_ctx *ctx;
  assert_int_equal(tsr_rpc_ctx_new(&ctx, &loop, &o), 0);
  char addr[300];
  memset(addr, 'h', 252);
  snprintf(addr + 252, sizeof addr - 252, ":1234");
  tsr_log_level lvl = tsr_log_get_level();
  tsr_log_set_level(TSR_LOG_ERROR);
  FILE *tf = tmpfile();
  assert_non_null(tf);
  fflush(stderr);
  int saved = dup(2);
  dup2(fileno(tf), 2);
  tsr_rpc_client *cl = NULL;
  int rc = tsr_rpc_client_new(&cl, ctx, addr);
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  tsr_log_set_level(lvl);
  char logged[1024] = "";
  rewind(tf);
  size_t n = fread(logged, 1, sizeof logged - 1, tf);
  logged[n] = 0;
  fclose(tf);
  assert_int_equal(rc, TSR_EINVAL);
  assert_null(cl);
  print_message("%s", logged);
  assert_non_null(strstr(logged, "longer than 255 bytes"));
  assert_non_null(strstr(logged, "hhhh"));
  assert_int_equal(tsr_rpc_ctx_free(ctx), 0);
  assert_int_equal(uv_loop_close(&loop), 0);
}

/* Closing a client fails its calls with TSR_ESHUTDOWN; a closed loop has
 * nothing left. */
static void test_close_pending(void **state) {
  env e;
  env_up(&e, NULL, NULL);
  res r;
  memset(&r, 0, sizeof r);
  tsr_rpc_request q = {.method = M_SLEEP};
  assert_int_equal(tsr_rpc_call(e.cli, &q, on_res, &r), 0);
  int spin = 0;
  while (!e.held && spin++ < 100) ru_run_until(&e.loop, &spin, 10);
  int cdone = 0;
  tsr_rpc_client_close(e.cli, ru_set_flag, &cdone);
  assert_true(r.done);
  assert_int_equal(r.status, TSR_ESHUTDOWN);
  assert_int_equal(tsr_rpc_call(e.cli, &q, on_res, &r), TSR_ESHUTDOWN);
  assert_true(ru_run_until(&e.loop, &cdone, 3000));
  e.cli = NULL;
  /* the server's held call is answered after its peer left */
  int wait = 0;
  ru_run_until(&e.loop, &wait, 400);
  assert_null(e.held);
  env_down(&e);
}

/* Closing the client from inside a call's callback: the other calls end
 * with TSR_ESHUTDOWN, the close completes, nothing is left on the loop. */
typedef struct closer {
  env *e;
  res r[3];
  int closed;
} closer;

static void on_close_inside(const tsr_rpc_result *rr, void *data) {
  closer *k = data;
  on_res(rr, &k->r[0]);
  tsr_rpc_client_close(k->e->cli, ru_set_flag, &k->closed);
  k->e->cli = NULL;
}

static void test_close_in_callback(void **state) {
  env e;
  env_up(&e, NULL, NULL);
  closer k = {.e = &e};
  uint32_t ms = 200;
  tsr_rpc_request fast = {.method = M_ECHO};
  tsr_rpc_request slow = {.method = M_SLEEP, .meta = &ms, .meta_len = 4};
  assert_int_equal(tsr_rpc_call(e.cli, &fast, on_close_inside, &k), 0);
  assert_int_equal(tsr_rpc_call(e.cli, &slow, on_res, &k.r[1]), 0);
  assert_true(ru_run_until(&e.loop, &k.closed, 3000));
  assert_int_equal(k.r[0].status, 0);
  assert_true(k.r[1].done);
  assert_int_equal(k.r[1].status, TSR_ESHUTDOWN);
  int wait = 0;
  ru_run_until(&e.loop, &wait, 400); /* the held call is answered, dropped */
  env_down(&e);
}

/* ---- allocation failures in turn ---------------------------------------- */

static void test_alloc_failures(void **state) {
  ru_failer f;
  tsr_rpc_allocator al = {ru_fail_alloc, ru_fail_free, &f};
  int completed_ok = 0;
  for (long n = 1; n < 400; n++) {
    memset(&f, 0, sizeof f);
    f.fail_at = n;
    uv_loop_t loop;
    assert_int_equal(uv_loop_init(&loop), 0);
    tsr_rpc_opts o;
    ru_opts(&o, "both");
    o.allocator = &al;
    o.backoff_min_ms = 5;
    o.backoff_max_ms = 10;
    tsr_rpc_ctx *ctx = NULL;
    tsr_rpc_server *s = NULL;
    tsr_rpc_client *c = NULL;
    int rc = tsr_rpc_ctx_new(&ctx, &loop, &o);
    if (rc) {
      assert_int_equal(rc, TSR_ENOMEM);
      assert_int_equal(uv_loop_close(&loop), 0);
      continue;
    }
    rc = tsr_rpc_server_new(&s, ctx);
    if (!rc) rc = tsr_rpc_server_register(s, M_ECHO, h_echo, NULL);
    if (!rc) rc = tsr_rpc_server_listen(s, "127.0.0.1:0");
    char addr[64];
    if (!rc) {
      snprintf(addr, sizeof addr, "127.0.0.1:%d", tsr_rpc_server_port(s));
      rc = tsr_rpc_client_new(&c, ctx, addr);
    }
    res r;
    memset(&r, 0, sizeof r);
    if (!rc) {
      uint8_t pl[10000];
      memset(pl, 5, sizeof pl);
      uv_buf_t b = uv_buf_init((char *)pl, sizeof pl);
      tsr_rpc_request q = {.method = M_ECHO, .meta = "m", .meta_len = 1,
                           .payload = &b, .npayload = 1, .deadline_ms = 300};
      rc = tsr_rpc_call(c, &q, on_res, &r);
      if (!rc) {
        ru_run_until(&loop, &r.done, 3000);
        assert_true(r.done);
        if (r.status == 0) {
          assert_int_equal(r.payload_len, sizeof pl);
          completed_ok++;
        }
      }
    }
    int cd = !c, sd = !s;
    if (c) tsr_rpc_client_close(c, ru_set_flag, &cd);
    if (s) tsr_rpc_server_close(s, ru_set_flag, &sd);
    assert_true(ru_run_until(&loop, &cd, 3000));
    assert_true(ru_run_until(&loop, &sd, 3000));
    /* nothing leaked: all the context still holds is its buffer pool */
    assert_int_equal(tsr_rpc__mem(ctx), ctx->pool_held);
    assert_int_equal(tsr_rpc_ctx_free(ctx), 0);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&loop), 0);
    if (f.failures == 0) break; /* past the last allocation */
  }
  assert_true(completed_ok > 0);
}

static void copy_peer(const tsr_rpc_conn_info *in, void *data) {
  snprintf(data, TSR_RPC_ADDR_MAX, "%s", in->peer);
}

/* Non-zero in the run of the table with TESSERA_RPC_TRANSPORT=tcp. */
static int tcp_pass;

/* A server listening on `listen_host`, a client of 127.0.0.1 with the
 * given transport: echo, then both ends say whether the connection was
 * the same-host socket, and the server names its peer accordingly. Both
 * ends ask for MACs (plain_frames 0): frames carry one over TCP, and none
 * over the same-host socket. */
static void same_host_case(const char *listen_host, int client_transport,
                           int want_local) {
  env e;
  memset(&e, 0, sizeof e);
  assert_int_equal(uv_loop_init(&e.loop), 0);
  uv_timer_init(&e.loop, &e.sleeper);
  uv_timer_init(&e.loop, &e.ticker);
  tsr_rpc_opts so, co;
  ru_opts(&so, "server");
  ru_opts(&co, "client");
  co.transport = client_transport;
  assert_int_equal(tsr_rpc_ctx_new(&e.sctx, &e.loop, &so), 0);
  assert_int_equal(tsr_rpc_server_new(&e.srv, e.sctx), 0);
  assert_int_equal(tsr_rpc_server_register(e.srv, M_ECHO, h_echo, &e), 0);
  char addr[64];
  snprintf(addr, sizeof addr, "%s:0", listen_host);
  assert_int_equal(tsr_rpc_server_listen(e.srv, addr), 0);
  e.port = tsr_rpc_server_port(e.srv);
  assert_int_equal(tsr_rpc_ctx_new(&e.cctx, &e.loop, &co), 0);
  snprintf(addr, sizeof addr, "127.0.0.1:%d", e.port);
  assert_int_equal(tsr_rpc_client_new(&e.cli, e.cctx, addr), 0);
  res r;
  uint8_t pl[300000];
  for (size_t i = 0; i < sizeof pl; i++) pl[i] = (uint8_t)(i * 13);
  assert_int_equal(call(&e, M_ECHO, "sh", 2, pl, sizeof pl, NULL, 0, 0, &r),
                   0);
  assert_int_equal(r.status, 0);
  assert_int_equal(r.sum, checksum(pl, sizeof pl));
  tsr_rpc_stats cs, ss;
  tsr_rpc_client_stats(e.cli, &cs);
  tsr_rpc_server_stats(e.srv, &ss);
  assert_int_equal(cs.connects, 1);
  assert_int_equal(ss.connects, 1);
  assert_int_equal(cs.connects_local, want_local);
  assert_int_equal(ss.connects_local, want_local);
  assert_int_equal(cs.connects_plain, want_local);
  assert_int_equal(ss.connects_plain, want_local);
  char peer[TSR_RPC_ADDR_MAX] = "";
  tsr_rpc_server_foreach_conn(e.srv, copy_peer, peer);
  if (want_local)
    assert_true(!strncmp(peer, "unix:pid ", 9));
  else
    assert_true(!strncmp(peer, "127.0.0.1:", 10));
  env_down(&e);
}

static void test_same_host(void **state) {
  same_host_case("127.0.0.1", TSR_RPC_TRANSPORT_AUTO, !tcp_pass);
}

/* A server bound to every address is found through a loopback address. */
static void test_same_host_wildcard(void **state) {
  same_host_case("0.0.0.0", TSR_RPC_TRANSPORT_AUTO, !tcp_pass);
}

/* A client that asks for TCP gets TCP from a server that offers both. */
static void test_same_host_tcp_only(void **state) {
  same_host_case("127.0.0.1", TSR_RPC_TRANSPORT_TCP, 0);
}

/* A transport that is neither is refused, as is an unknown environment
 * value. */
static void test_transport_refused(void **state) {
  uv_loop_t loop;
  assert_int_equal(uv_loop_init(&loop), 0);
  tsr_rpc_opts o;
  ru_opts(&o, "x");
  o.transport = 7;
  tsr_rpc_ctx *ctx;
  assert_int_equal(tsr_rpc_ctx_new(&ctx, &loop, &o), TSR_ECONFIG);
  o.transport = 0;
  const char *was = getenv("TESSERA_RPC_TRANSPORT");
  setenv("TESSERA_RPC_TRANSPORT", "shm", 1);
  assert_int_equal(tsr_rpc_ctx_new(&ctx, &loop, &o), TSR_ECONFIG);
  if (was)
    setenv("TESSERA_RPC_TRANSPORT", "tcp", 1);
  else
    unsetenv("TESSERA_RPC_TRANSPORT");
  assert_int_equal(uv_loop_close(&loop), 0);
}

int main(void) {
  setenv("TESSERA_LOG", "error", 0);
  tsr_log_init("test");
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_echo),          cmocka_unit_test(test_many_sizes),
      cmocka_unit_test(test_localhost),
      cmocka_unit_test(test_remote_error),  cmocka_unit_test(test_typed_meta),
      cmocka_unit_test(test_call_msg),
      cmocka_unit_test(test_deadline),      cmocka_unit_test(test_resp_buf),
      cmocka_unit_test(test_deadline_race),
      cmocka_unit_test(test_sink),          cmocka_unit_test(test_busy),
      cmocka_unit_test(test_reconnect),     cmocka_unit_test(test_wrong_token),
      cmocka_unit_test(test_fail_fast),     cmocka_unit_test(test_long_address),
      cmocka_unit_test(test_close_pending),
      cmocka_unit_test(test_close_in_callback),
      cmocka_unit_test(test_alloc_failures),
      cmocka_unit_test(test_same_host),
      cmocka_unit_test(test_same_host_wildcard),
      cmocka_unit_test(test_same_host_tcp_only),
      cmocka_unit_test(test_transport_refused),
  };
  unsetenv("TESSERA_RPC_TRANSPORT");
  tcp_pass = 0;
  int failed = cmocka_run_group_tests_name("same-host", tests, NULL, NULL);
  setenv("TESSERA_RPC_TRANSPORT", "tcp", 1);
  tcp_pass = 1;
  failed += cmocka_run_group_tests_name("tcp", tests, NULL, NULL);
  return failed;
}
