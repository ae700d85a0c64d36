/* libFuzzer target: the PS service methods against a real store.
 *
 * Each input is a run of requests to a fresh parameter server (a small
 * memory limit, a checkpoint root on tmpfs): its first byte picks the
 * consistency mode and whether non-finite gradients are allowed, then
 * records of [method selector u8][meta length u16][payload length u16]
 * [meta][payload] follow. Every request is decoded and dispatched to its
 * handler exactly as one from the network would be (without a socket:
 * tsr_rpc__server_inject), applies and checkpoint I/O run on the pool,
 * and the server is closed at the end, which must answer every held
 * call and free everything (ASan reports leaks and bad accesses, UBSan
 * overflows). */
#include "common/rpc/rpc_int.h"
#include "ps/svc_int.h"

#include "common/log.h"

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

static const uint32_t methods[] = {
    PS_M_CREATE, PS_M_PULL,  PS_M_PULL_ROWS, PS_M_PUSH,
    PS_M_PUSH_ROWS, PS_M_PUSH_PULL, PS_M_CLOCK, PS_M_CONFIG,
    PS_M_SAVE,   PS_M_RESTORE, PS_M_STATS, PS_M_SHUTDOWN,
};

static uv_loop_t g_loop;
static tsr_rpc_ctx *g_ctx;
static char g_root[64];

static void fz_closed(void *data) { *(int *)data = 1; }

static int fz_rm(const char *path, const struct stat *st, int flag,
                 struct FTW *f) {
  (void)st;
  (void)flag;
  if (f->level > 0) remove(path);
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!g_ctx) {
    tsr_log_set_level(TSR_LOG_ERROR);
    uv_loop_init(&g_loop);
    tsr_rpc_opts o = {0};
    o.name = "fuzz";
    o.token = "fuzz-token";
    o.token_len = 10;
    o.max_payload_bytes = 1 << 20;
    if (tsr_rpc_ctx_new(&g_ctx, &g_loop, &o)) abort();
    snprintf(g_root, sizeof g_root, "%s/tsr-fuzz-ps-%d",
             access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp",
             (int)getpid());
    mkdir(g_root, 0755);
  }
  if (size < 1) return 0;
  static const char *const modes[] = {"async", "ssp:1", "sync", "ssp:0"};
  ps_server_opts po = {0};
  po.memory_limit = 8 << 20;
  po.mode = modes[data[0] & 3];
  po.allow_nonfinite = (data[0] & 4) != 0;
  po.checkpoint_root = g_root;
  ps_server *s;
  if (ps_server_new(&s, g_ctx, &po)) abort();
  data++;
  size--;
  uint64_t id = 1;
  while (size >= 5) {
    uint32_t m = methods[data[0] % (sizeof methods / sizeof methods[0])];
    size_t ml = (size_t)data[1] | (size_t)data[2] << 8;
    size_t pl = (size_t)data[3] | (size_t)data[4] << 8;
    data += 5;
    size -= 5;
    if (ml > size) ml = size;
    if (pl > size - ml) pl = size - ml;
    tsr_rpc__server_inject(s->rpc, m, id++, data, ml, data + ml, pl);
    data += ml + pl;
    size -= ml + pl;
    uv_run(&g_loop, UV_RUN_NOWAIT);
  }
  int closed = 0;
  ps_server_close(s, fz_closed, &closed);
  while (!closed) uv_run(&g_loop, UV_RUN_ONCE);
  /* what saves wrote goes, or tmpfs would fill up */
  nftw(g_root, fz_rm, 16, FTW_DEPTH | FTW_PHYS);
  return 0;
}
