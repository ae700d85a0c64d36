/* Cluster spec from Slurm, as TensorFlow's SlurmClusterResolver builds it:
 * the step's node list (SLURM_STEP_NODELIST or SLURM_JOB_NODELIST, a
 * hostlist expression such as "node[01-03,07],gpu5") and tasks per node
 * (SLURM_STEP_TASKS_PER_NODE or SLURM_TASKS_PER_NODE, "2(x3),1") give an
 * ordered list of task addresses, host:port_base+k for the k-th task on a
 * host; ranks are dealt to the jobs in order ("ps:2,worker:*", where * takes
 * the rest), and SLURM_PROCID picks this process's task.
 */
#include "common/cluster.h"
#include "common/err.h"
#include "common/grow.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TSR__MAX_HOSTS 65536

typedef struct {
  char **v;
  size_t n, cap;
} tsr__strvec;

static int tsr__push(tsr__strvec *s, const char *str, size_t len) {
  if (s->n == TSR__MAX_HOSTS) return TSR_ERANGE;
  if (tsr_grow(&s->v, &s->cap, s->n, sizeof *s->v, 16)) return TSR_ENOMEM;
  char *c = malloc(len + 1);
  if (!c) return TSR_ENOMEM;
  memcpy(c, str, len);
  c[len] = 0;
  s->v[s->n++] = c;
  return 0;
}

static void tsr__strvec_free(tsr__strvec *s) {
  for (size_t i = 0; i < s->n; i++) free(s->v[i]);
  free(s->v);
  memset(s, 0, sizeof *s);
}

/* Expands one hostlist item: "pre[01-03,7]post" or a plain name. Only one
 * bracket group per item, as Slurm writes node lists. */
static int tsr__expand_item(const char *item, size_t len, tsr__strvec *out,
                            char *err, size_t errlen) {
  const char *lb = memchr(item, '[', len);
  if (!lb) return tsr__push(out, item, len) ? TSR_ENOMEM : 0;
  const char *rb = memchr(lb, ']', len - (size_t)(lb - item));
  if (!rb)
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "node list item \"%.*s\": missing ']'", (int)len, item);
  size_t plen = (size_t)(lb - item);
  const char *post = rb + 1;
  size_t postlen = len - (size_t)(post - item);
  const char *p = lb + 1;
  while (p < rb) {
    const char *comma = memchr(p, ',', (size_t)(rb - p));
    const char *end = comma ? comma : rb;
    const char *dash = memchr(p, '-', (size_t)(end - p));
    char *e1;
    errno = 0;
    long lo = strtol(p, &e1, 10), hi = lo;
    int width = (int)((dash ? dash : end) - p);
    if (e1 != (dash ? dash : end) || errno || lo < 0)
      return tsr_errf(err, errlen, TSR_ECONFIG,
                      "node list range \"%.*s\" is not a " "number",
                      (int)(end - p), p);
    if (dash) {
      char *e2;
      hi = strtol(dash + 1, &e2, 10);
      if (e2 != end || hi < lo || hi - lo > TSR__MAX_HOSTS)
        return tsr_errf(err, errlen, TSR_ECONFIG,
                        "node list range \"%.*s\" is not " "LO-HI",
                        (int)(end - p), p);
    }
    for (long k = lo; k <= hi; k++) {
      char name[512];
      int n = snprintf(name, sizeof name, "%.*s%0*ld%.*s", (int)plen, item,
                       width, k, (int)postlen, post);
      if (n < 0 || (size_t)n >= sizeof name)
        return tsr_errf(err, errlen, TSR_ECONFIG, "node name too long");
      int rc = tsr__push(out, name, (size_t)n);
      if (rc)
        return rc == TSR_ERANGE ? tsr_errf(err, errlen, TSR_ECONFIG,
                                           "too many nodes")
                                : rc;
    }
    p = end + 1;
  }
  return 0;
}

