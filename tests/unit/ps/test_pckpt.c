/* Shard checkpoints: a round trip of dense and sparse shards with their
 * slots and step; a variable saved on 2 PS restored onto 3 (rows re-cut)
 * through the real service; a sparse shard of several MiB (rows that
 * straddle the writer's 1 MiB buffer) read back exactly; a truncated file and a flipped data byte fail
 * the restore whole, leaving every shard as it was; the header is the
 * documented msgpack map. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <dirent.h>
#include <fcntl.h>
#include <msgpack.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ps_harness.h"
#include "ps/ps_int.h"

static void tmpdir(char *buf, size_t len, const char *tag) {
  const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
  snprintf(buf, len, "%s/tsr-ps-%s-XXXXXX", base, tag);
  if (!mkdtemp(buf)) abort();
}

static void rmtree(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  char p[4096];
  while ((e = readdir(d)))
    if (e->d_name[0] != '.') {
      snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
      unlink(p);
    }
  closedir(d);
  rmdir(dir);
}

static ps_var_spec spec_of(const char *name, int64_t d0, int64_t d1, int shard,
                           int nsh, tsr_opt_kind k) {
  return h_spec(name, d0, d1, shard, nsh, "glorot_uniform", 5, k);
}

/* A row-sparse Adagrad table of rows `width` wide, ids unbounded, one
 * shard. */
static ps_var_spec sparse_of(const char *name, int64_t width) {
  ps_var_spec e = spec_of(name, 1, width, 0, 1, TSR_OPT_ADAGRAD);
  e.var.kind = TSR_VAR_ROW_SPARSE;
  e.bounded = false;
  return e;
}

static void shard_round_trip(void **state) {
  (void)state;
  char dir[256], err[512];
  tmpdir(dir, sizeof dir, "rt");
  ps_mem mem = {0, 0, NULL, NULL};
  ps_var_spec sp = spec_of("layer/kernel:0", 10, 6, 0, 1, TSR_OPT_ADAM);
  ps_shard *a, *b;
  assert_int_equal(ps__shard_new(&sp, &mem, &a, err, sizeof err), 0);
  float g[60];
  for (int t = 0; t < 3; t++) {
    for (int i = 0; i < 60; i++) g[i] = (float)(i - 30) * 0.01f * (float)(t + 1);
    ps__shard_apply_dense(a, g, 1.0f);
  }
  assert_int_equal(ps__ckpt_save_shard(a, dir, NULL, false, NULL, err, sizeof err), 0);
  assert_int_equal(ps__ckpt_load_shard(&sp, &mem, dir, NULL, &b, err, sizeof err), 0);
  assert_memory_equal(a->w, b->w, 240);
  assert_memory_equal(a->slots[0], b->slots[0], 240);
  assert_memory_equal(a->slots[1], b->slots[1], 240);
  assert_int_equal(b->step, 3);
  ps__shard_free(b, &mem);

  /* the header is a msgpack map with the documented keys */
  char fname[512], path[1024];
  ps__ckpt_file_name(&sp, fname, sizeof fname);
  assert_string_equal(fname, "layer%2Fkernel%3A0.part-0-of-1.tshard");
  snprintf(path, sizeof path, "%s/%s", dir, fname);
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  char magic[8];
  uint32_t hlen;
  assert_int_equal(fread(magic, 1, 8, f), 8);
  assert_memory_equal(magic, "TSRSHARD", 8);
  assert_int_equal(fread(&hlen, 4, 1, f), 1);
  char *h = malloc(hlen);
  assert_int_equal(fread(h, 1, hlen, f), hlen);
  fclose(f);
  msgpack_unpacked up;
  msgpack_unpacked_init(&up);
  assert_int_equal(msgpack_unpack_next(&up, h, hlen, NULL), MSGPACK_UNPACK_SUCCESS);
  assert_int_equal(up.data.type, MSGPACK_OBJECT_MAP);
  int seen = 0;
  for (uint32_t i = 0; i < up.data.via.map.size; i++) {
    msgpack_object k = up.data.via.map.ptr[i].key;
    msgpack_object v = up.data.via.map.ptr[i].val;
    if (k.via.str.size == 8 && !memcmp(k.via.str.ptr, "sections", 8)) {
      assert_int_equal(v.via.array.size, 3); /* value, slot/m, slot/v */
      seen++;
    }
    if (k.via.str.size == 4 && !memcmp(k.via.str.ptr, "name", 4)) {
      assert_memory_equal(v.via.str.ptr, "layer/kernel:0", 14);
      seen++;
    }
  }
  assert_int_equal(seen, 2);
  msgpack_unpacked_destroy(&up);
  free(h);

  /* sparse: ids, values and slots; restored onto 2 shards by id % 2 */
  ps_var_spec e = sparse_of("emb", 4);
  assert_int_equal(ps__shard_new(&e, &mem, &b, err, sizeof err), 0);
  int64_t ids[5] = {11, 4, 1000000007, 6, 9};
  float rg[20];
  for (int i = 0; i < 20; i++) rg[i] = (float)i * 0.1f;
  assert_int_equal(ps__shard_apply_rows(b, &mem, ids, 5, rg, 1.0f, err, sizeof err), 0);
  assert_int_equal(ps__ckpt_save_shard(b, dir, NULL, false, NULL, err, sizeof err), 0);
  float want[20];
  ps__shard_gather(b, &mem, ids, 5, want, false, err, sizeof err);
  for (int k = 0; k < 2; k++) {
    ps_var_spec ek = e;
    ek.shard.shard = k;
    ek.shard.num_shards = 2;
    ps_shard *r;
    assert_int_equal(ps__ckpt_load_shard(&ek, &mem, dir, NULL, &r, err, sizeof err), 0);
    for (int i = 0; i < 5; i++) {
      if (ids[i] % 2 != k) continue;
      float *rec = ps__rows_find(&r->rows, ids[i]);
      assert_non_null(rec);
      assert_memory_equal(rec, want + 4 * i, 16);
      assert_memory_equal(rec + 4, ps__rows_find(&b->rows, ids[i]) + 4, 16);
    }
    assert_int_equal(r->rows.count, k == 0 ? 2 : 3);
    ps__shard_free(r, &mem);
  }
  ps__shard_free(b, &mem);
  ps__shard_free(a, &mem);
  assert_int_equal(atomic_load(&mem.used), 0);
  rmtree(dir);
}

