/* The job file's keys (job_keys.h) made into rows, the readers of each
 * kind, the readers of the keys that need their own (FN, OBJ), and the
 * README's table.
 *
 * Happy path: tsr__jk_read() checks an object's keys against the rows
 * (an unknown key is named with the closest known one) and reads each key
 * present, in the rows' order, into tsr_job. Failure modes: a value of the
 * wrong type or out of range: TSR_ECONFIG naming the key's path and the
 * accepted values; out of memory: TSR_ENOMEM; a model file that cannot be
 * read or parsed: its own code naming the file.
 */
#include "common/job_int.h"
#include "common/job_keys.h"
#include "common/conf.h"
#include "common/err.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the rows ------------------------------------------------------------*/

static tsr__jk_reader jk_model, jk_loss, jk_metrics, jk_optimizer, jk_data,
    jk_mode, jk_partitioner, jk_placement, jk_precision, jk_seed,
    jk_prefetch_params, jk_wire_precision, jk_sparse_rows, jk_dense,
    jk_checkpoint, jk_checkpoint_storage;

#define JK_MEMBER(m) .off = offsetof(tsr_job, m), .size = sizeof(((tsr_job *)0)->m)
#define JK_INT(m, l, h) .kind = TSR__JK_INT, JK_MEMBER(m), .lo = (l), .hi = (h)
#define JK_SECS(m) .kind = TSR__JK_SECS, JK_MEMBER(m)
#define JK_PATH(m) .kind = TSR__JK_PATH, JK_MEMBER(m)
#define JK_FN(f, t) .kind = TSR__JK_FN, .fn = (f), .type = (t)
#define JK_OBJ(f, t, s) JK_FN(f, t), .sub = (s), .nsub = sizeof(s) / sizeof(s)[0]
#define JK_NOTE(t) .kind = TSR__JK_NOTE, .type = (t)
#define JK_ROW(k, spec, d, text) {.key = #k, JK_##spec, .def = (d), .doc = (text)},

