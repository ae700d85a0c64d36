/* Chrome trace-event recorder (see trace.h).
 *
 * Happy path: events go into one array under a mutex; write() copies it,
 * sorts the copy by time and prints JSON by hand (it is the hot output of
 * a long run: no DOM). Failure modes: a full recorder drops and counts;
 * an unwritable path names the path; merge names the input that is not a
 * trace; a wire batch that is cut or malformed is refused whole.
 */
#include "common/trace.h"
#include "common/err.h"
#include "common/fs.h"

#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
  int32_t pid, tid; /* tid -1: a process name */
  char name[64];
} track_name;

struct tsr_trace {
  pthread_mutex_t mu;
  tsr_trace_event *ev;
  size_t n, cap, max;
  size_t dropped;
  track_name *names;
  size_t n_names, cap_names;
};

int tsr_trace_create(tsr_trace **out, size_t max_events) {
  tsr_trace *t = calloc(1, sizeof *t);
  if (!t) return TSR_ENOMEM;
  t->max = max_events ? max_events : 262144;
  pthread_mutex_init(&t->mu, NULL);
  *out = t;
  return 0;
}

void tsr_trace_free(tsr_trace *t) {
  if (!t) return;
  pthread_mutex_destroy(&t->mu);
  free(t->ev);
  free(t->names);
  free(t);
}

int32_t tsr_trace_pid(int task_type, int index) {
  switch (task_type) {
    case 0: return 1;
    case 1: return 1000 + index;
    case 2: return 2000 + index;
    case 3: return 3000 + index;
    default: return 9000 + index;
  }
}

int64_t tsr_trace_now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static int set_name(tsr_trace *t, int32_t pid, int32_t tid, const char *name) {
  pthread_mutex_lock(&t->mu);
  int rc = 0;
  track_name *slot = NULL;
  for (size_t i = 0; i < t->n_names; i++)
    if (t->names[i].pid == pid && t->names[i].tid == tid) slot = &t->names[i];
  if (!slot) {
    if (t->n_names == t->cap_names) {
      size_t cap = t->cap_names ? t->cap_names * 2 : 16;
      track_name *nn = realloc(t->names, cap * sizeof *nn);
      if (!nn) {
        rc = TSR_ENOMEM;
        goto out;
      }
      t->names = nn;
      t->cap_names = cap;
    }
    slot = &t->names[t->n_names++];
    slot->pid = pid;
    slot->tid = tid;
  }
  snprintf(slot->name, sizeof slot->name, "%s", name);
out:
  pthread_mutex_unlock(&t->mu);
  return rc;
}

int tsr_trace_name_process(tsr_trace *t, int32_t pid, const char *name) {
  return set_name(t, pid, -1, name);
}

int tsr_trace_name_thread(tsr_trace *t, int32_t pid, int32_t tid,
                          const char *name) {
  if (tid < 0) return TSR_EINVAL;
  return set_name(t, pid, tid, name);
}

/* Called with the mutex held. */
static int push_locked(tsr_trace *t, const tsr_trace_event *e) {
  if (t->n >= t->max) {
    t->dropped++;
    return TSR_EBUSY;
  }
  if (t->n == t->cap) {
    size_t cap = t->cap ? t->cap * 2 : 1024;
    if (cap > t->max) cap = t->max;
    tsr_trace_event *ne = realloc(t->ev, cap * sizeof *ne);
    if (!ne) {
      t->dropped++;
      return TSR_ENOMEM;
    }
    t->ev = ne;
    t->cap = cap;
  }
  t->ev[t->n++] = *e;
  return 0;
}

int tsr_trace_complete(tsr_trace *t, int32_t pid, int32_t tid,
                       const char *cat, const char *name, int64_t ts_us,
                       int64_t dur_us) {
  tsr_trace_event e;
  memset(&e, 0, sizeof e);
  snprintf(e.name, sizeof e.name, "%s", name);
  snprintf(e.cat, sizeof e.cat, "%s", cat ? cat : "");
  e.pid = pid;
  e.tid = tid;
  e.ts_us = ts_us;
  e.dur_us = dur_us < 0 ? 0 : dur_us;
  pthread_mutex_lock(&t->mu);
  int rc = push_locked(t, &e);
  pthread_mutex_unlock(&t->mu);
  return rc;
}

