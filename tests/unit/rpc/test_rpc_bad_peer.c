/* Bad peers against a real server running on its own thread, spoken to
 * over blocking sockets: garbage before the handshake, a wrong frame
 * magic, a truncated header, lengths over the limits, metas that do not
 * decode, unknown methods, a request id reused while in flight, a replayed
 * handshake, a client that sends nothing, and clients that stop reading or
 * hold many calls (backpressure: the server stops reading them and its
 * memory stays bounded), a peer that leaves mid-payload, a peer of
 * another protocol version. After each, the server still serves a good
 * client; at the end its loop closes with every handle gone. The whole
 * table runs twice: over TCP, and over the server's same-host Unix socket,
 * where every bad peer must be refused the same way. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "common/log.h"
#include "rpc.pb-c.h"
#include "rpc_util.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/time.h>

enum { M_ECHO = 1, M_HOLD = 2, M_TYPED = 4, M_SINK = 5 };
#define MAX_PAYLOAD (1u << 20)
#define MAX_INFLIGHT 8

typedef struct srv {
  uv_loop_t loop;
  tsr_rpc_ctx *ctx;
  tsr_rpc_server *s;
  uv_async_t stop;
  uv_timer_t snap_timer;
  pthread_t th;
  int port;
  int loop_close_rc;
  tsr_rpc_incoming *held[64];
  int nheld;
  pthread_mutex_t mu;
  tsr_rpc_stats snap;
  uint8_t sink[64 * 1024];
  int sink_aborts;      /* server thread writes, read after a snapshot */
} srv;

static srv S;

static void h_echo(tsr_rpc_incoming *call, void *data) {
  uv_buf_t b = uv_buf_init(call->payload, (unsigned)call->payload_len);
  tsr_rpc_reply(call, call->meta, call->meta_len, &b,
                call->payload_len ? 1 : 0, NULL, NULL);
}

static void h_hold(tsr_rpc_incoming *call, void *data) {
  if (S.nheld < 64)
    S.held[S.nheld++] = call;
  else
    tsr_rpc_reply_error(call, TSR_EBUSY, "test holds 64 at most");
}

static void h_typed(tsr_rpc_incoming *call, void *data) {
  tsr_rpc_reply(call, NULL, 0, NULL, 0, NULL, NULL);
}

static int sink_alloc(tsr_rpc_incoming *call, size_t len, void **buf,
                      void *data) {
  if (len > sizeof S.sink) return TSR_ETOOBIG;
  *buf = S.sink;
  return 0;
}
static void sink_abort(tsr_rpc_incoming *call, void *buf, int status,
                       void *data) {
  assert_ptr_equal(buf, S.sink);
  __atomic_add_fetch(&S.sink_aborts, 1, __ATOMIC_RELAXED);
}

static void snap_cb(uv_timer_t *t) {
  tsr_rpc_stats st;
  tsr_rpc_server_stats(S.s, &st);
  pthread_mutex_lock(&S.mu);
  S.snap = st;
  pthread_mutex_unlock(&S.mu);
}

static void release_held(void) {
  for (int i = 0; i < S.nheld; i++)
    tsr_rpc_reply_error(S.held[i], TSR_ESHUTDOWN, "test over");
  S.nheld = 0;
}

static void closed_cb(void *data) {
  uv_close((uv_handle_t *)&S.stop, NULL);
  uv_close((uv_handle_t *)&S.snap_timer, NULL);
}

static void stop_cb(uv_async_t *a) {
  release_held();
  tsr_rpc_server_close(S.s, closed_cb, NULL);
}

static void *srv_main(void *arg) {
  uv_run(&S.loop, UV_RUN_DEFAULT);
  tsr_rpc_ctx_free(S.ctx);
  S.loop_close_rc = uv_loop_close(&S.loop);
  return NULL;
}

