/* The data spec: job.data.train / job.data.eval validated into
 * wk_input_spec.
 *
 * Happy path: look up the split's object, let eval inherit the data
 * description (format, paths, label, features, ...) from train, check
 * every key against the table below (an unknown key names its path and the
 * closest known key; a key the format does not use is an error too), and
 * resolve paths against the job file's folder.
 * Failure modes: wrong types, out-of-range values, a missing required key:
 * each error names the key with its full path and the value.
 */
#include "worker/input_int.h"

#include "common/conf.h"
#include "common/err.h"

#include <glob.h>
#include <libgen.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Bit per format, for "which formats use this key". */
#define F_CSV (1u << WK_FMT_CSV)
#define F_NPY (1u << WK_FMT_NPY)
#define F_NPZ (1u << WK_FMT_NPZ)
#define F_IDX (1u << WK_FMT_IDX)
#define F_TFR (1u << WK_FMT_TFRECORD)
#define F_SYN (1u << WK_FMT_SYNTHETIC)
#define F_CTR (1u << WK_FMT_SYNTHETIC_CTR)
#define F_FILES (F_CSV | F_NPY | F_NPZ | F_IDX | F_TFR)
#define F_ALL (F_FILES | F_SYN | F_CTR)

typedef struct {
  const char *key;
  unsigned formats;
  bool describes_data; /* inherited by eval from train */
} wk_key_info;

static const wk_key_info wk_keys[] = {
    {"format", F_ALL, true},
    {"paths", F_FILES, true},
    {"labels", F_NPY | F_IDX, true},
    {"label", F_CSV | F_NPZ | F_TFR, true},
    {"features", F_CSV | F_NPZ | F_TFR, true},
    {"sparse_features", F_TFR, true},
    {"scale", F_ALL, true},
    {"normalize", F_ALL, true},
    {"n_classes", F_ALL, true},
    {"n", F_SYN | F_CTR, true},
    {"dense", F_SYN | F_CTR, true},
    {"sparse", F_CTR, true},
    {"vocab", F_CTR, true},
    {"noise", F_SYN, true},
    {"zipf", F_CTR, true},
    {"ids_per_feature", F_CTR, true},
    {"positive_rate", F_CTR, true},
    {"data_seed", F_SYN | F_CTR, true},
    {"shard", F_ALL, false},
    {"shuffle_buffer", F_ALL, false},
    {"prefetch", F_ALL, false},
    {"drop_remainder", F_ALL, false},
    {"epochs", F_ALL, false},
    {"repeat", F_ALL, false},
    {"seed", F_ALL, false},
    {"skip_corrupt", F_TFR, false},
    {"delimiter", F_CSV, true},
    {"split", F_ALL, false},
    {"k", F_ALL, false},
    {"index", F_ALL, false},
};
#define WK_NKEYS (sizeof wk_keys / sizeof wk_keys[0])

static const char *const wk_fmt_names[] = {
    "csv", "npy", "npz", "idx", "tfrecord", "synthetic", "synthetic_ctr"};

static const wk_key_info *find_key(const char *k) {
  for (size_t i = 0; i < WK_NKEYS; i++)
    if (strcmp(wk_keys[i].key, k) == 0) return &wk_keys[i];
  return NULL;
}

static int check_keys(json_t *obj, const char *where, char *err,
                      size_t errlen) {
  const char *names[WK_NKEYS + 1];
  for (size_t i = 0; i < WK_NKEYS; i++) names[i] = wk_keys[i].key;
  names[WK_NKEYS] = NULL;
  return tsr_conf_check_keys(obj, where, names, NULL, err, errlen);
}

static char *resolve_path(const tsr_job *job, const char *p) {
  if (p[0] == '/' || !job->path) return strdup(p);
  char *copy = strdup(job->path);
  if (!copy) return NULL;
  const char *dir = dirname(copy);
  size_t n = strlen(dir) + strlen(p) + 2;
  char *out = malloc(n);
  if (out) snprintf(out, n, "%s/%s", dir, p);
  free(copy);
  return out;
}