/* The members the rows write have the types their readers write. */
#define JK_CHECK_INT(m, l, h)                                              \
  _Static_assert(_Generic(((tsr_job *)0)->m, int64_t: 1, int: 1,          \
                          default: 0), #m ": INT needs an int64_t or int");
#define JK_CHECK_SECS(m)                                                   \
  _Static_assert(_Generic(((tsr_job *)0)->m, double: 1, default: 0),       \
                 #m ": SECS needs a double");
#define JK_CHECK_PATH(m)                                                   \
  _Static_assert(_Generic(((tsr_job *)0)->m, char *: 1, default: 0),       \
                 #m ": PATH needs a char *");
#define JK_CHECK_FN(f, t)
#define JK_CHECK_OBJ(f, t, s)
#define JK_CHECK_NOTE(t)
#define JK_CHECK(k, spec, d, text) JK_CHECK_##spec
TSR_JOB_KEYS(JK_CHECK)
TSR_JOB_CHECKPOINT_KEYS(JK_CHECK)

static const tsr__jk_row jk_checkpoint_keys[] = {
    TSR_JOB_CHECKPOINT_KEYS(JK_ROW)};

const tsr__jk_row tsr__job_keys[] = {TSR_JOB_KEYS(JK_ROW)};
const size_t tsr__job_nkeys = sizeof tsr__job_keys / sizeof tsr__job_keys[0];

/* ---- readers of each kind ------------------------------------------------*/

/* "where.key", or "key" at the top. */
static const char *jk_path(char *buf, size_t len, const char *where,
                           const char *key) {
  snprintf(buf, len, "%s%s%s", where, *where ? "." : "", key);
  return buf;
}

int tsr__jk_get_int(json_t *obj, const char *where, const char *key,
                    int64_t *out, int64_t lo, int64_t hi, char *err,
                    size_t errlen) {
  json_t *v = json_object_get(obj, key);
  if (!v) return 0;
  char p[160];
  jk_path(p, sizeof p, where, key);
  if (!json_is_integer(v))
    return tsr_errf(err, errlen, TSR_ECONFIG, "%s must be an integer", p);
  json_int_t x = json_integer_value(v);
  if (x < lo || x > hi)
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "%s = %lld is out of range [%lld, %lld]", p,
                    (long long)x, (long long)lo, (long long)hi);
  *out = x;
  return 0;
}

static int jk_read_row(tsr_job *job, json_t *obj, const char *where,
                       const tsr__jk_row *r, const char *base_dir, char *err,
                       size_t errlen) {
  json_t *v = json_object_get(obj, r->key);
  if (!v) return 0;
  char *m = (char *)job + r->off;
  char p[160];
  jk_path(p, sizeof p, where, r->key);
  switch (r->kind) {
    case TSR__JK_INT: {
      int64_t x = 0;
      int rc = tsr__jk_get_int(obj, where, r->key, &x, r->lo, r->hi, err,
                               errlen);
      if (rc) return rc;
      if (r->size == sizeof(int64_t)) {
        memcpy(m, &x, sizeof x);
      } else {
        int i = (int)x; /* the range fits an int (job_keys.h) */
        memcpy(m, &i, sizeof i);
      }
      return 0;
    }
    case TSR__JK_SECS: {
      double d = json_is_number(v) ? json_number_value(v) : -1;
      if (!isfinite(d) || d < 0)
        return tsr_errf(err, errlen, TSR_ECONFIG,
                        "%s must be a number >= 0 (seconds)", p);
      memcpy(m, &d, sizeof d);
      return 0;
    }
    case TSR__JK_PATH: {
      if (json_is_null(v)) return 0;
      if (!json_is_string(v))
        return tsr_errf(err, errlen, TSR_ECONFIG, "%s must be a string", p);
      char *s = strdup(json_string_value(v)), *old;
      if (!s) return tsr_errf(err, errlen, TSR_ENOMEM, "out of memory");
      memcpy(&old, m, sizeof old);
      free(old);
      memcpy(m, &s, sizeof s);
      return 0;
    }
    case TSR__JK_FN:
      return r->fn(job, v, where, base_dir, r, err, errlen);
    case TSR__JK_NOTE:
      return 0;
  }
  return TSR_EINVAL;
}

int tsr__jk_read(tsr_job *job, json_t *obj, const char *where,
                 const tsr__jk_row *rows, size_t n, const char *base_dir,
                 char *err, size_t errlen) {
  const char *names[48];
  if (n >= sizeof names / sizeof names[0]) return TSR_EINVAL;
  for (size_t i = 0; i < n; i++) names[i] = rows[i].key;
  names[n] = NULL;
  int rc = tsr_conf_check_keys(obj, where, names, NULL, err, errlen);
  for (size_t i = 0; i < n && !rc; i++)
    rc = jk_read_row(job, obj, where, &rows[i], base_dir, err, errlen);
  return rc;
}

/* ---- keys with readers of their own --------------------------------------*/

static int jk_model(tsr_job *job, json_t *m, const char *where,
                    const char *base_dir, const tsr__jk_row *row, char *err,
                    size_t errlen) {
  if (json_is_object(m)) {
    job->model = json_incref(m);
    job->model_source = strdup("inline");
    return job->model_source ? 0 : TSR_ENOMEM;
  }
  if (!json_is_string(m))
    return tsr_errf(err, errlen, TSR_ECONFIG,
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
  if (!text) return tsr_errf(err, errlen, rc, "model: %s", emsg);
  json_error_t je;
  json_t *doc = json_loads(text, 0, &je);
  free(text);
  if (!doc)
    return tsr_errf(err, errlen, TSR_EJSON,
                    "model: %s: malformed JSON at line %d column %d: %s",
                    path, je.line, je.column, je.text);
  job->model = doc;
  job->model_source = strdup(path);
  return job->model_source ? 0 : TSR_ENOMEM;
}

static int jk_loss(tsr_job *job, json_t *v, const char *where,
                   const char *base_dir, const tsr__jk_row *row, char *err,
                   size_t errlen) {
  if (json_is_null(v)) return 0; /* the default */
  char canon[256];
  int rc = tsr_loss_canon(v, canon, sizeof canon, err, errlen);
  if (rc) return rc;
  free(job->loss);
  job->loss = strdup(canon);
  return job->loss ? 0 : TSR_ENOMEM;
}

static int jk_metrics(tsr_job *job, json_t *v, const char *where,
                      const char *base_dir, const tsr__jk_row *row, char *err,
                      size_t errlen) {
  if (json_is_string(v)) {
    job->metrics = calloc(1, sizeof *job->metrics);
    if (!job->metrics) return TSR_ENOMEM;
    if (!(job->metrics[0] = strdup(json_string_value(v)))) return TSR_ENOMEM;
    job->n_metrics = 1;
    return 0;
  }
  if (!json_is_array(v))
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "metrics must be a list of names, e.g. [\"accuracy\"]");
  size_t n = json_array_size(v);
  job->metrics = calloc(n ? n : 1, sizeof *job->metrics);
  if (!job->metrics) return TSR_ENOMEM;
  for (size_t i = 0; i < n; i++) {
    json_t *m = json_array_get(v, i);
    char canon[256], e2[400];
    if (!json_is_string(m) && !json_is_object(m))
      return tsr_errf(err, errlen, TSR_ECONFIG,
                      "metrics[%zu] must be a string or a serialized Keras "
                      "metric", i);
    int rc = tsr_metric_canon(m, canon, sizeof canon, e2, sizeof e2);
    if (rc) return tsr_errf(err, errlen, rc, "metrics[%zu]: %s", i, e2);
    if (!(job->metrics[i] = strdup(canon))) return TSR_ENOMEM;
    job->n_metrics++;
  }
  return 0;
}

static int jk_optimizer(tsr_job *job, json_t *v, const char *where,
                        const char *base_dir, const tsr__jk_row *row,
                        char *err, size_t errlen) {
  return tsr_optim_parse(v, &job->optimizer, err, errlen);
}

static int jk_data(tsr_job *job, json_t *v, const char *where,
                   const char *base_dir, const tsr__jk_row *row, char *err,
                   size_t errlen) {
  if (!json_is_object(v))
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "data must be an object {\"train\": {...}, \"eval\": "
                    "{...}}");
  job->data = json_incref(v);
  return 0;
}

static int jk_mode(tsr_job *job, json_t *v, const char *where,
                   const char *base_dir, const tsr__jk_row *row, char *err,
                   size_t errlen) {
  if (json_is_string(v) &&
      !tsr_mode_parse(json_string_value(v), &job->mode, &job->staleness))
    return 0;
  char *d = json_dumps(v, JSON_ENCODE_ANY);
  int rc = tsr_errf(err, errlen, TSR_ECONFIG,
                    "mode %s is not \"async\", \"ssp:S\" or \"sync\"",
                    d ? d : "?");
  free(d);
  return rc;
}

static int jk_partitioner(tsr_job *job, json_t *v, const char *where,
                          const char *base_dir, const tsr__jk_row *row,
                          char *err, size_t errlen) {
  return tsr_partitioner_parse(v, &job->partitioner, err, errlen);
}

static int jk_placement(tsr_job *job, json_t *v, const char *where,
                        const char *base_dir, const tsr__jk_row *row,
                        char *err, size_t errlen) {
  if (!json_is_string(v))
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "placement must be \"balanced\" or \"round_robin\"");
  if (tsr_placement_parse(json_string_value(v), &job->partitioner.placement,
                          err, errlen))
    return TSR_ECONFIG;
  return 0;
}

