/* RPC internals shared by the files of common/rpc/.
 *
 * Layers, bottom up: wire.c (frame header and error meta encoding, pure),
 * handshake.c (the handshake state machine, pure), rx.c (the receive state
 * machine that splits a byte stream into frames and tells where the next
 * bytes should land, pure), ctx.c (context, allocator, buffer pool, token),
 * idmap.c (request id -> object), conn.c (one TCP connection on libuv:
 * handshake, reads, gathered writes, heartbeats, close), server.c and
 * client.c. The pure layers take no handle so they can be fuzzed and
 * tested byte by byte.
 */
#ifndef TSR_RPC_INT_H
#define TSR_RPC_INT_H

#include "common/list.h"
#include "common/rpc/rpc.h"
#include "tsr_config.h"

#include <pthread.h>
#include <sodium.h>
#include <stdint.h>
#include <string.h>

/* Messages are cut to their buffers on purpose (they name a peer and a
 * cause; the head of the text is what matters). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wformat-truncation"
#endif

/* ---- wire format -------------------------------------------------------- */

#define TSR_RPC__FRAME_MAGIC 0x46525354u /* "TSRF" little-endian */
#define TSR_RPC__HELLO_MAGIC 0x48525354u /* "TSRH" little-endian */

enum tsr_rpc__kind {
  TSR_RPC__REQ = 1,
  TSR_RPC__RESP = 2,
  TSR_RPC__ERR = 3,
  TSR_RPC__PING = 4,
  TSR_RPC__PONG = 5,
};
#define TSR_RPC__KIND_BIT(k) (1u << (k))

/* Header layout (little-endian):
 *  0 u32 magic  4 u8 version  5 u8 kind  6 u16 flags (0)
 *  8 u32 method 12 u32 meta_len  16 u64 id  24 u64 payload_len */
typedef struct tsr_rpc__hdr {
  uint8_t version;
  uint8_t kind;
  uint16_t flags;
  uint32_t method;
  uint32_t meta_len;
  uint64_t id;
  uint64_t payload_len;
} tsr_rpc__hdr;

typedef struct tsr_rpc__limits {
  uint32_t max_meta;
  uint64_t max_payload;
} tsr_rpc__limits;

void tsr_rpc__hdr_encode(uint8_t out[TSR_RPC_HEADER_SIZE],
                         const tsr_rpc__hdr *h);
/* Decodes and checks one header: magic, version, known kind, zero flags,
 * the kind's shape (pings carry nothing, errors no payload, requests a
 * method) and the limits. 0 or TSR_EPROTO / TSR_EVERSION / TSR_ETOOBIG
 * with a message in msg. Fields are filled even on error (best effort). */
int tsr_rpc__hdr_decode(const uint8_t in[TSR_RPC_HEADER_SIZE],
                        const tsr_rpc__limits *lim, tsr_rpc__hdr *h,
                        char *msg, size_t msglen);
const char *tsr_rpc__kind_name(unsigned kind);

/* Error meta (proto/rpc.proto RpcError). Encode writes into a buffer of
 * tsr_rpc__err_size() bytes; decode fills code and a NUL-terminated
 * message (cut to msgcap). */
size_t tsr_rpc__err_size(int code, const char *message);
size_t tsr_rpc__err_encode(int code, const char *message, uint8_t *out);
int tsr_rpc__err_decode(const uint8_t *meta, size_t len, int *code,
                        char *msg, size_t msgcap);

static inline void tsr_rpc__put32(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8);
  p[2] = (uint8_t)(v >> 16); p[3] = (uint8_t)(v >> 24);
}
static inline uint32_t tsr_rpc__get32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
         (uint32_t)p[3] << 24;
}
static inline void tsr_rpc__put64(uint8_t *p, uint64_t v) {
  tsr_rpc__put32(p, (uint32_t)v);
  tsr_rpc__put32(p + 4, (uint32_t)(v >> 32));
}
static inline uint64_t tsr_rpc__get64(const uint8_t *p) {
  return (uint64_t)tsr_rpc__get32(p) | (uint64_t)tsr_rpc__get32(p + 4) << 32;
}

/* ---- frame integrity (mac.c) ------------------------------------------ */

/* Poly1305 tag after every frame once the handshake is done (unless both
 * ends asked for plain frames): frame n of a direction is keyed with
 * ChaCha20(direction's session key, n), so replayed, reordered, dropped
 * and altered frames all fail. */
