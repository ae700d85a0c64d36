/* For tests of durable writes: fsync is interposed (the static libraries'
 * calls resolve to the test program's definition first) to record the
 * resolved path of every file and folder synced, and each test gets a
 * fresh folder `root` (a real path, as the recorder sees it) that its
 * teardown removes, and can count what a folder holds. Include it in one
 * file of a test program only. */
#ifndef TSR_TEST_FSYNC_RECORD_H
#define TSR_TEST_FSYNC_RECORD_H

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static char synced[64][4096];
static int n_synced;

int fsync(int fd) {
  char link[64];
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  if (n_synced < 64) {
    ssize_t n = readlink(link, synced[n_synced], sizeof synced[0] - 1);
    synced[n_synced][n > 0 ? n : 0] = 0;
    n_synced++;
  }
  return (int)syscall(SYS_fsync, fd);
}

static int was_synced(const char *path) {
  for (int i = 0; i < n_synced; i++)
    if (strcmp(synced[i], path) == 0) return 1;
  return 0;
}

static int was_synced_prefix(const char *prefix) {
  for (int i = 0; i < n_synced; i++)
    if (strncmp(synced[i], prefix, strlen(prefix)) == 0) return 1;
  return 0;
}

static char root[256];

static int setup(void **state) {
  (void)state;
  char tmpl[] = "/tmp/tsr_fsync_XXXXXX";
  if (!mkdtemp(tmpl)) return -1;
  if (!realpath(tmpl, root)) return -1;
  n_synced = 0;
  return 0;
}

static int teardown(void **state) {
  (void)state;
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
  return system(cmd) == 0 ? 0 : -1;
}

/* Entries of `dir` whose name holds `part` (NULL: every entry but . and
 * ..); -1 when the folder cannot be read. */
static int count_entries(const char *dir, const char *part) {
  DIR *d = opendir(dir);
  if (!d) return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (part ? strstr(e->d_name, part) != NULL
             : strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
      n++;
  closedir(d);
  return n;
}

#endif /* TSR_TEST_FSYNC_RECORD_H */