static int push_path(char ***out, int *n, size_t *cap, char *p) {
  if (!p) return TSR_ENOMEM;
  if ((size_t)*n == *cap) {
    size_t nc = *cap ? *cap * 2 : 8;
    char **np = realloc(*out, nc * sizeof *np);
    if (!np) {
      free(p);
      return TSR_ENOMEM;
    }
    *out = np;
    *cap = nc;
  }
  (*out)[(*n)++] = p;
  return 0;
}

/* A string or a list of strings into resolved paths; an entry with * ? or
 * [ is a glob pattern (as tf.data.Dataset.list_files) expanded in sorted
 * order, and must match at least one file. */
static int get_paths(const tsr_job *job, json_t *v, const char *where,
                     const char *key, char ***out, int *n, char *err,
                     size_t errlen) {
  size_t cnt = json_is_string(v) ? 1 : json_is_array(v) ? json_array_size(v)
                                                        : 0;
  if (cnt == 0)
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "%s.%s must be a path or a non-empty list of paths",
                    where, key);
  size_t cap = 0;
  *out = NULL;
  *n = 0;
  for (size_t i = 0; i < cnt; i++) {
    json_t *e = json_is_string(v) ? v : json_array_get(v, i);
    if (!json_is_string(e) || !json_string_value(e)[0])
      return tsr_errf(err, errlen, TSR_ECONFIG,
                      "%s.%s[%zu] must be a non-empty string", where,
                      key, i);
    char *p = resolve_path(job, json_string_value(e));
    if (!p) return TSR_ENOMEM;
    if (!strpbrk(json_string_value(e), "*?[")) {
      int rc = push_path(out, n, &cap, p);
      if (rc) return rc;
      continue;
    }
    glob_t g;
    int gr = glob(p, 0, NULL, &g);
    free(p);
    if (gr != 0 || g.gl_pathc == 0) {
      if (gr == 0) globfree(&g);
      return tsr_errf(err, errlen, TSR_ENOTFOUND,
                      "%s.%s: \"%s\" matches no file", where, key,
                      json_string_value(e));
    }
    for (size_t k = 0; k < g.gl_pathc; k++) {
      int rc = push_path(out, n, &cap, strdup(g.gl_pathv[k]));
      if (rc) {
        globfree(&g);
        return rc;
      }
    }
    globfree(&g);
  }
  return 0;
}

static int get_int(json_t *o, const char *where, const char *key,
                   int64_t lo, int64_t hi, int64_t *out, char *err,
                   size_t errlen) {
  json_t *v = json_object_get(o, key);
  if (!v) return 0;
  if (!json_is_integer(v))
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "%s.%s must be an integer", where, key);
  json_int_t x = json_integer_value(v);
  if (x < lo || x > hi)
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "%s.%s: %lld is out of range [%lld, %lld]", where,
                    key, (long long)x, (long long)lo, (long long)hi);
  *out = x;
  return 0;
}

static int get_num(json_t *o, const char *where, const char *key, double lo,
                   double hi, double *out, char *err, size_t errlen) {
  json_t *v = json_object_get(o, key);
  if (!v) return 0;
  if (!json_is_number(v))
    return tsr_errf(err, errlen, TSR_ECONFIG, "%s.%s must be a number",
                    where, key);
  double x = json_number_value(v);
  if (!(x >= lo && x <= hi))
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "%s.%s: %g is out of range [%g, %g]", where, key, x,
                    lo, hi);
  *out = x;
  return 0;
}

static int get_bool(json_t *o, const char *where, const char *key, bool *out,
                    char *err, size_t errlen) {
  json_t *v = json_object_get(o, key);
  if (!v) return 0;
  if (!json_is_boolean(v))
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "%s.%s must be true or false", where, key);
  *out = json_is_true(v);
  return 0;
}

static int get_str(json_t *o, const char *where, const char *key, char **out,
                   char *err, size_t errlen) {
  json_t *v = json_object_get(o, key);
  if (!v) return 0;
  if (!json_is_string(v) || !json_string_value(v)[0])
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "%s.%s must be a non-empty string", where, key);
  free(*out);
  *out = strdup(json_string_value(v));
  return *out ? 0 : TSR_ENOMEM;
}

