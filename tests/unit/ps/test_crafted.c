/* Crafted shard files with valid CRCs, as an attacker or a bad disk copy
 * would leave them, each refused on restore with a message naming the
 * file, nothing changed: a huge n_rows that wrapped the size check to
 * nothing (dense and sparse: the PS crashed or served bytes from past the
 * mapping), parts whose rows overlap (rows left at their initial values),
 * a part copied in from an older checkpoint, ids outside their part, a
 * row saved twice, a part claiming another variable, a file of the old
 * format. Files are rewritten with a new header and correct CRCs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <dirent.h>
#include <msgpack.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/crc32c.h"
#include "ps_harness.h"
#include "ps/ps_int.h"

static char g_dir[256];

static void rmtree(const char *dir) {
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd)) abort();
}

static uint8_t *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  *len = (size_t)ftell(f);
  rewind(f);
  uint8_t *b = malloc(*len + 1);
  assert_int_equal(fread(b, 1, *len, f), *len);
  fclose(f);
  return b;
}

/* One header change: `key` set to an integer, or to a string when str is
 * not NULL. */
typedef struct {
  const char *key;
  int64_t num;
  const char *str;
} edit;

/* One change of the sections table: field `field` of section `idx` set
 * (an unsigned integer, or a string when str is not NULL), section `idx`
 * listed twice, or left out. */
typedef enum { SEC_NONE, SEC_SET, SEC_DUP, SEC_DROP } sec_op;
typedef struct {
  sec_op op;
  uint32_t idx;
  const char *field;
  uint64_t num;
  const char *str;
} sec_edit;

static bool key_is(const msgpack_object *k, const char *name) {
  return k->type == MSGPACK_OBJECT_STR && k->via.str.size == strlen(name) &&
         !memcmp(k->via.str.ptr, name, k->via.str.size);
}

static void pack_str(msgpack_packer *pk, const char *s) {
  msgpack_pack_str(pk, strlen(s));
  msgpack_pack_str_body(pk, s, strlen(s));
}

static void pack_sections(msgpack_packer *pk, const msgpack_object *v,
                          const sec_edit *se) {
  uint32_t n = v->via.array.size;
  msgpack_pack_array(pk, n + (se->op == SEC_DUP) - (se->op == SEC_DROP));
  for (uint32_t i = 0; i < n; i++) {
    const msgpack_object *m = &v->via.array.ptr[i];
    if (se->op == SEC_DROP && i == se->idx) continue;
    if (se->op != SEC_SET || i != se->idx) {
      msgpack_pack_object(pk, *m);
      continue;
    }
    msgpack_pack_map(pk, m->via.map.size);
    for (uint32_t j = 0; j < m->via.map.size; j++) {
      const msgpack_object_kv *kv = &m->via.map.ptr[j];
      msgpack_pack_object(pk, kv->key);
      if (!key_is(&kv->key, se->field))
        msgpack_pack_object(pk, kv->val);
      else if (se->str)
        pack_str(pk, se->str);
      else
        msgpack_pack_uint64(pk, se->num);
    }
  }
  if (se->op == SEC_DUP) msgpack_pack_object(pk, v->via.array.ptr[se->idx]);
}

/* Rewrites a shard file: the header with `edits` and `se` applied (and
 * key `dup_key`, when not NULL, listed a second time), the data cut to
 * `data_len` bytes (SIZE_MAX: as it is), both CRCs right again. */
