/* Private to the PS client library (client.c, client_kv.c,
 * client_kv_loop.c): what the client needs of the wire schema, without any
 * of the server's internals, and the multi-PS client's state shared by its
 * submitting side (client_kv.c) and its loop side (client_kv_loop.c).
 */
#ifndef TSR_PS_CLIENT_INT_H
#define TSR_PS_CLIENT_INT_H

#include <pthread.h>
#include <uv.h>

#include "ps.pb-c.h"
#include "ps/client/client.h"

/* Fills `v` (and the caller-provided sub-messages) from a spec; strings
 * point into the spec (client_spec.c). */
void ps__client_spec_to_proto(const ps_var_spec *s, Tessera__Ps__VarSpec *v,
                              Tessera__Ps__Initializer *in,
                              Tessera__Ps__Optimizer *o,
                              Tessera__Ps__LrSchedule *sched,
                              int64_t *shape_buf);

/* ---- the multi-PS client (client_kv.c, client_kv_loop.c) ---------------- */

typedef enum {
  KV_PULL = 0,
  KV_PULL_ROWS,
  KV_PUSH,
  KV_PUSH_ROWS,
  KV_PUSH_PULL,
  KV_PUSH_PULL_ROWS,
  KV_CLOCK
} kv_kind;

typedef struct kv_call {
  struct kv_call *next;    /* issue queue */
  ps_kv *kv;
  uint32_t slot;
  kv_kind kind;
  int ps, var, shard;
  int64_t step, clock;
  ps_clock_op clock_op;
  uint64_t run, closure;   /* JOIN */
  ps_dtype wire;
  const int64_t *ids;
  size_t n_ids;
  const void *grad;        /* float32 caller buffer or bf16 staging */
  size_t grad_bytes;
  const float *grad_f32;   /* bf16: the source, converted at submit */
  size_t grad_floats;
  const int64_t *pull_ids;
  size_t n_pull;
  float *dst;
  size_t dst_floats;
  unsigned flags;
  uint64_t losses;
  uint32_t gen;            /* connection generation it was issued on */
  uint64_t first_ms;       /* first issued at (tsr_now_ms; 0: not yet) */
} kv_call;

typedef struct kv_buf {
  struct kv_buf *next;
  size_t cap;
  uint16_t *data;
} kv_buf;

typedef struct {
  uint64_t id;             /* the ticket; 0: free */
  int pending;             /* calls not completed */
  ps_kv_result res;        /* what ps_kv_wait reports, built up by the
                              calls' completions */
  kv_call *calls;
  int n_calls;
  kv_buf *buf;             /* bf16 staging, back to the pool at wait */
} kv_slot;

typedef struct {
  char *name;
  bool sparse;
  int64_t rows, row_dim;
  int n_shards;
  tsr_shard *shards;
} kv_var;

#define KV_SLOT_BITS 10
#define KV_SLOTS (1u << KV_SLOT_BITS)
_Static_assert(KV_SLOTS == PS_KV_MAX_TICKETS, "ticket slots");

struct ps_kv {
  tsr_rpc_ctx *ctx;
  uv_async_t async;
  /* loop thread */
  int n_ps;
  char **addrs;
  ps_client **cl;
  uint64_t *era;           /* per PS: the era its last JOIN answered */
  uint64_t *ps_lost;       /* per PS: its connection losses */
  uv_timer_t retry;        /* wait_lost: sends r_head's calls again */
  uint32_t gen;            /* bumped by every reset */
  bool reset_wanted;
  int open_handles;        /* clients and the async handle still open */
  bool closing;
  tsr_rpc_close_cb close_cb;
  void *close_data;

  pthread_mutex_t mu;
  pthread_cond_t cv;
  /* under mu */
  int worker;
  bool hold;
  bool wait_lost;
  ps_dtype wire;
  uint32_t deadline_ms;
  kv_var *vars;
  int n_vars;
  kv_call *q_head, *q_tail;
  kv_call *r_head, *r_tail; /* wait_lost: to send again at the timer */
  uint64_t resent;          /* calls sent again, for the tests */
  kv_slot slots[KV_SLOTS];
  uint32_t cursor;         /* next slot to try */
  uint64_t seq;
  int open;                /* tickets not yet waited for */
  int inflight;            /* calls issued, not completed */
  int inflight_data;       /* of them, pulls and pushes (not clocks) */
  uint64_t losses;
  char loss_msg[512];
  char lost[512];          /* why the last reset happened */
  kv_buf *pool;
  bool cancelled;
};


/* Frees a layout's n variables (client_kv.c). */
void ps__kv_free_vars(kv_var *v, int n);

#endif
