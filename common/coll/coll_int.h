/* Internals of the collectives, shared by group.c (life cycle, the group
 * and its hellos, failures and aborts), ring.c (operations: geometry,
 * sends, landings), ticket.c (other threads) and the unit tests.
 *
 * Every field is the loop thread's, except the ticket table and the
 * submission queue (under `mu`).
 */
#ifndef TSR_COLL_INT_H
#define TSR_COLL_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/coll/coll.h"
#include "common/list.h"

#include "coll.pb-c.h"

/* An operation posted on this rank. */
typedef struct coll_op {
  tsr_list node;            /* in c->ops (by seq) or c->done */
  tsr_coll *c;
  uint64_t seq;
  tsr_coll_kind kind;       /* ALLREDUCE (barrier: one of 0 floats),
                               BROADCAST */
  bool barrier;             /* for messages */
  uint8_t *buf;             /* the caller's */
  size_t count;             /* floats (all-reduce) or bytes */
  int root;
  tsr_coll_cb cb;
  void *data;
  uint32_t nsteps;          /* message steps: all-reduce 2(N-1),
                               broadcast N-1 */
  uint32_t nseg;            /* segments per chunk */
  uint32_t recv_left;       /* messages still to apply */
  uint32_t send_left;       /* sends not yet completed (queued too) */
  uint8_t *got;             /* [nsteps * nseg] applied */
  uint8_t *sent;            /* [nsteps * nseg] send completed */
  tsr_list deferred;        /* coll_land waiting for a send of the same
                               bytes to complete (all-gather) */
  int refs;                 /* sends submitted, landings in progress,
                               deferred landings: each touches buf */
  bool failed;
  bool complete;            /* in c->done, or delivered */
  int status;
  char msg[TSR_COLL_ERR_MAX];
  uint64_t post_ns, progress_ns;
} coll_op;

/* A message that arrived (or is arriving): where its payload lands. */
typedef enum {
  COLL_LAND_DIRECT = 0,     /* straight into the op's buffer */
  COLL_LAND_SCRATCH,        /* a pool buffer: added (reduce-scatter) or
                               copied (a send of those bytes pending) */
  COLL_LAND_EARLY,          /* a pool buffer: the op is not posted yet */
  COLL_LAND_REFUSED,        /* answered with `status` and `msg` */
} coll_land_mode;

typedef struct coll_land {
  tsr_list node;            /* early: c->early; deferred: op->deferred */
  coll_op *op;              /* NULL while early */
  coll_land_mode mode;
  uint64_t epoch;
  uint64_t seq;
  uint32_t kind, root, step, seg;
  uint64_t count;
  uint8_t *pool;            /* the pool buffer, or NULL (direct) */
  size_t off, len;          /* bytes in the op's buffer */
  int status;               /* refused: the answer */
  char *msg;
} coll_land;

/* A message to the right neighbour, queued or in flight. */
typedef struct coll_msg {
  tsr_list node;            /* c->fwdq or c->sendq while queued */
  coll_op *op;
  uint32_t step, seg;
  size_t off, len;          /* bytes in op->buf */
  bool inflight;
} coll_msg;

/* A ring neighbour's connection. */
typedef struct coll_peer {
  tsr_coll *c;
  tsr_rpc_client *cl;
  char addr[TSR_RPC_ADDR_MAX];
  int rank;                 /* in the current group */
  bool hello_ok;
  bool hello_inflight;
  uint64_t retry_ms;        /* tsr_now_ms() of the next hello */
  int last_rc;              /* the last hello's failure */
  char last_msg[TSR_COLL_ERR_MAX];
} coll_peer;

/* A submission from another thread, and its ticket. */
typedef struct coll_sub {
  tsr_list node;
  tsr_coll *c;
  tsr_coll_ticket t;
  tsr_coll_req req;
  tsr_coll_group g;         /* configure: a deep copy */
  char **addrs, **names;
  char *msg;                /* abort */
} coll_sub;

typedef struct coll_slot {
  tsr_coll_ticket t;        /* 0: free */
  bool done;
  uint64_t post_ns, done_ns;
  int status;
  char msg[TSR_COLL_ERR_MAX];
} coll_slot;

struct tsr_coll {
  tsr_rpc_ctx *ctx;
  uv_loop_t *loop;
  tsr_coll_opts o;
  char self_name[TSR_RPC_NAME_MAX + 1];

  /* the group */
  uint64_t epoch;           /* 0: none yet */
  int rank, nranks;
  char **addrs, **names;    /* nranks each (names filled in) */
  uint64_t digest;
  bool configured;          /* both hellos answered */
  bool configuring;
  tsr_coll_cb cfg_cb;
  void *cfg_data;
  uint64_t cfg_deadline_ms;
  uint32_t cfg_timeout_ms;  /* this configure's */
  coll_peer right, left;    /* left unused (right serves both) at N=2 */
  bool broken;
  int broken_code;
  char cause[TSR_COLL_ERR_MAX];

