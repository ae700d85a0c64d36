/* TF_CONFIG and --cluster/--task resolution. The happy path: parse the JSON
 * with jansson, read every job in either form into a sorted array, read the
 * task, validate with TF's rules. Every error is one line that names the
 * key and the value; nothing is half-filled on error (the struct is freed).
 */
#include "common/cluster.h"
#include "common/err.h"
#include "common/job.h"

#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const tsr__task_names[TSR_TASK__COUNT] = {
    "chief", "worker", "ps", "evaluator"};

const char *tsr_task_type_name(tsr_task_type t) {
  if (t < 0 || t >= TSR_TASK__COUNT) return "none";
  return tsr__task_names[t];
}

tsr_task_type tsr_task_type_parse(const char *s) {
  for (int i = 0; i < TSR_TASK__COUNT; i++)
    if (strcmp(s, tsr__task_names[i]) == 0) return (tsr_task_type)i;
  return TSR_TASK_NONE;
}

void tsr_cluster_init(tsr_cluster *c) {
  memset(c, 0, sizeof *c);
  c->task_type = TSR_TASK_NONE;
  c->task_index = -1;
}

void tsr_cluster_free(tsr_cluster *c) {
  for (int i = 0; i < TSR_TASK__COUNT; i++) free(c->jobs[i]);
  tsr_cluster_init(c);
}

int tsr_addr_parse(const char *s, tsr_task_addr *a, char *err,
                   size_t errlen) {
  memset(a, 0, sizeof *a);
  if (!s || !*s)
    return tsr_errf(err, errlen, TSR_ECONFIG, "empty address");
  if (strlen(s) >= sizeof a->addr)
    return tsr_errf(err, errlen, TSR_ECONFIG, "address \"%.40s...\" too long",
                    s);
  const char *colon;
  const char *host = s;
  size_t hostlen;
  if (s[0] == '[') {
    const char *close = strchr(s, ']');
    if (!close || close[1] != ':')
      return tsr_errf(err, errlen, TSR_ECONFIG,
                      "address \"%s\": expected [ipv6]:port", s);
    host = s + 1;
    hostlen = (size_t)(close - host);
    colon = close + 1;
  } else {
    colon = strrchr(s, ':');
    if (!colon)
      return tsr_errf(err, errlen, TSR_ECONFIG,
                      "address \"%s\": expected host:port", s);
    if (memchr(s, ':', (size_t)(colon - s)))
      return tsr_errf(err, errlen, TSR_ECONFIG,
                      "address \"%s\": an IPv6 host needs brackets, "
                      "[::1]:port", s);
    hostlen = (size_t)(colon - s);
  }
  if (hostlen == 0)
    return tsr_errf(err, errlen, TSR_ECONFIG, "address \"%s\": empty host",
                    s);
  const char *ps = colon + 1;
  if (!*ps)
    return tsr_errf(err, errlen, TSR_ECONFIG, "address \"%s\": empty port",
                    s);
  char *end;
  errno = 0;
  long port = strtol(ps, &end, 10);
  if (*end || errno || port < 1 || port > 65535)
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "address \"%s\": port \"%s\" is not in 1..65535", s, ps);
  memcpy(a->host, host, hostlen);
  a->host[hostlen] = 0;
  a->port = (int)port;
  snprintf(a->addr, sizeof a->addr, "%s", s);
  return 0;
}

static int tsr__cmp_task(const void *x, const void *y) {
  const tsr_task_addr *a = x, *b = y;
  return (a->index > b->index) - (a->index < b->index);
}

/* Integer from a JSON integer or an integer string; -1 on failure. */
static long long tsr__json_index(json_t *v) {
  if (json_is_integer(v)) return json_integer_value(v);
  if (json_is_string(v)) {
    const char *s = json_string_value(v);
    char *end;
    errno = 0;
    long long x = strtoll(s, &end, 10);
    if (*s && !*end && !errno) return x;
  }
  return LLONG_MIN;
}

/* One task's address: cluster.NAME[i] of a list, or cluster.NAME["key"]
 * of a map (key not NULL). */
static int tsr__parse_task_addr(json_t *v, const char *src, const char *name,
                                const char *key, size_t i, tsr_task_addr *a,
                                char *err, size_t errlen) {
  char at[32], emsg[TSR_ERRBUF];
  snprintf(at, sizeof at, "%zu", i);
  const char *q = key ? "\"" : "", *k = key ? key : at;
  if (!json_is_string(v))
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "%s: cluster.%s[%s%s%s] must be a \"host:port\" string",
                    src, name, q, k, q);
  if (tsr_addr_parse(json_string_value(v), a, emsg, sizeof emsg))
    return tsr_errf(err, errlen, TSR_ECONFIG, "%s: cluster.%s[%s%s%s]: %s",
                    src, name, q, k, q, emsg);
  return 0;
}

