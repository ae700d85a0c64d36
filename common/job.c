/* Job file parsing. Flow: read the file -> jansson tree -> apply the
 * command-line overrides to the tree -> read it key by key into tsr_job
 * as the key table says (job_keys.h, job_keys.c), rejecting unknown keys
 * with a suggestion when one is close. */
#include "common/job_int.h"
#include "common/conf.h"
#include "common/err.h"
#include "common/mem.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

char *tsr_read_file(const char *path, size_t *len, int *rc, char *err,
                    size_t errlen) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    *rc = tsr_errf(err, errlen, TSR_EIO, "%s: %s", path, strerror(errno));
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
        *rc = tsr_errf(err, errlen, TSR_ETOOBIG, "%s: larger than 1 GiB",
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
    *rc = tsr_errf(err, errlen, buf ? TSR_EIO : TSR_ENOMEM,
                   "%s: read failed", path);
    return NULL;
  }
  buf[n] = 0;
  if (len) *len = n;
  *rc = 0;
  return buf;
}

/* ---- partitioner ---------------------------------------------------------*/

int tsr_partitioner_parse(json_t *v, tsr_partitioner *out, char *err,
                          size_t errlen) {
  tsr_partitioner_default(out);
  if (!json_is_object(v))
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "partitioner must be an object {\"type\": \"min_size\", "
                    "...}");
  json_t *t = json_object_get(v, "type");
  const char *type = json_is_string(t) ? json_string_value(t) : "min_size";
  if (t && !json_is_string(t))
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "partitioner.type must be a string");
  int rc;
  if (strcmp(type, "min_size") == 0) {
    static const char *const k[] = {"type", "min_shard_bytes", "max_shards",
                                    NULL};
    if ((rc = tsr_conf_check_keys(v, "partitioner", k, NULL, err, errlen)))
      return rc;
    out->kind = TSR_PART_MIN_SIZE;
  } else if (strcmp(type, "max_size") == 0) {
    static const char *const k[] = {"type", "max_shard_bytes", "max_shards",
                                    NULL};
    if ((rc = tsr_conf_check_keys(v, "partitioner", k, NULL, err, errlen)))
      return rc;
    out->kind = TSR_PART_MAX_SIZE;
    out->max_shards = 0;
    if (!json_object_get(v, "max_shard_bytes"))
      return tsr_errf(err, errlen, TSR_ECONFIG,
                      "partitioner.max_shard_bytes is required for "
                      "max_size");
  } else if (strcmp(type, "fixed") == 0 || strcmp(type, "fixed_shards") == 0) {
    static const char *const k[] = {"type", "num_shards", NULL};
    if ((rc = tsr_conf_check_keys(v, "partitioner", k, NULL, err, errlen)))
      return rc;
    out->kind = TSR_PART_FIXED;
    if (!json_object_get(v, "num_shards"))
      return tsr_errf(err, errlen, TSR_ECONFIG,
                      "partitioner.num_shards is required for fixed");
  } else {
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "partitioner.type \"%s\" is not one of min_size, "
                    "max_size, fixed", type);
  }
  if ((rc = tsr__jk_get_int(v, "partitioner", "min_shard_bytes",
                            &out->min_shard_bytes, INT64_MIN, INT64_MAX, err,
                            errlen)) ||
      (rc = tsr__jk_get_int(v, "partitioner", "max_shard_bytes",
                            &out->max_shard_bytes, INT64_MIN, INT64_MAX, err,
                            errlen)) ||
      (rc = tsr__jk_get_int(v, "partitioner", "max_shards", &out->max_shards,
                            INT64_MIN, INT64_MAX, err, errlen)) ||
      (rc = tsr__jk_get_int(v, "partitioner", "num_shards", &out->num_shards,
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
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "override \"%s\": expected key=value", kv);
  char key[256];
  size_t kl = (size_t)(eq - kv);
  if (kl >= sizeof key)
    return tsr_errf(err, errlen, TSR_ECONFIG, "override key too long");
  memcpy(key, kv, kl);
  key[kl] = 0;
  const char *val = eq + 1;
  json_error_t je;
  json_t *jv = json_loads(val, JSON_DECODE_ANY, &je);
  if (!jv) jv = json_string(val); /* NULL for text that is not UTF-8 */
  if (!jv)
    return tsr_errf(err, errlen, TSR_ECONFIG, "override \"%s\": the value "
                    "is neither JSON nor UTF-8 text", kv);
  json_t *obj = root;
  char *save = NULL;
  char *part = strtok_r(key, ".", &save);
  char *next;
  while (part && (next = strtok_r(NULL, ".", &save))) {
    json_t *child = json_object_get(obj, part);
    if (!child) {
      /* set_new takes (and on failure frees) the new object: use it only
       * once it is in place */
      child = json_object();
      if (!child || json_object_set_new(obj, part, child)) {
        json_decref(jv);
        return tsr_errf(err, errlen, TSR_ECONFIG, "override \"%s\": key "
                        "\"%s\" is not valid UTF-8 (or out of memory)", kv,
                        part);
      }
    } else if (json_is_string(child) && obj == root &&
               (!strcmp(part, "optimizer") || !strcmp(part, "checkpoint"))) {
      /* the short forms: "adam" is {"name": "adam"}, a checkpoint folder
       * is {"dir": ...}; a key set inside them keeps the short form's
       * meaning */
      json_t *full = json_object();
      if (!full ||
          json_object_set(full, !strcmp(part, "optimizer") ? "name" : "dir",
                          child) ||
          json_object_set_new(obj, part, full)) {
        json_decref(jv);
        return tsr_errf(err, errlen, TSR_ENOMEM, "override \"%s\": out of "
                        "memory", kv);
      }
      child = full;
    }
    if (!json_is_object(child)) {
      json_decref(jv);
      return tsr_errf(err, errlen, TSR_ECONFIG,
                      "override \"%s\": \"%s\" is not an object", kv, part);
    }
    obj = child;
    part = next;
  }
  if (!part) {
    json_decref(jv);
    return tsr_errf(err, errlen, TSR_ECONFIG, "override \"%s\": empty key",
                    kv);
  }
  if (json_object_set_new(obj, part, jv)) /* it took jv either way */
    return tsr_errf(err, errlen, TSR_ECONFIG, "override \"%s\": key \"%s\" "
                    "is not valid UTF-8", kv, part);
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
  job->checkpoint_full_every = 1;
  job->allreduce_bucket_bytes = (int64_t)4 << 20;
}

void tsr_job_free(tsr_job *job) {
  for (int i = 0; i < job->n_metrics; i++) free(job->metrics[i]);
  TSR_FREE_ALL(job->path, job->model_source, job->loss, job->metrics,
               job->checkpoint_dir, job->logdir, job->initial_weights);
  json_decref(job->model);
  json_decref(job->data);
  json_decref(job->raw);
  tsr_job_init(job);
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
    return tsr_errf(err, errlen, TSR_EJSON,
                    "%s: malformed JSON at line %d column %d: %s", src,
                    je.line, je.column, je.text);
  int rc = 0;
  if (!json_is_object(root)) {
    rc = tsr_errf(err, errlen, TSR_ECONFIG, "%s: must be a JSON object",
                  src);
    goto fail;
  }
  for (const char *const *o = overrides; o && *o; o++) {
    rc = tsr_job_override(root, *o, emsg, sizeof emsg);
    if (rc) {
      tsr_errf(err, errlen, rc, "%s", emsg);
      goto fail;
    }
  }
  job->raw = root;
  emsg[0] = 0;
  json_t *ep = json_object_get(root, "epochs");
  if (json_is_integer(ep) && json_integer_value(ep) == 0) {
    /* Keras's fit(epochs=0) trains nothing and returns; a job that says
     * so most likely wants its weights evaluated, which has commands */
    rc = TSR_ECONFIG;
    snprintf(emsg, sizeof emsg,
             "epochs = 0 is out of range [1, %d]: it trains nothing; to "
             "evaluate weights without training, run `tessera evaluate --job "
             "JOB (--checkpoint DIR | --weights FILE)` or `tessera-worker "
             "--standalone --evaluate`", 1 << 30);
    goto efail;
  }
  if ((rc = tsr__jk_read(job, root, "", tsr__job_keys, tsr__job_nkeys,
                         base_dir, emsg, sizeof emsg)))
    goto efail;
  if (!job->loss && !(job->loss = strdup("mse"))) goto nomem;
  if (job->steps == 0 && job->epochs == 0) job->epochs = 1;
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
  tsr_errf(err, errlen, rc, "%s: %s", src,
           emsg[0] ? emsg : tsr_strerror(rc));
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

void tsr_job_dir(const tsr_job *job, char *dir, size_t len) {
  const char *slash = job->path ? strrchr(job->path, '/') : NULL;
  if (slash)
    snprintf(dir, len, "%.*s", (int)(slash - job->path), job->path);
  else
    snprintf(dir, len, ".");
}

char *tsr_job_resolve(const tsr_job *job, const char *p, const char *suffix) {
  char dir[4096];
  tsr_job_dir(job, dir, sizeof dir);
  bool abs = p[0] == '/';
  size_t n = (abs ? 0 : strlen(dir) + 1) + strlen(p) + strlen(suffix) + 1;
  char *out = malloc(n);
  if (out)
    snprintf(out, n, "%s%s%s%s", abs ? "" : dir, abs ? "" : "/", p, suffix);
  return out;
}
