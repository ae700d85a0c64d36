/* The memory a process may use, from fake /proc and /sys trees: a cgroup
 * v2 limit (the smallest along the path, "max" meaning none), a v1 limit
 * (its own cgroup's, or the mount root's inside a container), a hybrid
 * machine (v1 memory controller), no limit, a limit above physical memory,
 * and no cgroup files at all. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/memlimit.h"

static char g_root[64];

static void put(const char *rel, const char *text) {
  char p[512], cmd[600];
  snprintf(p, sizeof p, "%s/%s", g_root, rel);
  snprintf(cmd, sizeof cmd, "mkdir -p \"$(dirname '%s')\"", p);
  assert_int_equal(system(cmd), 0);
  FILE *f = fopen(p, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

static int setup(void **s) {
  snprintf(g_root, sizeof g_root, "/tmp/tsr-memlimit-XXXXXX");
  assert_non_null(mkdtemp(g_root));
  return 0;
}

static int teardown(void **s) {
  char cmd[200];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_root);
  return system(cmd);
}

#define GIB (1ull << 30)

static void check(uint64_t phys, uint64_t want, tsr_mem_source src,
                  const char *text) {
  uint64_t b = 0;
  tsr_mem_source s;
  char d[512];
  assert_int_equal(tsr_mem_available(g_root, phys, &b, &s, d, sizeof d), 0);
  if (b != want || s != src || !strstr(d, text))
    fail_msg("got %llu (source %d, \"%s\"), want %llu (source %d, \"%s\")",
             (unsigned long long)b, s, d, (unsigned long long)want, src,
             text);
}

static void v2_container(void **s) {
  put("proc/self/cgroup", "0::/\n");
  put("sys/fs/cgroup/memory.max", "536870912\n");
  check(64 * GIB, 536870912, TSR_MEM_CGROUP_V2,
        "cgroup v2 limit (/sys/fs/cgroup/memory.max)");
}

static void v2_nested_smallest_wins(void **s) {
  put("proc/self/cgroup", "0::/kube/pod1/ctr\n");
  put("sys/fs/cgroup/memory.max", "max\n");
  put("sys/fs/cgroup/kube/memory.max", "8589934592\n");
  put("sys/fs/cgroup/kube/pod1/memory.max", "1073741824\n");
  put("sys/fs/cgroup/kube/pod1/ctr/memory.max", "max\n");
  check(64 * GIB, GIB, TSR_MEM_CGROUP_V2, "/kube/pod1/memory.max");
}

static void v2_no_limit(void **s) {
  put("proc/self/cgroup", "0::/user.slice\n");
  put("sys/fs/cgroup/user.slice/memory.max", "max\n");
  check(16 * GIB, 16 * GIB, TSR_MEM_PHYSICAL, "physical memory");
}

static void v1_own_and_container(void **s) {
  put("proc/self/cgroup", "4:memory:/docker/abc\n0::/\n");
  put("sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes", "2147483648\n");
  check(64 * GIB, 2 * GIB, TSR_MEM_CGROUP_V1, "cgroup v1 limit");
  /* inside the container the host's path is not there: the mount root */
  put("proc/self/cgroup", "12:cpu,memory:/docker/xyz\n");
  put("sys/fs/cgroup/memory/memory.limit_in_bytes", "268435456\n");
  check(64 * GIB, 268435456, TSR_MEM_CGROUP_V1,
        "/sys/fs/cgroup/memory/memory.limit_in_bytes");
  /* "no limit" in v1 is a huge number */
  put("sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");
  check(8 * GIB, 8 * GIB, TSR_MEM_PHYSICAL, "physical");
}

static void limit_above_physical(void **s) {
  put("proc/self/cgroup", "0::/\n");
  put("sys/fs/cgroup/memory.max", "1099511627776\n");
  check(4 * GIB, 4 * GIB, TSR_MEM_PHYSICAL, "physical");
}

static void no_cgroup_files(void **s) {
  char cmd[200];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'/*", g_root);
  assert_int_equal(system(cmd), 0);
  check(3 * GIB, 3 * GIB, TSR_MEM_PHYSICAL, "physical memory");
  /* and the real machine answers something */
  uint64_t b = 0;
  tsr_mem_source src;
  char d[512];
  assert_int_equal(tsr_mem_available("", 0, &b, &src, d, sizeof d), 0);
  assert_true(b > 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(v2_container),
      cmocka_unit_test(v2_nested_smallest_wins),
      cmocka_unit_test(v2_no_limit),
      cmocka_unit_test(v1_own_and_container),
      cmocka_unit_test(limit_above_physical),
      cmocka_unit_test(no_cgroup_files),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
