/* Job file parsing. Flow: read the file -> jansson tree -> apply the
 * command-line overrides to the tree -> walk it key by key into tsr_job,
 * rejecting unknown keys with a suggestion when one is close. */
#include "common/job.h"
#include "common/err.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static int tsr__jfail(char *err, size_t errlen, int code, const char *fmt,
                      ...) __attribute__((format(printf, 4, 5)));
static int tsr__jfail(char *err, size_t errlen, int code, const char *fmt,
                      ...) {
  if (err && errlen) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return code;
}

char *tsr_read_file(const char *path, size_t *len, int *rc, char *err,
                    size_t errlen) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    *rc = tsr__jfail(err, errlen, TSR_EIO, "%s: %s", path, strerror(errno));
    return NULL;
  }
  size_t cap = 1 << 16, n = 0;
  char *buf = malloc(cap);
  for (;;) {
    if (!buf) break;
    size_t r = fread(buf + n, 1, cap - n - 1, f);
    n += r;
    if (r == 0) break;
    if (n + 1 == cap) {
      if (cap >= ((size_t)1 << 30)) {
        free(buf);
        fclose(f);
        *rc = tsr__jfail(err, errlen, TSR_ETOOBIG, "%s: larger than 1 GiB",
                         path);
        return NULL;
      }
      char *nb = realloc(buf, cap * 2);
      if (!nb) {
        free(buf);
        buf = NULL;
        break;
      }
      buf = nb;
      cap *= 2;
    }
  }
  int bad = ferror(f);
  fclose(f);
  if (!buf || bad) {
    free(buf);
    *rc = tsr__jfail(err, errlen, buf ? TSR_EIO : TSR_ENOMEM,
                     "%s: read failed", path);
    return NULL;
  }
  buf[n] = 0;
  if (len) *len = n;
  *rc = 0;
  return buf;
}

/* ---- small helpers for strict key walking -------------------------------*/

int tsr_edit_distance(const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b);
  if (la > 40 || lb > 40) return 99;
  int d[41][41];
  for (size_t i = 0; i <= la; i++) d[i][0] = (int)i;
  for (size_t j = 0; j <= lb; j++) d[0][j] = (int)j;
  for (size_t i = 1; i <= la; i++)
    for (size_t j = 1; j <= lb; j++) {
      int c = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
      if (d[i - 1][j] + 1 < c) c = d[i - 1][j] + 1;
      if (d[i][j - 1] + 1 < c) c = d[i][j - 1] + 1;
      d[i][j] = c;
    }
  return d[la][lb];
}

/* Fails on the first key of `obj` not in `allowed` (NULL-terminated). */
static int tsr__check_keys(json_t *obj, const char *where,
                           const char *const *allowed, char *err,
                           size_t errlen) {
  const char *key;
  json_t *v;
  json_object_foreach(obj, key, v) {
    int ok = 0;
    const char *best = NULL;
    int bestd = 3;
    for (const char *const *a = allowed; *a; a++) {
      if (strcmp(key, *a) == 0) {
        ok = 1;
        break;
      }
      int dd = tsr_edit_distance(key, *a);
      if (dd < bestd) {
        bestd = dd;
        best = *a;
      }
    }
    if (!ok) {
      if (best)
        return tsr__jfail(err, errlen, TSR_ECONFIG,
                          "%s%s%s: unknown key; did you mean \"%s\"?", where,
                          *where ? "." : "", key, best);
      return tsr__jfail(err, errlen, TSR_ECONFIG, "%s%s%s: unknown key",
                        where, *where ? "." : "", key);
    }
  }
  return 0;
}

static int tsr__get_num(json_t *obj, const char *where, const char *key,
                        double *out, char *err, size_t errlen) {
  json_t *v = json_object_get(obj, key);
  if (!v) return 0;
  if (!json_is_number(v))
    return tsr__jfail(err, errlen, TSR_ECONFIG, "%s.%s must be a number",
                      where, key);
  double d = json_number_value(v);
  if (!isfinite(d))
    return tsr__jfail(err, errlen, TSR_ECONFIG, "%s.%s must be finite", where,
                      key);
  *out = d;
  return 0;
}

