/* The RPC server's structures, private to server.c (calls: requests in,
 * answers out) and server_life.c (the server made, its methods
 * registered, listening and accepting, closed; its statistics).
 *
 * Threads: the context's loop thread only.
 */
#ifndef TSR_RPC_SERVER_INT_H
#define TSR_RPC_SERVER_INT_H

#include "common/rpc/rpc_int.h"

typedef struct method_ent {
  tsr_rpc_method m;
  char name[48];
  tsr_rpc_method_stats st;
} method_ent;

typedef struct sconn sconn;

enum { CALL_RECEIVING, CALL_HANDLING, CALL_ANSWERED };

typedef struct scall {
  tsr_rpc_incoming pub;
  tsr_rpc_server *s;
  sconn *sc;                 /* NULL once the connection is gone */
  method_ent *me;
  int state;
  int user_buf;              /* payload from the method's allocator */
  int is_error;
  tsr_rpc_done_cb done;
  void *done_data;
  uint64_t out_bytes;
  tsr_list link;             /* sc->calls, or the server's dead list */
  uint8_t meta[];
} scall;

struct sconn {
  tsr_rpc__conn c;           /* first: an sconn is its conn */
  tsr_rpc_server *s;
  tsr_rpc__idmap ids;
  tsr_list calls;            /* scall.link: handled, not answered */
  scall *receiving;          /* payload landing */
  int counted;               /* in s->st.connections */
  struct {                   /* a request refused before its handler,
                                answered once its frame is complete (and
                                its MAC verified: nothing is answered to
                                a frame a relay made up) */
    int pending, code;
    uint64_t id;
    uint32_t method;
    char msg[300];
  } refusal;
};

/* The connection whose conn.link is node `n` of the server's list. */
#define CONN_OF(n) ((sconn *)tsr_list_entry(n, tsr_rpc__conn, link))

struct tsr_rpc_server {
  tsr_rpc_ctx *ctx;
  uv_tcp_t listener;
  uv_pipe_t local;           /* the same-host Unix socket (local.c) */
  int local_open;            /* `local` is a handle to close */
  uv_idle_t idle;            /* runs done callbacks of dead answers */
  int handles;
  int listening;
  int closing;
  int idle_closing;
  int port;
  method_ent *methods;       /* sorted by number */
  size_t nmethods;
  tsr_list conns;            /* sconn.c.link */
  tsr_list dead;             /* scall.link: answered after their connection
                                died */
  uint64_t live_calls;
  tsr_rpc_stats st;
  tsr_rpc_close_cb close_cb;
  void *close_data;
};

/* server.c */
/* An accepted connection's callbacks: its requests become calls. */
extern const tsr_rpc__conn_ops tsr_rpc__server_ops;

/* server_life.c */
/* The registered method numbered m, or NULL. */
method_ent *tsr_rpc__find_method(tsr_rpc_server *s, uint32_t m);
/* Frees the server once it is closing and nothing of it is left (no
 * connection, no live call, every handle closed), then calls its
 * close callback; otherwise does nothing. */
void tsr_rpc__server_maybe_finish(tsr_rpc_server *s);

#endif /* TSR_RPC_SERVER_INT_H */
