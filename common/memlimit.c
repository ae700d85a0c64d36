/* The memory a process may use; see memlimit.h.
 *
 * Happy path: /proc/self/cgroup names the process's cgroup. With cgroup v2
 * (a "0::PATH" line) every memory.max from /sys/fs/cgroup/PATH up to the
 * root is read and the smallest number wins ("max" is no limit). With v1
 * (a line whose controllers include "memory") memory.limit_in_bytes of
 * that cgroup is read, or of the mount's root when the path is not
 * visible (inside a container), a value of 2^62 or more being no limit.
 * The result is never above physical memory.
 */
#include "common/memlimit.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ML_NONE UINT64_MAX

/* A file's first line as a byte count; ML_NONE for "max", a missing file
 * or anything else. */
static uint64_t ml_read(const char *path) {
  FILE *f = fopen(path, "r");
  if (!f) return ML_NONE;
  char line[64];
  uint64_t v = ML_NONE;
  if (fgets(line, sizeof line, f)) {
    char *end;
    unsigned long long x = strtoull(line, &end, 10);
    if (end != line && (*end == '\n' || *end == 0) &&
        x < ((unsigned long long)1 << 62))
      v = (uint64_t)x;
  }
  fclose(f);
  return v;
}

/* The cgroup path of the v2 line, or of the v1 line with the memory
 * controller. 2, 1, or 0 when neither. */
static int ml_cgroup(const char *root, char *path, size_t len) {
  char p[4096];
  snprintf(p, sizeof p, "%s/proc/self/cgroup", root);
  FILE *f = fopen(p, "r");
  if (!f) return 0;
  char line[4096];
  int ver = 0;
  while (fgets(line, sizeof line, f)) {
    line[strcspn(line, "\n")] = 0;
    char *c1 = strchr(line, ':');
    char *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
    if (!c2) continue;
    *c1 = *c2 = 0;
    const char *ctl = c1 + 1, *cg = c2 + 1;
    if (!strcmp(line, "0") && !ctl[0]) {
      if (ver == 0) {
        snprintf(path, len, "%s", cg);
        ver = 2;
      }
      continue;
    }
    /* "memory" among the comma-separated controllers */
    char ctls[512];
    snprintf(ctls, sizeof ctls, "%s", ctl);
    for (char *save, *t = strtok_r(ctls, ",", &save); t;
         t = strtok_r(NULL, ",", &save))
      if (!strcmp(t, "memory")) {
        snprintf(path, len, "%s", cg);
        ver = 1;
      }
    if (ver == 1) break;
  }
  fclose(f);
  return ver;
}

int tsr_mem_available(const char *root, uint64_t physical, uint64_t *bytes,
                      tsr_mem_source *source, char *desc, size_t desclen) {
  if (!root) root = "";
  if (!physical) {
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    physical = pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz : 0;
  }
  char cg[2048], p[4096], where[4096] = "";
  uint64_t lim = ML_NONE;
  int ver = ml_cgroup(root, cg, sizeof cg);
  if (ver == 2) {
    /* the smallest memory.max from the process's cgroup up to the root */
    for (;;) {
      size_t L = strlen(cg);
      while (L > 1 && cg[L - 1] == '/') cg[--L] = 0;
      snprintf(p, sizeof p, "%s/sys/fs/cgroup%s/memory.max", root,
               strcmp(cg, "/") ? cg : "");
      uint64_t v = ml_read(p);
      if (v < lim) {
        lim = v;
        snprintf(where, sizeof where, "%s", p + strlen(root));
      }
      char *slash = strrchr(cg, '/');
      if (!slash || slash == cg) {
        if (strcmp(cg, "/") == 0 || !slash) break;
        snprintf(cg, sizeof cg, "/");
        continue;
      }
      *slash = 0;
    }
  } else if (ver == 1) {
    snprintf(p, sizeof p, "%s/sys/fs/cgroup/memory%s/memory.limit_in_bytes",
             root, strcmp(cg, "/") ? cg : "");
    lim = ml_read(p);
    if (lim == ML_NONE) { /* the host's path, not visible in a container */
      snprintf(p, sizeof p, "%s/sys/fs/cgroup/memory/memory.limit_in_bytes",
               root);
      lim = ml_read(p);
    }
    if (lim != ML_NONE) snprintf(where, sizeof where, "%s", p + strlen(root));
  }
  if (lim != ML_NONE && (physical == 0 || lim <= physical)) {
    *bytes = lim;
    *source = ver == 2 ? TSR_MEM_CGROUP_V2 : TSR_MEM_CGROUP_V1;
    snprintf(desc, desclen, "the cgroup v%d limit (%s)", ver, where);
    return 0;
  }
  *bytes = physical;
  *source = TSR_MEM_PHYSICAL;
  snprintf(desc, desclen, "physical memory%s",
           ver ? " (the cgroup sets no lower limit)" : "");
  return 0;
}
