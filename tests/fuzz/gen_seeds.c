/* Writes the binary seeds of the fuzz targets into tests/fuzz/corpus/:
 *   fuzz_ps_service/  request runs (create, pushes and pulls of every kind,
 *                     clocks, config, save and restore, stats)
 *   fuzz_ckpt_shard/  real shard files (dense Adam, bounded sparse
 *                     Adagrad, unbounded sparse FTRL)
 *   fuzz_manifest/    the manifest of fuzz_manifest's own checkpoint
 * Usage: fuzz_seeds SOURCE_DIR. Run again when a format changes; the JSON
 * seeds of fuzz_job and fuzz_model and the Examples of fuzz_tfr_example
 * are kept by hand, the crafted regress-* shard files are made from these
 * seeds by craft_shards.py. */
#include "common/crc32c.h"
#include "ps/client/client_int.h"
#include "ps/svc_int.h"
#include "tests/fuzz/fuzz_ckpt_part.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_src[1024];

static void write_file(const char *target, const char *name, const void *p,
                       size_t n) {
  char path[2048];
  snprintf(path, sizeof path, "%s/tests/fuzz/corpus/%s", g_src, target);
  mkdir(path, 0755);
  snprintf(path, sizeof path, "%s/tests/fuzz/corpus/%s/%s", g_src, target,
           name);
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(p, 1, n, f) != n) {
    perror(path);
    exit(1);
  }
  fclose(f);
}

/* ---- request runs --------------------------------------------------------*/

typedef struct {
  uint8_t b[1 << 16];
  size_t n;
} run;

static const uint32_t methods[] = {
    PS_M_CREATE, PS_M_PULL,  PS_M_PULL_ROWS, PS_M_PUSH,
    PS_M_PUSH_ROWS, PS_M_PUSH_PULL, PS_M_CLOCK, PS_M_CONFIG,
    PS_M_SAVE,   PS_M_RESTORE, PS_M_STATS, PS_M_SHUTDOWN,
};

static void add(run *r, uint32_t method, const ProtobufCMessage *m,
                const void *payload, size_t plen) {
  uint8_t meta[4096];
  size_t ml = protobuf_c_message_pack(m, meta);
  uint8_t sel = 0;
  for (uint8_t i = 0; i < sizeof methods / sizeof methods[0]; i++)
    if (methods[i] == method) sel = i;
  uint8_t *p = r->b + r->n;
  p[0] = sel;
  p[1] = (uint8_t)ml;
  p[2] = (uint8_t)(ml >> 8);
  p[3] = (uint8_t)plen;
  p[4] = (uint8_t)(plen >> 8);
  memcpy(p + 5, meta, ml);
  memcpy(p + 5 + ml, payload, plen);
  r->n += 5 + ml + plen;
}

static void create(run *r, const ps_var_spec *specs, size_t n) {
  Tessera__Ps__CreateRequest m = TESSERA__PS__CREATE_REQUEST__INIT;
  Tessera__Ps__VarSpec v[4], *vp[4];
  Tessera__Ps__Initializer in[4];
  Tessera__Ps__Optimizer o[4];
  Tessera__Ps__LrSchedule sc[4];
  int64_t shape[4][TSR_MAX_RANK];
  for (size_t i = 0; i < n; i++) {
    ps__client_spec_to_proto(&specs[i], &v[i], &in[i], &o[i], &sc[i], shape[i]);
    vp[i] = &v[i];
  }
  m.n_vars = n;
  m.vars = vp;
  add(r, PS_M_CREATE, &m.base, NULL, 0);
}

static void pull(run *r, uint32_t method, const char *name, int64_t clock,
                 const int64_t *ids, size_t n) {
  Tessera__Ps__PullRequest m = TESSERA__PS__PULL_REQUEST__INIT;
  m.name = (char *)name;
  m.clock = clock;
  m.n_ids = n;
  add(r, method, &m.base, ids, n * 8);
}

static void push(run *r, uint32_t method, const char *name, int64_t step,
                 int dtype, const void *payload, size_t plen, size_t n_ids,
                 size_t n_pull) {
  Tessera__Ps__PushRequest m = TESSERA__PS__PUSH_REQUEST__INIT;
  m.name = (char *)name;
  m.step = step;
  m.dtype = dtype;
  m.n_ids = n_ids;
  m.n_pull_ids = n_pull;
  m.pull_clock = step + 1;
  add(r, method, &m.base, payload, plen);
}

