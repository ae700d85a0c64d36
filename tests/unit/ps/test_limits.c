/* What a token holder's requests may reach on a PS:
 *  - the checkpoint root is set once (at start, or by the first
 *    configure) and never moves: a later configure naming "/" (after which
 *    Save wrote anywhere) or another folder is refused, and saves still
 *    land in the first root; "/" is never a root;
 *  - Create's init_path is read only from a regular file under the root:
 *    a file outside (a 32-byte one came back whole through a Pull), one
 *    reached through a link that leads out, are refused with the same
 *    message whether they exist or not (before, the errors told existence
 *    and size);
 *  - answers count against --memory-limit: a PullRows whose rows pass it
 *    is refused with the figures (3 concurrent pulls of 200 x 4 MiB rows
 *    took a PS limited to 64M to 1.98 GB), one held by the ssp gate keeps
 *    its share so another that would pass the limit with it is refused,
 *    a bfloat16 copy of a dense shard counts, and every reservation is
 *    given back once the answers are written. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ps_harness.h"

static char g_dir[128];

static int setup(void **state) {
  (void)state;
  snprintf(g_dir, sizeof g_dir, "/tmp/tsr-limits-XXXXXX");
  return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  char cmd[256];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
  return system(cmd) ? -1 : 0;
}

static void configure(h_env *e, const char *root, h_res *r) {
  ps_config cfg = {.mode = "async", .trace_pid = -1,
                   .checkpoint_root = root};
  H_CALL(e, *r, ps_client_configure(e->cl[0], &cfg, h_cb, r));
}

static bool exists(const char *path) {
  struct stat st;
  return stat(path, &st) == 0;
}

/* ---- the root -------------------------------------------------------------*/

static void root_never_moves(void **state) {
  (void)state;
  char a[200], b[200], p[300];
  snprintf(a, sizeof a, "%s/a", g_dir);
  snprintf(b, sizeof b, "%s/b", g_dir);
  h_env e;
  h_up(&e, 1, NULL);
  h_res r;
  /* "/" is no root, even first */
  configure(&e, "/", &r);
  assert_int_equal(r.status, TSR_EINVAL);
  assert_non_null(strstr(r.message, "\"/\""));
  ps_var_spec v = h_spec("w", 4, 2, 0, 1, "zeros", 1, TSR_OPT_SGD);
  H_CALL(&e, r, ps_client_create(e.cl[0], &v, 1, h_cb, &r));
  assert_int_equal(r.status, 0);
  configure(&e, a, &r);
  assert_int_equal(r.status, 0);
  configure(&e, a, &r); /* the same root again (a chief restarting) */
  assert_int_equal(r.status, 0);
  configure(&e, "/", &r);
  assert_int_equal(r.status, TSR_EINVAL);
  configure(&e, b, &r);
  assert_int_equal(r.status, TSR_EEXISTS);
  assert_non_null(strstr(r.message, "keeps"));
  assert_non_null(strstr(r.message, a));
  H_CALL(&e, r, ps_client_save_ckpt(e.cl[0], "ck", "id-1", 1, false, h_cb,
                                    &r));
  assert_int_equal(r.status, 0);
  snprintf(p, sizeof p, "%s/ck/w.part-0-of-1.tshard", a);
  assert_true(exists(p));
  assert_false(exists(b));
  /* absolute paths outside it stay refused */
  H_CALL(&e, r, ps_client_save_ckpt(e.cl[0], "/tmp", "id-2", 2, false, h_cb,
                                    &r));
  assert_int_equal(r.status, TSR_EINVAL);
  assert_int_equal(h_down(&e), 0);
}

/* A root given at start stays whatever a configure says (the chief's path
 * for the same folder may differ on its host). */
static void root_from_start_stays(void **state) {
  (void)state;
  char a[200], p[300];
  snprintf(a, sizeof a, "%s/start", g_dir);
  ps_server_opts o = {0};
  o.checkpoint_root = a;
  h_env e;
  h_up(&e, 1, &o);
  h_res r;
  ps_var_spec v = h_spec("w", 4, 2, 0, 1, "zeros", 1, TSR_OPT_SGD);
  H_CALL(&e, r, ps_client_create(e.cl[0], &v, 1, h_cb, &r));
  configure(&e, "/", &r);
  assert_int_equal(r.status, TSR_EINVAL);
  configure(&e, g_dir, &r);
  assert_int_equal(r.status, 0);
  H_CALL(&e, r, ps_client_save_ckpt(e.cl[0], "ck", "id-1", 1, false, h_cb,
                                    &r));
  assert_int_equal(r.status, 0);
  snprintf(p, sizeof p, "%s/ck/w.part-0-of-1.tshard", a);
  assert_true(exists(p));
  assert_int_equal(h_down(&e), 0);
}