static int tsr__get_int(json_t *obj, const char *where, const char *key,
                        int64_t *out, int64_t lo, int64_t hi, char *err,
                        size_t errlen) {
  json_t *v = json_object_get(obj, key);
  if (!v) return 0;
  if (!json_is_integer(v))
    return tsr__jfail(err, errlen, TSR_ECONFIG, "%s%s%s must be an integer",
                      where, *where ? "." : "", key);
  json_int_t x = json_integer_value(v);
  if (x < lo || x > hi)
    return tsr__jfail(err, errlen, TSR_ECONFIG,
                      "%s%s%s = %lld is out of range [%lld, %lld]", where,
                      *where ? "." : "", key, (long long)x, (long long)lo,
                      (long long)hi);
  *out = x;
  return 0;
}

static int tsr__get_str(json_t *obj, const char *where, const char *key,
                        char **out, char *err, size_t errlen) {
  json_t *v = json_object_get(obj, key);
  if (!v || json_is_null(v)) return 0;
  if (!json_is_string(v))
    return tsr__jfail(err, errlen, TSR_ECONFIG, "%s%s%s must be a string",
                      where, *where ? "." : "", key);
  free(*out);
  *out = strdup(json_string_value(v));
  return *out ? 0 : TSR_ENOMEM;
}

/* ---- partitioner ---------------------------------------------------------*/

int tsr_partitioner_parse(json_t *v, tsr_partitioner *out, char *err,
                          size_t errlen) {
  tsr_partitioner_default(out);
  if (!json_is_object(v))
    return tsr__jfail(err, errlen, TSR_ECONFIG,
                      "partitioner must be an object {\"type\": \"min_size\", "
                      "...}");
  json_t *t = json_object_get(v, "type");
  const char *type = json_is_string(t) ? json_string_value(t) : "min_size";
  if (t && !json_is_string(t))
    return tsr__jfail(err, errlen, TSR_ECONFIG,
                      "partitioner.type must be a string");
  int rc;
  if (strcmp(type, "min_size") == 0) {
    static const char *const k[] = {"type", "min_shard_bytes", "max_shards",
                                    NULL};
    if ((rc = tsr__check_keys(v, "partitioner", k, err, errlen))) return rc;
    out->kind = TSR_PART_MIN_SIZE;
  } else if (strcmp(type, "max_size") == 0) {
    static const char *const k[] = {"type", "max_shard_bytes", "max_shards",
                                    NULL};
    if ((rc = tsr__check_keys(v, "partitioner", k, err, errlen))) return rc;
    out->kind = TSR_PART_MAX_SIZE;
    out->max_shards = 0;
    if (!json_object_get(v, "max_shard_bytes"))
      return tsr__jfail(err, errlen, TSR_ECONFIG,
                        "partitioner.max_shard_bytes is required for "
                        "max_size");
  } else if (strcmp(type, "fixed") == 0 || strcmp(type, "fixed_shards") == 0) {
    static const char *const k[] = {"type", "num_shards", NULL};
    if ((rc = tsr__check_keys(v, "partitioner", k, err, errlen))) return rc;
    out->kind = TSR_PART_FIXED;
    if (!json_object_get(v, "num_shards"))
      return tsr__jfail(err, errlen, TSR_ECONFIG,
                        "partitioner.num_shards is required for fixed");
  } else {
    return tsr__jfail(err, errlen, TSR_ECONFIG,
                      "partitioner.type \"%s\" is not one of min_size, "
                      "max_size, fixed", type);
  }
  if ((rc = tsr__get_int(v, "partitioner", "min_shard_bytes",
                         &out->min_shard_bytes, INT64_MIN, INT64_MAX, err,
                         errlen)) ||
      (rc = tsr__get_int(v, "partitioner", "max_shard_bytes",
                         &out->max_shard_bytes, INT64_MIN, INT64_MAX, err,
                         errlen)) ||
      (rc = tsr__get_int(v, "partitioner", "max_shards", &out->max_shards,
                         INT64_MIN, INT64_MAX, err, errlen)) ||
      (rc = tsr__get_int(v, "partitioner", "num_shards", &out->num_shards,
                         INT64_MIN, INT64_MAX, err, errlen)))
    return rc;
  rc = tsr_partitioner_check(out, err, errlen);
  return rc ? TSR_ECONFIG : 0;
}

