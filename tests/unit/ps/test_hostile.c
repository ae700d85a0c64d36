/* A client that holds the token but sends hostile contents: every numeric
 * field of every PS method out of range, sizes whose products overflow,
 * counts that disagree with the payload, unknown enum values. Each must be
 * refused with an error that names the field and the value, and the PS
 * must go on serving (a correct pull after every refusal). Before these
 * checks several of these requests overflowed the heap or hit signed
 * overflow (UBSan). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <dirent.h>
#include <math.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ps_harness.h"
#include "ps/client/client_int.h"
#include "ps/svc_int.h"
#include "../rpc/tamper_proxy.h"

static ps_var_spec mk(const char *name, int64_t d0, int64_t d1) {
  return h_spec(name, d0, d1, 0, 1, "zeros", 7, TSR_OPT_ADAM);
}

/* ---- raw calls: any meta, any payload ----------------------------------- */

typedef struct {
  int done, status;
  char message[512];
} raw_res;

static void raw_cb(const tsr_rpc_result *r, void *data) {
  raw_res *o = data;
  o->done = 1;
  o->status = r->status;
  snprintf(o->message, sizeof o->message, "%s", r->message);
}

static raw_res raw_call(h_env *e, uint32_t method, const ProtobufCMessage *m,
                        const void *payload, size_t plen) {
  uint8_t meta[4096];
  size_t mlen = protobuf_c_message_pack(m, meta);
  tsr_rpc_request q = {0};
  q.method = method;
  q.meta = meta;
  q.meta_len = mlen;
  uv_buf_t b = uv_buf_init((char *)payload, (unsigned)plen);
  q.payload = &b;
  q.npayload = plen ? 1 : 0;
  q.flags = TSR_RPC_RESP_UPTO;
  static uint8_t sink[1 << 16];
  q.resp_buf = sink;
  q.resp_len = sizeof sink;
  raw_res r = {0};
  if (tsr_rpc_call(ps_client_rpc(e->cl[0]), &q, raw_cb, &r)) abort();
  if (!h_wait(e, &r.done)) fail_msg("no answer to method 0x%x", method);
  return r;
}

#define REFUSED(res, code, text)                                          \
  do {                                                                    \
    assert_int_equal((res).status, (code));                               \
    if (!strstr((res).message, (text)))                                   \
      fail_msg("message \"%s\" does not name \"%s\"", (res).message, (text)); \
  } while (0)

static void still_serving(h_env *e) {
  float got[16 * 4], want[16 * 4] = {0};
  h_res r;
  H_CALL(e, r, ps_client_pull(e->cl[0], "ok", 0, 0, 0, got, 64, h_cb, &r));
  assert_int_equal(r.status, 0);
  assert_memory_equal(got, want, sizeof got);
}

static void setup_ok(h_env *e) {
  h_res r;
  ps_var_spec ok = mk("ok", 16, 4);
  H_CALL(e, r, ps_client_create(e->cl[0], &ok, 1, h_cb, &r));
  assert_int_equal(r.status, 0);
}

/* ---- create --------------------------------------------------------------*/