static int tsr__parse_job(tsr_cluster *c, const char *src, const char *name,
                          json_t *job, char *err, size_t errlen) {
  tsr_task_type t = tsr_task_type_parse(name);
  if (t == TSR_TASK_NONE) {
    if (strcmp(name, "master") == 0)
      return tsr_errf(err, errlen, TSR_ECONFIG,
                      "%s: cluster job \"master\" is TF1's name; use \"chief\"",
                      src);
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "%s: cluster job \"%s\" is not one of chief, worker, ps, "
                    "evaluator", src, name);
  }
  size_t n;
  if (json_is_array(job)) {
    n = json_array_size(job);
  } else if (json_is_object(job)) {
    n = json_object_size(job);
    c->sparse[t] = true;
  } else {
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "%s: cluster.%s must be a list of \"host:port\" or a map "
                    "{\"index\": \"host:port\"}", src, name);
  }
  if (n > 100000)
    return tsr_errf(err, errlen, TSR_ECONFIG, "%s: cluster.%s has %zu tasks",
                    src, name, n);
  tsr_task_addr *arr = calloc(n ? n : 1, sizeof *arr);
  if (!arr) return tsr_errf(err, errlen, TSR_ENOMEM, "out of memory");
  c->jobs[t] = arr;
  c->n[t] = (int)n;
  int rc;
  if (json_is_array(job)) {
    for (size_t i = 0; i < n; i++) {
      if ((rc = tsr__parse_task_addr(json_array_get(job, i), src, name, NULL,
                                     i, &arr[i], err, errlen)))
        return rc;
      arr[i].index = (int)i;
    }
    return 0;
  }
  const char *key;
  json_t *v;
  size_t i = 0;
  json_object_foreach(job, key, v) {
    char *end;
    errno = 0;
    long idx = strtol(key, &end, 10);
    if (!*key || *end || errno || idx < 0 || idx > INT_MAX)
      return tsr_errf(err, errlen, TSR_ECONFIG,
                      "%s: cluster.%s key \"%s\" is not a task index", src,
                      name, key);
    if ((rc = tsr__parse_task_addr(v, src, name, key, 0, &arr[i], err,
                                   errlen)))
      return rc;
    arr[i].index = (int)idx;
    i++;
  }
  qsort(arr, n, sizeof *arr, tsr__cmp_task);
  for (size_t k = 1; k < n; k++)
    if (arr[k].index == arr[k - 1].index)
      return tsr_errf(err, errlen, TSR_ECONFIG,
                      "%s: cluster.%s index %d appears twice", src, name,
                      arr[k].index);
  return 0;
}

static int tsr__parse_task(tsr_cluster *c, const char *src, json_t *task,
                           char *err, size_t errlen) {
  if (!json_is_object(task))
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "%s: \"task\" must be an object {\"type\": ..., "
                    "\"index\": ...}", src);
  const char *key;
  json_t *v;
  json_object_foreach(task, key, v) {
    if (strcmp(key, "type") && strcmp(key, "index") && strcmp(key, "trial"))
      return tsr_errf(err, errlen, TSR_ECONFIG,
                      "%s: unknown key task.%s", src, key);
  }
  json_t *type = json_object_get(task, "type");
  if (!type || !json_is_string(type))
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "%s: task.type must be a string (chief, worker, ps, "
                    "evaluator)", src);
  const char *ts = json_string_value(type);
  tsr_task_type t = tsr_task_type_parse(ts);
  if (t == TSR_TASK_NONE)
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "%s: task.type \"%s\" is not one of chief, worker, ps, "
                    "evaluator", src, ts);
  json_t *idx = json_object_get(task, "index");
  long long i = 0; /* TF: index defaults to 0 */
  if (idx) {
    i = tsr__json_index(idx);
    if (i == LLONG_MIN || i < 0 || i > INT_MAX) {
      char *dump = json_dumps(idx, JSON_ENCODE_ANY);
      int rc = tsr_errf(err, errlen, TSR_ECONFIG,
                        "%s: task.index %s is not a non-negative integer",
                        src, dump ? dump : "?");
      free(dump);
      return rc;
    }
  }
  c->task_type = t;
  c->task_index = (int)i;
  return 0;
}

