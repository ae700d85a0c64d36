/* The chief's progress display.
 *
 * On a terminal one line is redrawn in place with '\r' and an erase to the
 * end of line:
 *   step 1200/5000 [#######.............]  24% loss 0.3127 8.1k ex/s ETA 1m12s
 * Elsewhere (a log file, a pipe) a plain line is written every
 * log_every_s instead, so logs are not flooded with redraws. Rates come
 * from a small ring of samples spanning the last ~10 s, so a stall shows
 * up quickly and a single slow step does not. Nothing here fails: a full
 * disk or a closed terminal just loses progress lines.
 */
#include "artifacts/monitor/monitor.h"
#include "common/err.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define RING 64
#define WINDOW_S 10.0
#define SAMPLE_EVERY_S 0.2

typedef struct {
  double t;
  int64_t step, examples;
} sample;

struct chief_progress {
  chief_progress_opts o;
  sample ring[RING];
  int head, count;
  int64_t step, examples;
  double loss;
  double last_draw, last_sample;
  double ex_rate, step_rate;
  bool drawn;       /* a bar line is on screen without a newline */
  bool have_state;
};

int chief_progress_create(chief_progress **out, const chief_progress_opts *o) {
  chief_progress *p = calloc(1, sizeof *p);
  if (!p) return TSR_ENOMEM;
  if (o) p->o = *o;
  if (!p->o.out) p->o.out = stdout;
  if (p->o.log_every_s <= 0) p->o.log_every_s = 10;
  if (p->o.min_redraw_s <= 0) p->o.min_redraw_s = 0.1;
  if (p->o.width <= 0) {
    const char *c = getenv("COLUMNS");
    p->o.width = c && atoi(c) >= 40 ? atoi(c) : 80;
  }
  if (p->o.mode == CHIEF_PROGRESS_AUTO) {
    const char *env = getenv("TESSERA_PROGRESS");
    if (env && !strcmp(env, "bar"))
      p->o.mode = CHIEF_PROGRESS_BAR;
    else if (env && !strcmp(env, "lines"))
      p->o.mode = CHIEF_PROGRESS_LINES;
    else if (env && !strcmp(env, "off"))
      p->o.mode = CHIEF_PROGRESS_OFF;
    else
      p->o.mode = isatty(fileno(p->o.out)) ? CHIEF_PROGRESS_BAR
                                           : CHIEF_PROGRESS_LINES;
  }
  p->loss = NAN;
  p->last_draw = p->last_sample = -1e300;
  *out = p;
  return 0;
}

chief_progress_mode chief_progress_get_mode(const chief_progress *p) {
  return p->o.mode;
}

void chief_format_duration(double s, char *buf, size_t len) {
  if (!(s >= 0) || s > 1e9) {
    snprintf(buf, len, "?");
    return;
  }
  if (s < 9.95) {
    snprintf(buf, len, "%.1fs", s);
    return;
  }
  long t = (long)(s + 0.5);
  if (t >= 3600)
    snprintf(buf, len, "%ldh%02ldm", t / 3600, (t / 60) % 60);
  else if (t >= 60)
    snprintf(buf, len, "%ldm%02lds", t / 60, t % 60);
  else
    snprintf(buf, len, "%lds", t);
}

/* 8123 -> "8.1k", 1234567 -> "1.23M". */
static void format_rate(double r, char *buf, size_t len) {
  if (r >= 1e6)
    snprintf(buf, len, "%.2fM", r / 1e6);
  else if (r >= 1e4)
    snprintf(buf, len, "%.1fk", r / 1e3);
  else if (r >= 100)
    snprintf(buf, len, "%.0f", r);
  else
    snprintf(buf, len, "%.3g", r);
}

/* The text of a progress line (without '\r' or '\n'); `bar_cols` 0: no
 * bar. */
