/* Frame integrity, and what a server logs about peers it refuses.
 *
 * A client and a server with a relay between them that
 * holds no token (tamper_proxy.h). Whatever the relay does to one frame
 * after the handshake (flip a byte of its header, meta, payload or tag,
 * drop it, send it twice, swap it with the next, in either direction) the
 * receiving end closes the connection and logs why; no handler ever runs
 * on an altered request and no caller ever gets an altered answer as a
 * success. The client then reconnects and calls succeed again. With plain
 * frames on both ends (a trusted network) the same flip goes through:
 * that is what the MAC is for. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>
#include <cmocka.h>

#include "rpc_util.h"
#include "tamper_proxy.h"

enum { M_ECHO = 7 };
#define PLEN 4096

typedef struct {
  int calls;        /* handler runs */
  int altered;      /* requests whose payload was not the pattern */
} srv_seen;

static uint8_t g_pat[PLEN];

static void h_echo(tsr_rpc_incoming *call, void *data) {
  srv_seen *s = data;
  s->calls++;
  if (call->payload_len != PLEN || memcmp(call->payload, g_pat, PLEN))
    s->altered++;
  uv_buf_t b = uv_buf_init(call->payload, (unsigned)call->payload_len);
  if (tsr_rpc_reply(call, call->meta, call->meta_len, &b, 1, NULL, NULL))
    tsr_rpc_reply_error(call, TSR_EINVAL, "answer refused");
}

typedef struct {
  int done, status;
  char msg[400];
  uint8_t back[PLEN];
  size_t back_len;
} res;

static void on_res(const tsr_rpc_result *r, void *data) {
  res *o = data;
  o->done = 1;
  o->status = r->status;
  o->back_len = r->payload_len;
  snprintf(o->msg, sizeof o->msg, "%s", r->message);
}

typedef struct {
  uv_loop_t loop;
  tsr_rpc_ctx *sctx, *cctx;
  tsr_rpc_server *srv;
  tsr_rpc_client *cli;
  srv_seen seen;
  tamper_proxy tp;
} env;

/* e zeroed, e->tp's tampering fields set; plain: 1 both ends ask for
 * plain frames, 2 only the client does. */
static void env_up(env *e, int plain) {
  assert_int_equal(uv_loop_init(&e->loop), 0);
  tsr_rpc_opts o;
  ru_opts(&o, "srv");
  o.plain_frames = plain == 1;
  assert_int_equal(tsr_rpc_ctx_new(&e->sctx, &e->loop, &o), 0);
  ru_opts(&o, "cli");
  o.plain_frames = plain != 0;
  o.backoff_min_ms = 10;
  o.backoff_max_ms = 50;
  o.heartbeat_ms = 100; /* a dropped frame shows at the next ping */
  assert_int_equal(tsr_rpc_ctx_new(&e->cctx, &e->loop, &o), 0);
  assert_int_equal(tsr_rpc_server_new(&e->srv, e->sctx), 0);
  assert_int_equal(tsr_rpc_server_register(e->srv, M_ECHO, h_echo, &e->seen),
                   0);
  assert_int_equal(tsr_rpc_server_listen(e->srv, "127.0.0.1:0"), 0);
  e->tp.plain = plain == 1;
  assert_int_equal(tp_start(&e->tp, tsr_rpc_server_port(e->srv)), 0);
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", e->tp.port);
  assert_int_equal(tsr_rpc_client_new(&e->cli, e->cctx, addr), 0);
}

static void env_down(env *e) {
  int a = 0, b = 0;
  tsr_rpc_client_close(e->cli, ru_set_flag, &a);
  tsr_rpc_server_close(e->srv, ru_set_flag, &b);
  assert_true(ru_run_until(&e->loop, &a, 5000));
  assert_true(ru_run_until(&e->loop, &b, 5000));
  tp_stop(&e->tp);
  assert_int_equal(tsr_rpc_ctx_free(e->cctx), 0);
  assert_int_equal(tsr_rpc_ctx_free(e->sctx), 0);
  uv_run(&e->loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&e->loop), 0);
}