#define TSR_RPC__TAG_SIZE 16

#define TSR_RPC__MAC_BATCH 64  /* frames' one-time keys made at once */

typedef struct tsr_rpc__mac {
  int on;
  uint8_t key[32];
  uint64_t counter;             /* frames of this direction so far */
  uint8_t keys[TSR_RPC__MAC_BATCH * 32]; /* one-time keys of this batch */
  int keys_ready;
  int use_big;                  /* this frame through libcrypto */
  void *big;                    /* EVP_MAC_CTX (libcrypto builds) */
  crypto_onetimeauth_state st;  /* the frame being sent or received */
} tsr_rpc__mac;

/* m must be zeroed or wiped before its first init. */
void tsr_rpc__mac_init(tsr_rpc__mac *m, const uint8_t key[32]);
void tsr_rpc__mac_wipe(tsr_rpc__mac *m);
/* Starts frame number m->counter, of frame_len bytes before its tag. */
void tsr_rpc__mac_begin(tsr_rpc__mac *m, uint64_t frame_len);
void tsr_rpc__mac_update(tsr_rpc__mac *m, const void *p, size_t n);
/* Ends the frame: its tag (send) or 0 when `tag` is right (receive). Both
 * move on to the next frame number. */
void tsr_rpc__mac_final(tsr_rpc__mac *m, uint8_t tag[TSR_RPC__TAG_SIZE]);
int tsr_rpc__mac_verify(tsr_rpc__mac *m,
                        const uint8_t tag[TSR_RPC__TAG_SIZE]);

/* ---- handshake (handshake.c) ------------------------------------------ */

/* Client -> server: HELLO. Server -> client: HELLO (always, so a client
 * of another version learns ours), then after the client's PROOF a
 * VERDICT: status (0, TSR_EAUTH, TSR_EVERSION) and the server's proof.
 * Proofs are HMAC-SHA256 under the cluster token over a role label and
 * both HELLOs (so both fresh nonces): a recorded exchange never verifies
 * again. Once both proofs verify, each end derives the same two session
 * keys (client->server, server->client) from the token and both HELLOs.
 * A HELLO's flags byte says whether its sender asks for plain frames;
 * frames carry a MAC unless both ends ask (and since the proofs cover the
 * HELLOs, nobody on the path can change that). */
#define TSR_RPC__NONCE_SIZE 32
#define TSR_RPC__HELLO_SIZE (8 + TSR_RPC__NONCE_SIZE + TSR_RPC_NAME_MAX + 1)
#define TSR_RPC__PROOF_SIZE 32
#define TSR_RPC__VERDICT_SIZE (4 + TSR_RPC__PROOF_SIZE)
#define TSR_RPC__HS_OUT_MAX (TSR_RPC__HELLO_SIZE + TSR_RPC__VERDICT_SIZE)

enum { TSR_RPC__CLIENT = 0, TSR_RPC__SERVER = 1 };

enum tsr_rpc__hs_state {
  TSR_RPC__HS_WAIT_HELLO,
  TSR_RPC__HS_WAIT_PROOF,    /* server */
  TSR_RPC__HS_WAIT_VERDICT,  /* client */
  TSR_RPC__HS_DONE,
  TSR_RPC__HS_FAILED,
};

typedef struct tsr_rpc__hs {
  int role;
  int state;
  const uint8_t *token;
  size_t token_len;
  uint8_t mine[TSR_RPC__HELLO_SIZE];
  uint8_t theirs[TSR_RPC__HELLO_SIZE];
  uint8_t in[TSR_RPC__HELLO_SIZE];
  size_t in_len;
  unsigned peer_version;
  char peer_name[TSR_RPC_NAME_MAX + 1];
  int status;                 /* on failure */
  char msg[200];              /* on failure: what went wrong */
  int close_after_send;       /* server refusals: send, then close */
  int mac;                    /* done: frames carry a MAC */
  uint8_t key_tx[32], key_rx[32]; /* done: this end's session keys */
} tsr_rpc__hs;

/* Starts the handshake; the client gets its HELLO to send in out. `plain`
 * asks for frames without a MAC (granted only if the peer asks too). */
void tsr_rpc__hs_init(tsr_rpc__hs *hs, int role, const void *token,
                      size_t token_len, const char *name, int plain,
                      uint8_t *out, size_t *out_len);
