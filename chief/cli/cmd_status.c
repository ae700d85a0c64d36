/* `tessera status`: asks every process of the cluster how it is, at once,
 * and prints one line per process (role, address, state, steps, rates) and
 * the run as the chief sees it. A process that does not answer within the
 * deadline is shown as down with the reason. Uses the cluster spec and the
 * token as every process does (TF_CONFIG or --cluster; TESSERA_TOKEN or
 * --token-file). Exit status: 0 when every process answered, 1 otherwise,
 * 2 for a bad spec or token. --probe asks one process only (a container's
 * liveness and readiness probe), by its role and address or its task.
 */
#include "chief.pb-c.h"
#include "chief/cli/cli.h"
#include "chief/wire.h"
#include "common/arg.h"
#include "common/cluster.h"
#include "common/err.h"
#include "common/log.h"
#include "common/rpc/rpc.h"
#include "ps.pb-c.h"
#include "ps/client/client.h"
#include "worker.pb-c.h"
#include "worker/wire.h"

#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What the chief said of one worker: since when and why it no longer runs
 * closures (lost, or left out). */
typedef struct {
  double left_s_ago;
  char why[160];
} st_view;

typedef struct {
  tsr_task_type type;
  int index;
  const char *addr;
  tsr_rpc_client *cli;
  ps_client *ps;
  bool done, ok;
  char line[768];
  int *pending;
  st_view *views; /* the chief's task: one per worker index */
  int n_views;
} st_task;

static void st_fmt_bytes(double b, char *buf, size_t len) {
  const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int i = 0;
  while (b >= 1024 && i < 4) {
    b /= 1024;
    i++;
  }
  snprintf(buf, len, "%.1f %s", b, u[i]);
}

/* A chief's or a worker's answer, unpacked with `desc`; NULL, with the
 * task's line saying why, when it failed or does not decode. */
static ProtobufCMessage *st_answer(st_task *t, const tsr_rpc_result *r,
                                   const ProtobufCMessageDescriptor *desc) {
  t->done = true;
  (*t->pending)--;
  if (r->status) {
    snprintf(t->line, sizeof t->line, "down     %s", r->message);
    return NULL;
  }
  ProtobufCMessage *m =
      protobuf_c_message_unpack(desc, NULL, r->meta_len, r->meta);
  if (!m) {
    snprintf(t->line, sizeof t->line, "?        answer does not decode");
    return NULL;
  }
  t->ok = true;
  return m;
}

static void st_on_chief(const tsr_rpc_result *r, void *data) {
  st_task *t = data;
  Tessera__Chief__StatusResponse *s = (Tessera__Chief__StatusResponse *)
      st_answer(t, r, &tessera__chief__status_response__descriptor);
  if (!s) return;
  char ck[32] = "none";
  if (s->last_checkpoint_step >= 0)
    snprintf(ck, sizeof ck, "%" PRId64, s->last_checkpoint_step);
  int n = snprintf(t->line, sizeof t->line,
                   "%-8s step %" PRId64 "/%" PRId64 ", %.0f ex/s, loss %.4g, "
                   "last checkpoint %s, up %.0f s", s->phase, s->step,
                   s->total_steps, s->examples_per_sec, s->loss, ck,
                   s->uptime_s);
  if (s->waiting && s->waiting[0] && n > 0 && (size_t)n < sizeof t->line)
    snprintf(t->line + n, sizeof t->line - (size_t)n, "; waiting for %s",
             s->waiting);
  for (size_t i = 0; i < s->n_workers && t->views; i++) {
    const Tessera__Chief__TaskStatus *w = s->workers[i];
    int idx;
    if (!w->task || sscanf(w->task, "worker:%d", &idx) != 1 || idx < 0 ||
        idx >= t->n_views || w->left_s_ago <= 0)
      continue;
    t->views[idx].left_s_ago = w->left_s_ago;
    snprintf(t->views[idx].why, sizeof t->views[idx].why, "%s",
             w->left_why ? w->left_why : "");
  }
  tessera__chief__status_response__free_unpacked(s, NULL);
}