static void call(env *e, res *r) {
  memset(r, 0, sizeof *r);
  uv_buf_t b = uv_buf_init((char *)g_pat, PLEN);
  tsr_rpc_request q = {0};
  q.method = M_ECHO;
  q.meta = "m";
  q.meta_len = 1;
  q.payload = &b;
  q.npayload = 1;
  q.resp_buf = r->back;
  q.resp_len = PLEN;
  q.deadline_ms = 5000;
  assert_int_equal(tsr_rpc_call(e->cli, &q, on_res, r), 0);
  assert_true(ru_run_until(&e->loop, &r->done, 10000));
}

/* A cleared env whose proxy tampers (mode) with frame `at` of `dir` at
 * byte flip_off, counting only frames of at least min_payload bytes. */
static void env_tamper(env *e, int mode, int dir, uint64_t at, long flip_off,
                       size_t min_payload) {
  memset(e, 0, sizeof *e);
  e->tp.mode = mode;
  e->tp.dir = dir;
  e->tp.at = at;
  e->tp.flip_off = flip_off;
  e->tp.min_payload = min_payload;
}

/* One tampering, then what every side must see. */
static void run_case(int mode, int dir, uint64_t at, long flip_off) {
  env e;
  /* count only the echo frames, not pings */
  env_tamper(&e, mode, dir, at, flip_off, PLEN);
  env_up(&e, 0);
  /* three calls in a row; the tampering hits one of the first two */
  res r[3];
  int ok = 0, failed = 0;
  for (int i = 0; i < 3; i++) {
    call(&e, &r[i]);
    if (r[i].status == 0) {
      ok++;
      /* an answer delivered as a success is exactly what was sent */
      assert_int_equal(r[i].back_len, PLEN);
      assert_memory_equal(r[i].back, g_pat, PLEN);
    } else {
      failed++;
      assert_int_equal(r[i].status, TSR_ECLOSED);
    }
  }
  assert_true(atomic_load(&e.tp.done));
  /* the call whose frame was changed, dropped or moved fails (a replayed
   * copy comes after its call is done: only the connection closes) */
  if (mode != TP_REPLAY) assert_true(failed >= 1);
  /* no handler ever saw an altered request */
  assert_int_equal(e.seen.altered, 0);
  /* a replayed or reordered request never runs twice or out of turn */
  assert_true(e.seen.calls <= ok + failed);
  /* the client reconnects (the relay leaves later connections alone) */
  res again;
  for (int k = 0; k < 50; k++) {
    call(&e, &again);
    if (again.status == 0) break;
  }
  assert_int_equal(again.status, 0);
  assert_memory_equal(again.back, g_pat, PLEN);
  /* the tampered connection was dropped and a new one made */
  tsr_rpc_stats st;
  tsr_rpc_client_stats(e.cli, &st);
  assert_true(st.connects >= 2);
  assert_true(atomic_load(&e.tp.conns) >= 2);
  env_down(&e);
}

static void flipped_request_payload(void **s) {
  run_case(TP_FLIP, TP_C2S, 1, -17 - 100);
}
static void flipped_request_header(void **s) {
  run_case(TP_FLIP, TP_C2S, 0, 8); /* the method number */
}
static void flipped_request_meta(void **s) {
  run_case(TP_FLIP, TP_C2S, 1, TSR_RPC_HEADER_SIZE);
}
static void flipped_request_tag(void **s) { run_case(TP_FLIP, TP_C2S, 0, -1); }
static void dropped_request(void **s) { run_case(TP_DROP, TP_C2S, 0, 0); }
static void replayed_request(void **s) { run_case(TP_REPLAY, TP_C2S, 0, 0); }
static void reordered_requests(void **s) { run_case(TP_SWAP, TP_C2S, 0, 0); }
static void flipped_answer_payload(void **s) {
  run_case(TP_FLIP, TP_S2C, 1, -17 - 5);
}
static void replayed_answer(void **s) { run_case(TP_REPLAY, TP_S2C, 0, 0); }
static void dropped_answer(void **s) { run_case(TP_DROP, TP_S2C, 0, 0); }

/* A payload large enough to leave before its MAC is computed (the tag in
 * a write of its own): a flipped byte in its middle is caught all the
 * same, and the handler never runs. */
