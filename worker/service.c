/* The worker's RPC service on the loop thread: answers the chief's
 * configure, run, eval, status and shutdown calls (worker/wire.h).
 *
 * Happy path: configure, run and eval become jobs for the training thread
 * (loop.c), which hands each back through the wake handle; the loop packs
 * the answer and replies. Status and shutdown are answered here at once, as
 * is a configure that repeats the current run id (a chief that reconnects).
 * The same wake handle carries the thread's requests to (re)connect to the
 * PS (pscomm.c).
 * Failure modes: a chief of another format version (TSR_EVERSION naming
 * both), a job the thread fails (its code and message, forwarded), an
 * answer that does not fit the chief's limits (answered with the error).
 * Shutdown (signal or method): queued jobs are answered TSR_ESHUTDOWN, the
 * thread stops after its step, PS clients and the server close, the thread
 * is joined, the last handles close and the loop ends with nothing open.
 */
#include "worker/service.h"
#include "worker/loop_int.h"

#include "common/arg.h"
#include "common/daemon.h"
#include "common/err.h"
#include "common/idle.h"
#include "common/log.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void wk__svc_wake(wk_svc *s) { uv_async_send(&s->wake); }

/* ---- answers ------------------------------------------------------------ */

static void reply_msg(tsr_rpc_incoming *call, const ProtobufCMessage *m) {
  size_t len = protobuf_c_message_get_packed_size(m);
  uint8_t *buf = malloc(len ? len : 1);
  if (!buf) {
    tsr_rpc_reply_error(call, TSR_ENOMEM, "worker: out of memory for the answer");
    return;
  }
  protobuf_c_message_pack(m, buf);
  int rc = tsr_rpc_reply(call, buf, len, NULL, 0, NULL, NULL);
  free(buf);
  if (rc < 0) tsr_rpc_reply_error(call, rc, "worker: answer over the limits");
}

static void payload_sent(int status, void *data) {
  (void)status;
  free(data);
}

/* An answer with the job's payload (a closure's trace events, the dense
 * values); the buffer leaves the job and is freed once written. */
static void reply_with_payload(wk_job *j, const ProtobufCMessage *m) {
  size_t len = protobuf_c_message_get_packed_size(m);
  uint8_t *buf = malloc(len ? len : 1);
  if (!buf) {
    tsr_rpc_reply_error(j->call, TSR_ENOMEM, "worker: out of memory");
    return;
  }
  protobuf_c_message_pack(m, buf);
  uv_buf_t b = uv_buf_init((char *)j->trace, (unsigned)j->trace_len);
  int rc = tsr_rpc_reply(j->call, buf, len, &b, 1, payload_sent, j->trace);
  free(buf);
  if (rc < 0) {
    tsr_rpc_reply_error(j->call, rc, "worker: answer over the limits");
    return;
  }
  j->trace = NULL; /* now owned by payload_sent */
  j->trace_len = 0;
}

static void answer_job(wk_svc *s, wk_job *j) {
  if (j->rc < 0) {
    tsr_warn("%s failed: %s",
             j->kind == WK_JOB_CONFIGURE ? "configure"
             : j->kind == WK_JOB_RUN     ? "closure"
             : j->kind == WK_JOB_EVAL    ? "eval"
             : j->kind == WK_JOB_DENSE   ? "dense state"
                                         : "taking a dense state",
             j->err);
    tsr_rpc_reply_error(j->call, j->rc, j->err);
    return;
  }
  switch (j->kind) {
    case WK_JOB_CONFIGURE: {
      const Tessera__Worker__ConfigureRequest *q = j->call->request;
      free(s->cfg_device);
      free(s->cfg_summary);
      s->cfg_device = strdup(j->out.cfg.device);
      s->cfg_summary = strdup(j->out.cfg.model_summary);
      s->cfg_examples = j->out.cfg.examples;
      s->cfg_run_id = s->cfg_device && s->cfg_summary ? q->run_id : 0;
      reply_msg(j->call, &j->out.cfg.base);
      break;
    }
    case WK_JOB_RUN:
      if (j->trace_len) {
        reply_with_payload(j, &j->out.run.base);
        break;
      }
      reply_msg(j->call, &j->out.run.base);
      break;
    case WK_JOB_EVAL: reply_msg(j->call, &j->out.eval.base); break;
    case WK_JOB_DENSE: reply_with_payload(j, &j->out.dense.base); break;
    case WK_JOB_DENSE_SET: reply_msg(j->call, &j->out.dense_set.base); break;
  }
}

