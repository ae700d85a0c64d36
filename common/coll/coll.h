/* Tessera collectives (tsr_coll_*): ring all-reduce, broadcast and barrier
 * among a group of processes (the workers of a job), over the project's
 * RPC (common/rpc/rpc.h): the same transport, handshake, cluster token and
 * frame MAC as every other call, the same-host socket where two members
 * share a host.
 *
 * Happy path. Each member makes one tsr_coll beside its RPC server
 * (tsr_coll_new registers the collective methods on it, so before listen),
 * then joins a group: every member's "host:port", its own rank and an
 * epoch that every member of the group names alike (tsr_coll_configure).
 * Configure opens a connection to both ring neighbours and exchanges a
 * hello with each; it succeeds once both neighbours are in the same group.
 * Then the members post the same sequence of operations (the n-th post on
 * every rank is the same operation, with the same size), each completing
 * through its callback:
 *
 *   all-reduce  float32 sums, in place. Reduce-scatter then all-gather
 *               around the ring: the buffer is cut into N chunks; each
 *               rank sends 2(N-1) chunks and receives as many, i.e.
 *               2(N-1)/N of the data, whatever N. Every element's sum is
 *               formed once, on one rank, in ring order from the chunk's
 *               first owner, and then copied to the others: every rank
 *               ends with bitwise the same floats, and a given (N, n)
 *               always sums each element in the same order.
 *   broadcast   root's bytes to every rank, down the ring.
 *   barrier     completes on a rank once every rank has posted it.
 *
 * Chunks travel in segments (segment_bytes) so a rank forwards the first
 * segment while the next arrives: a large operation keeps every link busy.
 * Payloads never pass through an intermediate copy on the sending side
 * and, where the RPC allows, land straight in the caller's buffer.
 * Several operations may be in flight at once (a bucket of gradients each,
 * started as the backward pass produces them); they complete in any order.
 *
 * Failure modes. Every failure names the peer and the operation. A member
 * that dies (its connections close) makes both its ring neighbours fail
 * at once, and each member that sees a failure first tells the next one
 * around the ring (an abort message), so every survivor fails its
 * operations within one round of messages; a member that hangs is found
 * by the RPC heartbeat (its idle_timeout_ms), and an operation that makes
 * no progress for op_timeout_ms fails naming the neighbour it waits on.
 * After a failure the group is broken: every operation in flight and
 * every later one fails with the first cause, until tsr_coll_configure
 * forms a new group (a new epoch). Messages of an older epoch are refused.
 * Ranks that post different operations under one number (another kind,
 * size or root) fail that operation naming both. Data from a neighbour
 * that runs ahead (posted an operation this rank has not posted yet) is
 * held, up to early_bytes_max, then refused (the group breaks).
 *
 * Threads. tsr_coll_new, _configure, _allreduce, _broadcast, _barrier,
 * _close and the statistics run on the RPC context's loop thread;
 * callbacks run there too, never from inside the call that registered
 * them. tsr_coll_submit and tsr_coll_wait let another thread (a training
 * thread) post operations and wait for them (tickets).
 *
 * Shutdown. tsr_coll_close fails every operation with TSR_ESHUTDOWN and
 * closes the collective's connections; its callback runs once its handles
 * are closed. The methods stay registered on the server, so the server is
 * closed next, and tsr_coll_free runs after the server's close callback.
 */
#ifndef TSR_COLL_H
#define TSR_COLL_H

#include <stddef.h>
#include <stdint.h>

#include "common/rpc/rpc.h"

/* Method numbers of the collective on a member's RPC server. */
enum {
  TSR_COLL_M_HELLO = 0x501,
  TSR_COLL_M_DATA = 0x502,
  TSR_COLL_M_ABORT = 0x503,
};

/* Largest group. */
#define TSR_COLL_MAX_RANKS 1024
/* Longest message a failure carries (with the NUL). */
#define TSR_COLL_ERR_MAX 384

typedef struct tsr_coll tsr_coll;

/* Options. A zero field takes the default named beside it. */
typedef struct tsr_coll_opts {
  uint32_t segment_bytes;        /* largest payload of one message (the
                                    pipelining unit); default 512 KiB;
                                    at least 4 KiB, at most 64 MiB */
  uint32_t op_timeout_ms;        /* an operation with no progress (nothing
                                    received, no send completed) for this
                                    long fails; default 60000 */
  uint32_t configure_timeout_ms; /* reaching both neighbours in the same
                                    group; default 10000 */
  uint32_t max_sends;            /* messages in flight to the right
                                    neighbour; more wait, bytes that
                                    just arrived (passed on) before an
                                    operation's own first ones;
                                    default 2 (see ring.c) */
  uint64_t early_bytes_max;      /* data held for operations not posted
                                    here yet; default 256 MiB */
} tsr_coll_opts;

/* Makes a collective that talks through `ctx` (its token, limits and
 * loop) and registers TSR_COLL_M_* on `srv`, which must not be listening
 * yet (TSR_EINVAL otherwise, from the RPC). TSR_EINVAL for options out of
 * their ranges, TSR_ENOMEM. */
