/* The one intact checkpoint part fuzz_manifest's folder holds, written
 * the same way by the target and by the seed generator (so the manifest
 * seed names exactly the file the target has): "w" [4, 2], zeros, SGD,
 * checkpoint "fz-7" of step 7. Aborts when it cannot be written. */
#ifndef TSR_FUZZ_CKPT_PART_H
#define TSR_FUZZ_CKPT_PART_H

#include <stdlib.h>

#include "ps/ps_int.h"
#include "tests/unit/ps/ps_spec_test.h"

/* Writes the part into `dir`; `f` gets its name, size and CRC. */
static inline void fz_write_manifest_part(const char *dir, ps_ckpt_file *f) {
  ps_var_spec s = h_spec("w", 4, 2, 0, 1, "zeros", 1, TSR_OPT_SGD);
  ps_mem mem = {0, 0, NULL, NULL};
  ps_shard *sh;
  char err[512];
  ps_ckpt_ident who = {"fz-7", 7};
  if (ps__shard_new(&s, &mem, &sh, err, sizeof err) ||
      ps__ckpt_save_shard(sh, dir, &who, false, f, err, sizeof err))
    abort();
  ps__shard_free(sh, &mem);
}

#endif