static int setup(void **state) {
  memset(&S, 0, sizeof S);
  pthread_mutex_init(&S.mu, NULL);
  assert_int_equal(uv_loop_init(&S.loop), 0);
  tsr_rpc_opts o;
  ru_opts(&o, "srv");
  o.handshake_timeout_ms = 300;
  o.max_meta_bytes = 4096;
  o.max_payload_bytes = MAX_PAYLOAD;
  o.max_inflight = MAX_INFLIGHT;
  o.max_write_queue = 2u << 20;
  o.idle_timeout_ms = 20000;
  /* these peers write frames by hand: plain ones (test_rpc_integrity
   * covers frames with their MAC) */
  o.plain_frames = 1;
  assert_int_equal(tsr_rpc_ctx_new(&S.ctx, &S.loop, &o), 0);
  assert_int_equal(tsr_rpc_server_new(&S.s, S.ctx), 0);
  assert_int_equal(tsr_rpc_server_register(S.s, M_ECHO, h_echo, NULL), 0);
  assert_int_equal(tsr_rpc_server_register(S.s, M_HOLD, h_hold, NULL), 0);
  tsr_rpc_method tm = {.method = M_TYPED, .handler = h_typed,
                       .request_type = &tessera__rpc__rpc_error__descriptor};
  assert_int_equal(tsr_rpc_server_register_method(S.s, &tm), 0);
  tsr_rpc_method sm = {.method = M_SINK, .handler = h_echo,
                       .payload_alloc = sink_alloc,
                       .payload_abort = sink_abort};
  assert_int_equal(tsr_rpc_server_register_method(S.s, &sm), 0);
  assert_int_equal(tsr_rpc_server_listen(S.s, "127.0.0.1:0"), 0);
  S.port = tsr_rpc_server_port(S.s);
  uv_async_init(&S.loop, &S.stop, stop_cb);
  uv_timer_init(&S.loop, &S.snap_timer);
  uv_timer_start(&S.snap_timer, snap_cb, 5, 5);
  assert_int_equal(pthread_create(&S.th, NULL, srv_main, NULL), 0);
  return 0;
}

static int teardown(void **state) {
  uv_async_send(&S.stop);
  pthread_join(S.th, NULL);
  assert_int_equal(S.loop_close_rc, 0);
  pthread_mutex_destroy(&S.mu);
  return 0;
}

/* Which of the server's two sockets this run of the table speaks to. */
static int over_unix;

static int peer_connect(void) {
  return over_unix ? ru_connect_unix(S.port) : ru_connect(S.port);
}

static tsr_rpc_stats snap(void) {
  usleep(30000); /* two snapshot periods */
  pthread_mutex_lock(&S.mu);
  tsr_rpc_stats st = S.snap;
  pthread_mutex_unlock(&S.mu);
  return st;
}

/* Waits (up to 5 s) for the server's figures to satisfy `cond`, which
 * names them `st`: the server thread may lag behind on a loaded machine. */
#define WAIT_SNAP(st, cond)                                              \
  do {                                                                   \
    uint64_t t0_ = tsr_now_ms();                                         \
    for (;;) {                                                           \
      st = snap();                                                       \
      if ((cond) || tsr_now_ms() - t0_ > 5000) break;                    \
    }                                                                    \
  } while (0)

/* A snapshot once the server's figures have stopped moving (two in a row
 * equal), so a figure taken as "before" is not one that still lags. */
static tsr_rpc_stats snap_settled(void) {
  tsr_rpc_stats a = snap(), b;
  uint64_t t0 = tsr_now_ms();
  for (;;) {
    b = snap();
    if (!memcmp(&a, &b, sizeof a) || tsr_now_ms() - t0 > 5000) return b;
    a = b;
  }
}

static int good_conn(void) {
  int fd = peer_connect();
  assert_true(fd >= 0);
  assert_int_equal(ru_handshake(fd, TEST_TOKEN, NULL), 0);
  return fd;
}

/* The server still answers a well-behaved client. */
static void assert_serving(void) {
  int fd = good_conn();
  uint8_t f[128];
  size_t n = ru_frame(f, TSR_RPC__REQ, M_ECHO, 1, "ping", 4, 3);
  memcpy(f + n, "abc", 3);
  assert_int_equal(ru_write_all(fd, f, n + 3), 0);
  tsr_rpc__hdr h;
  assert_int_equal(ru_read_answer(fd, &h, NULL, NULL, 0), TSR_RPC__RESP);
  assert_int_equal(h.id, 1);
  assert_int_equal(h.payload_len, 3);
  close(fd);
}

static int read_eof(int fd) {
  uint8_t b[256];
  for (;;) {
    ssize_t r = read(fd, b, sizeof b);
    if (r == 0) return 1;
    if (r < 0) return 0; /* timeout or error, not an orderly close */
  }
}

/* The server's hello (into `hello`), then its verdict `code`, then an
 * orderly close; the socket is closed. */
static void expect_refusal(int fd, uint8_t *hello, int code) {
  uint8_t verdict[TSR_RPC__VERDICT_SIZE];
  assert_int_equal(ru_read_all(fd, hello, TSR_RPC__HELLO_SIZE), 0);
  assert_int_equal(ru_read_all(fd, verdict, sizeof verdict), 0);
  assert_int_equal((int)tsr_rpc__get32(verdict), code);
  assert_true(read_eof(fd));
  close(fd);
}

