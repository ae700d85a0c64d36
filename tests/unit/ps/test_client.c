/* The PS client against a server that answers every method with a meta
 * that is no protobuf message: each call reports TSR_EPROTO with a
 * message, never success with empty figures. A server that answers
 * properly is covered by test_service.c. And the one conversion of a
 * variable and its shard (common/var.h) into the spec the PS creates. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "../rpc/rpc_util.h"
#include "ps/client/client.h"
#include "common/partition.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* A variable's shard as the chief creates it: the variable and the shard
 * held as they are, the same create as one built by hand
 * (ps_var_spec_init, then the variable's own initializer and file), and
 * the refusals. */
static void test_spec_from_var(void **state) {
  (void)state;
  static const int64_t shape[4] = {3, 3, 2, 8}, emb[2] = {1000, 16};
  tsr_var v;
  tsr_init_spec he;
  assert_int_equal(tsr_init_parse("he_normal", &he), 0);
  assert_int_equal(tsr_var_set(&v, "c1/kernel", 4, shape, TSR_DT_FLOAT32,
                               TSR_VAR_DENSE, NULL, 0), 0);
  tsr_var_set_init(&v, &he);
  tsr_optim_spec o;
  tsr_optim_defaults(TSR_OPT_ADAM, &o);
  tsr_partitioner p;
  tsr_partitioner_default(&p);
  p.kind = TSR_PART_FIXED;
  p.num_shards = 2;
  tsr_shard *sh;
  size_t n;
  assert_int_equal(tsr_partition_plan(&p, &v, NULL, 1, 2, &sh, &n, NULL, 0),
                   0);
  assert_int_equal(n, 2);
  for (size_t k = 0; k < n; k++) {
    ps_var_spec a, b;
    assert_int_equal(ps_var_spec_from_var(&a, &v, &sh[k], 7, &o,
                                          "/ckpt/init/c1.raw"), 0);
    assert_int_equal(ps_var_spec_init(&b, v.name, v.rank, v.shape,
                                      sh[k].shard, sh[k].num_shards,
                                      tsr_init_name(v.init.kind), 7, &o), 0);
    b.var.init = v.init;
    snprintf(b.init_path, sizeof b.init_path, "%s", "/ckpt/init/c1.raw");
    /* the variable as it is, the chief's shard, the rest as by hand */
    assert_memory_equal(&a.var, &v, sizeof v);
    assert_memory_equal(&a.var, &b.var, sizeof a.var);
    assert_memory_equal(&a.shard, &sh[k], sizeof a.shard);
    assert_int_equal(a.shard.row0, b.shard.row0);
    assert_int_equal(a.shard.rows, b.shard.rows);
    assert_int_equal(a.shard.shard, b.shard.shard);
    assert_int_equal(a.shard.num_shards, b.shard.num_shards);
    assert_true(a.bounded == b.bounded && a.seed == b.seed);
    assert_memory_equal(&a.optim, &b.optim, sizeof a.optim);
    assert_string_equal(a.init_path, b.init_path);
    assert_int_equal(a.var.init.fan_in, 18);
    assert_false(ps_var_spec_sparse(&a) || a.bounded);
  }
  /* a row-sparse table: rows by id, bounded by its shard */
  assert_int_equal(tsr_var_set(&v, "e/embeddings", 2, emb, TSR_DT_FLOAT32,
                               TSR_VAR_ROW_SPARSE, NULL, 0), 0);
  ps_var_spec a;
  tsr_shard s1 = {.var = 0, .shard = 1, .num_shards = 2, .row0 = 500,
                  .rows = 500, .ps = 1};
  assert_int_equal(ps_var_spec_from_var(&a, &v, &s1, 1, &o, NULL), 0);
  assert_true(ps_var_spec_sparse(&a) && a.bounded);
  assert_int_equal(a.shard.row0, 500);
  assert_int_equal(a.shard.rows, 500);
  assert_string_equal(a.init_path, "");
  /* refusals: rows past the variable, a shard out of its count, a dtype
   * the PS does not hold */
  tsr_shard bad = s1;
  bad.rows = 501;
  assert_int_equal(ps_var_spec_from_var(&a, &v, &bad, 1, &o, NULL),
                   TSR_EINVAL);
  bad = s1;
  bad.shard = 2;
  assert_int_equal(ps_var_spec_from_var(&a, &v, &bad, 1, &o, NULL),
                   TSR_EINVAL);
  v.dtype = TSR_DT_BFLOAT16;
  assert_int_equal(ps_var_spec_from_var(&a, &v, &s1, 1, &o, NULL),
                   TSR_EINVAL);
  free(sh);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_undecodable_answers),
      cmocka_unit_test(test_spec_from_var),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