static void try_finish_close(wk_svc *s);

static void on_wake(uv_async_t *h) {
  wk_svc *s = h->data;
  for (;;) {
    pthread_mutex_lock(&s->mu);
    tsr_list *n = tsr_list_first(&s->done);
    if (n) {
      tsr_list_remove(n);
      s->queued--;
    }
    pthread_mutex_unlock(&s->mu);
    if (!n) break;
    wk_job *j = tsr_list_entry(n, wk_job, node);
    answer_job(s, j);
    wk__job_free(j);
  }
  wk__ps_issue(s);
  if (s->closing) try_finish_close(s);
}

static void enqueue(wk_svc *s, tsr_rpc_incoming *call, wk_job_kind kind) {
  if (s->closing) {
    tsr_rpc_reply_error(call, TSR_ESHUTDOWN, "worker: shutting down");
    return;
  }
  wk_job *j = calloc(1, sizeof *j);
  if (!j) {
    tsr_rpc_reply_error(call, TSR_ENOMEM, "worker: out of memory");
    return;
  }
  j->kind = kind;
  j->call = call;
  pthread_mutex_lock(&s->mu);
  tsr_list_push_back(&s->jobs, &j->node);
  s->queued++;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

/* ---- handlers ----------------------------------------------------------- */

static void h_configure(tsr_rpc_incoming *call, void *data) {
  wk_svc *s = data;
  const Tessera__Worker__ConfigureRequest *q = call->request;
  if (q->format_version != WK_FORMAT_VERSION) {
    char msg[256];
    snprintf(msg, sizeof msg,
             "%s: the chief speaks worker format_version %u, this worker %d "
             "(rebuild one of them from the same release)", s->role,
             q->format_version, WK_FORMAT_VERSION);
    tsr_rpc_reply_error(call, TSR_EVERSION, msg);
    return;
  }
  pthread_mutex_lock(&s->mu);
  bool same = s->cfg_run_id != 0 && s->cfg_run_id == q->run_id &&
              s->run_id == q->run_id;
  uint64_t cur = s->run_id;
  pthread_mutex_unlock(&s->mu);
  if (!same && cur && cur != q->run_id && s->coll) {
    /* a new chief's run: the old run's ring is over. A closure of it may
     * be waiting on a member that will never post its part (that member
     * took this configure first); break the ring on every member now, or
     * this configure would queue behind that wait (the ring's timeout) */
    char why[128];
    snprintf(why, sizeof why, "run %llu is over: the chief configures run "
             "%llu", (unsigned long long)cur, (unsigned long long)q->run_id);
    tsr_coll_abort(s->coll, TSR_ECANCELED, why);
  }
  if (same) {
    Tessera__Worker__ConfigureResponse r =
        TESSERA__WORKER__CONFIGURE_RESPONSE__INIT;
    r.device = s->cfg_device;
    r.examples = s->cfg_examples;
    r.model_summary = s->cfg_summary;
    reply_msg(call, &r.base);
    return;
  }
  s->cfg_run_id = 0;
  tsr_info("configure for run %llu from %s (%s), model %s",
           (unsigned long long)q->run_id, call->peer_name, call->peer,
           q->model_digest && q->model_digest[0] ? q->model_digest : "-");
  enqueue(s, call, WK_JOB_CONFIGURE);
}

static void h_run(tsr_rpc_incoming *call, void *data) {
  enqueue(data, call, WK_JOB_RUN);
}

static void h_eval(tsr_rpc_incoming *call, void *data) {
  enqueue(data, call, WK_JOB_EVAL);
}

static void h_dense(tsr_rpc_incoming *call, void *data) {
  enqueue(data, call, WK_JOB_DENSE);
}

static void h_dense_set(tsr_rpc_incoming *call, void *data) {
  wk_svc *s = data;
  const Tessera__Worker__DenseSetRequest *q = call->request;
  if (q->rewind && s->coll) {
    /* the run rewinds: the ring's steps since are void. A closure of it
     * may wait on a member that has none left (the chief gives none until
     * every member took this state): break the ring on every member now,
     * or this state would queue behind that wait */
    char why[160];
    snprintf(why, sizeof why, "the run rewinds to the dense state of %lld "
             "optimizer applies (the chief restores a checkpoint)",
             (long long)q->step);
    tsr_coll_abort(s->coll, TSR_ECANCELED, why);
  }
  enqueue(s, call, WK_JOB_DENSE_SET);
}

static void h_ring_break(tsr_rpc_incoming *call, void *data) {
  wk_svc *s = data;
  const Tessera__Worker__RingBreakRequest *q = call->request;
  if (s->coll) {
    char why[200];
    snprintf(why, sizeof why, "the chief broke the ring: %.150s",
             q->why && q->why[0] ? q->why : "no reason given");
    tsr_coll_abort(s->coll, TSR_ECANCELED, why);
  }
  Tessera__Worker__RingBreakResponse r =
      TESSERA__WORKER__RING_BREAK_RESPONSE__INIT;
  reply_msg(call, &r.base);
}

static void h_status(tsr_rpc_incoming *call, void *data) {
  wk_svc *s = data;
  Tessera__Worker__StatusResponse r = TESSERA__WORKER__STATUS_RESPONSE__INIT;
  char state[16], device[32], last[WK_ERR_MAX];
  pthread_mutex_lock(&s->mu);
  snprintf(state, sizeof state, "%s", s->state);
  snprintf(device, sizeof device, "%s", s->device);
  snprintf(last, sizeof last, "%s", s->last_error);
  r.run_id = s->run_id;
  r.steps = s->steps;
  r.examples_per_sec = s->ex_per_sec;
  pthread_mutex_unlock(&s->mu);
  r.role = s->role;
  r.state = state;
  r.device = device;
  r.last_error = last;
  if (s->coll) { /* the ring's own figures (loop thread) */
    tsr_coll_stats cs;
    tsr_coll_get_stats(s->coll, &cs);
    r.allreduce_bytes = cs.allreduce_floats * sizeof(float);
    r.allreduce_s = (double)cs.op_ns / 1e9;
    r.allreduce_ops = cs.ops;
  }
  reply_msg(call, &r.base);
}

static void start_close(wk_svc *s, int code);

static void on_shutdown_written(int status, void *data) {
  wk_svc *s = data;
  tsr_info("shutdown asked by the chief");
  start_close(s, 0);
}

static void h_shutdown(tsr_rpc_incoming *call, void *data) {
  wk_svc *s = data;
  Tessera__Worker__ShutdownResponse r =
      TESSERA__WORKER__SHUTDOWN_RESPONSE__INIT;
  uint8_t buf[16];
  size_t len = tessera__worker__shutdown_response__pack(&r, buf);
  if (tsr_rpc_reply(call, buf, len, NULL, 0, on_shutdown_written, s) < 0) {
    tsr_rpc_reply_error(call, TSR_EINVAL, "worker: cannot answer");
    start_close(s, 0);
  }
}

/* ---- shutdown ----------------------------------------------------------- */

static void on_handle_closed(uv_handle_t *h) {
  wk_svc *s = h->data;
  s->handles_open--;
}

static void on_server_closed(void *data) {
  wk_svc *s = data;
  s->srv = NULL;
  try_finish_close(s);
}

static void on_coll_closed(void *data) {
  wk_svc *s = data;
  s->coll_closed = true;
  try_finish_close(s);
}

static void try_finish_close(wk_svc *s) {
  if (s->wake_closed) return;
  if (s->thread_started) {
    pthread_mutex_lock(&s->mu);
    bool exited = s->thread_exited;
    bool idle = tsr_list_empty(&s->done);
    pthread_mutex_unlock(&s->mu);
    if (!exited || !idle) return;
    pthread_join(s->thread, NULL);
    s->thread_started = false;
  }
  /* the collective's methods stay on the server until it has closed */
  if (s->coll && (!s->coll_closed || s->srv)) return;
  tsr_coll_free(s->coll);
  s->coll = NULL;
  wk__ps_close_all(s);
  s->wake_closed = true;
  uv_close((uv_handle_t *)&s->wake, on_handle_closed);
}

static void start_close(wk_svc *s, int code) {
  if (s->closing) return;
  s->closing = true;
  s->exit_code = code;
  tsr_idle_close(s->idle);
  s->idle = NULL;
  uv_close((uv_handle_t *)&s->sig_term, on_handle_closed);
  uv_close((uv_handle_t *)&s->sig_int, on_handle_closed);
  /* Queued jobs will never run. */
  pthread_mutex_lock(&s->mu);
  tsr_list list;
  tsr_list_init(&list);
  for (tsr_list *n; (n = tsr_list_first(&s->jobs));) {
    tsr_list_remove(n);
    tsr_list_push_back(&list, n);
  }
  s->stop = true;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
  tsr_list_foreach_safe(n, tmp, &list) {
    wk_job *j = tsr_list_entry(n, wk_job, node);
    tsr_rpc_reply_error(j->call, TSR_ESHUTDOWN, "worker: shutting down");
    pthread_mutex_lock(&s->mu);
    s->queued--;
    pthread_mutex_unlock(&s->mu);
    wk__job_free(j);
  }
  s->closing_ps = true;
  wk__ps_cancel(s); /* calls in flight fail: the thread moves on */
  if (s->coll) tsr_coll_close(s->coll, on_coll_closed, s); /* the ring too */
  if (s->srv) tsr_rpc_server_close(s->srv, on_server_closed, s);
  try_finish_close(s);
}

static void on_idle(void *data) { start_close(data, 0); }

static void on_signal(uv_signal_t *h, int signum) {
  wk_svc *s = h->data;
  tsr_info("signal %d: shutting down", signum);
  start_close(s, 0);
}

/* ---- main --------------------------------------------------------------- */

static void usage(FILE *f, const void *data) {
  (void)data;
  fprintf(f,
          "usage: tessera-worker [--cluster FILE.json] [--task worker:N]\n"
          "                      [--token-file FILE] [--device auto|cpu|gpu]\n"
          "                      [--ps-deadline-ms MS] [--listen HOST:PORT]\n"
          "                      [--frame-mac on|off] [--idle-exit DURATION]\n"
          "  The cluster comes from TF_CONFIG unless --cluster is given; the\n"
          "  token from TESSERA_TOKEN unless --token-file is given.\n"
          "  --idle-exit DURATION (e.g. 10m): exit 0 when no chief has been\n"
          "  connected for that long (its job failed for good or was deleted).\n"
          "  tessera-worker --standalone --job JOB.json trains in one process.\n");
}

int wk_service_selected(int argc, char **argv) {
  for (int i = 1; i < argc; i++)
    if (strcmp(argv[i], "--standalone") == 0) return 0;
  return 1;
}

static int register_all(wk_svc *s) {
  const tsr_rpc_method ms[] = {
      {WK_M_CONFIGURE, "configure", h_configure, s,
       &tessera__worker__configure_request__descriptor, NULL, NULL},
      {WK_M_RUN, "run", h_run, s, &tessera__worker__run_request__descriptor,
       NULL, NULL},
      {WK_M_EVAL, "eval", h_eval, s,
       &tessera__worker__eval_request__descriptor, NULL, NULL},
      {WK_M_STATUS, "status", h_status, s,
       &tessera__worker__status_request__descriptor, NULL, NULL},
      {WK_M_SHUTDOWN, "shutdown", h_shutdown, s,
       &tessera__worker__shutdown_request__descriptor, NULL, NULL},
      {WK_M_DENSE, "dense", h_dense, s,
       &tessera__worker__dense_request__descriptor, NULL, NULL},
      {WK_M_DENSE_SET, "dense_set", h_dense_set, s,
       &tessera__worker__dense_set_request__descriptor, NULL, NULL},
      {WK_M_RING_BREAK, "ring_break", h_ring_break, s,
       &tessera__worker__ring_break_request__descriptor, NULL, NULL},
  };
  for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) {
    int rc = tsr_rpc_server_register_method(s->srv, &ms[i]);
    if (rc) return rc;
  }
  return 0;
}

