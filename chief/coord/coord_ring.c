/* dense "allreduce": the ring of workers each closure runs in (coord_io.h).
 * Every closure names its ring: the workers ready now, in index order,
 * under an epoch. The epoch changes when that set changes (a worker lost,
 * one configured again) or when a member's closure failed (its ring broke
 * and stays broken until re-formed); a worker given a closure of a new
 * epoch re-forms the ring first, and every member takes the dense state
 * of `state_root`, the lowest member that holds the ring's trained state
 * (a worker that just came back holds none). So nothing is rewound: the
 * survivors go on from where they are, and a returning worker joins with
 * their state (Horovod Elastic's and TorchElastic's way).
 * Members' closures of one epoch must reach the same number of steps; a
 * member whose closure finds the others in another epoch fails it (its
 * steps go back) and its next closure is in the new one.
 */
#include "chief/coord/coord_io.h"
#include "common/log.h"
#include "worker.pb-c.h"
#include "worker/wire.h"

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A ready worker whose connection is up (a loss the machine has not heard
 * of yet, the failed closures coming first, keeps it out already), and
 * the worker the closure goes to. */
static bool coord_ring_member(const coord *co, int i, int w) {
  return coord_sm_wk_state(co->sm, i) == COORD_WK_READY &&
         (i == w || tsr_rpc_client_connected(co->wk[i].cli));
}

void coord__ring_lost(coord *co, int w) {
  co->wk[w].has_state = false;
  if (co->wk[w].in_ring) co->ring_dirty = true;
}

void coord__ring_configured(coord *co, int w) {
  /* before any closure every worker holds the initial (or restored)
   * state; later a configured worker is a fresh one */
  co->wk[w].has_state = !co->ring_started;
}

void coord__ring_failed(coord *co, int w, uint64_t epoch) {
  /* a closure of an older ring failing is expected (its ring is gone) */
  if (co->wk[w].in_ring && epoch == co->group_epoch) co->ring_dirty = true;
}

void coord__ring_done(coord *co, int w) { co->wk[w].has_state = true; }

static void coord_ring_on_break(const tsr_rpc_result *r, void *data) {
  intptr_t w = (intptr_t)data;
  if (r->status)
    tsr_debug("dense \"allreduce\": worker:%d did not take the ring break: "
              "%s", (int)w, r->message);
}

void coord__ring_break(coord *co, const char *why) {
  if (!co->job.dense_allreduce || !co->ring_started) return;
  co->ring_dirty = true;
  coord__note(co, TSR_LOG_INFO, "dense \"allreduce\": every worker's ring "
              "breaks now (%s): a closure waiting in an all-reduce ends at "
              "once", why);
  Tessera__Worker__RingBreakRequest q =
      TESSERA__WORKER__RING_BREAK_REQUEST__INIT;
  q.why = (char *)why;
  for (int i = 0; i < co->n_wk; i++)
    if (co->wk[i].cli && tsr_rpc_client_connected(co->wk[i].cli))
      coord__wk_send(co, i, WK_M_RING_BREAK, &q.base, NULL, 10000,
                     coord_ring_on_break, (void *)(intptr_t)i);
}

void coord__ring_free(char **strs) {
  if (!strs) return;
  for (char **p = strs; *p; p++) free(*p);
  free(strs);
}

int coord__ring_for(coord *co, int w, Tessera__Worker__RunRequest *req,
                    char ***strs) {
  *strs = NULL;
  int n = 0;
  bool same = !co->ring_dirty;
  for (int i = 0; i < co->n_wk; i++) {
    bool member = coord_ring_member(co, i, w);
    n += member;
    same = same && member == co->wk[i].in_ring;
  }
  if (!co->ring_started) {
    /* the first closures: the configure's ring (every worker, its epoch)
     * holds when every worker is ready */
    same = n == co->n_wk;
    co->ring_started = true;
    for (int i = 0; same && i < co->n_wk; i++) co->wk[i].in_ring = true;
  }
  if (!same) {
    co->group_epoch++;
    co->ring_dirty = false;
    for (int i = 0; i < co->n_wk; i++)
      co->wk[i].in_ring = coord_ring_member(co, i, w);
  }
  int root = -1, rank = -1, k = 0;
  for (int i = 0; i < co->n_wk; i++) {
    if (!co->wk[i].in_ring) continue;
    if (i == w) rank = k;
    if (root < 0 && co->wk[i].has_state) root = k;
    k++;
  }
  if (rank < 0) return TSR_EINVAL; /* dispatched to a worker not ready */
  if (!same && root < 0) {
    /* every worker that held the state is gone: the newest checkpoint's
     * (the steps since are not rewound, as a lost PS of an async run) */
    coord__dense_from_ckpt(co);
    for (int i = 0; i < co->n_wk; i++)
      if (co->wk[i].in_ring) co->wk[i].has_state = true;
    root = 0;
  }
  if (!same)
    coord__note(co, TSR_LOG_INFO, "dense \"allreduce\": the ring re-forms "
                "with %d worker(s) (group %" PRIu64 "), every one taking the "
                "dense state of %s", k, co->group_epoch,
                root >= 0 ? "its first member that trained"
                          : "none (no member holds one: the initial values)");
  char **flat = calloc((size_t)(2 * k + 1), sizeof *flat);
  if (!flat) return TSR_ENOMEM;
  int j = 0;
  for (int i = 0; i < co->n_wk; i++) {
    if (!co->wk[i].in_ring) continue;
    char nm[32];
    snprintf(nm, sizeof nm, "worker:%d", i);
    flat[j] = strdup(co->cluster.jobs[TSR_TASK_WORKER][i].addr);
    flat[k + j] = strdup(nm);
    if (!flat[j] || !flat[k + j]) {
      for (int x = 0; x < 2 * k; x++) free(flat[x]);
      free(flat);
      return TSR_ENOMEM;
    }
    j++;
  }
  req->group_addrs = flat;
  req->group_names = flat + k;
  req->n_group_addrs = req->n_group_names = (size_t)k;
  req->group_epoch = co->group_epoch;
  req->group_rank = (uint32_t)rank;
  req->state_root = (uint32_t)(root < 0 ? 0 : root);
  *strs = flat;
  return 0;
}
