/* Shard file names: "<enc>.part-<k>-of-<n>.tshard", the variable name
 * with every byte outside [A-Za-z0-9._-] written as %XX.
 */
#include "common/ckpt/shardfile.h"
#include "common/err.h"

#include <stdio.h>
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

/* A decimal number as the writer prints it: digits only, no sign, no
 * leading zero (but "0"), at most 5 digits (parts are at most 65536). */
static bool sf_number(const char *p, size_t n, long *out) {
  if (n == 0 || n > 5 || (n > 1 && p[0] == '0')) return false;
  long v = 0;
  for (size_t i = 0; i < n; i++) {
    if (p[i] < '0' || p[i] > '9') return false;
    v = v * 10 + (p[i] - '0');
  }
  *out = v;
  return true;
}

bool tsr_shardfile_name_parse(const char *fname, const char *enc, int32_t *k,
                              int32_t *n) {
  size_t L = strlen(fname), el = strlen(enc);
  if (L <= el + 6 + 7 || strncmp(fname, enc, el) ||
      strncmp(fname + el, ".part-", 6) || strcmp(fname + L - 7, ".tshard"))
    return false;
  const char *a = fname + el + 6, *end = fname + L - 7;
  const char *of = memmem(a, (size_t)(end - a), "-of-", 4);
  long x, y;
  if (!of || !sf_number(a, (size_t)(of - a), &x) ||
      !sf_number(of + 4, (size_t)(end - of - 4), &y) || y < 1 ||
      y > TSR_SHARDFILE_MAX_PARTS || x >= y)
    return false;
  *k = (int32_t)x;
  *n = (int32_t)y;
  return true;
}
