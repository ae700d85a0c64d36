/* The worker tests' harness (harness.h): real processes on loopback, a
 * driver loop with deadlines on every wait.
 */
#include "harness.h"

#include "common/clock.h"
#include "common/err.h"
#include "common/trace.h"
#include "kernels/init.h"
#include "ports.h"

#include <errno.h>
#include <libgen.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#define H_TOKEN "worker-integration-test-token"

static char ps_deadline[16] = "5000";

void h_set_ps_deadline(int ms) {
  snprintf(ps_deadline, sizeof ps_deadline, "%d", ms);
}

static pid_t spawn(h_cluster *c, const char *exe, const char *type, int i) {
  char path[1024], tf[1400], task[32];
  snprintf(path, sizeof path, "%s/%s", c->build_dir, exe);
  snprintf(tf, sizeof tf, "{\"cluster\": %s, \"task\": {\"type\": \"%s\", "
           "\"index\": %d}}", c->cluster_json, type, i);
  snprintf(task, sizeof task, "%s:%d", type, i);
  pid_t pid = fork();
  if (pid != 0) return pid;
  prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive a failed test */
  setenv("TF_CONFIG", tf, 1);
  setenv("TESSERA_TOKEN", H_TOKEN, 1);
  if (strcmp(type, "worker") == 0)
    execl(path, path, "--device", "cpu", "--ps-deadline-ms", ps_deadline,
          NULL);
  else
    execl(path, path, NULL);
  fprintf(stderr, "cannot run %s: %s\n", path, strerror(errno));
  _exit(127);
}

int h_kill(pid_t pid, int sig, int timeout_ms) {
  if (pid <= 0) return -1;
  kill(pid, sig);
  uint64_t end = tsr_now_ms() + (uint64_t)timeout_ms;
  for (;;) {
    int st;
    pid_t r = waitpid(pid, &st, WNOHANG);
    if (r == pid)
      return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    if (tsr_now_ms() > end) {
      kill(pid, SIGKILL);
      waitpid(pid, &st, 0);
      return -1;
    }
    tsr_sleep_ms(10);
  }
}

static void on_tick(uv_timer_t *t) { (void)t; }

int h_start_ps(h_cluster *c, int i, const char *ps_mode) {
  (void)ps_mode;
  c->ps_pid[i] = spawn(c, "ps/tessera-ps", "ps", i);
  return c->ps_pid[i] > 0 ? 0 : TSR_EINVAL;
}

/* n tasks on ports of 127.0.0.1 claimed for this test's life (ports.h:
 * free again for a PS started again on its port): their ports,
 * "host:port" addresses, and the JSON list of the addresses (a cluster's
 * job). */
static void h_task_addrs(int n, int *port, char (*addr)[32], char *list,
                         size_t len) {
  list[0] = 0;
  for (int i = 0; i < n; i++) {
    port[i] = test_port();
    snprintf(addr[i], sizeof addr[i], "127.0.0.1:%d", port[i]);
    size_t l = strlen(list);
    snprintf(list + l, len - l, "%s\"%s\"", i ? ", " : "", addr[i]);
  }
}

