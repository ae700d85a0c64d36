/* The shard file library on its own (common/ckpt/shardfile.h): dense and
 * sparse parts written and read back with the sections FORMAT.md lists,
 * names encoded and parsed (only as the writer writes them), a writer
 * whose data changes between its two passes or is not the size its header
 * says refused with no file left, files that are no regular files refused
 * without being read, slot names twice refused; the one-pass writer from
 * rows gives the very bytes the two-pass one does (sections in layout
 * order at their own offsets, the header last, the CRCs joined), and
 * passes on the error of a block; a file checked by tsr_shardfile_open
 * does not stay resident, and tsr_shardfile_drop releases what a reader
 * touched after. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <dirent.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/ckpt/shardfile.h"
#include "common/ckpt/shardfile_int.h"
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

/* Rows of a part with one slot, as records (value, slot), made up from
 * the row number; ids r * 3 + 1. Fails at row `fail_at` (0: never). */
typedef struct {
  size_t width;
  uint64_t fail_at;
  int blocks;
} rows_src;

static int rows_fn(void *ctx, uint64_t r0, size_t n, unsigned char *ids,
                   unsigned char *const *secs, char *err, size_t errlen) {
  rows_src *s = ctx;
  s->blocks++;
  for (size_t i = 0; i < n; i++) {
    uint64_t r = r0 + i;
    if (s->fail_at && r == s->fail_at)
      return tsr_errf(err, errlen, TSR_EMEMLIMIT, "row %llu: lost",
                      (unsigned long long)r);
    int64_t id = (int64_t)(r * 3 + 1);
    if (ids) memcpy(ids + i * sizeof id, &id, sizeof id);
    for (size_t k = 0; k < s->width; k++) {
      float v = (float)r + 0.25f * (float)k, m = 1.0f + (float)(r % 7);
      memcpy(secs[0] + (i * s->width + k) * sizeof v, &v, sizeof v);
      memcpy(secs[1] + (i * s->width + k) * sizeof m, &m, sizeof m);
    }
  }
  return 0;
}

/* The same part through tsr_shardfile_write, sections one after the
 * other. */
typedef struct {
  const tsr_shardfile_hdr *h;
  rows_src *rs;
} stream_src;

static void stream_emit(void *ctx, tsr_shardfile_writer *w) {
  stream_src *s = ctx;
  size_t W = s->rs->width, n = (size_t)s->h->n_rows;
  int64_t *ids = malloc(n * sizeof *ids);
  float *val = malloc(n * W * sizeof *val), *mom = malloc(n * W * sizeof *mom);
  unsigned char *secs[2] = {(unsigned char *)val, (unsigned char *)mom};
  char err[64];
  assert_int_equal(rows_fn(s->rs, 0, n, s->h->sparse ? (unsigned char *)ids
                                                     : NULL, secs, err,
                           sizeof err), 0);
  if (s->h->sparse) tsr_shardfile_put(w, ids, n * sizeof *ids);
  for (size_t i = 0; i < n; i++) /* small pieces: through its buffer */
    tsr_shardfile_put(w, val + i * W, W * sizeof(float));
  for (size_t i = 0; i < n; i++)
    tsr_shardfile_put(w, mom + i * W, W * sizeof(float));
  free(ids);
  free(val);
  free(mom);
}

static void *slurp(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  *n = (size_t)ftell(f);
  fseek(f, 0, SEEK_SET);
  void *b = malloc(*n);
  assert_int_equal(fread(b, 1, *n, f), *n);
  fclose(f);
  return b;
}