static int infer_format(const char *path, wk_fmt *f) {
  const char *base = strrchr(path, '/');
  base = base ? base + 1 : path;
  size_t n = strlen(base);
  if (n > 3 && strcmp(base + n - 3, ".gz") == 0) n -= 3;
  /* TFDS shards: "mnist-train.tfrecord-00000-of-00001" */
  const char *tf = strstr(base, ".tfrecord-");
  if (tf && strstr(tf, "-of-")) {
    *f = WK_FMT_TFRECORD;
    return 0;
  }
  struct { const char *ext; wk_fmt f; } tab[] = {
      {".csv", WK_FMT_CSV},       {".npy", WK_FMT_NPY},
      {".npz", WK_FMT_NPZ},       {".tfrecord", WK_FMT_TFRECORD},
      {".tfrecords", WK_FMT_TFRECORD}, {"-ubyte", WK_FMT_IDX}};
  for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++) {
    size_t e = strlen(tab[i].ext);
    if (n >= e && strncmp(base + n - e, tab[i].ext, e) == 0) {
      *f = tab[i].f;
      return 0;
    }
  }
  return -1;
}

static int parse_dense(json_t *v, wk_input_spec *s, char *err,
                       size_t errlen) {
  const char *w = s->where;
  if (json_is_string(v)) {
    if (s->format == WK_FMT_NPZ) {
      s->features_member = strdup(json_string_value(v));
      return s->features_member ? 0 : TSR_ENOMEM;
    }
    if (s->format == WK_FMT_CSV &&
        strcmp(json_string_value(v), "all but label") == 0)
      return 0;
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "%s.features: \"%s\" is neither a list of names "
                    "nor \"all but label\"",
                    w, json_string_value(v));
  }
  if (s->format == WK_FMT_NPZ)
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "%s.features: for npz, the name of the member "
                    "holding the features (a string)",
                    w);
  if (!json_is_array(v))
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "%s.features must be a list of feature names", w);
  size_t n = json_array_size(v);
  s->dense = calloc(n ? n : 1, sizeof *s->dense);
  if (!s->dense) return TSR_ENOMEM;
  s->n_dense = (int)n;
  for (size_t i = 0; i < n; i++) {
    json_t *e = json_array_get(v, i);
    json_t *name = e;
    int64_t size = 1;
    if (json_is_object(e) && s->format == WK_FMT_TFRECORD) {
      static const char *const keys[] = {"name", "size", "decode", NULL};
      char where2[64];
      snprintf(where2, sizeof where2, "%s.features[%zu]", w, i);
      int rc = tsr_conf_check_keys(e, where2, keys, NULL, err, errlen);
      if (rc) return rc;
      name = json_object_get(e, "name");
      rc = get_int(e, where2, "size", 1, 1 << 24, &size, err, errlen);
      if (rc) return rc;
      json_t *dec = json_object_get(e, "decode");
      if (dec) {
        const char *ds = json_string_value(dec);
        int k2 = -1;
        for (int d = WK_DECODE_RAW_U8; d <= WK_DECODE_IMAGE && ds; d++)
          if (!strcmp(ds, wk_decode__name((wk_decode)d))) k2 = d;
        if (k2 < 0)
          return tsr_errf(err, errlen, TSR_ECONFIG,
                          "%s.decode must be \"raw_uint8\", "
                          "\"raw_float32\", \"png\", \"jpeg\" or "
                          "\"image\" (a bytes_list feature)", where2);
        s->dense[i].decode = (wk_decode)k2;
      }
    }
    if (!json_is_string(name) || !json_string_value(name)[0])
      return tsr_errf(err, errlen, TSR_ECONFIG,
                      "%s.features[%zu] must be a feature name%s", w, i,
                      s->format == WK_FMT_TFRECORD
                          ? " or {\"name\": ..., \"size\": N}"
                          : "");
    s->dense[i].name = strdup(json_string_value(name));
    s->dense[i].size = size;
    if (!s->dense[i].name) return TSR_ENOMEM;
  }
  return 0;
}

