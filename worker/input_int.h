/* Internals of the input pipeline, shared by its files (input*.c,
 * read_*.c, synth*.c). Not a public interface.
 *
 * Shape of the pipeline: the data spec (input_spec.c) says what to read;
 * a source (one per format) produces records, either by row number
 * (in-memory tables and the synthetic generators: shuffling then permutes
 * row numbers, never row copies) or as a stream (TFRecord: shuffling keeps
 * copies of the serialized records, each decoded straight into its batch
 * row when drawn); input.c applies scale/normalization,
 * shuffles, batches and prefetches on a reader thread.
 */
#ifndef TSR_WK_INPUT_INT_H
#define TSR_WK_INPUT_INT_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "worker/input.h"
#include "common/err.h"

typedef enum {
  WK_FMT_CSV = 0,
  WK_FMT_NPY,
  WK_FMT_NPZ,
  WK_FMT_IDX,
  WK_FMT_TFRECORD,
  WK_FMT_SYNTHETIC,
  WK_FMT_SYNTHETIC_CTR
} wk_fmt;

typedef enum {
  WK_SHARD_AUTO = 0,
  WK_SHARD_FILE,
  WK_SHARD_DATA,
  WK_SHARD_OFF
} wk_shard_policy;

/* How a TFRecord bytes_list feature becomes floats (decode.c). */
typedef enum {
  WK_DECODE_NONE = 0,    /* a float_list (or int64_list, as floats) */
  WK_DECODE_RAW_U8,      /* bytes of uint8, one value each */
  WK_DECODE_RAW_F32,     /* bytes of little-endian float32 */
  WK_DECODE_PNG,
  WK_DECODE_JPEG,
  WK_DECODE_IMAGE        /* PNG or JPEG, told apart by their magic */
} wk_decode;

/* A dense feature of a TFRecord Example: `size` floats per example. */
typedef struct {
  char *name;
  int64_t size;
  wk_decode decode;
} wk_dense_feat;

/* Decodes one bytes value of feature `name` into `size` floats: raw bytes
 * (the size must match) or an image (PNG/JPEG, HxWxC row-major as Keras
 * reads tf.io.decode_image: gray when size is H*W, RGB when H*W*3; its
 * values 0..255). TSR_ESHAPE / TSR_EFORMAT with `err` saying why. */
int wk_decode__bytes(wk_decode d, const uint8_t *p, size_t len, float *out,
                     int64_t size, char *err, size_t errlen);
const char *wk_decode__name(wk_decode d);

/* A sparse feature: an int64 id list per example, ids in [0, vocab). */
typedef struct {
  char *name;
  int64_t vocab; /* 0: unbounded */
} wk_sparse_feat;

/* One split's data spec after validation; paths are resolved against the
 * job file's folder. */
typedef struct {
  char where[24];         /* "data.train" / "data.eval", for messages */
  wk_fmt format;
  char **paths;
  int n_paths;
  char **labels;          /* npy / idx: label files, parallel to paths */
  int n_labels;
  char *label;            /* csv column, tfrecord feature, npz member */
  char delimiter;         /* csv: the cell separator (default ',') */
  char *features_member;  /* npz member holding the features */
  wk_dense_feat *dense;   /* csv / tfrecord dense features; NULL: all but label (csv) */
  int n_dense;
  wk_sparse_feat *sparse;
  int n_sparse;
  wk_shard_policy shard;
  int64_t shuffle_buffer;  /* -1: the default (input.c: the whole share
                              when it fits WK_SHUFFLE_BUDGET, train only) */
  int prefetch;
  bool normalize;
  double scale;
  int drop_remainder;     /* -1: take opts */
  int64_t epochs;         /* -2: take opts; -1: forever */
  bool has_seed;
  uint64_t seed;
  int split_k;            /* 0: no every-k-th cut */
  int split_index;
  bool split_keep;        /* keep rows with i % k == index (eval) or the others (train) */
  bool skip_corrupt;
  int64_t n_classes;      /* 0: from the loss and the labels */
  /* synthetic generators */
  int64_t n;              /* examples per epoch */
  int64_t syn_dense;      /* dense features */
  int syn_sparse;         /* sparse features (ctr) */
  int64_t *syn_vocab;     /* syn_sparse vocabulary sizes */
  double noise;           /* regression noise stddev */
  double zipf;            /* Zipf exponent of the ids */
  int ids_per_feature;
  double positive_rate;
  uint64_t data_seed;     /* the hidden model and the examples */
  int syn_stream;         /* 0 train, 1 eval: different examples, same model */
} wk_input_spec;

