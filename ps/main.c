/* tessera-ps: one parameter server of a Tessera cluster.
 *
 * Happy path: resolve the cluster (TF_CONFIG or --cluster/--task; the task
 * must be a ps), read the cluster token (--token-file or TESSERA_TOKEN),
 * make the service with every method registered, listen on this task's
 * port, serve until the shutdown method or SIGTERM/SIGINT, then close
 * everything and exit 0 when the chief's shutdown said the job is done (or
 * no job ever came).
 * Failure modes: a bad cluster spec, a missing token, an address that
 * cannot be bound, a bad flag: one line naming the problem, exit 2. Told
 * to leave (a signal, a shutdown without job_done) while it holds a job
 * that is not done: exit 1, so a supervisor starts it again. With
 * --idle-exit DURATION, no chief connected for that long: exit 0 (common/
 * idle.h).
 */
#include "common/arg.h"
#include "common/cluster.h"
#include "common/daemon.h"
#include "common/err.h"
#include "common/idle.h"
#include "common/log.h"
#include "common/memlimit.h"
#include "common/rpc/rpc.h"
#include "ps/ps.h"

#include <signal.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
  uv_loop_t loop;
  tsr_rpc_ctx *ctx;
  ps_server *srv;
  uv_signal_t sigterm, sigint;
  tsr_idle *idle;  /* --idle-exit, or NULL */
  int idle_left;   /* left because no chief was seen: exit 0 */
  int closing;
  int exit_code;
} ps_main;

static void usage(FILE *f, const void *data) {
  (void)data;
  fprintf(f,
          "usage: tessera-ps [--cluster FILE.json] [--task ps:INDEX]\n"
          "                  [--token-file FILE] [--memory-limit BYTES]\n"
          "                  [--listen HOST:PORT] [--mode async|ssp:S|sync]\n"
          "                  [--allow-nonfinite] [--checkpoint-root DIR]\n"
          "                  [--frame-mac on|off] [--idle-exit DURATION]\n"
          "  The cluster comes from TF_CONFIG unless --cluster is given; the\n"
          "  token from TESSERA_TOKEN unless --token-file is given.\n"
          "  --memory-limit takes a byte count with an optional K, M, G or T\n"
          "  suffix (default: 80%% of the cgroup's memory limit when there\n"
          "  is one, as in a container, else of the machine's memory).\n"
          "  --checkpoint-root: Save, Restore and initial values stay under\n"
          "  DIR (default: the folder the first configure names; the root\n"
          "  never moves after).\n"
          "  --frame-mac off (or TESSERA_FRAME_MAC=off) asks peers for frames\n"
          "  without a MAC, for a trusted network; used only where the peer\n"
          "  asks too.\n"
          "  --idle-exit DURATION (e.g. 10m): exit 0 when no chief has been\n"
          "  connected for that long (its job failed for good or was\n"
          "  deleted), instead of waiting for it for ever.\n");
}

/* --memory-limit: a byte count above 0, with an optional K, M, G or T
 * (and i, B) after it. */
static int parse_bytes(void *data, const char *flag, const char *s,
                       char *err, size_t errlen) {
  size_t *out = data;
  char *end;
  double v = strtod(s, &end);
  if (end == s || v < 0) goto bad;
  double mul = 1;
  switch (*end) {
    case 'k': case 'K': mul = 1024.0; end++; break;
    case 'm': case 'M': mul = 1024.0 * 1024; end++; break;
    case 'g': case 'G': mul = 1024.0 * 1024 * 1024; end++; break;
    case 't': case 'T': mul = 1024.0 * 1024 * 1024 * 1024; end++; break;
    default: break;
  }
  if (*end == 'i' || *end == 'B') end++;
  if (*end == 'B') end++;
  if (*end || (size_t)(v * mul) == 0) goto bad;
  *out = (size_t)(v * mul);
  return 0;
bad:
  snprintf(err, errlen, "%s \"%s\" is not a byte count (e.g. 8G)", flag, s);
  return TSR_EINVAL;
}

static void closed_all(void *data) {
  ps_main *m = data;
  m->srv = NULL;
}

static void begin_close(ps_main *m) {
  if (m->closing) return;
  m->closing = 1;
  if (m->exit_code == 0 && !m->idle_left && !ps_server_job_finished(m->srv)) {
    tsr_warn("leaving while the job is not done: exit status 1 (a "
             "supervisor starts this PS again)");
    m->exit_code = 1;
  }
  uv_close((uv_handle_t *)&m->sigterm, NULL);
  uv_close((uv_handle_t *)&m->sigint, NULL);
  tsr_idle_close(m->idle);
  m->idle = NULL;
  ps_server_close(m->srv, closed_all, m);
}

static void on_signal(uv_signal_t *h, int signum) {
  ps_main *m = h->data;
  tsr_info("signal %d: closing", signum);
  begin_close(m);
}

static void on_shutdown(ps_server *s, void *data) { begin_close(data); }

static void on_idle(void *data) {
  ps_main *m = data;
  m->idle_left = 1;
  begin_close(m);
}