int h_start(h_cluster *c, int n_ps, int n_workers, const char *ps_mode) {
  memset(c, 0, sizeof *c);
  tsr_job_init(&c->job);
  c->build_dir = getenv("TSR_BUILD_DIR");
  c->source_dir = getenv("TSR_SOURCE_DIR");
  if (!c->build_dir || !c->source_dir) {
    fprintf(stderr, "TSR_BUILD_DIR and TSR_SOURCE_DIR must be set\n");
    return TSR_ECONFIG;
  }
  c->n_ps = n_ps;
  c->n_workers = n_workers;
  char ps_list[256], wk_list[256];
  h_task_addrs(n_ps, c->ps_port, c->ps_addr, ps_list, sizeof ps_list);
  h_task_addrs(n_workers, c->wk_port, c->wk_addr, wk_list, sizeof wk_list);
  snprintf(c->cluster_json, sizeof c->cluster_json,
           "{\"ps\": [%s], \"worker\": [%s]}", ps_list, wk_list);
  for (int i = 0; i < n_ps; i++) h_start_ps(c, i, ps_mode);
  for (int i = 0; i < n_workers; i++)
    c->wk_pid[i] = spawn(c, "worker/tessera-worker", "worker", i);

  uv_loop_init(&c->loop);
  uv_timer_init(&c->loop, &c->tick);
  uv_timer_start(&c->tick, on_tick, 20, 20);
  tsr_rpc_opts o = {.name = "chief:0", .token = H_TOKEN,
                    .token_len = strlen(H_TOKEN), .backoff_max_ms = 200};
  int rc = tsr_rpc_ctx_new(&c->ctx, &c->loop, &o);
  for (int i = 0; !rc && i < n_ps; i++)
    rc = ps_client_new(&c->ps[i], c->ctx, c->ps_addr[i]);
  for (int i = 0; !rc && i < n_workers; i++)
    rc = tsr_rpc_client_new(&c->wk[i], c->ctx, c->wk_addr[i]);
  for (int i = 0; !rc && i < n_ps; i++) ps_client_set_deadline(c->ps[i], 10000);
  return rc;
}

static int closing;
static void on_closed(void *data) {
  (void)data;
  closing--;
}

int h_stop(h_cluster *c) {
  int bad = 0;
  for (int i = 0; i < c->n_workers; i++) {
    int st = h_kill(c->wk_pid[i], SIGTERM, 10000);
    if (c->wk_pid[i] > 0 && st != 0) {
      fprintf(stderr, "worker %d exited with %d after SIGTERM\n", i, st);
      bad = 1;
    }
  }
  /* a PS that holds this test's variables leaves an unfinished job: it
   * exits 1 (a supervisor would start it again), cleanly */
  for (int i = 0; i < c->n_ps; i++) {
    int st = h_kill(c->ps_pid[i], SIGTERM, 10000);
    if (c->ps_pid[i] > 0 && st != 0 && st != 1) {
      fprintf(stderr, "ps %d exited with %d after SIGTERM\n", i, st);
      bad = 1;
    }
  }
  for (int i = 0; i < c->n_ps; i++)
    if (c->ps[i]) {
      closing++;
      ps_client_close(c->ps[i], on_closed, NULL);
    }
  for (int i = 0; i < c->n_workers; i++)
    if (c->wk[i]) {
      closing++;
      tsr_rpc_client_close(c->wk[i], on_closed, NULL);
    }
  uint64_t end = tsr_now_ms() + 5000;
  while (closing > 0 && tsr_now_ms() < end) uv_run(&c->loop, UV_RUN_ONCE);
  uv_close((uv_handle_t *)&c->tick, NULL);
  uv_run(&c->loop, UV_RUN_DEFAULT);
  if (closing || tsr_rpc_ctx_free(c->ctx) != 0) bad = 1;
  if (uv_loop_close(&c->loop) != 0) {
    fprintf(stderr, "uv_loop_close failed: handles left open\n");
    bad = 1;
  }
  if (c->model) tsr_model_free(c->model);
  free(c->shards);
  free(c->job_text);
  tsr_job_free(&c->job);
  /* every process is gone: the ports may go to other tests */
  char err[256];
  test_ports_release((long)getpid(), c->ps_port, c->n_ps, err, sizeof err);
  test_ports_release((long)getpid(), c->wk_port, c->n_workers, err,
                     sizeof err);
  return bad;
}

void h_spin(h_cluster *c, int ms) {
  uint64_t end = tsr_now_ms() + (uint64_t)ms;
  while (tsr_now_ms() < end) uv_run(&c->loop, UV_RUN_ONCE);
}

