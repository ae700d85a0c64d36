/* The shard file library on its own (common/ckpt/shardfile.h): dense and
 * sparse parts written and read back with the sections FORMAT.md lists,
 * names encoded and parsed (only as the writer writes them), a writer
 * whose data changes between its two passes or is not the size its header
 * says refused with no file left, files that are no regular files refused
 * without being read, slot names twice refused. */
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

#include "common/ckpt/shardfile.h"
#include "common/err.h"

static char g_dir[64];

static int setup(void **state) {
  (void)state;
  snprintf(g_dir, sizeof g_dir, "/tmp/tsr-shardfile-XXXXXX");
  return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
  return system(cmd) == 0 ? 0 : -1;
}

static int count_files(const char *dir) {
  DIR *d = opendir(dir);
  assert_non_null(d);
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (e->d_name[0] != '.') n++;
  closedir(d);
  return n;
}

/* A dense part: rows 3..5 of a [7, 2] variable saved in 2 parts, with one
 * slot; a sparse part: ids 9 and 4 of an unbounded [100, 2] table. */
static tsr_shardfile_hdr dense_hdr(void) {
  tsr_shardfile_hdr h;
  memset(&h, 0, sizeof h);
  snprintf(h.ckpt_id, sizeof h.ckpt_id, "ck-1");
  h.ckpt_step = 12;
  snprintf(h.name, sizeof h.name, "dense/kernel:0");
  h.rank = 2;
  h.shape[0] = 7;
  h.shape[1] = 2;
  h.shard = 1;
  h.num_shards = 2;
  h.row0 = 4;
  h.rows = 3;
  h.width = 2;
  h.n_rows = 3;
  h.step = 5;
  h.var_version = 6;
  snprintf(h.optimizer, sizeof h.optimizer, "sgd");
  h.nslots = 1;
  snprintf(h.slots[0], sizeof h.slots[0], "momentum");
  return h;
}

static tsr_shardfile_hdr sparse_hdr(void) {
  tsr_shardfile_hdr h = dense_hdr();
  snprintf(h.name, sizeof h.name, "emb");
  h.shape[0] = 100;
  h.sparse = true;
  h.shard = 0;
  h.num_shards = 1;
  h.row0 = 0;
  h.rows = 100;
  h.n_rows = 2;
  snprintf(h.optimizer, sizeof h.optimizer, "adagrad");
  snprintf(h.slots[0], sizeof h.slots[0], "accumulator");
  return h;
}

typedef struct {
  const void *p[3];
  size_t n[3];
  int calls;
  int change_on; /* 0: never; k: the k-th call puts other bytes */
  size_t cut;    /* bytes left off the last piece */
} src;

static void emit(void *ctx, tsr_shardfile_writer *w) {
  src *s = ctx;
  s->calls++;
  for (int i = 0; i < 3 && s->p[i]; i++) {
    size_t n = s->n[i] - (i == 2 || !s->p[i + 1] ? s->cut : 0);
    if (s->change_on == s->calls && i == 0) {
      float x = 42.0f;
      tsr_shardfile_put(w, &x, sizeof x);
      tsr_shardfile_put(w, (const char *)s->p[i] + 4, n - 4);
      continue;
    }
    tsr_shardfile_put(w, s->p[i], n);
  }
}