static void expect_error(int fd, uint64_t id, int code, const char *text) {
  tsr_rpc__hdr h;
  int c = 0;
  char msg[300] = "";
  assert_int_equal(ru_read_answer(fd, &h, &c, msg, sizeof msg), TSR_RPC__ERR);
  assert_int_equal(h.id, id);
  assert_int_equal(c, code);
  if (text && !strstr(msg, text)) fail_msg("'%s' lacks '%s'", msg, text);
}

static void test_garbage_before_handshake(void **state) {
  tsr_rpc_stats before = snap();
  int fd = peer_connect();
  const char *http = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
  assert_int_equal(ru_write_all(fd, http, strlen(http)), 0);
  assert_true(read_eof(fd)); /* nothing answered, closed */
  close(fd);
  tsr_rpc_stats after;
  WAIT_SNAP(after, after.refused == before.refused + 1);
  assert_int_equal(after.refused, before.refused + 1);
  assert_serving();
}

static void test_wrong_frame_magic(void **state) {
  int fd = good_conn();
  uint8_t junk[TSR_RPC_HEADER_SIZE];
  memset(junk, 0xAB, sizeof junk);
  assert_int_equal(ru_write_all(fd, junk, sizeof junk), 0);
  expect_error(fd, 0, TSR_EPROTO, "magic");
  assert_true(read_eof(fd));
  close(fd);
  assert_serving();
}

static void test_truncated_header(void **state) {
  int fd = good_conn();
  uint8_t f[64];
  ru_frame(f, TSR_RPC__REQ, M_ECHO, 1, NULL, 0, 0);
  assert_int_equal(ru_write_all(fd, f, 10), 0);
  close(fd);
  assert_serving();
}

static void test_over_limit(void **state) {
  int fd = good_conn();
  uint8_t f[64];
  size_t n = ru_frame(f, TSR_RPC__REQ, M_ECHO, 5, NULL, 0, MAX_PAYLOAD + 1);
  assert_int_equal(ru_write_all(fd, f, n), 0);
  expect_error(fd, 5, TSR_ETOOBIG, "over the limit");
  assert_true(read_eof(fd));
  close(fd);
  fd = good_conn();
  n = ru_frame(f, TSR_RPC__REQ, M_ECHO, 6, NULL, 0, 0);
  tsr_rpc__put32(f + 12, 5000); /* meta length over 4096 */
  assert_int_equal(ru_write_all(fd, f, n), 0);
  expect_error(fd, 6, TSR_ETOOBIG, "meta of 5000 bytes");
  close(fd);
  assert_serving();
}

static void test_meta_not_decoding(void **state) {
  int fd = good_conn();
  uint8_t f[128];
  static const uint8_t junk[] = {0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f, 0x01};
  size_t n = ru_frame(f, TSR_RPC__REQ, M_TYPED, 1, junk, sizeof junk, 3);
  memcpy(f + n, "xyz", 3);
  assert_int_equal(ru_write_all(fd, f, n + 3), 0);
  expect_error(fd, 1, TSR_EPROTO, "does not decode");
  /* the connection goes on */
  n = ru_frame(f, TSR_RPC__REQ, M_ECHO, 2, "ok", 2, 0);
  assert_int_equal(ru_write_all(fd, f, n), 0);
  tsr_rpc__hdr h;
  assert_int_equal(ru_read_answer(fd, &h, NULL, NULL, 0), TSR_RPC__RESP);
  assert_int_equal(h.id, 2);
  close(fd);
}

static void test_unknown_method(void **state) {
  int fd = good_conn();
  uint8_t f[128];
  size_t n = ru_frame(f, TSR_RPC__REQ, 999, 1, "m", 1, 4);
  memcpy(f + n, "abcd", 4);
  assert_int_equal(ru_write_all(fd, f, n + 4), 0);
  expect_error(fd, 1, TSR_ENOMETHOD, "unknown method 999");
  n = ru_frame(f, TSR_RPC__REQ, M_ECHO, 2, NULL, 0, 0);
  assert_int_equal(ru_write_all(fd, f, n), 0);
  tsr_rpc__hdr h;
  assert_int_equal(ru_read_answer(fd, &h, NULL, NULL, 0), TSR_RPC__RESP);
  close(fd);
}