static void create_refuses_what_overflows(void **state) {
  (void)state;
  ps_server_opts o = {0};
  o.memory_limit = 64 << 20;
  h_env e;
  h_up(&e, 1, &o);
  setup_ok(&e);
  h_res r;
  /* dense [2^62 + 1]: a size that wrapped to a small allocation */
  ps_var_spec v = mk("huge", 4, 4);
  v.var.rank = 1;
  v.var.shape[0] = ((int64_t)1 << 62) + 1;
  v.shard.rows = v.var.shape[0];
  H_CALL(&e, r, ps_client_create(e.cl[0], &v, 1, h_cb, &r));
  REFUSED(r, TSR_EINVAL, "shape[0]");
  still_serving(&e);
  /* dense [2^40, 2^30]: each dim fine, the product overflows */
  v = mk("wide", 1, 1);
  v.var.shape[0] = (int64_t)1 << 40;
  v.var.shape[1] = (int64_t)1 << 30;
  v.shard.rows = v.var.shape[0];
  H_CALL(&e, r, ps_client_create(e.cl[0], &v, 1, h_cb, &r));
  REFUSED(r, TSR_ERANGE, "wide");
  still_serving(&e);
  /* sparse [10, 2^62 + 1]: rows too wide to size */
  v = mk("semb", 10, 4);
  v.bounded = true;
  v.var.kind = TSR_VAR_ROW_SPARSE;
  v.var.shape[1] = ((int64_t)1 << 62) + 1;
  H_CALL(&e, r, ps_client_create(e.cl[0], &v, 1, h_cb, &r));
  assert_int_not_equal(r.status, 0);
  assert_non_null(strstr(r.message, "semb"));
  v.var.shape[1] = (int64_t)1 << 61;
  H_CALL(&e, r, ps_client_create(e.cl[0], &v, 1, h_cb, &r));
  REFUSED(r, TSR_ERANGE, "semb");
  still_serving(&e);
  /* row0 + rows overflows int64 */
  v = mk("rows", 100, 4);
  v.shard.row0 = INT64_MAX - 1;
  v.shard.rows = 10;
  H_CALL(&e, r, ps_client_create(e.cl[0], &v, 1, h_cb, &r));
  REFUSED(r, TSR_EINVAL, "row0 9223372036854775806");
  v.shard.row0 = -5;
  v.shard.rows = 10;
  H_CALL(&e, r, ps_client_create(e.cl[0], &v, 1, h_cb, &r));
  REFUSED(r, TSR_EINVAL, "row0 -5");
  /* shard numbers */
  v = mk("sh", 100, 4);
  v.shard.shard = 3;
  v.shard.num_shards = 2;
  H_CALL(&e, r, ps_client_create(e.cl[0], &v, 1, h_cb, &r));
  REFUSED(r, TSR_EINVAL, "shard 3 of num_shards 2");
  /* non-finite and out-of-range hyper-parameters, each named */
  static const struct {
    const char *field;
    size_t off;
    double value;
  } hyper[] = {
      {"learning_rate", offsetof(tsr_optim_spec, learning_rate), INFINITY},
      {"learning_rate", offsetof(tsr_optim_spec, learning_rate), NAN},
      {"learning_rate", offsetof(tsr_optim_spec, learning_rate), -1},
      {"momentum", offsetof(tsr_optim_spec, momentum), 1.5},
      {"beta_1", offsetof(tsr_optim_spec, beta_1), NAN},
      {"beta_2", offsetof(tsr_optim_spec, beta_2), 1.0},
      {"epsilon", offsetof(tsr_optim_spec, epsilon), -INFINITY},
      {"rho", offsetof(tsr_optim_spec, rho), -0.5},
      {"initial_accumulator_value",
       offsetof(tsr_optim_spec, initial_accumulator_value), INFINITY},
      {"learning_rate_power", offsetof(tsr_optim_spec, learning_rate_power),
       0.5},
      {"l1", offsetof(tsr_optim_spec, l1), -1},
      {"l2", offsetof(tsr_optim_spec, l2), NAN},
      {"l2_shrinkage", offsetof(tsr_optim_spec, l2_shrinkage), INFINITY},
      {"beta", offsetof(tsr_optim_spec, beta), -2},
  };
  for (size_t i = 0; i < sizeof hyper / sizeof hyper[0]; i++) {
    v = mk("hp", 8, 4);
    memcpy((char *)&v.optim + hyper[i].off, &hyper[i].value, sizeof(double));
    H_CALL(&e, r, ps_client_create(e.cl[0], &v, 1, h_cb, &r));
    REFUSED(r, TSR_EINVAL, hyper[i].field);
  }
  /* initializer arguments */
  v = mk("init", 8, 4);
  v.var.init.a = NAN;
  H_CALL(&e, r, ps_client_create(e.cl[0], &v, 1, h_cb, &r));
  REFUSED(r, TSR_EINVAL, "initializer");
  v = mk("init", 8, 4);
  v.var.init.fan_in = -3;
  H_CALL(&e, r, ps_client_create(e.cl[0], &v, 1, h_cb, &r));
  REFUSED(r, TSR_EINVAL, "fan_in -3");
  /* nothing of any of these was created */
  H_CALL(&e, r, ps_client_stats(e.cl[0], h_cb, &r));
  assert_int_equal(r.mem_used, 16 * 4 * 4 * 3);
  still_serving(&e);
  assert_int_equal(h_down(&e), 0);
}

/* A learning-rate schedule crosses the wire whole: every member, each
 * set to a value of its own, is read back by the PS as the client sent it. */
