/* Folders and whole-file replacement (common/fs.h): mkdir -p through
 * parents and over existing folders, a file in the way named; a
 * replacement writes the bytes, fsyncs the temp file and then the folder,
 * and leaves no temp file behind, whether it succeeds or fails; the trace
 * writer and the trace merge go through it.
 *
 * fsync is interposed (fsync_record.h) to record what was synced. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/err.h"
#include "common/fs.h"
#include "common/trace.h"
#include "fsync_record.h"

static char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  static char buf[4096];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  return buf;
}

/* Files in `dir` whose name holds ".tmp." */
static int temp_files(const char *dir) { return count_entries(dir, ".tmp."); }

/* ---- tests --------------------------------------------------------------- */

static void mkdir_p_makes_parents(void **state) {
  (void)state;
  char p[512], err[256];
  snprintf(p, sizeof p, "%s/a/b/c", root);
  assert_int_equal(tsr_mkdir_p(p, 0777, err, sizeof err), 0);
  struct stat st;
  assert_int_equal(stat(p, &st), 0);
  assert_true(S_ISDIR(st.st_mode));
  /* again, and with a trailing slash: fine */
  assert_int_equal(tsr_mkdir_p(p, 0777, err, sizeof err), 0);
  snprintf(p, sizeof p, "%s/a/b/", root);
  assert_int_equal(tsr_mkdir_p(p, 0777, err, sizeof err), 0);
  assert_int_equal(tsr_mkdir_p("", 0777, err, sizeof err), TSR_EINVAL);
}

static void mkdir_p_names_a_file_in_the_way(void **state) {
  (void)state;
  char p[512], q[512], err[512] = "";
  snprintf(p, sizeof p, "%s/file", root);
  FILE *f = fopen(p, "w");
  assert_non_null(f);
  fclose(f);
  /* the last component is a file */
  assert_int_equal(tsr_mkdir_p(p, 0777, err, sizeof err), TSR_EEXISTS);
  assert_non_null(strstr(err, p));
  /* a parent is a file */
  snprintf(q, sizeof q, "%s/x/y", p);
  assert_int_equal(tsr_mkdir_p(q, 0777, err, sizeof err), -ENOTDIR);
  assert_non_null(strstr(err, "cannot create directory"));
  assert_non_null(strstr(err, p));
  /* no buffer for the message: the code still comes back */
  assert_int_equal(tsr_mkdir_p(q, 0777, NULL, 0), -ENOTDIR);
}

static void write_atomic_replaces_and_syncs(void **state) {
  (void)state;
  char p[512], tmp[600], err[256];
  snprintf(p, sizeof p, "%s/out.json", root);
  assert_int_equal(tsr_write_atomic(p, "old", 3, err, sizeof err), 0);
  n_synced = 0;
  assert_int_equal(tsr_write_atomic(p, "new text", 8, err, sizeof err), 0);
  assert_string_equal(slurp(p), "new text");
  assert_int_equal(temp_files(root), 0);
  snprintf(tmp, sizeof tmp, "%s.tmp.", p);
  assert_true(was_synced_prefix(tmp)); /* the bytes, before the rename */
  assert_true(was_synced(root));       /* the rename itself */
}

static void write_atomic_failure_leaves_target_and_no_temp(void **state) {
  (void)state;
  char p[512], err[512] = "";
  /* a folder where the file should go: the rename fails */
  snprintf(p, sizeof p, "%s/taken", root);
  assert_int_equal(mkdir(p, 0777), 0);
  int rc = tsr_write_atomic(p, "x", 1, err, sizeof err);
  assert_true(rc < 0);
  assert_non_null(strstr(err, "cannot rename"));
  assert_int_equal(temp_files(root), 0);
  struct stat st;
  assert_int_equal(stat(p, &st), 0);
  assert_true(S_ISDIR(st.st_mode));
  /* a missing folder: the temp file cannot be made */
  snprintf(p, sizeof p, "%s/missing/out", root);
  assert_int_equal(tsr_write_atomic(p, "x", 1, err, sizeof err), -ENOENT);
  assert_non_null(strstr(err, "cannot create"));
  assert_non_null(strstr(err, p));
}

