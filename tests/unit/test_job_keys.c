/* The job-key table (common/job_keys.h) against the README and the
 * parser: the README's table between its markers is the one the table
 * makes; every documented number default is the one a job without the key
 * gets; every key (nested ones too) is read, and a misspelling of it is
 * refused naming the key it resembles; every integer key refuses a value
 * under its range naming the key and the range.
 *
 * Run as `test_job_keys README.md`; `test_job_keys --write README.md`
 * rewrites the README's table instead (ninja -C build readme-job-keys). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/job_int.h"

#define BEGIN_MARK "<!-- job keys: generated from common/job_keys.h"
#define END_MARK "<!-- end of job keys -->"

static const char *readme_path;

/* The README and where its table starts (after the begin marker's line)
 * and ends (at the end marker). */
static char *read_readme(const char *path, size_t *begin, size_t *end) {
  int rc;
  char err[512];
  char *text = tsr_read_file(path, NULL, &rc, err, sizeof err);
  if (!text) {
    fprintf(stderr, "%s\n", err);
    return NULL;
  }
  char *b = strstr(text, BEGIN_MARK);
  char *e = b ? strstr(b, END_MARK) : NULL;
  char *nl = b ? strchr(b, '\n') : NULL;
  if (!b || !e || !nl || nl > e) {
    fprintf(stderr, "%s: no \"%s ...\" line followed by \"%s\"\n", path,
            BEGIN_MARK, END_MARK);
    free(text);
    return NULL;
  }
  *begin = (size_t)(nl + 1 - text);
  *end = (size_t)(e - text);
  return text;
}

static void readme_table_is_the_generated_one(void **state) {
  (void)state;
  size_t b, e;
  char *text = read_readme(readme_path, &b, &e);
  assert_non_null(text);
  char *want = tsr_job_keys_markdown();
  assert_non_null(want);
  size_t n = strlen(want);
  if (e - b != n || memcmp(text + b, want, n) != 0) {
    /* the first line that differs */
    size_t i = 0;
    while (i < n && b + i < e && text[b + i] == want[i]) i++;
    size_t ls = i;
    while (ls > 0 && want[ls - 1] != '\n') ls--;
    const char *nl = strchr(want + ls, '\n');
    fprintf(stderr,
            "README.md's job-key table differs from common/job_keys.h at:\n"
            "  want: %.*s\n"
            "  (run `ninja -C build readme-job-keys` to rewrite it)\n",
            (int)(nl ? nl - (want + ls) : (long)strlen(want + ls)),
            want + ls);
    free(want);
    free(text);
    fail();
  }
  free(want);
  free(text);
}

/* The rows of the top level and of every object, with their paths. */
typedef void (*row_fn)(const char *path, const char *parent,
                       const tsr__jk_row *r);

static void each_row(const tsr__jk_row *rows, size_t n, const char *parent,
                     row_fn fn) {
  for (size_t i = 0; i < n; i++) {
    char path[128];
    snprintf(path, sizeof path, "%s%s%s", parent, *parent ? "." : "",
             rows[i].key);
    fn(path, parent, &rows[i]);
    if (rows[i].sub) each_row(rows[i].sub, rows[i].nsub, path, fn);
  }
}

static tsr_job defaults;

static void check_default(const char *path, const char *parent,
                          const tsr__jk_row *r) {
  (void)parent;
  char *end;
  double doc = strtod(r->def, &end);
  if (end == r->def) return; /* words, not a number */
  const char *m = (const char *)&defaults + r->off;
  double got;
  if (r->kind == TSR__JK_INT && r->size == sizeof(int64_t)) {
    int64_t x;
    memcpy(&x, m, sizeof x);
    got = (double)x;
  } else if (r->kind == TSR__JK_INT) {
    int x;
    memcpy(&x, m, sizeof x);
    got = x;
  } else if (r->kind == TSR__JK_SECS) {
    memcpy(&got, m, sizeof got);
  } else if (!strcmp(r->key, "seed")) {
    got = (double)defaults.seed;
  } else {
    fail_msg("%s: a number default (\"%s\") on a key that is not a number",
             path, r->def);
    return;
  }
  if (got != doc)
    fail_msg("%s: the README says %s, a job without it gets %g", path,
             r->def, got);
}

static void documented_defaults_are_applied(void **state) {
  (void)state;
  char err[512];
  assert_int_equal(tsr_job_parse("{}", "job", NULL, NULL, &defaults, err,
                                 sizeof err), 0);
  each_row(tsr__job_keys, tsr__job_nkeys, "", check_default);
  tsr_job_free(&defaults);
}

