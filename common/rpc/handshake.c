/* The connection handshake, as a byte-in/byte-out state machine.
 *
 * Happy path: client HELLO (magic, version, role, fresh nonce, name) ->
 * server HELLO (the same, its own nonce) -> client PROOF = HMAC(token,
 * "client" label, both HELLOs) -> server VERDICT (status 0 and its PROOF
 * over the "server" label). Each side proves it holds the token, neither
 * sends it, and since both nonces are fresh per connection a recorded
 * exchange replayed later does not verify.
 * Failure modes: wrong magic (not a Tessera peer: nothing is answered),
 * another protocol version (the server still sends its HELLO so the client
 * can name both versions, then refuses), a wrong proof (the server answers
 * a refusal and closes; the client drops a server whose proof fails). The
 * server never computes a proof for a client that has not proven itself.
 * Done: both ends hold the same two session keys (one per direction) for
 * the frames' MACs (mac.c), and agree whether frames carry one.
 */
#include "common/rpc/rpc_int.h"

#include "common/err.h"

#include <sodium.h>
#include <stdio.h>

static const char tsr__label_client[] = "tessera-rpc client proof v1";
static const char tsr__label_server[] = "tessera-rpc server proof v1";
static const char tsr__label_session[] = "tessera-rpc session keys v2";

/* HELLO byte 7: flags. */
#define HS_FLAG_PLAIN 0x01u /* asks for frames without a MAC */

static void hs_hello(tsr_rpc__hs *hs, const char *name, int plain) {
  uint8_t *p = hs->mine;
  memset(p, 0, TSR_RPC__HELLO_SIZE);
  tsr_rpc__put32(p, TSR_RPC__HELLO_MAGIC);
  p[4] = (uint8_t)TSR_RPC_VERSION;
  p[5] = (uint8_t)(TSR_RPC_VERSION >> 8);
  p[6] = (uint8_t)hs->role;
  p[7] = plain ? HS_FLAG_PLAIN : 0;
  randombytes_buf(p + 8, TSR_RPC__NONCE_SIZE);
  if (name) {
    size_t n = strlen(name);
    if (n > TSR_RPC_NAME_MAX) n = TSR_RPC_NAME_MAX;
    memcpy(p + 8 + TSR_RPC__NONCE_SIZE, name, n);
  }
}

static void hs_proof(const tsr_rpc__hs *hs, const char *label,
                     uint8_t out[TSR_RPC__PROOF_SIZE]) {
  const uint8_t *ch = hs->role == TSR_RPC__CLIENT ? hs->mine : hs->theirs;
  const uint8_t *sh = hs->role == TSR_RPC__CLIENT ? hs->theirs : hs->mine;
  crypto_auth_hmacsha256_state st;
  crypto_auth_hmacsha256_init(&st, hs->token, hs->token_len);
  crypto_auth_hmacsha256_update(&st, (const uint8_t *)label, strlen(label));
  crypto_auth_hmacsha256_update(&st, ch, TSR_RPC__HELLO_SIZE);
  crypto_auth_hmacsha256_update(&st, sh, TSR_RPC__HELLO_SIZE);
  crypto_auth_hmacsha256_final(&st, out);
  sodium_memzero(&st, sizeof st);
}

/* Both ends, once both proofs verified: K = HMAC(token, label, client
 * HELLO, server HELLO), then one key per direction, HMAC(K, "c2s") and
 * HMAC(K, "s2c"). Fresh nonces make them new for every connection. */
