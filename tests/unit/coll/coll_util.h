/* Helpers of the collective tests and benchmark: a group of ranks on one
 * loop (each with its own RPC context, server and collective, listening
 * on 127.0.0.1), completion records, and the reference sums in the ring's
 * documented order. */
#ifndef TSR_TEST_COLL_UTIL_H
#define TSR_TEST_COLL_UTIL_H

#include "common/clock.h"
#include "common/coll/coll.h"
#include "common/err.h"
#include "common/rpc/rpc.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CU_TOKEN "coll-test-token"
#define CU_MAX 8

typedef struct {
  int done;
  int status;
  char msg[TSR_COLL_ERR_MAX];
} cu_rec;

static inline void cu_rec_cb(int status, const char *message, void *data) {
  cu_rec *r = data;
  r->done++;
  r->status = status;
  snprintf(r->msg, sizeof r->msg, "%s", message);
}

static inline void cu_guard(uv_timer_t *t) { *(int *)t->data = 1; }

/* Runs the loop until every rec in recs[0..n) is done or timeout_ms
 * passed; returns non-zero when all are done. */
static inline int cu_run(uv_loop_t *loop, cu_rec *recs, int n,
                         unsigned timeout_ms) {
  uv_timer_t guard;
  int expired = 0;
  uv_timer_init(loop, &guard);
  guard.data = &expired;
  uv_timer_start(&guard, cu_guard, timeout_ms, 0);
  for (;;) {
    int all = 1;
    for (int i = 0; i < n; i++) all &= recs[i].done > 0;
    if (all || expired) break;
    uv_run(loop, UV_RUN_ONCE);
  }
  uv_close((uv_handle_t *)&guard, NULL);
  uv_run(loop, UV_RUN_NOWAIT);
  int all = 1;
  for (int i = 0; i < n; i++) all &= recs[i].done > 0;
  return all;
}

/* Small segments, so that modest sizes span many of them; the rest as
 * the defaults. */
static inline tsr_coll_opts cu_small_opts(void) {
  tsr_coll_opts o;
  memset(&o, 0, sizeof o);
  o.segment_bytes = 4096;
  return o;
}

/* One rank's endpoint. */
typedef struct {
  tsr_rpc_ctx *ctx;
  tsr_rpc_server *srv;
  tsr_coll *coll;
  char addr[64];
  char name[32];
  bool open;
} cu_rank;

typedef struct {
  uv_loop_t *loop;
  int n;
  cu_rank r[CU_MAX];
  const char *addrs[CU_MAX];
  const char *names[CU_MAX];
} cu_group;

static inline int cu_rank_open(cu_rank *k, uv_loop_t *loop, int i,
                               const tsr_coll_opts *o) {
  tsr_rpc_opts ro;
  memset(&ro, 0, sizeof ro);
  snprintf(k->name, sizeof k->name, "worker:%d", i);
  ro.name = k->name;
  ro.token = CU_TOKEN;
  ro.token_len = strlen(CU_TOKEN);
  int rc = tsr_rpc_ctx_new(&k->ctx, loop, &ro);
  if (!rc) rc = tsr_rpc_server_new(&k->srv, k->ctx);
  if (!rc) rc = tsr_coll_new(&k->coll, k->ctx, k->srv, o);
  if (!rc) rc = tsr_rpc_server_listen(k->srv, "127.0.0.1:0");
  if (rc) return rc;
  snprintf(k->addr, sizeof k->addr, "127.0.0.1:%d",
           tsr_rpc_server_port(k->srv));
  k->open = true;
  return 0;
}

static inline int cu_open(cu_group *g, uv_loop_t *loop, int n,
                          const tsr_coll_opts *o) {
  memset(g, 0, sizeof *g);
  g->loop = loop;
  g->n = n;
  for (int i = 0; i < n; i++) {
    int rc = cu_rank_open(&g->r[i], loop, i, o);
    if (rc) return rc;
    g->addrs[i] = g->r[i].addr;
    g->names[i] = g->r[i].name;
  }
  return 0;
}

static inline void cu_count(void *data) { (*(int *)data)++; }

/* Closes one rank: collective, then server, then context. */
static inline void cu_rank_close(uv_loop_t *loop, cu_rank *k) {
  if (!k->open) return;
  int n = 0;
  tsr_coll_close(k->coll, cu_count, &n);
  while (n < 1) uv_run(loop, UV_RUN_ONCE);
  tsr_rpc_server_close(k->srv, cu_count, &n);
  while (n < 2) uv_run(loop, UV_RUN_ONCE);
  tsr_coll_free(k->coll);
  tsr_rpc_ctx_free(k->ctx);
  k->open = false;
}

static inline void cu_close(cu_group *g) {
  for (int i = 0; i < g->n; i++) cu_rank_close(g->loop, &g->r[i]);
  uv_run(g->loop, UV_RUN_NOWAIT);
}

/* Configures ranks [0, members) of g as a group of `members`, with the
 * member list g->addrs; statuses in recs. */
static inline int cu_configure(cu_group *g, uint64_t epoch, int members,
                               cu_rec *recs) {
  memset(recs, 0, sizeof *recs * (size_t)members);
  for (int i = 0; i < members; i++) {
    tsr_coll_group gr = {epoch, i, members, g->addrs, g->names, 0};
    int rc = tsr_coll_configure(g->r[i].coll, &gr, cu_rec_cb, &recs[i]);
    if (rc) return rc;
  }
  return cu_run(g->loop, recs, members, 20000) ? 0 : TSR_ETIMEOUT;
}

/* Whole reads and writes on a pipe or blocking socket: 0, or -1. */
static inline int cu_read_all(int fd, void *p, size_t n) {
  uint8_t *b = p;
  while (n) {
    ssize_t r = read(fd, b, n);
    if (r <= 0) return -1;
    b += r;
    n -= (size_t)r;
  }
  return 0;
}

static inline int cu_write_all(int fd, const void *p, size_t n) {
  const uint8_t *b = p;
  while (n) {
    ssize_t w = write(fd, b, n);
    if (w <= 0) return -1;
    b += w;
    n -= (size_t)w;
  }
  return 0;
}

/* Initializes `loop` and forms a group of n ranks on it with options o
 * as group `epoch`: 0 when every rank's configure answered 0. */
static inline int cu_start(uv_loop_t *loop, cu_group *g, int n,
                           const tsr_coll_opts *o, uint64_t epoch) {
  uv_loop_init(loop);
  cu_rec rec[CU_MAX];
  int rc = cu_open(g, loop, n, o);
  if (!rc) rc = cu_configure(g, epoch, n, rec);
  for (int i = 0; !rc && i < n; i++) rc = rec[i].status;
  return rc;
}

/* Closes every rank, then the loop: 0 when nothing was left open. */
static inline int cu_end(cu_group *g) {
  cu_close(g);
  return uv_loop_close(g->loop);
}

/* The reference all-reduce in the ring's order: element e of chunk c is
 * x_c, then + x_{c+1}, ..., + x_{c+N-1} (ranks mod N), each addition in
 * float32. */
static inline void cu_ref_sum(float *const *x, int n, size_t count,
                              float *out) {
  size_t base = count / (size_t)n, extra = count % (size_t)n;
  for (int c = 0; c < n; c++) {
    size_t cc = (size_t)c;
    size_t off = cc * base + (cc < extra ? cc : extra);
    size_t len = base + (cc < extra);
    for (size_t e = off; e < off + len; e++) {
      volatile float acc = x[c][e];
      for (int j = 1; j < n; j++) acc = x[(c + j) % n][e] + acc;
      out[e] = acc;
    }
  }
}

#endif