int h_load_job(h_cluster *c, const char *path, const char *const *overrides,
               int parts) {
  char err[1024];
  int rc = tsr_job_load(path, overrides, &c->job, err, sizeof err);
  if (rc) {
    fprintf(stderr, "job %s: %s\n", path, err);
    return rc;
  }
  c->job_text = json_dumps(c->job.raw, JSON_COMPACT);
  wk_input *in = NULL;
  wk_input_opts io = {.worker_index = 0, .num_workers = 1,
                      .batch_size = c->job.batch_size, .epochs = 1};
  if ((rc = wk_input_open(&c->job, WK_SPLIT_TRAIN, &io, &in, err,
                          sizeof err)) ||
      (rc = tsr_model_from_job(&c->job, wk_input_get_schema(in), &c->model,
                              err, sizeof err))) {
    fprintf(stderr, "job %s: %s\n", path, err);
    if (in) wk_input_close(in);
    return rc;
  }
  wk_input_close(in);
  tsr_model_variables(c->model, &c->vars, &c->n_vars);
  tsr_partitioner p = c->job.partitioner;
  if (parts > 0) p = (tsr_partitioner){.kind = TSR_PART_FIXED,
                                       .num_shards = parts};
  /* dense "allreduce": the sparse tables only, indices mapped back */
  tsr_var sv[64];
  size_t map[64], k = 0;
  for (size_t v = 0; v < c->n_vars && v < 64; v++)
    if (!c->job.dense_allreduce || c->vars[v].kind == TSR_VAR_ROW_SPARSE) {
      sv[k] = c->vars[v];
      map[k++] = v;
    }
  c->group_epoch = 1;
  if (k == 0) return 0;
  if ((rc = tsr_partition_plan(&p, sv, NULL, k, c->n_ps, &c->shards,
                               &c->n_shards, err, sizeof err))) {
    fprintf(stderr, "partition: %s\n", err);
    return rc;
  }
  for (size_t i = 0; i < c->n_shards; i++)
    c->shards[i].var = (int)map[c->shards[i].var];
  return 0;
}

/* ---- calls ---------------------------------------------------------------- */

static void on_ps(const ps_result *r, void *data) {
  h_result *res = data;
  res->done = true;
  res->status = r->status;
  res->step = r->step;
  snprintf(res->msg, sizeof res->msg, "%s", r->message);
}

int h_wait(h_cluster *c, h_result *res, int timeout_ms) {
  uint64_t end = tsr_now_ms() + (uint64_t)timeout_ms;
  while (!res->done) {
    if (tsr_now_ms() > end) return TSR_ETIMEOUT;
    uv_run(&c->loop, UV_RUN_ONCE);
  }
  return res->status;
}

int h_create_vars(h_cluster *c, const char *mode) {
  for (int p = 0; p < c->n_ps; p++) {
    ps_var_spec specs[64];
    size_t n = 0;
    for (size_t i = 0; i < c->n_shards && n < 64; i++) {
      const tsr_shard *sh = &c->shards[i];
      if (sh->ps != p) continue;
      const tsr_var *vi = &c->vars[sh->var];
      ps_var_spec *s = &specs[n++];
      tsr_optim_spec vo;
      tsr_var_optimizer(vi, &c->job.optimizer, &vo);
      int rc = ps_var_spec_from_var(s, vi, sh, c->job.seed, &vo, NULL);
      if (rc) return rc;
    }
    h_result r = {0}, m = {0};
    int rc = ps_client_create(c->ps[p], specs, n, on_ps, &r);
    if (!rc) rc = h_wait(c, &r, 10000);
    if (rc) {
      fprintf(stderr, "create on ps:%d: %s\n", p, r.msg);
      return rc;
    }
    rc = ps_client_config(c->ps[p], mode, false, on_ps, &m);
    if (!rc) rc = h_wait(c, &m, 10000);
    if (rc) {
      fprintf(stderr, "config on ps:%d: %s\n", p, m.msg);
      return rc;
    }
  }
  return 0;
}

