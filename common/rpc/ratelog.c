/* Log lines about misbehaving peers (refused handshakes, frames that fail
 * their integrity check, same-host sockets held by another uid), one per
 * key per interval: the peer's address, or a socket's name.
 *
 * Happy path: an event for a key not seen within the interval is logged
 * at once; further events of that key within the interval are only
 * counted, and the next line logged for it says how many were
 * suppressed. A client that reconnects in a loop with a wrong token, or
 * through a relay that changes every frame, thus costs one line per
 * interval, not one per attempt.
 * Failure modes: none; with more keys than slots the one whose window
 * is oldest gives its slot up (its count is then lost, never its first
 * line). Pure: the caller passes the time; tested on its own.
 */
#include "common/rpc/rpc_int.h"

#include <stdio.h>

/* "1.2.3.4:56" -> "1.2.3.4", "[::1]:56" -> "::1". */
static void rl_host(const char *peer, char *out, size_t len) {
  const char *p = peer, *end;
  if (p[0] == '[') {
    p++;
    end = strchr(p, ']');
  } else {
    end = strrchr(p, ':');
  }
  size_t n = end ? (size_t)(end - p) : strlen(p);
  if (n >= len) n = len - 1;
  memcpy(out, p, n);
  out[n] = 0;
}

int tsr_rpc__ratelog_note(tsr_rpc__ratelog *rl, const char *peer,
                          uint64_t now_ns, uint64_t interval_ns,
                          uint64_t *suppressed, char *host, size_t hostlen) {
  char h[TSR_RPC_ADDR_MAX];
  rl_host(peer, h, sizeof h);
  snprintf(host, hostlen, "%s", h);
  return tsr_rpc__ratelog_note_key(rl, h, now_ns, interval_ns, suppressed);
}

int tsr_rpc__ratelog_note_key(tsr_rpc__ratelog *rl, const char *key,
                              uint64_t now_ns, uint64_t interval_ns,
                              uint64_t *suppressed) {
  char h[TSR_RPC__RATELOG_KEY];
  snprintf(h, sizeof h, "%s", key);
  tsr_rpc__ratelog_slot *s = NULL, *oldest = &rl->slot[0];
  for (int i = 0; i < TSR_RPC__RATELOG_SLOTS; i++) {
    tsr_rpc__ratelog_slot *t = &rl->slot[i];
    if (t->used && !strcmp(t->key, h)) {
      s = t;
      break;
    }
    if (!t->used || (oldest->used && t->since_ns < oldest->since_ns))
      oldest = t;
  }
  if (s && now_ns - s->since_ns < interval_ns) {
    s->suppressed++;
    return 0;
  }
  if (!s) {
    s = oldest;
    memset(s, 0, sizeof *s);
    s->used = 1;
    snprintf(s->key, sizeof s->key, "%s", h);
  }
  *suppressed = s->suppressed;
  s->suppressed = 0;
  s->since_ns = now_ns;
  return 1;
}