static void schedule_crosses_the_wire_whole(void **state) {
  (void)state;
  ps_var_spec v = mk("s", 8, 4), back;
  tsr_lr_schedule *s = &v.optim.schedule;
  *s = (tsr_lr_schedule){.kind = TSR_LR_COSINE_RESTARTS, .initial = 0.5,
                         .decay_steps = 100, .decay_rate = 0.25,
                         .staircase = true, .alpha = 0.125, .warmup = true,
                         .warmup_target = 0.75, .warmup_steps = 7,
                         .t_mul = 3, .m_mul = 0.875, .end_lr = 0.0625,
                         .power = 1.5, .cycle = true};
  Tessera__Ps__VarSpec vs;
  Tessera__Ps__Initializer in;
  Tessera__Ps__Optimizer op;
  Tessera__Ps__LrSchedule sc;
  int64_t shape[TSR_MAX_RANK];
  ps__client_spec_to_proto(&v, &vs, &in, &op, &sc, shape);
  char err[256];
  assert_int_equal(ps__spec_from_proto(&vs, &back, err, sizeof err), 0);
  const tsr_lr_schedule *b = &back.optim.schedule;
  assert_int_equal(b->kind, s->kind);
  assert_true(b->initial == 0.5 && b->decay_steps == 100 &&
              b->decay_rate == 0.25 && b->staircase && b->alpha == 0.125);
  assert_true(b->warmup && b->warmup_target == 0.75 && b->warmup_steps == 7);
  assert_true(b->t_mul == 3 && b->m_mul == 0.875 && b->end_lr == 0.0625 &&
              b->power == 1.5 && b->cycle);
}

/* A variable's name is at most TSR_VAR_NAME_MAX - 1 bytes on the PS as in
 * the chief (the spec holds a tsr_var): one byte more is refused with the
 * limit named, the longest is created. */
static void create_refuses_long_names(void **state) {
  (void)state;
  h_env e;
  h_up(&e, 1, NULL);
  setup_ok(&e);
  ps_var_spec v = mk("n", 8, 4);
  Tessera__Ps__VarSpec vs, *vp = &vs;
  Tessera__Ps__Initializer in;
  Tessera__Ps__Optimizer op;
  Tessera__Ps__LrSchedule sc;
  int64_t shape[TSR_MAX_RANK];
  ps__client_spec_to_proto(&v, &vs, &in, &op, &sc, shape);
  char name[TSR_VAR_NAME_MAX + 1];
  memset(name, 'n', TSR_VAR_NAME_MAX);
  name[TSR_VAR_NAME_MAX] = 0;
  vs.name = name;
  Tessera__Ps__CreateRequest cr = TESSERA__PS__CREATE_REQUEST__INIT;
  cr.n_vars = 1;
  cr.vars = &vp;
  raw_res x = raw_call(&e, PS_M_CREATE, &cr.base, NULL, 0);
  REFUSED(x, TSR_EINVAL, "longer than 127 bytes");
  name[TSR_VAR_NAME_MAX - 1] = 0;
  x = raw_call(&e, PS_M_CREATE, &cr.base, NULL, 0);
  assert_int_equal(x.status, 0);
  float got[8 * 4], want[8 * 4] = {0};
  h_res r;
  H_CALL(&e, r, ps_client_pull(e.cl[0], name, 0, 0, 0, got, 32, h_cb, &r));
  assert_int_equal(r.status, 0);
  assert_memory_equal(got, want, sizeof got);
  still_serving(&e);
  assert_int_equal(h_down(&e), 0);
}

/* ---- pulls and pushes ----------------------------------------------------*/