int h_pull_var(h_cluster *c, int v, float *out, int64_t *step) {
  const tsr_var *vi = &c->vars[v];
  for (size_t i = 0; i < c->n_shards; i++) {
    const tsr_shard *sh = &c->shards[i];
    if (sh->var != v) continue;
    h_result r = {0};
    float *dst = out + sh->row0 * vi->row_dim;
    int64_t *ids = NULL;
    int rc;
    if (vi->kind == TSR_VAR_ROW_SPARSE) {
      /* Every row of the shard (untouched ones read as initialized). */
      ids = malloc((size_t)sh->rows * sizeof *ids);
      if (!ids) return TSR_ENOMEM;
      for (int64_t k = 0; k < sh->rows; k++) ids[k] = sh->row0 + k;
      rc = ps_client_pull_rows(c->ps[sh->ps], vi->name, sh->shard, -1, 0, ids,
                               (size_t)sh->rows, dst, (size_t)vi->row_dim,
                               on_ps, &r);
    } else {
      rc = ps_client_pull(c->ps[sh->ps], vi->name, sh->shard, -1, 0, dst,
                          (size_t)(sh->rows * vi->row_dim), on_ps, &r);
    }
    if (!rc) rc = h_wait(c, &r, 10000);
    free(ids);
    if (rc) {
      fprintf(stderr, "pull %s shard %d: %s\n", vi->name, sh->shard, r.msg);
      return rc;
    }
    if (step) *step = r.step;
  }
  return 0;
}

static void on_call(const tsr_rpc_result *r, void *data) {
  h_result *res = data;
  res->done = true;
  res->status = r->status;
  snprintf(res->msg, sizeof res->msg, "%s", r->message);
  if (r->status == 0) {
    res->meta = malloc(r->meta_len ? r->meta_len : 1);
    if (res->meta && r->meta_len) memcpy(res->meta, r->meta, r->meta_len);
    res->meta_len = r->meta_len;
    res->payload_len = r->payload_len;
    if (r->payload_len && (res->payload = malloc(r->payload_len)))
      memcpy(res->payload, r->payload, r->payload_len);
    size_t max = r->payload_len / TSR_TRACE_WIRE_SIZE, n = 0;
    tsr_trace_event *ev = max ? malloc(max * sizeof *ev) : NULL;
    if (ev && tsr_trace_unpack(r->payload, r->payload_len, ev, max, &n) == 0)
      res->trace_events = n;
    free(ev);
  }
}

int h_call_start(h_cluster *c, int w, uint32_t method,
                 const ProtobufCMessage *req, h_result *res) {
  return h_call_start_payload(c, w, method, req, NULL, 0, res);
}

int h_call_start_payload(h_cluster *c, int w, uint32_t method,
                         const ProtobufCMessage *req, const void *payload,
                         size_t payload_len, h_result *res) {
  memset(res, 0, sizeof *res);
  size_t len = protobuf_c_message_get_packed_size(req);
  uint8_t *buf = malloc(len ? len : 1);
  if (!buf) return TSR_ENOMEM;
  protobuf_c_message_pack(req, buf);
  uv_buf_t pb = uv_buf_init((char *)(uintptr_t)payload,
                            (unsigned)payload_len);
  tsr_rpc_request rq = {.method = method, .meta = buf, .meta_len = len,
                        .deadline_ms = 60000};
  if (payload_len) {
    rq.payload = &pb;
    rq.npayload = 1;
  }
  int rc = tsr_rpc_call(c->wk[w], &rq, on_call, res);
  free(buf);
  return rc;
}

int h_call(h_cluster *c, int w, uint32_t method, const ProtobufCMessage *req,
           h_result *res, int timeout_ms) {
  int rc = h_call_start(c, w, method, req, res);
  if (rc) return rc;
  return h_wait(c, res, timeout_ms);
}

