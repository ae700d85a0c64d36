/* Tessera RPC: framed, multiplexed, authenticated calls over TCP on libuv
 * (and over a Unix domain socket to a peer on the same host, see
 * TSR_RPC_TRANSPORT_AUTO).
 *
 * Happy path. A process makes one context per loop (tsr_rpc_ctx_new) from
 * its options (limits, the cluster token, a name for logs). A server
 * registers every method it answers, then listens; a client connects to one
 * peer ("host:port") and multiplexes calls over one TCP connection, each
 * call with a deadline and a completion callback. Each connection opens
 * with a handshake (magic, protocol version, mutual HMAC proof of the
 * cluster token over fresh nonces); only then are frames read. A frame is a
 * fixed 32-byte little-endian header, the protobuf-c meta message (its
 * schema belongs to the method, the RPC layer only carries the bytes), the
 * raw payload, then a 16-byte MAC (Poly1305 under a per-connection,
 * per-direction session key from the handshake and the frame's number):
 * a frame altered, replayed, reordered or dropped on the way closes the
 * connection (logged), so nothing a relay without the token touched is
 * ever handed to a handler or a caller. Both ends may agree to plain
 * frames on a trusted network (opts.plain_frames on both). A connection
 * over the same-host Unix socket (local.c) has plain frames when each end
 * has asked the kernel who the other is (SO_PEERCRED) and found this
 * process's own uid or one named in TESSERA_RPC_PEER_UIDS: then no
 * stranger can be in between, and a MAC would only cost both ends a pass
 * over every byte. A socket name held by another uid (any local user may
 * bind an abstract name first and relay) is not used by a client, and a
 * peer of another uid gets the MAC. Payload bytes are never copied: the
 * sender passes them
 * as its own uv_buf_t array (written with one gathered uv_write), the
 * receiver reads them straight into their destination (a buffer named by
 * the caller for a response, or one chosen by the method's payload
 * allocator for a request).
 *
 * Failure modes. Lengths are checked against the limits before anything is
 * allocated; a frame over a limit gets an error answer where the stream
 * still makes sense, then its connection is closed while the server keeps
 * serving others. A peer without the token, with the wrong one, or with
 * another protocol version is refused and logged with its address (one
 * line per address per refuse_log_ms, with a count of the rest). A
 * dropped connection fails every call written on it at once (TSR_ECLOSED)
 * and the client reconnects with exponential backoff and jitter; calls not
 * yet written wait for the connection until their deadline. Silent peers
 * are detected by heartbeats (and TCP keepalive). In-flight calls per
 * connection are bounded: over the bound a call fails at once with
 * TSR_EBUSY, and a server stops reading from a peer that does not read its
 * answers (backpressure through TCP, never unbounded memory).
 *
 * Threads. Everything runs on the context's loop thread; a compute thread
 * hands its calls to the loop (the worker does so with its own uv_async).
 * Callbacks always run on the loop thread, never from inside the function
 * that registered them.
 *
 * Shutdown. Close every server and client (their callbacks report when all
 * their handles are closed), then free the context; uv_loop_close() then
 * returns 0.
 *
 * Signals. A process that uses this layer must ignore SIGPIPE
 * (signal(SIGPIPE, SIG_IGN)): libuv writes with plain writev, and a peer
 * that leaves mid-write must fail that connection, not end the process.
 */
#ifndef TSR_RPC_H
#define TSR_RPC_H

#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>
#include <uv.h>

/* Protocol version spoken by this build; a peer with another version is
 * refused with a message naming both. */
#define TSR_RPC_VERSION 2
/* Fixed frame header size on the wire (bytes). */
#define TSR_RPC_HEADER_SIZE 32
/* Longest cluster token accepted (bytes). */
#define TSR_RPC_TOKEN_MAX 1024
/* Longest name a peer announces in the handshake (bytes, without NUL). */
#define TSR_RPC_NAME_MAX 31
/* Longest "host:port" text of a peer address, with NUL. */
#define TSR_RPC_ADDR_MAX 64

