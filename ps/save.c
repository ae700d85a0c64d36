/* Save: a checkpoint of every shard this PS holds, written while applies
 * go on.
 *
 * Happy path. A SNAP op per shard joins the shard's queue as a write, so
 * it comes after the writes queued before the Save (every push answered
 * before it is in the snapshot) and runs on the loop with no apply
 * running: it takes the shard's snapshot (snap.c) and attaches it, so the
 * shard's writers keep the rows they change. When every shard is
 * snapshotted, one job on the pool writes them one after the other
 * (ckpt.c; one at a time: the disk takes them sequentially best, and the
 * pool's other threads stay free for applies), releasing each snapshot as
 * soon as its file is written; then an UNSNAP op per shard detaches it.
 * A plain Save answers when every file is written. A background Save
 * answers once every shard is snapshotted, and SaveWait answers with the
 * files (or the error) once they are written: the chief of a sync or ssp
 * run resumes training at the step boundary the snapshots hold without
 * waiting for the disk.
 * Failure modes: a second Save while one is being written (TSR_EBUSY), a
 * snapshot that cannot be taken (memory: the save fails, nothing is
 * written), a snapshot lost for want of memory while its file is written
 * or a write that fails (the save fails naming the file; training is
 * untouched), SaveWait for a checkpoint this PS is not saving
 * (TSR_ENOTFOUND: it restarted since), the server closing (waiters are
 * answered TSR_ESHUTDOWN).
 *
 * A test hook (ps_server_opts.test_save_gate): while that file exists the
 * writing waits before each shard, so a test can hold a save in progress
 * without depending on how fast the disk is.
 */
#include "ps/svc_int.h"
#include "common/err.h"
#include "common/fs.h"
#include "common/log.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- answers ---------------------------------------------------------- */

static void save_reply(ps_server *s, tsr_rpc_incoming *call,
                       const ps_batch *b, bool files) {
  if (b->rc) {
    tsr_rpc_reply_error(call, b->rc, b->err);
    return;
  }
  Tessera__Ps__SaveResponse m = TESSERA__PS__SAVE_RESPONSE__INIT;
  m.shards = files ? b->count : (int32_t)b->n;
  m.bytes = files ? b->bytes : 0;
  m.checkpoint_id = (char *)b->who.id;
  m.incremental = b->incremental;
  size_t nf = files ? b->n_files : 0;
  Tessera__Ps__SavedFile *f = ps__calloc(&s->mem, nf, sizeof *f);
  Tessera__Ps__SavedFile **fp = ps__calloc(&s->mem, nf, sizeof *fp);
  if (!f || !fp) {
    tsr_rpc_reply_error(call, TSR_ENOMEM, "out of memory listing the files "
                        "saved");
  } else {
    for (size_t i = 0; i < nf; i++) {
      tessera__ps__saved_file__init(&f[i]);
      f[i].name = (char *)b->files[i].name;
      f[i].bytes = b->files[i].bytes;
      f[i].crc32c = b->files[i].crc32c;
      fp[i] = &f[i];
    }
    m.n_files = nf;
    m.files = fp;
    ps__reply_msg(s, call, &m.base);
  }
  ps__free(&s->mem, f);
  ps__free(&s->mem, fp);
}

static void save_forget(ps_server *s, ps_batch *b) {
  if (s->save == b) s->save = NULL;
  ps__batch_free(s, b);
}

/* ---- the request -------------------------------------------------------- */

void ps__on_save(tsr_rpc_incoming *call, void *data) {
  ps_server *s = data;
  Tessera__Ps__SaveRequest *r = call->request;
  char msg[1200], path[PS_PATH_MAX];
  int rc = ps__ckpt_request(s, call, "save", r->dir, r->checkpoint_id,
                            r->step, path, sizeof path);
  if (rc) return;
  if (s->save && s->save->phase < 2) {
    snprintf(msg, sizeof msg, "save: checkpoint \"%s\" of step %" PRId64
             " is still being written here; one save at a time",
             s->save->who.id, s->save->who.step);
    tsr_rpc_reply_error(call, TSR_EBUSY, msg);
    return;
  }
  if ((rc = tsr_mkdir_p(path, 0755, NULL, 0))) {
    snprintf(msg, sizeof msg, "save: cannot create %s: %s", path,
             uv_strerror(rc));
    tsr_rpc_reply_error(call, rc, msg);
    return;
  }
  size_t n = (size_t)s->n_ents;
  ps_batch *b = ps__ckpt_batch(s, call, n, path, r->checkpoint_id, r->step);
  if (!b) return;
  if (!(b->files = ps__calloc(&s->mem, n, sizeof *b->files)) ||
      !(b->snaps = ps__calloc(&s->mem, n, sizeof *b->snaps))) {
    ps__batch_free(s, b);
    tsr_rpc_reply_error(call, TSR_ENOMEM, "out of memory");
    return;
  }
  b->verify = r->verify;
  b->background = r->background;
  if (r->since_id && strlen(r->since_id) > PS_CKPT_ID_MAX) {
    ps__batch_free(s, b);
    snprintf(msg, sizeof msg, "save: since_id \"%.80s\" is longer than %d "
             "bytes", r->since_id, PS_CKPT_ID_MAX);
    tsr_rpc_reply_error(call, TSR_EINVAL, msg);
    return;
  }
  snprintf(b->since, sizeof b->since, "%s", r->since_id ? r->since_id : "");
  if (s->save) save_forget(s, s->save); /* the last one's result goes */
  s->save = b;
  ps__batch_each_entry(s, b, PS_OP_SNAP, 0, "save");
  ps__batch_done(s, b);
}