void h_result_free(h_result *res) {
  free(res->meta);
  free(res->payload);
  res->meta = NULL;
  res->payload = NULL;
}

int h_configure(h_cluster *c, int w, uint64_t run_id, uint32_t version,
                const char *job_text, h_result *res) {
  int rc = h_configure_start(c, w, run_id, version, job_text, res);
  return rc ? rc : h_wait(c, res, 30000);
}

int h_configure_start(h_cluster *c, int w, uint64_t run_id, uint32_t version,
                      const char *job_text, h_result *res) {
  Tessera__Worker__ConfigureRequest q =
      TESSERA__WORKER__CONFIGURE_REQUEST__INIT;
  Tessera__Worker__Shard sh[64], *shp[64];
  char *addrs[H_MAX_PROCS];
  char dir[1024];
  snprintf(dir, sizeof dir, "%s", c->job.path ? c->job.path : ".");
  q.run_id = run_id;
  q.format_version = version;
  q.worker_index = (uint32_t)w;
  q.num_workers = (uint32_t)c->n_workers;
  q.job_json = (char *)job_text;
  q.job_dir = dirname(dir);
  for (int i = 0; i < c->n_ps; i++) addrs[i] = c->ps_addr[i];
  q.n_ps_addrs = (size_t)c->n_ps;
  q.ps_addrs = addrs;
  for (size_t i = 0; i < c->n_shards && i < 64; i++) {
    tessera__worker__shard__init(&sh[i]);
    sh[i].var = (uint32_t)c->shards[i].var;
    sh[i].shard = (uint32_t)c->shards[i].shard;
    sh[i].num_shards = (uint32_t)c->shards[i].num_shards;
    sh[i].row0 = c->shards[i].row0;
    sh[i].rows = c->shards[i].rows;
    sh[i].ps = (uint32_t)c->shards[i].ps;
    shp[i] = &sh[i];
  }
  q.n_shards = c->n_shards - c->drop_shards;
  q.shards = shp;
  q.model_digest = "test";
  char *gaddrs[H_MAX_PROCS], *gnames[H_MAX_PROCS], names[H_MAX_PROCS][16];
  if (c->job.dense_allreduce) {
    for (int i = 0; i < c->n_workers; i++) {
      gaddrs[i] = c->wk_addr[i];
      snprintf(names[i], sizeof names[i], "worker:%d", i);
      gnames[i] = names[i];
    }
    q.n_group_addrs = q.n_group_names = (size_t)c->n_workers;
    q.group_addrs = gaddrs;
    q.group_names = gnames;
    q.group_rank = (uint32_t)w;
    q.group_epoch = c->group_epoch;
  }
  return h_call_start(c, w, WK_M_CONFIGURE, &q.base, res);
}

int h_configure_all(h_cluster *c, uint64_t run_id, int timeout_ms) {
  h_result r[H_MAX_PROCS];
  for (int w = 0; w < c->n_workers; w++)
    H_CHECK(h_configure_start(c, w, run_id, WK_FORMAT_VERSION, c->job_text,
                              &r[w]) == 0, "configure worker %d", w);
  for (int w = 0; w < c->n_workers; w++) {
    int rc = h_wait(c, &r[w], timeout_ms);
    H_CHECK(rc == 0, "configure worker %d for run %llu: %s: %s", w,
            (unsigned long long)run_id, tsr_err_name(rc), r[w].msg);
    h_result_free(&r[w]);
  }
  return 0;
}

int h_run_ring_start(h_cluster *c, int w, uint64_t id, int64_t steps,
                     uint32_t state_root, h_result *res) {
  Tessera__Worker__RunRequest q = TESSERA__WORKER__RUN_REQUEST__INIT;
  char *gaddrs[H_MAX_PROCS], *gnames[H_MAX_PROCS], names[H_MAX_PROCS][16];
  for (int i = 0; i < c->n_workers; i++) {
    gaddrs[i] = c->wk_addr[i];
    snprintf(names[i], sizeof names[i], "worker:%d", i);
    gnames[i] = names[i];
  }
  q.closure_id = id;
  q.steps = steps;
  q.n_group_addrs = q.n_group_names = (size_t)c->n_workers;
  q.group_addrs = gaddrs;
  q.group_names = gnames;
  q.group_rank = (uint32_t)w;
  q.group_epoch = c->group_epoch;
  q.state_root = state_root;
  return h_call_start(c, w, WK_M_RUN, &q.base, res);
}