static void st_on_worker(const tsr_rpc_result *r, void *data) {
  st_task *t = data;
  Tessera__Worker__StatusResponse *s = (Tessera__Worker__StatusResponse *)
      st_answer(t, r, &tessera__worker__status_response__descriptor);
  if (!s) return;
  /* dense "allreduce": what went through the ring */
  char ar[96] = "";
  if (s->allreduce_ops > 0) {
    char b[32];
    st_fmt_bytes((double)s->allreduce_bytes, b, sizeof b);
    snprintf(ar, sizeof ar, ", all-reduce %s in %" PRIu64 " buckets, %.2f s",
             b, s->allreduce_ops, s->allreduce_s);
  }
  snprintf(t->line, sizeof t->line,
           "%-8s %" PRId64 " steps, %.0f ex/s, %s%s%s%s", s->state, s->steps,
           s->examples_per_sec, s->device && *s->device ? s->device : "-", ar,
           s->last_error && *s->last_error ? ", last error: " : "",
           s->last_error ? s->last_error : "");
  tessera__worker__status_response__free_unpacked(s, NULL);
}

static void st_on_ps(const ps_result *r, void *data) {
  st_task *t = data;
  t->done = true;
  (*t->pending)--;
  if (r->status || !r->stats) {
    snprintf(t->line, sizeof t->line, "down     %s", r->message);
    return;
  }
  const Tessera__Ps__StatsResponse *s = r->stats;
  t->ok = true;
  char in[32], out[32], mem[32];
  st_fmt_bytes((double)s->bytes_in, in, sizeof in);
  st_fmt_bytes((double)s->bytes_out, out, sizeof out);
  st_fmt_bytes((double)s->mem_used, mem, sizeof mem);
  snprintf(t->line, sizeof t->line,
           "up       %zu shards, %" PRIu64 " applies (%.3f ms each), in %s, "
           "out %s, memory %s, mode %s", s->n_shards, s->applies,
           s->applies ? (double)s->apply_ns / 1e6 / (double)s->applies : 0.0,
           in, out, mem, s->mode ? s->mode : "?");
  if (s->mode && strncmp(s->mode, "ssp:", 4) == 0) {
    size_t l = strlen(t->line);
    snprintf(t->line + l, sizeof t->line - l, ", max read lead %" PRId64,
             s->max_read_lead);
  }
}

static void st_closed(void *data) { (void)data; }

/* Sends the task its status call (a PS: its statistics). */
static void st_ask(st_task *t, tsr_rpc_ctx *ctx) {
  snprintf(t->line, sizeof t->line, "down     no answer");
  int rc;
  if (t->type == TSR_TASK_PS) {
    rc = ps_client_new(&t->ps, ctx, t->addr);
    if (!rc) rc = ps_client_stats(t->ps, st_on_ps, t);
  } else {
    rc = tsr_rpc_client_new(&t->cli, ctx, t->addr);
    if (!rc) {
      uint8_t meta[1];
      tsr_rpc_request req;
      memset(&req, 0, sizeof req);
      req.method = t->type == TSR_TASK_CHIEF ? CHIEF_M_STATUS : WK_M_STATUS;
      req.meta = meta;
      req.meta_len = 0;
      rc = tsr_rpc_call(t->cli, &req,
                        t->type == TSR_TASK_CHIEF ? st_on_chief : st_on_worker,
                        t);
    }
  }
  if (rc)
    snprintf(t->line, sizeof t->line, "down     %s", tsr_strerror(rc));
  else
    (*t->pending)++;
}

/* --probe ROLE@HOST:PORT (the process at that address, e.g. a container's
 * own ps@localhost:2222) or --probe TYPE:INDEX (the cluster's task): one
 * task; its address from the spec or the text. 0 and the task's line, or
 * -1 with a message. */
