/* libFuzzer target: the checkpoint manifest reader.
 *
 * The input is a manifest.json in a committed checkpoint folder (step 7)
 * that also holds one real, intact shard file. The chief reads it the way
 * a restart does (chief_ckpt_latest, chief_ckpt_latest_intact: the file
 * list, sizes, CRCs, the part's checks, every part present, nothing
 * unlisted) and the way `tessera ckpt inspect --verify` does. Any JSON,
 * any types in any key: nothing may crash or leak, and a manifest that
 * passes the verification must list exactly the one intact file. */
#include "chief/ckpt/ckpt.h"
#include "common/log.h"
#include "ps/ps_int.h"
#include "tests/fuzz/fuzz_ckpt_part.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_root[64], g_dir[128];

static void fz_setup(void) {
  tsr_log_set_level(TSR_LOG_ERROR);
  snprintf(g_root, sizeof g_root, "%s/tsr-fuzz-mf-%d",
           access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp",
           (int)getpid());
  mkdir(g_root, 0755);
  snprintf(g_dir, sizeof g_dir, "%s/ckpt-000000000007", g_root);
  mkdir(g_dir, 0755);
  /* one intact part: "w" [4, 2], SGD, checkpoint "fz-7" of step 7 */
  ps_ckpt_file f;
  fz_write_manifest_part(g_dir, &f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!g_root[0]) fz_setup();
  char path[300];
  snprintf(path, sizeof path, "%s/manifest.json", g_dir);
  FILE *f = fopen(path, "wb");
  if (!f) return 0;
  fwrite(data, 1, size, f);
  fclose(f);
  char err[1024];
  int64_t step;
  json_t *m = NULL;
  if (chief_ckpt_latest(g_root, &step, &m, err, sizeof err) == 0) {
    if (chief_ckpt_verify(g_dir, m, err, sizeof err) == 0) {
      /* intact: it lists the one file there is */
      const json_t *files = json_object_get(m, "files");
      if (json_array_size(files) != 1) abort();
    }
    json_decref(m);
  }
  m = NULL;
  if (chief_ckpt_latest_intact(g_root, INT64_MAX, &step, &m, err,
                               sizeof err) == 0) {
    if (step != 7) abort();
    json_decref(m);
  }
  return 0;
}