static void atomic_stream_commit_and_abort(void **state) {
  (void)state;
  char p[512], err[256];
  tsr_atomic_file af;
  snprintf(p, sizeof p, "%s/stream.txt", root);
  assert_int_equal(tsr_atomic_open(&af, p, err, sizeof err), 0);
  fprintf(af.f, "%d lines\n", 3);
  n_synced = 0;
  assert_int_equal(tsr_atomic_commit(&af, err, sizeof err), 0);
  assert_null(af.f);
  assert_string_equal(slurp(p), "3 lines\n");
  assert_true(was_synced(root));
  /* abort: the target keeps its old text */
  assert_int_equal(tsr_atomic_open(&af, p, err, sizeof err), 0);
  fputs("half", af.f);
  tsr_atomic_abort(&af);
  assert_string_equal(slurp(p), "3 lines\n");
  assert_int_equal(temp_files(root), 0);
}

/* A file written by name elsewhere (libhdf5) is fsynced, renamed over the
 * target and its folder synced; a missing temp file is named. */
static void commit_written_renames_and_syncs(void **state) {
  (void)state;
  char tmp[512], p[512], err[512] = "";
  snprintf(tmp, sizeof tmp, "%s/w.h5.tmp", root);
  snprintf(p, sizeof p, "%s/w.h5", root);
  FILE *f = fopen(tmp, "w");
  assert_non_null(f);
  fputs("hdf5 bytes", f);
  fclose(f);
  n_synced = 0;
  assert_int_equal(tsr_commit_written(tmp, p, err, sizeof err), 0);
  assert_string_equal(slurp(p), "hdf5 bytes");
  assert_true(was_synced(root));
  assert_int_equal(temp_files(root), 0);
  assert_true(tsr_commit_written(tmp, p, err, sizeof err) < 0);
  assert_non_null(strstr(err, "w.h5.tmp"));
  assert_string_equal(slurp(p), "hdf5 bytes");
}

static void fsync_dir_names_what_is_missing(void **state) {
  (void)state;
  char p[512], err[512] = "";
  snprintf(p, sizeof p, "%s/nope", root);
  assert_int_equal(tsr_fsync_dir(p, err, sizeof err), -ENOENT);
  assert_non_null(strstr(err, p));
  assert_int_equal(tsr_fsync_dir(root, err, sizeof err), 0);
}

static void trace_write_and_merge_are_durable(void **state) {
  (void)state;
  char a[512], b[512], m[512], tmp[600], err[256];
  snprintf(a, sizeof a, "%s/a.json", root);
  snprintf(b, sizeof b, "%s/b.json", root);
  snprintf(m, sizeof m, "%s/merged.json", root);
  tsr_trace *t;
  assert_int_equal(tsr_trace_create(&t, 0), 0);
  assert_int_equal(tsr_trace_complete(t, 1, 2, "cat", "step", 10, 5), 0);
  assert_int_equal(tsr_trace_write(t, a, err, sizeof err), 0);
  assert_int_equal(tsr_trace_write(t, b, err, sizeof err), 0);
  tsr_trace_free(t);
  n_synced = 0;
  const char *in[] = {a, b};
  assert_int_equal(tsr_trace_merge_files(in, 2, m, err, sizeof err), 0);
  assert_non_null(strstr(slurp(m), "traceEvents"));
  snprintf(tmp, sizeof tmp, "%s.tmp.", m);
  assert_true(was_synced_prefix(tmp));
  assert_true(was_synced(root));
  assert_int_equal(temp_files(root), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(mkdir_p_makes_parents, setup, teardown),
      cmocka_unit_test_setup_teardown(mkdir_p_names_a_file_in_the_way, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(write_atomic_replaces_and_syncs, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(
          write_atomic_failure_leaves_target_and_no_temp, setup, teardown),
      cmocka_unit_test_setup_teardown(atomic_stream_commit_and_abort, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(commit_written_renames_and_syncs, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(fsync_dir_names_what_is_missing, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(trace_write_and_merge_are_durable,
                                      setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