/* ---- options and context ------------------------------------------------ */

/* Memory hook. Lets a test fail allocations in turn and lets the stats
 * count what the library holds. `alloc` returns NULL on failure; `free`
 * accepts NULL. Called on the loop thread. */
typedef struct tsr_rpc_allocator {
  void *(*alloc)(void *ctx, size_t size);
  void (*free)(void *ctx, void *ptr);
  void *ctx;
} tsr_rpc_allocator;

/* Options for a context. A zero field takes the default named beside it, so
 * `tsr_rpc_opts o = {0}; o.token = ...` is a valid start. Every limit is
 * per connection unless said otherwise. */
typedef struct tsr_rpc_opts {
  const char *name;             /* for logs and the handshake ("ps:0");
                                   copied, cut at TSR_RPC_NAME_MAX */
  const void *token;            /* cluster token, required; copied */
  size_t token_len;             /* 1..TSR_RPC_TOKEN_MAX */
  uint32_t max_meta_bytes;      /* meta limit; default 1 MiB */
  uint64_t max_payload_bytes;   /* payload limit; default 1 GiB */
  uint32_t max_inflight;        /* calls in flight per connection (client:
                                   submitted and not completed, more fail
                                   with TSR_EBUSY; server: received and not
                                   answered, more are answered TSR_EBUSY);
                                   default 1024 */
  uint64_t max_write_queue;     /* server: bytes queued for writing on one
                                   connection before it stops reading from
                                   that peer; default 64 MiB */
  uint32_t handshake_timeout_ms;/* connect + handshake; default 5000 */
  uint32_t heartbeat_ms;        /* client pings an idle connection this
                                   often, the server answers; must be below
                                   idle_timeout_ms; default 1000 */
  uint32_t idle_timeout_ms;     /* a connection that received no byte (and
                                   whose queued writes did not drain) for
                                   this long is dead: its calls fail with
                                   TSR_ECLOSED; default 10000 */
  uint32_t backoff_min_ms;      /* first reconnect delay; default 50 */
  uint32_t backoff_max_ms;      /* reconnect delay cap; default 5000 */
  uint32_t default_deadline_ms; /* for calls that give none; default 30000 */
  uint64_t pool_bytes;          /* receive buffers kept for reuse, per
                                   context; default 256 MiB */
  int fail_fast;                /* non-zero: a call made while the peer is
                                   known unreachable fails at once with
                                   TSR_EUNAVAIL instead of waiting for the
                                   connection until its deadline */
  const tsr_rpc_allocator *allocator; /* NULL: malloc/free; copied */
  uint32_t refuse_log_ms;       /* refused peers, connections closed for
                                   bad frames, same-host sockets of
                                   untrusted uids: at most one log line per
                                   address (or name) per this many ms, with
                                   a count of those suppressed; default
                                   10000 */
  int plain_frames;             /* non-zero: ask peers for frames without a
                                   MAC (a trusted network). Frames carry a
                                   MAC unless both ends ask; default 0 */
  int transport;                /* TSR_RPC_TRANSPORT_*; default AUTO, or
                                   TCP when the environment says
                                   TESSERA_RPC_TRANSPORT=tcp */
} tsr_rpc_opts;

/* Transports. AUTO: a server listens on TCP and on a Unix domain socket
 * named after the address it bound (an abstract name, so it lives in the
 * network namespace: the processes that reach the same listener over TCP
 * through loopback or one of this host's addresses); a client whose peer
 * has such a socket, held by a process of this uid or one named in
 * TESSERA_RPC_PEER_UIDS, uses it, any other peer TCP. The handshake and
 * the frames are the same on both. TCP: TCP only, at this end. */
enum { TSR_RPC_TRANSPORT_AUTO = 0, TSR_RPC_TRANSPORT_TCP = 1 };

typedef struct tsr_rpc_ctx tsr_rpc_ctx;

/* Makes a context bound to `loop`. Fails with TSR_ECONFIG (and a logged
 * reason) when there is no token or a limit makes no sense, TSR_ENOMEM
 * when memory runs out. The context opens no handle. */