void ps__on_save_wait(tsr_rpc_incoming *call, void *data) {
  ps_server *s = data;
  Tessera__Ps__SaveWaitRequest *r = call->request;
  const char *id = r->checkpoint_id ? r->checkpoint_id : "";
  ps_batch *b = s->save;
  if (!b || !b->background || strcmp(b->who.id, id)) {
    char msg[300];
    snprintf(msg, sizeof msg, "save_wait: no save of checkpoint \"%.80s\" "
             "here (the parameter server restarted since, or was never "
             "asked)", id);
    tsr_rpc_reply_error(call, TSR_ENOTFOUND, msg);
    return;
  }
  if (b->phase == 2) {
    save_reply(s, call, b, true);
    return;
  }
  if (b->n_waiters == b->cap_waiters) {
    size_t nc = b->cap_waiters ? b->cap_waiters * 2 : 4;
    tsr_rpc_incoming **w = ps__realloc(&s->mem, b->waiters,
                                       b->cap_waiters * sizeof *w,
                                       nc * sizeof *w);
    if (!w) {
      tsr_rpc_reply_error(call, TSR_ENOMEM, "out of memory");
      return;
    }
    b->waiters = w;
    b->cap_waiters = nc;
  }
  b->waiters[b->n_waiters++] = call;
}

/* ---- snapshots ---------------------------------------------------------- */

void ps__save_op(ps_server *s, ps_op *op) {
  ps_batch *b = op->batch;
  ps_entry *e = op->e;
  if (op->kind == PS_OP_UNSNAP) {
    ps__snap_drop(e->sh);
  } else if (!b->rc) { /* SNAP: after a failure the others take none */
    char err[512];
    ps_snap *v = NULL;
    int rc = ps__snap_take(e->sh, &s->mem, &v, err, sizeof err);
    if (!rc && ps_var_spec_sparse(&e->spec)) {
      /* the rows changed since the last save become this save's mark; an
       * increment holds those since b->since */
      uint64_t *sel;
      size_t words, bytes;
      int inc = ps__dirty_capture(e->sh, &s->mem, b->who.id, b->since, &sel,
                                  &words, &bytes);
      if (inc == 1) {
        ps__snap_select(v, sel, words, bytes);
        b->incremental = true;
      } else if (inc < 0) {
        rc = tsr_errf(err, sizeof err, inc, "%s shard %d: no room for the map "
                      "of the rows changed since checkpoint \"%s\"",
                      e->spec.var.name, e->spec.shard.shard, b->since);
      }
    }
    if (!rc && (rc = ps__snap_attach(e->sh, v, err, sizeof err))) {
      ps__snap_free(v);
      v = NULL;
    }
    if (rc && v) {
      ps__snap_free(v);
      v = NULL;
    }
    if (rc) {
      b->rc = rc;
      snprintf(b->err, sizeof b->err, "save: %s", err);
    }
    b->snaps[op->idx] = v;
  }
  ps__free(&s->mem, op);
  ps__dispatch(s, e);
  if (b) ps__batch_done(s, b);
}

/* An UNSNAP for every shard snapshotted, ahead of what is queued. */
static void save_unsnap_all(ps_server *s, ps_batch *b) {
  for (size_t i = 0; i < b->n; i++) {
    if (!b->snaps[i]) continue;
    b->snaps[i] = NULL;
    ps_op *op = ps__calloc(&s->mem, 1, sizeof *op);
    if (!op) /* it stays attached, released (writers keep nothing): the
              * next snapshot, a swap or the shard's end drops it */
      continue;
    op->srv = s;
    op->e = b->ents[i];
    op->kind = PS_OP_UNSNAP;
    ps__enqueue(s, op, true);
  }
}