int tsr_mode_parse(const char *s, tsr_mode *mode, int *staleness) {
  *staleness = 0;
  if (strcmp(s, "async") == 0) {
    *mode = TSR_MODE_ASYNC;
    return 0;
  }
  if (strcmp(s, "sync") == 0) {
    *mode = TSR_MODE_SYNC;
    return 0;
  }
  if (strncmp(s, "ssp:", 4) == 0 && s[4]) {
    char *end;
    errno = 0;
    long v = strtol(s + 4, &end, 10);
    if (*end || errno || v < 0 || v > 1000000) return TSR_EINVAL;
    *mode = TSR_MODE_SSP;
    *staleness = (int)v;
    return 0;
  }
  return TSR_EINVAL;
}

const char *tsr_precision_name(tsr_precision p) {
  switch (p) {
    case TSR_PREC_FP32: return "fp32";
    case TSR_PREC_BF16: return "bf16";
    case TSR_PREC_FP16: return "fp16";
  }
  return "?";
}

/* ---- overrides -----------------------------------------------------------*/

int tsr_job_override(json_t *root, const char *kv, char *err, size_t errlen) {
  const char *eq = strchr(kv, '=');
  if (!eq || eq == kv)
    return tsr__jfail(err, errlen, TSR_ECONFIG,
                      "override \"%s\": expected key=value", kv);
  char key[256];
  size_t kl = (size_t)(eq - kv);
  if (kl >= sizeof key)
    return tsr__jfail(err, errlen, TSR_ECONFIG, "override key too long");
  memcpy(key, kv, kl);
  key[kl] = 0;
  const char *val = eq + 1;
  json_error_t je;
  json_t *jv = json_loads(val, JSON_DECODE_ANY, &je);
  if (!jv) jv = json_string(val);
  if (!jv) return TSR_ENOMEM;
  json_t *obj = root;
  char *save = NULL;
  char *part = strtok_r(key, ".", &save);
  char *next;
  while (part && (next = strtok_r(NULL, ".", &save))) {
    json_t *child = json_object_get(obj, part);
    if (!child) {
      child = json_object();
      json_object_set_new(obj, part, child);
    } else if (json_is_string(child) && obj == root &&
               (!strcmp(part, "optimizer") || !strcmp(part, "checkpoint"))) {
      /* the short forms: "adam" is {"name": "adam"}, a checkpoint folder
       * is {"dir": ...}; a key set inside them keeps the short form's
       * meaning */
      json_t *full = json_object();
      json_object_set(full, !strcmp(part, "optimizer") ? "name" : "dir",
                      child);
      json_object_set_new(obj, part, full);
      child = full;
    }
    if (!json_is_object(child)) {
      json_decref(jv);
      return tsr__jfail(err, errlen, TSR_ECONFIG,
                        "override \"%s\": \"%s\" is not an object", kv, part);
    }
    obj = child;
    part = next;
  }
  if (!part) {
    json_decref(jv);
    return tsr__jfail(err, errlen, TSR_ECONFIG, "override \"%s\": empty key",
                      kv);
  }
  json_object_set_new(obj, part, jv);
  return 0;
}

/* ---- the job --------------------------------------------------------------*/

void tsr_job_init(tsr_job *job) {
  memset(job, 0, sizeof *job);
  job->loss = NULL;
  tsr_optim_defaults(TSR_OPT_ADAM, &job->optimizer);
  job->batch_size = 32;
  job->steps_per_closure = 10;
  job->mode = TSR_MODE_ASYNC;
  tsr_partitioner_default(&job->partitioner);
  job->precision = TSR_PREC_FP32;
  job->checkpoint_keep = 3;
}

void tsr_job_free(tsr_job *job) {
  free(job->path);
  json_decref(job->model);
  free(job->model_source);
  free(job->loss);
  for (int i = 0; i < job->n_metrics; i++) free(job->metrics[i]);
  free(job->metrics);
  json_decref(job->data);
  free(job->checkpoint_dir);
  free(job->logdir);
  free(job->initial_weights);
  json_decref(job->raw);
  tsr_job_init(job);
}