static int parse_sparse(json_t *v, wk_input_spec *s, char *err,
                        size_t errlen) {
  const char *w = s->where;
  if (!json_is_array(v))
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "%s.sparse_features must be a list of names or "
                    "{\"name\": ..., \"vocab\": N}",
                    w);
  size_t n = json_array_size(v);
  s->sparse = calloc(n ? n : 1, sizeof *s->sparse);
  if (!s->sparse) return TSR_ENOMEM;
  s->n_sparse = (int)n;
  for (size_t i = 0; i < n; i++) {
    json_t *e = json_array_get(v, i), *name = e;
    int64_t vocab = 0;
    if (json_is_object(e)) {
      static const char *const keys[] = {"name", "vocab", NULL};
      char where2[64];
      snprintf(where2, sizeof where2, "%s.sparse_features[%zu]", w, i);
      int rc = tsr_conf_check_keys(e, where2, keys, NULL, err, errlen);
      if (rc) return rc;
      name = json_object_get(e, "name");
      rc = get_int(e, where2, "vocab", 0, INT64_MAX, &vocab, err, errlen);
      if (rc) return rc;
    }
    if (!json_is_string(name) || !json_string_value(name)[0])
      return tsr_errf(err, errlen, TSR_ECONFIG,
                      "%s.sparse_features[%zu] needs a name", w, i);
    s->sparse[i].name = strdup(json_string_value(name));
    s->sparse[i].vocab = vocab;
    if (!s->sparse[i].name) return TSR_ENOMEM;
  }
  return 0;
}