typedef struct {
  tsr_daemon_flags d;
  const char *listen;
  kern_device device;
  long deadline_ms;
  double idle_secs;
} wk_flags;

/* 0, or the exit status: 0 after --help, 2 after a bad flag. */
static int parse_flags(int argc, char **argv, wk_flags *f) {
  const tsr_arg opts[] = {
      TSR_DAEMON_ARGS(&f->d),
      TSR_ARG_CHOICE("device", &f->device, kern_device_names),
      TSR_ARG_INT("ps-deadline-ms", &f->deadline_ms, 1, 86400000),
      TSR_ARG_STR("listen", &f->listen),
      TSR_ARG_CALL("idle-exit", tsr_idle_arg, &f->idle_secs),
      TSR_ARG_END};
  static const tsr_arg_cmd cmd = {.name = "tessera-worker", .usage = usage};
  return tsr_arg_parse(&cmd, opts, argc, argv, NULL);
}

/* The daemon's cluster moves into the service. */
static void setup(wk_svc *s, tsr_daemon *d, const wk_flags *f) {
  s->cluster = d->cluster;
  tsr_cluster_init(&d->cluster);
  s->task_index = s->cluster.task_index;
  snprintf(s->role, sizeof s->role, "%s", d->task);
  s->kopts.device = f->device;
  s->kopts.cpu_threads = 1;
  s->ps_deadline_ms = (uint32_t)f->deadline_ms;
}