static int tsr__load_model(tsr_job *job, json_t *m, const char *base_dir,
                           char *err, size_t errlen) {
  if (json_is_object(m)) {
    job->model = json_incref(m);
    job->model_source = strdup("inline");
    return job->model_source ? 0 : TSR_ENOMEM;
  }
  if (!json_is_string(m))
    return tsr__jfail(err, errlen, TSR_ECONFIG,
                      "model must be a path to a Keras model.to_json() file, "
                      "the same inline, or {\"builtin\": ...}");
  const char *p = json_string_value(m);
  char path[4096];
  if (p[0] != '/' && base_dir && *base_dir)
    snprintf(path, sizeof path, "%s/%s", base_dir, p);
  else
    snprintf(path, sizeof path, "%s", p);
  int rc;
  char emsg[512];
  char *text = tsr_read_file(path, NULL, &rc, emsg, sizeof emsg);
  if (!text) return tsr__jfail(err, errlen, rc, "model: %s", emsg);
  json_error_t je;
  json_t *doc = json_loads(text, 0, &je);
  free(text);
  if (!doc)
    return tsr__jfail(err, errlen, TSR_EJSON,
                      "model: %s: malformed JSON at line %d column %d: %s",
                      path, je.line, je.column, je.text);
  job->model = doc;
  job->model_source = strdup(path);
  return job->model_source ? 0 : TSR_ENOMEM;
}