/* A sparse shard whose sections are several times the writer's 1 MiB
 * buffer, with 12-byte rows that straddle its edges: written with the
 * read-back check, every row and slot restored exactly. */
static void sparse_past_the_buffer(void **state) {
  (void)state;
  char dir[256], err[512];
  tmpdir(dir, sizeof dir, "big");
  ps_mem mem = {0, 0, NULL, NULL};
  ps_var_spec e = sparse_of("big", 3);
  ps_shard *a, *b;
  assert_int_equal(ps__shard_new(&e, &mem, &a, err, sizeof err), 0);
  enum { N = 150000, CH = 5000 };
  int64_t *ids = malloc(N * sizeof *ids);
  float *g = malloc(CH * 3 * sizeof *g);
  for (int i = 0; i < N; i++) ids[i] = (int64_t)i * 7919 + 3;
  for (int c = 0; c < N; c += CH) {
    for (int i = 0; i < CH * 3; i++) g[i] = (float)((c + i) % 97) * 0.01f - 0.4f;
    assert_int_equal(ps__shard_apply_rows(a, &mem, ids + c, CH, g, 1.0f, err,
                                          sizeof err), 0);
  }
  ps_ckpt_file out;
  assert_int_equal(ps__ckpt_save_shard(a, dir, NULL, true, &out, err,
                                       sizeof err), 0);
  assert_true(out.bytes > (uint64_t)N * (8 + 12 + 12));
  assert_int_equal(ps__ckpt_load_shard(&e, &mem, dir, NULL, &b, err,
                                       sizeof err), 0);
  assert_int_equal(b->rows.count, N);
  for (int i = 0; i < N; i++) {
    float *x = ps__rows_find(&a->rows, ids[i]), *y = ps__rows_find(&b->rows, ids[i]);
    assert_non_null(y);
    assert_memory_equal(x, y, 6 * sizeof(float)); /* value and accumulator */
  }
  free(ids);
  free(g);
  ps__shard_free(a, &mem);
  ps__shard_free(b, &mem);
  assert_int_equal(atomic_load(&mem.used), 0);
  rmtree(dir);
}

/* A materialized table (every row held) saved in two shards, restored
 * into one materialized shard and into one of rows made on first touch:
 * the same rows and slots either way. */
static void materialized_round_trip(void **state) {
  (void)state;
  char dir[256], err[512];
  tmpdir(dir, sizeof dir, "mat");
  ps_mem mem = {0, 0, NULL, NULL};
  ps_shard *a[2], *m, *t;
  for (int k = 0; k < 2; k++) {
    ps_var_spec e = spec_of("emb", 3001, 5, k, 2, TSR_OPT_ADAGRAD);
    e.var.kind = TSR_VAR_ROW_SPARSE;
    e.bounded = e.materialized = true;
    assert_int_equal(ps__shard_new(&e, &mem, &a[k], err, sizeof err), 0);
    int64_t ids[3] = {e.shard.row0, e.shard.row0 + 17, e.shard.row0 + 1000};
    float g[15];
    for (int i = 0; i < 15; i++) g[i] = 0.1f * (float)(i + k);
    assert_int_equal(ps__shard_apply_rows(a[k], &mem, ids, 3, g, 1.0f, err,
                                          sizeof err), 0);
    assert_int_equal(ps__ckpt_save_shard(a[k], dir, NULL, true, NULL, err,
                                         sizeof err), 0);
  }
  ps_var_spec whole = spec_of("emb", 3001, 5, 0, 1, TSR_OPT_ADAGRAD);
  whole.var.kind = TSR_VAR_ROW_SPARSE;
  whole.bounded = true;
  assert_int_equal(ps__ckpt_load_shard(&whole, &mem, dir, NULL, &t, err,
                                       sizeof err), 0);
  whole.materialized = true;
  assert_int_equal(ps__ckpt_load_shard(&whole, &mem, dir, NULL, &m, err,
                                       sizeof err), 0);
  assert_int_equal(t->rows.count, 3001);
  assert_int_equal(m->rows.count, 3001);
  for (int64_t id = 0; id < 3001; id++) {
    const ps_shard *src = a[id < 1501 ? 0 : 1];
    float *x = ps__rows_find(&src->rows, id);
    assert_memory_equal(x, ps__rows_find(&t->rows, id), 10 * sizeof(float));
    assert_memory_equal(x, ps__rows_find(&m->rows, id), 10 * sizeof(float));
  }
  ps__shard_free(m, &mem);
  ps__shard_free(t, &mem);
  ps__shard_free(a[0], &mem);
  ps__shard_free(a[1], &mem);
  assert_int_equal(atomic_load(&mem.used), 0);
  rmtree(dir);
}