static int parse_obj(const tsr_job *job, json_t *o, wk_input_spec *s,
                     char *err, size_t errlen) {
  const char *w = s->where;
  int rc = check_keys(o, w, err, errlen);
  if (rc) return rc;

  json_t *v = json_object_get(o, "format");
  json_t *paths = json_object_get(o, "paths");
  if (v) {
    if (!json_is_string(v))
      return tsr_errf(err, errlen, TSR_ECONFIG,
                      "%s.format must be a string", w);
    size_t i;
    for (i = 0; i < sizeof wk_fmt_names / sizeof wk_fmt_names[0]; i++)
      if (strcmp(json_string_value(v), wk_fmt_names[i]) == 0) break;
    if (i == sizeof wk_fmt_names / sizeof wk_fmt_names[0])
      return tsr_errf(err, errlen, TSR_ECONFIG,
                      "%s.format: unknown format \"%s\" (csv, npy, "
                      "npz, idx, tfrecord, synthetic, synthetic_ctr)",
                      w, json_string_value(v));
    s->format = (wk_fmt)i;
  } else {
    json_t *p0 = json_is_array(paths) ? json_array_get(paths, 0) : paths;
    if (!json_is_string(p0) ||
        infer_format(json_string_value(p0), &s->format) != 0)
      return tsr_errf(err, errlen, TSR_ECONFIG,
                      "%s.format: missing (csv, npy, npz, idx, "
                      "tfrecord, synthetic, synthetic_ctr)",
                      w);
  }
  unsigned bit = 1u << s->format;
  const char *key;
  json_object_foreach(o, key, v) {
    if (!(find_key(key)->formats & bit))
      return tsr_errf(err, errlen, TSR_ECONFIG,
                      "%s.%s: not used by format %s", w, key,
                      wk_fmt_names[s->format]);
  }

  if ((bit & F_FILES) && !paths)
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "%s.paths: missing (format %s reads files)", w,
                    wk_fmt_names[s->format]);
  if (paths && (rc = get_paths(job, paths, w, "paths", &s->paths, &s->n_paths,
                               err, errlen)))
    return rc;
  if (bit & (F_NPY | F_IDX)) {
    v = json_object_get(o, "labels");
    if (!v)
      return tsr_errf(err, errlen, TSR_ECONFIG,
                      "%s.labels: missing (the label file of each "
                      "path)",
                      w);
    if ((rc = get_paths(job, v, w, "labels", &s->labels, &s->n_labels, err,
                        errlen)))
      return rc;
    if (s->n_labels != s->n_paths)
      return tsr_errf(err, errlen, TSR_ECONFIG,
                      "%s.labels: %d label files for %d paths", w,
                      s->n_labels, s->n_paths);
  }
  if ((rc = get_str(o, w, "label", &s->label, err, errlen))) return rc;
  if (!s->label && s->format == WK_FMT_NPZ) s->label = strdup("y");
  if (!s->label && (bit & (F_CSV | F_TFR)))
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "%s.label: missing (the %s holding the label)", w,
                    s->format == WK_FMT_CSV ? "column" : "feature");
  if ((v = json_object_get(o, "features")) &&
      (rc = parse_dense(v, s, err, errlen)))
    return rc;
  for (int i = 0; s->label && i < s->n_dense; i++)
    if (strcmp(s->dense[i].name, s->label) == 0)
      return tsr_errf(err, errlen, TSR_ECONFIG,
                      "%s.features[%d]: \"%s\" is the label", w, i,
                      s->label);
  if (s->format == WK_FMT_NPZ && !s->features_member)
    s->features_member = strdup("x");
  if ((v = json_object_get(o, "sparse_features")) &&
      (rc = parse_sparse(v, s, err, errlen)))
    return rc;
  if (s->format == WK_FMT_TFRECORD && !s->dense && !s->sparse)
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "%s: tfrecord needs features and/or "
                    "sparse_features",
                    w);

  if ((v = json_object_get(o, "shard"))) {
    const char *pol[] = {"auto", "file", "data", "off"};
    int i;
    for (i = 0; i < 4; i++)
      if (json_is_string(v) && strcmp(json_string_value(v), pol[i]) == 0)
        break;
    if (i == 4)
      return tsr_errf(err, errlen, TSR_ECONFIG,
                      "%s.shard must be \"auto\", \"file\", \"data\" "
                      "or \"off\"",
                      w);
    s->shard = (wk_shard_policy)i;
  }
  int64_t x;
  if ((rc = get_int(o, w, "shuffle_buffer", 0, INT64_C(1) << 32,
                    &s->shuffle_buffer, err, errlen)))
    return rc;
  x = s->prefetch;
  if ((rc = get_int(o, w, "prefetch", -1, 64, &x, err, errlen))) return rc;
  s->prefetch = x < 0 ? 2 : (int)x;
  if ((rc = get_bool(o, w, "normalize", &s->normalize, err, errlen)))
    return rc;
  if ((rc = get_num(o, w, "scale", -1e30, 1e30, &s->scale, err, errlen)))
    return rc;
  if ((v = json_object_get(o, "drop_remainder"))) {
    bool b = false;
    if ((rc = get_bool(o, w, "drop_remainder", &b, err, errlen))) return rc;
    s->drop_remainder = b;
  }
  if ((rc = get_int(o, w, "epochs", -1, INT64_MAX, &s->epochs, err, errlen)))
    return rc;
  if ((v = json_object_get(o, "repeat"))) {
    if (json_is_true(v))
      s->epochs = -1;
    else if (json_is_integer(v) && json_integer_value(v) >= 1)
      s->epochs = json_integer_value(v);
    else if (!json_is_false(v))
      return tsr_errf(err, errlen, TSR_ECONFIG,
                      "%s.repeat must be true, false or a count >= 1",
                      w);
  }
  if ((v = json_object_get(o, "seed"))) {
    if (!json_is_integer(v) || json_integer_value(v) < 0)
      return tsr_errf(err, errlen, TSR_ECONFIG,
                      "%s.seed must be an integer >= 0", w);
    s->has_seed = true;
    s->seed = (uint64_t)json_integer_value(v);
  }
  if ((rc = get_bool(o, w, "skip_corrupt", &s->skip_corrupt, err, errlen)))
    return rc;
  if ((v = json_object_get(o, "delimiter"))) {
    const char *d = json_string_value(v);
    if (!d || strlen(d) != 1 || d[0] == '"' || d[0] == '\n' || d[0] == '\r')
      return tsr_errf(err, errlen, TSR_ECONFIG,
                      "%s.delimiter must be one character other than a "
                      "quote or a line end (\",\", \";\", \"\\t\", \"|\")",
                      w);
    s->delimiter = d[0];
  }
  if ((rc = get_int(o, w, "n_classes", 1, INT64_C(1) << 31, &s->n_classes,
                    err, errlen)))
    return rc;

  /* synthetic generators */
  if ((rc = get_int(o, w, "n", 1, INT64_C(1) << 40, &s->n, err, errlen)))
    return rc;
  if ((rc = get_int(o, w, "dense", 0, 1 << 20, &s->syn_dense, err, errlen)))
    return rc;
  x = s->syn_sparse;
  if ((rc = get_int(o, w, "sparse", 0, 1024, &x, err, errlen))) return rc;
  if (x != s->syn_sparse) {
    s->syn_sparse = (int)x;
    free(s->syn_vocab);
    s->syn_vocab = NULL;
  }
  if ((rc = get_num(o, w, "noise", 0, 1e6, &s->noise, err, errlen)))
    return rc;
  if ((rc = get_num(o, w, "zipf", 0, 10, &s->zipf, err, errlen))) return rc;
  x = s->ids_per_feature;
  if ((rc = get_int(o, w, "ids_per_feature", 1, 1024, &x, err, errlen)))
    return rc;
  s->ids_per_feature = (int)x;
  if ((rc = get_num(o, w, "positive_rate", 1e-6, 1 - 1e-6, &s->positive_rate,
                    err, errlen)))
    return rc;
  if ((v = json_object_get(o, "data_seed"))) {
    if (!json_is_integer(v) || json_integer_value(v) < 0)
      return tsr_errf(err, errlen, TSR_ECONFIG,
                      "%s.data_seed must be an integer >= 0", w);
    s->data_seed = (uint64_t)json_integer_value(v);
  }
  if (s->format == WK_FMT_SYNTHETIC_CTR) {
    v = json_object_get(o, "vocab");
    if (!s->syn_vocab) {
      s->syn_vocab = calloc(s->syn_sparse ? s->syn_sparse : 1, sizeof(int64_t));
      if (!s->syn_vocab) return TSR_ENOMEM;
      for (int i = 0; i < s->syn_sparse; i++) s->syn_vocab[i] = 100000;
    }
    if (json_is_integer(v) && json_integer_value(v) >= 2 &&
        json_integer_value(v) < (INT64_C(1) << 40)) {
      for (int i = 0; i < s->syn_sparse; i++)
        s->syn_vocab[i] = json_integer_value(v);
    } else if (json_is_array(v) && (int)json_array_size(v) == s->syn_sparse) {
      for (int i = 0; i < s->syn_sparse; i++) {
        json_t *e = json_array_get(v, i);
        if (!json_is_integer(e) || json_integer_value(e) < 2)
          return tsr_errf(err, errlen, TSR_ECONFIG,
                          "%s.vocab[%d] must be an integer >= 2", w, i);
        s->syn_vocab[i] = json_integer_value(e);
      }
    } else if (v) {
      return tsr_errf(err, errlen, TSR_ECONFIG,
                      "%s.vocab must be an integer >= 2 or a list of "
                      "%d of them (one per sparse feature)",
                      w, s->syn_sparse);
    }
  }
  return 0;
}