static int st_probe_task(const char *spec, const tsr_cluster *c, st_task *t,
                         char *addr, size_t cap, char *err, size_t errlen) {
  const char *at = strchr(spec, '@');
  char role[16];
  size_t rl = at ? (size_t)(at - spec) : strcspn(spec, ":");
  if (rl == 0 || rl >= sizeof role) goto bad;
  memcpy(role, spec, rl);
  role[rl] = 0;
  tsr_task_type ty = tsr_task_type_parse(role);
  if (ty != TSR_TASK_CHIEF && ty != TSR_TASK_PS && ty != TSR_TASK_WORKER)
    goto bad;
  t->type = ty;
  if (at) {
    tsr_task_addr a;
    if (tsr_addr_parse(at + 1, &a, err, errlen)) return -1;
    snprintf(addr, cap, "%s", at + 1);
    t->index = -1;
  } else {
    char *end;
    long i = spec[rl] == ':' ? strtol(spec + rl + 1, &end, 10) : -1;
    const tsr_task_addr *a =
        i >= 0 && !*end ? tsr_cluster_find(c, ty, (int)i) : NULL;
    if (!a) {
      snprintf(err, errlen, "--probe %s: no such task in the cluster", spec);
      return -1;
    }
    snprintf(addr, cap, "%s", a->addr);
    t->index = (int)i;
  }
  t->addr = addr;
  return 0;
bad:
  snprintf(err, errlen, "--probe %s: expected ROLE@HOST:PORT or ROLE:INDEX "
           "(ROLE chief, ps or worker)", spec);
  return -1;
}

/* One task, one line; exit status 0 when it answered. */
static int st_probe(const char *spec, const char *file, tsr_rpc_ctx *ctx,
                    uv_loop_t *loop) {
  char err[TSR_ERRBUF], addr[TSR_RPC_ADDR_MAX + 272];
  tsr_cluster c;
  tsr_cluster_init(&c);
  if (!strchr(spec, '@') && tsr_cluster_load(file, NULL, &c, err, sizeof err)) {
    fprintf(stderr, "tessera status: %s\n", err);
    return 2;
  }
  int pending = 0;
  st_task t;
  memset(&t, 0, sizeof t);
  t.pending = &pending;
  if (st_probe_task(spec, &c, &t, addr, sizeof addr, err, sizeof err)) {
    fprintf(stderr, "tessera status: %s\n", err);
    tsr_cluster_free(&c);
    return 2;
  }
  st_ask(&t, ctx);
  while (pending > 0 && uv_run(loop, UV_RUN_ONCE)) {
  }
  printf("%s %s %s\n", spec, t.addr, t.line);
  if (t.cli) tsr_rpc_client_close(t.cli, st_closed, NULL);
  if (t.ps) ps_client_close(t.ps, st_closed, NULL);
  tsr_cluster_free(&c);
  return t.ok ? 0 : 1;
}

static void usage(FILE *f, const void *data) {
  (void)data;
  fprintf(f, "usage: tessera status [--cluster FILE.json] [--token-file F] "
             "[--timeout S]\n"
             "       tessera status --probe ROLE@HOST:PORT|ROLE:INDEX "
             "[--token-file F] [--timeout S]\n"
             "  --probe asks one process (a liveness or readiness probe: "
             "ps@localhost:2222);\n"
             "  exit 0 when it answers within the timeout, 1 otherwise\n");
}