static void test_dup_id(void **state) {
  int fd = good_conn();
  uint8_t f[128];
  size_t n = ru_frame(f, TSR_RPC__REQ, M_HOLD, 7, NULL, 0, 0);
  assert_int_equal(ru_write_all(fd, f, n), 0);
  assert_int_equal(ru_write_all(fd, f, n), 0);
  expect_error(fd, 7, TSR_EDUPID, "already in flight");
  assert_true(read_eof(fd));
  close(fd);
  assert_serving();
}

static void test_replay(void **state) {
  uint8_t rec[512];
  int fd = peer_connect();
  assert_int_equal(ru_handshake(fd, TEST_TOKEN, rec), 0);
  close(fd);
  tsr_rpc_stats before = snap_settled();
  /* the same client bytes again, on a new connection */
  fd = peer_connect();
  assert_int_equal(ru_write_all(fd, rec,
                                TSR_RPC__HELLO_SIZE + TSR_RPC__PROOF_SIZE),
                   0);
  uint8_t hello[TSR_RPC__HELLO_SIZE];
  expect_refusal(fd, hello, TSR_EAUTH);
  tsr_rpc_stats after;
  WAIT_SNAP(after, after.refused == before.refused + 1);
  assert_int_equal(after.refused, before.refused + 1);
  assert_int_equal(after.connects, before.connects);
}

static void test_silent_client(void **state) {
  tsr_rpc_stats before = snap();
  int fd = peer_connect(); /* 5 s receive timeout */
  assert_true(read_eof(fd));   /* dropped by the server before that */
  close(fd);
  tsr_rpc_stats after;
  WAIT_SNAP(after, after.refused == before.refused + 1);
  assert_int_equal(after.refused, before.refused + 1);
  /* a client that stops after part of its HELLO is dropped the same way */
  fd = peer_connect();
  uint8_t part[8];
  tsr_rpc__put32(part, TSR_RPC__HELLO_MAGIC);
  memset(part + 4, 0, 4);
  assert_int_equal(ru_write_all(fd, part, sizeof part), 0);
  assert_true(read_eof(fd));
  close(fd);
}

/* A client that sends and never reads: the server stops reading it once
 * max_write_queue bytes of answers wait, so what it holds stays bounded
 * however long the client keeps pushing. */
static void test_stops_reading(void **state) {
  int fd = good_conn();
  int fl = fcntl(fd, F_GETFL);
  fcntl(fd, F_SETFL, fl | O_NONBLOCK);
  size_t plen = 256 * 1024;
  uint8_t *frame = malloc(TSR_RPC_HEADER_SIZE + plen);
  memset(frame, 0x5a, TSR_RPC_HEADER_SIZE + plen);
  uint64_t sent = 0, mem_mid = 0;
  uint64_t id = 1;
  size_t off = 0, flen = 0;
  uint64_t t0 = tsr_now_ms();
  int stalls = 0;
  while (tsr_now_ms() - t0 < 1500) {
    if (off == flen) {
      flen = ru_frame(frame, TSR_RPC__REQ, M_ECHO, id++, NULL, 0, plen) +
             plen;
      off = 0;
    }
    ssize_t w = send(fd, frame + off, flen - off, MSG_NOSIGNAL);
    if (w > 0) {
      off += (size_t)w;
      sent += (uint64_t)w;
    } else {
      stalls++;
      usleep(2000);
    }
    if (!mem_mid && tsr_now_ms() - t0 > 700) mem_mid = snap().mem_bytes;
  }
  tsr_rpc_stats st;
  WAIT_SNAP(st, st.paused == 1);
  assert_true(stalls > 0);           /* the client was held back by TCP */
  assert_int_equal(st.paused, 1);    /* the server stopped reading it */
  /* what the server holds: at most max_inflight answers of plen bytes plus
   * the answers queued, a stage and pooled buffers: far below what was
   * pushed at it, and not growing */
  uint64_t bound = (uint64_t)(MAX_INFLIGHT + 2) * plen + (4u << 20);
  if (st.mem_bytes > bound)
    fail_msg("server holds %llu bytes (bound %llu) after %llu sent",
             (unsigned long long)st.mem_bytes, (unsigned long long)bound,
             (unsigned long long)sent);
  assert_true(st.mem_bytes <= mem_mid + plen);
  assert_true(st.inflight <= MAX_INFLIGHT);
  close(fd);
  free(frame);
  st = snap();
  assert_serving();
}

/* Calls held by a handler count against max_inflight: requests beyond it
 * are answered TSR_EBUSY at once and the connection stays readable. */