/* The eval split's every-k-th cut: {"split": "every", "k": 5, "index": 4}. */
static int parse_split(json_t *o, const char *w, int *k, int *index,
                       char *err, size_t errlen) {
  json_t *v = json_object_get(o, "split");
  json_t *vk = json_object_get(o, "k"), *vi = json_object_get(o, "index");
  if (!v) {
    if (vk || vi)
      return tsr_errf(err, errlen, TSR_ECONFIG,
                      "%s.%s: only used with \"split\": \"every\"", w,
                      vk ? "k" : "index");
    return 0;
  }
  if (!json_is_string(v) || strcmp(json_string_value(v), "every") != 0)
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "%s.split must be \"every\" (with k and index)", w);
  int64_t kk = 0, ii = -1;
  int rc = get_int(o, w, "k", 2, 1 << 30, &kk, err, errlen);
  if (rc) return rc;
  if ((rc = get_int(o, w, "index", 0, 1 << 30, &ii, err, errlen))) return rc;
  if (kk == 0)
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "%s.k: missing (every k-th row goes to eval)", w);
  if (ii < 0) ii = kk - 1;
  if (ii >= kk)
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "%s.index: %lld must be below k (%lld)", w,
                    (long long)ii, (long long)kk);
  *k = (int)kk;
  *index = (int)ii;
  return 0;
}

void wk_input__spec_free(wk_input_spec *s) {
  if (!s) return;
  for (int i = 0; i < s->n_paths; i++) free(s->paths[i]);
  free(s->paths);
  for (int i = 0; i < s->n_labels; i++) free(s->labels[i]);
  free(s->labels);
  free(s->label);
  free(s->features_member);
  for (int i = 0; i < s->n_dense; i++) free(s->dense[i].name);
  free(s->dense);
  for (int i = 0; i < s->n_sparse; i++) free(s->sparse[i].name);
  free(s->sparse);
  free(s->syn_vocab);
  memset(s, 0, sizeof *s);
}