static void data_calls_refuse_bad_fields(void **state) {
  (void)state;
  h_env e;
  h_up(&e, 1, NULL);
  setup_ok(&e);
  h_res r;
  /* a sparse table with very wide rows: creating it costs nothing, but a
   * pull of one row would be 2^42 bytes */
  ps_var_spec w = mk("wide_emb", 10, 4);
  w.bounded = true;
  w.var.kind = TSR_VAR_ROW_SPARSE;
  w.var.shape[1] = (int64_t)1 << 40;
  H_CALL(&e, r, ps_client_create(e.cl[0], &w, 1, h_cb, &r));
  assert_int_equal(r.status, 0);
  int64_t ids[2] = {1, 2};
  Tessera__Ps__PullRequest pr = TESSERA__PS__PULL_REQUEST__INIT;
  pr.name = (char *)"wide_emb";
  pr.n_ids = 1;
  raw_res x = raw_call(&e, PS_M_PULL_ROWS, &pr.base, ids, 8);
  REFUSED(x, TSR_ETOOBIG, "payload limit");
  still_serving(&e);
  /* n_ids that overflows n_ids * 8 */
  pr.name = (char *)"wide_emb";
  pr.n_ids = (uint64_t)1 << 61;
  x = raw_call(&e, PS_M_PULL_ROWS, &pr.base, ids, 16);
  REFUSED(x, TSR_ESHAPE, "n_ids 2305843009213693952");
  /* push rows: n_ids * width * 4 does not match (nor fit) the payload */
  Tessera__Ps__PushRequest pu = TESSERA__PS__PUSH_REQUEST__INIT;
  pu.name = (char *)"wide_emb";
  pu.n_ids = 1;
  float g[4] = {1, 2, 3, 4};
  uint8_t pay[8 + 16];
  memcpy(pay, ids, 8);
  memcpy(pay + 8, g, 16);
  x = raw_call(&e, PS_M_PUSH_ROWS, &pu.base, pay, sizeof pay);
  REFUSED(x, TSR_ESHAPE, "n_ids 1");
  pu.n_ids = UINT64_MAX / 8 + 2;
  x = raw_call(&e, PS_M_PUSH_ROWS, &pu.base, pay, sizeof pay);
  REFUSED(x, TSR_ESHAPE, "wide_emb");
  still_serving(&e);
  /* steps and clocks out of range (signed overflow in the gates) */
  pu = (Tessera__Ps__PushRequest)TESSERA__PS__PUSH_REQUEST__INIT;
  pu.name = (char *)"ok";
  pu.step = INT64_MAX;
  float dg[64] = {0};
  x = raw_call(&e, PS_M_PUSH, &pu.base, dg, sizeof dg);
  REFUSED(x, TSR_EINVAL, "step 9223372036854775807");
  pu.step = -1;
  x = raw_call(&e, PS_M_PUSH, &pu.base, dg, sizeof dg);
  REFUSED(x, TSR_EINVAL, "step -1");
  pu.step = 0;
  pu.worker = -7;
  x = raw_call(&e, PS_M_PUSH, &pu.base, dg, sizeof dg);
  REFUSED(x, TSR_EINVAL, "worker -7");
  pu.worker = 0;
  pu.pull_clock = INT64_MIN;
  x = raw_call(&e, PS_M_PUSH_PULL, &pu.base, dg, sizeof dg);
  REFUSED(x, TSR_EINVAL, "pull_clock");
  pu.pull_clock = 0;
  pu.n_pull_ids = 3; /* on a push that pulls nothing */
  x = raw_call(&e, PS_M_PUSH, &pu.base, dg, sizeof dg);
  REFUSED(x, TSR_EINVAL, "n_pull_ids 3");
  pu.n_pull_ids = 0;
  pu.n_ids = 2; /* on a dense push */
  x = raw_call(&e, PS_M_PUSH, &pu.base, dg, sizeof dg);
  REFUSED(x, TSR_EINVAL, "n_ids 2");
  pu.n_ids = 0;
  pu.dtype = 9;
  x = raw_call(&e, PS_M_PUSH, &pu.base, dg, sizeof dg);
  REFUSED(x, TSR_EDTYPE, "dtype 9");
  pr = (Tessera__Ps__PullRequest)TESSERA__PS__PULL_REQUEST__INIT;
  pr.name = (char *)"ok";
  pr.clock = INT64_MIN;
  x = raw_call(&e, PS_M_PULL, &pr.base, NULL, 0);
  REFUSED(x, TSR_EINVAL, "clock -9223372036854775808");
  pr.clock = 0;
  pr.worker = INT32_MAX;
  x = raw_call(&e, PS_M_PULL, &pr.base, NULL, 0);
  REFUSED(x, TSR_EINVAL, "worker 2147483647");
  pr.worker = 0;
  x = raw_call(&e, PS_M_PULL, &pr.base, ids, 16); /* payload on a pull */
  REFUSED(x, TSR_ESHAPE, "no payload");
  /* nothing was applied */
  H_CALL(&e, r, ps_client_stats(e.cl[0], h_cb, &r));
  assert_int_equal(r.applies, 0);
  still_serving(&e);
  assert_int_equal(h_down(&e), 0);
}

/* ---- clocks, config, restore ---------------------------------------------*/