int tsr_trace_end(tsr_trace *t, int32_t pid, int32_t tid, const char *cat,
                  const char *name, int64_t start_us) {
  return tsr_trace_complete(t, pid, tid, cat, name, start_us,
                            tsr_trace_now_us() - start_us);
}

size_t tsr_trace_drain(tsr_trace *t, tsr_trace_event *out, size_t max) {
  pthread_mutex_lock(&t->mu);
  size_t k = t->n < max ? t->n : max;
  if (k) {
    memcpy(out, t->ev, k * sizeof *out);
    memmove(t->ev, t->ev + k, (t->n - k) * sizeof *t->ev);
  }
  t->n -= k;
  pthread_mutex_unlock(&t->mu);
  return k;
}

int tsr_trace_append(tsr_trace *t, const tsr_trace_event *ev, size_t n) {
  int rc = 0;
  pthread_mutex_lock(&t->mu);
  for (size_t i = 0; i < n; i++) {
    tsr_trace_event e = ev[i];
    e.name[sizeof e.name - 1] = '\0';
    e.cat[sizeof e.cat - 1] = '\0';
    int r = push_locked(t, &e);
    if (r && !rc) rc = r;
  }
  pthread_mutex_unlock(&t->mu);
  return rc;
}

static void put_le(uint8_t *p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint64_t get_le(const uint8_t *p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

void tsr_trace_pack(const tsr_trace_event *ev, size_t n, uint8_t *out) {
  for (size_t i = 0; i < n; i++, out += TSR_TRACE_WIRE_SIZE) {
    memset(out, 0, 48);
    memcpy(out, ev[i].name, strnlen(ev[i].name, TSR_TRACE_NAME_MAX - 1));
    memcpy(out + 32, ev[i].cat, strnlen(ev[i].cat, TSR_TRACE_CAT_MAX - 1));
    put_le(out + 48, (uint32_t)ev[i].pid, 4);
    put_le(out + 52, (uint32_t)ev[i].tid, 4);
    put_le(out + 56, (uint64_t)ev[i].ts_us, 8);
    put_le(out + 64, (uint64_t)ev[i].dur_us, 8);
  }
}

int tsr_trace_unpack(const uint8_t *data, size_t len, tsr_trace_event *out,
                     size_t max, size_t *n) {
  *n = 0;
  if (len % TSR_TRACE_WIRE_SIZE) return TSR_ECORRUPT;
  size_t k = len / TSR_TRACE_WIRE_SIZE;
  if (k > max) return TSR_ETOOBIG;
  /* Check everything first: a bad batch is refused whole. */
  for (size_t i = 0; i < k; i++) {
    const uint8_t *p = data + i * TSR_TRACE_WIRE_SIZE;
    if (!memchr(p, 0, TSR_TRACE_NAME_MAX) ||
        !memchr(p + 32, 0, TSR_TRACE_CAT_MAX) ||
        (int64_t)get_le(p + 64, 8) < 0)
      return TSR_ECORRUPT;
  }
  for (size_t i = 0; i < k; i++) {
    const uint8_t *p = data + i * TSR_TRACE_WIRE_SIZE;
    tsr_trace_event *e = &out[i];
    memcpy(e->name, p, TSR_TRACE_NAME_MAX);
    memcpy(e->cat, p + 32, TSR_TRACE_CAT_MAX);
    e->pid = (int32_t)(uint32_t)get_le(p + 48, 4);
    e->tid = (int32_t)(uint32_t)get_le(p + 52, 4);
    e->ts_us = (int64_t)get_le(p + 56, 8);
    e->dur_us = (int64_t)get_le(p + 64, 8);
  }
  *n = k;
  return 0;
}

size_t tsr_trace_count(tsr_trace *t) {
  pthread_mutex_lock(&t->mu);
  size_t n = t->n;
  pthread_mutex_unlock(&t->mu);
  return n;
}

size_t tsr_trace_dropped(tsr_trace *t) {
  pthread_mutex_lock(&t->mu);
  size_t n = t->dropped;
  pthread_mutex_unlock(&t->mu);
  return n;
}

static int by_ts(const void *a, const void *b) {
  const tsr_trace_event *x = a, *y = b;
  if (x->ts_us != y->ts_us) return x->ts_us < y->ts_us ? -1 : 1;
  if (x->pid != y->pid) return x->pid < y->pid ? -1 : 1;
  return x->tid < y->tid ? -1 : x->tid > y->tid;
}

static void put_str(FILE *f, const char *s) {
  fputc('"', f);
  for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
    if (*c == '"' || *c == '\\')
      fprintf(f, "\\%c", *c);
    else if (*c < 0x20)
      fprintf(f, "\\u%04x", *c);
    else
      fputc(*c, f);
  }
  fputc('"', f);
}

int tsr_trace_write(tsr_trace *t, const char *path, char *err, size_t errlen) {
  pthread_mutex_lock(&t->mu);
  size_t n = t->n, nn = t->n_names;
  tsr_trace_event *ev = malloc((n ? n : 1) * sizeof *ev);
  track_name *names = malloc((nn ? nn : 1) * sizeof *names);
  if (ev && names) {
    if (n) memcpy(ev, t->ev, n * sizeof *ev);
    if (nn) memcpy(names, t->names, nn * sizeof *names);
  }
  size_t dropped = t->dropped;
  pthread_mutex_unlock(&t->mu);
  int rc = 0;
  tsr_atomic_file af;
  if (!ev || !names) {
    rc = tsr_errf(err, errlen, TSR_ENOMEM, "out of memory writing %s", path);
    goto done;
  }
  qsort(ev, n, sizeof *ev, by_ts);
  if ((rc = tsr_atomic_open(&af, path, err, errlen))) goto done;
  FILE *f = af.f;
  fputs("{\"displayTimeUnit\": \"ms\",\n", f);
  fprintf(f, "\"otherData\": {\"dropped_events\": %zu},\n", dropped);
  fputs("\"traceEvents\": [\n", f);
  const char *sep = "";
  for (size_t i = 0; i < nn; i++) {
    fprintf(f, "%s{\"ph\": \"M\", \"name\": \"%s\", \"pid\": %d", sep,
            names[i].tid < 0 ? "process_name" : "thread_name", names[i].pid);
    if (names[i].tid >= 0) fprintf(f, ", \"tid\": %d", names[i].tid);
    fputs(", \"args\": {\"name\": ", f);
    put_str(f, names[i].name);
    fputs("}}", f);
    sep = ",\n";
  }
  for (size_t i = 0; i < n; i++) {
    fprintf(f, "%s{\"ph\": \"X\", \"name\": ", sep);
    put_str(f, ev[i].name);
    fputs(", \"cat\": ", f);
    put_str(f, ev[i].cat);
    fprintf(f, ", \"pid\": %d, \"tid\": %d, \"ts\": %lld, \"dur\": %lld}",
            ev[i].pid, ev[i].tid, (long long)ev[i].ts_us,
            (long long)ev[i].dur_us);
    sep = ",\n";
  }
  fputs("\n]}\n", f);
  rc = tsr_atomic_commit(&af, err, errlen);
done:
  free(ev);
  free(names);
  return rc;
}

int tsr_trace_merge_files(const char *const *inputs, size_t n,
                          const char *out, char *err, size_t errlen) {
  json_t *all = json_array();
  json_t *root = json_object();
  int rc = 0;
  if (!all || !root) {
    rc = TSR_ENOMEM;
    goto done;
  }
  for (size_t i = 0; i < n; i++) {
    json_error_t je;
    json_t *doc = json_load_file(inputs[i], 0, &je);
    if (!doc) {
      snprintf(err, errlen, "%s:%d: not JSON: %s", inputs[i], je.line,
               je.text);
      rc = TSR_EJSON;
      goto done;
    }
    json_t *evs = json_is_array(doc) ? doc
                                     : json_object_get(doc, "traceEvents");
    if (!json_is_array(evs)) {
      snprintf(err, errlen, "%s: no \"traceEvents\" array: not a trace file",
               inputs[i]);
      json_decref(doc);
      rc = TSR_EFORMAT;
      goto done;
    }
    json_array_extend(all, evs);
    json_decref(doc);
  }
  json_object_set_new(root, "displayTimeUnit", json_string("ms"));
  json_object_set(root, "traceEvents", all);
  tsr_atomic_file af;
  if ((rc = tsr_atomic_open(&af, out, err, errlen))) goto done;
  if (json_dumpf(root, af.f, JSON_COMPACT) != 0) {
    tsr_atomic_abort(&af);
    rc = tsr_errf(err, errlen, TSR_EIO, "cannot write %s", out);
    goto done;
  }
  rc = tsr_atomic_commit(&af, err, errlen);
done:
  json_decref(all);
  json_decref(root);
  return rc;
}