static void rows_writer_same_bytes(void **state) {
  (void)state;
  /* in /tmp (the bulk of each section goes direct, heads and tails
   * buffered), then, where there is one, on tmpfs: kernels before 6.6
   * refuse O_DIRECT there, and every byte goes buffered */
  char shm[64] = "/dev/shm/tsr-shardfile-XXXXXX", keep[64];
  tsr_shardfile_stage *stage = tsr_shardfile_stage_new();
  assert_non_null(stage);
  snprintf(keep, sizeof keep, "%s", g_dir);
  bool on_shm = false;
  for (int pass = 0; pass < 4; pass++) {
    int sparse = pass % 2;
    if (pass == 2) {
      if (!mkdtemp(shm)) break; /* no tmpfs here */
      snprintf(g_dir, sizeof g_dir, "%s", shm);
      on_shm = true;
    }
    /* 200000 rows of 3: the sections pass the 1 MiB staging several
     * times and the rows come in several blocks; dense, 600001 rows:
     * its sections (7.2 MB) go direct, the sparse ones (2.4 MB) are
     * under SR_DIRECT_MIN and go buffered whole */
    tsr_shardfile_hdr h = sparse ? sparse_hdr() : dense_hdr();
    h.shape[0] = 600001;
    h.shape[1] = 3;
    h.width = 3;
    h.num_shards = 1;
    h.shard = 0;
    h.row0 = 0;
    h.rows = 600001;
    h.n_rows = sparse ? 200000 : 600001;
    rows_src rs = {3, 0, 0};
    stream_src ss = {&h, &rs};
    char err[512], a[300], b[300];
    tsr_shardfile_written o1, o2;
    assert_int_equal(tsr_shardfile_write(g_dir, &h, "test", stream_emit, &ss,
                                         false, &o1, err, sizeof err), 0);
    snprintf(a, sizeof a, "%s/%s", g_dir, o1.name);
    snprintf(b, sizeof b, "%s/first", g_dir);
    assert_int_equal(rename(a, b), 0);
    rs.blocks = 0;
    /* one stage for every pass: buffers kept from a file of another
     * shape serve the next */
    assert_int_equal(tsr_shardfile_write_rows(g_dir, &h, "test", rows_fn, &rs,
                                              stage, true, &o2, err,
                                              sizeof err), 0);
    assert_true(rs.blocks > 3);
    assert_int_equal(o1.bytes, o2.bytes);
    assert_int_equal(o1.crc32c, o2.crc32c);
    size_t n1, n2;
    void *x = slurp(b, &n1), *y = slurp(a, &n2);
    assert_int_equal(n1, n2);
    assert_memory_equal(x, y, n1);
    free(x);
    free(y);
    tsr_shardfile f;
    assert_int_equal(tsr_shardfile_open(&f, a, err, sizeof err), 0);
    tsr_shardfile_close(&f);
    unlink(a);
    unlink(b);
  }
  tsr_shardfile_stage_free(stage);
  if (on_shm) assert_int_equal(rmdir(shm), 0);
  snprintf(g_dir, sizeof g_dir, "%s", keep);
  /* a block that fails: its error, no file left */
  tsr_shardfile_hdr h = sparse_hdr();
  h.n_rows = 50;
  rows_src rs = {2, 17, 0};
  char err[512] = "";
  assert_int_equal(tsr_shardfile_write_rows(g_dir, &h, "test", rows_fn, &rs,
                                            NULL, false, NULL, err, sizeof err),
                   TSR_EMEMLIMIT);
  assert_non_null(strstr(err, "row 17: lost"));
  assert_int_equal(count_files(g_dir), 0);
}

/* rows_fn's rows with value element `bad` (row-major) made NaN, or
 * (`neg`) that element of the slot made negative. */
typedef struct {
  rows_src rs;
  uint64_t bad;
  bool neg;
} nan_src;

static int nan_rows(void *ctx, uint64_t r0, size_t n, unsigned char *ids,
                    unsigned char *const *secs, char *err, size_t errlen) {
  nan_src *s = ctx;
  int rc = rows_fn(&s->rs, r0, n, ids, secs, err, errlen);
  uint64_t W = s->rs.width, row = s->bad / W;
  if (!rc && row >= r0 && row < r0 + n) {
    uint32_t x = s->neg ? 0xbfa5a5a5u : 0x7fa5a5a5u; /* -1.29..., a NaN:
                                                         no zero byte */
    memcpy(secs[s->neg ? 1 : 0] + ((row - r0) * W + s->bad % W) * sizeof x,
           &x, sizeof x);
  }
  return rc;
}