int wk_service_main(int argc, char **argv) {
  wk_flags f = {.device = KERN_DEVICE_AUTO, .deadline_ms = 60000};
  int rc = parse_flags(argc, argv, &f);
  if (rc) return tsr_arg_status(rc);
  tsr_log_init("worker");
  char err[WK_ERR_MAX];
  wk_svc *s = calloc(1, sizeof *s);
  uv_loop_t loop;
  if (!s) return 1;
  tsr_cluster_init(&s->cluster);
  tsr_list_init(&s->jobs);
  tsr_list_init(&s->done);
  snprintf(s->state, sizeof s->state, "idle");
  static const tsr_daemon_spec spec = {
      "tessera-worker", TSR_TASK_BIT(TSR_TASK_WORKER),
      TSR_TASK_BIT(TSR_TASK_WORKER), NULL};
  tsr_daemon d;
  if ((rc = tsr_daemon_start(&d, &spec, &f.d, err, sizeof err))) {
    tsr_error("%s", err);
    tsr_daemon_free(&d);
    tsr_cluster_free(&s->cluster);
    free(s);
    return 2;
  }
  setup(s, &d, &f);
  const tsr_task_addr *me =
      tsr_cluster_find(&s->cluster, TSR_TASK_WORKER, s->task_index);
  char listen_addr[300];
  if (f.listen)
    snprintf(listen_addr, sizeof listen_addr, "%s", f.listen);
  else
    tsr_task_listen_addr(me, listen_addr, sizeof listen_addr);

  int code = 1;
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->cv, NULL);
  uv_loop_init(&loop);
  s->loop = &loop;
  /* fail_fast: a call to a PS known to be down fails at once, so a
   * closure fails promptly and the chief can start the PS recovery (ssp,
   * sync; in async the PS client sends it again until the PS is back and
   * restored: ps_kv's wait_lost); reconnects are retried at least every
   * 250 ms, so the calls waiting for a PS started again go on within a
   * quarter second of it (with 1 s they waited half a second on average;
   * a refused connect costs next to nothing). */
  tsr_rpc_opts ro = {.name = s->role, .token = d.token,
                     .token_len = d.token_len, .fail_fast = 1,
                     .backoff_max_ms = 250, .plain_frames = d.plain_frames};
  rc = tsr_rpc_ctx_new(&s->rpc, &loop, &ro);
  tsr_daemon_free(&d); /* the context keeps its copy of the token */
  if (rc) {
    tsr_error("cannot make the RPC context: %s", tsr_strerror(rc));
    goto out_loop;
  }
  uv_async_init(&loop, &s->wake, on_wake);
  s->wake.data = s;
  uv_signal_init(&loop, &s->sig_term);
  uv_signal_init(&loop, &s->sig_int);
  s->sig_term.data = s->sig_int.data = s;
  s->handles_open = 3;
  uv_signal_start(&s->sig_term, on_signal, SIGTERM);
  uv_signal_start(&s->sig_int, on_signal, SIGINT);

  if (pthread_create(&s->thread, NULL, wk__thread_main, s) != 0) {
    tsr_error("cannot start the training thread");
    start_close(s, 1);
    goto run;
  }
  s->thread_started = true;
  /* the ring among the workers (dense "allreduce"): its operations wait
   * as long as a PS call would */
  tsr_coll_opts co = {.op_timeout_ms = s->ps_deadline_ms,
                      .configure_timeout_ms = s->ps_deadline_ms};
  if ((rc = tsr_rpc_server_new(&s->srv, s->rpc)) || (rc = register_all(s)) ||
      (rc = tsr_coll_new(&s->coll, s->rpc, s->srv, &co))) {
    tsr_error("cannot make the RPC server: %s", tsr_strerror(rc));
    start_close(s, 1);
    goto run;
  }
  if ((rc = tsr_rpc_server_listen(s->srv, listen_addr))) {
    tsr_error("cannot listen on %s: %s", listen_addr, tsr_strerror(rc));
    start_close(s, 1);
    goto run;
  }
  tsr_info("listening on %s (%s)", listen_addr, me->addr);
  if (f.idle_secs > 0) {
    const tsr_task_addr *chief = tsr_cluster_chief(&s->cluster);
    if (!chief || chief == me) {
      tsr_error("--idle-exit: the cluster names no chief to wait for");
      start_close(s, 2);
    } else if ((rc = tsr_idle_start(&s->idle, s->rpc, chief->addr,
                                    f.idle_secs, on_idle, s))) {
      tsr_error("--idle-exit: cannot watch the chief at %s: %s", chief->addr,
                tsr_strerror(rc));
      start_close(s, 2);
    }
  }
run:
  uv_run(&loop, UV_RUN_DEFAULT);
  code = s->exit_code;
  if (s->handles_open != 0 || s->srv || s->ps_closing) {
    tsr_error("loop ended with handles open");
    code = 1;
  }
  if (tsr_rpc_ctx_free(s->rpc) != 0) code = 1;
out_loop:
  if (uv_loop_close(&loop) != 0) {
    tsr_error("loop closed with handles open");
    code = 1;
  }
  pthread_cond_destroy(&s->cv);
  pthread_mutex_destroy(&s->mu);
  free(s->cfg_device);
  free(s->cfg_summary);
  tsr_cluster_free(&s->cluster);
  free(s);
  return code;
}