/* {"a": {"b": value}} for the path "a.b". */
static char *nest(const char *path, const char *key, const char *value) {
  static char buf[512];
  char opened[128] = "", closed[16] = "";
  char p[128];
  snprintf(p, sizeof p, "%s", path);
  for (char *part = strtok(p, "."); part; part = strtok(NULL, ".")) {
    size_t o = strlen(opened);
    snprintf(opened + o, sizeof opened - o, "{\"%s\": ", part);
    strcat(closed, "}");
  }
  snprintf(buf, sizeof buf, "%s{\"%s\": %s}%s", opened, key, value, closed);
  return buf;
}

static void check_misspelling(const char *path, const char *parent,
                              const tsr__jk_row *r) {
  /* capitalised, as a Keras user might: one edit from this key only */
  char bad[80], err[512] = "", want[256];
  snprintf(bad, sizeof bad, "%c%s", toupper((unsigned char)r->key[0]),
           r->key + 1);
  tsr_job j;
  const char *text = nest(parent, bad, "1");
  int rc = tsr_job_parse(text, "job", NULL, NULL, &j, err, sizeof err);
  snprintf(want, sizeof want, "%s%s%s: unknown key; did you mean \"%s\"?",
           parent, *parent ? "." : "", bad, r->key);
  if (rc != TSR_ECONFIG || !strstr(err, want))
    fail_msg("%s: %s gave %d \"%s\", not \"%s\"", path, text, rc, err, want);
}

static void misspelled_keys_are_named(void **state) {
  (void)state;
  each_row(tsr__job_keys, tsr__job_nkeys, "", check_misspelling);
}

static void check_range(const char *path, const char *parent,
                        const tsr__jk_row *r) {
  if (r->kind != TSR__JK_INT) return;
  char v[32], err[512] = "", want[256];
  tsr_job j;
  /* at the bottom of the range: read */
  snprintf(v, sizeof v, "%lld", (long long)r->lo);
  const char *text = nest(parent, r->key, v);
  int rc = tsr_job_parse(text, "job", NULL, NULL, &j, err, sizeof err);
  if (rc) fail_msg("%s: %s refused: %s", path, text, err);
  tsr_job_free(&j);
  /* under it: refused, naming the key and the range */
  snprintf(v, sizeof v, "%lld", (long long)r->lo - 1);
  text = nest(parent, r->key, v);
  rc = tsr_job_parse(text, "job", NULL, NULL, &j, err, sizeof err);
  snprintf(want, sizeof want, "%s = %lld is out of range [%lld, %lld]", path,
           (long long)r->lo - 1, (long long)r->lo, (long long)r->hi);
  if (rc != TSR_ECONFIG || !strstr(err, want))
    fail_msg("%s: %s gave %d \"%s\", not \"%s\"", path, text, rc, err, want);
  /* not a number: refused, naming the key */
  text = nest(parent, r->key, "\"many\"");
  rc = tsr_job_parse(text, "job", NULL, NULL, &j, err, sizeof err);
  snprintf(want, sizeof want, "%s must be an integer", path);
  if (rc != TSR_ECONFIG || !strstr(err, want))
    fail_msg("%s: %s gave %d \"%s\", not \"%s\"", path, text, rc, err, want);
}

static void integer_ranges_are_enforced(void **state) {
  (void)state;
  each_row(tsr__job_keys, tsr__job_nkeys, "", check_range);
}

static int write_readme(const char *path) {
  size_t b, e;
  char *text = read_readme(path, &b, &e);
  char *table = tsr_job_keys_markdown();
  if (!text || !table) return 1;
  FILE *f = fopen(path, "w");
  if (!f) {
    perror(path);
    return 1;
  }
  fwrite(text, 1, b, f);
  fputs(table, f);
  fputs(text + e, f);
  int rc = fclose(f) != 0;
  free(text);
  free(table);
  if (!rc) printf("%s: job-key table written\n", path);
  return rc;
}

int main(int argc, char **argv) {
  if (argc == 3 && !strcmp(argv[1], "--write")) return write_readme(argv[2]);
  if (argc != 2) {
    fprintf(stderr, "usage: test_job_keys README.md\n"
                    "       test_job_keys --write README.md\n");
    return 2;
  }
  readme_path = argv[1];
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(readme_table_is_the_generated_one),
      cmocka_unit_test(documented_defaults_are_applied),
      cmocka_unit_test(misspelled_keys_are_named),
      cmocka_unit_test(integer_ranges_are_enforced),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