static void check_reads_once(void **state) {
  (void)state;
  /* 400000 rows of 3 with a slot: ids 3.2 MB, value and slot 4.8 MB
   * each, read in pieces of 4 MiB; the id's length puts the value section
   * at 1 past 4-byte alignment, so its element at 4 MiB lies across two
   * pieces, three bytes in the first (the exponent's low bit among them) */
  tsr_shardfile_hdr h = sparse_hdr();
  h.shape[0] = 1200001;
  h.shape[1] = 3;
  h.width = 3;
  h.rows = 1200001;
  h.n_rows = 400000;
  nan_src ns = {{3, 0, 0}, UINT64_MAX, false};
  char err[512], err2[512], path[300];
  tsr_shardfile_written o;
  uint64_t vo = 0;
  for (int L = 0; L < 8; L++) {
    memset(h.ckpt_id, 'x', (size_t)L);
    h.ckpt_id[L] = 0;
    assert_int_equal(tsr_shardfile_write_rows(g_dir, &h, "test", nan_rows, &ns,
                                              NULL, false, &o, err,
                                              sizeof err), 0);
    snprintf(path, sizeof path, "%s/%s", g_dir, o.name);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    uint8_t head[12];
    assert_int_equal(fread(head, 1, 12, f), 12);
    fclose(f);
    uint32_t hlen;
    memcpy(&hlen, head + 8, 4);
    vo = 16 + (uint64_t)hlen + 400000 * 8;
    if (vo % 4 == 1) break;
  }
  assert_true(vo % 4 == 1);
  /* intact: its header */
  tsr_shardfile_hdr got;
  assert_int_equal(tsr_shardfile_check(path, o.bytes, o.crc32c, &got, err,
                                       sizeof err), 0);
  assert_int_equal(got.n_rows, 400000);
  assert_string_equal(got.ckpt_id, h.ckpt_id);
  /* another size, another CRC */
  assert_int_equal(tsr_shardfile_check(path, o.bytes + 1, o.crc32c, NULL, err,
                                       sizeof err), TSR_ECORRUPT);
  assert_non_null(strstr(err, "bytes, written"));
  assert_int_equal(tsr_shardfile_check(path, o.bytes, o.crc32c ^ 1, NULL, err,
                                       sizeof err), TSR_ECORRUPT);
  assert_non_null(strstr(err, "(damaged)"));
  /* a NaN across the pieces, its CRCs right: named as the map's check
   * names it */
  ns.bad = ((4u << 20) - vo) / 4;
  assert_int_equal(tsr_shardfile_write_rows(g_dir, &h, "test", nan_rows, &ns,
                                            NULL, false, &o, err, sizeof err),
                   0);
  assert_int_equal(tsr_shardfile_check(path, o.bytes, o.crc32c, NULL, err,
                                       sizeof err), TSR_EFORMAT);
  tsr_shardfile f;
  assert_int_equal(tsr_shardfile_open(&f, path, err2, sizeof err2),
                   TSR_EFORMAT);
  assert_string_equal(err, err2);
  assert_non_null(strstr(err, "\"value\" holds NaN"));
  /* a negative sum of squares */
  ns.neg = true;
  ns.bad = 1000001;
  assert_int_equal(tsr_shardfile_write_rows(g_dir, &h, "test", nan_rows, &ns,
                                            NULL, false, &o, err, sizeof err),
                   0);
  assert_int_equal(tsr_shardfile_check(path, o.bytes, o.crc32c, NULL, err,
                                       sizeof err), TSR_EFORMAT);
  assert_int_equal(tsr_shardfile_open(&f, path, err2, sizeof err2),
                   TSR_EFORMAT);
  assert_string_equal(err, err2);
  assert_non_null(strstr(err, "\"slot/accumulator\" holds a negative value"));
  assert_non_null(strstr(err, "row 333333, element 2"));
  /* not a regular file; missing */
  char link[300];
  snprintf(link, sizeof link, "%s/link.tshard", g_dir);
  assert_int_equal(symlink(path, link), 0);
  assert_int_equal(tsr_shardfile_check(link, o.bytes, o.crc32c, NULL, err,
                                       sizeof err), TSR_EFORMAT);
  assert_non_null(strstr(err, "symbolic link"));
  unlink(link);
  unlink(path);
  assert_int_equal(tsr_shardfile_check(path, o.bytes, o.crc32c, NULL, err,
                                       sizeof err), -ENOENT);
}

/* The resident kB of the mapping that starts at p (/proc/self/smaps). */
static long map_rss_kb(const void *p) {
  FILE *f = fopen("/proc/self/smaps", "r");
  assert_non_null(f);
  char line[512];
  bool in = false;
  long kb = -1;
  while (fgets(line, sizeof line, f)) {
    unsigned long a, e;
    char perm[8];
    if (sscanf(line, "%lx-%lx %7s", &a, &e, perm) == 3)
      in = a == (unsigned long)(uintptr_t)p; /* a mapping's first line */
    else if (in && sscanf(line, "Rss: %ld kB", &kb) == 1)
      break;
  }
  fclose(f);
  return kb;
}

