/* Frame integrity: a Poly1305 tag on every frame after the handshake.
 *
 * Happy path. The handshake gives each direction of a connection its own
 * 32-byte session key (derived from the cluster token and both fresh
 * nonces, handshake.c). Frame n of a direction (n = 0, 1, ... counted by
 * both ends, never sent) is authenticated with its own one-time key: the
 * 32 bytes at n * 32 of the ChaCha20 key stream of the session key
 * (produced 64 frames' keys at a time), over the header, the meta and the
 * payload exactly as they travel; the 16-byte tag follows the payload.
 * Since every frame has its own key, a frame replayed, moved to another
 * place in the stream, dropped (every later frame then has the wrong
 * number) or changed in any byte fails its check, and the receiver closes
 * the connection.
 *
 * Why Poly1305, measured on one core of the build machines (AMD EPYC with
 * AES-NI, AVX-512 and VAES): libsodium's Poly1305 2.5-2.9 GB/s, its
 * AES-256-GCM used as a MAC over additional data 2.9 GB/s (and it wants
 * the whole message in one buffer, where Poly1305 runs incrementally as
 * bytes leave and arrive, so tensor bytes stay on their zero-copy path and
 * are hashed in place while hot in the cache), keyed BLAKE2b and
 * HMAC-SHA-512/256 about 0.4 GB/s; OpenSSL's Poly1305 (AVX2/AVX-512 code)
 * 5.7 GB/s and its GMAC 5.4 GB/s. So: Poly1305, computed by OpenSSL's
 * libcrypto for frames of 32 KiB and more when the build has it (it costs
 * a little more to start, ~250 ns against ~200), by libsodium otherwise.
 * Both compute the same function, so the two ends need not agree on which.
 * A payload of 256 KiB or more is handed to the kernel before its MAC is
 * computed and the tag follows in a write of its own (conn.c), so the
 * receiver reads and hashes it while the sender hashes it: 1 MiB calls
 * went from 0.62 to about 0.71 of raw TCP with one call in flight.
 * Failure modes: none here; the receive machine (rx.c) refuses a frame
 * whose tag does not verify.
 */
#include "common/rpc/rpc_int.h"

#include <sodium.h>

#if TSR_HAVE_LIBCRYPTO
#include <openssl/evp.h>
#define MAC_BIG (32u * 1024u) /* frames from this size use libcrypto */
#endif

void tsr_rpc__mac_init(tsr_rpc__mac *m, const uint8_t key[32]) {
  tsr_rpc__mac_wipe(m);
  memcpy(m->key, key, 32);
  m->on = 1;
#if TSR_HAVE_LIBCRYPTO
  EVP_MAC *mac = EVP_MAC_fetch(NULL, "POLY1305", NULL);
  if (mac) {
    m->big = EVP_MAC_CTX_new(mac);
    EVP_MAC_free(mac);
  }
#endif
}

void tsr_rpc__mac_wipe(tsr_rpc__mac *m) {
#if TSR_HAVE_LIBCRYPTO
  if (m->big) EVP_MAC_CTX_free(m->big);
#endif
  sodium_memzero(m, sizeof *m);
}

void tsr_rpc__mac_begin(tsr_rpc__mac *m, uint64_t frame_len) {
  unsigned slot = (unsigned)(m->counter % TSR_RPC__MAC_BATCH);
  if (slot == 0 || !m->keys_ready) {
    /* the key stream of keys [counter - slot, + batch): one ChaCha20 call
     * per 64 frames, nonce = the batch's number */
    uint8_t nonce[8];
    tsr_rpc__put64(nonce, m->counter / TSR_RPC__MAC_BATCH);
    crypto_stream_chacha20(m->keys, sizeof m->keys, nonce, m->key);
    m->keys_ready = 1;
  }
  const uint8_t *fk = m->keys + (size_t)slot * 32;
  m->use_big = 0;
#if TSR_HAVE_LIBCRYPTO
  if (m->big && frame_len >= MAC_BIG &&
      EVP_MAC_init(m->big, fk, 32, NULL) == 1)
    m->use_big = 1;
#else
  (void)frame_len;
#endif
  if (!m->use_big) crypto_onetimeauth_init(&m->st, fk);
}

void tsr_rpc__mac_update(tsr_rpc__mac *m, const void *p, size_t n) {
  if (!n) return;
#if TSR_HAVE_LIBCRYPTO
  if (m->use_big) {
    /* a failure here leaves a wrong tag: the frame is refused */
    (void)EVP_MAC_update(m->big, p, n);
    return;
  }
#endif
  crypto_onetimeauth_update(&m->st, p, n);
}

static void mac_end(tsr_rpc__mac *m, uint8_t out[TSR_RPC__TAG_SIZE]) {
  int done = 0;
#if TSR_HAVE_LIBCRYPTO
  if (m->use_big) {
    size_t len = 0;
    done = EVP_MAC_final(m->big, out, &len, TSR_RPC__TAG_SIZE) == 1 &&
           len == TSR_RPC__TAG_SIZE;
    if (!done) memset(out, 0, TSR_RPC__TAG_SIZE); /* never verifies */
    done = 1;
  }
#endif
  if (!done) crypto_onetimeauth_final(&m->st, out);
  /* this frame's one-time key is used up */
  sodium_memzero(m->keys + (size_t)(m->counter % TSR_RPC__MAC_BATCH) * 32,
                 32);
  m->counter++;
}

void tsr_rpc__mac_final(tsr_rpc__mac *m, uint8_t tag[TSR_RPC__TAG_SIZE]) {
  mac_end(m, tag);
}

int tsr_rpc__mac_verify(tsr_rpc__mac *m,
                        const uint8_t tag[TSR_RPC__TAG_SIZE]) {
  uint8_t want[TSR_RPC__TAG_SIZE];
  mac_end(m, want);
  return crypto_verify_16(want, tag) == 0 ? 0 : -1;
}