static void rewrite_ex(const char *path, const edit *edits, int n_edits,
                       size_t data_len, const sec_edit *se,
                       const char *dup_key) {
  size_t len;
  uint8_t *b = slurp(path, &len);
  uint32_t hlen;
  memcpy(&hlen, b + 8, 4);
  msgpack_unpacked up;
  msgpack_unpacked_init(&up);
  assert_int_equal(msgpack_unpack_next(&up, (const char *)b + 12, hlen, NULL),
                   MSGPACK_UNPACK_SUCCESS);
  const uint8_t *data = b + 16 + hlen;
  size_t dlen = len - 16 - hlen;
  if (data_len != SIZE_MAX && data_len < dlen) dlen = data_len;
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  const msgpack_object *m = &up.data;
  msgpack_pack_map(&pk, m->via.map.size + (dup_key ? 1 : 0));
  const msgpack_object_kv *dup = NULL;
  for (uint32_t i = 0; i < m->via.map.size; i++) {
    const msgpack_object_kv *kv = &m->via.map.ptr[i];
    msgpack_pack_object(&pk, kv->key);
    if (dup_key && key_is(&kv->key, dup_key)) dup = kv;
    const edit *e = NULL;
    for (int k = 0; k < n_edits; k++)
      if (key_is(&kv->key, edits[k].key)) e = &edits[k];
    if (!e && key_is(&kv->key, "data_crc32c")) {
      msgpack_pack_uint32(&pk, tsr_crc32c(0, data, dlen));
      continue;
    }
    if (!e && se && se->op != SEC_NONE && key_is(&kv->key, "sections")) {
      pack_sections(&pk, &kv->val, se);
      continue;
    }
    if (!e) {
      msgpack_pack_object(&pk, kv->val);
    } else if (e->str) {
      pack_str(&pk, e->str);
    } else {
      msgpack_pack_int64(&pk, e->num);
    }
  }
  if (dup_key) {
    assert_non_null(dup);
    msgpack_pack_object(&pk, dup->key);
    msgpack_pack_object(&pk, dup->val);
  }
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  uint32_t nh = (uint32_t)sb.size, hcrc = tsr_crc32c(0, sb.data, sb.size);
  fwrite("TSRSHARD", 1, 8, f);
  fwrite(&nh, 4, 1, f);
  fwrite(sb.data, 1, sb.size, f);
  fwrite(&hcrc, 4, 1, f);
  fwrite(data, 1, dlen, f);
  fclose(f);
  msgpack_sbuffer_destroy(&sb);
  msgpack_unpacked_destroy(&up);
  free(b);
}

static void rewrite(const char *path, const edit *edits, int n_edits,
                    size_t data_len) {
  rewrite_ex(path, edits, n_edits, data_len, NULL, NULL);
}

/* Overwrites `n` bytes at `off` of a file's data, then sets its data CRC
 * right again. */
static void poke(const char *path, size_t off, const void *p, size_t n) {
  size_t len;
  uint8_t *b = slurp(path, &len);
  uint32_t hlen;
  memcpy(&hlen, b + 8, 4);
  assert_true(16 + hlen + off + n <= len);
  memcpy(b + 16 + hlen + off, p, n);
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(b, 1, len, f), len);
  fclose(f);
  free(b);
  rewrite(path, NULL, 0, SIZE_MAX);
}

static ps_var_spec spec_of(const char *name, int64_t d0, int64_t d1, int shard,
                           int nsh, tsr_opt_kind k, bool sparse) {
  ps_var_spec s = h_spec(name, d0, d1, shard, nsh, "glorot_uniform", 5, k);
  return sparse ? h_sparse(s, true) : s;
}

static const ps_ckpt_ident g_who = {"ckpt-b", 20};

/* Saves `nsh` parts of a variable into dir (as checkpoint `who`); the
 * shards' values differ from their initial ones. */
static void save_parts(const char *dir, const char *name, int64_t d0,
                       int64_t d1, int nsh, tsr_opt_kind k, bool sparse,
                       const ps_ckpt_ident *who) {
  ps_mem mem = {0, 0, NULL, NULL};
  char err[512];
  for (int i = 0; i < nsh; i++) {
    ps_var_spec sp = spec_of(name, d0, d1, i, nsh, k, sparse);
    ps_shard *s;
    assert_int_equal(ps__shard_new(&sp, &mem, &s, err, sizeof err), 0);
    if (sparse) {
      int64_t ids[2] = {sp.shard.row0, sp.shard.row0 + 1};
      float g[64];
      for (int j = 0; j < 64; j++) g[j] = 1.0f;
      assert_int_equal(ps__shard_apply_rows(s, &mem, ids, 2, g, 1.0f, err,
                                            sizeof err), 0);
    } else {
      float *g = calloc(s->numel, sizeof *g);
      for (size_t j = 0; j < s->numel; j++) g[j] = 0.25f;
      assert_int_equal(ps__shard_apply_dense(s, g, 1.0f), 0);
      free(g);
    }
    assert_int_equal(ps__ckpt_save_shard(s, dir, who, false, NULL, err,
                                         sizeof err), 0);
    ps__shard_free(s, &mem);
  }
}