static void reader_releases_pages(void **state) {
  (void)state;
  /* 600000 rows of 4 with a slot: 24 MB of data, three times what the
   * check holds between releases */
  tsr_shardfile_hdr h = sparse_hdr();
  h.shape[0] = 1800001;
  h.shape[1] = 4;
  h.width = 4;
  h.num_shards = 1;
  h.shard = 0;
  h.n_rows = 600000;
  rows_src rs = {4, 0, 0};
  char err[512], path[300];
  tsr_shardfile_written o;
  assert_int_equal(tsr_shardfile_write_rows(g_dir, &h, "test", rows_fn, &rs,
                                            NULL, false, &o, err, sizeof err),
                   0);
  snprintf(path, sizeof path, "%s/%s", g_dir, o.name);
  tsr_shardfile f;
  assert_int_equal(tsr_shardfile_open(&f, path, err, sizeof err), 0);
  long whole = (long)(f.size / 1024);
  assert_true(whole > 20000);
  /* checked whole, held a piece at a time (8 MiB and a page per section) */
  long after_check = map_rss_kb(f.map);
  assert_true(after_check >= 0);
  assert_true(after_check < 9 * 1024);
  /* a reader touching it all holds it all, until it drops it */
  const uint8_t *b = f.map;
  unsigned sum = 0;
  for (size_t i = 0; i < f.size; i += 4096) sum += b[i];
  (void)sum;
  assert_true(map_rss_kb(f.map) > whole / 2);
  tsr_shardfile_drop(&f, f.p.data, (size_t)f.p.data_bytes);
  assert_true(map_rss_kb(f.map) < 64);
  /* outside the map: nothing happens */
  tsr_shardfile_drop(&f, &sum, sizeof sum);
  assert_int_equal(f.p.h.n_rows, 600000);
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

/* Both writers find the file and its layout alike: "<dir>/<name>", the
 * sections tsr_shardfile_layout gives; a folder that makes the path too
 * long is refused naming it, by each writer, with nothing written. */
static void target_paths(void **state) {
  (void)state;
  tsr_shardfile_hdr h = dense_hdr();
  tsr_shardfile__dest d;
  char want[TSR_PATH_MAX], err[2 * TSR_PATH_MAX] = "";
  tsr_shardfile_section lay[TSR_SHARDFILE_MAX_SECTIONS];
  int nlay = 0;
  uint64_t bytes = 0;
  assert_int_equal(tsr_shardfile__dest_of(g_dir, &h, &d, err, sizeof err), 0);
  snprintf(want, sizeof want, "%s/%s", g_dir, d.fname);
  assert_string_equal(d.path, want);
  assert_int_equal(tsr_shardfile_layout(&h, lay, &nlay, &bytes), 0);
  assert_int_equal(d.nsec, nlay);
  assert_true(d.data_bytes == bytes);
  for (int k = 0; k < nlay; k++) {
    assert_string_equal(d.secs[k].name, lay[k].name);
    assert_true(d.secs[k].offset == lay[k].offset);
    assert_true(d.secs[k].nbytes == lay[k].nbytes);
  }
  char *dir = malloc(TSR_PATH_MAX);
  assert_non_null(dir);
  memset(dir, 'd', TSR_PATH_MAX - 8);
  dir[TSR_PATH_MAX - 8] = 0;
  assert_int_equal(tsr_shardfile__dest_of(dir, &h, &d, err, sizeof err),
                   TSR_ERANGE);
  assert_non_null(strstr(err, "path too long"));
  float val[6] = {0}, mom[6] = {0};
  src s = {{val, mom}, {sizeof val, sizeof mom}, 0, 0, 0};
  err[0] = 0;
  assert_int_equal(tsr_shardfile_write(dir, &h, NULL, emit, &s, false, NULL,
                                       err, sizeof err), TSR_ERANGE);
  assert_non_null(strstr(err, "path too long"));
  rows_src rs = {(size_t)h.width, 0, 0};
  err[0] = 0;
  assert_int_equal(tsr_shardfile_write_rows(dir, &h, "test", rows_fn, &rs,
                                            NULL, false, NULL, err, sizeof err),
                   TSR_ERANGE);
  assert_non_null(strstr(err, "path too long"));
  assert_int_equal(rs.blocks, 0);
  free(dir);
  assert_int_equal(count_files(g_dir), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(dense_round_trip, setup, teardown),
      cmocka_unit_test_setup_teardown(sparse_round_trip, setup, teardown),
      cmocka_unit_test(names),
      cmocka_unit_test_setup_teardown(rows_writer_same_bytes, setup, teardown),
      cmocka_unit_test_setup_teardown(reader_releases_pages, setup, teardown),
      cmocka_unit_test_setup_teardown(check_reads_once, setup, teardown),
      cmocka_unit_test_setup_teardown(bad_writers, setup, teardown),
      cmocka_unit_test_setup_teardown(not_regular, setup, teardown),
      cmocka_unit_test_setup_teardown(slots_twice, setup, teardown),
      cmocka_unit_test_setup_teardown(target_paths, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
