/* --idle-exit: see idle.h. */
#include "common/idle.h"

#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define IDLE_MAX_SECS (7 * 24 * 3600.0)

struct tsr_idle {
  uv_timer_t timer;
  tsr_rpc_client *cli;
  double secs;
  double last_seen; /* tsr_now_s() */
  bool fired;
  bool was_up;
  int open; /* handles not yet closed: the timer and the client */
  char addr[TSR_RPC_ADDR_MAX + 200];
  tsr_idle_cb on_idle;
  void *data;
};

int tsr_idle_parse(const char *flag, const char *text, double *secs,
                   char *err, size_t errlen) {
  char *end;
  double v = strtod(text, &end);
  double mul = 1;
  if (end != text) {
    if (*end == 's') end++;
    else if (*end == 'm') mul = 60, end++;
    else if (*end == 'h') mul = 3600, end++;
  }
  v *= mul;
  if (end == text || *end || !isfinite(v) || v <= 0 || v > IDLE_MAX_SECS) {
    snprintf(err, errlen, "%s \"%s\": expected a duration above 0 and at most "
             "a week, in seconds or with s, m or h (e.g. 90, 90s, 10m, 2h)",
             flag, text);
    return TSR_EINVAL;
  }
  *secs = v;
  return 0;
}

int tsr_idle_arg(void *secs, const char *flag, const char *value, char *err,
                 size_t errlen) {
  return tsr_idle_parse(flag, value, secs, err, errlen);
}

static void idle_free(tsr_idle *w) {
  if (--w->open == 0) free(w);
}

static void on_timer_closed(uv_handle_t *h) { idle_free(h->data); }
static void on_client_closed(void *data) { idle_free(data); }

static void on_tick(uv_timer_t *t) {
  tsr_idle *w = t->data;
  double now = tsr_now_s();
  bool up = tsr_rpc_client_connected(w->cli) != 0;
  if (up) {
    w->last_seen = now;
    w->was_up = true;
    return;
  }
  if (w->fired || now - w->last_seen < w->secs) return;
  w->fired = true;
  tsr_warn("no chief at %s for %.3g s (--idle-exit%s): leaving", w->addr,
           w->secs, w->was_up ? ", since it was last connected"
                                  : ", since this process started");
  uv_timer_stop(&w->timer);
  w->on_idle(w->data);
}

int tsr_idle_start(tsr_idle **out, tsr_rpc_ctx *ctx, const char *chief_addr,
                   double secs, tsr_idle_cb on_idle, void *data) {
  *out = NULL;
  tsr_idle *w = calloc(1, sizeof *w);
  if (!w) return TSR_ENOMEM;
  int rc = tsr_rpc_client_new(&w->cli, ctx, chief_addr);
  if (rc) {
    free(w);
    return rc;
  }
  snprintf(w->addr, sizeof w->addr, "%s", chief_addr);
  w->secs = secs;
  w->last_seen = tsr_now_s();
  w->on_idle = on_idle;
  w->data = data;
  w->open = 2;
  uv_timer_init(tsr_rpc_ctx_loop(ctx), &w->timer);
  w->timer.data = w;
  uint64_t every = secs >= 4 ? 1000 : (uint64_t)(secs * 250);
  uv_timer_start(&w->timer, on_tick, every ? every : 1, every ? every : 1);
  tsr_info("--idle-exit: leaving when no chief has been connected at %s for "
           "%.3g s", chief_addr, secs);
  *out = w;
  return 0;
}

void tsr_idle_close(tsr_idle *w) {
  if (!w) return;
  uv_timer_stop(&w->timer);
  uv_close((uv_handle_t *)&w->timer, on_timer_closed);
  tsr_rpc_client_close(w->cli, on_client_closed, w);
}