  /* operations */
  uint64_t next_seq;        /* the number of the next post */
  tsr_list ops;             /* posted, not complete */
  tsr_list done;            /* complete, callback not yet delivered */
  tsr_list early;           /* coll_land of ops not posted yet */
  tsr_list fwdq;            /* coll_msg waiting for a send slot: bytes
                               that just arrived, passed on (steps after
                               an operation's first); sent first */
  tsr_list sendq;           /* the same: operations' first steps */
  uint32_t sending;         /* coll_msg in flight */
  bool cfg_done;            /* configure's callback pending delivery */
  int cfg_status;
  char cfg_msg[TSR_COLL_ERR_MAX];

  /* pool of segment buffers */
  void **pool;
  int pool_n, pool_cap;

  /* handles */
  uv_async_t wake;          /* deliveries; submissions from threads */
  uv_timer_t tick;          /* op timeouts, hello retries */
  int handles_open;
  int clients_closing;
  bool closing;
  bool close_called;
  tsr_rpc_close_cb close_cb;
  void *close_data;

  /* other threads (under mu) */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  tsr_list subq;            /* coll_sub */
  coll_slot slots[TSR_COLL_TICKETS];
  tsr_coll_ticket next_ticket;
  bool mu_closing;

  tsr_coll_stats st;
};

/* ---- ring.c ------------------------------------------------------------- */

/* Posts an operation (the three public posts go through here). */
int tsr_coll__post(tsr_coll *c, tsr_coll_kind kind, bool barrier, void *buf,
                   size_t count, int root, tsr_coll_cb cb, void *data);
/* The span (elements) of segment `seg` of chunk `chunk` when `count`
 * elements are cut into `nchunks` chunks and each chunk into `nseg`
 * segments ("div" layout: the first ones one longer). */
void tsr_coll__span(size_t count, int nchunks, int chunk, uint32_t nseg,
                    uint32_t seg, size_t *off, size_t *len);
/* Segments per chunk for an operation of `count` elements of `elem`
 * bytes over `nchunks` chunks: at least one. */
uint32_t tsr_coll__nseg(size_t count, size_t elem, int nchunks,
                        uint32_t segment_bytes);
/* Fails an operation (the first cause stays) and completes it once no
 * transfer touches its buffer. */
void tsr_coll__op_fail(coll_op *op, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Completes op if it is finished or failed and nothing touches buf. */
void tsr_coll__op_maybe_complete(coll_op *op);
/* Delivers completed operations' callbacks (and configure's). */
void tsr_coll__deliver(tsr_coll *c);
/* Sends queued messages while slots are free. */
void tsr_coll__pump(tsr_coll *c);
/* Drops data held for operations not posted (a new group, a break). */
void tsr_coll__early_drop(tsr_coll *c);
/* Checks every operation for op_timeout_ms without progress. */
void tsr_coll__check_timeouts(tsr_coll *c, uint64_t now_ns);
/* The DATA method's callbacks. */
int tsr_coll__data_alloc(tsr_rpc_incoming *call, size_t len, void **buf,
                         void *data);
void tsr_coll__data_abort(tsr_rpc_incoming *call, void *buf, int status,
                          void *data);
void tsr_coll__on_data(tsr_rpc_incoming *call, void *data);
/* "all-reduce #7 (4096 floats)" */
void tsr_coll__op_name(const coll_op *op, char *buf, size_t len);

/* ---- group.c ------------------------------------------------------------ */

/* The group fails: every operation with `code` and the cause, later posts
 * too; the cause goes on to the right neighbour when `tell` is set. */
void tsr_coll__break(tsr_coll *c, int code, bool tell, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* "worker:1 (127.0.0.1:4001)" for rank r. */
void tsr_coll__who(const tsr_coll *c, int r, char *buf, size_t len);
/* Pool of segment_bytes buffers. */
void *tsr_coll__pool_get(tsr_coll *c);
void tsr_coll__pool_put(tsr_coll *c, void *p);
/* Wakes the loop (deliveries, submissions). */
void tsr_coll__wake(tsr_coll *c);

/* ---- ticket.c ----------------------------------------------------------- */

/* Posts the queued submissions (loop thread). */
void tsr_coll__subs_run(tsr_coll *c);
/* Fails every queued submission and ticket (closing). */
void tsr_coll__subs_fail(tsr_coll *c);

#endif /* TSR_COLL_INT_H */