static void hs_session(tsr_rpc__hs *hs) {
  const uint8_t *ch = hs->role == TSR_RPC__CLIENT ? hs->mine : hs->theirs;
  const uint8_t *sh = hs->role == TSR_RPC__CLIENT ? hs->theirs : hs->mine;
  uint8_t k[32], c2s[32], s2c[32];
  crypto_auth_hmacsha256_state st;
  crypto_auth_hmacsha256_init(&st, hs->token, hs->token_len);
  crypto_auth_hmacsha256_update(&st, (const uint8_t *)tsr__label_session,
                                strlen(tsr__label_session));
  crypto_auth_hmacsha256_update(&st, ch, TSR_RPC__HELLO_SIZE);
  crypto_auth_hmacsha256_update(&st, sh, TSR_RPC__HELLO_SIZE);
  crypto_auth_hmacsha256_final(&st, k);
  crypto_auth_hmacsha256(c2s, (const uint8_t *)"c2s", 3, k);
  crypto_auth_hmacsha256(s2c, (const uint8_t *)"s2c", 3, k);
  int client = hs->role == TSR_RPC__CLIENT;
  memcpy(hs->key_tx, client ? c2s : s2c, 32);
  memcpy(hs->key_rx, client ? s2c : c2s, 32);
  hs->mac = !((ch[7] & HS_FLAG_PLAIN) && (sh[7] & HS_FLAG_PLAIN));
  sodium_memzero(&st, sizeof st);
  sodium_memzero(k, sizeof k);
  sodium_memzero(c2s, sizeof c2s);
  sodium_memzero(s2c, sizeof s2c);
}

void tsr_rpc__hs_init(tsr_rpc__hs *hs, int role, const void *token,
                      size_t token_len, const char *name, int plain,
                      uint8_t *out, size_t *out_len) {
  memset(hs, 0, sizeof *hs);
  hs->role = role;
  hs->token = token;
  hs->token_len = token_len;
  hs->state = TSR_RPC__HS_WAIT_HELLO;
  hs_hello(hs, name, plain);
  *out_len = 0;
  if (role == TSR_RPC__CLIENT) {
    memcpy(out, hs->mine, TSR_RPC__HELLO_SIZE);
    *out_len = TSR_RPC__HELLO_SIZE;
  }
}

static int hs_fail(tsr_rpc__hs *hs, int code) {
  hs->state = TSR_RPC__HS_FAILED;
  hs->status = code;
  return code;
}

static void verdict(uint8_t *out, size_t *out_len, int status,
                    const uint8_t *proof) {
  uint8_t *p = out + *out_len;
  tsr_rpc__put32(p, (uint32_t)status);
  if (proof)
    memcpy(p + 4, proof, TSR_RPC__PROOF_SIZE);
  else
    memset(p + 4, 0, TSR_RPC__PROOF_SIZE);
  *out_len += TSR_RPC__VERDICT_SIZE;
}

/* Takes the peer's HELLO from hs->in. */
static int take_hello(tsr_rpc__hs *hs) {
  const uint8_t *p = hs->in;
  hs->peer_version = (unsigned)(p[4] | p[5] << 8);
  unsigned role = p[6];
  memcpy(hs->theirs, p, TSR_RPC__HELLO_SIZE);
  const uint8_t *nm = p + 8 + TSR_RPC__NONCE_SIZE;
  size_t i = 0;
  for (; i < TSR_RPC_NAME_MAX && nm[i]; i++)
    hs->peer_name[i] = nm[i] >= 0x21 && nm[i] < 0x7f ? (char)nm[i] : '?';
  hs->peer_name[i] = 0;
  if (role != (hs->role == TSR_RPC__CLIENT ? TSR_RPC__SERVER
                                           : TSR_RPC__CLIENT)) {
    snprintf(hs->msg, sizeof hs->msg,
             "handshake from a peer that says it is a %s, expected a %s",
             role == TSR_RPC__SERVER ? "server"
             : role == TSR_RPC__CLIENT ? "client" : "peer of unknown role",
             hs->role == TSR_RPC__CLIENT ? "server" : "client");
    return TSR_EPROTO;
  }
  return 0;
}