int tsr_rpc_ctx_new(tsr_rpc_ctx **out, uv_loop_t *loop,
                    const tsr_rpc_opts *opts);
/* Frees the context. Every server and client made from it must have
 * finished closing (TSR_EBUSY otherwise, and nothing is freed). */
int tsr_rpc_ctx_free(tsr_rpc_ctx *ctx);
uv_loop_t *tsr_rpc_ctx_loop(const tsr_rpc_ctx *ctx);
/* The options in force, defaults filled in (the token is not exposed). */
void tsr_rpc_ctx_opts(const tsr_rpc_ctx *ctx, tsr_rpc_opts *out);

/* ---- cluster token ------------------------------------------------------ */

/* Reads the cluster token: from the file `path` when it is not NULL (the
 * --token-file flag; one trailing newline is dropped), else from the
 * environment variable TESSERA_TOKEN. Writes it to buf (capacity `cap`)
 * and its length to *len. Errors (TSR_ECONFIG, TSR_EIO, TSR_ETOOBIG) come
 * with a message in err that names the file or the variable, e.g. when
 * neither is set or the token is empty. */
int tsr_rpc_token_load(const char *path, void *buf, size_t cap, size_t *len,
                       char *err, size_t errlen);
/* Whether this process asks for plain frames (no MAC; only on a trusted
 * network, and only where every peer asks too): `flag` ("on" or "off",
 * from a --frame-mac flag; NULL when not given) wins over the environment
 * variable TESSERA_FRAME_MAC (on|off|1|0|true|false|yes|no; unset: on).
 * *plain = 1 for "off". TSR_ECONFIG with a message naming the flag or the
 * variable and the value otherwise. */
int tsr_rpc_frame_mac_setting(const char *flag, int *plain, char *err,
                              size_t errlen);
/* Writes a fresh random token as lowercase hex: len - 1 characters and a
 * NUL (len >= 33, i.e. at least 128 random bits; TSR_EINVAL otherwise),
 * for launchers that start a whole cluster and hand every process the
 * same token. */
int tsr_rpc_token_generate(char *buf, size_t len);

/* ---- server ------------------------------------------------------------- */

typedef struct tsr_rpc_server tsr_rpc_server;

/* One received request. The public fields are read-only for the handler
 * except `user`. The call, its meta, its decoded request and its payload
 * stay valid until the answer (tsr_rpc_reply or tsr_rpc_reply_error) has
 * been written or has failed, i.e. until the reply's done callback: so a
 * reply may send bytes straight out of the request payload (an echo).
 * Every call must be answered exactly once; a handler may answer later
 * (e.g. a sync-mode parameter server holding pushes until every worker has
 * pushed). Answering a call whose connection died is allowed: the answer
 * is dropped and its done callback reports TSR_ECLOSED. */
typedef struct tsr_rpc_incoming {
  uint32_t method;
  uint64_t id;                 /* the caller's request id */
  const uint8_t *meta;         /* the request meta bytes (may be NULL/0) */
  size_t meta_len;
  void *request;               /* decoded meta (ProtobufCMessage *) when the
                                  method names a request_type, else NULL */
  void *payload;               /* request payload (NULL when empty); in the
                                  method's own buffer when its payload_alloc
                                  gave one, else in a library buffer
                                  (16-byte aligned) */
  size_t payload_len;
  const char *peer;            /* "ip:port" of the caller ("unix:pid N"
                                  over the same-host socket, "unix:pid N
                                  uid U" from an untrusted uid) */
  const char *peer_name;       /* the name the caller announced */
  uint64_t recv_ns;            /* tsr_now_ns() when the frame was complete */
  void *user;                  /* free for the handler */
} tsr_rpc_incoming;

typedef void (*tsr_rpc_handler)(tsr_rpc_incoming *call, void *data);