/* ---- init_path ------------------------------------------------------------*/

static void write_floats(const char *path, const float *v, size_t n) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(v, sizeof *v, n, f), n);
  fclose(f);
}

/* Create of "w" [4, 2] from `path`: its status and message. */
static void create_from(h_env *e, const char *name, const char *path,
                        h_res *r) {
  ps_var_spec v = h_spec(name, 4, 2, 0, 1, "zeros", 1, TSR_OPT_SGD);
  snprintf(v.init_path, sizeof v.init_path, "%s", path);
  H_CALL(e, *r, ps_client_create(e->cl[0], &v, 1, h_cb, r));
}

static void init_path_confined(void **state) {
  (void)state;
  char root[200], out[200], secret[300], nothing[300], in[300], link[300],
      dlink[300];
  snprintf(root, sizeof root, "%s/root", g_dir);
  snprintf(out, sizeof out, "%s/outside", g_dir);
  assert_int_equal(mkdir(root, 0755), 0);
  assert_int_equal(mkdir(out, 0755), 0);
  const float sec[8] = {1, 2, 3, 4, 5, 6, 7, 8}, mine[8] = {8, 7, 6, 5, 4, 3,
                                                           2, 1};
  snprintf(secret, sizeof secret, "%s/secret.f32", out);
  snprintf(nothing, sizeof nothing, "%s/nothing.f32", out);
  write_floats(secret, sec, 8); /* 32 bytes, the variable's size */
  snprintf(in, sizeof in, "%s/w.f32", root);
  write_floats(in, mine, 8);
  ps_server_opts o = {0};
  o.checkpoint_root = root;
  h_env e;
  h_up(&e, 1, &o);
  h_res r;
  /* outside: refused, the same words whether the file is there or not */
  char m1[512], m2[512];
  create_from(&e, "a", secret, &r);
  assert_int_equal(r.status, TSR_EINVAL);
  assert_non_null(strstr(r.message, "not inside the checkpoint root"));
  snprintf(m1, sizeof m1, "%s", r.message);
  create_from(&e, "a", nothing, &r);
  assert_int_equal(r.status, TSR_EINVAL);
  snprintf(m2, sizeof m2, "%s", r.message);
  char *p1 = strstr(m1, "secret.f32"), *p2 = strstr(m2, "nothing.f32");
  assert_non_null(p1);
  assert_non_null(p2);
  assert_string_equal(p1 + strlen("secret.f32"), p2 + strlen("nothing.f32"));
  create_from(&e, "a", "../outside/secret.f32", &r);
  assert_int_equal(r.status, TSR_EINVAL);
  /* through links inside the root: to the file, to its folder */
  snprintf(link, sizeof link, "%s/link.f32", root);
  assert_int_equal(symlink(secret, link), 0);
  snprintf(dlink, sizeof dlink, "%s/out", root);
  assert_int_equal(symlink(out, dlink), 0);
  static const char *const via[] = {"link.f32", "out/secret.f32",
                                    "out/nothing.f32"};
  for (size_t i = 0; i < 3; i++) {
    create_from(&e, "a", via[i], &r);
    assert_int_equal(r.status, TSR_EINVAL);
    assert_non_null(strstr(r.message, "leads outside the checkpoint root"));
    assert_non_null(strstr(r.message, "through a symbolic link"));
    assert_null(strstr(r.message, out)); /* where it leads is not said */
  }
  /* nothing was created: the variable is not there */
  float got[8];
  H_CALL(&e, r, ps_client_pull(e.cl[0], "a", 0, 0, 0, got, 8, h_cb, &r));
  assert_int_equal(r.status, TSR_ENOTFOUND);
  /* inside, relative or absolute: read */
  create_from(&e, "b", "w.f32", &r);
  assert_int_equal(r.status, 0);
  H_CALL(&e, r, ps_client_pull(e.cl[0], "b", 0, 0, 0, got, 8, h_cb, &r));
  assert_memory_equal(got, mine, sizeof got);
  create_from(&e, "c", in, &r);
  assert_int_equal(r.status, 0);
  /* a folder under the root is no file */
  create_from(&e, "d", ".", &r);
  assert_int_equal(r.status, TSR_EINVAL);
  assert_int_equal(h_down(&e), 0);
}

/* ---- answers and the memory limit -----------------------------------------*/

#define ROW (65536) /* floats: 256 KiB rows */