enum { M_BIG = 8, BIG = 1 << 20 };
static uint8_t *g_big;

static void h_big(tsr_rpc_incoming *call, void *data) {
  srv_seen *s = data;
  s->calls++;
  if (call->payload_len != BIG || memcmp(call->payload, g_big, BIG))
    s->altered++;
  tsr_rpc_reply(call, NULL, 0, NULL, 0, NULL, NULL);
}

static void flipped_large_request(void **st) {
  env e;
  env_tamper(&e, TP_FLIP, TP_C2S, 0, TSR_RPC_HEADER_SIZE + 1 + BIG / 2, BIG);
  g_big = malloc(BIG);
  for (int i = 0; i < BIG; i++) g_big[i] = (uint8_t)(i * 13 + 5);
  assert_int_equal(uv_loop_init(&e.loop), 0);
  tsr_rpc_opts o;
  ru_opts(&o, "srv");
  assert_int_equal(tsr_rpc_ctx_new(&e.sctx, &e.loop, &o), 0);
  ru_opts(&o, "cli");
  o.backoff_min_ms = 10;
  o.backoff_max_ms = 50;
  assert_int_equal(tsr_rpc_ctx_new(&e.cctx, &e.loop, &o), 0);
  assert_int_equal(tsr_rpc_server_new(&e.srv, e.sctx), 0);
  assert_int_equal(tsr_rpc_server_register(e.srv, M_BIG, h_big, &e.seen), 0);
  assert_int_equal(tsr_rpc_server_listen(e.srv, "127.0.0.1:0"), 0);
  assert_int_equal(tp_start(&e.tp, tsr_rpc_server_port(e.srv)), 0);
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", e.tp.port);
  assert_int_equal(tsr_rpc_client_new(&e.cli, e.cctx, addr), 0);
  int ok = 0, failed = 0;
  for (int i = 0; i < 2; i++) {
    res r;
    memset(&r, 0, sizeof r);
    uv_buf_t b = uv_buf_init((char *)g_big, BIG);
    tsr_rpc_request q = {0};
    q.method = M_BIG;
    q.meta = "m";
    q.meta_len = 1;
    q.payload = &b;
    q.npayload = 1;
    q.deadline_ms = 10000;
    assert_int_equal(tsr_rpc_call(e.cli, &q, on_res, &r), 0);
    assert_true(ru_run_until(&e.loop, &r.done, 20000));
    if (r.status == 0) ok++; else failed++;
  }
  assert_true(atomic_load(&e.tp.done));
  assert_int_equal(failed, 1);
  assert_int_equal(ok, 1);
  assert_int_equal(e.seen.altered, 0);
  assert_int_equal(e.seen.calls, 1);
  env_down(&e);
  free(g_big);
}

/* Both ends on plain frames: the relay's change goes through unseen. */
static void plain_frames_carry_no_check(void **s) {
  env e;
  env_tamper(&e, TP_FLIP, TP_C2S, 0, -1 - 100, PLEN);
  env_up(&e, 1);
  res r;
  call(&e, &r);
  assert_int_equal(r.status, 0);
  assert_true(atomic_load(&e.tp.done));
  assert_int_equal(e.seen.altered, 1);
  env_down(&e);
}

/* Only one end asks for plain frames: they carry a MAC all the same. */
static void plain_needs_both_ends(void **s) {
  env e;
  env_tamper(&e, TP_FLIP, TP_C2S, 0, -17 - 100, PLEN);
  env_up(&e, 2);
  res r;
  call(&e, &r);
  assert_int_equal(r.status, TSR_ECLOSED);
  assert_int_equal(e.seen.altered, 0);
  env_down(&e);
}