/* Chooses where a request payload lands, after the meta has arrived (and
 * has been decoded, when the method names a request_type) and before the
 * first payload byte is read. Return 0 with *buf pointing at `len`
 * writable bytes to receive the payload there (e.g. straight into a shard
 * or a pinned buffer; the memory belongs to the method, the library never
 * frees it); 0 with *buf NULL to take a library buffer; a negative code to
 * refuse: the payload is skipped and the call answered with that code. */
typedef int (*tsr_rpc_payload_alloc_cb)(tsr_rpc_incoming *call, size_t len,
                                        void **buf, void *data);
/* The connection died (or the server closed) while a payload was landing
 * in a buffer from payload_alloc: the handler will never see this call,
 * the buffer is handed back. `status` says why. */
typedef void (*tsr_rpc_payload_abort_cb)(tsr_rpc_incoming *call, void *buf,
                                         int status, void *data);

typedef struct tsr_rpc_method {
  uint32_t method;                        /* the method number, != 0 */
  const char *name;                       /* for logs and stats; copied */
  tsr_rpc_handler handler;                /* required */
  void *data;                             /* passed to every callback */
  const ProtobufCMessageDescriptor *request_type; /* optional: the meta is
                                  decoded before the handler runs; a meta
                                  that does not decode is answered with
                                  TSR_EPROTO and the handler never runs */
  tsr_rpc_payload_alloc_cb payload_alloc; /* optional */
  tsr_rpc_payload_abort_cb payload_abort; /* optional (with payload_alloc) */
} tsr_rpc_method;

/* Makes a server that answers through `ctx`. Opens no handle until listen. */
int tsr_rpc_server_new(tsr_rpc_server **out, tsr_rpc_ctx *ctx);
/* Registers a method. Every method must be registered before listen: a
 * request must never arrive before its handler (TSR_EINVAL after listen,
 * TSR_EEXISTS for a number already taken). */
int tsr_rpc_server_register_method(tsr_rpc_server *s,
                                   const tsr_rpc_method *m);
/* Shorthand for a method with only a handler. */
int tsr_rpc_server_register(tsr_rpc_server *s, uint32_t method,
                            tsr_rpc_handler handler, void *data);
/* Binds and listens on "host:port" (host an IPv4/IPv6 literal, "[v6]", or
 * a name resolved now; port 0 picks a free port, see
 * tsr_rpc_server_port). Errors name the address (logged). */
int tsr_rpc_server_listen(tsr_rpc_server *s, const char *addr);
/* The bound port after a successful listen, else 0. */
int tsr_rpc_server_port(const tsr_rpc_server *s);

typedef void (*tsr_rpc_close_cb)(void *data);
/* Stops listening, closes every connection (calls being read are dropped,
 * held calls are marked dead: their answers are accepted and dropped).
 * `cb` runs once every handle is closed and every held call has been
 * answered, after which the server is freed: a handler that holds calls
 * must answer them (e.g. tsr_rpc_reply_error(call, TSR_ESHUTDOWN, ...))
 * for the close to finish. */
void tsr_rpc_server_close(tsr_rpc_server *s, tsr_rpc_close_cb cb,
                          void *data);

/* Done callback of an answer: 0 once the answer has been handed to the
 * kernel, TSR_ECLOSED (or a libuv code) when its connection is gone. The
 * call and its payload are released right after it returns. */
typedef void (*tsr_rpc_done_cb)(int status, void *data);

/* Answers a call with meta bytes (copied before return) and payload
 * buffers (not copied: they must stay valid until `done`). Consumes the
 * call on 0: `done` (may be NULL) then runs exactly once, later, on the
 * loop. On a negative return (TSR_EINVAL, TSR_ETOOBIG: the answer breaks
 * the peer's limits) the call is NOT consumed, so it can still be answered
 * with an error. Loop thread only. */
int tsr_rpc_reply(tsr_rpc_incoming *call, const void *meta, size_t meta_len,
                  const uv_buf_t *payload, unsigned npayload,
                  tsr_rpc_done_cb done, void *data);
