/* Chrome trace-event recording (--trace FILE), for Perfetto or
 * chrome://tracing.
 *
 * Each process records complete events ("ph": "X": name, cat, pid, tid,
 * ts, dur) for its phases: a worker's input wait, pull, compute and push,
 * a PS's applies. Appending is thread-safe and cheap (a mutex and a copy
 * into a bounded array); when the array is full new events are dropped and
 * counted rather than growing without limit. Events can be drained in
 * batches (to send to the chief) and appended to another recorder, or
 * whole files merged, so one trace shows every process of the cluster.
 *
 * Timestamps are wall-clock microseconds since the epoch, so the events of
 * processes on different hosts line up as well as their clocks do. Process
 * ids are the task's (tsr_trace_pid), not the OS pid, so a restarted
 * worker stays on the same track.
 */
#ifndef TSR_TRACE_H
#define TSR_TRACE_H

#include <stddef.h>
#include <stdint.h>

#define TSR_TRACE_NAME_MAX 32
#define TSR_TRACE_CAT_MAX 16

typedef struct {
  char name[TSR_TRACE_NAME_MAX];  /* NUL-terminated, truncated if longer */
  char cat[TSR_TRACE_CAT_MAX];
  int32_t pid, tid;
  int64_t ts_us;   /* start, wall-clock microseconds since the epoch */
  int64_t dur_us;  /* >= 0 */
} tsr_trace_event;

typedef struct tsr_trace tsr_trace;

/* `max_events` 0: 262144 (about 20 MB). */
int tsr_trace_create(tsr_trace **out, size_t max_events);
void tsr_trace_free(tsr_trace *t);

/* Track ids: chief 1, worker I 1000+I, ps I 2000+I, evaluator 3000+I
 * (task types as in common/cluster.h: 0 chief, 1 worker, 2 ps, 3
 * evaluator). */
int32_t tsr_trace_pid(int task_type, int index);

/* Wall-clock microseconds now, the clock ts_us is measured on. */
int64_t tsr_trace_now_us(void);

/* Labels a track in the viewer ("worker:0", "pull thread"). The last call
 * for a pid (or pid, tid) wins. Thread-safe. */
int tsr_trace_name_process(tsr_trace *t, int32_t pid, const char *name);
int tsr_trace_name_thread(tsr_trace *t, int32_t pid, int32_t tid,
                          const char *name);

/* Records one complete event. Thread-safe. Returns TSR_EBUSY when the
 * recorder is full (the event is dropped and counted). */
int tsr_trace_complete(tsr_trace *t, int32_t pid, int32_t tid,
                       const char *cat, const char *name, int64_t ts_us,
                       int64_t dur_us);

/* Records an event that began at `start_us` (tsr_trace_now_us()) and ends
 * now: the usual way to time a phase. Thread-safe; as complete(). */
int tsr_trace_end(tsr_trace *t, int32_t pid, int32_t tid, const char *cat,
                  const char *name, int64_t start_us);

/* Moves up to `max` of the oldest events into `out` and removes them from
 * the recorder; returns how many. Thread-safe. */
size_t tsr_trace_drain(tsr_trace *t, tsr_trace_event *out, size_t max);

/* Appends events recorded elsewhere (the merge step on the chief). Events
 * over the limit are dropped and counted; returns TSR_EBUSY then. */
int tsr_trace_append(tsr_trace *t, const tsr_trace_event *ev, size_t n);

/* Wire form of events, for a worker or PS to send its drained events to
 * the chief (e.g. as the raw payload of an RPC): TSR_TRACE_WIRE_SIZE bytes
 * per event, little-endian: name[32], cat[16], pid i32, tid i32, ts i64,
 * dur i64. `out` holds n * TSR_TRACE_WIRE_SIZE bytes. */
#define TSR_TRACE_WIRE_SIZE 72
void tsr_trace_pack(const tsr_trace_event *ev, size_t n, uint8_t *out);
/* Decodes `len` bytes into at most `max` events (`*n` set). A length that
 * is not a whole number of events, a name or category without its NUL, or
 * a negative duration is TSR_ECORRUPT, nothing decoded; more events than
 * `max` is TSR_ETOOBIG. */
int tsr_trace_unpack(const uint8_t *data, size_t len, tsr_trace_event *out,
                     size_t max, size_t *n);

size_t tsr_trace_count(tsr_trace *t);
size_t tsr_trace_dropped(tsr_trace *t);

/* Writes {"traceEvents": [...], "displayTimeUnit": "ms"} with the track
 * names as metadata events and the events in time order, through a temp
 * file and rename(). The recorder keeps its events. */
int tsr_trace_write(tsr_trace *t, const char *path, char *err, size_t errlen);

/* Merges trace files (each an object with "traceEvents", or a bare array)
 * into one file at `out`. A file that is not a trace is an error naming
 * it. */
int tsr_trace_merge_files(const char *const *inputs, size_t n,
                          const char *out, char *err, size_t errlen);

#endif /* TSR_TRACE_H */