int main(int argc, char **argv) {
  tsr_daemon_flags df = {0};
  const char *listen = NULL, *mode = NULL, *ckpt_root = NULL;
  double idle_secs = 0;
  size_t mem_limit = 0;
  int allow_nonfinite = 0;
  const tsr_arg opts[] = {
      TSR_DAEMON_ARGS(&df),
      TSR_ARG_CALL("memory-limit", parse_bytes, &mem_limit),
      TSR_ARG_STR("listen", &listen),
      TSR_ARG_STR("mode", &mode),
      TSR_ARG_FLAG("allow-nonfinite", &allow_nonfinite),
      TSR_ARG_STR("checkpoint-root", &ckpt_root),
      TSR_ARG_CALL("idle-exit", tsr_idle_arg, &idle_secs),
      TSR_ARG_END};
  static const tsr_arg_cmd cmd = {.name = "tessera-ps", .log = true,
                                  .usage = usage};
  tsr_log_init("ps");
  int rc = tsr_arg_parse(&cmd, opts, argc, argv, NULL);
  if (rc) return tsr_arg_status(rc);
  char mem_src[600] = "--memory-limit";
  if (!mem_limit) {
    uint64_t avail;
    tsr_mem_source src;
    char desc[512];
    tsr_mem_available("", 0, &avail, &src, desc, sizeof desc);
    mem_limit = (size_t)(avail / 10 * 8);
    snprintf(mem_src, sizeof mem_src, "80%% of %s, %" PRIu64 " bytes", desc,
             avail);
  }
  static const tsr_daemon_spec spec = {"tessera-ps", TSR_TASK_BIT(TSR_TASK_PS),
                                       TSR_TASK_BIT(TSR_TASK_PS), NULL};
  tsr_daemon d;
  char err[TSR_ERRBUF];
  if (tsr_daemon_start(&d, &spec, &df, err, sizeof err)) {
    tsr_error("%s", err);
    return 2;
  }
  const tsr_task_addr *me =
      tsr_cluster_find(&d.cluster, TSR_TASK_PS, d.cluster.task_index);
  char addr[300];
  if (listen)
    snprintf(addr, sizeof addr, "%s", listen);
  else
    tsr_task_listen_addr(me, addr, sizeof addr);
  char chief[sizeof me->addr] = "";
  const tsr_task_addr *ca = tsr_cluster_chief(&d.cluster);
  if (idle_secs > 0 && !ca) {
    tsr_error("--idle-exit: the cluster names no chief to wait for");
    tsr_daemon_free(&d);
    return 2;
  }
  if (ca) snprintf(chief, sizeof chief, "%s", ca->addr);

  ps_main m;
  memset(&m, 0, sizeof m);
  rc = uv_loop_init(&m.loop);
  if (rc) {
    tsr_error("uv_loop_init: %s", uv_strerror(rc));
    tsr_daemon_free(&d);
    return 1;
  }
  tsr_rpc_opts ro = {0};
  ro.name = d.task;
  ro.token = d.token;
  ro.token_len = d.token_len;
  ro.max_payload_bytes = 4ull << 30;
  ro.plain_frames = d.plain_frames;
  rc = tsr_rpc_ctx_new(&m.ctx, &m.loop, &ro);
  tsr_daemon_free(&d); /* the context keeps its copy of the token */
  if (rc) {
    tsr_error("rpc context: %s", tsr_strerror(rc));
    return 2;
  }
  ps_server_opts po = {0};
  po.memory_limit = mem_limit;
  po.allow_nonfinite = allow_nonfinite;
  po.mode = mode;
  po.checkpoint_root = ckpt_root;
  /* tests only: hold every save's writing while this file exists */
  po.test_save_gate = getenv("TESSERA_TEST_SAVE_GATE");
  po.on_shutdown = on_shutdown;
  po.data = &m;
  if ((rc = ps_server_new(&m.srv, m.ctx, &po))) {
    tsr_error("cannot start the service: %s", tsr_strerror(rc));
    return 2;
  }
  uv_signal_init(&m.loop, &m.sigterm);
  uv_signal_init(&m.loop, &m.sigint);
  m.sigterm.data = m.sigint.data = &m;
  uv_signal_start(&m.sigterm, on_signal, SIGTERM);
  uv_signal_start(&m.sigint, on_signal, SIGINT);
  if ((rc = ps_server_listen(m.srv, addr))) {
    tsr_error("cannot listen on %s: %s", addr, tsr_strerror(rc));
    m.exit_code = 2;
    begin_close(&m);
  } else {
    tsr_info("serving on %s (memory limit %zu bytes: %s)", addr, mem_limit,
             mem_src);
    if (idle_secs > 0 &&
        (rc = tsr_idle_start(&m.idle, m.ctx, chief, idle_secs, on_idle, &m))) {
      tsr_error("--idle-exit: cannot watch the chief at %s: %s", chief,
                tsr_strerror(rc));
      m.exit_code = 2;
      begin_close(&m);
    }
  }
  uv_run(&m.loop, UV_RUN_DEFAULT);
  if ((rc = tsr_rpc_ctx_free(m.ctx)))
    tsr_warn("rpc context still busy at exit: %s", tsr_strerror(rc));
  if ((rc = uv_loop_close(&m.loop)))
    tsr_warn("loop still has handles at exit: %s", uv_strerror(rc));
  return m.exit_code;
}