static void answers_counted(void **state) {
  (void)state;
  ps_server_opts o = {0};
  o.memory_limit = 8 << 20;
  h_env e;
  h_up(&e, 1, &o);
  h_res r;
  ps_var_spec big = h_sparse(h_spec("big", 1000, ROW, 0, 1, "zeros", 1,
                                    TSR_OPT_SGD), true);
  H_CALL(&e, r, ps_client_create(e.cl[0], &big, 1, h_cb, &r));
  assert_int_equal(r.status, 0);
  int64_t ids[40];
  for (int i = 0; i < 40; i++) ids[i] = i;
  float *dst = calloc((size_t)40 * ROW, sizeof(float));
  float *dst2 = calloc((size_t)20 * ROW, sizeof(float));
  assert_non_null(dst);
  assert_non_null(dst2);
  /* 40 rows: 10 MiB of answer, over 8 MiB */
  H_CALL(&e, r, ps_client_pull_rows(e.cl[0], "big", 0, 0, 0, ids, 40, dst,
                                    ROW, h_cb, &r));
  assert_int_equal(r.status, TSR_EMEMLIMIT);
  assert_non_null(strstr(r.message, "10486080 bytes"));
  assert_non_null(strstr(r.message, "of 8388608 bytes in use"));
  /* 20 rows fit, and give their share back */
  H_CALL(&e, r, ps_client_pull_rows(e.cl[0], "big", 0, 0, 0, ids, 20, dst,
                                    ROW, h_cb, &r));
  assert_int_equal(r.status, 0);
  H_CALL(&e, r, ps_client_stats(e.cl[0], h_cb, &r));
  assert_int_equal(r.mem_used, 0);
  /* ssp:0: worker 0's pull at clock 2 waits for its own clock, holding
   * 5 MiB; another 5 MiB pull meanwhile would pass the limit */
  H_CALL(&e, r, ps_client_config(e.cl[0], "ssp:0", false, h_cb, &r));
  assert_int_equal(r.status, 0);
  H_CALL(&e, r, ps_client_join(e.cl[0], 0, 0, 0, 0, h_cb, &r));
  assert_int_equal(r.status, 0);
  ps_client_set_era(e.cl[0], r.era);
  h_res held = {0};
  assert_int_equal(ps_client_pull_rows(e.cl[0], "big", 0, 0, 2, ids, 20, dst,
                                       ROW, h_cb, &held), 0);
  h_spin(&e, 20);
  assert_false(held.done);
  H_CALL(&e, r, ps_client_pull_rows(e.cl[0], "big", 0, -1, 0, ids + 20, 20,
                                    dst2, ROW, h_cb, &r));
  assert_int_equal(r.status, TSR_EMEMLIMIT);
  assert_non_null(strstr(r.message, "(5243040 of 8388608 bytes in use)"));
  H_CALL(&e, r, ps_client_clock(e.cl[0], 0, 2, PS_CLOCK_TICK, h_cb, &r));
  assert_int_equal(r.status, 0);
  assert_true(h_wait(&e, &held.done));
  assert_int_equal(held.status, 0);
  H_CALL(&e, r, ps_client_stats(e.cl[0], h_cb, &r));
  assert_int_equal(r.mem_used, 0);
  free(dst);
  free(dst2);
  assert_int_equal(h_down(&e), 0);
}

/* A dense shard of 4 MiB under a 5 MiB limit: float32 pulls go out of
 * the shard itself, a bfloat16 copy (2 MiB) does not fit. */
static void bf16_copy_counted(void **state) {
  (void)state;
  ps_server_opts o = {0};
  o.memory_limit = 5 << 20;
  h_env e;
  h_up(&e, 1, &o);
  h_res r;
  ps_var_spec d = h_spec("d", 1024, 1024, 0, 1, "zeros", 1, TSR_OPT_SGD);
  H_CALL(&e, r, ps_client_create(e.cl[0], &d, 1, h_cb, &r));
  assert_int_equal(r.status, 0);
  float *f = calloc(1024 * 1024, sizeof *f);
  assert_non_null(f);
  H_CALL(&e, r, ps_client_pull(e.cl[0], "d", 0, 0, 0, f, 1024 * 1024, h_cb,
                               &r));
  assert_int_equal(r.status, 0);
  H_CALL(&e, r, ps_client_pull_as(e.cl[0], "d", 0, 0, 0, PS_DT_BF16, f,
                                  1024 * 1024 * 2, h_cb, &r));
  assert_int_equal(r.status, TSR_EMEMLIMIT);
  assert_non_null(strstr(r.message, "2097152 bytes"));
  H_CALL(&e, r, ps_client_stats(e.cl[0], h_cb, &r));
  assert_int_equal(r.mem_used, 4 << 20);
  free(f);
  assert_int_equal(h_down(&e), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(root_never_moves, setup, teardown),
      cmocka_unit_test_setup_teardown(root_from_start_stays, setup, teardown),
      cmocka_unit_test_setup_teardown(init_path_confined, setup, teardown),
      cmocka_unit_test(answers_counted),
      cmocka_unit_test(bf16_copy_counted),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