/* Feeds received bytes. Consumes what belongs to the handshake (*used),
 * appends bytes to send to out (capacity TSR_RPC__HS_OUT_MAX, *out_len).
 * Returns 0 while going on, 1 once done (bytes after *used are frames),
 * or a negative code with hs->msg set (out may still hold a refusal to
 * send before closing). */
int tsr_rpc__hs_feed(tsr_rpc__hs *hs, const uint8_t *in, size_t len,
                     size_t *used, uint8_t *out, size_t *out_len);

/* ---- receive state machine (rx.c) -------------------------------------- */

typedef struct tsr_rpc__rx tsr_rpc__rx;

typedef struct tsr_rpc__rx_ops {
  /* Header and meta complete (meta valid only during the call). Set *dst
   * to where the payload must land (h->payload_len bytes) or leave it NULL
   * to discard the payload. Return 0 to go on, a negative code to stop
   * (the owner has dealt with it). */
  int (*on_head)(tsr_rpc__rx *rx, const tsr_rpc__hdr *h, const uint8_t *meta,
                 void **dst);
  /* Payload complete (payload is *dst from on_head, NULL when discarded
   * or empty). Return 0 to go on, 1 to pause (tsr_rpc__rx_process resumes),
   * a negative code to stop. */
  int (*on_frame)(tsr_rpc__rx *rx, const tsr_rpc__hdr *h, void *payload);
} tsr_rpc__rx_ops;

enum { TSR_RPC__RX_HDR, TSR_RPC__RX_META, TSR_RPC__RX_PAYLOAD,
       TSR_RPC__RX_TAG, TSR_RPC__RX_DEAD };

struct tsr_rpc__rx {
  const tsr_rpc__rx_ops *ops;
  void *owner;
  tsr_rpc__limits lim;
  uint32_t accept;            /* TSR_RPC__KIND_BIT mask */
  const tsr_rpc_allocator *al;
  uint8_t *stage;             /* staging buffer */
  size_t cap, beg, end;
  int state;
  tsr_rpc__hdr h;
  uint8_t *meta;              /* big meta (does not fit in stage) */
  size_t meta_got;
  uint8_t *dst;               /* payload destination, NULL: discard */
  uint64_t got;
  int given;                  /* what rx_buf handed out last */
  uint8_t *given_p;           /* where (payloads: hashed from there) */
  int paused;
  int busy;                   /* inside rx_process */
  int err;                    /* fatal error code, 0 */
  uint64_t err_id;            /* request id the error is about (0: none) */
  char msg[200];
  tsr_rpc__mac mac;           /* off until tsr_rpc__rx_mac_on */
  uint8_t tag[TSR_RPC__TAG_SIZE];
  size_t tag_got;
};

int tsr_rpc__rx_init(tsr_rpc__rx *rx, const tsr_rpc__rx_ops *ops,
                     void *owner, const tsr_rpc__limits *lim,
                     uint32_t accept, const tsr_rpc_allocator *al,
                     size_t stage_cap);
void tsr_rpc__rx_free(tsr_rpc__rx *rx);
/* Where the next received bytes must go. */
void tsr_rpc__rx_buf(tsr_rpc__rx *rx, uint8_t **p, size_t *len);
/* n bytes were written where rx_buf said; processes them. 0, or the
 * negative fatal code (rx->msg, rx->err_id set). */
int tsr_rpc__rx_done(tsr_rpc__rx *rx, size_t n);
/* Puts bytes already received (after a handshake) into the stage; p may
 * point into the stage itself. */
int tsr_rpc__rx_push(tsr_rpc__rx *rx, const uint8_t *p, size_t n);
/* From the next frame on, every frame must end with its tag under `key`
 * (a frame whose tag does not verify stops the machine: TSR_EAUTH). */
void tsr_rpc__rx_mac_on(tsr_rpc__rx *rx, const uint8_t key[32]);
/* Processes staged bytes (resuming after a pause). */
int tsr_rpc__rx_process(tsr_rpc__rx *rx);
/* The payload being received will be discarded from now on (its
 * destination is no longer valid). */
void tsr_rpc__rx_divert(tsr_rpc__rx *rx);
/* Non-zero while a payload is landing in an owner's destination. */
int tsr_rpc__rx_in_payload(const tsr_rpc__rx *rx);

/* ---- rate-limited log lines about peers (ratelog.c) --------------------- */

#define TSR_RPC__RATELOG_SLOTS 64
#define TSR_RPC__RATELOG_KEY 112    /* a peer's address or a socket's name */

