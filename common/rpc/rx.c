/* The receive state machine: splits a byte stream into frames.
 *
 * Happy path: bytes land in a staging buffer; once a header is complete it
 * is checked (wire.c), then the meta is gathered (in the stage when it
 * fits, else in a buffer of exactly its size), the owner is told (on_head)
 * and names where the payload goes; the payload is copied out of the stage
 * or, once the stage is drained and enough remains, read by the kernel
 * straight into that destination (rx_buf hands out the destination itself,
 * so a large tensor is never copied). A frame whose payload the owner
 * does not want is read into the stage and dropped.
 * With frame MACs on (after the handshake), every byte of a frame is fed
 * to the frame's MAC as it arrives (the payload where it lands, while it
 * is hot in the cache), the 16-byte tag that follows the payload is
 * gathered in the stage, and only a frame whose tag verifies reaches
 * on_frame: an altered, replayed, reordered or dropped frame never gets
 * to a handler or a caller.
 * Failure modes: a bad header, an unexpected kind or a tag that does not
 * verify stops the machine for good with a code, a message, and the
 * request id it concerns, and the owner closes the connection. Nothing is
 * allocated before the header has passed its limits.
 */
#include "common/rpc/rpc_int.h"

#include "common/err.h"

#include <stdio.h>

enum { GIVE_STAGE, GIVE_META, GIVE_DIRECT, GIVE_DISCARD };

int tsr_rpc__rx_init(tsr_rpc__rx *rx, const tsr_rpc__rx_ops *ops,
                     void *owner, const tsr_rpc__limits *lim,
                     uint32_t accept, const tsr_rpc_allocator *al,
                     size_t stage_cap) {
  memset(rx, 0, sizeof *rx);
  rx->ops = ops;
  rx->owner = owner;
  rx->lim = *lim;
  rx->accept = accept;
  rx->al = al;
  rx->stage = al->alloc(al->ctx, stage_cap);
  if (!rx->stage) return TSR_ENOMEM;
  rx->cap = stage_cap;
  rx->state = TSR_RPC__RX_HDR;
  return 0;
}

void tsr_rpc__rx_free(tsr_rpc__rx *rx) {
  if (rx->meta) rx->al->free(rx->al->ctx, rx->meta);
  if (rx->stage) rx->al->free(rx->al->ctx, rx->stage);
  rx->meta = rx->stage = NULL;
  rx->state = TSR_RPC__RX_DEAD;
  tsr_rpc__mac_wipe(&rx->mac);
}

void tsr_rpc__rx_mac_on(tsr_rpc__rx *rx, const uint8_t key[32]) {
  tsr_rpc__mac_init(&rx->mac, key);
}

static size_t direct_min(const tsr_rpc__rx *rx) { return rx->cap / 2; }

void tsr_rpc__rx_buf(tsr_rpc__rx *rx, uint8_t **p, size_t *len) {
  if (rx->beg == rx->end) {
    rx->beg = rx->end = 0;
    if (rx->state == TSR_RPC__RX_PAYLOAD) {
      uint64_t left = rx->h.payload_len - rx->got;
      if (!rx->dst) {
        rx->given = GIVE_DISCARD;
        *p = rx->stage;
        rx->given_p = *p;
        *len = left < rx->cap ? (size_t)left : rx->cap;
        return;
      }
      if (left >= direct_min(rx)) {
        rx->given = GIVE_DIRECT;
        *p = rx->dst + rx->got;
        rx->given_p = *p;
        /* read(2) moves at most 2 GiB - 4 KiB at a time anyway */
        *len = left < (1u << 30) ? (size_t)left : (size_t)1 << 30;
        return;
      }
    } else if (rx->state == TSR_RPC__RX_META && rx->meta) {
      rx->given = GIVE_META;
      *p = rx->meta + rx->meta_got;
      *len = rx->h.meta_len - rx->meta_got;
      return;
    }
  } else if (rx->beg > 0) {
    memmove(rx->stage, rx->stage + rx->beg, rx->end - rx->beg);
    rx->end -= rx->beg;
    rx->beg = 0;
  }
  rx->given = GIVE_STAGE;
  *p = rx->stage + rx->end;
  *len = rx->cap - rx->end;
}