static void dense_round_trip(void **state) {
  (void)state;
  tsr_shardfile_hdr h = dense_hdr();
  float val[6] = {1, 2, 3, 4, 5, 6}, mom[6] = {-1, -2, -3, -4, -5, -6};
  src s = {{val, mom}, {sizeof val, sizeof mom}, 0, 0, 0};
  char err[512];
  tsr_shardfile_written out;
  assert_int_equal(tsr_shardfile_write(g_dir, &h, "test", emit, &s, true,
                                       &out, err, sizeof err), 0);
  assert_int_equal(s.calls, 2);
  assert_string_equal(out.name, "dense%2Fkernel%3A0.part-1-of-2.tshard");
  char path[256];
  snprintf(path, sizeof path, "%s/%s", g_dir, out.name);
  tsr_shardfile f;
  assert_int_equal(tsr_shardfile_open(&f, path, err, sizeof err), 0);
  assert_int_equal(f.size, out.bytes);
  assert_string_equal(f.p.h.name, "dense/kernel:0");
  assert_string_equal(f.p.h.ckpt_id, "ck-1");
  assert_int_equal(f.p.h.ckpt_step, 12);
  assert_int_equal(f.p.h.row0, 4);
  assert_int_equal(f.p.h.step, 5);
  assert_string_equal(f.p.h.slots[0], "momentum");
  assert_int_equal(f.p.data_bytes, sizeof val + sizeof mom);
  assert_memory_equal(f.p.data + f.p.off_value, val, sizeof val);
  assert_memory_equal(f.p.data + f.p.off_slot[0], mom, sizeof mom);
  tsr_shardfile_close(&f);
  /* the layout lists what the file holds */
  tsr_shardfile_section secs[TSR_SHARDFILE_MAX_SECTIONS];
  int n;
  uint64_t bytes;
  assert_int_equal(tsr_shardfile_layout(&h, secs, &n, &bytes), 0);
  assert_int_equal(n, 2);
  assert_string_equal(secs[1].name, "slot/momentum");
  assert_int_equal(secs[1].offset, sizeof val);
  assert_int_equal(bytes, sizeof val + sizeof mom);
}

static void sparse_round_trip(void **state) {
  (void)state;
  tsr_shardfile_hdr h = sparse_hdr();
  int64_t ids[2] = {9, 4};
  float val[4] = {1, 2, 3, 4}, acc[4] = {0.1f, 0.2f, 0.3f, 0.4f};
  src s = {{ids, val, acc}, {sizeof ids, sizeof val, sizeof acc}, 0, 0, 0};
  char err[512];
  tsr_shardfile_written out;
  assert_int_equal(tsr_shardfile_write(g_dir, &h, NULL, emit, &s, false,
                                       &out, err, sizeof err), 0);
  char path[256];
  snprintf(path, sizeof path, "%s/%s", g_dir, out.name);
  tsr_shardfile f;
  assert_int_equal(tsr_shardfile_open(&f, path, err, sizeof err), 0);
  assert_true(f.p.h.sparse);
  assert_int_equal(f.p.off_ids, 0);
  assert_memory_equal(f.p.data + f.p.off_ids, ids, sizeof ids);
  assert_memory_equal(f.p.data + f.p.off_value, val, sizeof val);
  assert_memory_equal(f.p.data + f.p.off_slot[0], acc, sizeof acc);
  tsr_shardfile_close(&f);
}

static void names(void **state) {
  (void)state;
  char buf[TSR_SHARDFILE_NAME_MAX], enc[64];
  assert_int_equal(tsr_shardfile_name("a b/c", 3, 10, buf, sizeof buf), 0);
  assert_string_equal(buf, "a%20b%2Fc.part-3-of-10.tshard");
  assert_int_equal(tsr_shardfile_name("x", 0, 1, buf, 8), TSR_ERANGE);
  tsr_shardfile_enc_name("a b/c", enc, sizeof enc);
  int32_t k, n;
  assert_true(tsr_shardfile_name_parse("a%20b%2Fc.part-3-of-10.tshard", enc,
                                       &k, &n));
  assert_int_equal(k, 3);
  assert_int_equal(n, 10);
  assert_false(tsr_shardfile_name_parse("a%20b%2Fc.part-10-of-10.tshard", enc,
                                        &k, &n));
  assert_false(tsr_shardfile_name_parse("a%20b%2Fcd.part-0-of-1.tshard", enc,
                                        &k, &n));
  assert_false(tsr_shardfile_name_parse("a%20b%2Fc.part-0-of-1.tshard.tmp.7",
                                        enc, &k, &n));
  /* only the writer's spelling of the numbers */
  static const char *const alias[] = {
      "x.part-00-of-1.tshard", "x.part-0-of-01.tshard",
      "x.part-+0-of-1.tshard", "x.part- 0-of-1.tshard",
      "x.part-0-of-1 .tshard", "x.part-0-of-+1.tshard",
      "x.part-0x0-of-1.tshard", "x.part--of-1.tshard",
      "x.part-0-of-.tshard", "x.part-0-of-65537.tshard",
      "x.part-0-of-1-of-1.tshard"};
  for (size_t i = 0; i < sizeof alias / sizeof alias[0]; i++)
    if (tsr_shardfile_name_parse(alias[i], "x", &k, &n))
      fail_msg("%s taken for part %d of %d", alias[i], k, n);
  assert_true(tsr_shardfile_name_parse("x.part-65535-of-65536.tshard", "x",
                                       &k, &n));
  assert_int_equal(k, 65535);
}