int tsr_cluster_parse(const char *json_text, const char *source,
                      tsr_cluster *out, char *err, size_t errlen) {
  const char *src = source ? source : "TF_CONFIG";
  tsr_cluster_init(out);
  json_error_t je;
  json_t *root = json_loads(json_text, JSON_REJECT_DUPLICATES, &je);
  if (!root)
    return tsr_errf(err, errlen, TSR_EJSON, "%s: malformed JSON at line %d "
                    "column %d: %s", src, je.line, je.column, je.text);
  int rc = 0;
  if (!json_is_object(root)) {
    rc = tsr_errf(err, errlen, TSR_ECONFIG, "%s: must be a JSON object",
                  src);
    goto out;
  }
  json_t *cluster = json_object_get(root, "cluster");
  json_t *task = json_object_get(root, "task");
  if (!cluster && !task) {
    /* A bare cluster map, as --cluster files may hold. */
    cluster = root;
  } else {
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
      /* TF also sets rpc_layer and environment; they are accepted. */
      if (strcmp(key, "cluster") && strcmp(key, "task") &&
          strcmp(key, "rpc_layer") && strcmp(key, "environment")) {
        rc = tsr_errf(err, errlen, TSR_ECONFIG, "%s: unknown key \"%s\"",
                      src, key);
        goto out;
      }
    }
  }
  if (!cluster) {
    rc = tsr_errf(err, errlen, TSR_ECONFIG, "%s: missing key \"cluster\"",
                  src);
    goto out;
  }
  if (!json_is_object(cluster)) {
    rc = tsr_errf(err, errlen, TSR_ECONFIG,
                  "%s: \"cluster\" must be an object of jobs", src);
    goto out;
  }
  const char *name;
  json_t *job;
  json_object_foreach(cluster, name, job) {
    rc = tsr__parse_job(out, src, name, job, err, errlen);
    if (rc) goto out;
  }
  if (task) {
    rc = tsr__parse_task(out, src, task, err, errlen);
    if (rc) goto out;
  }
  rc = tsr_cluster_validate(out, err, errlen);
out:
  json_decref(root);
  if (rc) tsr_cluster_free(out);
  return rc;
}

const tsr_task_addr *tsr_cluster_find(const tsr_cluster *c, tsr_task_type t,
                                      int index) {
  if (t < 0 || t >= TSR_TASK__COUNT) return NULL;
  for (int i = 0; i < c->n[t]; i++)
    if (c->jobs[t][i].index == index) return &c->jobs[t][i];
  return NULL;
}

int tsr_cluster_validate(const tsr_cluster *c, char *err, size_t errlen) {
  int total = 0;
  for (int i = 0; i < TSR_TASK__COUNT; i++) total += c->n[i];
  if (total == 0)
    return tsr_errf(err, errlen, TSR_ECONFIG, "cluster has no tasks");
  if (c->n[TSR_TASK_CHIEF] > 1)
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "cluster.chief has %d tasks; there must be at most one "
                    "chief", c->n[TSR_TASK_CHIEF]);
  if (c->n[TSR_TASK_EVALUATOR] > 1)
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "cluster.evaluator has %d tasks; there must be at most "
                    "one evaluator", c->n[TSR_TASK_EVALUATOR]);
  if (c->task_type == TSR_TASK_NONE) return 0;
  tsr_task_type t = c->task_type;
  if (c->n[t] == 0) {
    if (t == TSR_TASK_EVALUATOR) return 0; /* a sidecar, as in TF */
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "task.type \"%s\" has no job in the cluster",
                    tsr_task_type_name(t));
  }
  if (!tsr_cluster_find(c, t, c->task_index)) {
    if (c->sparse[t])
      return tsr_errf(err, errlen, TSR_ECONFIG,
                      "task.index %d is not a task of cluster.%s",
                      c->task_index, tsr_task_type_name(t));
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "task.index %d is out of range: cluster.%s has %d "
                    "task(s)", c->task_index, tsr_task_type_name(t),
                    c->n[t]);
  }
  return 0;
}

int tsr_cluster_check_ps_training(const tsr_cluster *c, char *err,
                                  size_t errlen) {
  if (c->n[TSR_TASK_PS] < 1)
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "cluster.ps: parameter-server training needs at least "
                    "one ps task");
  if (c->n[TSR_TASK_WORKER] < 1)
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "cluster.worker: parameter-server training needs at "
                    "least one worker task");
  return 0;
}

int tsr_cluster_set_task(tsr_cluster *c, const char *task_flag, char *err,
                         size_t errlen) {
  const char *colon = strchr(task_flag, ':');
  char type[32];
  if (!colon || (size_t)(colon - task_flag) >= sizeof type)
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "--task \"%s\": expected TYPE:INDEX, e.g. worker:0",
                    task_flag);
  memcpy(type, task_flag, (size_t)(colon - task_flag));
  type[colon - task_flag] = 0;
  tsr_task_type t = tsr_task_type_parse(type);
  if (t == TSR_TASK_NONE)
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "--task \"%s\": type \"%s\" is not one of chief, worker, "
                    "ps, evaluator", task_flag, type);
  char *end;
  errno = 0;
  long idx = strtol(colon + 1, &end, 10);
  if (!colon[1] || *end || errno || idx < 0 || idx > INT_MAX)
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "--task \"%s\": index \"%s\" is not a non-negative "
                    "integer", task_flag, colon + 1);
  c->task_type = t;
  c->task_index = (int)idx;
  return 0;
}

