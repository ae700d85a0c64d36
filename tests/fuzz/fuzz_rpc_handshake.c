/* libFuzzer target: the RPC handshake state machine, both sides.
 *
 * The input's first byte picks the side (server or client) and the read
 * size; the rest is what the peer sends. A server must never answer more
 * than a HELLO and a VERDICT, never finish without a valid proof (which
 * random input cannot forge: reaching DONE aborts), and refuse for good
 * after an error. A client likewise never reaches DONE without a server
 * proof. */
#include "common/rpc/rpc_int.h"

#include <sodium.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static int init;
  if (!init) {
    if (sodium_init() < 0) abort();
    init = 1;
  }
  if (size < 1) return 0;
  int role = data[0] & 1 ? TSR_RPC__CLIENT : TSR_RPC__SERVER;
  size_t chunk = (size_t)(data[0] >> 1) + 1;
  data++;
  size--;
  tsr_rpc__hs hs;
  uint8_t out[TSR_RPC__HS_OUT_MAX];
  size_t out_len, used;
  tsr_rpc__hs_init(&hs, role, "fuzz-token", 10, "fuzz", 0, out, &out_len);
  int rc = 0;
  while (size) {
    size_t n = size < chunk ? size : chunk;
    rc = tsr_rpc__hs_feed(&hs, data, n, &used, out, &out_len);
    if (out_len > TSR_RPC__HS_OUT_MAX || used > n) abort();
    if (rc == 1) abort(); /* a proof was forged */
    if (rc < 0) {
      if (hs.msg[0] == 0) abort(); /* every refusal says why */
      if (tsr_rpc__hs_feed(&hs, data, n, &used, out, &out_len) >= 0) abort();
      break;
    }
    data += n;
    size -= n;
  }
  return 0;
}