typedef struct tsr_rpc__ratelog_slot {
  int used;
  char key[TSR_RPC__RATELOG_KEY];
  uint64_t since_ns;          /* when its last line was logged */
  uint64_t suppressed;        /* events not logged since */
} tsr_rpc__ratelog_slot;

typedef struct tsr_rpc__ratelog {
  tsr_rpc__ratelog_slot slot[TSR_RPC__RATELOG_SLOTS];
} tsr_rpc__ratelog;

/* An event about `peer` ("ip:port") at now_ns: 1 when a line is due (then
 * *suppressed says how many events of that address went unlogged since
 * its last line), 0 when it is only counted. `host` gets the address
 * without the port, which is the key. */
int tsr_rpc__ratelog_note(tsr_rpc__ratelog *rl, const char *peer,
                          uint64_t now_ns, uint64_t interval_ns,
                          uint64_t *suppressed, char *host, size_t hostlen);
/* The same for a key taken as it is (a socket's name, a uid). */
int tsr_rpc__ratelog_note_key(tsr_rpc__ratelog *rl, const char *key,
                              uint64_t now_ns, uint64_t interval_ns,
                              uint64_t *suppressed);

/* ---- context (ctx.c) --------------------------------------------------- */

#define TSR_RPC__POOL_CLASSES 31 /* 4 KiB << 0 .. 30 */
#define TSR_RPC__PEER_UIDS_MAX 16

struct tsr_rpc_ctx {
  uv_loop_t *loop;
  tsr_rpc_opts o;             /* defaults filled in; o.token -> token */
  char name[TSR_RPC_NAME_MAX + 1];
  uint8_t token[TSR_RPC_TOKEN_MAX];
  tsr_rpc_allocator user_al;  /* what the options gave (or malloc) */
  tsr_rpc_allocator al;       /* counting wrapper around user_al */
  ProtobufCAllocator pb_al;
  uint64_t mem_bytes;         /* atomic */
  void *pool[TSR_RPC__POOL_CLASSES];  /* free lists (next in first word) */
  uint64_t pool_held;
  unsigned users;             /* servers + clients not yet freed */
  tsr_rpc__ratelog refused;   /* log lines about refused peers */
  tsr_rpc__ratelog bad_frames; /* ... about connections closed for bad
                                 frames */
  tsr_rpc__ratelog local_log; /* ... about same-host sockets and peers of
                                 untrusted uids */
  unsigned self_uid;          /* geteuid() */
  unsigned peer_uids[TSR_RPC__PEER_UIDS_MAX]; /* TESSERA_RPC_PEER_UIDS */
  unsigned npeer_uids;
};

/* Logs a refused peer (rate limited per address, opts.refuse_log_ms):
 * "rpc NAME: refused peer ADDR: why (and N more refusals of ADDR since
 * its last line)". Loop thread only. */
void tsr_rpc__log_refused(tsr_rpc_ctx *ctx, const char *peer,
                          const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Logs a connection closed for a bad frame (one that fails its integrity
 * check or does not parse: what a relay that changes frames causes),
 * rate limited alike per peer address ("ip:port", or a client's
 * "host:port" of its server): "rpc NAME: TEXT (and N more bad frames from
 * HOST ...)". */
