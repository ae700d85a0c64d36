/* Leaving when the chief is gone (--idle-exit DURATION of tessera-ps and
 * tessera-worker): a PS or a worker whose chief failed for good (a batch
 * job that ran out of restarts, a deleted pod) would otherwise wait for it
 * until someone kills it, holding its node.
 *
 * Happy path: tsr_idle_start() opens a client to the chief's address (the
 * chief's status service, which listens there for the whole run) and
 * checks every second whether that connection is up. The connection is
 * kept alive by the RPC heartbeats, so a chief that runs, trains, waits or
 * evaluates is "seen"; one that has not been connected for DURATION (from
 * the start, or since the connection was lost) calls on_idle once. The
 * caller leaves then (status 0: nothing is left to do, and a supervisor
 * that restarts failures would only start another wait).
 * Failure modes: tsr_idle_parse names a DURATION it cannot read; a chief
 * whose status service did not start (its warning says so) is never seen.
 *
 * Threads: the loop thread of the context given.
 */
#ifndef TSR_IDLE_H
#define TSR_IDLE_H

#include <stddef.h>

#include "common/rpc/rpc.h"

/* "90" or "90s", "10m", "2h", "1.5h": seconds in *secs (> 0, at most a
 * week). TSR_EINVAL with a message naming the flag and the value
 * otherwise. */
int tsr_idle_parse(const char *flag, const char *text, double *secs,
                   char *err, size_t errlen);
/* The same as an option table's reader (common/arg.h), `secs` a double *:
 * TSR_ARG_CALL("idle-exit", tsr_idle_arg, &secs). */
int tsr_idle_arg(void *secs, const char *flag, const char *value, char *err,
                 size_t errlen);

typedef struct tsr_idle tsr_idle;
typedef void (*tsr_idle_cb)(void *data);

/* Starts watching `chief_addr` through `ctx`; on_idle(data) runs once, on
 * the loop, when the chief has not been connected for `secs`. */
int tsr_idle_start(tsr_idle **out, tsr_rpc_ctx *ctx, const char *chief_addr,
                   double secs, tsr_idle_cb on_idle, void *data);
/* Stops watching and frees it once its handles are closed (the loop must
 * run on); NULL is fine. */
void tsr_idle_close(tsr_idle *w);

#endif /* TSR_IDLE_H */
