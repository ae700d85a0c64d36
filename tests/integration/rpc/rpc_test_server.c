/* rpc_test_server: a Tessera RPC server for the integration tests.
 *
 * Methods: 1 echo (meta and payload back), 2 checksum (answers the
 * payload's length and CRC32C as 12 bytes of meta), 3 sleep (answers
 * after the milliseconds in its 4-byte meta). Listens on 127.0.0.1 (port
 * from --port, 0 by default), prints "PORT <n>" on stdout once it
 * listens, stops cleanly on SIGTERM or SIGINT. The token comes from
 * --token-file or TESSERA_TOKEN. */
#include "common/crc32c.h"
#include "common/err.h"
#include "common/log.h"
#include "common/rpc/rpc.h"

#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { M_ECHO = 1, M_CHECKSUM = 2, M_SLEEP = 3 };

typedef struct sleeper {
  uv_timer_t t;
  tsr_rpc_incoming *call;
  struct sleeper *next, *prev;
} sleeper;

typedef struct app {
  uv_loop_t loop;
  tsr_rpc_ctx *ctx;
  tsr_rpc_server *srv;
  uv_signal_t sigterm, sigint;
  sleeper *sleepers;
} app;

static void h_echo(tsr_rpc_incoming *call, void *data) {
  uv_buf_t b = uv_buf_init(call->payload, (unsigned)call->payload_len);
  int rc = tsr_rpc_reply(call, call->meta, call->meta_len, &b,
                         call->payload_len ? 1 : 0, NULL, NULL);
  if (rc) tsr_rpc_reply_error(call, rc, "echo refused");
}

static void h_checksum(tsr_rpc_incoming *call, void *data) {
  uint8_t meta[12];
  uint64_t n = call->payload_len;
  uint32_t crc = tsr_crc32c(0, call->payload, call->payload_len);
  memcpy(meta, &n, 8);
  memcpy(meta + 8, &crc, 4);
  tsr_rpc_reply(call, meta, sizeof meta, NULL, 0, NULL, NULL);
}

static void sleeper_unlink(app *a, sleeper *s) {
  if (s->prev) s->prev->next = s->next; else a->sleepers = s->next;
  if (s->next) s->next->prev = s->prev;
}

static void sleeper_closed(uv_handle_t *h) { free(h->data); }

static void sleeper_fire(uv_timer_t *t) {
  sleeper *s = t->data;
  app *a = t->loop->data;
  sleeper_unlink(a, s);
  tsr_rpc_reply(s->call, "slept", 5, NULL, 0, NULL, NULL);
  uv_close((uv_handle_t *)&s->t, sleeper_closed);
}

static void h_sleep(tsr_rpc_incoming *call, void *data) {
  app *a = data;
  uint32_t ms = 0;
  if (call->meta_len != 4) {
    tsr_rpc_reply_error(call, TSR_EINVAL, "sleep wants a 4-byte meta");
    return;
  }
  memcpy(&ms, call->meta, 4);
  sleeper *s = calloc(1, sizeof *s);
  if (!s) {
    tsr_rpc_reply_error(call, TSR_ENOMEM, NULL);
    return;
  }
  s->call = call;
  s->t.data = s;
  uv_timer_init(&a->loop, &s->t);
  s->next = a->sleepers;
  if (a->sleepers) a->sleepers->prev = s;
  a->sleepers = s;
  uv_timer_start(&s->t, sleeper_fire, ms, 0);
}

static void server_closed(void *data) {
  app *a = data;
  uv_close((uv_handle_t *)&a->sigterm, NULL);
  uv_close((uv_handle_t *)&a->sigint, NULL);
}

static void on_signal(uv_signal_t *sig, int signum) {
  app *a = sig->data;
  tsr_info("signal %d: stopping", signum);
  while (a->sleepers) {
    sleeper *s = a->sleepers;
    sleeper_unlink(a, s);
    uv_timer_stop(&s->t);
    tsr_rpc_reply_error(s->call, TSR_ESHUTDOWN, "server stopping");
    uv_close((uv_handle_t *)&s->t, sleeper_closed);
  }
  uv_signal_stop(&a->sigterm);
  uv_signal_stop(&a->sigint);
  tsr_rpc_server_close(a->srv, server_closed, a);
}

int main(int argc, char **argv) {
  const char *token_file = NULL;
  int port = 0;
  static const struct option lopts[] = {
      {"token-file", required_argument, 0, 't'},
      {"port", required_argument, 0, 'p'},
      {0, 0, 0, 0}};
  int ch;
  while ((ch = getopt_long(argc, argv, "", lopts, NULL)) != -1) {
    if (ch == 't')
      token_file = optarg;
    else if (ch == 'p')
      port = atoi(optarg);
    else {
      fprintf(stderr, "usage: rpc_test_server [--token-file F] [--port P]\n");
      return 2;
    }
  }
  tsr_log_init("rpc-test-server");
  signal(SIGPIPE, SIG_IGN);
  char token[TSR_RPC_TOKEN_MAX], err[300];
  size_t token_len;
  if (tsr_rpc_token_load(token_file, token, sizeof token, &token_len, err,
                         sizeof err)) {
    tsr_error("%s", err);
    return 2;
  }
  app a;
  memset(&a, 0, sizeof a);
  uv_loop_init(&a.loop);
  a.loop.data = &a;
  tsr_rpc_opts o = {.name = "rpc-test-server", .token = token,
                    .token_len = token_len};
  int rc = tsr_rpc_ctx_new(&a.ctx, &a.loop, &o);
  if (!rc) rc = tsr_rpc_server_new(&a.srv, a.ctx);
  if (!rc) rc = tsr_rpc_server_register(a.srv, M_ECHO, h_echo, &a);
  if (!rc) rc = tsr_rpc_server_register(a.srv, M_CHECKSUM, h_checksum, &a);
  if (!rc) rc = tsr_rpc_server_register(a.srv, M_SLEEP, h_sleep, &a);
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
  if (!rc) rc = tsr_rpc_server_listen(a.srv, addr);
  if (rc) {
    tsr_error("cannot serve on %s: %s", addr, tsr_strerror(rc));
    return 1;
  }
  uv_signal_init(&a.loop, &a.sigterm);
  uv_signal_init(&a.loop, &a.sigint);
  a.sigterm.data = a.sigint.data = &a;
  uv_signal_start(&a.sigterm, on_signal, SIGTERM);
  uv_signal_start(&a.sigint, on_signal, SIGINT);
  printf("PORT %d\n", tsr_rpc_server_port(a.srv));
  fflush(stdout);
  uv_run(&a.loop, UV_RUN_DEFAULT);
  rc = tsr_rpc_ctx_free(a.ctx);
  int lc = uv_loop_close(&a.loop);
  if (rc || lc) {
    tsr_error("unclean shutdown: ctx %d, loop %d", rc, lc);
    return 1;
  }
  return 0;
}