static int tsr__expand_hostlist(const char *s, tsr__strvec *out, char *err,
                                size_t errlen) {
  const char *p = s;
  while (*p) {
    /* an item ends at a comma outside brackets */
    const char *q = p;
    int depth = 0;
    while (*q && (depth || *q != ',')) {
      if (*q == '[') depth++;
      if (*q == ']') depth--;
      q++;
    }
    if (q == p)
      return tsr_errf(err, errlen, TSR_ECONFIG,
                      "node list \"%s\" has an empty item", s);
    int rc = tsr__expand_item(p, (size_t)(q - p), out, err, errlen);
    if (rc) return rc;
    p = *q ? q + 1 : q;
  }
  return 0;
}

/* "2(x3),1" -> counts per node. */
static int tsr__tasks_per_node(const char *s, size_t n_nodes, long *counts,
                               char *err, size_t errlen) {
  size_t k = 0;
  const char *p = s;
  while (*p) {
    char *e;
    errno = 0;
    long c = strtol(p, &e, 10);
    if (e == p || errno || c <= 0)
      return tsr_errf(err, errlen, TSR_ECONFIG,
                      "tasks per node \"%s\" is malformed", s);
    long rep = 1;
    if (*e == '(') {
      if (e[1] != 'x')
        return tsr_errf(err, errlen, TSR_ECONFIG,
                        "tasks per node \"%s\" is malformed", s);
      rep = strtol(e + 2, &e, 10);
      if (*e != ')' || rep <= 0)
        return tsr_errf(err, errlen, TSR_ECONFIG,
                        "tasks per node \"%s\" is malformed", s);
      e++;
    }
    for (long r = 0; r < rep; r++) {
      if (k == n_nodes)
        return tsr_errf(err, errlen, TSR_ECONFIG,
                        "tasks per node \"%s\" names more "
                        "nodes than the node list (%zu)", s, n_nodes);
      counts[k++] = c;
    }
    if (*e == ',') e++;
    else if (*e)
      return tsr_errf(err, errlen, TSR_ECONFIG,
                      "tasks per node \"%s\" is malformed", s);
    p = e;
  }
  if (k != n_nodes)
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "tasks per node \"%s\" covers %zu nodes, "
                    "the node list has %zu", s, k, n_nodes);
  return 0;
}

static const char *tsr__env2(const char *a, const char *b) {
  const char *v = getenv(a);
  if (v && *v) return v;
  v = getenv(b);
  return v && *v ? v : NULL;
}

