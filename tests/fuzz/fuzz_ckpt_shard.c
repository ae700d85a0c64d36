/* libFuzzer target: the shard file readers.
 *
 * The input is a whole shard checkpoint file. It is checked in memory by
 * the shard file library (tsr_shardfile_parse); when that accepts it, a
 * shard of the variable it describes is restored from it through the PS's
 * full restore path (the folder listing, the part's place in the layout,
 * every row copied), both as one shard and re-cut in two. The chief's
 * reader (tessera ckpt inspect/export: chief_ckpt_scan,
 * chief_ckpt_load_value) reads the same file. Nothing may crash, read outside the file or leak,
 * whatever the header claims (sizes, counts, ranges, ids). */
#include "chief/ckpt/ckpt_read.h"
#include "common/ckpt/shardfile.h"
#include "common/log.h"
#include "ps/ps_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_dir[64];

static void fz_restore(const tsr_shardfile_hdr *p, const char *dir, int shard,
                       int num_shards) {
  ps_var_spec s;
  memset(&s, 0, sizeof s);
  snprintf(s.var.name, sizeof s.var.name, "%s", p->name);
  s.var.rank = p->rank;
  memcpy(s.var.shape, p->shape, sizeof s.var.shape);
  s.var.kind = p->sparse ? TSR_VAR_ROW_SPARSE : TSR_VAR_DENSE;
  s.bounded = p->bounded;
  s.shard.shard = shard;
  s.shard.num_shards = num_shards;
  int64_t dim0 = s.var.rank ? s.var.shape[0] : 1;
  if (num_shards > dim0) return;
  tsr_partition_rows(dim0, num_shards, shard, &s.shard.row0, &s.shard.rows);
  tsr_init_parse("zeros", &s.var.init);
  static const char *const opt[] = {"sgd", "adagrad", "rmsprop", "adam",
                                    "ftrl"};
  tsr_optim_defaults(TSR_OPT_SGD, &s.optim);
  for (int k = 0; k < 5; k++)
    if (!strcmp(p->optimizer, opt[k])) tsr_optim_defaults(k, &s.optim);
  if (p->nslots == 1 && s.optim.kind == TSR_OPT_SGD) s.optim.momentum = 0.9;
  ps_mem mem = {0, 64 << 20, NULL, NULL};
  ps_shard *out = NULL;
  char err[512];
  if (ps__ckpt_load_shard(&s, &mem, dir, NULL, &out, err, sizeof err) == 0)
    ps__shard_free(out, &mem);
  if (atomic_load(&mem.used) != 0) abort(); /* the budget leaked */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!g_dir[0]) {
    tsr_log_set_level(TSR_LOG_ERROR);
    snprintf(g_dir, sizeof g_dir, "%s/tsr-fuzz-ck-%d",
             access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp",
             (int)getpid());
    mkdir(g_dir, 0755);
  }
  tsr_shardfile_part part;
  const tsr_shardfile_hdr *p = &part.h;
  char err[512];
  int ok =
      tsr_shardfile_parse("input", data, size, &part, err, sizeof err) == 0;
  /* the file under its own name, alone in the folder */
  char path[600], enc[800];
  if (ok) {
    tsr_shardfile_enc_name(p->name, enc, sizeof enc);
    snprintf(path, sizeof path, "%s/%s.part-%d-of-%d.tshard", g_dir, enc,
             p->shard, p->num_shards);
  } else {
    snprintf(path, sizeof path, "%s/x.part-0-of-1.tshard", g_dir);
  }
  FILE *f = fopen(path, "wb");
  if (!f) return 0;
  fwrite(data, 1, size, f);
  fclose(f);
  if (ok && p->num_shards == 1) {
    fz_restore(p, g_dir, 0, 1);
    fz_restore(p, g_dir, 1, 2);
  }
  chief_ckpt_var *vars;
  size_t n;
  if (chief_ckpt_scan(g_dir, &vars, &n, err, sizeof err) == 0) {
    for (size_t i = 0; i < n; i++) {
      int64_t dim0 = vars[i].rank ? vars[i].shape[0] : 1, cells;
      if (dim0 < 0 || dim0 > (1 << 20) || vars[i].width > (1 << 20) ||
          __builtin_mul_overflow(dim0, vars[i].width, &cells) ||
          cells > (1 << 22))
        continue; /* export would need that much memory: not its check */
      float *val = calloc((size_t)cells + 1, sizeof *val);
      uint8_t *present = calloc((size_t)dim0 + 1, 1);
      if (val && present)
        chief_ckpt_load_value(&vars[i], val, present, err, sizeof err);
      free(val);
      free(present);
    }
    chief_ckpt_vars_free(vars, n);
  }
  unlink(path);
  return 0;
}