int h_run_start(h_cluster *c, int w, uint64_t id, int64_t steps, bool trace,
                h_result *res) {
  Tessera__Worker__RunRequest q = TESSERA__WORKER__RUN_REQUEST__INIT;
  q.closure_id = id;
  q.steps = steps;
  q.trace = trace;
  return h_call_start(c, w, WK_M_RUN, &q.base, res);
}

const char *h_main_start(int argc, char **argv, const char *usage,
                         char *job_path, size_t len) {
  const char *src = getenv("TSR_SOURCE_DIR");
  if (argc != 2 || !src) {
    fprintf(stderr, "usage: %s (TSR_SOURCE_DIR, TSR_BUILD_DIR set)\n",
            usage);
    return NULL;
  }
  snprintf(job_path, len, "%s/tests/data/diabetes_job.json", src);
  signal(SIGPIPE, SIG_IGN);
  return src;
}

int h_dense(h_cluster *c, int w, float **out, size_t *n, int64_t *step) {
  Tessera__Worker__DenseRequest q = TESSERA__WORKER__DENSE_REQUEST__INIT;
  h_result r;
  *out = NULL;
  int rc = h_call(c, w, WK_M_DENSE, &q.base, &r, 30000);
  if (rc) {
    fprintf(stderr, "dense state of worker %d: %s\n", w, r.msg);
    h_result_free(&r);
    return rc;
  }
  Tessera__Worker__DenseResponse *d =
      tessera__worker__dense_response__unpack(NULL, r.meta_len, r.meta);
  if (!d) {
    h_result_free(&r);
    return TSR_EPROTO;
  }
  *step = d->step;
  tessera__worker__dense_response__free_unpacked(d, NULL);
  *out = (float *)(void *)r.payload;
  *n = r.payload_len / sizeof(float);
  r.payload = NULL;
  h_result_free(&r);
  return 0;
}

int h_dense_state(h_cluster *c, int w, h_result *res,
                  Tessera__Worker__DenseResponse **state) {
  Tessera__Worker__DenseRequest q = TESSERA__WORKER__DENSE_REQUEST__INIT;
  q.slots = true;
  *state = NULL;
  int rc = h_call(c, w, WK_M_DENSE, &q.base, res, 30000);
  if (rc) {
    fprintf(stderr, "dense state of worker %d: %s\n", w, res->msg);
    return rc;
  }
  *state = tessera__worker__dense_response__unpack(NULL, res->meta_len,
                                                   res->meta);
  return *state ? 0 : TSR_EPROTO;
}

int h_ring_break_start(h_cluster *c, int w, const char *why, h_result *res) {
  Tessera__Worker__RingBreakRequest q =
      TESSERA__WORKER__RING_BREAK_REQUEST__INIT;
  q.why = (char *)why;
  return h_call_start(c, w, WK_M_RING_BREAK, &q.base, res);
}

int h_dense_set_start(h_cluster *c, int w,
                      const Tessera__Worker__DenseResponse *state,
                      const void *payload, size_t payload_len, bool rewind,
                      h_result *res) {
  Tessera__Worker__DenseSetRequest q =
      TESSERA__WORKER__DENSE_SET_REQUEST__INIT;
  q.step = state->step;
  q.n_vars = state->n_vars;
  q.vars = state->vars;
  q.rewind = rewind;
  return h_call_start_payload(c, w, WK_M_DENSE_SET, &q.base, payload,
                              payload_len, res);
}