int tsr_cluster_from_slurm(const char *jobs, int port_base, tsr_cluster *out,
                           char *err, size_t errlen) {
  tsr_cluster_init(out);
  const char *procid = getenv("SLURM_PROCID");
  const char *nodelist = tsr__env2("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST");
  const char *tpn = tsr__env2("SLURM_STEP_TASKS_PER_NODE",
                              "SLURM_TASKS_PER_NODE");
  if (!procid || !nodelist || !tpn)
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "Slurm: SLURM_PROCID, SLURM_JOB_NODELIST "
                    "and SLURM_TASKS_PER_NODE must be set");
  if (port_base < 1 || port_base > 65535)
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "Slurm: port base %d is not in 1..65535", port_base);
  char *e;
  errno = 0;
  long rank = strtol(procid, &e, 10);
  if (*e || errno || rank < 0)
    return tsr_errf(err, errlen, TSR_ECONFIG,
                    "Slurm: SLURM_PROCID \"%s\" is not a rank", procid);
  tsr__strvec hosts = {0};
  long *counts = NULL;
  int rc = tsr__expand_hostlist(nodelist, &hosts, err, errlen);
  if (rc) goto out;
  counts = calloc(hosts.n ? hosts.n : 1, sizeof *counts);
  if (!counts) {
    rc = TSR_ENOMEM;
    goto out;
  }
  rc = tsr__tasks_per_node(tpn, hosts.n, counts, err, errlen);
  if (rc) goto out;
  long total = 0;
  for (size_t i = 0; i < hosts.n; i++) {
    total += counts[i];
    if (port_base + counts[i] - 1 > 65535) {
      rc = tsr_errf(err, errlen, TSR_ECONFIG,
                    "Slurm: %ld tasks on %s from port %d run " "past 65535",
                    counts[i], hosts.v[i], port_base);
      goto out;
    }
  }
  if (rank >= total) {
    rc = tsr_errf(err, errlen, TSR_ECONFIG,
                  "Slurm: SLURM_PROCID %ld but only %ld tasks", rank, total);
    goto out;
  }
  /* Jobs: "ps:2,worker:*"; default TF's: every task a worker. */
  const char *spec = jobs && *jobs ? jobs : "worker:*";
  long assigned[TSR_TASK__COUNT] = {0};
  tsr_task_type order[TSR_TASK__COUNT];
  int n_order = 0, star = -1;
  char buf[256];
  snprintf(buf, sizeof buf, "%s", spec);
  char *save = NULL;
  long used = 0;
  for (char *tok = strtok_r(buf, ",", &save); tok;
       tok = strtok_r(NULL, ",", &save)) {
    char *colon = strchr(tok, ':');
    if (!colon) {
      rc = tsr_errf(err, errlen, TSR_ECONFIG,
                    "Slurm jobs \"%s\": item \"%s\" is not " "JOB:COUNT", spec,
                    tok);
      goto out;
    }
    *colon = 0;
    tsr_task_type t = tsr_task_type_parse(tok);
    if (t == TSR_TASK_NONE || n_order == TSR_TASK__COUNT) {
      rc = tsr_errf(err, errlen, TSR_ECONFIG,
                    "Slurm jobs \"%s\": job \"%s\" is not "
                    "chief, worker, ps or evaluator", spec, tok);
      goto out;
    }
    for (int k = 0; k < n_order; k++)
      if (order[k] == t) {
        rc = tsr_errf(err, errlen, TSR_ECONFIG,
                      "Slurm jobs \"%s\": job \"%s\" twice", spec, tok);
        goto out;
      }
    order[n_order] = t;
    if (strcmp(colon + 1, "*") == 0) {
      if (star >= 0) {
        rc = tsr_errf(err, errlen, TSR_ECONFIG,
                      "Slurm jobs \"%s\": only one job may "
                      "take the rest (*)", spec);
        goto out;
      }
      star = n_order;
    } else {
      long c = strtol(colon + 1, &e, 10);
      if (*e || c < 0) {
        rc = tsr_errf(err, errlen, TSR_ECONFIG,
                      "Slurm jobs \"%s\": count \"%s\" is not " "a number",
                      spec, colon + 1);
        goto out;
      }
      assigned[t] = c;
      used += c;
    }
    n_order++;
  }
  if (used > total || (star < 0 && used != total)) {
    rc = tsr_errf(err, errlen, TSR_ECONFIG,
                  "Slurm jobs \"%s\" ask for %ld tasks; the " "step has %ld",
                  spec, used, total);
    goto out;
  }
  if (star >= 0) assigned[order[star]] = total - used;
  /* Deal the ordered addresses to the jobs in order. */
  long next = 0;
  size_t host = 0;
  long on_host = 0;
  for (int k = 0; k < n_order; k++) {
    tsr_task_type t = order[k];
    out->n[t] = (int)assigned[t];
    out->jobs[t] = calloc(assigned[t] ? (size_t)assigned[t] : 1,
                          sizeof(tsr_task_addr));
    if (!out->jobs[t]) {
      rc = TSR_ENOMEM;
      goto out;
    }
    for (long i = 0; i < assigned[t]; i++, next++) {
      while (on_host >= counts[host]) {
        host++;
        on_host = 0;
      }
      tsr_task_addr *a = &out->jobs[t][i];
      a->index = (int)i;
      snprintf(a->host, sizeof a->host, "%s", hosts.v[host]);
      a->port = port_base + (int)on_host;
      snprintf(a->addr, sizeof a->addr, "%s:%d", a->host, a->port);
      if (next == rank) {
        out->task_type = t;
        out->task_index = (int)i;
      }
      on_host++;
    }
  }
  rc = tsr_cluster_validate(out, err, errlen);
out:
  tsr__strvec_free(&hosts);
  free(counts);
  if (rc) tsr_cluster_free(out);
  return rc;
}
