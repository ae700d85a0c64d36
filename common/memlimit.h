/* How much memory this process may use: the limit of its cgroup when it
 * has one (cgroup v2 memory.max, the smallest along its path; cgroup v1
 * memory.limit_in_bytes), else the machine's physical memory. A container
 * limit of 512 MiB thus reads as 512 MiB, not as the host's memory.
 *
 * Failure modes: none that fail; files that are missing, unreadable or
 * say "max" mean "no limit here", and the answer falls back to physical
 * memory (desc says which source it is).
 */
#ifndef TSR_MEMLIMIT_H
#define TSR_MEMLIMIT_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
  TSR_MEM_PHYSICAL = 0,
  TSR_MEM_CGROUP_V2 = 1,
  TSR_MEM_CGROUP_V1 = 2,
} tsr_mem_source;

/* `root` is "" normally; a test passes a folder holding proc/self/cgroup
 * and sys/fs/cgroup/... `physical` is the machine's memory in bytes (0:
 * read it from sysconf). Fills *bytes, *source and desc (e.g. "cgroup v2
 * limit (/sys/fs/cgroup/memory.max)"). Returns 0. */
int tsr_mem_available(const char *root, uint64_t physical, uint64_t *bytes,
                      tsr_mem_source *source, char *desc, size_t desclen);

#endif