/* A symbolic link to a good part, a FIFO, a folder: refused by what they
 * are, without waiting on the FIFO. */
static void not_regular(void **state) {
  (void)state;
  tsr_shardfile_hdr h = dense_hdr();
  float val[6] = {1, 2, 3, 4, 5, 6}, mom[6] = {0};
  src s = {{val, mom}, {sizeof val, sizeof mom}, 0, 0, 0};
  char err[512], real[256], p[256];
  tsr_shardfile_written out;
  assert_int_equal(tsr_shardfile_write(g_dir, &h, NULL, emit, &s, false,
                                       &out, err, sizeof err), 0);
  snprintf(real, sizeof real, "%s/%s", g_dir, out.name);
  snprintf(p, sizeof p, "%s/link.tshard", g_dir);
  assert_int_equal(symlink(real, p), 0);
  tsr_shardfile f;
  assert_int_equal(tsr_shardfile_open(&f, p, err, sizeof err), TSR_EFORMAT);
  assert_non_null(strstr(err, "symbolic link"));
  assert_null(f.map);
  snprintf(p, sizeof p, "%s/fifo.tshard", g_dir);
  assert_int_equal(mkfifo(p, 0600), 0);
  assert_int_equal(tsr_shardfile_map(&f, p, err, sizeof err), TSR_EFORMAT);
  assert_non_null(strstr(err, "a FIFO"));
  assert_int_equal(tsr_shardfile_map(&f, g_dir, err, sizeof err),
                   TSR_EFORMAT);
  assert_non_null(strstr(err, "a folder"));
}

/* Slot names the layout would list twice. */
static void slots_twice(void **state) {
  (void)state;
  tsr_shardfile_hdr h = dense_hdr();
  h.nslots = 2;
  snprintf(h.slots[1], sizeof h.slots[1], "momentum");
  float val[6] = {1, 2, 3, 4, 5, 6}, mom[6] = {0}, mom2[6] = {0};
  src s = {{val, mom, mom2}, {sizeof val, sizeof mom, sizeof mom2}, 0, 0, 0};
  char err[512], p[256];
  tsr_shardfile_written out;
  assert_int_equal(tsr_shardfile_write(g_dir, &h, NULL, emit, &s, false,
                                       &out, err, sizeof err), 0);
  snprintf(p, sizeof p, "%s/%s", g_dir, out.name);
  tsr_shardfile f;
  assert_int_equal(tsr_shardfile_open(&f, p, err, sizeof err), TSR_EFORMAT);
  assert_non_null(strstr(err, "slot \"momentum\" is listed twice"));
}

/* Data that changes between the CRC pass and the write, or is not the
 * size the header says: refused, nothing left in the folder. */
static void bad_writers(void **state) {
  (void)state;
  tsr_shardfile_hdr h = dense_hdr();
  float val[6] = {1, 2, 3, 4, 5, 6}, mom[6] = {0};
  char err[512] = "";
  src s = {{val, mom}, {sizeof val, sizeof mom}, 0, 2, 0};
  assert_int_equal(tsr_shardfile_write(g_dir, &h, NULL, emit, &s, false,
                                       NULL, err, sizeof err), TSR_ECORRUPT);
  assert_non_null(strstr(err, "changed while it was written"));
  assert_int_equal(count_files(g_dir), 0);
  src t = {{val, mom}, {sizeof val, sizeof mom}, 0, 0, 4};
  assert_int_equal(tsr_shardfile_write(g_dir, &h, NULL, emit, &t, false,
                                       NULL, err, sizeof err), TSR_EINVAL);
  assert_non_null(strstr(err, "not the size its header says"));
  assert_int_equal(count_files(g_dir), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(dense_round_trip, setup, teardown),
      cmocka_unit_test_setup_teardown(sparse_round_trip, setup, teardown),
      cmocka_unit_test(names),
      cmocka_unit_test_setup_teardown(bad_writers, setup, teardown),
      cmocka_unit_test_setup_teardown(not_regular, setup, teardown),
      cmocka_unit_test_setup_teardown(slots_twice, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