int tsr_job_parse(const char *text, const char *source, const char *base_dir,
                  const char *const *overrides, tsr_job *job, char *err,
                  size_t errlen) {
  const char *src = source ? source : "job";
  char emsg[512];
  tsr_job_init(job);
  json_error_t je;
  json_t *root = json_loads(text, JSON_REJECT_DUPLICATES, &je);
  if (!root)
    return tsr__jfail(err, errlen, TSR_EJSON,
                      "%s: malformed JSON at line %d column %d: %s", src,
                      je.line, je.column, je.text);
  int rc = 0;
  if (!json_is_object(root)) {
    rc = tsr__jfail(err, errlen, TSR_ECONFIG, "%s: must be a JSON object",
                    src);
    goto fail;
  }
  for (const char *const *o = overrides; o && *o; o++) {
    rc = tsr_job_override(root, *o, emsg, sizeof emsg);
    if (rc) {
      tsr__jfail(err, errlen, rc, "%s", emsg);
      goto fail;
    }
  }
  job->raw = root;
  static const char *const keys[] = {
      "model", "loss", "metrics", "optimizer", "data", "batch_size", "steps",
      "epochs", "steps_per_closure", "mode", "partitioner", "precision",
      "seed", "checkpoint", "logdir", "eval_every_steps",
      "summary_every_steps", "summary_every_secs", "name", "description",
      "placement", "initial_weights", NULL};
  if ((rc = tsr__check_keys(root, "", keys, emsg, sizeof emsg))) goto efail;

  json_t *v;
  if ((v = json_object_get(root, "model"))) {
    if ((rc = tsr__load_model(job, v, base_dir, emsg, sizeof emsg)))
      goto efail;
  }
  if ((v = json_object_get(root, "loss")) && !json_is_null(v)) {
    char canon[256];
    if ((rc = tsr_loss_canon(v, canon, sizeof canon, emsg, sizeof emsg)))
      goto efail;
    if (!(job->loss = strdup(canon))) goto nomem;
  }
  if (!job->loss && !(job->loss = strdup("mse"))) goto nomem;
  if ((v = json_object_get(root, "metrics"))) {
    if (json_is_string(v)) {
      job->metrics = calloc(1, sizeof *job->metrics);
      if (!job->metrics) goto nomem;
      if (!(job->metrics[0] = strdup(json_string_value(v)))) goto nomem;
      job->n_metrics = 1;
    } else if (json_is_array(v)) {
      size_t n = json_array_size(v);
      job->metrics = calloc(n ? n : 1, sizeof *job->metrics);
      if (!job->metrics) goto nomem;
      for (size_t i = 0; i < n; i++) {
        json_t *m = json_array_get(v, i);
        char canon[256], e2[400];
        if (!json_is_string(m) && !json_is_object(m)) {
          rc = tsr__jfail(emsg, sizeof emsg, TSR_ECONFIG,
                          "metrics[%zu] must be a string or a serialized "
                          "Keras metric", i);
          goto efail;
        }
        if ((rc = tsr_metric_canon(m, canon, sizeof canon, e2, sizeof e2))) {
          tsr__jfail(emsg, sizeof emsg, rc, "metrics[%zu]: %s", i, e2);
          goto efail;
        }
        if (!(job->metrics[i] = strdup(canon))) goto nomem;
        job->n_metrics++;
      }
    } else {
      rc = tsr__jfail(emsg, sizeof emsg, TSR_ECONFIG,
                      "metrics must be a list of names, e.g. [\"accuracy\"]");
      goto efail;
    }
  }
  if ((v = json_object_get(root, "optimizer"))) {
    if ((rc = tsr_optim_parse(v, &job->optimizer, emsg, sizeof emsg)))
      goto efail;
  }
  if ((v = json_object_get(root, "data"))) {
    if (!json_is_object(v)) {
      rc = tsr__jfail(emsg, sizeof emsg, TSR_ECONFIG,
                      "data must be an object {\"train\": {...}, \"eval\": "
                      "{...}}");
      goto efail;
    }
    job->data = json_incref(v);
  }
  if ((rc = tsr__get_int(root, "", "batch_size", &job->batch_size, 1,
                         1 << 24, emsg, sizeof emsg)) ||
      (rc = tsr__get_int(root, "", "steps", &job->steps, 0, INT64_MAX / 2,
                         emsg, sizeof emsg)) ||
      (rc = tsr__get_int(root, "", "epochs", &job->epochs, 0, 1 << 30, emsg,
                         sizeof emsg)) ||
      (rc = tsr__get_int(root, "", "steps_per_closure",
                         &job->steps_per_closure, 1, 1 << 30, emsg,
                         sizeof emsg)) ||
      (rc = tsr__get_int(root, "", "eval_every_steps", &job->eval_every_steps,
                         0, INT64_MAX / 2, emsg, sizeof emsg)) ||
      (rc = tsr__get_int(root, "", "summary_every_steps",
                         &job->summary_every_steps, 0, INT64_MAX / 2, emsg,
                         sizeof emsg)))
    goto efail;
  if ((v = json_object_get(root, "summary_every_secs"))) {
    if (!json_is_number(v) || json_number_value(v) < 0) {
      rc = tsr__jfail(emsg, sizeof emsg, TSR_ECONFIG,
                      "summary_every_secs must be a number >= 0");
      goto efail;
    }
    job->summary_every_secs = json_number_value(v);
  }
  if (job->steps == 0 && job->epochs == 0) job->epochs = 1;
  if ((v = json_object_get(root, "mode"))) {
    if (!json_is_string(v) ||
        tsr_mode_parse(json_string_value(v), &job->mode, &job->staleness)) {
      char *d = json_dumps(v, JSON_ENCODE_ANY);
      rc = tsr__jfail(emsg, sizeof emsg, TSR_ECONFIG,
                      "mode %s is not \"async\", \"ssp:S\" or \"sync\"",
                      d ? d : "?");
      free(d);
      goto efail;
    }
  }
  if ((v = json_object_get(root, "partitioner"))) {
    if ((rc = tsr_partitioner_parse(v, &job->partitioner, emsg,
                                    sizeof emsg)))
      goto efail;
  }
  if ((v = json_object_get(root, "placement"))) {
    if (!json_is_string(v)) {
      rc = tsr__jfail(emsg, sizeof emsg, TSR_ECONFIG,
                      "placement must be \"balanced\" or \"round_robin\"");
      goto efail;
    }
    if (tsr_placement_parse(json_string_value(v), &job->partitioner.placement,
                            emsg, sizeof emsg)) {
      rc = TSR_ECONFIG;
      goto efail;
    }
  }
  if ((v = json_object_get(root, "precision"))) {
    const char *p = json_is_string(v) ? json_string_value(v) : "";
    if (strcmp(p, "fp32") == 0 || strcmp(p, "float32") == 0)
      job->precision = TSR_PREC_FP32;
    else if (strcmp(p, "bf16") == 0 || strcmp(p, "mixed_bfloat16") == 0)
      job->precision = TSR_PREC_BF16;
    else if (strcmp(p, "fp16") == 0 || strcmp(p, "mixed_float16") == 0)
      job->precision = TSR_PREC_FP16;
    else {
      rc = tsr__jfail(emsg, sizeof emsg, TSR_ECONFIG,
                      "precision \"%s\" is not fp32, bf16 or fp16", p);
      goto efail;
    }
  }
  if ((v = json_object_get(root, "seed"))) {
    if (!json_is_integer(v) || json_integer_value(v) < 0) {
      rc = tsr__jfail(emsg, sizeof emsg, TSR_ECONFIG,
                      "seed must be a non-negative integer");
      goto efail;
    }
    job->seed = (uint64_t)json_integer_value(v);
  }
  if ((v = json_object_get(root, "checkpoint"))) {
    if (json_is_string(v)) {
      if (!(job->checkpoint_dir = strdup(json_string_value(v)))) goto nomem;
    } else if (json_is_object(v)) {
      static const char *const ck[] = {"dir", "every_steps", "every_secs",
                                       "keep", NULL};
      if ((rc = tsr__check_keys(v, "checkpoint", ck, emsg, sizeof emsg)))
        goto efail;
      int64_t keep = job->checkpoint_keep;
      if ((rc = tsr__get_str(v, "checkpoint", "dir", &job->checkpoint_dir,
                             emsg, sizeof emsg)) ||
          (rc = tsr__get_int(v, "checkpoint", "every_steps",
                             &job->checkpoint_every_steps, 0, INT64_MAX / 2,
                             emsg, sizeof emsg)) ||
          (rc = tsr__get_num(v, "checkpoint", "every_secs",
                             &job->checkpoint_every_secs, emsg,
                             sizeof emsg)) ||
          (rc = tsr__get_int(v, "checkpoint", "keep", &keep, 1, 1000000, emsg,
                             sizeof emsg)))
        goto efail;
      job->checkpoint_keep = (int)keep;
      if (job->checkpoint_every_secs < 0) {
        rc = tsr__jfail(emsg, sizeof emsg, TSR_ECONFIG,
                        "checkpoint.every_secs must be >= 0");
        goto efail;
      }
    } else {
      rc = tsr__jfail(emsg, sizeof emsg, TSR_ECONFIG,
                      "checkpoint must be a folder path or {\"dir\", "
                      "\"every_steps\", \"keep\"}");
      goto efail;
    }
  }
  if ((rc = tsr__get_str(root, "", "logdir", &job->logdir, emsg,
                         sizeof emsg)) ||
      (rc = tsr__get_str(root, "", "initial_weights", &job->initial_weights,
                         emsg, sizeof emsg)))
    goto efail;
  if (base_dir && *base_dir) {
    /* Relative data paths resolve from the job file's folder: record where
     * the file (named by `source`) is taken to live. */
    const char *slash = source ? strrchr(source, '/') : NULL;
    const char *base = slash ? slash + 1 : (source ? source : "job.json");
    size_t n = strlen(base_dir) + strlen(base) + 2;
    job->path = malloc(n);
    if (!job->path) goto nomem;
    snprintf(job->path, n, "%s/%s", base_dir, base);
  }
  return 0;
nomem:
  rc = TSR_ENOMEM;
  snprintf(emsg, sizeof emsg, "out of memory");
efail:
  tsr__jfail(err, errlen, rc, "%s: %s", src, emsg);
  tsr_job_free(job);
  return rc;
fail:
  json_decref(root);
  tsr_job_free(job);
  return rc;
}

int tsr_job_load(const char *path, const char *const *overrides,
                 tsr_job *job, char *err, size_t errlen) {
  int rc;
  tsr_job_init(job);
  char *text = tsr_read_file(path, NULL, &rc, err, errlen);
  if (!text) return rc;
  char dir[4096];
  snprintf(dir, sizeof dir, "%s", path);
  char *slash = strrchr(dir, '/');
  if (slash)
    *slash = 0;
  else
    snprintf(dir, sizeof dir, ".");
  rc = tsr_job_parse(text, path, dir, overrides, job, err, errlen);
  free(text);
  if (rc == 0) {
    free(job->path);
    job->path = strdup(path);
    if (!job->path) {
      tsr_job_free(job);
      return TSR_ENOMEM;
    }
  }
  return rc;
}
