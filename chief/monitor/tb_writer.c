/* TensorBoard event file writer.
 *
 * Happy path: open creates logdir, names the file
 * events.out.tfevents.<secs>.<host> as TensorFlow does, and writes the
 * file_version record at once so TensorBoard recognises the file even if
 * nothing else arrives. Each scalar is packed with protobuf-c into an
 * Event, framed as a TFRecord (length, masked CRC32C of the length, data,
 * masked CRC32C of the data) and buffered; the buffer goes to the file when
 * it holds max_pending records or its oldest record is flush_ms old.
 * Failure modes: an unwritable logdir fails open with the path named; a
 * write error is kept and returned by every later call and by close, so
 * the caller can log it once and carry on training.
 */
#include "chief/monitor/monitor.h"
#include "chief/monitor/monitor_int.h"
#include "common/clock.h"
#include "common/crc32c.h"
#include "common/err.h"
#include "event.pb-c.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct chief_tb {
  FILE *f;
  char *path;
  chief__buf pending;
  int n_pending;
  int max_pending;
  uint64_t flush_ms;
  uint64_t oldest_ms; /* monotonic time of the first buffered record */
  int error;          /* first write error, sticky */
};

static void put_le64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put_le32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

void chief_tb_frame(const void *data, size_t len, uint8_t *hdr12,
                    uint8_t *ftr4) {
  put_le64(hdr12, (uint64_t)len);
  put_le32(hdr12 + 8, tsr_crc32c_mask(tsr_crc32c(0, hdr12, 8)));
  put_le32(ftr4, tsr_crc32c_mask(tsr_crc32c(0, data, len)));
}

static int write_pending(chief_tb *tb) {
  if (tb->error) return tb->error;
  if (tb->pending.oom) {
    tb->error = TSR_ENOMEM;
    return tb->error;
  }
  if (tb->pending.len > 0 &&
      fwrite(tb->pending.p, 1, tb->pending.len, tb->f) != tb->pending.len)
    tb->error = errno ? -errno : TSR_EIO;
  if (!tb->error && fflush(tb->f) != 0) tb->error = errno ? -errno : TSR_EIO;
  tb->pending.len = 0;
  tb->n_pending = 0;
  return tb->error;
}

static int append_event(chief_tb *tb, const Tensorflow__Event *ev) {
  if (tb->error) return tb->error;
  size_t len = tensorflow__event__get_packed_size(ev);
  uint8_t stack[512];
  uint8_t *data = len <= sizeof stack ? stack : malloc(len);
  if (!data) return TSR_ENOMEM;
  tensorflow__event__pack(ev, data);
  uint8_t hdr[12], ftr[4];
  chief_tb_frame(data, len, hdr, ftr);
  chief__buf_put(&tb->pending, hdr, sizeof hdr);
  chief__buf_put(&tb->pending, data, len);
  chief__buf_put(&tb->pending, ftr, sizeof ftr);
  if (data != stack) free(data);
  uint64_t now = tsr_now_ms();
  if (tb->n_pending++ == 0) tb->oldest_ms = now;
  if (tb->pending.oom || tb->n_pending >= tb->max_pending ||
      now - tb->oldest_ms >= tb->flush_ms)
    return write_pending(tb);
  return 0;
}