static void part_path(char *buf, size_t len, const char *dir,
                      const char *name, int k, int n) {
  snprintf(buf, len, "%s/%s.part-%d-of-%d.tshard", dir, name, k, n);
}

/* Restoring the whole variable from dir: refused with `code` and a message
 * naming `text`; nothing is returned. */
static void refused(const char *dir, const char *name, int64_t d0, int64_t d1,
                    tsr_opt_kind k, bool sparse, const ps_ckpt_ident *want,
                    int code, const char *text) {
  ps_mem mem = {0, 0, NULL, NULL};
  char err[512] = "";
  ps_var_spec whole = spec_of(name, d0, d1, 0, 1, k, sparse);
  ps_shard *r = NULL;
  int rc = ps__ckpt_load_shard(&whole, &mem, dir, want, &r, err, sizeof err);
  if (rc != code || !strstr(err, text))
    fail_msg("restore gave %s \"%s\", expected %s naming \"%s\"",
             tsr_err_name(rc), err, tsr_err_name(code), text);
  assert_null(r);
  assert_int_equal(atomic_load(&mem.used), 0);
}

static void fresh_dir(void) {
  snprintf(g_dir, sizeof g_dir, "/tmp/tsr-crafted-XXXXXX");
  assert_non_null(mkdtemp(g_dir));
}

/* n_rows 2^62 on a dense part of width 1 and SGD: 2^62 * 4 bytes wrapped
 * to 0, the file carried no data, the restore read past the mapping. */
static void huge_n_rows_dense(void **state) {
  fresh_dir();
  save_parts(g_dir, "v", 8, 1, 1, TSR_OPT_SGD, false, &g_who);
  char p[512];
  part_path(p, sizeof p, g_dir, "v", 0, 1);
  edit e[] = {{"n_rows", (int64_t)1 << 62, NULL}, {"data_bytes", 0, NULL}};
  rewrite(p, e, 2, 0);
  refused(g_dir, "v", 8, 1, TSR_OPT_SGD, false, &g_who, TSR_EFORMAT,
          "rows stored");
  /* the same with rows and the shape agreeing: the size itself refuses */
  edit e2[] = {{"n_rows", (int64_t)1 << 62, NULL},
               {"rows", (int64_t)1 << 62, NULL}};
  rewrite(p, e2, 2, 0);
  refused(g_dir, "v", 8, 1, TSR_OPT_SGD, false, &g_who, TSR_EFORMAT, "v.part");
  rmtree(g_dir);
}

/* A sparse part of width 1 with Adagrad: 2^60 rows * (8 id bytes + 8
 * value and slot bytes) is 2^64, wrapped to 0: the PS crashed. */
static void huge_n_rows_sparse(void **state) {
  fresh_dir();
  save_parts(g_dir, "e", 16, 1, 1, TSR_OPT_ADAGRAD, true, &g_who);
  char p[512];
  part_path(p, sizeof p, g_dir, "e", 0, 1);
  edit e[] = {{"n_rows", (int64_t)1 << 60, NULL}, {"data_bytes", 0, NULL}};
  rewrite(p, e, 2, 0);
  refused(g_dir, "e", 16, 1, TSR_OPT_ADAGRAD, true, &g_who, TSR_EFORMAT,
          "e.part-0-of-1");
  rmtree(g_dir);
}

/* Part 1 of 2 rewritten to claim part 0's rows: the two overlap and rows
 * [5, 9) are in no part. */
