/* gpu_check's NCCL part (kernels/kern_nccl.h), the GPU path of dense
 * "allreduce" among processes: a communicator of one rank on this GPU
 * (all-reduce and broadcast leave the data as it is), and with two GPUs or
 * more two rank processes (this program again, --nccl-rank R ID: CUDA
 * does not survive a fork) that sum and broadcast through a communicator
 * whose id this process made. The CPU self-test checks that a CPU context
 * is refused with the reason.
 */
#include "kernels/kern_nccl.h"
#include "common/err.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define NCCL_N (1 << 20)

int gpu_check_nccl(kern_ctx *gpu, int ngpu, const char *self);
int gpu_check_nccl_rank(int rank, const char *idhex);

static void hex(const uint8_t *id, char *out) {
  for (int i = 0; i < KERN_NCCL_ID_BYTES; i++) sprintf(out + 2 * i, "%02x", id[i]);
}

static int unhex(const char *s, uint8_t *id) {
  if (strlen(s) != 2 * KERN_NCCL_ID_BYTES) return -1;
  for (int i = 0; i < KERN_NCCL_ID_BYTES; i++) {
    unsigned v;
    if (sscanf(s + 2 * i, "%2x", &v) != 1) return -1;
    id[i] = (uint8_t)v;
  }
  return 0;
}

/* all-reduce then broadcast of NCCL_N floats on `g`; x[i] = (rank + 1)
 * * (i % 7): the sum is nranks (nranks + 1) / 2 * (i % 7), and root's
 * broadcast of i * (root + 1) lands everywhere. 0 when both check. */
static int exercise(kern_ctx *g, kern_nccl *c, int nranks, int rank,
                    int root) {
  float *h = malloc(NCCL_N * sizeof(float));
  float *d = kern_alloc(g, NCCL_N * sizeof(float));
  int bad = !h || !d;
  for (int i = 0; !bad && i < NCCL_N; i++) h[i] = (float)((rank + 1) * (i % 7));
  if (!bad) bad = kern_upload(g, d, h, NCCL_N * sizeof(float)) ||
                  kern_nccl_allreduce(c, d, NCCL_N) ||
                  kern_download(g, h, d, NCCL_N * sizeof(float));
  float tri = (float)(nranks * (nranks + 1) / 2);
  for (int i = 0; !bad && i < NCCL_N; i++) bad = h[i] != tri * (float)(i % 7);
  for (int i = 0; !bad && i < NCCL_N; i++)
    h[i] = rank == root ? (float)i * (float)(root + 1) : -1.0f;
  if (!bad) bad = kern_upload(g, d, h, NCCL_N * sizeof(float)) ||
                  kern_nccl_broadcast(c, d, NCCL_N * sizeof(float), root) ||
                  kern_download(g, h, d, NCCL_N * sizeof(float));
  for (int i = 0; !bad && i < NCCL_N; i++)
    bad = h[i] != (float)i * (float)(root + 1);
  if (bad) fprintf(stderr, "NCCL rank %d of %d: %s\n", rank, nranks,
                   kern_last_error(g));
  kern_free(g, d);
  free(h);
  return bad;
}

int gpu_check_nccl_rank(int rank, const char *idhex) {
  uint8_t id[KERN_NCCL_ID_BYTES];
  char err[512];
  kern_opts o = {.device = KERN_DEVICE_GPU, .gpu_index = rank};
  kern_ctx *g;
  kern_nccl *c;
  if (unhex(idhex, id)) return 2;
  if (kern_open(&o, &g, err, sizeof err) ||
      kern_nccl_open(g, id, 2, rank, &c, err, sizeof err)) {
    fprintf(stderr, "NCCL rank %d: %s\n", rank, err);
    return 1;
  }
  int bad = exercise(g, c, 2, rank, 1);
  kern_nccl_close(c);
  kern_close(g);
  return bad;
}

int gpu_check_nccl(kern_ctx *gpu, int ngpu, const char *self) {
  char err[512];
  int failures = 0;
  if (kern_is_host(gpu)) {
    /* the CPU self-test: refused, saying why */
    int rc = kern_nccl_available(gpu, err, sizeof err);
    bool ok = rc == TSR_ENODEVICE && strstr(err, "GPU");
    printf("%-48s %s (%s)\n", "NCCL refused on a CPU context", ok ? "ok" : "FAIL",
           err);
    return ok ? 0 : 1;
  }
  uint8_t id[KERN_NCCL_ID_BYTES];
  kern_nccl *c;
  if (kern_nccl_unique_id(gpu, id, err, sizeof err) ||
      kern_nccl_open(gpu, id, 1, 0, &c, err, sizeof err)) {
    printf("%-48s FAIL (%s)\n", "NCCL communicator of 1 rank", err);
    return 1;
  }
  int bad = exercise(gpu, c, 1, 0, 0);
  kern_nccl_close(c);
  printf("%-48s %s\n", "NCCL 1 rank: all-reduce, broadcast", bad ? "FAIL" : "ok");
  failures += bad;
  if (ngpu < 2) {
    printf("%-48s skipped: %d GPU visible\n", "NCCL 2 rank processes", ngpu);
    return failures;
  }
  char idhex[2 * KERN_NCCL_ID_BYTES + 1];
  if (kern_nccl_unique_id(gpu, id, err, sizeof err)) {
    printf("%-48s FAIL (%s)\n", "NCCL 2 rank processes", err);
    return failures + 1;
  }
  hex(id, idhex);
  pid_t pid[2];
  for (int r = 0; r < 2; r++) {
    char rank[8];
    snprintf(rank, sizeof rank, "%d", r);
    if ((pid[r] = fork()) == 0) {
      execl(self, self, "--nccl-rank", rank, idhex, (char *)NULL);
      _exit(127);
    }
  }
  int ok = 0;
  for (int r = 0; r < 2; r++) {
    int st = 0;
    if (pid[r] > 0 && waitpid(pid[r], &st, 0) == pid[r] && WIFEXITED(st) &&
        WEXITSTATUS(st) == 0)
      ok++;
  }
  printf("%-48s %s\n", "NCCL 2 rank processes: sum and broadcast",
         ok == 2 ? "ok" : "FAIL");
  return failures + (ok == 2 ? 0 : 1);
}