int chief_cmd_status(int argc, char **argv) {
  const char *file = NULL, *token_file = NULL, *probe = NULL;
  double timeout_s = 3;
  const tsr_arg opts[] = {
      TSR_ARG_STR("cluster", &file), TSR_ARG_STR("token-file", &token_file),
      TSR_ARG_NUM_ABOVE("timeout", &timeout_s, 0, 3600),
      TSR_ARG_STR("probe", &probe), TSR_ARG_END};
  static const tsr_arg_cmd cmd = {.name = "tessera status", .usage = usage};
  int rc = tsr_arg_parse(&cmd, opts, argc, argv, NULL);
  if (rc) return tsr_arg_status(rc);
  char err[TSR_ERRBUF];
  tsr_cluster c;
  tsr_cluster_init(&c);
  if (!probe && tsr_cluster_load(file, NULL, &c, err, sizeof err)) {
    fprintf(stderr, "tessera status: %s\n", err);
    return 2;
  }
  char token[TSR_RPC_TOKEN_MAX];
  size_t tlen;
  if (tsr_rpc_token_load(token_file, token, sizeof token, &tlen, err,
                         sizeof err)) {
    fprintf(stderr, "tessera status: %s\n", err);
    tsr_cluster_free(&c);
    return 2;
  }
  tsr_log_set_level(TSR_LOG_ERROR);
  uv_loop_t loop;
  uv_loop_init(&loop);
  tsr_rpc_opts ro;
  memset(&ro, 0, sizeof ro);
  ro.name = "status";
  ro.token = token;
  ro.token_len = tlen;
  ro.default_deadline_ms = (uint32_t)(timeout_s * 1000);
  ro.handshake_timeout_ms = (uint32_t)(timeout_s * 1000);
  if (tsr_rpc_frame_mac_setting(NULL, &ro.plain_frames, err, sizeof err)) {
    fprintf(stderr, "tessera status: %s\n", err);
    tsr_cluster_free(&c);
    return 2;
  }
  tsr_rpc_ctx *ctx;
  if (tsr_rpc_ctx_new(&ctx, &loop, &ro)) {
    tsr_cluster_free(&c);
    return 2;
  }
  if (probe) {
    int prc = st_probe(probe, file, ctx, &loop);
    uv_run(&loop, UV_RUN_DEFAULT);
    tsr_rpc_ctx_free(ctx);
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_loop_close(&loop);
    return prc;
  }
  int total = 0;
  for (int t = 0; t < TSR_TASK__COUNT; t++) total += c.n[t];
  st_task *tasks = calloc((size_t)total, sizeof *tasks);
  int n_wk = c.n[TSR_TASK_WORKER];
  st_view *views = calloc(n_wk > 0 ? (size_t)n_wk : 1, sizeof *views);
  if (!views) {
    free(tasks);
    tasks = NULL;
  }
  int pending = 0, k = 0;
  static const tsr_task_type order[] = {TSR_TASK_CHIEF, TSR_TASK_PS,
                                        TSR_TASK_WORKER, TSR_TASK_EVALUATOR};
  for (int o = 0; o < 4 && tasks; o++) {
    tsr_task_type ty = order[o];
    for (int i = 0; i < c.n[ty]; i++, k++) {
      st_task *t = &tasks[k];
      t->type = ty;
      t->index = c.jobs[ty][i].index;
      t->addr = c.jobs[ty][i].addr;
      t->pending = &pending;
      if (ty == TSR_TASK_CHIEF) {
        t->views = views;
        t->n_views = n_wk;
      }
      if (ty == TSR_TASK_EVALUATOR) {
        snprintf(t->line, sizeof t->line, "-        (evaluators answer no "
                 "status)");
        t->done = true;
        continue;
      }
      st_ask(t, ctx);
    }
  }
  while (pending > 0 && uv_run(&loop, UV_RUN_ONCE)) {
  }
  int down = 0;
  printf("%-10s %-24s %s\n", "TASK", "ADDRESS", "STATE");
  for (int i = 0; i < total && tasks; i++) {
    char name[32];
    snprintf(name, sizeof name, "%s:%d", tsr_task_type_name(tasks[i].type),
             tasks[i].index);
    printf("%-10s %-24s %s", name, tasks[i].addr, tasks[i].line);
    /* the chief's word on a worker that no longer runs closures */
    if (tasks[i].type == TSR_TASK_WORKER && tasks[i].index >= 0 &&
        tasks[i].index < n_wk && views[tasks[i].index].left_s_ago > 0)
      printf(" (chief: no closures for it since %.1f s ago: %s)",
             views[tasks[i].index].left_s_ago, views[tasks[i].index].why);
    printf("\n");
    if (!tasks[i].ok && tasks[i].type != TSR_TASK_EVALUATOR) down++;
    if (tasks[i].cli) tsr_rpc_client_close(tasks[i].cli, st_closed, NULL);
    if (tasks[i].ps) ps_client_close(tasks[i].ps, st_closed, NULL);
  }
  uv_run(&loop, UV_RUN_DEFAULT);
  tsr_rpc_ctx_free(ctx);
  uv_run(&loop, UV_RUN_DEFAULT);
  uv_loop_close(&loop);
  free(tasks);
  free(views);
  tsr_cluster_free(&c);
  return down ? 1 : 0;
}