void wk_input__spec_free(wk_input_spec *s);

/* Validates job->data and fills the spec of one split (the eval spec
 * inherits the data description from the train spec). The train spec also
 * learns the eval's every-k-th cut so that it leaves those rows out. */
int wk_input__spec_parse(const tsr_job *job, wk_split split,
                         wk_input_spec *out, char *err, size_t errlen);

/* Which records belong to this reader: the split cut (row index within its
 * file) and the worker's shard. */
typedef struct {
  int split_k, split_index;
  bool split_keep;
  wk_shard_policy policy; /* resolved: FILE, DATA or OFF */
  int W, w;
} wk_sel;

/* Resolves AUTO for `n_files` files; fails when file sharding leaves a
 * worker without files. */
int wk_sel__resolve(wk_sel *sel, wk_shard_policy asked, int n_files,
                    char *err, size_t errlen);
static inline bool wk_sel__split_ok(const wk_sel *s, int64_t i) {
  if (s->split_k <= 0) return true;
  return ((i % s->split_k) == s->split_index) == s->split_keep;
}
static inline bool wk_sel__file_ok(const wk_sel *s, int f) {
  return s->policy != WK_SHARD_FILE || (f % s->W) == s->w;
}
static inline bool wk_sel__data_ok(const wk_sel *s, int64_t pos) {
  return s->policy != WK_SHARD_DATA || (pos % s->W) == s->w;
}

/* One example on its way through the pipeline. */
typedef struct {
  float *x;        /* n_dense */
  float y;
  int64_t *ids;    /* ids of all sparse features, concatenated */
  int64_t *off;    /* n_sparse + 1 offsets into ids */
  size_t ids_cap;
} wk_rec;

int wk_rec__init(wk_rec *r, int64_t n_dense, int n_sparse);
void wk_rec__free(wk_rec *r);
/* Makes room for `more` ids after off[f]; may move r->ids. */
int wk_rec__reserve(wk_rec *r, size_t more);
int wk_rec__copy(wk_rec *dst, const wk_rec *src, int64_t n_dense,
                 int n_sparse);

/* Memory the default shuffle buffer of a streamed split may take. */
#define WK_SHUFFLE_BUDGET ((int64_t)256 << 20)
#define WK_SHUFFLE_MAX ((int64_t)1 << 20)   /* and at most this many records */

/* A serialized record of a streaming source, and where it came from. */
typedef struct {
  const uint8_t *p;
  size_t n;
  int file;
  uint64_t off;
} wk_raw;

/* One row of a batch being filled: dense values at x, the label at *y,
 * sparse feature f's ids in column ids[f] from offs[f][row] (offs[f][row
 * + 1] set past them). grow(ctx, f, need) makes column f hold `need` ids
 * (0 or TSR_ENOMEM; it may move ids[f] and raises ids_cap[f]). */
typedef struct {
  float *x, *y;
  int64_t **ids;
  int64_t **offs;
  size_t *ids_cap;
  int64_t row;
  int (*grow)(void *ctx, int f, size_t need);
  void *ctx;
} wk_row;

typedef struct wk_src wk_src;
typedef struct {
  /* Random-access sources: fills `r` with row `row` (an entry of rows[]). */
  int (*get)(wk_src *s, int64_t row, wk_rec *r, char *err, size_t errlen);
  /* Optional, for sources without sparse features: writes row `row`'s
   * dense features as x * xa + xb (a plain copy when xa is NULL) and its
   * label straight into the batch. */
  void (*get_dense)(wk_src *s, int64_t row, const float *xa, const float *xb,
                    float *x, float *y);
  /* Optional hint: row `row` is wanted soon. */
  void (*prefetch)(wk_src *s, int64_t row);
  /* Streaming sources: starts a pass, then records until TSR_EEOF:
   * decoded (next: for the training statistics), or serialized (next_raw:
   * the bytes, valid until the next call on the source, and where they
   * came from) for the pipeline to shuffle and then decode straight into
   * a batch row (decode_raw, whose messages name that file and offset). */
  int (*begin)(wk_src *s, char *err, size_t errlen);
  int (*next)(wk_src *s, wk_rec *r, char *err, size_t errlen);
  int (*next_raw)(wk_src *s, wk_raw *r, char *err, size_t errlen);
  int (*decode_raw)(wk_src *s, const wk_raw *r, const wk_row *o, char *err,
                    size_t errlen);
  /* Optional, in-memory sources: checks every example of the split (not
   * only this share): finite values, labels in [0, n_classes) when
   * n_classes > 0; the message names the file, line and column. */
  int (*validate)(wk_src *s, int64_t n_classes, char *err, size_t errlen);
  void (*destroy)(wk_src *s);
} wk_src_ops;