static ps_var_spec spec(const char *name, int64_t d0, int64_t d1,
                        tsr_opt_kind k, bool sparse, bool bounded) {
  ps_var_spec s = h_spec(name, d0, d1, 0, 1, "glorot_uniform", 3, k);
  return sparse ? h_sparse(s, bounded) : s;
}

static void service_seeds(void) {
  static run r;
  ps_var_spec vs[2] = {spec("d", 8, 4, TSR_OPT_ADAM, false, false),
                       spec("e", 100, 4, TSR_OPT_ADAGRAD, true, true)};
  float g[32];
  for (int i = 0; i < 32; i++) g[i] = 0.1f * (float)(i % 5) - 0.2f;
  uint16_t bf[32];
  for (int i = 0; i < 32; i++) bf[i] = 0x3f80;
  int64_t ids[3] = {5, 9, 5};
  uint8_t rows[3 * 8 + 3 * 16 + 2 * 8];
  memcpy(rows, ids, 24);
  memcpy(rows + 24, g, 48);
  memcpy(rows + 72, ids, 16);

  /* async: every data method */
  r.n = 0;
  r.b[r.n++] = 0; /* async */
  create(&r, vs, 2);
  pull(&r, PS_M_PULL, "d", 0, NULL, 0);
  push(&r, PS_M_PUSH, "d", 0, PS_DT_F32, g, sizeof g, 0, 0);
  push(&r, PS_M_PUSH_PULL, "d", 1, PS_DT_BF16, bf, sizeof bf, 0, 0);
  push(&r, PS_M_PUSH_ROWS, "e", 0, PS_DT_F32, rows, 72, 3, 0);
  pull(&r, PS_M_PULL_ROWS, "e", 0, ids, 2);
  push(&r, PS_M_PUSH_PULL, "e", 1, PS_DT_F32, rows, sizeof rows, 3, 2);
  {
    Tessera__Ps__StatsRequest m = TESSERA__PS__STATS_REQUEST__INIT;
    add(&r, PS_M_STATS, &m.base, NULL, 0);
  }
  write_file("fuzz_ps_service", "async_data", r.b, r.n);

  /* sync with a clock, then ssp through config */
  r.n = 0;
  r.b[r.n++] = 2; /* sync */
  create(&r, vs, 2);
  {
    Tessera__Ps__ClockRequest m = TESSERA__PS__CLOCK_REQUEST__INIT;
    m.op = TESSERA__PS__CLOCK_REQUEST__OP__JOIN;
    add(&r, PS_M_CLOCK, &m.base, NULL, 0);
  }
  push(&r, PS_M_PUSH_PULL, "d", 0, PS_DT_F32, g, sizeof g, 0, 0);
  push(&r, PS_M_PUSH_ROWS, "e", 0, PS_DT_F32, rows, 72, 3, 0);
  {
    Tessera__Ps__ClockRequest m = TESSERA__PS__CLOCK_REQUEST__INIT;
    m.clock = 1;
    add(&r, PS_M_CLOCK, &m.base, NULL, 0);
    Tessera__Ps__ConfigRequest c = TESSERA__PS__CONFIG_REQUEST__INIT;
    c.mode = (char *)"ssp:1";
    c.trace = true;
    c.trace_pid = 3;
    add(&r, PS_M_CONFIG, &c.base, NULL, 0);
  }
  pull(&r, PS_M_PULL, "d", 3, NULL, 0);
  {
    Tessera__Ps__StatsRequest m = TESSERA__PS__STATS_REQUEST__INIT;
    m.drain_trace = true;
    add(&r, PS_M_STATS, &m.base, NULL, 0);
  }
  write_file("fuzz_ps_service", "sync_ssp", r.b, r.n);

  /* save and restore */
  r.n = 0;
  r.b[r.n++] = 0;
  create(&r, vs, 2);
  push(&r, PS_M_PUSH_ROWS, "e", 0, PS_DT_F32, rows, 72, 3, 0);
  {
    Tessera__Ps__SaveRequest m = TESSERA__PS__SAVE_REQUEST__INIT;
    m.dir = (char *)"ckpt-000000000001";
    m.checkpoint_id = (char *)"seed-1";
    m.step = 1;
    m.verify = true;
    add(&r, PS_M_SAVE, &m.base, NULL, 0);
    Tessera__Ps__RestoreRequest q = TESSERA__PS__RESTORE_REQUEST__INIT;
    q.dir = (char *)"ckpt-000000000001";
    q.checkpoint_id = (char *)"seed-1";
    q.step = 1;
    add(&r, PS_M_RESTORE, &q.base, NULL, 0);
  }
  pull(&r, PS_M_PULL, "d", 0, NULL, 0);
  write_file("fuzz_ps_service", "save_restore", r.b, r.n);
}