static void test_held_calls_bound(void **state) {
  int fd = good_conn();
  uint8_t f[64];
  for (uint64_t id = 1; id <= 20; id++) {
    size_t n = ru_frame(f, TSR_RPC__REQ, M_HOLD, id, NULL, 0, 0);
    assert_int_equal(ru_write_all(fd, f, n), 0);
  }
  for (uint64_t id = MAX_INFLIGHT + 1; id <= 20; id++)
    expect_error(fd, id, TSR_EBUSY, "already in flight");
  tsr_rpc_stats st;
  WAIT_SNAP(st, st.inflight == MAX_INFLIGHT);
  assert_int_equal(st.inflight, MAX_INFLIGHT);
  assert_int_equal(st.paused, 0);
  close(fd);
  WAIT_SNAP(st, st.inflight == 0);
  assert_int_equal(st.inflight, 0);
  assert_int_equal(st.paused, 0);
}

/* A peer that leaves halfway through a payload landing in a method's own
 * buffer: the buffer is handed back through payload_abort. */
static void test_payload_abort(void **state) {
  int fd = good_conn();
  tsr_rpc_stats before = snap();
  uint8_t f[64 + 1000];
  size_t n = ru_frame(f, TSR_RPC__REQ, M_SINK, 1, NULL, 0, 50000);
  memset(f + n, 1, 1000);
  assert_int_equal(ru_write_all(fd, f, n + 1000), 0);
  tsr_rpc_stats st;
  WAIT_SNAP(st, st.bytes_in >= before.bytes_in + n + 1000);
  close(fd);
  WAIT_SNAP(st, __atomic_load_n(&S.sink_aborts, __ATOMIC_RELAXED) == 1);
  assert_int_equal(__atomic_load_n(&S.sink_aborts, __ATOMIC_RELAXED), 1);
  assert_int_equal(st.inflight, 0);
  assert_serving();
}

/* A peer of another protocol version gets the server's HELLO (so it can
 * name both versions) and a refusal, then the connection closes. */
static void test_version_mismatch(void **state) {
  tsr_rpc_stats before = snap();
  int fd = peer_connect();
  tsr_rpc__hs hs;
  uint8_t out[TSR_RPC__HS_OUT_MAX];
  size_t ol;
  tsr_rpc__hs_init(&hs, TSR_RPC__CLIENT, TEST_TOKEN, strlen(TEST_TOKEN),
                   "old", 0, out, &ol);
  out[4] = (uint8_t)(TSR_RPC_VERSION + 1); /* a newer version */
  assert_int_equal(ru_write_all(fd, out, ol), 0);
  uint8_t hello[TSR_RPC__HELLO_SIZE];
  expect_refusal(fd, hello, TSR_EVERSION);
  assert_int_equal(hello[4] | hello[5] << 8, TSR_RPC_VERSION);
  tsr_rpc_stats after;
  WAIT_SNAP(after, after.refused == before.refused + 1);
  assert_int_equal(after.refused, before.refused + 1);
}

/* A good peer's handshake counts as a same-host connection exactly when
 * it came over the Unix socket. */
static void test_transport_counted(void **state) {
  tsr_rpc_stats before = snap_settled();
  int fd = peer_connect();
  assert_true(fd >= 0);
  assert_int_equal(ru_handshake(fd, TEST_TOKEN, NULL), 0);
  tsr_rpc_stats after;
  WAIT_SNAP(after, after.connects == before.connects + 1);
  assert_int_equal(after.connects_local,
                   before.connects_local + (over_unix ? 1 : 0));
  close(fd);
}

int main(void) {
  setenv("TESSERA_LOG", "error", 0);
  tsr_log_init("test");
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_garbage_before_handshake),
      cmocka_unit_test(test_wrong_frame_magic),
      cmocka_unit_test(test_truncated_header),
      cmocka_unit_test(test_over_limit),
      cmocka_unit_test(test_meta_not_decoding),
      cmocka_unit_test(test_unknown_method),
      cmocka_unit_test(test_dup_id),
      cmocka_unit_test(test_replay),
      cmocka_unit_test(test_silent_client),
      cmocka_unit_test(test_stops_reading),
      cmocka_unit_test(test_held_calls_bound),
      cmocka_unit_test(test_payload_abort),
      cmocka_unit_test(test_version_mismatch),
      cmocka_unit_test(test_transport_counted),
  };
  over_unix = 0;
  int failed = cmocka_run_group_tests_name("tcp", tests, setup, teardown);
  over_unix = 1;
  failed += cmocka_run_group_tests_name("unix", tests, setup, teardown);
  return failed;
}