static void frame_mac_setting(void **s) {
  int plain = -1;
  char err[200];
  unsetenv("TESSERA_FRAME_MAC");
  assert_int_equal(tsr_rpc_frame_mac_setting(NULL, &plain, err, sizeof err), 0);
  assert_int_equal(plain, 0);
  setenv("TESSERA_FRAME_MAC", "off", 1);
  assert_int_equal(tsr_rpc_frame_mac_setting(NULL, &plain, err, sizeof err), 0);
  assert_int_equal(plain, 1);
  /* the flag wins */
  assert_int_equal(tsr_rpc_frame_mac_setting("on", &plain, err, sizeof err), 0);
  assert_int_equal(plain, 0);
  setenv("TESSERA_FRAME_MAC", "maybe", 1);
  assert_int_equal(tsr_rpc_frame_mac_setting(NULL, &plain, err, sizeof err),
                   TSR_ECONFIG);
  assert_non_null(strstr(err, "TESSERA_FRAME_MAC \"maybe\""));
  assert_int_equal(tsr_rpc_frame_mac_setting("nah", &plain, err, sizeof err),
                   TSR_ECONFIG);
  assert_non_null(strstr(err, "--frame-mac"));
  unsetenv("TESSERA_FRAME_MAC");
}

/* ---- refused peers: one log line per address per interval ------------------*/

static void ratelog_pure(void **s) {
  tsr_rpc__ratelog rl;
  memset(&rl, 0, sizeof rl);
  uint64_t sup = 0, iv = 1000;
  char host[64];
  assert_int_equal(tsr_rpc__ratelog_note(&rl, "10.0.0.1:5", 0, iv, &sup, host,
                                         sizeof host), 1);
  assert_string_equal(host, "10.0.0.1");
  assert_int_equal(sup, 0);
  for (int i = 1; i <= 99; i++)
    assert_int_equal(tsr_rpc__ratelog_note(&rl, "10.0.0.1:6", (uint64_t)i,
                                           iv, &sup, host, sizeof host), 0);
  /* another address has its own window */
  assert_int_equal(tsr_rpc__ratelog_note(&rl, "[::1]:9", 50, iv, &sup, host,
                                         sizeof host), 1);
  assert_string_equal(host, "::1");
  /* past the interval: a line, with the count of the rest */
  assert_int_equal(tsr_rpc__ratelog_note(&rl, "10.0.0.1:7", 1000, iv, &sup,
                                         host, sizeof host), 1);
  assert_int_equal(sup, 99);
  assert_int_equal(tsr_rpc__ratelog_note(&rl, "10.0.0.1:7", 1001, iv, &sup,
                                         host, sizeof host), 0);
  /* keys taken whole: two socket names of one address are two keys */
  assert_int_equal(tsr_rpc__ratelog_note_key(&rl, "@tessera-rpc/10.0.0.1:5",
                                             1500, iv, &sup), 1);
  assert_int_equal(tsr_rpc__ratelog_note_key(&rl, "@tessera-rpc/10.0.0.1:6",
                                             1500, iv, &sup), 1);
  assert_int_equal(tsr_rpc__ratelog_note_key(&rl, "@tessera-rpc/10.0.0.1:6",
                                             1501, iv, &sup), 0);
  assert_int_equal(tsr_rpc__ratelog_note_key(&rl, "@tessera-rpc/10.0.0.1:6",
                                             2600, iv, &sup), 1);
  assert_int_equal(sup, 1);
  /* more addresses than slots: each still gets its first line */
  for (int i = 0; i < 3 * TSR_RPC__RATELOG_SLOTS; i++) {
    char peer[32];
    snprintf(peer, sizeof peer, "10.1.%d.%d:1", i / 200, i % 200);
    assert_int_equal(tsr_rpc__ratelog_note(&rl, peer, 2000 + (uint64_t)i, iv,
                                           &sup, host, sizeof host), 1);
  }
}

static int count_lines(const char *path, const char *what) {
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  char line[1024];
  int n = 0;
  while (fgets(line, sizeof line, f)) n += strstr(line, what) != NULL;
  fclose(f);
  return n;
}

/* A client with the wrong token reconnecting as fast as it can: the
 * server refuses every attempt but logs one line per interval, the next
 * one with the count of those it did not log. Over TCP the address is the
 * client's IP; over the same-host socket every peer is "unix". */