int tsr_coll_new(tsr_coll **out, tsr_rpc_ctx *ctx, tsr_rpc_server *srv,
                 const tsr_coll_opts *opts);

/* A group. addrs[i] is rank i's server ("host:port", as its RPC server
 * listens); names[i] (NULL: "rank i") is what errors call it, e.g.
 * "worker:1". The epoch is the same on every member and larger than that
 * of any earlier group of these processes. Everything is copied. */
typedef struct tsr_coll_group {
  uint64_t epoch;
  int rank;
  int nranks;                    /* 1..TSR_COLL_MAX_RANKS */
  const char *const *addrs;
  const char *const *names;      /* may be NULL */
  uint32_t timeout_ms;           /* the neighbours' hellos; 0: the
                                    options' configure_timeout_ms */
} tsr_coll_group;

/* Completion of an operation (or a configure): status 0, or a negative
 * code with a message naming the peer and the operation (never NULL;
 * valid during the callback). */
typedef void (*tsr_coll_cb)(int status, const char *message, void *data);

/* Joins a group. Operations of an earlier group still in flight fail
 * with TSR_ECANCELED. Completion on one rank says its two neighbours
 * have joined; operations may be posted at once (they start when the
 * neighbours are there), and a barrier that completes tells every rank
 * that all have joined. `cb` reports 0 once both neighbours answered the
 * hello in this group, or: TSR_ETIMEOUT / TSR_EUNAVAIL naming the pair
 * that cannot reach each other ("worker:0 (10.0.0.1:2222) cannot reach
 * worker:1 (10.0.0.2:2222): ..."), TSR_ECONFIG when a neighbour has
 * another member list or size, TSR_ESTALE when it is in a newer group.
 * With one rank it completes at once (later, on the loop). A negative
 * return (TSR_EINVAL: rank, size, epoch not above the last one, an
 * address too long; TSR_ENOMEM; TSR_ESHUTDOWN) means `cb` never runs.
 * The epoch of a group whose configure failed here may be given again
 * (a retry); one that formed may not. */
int tsr_coll_configure(tsr_coll *c, const tsr_coll_group *g, tsr_coll_cb cb,
                       void *data);

/* Posts operations of the current group. `buf` must stay valid and
 * untouched until `cb` (the collective reads and writes it until then,
 * also after a failure: the callback waits for the transfers in flight,
 * each bounded by the RPC's deadlines). On a negative return (TSR_EINVAL;
 * TSR_ESTALE: no group configured; TSR_ESHUTDOWN; TSR_ENOMEM) `cb` never
 * runs. A broken group fails the operation through `cb`. */
int tsr_coll_allreduce(tsr_coll *c, float *buf, size_t n, tsr_coll_cb cb,
                       void *data);
int tsr_coll_broadcast(tsr_coll *c, int root, void *buf, size_t bytes,
                       tsr_coll_cb cb, void *data);
int tsr_coll_barrier(tsr_coll *c, tsr_coll_cb cb, void *data);

/* This rank cannot go on (its step failed after it posted part of it):
 * the group breaks on every member, each operation failing with `code`
 * (negative) and "<this rank>: <message>". A group already broken keeps
 * its first cause. Loop thread; no callback. */
void tsr_coll_abort(tsr_coll *c, int code, const char *message);

/* Fails every operation (TSR_ESHUTDOWN), wakes every waiting thread,
 * closes the connections and handles; `cb` runs once they are closed.
 * Calls arriving later are answered TSR_ESHUTDOWN. */
void tsr_coll_close(tsr_coll *c, tsr_rpc_close_cb cb, void *data);
/* Frees a closed collective, after the server it registered on has
 * finished closing. */
void tsr_coll_free(tsr_coll *c);

/* ---- from another thread: tickets --------------------------------------- */

typedef uint64_t tsr_coll_ticket;   /* 0 is never one */

typedef enum {
  TSR_COLL_ALLREDUCE = 1,
  TSR_COLL_BROADCAST = 2,
  TSR_COLL_BARRIER = 3,
  TSR_COLL_CONFIGURE = 4,
  TSR_COLL_ABORT = 5,
} tsr_coll_kind;

typedef struct tsr_coll_req {
  tsr_coll_kind kind;
  void *buf;                     /* all-reduce: float[count]; broadcast */
  size_t count;                  /* all-reduce: floats; broadcast: bytes */
  int root;                      /* broadcast */
  const tsr_coll_group *group;   /* configure (copied before return) */
  const char *message;           /* abort (copied); its code in root */
} tsr_coll_req;

/* Largest number of tickets submitted and not yet waited for. */
#define TSR_COLL_TICKETS 256

/* Any thread: queues the operation for the loop; *t to wait for.
 * Operations are posted in submission order. TSR_EBUSY with
 * TSR_COLL_TICKETS open, TSR_ESHUTDOWN once closing, TSR_ENOMEM. */
int tsr_coll_submit(tsr_coll *c, const tsr_coll_req *req,
                    tsr_coll_ticket *t);
/* Blocks until the ticket's operation completed (never call it on the
 * loop thread); returns its status with its message in err. A ticket is
 * waited for once (TSR_EINVAL for an unknown one). */
