/* Runs a fuzz target's LLVMFuzzerTestOneInput over files, without
 * libFuzzer: the regular build links each target with this driver, so a
 * target that no longer compiles fails the ordinary build, and the suite
 * replays the checked-in corpus (the seeds and every regression input a
 * campaign found) under whatever sanitizers the build has.
 *
 * usage: fuzz_replay_<target> PATH...   (a PATH may be a folder: each
 * regular file directly in it is replayed, in name order). Exits 0 when
 * every input ran, 1 when a file could not be read, 2 on bad usage; a
 * target that crashes ends the process as the crash does. */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/job.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int replay_file(const char *path) {
  char err[512];
  size_t n;
  int rc;
  char *buf = tsr_read_file(path, &n, &rc, err, sizeof err);
  if (!buf) {
    fprintf(stderr, "fuzz_replay: %s\n", err);
    return -1;
  }
  LLVMFuzzerTestOneInput((const uint8_t *)buf, n);
  free(buf);
  return 0;
}

static int by_name(const struct dirent **a, const struct dirent **b) {
  return strcmp((*a)->d_name, (*b)->d_name);
}

static int replay_path(const char *path, int *count) {
  struct stat st;
  if (stat(path, &st) != 0) {
    fprintf(stderr, "fuzz_replay: %s: %s\n", path, strerror(errno));
    return -1;
  }
  if (!S_ISDIR(st.st_mode)) {
    ++*count;
    return replay_file(path);
  }
  struct dirent **ents;
  int n = scandir(path, &ents, NULL, by_name);
  if (n < 0) {
    fprintf(stderr, "fuzz_replay: %s: %s\n", path, strerror(errno));
    return -1;
  }
  int rc = 0;
  for (int i = 0; i < n; i++) {
    char sub[4096];
    int len = snprintf(sub, sizeof sub, "%s/%s", path, ents[i]->d_name);
    if (ents[i]->d_name[0] != '.' && len > 0 && (size_t)len < sizeof sub &&
        stat(sub, &st) == 0 && S_ISREG(st.st_mode)) {
      ++*count;
      if (replay_file(sub) != 0) rc = -1;
    }
    free(ents[i]);
  }
  free(ents);
  return rc;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s PATH...\n", argv[0]);
    return 2;
  }
  int rc = 0, count = 0;
  for (int i = 1; i < argc; i++)
    if (replay_path(argv[i], &count) != 0) rc = 1;
  printf("fuzz_replay: %d input(s) replayed\n", count);
  if (count == 0) {
    fprintf(stderr, "fuzz_replay: no input found\n");
    return 1;
  }
  return rc;
}