/* Answers a call with an error code (the project's own, or a libuv code)
 * and a message (copied; may be NULL for the code's own text). Always
 * consumes the call; returns 0. The caller sees the same code and message. */
int tsr_rpc_reply_error(tsr_rpc_incoming *call, int code,
                        const char *message);
/* Non-zero once the call's connection is gone: an answer would be dropped,
 * so a long computation may stop early (it must still answer). */
int tsr_rpc_incoming_dead(const tsr_rpc_incoming *call);

/* ---- client ------------------------------------------------------------- */

typedef struct tsr_rpc_client tsr_rpc_client;

/* Makes a client for the peer at "host:port" (IPv4/IPv6 literal, "[v6]",
 * or a name resolved at every connection attempt) and starts connecting at
 * once. It reconnects after every loss, with exponential backoff between
 * backoff_min_ms and backoff_max_ms and random jitter, until closed. */
int tsr_rpc_client_new(tsr_rpc_client **out, tsr_rpc_ctx *ctx,
                       const char *addr);

/* Connection state changes, for callers that track peers (the chief):
 * connected = 1 once a handshake succeeded, 0 when that connection is
 * lost (status says why). Never called after close. */
typedef void (*tsr_rpc_state_cb)(tsr_rpc_client *c, int connected,
                                 int status, void *data);
void tsr_rpc_client_on_state(tsr_rpc_client *c, tsr_rpc_state_cb cb,
                             void *data);
/* Non-zero while a handshaken connection is up. */
int tsr_rpc_client_connected(const tsr_rpc_client *c);

/* Outcome of a call, valid only during the callback. */
typedef struct tsr_rpc_result {
  int status;               /* 0; a local code (TSR_ETIMEOUT, TSR_ECLOSED,
                               TSR_EUNAVAIL, TSR_ESHUTDOWN, TSR_EPROTO,
                               TSR_ESHAPE...); or the remote's own code */
  int remote;               /* non-zero when status came from the peer */
  const char *message;      /* never NULL: the remote's message, or what
                               went wrong here, naming the peer */
  const uint8_t *meta;      /* response meta bytes (status 0 only) */
  size_t meta_len;
  void *payload;            /* response payload: resp_buf when the request
                               named one, else a library buffer valid until
                               the callback returns */
  size_t payload_len;
  uint64_t latency_ns;      /* submit to completion */
} tsr_rpc_result;

typedef void (*tsr_rpc_call_cb)(const tsr_rpc_result *r, void *data);

/* Flags of a request. */
enum {
  /* A response payload shorter than resp_len is accepted (the result says
   * how long it was). Without it the size must match exactly. */
  TSR_RPC_RESP_UPTO = 1u << 0,
};

/* A request. Zero-initialise and fill; new fields only ever get added with
 * zero meaning the old behaviour. */
typedef struct tsr_rpc_request {
  uint32_t method;
  const void *meta;         /* copied before tsr_rpc_call returns */
  size_t meta_len;
  const uv_buf_t *payload;  /* array copied; the memory it points at is NOT
                               copied and must stay valid until the
                               callback */
  unsigned npayload;
  void *resp_buf;           /* optional destination of the response payload:
                               the bytes are read straight into it. A
                               response of another size fails the call with
                               TSR_ESHAPE. After a failed call its content
                               is unspecified, but the library no longer
                               touches it once the callback has run. */
  size_t resp_len;
  uint32_t deadline_ms;     /* from submission; 0: default_deadline_ms.
                               Past it the call fails with TSR_ETIMEOUT
                               (TSR_EUNAVAIL if it never left for want of
                               a connection). The callback comes later
                               only while the request's payload is still
                               being written (its memory is in use): at
                               worst idle_timeout_ms later */
  uint32_t flags;           /* TSR_RPC_RESP_* */
} tsr_rpc_request;

/* Starts a call. On 0, `cb` runs exactly once, later, on the loop thread.
 * On a negative return `cb` never runs: TSR_EBUSY (max_inflight calls are
 * already in flight: back off), TSR_ETOOBIG (meta or payload over the
 * limits), TSR_EUNAVAIL (fail_fast and the peer is unreachable),
 * TSR_ESHUTDOWN (closing), TSR_EINVAL, TSR_ENOMEM. Loop thread only. */