/* ---- shard files and the manifest ------------------------------------------*/

static void shard_file(const char *seed, ps_var_spec s, int pushes) {
  char dir[] = "/tmp/tsr-seeds-XXXXXX", err[512];
  if (!mkdtemp(dir)) abort();
  ps_mem mem = {0, 0, NULL, NULL};
  ps_shard *sh;
  if (ps__shard_new(&s, &mem, &sh, err, sizeof err)) abort();
  float g[64];
  for (int i = 0; i < 64; i++) g[i] = 0.05f * (float)(i % 7);
  int64_t ids[4] = {s.bounded ? 3 : 7, s.bounded ? 11 : 1000000007, 3, 40};
  for (int t = 0; t < pushes; t++) {
    if (ps_var_spec_sparse(&s))
      ps__shard_apply_rows(sh, &mem, ids, 2, g, 1.0f, err, sizeof err);
    else
      ps__shard_apply_dense(sh, g, 1.0f);
  }
  ps_ckpt_ident who = {"seed-7", 7};
  ps_ckpt_file f;
  if (ps__ckpt_save_shard(sh, dir, &who, false, &f, err, sizeof err)) {
    fprintf(stderr, "%s\n", err);
    abort();
  }
  char path[2048];
  snprintf(path, sizeof path, "%s/%s", dir, f.name);
  FILE *fp = fopen(path, "rb");
  uint8_t *b = malloc(f.bytes);
  if (!fp || fread(b, 1, f.bytes, fp) != f.bytes) abort();
  fclose(fp);
  write_file("fuzz_ckpt_shard", seed, b, f.bytes);
  free(b);
  unlink(path);
  rmdir(dir);
  ps__shard_free(sh, &mem);
}

static void manifest_seed(void) {
  /* the part fuzz_manifest writes: "w" [4, 2], SGD, zeros, "fz-7" step 7 */
  char dir[] = "/tmp/tsr-seeds-XXXXXX";
  if (!mkdtemp(dir)) abort();
  ps_ckpt_file f;
  fz_write_manifest_part(dir, &f);
  char path[2048];
  snprintf(path, sizeof path, "%s/%s", dir, f.name);
  unlink(path);
  rmdir(dir);
  json_t *m = json_pack(
      "{s:s, s:i, s:i, s:s, s:s, s:[{s:s, s:I, s:I, s:i}], "
      "s:[{s:s, s:[i, i], s:s, s:i}]}",
      "format", "tessera-checkpoint", "version", 1, "step", 7,
      "checkpoint_id", "fz-7", "storage", "shared", "files", "name", f.name,
      "bytes", (json_int_t)f.bytes, "crc32c", (json_int_t)f.crc32c, "ps", 0,
      "variables", "name", "w", "shape", 4, 2, "kind", "dense", "num_shards",
      1);
  char *text = json_dumps(m, JSON_INDENT(1) | JSON_SORT_KEYS);
  write_file("fuzz_manifest", "intact", text, strlen(text));
  free(text);
  json_decref(m);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: fuzz_seeds SOURCE_DIR\n");
    return 2;
  }
  snprintf(g_src, sizeof g_src, "%s", argv[1]);
  service_seeds();
  shard_file("dense_adam", spec("layer/kernel", 8, 4, TSR_OPT_ADAM, false,
                                false), 2);
  shard_file("sparse_bounded_adagrad",
             spec("emb", 64, 4, TSR_OPT_ADAGRAD, true, true), 1);
  shard_file("sparse_unbounded_ftrl",
             spec("ids", 1000000000000LL, 4, TSR_OPT_FTRL, true, false), 1);
  manifest_seed();
  printf("seeds written under %s/tests/fuzz/corpus\n", g_src);
  return 0;
}
