/* libFuzzer target: the RPC receive machine and frame parser.
 *
 * The input is a byte stream as a peer would send it after the handshake;
 * its first byte picks how the kernel would cut it into reads. Frames are
 * split, checked against small limits (so both over-limit paths and the
 * big-meta and direct-payload paths run with a 256-byte stage), payloads
 * land in buffers of exactly their size (ASan catches any write past
 * them), error metas are decoded. The machine must never crash, never
 * write outside what it was given, and stop for good after an error. With
 * the first byte's top bit, frames must carry a MAC: no random frame may
 * ever reach on_frame. */
#include "common/rpc/rpc_int.h"

#include <stdlib.h>

static void *fz_alloc(void *ctx, size_t n) { return malloc(n); }
static void fz_free(void *ctx, void *p) { free(p); }

typedef struct owner {
  void *dst;
  int frames;
} owner;

static int on_head(tsr_rpc__rx *rx, const tsr_rpc__hdr *h,
                   const uint8_t *meta, void **dst) {
  owner *o = rx->owner;
  if (h->kind == TSR_RPC__ERR) {
    int code;
    char msg[128];
    tsr_rpc__err_decode(meta, h->meta_len, &code, msg, sizeof msg);
  }
  /* every other frame's payload is discarded, the rest lands in place */
  if (h->payload_len && (h->id & 1)) {
    o->dst = malloc((size_t)h->payload_len);
    *dst = o->dst;
  }
  return 0;
}

static int on_frame(tsr_rpc__rx *rx, const tsr_rpc__hdr *h, void *payload) {
  owner *o = rx->owner;
  if (rx->mac.on) abort(); /* a frame whose MAC nobody could make */
  if (payload && payload != o->dst) abort();
  free(o->dst);
  o->dst = NULL;
  o->frames++;
  return (o->frames % 7) == 0 ? 1 : 0; /* pause now and then */
}

static const tsr_rpc__rx_ops ops = {on_head, on_frame};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  /* the top bit: frames must carry a MAC (random input never has a right
   * one: the first complete frame must stop the machine) */
  int mac = data[0] & 0x80;
  size_t chunk = (size_t)(data[0] & 0x7f) * 3 + 1;
  data++;
  size--;
  tsr_rpc_allocator al = {fz_alloc, fz_free, NULL};
  tsr_rpc__limits lim = {4096, 1 << 16};
  uint32_t accept = TSR_RPC__KIND_BIT(TSR_RPC__REQ) |
                    TSR_RPC__KIND_BIT(TSR_RPC__ERR) |
                    TSR_RPC__KIND_BIT(TSR_RPC__RESP) |
                    TSR_RPC__KIND_BIT(TSR_RPC__PING);
  owner o = {0};
  tsr_rpc__rx rx;
  if (tsr_rpc__rx_init(&rx, &ops, &o, &lim, accept, &al, 256)) return 0;
  static const uint8_t key[32] = {7};
  if (mac) tsr_rpc__rx_mac_on(&rx, key);
  while (size) {
    if (rx.paused) {
      rx.paused = 0;
      if (tsr_rpc__rx_process(&rx)) break;
      continue;
    }
    uint8_t *p;
    size_t cap;
    tsr_rpc__rx_buf(&rx, &p, &cap);
    size_t n = size < chunk ? size : chunk;
    if (n > cap) n = cap;
    memcpy(p, data, n);
    data += n;
    size -= n;
    if (tsr_rpc__rx_done(&rx, n)) {
      /* dead stays dead */
      if (tsr_rpc__rx_done(&rx, 0) == 0) abort();
      break;
    }
  }
  free(o.dst);
  tsr_rpc__rx_free(&rx);
  return 0;
}