static void corrupt_files_fail_whole(void **state) {
  (void)state;
  char dir[256], err[512];
  tmpdir(dir, sizeof dir, "bad");
  ps_mem mem = {0, 0, NULL, NULL};
  ps_var_spec s0 = spec_of("v", 9, 3, 0, 2, TSR_OPT_SGD);
  ps_var_spec s1 = spec_of("v", 9, 3, 1, 2, TSR_OPT_SGD);
  ps_shard *a, *b, *r = NULL;
  assert_int_equal(ps__shard_new(&s0, &mem, &a, err, sizeof err), 0);
  assert_int_equal(ps__shard_new(&s1, &mem, &b, err, sizeof err), 0);
  assert_int_equal(ps__ckpt_save_shard(a, dir, NULL, false, NULL, err, sizeof err), 0);
  assert_int_equal(ps__ckpt_save_shard(b, dir, NULL, false, NULL, err, sizeof err), 0);
  ps_var_spec whole = spec_of("v", 9, 3, 0, 1, TSR_OPT_SGD);
  assert_int_equal(ps__ckpt_load_shard(&whole, &mem, dir, NULL, &r, err, sizeof err), 0);
  ps__shard_free(r, &mem);
  r = NULL;
  /* another optimizer's slots */
  ps_var_spec adam = spec_of("v", 9, 3, 0, 2, TSR_OPT_ADAM);
  assert_int_equal(ps__ckpt_load_shard(&adam, &mem, dir, NULL, &r, err, sizeof err),
                   TSR_ESHAPE);
  assert_non_null(strstr(err, "slot"));
  char p1[1024];
  ps__ckpt_file_name(&s1, p1, sizeof p1);
  char path[1300];
  snprintf(path, sizeof path, "%s/%s", dir, p1);
  struct stat st;
  assert_int_equal(stat(path, &st), 0);
  /* flip one data byte */
  int fd = open(path, O_RDWR);
  unsigned char c;
  assert_int_equal(pread(fd, &c, 1, st.st_size - 3), 1);
  c ^= 0x40;
  assert_int_equal(pwrite(fd, &c, 1, st.st_size - 3), 1);
  assert_int_equal(ps__ckpt_load_shard(&whole, &mem, dir, NULL, &r, err, sizeof err),
                   TSR_ECORRUPT);
  assert_non_null(strstr(err, "CRC32C"));
  assert_null(r);
  /* truncate it */
  c ^= 0x40;
  assert_int_equal(pwrite(fd, &c, 1, st.st_size - 3), 1);
  assert_int_equal(ftruncate(fd, st.st_size - 7), 0);
  close(fd);
  assert_int_equal(ps__ckpt_load_shard(&whole, &mem, dir, NULL, &r, err, sizeof err),
                   TSR_ECORRUPT);
  assert_non_null(strstr(err, "truncated"));
  /* a missing part */
  unlink(path);
  assert_int_equal(ps__ckpt_load_shard(&whole, &mem, dir, NULL, &r, err, sizeof err),
                   TSR_ENOTFOUND);
  ps__shard_free(a, &mem);
  ps__shard_free(b, &mem);
  assert_int_equal(atomic_load(&mem.used), 0);
  rmtree(dir);
}

/* ---- through the service: saved on 2 PS, restored onto 3 -------------------*/

enum { R = 13, C = 5 };

/* Shard k of nsh of "w" [R, C] (Adam) and of "emb" [1000, 3] (sparse,
 * bounded, Adagrad) created on PS k of `e`; returns w's spec. */
static ps_var_spec create_w_emb(h_env *e, int k, int nsh) {
  ps_var_spec v[2] = {
      spec_of("w", R, C, k, nsh, TSR_OPT_ADAM),
      h_sparse(spec_of("emb", 1000, 3, k, nsh, TSR_OPT_ADAGRAD), true)};
  h_res r;
  H_CALL(e, r, ps_client_create(e->cl[k], v, 2, h_cb, &r));
  assert_int_equal(r.status, 0);
  assert_int_equal(r.count, 2);
  return v[0];
}