int tsr_cluster_load(const char *cluster_file, const char *task_flag,
                     tsr_cluster *out, char *err, size_t errlen) {
  int rc = 0;
  tsr_cluster_init(out);
  if (cluster_file) {
    char *text = tsr_read_file(cluster_file, NULL, &rc, err, errlen);
    if (!text) return rc;
    rc = tsr_cluster_parse(text, cluster_file, out, err, errlen);
    free(text);
  } else {
    const char *env = getenv("TF_CONFIG");
    const char *slurm = getenv("SLURM_PROCID");
    if ((!env || !*env) && slurm && *slurm) {
      const char *pb = getenv("TESSERA_SLURM_PORT_BASE");
      int port_base = pb && *pb ? atoi(pb) : 8888;
      rc = tsr_cluster_from_slurm(getenv("TESSERA_SLURM_JOBS"), port_base,
                                  out, err, errlen);
    } else if (!env || !*env) {
      return tsr_errf(err, errlen, TSR_ECONFIG,
                      "no cluster: set TF_CONFIG or pass --cluster FILE.json "
                      "(or run under Slurm)");
    } else {
      rc = tsr_cluster_parse(env, "TF_CONFIG", out, err, errlen);
    }
  }
  if (rc) return rc;
  if (task_flag) {
    rc = tsr_cluster_set_task(out, task_flag, err, errlen);
    if (!rc) rc = tsr_cluster_validate(out, err, errlen);
    if (rc) tsr_cluster_free(out);
  }
  return rc;
}

bool tsr_cluster_is_chief(const tsr_cluster *c) {
  if (c->task_type == TSR_TASK_CHIEF) return true;
  return c->n[TSR_TASK_CHIEF] == 0 && c->task_type == TSR_TASK_WORKER &&
         c->task_index == 0;
}

const tsr_task_addr *tsr_cluster_chief(const tsr_cluster *c) {
  if (c->n[TSR_TASK_CHIEF] > 0) return &c->jobs[TSR_TASK_CHIEF][0];
  return tsr_cluster_find(c, TSR_TASK_WORKER, 0);
}

void tsr_task_listen_addr(const tsr_task_addr *a, char *out, size_t cap) {
  unsigned char buf[16];
  if (inet_pton(AF_INET, a->host, buf) == 1)
    snprintf(out, cap, "%s:%d", a->host, a->port);
  else if (inet_pton(AF_INET6, a->host, buf) == 1)
    snprintf(out, cap, "[%s]:%d", a->host, a->port);
  else if (strcmp(a->host, "localhost") == 0)
    snprintf(out, cap, "127.0.0.1:%d", a->port);
  else
    snprintf(out, cap, "[::]:%d", a->port);
}

char *tsr_cluster_to_json(const tsr_cluster *c) {
  json_t *root = json_object();
  json_t *cl = json_object();
  for (int t = 0; t < TSR_TASK__COUNT; t++) {
    if (c->n[t] == 0) continue;
    json_t *job;
    if (c->sparse[t]) {
      job = json_object();
      for (int i = 0; i < c->n[t]; i++) {
        char k[16];
        snprintf(k, sizeof k, "%d", c->jobs[t][i].index);
        json_object_set_new(job, k, json_string(c->jobs[t][i].addr));
      }
    } else {
      job = json_array();
      for (int i = 0; i < c->n[t]; i++)
        json_array_append_new(job, json_string(c->jobs[t][i].addr));
    }
    json_object_set_new(cl, tsr_task_type_name((tsr_task_type)t), job);
  }
  json_object_set_new(root, "cluster", cl);
  if (c->task_type != TSR_TASK_NONE) {
    json_t *task = json_object();
    json_object_set_new(task, "type",
                        json_string(tsr_task_type_name(c->task_type)));
    json_object_set_new(task, "index", json_integer(c->task_index));
    json_object_set_new(root, "task", task);
    const tsr_task_addr *me = tsr_cluster_find(c, c->task_type, c->task_index);
    json_object_set_new(root, "address", me ? json_string(me->addr)
                                            : json_null());
    json_object_set_new(root, "is_chief",
                        json_boolean(tsr_cluster_is_chief(c)));
  }
  const tsr_task_addr *chief = tsr_cluster_chief(c);
  json_object_set_new(root, "chief", chief ? json_string(chief->addr)
                                           : json_null());
  char *s = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
  json_decref(root);
  return s;
}