/* fp32 (or float32), bf16 (or bf16_alias) and, when fp16_alias is not
 * NULL, fp16 (or fp16_alias); -1 for anything else. */
static int jk_prec_name(const char *p, const char *bf16_alias,
                        const char *fp16_alias, tsr_precision *out) {
  if (strcmp(p, "fp32") == 0 || strcmp(p, "float32") == 0)
    *out = TSR_PREC_FP32;
  else if (strcmp(p, "bf16") == 0 || strcmp(p, bf16_alias) == 0)
    *out = TSR_PREC_BF16;
  else if (fp16_alias && (strcmp(p, "fp16") == 0 || strcmp(p, fp16_alias) == 0))
    *out = TSR_PREC_FP16;
  else
    return -1;
  return 0;
}

static int jk_precision(tsr_job *job, json_t *v, const char *where,
                        const char *base_dir, const tsr__jk_row *row,
                        char *err, size_t errlen) {
  const char *p = json_is_string(v) ? json_string_value(v) : "";
  if (jk_prec_name(p, "mixed_bfloat16", "mixed_float16", &job->precision))
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "precision \"%s\" is not fp32, bf16 or fp16", p);
  return 0;
}

/* After mode (the rows' order): prefetching is refused outside async. */
static int jk_prefetch_params(tsr_job *job, json_t *v, const char *where,
                              const char *base_dir, const tsr__jk_row *row,
                              char *err, size_t errlen) {
  if (!json_is_boolean(v))
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "prefetch_params must be true or false");
  job->prefetch_params = json_is_true(v);
  if (job->prefetch_params && job->mode != TSR_MODE_ASYNC)
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "prefetch_params needs mode \"async\" (it computes "
                    "each step with the values pulled during the one "
                    "before: one more step of staleness)");
  return 0;
}

/* A value that is one of two names: *is_second says which. -1 for
 * anything else (*is_second untouched). */
static int jk_either(json_t *v, const char *first, const char *second,
                     bool *is_second) {
  const char *s = json_is_string(v) ? json_string_value(v) : NULL;
  if (!s || (strcmp(s, first) && strcmp(s, second))) return -1;
  *is_second = !strcmp(s, second);
  return 0;
}

/* After prefetch_params (the rows' order): dense values are never pulled
 * when they live on the workers. */