static void two_ps_to_three(void **state) {
  (void)state;
  char dir[256];
  tmpdir(dir, sizeof dir, "svc");
  /* the PS save and restore only under their root: "ck" is inside it */
  ps_server_opts o = {0};
  o.checkpoint_root = dir;
  char ck[300];
  snprintf(ck, sizeof ck, "%s/ck", dir);
  h_env e2;
  h_up(&e2, 2, &o);
  h_res r;
  static float full[R * C], g[R * C], got[R * C];
  /* "w" in 2 shards (7 + 6 rows), one per PS; "emb" sparse, 2 shards */
  for (int k = 0; k < 2; k++) {
    ps_var_spec w = create_w_emb(&e2, k, 2);
    int64_t row0 = w.shard.row0, rows = w.shard.rows;
    for (int t = 0; t < 2; t++) {
      for (int i = 0; i < rows * C; i++) g[i] = (float)((i + t) % 7) - 3.0f;
      H_CALL(&e2, r, ps_client_push(e2.cl[k], "w", k, 0, t, PS_DT_F32, g,
                                    (size_t)(rows * C * 4), h_cb, &r));
      assert_int_equal(r.status, 0);
    }
    H_CALL(&e2, r, ps_client_pull(e2.cl[k], "w", k, 0, 0, full + row0 * C,
                                  (size_t)(rows * C), h_cb, &r));
    int64_t id = k == 0 ? 42 : 777;
    float rg[3] = {1, 2, 3};
    H_CALL(&e2, r, ps_client_push_rows(e2.cl[k], "emb", k, 0, 0, PS_DT_F32,
                                       &id, 1, rg, sizeof rg, h_cb, &r));
    assert_int_equal(r.status, 0);
  }
  float emb42[3], emb777[3];
  int64_t i42 = 42, i777 = 777;
  H_CALL(&e2, r, ps_client_pull_rows(e2.cl[0], "emb", 0, 0, 0, &i42, 1, emb42, 3, h_cb, &r));
  H_CALL(&e2, r, ps_client_pull_rows(e2.cl[1], "emb", 1, 0, 0, &i777, 1, emb777, 3, h_cb, &r));
  for (int k = 0; k < 2; k++) {
    H_CALL(&e2, r, ps_client_save(e2.cl[k], "ck", h_cb, &r));
    assert_int_equal(r.status, 0);
    assert_int_equal(r.count, 2);
  }
  assert_int_equal(h_down(&e2), 0);

  h_env e3;
  h_up(&e3, 3, &o);
  for (int k = 0; k < 3; k++) {
    ps_var_spec w = create_w_emb(&e3, k, 3);
    H_CALL(&e3, r, ps_client_restore(e3.cl[k], ck, h_cb, &r));
    assert_int_equal(r.status, 0);
    assert_int_equal(r.count, 2);
    H_CALL(&e3, r,
           ps_client_pull(e3.cl[k], "w", k, 0, 0, got,
                          (size_t)(w.shard.rows * C), h_cb, &r));
    assert_int_equal(r.status, 0);
    assert_memory_equal(got, full + w.shard.row0 * C,
                        (size_t)(w.shard.rows * C * 4));
    assert_int_equal(r.step, 2);
  }
  /* rows re-cut: 42 is on shard 0 of 3 ([0,334)), 777 on shard 2 */
  float back[3];
  H_CALL(&e3, r, ps_client_pull_rows(e3.cl[0], "emb", 0, 0, 0, &i42, 1, back, 3, h_cb, &r));
  assert_memory_equal(back, emb42, 12);
  H_CALL(&e3, r, ps_client_pull_rows(e3.cl[2], "emb", 2, 0, 0, &i777, 1, back, 3, h_cb, &r));
  assert_memory_equal(back, emb777, 12);
  /* a corrupt file: the restore fails and nothing changes */
  DIR *d = opendir(ck);
  struct dirent *de;
  char victim[1300] = "";
  while ((de = readdir(d)))
    if (strstr(de->d_name, "w.part-1-of-2")) snprintf(victim, sizeof victim, "%s/%s", ck, de->d_name);
  closedir(d);
  assert_true(victim[0]);
  struct stat st;
  stat(victim, &st);
  assert_int_equal(truncate(victim, st.st_size / 2), 0);
  float before[R * C];
  H_CALL(&e3, r, ps_client_pull(e3.cl[1], "w", 1, 0, 0, before, 4 * C, h_cb, &r));
  uint64_t version = r.version;
  float gg[4 * C];
  for (int i = 0; i < 4 * C; i++) gg[i] = 0.5f;
  H_CALL(&e3, r, ps_client_push(e3.cl[1], "w", 1, 0, 0, PS_DT_F32, gg, sizeof gg, h_cb, &r));
  H_CALL(&e3, r, ps_client_pull(e3.cl[1], "w", 1, 0, 0, before, 4 * C, h_cb, &r));
  assert_int_equal(r.version, version + 1);
  H_CALL(&e3, r, ps_client_restore(e3.cl[1], "ck", h_cb, &r));
  assert_int_equal(r.status, TSR_ECORRUPT);
  assert_non_null(strstr(r.message, "nothing changed"));
  H_CALL(&e3, r, ps_client_pull(e3.cl[1], "w", 1, 0, 0, got, 4 * C, h_cb, &r));
  assert_memory_equal(got, before, sizeof gg);
  assert_int_equal(r.version, version + 1);
  assert_int_equal(h_down(&e3), 0);
  rmtree(ck);
  rmtree(dir);
}