static void overlapping_parts(void **state) {
  fresh_dir();
  save_parts(g_dir, "w", 9, 4, 2, TSR_OPT_SGD, false, &g_who);
  char p[512];
  part_path(p, sizeof p, g_dir, "w", 1, 2);
  edit e[] = {{"row0", 0, NULL}, {"rows", 4, NULL}, {"n_rows", 4, NULL}};
  rewrite(p, e, 3, SIZE_MAX);
  refused(g_dir, "w", 9, 4, TSR_OPT_SGD, false, &g_who, TSR_EFORMAT,
          "not part 1 of 2");
  /* part 0 copied over part 1: two copies of rows [0, 5) */
  save_parts(g_dir, "w", 9, 4, 2, TSR_OPT_SGD, false, &g_who);
  char p0[512];
  part_path(p0, sizeof p0, g_dir, "w", 0, 2);
  size_t len;
  uint8_t *b = slurp(p0, &len);
  FILE *f = fopen(p, "wb");
  fwrite(b, 1, len, f);
  fclose(f);
  free(b);
  refused(g_dir, "w", 9, 4, TSR_OPT_SGD, false, &g_who, TSR_EFORMAT,
          "its name says 1 of 2");
  rmtree(g_dir);
}

/* Part 1 copied in from an older checkpoint (valid CRCs, same variable). */
static void part_from_another_checkpoint(void **state) {
  fresh_dir();
  char old[300], p[512], q[512];
  snprintf(old, sizeof old, "%s/old", g_dir);
  assert_int_equal(mkdir(old, 0755), 0);
  ps_ckpt_ident a = {"ckpt-a", 10};
  save_parts(old, "w", 9, 4, 2, TSR_OPT_SGD, false, &a);
  save_parts(g_dir, "w", 9, 4, 2, TSR_OPT_SGD, false, &g_who);
  part_path(p, sizeof p, old, "w", 1, 2);
  part_path(q, sizeof q, g_dir, "w", 1, 2);
  assert_int_equal(rename(p, q), 0);
  refused(g_dir, "w", 9, 4, TSR_OPT_SGD, false, &g_who, TSR_ESTALE,
          "belongs to checkpoint \"ckpt-a\" of step 10");
  /* with no id asked for, the parts must still agree */
  refused(g_dir, "w", 9, 4, TSR_OPT_SGD, false, NULL, TSR_ESTALE,
          "other parts of w");
  rmtree(g_dir);
}

/* Sparse ids outside their part, and a row saved in two parts. */
static void sparse_ids(void **state) {
  fresh_dir();
  save_parts(g_dir, "e", 10, 2, 2, TSR_OPT_SGD, true, &g_who);
  char p0[512], p1[512];
  part_path(p0, sizeof p0, g_dir, "e", 0, 2);
  part_path(p1, sizeof p1, g_dir, "e", 1, 2);
  /* part 1 holds ids 5 and 6; make its first id 2 (part 0's) */
  size_t len;
  uint8_t *b = slurp(p1, &len);
  uint32_t hlen;
  memcpy(&hlen, b + 8, 4);
  int64_t id = 2;
  memcpy(b + 16 + hlen, &id, 8);
  FILE *f = fopen(p1, "wb");
  fwrite(b, 1, len, f);
  fclose(f);
  free(b);
  edit none[] = {{"written_by", 0, "test"}};
  rewrite(p1, none, 1, SIZE_MAX);
  refused(g_dir, "e", 10, 2, TSR_OPT_SGD, true, &g_who, TSR_EFORMAT,
          "row id 2");
  rmtree(g_dir);
}

/* A part whose header names another variable; a file of version 1. */
static void other_variable_and_old_format(void **state) {
  fresh_dir();
  save_parts(g_dir, "w", 9, 4, 1, TSR_OPT_SGD, false, &g_who);
  char p[512];
  part_path(p, sizeof p, g_dir, "w", 0, 1);
  edit e[] = {{"name", 0, "other"}};
  rewrite(p, e, 1, SIZE_MAX);
  refused(g_dir, "w", 9, 4, TSR_OPT_SGD, false, &g_who, TSR_ESHAPE,
          "holds variable \"other\"");
  edit v1[] = {{"name", 0, "w"}, {"version", 1, NULL}};
  rewrite(p, v1, 2, SIZE_MAX);
  refused(g_dir, "w", 9, 4, TSR_OPT_SGD, false, &g_who, TSR_EFORMAT,
          "version 1");
  /* padded: more data than the header says */
  edit ok[] = {{"version", 2, NULL}};
  rewrite(p, ok, 1, SIZE_MAX);
  FILE *f = fopen(p, "ab");
  fputc(0, f);
  fclose(f);
  refused(g_dir, "w", 9, 4, TSR_OPT_SGD, false, &g_who, TSR_ECORRUPT,
          "padded");
  rmtree(g_dir);
}

