/* Checkpoint folders: a manifest commits a checkpoint, an unfinished one
 * is never the latest, pruning keeps the newest K, an unwritable root is
 * found before training. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "chief/ckpt/ckpt.h"
#include "common/err.h"

static char root[64];

static int setup(void **state) {
  (void)state;
  snprintf(root, sizeof root, "/tmp/tsr_ckpt_XXXXXX");
  return mkdtemp(root) ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", root);
  return system(cmd) == 0 ? 0 : -1;
}

static void touch_shard(int64_t step) {
  char dir[256], p[300];
  chief_ckpt_dir(root, step, dir, sizeof dir);
  snprintf(p, sizeof p, "%s/w.part-0-of-1.tshard", dir);
  FILE *f = fopen(p, "w");
  assert_non_null(f);
  fputs("x", f);
  fclose(f);
}

static void commit_latest_and_prune(void **state) {
  (void)state;
  char err[512];
  int64_t step;
  json_t *m;
  assert_int_equal(chief_ckpt_latest(root, &step, &m, err, sizeof err),
                   TSR_ENOTFOUND);
  for (int64_t s = 100; s <= 500; s += 100) {
    assert_int_equal(chief_ckpt_prepare(root, s, err, sizeof err), 0);
    touch_shard(s);
    json_t *man = json_object();
    json_object_set_new(man, "run_id", json_integer(7));
    assert_int_equal(chief_ckpt_commit(root, s, man, err, sizeof err), 0);
    json_decref(man);
  }
  /* an unfinished checkpoint at 600: shards but no manifest */
  assert_int_equal(chief_ckpt_prepare(root, 600, err, sizeof err), 0);
  touch_shard(600);
  assert_int_equal(chief_ckpt_latest(root, &step, &m, err, sizeof err), 0);
  assert_int_equal(step, 500);
  assert_int_equal(json_integer_value(json_object_get(m, "run_id")), 7);
  assert_string_equal(json_string_value(json_object_get(m, "format")),
                      CHIEF_CKPT_FORMAT);
  json_decref(m);
  char hint[128] = "";
  char hp[128];
  snprintf(hp, sizeof hp, "%s/checkpoint", root);
  FILE *f = fopen(hp, "r");
  assert_non_null(f);
  assert_non_null(fgets(hint, sizeof hint, f));
  fclose(f);
  assert_string_equal(hint, "latest: ckpt-000000000500\n");
  /* keep 2: 400 and 500 stay; 100-300 go; the unfinished 600 is newer
   * than every commit and stays (a save may be running) */
  assert_int_equal(chief_ckpt_prune(root, 2, err, sizeof err), 3);
  char dir[256];
  struct stat st;
  chief_ckpt_dir(root, 300, dir, sizeof dir);
  assert_int_not_equal(stat(dir, &st), 0);
  chief_ckpt_dir(root, 400, dir, sizeof dir);
  assert_int_equal(stat(dir, &st), 0);
  chief_ckpt_dir(root, 600, dir, sizeof dir);
  assert_int_equal(stat(dir, &st), 0);
  /* reading a folder directly */
  char folder[256];
  chief_ckpt_dir(root, 400, dir, sizeof dir);
  assert_int_equal(chief_ckpt_read(dir, &step, &m, folder, sizeof folder, err,
                                   sizeof err), 0);
  assert_int_equal(step, 400);
  json_decref(m);
  assert_int_equal(chief_ckpt_read(root, &step, &m, folder, sizeof folder,
                                   err, sizeof err), 0);
  assert_int_equal(step, 500);
  assert_non_null(strstr(folder, "ckpt-000000000500"));
  json_decref(m);
}

static void corrupt_manifest_is_skipped(void **state) {
  (void)state;
  char err[512], dir[256], p[300];
  json_t *man = json_object();
  assert_int_equal(chief_ckpt_prepare(root, 10, err, sizeof err), 0);
  assert_int_equal(chief_ckpt_commit(root, 10, man, err, sizeof err), 0);
  assert_int_equal(chief_ckpt_prepare(root, 20, err, sizeof err), 0);
  assert_int_equal(chief_ckpt_commit(root, 20, man, err, sizeof err), 0);
  json_decref(man);
  chief_ckpt_dir(root, 20, dir, sizeof dir);
  snprintf(p, sizeof p, "%s/%s", dir, CHIEF_CKPT_MANIFEST);
  FILE *f = fopen(p, "w");
  fputs("{\"format\": ", f);
  fclose(f);
  int64_t step;
  json_t *m;
  assert_int_equal(chief_ckpt_latest(root, &step, &m, err, sizeof err), 0);
  assert_int_equal(step, 10);
  json_decref(m);
}

static void unwritable_root_is_found_early(void **state) {
  (void)state;
  char err[512];
  assert_int_equal(chief_ckpt_check_writable(root, err, sizeof err), 0);
  char sub[128];
  snprintf(sub, sizeof sub, "%s/ro", root);
  mkdir(sub, 0555);
  char under[160];
  snprintf(under, sizeof under, "%s/ckpts", sub);
  if (geteuid() == 0) {
    /* root writes anywhere: use a path under a regular file instead */
    char file[160];
    snprintf(file, sizeof file, "%s/plainfile", root);
    FILE *f = fopen(file, "w");
    fclose(f);
    snprintf(under, sizeof under, "%s/plainfile/ckpts", root);
  }
  assert_true(chief_ckpt_check_writable(under, err, sizeof err) < 0);
  assert_non_null(strstr(err, under) ? err : strstr(err, "plainfile"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(commit_latest_and_prune, setup, teardown),
      cmocka_unit_test_setup_teardown(corrupt_manifest_is_skipped, setup, teardown),
      cmocka_unit_test_setup_teardown(unwritable_root_is_found_early, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
