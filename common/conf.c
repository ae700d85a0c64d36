/* Unknown keys (conf.h): look the key up in the known lists; when it is in
 * none, name it with its path and either the closest known key (two edits
 * at most) or the whole list. */
#include "common/conf.h"
#include "common/err.h"

#include <stdio.h>
#include <string.h>

int tsr_edit_distance(const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b);
  if (la > 40 || lb > 40) return 99;
  int d[41][41];
  for (size_t i = 0; i <= la; i++) d[i][0] = (int)i;
  for (size_t j = 0; j <= lb; j++) d[0][j] = (int)j;
  for (size_t i = 1; i <= la; i++)
    for (size_t j = 1; j <= lb; j++) {
      int c = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
      if (d[i - 1][j] + 1 < c) c = d[i - 1][j] + 1;
      if (d[i][j - 1] + 1 < c) c = d[i][j - 1] + 1;
      d[i][j] = c;
    }
  return d[la][lb];
}

static int known_key(const char *key, const char *const *known,
                     const char *const *more) {
  for (int l = 0; l < 2; l++)
    for (const char *const *k = l ? more : known; k && *k; k++)
      if (strcmp(key, *k) == 0) return 1;
  return 0;
}

int tsr_conf_unknown_key(const char *where, const char *key,
                         const char *const *known, const char *const *more,
                         char *err, size_t errlen) {
  const char *best = NULL;
  int bestd = 3;
  char list[256];
  size_t o = 0;
  int fits = 1;
  for (int l = 0; l < 2; l++)
    for (const char *const *k = l ? more : known; k && *k; k++) {
      int d = tsr_edit_distance(key, *k);
      if (d < bestd) {
        bestd = d;
        best = *k;
      }
      int n = snprintf(list + o, sizeof list - o, "%s%s", o ? ", " : "", *k);
      if (n < 0 || (size_t)n >= sizeof list - o)
        fits = 0;
      else
        o += (size_t)n;
    }
  const char *dot = *where ? "." : "";
  if (best)
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "%s%s%s: unknown key; did you mean \"%s\"?", where, dot,
                    key, best);
  if (fits && o)
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "%s%s%s: unknown key (known: %s)", where, dot, key, list);
  return tsr_errf(err, errlen, TSR_ECONFIG, "%s%s%s: unknown key", where, dot,
                  key);
}

int tsr_conf_check_keys(const json_t *obj, const char *where,
                        const char *const *known, const char *const *more,
                        char *err, size_t errlen) {
  const char *key;
  json_t *v;
  json_object_foreach((json_t *)obj, key, v) {
    if (!known_key(key, known, more))
      return tsr_conf_unknown_key(where, key, known, more, err, errlen);
  }
  return 0;
}