/* The whole variable restored from dir; its first value. */
static float restored_first(const char *dir, const char *name, int64_t d0,
                            int64_t d1, tsr_opt_kind k) {
  ps_mem mem = {0, 0, NULL, NULL};
  char err[512] = "";
  ps_var_spec whole = spec_of(name, d0, d1, 0, 1, k, false);
  ps_shard *r = NULL;
  int rc = ps__ckpt_load_shard(&whole, &mem, dir, &g_who, &r, err, sizeof err);
  if (rc) fail_msg("restore: %s", err);
  float v = r->w[0];
  ps__shard_free(r, &mem);
  return v;
}

/* The same part under names that are not its own (leading zeros, a sign,
 * a space): never read. Alone, they are no part; beside the real file,
 * its values stay. */
static void alias_names(void **state) {
  fresh_dir();
  save_parts(g_dir, "w", 9, 4, 1, TSR_OPT_SGD, false, &g_who);
  char p[512], keep[600];
  part_path(p, sizeof p, g_dir, "w", 0, 1);
  float real = restored_first(g_dir, "w", 9, 4, TSR_OPT_SGD), seven = 7.0f;
  snprintf(keep, sizeof keep, "%s.keep", p);
  static const char *const alias[] = {"w.part-00-of-1.tshard",
                                      "w.part-0-of-01.tshard",
                                      "w.part-+0-of-1.tshard",
                                      "w.part- 0-of-1.tshard"};
  size_t len;
  uint8_t *b = slurp(p, &len);
  assert_int_equal(rename(p, keep), 0);
  for (size_t i = 0; i < sizeof alias / sizeof alias[0]; i++) {
    char a[600];
    snprintf(a, sizeof a, "%s/%s", g_dir, alias[i]);
    FILE *f = fopen(a, "wb");
    assert_int_equal(fwrite(b, 1, len, f), len);
    fclose(f);
    poke(a, 0, &seven, 4); /* other values, valid CRCs */
    refused(g_dir, "w", 9, 4, TSR_OPT_SGD, false, &g_who, TSR_ENOTFOUND,
            "no saved parts of w");
    char moved[700];
    snprintf(moved, sizeof moved, "%s.%zu", keep, i);
    assert_int_equal(rename(a, moved), 0);
  }
  /* every alias beside the real file */
  assert_int_equal(rename(keep, p), 0);
  for (size_t i = 0; i < sizeof alias / sizeof alias[0]; i++) {
    char a[600], moved[700];
    snprintf(a, sizeof a, "%s/%s", g_dir, alias[i]);
    snprintf(moved, sizeof moved, "%s.keep.%zu", p, i);
    assert_int_equal(rename(moved, a), 0);
  }
  assert_true(restored_first(g_dir, "w", 9, 4, TSR_OPT_SGD) == real);
  free(b);
  rmtree(g_dir);
}

static void on_alarm(int sig) {
  (void)sig;
  static const char m[] = "restore blocked on a FIFO\n";
  if (write(2, m, sizeof m - 1) < 0) _exit(2);
  _exit(1);
}

/* A part that is a symbolic link (to a real part elsewhere) or a FIFO:
 * refused at once, by name. */
static void not_regular_files(void **state) {
  fresh_dir();
  char real[300], p[512], target[600];
  snprintf(real, sizeof real, "%s/elsewhere", g_dir);
  assert_int_equal(mkdir(real, 0755), 0);
  save_parts(real, "w", 9, 4, 1, TSR_OPT_SGD, false, &g_who);
  part_path(p, sizeof p, g_dir, "w", 0, 1);
  part_path(target, sizeof target, real, "w", 0, 1);
  assert_int_equal(symlink(target, p), 0);
  refused(g_dir, "w", 9, 4, TSR_OPT_SGD, false, &g_who, TSR_EFORMAT,
          "symbolic link");
  assert_int_equal(unlink(p), 0);
  assert_int_equal(mkfifo(p, 0600), 0);
  signal(SIGALRM, on_alarm);
  alarm(20);
  refused(g_dir, "w", 9, 4, TSR_OPT_SGD, false, &g_who, TSR_EFORMAT,
          "FIFO");
  alarm(0);
  signal(SIGALRM, SIG_DFL);
  rmtree(g_dir);
}