static void spec_defaults(wk_input_spec *s, const char *where) {
  memset(s, 0, sizeof *s);
  snprintf(s->where, sizeof s->where, "%s", where);
  s->shard = WK_SHARD_AUTO;
  s->shuffle_buffer = -1;
  s->delimiter = ',';
  s->prefetch = 2;
  s->scale = 1.0;
  s->drop_remainder = -1;
  s->epochs = -2;
  s->n = 1000;
  s->syn_dense = -1;
  s->syn_sparse = 26;
  s->noise = 0.1;
  s->zipf = 1.1;
  s->ids_per_feature = 1;
  s->positive_rate = 0.25;
  s->data_seed = 42;
}

int wk_input__spec_parse(const tsr_job *job, wk_split split,
                         wk_input_spec *out, char *err, size_t errlen) {
  int rc = 0;
  json_t *merged = NULL;
  spec_defaults(out, split == WK_SPLIT_EVAL ? "data.eval" : "data.train");
  json_t *data = job ? job->data : NULL;
  if (!json_is_object(data))
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "data: missing (the job file names its data as "
                    "{\"train\": {...}, \"eval\": {...}})");
  const char *key;
  json_t *v;
  json_object_foreach(data, key, v) {
    static const char *const top[] = {"train", "eval", NULL};
    if (strcmp(key, "train") && strcmp(key, "eval"))
      return tsr_conf_unknown_key("data", key, top, NULL, err, errlen);
    if (!json_is_object(v))
      return tsr_errf(err, errlen, TSR_ECONFIG,
                      "data.%s must be an object", key);
  }
  json_t *train = json_object_get(data, "train");
  json_t *eval = json_object_get(data, "eval");
  if (!train)
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "data.train: missing");
  if ((rc = check_keys(train, "data.train", err, errlen))) return rc;
  if (json_object_get(train, "split") || json_object_get(train, "k") ||
      json_object_get(train, "index"))
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "data.train.split: only data.eval is cut from the "
                    "training files");
  int k = 0, index = 0;
  if (eval) {
    if ((rc = check_keys(eval, "data.eval", err, errlen))) return rc;
    if ((rc = parse_split(eval, "data.eval", &k, &index, err, errlen)))
      return rc;
    if (k && json_object_get(eval, "paths"))
      return tsr_errf(err, errlen, TSR_ECONFIG,
                      "data.eval.paths: not with \"split\" (the eval "
                      "rows are cut from data.train.paths)");
  }
  if (split == WK_SPLIT_EVAL && !eval)
    return tsr_errf(err, errlen, TSR_ENOTFOUND,
                    "data.eval: missing (no eval data in the job)");
  if (split == WK_SPLIT_TRAIN) {
    merged = json_deep_copy(train);
  } else {
    /* eval: train's data description, overridden by eval's own keys */
    merged = json_object();
    if (merged) {
      json_object_foreach(train, key, v) {
        const wk_key_info *ki = find_key(key);
        if (ki && ki->describes_data) json_object_set(merged, key, v);
      }
      json_object_foreach(eval, key, v) {
        if (strcmp(key, "split") && strcmp(key, "k") && strcmp(key, "index"))
          json_object_set(merged, key, v);
      }
      if (!k && json_object_get(eval, "paths") &&
          !json_object_get(eval, "labels"))
        json_object_del(merged, "labels");
    }
  }
  if (!merged) return TSR_ENOMEM;
  rc = parse_obj(job, merged, out, err, errlen);
  json_decref(merged);
  if (rc) {
    wk_input__spec_free(out);
    spec_defaults(out, split == WK_SPLIT_EVAL ? "data.eval" : "data.train");
    return rc;
  }
  if (out->syn_dense < 0)
    out->syn_dense = out->format == WK_FMT_SYNTHETIC_CTR ? 13 : 10;
  /* Keras shuffles training data each epoch, never validation data */
  if (split == WK_SPLIT_EVAL && out->shuffle_buffer < 0) out->shuffle_buffer = 0;
  out->split_k = k;
  out->split_index = index;
  out->split_keep = split == WK_SPLIT_EVAL;
  out->syn_stream = (split == WK_SPLIT_EVAL && !k) ? 1 : 0;
  return 0;
}
