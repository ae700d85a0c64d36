/* The .npz writer (artifacts/weights/npz.h) replaces its target whole and
 * durably: close fsyncs the archive, renames it over the target and fsyncs
 * the folder, leaving no temp file; abort and a failed close leave the old
 * target as it was and no temp file either.
 *
 * fsync is interposed (fsync_record.h) to record what was synced. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "artifacts/weights/npz.h"
#include "../fsync_record.h"

/* Entries of `dir` other than . and .. */
static int entries(const char *dir) { return count_entries(dir, NULL); }

static long file_size(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

static void write_one(const char *path, int64_t n) {
  char err[256] = "";
  chief_npz *z;
  assert_int_equal(chief_npz_open(&z, path, err, sizeof err), 0);
  float v[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  assert_int_equal(chief_npz_add_f32(z, "w", &n, 1, v, err, sizeof err), 0);
  assert_int_equal(chief_npz_close(z, err, sizeof err), 0);
}

static void close_syncs_file_and_folder(void **state) {
  (void)state;
  char p[512], tmp[600];
  snprintf(p, sizeof p, "%s/w.npz", root);
  write_one(p, 8);
  snprintf(tmp, sizeof tmp, "%s.tmp", p);
  assert_true(was_synced_prefix(tmp)); /* the bytes, before the rename */
  assert_true(was_synced(root));       /* the rename itself */
  assert_int_equal(entries(root), 1);  /* no temp file left */
  assert_true(file_size(p) > 0);
}

static void abort_and_failed_close_keep_the_old_file(void **state) {
  (void)state;
  char p[512], sub[512], err[512] = "";
  snprintf(p, sizeof p, "%s/w.npz", root);
  write_one(p, 8);
  long before = file_size(p);
  /* abort: the old archive stays, no temp file */
  chief_npz *z;
  assert_int_equal(chief_npz_open(&z, p, err, sizeof err), 0);
  assert_int_equal(chief_npz_add_file(z, "a.txt", "abc", 3, err, sizeof err),
                   0);
  chief_npz_abort(z);
  assert_int_equal(file_size(p), before);
  assert_int_equal(entries(root), 1);
  /* a folder where the archive should go: close fails, names the path and
   * leaves no temp file */
  snprintf(sub, sizeof sub, "%s/taken", root);
  assert_int_equal(mkdir(sub, 0777), 0);
  assert_int_equal(chief_npz_open(&z, sub, err, sizeof err), 0);
  assert_true(chief_npz_close(z, err, sizeof err) < 0);
  assert_non_null(strstr(err, sub));
  assert_int_equal(entries(root), 2);
  /* a missing folder: open fails and names it */
  snprintf(sub, sizeof sub, "%s/missing/w.npz", root);
  assert_true(chief_npz_open(&z, sub, err, sizeof err) < 0);
  assert_non_null(strstr(err, sub));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(close_syncs_file_and_folder, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(abort_and_failed_close_keep_the_old_file,
                                      setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
