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
#include "artifacts/monitor/monitor.h"
#include "artifacts/monitor/monitor_int.h"
#include "common/clock.h"
#include "common/crc32c.h"
#include "common/err.h"
#include "common/histo.h"
#include "event.pb-c.h"
#include "hparams.pb-c.h"

#include <math.h>

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
  int rc = tsr_mkdir_p(logdir, 0777, err, errlen);
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

/* One Summary.Value in an Event at `step`. */
static int append_value(chief_tb *tb, Tensorflow__Summary__Value *v,
                        int64_t step, double wall_time) {
  Tensorflow__Summary sum = TENSORFLOW__SUMMARY__INIT;
  sum.n_value = 1;
  sum.value = &v;
  Tensorflow__Event ev = TENSORFLOW__EVENT__INIT;
  ev.wall_time = wall_time > 0 ? wall_time : tsr_wall_s();
  ev.step = step;
  ev.what_case = TENSORFLOW__EVENT__WHAT_SUMMARY;
  ev.summary = &sum;
  return append_event(tb, &ev);
}

/* A tensor value with its plugin metadata. */
static int append_tensor(chief_tb *tb, const char *tag,
                         Tensorflow__SummaryMetadata *md,
                         Tensorflow__TensorProto *t, int64_t step,
                         double wall_time) {
  Tensorflow__Summary__Value v = TENSORFLOW__SUMMARY__VALUE__INIT;
  v.tag = (char *)tag;
  v.metadata = md;
  v.value_case = TENSORFLOW__SUMMARY__VALUE__VALUE_TENSOR;
  v.tensor = t;
  return append_value(tb, &v, step, wall_time);
}

int chief_tb_scalar(chief_tb *tb, const char *tag, int64_t step, double value,
                    double wall_time) {
  Tensorflow__Summary__Value v = TENSORFLOW__SUMMARY__VALUE__INIT;
  v.tag = (char *)tag;
  v.value_case = TENSORFLOW__SUMMARY__VALUE__VALUE_SIMPLE_VALUE;
  v.simple_value = (float)value;
  return append_value(tb, &v, step, wall_time);
}

int chief_tb_histogram_counts(chief_tb *tb, const char *tag, int64_t step,
                              double min, double max, double num, double sum,
                              double sum_squares, const double *bucket_limit,
                              const double *bucket, size_t n_buckets,
                              double wall_time) {
  Tensorflow__HistogramProto h = TENSORFLOW__HISTOGRAM_PROTO__INIT;
  h.min = min;
  h.max = max;
  h.num = num;
  h.sum = sum;
  h.sum_squares = sum_squares;
  h.n_bucket_limit = n_buckets;
  h.bucket_limit = (double *)bucket_limit;
  h.n_bucket = n_buckets;
  h.bucket = (double *)bucket;
  Tensorflow__Summary__Value v = TENSORFLOW__SUMMARY__VALUE__INIT;
  v.tag = (char *)tag;
  v.value_case = TENSORFLOW__SUMMARY__VALUE__VALUE_HISTO;
  v.histo = &h;
  return append_value(tb, &v, step, wall_time);
}

int chief_tb_histogram(chief_tb *tb, const char *tag, int64_t step,
                       const float *x, size_t n, int buckets,
                       double wall_time) {
  tsr_histo h;
  tsr_histo_fill(x, n, buckets, &h);
  return chief_tb_histogram_counts(tb, tag, step, h.min, h.max, h.num, h.sum,
                                   h.sum_squares, h.limit, h.count,
                                   (size_t)h.n_buckets, wall_time);
}

int chief_tb_text(chief_tb *tb, const char *tag, int64_t step,
                  const char *text, double wall_time) {
  Tensorflow__SummaryMetadata__PluginData pd =
      TENSORFLOW__SUMMARY_METADATA__PLUGIN_DATA__INIT;
  pd.plugin_name = (char *)"text";
  Tensorflow__SummaryMetadata md = TENSORFLOW__SUMMARY_METADATA__INIT;
  md.plugin_data = &pd;
  Tensorflow__TensorShapeProto shape = TENSORFLOW__TENSOR_SHAPE_PROTO__INIT;
  Tensorflow__TensorProto t = TENSORFLOW__TENSOR_PROTO__INIT;
  t.dtype = 7; /* DT_STRING, a scalar */
  t.tensor_shape = &shape;
  ProtobufCBinaryData str = {strlen(text), (uint8_t *)text};
  t.n_string_val = 1;
  t.string_val = &str;
  return append_tensor(tb, tag, &md, &t, step, wall_time);
}

/* One hparams record: the plugin data packed into the summary metadata,
 * with the empty float tensor the plugin's writer attaches. */