/* ---- writing ------------------------------------------------------------ */

static double save_clock(clockid_t id) {
  struct timespec t;
  clock_gettime(id, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void save_work(uv_work_t *w) {
  ps_batch *b = w->data;
  double t0 = save_clock(CLOCK_MONOTONIC),
         c0 = save_clock(CLOCK_THREAD_CPUTIME_ID);
  if (!b->srv->ckpt_stage) /* NULL still works: buffers of each file */
    b->srv->ckpt_stage = tsr_shardfile_stage_new();
  const char *gate = b->gate[0] ? b->gate : NULL;
  for (size_t i = 0; i < b->n; i++) {
    while (gate && access(gate, F_OK) == 0) usleep(20000);
    ps_snap *v = b->snaps[i];
    if (!b->rc) {
      const ps_snap_info *in = ps__snap_info(v);
      ps_ckpt_file *f = &b->files[b->n_files];
      b->rc = ps__ckpt_save_snap(v, b->dir, &b->who, b->srv->ckpt_stage,
                                 b->verify, f, b->err, sizeof b->err);
      if (!b->rc) {
        b->n_files++;
        b->count++;
        b->bytes += (uint64_t)in->n_rows * (uint64_t)in->width *
                    (uint64_t)(1 + in->nslots) * 4;
      }
    }
    ps__snap_release(v); /* its writers keep nothing more */
  }
  /* the blocks the rows were kept in stay for the next checkpoint, as
   * many as were out at once (keep.c): fresh pages would cost a fault
   * and a zeroing each again. (The allocator's free memory is no longer
   * trimmed here: the kept rows are not in it, and what is, the answers'
   * buffers, was faulted in again by the next pulls.) */
  ps__keep_trim(&b->srv->mem);
  b->write_s = save_clock(CLOCK_MONOTONIC) - t0;
  b->write_cpu_s = save_clock(CLOCK_THREAD_CPUTIME_ID) - c0;
}

/* The writing is over (status: the pool's own failure to run it). */
static void save_finish(ps_server *s, ps_batch *b, int status) {
  if (status && !b->rc) {
    b->rc = status;
    snprintf(b->err, sizeof b->err, "save: %s", uv_strerror(status));
  }
  b->phase = 2;
  save_unsnap_all(s, b);
  if (b->rc)
    tsr_warn("checkpoint \"%s\" of step %" PRId64 " not saved: %s",
             b->who.id, b->who.step, b->err);
  else /* what a checkpoint costs here, beside the applies it slows */
    tsr_info("checkpoint \"%s\" of step %" PRId64 ": %zu file(s), %.1f MB "
             "written in %.2f s, %.2f s of CPU", b->who.id, b->who.step,
             b->n_files, (double)b->bytes / 1e6, b->write_s, b->write_cpu_s);
  if (!b->background) {
    save_reply(s, b->call, b, true);
    save_forget(s, b);
  } else {
    for (size_t i = 0; i < b->n_waiters; i++)
      save_reply(s, b->waiters[i], b, true);
    b->n_waiters = 0;
  }
  ps__maybe_finish(s);
}

static void save_written(uv_work_t *w, int status) {
  ps_batch *b = w->data;
  b->srv->works--;
  save_finish(b->srv, b, status);
}

void ps__save_snapped(ps_server *s, ps_batch *b) {
  if (b->rc) {
    save_unsnap_all(s, b);
    b->phase = 2;
    tsr_rpc_reply_error(b->call, b->rc, b->err);
    save_forget(s, b);
    return;
  }
  b->phase = 1;
  b->srv = s;
  if (s->opts.test_save_gate)
    snprintf(b->gate, sizeof b->gate, "%s", s->opts.test_save_gate);
  if (b->background) {
    save_reply(s, b->call, b, false);
    b->call = NULL;
  }
  b->work.data = b;
  s->works++;
  int rc = uv_queue_work(s->loop, &b->work, save_work, save_written);
  if (rc) {
    s->works--;
    for (size_t i = 0; i < b->n; i++) ps__snap_release(b->snaps[i]);
    save_finish(s, b, rc);
  }
}

void ps__save_close(ps_server *s) {
  ps_batch *b = s->save;
  if (b && b->phase < 2) return; /* a save being written ends on its own */
  tsr_shardfile_stage_free(s->ckpt_stage);
  s->ckpt_stage = NULL;
  if (!b) return;
  for (size_t i = 0; i < b->n_waiters; i++)
    tsr_rpc_reply_error(b->waiters[i], TSR_ESHUTDOWN,
                        "the parameter server is shutting down");
  b->n_waiters = 0;
  save_forget(s, b);
}
