/* Shard file names: "<enc>.part-<k>-of-<n>.tshard", the variable name
 * with every byte outside [A-Za-z0-9._-] written as %XX.
 */
#include "common/ckpt/shardfile.h"
#include "common/err.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void tsr_shardfile_enc_name(const char *name, char *out, size_t len) {
  size_t o = 0;
  for (const unsigned char *p = (const unsigned char *)name; *p && o + 4 < len;
       p++) {
    if ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
        (*p >= '0' && *p <= '9') || *p == '.' || *p == '_' || *p == '-')
      out[o++] = (char)*p;
    else
      o += (size_t)snprintf(out + o, len - o, "%%%02X", *p);
  }
  out[o] = 0;
}

int tsr_shardfile_name(const char *var, int32_t k, int32_t n, char *buf,
                       size_t len) {
  char enc[3 * TSR_VAR_NAME_MAX + 1];
  tsr_shardfile_enc_name(var, enc, sizeof enc);
  int r = snprintf(buf, len, "%s.part-%d-of-%d.tshard", enc, k, n);
  return r < 0 || (size_t)r >= len ? TSR_ERANGE : 0;
}

bool tsr_shardfile_name_parse(const char *fname, const char *enc, int32_t *k,
                              int32_t *n) {
  size_t L = strlen(fname), el = strlen(enc);
  if (L <= el + 6 + 7 || strncmp(fname, enc, el) ||
      strncmp(fname + el, ".part-", 6) || strcmp(fname + L - 7, ".tshard"))
    return false;
  char tail[64];
  size_t tl = L - el - 6 - 7;
  if (tl >= sizeof tail) return false;
  memcpy(tail, fname + el + 6, tl);
  tail[tl] = 0;
  char *e1, *e2;
  long a = strtol(tail, &e1, 10);
  if (e1 == tail || strncmp(e1, "-of-", 4)) return false;
  long b = strtol(e1 + 4, &e2, 10);
  if (e2 == e1 + 4 || *e2 || b < 1 || b > TSR_SHARDFILE_MAX_PARTS || a < 0 ||
      a >= b)
    return false;
  *k = (int32_t)a;
  *n = (int32_t)b;
  return true;
}
