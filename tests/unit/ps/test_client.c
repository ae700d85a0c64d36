/* The PS client against a server that answers every method with a meta
 * that is no protobuf message: each call reports TSR_EPROTO with a
 * message, never success with empty figures. A server that answers
 * properly is covered by test_service.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "../rpc/rpc_util.h"
#include "ps/client.h"

static const uint8_t garbage[] = {0xff, 0xff, 0xff, 0xff, 0x0f};

/* data: the payload bytes to send along (a pull's destination size) */
static void h_garbage(tsr_rpc_incoming *call, void *data) {
  static float zeros[4];
  uv_buf_t b = uv_buf_init((char *)zeros, (unsigned)(uintptr_t)data);
  assert_int_equal(tsr_rpc_reply(call, garbage, sizeof garbage, &b,
                                 data ? 1 : 0, NULL, NULL), 0);
}

typedef struct {
  int done, status;
  char msg[200];
} outcome;

static void on_result(const ps_result *r, void *data) {
  outcome *o = data;
  o->status = r->status;
  snprintf(o->msg, sizeof o->msg, "%s", r->message);
  o->done = 1;
}

static void test_undecodable_answers(void **state) {
  uv_loop_t loop;
  assert_int_equal(uv_loop_init(&loop), 0);
  tsr_rpc_opts so, co;
  ru_opts(&so, "fake-ps");
  ru_opts(&co, "client");
  tsr_rpc_ctx *sctx, *cctx;
  assert_int_equal(tsr_rpc_ctx_new(&sctx, &loop, &so), 0);
  assert_int_equal(tsr_rpc_ctx_new(&cctx, &loop, &co), 0);
  tsr_rpc_server *srv;
  assert_int_equal(tsr_rpc_server_new(&srv, sctx), 0);
  const uint32_t methods[] = {PS_M_PULL, PS_M_PUSH, PS_M_CREATE, PS_M_CLOCK,
                              PS_M_SAVE, PS_M_RESTORE, PS_M_STATS};
  for (size_t i = 0; i < sizeof methods / sizeof *methods; i++)
    assert_int_equal(
        tsr_rpc_server_register(srv, methods[i], h_garbage,
                                methods[i] == PS_M_PULL
                                    ? (void *)(uintptr_t)(4 * sizeof(float))
                                    : NULL),
        0);
  assert_int_equal(tsr_rpc_server_listen(srv, "127.0.0.1:0"), 0);
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", tsr_rpc_server_port(srv));
  ps_client *c;
  assert_int_equal(ps_client_new(&c, cctx, addr), 0);

  float dst[4], grad[4] = {1, 2, 3, 4};
  ps_var_spec spec;
  int64_t shape[1] = {4};
  tsr_optim_spec opt;
  memset(&opt, 0, sizeof opt);
  assert_int_equal(ps_var_spec_init(&spec, "v", 1, shape, 0, 1, "zeros", 1,
                                    &opt), 0);
  for (int k = 0; k < 7; k++) {
    outcome o = {0};
    int rc;
    switch (k) {
      case 0:
        rc = ps_client_pull(c, "v", 0, 0, 0, dst, 4, on_result, &o);
        break;
      case 1:
        rc = ps_client_push(c, "v", 0, 0, 0, PS_DT_F32, grad, sizeof grad,
                            on_result, &o);
        break;
      case 2: rc = ps_client_create(c, &spec, 1, on_result, &o); break;
      case 3:
        rc = ps_client_clock(c, 0, 1, PS_CLOCK_TICK, on_result, &o);
        break;
      case 4: rc = ps_client_save(c, "/nonexistent", on_result, &o); break;
      case 5: rc = ps_client_restore(c, "/nonexistent", on_result, &o); break;
      default: rc = ps_client_stats(c, on_result, &o); break;
    }
    assert_int_equal(rc, 0);
    assert_true(ru_run_until(&loop, &o.done, 5000));
    print_message("call %d: %s\n", k, o.msg);
    assert_int_equal(o.status, TSR_EPROTO);
    assert_non_null(strstr(o.msg, "does not decode"));
  }
  int closed = 0, sclosed = 0;
  ps_client_close(c, ru_set_flag, &closed);
  tsr_rpc_server_close(srv, ru_set_flag, &sclosed);
  assert_true(ru_run_until(&loop, &closed, 5000));
  assert_true(ru_run_until(&loop, &sclosed, 5000));
  assert_int_equal(tsr_rpc_ctx_free(cctx), 0);
  assert_int_equal(tsr_rpc_ctx_free(sctx), 0);
  uv_run(&loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&loop), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_undecodable_answers),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