/* A save whose writing is held (the test hook's gate file): pushes and
 * pulls go on and are answered meanwhile, a second save is refused while
 * it is written, and the files hold the shards as they were when the
 * save came (a restore after more pushes brings those values back). A
 * background save answers once snapshotted; SaveWait answers with the
 * files once written; SaveWait for a checkpoint the PS is not saving is
 * refused. */
static void save_while_applying(void **state) {
  (void)state;
  char dir[256], gate[300];
  tmpdir(dir, sizeof dir, "bg");
  snprintf(gate, sizeof gate, "%s/gate", dir);
  FILE *gf = fopen(gate, "w");
  assert_non_null(gf);
  fclose(gf);
  ps_server_opts o = {0};
  o.checkpoint_root = dir;
  o.test_save_gate = gate;
  h_env e;
  h_up(&e, 1, &o);
  ps_var_spec v[2] = {
      spec_of("w", R, C, 0, 1, TSR_OPT_ADAM),
      h_sparse(spec_of("emb", 1000, 3, 0, 1, TSR_OPT_ADAGRAD), true)};
  v[1].materialized = true;
  h_res r, sv, wt;
  H_CALL(&e, r, ps_client_create(e.cl[0], v, 2, h_cb, &r));
  assert_int_equal(r.status, 0);
  static float g[R * C], w0[R * C], w1[R * C];
  int64_t ids[2] = {5, 900};
  float rg[6] = {1, 2, 3, -1, -2, -3}, e0[6], e1[6];
  for (int i = 0; i < R * C; i++) g[i] = 0.25f;
  H_CALL(&e, r, ps_client_push(e.cl[0], "w", 0, 0, 0, PS_DT_F32, g, sizeof g,
                               h_cb, &r));
  H_CALL(&e, r, ps_client_push_rows(e.cl[0], "emb", 0, 0, 0, PS_DT_F32, ids,
                                    2, rg, sizeof rg, h_cb, &r));
  H_CALL(&e, r, ps_client_pull(e.cl[0], "w", 0, 0, 0, w0, R * C, h_cb, &r));
  H_CALL(&e, r, ps_client_pull_rows(e.cl[0], "emb", 0, 0, 0, ids, 2, e0, 3,
                                    h_cb, &r));
  /* snapshotted and answered; the writing waits at the gate */
  H_CALL(&e, sv, ps_client_save_start(e.cl[0], "ck", "ck-1", 7, false, h_cb,
                                      &sv));
  assert_int_equal(sv.status, 0);
  assert_int_equal(sv.count, 2);
  memset(&wt, 0, sizeof wt);
  assert_int_equal(ps_client_save_wait(e.cl[0], "ck-1", h_cb, &wt), 0);
  for (int t = 1; t <= 3; t++) { /* applies go on */
    H_CALL(&e, r, ps_client_push(e.cl[0], "w", 0, 0, t, PS_DT_F32, g,
                                 sizeof g, h_cb, &r));
    assert_int_equal(r.status, 0);
    H_CALL(&e, r, ps_client_push_rows(e.cl[0], "emb", 0, 0, t, PS_DT_F32,
                                      ids, 2, rg, sizeof rg, h_cb, &r));
    assert_int_equal(r.status, 0);
  }
  H_CALL(&e, r, ps_client_pull(e.cl[0], "w", 0, 0, 0, w1, R * C, h_cb, &r));
  assert_memory_not_equal(w0, w1, sizeof w0);
  H_CALL(&e, r, ps_client_pull_rows(e.cl[0], "emb", 0, 0, 0, ids, 2, e1, 3,
                                    h_cb, &r));
  assert_memory_not_equal(e0, e1, sizeof e0);
  H_CALL(&e, r, ps_client_save_start(e.cl[0], "ck2", "ck-2", 9, false, h_cb,
                                     &r));
  assert_int_equal(r.status, TSR_EBUSY);
  assert_non_null(strstr(r.message, "ck-1"));
  h_spin(&e, 50);
  assert_false(wt.done); /* held at the gate */
  unlink(gate);
  assert_true(h_wait(&e, &wt.done));
  assert_int_equal(wt.status, 0);
  assert_int_equal(wt.count, 2);
  H_CALL(&e, r, ps_client_save_wait(e.cl[0], "ck-9", h_cb, &r));
  assert_int_equal(r.status, TSR_ENOTFOUND);
  /* the files are the shards as the save found them */
  H_CALL(&e, r, ps_client_restore_ckpt(e.cl[0], "ck", "ck-1", 7, h_cb, &r));
  assert_int_equal(r.status, 0);
  H_CALL(&e, r, ps_client_pull(e.cl[0], "w", 0, 0, 0, w1, R * C, h_cb, &r));
  assert_memory_equal(w0, w1, sizeof w0);
  assert_int_equal(r.step, 1);
  H_CALL(&e, r, ps_client_pull_rows(e.cl[0], "emb", 0, 0, 0, ids, 2, e1, 3,
                                    h_cb, &r));
  assert_memory_equal(e0, e1, sizeof e0);
  /* the next save goes through */
  H_CALL(&e, r, ps_client_save_ckpt(e.cl[0], "ck2", "ck-2", 9, true, h_cb,
                                    &r));
  assert_int_equal(r.status, 0);
  assert_int_equal(h_down(&e), 0);
  char sub[300];
  snprintf(sub, sizeof sub, "%s/ck", dir);
  rmtree(sub);
  snprintf(sub, sizeof sub, "%s/ck2", dir);
  rmtree(sub);
  rmtree(dir);
}