int tsr_rpc__hs_feed(tsr_rpc__hs *hs, const uint8_t *in, size_t len,
                     size_t *used, uint8_t *out, size_t *out_len) {
  *used = 0;
  *out_len = 0;
  while (hs->state != TSR_RPC__HS_DONE && hs->state != TSR_RPC__HS_FAILED) {
    size_t need = hs->state == TSR_RPC__HS_WAIT_HELLO ? TSR_RPC__HELLO_SIZE
                  : hs->state == TSR_RPC__HS_WAIT_PROOF
                      ? TSR_RPC__PROOF_SIZE
                      : TSR_RPC__VERDICT_SIZE;
    size_t take = need - hs->in_len;
    if (take > len - *used) take = len - *used;
    memcpy(hs->in + hs->in_len, in + *used, take);
    hs->in_len += take;
    *used += take;
    /* A stranger is told off as soon as its first 4 bytes are in, not
     * after the handshake timeout. */
    if (hs->state == TSR_RPC__HS_WAIT_HELLO && hs->in_len >= 4 &&
        tsr_rpc__get32(hs->in) != TSR_RPC__HELLO_MAGIC) {
      snprintf(hs->msg, sizeof hs->msg,
               "not a Tessera RPC peer: handshake magic 0x%08x, expected "
               "0x%08x",
               tsr_rpc__get32(hs->in), TSR_RPC__HELLO_MAGIC);
      return hs_fail(hs, TSR_EPROTO);
    }
    if (hs->in_len < need) return 0;
    hs->in_len = 0;

    if (hs->state == TSR_RPC__HS_WAIT_HELLO) {
      int rc = take_hello(hs);
      if (rc) return hs_fail(hs, rc);
      if (hs->role == TSR_RPC__SERVER) {
        memcpy(out + *out_len, hs->mine, TSR_RPC__HELLO_SIZE);
        *out_len += TSR_RPC__HELLO_SIZE;
        if (hs->peer_version != TSR_RPC_VERSION) {
          snprintf(hs->msg, sizeof hs->msg,
                   "peer speaks protocol version %u, this server speaks "
                   "version %u",
                   hs->peer_version, TSR_RPC_VERSION);
          verdict(out, out_len, TSR_EVERSION, NULL);
          hs->close_after_send = 1;
          return hs_fail(hs, TSR_EVERSION);
        }
        hs->state = TSR_RPC__HS_WAIT_PROOF;
      } else {
        if (hs->peer_version != TSR_RPC_VERSION) {
          snprintf(hs->msg, sizeof hs->msg,
                   "server speaks protocol version %u, this client speaks "
                   "version %u",
                   hs->peer_version, TSR_RPC_VERSION);
          return hs_fail(hs, TSR_EVERSION);
        }
        hs_proof(hs, tsr__label_client, out + *out_len);
        *out_len += TSR_RPC__PROOF_SIZE;
        hs->state = TSR_RPC__HS_WAIT_VERDICT;
      }
    } else if (hs->state == TSR_RPC__HS_WAIT_PROOF) {
      uint8_t want[TSR_RPC__PROOF_SIZE];
      hs_proof(hs, tsr__label_client, want);
      if (crypto_verify_32(want, hs->in) != 0) {
        snprintf(hs->msg, sizeof hs->msg,
                 "wrong cluster token (its proof does not verify)");
        verdict(out, out_len, TSR_EAUTH, NULL);
        hs->close_after_send = 1;
        return hs_fail(hs, TSR_EAUTH);
      }
      uint8_t proof[TSR_RPC__PROOF_SIZE];
      hs_proof(hs, tsr__label_server, proof);
      verdict(out, out_len, 0, proof);
      hs_session(hs);
      hs->state = TSR_RPC__HS_DONE;
    } else {
      int status = (int)tsr_rpc__get32(hs->in);
      if (status == TSR_EAUTH) {
        snprintf(hs->msg, sizeof hs->msg,
                 "server refused the handshake: wrong cluster token");
        return hs_fail(hs, TSR_EAUTH);
      }
      if (status == TSR_EVERSION) {
        snprintf(hs->msg, sizeof hs->msg,
                 "server refused protocol version %u", TSR_RPC_VERSION);
        return hs_fail(hs, TSR_EVERSION);
      }
      if (status != 0) {
        snprintf(hs->msg, sizeof hs->msg,
                 "server refused the handshake with status %d", status);
        return hs_fail(hs, TSR_EPROTO);
      }
      uint8_t want[TSR_RPC__PROOF_SIZE];
      hs_proof(hs, tsr__label_server, want);
      if (crypto_verify_32(want, hs->in + 4) != 0) {
        snprintf(hs->msg, sizeof hs->msg,
                 "server does not hold the cluster token (its proof does "
                 "not verify)");
        return hs_fail(hs, TSR_EAUTH);
      }
      hs_session(hs);
      hs->state = TSR_RPC__HS_DONE;
    }
  }
  return hs->state == TSR_RPC__HS_DONE ? 1 : hs->status;
}