static void admin_calls_refuse_bad_fields(void **state) {
  (void)state;
  ps_server_opts o = {0};
  o.mode = "ssp:2";
  o.checkpoint_root = "/tmp";
  h_env e;
  h_up(&e, 1, &o);
  setup_ok(&e);
  Tessera__Ps__ClockRequest c = TESSERA__PS__CLOCK_REQUEST__INIT;
  c.op = (Tessera__Ps__ClockRequest__Op)9;
  raw_res x = raw_call(&e, PS_M_CLOCK, &c.base, NULL, 0);
  REFUSED(x, TSR_EINVAL, "op 9");
  c.op = TESSERA__PS__CLOCK_REQUEST__OP__JOIN;
  c.clock = INT64_MIN;
  x = raw_call(&e, PS_M_CLOCK, &c.base, NULL, 0);
  REFUSED(x, TSR_EINVAL, "clock -9223372036854775808");
  c.clock = 0;
  c.worker = PS_WORKER_MAX + 1;
  x = raw_call(&e, PS_M_CLOCK, &c.base, NULL, 0);
  REFUSED(x, TSR_EINVAL, "worker 65536");
  h_res r;
  H_CALL(&e, r, ps_client_stats(e.cl[0], h_cb, &r));
  assert_int_equal(r.min_clock, -1); /* nobody joined */
  Tessera__Ps__ConfigRequest cf = TESSERA__PS__CONFIG_REQUEST__INIT;
  cf.mode = (char *)"ssp:-4";
  x = raw_call(&e, PS_M_CONFIG, &cf.base, NULL, 0);
  REFUSED(x, TSR_EINVAL, "ssp:-4");
  cf.mode = (char *)"async";
  cf.trace = true;
  cf.trace_pid = -2;
  x = raw_call(&e, PS_M_CONFIG, &cf.base, NULL, 0);
  REFUSED(x, TSR_EINVAL, "trace_pid -2");
  Tessera__Ps__ShardRef ref = TESSERA__PS__SHARD_REF__INIT, *refs[2] = {&ref,
                                                                       &ref};
  ref.name = (char *)"ok";
  Tessera__Ps__RestoreRequest rq = TESSERA__PS__RESTORE_REQUEST__INIT;
  rq.dir = (char *)"ckpt-000000000001";
  rq.n_shards = 2;
  rq.shards = refs;
  x = raw_call(&e, PS_M_RESTORE, &rq.base, NULL, 0);
  REFUSED(x, TSR_EINVAL, "again");
  still_serving(&e);
  assert_int_equal(h_down(&e), 0);
}

/* ---- save and restore stay under the checkpoint root ----------------------*/

static void paths_stay_under_the_root(void **state) {
  (void)state;
  char root[128], outside[128], link[300], ck[300];
  snprintf(root, sizeof root, "/tmp/tsr-root-XXXXXX");
  snprintf(outside, sizeof outside, "/tmp/tsr-out-XXXXXX");
  assert_non_null(mkdtemp(root));
  assert_non_null(mkdtemp(outside));
  snprintf(link, sizeof link, "%s/escape", root);
  assert_int_equal(symlink(outside, link), 0);
  /* no root at all: nothing is read or written */
  h_env e;
  h_up(&e, 1, NULL);
  setup_ok(&e);
  h_res r;
  H_CALL(&e, r, ps_client_save(e.cl[0], "/tmp/x", h_cb, &r));
  REFUSED(r, TSR_ECONFIG, "no checkpoint root");
  H_CALL(&e, r, ps_client_restore(e.cl[0], "/tmp/x", h_cb, &r));
  REFUSED(r, TSR_ECONFIG, "no checkpoint root");
  /* the chief names one at configure */
  ps_config cfg = {.mode = "async", .trace_pid = -1, .checkpoint_root = root};
  H_CALL(&e, r, ps_client_configure(e.cl[0], &cfg, h_cb, &r));
  assert_int_equal(r.status, 0);
  static const char *const bad[] = {
      "/nonexistent/x", "/tmp", "..", "../x", "a/../../x", "a//b", "./a",
      "escape/x", "escape",
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    H_CALL(&e, r, ps_client_save(e.cl[0], bad[i], h_cb, &r));
    assert_int_equal(r.status, TSR_EINVAL);
    if (!strstr(r.message, "checkpoint root"))
      fail_msg("save %s: %s", bad[i], r.message);
    H_CALL(&e, r, ps_client_restore(e.cl[0], bad[i], h_cb, &r));
    assert_int_equal(r.status, TSR_EINVAL);
  }
  /* nothing was created outside the root, not even /nonexistent */
  struct stat st;
  assert_int_not_equal(stat("/nonexistent", &st), 0);
  DIR *d = opendir(outside);
  int entries = 0;
  for (struct dirent *de; (de = readdir(d));) entries += de->d_name[0] != '.';
  closedir(d);
  assert_int_equal(entries, 0);
  /* relative and absolute names inside the root work */
  H_CALL(&e, r, ps_client_save(e.cl[0], "ckpt-1", h_cb, &r));
  assert_int_equal(r.status, 0);
  snprintf(ck, sizeof ck, "%s/ckpt-1", root);
  H_CALL(&e, r, ps_client_restore(e.cl[0], ck, h_cb, &r));
  assert_int_equal(r.status, 0);
  assert_int_equal(h_down(&e), 0);
  /* a root given at start stays when the chief names another */
  ps_server_opts o = {0};
  o.checkpoint_root = root;
  h_up(&e, 1, &o);
  setup_ok(&e);
  cfg.checkpoint_root = outside;
  H_CALL(&e, r, ps_client_configure(e.cl[0], &cfg, h_cb, &r));
  assert_int_equal(r.status, 0);
  char there[300];
  snprintf(there, sizeof there, "%s/y", outside);
  H_CALL(&e, r, ps_client_save(e.cl[0], there, h_cb, &r));
  REFUSED(r, TSR_EINVAL, "not inside the checkpoint root");
  H_CALL(&e, r, ps_client_restore(e.cl[0], "ckpt-1", h_cb, &r));
  assert_int_equal(r.status, 0);
  assert_int_equal(h_down(&e), 0);
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'", root, outside);
  assert_int_equal(system(cmd), 0);
}

