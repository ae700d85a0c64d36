/* The checkpoint folders' own disk work, off the chief's loop: making a
 * checkpoint's folder (emptying one left from before, fsync) and removing
 * a failed or pruned one (a materialized model's checkpoint is gigabytes:
 * unlinking it, or an fsync while the PS write theirs, takes seconds, and
 * a loop that stalls that long is taken for dead by every peer).
 *
 * Happy path: jobs run on libuv's pool one at a time, in the order they
 * were asked for (a folder removed, then made again for the same step,
 * never the other way round); a made folder's callback then runs on the
 * loop. The queue runs to its end even while the chief stops (its
 * teardown runs the loop until no request is left).
 * Failure modes: a folder that cannot be made goes to the callback with
 * its error; a removal that fails is logged, naming the folder.
 * A test hook (TESSERA_TEST_FOLDER_GATE) holds the making of folders, so
 * a test can lose a PS while a checkpoint's folder is being made.
 */
#include "chief/coord/coord_io.h"
#include "common/err.h"
#include "common/list.h"
#include "common/log.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct coord_fs_job {
  coord_fs_job *next;
  uv_work_t work;
  coord *co;
  bool make;               /* make the folder, else remove it */
  int64_t step;
  char why[32];            /* a removal's reason, for the log */
  void (*done)(coord *co, int rc, const char *err, void *data);
  void *data;
  int rc;
  char err[512];
};

static void coord_fs_next(coord *co);

/* The test hook (chief_coord_opts.test_folder_gate): while the gate
 * exists, and the step written in it (none: 0) is at most `step`, says it
 * holds the folder of step `step` (<gate>.held, the step in it), then
 * waits while the gate exists. */
static void coord_fs_gate(const char *gate, int64_t step) {
  char held[4096];
  if (snprintf(held, sizeof held, "%s.held", gate) >= (int)sizeof held) return;
  FILE *g = fopen(gate, "r");
  if (!g) return;
  long long from = 0;
  if (fscanf(g, "%lld", &from) != 1) from = 0;
  fclose(g);
  if (step < from) return;
  FILE *f = fopen(held, "w");
  if (f) {
    fprintf(f, "%" PRId64 "\n", step);
    fclose(f);
  }
  while (access(gate, F_OK) == 0) usleep(20000);
}

static void coord_fs_work(uv_work_t *w) {
  coord_fs_job *j = w->data;
  const char *root = j->co->job.checkpoint_dir;
  if (j->make && j->co->o->test_folder_gate)
    coord_fs_gate(j->co->o->test_folder_gate, j->step);
  j->rc = j->make ? chief_ckpt_prepare(root, j->step, j->err, sizeof j->err)
                  : chief_ckpt_remove(root, j->step, j->err, sizeof j->err);
}

static void coord_fs_after(uv_work_t *w, int status) {
  coord_fs_job *j = w->data;
  coord *co = j->co;
  int rc = status ? status : j->rc;
  if (status) snprintf(j->err, sizeof j->err, "%s", uv_strerror(status));
  co->fs_head = j->next;
  if (!co->fs_head) co->fs_tail = NULL;
  co->fs_running = false;
  if (j->make) {
    j->done(co, rc, j->err, j->data);
  } else if (rc) {
    tsr_warn("removing the checkpoint of step %" PRId64 " (%s): %s", j->step,
             j->why, j->err);
  } else {
    tsr_debug("removed the checkpoint of step %" PRId64 " (%s)", j->step,
              j->why);
  }
  free(j);
  coord_fs_next(co);
}

static void coord_fs_next(coord *co) {
  coord_fs_job *j = co->fs_head;
  if (!j || co->fs_running) return;
  j->work.data = j;
  int rc = uv_queue_work(&co->loop, &j->work, coord_fs_work, coord_fs_after);
  if (rc) { /* cannot happen with a live loop; answered as failed */
    co->fs_running = true;
    coord_fs_after(&j->work, rc);
    return;
  }
  co->fs_running = true;
}

static void coord_fs_push(coord *co, coord_fs_job *j) {
  j->co = co;
  tsr_fifo_append(co->fs_head, co->fs_tail, j);
  coord_fs_next(co);
}

void coord__fs_prepare(coord *co, int64_t step,
                       void (*done)(coord *co, int rc, const char *err,
                                    void *data),
                       void *data) {
  coord_fs_job *j = calloc(1, sizeof *j);
  if (!j) {
    done(co, TSR_ENOMEM, "out of memory", data);
    return;
  }
  j->make = true;
  j->step = step;
  j->done = done;
  j->data = data;
  coord_fs_push(co, j);
}

void coord__fs_remove(coord *co, int64_t step, const char *why) {
  coord_fs_job *j = calloc(1, sizeof *j);
  if (!j) {
    tsr_warn("removing the checkpoint of step %" PRId64 " (%s): out of "
             "memory", step, why);
    return;
  }
  j->step = step;
  snprintf(j->why, sizeof j->why, "%s", why);
  coord_fs_push(co, j);
}
