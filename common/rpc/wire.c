/* Frame header and error meta encoding.
 *
 * Happy path: the sender fills a tsr_rpc__hdr and encodes 32 bytes; the
 * receiver decodes them and learns how many meta and payload bytes follow.
 * Failure modes: anything a peer could get wrong (magic, version, kind,
 * flags, a kind carrying what it must not, a length over the limits) is
 * refused here with a message naming the field and value, before the
 * receiver allocates a byte for the frame.
 */
#include "common/rpc/rpc_int.h"

#include "common/err.h"
#include "rpc.pb-c.h"

#include <stdio.h>

const char *tsr_rpc__kind_name(unsigned kind) {
  switch (kind) {
    case TSR_RPC__REQ: return "request";
    case TSR_RPC__RESP: return "response";
    case TSR_RPC__ERR: return "error";
    case TSR_RPC__PING: return "ping";
    case TSR_RPC__PONG: return "pong";
    default: return "unknown";
  }
}

void tsr_rpc__hdr_encode(uint8_t out[TSR_RPC_HEADER_SIZE],
                         const tsr_rpc__hdr *h) {
  tsr_rpc__put32(out, TSR_RPC__FRAME_MAGIC);
  out[4] = h->version;
  out[5] = h->kind;
  out[6] = (uint8_t)h->flags;
  out[7] = (uint8_t)(h->flags >> 8);
  tsr_rpc__put32(out + 8, h->method);
  tsr_rpc__put32(out + 12, h->meta_len);
  tsr_rpc__put64(out + 16, h->id);
  tsr_rpc__put64(out + 24, h->payload_len);
}

int tsr_rpc__hdr_decode(const uint8_t in[TSR_RPC_HEADER_SIZE],
                        const tsr_rpc__limits *lim, tsr_rpc__hdr *h,
                        char *msg, size_t msglen) {
  uint32_t magic = tsr_rpc__get32(in);
  h->version = in[4];
  h->kind = in[5];
  h->flags = (uint16_t)(in[6] | in[7] << 8);
  h->method = tsr_rpc__get32(in + 8);
  h->meta_len = tsr_rpc__get32(in + 12);
  h->id = tsr_rpc__get64(in + 16);
  h->payload_len = tsr_rpc__get64(in + 24);
  if (magic != TSR_RPC__FRAME_MAGIC) {
    snprintf(msg, msglen, "bad frame magic 0x%08x (expected 0x%08x)", magic,
             TSR_RPC__FRAME_MAGIC);
    return TSR_EPROTO;
  }
  if (h->version != TSR_RPC_VERSION) {
    snprintf(msg, msglen,
             "frame of protocol version %u, this side speaks version %u",
             h->version, TSR_RPC_VERSION);
    return TSR_EVERSION;
  }
  if (h->kind < TSR_RPC__REQ || h->kind > TSR_RPC__PONG) {
    snprintf(msg, msglen, "unknown frame kind %u", h->kind);
    return TSR_EPROTO;
  }
  if (h->flags != 0) {
    snprintf(msg, msglen, "%s frame with unknown flags 0x%04x",
             tsr_rpc__kind_name(h->kind), h->flags);
    return TSR_EPROTO;
  }
  if (h->kind == TSR_RPC__PING || h->kind == TSR_RPC__PONG) {
    if (h->meta_len || h->payload_len || h->method) {
      snprintf(msg, msglen, "%s frame carries data (meta %u, payload %llu)",
               tsr_rpc__kind_name(h->kind), h->meta_len,
               (unsigned long long)h->payload_len);
      return TSR_EPROTO;
    }
    return 0;
  }
  if (h->id == 0) {
    snprintf(msg, msglen, "%s frame with request id 0",
             tsr_rpc__kind_name(h->kind));
    /* id 0 is how a peer reports a connection-level error */
    if (h->kind != TSR_RPC__ERR) return TSR_EPROTO;
  }
  if (h->kind == TSR_RPC__REQ && h->method == 0) {
    snprintf(msg, msglen, "request %llu names method 0",
             (unsigned long long)h->id);
    return TSR_EPROTO;
  }
  if (h->kind == TSR_RPC__ERR && h->payload_len) {
    snprintf(msg, msglen, "error frame with a payload of %llu bytes",
             (unsigned long long)h->payload_len);
    return TSR_EPROTO;
  }
  if (h->meta_len > lim->max_meta) {
    snprintf(msg, msglen,
             "%s meta of %u bytes is over the limit of %u (method %u, "
             "request %llu)",
             tsr_rpc__kind_name(h->kind), h->meta_len, lim->max_meta,
             h->method, (unsigned long long)h->id);
    return TSR_ETOOBIG;
  }
  if (h->payload_len > lim->max_payload) {
    snprintf(msg, msglen,
             "%s payload of %llu bytes is over the limit of %llu (method "
             "%u, request %llu)",
             tsr_rpc__kind_name(h->kind), (unsigned long long)h->payload_len,
             (unsigned long long)lim->max_payload, h->method,
             (unsigned long long)h->id);
    return TSR_ETOOBIG;
  }
  return 0;
}

size_t tsr_rpc__err_size(int code, const char *message) {
  Tessera__Rpc__RpcError e = TESSERA__RPC__RPC_ERROR__INIT;
  e.code = code;
  e.message = (char *)(message ? message : "");
  return tessera__rpc__rpc_error__get_packed_size(&e);
}

size_t tsr_rpc__err_encode(int code, const char *message, uint8_t *out) {
  Tessera__Rpc__RpcError e = TESSERA__RPC__RPC_ERROR__INIT;
  e.code = code;
  e.message = (char *)(message ? message : "");
  return tessera__rpc__rpc_error__pack(&e, out);
}

int tsr_rpc__err_decode(const uint8_t *meta, size_t len, int *code,
                        char *msg, size_t msgcap) {
  Tessera__Rpc__RpcError *e =
      tessera__rpc__rpc_error__unpack(NULL, len, meta);
  if (!e) {
    snprintf(msg, msgcap, "error frame whose meta (%zu bytes) does not "
             "decode", len);
    return TSR_EPROTO;
  }
  *code = e->code;
  /* The text goes into logs: keep it printable. */
  size_t i = 0;
  for (const char *s = e->message ? e->message : ""; *s && i + 1 < msgcap;
       s++)
    msg[i++] = (*s >= 0x20 && *s < 0x7f) || (unsigned char)*s >= 0x80
                   ? *s
                   : '?';
  if (msgcap) msg[i] = 0;
  tessera__rpc__rpc_error__free_unpacked(e, NULL);
  /* A code that is not an error would let a failure pass as success. */
  if (*code >= 0) {
    snprintf(msg + i, msgcap > i ? msgcap - i : 0, " (remote sent code %d)",
             *code);
    *code = TSR_EREMOTE;
  }
  return 0;
}