/* ---- a relay without the token flips a byte of a push ---------------------*/

static void altered_push_never_applied(void **state) {
  (void)state;
  ps_var_spec v = h_spec("w", 64, 64, 0, 1, "zeros", 1, TSR_OPT_SGD);
  v.optim.learning_rate = 1.0;
  h_env e;
  h_up_var(&e, &v);
  h_res r;
  /* the worker's connection goes through the relay: it flips one bit of
   * the first push's gradient (the sign and exponent byte of a float) */
  tamper_proxy tp;
  memset(&tp, 0, sizeof tp);
  tp.mode = TP_FLIP;
  tp.dir = TP_C2S;
  tp.at = 0;
  tp.flip_off = -17 - 3; /* the top byte of the last float */
  tp.min_payload = 64 * 64 * 4;
  assert_int_equal(tp_start(&tp, ps_server_port(e.srv[0])), 0);
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", tp.port);
  assert_int_equal(ps_client_new(&e.cl[1], e.ctx, addr), 0);
  static float g[64 * 64], got[64 * 64];
  for (int i = 0; i < 64 * 64; i++) g[i] = -1.0f;
  H_CALL(&e, r, ps_client_push(e.cl[1], "w", 0, 0, 0, PS_DT_F32, g, sizeof g,
                               h_cb, &r));
  assert_int_equal(r.status, TSR_ECLOSED);
  assert_true(atomic_load(&tp.done));
  /* nothing was applied */
  H_CALL(&e, r, ps_client_pull(e.cl[0], "w", 0, 0, 0, got, 64 * 64, h_cb, &r));
  assert_int_equal(r.status, 0);
  assert_int_equal(r.version, 0);
  for (int i = 0; i < 64 * 64; i++) assert_true(got[i] == 0.0f);
  /* the worker retries on its new connection: applied once, exactly */
  for (int k = 0; k < 50; k++) {
    H_CALL(&e, r, ps_client_push(e.cl[1], "w", 0, 0, 0, PS_DT_F32, g,
                                 sizeof g, h_cb, &r));
    if (r.status == 0) break;
    h_spin(&e, 20);
  }
  assert_int_equal(r.status, 0);
  H_CALL(&e, r, ps_client_pull(e.cl[0], "w", 0, 0, 0, got, 64 * 64, h_cb, &r));
  assert_int_equal(r.version, 1);
  for (int i = 0; i < 64 * 64; i++) assert_true(got[i] == 1.0f);
  assert_int_equal(h_down(&e), 0);
  tp_stop(&tp);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(create_refuses_what_overflows),
      cmocka_unit_test(create_refuses_long_names),
      cmocka_unit_test(schedule_crosses_the_wire_whole),
      cmocka_unit_test(data_calls_refuse_bad_fields),
      cmocka_unit_test(admin_calls_refuse_bad_fields),
      cmocka_unit_test(paths_stay_under_the_root),
      cmocka_unit_test(altered_push_never_applied),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
