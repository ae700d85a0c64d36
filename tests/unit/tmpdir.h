/* Temporary folders for the chief's tests: made under $TMPDIR (or /tmp)
 * and removed with everything in them. */
#ifndef TSR_TEST_CHIEF_TMPDIR_H
#define TSR_TEST_CHIEF_TMPDIR_H

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static inline void test_tmpdir(char *buf, size_t len) {
  const char *base = getenv("TMPDIR");
  snprintf(buf, len, "%s/tsr-chief-XXXXXX", base && *base ? base : "/tmp");
  if (!mkdtemp(buf)) {
    perror("mkdtemp");
    abort();
  }
}

static inline int test__rm_one(const char *p, const struct stat *st, int flag,
                               struct FTW *ftw) {
  (void)st;
  (void)flag;
  (void)ftw;
  return remove(p);
}

static inline void test_rmtree(const char *dir) {
  nftw(dir, test__rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* Reads a whole file; NULL when missing. The caller frees. */
static inline char *test_slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  size_t cap = 4096, n = 0;
  char *p = malloc(cap + 1);
  size_t r;
  while (p && (r = fread(p + n, 1, cap - n, f)) > 0) {
    n += r;
    if (n == cap) {
      cap *= 2;
      char *q = realloc(p, cap + 1);
      if (!q) {
        free(p);
        p = NULL;
      } else {
        p = q;
      }
    }
  }
  fclose(f);
  if (p) p[n] = '\0';
  if (len) *len = n;
  return p;
}

#endif
