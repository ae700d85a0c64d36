/* Checkpoint folders: a manifest commits a checkpoint, an unfinished one
 * is never the latest, pruning keeps the newest K, an unwritable root is
 * found before training; a part file with values training cannot leave
 * (valid CRCs, listed in the manifest) makes its checkpoint damaged, so a
 * restart falls back to the one before; `tessera ckpt`'s reader refuses a
 * part under a name that is not its own; a folder without a manifest is
 * logged and removed when a chief starts. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "chief/ckpt/ckpt.h"
#include "chief/ckpt/ckpt_read.h"
#include "common/ckpt/shardfile.h"
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

/* "w" [2, 2], one part, SGD: its four values as given. */
typedef struct {
  float v[4];
} w_vals;

static void w_emit(void *ctx, tsr_shardfile_writer *w) {
  tsr_shardfile_put(w, ((w_vals *)ctx)->v, sizeof(float) * 4);
}

/* Commits checkpoint `step` holding "w" with `vals`, its manifest listing
 * the file as written. */
static void commit_w(int64_t step, const float *vals) {
  char err[512], dir[256], id[32];
  assert_int_equal(chief_ckpt_prepare(root, step, err, sizeof err), 0);
  chief_ckpt_dir(root, step, dir, sizeof dir);
  snprintf(id, sizeof id, "id-%lld", (long long)step);
  tsr_shardfile_hdr h;
  memset(&h, 0, sizeof h);
  snprintf(h.ckpt_id, sizeof h.ckpt_id, "%s", id);
  h.ckpt_step = step;
  snprintf(h.name, sizeof h.name, "w");
  h.rank = 2;
  h.shape[0] = h.shape[1] = 2;
  h.num_shards = 1;
  h.rows = h.n_rows = h.width = 2;
  snprintf(h.optimizer, sizeof h.optimizer, "sgd");
  w_vals wv;
  memcpy(wv.v, vals, sizeof wv.v);
  tsr_shardfile_written out;
  assert_int_equal(tsr_shardfile_write(dir, &h, "test", w_emit, &wv, false,
                                       &out, err, sizeof err), 0);
  json_t *man = json_pack("{s:s, s:s, s:[{s:s, s:I, s:I, s:i}]}",
                          "checkpoint_id", id, "storage", "shared", "files",
                          "name", out.name, "bytes", (json_int_t)out.bytes,
                          "crc32c", (json_int_t)out.crc32c, "ps", 0);
  assert_int_equal(chief_ckpt_commit(root, step, man, err, sizeof err), 0);
  json_decref(man);
}

static void crafted_values_fall_back(void **state) {
  (void)state;
  const float ok[4] = {0.5f, -1, 2, 3};
  float bad[4] = {0.5f, -1, 2, 3};
  bad[2] = __builtin_nanf("");
  commit_w(10, ok);
  commit_w(20, bad);
  char err[512], dir[256];
  int64_t step;
  json_t *m;
  assert_int_equal(chief_ckpt_latest_intact(root, INT64_MAX, &step, &m, err,
                                            sizeof err), 0);
  assert_int_equal(step, 10);
  json_decref(m);
  chief_ckpt_dir(root, 20, dir, sizeof dir);
  assert_int_equal(chief_ckpt_latest(root, &step, &m, err, sizeof err), 0);
  assert_int_equal(step, 20);
  assert_int_equal(chief_ckpt_verify(dir, m, err, sizeof err), TSR_EFORMAT);
  assert_non_null(strstr(err, "w.part-0-of-1.tshard"));
  assert_non_null(strstr(err, "NaN"));
  json_decref(m);
}

static void alias_refused_by_reader(void **state) {
  (void)state;
  const float ok[4] = {0.5f, -1, 2, 3};
  commit_w(10, ok);
  char err[512], dir[256], a[300], b[300], cmd[700];
  chief_ckpt_dir(root, 10, dir, sizeof dir);
  snprintf(a, sizeof a, "%s/w.part-0-of-1.tshard", dir);
  snprintf(b, sizeof b, "%s/w.part-00-of-1.tshard", dir);
  snprintf(cmd, sizeof cmd, "cp '%s' '%s'", a, b);
  assert_int_equal(system(cmd), 0);
  chief_ckpt_var *vars = NULL;
  size_t n = 0;
  assert_int_equal(chief_ckpt_scan(dir, &vars, &n, err, sizeof err),
                   TSR_EFORMAT);
  assert_non_null(strstr(err, "w.part-00-of-1.tshard"));
  assert_null(vars);
}

/* A step folder without a manifest (a save that never finished, or a
 * manifest lost), newer than every committed one: a starting chief says
 * so and removes it (it was skipped without a word and stayed for good). */
static void unfinished_folder_logged_and_removed(void **state) {
  (void)state;
  const float ok[4] = {0.5f, -1, 2, 3};
  commit_w(10, ok);
  commit_w(20, ok);
  char err[512], dir[256], p[300], logp[300];
  chief_ckpt_dir(root, 20, dir, sizeof dir);
  snprintf(p, sizeof p, "%s/%s", dir, CHIEF_CKPT_MANIFEST);
  assert_int_equal(unlink(p), 0);
  /* stderr (the log) into a file for the call */
  snprintf(logp, sizeof logp, "%s/log.txt", root);
  fflush(stderr);
  int saved = dup(2), fd = open(logp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  assert_true(saved >= 0 && fd >= 0);
  dup2(fd, 2);
  int64_t *steps = NULL;
  size_t n = 0;
  int rc = chief_ckpt_list_intact(root, &steps, &n, err, sizeof err);
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  close(fd);
  assert_int_equal(rc, 0);
  assert_int_equal(n, 1);
  assert_int_equal(steps[0], 10);
  free(steps);
  struct stat st;
  assert_int_not_equal(stat(dir, &st), 0);
  FILE *f = fopen(logp, "r");
  char text[2048] = "";
  size_t got = fread(text, 1, sizeof text - 1, f);
  fclose(f);
  text[got] = 0;
  assert_non_null(strstr(text, "ckpt-000000000020 has no manifest"));
}

/* The root of a checkpoint folder: its parent, "/" at the top, "." for a
 * bare name. */
static void root_of_folders(void **state) {
  (void)state;
  char b[64];
  chief_ckpt_root_of("/runs/a/ckpt-000000000010", b, sizeof b);
  assert_string_equal(b, "/runs/a");
  chief_ckpt_root_of("rel/ckpt-000000000010", b, sizeof b);
  assert_string_equal(b, "rel");
  chief_ckpt_root_of("/ckpt-000000000010", b, sizeof b);
  assert_string_equal(b, "/");
  chief_ckpt_root_of("ckpt-000000000010", b, sizeof b);
  assert_string_equal(b, ".");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(root_of_folders),
      cmocka_unit_test_setup_teardown(commit_latest_and_prune, setup, teardown),
      cmocka_unit_test_setup_teardown(corrupt_manifest_is_skipped, setup, teardown),
      cmocka_unit_test_setup_teardown(unwritable_root_is_found_early, setup, teardown),
      cmocka_unit_test_setup_teardown(crafted_values_fall_back, setup, teardown),
      cmocka_unit_test_setup_teardown(alias_refused_by_reader, setup, teardown),
      cmocka_unit_test_setup_teardown(unfinished_folder_logged_and_removed,
                                      setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
