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

/* Rewrites a shard file: the header with `edits` applied, the data cut to
 * `data_len` bytes (SIZE_MAX: as it is), both CRCs right again. */
static void rewrite(const char *path, const edit *edits, int n_edits,
                    size_t data_len) {
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
  msgpack_pack_map(&pk, m->via.map.size);
  for (uint32_t i = 0; i < m->via.map.size; i++) {
    const msgpack_object_kv *kv = &m->via.map.ptr[i];
    msgpack_pack_object(&pk, kv->key);
    const edit *e = NULL;
    for (int k = 0; k < n_edits; k++)
      if (kv->key.via.str.size == strlen(edits[k].key) &&
          !memcmp(kv->key.via.str.ptr, edits[k].key, kv->key.via.str.size))
        e = &edits[k];
    if (!e && kv->key.via.str.size == 11 &&
        !memcmp(kv->key.via.str.ptr, "data_crc32c", 11)) {
      msgpack_pack_uint32(&pk, tsr_crc32c(0, data, dlen));
      continue;
    }
    if (!e) {
      msgpack_pack_object(&pk, kv->val);
    } else if (e->str) {
      msgpack_pack_str(&pk, strlen(e->str));
      msgpack_pack_str_body(&pk, e->str, strlen(e->str));
    } else {
      msgpack_pack_int64(&pk, e->num);
    }
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
  ps_mem mem = {0, 0, NULL};
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
  ps_mem mem = {0, 0, NULL};
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
      cmocka_unit_test(service_keeps_values),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