static void render(const chief_progress *p, char *buf, size_t len,
                   int bar_cols) {
  char rate[32], eta[32] = "", loss[48] = "";
  format_rate(p->ex_rate, rate, sizeof rate);
  if (!isnan(p->loss)) snprintf(loss, sizeof loss, " loss %.4g", p->loss);
  int64_t total = p->o.total_steps;
  if (total > 0 && p->step_rate > 0 && p->step < total) {
    char d[24];
    chief_format_duration((double)(total - p->step) / p->step_rate, d,
                          sizeof d);
    snprintf(eta, sizeof eta, " ETA %s", d);
  }
  size_t k = 0;
  if (total > 0)
    k += (size_t)snprintf(buf + k, len - k, "step %lld/%lld",
                          (long long)p->step, (long long)total);
  else
    k += (size_t)snprintf(buf + k, len - k, "step %lld", (long long)p->step);
  if (k < len && total > 0) {
    double frac = (double)p->step / (double)total;
    if (frac > 1) frac = 1;
    if (frac < 0) frac = 0;
    if (bar_cols > 0 && k + (size_t)bar_cols + 4 < len) {
      int fill = (int)(frac * bar_cols + 1e-9);
      buf[k++] = ' ';
      buf[k++] = '[';
      for (int i = 0; i < bar_cols; i++) buf[k++] = i < fill ? '#' : '.';
      buf[k++] = ']';
      buf[k] = '\0';
    }
    if (k < len)
      k += (size_t)snprintf(buf + k, len - k, " %3d%%", (int)(frac * 100));
  }
  if (k < len)
    snprintf(buf + k, len - k, "%s %s ex/s%s", loss, rate, eta);
}

static void draw(chief_progress *p, bool final) {
  FILE *f = p->o.out;
  char line[512];
  if (p->o.mode == CHIEF_PROGRESS_BAR) {
    /* Fit the line: measure it without a bar, give the bar what is left. */
    render(p, line, sizeof line, 0);
    int room = p->o.width - 1 - (int)strlen(line) - 3;
    int bar = room > 50 ? 50 : room;
    render(p, line, sizeof line, bar >= 10 && p->o.total_steps > 0 ? bar : 0);
    if ((int)strlen(line) > p->o.width - 1) line[p->o.width - 1] = '\0';
    fprintf(f, "\r%s\033[K%s", line, final ? "\n" : "");
    p->drawn = !final;
  } else if (p->o.mode == CHIEF_PROGRESS_LINES) {
    render(p, line, sizeof line, 0);
    fprintf(f, "%s\n", line);
  }
  fflush(f);
}

static void add_sample(chief_progress *p, double now) {
  p->ring[p->head] = (sample){now, p->step, p->examples};
  p->head = (p->head + 1) % RING;
  if (p->count < RING) p->count++;
  /* Oldest sample still inside the window (keep at least two). */
  const sample *newest = &p->ring[(p->head + RING - 1) % RING];
  const sample *old = NULL;
  for (int i = p->count; i >= 2; i--) {
    const sample *s = &p->ring[(p->head + RING - i) % RING];
    if (newest->t - s->t <= WINDOW_S || i == 2) {
      old = s;
      break;
    }
  }
  if (old && newest->t > old->t) {
    double dt = newest->t - old->t;
    p->ex_rate = (double)(newest->examples - old->examples) / dt;
    p->step_rate = (double)(newest->step - old->step) / dt;
  }
}

void chief_progress_update(chief_progress *p, int64_t step, int64_t examples,
                           double loss, double now_s) {
  /* A rewind (recovery from a checkpoint) restarts the rate window: the
   * steps between are run again, not undone at a negative rate. */
  if (p->have_state && (step < p->step || examples < p->examples)) {
    p->count = 0;
    p->head = 0;
    p->last_sample = -1e300;
  }
  p->step = step;
  p->examples = examples;
  if (!isnan(loss)) p->loss = loss;
  p->have_state = true;
  if (now_s - p->last_sample >= SAMPLE_EVERY_S - 1e-9 || p->count < 2) {
    add_sample(p, now_s);
    p->last_sample = now_s;
  }
  double every = p->o.mode == CHIEF_PROGRESS_BAR ? p->o.min_redraw_s
                                                 : p->o.log_every_s;
  /* The epsilon keeps sums of float intervals (0.1 + 0.2) on schedule. */
  if (p->o.mode != CHIEF_PROGRESS_OFF && now_s - p->last_draw >= every - 1e-9) {
    draw(p, false);
    p->last_draw = now_s;
  }
}

void chief_progress_note(chief_progress *p, const char *fmt, ...) {
  FILE *f = p->o.out;
  if (p->drawn) fputs("\r\033[K", f);
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  fputs(line, f);
  fputc('\n', f);
  if (p->drawn && p->have_state) draw(p, false);
  fflush(f);
}

void chief_progress_finish(chief_progress *p) {
  if (p->o.mode == CHIEF_PROGRESS_OFF || !p->have_state) return;
  draw(p, true);
  p->drawn = false;
}

double chief_progress_examples_per_sec(const chief_progress *p) {
  return p->ex_rate;
}
double chief_progress_steps_per_sec(const chief_progress *p) {
  return p->step_rate;
}

void chief_progress_free(chief_progress *p) { free(p); }