struct wk_src {
  const wk_src_ops *ops;
  int64_t n_dense;
  int n_sparse;
  char **dense_names;     /* n_dense names or NULL */
  char **sparse_names;
  int64_t *vocab;
  int64_t *rows;          /* random access: this share's rows; NULL: stream */
  int64_t n_rows;
  int64_t n_total;        /* examples in the split (all workers), -1 unknown */
  bool labels_integral;   /* every label seen at open is an integer >= 0 */
  double label_max;
  double best_auc;        /* synthetic_ctr: the hidden model's AUC; NAN else */
  int64_t skipped;        /* corrupt records skipped (atomic: read live) */
  int64_t raw_bytes;      /* stream: the first record's serialized size,
                             for the shuffle buffer's budget; 0 unknown */
};

/* Opens the source of a spec for the given selection. */
int wk_src__open(const wk_input_spec *spec, const wk_sel *sel, wk_src **out,
                 char *err, size_t errlen);
void wk_src__close(wk_src *s);

/* In-memory table: what CSV, npy/npz and IDX readers load. */
typedef struct {
  int64_t n, d;
  float *x;               /* n*d, or NULL when xu8 holds the values */
  uint8_t *xu8;
  float *y;               /* n */
  int n_files;
  int64_t *file_start;    /* n_files + 1 */
  char **names;           /* d feature names, or NULL */
} wk_table;

void wk_table__free(wk_table *t);
/* Appends `part` (one file's rows) to `t` and frees `part`'s arrays. */
int wk_table__append(wk_table *t, wk_table *part, const char *what,
                     char *err, size_t errlen);
/* A random-access source over a table (takes ownership of `t`). */
int wk_table__src(wk_table *t, const wk_sel *sel, wk_src **out, char *err,
                  size_t errlen);

/* Readers: one file (or file pair) into a table. */
int wk_read__csv(const char *path, const wk_input_spec *spec, wk_table *out,
                 char *err, size_t errlen);
int wk_read__npy(const char *xpath, const char *ypath, wk_table *out,
                 char *err, size_t errlen);
int wk_read__npz(const char *path, const char *xmember, const char *ymember,
                 wk_table *out, char *err, size_t errlen);
int wk_read__idx(const char *images, const char *labels, wk_table *out,
                 char *err, size_t errlen);
int wk_read__tfrecord_src(const wk_input_spec *spec, const wk_sel *sel,
                          wk_src **out, char *err, size_t errlen);
int wk_synth__src(const wk_input_spec *spec, const wk_sel *sel, wk_src **out,
                  char *err, size_t errlen);

/* Whole file into memory, gunzipped when it starts with the gzip magic.
 * Errors name the file. */
int wk_read__slurp(const char *path, uint8_t **buf, size_t *len, char *err,
                   size_t errlen);

/* splitmix64: the counter-based generator of shuffles and synthetic data. */
static inline uint64_t wk_mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
static inline uint64_t wk_rng_next(uint64_t *state) {
  *state += 0x9e3779b97f4a7c15ull;
  uint64_t z = *state;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
/* Uniform in [0, n) without modulo bias worth caring about (n < 2^32). */
static inline uint64_t wk_rng_below(uint64_t *state, uint64_t n) {
  return (uint64_t)(((unsigned __int128)wk_rng_next(state) * n) >> 64);
}
static inline double wk_rng_unit(uint64_t *state) {
  return (double)(wk_rng_next(state) >> 11) * (1.0 / 9007199254740992.0);
}

#endif