static int hp_record(chief_tb *tb, const char *tag,
                     const Tensorboard__HParamsPluginData *d,
                     double wall_time) {
  size_t len = tensorboard__hparams_plugin_data__get_packed_size(d);
  uint8_t *buf = malloc(len ? len : 1);
  if (!buf) return TSR_ENOMEM;
  tensorboard__hparams_plugin_data__pack(d, buf);
  Tensorflow__SummaryMetadata__PluginData pd =
      TENSORFLOW__SUMMARY_METADATA__PLUGIN_DATA__INIT;
  pd.plugin_name = (char *)"hparams";
  pd.content.len = len;
  pd.content.data = buf;
  Tensorflow__SummaryMetadata md = TENSORFLOW__SUMMARY_METADATA__INIT;
  md.plugin_data = &pd;
  Tensorflow__TensorShapeProto__Dim dim = TENSORFLOW__TENSOR_SHAPE_PROTO__DIM__INIT;
  Tensorflow__TensorShapeProto__Dim *dp = &dim;
  Tensorflow__TensorShapeProto shape = TENSORFLOW__TENSOR_SHAPE_PROTO__INIT;
  shape.n_dim = 1;
  shape.dim = &dp;
  Tensorflow__TensorProto t = TENSORFLOW__TENSOR_PROTO__INIT;
  t.dtype = 1; /* DT_FLOAT, shape [0] */
  t.tensor_shape = &shape;
  int rc = append_tensor(tb, tag, &md, &t, 0, wall_time);
  free(buf);
  return rc;
}

#define CHIEF__MAX_HP 64

int chief_tb_hparams(chief_tb *tb, const char *const *names,
                     const double *values, const char *const *str, int n,
                     const char *const *metrics, int n_metrics,
                     double wall_time) {
  if (n > CHIEF__MAX_HP) n = CHIEF__MAX_HP;
  if (n_metrics > CHIEF__MAX_HP) n_metrics = CHIEF__MAX_HP;
  double now = wall_time > 0 ? wall_time : tsr_wall_s();
  Tensorboard__HParamInfo info[CHIEF__MAX_HP], *infop[CHIEF__MAX_HP];
  Tensorboard__MetricInfo mi[CHIEF__MAX_HP], *mip[CHIEF__MAX_HP];
  Tensorboard__MetricName mn[CHIEF__MAX_HP];
  Tensorboard__SessionStartInfo__HparamsEntry ent[CHIEF__MAX_HP],
      *entp[CHIEF__MAX_HP];
  Tensorboard__Value val[CHIEF__MAX_HP];
  char groups[CHIEF__MAX_HP][32];
  for (int i = 0; i < n; i++) {
    tensorboard__hparam_info__init(&info[i]);
    info[i].name = (char *)names[i];
    info[i].type = str && str[i] ? 1 : 3;
    infop[i] = &info[i];
    tensorboard__value__init(&val[i]);
    if (str && str[i]) {
      val[i].kind_case = TENSORBOARD__VALUE__KIND_STRING_VALUE;
      val[i].string_value = (char *)str[i];
    } else {
      val[i].kind_case = TENSORBOARD__VALUE__KIND_NUMBER_VALUE;
      val[i].number_value = values[i];
    }
    tensorboard__session_start_info__hparams_entry__init(&ent[i]);
    ent[i].key = (char *)names[i];
    ent[i].value = &val[i];
    entp[i] = &ent[i];
  }
  for (int i = 0; i < n_metrics; i++) {
    /* "validation/epoch_loss": group "validation", tag "epoch_loss" */
    const char *slash = strchr(metrics[i], '/');
    size_t gl = slash ? (size_t)(slash - metrics[i]) : 0;
    if (gl >= sizeof groups[i]) gl = sizeof groups[i] - 1;
    memcpy(groups[i], metrics[i], gl);
    groups[i][gl] = 0;
    tensorboard__metric_name__init(&mn[i]);
    mn[i].group = groups[i];
    mn[i].tag = (char *)(slash ? slash + 1 : metrics[i]);
    tensorboard__metric_info__init(&mi[i]);
    mi[i].name = &mn[i];
    mi[i].dataset_type = !strcmp(groups[i], "train") ? 1
                         : !strcmp(groups[i], "validation") ? 2 : 0;
    mip[i] = &mi[i];
  }
  Tensorboard__Experiment ex = TENSORBOARD__EXPERIMENT__INIT;
  ex.time_created_secs = now;
  ex.n_hparam_infos = (size_t)n;
  ex.hparam_infos = infop;
  ex.n_metric_infos = (size_t)n_metrics;
  ex.metric_infos = mip;
  Tensorboard__HParamsPluginData d = TENSORBOARD__HPARAMS_PLUGIN_DATA__INIT;
  d.data_case = TENSORBOARD__HPARAMS_PLUGIN_DATA__DATA_EXPERIMENT;
  d.experiment = &ex;
  int rc = hp_record(tb, "_hparams_/experiment", &d, now);
  if (rc) return rc;
  Tensorboard__SessionStartInfo ss = TENSORBOARD__SESSION_START_INFO__INIT;
  ss.n_hparams = (size_t)n;
  ss.hparams = entp;
  ss.start_time_secs = now;
  d.data_case = TENSORBOARD__HPARAMS_PLUGIN_DATA__DATA_SESSION_START_INFO;
  d.session_start_info = &ss;
  return hp_record(tb, "_hparams_/session_start_info", &d, now);
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