void tsr_rpc__log_bad_frame(tsr_rpc_ctx *ctx, const char *peer,
                            const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

void *tsr_rpc__alloc(tsr_rpc_ctx *ctx, size_t n);
void *tsr_rpc__calloc(tsr_rpc_ctx *ctx, size_t n);
void tsr_rpc__free(tsr_rpc_ctx *ctx, void *p);
char *tsr_rpc__strdup(tsr_rpc_ctx *ctx, const char *s);
/* Receive buffers of any size, reused through per-size-class free lists
 * (bounded by opts.pool_bytes). Loop thread only. */
void *tsr_rpc__buf_get(tsr_rpc_ctx *ctx, size_t n);
void tsr_rpc__buf_put(tsr_rpc_ctx *ctx, void *p, size_t n);
uint64_t tsr_rpc__mem(const tsr_rpc_ctx *ctx);

/* Exponential backoff with jitter: attempt 0 -> ~min, doubling, capped. */
uint64_t tsr_rpc__backoff_ms(const tsr_rpc_opts *o, unsigned attempt);
/* Splits "host:port" / "[v6]:port"; 0 or TSR_EINVAL with a message. */
int tsr_rpc__split_addr(const char *addr, char *host, size_t hostcap,
                        char *port, size_t portcap, char *err, size_t errlen);
void tsr_rpc__fmt_sockaddr(const struct sockaddr *sa, char *out, size_t cap);
/* The address to use from a resolver answer: the first IPv4 one, else the
 * first. Servers and clients pick alike, so "localhost" on both ends
 * meets even where it resolves to ::1 and 127.0.0.1. */
const struct addrinfo *tsr_rpc__pick_addr(const struct addrinfo *res);

/* ---- request id map (idmap.c) ------------------------------------------ */

typedef struct tsr_rpc__idmap {
  uint64_t *keys;             /* 0 = empty (ids are never 0) */
  void **vals;
  size_t cap, len;
  tsr_rpc_ctx *ctx;
} tsr_rpc__idmap;

void tsr_rpc__idmap_init(tsr_rpc__idmap *m, tsr_rpc_ctx *ctx);
void tsr_rpc__idmap_free(tsr_rpc__idmap *m);
/* 0, TSR_EDUPID when present, TSR_ENOMEM. */
int tsr_rpc__idmap_put(tsr_rpc__idmap *m, uint64_t id, void *v);
void *tsr_rpc__idmap_get(const tsr_rpc__idmap *m, uint64_t id);
void *tsr_rpc__idmap_del(tsr_rpc__idmap *m, uint64_t id);

/* ---- injected requests (server.c), for the fuzz targets --------------- */

/* Hands a request to a method's handler as if it had arrived complete on
 * a connection that is already gone: decoded, its payload in a buffer of
 * its own, the answer accepted and dropped (done callbacks report
 * TSR_ECLOSED). Lets a fuzz target drive a service without sockets.
 * TSR_ENOMETHOD, TSR_ETOOBIG, TSR_EPROTO (meta does not decode), a
 * payload_alloc refusal or TSR_ENOMEM; 0 once the handler ran. */
int tsr_rpc__server_inject(tsr_rpc_server *s, uint32_t method, uint64_t id,
                           const void *meta, size_t meta_len,
                           const void *payload, size_t payload_len);

/* ---- connection (conn.c) ----------------------------------------------- */

typedef struct tsr_rpc__conn tsr_rpc__conn;

typedef struct tsr_rpc__conn_ops {
  tsr_rpc__rx_ops rx;
  void (*on_ready)(tsr_rpc__conn *c);                 /* handshake done */
  /* The connection is going away (called once): fail what hangs on it. */
  void (*on_down)(tsr_rpc__conn *c, int status, const char *msg);
  void (*on_freed)(tsr_rpc__conn *c);                 /* handles closed */
  /* A write completed (after its own callback): a chance to resume. */
  void (*on_drain)(tsr_rpc__conn *c);
} tsr_rpc__conn_ops;

enum { TSR_RPC__C_HS, TSR_RPC__C_READY, TSR_RPC__C_FLUSH,
       TSR_RPC__C_CLOSING };

typedef void (*tsr_rpc__sent_cb)(tsr_rpc__conn *c, int status, void *data);

/* A connection's byte stream: TCP, or the same-host Unix socket
 * (local.c). Nothing above the stream knows which. */
typedef union tsr_rpc__sock {
  uv_handle_t handle;
  uv_stream_t stream;
  uv_tcp_t tcp;
  uv_pipe_t pipe;
} tsr_rpc__sock;

struct tsr_rpc__conn {
  tsr_rpc__sock sock;
  int local;                  /* sock is the Unix socket (set before
                                 conn_init, which keeps it) */
  int local_trusted;          /* local, and the kernel says the other end
                                 runs as a trusted uid (local_vet) */
  int quiet_down;             /* the reason it goes down was logged, rate
                                 limited: the owner adds no line */
  uv_timer_t timer;
  uv_check_t check;           /* reports writes that went out at once */
  tsr_list done;              /* such writes, oldest first */
  tsr_rpc_ctx *ctx;
  const tsr_rpc__conn_ops *ops;
  void *owner;
  int role;
  int state;
  int handles;                /* open handles */
  int reading;
  tsr_rpc__hs hs;
  tsr_rpc__rx rx;
  char peer[TSR_RPC_ADDR_MAX];
  char peer_name[TSR_RPC_NAME_MAX + 1];
  uint64_t started_ns, ready_ns;
  uint64_t last_rx_ns, last_tx_ns;
  uint64_t wq_bytes;          /* queued, not yet written */
  uint32_t writes;            /* write requests not yet reported */
  uint32_t uv_writes;         /* of which handed to uv_write */
  uint32_t inflight;          /* calls in flight on this connection */
  int paused;
  uint64_t bytes_in, bytes_out, frames_in, frames_out, calls;
  uint64_t last_progress_ns;  /* a write that had to wait completed */
  int down;                   /* on_down has run */
  tsr_rpc__mac txmac;         /* frames sent (on once handshaken) */
  tsr_rpc_stats *agg;         /* owner totals to add to */
  tsr_list link;              /* owner's list */
};

/* Initialises c around an accepted or a connecting stream (c->sock is
 * initialised by this call, as a pipe when c->local was set before, else
 * as TCP; a server accepts into it afterwards). */
int tsr_rpc__conn_init(tsr_rpc__conn *c, tsr_rpc_ctx *ctx, int role,
                       const tsr_rpc__conn_ops *ops, void *owner);
/* The TCP connection is up (accepted or connected): start the handshake
 * and its timeout. */
int tsr_rpc__conn_start(tsr_rpc__conn *c);
/* A client's connect has started: the handshake deadline runs from now
 * (a connect that hangs is dropped at the same deadline). */
void tsr_rpc__conn_watch(tsr_rpc__conn *c);
/* Sends one frame: header, meta (copied), payload (not copied; valid
 * until cb). 0, or TSR_ECLOSED / TSR_ENOMEM / a libuv code with no
 * callback. */
int tsr_rpc__conn_send(tsr_rpc__conn *c, const tsr_rpc__hdr *h,
                       const void *meta, const uv_buf_t *payload,
                       unsigned npayload, tsr_rpc__sent_cb cb, void *data);
/* Sends an error frame. */
int tsr_rpc__conn_send_err(tsr_rpc__conn *c, uint64_t id, uint32_t method,
                           int code, const char *msg, tsr_rpc__sent_cb cb,
                           void *data);
/* Closes now: on_down, then the handles, then on_freed. Idempotent. */
void tsr_rpc__conn_close(tsr_rpc__conn *c, int status, const char *msg);
/* Stops reading, lets queued writes go out (bounded wait), then closes. */
void tsr_rpc__conn_close_after_flush(tsr_rpc__conn *c, int status,
                                     const char *msg);
void tsr_rpc__conn_pause(tsr_rpc__conn *c);
void tsr_rpc__conn_resume(tsr_rpc__conn *c);

/* ---- the same-host transport (local.c) ---------------------------------- */

/* Reads who may share plain frames over the same-host socket: this
 * process's euid, and the uids in TESSERA_RPC_PEER_UIDS. 0, or
 * TSR_ECONFIG (logged, naming the variable and its value). */
int tsr_rpc__local_init(tsr_rpc_ctx *ctx);
/* Non-zero when a same-host peer running as `uid` is trusted. */
int tsr_rpc__local_uid_ok(const tsr_rpc_ctx *ctx, unsigned uid);
/* Non-zero unless the context is TCP only. */
int tsr_rpc__local_wanted(const tsr_rpc_ctx *ctx);
/* Initialises `pipe` (the caller closes it in every case) and listens on
 * the abstract Unix name of `bound` (the address the TCP listener bound);
 * the name, for logs, goes to `name`. 0 or a libuv code (UV_EADDRINUSE:
 * the name is taken). */
int tsr_rpc__local_listen(tsr_rpc_ctx *ctx, const struct sockaddr *bound,
                          uv_pipe_t *pipe, uv_connection_cb cb, char *name,
                          size_t namecap);
/* A connected non-blocking Unix socket to the server behind `peer` when
 * one listens in this network namespace as a trusted uid (its name to
 * `name`), else -1: use TCP. Every name held by an untrusted uid is
 * logged and counted in *untrusted. */
int tsr_rpc__local_connect(tsr_rpc_ctx *ctx, const struct sockaddr *peer,
                           char *name, size_t namecap, uint64_t *untrusted);
/* Asks the kernel who is at the other end of a connected same-host
 * socket: non-zero when its uid is trusted (this end may ask for plain
 * frames). With `peer` (a server's accepted connection) it also names
 * the peer, "unix:pid N" (" uid U" added when untrusted), and logs an
 * untrusted one (rate limited per uid). */
int tsr_rpc__local_vet(tsr_rpc_ctx *ctx, uv_pipe_t *pipe, char *peer,
                       size_t cap);

#endif /* TSR_RPC_INT_H */