static void refused_rate_limited(int transport, const char *peer,
                                 const char *host) {
  uv_loop_t loop;
  assert_int_equal(uv_loop_init(&loop), 0);
  tsr_rpc_opts o;
  ru_opts(&o, "srv");
  o.refuse_log_ms = 400;
  tsr_rpc_ctx *sctx, *cctx;
  assert_int_equal(tsr_rpc_ctx_new(&sctx, &loop, &o), 0);
  ru_opts(&o, "intruder");
  o.transport = transport;
  o.token = "not-the-token";
  o.token_len = strlen("not-the-token");
  o.backoff_min_ms = 1;
  o.backoff_max_ms = 2;
  assert_int_equal(tsr_rpc_ctx_new(&cctx, &loop, &o), 0);
  tsr_rpc_server *srv;
  assert_int_equal(tsr_rpc_server_new(&srv, sctx), 0);
  assert_int_equal(tsr_rpc_server_listen(srv, "127.0.0.1:0"), 0);
  char addr[64], path[] = "/tmp/tsr-refused-XXXXXX";
  snprintf(addr, sizeof addr, "127.0.0.1:%d", tsr_rpc_server_port(srv));
  int lf = mkstemp(path);
  assert_true(lf >= 0);
  fflush(stderr);
  int saved = dup(2);
  dup2(lf, 2);
  tsr_rpc_client *cli;
  assert_int_equal(tsr_rpc_client_new(&cli, cctx, addr), 0);
  /* Refusals until one came after the interval that the first logged
   * line opened had run out (that one is logged too), and at least 40.
   * The client and the server run on this thread, so a refusal counted
   * during an iteration happened after that iteration began; the first
   * line was logged before the end of the iteration that counted the
   * first refusal. Timed from there, a loaded machine that is slow to
   * connect, or stalls this thread, cannot end the loop too early. */
  uint64_t t0 = tsr_now_ms(), first_by = 0;
  bool after_interval = false;
  tsr_rpc_stats st = {0};
  while ((!after_interval || st.refused < 40) &&
         tsr_now_ms() - t0 < 30000) {
    uint64_t began = tsr_now_ms(), before = st.refused;
    uv_run(&loop, UV_RUN_NOWAIT);
    tsr_rpc_server_stats(srv, &st);
    if (st.refused > 0 && first_by == 0) first_by = tsr_now_ms();
    if (st.refused > before && first_by && began > first_by + 400)
      after_interval = true;
  }
  int a = 0, b = 0;
  tsr_rpc_client_close(cli, ru_set_flag, &a);
  tsr_rpc_server_close(srv, ru_set_flag, &b);
  ru_run_until(&loop, &a, 5000);
  ru_run_until(&loop, &b, 5000);
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  close(lf);
  uint64_t elapsed = tsr_now_ms() - t0;
  char want[64], want_more[64];
  snprintf(want, sizeof want, "refused peer %s", peer);
  snprintf(want_more, sizeof want_more, "more refusals of %s ", host);
  int lines = count_lines(path, want);
  int counted = count_lines(path, want_more);
  unlink(path);
  print_message("%llu refusals in %llu ms, %d lines\n",
                (unsigned long long)st.refused, (unsigned long long)elapsed,
                lines);
  assert_true(after_interval);
  assert_true(st.refused >= 40);
  /* one line per started interval of 400 ms, not one per refusal */
  assert_true(lines >= 2);
  assert_true((uint64_t)lines <= elapsed / 400 + 1);
  assert_true(counted >= 1);
  assert_int_equal(tsr_rpc_ctx_free(cctx), 0);
  assert_int_equal(tsr_rpc_ctx_free(sctx), 0);
  uv_run(&loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&loop), 0);
}

static void refused_peers_rate_limited(void **s) {
  refused_rate_limited(TSR_RPC_TRANSPORT_TCP, "127.0.0.1:", "127.0.0.1");
}

static void refused_local_peers_rate_limited(void **s) {
  refused_rate_limited(TSR_RPC_TRANSPORT_AUTO, "unix:", "unix");
}

/* A relay that changes every request frame on every connection: each
 * connection dies at its first call, the client reconnects at once, and
 * both ends log one line per peer per interval (400 ms here), the next
 * with the count of the rest, instead of a line (or two) per connection. */