int chief_tb_open(chief_tb **out, const char *logdir,
                  const chief_tb_opts *opts, char *err, size_t errlen) {
  chief_tb_opts o = {0};
  if (opts) o = *opts;
  if (o.max_pending <= 0) o.max_pending = 64;
  if (o.flush_ms == 0) o.flush_ms = 2000;
  double wall = o.wall_time > 0 ? o.wall_time : tsr_wall_s();
  char host[256];
  if (o.host) {
    snprintf(host, sizeof host, "%s", o.host);
  } else if (gethostname(host, sizeof host) != 0) {
    snprintf(host, sizeof host, "localhost");
  }
  host[sizeof host - 1] = '\0';
  int rc = chief__mkdir_p(logdir, err, errlen);
  if (rc) return rc;

  chief_tb *tb = calloc(1, sizeof *tb);
  if (!tb) return TSR_ENOMEM;
  tb->max_pending = o.max_pending;
  tb->flush_ms = o.flush_ms;
  size_t plen = strlen(logdir) + strlen(host) + 64;
  tb->path = malloc(plen);
  if (!tb->path) {
    rc = TSR_ENOMEM;
    goto fail;
  }
  /* "x": never append to an event file of another run; a second file in
   * the same second gets a numeric suffix (TensorBoard reads any name
   * containing "tfevents"). */
  for (int k = 0; k < 100; k++) {
    int n = snprintf(tb->path, plen, "%s/events.out.tfevents.%lld.%s", logdir,
                     (long long)wall, host);
    if (k > 0) snprintf(tb->path + n, plen - (size_t)n, ".%d", k);
    tb->f = fopen(tb->path, "wxe");
    if (tb->f || errno != EEXIST) break;
  }
  if (!tb->f) {
    rc = -errno;
    snprintf(err, errlen, "cannot create event file %s: %s", tb->path,
             strerror(errno));
    goto fail;
  }
  Tensorflow__Event ev = TENSORFLOW__EVENT__INIT;
  ev.wall_time = wall;
  ev.what_case = TENSORFLOW__EVENT__WHAT_FILE_VERSION;
  ev.file_version = (char *)"brain.Event:2";
  rc = append_event(tb, &ev);
  if (!rc) rc = write_pending(tb);
  if (rc) {
    snprintf(err, errlen, "cannot write event file %s: %s", tb->path,
             tsr_strerror(rc));
    goto fail;
  }
  *out = tb;
  return 0;
fail:
  if (tb->f) {
    fclose(tb->f);
    unlink(tb->path);
  }
  chief__buf_free(&tb->pending);
  free(tb->path);
  free(tb);
  return rc;
}

int chief_tb_scalar(chief_tb *tb, const char *tag, int64_t step, double value,
                    double wall_time) {
  Tensorflow__Summary__Value v = TENSORFLOW__SUMMARY__VALUE__INIT;
  v.tag = (char *)tag;
  v.value_case = TENSORFLOW__SUMMARY__VALUE__VALUE_SIMPLE_VALUE;
  v.simple_value = (float)value;
  Tensorflow__Summary__Value *vp = &v;
  Tensorflow__Summary sum = TENSORFLOW__SUMMARY__INIT;
  sum.n_value = 1;
  sum.value = &vp;
  Tensorflow__Event ev = TENSORFLOW__EVENT__INIT;
  ev.wall_time = wall_time > 0 ? wall_time : tsr_wall_s();
  ev.step = step;
  ev.what_case = TENSORFLOW__EVENT__WHAT_SUMMARY;
  ev.summary = &sum;
  return append_event(tb, &ev);
}

int chief_tb_session_start(chief_tb *tb, int64_t step, double wall_time) {
  Tensorflow__SessionLog log = TENSORFLOW__SESSION_LOG__INIT;
  log.status = TENSORFLOW__SESSION_LOG__SESSION_STATUS__START;
  Tensorflow__Event ev = TENSORFLOW__EVENT__INIT;
  ev.wall_time = wall_time > 0 ? wall_time : tsr_wall_s();
  ev.step = step;
  ev.what_case = TENSORFLOW__EVENT__WHAT_SESSION_LOG;
  ev.session_log = &log;
  int rc = append_event(tb, &ev);
  return rc ? rc : write_pending(tb);
}

int chief_tb_flush(chief_tb *tb) { return write_pending(tb); }

int chief_tb_close(chief_tb *tb) {
  if (!tb) return 0;
  int rc = write_pending(tb);
  if (!rc && fsync(fileno(tb->f)) != 0) rc = -errno;
  if (fclose(tb->f) != 0 && !rc) rc = -errno;
  chief__buf_free(&tb->pending);
  free(tb->path);
  free(tb);
  return rc;
}

const char *chief_tb_path(const chief_tb *tb) { return tb->path; }
