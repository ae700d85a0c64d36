/* tessera-ps as a library: the parameter-server service on an RPC server,
 * so the binary (ps/main.c) and the tests host it the same way, several in
 * one process if they like (each with its own context and loop).
 *
 * Happy path: ps_server_new() registers every PS method (ps/wire/wire.h,
 * PS_M_*) on a fresh RPC server before anything listens, then
 * ps_server_listen() binds. Applies, checkpoint I/O and sparse gathers run
 * on libuv's thread pool, one writer per shard; everything else runs on
 * the loop. The shutdown method answers, then calls `on_shutdown` so the
 * host can close the server and leave its loop.
 * Failure modes: every bad request is answered with an error that names the
 * variable, the shard and the problem; nothing stored changes then.
 */
#ifndef TSR_PS_H
#define TSR_PS_H

#include <stdbool.h>
#include <stddef.h>

#include "common/rpc/rpc.h"
#include "ps/wire/wire.h"

typedef struct ps_server ps_server;

typedef struct {
  size_t memory_limit;      /* bytes for shards, slots and rows; 0: none */
  bool allow_nonfinite;     /* apply NaN/Inf gradients instead of refusing */
  const char *mode;         /* initial mode: NULL or "async", "ssp:S", "sync" */
  const char *checkpoint_root; /* Save and Restore read and write only
                               under it; NULL: the folder the chief names
                               at configure (copied) */
  const tsr_rpc_allocator *allocator; /* every allocation of the service
                               (loop and pool threads: must be
                               thread-safe); NULL: malloc/free. Not copied:
                               must outlive the server */
  /* called on the loop once the shutdown method has been answered */
  void (*on_shutdown)(ps_server *s, void *data);
  void *data;
} ps_server_opts;

/* Makes the service on `ctx` with every method registered. */
int ps_server_new(ps_server **out, tsr_rpc_ctx *ctx, const ps_server_opts *o);
/* Listens on "host:port" (port 0: a free one, see ps_server_port). */
int ps_server_listen(ps_server *s, const char *addr);
int ps_server_port(const ps_server *s);
/* Whether this PS may exit 0 now: it holds no variable, or the chief's
 * shutdown said the job is done. A PS leaving a job that is not done
 * (SIGTERM, a shutdown without job_done) must exit non-zero, so that a
 * supervisor (tessera local, restart: on-failure) starts it again. */
bool ps_server_job_finished(const ps_server *s);

/* Answers held calls with TSR_ESHUTDOWN, waits for running applies, closes
 * the RPC server and frees everything; `cb` runs when done. */
void ps_server_close(ps_server *s, void (*cb)(void *data), void *data);

#endif
