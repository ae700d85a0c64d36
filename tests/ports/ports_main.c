/* tsr-test-ports: the port claims of ports.h for the shell tests.
 *
 *   tsr-test-ports claim N OWNER_PID        N ports, on one line
 *   tsr-test-ports claim-run N OWNER_PID    N consecutive ports, the first
 *                                           a multiple of N
 *   tsr-test-ports release OWNER_PID [PORT...]
 *                                           the owner's claims on PORTs,
 *                                           or all of them
 * Exit status 0, 1 when the ports cannot be claimed (the line says why),
 * 2 on bad arguments. */
#include "ports.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int usage(void) {
  fprintf(stderr, "usage: tsr-test-ports claim|claim-run N OWNER_PID\n"
                  "       tsr-test-ports release OWNER_PID [PORT...]\n");
  return 2;
}

static int number(const char *s, const char *what, long *v) {
  char *end;
  *v = strtol(s, &end, 10);
  if (*s && !*end && *v > 0) return 0;
  fprintf(stderr, "tsr-test-ports: %s \"%s\" is not a number above 0\n",
          what, s);
  return -1;
}

int main(int argc, char **argv) {
  char err[512] = "";
  long n, owner;
  if (argc == 4 && (!strcmp(argv[1], "claim") ||
                    !strcmp(argv[1], "claim-run"))) {
    if (number(argv[2], "N", &n) || number(argv[3], "OWNER_PID", &owner))
      return 2;
    if (n > 65535) {
      fprintf(stderr, "tsr-test-ports: N %ld is more than there are ports\n",
              n);
      return 2;
    }
    int *ports = malloc((size_t)n * sizeof *ports);
    if (!ports) return 1;
    int rc = test_ports_claim((int)n, !strcmp(argv[1], "claim-run"), owner,
                              ports, err, sizeof err);
    if (rc) {
      fprintf(stderr, "tsr-test-ports: %s\n", err);
      free(ports);
      return rc == -EINVAL ? 2 : 1;
    }
    for (long i = 0; i < n; i++) printf("%s%d", i ? " " : "", ports[i]);
    printf("\n");
    free(ports);
    return 0;
  }
  if (argc >= 3 && !strcmp(argv[1], "release")) {
    if (number(argv[2], "OWNER_PID", &owner)) return 2;
    int k = argc - 3;
    int *ports = malloc((size_t)(k ? k : 1) * sizeof *ports);
    if (!ports) return 1;
    for (int i = 0; i < k; i++) {
      long p;
      if (number(argv[3 + i], "PORT", &p) || p > 65535) {
        if (p > 65535)
          fprintf(stderr, "tsr-test-ports: PORT %ld is above 65535\n", p);
        free(ports);
        return 2;
      }
      ports[i] = (int)p;
    }
    int rc = test_ports_release(owner, ports, k, err, sizeof err);
    free(ports);
    if (rc < 0) {
      fprintf(stderr, "tsr-test-ports: %s\n", err);
      return 1;
    }
    return 0;
  }
  return usage();
}