static void bad_frames_rate_limited(void **st) {
  env e;
  env_tamper(&e, TP_FLIP, TP_C2S, 0, -17 - 100, PLEN);
  e.tp.every = 1;
  assert_int_equal(uv_loop_init(&e.loop), 0);
  tsr_rpc_opts o;
  ru_opts(&o, "srv");
  o.refuse_log_ms = 400;
  assert_int_equal(tsr_rpc_ctx_new(&e.sctx, &e.loop, &o), 0);
  ru_opts(&o, "cli");
  o.refuse_log_ms = 400;
  o.backoff_min_ms = 1;
  o.backoff_max_ms = 2;
  assert_int_equal(tsr_rpc_ctx_new(&e.cctx, &e.loop, &o), 0);
  assert_int_equal(tsr_rpc_server_new(&e.srv, e.sctx), 0);
  assert_int_equal(tsr_rpc_server_register(e.srv, M_ECHO, h_echo, &e.seen),
                   0);
  assert_int_equal(tsr_rpc_server_listen(e.srv, "127.0.0.1:0"), 0);
  assert_int_equal(tp_start(&e.tp, tsr_rpc_server_port(e.srv)), 0);
  char addr[64], path[] = "/tmp/tsr-badframes-XXXXXX";
  snprintf(addr, sizeof addr, "127.0.0.1:%d", e.tp.port);
  int lf = mkstemp(path);
  assert_true(lf >= 0);
  fflush(stderr);
  int saved = dup(2);
  dup2(lf, 2);
  uint64_t t0 = tsr_now_ms();
  assert_int_equal(tsr_rpc_client_new(&e.cli, e.cctx, addr), 0);
  /* calls until 40 connections died and the first interval is well past
   * (so a line with a count is due) */
  int failed = 0, ok = 0;
  while ((failed < 40 || tsr_now_ms() - t0 < 1000) &&
         tsr_now_ms() - t0 < 30000) {
    res r;
    call(&e, &r);
    if (r.status == 0) ok++; else failed++;
  }
  env_down(&e);
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  close(lf);
  uint64_t elapsed = tsr_now_ms() - t0;
  int srv_lines = count_lines(path, "rpc srv:");
  int cli_lines = count_lines(path, "rpc cli:");
  int counted = count_lines(path, "more bad frames from 127.0.0.1 ");
  int warn = count_lines(path, " WARN ");
  unlink(path);
  print_message("%d calls failed (%d ok) over %d connections in %llu ms: "
                "%d server lines, %d client lines, %d with a count, %d "
                "warnings\n", failed, ok, atomic_load(&e.tp.conns),
                (unsigned long long)elapsed, srv_lines, cli_lines, counted,
                warn);
  /* nothing changed went through */
  assert_int_equal(ok, 0);
  assert_int_equal(e.seen.altered, 0);
  assert_true(failed >= 40);
  /* each end: one line per started interval of 400 ms */
  uint64_t most = elapsed / 400 + 1;
  assert_true(srv_lines >= 1 && (uint64_t)srv_lines <= most);
  assert_true(cli_lines >= 1 && (uint64_t)cli_lines <= most);
  assert_true(counted >= 1);
  /* and no other line per connection */
  assert_true((uint64_t)warn <= 2 * most);
}

int main(void) {
  for (int i = 0; i < PLEN; i++) g_pat[i] = (uint8_t)(i * 7 + 1);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(flipped_request_payload),
      cmocka_unit_test(flipped_request_header),
      cmocka_unit_test(flipped_request_meta),
      cmocka_unit_test(flipped_request_tag),
      cmocka_unit_test(dropped_request),
      cmocka_unit_test(replayed_request),
      cmocka_unit_test(reordered_requests),
      cmocka_unit_test(flipped_answer_payload),
      cmocka_unit_test(replayed_answer),
      cmocka_unit_test(dropped_answer),
      cmocka_unit_test(flipped_large_request),
      cmocka_unit_test(plain_frames_carry_no_check),
      cmocka_unit_test(plain_needs_both_ends),
      cmocka_unit_test(frame_mac_setting),
      cmocka_unit_test(ratelog_pure),
      cmocka_unit_test(refused_peers_rate_limited),
      cmocka_unit_test(refused_local_peers_rate_limited),
      cmocka_unit_test(bad_frames_rate_limited),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