static int rx_fail(tsr_rpc__rx *rx, int code) {
  rx->state = TSR_RPC__RX_DEAD;
  rx->err = code;
  return code;
}

static int finish_frame(tsr_rpc__rx *rx) {
  if (rx->mac.on && rx->state != TSR_RPC__RX_TAG) {
    rx->state = TSR_RPC__RX_TAG; /* the tag first */
    rx->tag_got = 0;
    return 0;
  }
  rx->state = TSR_RPC__RX_HDR;
  void *payload = rx->h.payload_len ? rx->dst : NULL;
  rx->dst = NULL;
  int rc = rx->ops->on_frame(rx, &rx->h, payload);
  if (rc < 0) return rx_fail(rx, rc);
  if (rc == 1) rx->paused = 1;
  return 0;
}

static int head_done(tsr_rpc__rx *rx, const uint8_t *meta) {
  void *dst = NULL;
  if (rx->mac.on) tsr_rpc__mac_update(&rx->mac, meta, rx->h.meta_len);
  int rc = rx->ops->on_head(rx, &rx->h, meta, &dst);
  if (rx->meta) {
    rx->al->free(rx->al->ctx, rx->meta);
    rx->meta = NULL;
  }
  if (rc < 0) return rx_fail(rx, rc);
  rx->dst = dst;
  rx->got = 0;
  rx->state = TSR_RPC__RX_PAYLOAD;
  if (rx->h.payload_len == 0) return finish_frame(rx);
  return 0;
}

static int take_header(tsr_rpc__rx *rx) {
  int rc = tsr_rpc__hdr_decode(rx->stage + rx->beg, &rx->lim, &rx->h,
                               rx->msg, sizeof rx->msg);
  rx->err_id = rx->h.kind == TSR_RPC__REQ ? rx->h.id : 0;
  if (rc) return rx_fail(rx, rc);
  if (!(rx->accept & TSR_RPC__KIND_BIT(rx->h.kind))) {
    snprintf(rx->msg, sizeof rx->msg, "unexpected %s frame (request %llu)",
             tsr_rpc__kind_name(rx->h.kind), (unsigned long long)rx->h.id);
    return rx_fail(rx, TSR_EPROTO);
  }
  rx->err_id = 0;
  if (rx->mac.on) {
    tsr_rpc__mac_begin(&rx->mac, TSR_RPC_HEADER_SIZE +
                                     (uint64_t)rx->h.meta_len +
                                     rx->h.payload_len);
    tsr_rpc__mac_update(&rx->mac, rx->stage + rx->beg, TSR_RPC_HEADER_SIZE);
  }
  rx->beg += TSR_RPC_HEADER_SIZE;
  rx->state = TSR_RPC__RX_META;
  rx->meta_got = 0;
  if (rx->h.meta_len == 0) return head_done(rx, NULL);
  if ((size_t)rx->h.meta_len + TSR_RPC_HEADER_SIZE > rx->cap) {
    rx->meta = rx->al->alloc(rx->al->ctx, rx->h.meta_len);
    if (!rx->meta) {
      snprintf(rx->msg, sizeof rx->msg,
               "out of memory for a meta of %u bytes", rx->h.meta_len);
      rx->err_id = rx->h.kind == TSR_RPC__REQ ? rx->h.id : 0;
      return rx_fail(rx, TSR_ENOMEM);
    }
    size_t take = rx->end - rx->beg;
    if (take > rx->h.meta_len) take = rx->h.meta_len;
    memcpy(rx->meta, rx->stage + rx->beg, take);
    rx->beg += take;
    rx->meta_got = take;
    if (rx->meta_got == rx->h.meta_len) return head_done(rx, rx->meta);
  }
  return 0;
}