int tsr_coll_wait(tsr_coll *c, tsr_coll_ticket t, char *err, size_t errlen);
/* The same, with tsr_now_ns() when the loop posted the operation and when
 * it completed (either pointer may be NULL). */
int tsr_coll_wait_timed(tsr_coll *c, tsr_coll_ticket t, char *err,
                        size_t errlen, uint64_t *post_ns, uint64_t *done_ns);
/* Non-zero once the ticket's operation has completed (no wait). */
int tsr_coll_done(tsr_coll *c, tsr_coll_ticket t);

/* ---- gradient buckets (fuse.c) -------------------------------------------
 *
 * Tensor fusion (Horovod's) with PyTorch DDP's layout: the tensors of a
 * step (gradients) are grouped, in the order the backward pass produces
 * them, into buckets of about bucket_bytes (a larger tensor is a bucket of
 * its own), and the fusion buffer holds each bucket contiguously, so a
 * gradient computed in place (tsr_coll_fuse_slot) is all-reduced with no
 * copy. A step: tsr_coll_fuse_start, then tsr_coll_fuse_ready as each
 * tensor becomes final (a bucket goes out as soon as all its tensors are
 * final and every bucket before it has gone: all ranks post buckets in
 * the same order whatever order their tensors become final in), then
 * tsr_coll_fuse_wait per bucket (apply an optimizer to a bucket while the
 * next is still on the ring) or tsr_coll_fuse_flush + wait_all.
 *
 * Threads: one thread (a training thread) drives a fuse; it posts through
 * tickets (tsr_coll_submit), so never the loop thread. */

typedef struct tsr_coll_fuse tsr_coll_fuse;

/* n tensors of counts[t] floats (0 allowed); order[i] is the i-th tensor
 * to become final in a step (a permutation of 0..n-1; NULL: n-1 down to
 * 0, a backward pass over layers in order). TSR_EINVAL for a bad order
 * or bucket_bytes < 4, TSR_ENOMEM. */
int tsr_coll_fuse_new(tsr_coll_fuse **out, const size_t *counts,
                      const int *order, int n, size_t bucket_bytes);
void tsr_coll_fuse_free(tsr_coll_fuse *f);
/* Where tensor t lives in the fusion buffer (64-byte aligned buffer). */
float *tsr_coll_fuse_slot(const tsr_coll_fuse *f, int t);
int tsr_coll_fuse_nbuckets(const tsr_coll_fuse *f);
/* Bucket b: its tensors (in final order) and its floats. */
const int *tsr_coll_fuse_members(const tsr_coll_fuse *f, int b, int *n);
size_t tsr_coll_fuse_bucket_floats(const tsr_coll_fuse *f, int b);

/* A new step on collective c (tickets from tsr_coll_submit): nothing is
 * final. Buckets of an earlier step must have been waited for. */
void tsr_coll_fuse_start(tsr_coll_fuse *f, tsr_coll *c);
/* Tensor t is final: posts every bucket now complete whose predecessors
 * are posted. The first failure to post is returned (and kept). */
int tsr_coll_fuse_ready(tsr_coll_fuse *f, int t);
/* Every tensor is final (those never marked included): posts the rest. */
int tsr_coll_fuse_flush(tsr_coll_fuse *f);
/* Waits for bucket b's all-reduce (which must have been posted); its
 * status, with the message in err. When not NULL, *post_ns and *done_ns
 * get tsr_now_ns() at its post and at its completion. */
int tsr_coll_fuse_wait(tsr_coll_fuse *f, int b, char *err, size_t errlen,
                       uint64_t *post_ns, uint64_t *done_ns);
/* Flush, then wait for every bucket; the first failure. */
int tsr_coll_fuse_wait_all(tsr_coll_fuse *f, char *err, size_t errlen);
/* Waits for every bucket posted so far and posts no other (a step that
 * failed: nothing may stay on the ring over the buffer). */
void tsr_coll_fuse_drain(tsr_coll_fuse *f);

/* ---- statistics --------------------------------------------------------- */

typedef struct tsr_coll_stats {
  uint64_t epoch;                /* of the current group (0: none) */
  int rank, nranks;
  int broken;                    /* the group failed; its cause below */
  char cause[TSR_COLL_ERR_MAX];
  uint64_t ops;                  /* completed successfully */
  uint64_t failed;               /* completed with an error */
  uint64_t allreduce_floats;     /* floats all-reduced (completed) */
  uint64_t bytes_sent;           /* payload bytes sent */
  uint64_t bytes_recv;           /* payload bytes received */
  uint64_t segs_sent, segs_recv;
  uint64_t op_ns;                /* post to completion, summed */
  uint64_t early_bytes;          /* held now for operations not posted */
  uint32_t landing;              /* payloads arriving now */
  uint32_t inflight;             /* operations posted and not complete */
} tsr_coll_stats;

/* Loop thread, or any thread while the loop is not running. */
void tsr_coll_get_stats(const tsr_coll *c, tsr_coll_stats *out);

#endif /* TSR_COLL_H */