int tsr_rpc_call(tsr_rpc_client *c, const tsr_rpc_request *req,
                 tsr_rpc_call_cb cb, void *data);
/* tsr_rpc_call with `msg` packed as the meta (req->meta and meta_len are
 * not read); TSR_ENOMEM when the packed message finds no memory. */
int tsr_rpc_call_msg(tsr_rpc_client *c, const tsr_rpc_request *req,
                     const ProtobufCMessage *msg, tsr_rpc_call_cb cb,
                     void *data);
/* Fails every call not yet completed with TSR_ESHUTDOWN, closes the
 * connection and every handle; `cb` runs once all are closed, then the
 * client is freed. */
void tsr_rpc_client_close(tsr_rpc_client *c, tsr_rpc_close_cb cb,
                          void *data);

/* ---- statistics --------------------------------------------------------- */

typedef struct tsr_rpc_stats {
  uint64_t bytes_in;        /* every byte read, handshakes included */
  uint64_t bytes_out;       /* every byte written */
  uint64_t frames_in;
  uint64_t frames_out;
  uint64_t calls;           /* server: requests answered; client: calls
                               completed */
  uint64_t errors;          /* calls that ended with a non-zero status */
  uint64_t connects;        /* handshakes that succeeded */
  uint64_t connects_local;  /* of which over the same-host Unix socket */
  uint64_t connects_plain;  /* of which with frames without a MAC (both
                               ends asked: plain_frames, or a same-host
                               socket whose other end the kernel showed
                               to run as a trusted uid) */
  uint64_t local_untrusted; /* same-host sockets whose other end runs as
                               an untrusted uid: client: names not used
                               (TCP instead), server: connections served
                               with a MAC on every frame */
  uint64_t refused;         /* handshakes refused (token, version, magic,
                               timeout) */
  uint32_t connections;     /* open now */
  uint32_t inflight;        /* calls in flight now */
  uint32_t paused;          /* server: connections not read for
                               backpressure now */
  uint64_t mem_bytes;       /* bytes the context holds from its allocator
                               now (context-wide in every stats) */
} tsr_rpc_stats;

typedef struct tsr_rpc_method_stats {
  uint32_t method;
  const char *name;         /* as registered */
  uint64_t calls;           /* completed */
  uint64_t errors;
  uint64_t bytes_in;        /* meta + payload received for this method */
  uint64_t bytes_out;       /* meta + payload sent for this method */
  uint64_t total_ns;        /* arrival to answer written, summed */
  uint64_t max_ns;
} tsr_rpc_method_stats;

void tsr_rpc_server_stats(const tsr_rpc_server *s, tsr_rpc_stats *out);
void tsr_rpc_client_stats(const tsr_rpc_client *c, tsr_rpc_stats *out);
/* Per-method figures, one entry per registered method, written to
 * out[0..cap); returns how many exist (may exceed cap). */
size_t tsr_rpc_server_method_stats(const tsr_rpc_server *s,
                                   tsr_rpc_method_stats *out, size_t cap);

/* One open server connection, for status reports. */
typedef struct tsr_rpc_conn_info {
  const char *peer;         /* "ip:port", or "unix:pid N" for a peer on
                               the same-host socket */
  const char *peer_name;    /* announced in the handshake */
  uint64_t bytes_in, bytes_out;
  uint64_t calls;
  uint32_t inflight;
  int paused;               /* not read for backpressure */
  uint64_t connected_ns;    /* tsr_now_ns() at the handshake */
} tsr_rpc_conn_info;
/* Calls `cb` for every handshaken connection; returns how many. */
size_t tsr_rpc_server_foreach_conn(const tsr_rpc_server *s,
                                   void (*cb)(const tsr_rpc_conn_info *info,
                                              void *data),
                                   void *data);

#endif /* TSR_RPC_H */