static int jk_dense(tsr_job *job, json_t *v, const char *where,
                    const char *base_dir, const tsr__jk_row *row, char *err,
                    size_t errlen) {
  if (jk_either(v, "ps", "allreduce", &job->dense_allreduce)) {
    char *d = json_dumps(v, JSON_ENCODE_ANY);
    int rc = tsr_errf(err, errlen, TSR_ECONFIG,
                      "dense %s is not \"ps\" or \"allreduce\"", d ? d : "?");
    free(d);
    return rc;
  }
  if (job->dense_allreduce && job->prefetch_params)
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "prefetch_params with dense \"allreduce\": dense values "
                    "live on the workers and are never pulled");
  return 0;
}

static int jk_wire_precision(tsr_job *job, json_t *v, const char *where,
                             const char *base_dir, const tsr__jk_row *row,
                             char *err, size_t errlen) {
  const char *p = json_is_string(v) ? json_string_value(v) : "";
  if (jk_prec_name(p, "bfloat16", NULL, &job->wire_precision))
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "wire_precision \"%s\" is not fp32 or bf16", p);
  return 0;
}

static int jk_sparse_rows(tsr_job *job, json_t *v, const char *where,
                          const char *base_dir, const tsr__jk_row *row,
                          char *err, size_t errlen) {
  if (jk_either(v, "on_touch", "materialized", &job->sparse_materialized))
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "sparse_rows must be \"on_touch\" (rows held once "
                    "pushed) or \"materialized\" (every row from the start)");
  return 0;
}

static int jk_seed(tsr_job *job, json_t *v, const char *where,
                   const char *base_dir, const tsr__jk_row *row, char *err,
                   size_t errlen) {
  if (!json_is_integer(v) || json_integer_value(v) < 0)
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "seed must be a non-negative integer");
  job->seed = (uint64_t)json_integer_value(v);
  return 0;
}

static int jk_checkpoint(tsr_job *job, json_t *v, const char *where,
                         const char *base_dir, const tsr__jk_row *row,
                         char *err, size_t errlen) {
  if (json_is_string(v)) {
    free(job->checkpoint_dir);
    job->checkpoint_dir = strdup(json_string_value(v));
    return job->checkpoint_dir ? 0 : TSR_ENOMEM;
  }
  if (!json_is_object(v))
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "checkpoint must be a folder path or {\"dir\", "
                    "\"every_steps\", \"keep\"}");
  return tsr__jk_read(job, v, row->key, row->sub, row->nsub, base_dir, err,
                      errlen);
}

static int jk_checkpoint_storage(tsr_job *job, json_t *v, const char *where,
                                 const char *base_dir, const tsr__jk_row *row,
                                 char *err, size_t errlen) {
  if (jk_either(v, "shared", "per_ps", &job->checkpoint_per_ps))
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "checkpoint.storage must be \"shared\" (one folder "
                    "every process sees) or \"per_ps\" (each PS its own)");
  return 0;
}

/* ---- the README's table --------------------------------------------------*/

void tsr__jk_type(const tsr__jk_row *r, char *buf, size_t len) {
  switch (r->kind) {
    case TSR__JK_INT:
      if (r->hi >= INT64_MAX / 2)
        snprintf(buf, len, "integer >= %lld", (long long)r->lo);
      else
        snprintf(buf, len, "integer %lld..%lld", (long long)r->lo,
                 (long long)r->hi);
      return;
    case TSR__JK_SECS: snprintf(buf, len, "seconds >= 0"); return;
    case TSR__JK_PATH: snprintf(buf, len, "path"); return;
    case TSR__JK_FN:
    case TSR__JK_NOTE: snprintf(buf, len, "%s", r->type); return;
  }
  snprintf(buf, len, "?");
}

static void md_rows(FILE *f, const char *prefix, const tsr__jk_row *rows,
                    size_t n) {
  for (size_t i = 0; i < n; i++) {
    const tsr__jk_row *r = &rows[i];
    char type[64];
    tsr__jk_type(r, type, sizeof type);
    fprintf(f, "| `%s%s` | %s | %s | %s |\n", prefix, r->key, type, r->def,
            r->doc);
    if (r->sub) {
      char sub[64];
      snprintf(sub, sizeof sub, "%s%s.", prefix, r->key);
      md_rows(f, sub, r->sub, r->nsub);
    }
  }
}

char *tsr_job_keys_markdown(void) {
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  if (!f) return NULL;
  fputs("| key | type | default | meaning |\n|---|---|---|---|\n", f);
  md_rows(f, "", tsr__job_keys, tsr__job_nkeys);
  if (fclose(f) != 0) {
    free(text);
    return NULL;
  }
  return text;
}