/* The rows a part file holds (its header's n_rows). */
static int64_t file_rows(const char *dir, const char *name) {
  char path[1024], err[256];
  snprintf(path, sizeof path, "%s/%s.part-0-of-1.tshard", dir, name);
  tsr_shardfile f;
  if (tsr_shardfile_open(&f, path, err, sizeof err)) return -1;
  int64_t n = f.p.h.n_rows;
  tsr_shardfile_close(&f);
  return n;
}

static void saved(h_env *e, const char *dir, const char *id, int64_t step,
                  const char *since) {
  h_res r, w;
  H_CALL(e, r, ps_client_save_since(e->cl[0], dir, id, step, false, since,
                                    h_cb, &r));
  assert_int_equal(r.status, 0);
  H_CALL(e, w, ps_client_save_wait(e->cl[0], id, h_cb, &w));
  assert_int_equal(w.status, 0);
}

/* Incremental saves: a whole checkpoint, then increments that hold only
 * the rows pushed since the one before (a materialized table and one of
 * rows made on first touch; a dense variable whole every time); a restore
 * of the last increment over the chain gives the values as they were at
 * it; an increment since a checkpoint this PS does not know is whole; a
 * link's file missing fails the restore naming it, and nothing changes. */
static void incremental_chain(void **state) {
  (void)state;
  char dir[256];
  tmpdir(dir, sizeof dir, "inc");
  ps_server_opts o = {0};
  o.checkpoint_root = dir;
  h_env e;
  h_up(&e, 1, &o);
  ps_var_spec v[3] = {
      spec_of("w", R, C, 0, 1, TSR_OPT_ADAM),
      h_sparse(spec_of("emb", 1000, 3, 0, 1, TSR_OPT_ADAGRAD), true),
      h_sparse(spec_of("tab", 1000, 3, 0, 1, TSR_OPT_ADAGRAD), true)};
  v[1].materialized = true;
  h_res r;
  H_CALL(&e, r, ps_client_create(e.cl[0], v, 3, h_cb, &r));
  assert_int_equal(r.status, 0);
  static float g[R * C];
  float rg[9] = {1, 2, 3, -1, -2, -3, 0.5f, 0.5f, 0.5f};
  for (int i = 0; i < R * C; i++) g[i] = 0.1f;
  int64_t a[3] = {1, 2, 3}, b[2] = {5, 7}, c[2] = {7, 9};
#define PUSH_ROWS(ids, n)                                                      \
  do {                                                                         \
    H_CALL(&e, r, ps_client_push_rows(e.cl[0], "emb", 0, 0, 0, PS_DT_F32, ids, \
                                      n, rg, n * 12, h_cb, &r));               \
    assert_int_equal(r.status, 0);                                             \
    H_CALL(&e, r, ps_client_push_rows(e.cl[0], "tab", 0, 0, 0, PS_DT_F32, ids, \
                                      n, rg, n * 12, h_cb, &r));               \
    assert_int_equal(r.status, 0);                                             \
    H_CALL(&e, r, ps_client_push(e.cl[0], "w", 0, 0, 0, PS_DT_F32, g,          \
                                 sizeof g, h_cb, &r));                         \
  } while (0)
  PUSH_ROWS(a, 3);
  saved(&e, "c1", "ck-1", 1, "");
  char d1[300], d2[300], d3[300];
  snprintf(d1, sizeof d1, "%s/c1", dir);
  snprintf(d2, sizeof d2, "%s/c2", dir);
  snprintf(d3, sizeof d3, "%s/c3", dir);
  assert_int_equal(file_rows(d1, "emb"), 1000); /* whole: every row */
  assert_int_equal(file_rows(d1, "tab"), 3);
  PUSH_ROWS(b, 2);
  saved(&e, "c2", "ck-2", 2, "ck-1");
  assert_int_equal(file_rows(d2, "emb"), 2);   /* 5, 7 */
  assert_int_equal(file_rows(d2, "tab"), 2);
  assert_int_equal(file_rows(d2, "w"), R);     /* dense: whole */
  PUSH_ROWS(c, 2);
  saved(&e, "c3", "ck-3", 3, "ck-2");
  assert_int_equal(file_rows(d3, "emb"), 2);   /* 7, 9 */
  int64_t all[6] = {1, 2, 3, 5, 7, 9};
  float eat[18], tat[18], wat[R * C], x[18];
  H_CALL(&e, r, ps_client_pull_rows(e.cl[0], "emb", 0, 0, 0, all, 6, eat, 3,
                                    h_cb, &r));
  H_CALL(&e, r, ps_client_pull_rows(e.cl[0], "tab", 0, 0, 0, all, 6, tat, 3,
                                    h_cb, &r));
  H_CALL(&e, r, ps_client_pull(e.cl[0], "w", 0, 0, 0, wat, R * C, h_cb, &r));
  PUSH_ROWS(all, 3); /* rows 1, 2, 3 move on */
  ps_chain_link chain[2] = {{"c1", "ck-1", 1}, {"c2", "ck-2", 2}};
  H_CALL(&e, r, ps_client_restore_chain(e.cl[0], "c3", "ck-3", 3, chain, 2,
                                        h_cb, &r));
  assert_int_equal(r.status, 0);
  H_CALL(&e, r, ps_client_pull_rows(e.cl[0], "emb", 0, 0, 0, all, 6, x, 3,
                                    h_cb, &r));
  assert_memory_equal(x, eat, sizeof eat);
  H_CALL(&e, r, ps_client_pull_rows(e.cl[0], "tab", 0, 0, 0, all, 6, x, 3,
                                    h_cb, &r));
  assert_memory_equal(x, tat, sizeof tat);
  static float wx[R * C];
  H_CALL(&e, r, ps_client_pull(e.cl[0], "w", 0, 0, 0, wx, R * C, h_cb, &r));
  assert_memory_equal(wx, wat, sizeof wat);
  /* after the restore, increments build on ck-3 */
  PUSH_ROWS(b, 1);
  saved(&e, "c4", "ck-4", 4, "ck-3");
  char d4[300];
  snprintf(d4, sizeof d4, "%s/c4", dir);
  assert_int_equal(file_rows(d4, "emb"), 1);
  /* since a checkpoint this PS never saw: whole */
  saved(&e, "c5", "ck-5", 5, "ck-0");
  char d5[300];
  snprintf(d5, sizeof d5, "%s/c5", dir);
  assert_int_equal(file_rows(d5, "emb"), 1000);
  /* a link's part missing: named, nothing changes */
  char gone[400];
  snprintf(gone, sizeof gone, "%s/emb.part-0-of-1.tshard", d2);
  assert_int_equal(unlink(gone), 0);
  H_CALL(&e, r, ps_client_restore_chain(e.cl[0], "c3", "ck-3", 3, chain, 2,
                                        h_cb, &r));
  assert_int_not_equal(r.status, 0);
  assert_non_null(strstr(r.message, "c2"));
  assert_non_null(strstr(r.message, "emb.part-*-of-*.tshard"));
  H_CALL(&e, r, ps_client_pull_rows(e.cl[0], "emb", 0, 0, 0, b, 1, x, 3,
                                    h_cb, &r));
  float moved[3];
  memcpy(moved, x, sizeof moved); /* pushed after the restore: kept */
  assert_memory_not_equal(moved, eat + 9, sizeof moved);
  assert_int_equal(h_down(&e), 0);
  const char *sub[] = {"c1", "c2", "c3", "c4", "c5"};
  for (int i = 0; i < 5; i++) {
    char p2[400];
    snprintf(p2, sizeof p2, "%s/%s", dir, sub[i]);
    rmtree(p2);
  }
  rmtree(dir);
#undef PUSH_ROWS
}

