/* `tessera local`'s output relay: each child's stdout and stderr, read on
 * the loop, written to the launcher's own with the child's name before
 * every line ("ps:0   | ..."). A line that ends in '\r' (the chief's
 * progress bar) is redrawn in place on a terminal and is an ordinary line
 * elsewhere.
 *
 * Failure modes: a line longer than 64 KiB is cut into lines of that
 * size; output that cannot be written (a closed terminal) or for which
 * there is no memory is dropped; the children never block on it.
 */
#include "chief/cli/local_int.h"
#include "common/err.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define LINE_MAX_RELAY 65536

static void write_all(int fd, const char *p, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return; /* a closed terminal: drop the output */
    p += w;
    n -= (size_t)w;
  }
}

/* One prefixed line in one write(). `inplace`: a progress line that ended
 * in '\r', drawn over the previous one on a terminal. */
static void emit_line(stream *st, const char *text, size_t n, bool inplace) {
  sup *s = st->p->s;
  int fd = st->is_err ? s->o->err_fd : s->o->out_fd;
  char stackbuf[1024];
  size_t need = n + (size_t)s->name_width + 16;
  char *buf = need <= sizeof stackbuf ? stackbuf : malloc(need);
  if (!buf) return;
  size_t k = 0;
  bool tty = st->is_err ? s->err_tty : s->relay_tty;
  if (tty && s->bar_shown) {
    memcpy(buf, "\r\033[K", 4);
    k = 4;
  }
  k += (size_t)sprintf(buf + k, "%-*s | ", s->name_width, st->p->name);
  memcpy(buf + k, text, n);
  k += n;
  if (inplace && tty) {
    s->bar_shown = true;
  } else {
    buf[k++] = '\n';
    if (tty) s->bar_shown = false;
  }
  write_all(fd, buf, k);
  if (buf != stackbuf) free(buf);
}

/* Lines end at '\n'. A '\r' (not part of "\r\n") starts a line that is
 * redrawn in place, like the chief's progress bar: on a terminal it is
 * shown as soon as it arrives and stays until the next line; elsewhere it
 * becomes an ordinary line. */
static void relay_bytes(stream *st, const char *p, size_t n) {
  sup *s = st->p->s;
  bool tty = st->is_err ? s->err_tty : s->relay_tty;
  for (size_t i = 0; i < n; i++) {
    char c = p[i];
    if (c == '\n') {
      if (tty && st->drawn && st->len == 0 && s->bar_shown) {
        /* The in-place line is on screen already: just end it. */
        write_all(st->is_err ? s->o->err_fd : s->o->out_fd, "\n", 1);
        s->bar_shown = false;
      } else {
        emit_line(st, st->line, st->len, false);
      }
      st->len = 0;
      st->after_cr = st->drawn = false;
      continue;
    }
    if (c == '\r') {
      if (i + 1 < n && p[i + 1] == '\n') continue;
      if (st->len > 0) {
        emit_line(st, st->line, st->len, true);
        st->drawn = true;
      }
      st->len = 0;
      st->after_cr = true;
      continue;
    }
    if (!st->line) {
      st->line = malloc(LINE_MAX_RELAY);
      if (!st->line) return;
    }
    st->line[st->len++] = c;
    if (st->len == LINE_MAX_RELAY) {
      emit_line(st, st->line, st->len, false);
      st->len = 0;
    }
  }
  if (tty && st->after_cr && st->len > 0) {
    emit_line(st, st->line, st->len, true);
    st->len = 0;
    st->drawn = true;
    /* What follows without a new '\r' (a log line) is a line of its own:
     * it replaces the bar rather than being drawn in place piecemeal. */
    st->after_cr = false;
  }
}

static void on_stream_closed(uv_handle_t *h) {
  stream *st = h->data;
  sup *s = st->p->s;
  free(st->line);
  free(st);
  s->open_streams--;
  chief_local__check_done(s);
}

static void close_stream(stream *st) {
  if (uv_is_closing((uv_handle_t *)&st->pipe)) return;
  if (st->len > 0) emit_line(st, st->line, st->len, false);
  st->len = 0;
  uv_close((uv_handle_t *)&st->pipe, on_stream_closed);
}

static void on_alloc(uv_handle_t *h, size_t sz, uv_buf_t *buf) {
  stream *st = h->data;
  (void)sz;
  /* One loop thread, and each read is relayed before the next: one buffer
   * serves every pipe. */
  *buf = uv_buf_init(st->p->s->rbuf, sizeof st->p->s->rbuf);
}

static void on_read(uv_stream_t *h, ssize_t n, const uv_buf_t *buf) {
  stream *st = h->data;
  if (n > 0) {
    relay_bytes(st, buf->base, (size_t)n);
  } else if (n < 0) {
    close_stream(st);
  }
}

void chief_local__close_stray_stream(uv_handle_t *h, void *arg) {
  (void)arg;
  if (h->type == UV_NAMED_PIPE && !uv_is_closing(h))
    close_stream((stream *)h->data);
}

void chief_local__end_bar(sup *s) {
  if (s->bar_shown) {
    write_all(s->o->out_fd, "\n", 1);
    s->bar_shown = false;
  }
}
int chief_local__open_stream(sup *s, proc *p, int fd, bool is_err) {
  stream *st = calloc(1, sizeof *st);
  if (!st) return TSR_ENOMEM;
  st->p = p;
  st->is_err = is_err;
  uv_pipe_init(&s->loop, &st->pipe, 0);
  st->pipe.data = st;
  s->open_streams++;
  int rc = uv_pipe_open(&st->pipe, fd);
  if (!rc) rc = uv_read_start((uv_stream_t *)&st->pipe, on_alloc, on_read);
  if (rc) {
    close(fd);
    uv_close((uv_handle_t *)&st->pipe, on_stream_closed);
  }
  return rc;
}