/* The sections table against the header: each change refused naming the
 * section, where a reader following FORMAT.md would have read other
 * arrays than the restore. */
static void sections_table(void **state) {
  static const struct {
    sec_edit se;
    const char *dup_key;
    const char *text;
  } cases[] = {
      {{SEC_SET, 0, "nbytes", (uint64_t)1 << 63, NULL}, NULL, "\"value\""},
      {{SEC_SET, 0, "dtype", 0, "<f8"}, NULL, "dtype \"<f8\""},
      {{SEC_SET, 1, "offset", (uint64_t)1 << 40, NULL}, NULL, "\"slot/m\""},
      {{SEC_SET, 2, "offset", 0, NULL}, NULL, "\"slot/v\""},
      {{SEC_SET, 1, "name", 0, "value"}, NULL, "\"value\""},
      {{SEC_SET, 2, "name", 0, "slot/x"}, NULL, "\"slot/x\""},
      {{SEC_DUP, 0, NULL, 0, NULL}, NULL, "4 sections"},
      {{SEC_DROP, 2, NULL, 0, NULL}, NULL, "2 sections"},
      {{SEC_NONE, 0, NULL, 0, NULL}, "sections", "key sections twice"},
      {{SEC_NONE, 0, NULL, 0, NULL}, "n_rows", "key n_rows twice"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    fresh_dir();
    save_parts(g_dir, "w", 9, 4, 1, TSR_OPT_ADAM, false, &g_who);
    char p[512];
    part_path(p, sizeof p, g_dir, "w", 0, 1);
    rewrite_ex(p, NULL, 0, SIZE_MAX, &cases[i].se, cases[i].dup_key);
    refused(g_dir, "w", 9, 4, TSR_OPT_ADAM, false, &g_who, TSR_EFORMAT,
            cases[i].text);
    rmtree(g_dir);
  }
}

/* Values training cannot leave: NaN or Inf weights and slots, negative
 * second moments and accumulators, ids past a bounded table. */
static void impossible_values(void **state) {
  const float nan = __builtin_nanf(""), inf = __builtin_inff(), neg = -0.5f;
  const size_t sec = 9 * 4 * 4; /* one [9, 4] float32 section */
  static const struct {
    tsr_opt_kind k;
    size_t off_secs, off_elems;
    int which;
    const char *text;
  } dense[] = {
      {TSR_OPT_SGD, 0, 5, 0, "\"value\""},          /* NaN weight */
      {TSR_OPT_SGD, 0, 35, 1, "\"value\""},         /* Inf weight */
      {TSR_OPT_ADAM, 1, 3, 1, "\"slot/m\""},        /* Inf first moment */
      {TSR_OPT_ADAM, 2, 0, 2, "\"slot/v\""},        /* negative v */
      {TSR_OPT_RMSPROP, 1, 7, 2, "\"slot/velocity\""},
      {TSR_OPT_ADAGRAD, 1, 1, 2, "\"slot/accumulator\""},
  };
  for (size_t i = 0; i < sizeof dense / sizeof dense[0]; i++) {
    fresh_dir();
    save_parts(g_dir, "w", 9, 4, 1, dense[i].k, false, &g_who);
    char p[512];
    part_path(p, sizeof p, g_dir, "w", 0, 1);
    const float *x = dense[i].which == 0 ? &nan
                     : dense[i].which == 1 ? &inf : &neg;
    poke(p, dense[i].off_secs * sec + dense[i].off_elems * 4, x, 4);
    refused(g_dir, "w", 9, 4, dense[i].k, false, &g_who, TSR_EFORMAT,
            dense[i].text);
    rmtree(g_dir);
  }
  /* sparse Adagrad, bounded [16, 2], one part: rows 0 and 1 saved (ids,
   * then values, then accumulators) */
  fresh_dir();
  save_parts(g_dir, "e", 16, 2, 1, TSR_OPT_ADAGRAD, true, &g_who);
  char p[512];
  part_path(p, sizeof p, g_dir, "e", 0, 1);
  poke(p, 16 + 16 + 4, &neg, 4);
  refused(g_dir, "e", 16, 2, TSR_OPT_ADAGRAD, true, &g_who, TSR_EFORMAT,
          "\"slot/accumulator\"");
  save_parts(g_dir, "e", 16, 2, 1, TSR_OPT_ADAGRAD, true, &g_who);
  int64_t past = 16;
  poke(p, 8, &past, 8);
  refused(g_dir, "e", 16, 2, TSR_OPT_ADAGRAD, true, &g_who, TSR_EFORMAT,
          "row id 16");
  rmtree(g_dir);
}

/* Through the service: a restore from a folder with a crafted part fails
 * whole and every shard keeps its values. */
static void service_keeps_values(void **state) {
  fresh_dir();
  ps_server_opts o = {0};
  o.checkpoint_root = g_dir;
  h_env e;
  h_up(&e, 1, &o);
  h_res r;
  ps_var_spec v = spec_of("w", 9, 4, 0, 1, TSR_OPT_SGD, false);
  H_CALL(&e, r, ps_client_create(e.cl[0], &v, 1, h_cb, &r));
  H_CALL(&e, r, ps_client_save_ckpt(e.cl[0], "ck", "ckpt-b", 20, true, h_cb,
                                    &r));
  assert_int_equal(r.status, 0);
  float before[36], got[36], g[36];
  for (int i = 0; i < 36; i++) g[i] = 1.0f;
  H_CALL(&e, r, ps_client_push(e.cl[0], "w", 0, 0, 0, PS_DT_F32, g, sizeof g,
                               h_cb, &r));
  H_CALL(&e, r, ps_client_pull(e.cl[0], "w", 0, 0, 0, before, 36, h_cb, &r));
  char ck[300], p[512];
  snprintf(ck, sizeof ck, "%s/ck", g_dir);
  part_path(p, sizeof p, ck, "w", 0, 1);
  edit x[] = {{"n_rows", (int64_t)1 << 62, NULL}, {"data_bytes", 0, NULL}};
  rewrite(p, x, 2, 0);
  H_CALL(&e, r, ps_client_restore_ckpt(e.cl[0], "ck", "ckpt-b", 20, h_cb,
                                       &r));
  assert_int_equal(r.status, TSR_EFORMAT);
  assert_non_null(strstr(r.message, "nothing changed"));
  H_CALL(&e, r, ps_client_pull(e.cl[0], "w", 0, 0, 0, got, 36, h_cb, &r));
  assert_memory_equal(got, before, sizeof got);
  /* another checkpoint's id asked for: refused too */
  H_CALL(&e, r, ps_client_save_ckpt(e.cl[0], "ck2", "ckpt-c", 30, false,
                                    h_cb, &r));
  assert_int_equal(r.status, 0);
  H_CALL(&e, r, ps_client_restore_ckpt(e.cl[0], "ck2", "ckpt-b", 20, h_cb,
                                       &r));
  assert_int_equal(r.status, TSR_ESTALE);
  H_CALL(&e, r, ps_client_restore_ckpt(e.cl[0], "ck2", "ckpt-c", 30, h_cb,
                                       &r));
  assert_int_equal(r.status, 0);
  assert_int_equal(h_down(&e), 0);
  rmtree(g_dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(huge_n_rows_dense),
      cmocka_unit_test(huge_n_rows_sparse),
      cmocka_unit_test(overlapping_parts),
      cmocka_unit_test(part_from_another_checkpoint),
      cmocka_unit_test(sparse_ids),
      cmocka_unit_test(other_variable_and_old_format),
      cmocka_unit_test(alias_names),
      cmocka_unit_test(not_regular_files),
      cmocka_unit_test(sections_table),
      cmocka_unit_test(impossible_values),
      cmocka_unit_test(service_keeps_values),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