/* An evaluation's snapshot: pulls that name it read the shards as they
 * were when it was taken (a dense one, rows changed since, a row made
 * since as its initial value) while pushes go on and plain pulls see
 * them; a new one replaces it; released, or past its time, pulls that
 * name it are refused with a message that says so. */
static void evaluation_snapshot(void **state) {
  (void)state;
  h_env e;
  h_up(&e, 1, NULL);
  ps_var_spec v[2] = {
      spec_of("w", R, C, 0, 1, TSR_OPT_ADAM),
      h_sparse(spec_of("emb", 1000, 3, 0, 1, TSR_OPT_ADAGRAD), true)};
  h_res r;
  H_CALL(&e, r, ps_client_create(e.cl[0], v, 2, h_cb, &r));
  static float g[R * C], w0[R * C], w1[R * C], wx[R * C];
  for (int i = 0; i < R * C; i++) g[i] = 0.5f;
  int64_t ids[3] = {4, 40, 400};
  float rg[9] = {1, 1, 1, 2, 2, 2, 3, 3, 3}, e0[9], e1[9], ex[9];
  H_CALL(&e, r, ps_client_push_rows(e.cl[0], "emb", 0, 0, 0, PS_DT_F32, ids,
                                    2, rg, 24, h_cb, &r)); /* 4 and 40 */
  H_CALL(&e, r, ps_client_pull(e.cl[0], "w", 0, 0, 0, w0, R * C, h_cb, &r));
  H_CALL(&e, r, ps_client_pull_rows(e.cl[0], "emb", 0, 0, 0, ids, 3, e0, 3,
                                    h_cb, &r));
  H_CALL(&e, r, ps_client_snapshot(e.cl[0], 7, false, 0, h_cb, &r));
  assert_int_equal(r.status, 0);
  /* training goes on: w changes, rows 4, 40 change, 400 is made */
  H_CALL(&e, r, ps_client_push(e.cl[0], "w", 0, 0, 1, PS_DT_F32, g, sizeof g,
                               h_cb, &r));
  H_CALL(&e, r, ps_client_push_rows(e.cl[0], "emb", 0, 0, 1, PS_DT_F32, ids,
                                    3, rg, sizeof rg, h_cb, &r));
  H_CALL(&e, r, ps_client_pull(e.cl[0], "w", 0, 0, 0, w1, R * C, h_cb, &r));
  H_CALL(&e, r, ps_client_pull_rows(e.cl[0], "emb", 0, 0, 0, ids, 3, e1, 3,
                                    h_cb, &r));
  assert_memory_not_equal(w0, w1, sizeof w0);
  assert_memory_not_equal(e0, e1, sizeof e0);
  ps_client_set_snapshot(e.cl[0], 7);
  H_CALL(&e, r, ps_client_pull(e.cl[0], "w", 0, 0, 0, wx, R * C, h_cb, &r));
  assert_int_equal(r.status, 0);
  assert_memory_equal(wx, w0, sizeof w0);
  H_CALL(&e, r, ps_client_pull_rows(e.cl[0], "emb", 0, 0, 0, ids, 3, ex, 3,
                                    h_cb, &r));
  assert_int_equal(r.status, 0);
  assert_memory_equal(ex, e0, sizeof e0);
  ps_client_set_snapshot(e.cl[0], 0);
  /* a new one replaces it */
  H_CALL(&e, r, ps_client_snapshot(e.cl[0], 8, false, 0, h_cb, &r));
  ps_client_set_snapshot(e.cl[0], 8);
  H_CALL(&e, r, ps_client_pull_rows(e.cl[0], "emb", 0, 0, 0, ids, 3, ex, 3,
                                    h_cb, &r));
  assert_memory_equal(ex, e1, sizeof e1);
  ps_client_set_snapshot(e.cl[0], 7);
  H_CALL(&e, r, ps_client_pull(e.cl[0], "w", 0, 0, 0, wx, R * C, h_cb, &r));
  assert_int_equal(r.status, TSR_ENOTFOUND);
  assert_non_null(strstr(r.message, "no snapshot 7"));
  /* released: refused */
  ps_client_set_snapshot(e.cl[0], 0);
  H_CALL(&e, r, ps_client_snapshot(e.cl[0], 8, true, 0, h_cb, &r));
  assert_int_equal(r.status, 0);
  ps_client_set_snapshot(e.cl[0], 8);
  H_CALL(&e, r, ps_client_pull_rows(e.cl[0], "emb", 0, 0, 0, ids, 3, ex, 3,
                                    h_cb, &r));
  assert_int_equal(r.status, TSR_ENOTFOUND);
  /* past its time (1 s): dropped by the server's timer */
  ps_client_set_snapshot(e.cl[0], 0);
  H_CALL(&e, r, ps_client_snapshot(e.cl[0], 9, false, 1, h_cb, &r));
  ps_client_set_snapshot(e.cl[0], 9);
  H_CALL(&e, r, ps_client_pull(e.cl[0], "w", 0, 0, 0, wx, R * C, h_cb, &r));
  assert_int_equal(r.status, 0);
  h_spin(&e, 1500);
  H_CALL(&e, r, ps_client_pull(e.cl[0], "w", 0, 0, 0, wx, R * C, h_cb, &r));
  assert_int_equal(r.status, TSR_ENOTFOUND);
  ps_client_set_snapshot(e.cl[0], 0);
  H_CALL(&e, r, ps_client_snapshot(e.cl[0], 0, false, 0, h_cb, &r));
  assert_int_equal(r.status, TSR_EINVAL);
  assert_int_equal(h_down(&e), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(shard_round_trip),
      cmocka_unit_test(sparse_past_the_buffer),
      cmocka_unit_test(materialized_round_trip),
      cmocka_unit_test(corrupt_files_fail_whole),
      cmocka_unit_test(save_while_applying),
      cmocka_unit_test(incremental_chain),
      cmocka_unit_test(evaluation_snapshot),
      cmocka_unit_test(two_ps_to_three),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