int tsr_rpc__rx_process(tsr_rpc__rx *rx) {
  if (rx->busy) return 0;
  rx->busy = 1;
  int rc = 0;
  while (!rc && !rx->paused && rx->state != TSR_RPC__RX_DEAD) {
    size_t avail = rx->end - rx->beg;
    if (rx->state == TSR_RPC__RX_HDR) {
      if (avail < TSR_RPC_HEADER_SIZE) break;
      rc = take_header(rx);
    } else if (rx->state == TSR_RPC__RX_META) {
      if (rx->meta || avail < rx->h.meta_len) break;
      const uint8_t *m = rx->stage + rx->beg;
      rx->beg += rx->h.meta_len;
      rc = head_done(rx, m);
    } else if (rx->state == TSR_RPC__RX_TAG) {
      size_t take = TSR_RPC__TAG_SIZE - rx->tag_got;
      if (take > avail) take = avail;
      if (take == 0) break;
      memcpy(rx->tag + rx->tag_got, rx->stage + rx->beg, take);
      rx->tag_got += take;
      rx->beg += take;
      if (rx->tag_got < TSR_RPC__TAG_SIZE) break;
      uint64_t n = rx->mac.counter;
      if (tsr_rpc__mac_verify(&rx->mac, rx->tag)) {
        snprintf(rx->msg, sizeof rx->msg,
                 "%s frame %llu (request %llu, method %u) fails its "
                 "integrity check: altered, replayed, reordered or dropped "
                 "on the way",
                 tsr_rpc__kind_name(rx->h.kind), (unsigned long long)n,
                 (unsigned long long)rx->h.id, rx->h.method);
        rx->err_id = 0;
        rc = rx_fail(rx, TSR_EAUTH);
        break;
      }
      rc = finish_frame(rx);
    } else {
      uint64_t left = rx->h.payload_len - rx->got;
      size_t take = left < avail ? (size_t)left : avail;
      if (take == 0) break;
      if (rx->mac.on)
        tsr_rpc__mac_update(&rx->mac, rx->stage + rx->beg, take);
      if (rx->dst) memcpy(rx->dst + rx->got, rx->stage + rx->beg, take);
      rx->got += take;
      rx->beg += take;
      if (rx->got < rx->h.payload_len) break;
      rc = finish_frame(rx);
    }
  }
  rx->busy = 0;
  return rc ? rc : (rx->state == TSR_RPC__RX_DEAD ? rx->err : 0);
}

int tsr_rpc__rx_done(tsr_rpc__rx *rx, size_t n) {
  if (rx->state == TSR_RPC__RX_DEAD) return rx->err ? rx->err : TSR_EPROTO;
  switch (rx->given) {
    case GIVE_DIRECT:
    case GIVE_DISCARD:
      if (rx->mac.on) tsr_rpc__mac_update(&rx->mac, rx->given_p, n);
      rx->got += n;
      if (rx->got == rx->h.payload_len) {
        int rc = finish_frame(rx);
        if (rc) return rc;
      }
      break;
    case GIVE_META:
      rx->meta_got += n;
      if (rx->meta_got == rx->h.meta_len) {
        int rc = head_done(rx, rx->meta);
        if (rc) return rc;
      }
      break;
    default:
      rx->end += n;
      break;
  }
  return tsr_rpc__rx_process(rx);
}

int tsr_rpc__rx_push(tsr_rpc__rx *rx, const uint8_t *p, size_t n) {
  if (n > rx->cap - rx->end) return TSR_ETOOBIG;
  memmove(rx->stage + rx->end, p, n);
  rx->end += n;
  return 0;
}

void tsr_rpc__rx_divert(tsr_rpc__rx *rx) {
  if (rx->state == TSR_RPC__RX_PAYLOAD) rx->dst = NULL;
}

int tsr_rpc__rx_in_payload(const tsr_rpc__rx *rx) {
  return rx->state == TSR_RPC__RX_PAYLOAD && rx->dst != NULL;
}
