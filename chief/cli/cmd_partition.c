/* `tessera partition`: prints every shard's row range and PS for a list of
 * variables, as the chief would place them. Variables come from --var
 * NAME=D0xD1[:dtype] flags; the partitioner from flags or a job file.
 * With each PS's bytes (values and optimizer slots) it prints the memory
 * each PS will need resident (ps_memory). */
#include "chief/cli/cli.h"
#include "common/arg.h"
#include "common/cluster.h"
#include "common/err.h"
#include "common/job.h"
#include "common/partition.h"
#include "kernels/optim.h"
#include "worker/model.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_VARS 4096

static void usage(FILE *f, const void *data) {
  (void)data;
  fprintf(f,
          "usage: tessera partition --var NAME=D0xD1[:dtype] [--var ...]\n"
          "                         [--ps N | --cluster FILE | TF_CONFIG]\n"
          "                         [--partitioner min_size|max_size|fixed]\n"
          "                         [--min-shard-bytes B] [--max-shard-bytes B]\n"
          "                         [--max-shards K] [--num-shards K]\n"
          "                         [--placement balanced|round_robin]\n"
          "                         [--slots N] [--job JOB.json] [--json]\n"
          "                         [--workers N]\n"
          "With --job and no --var, the job's model gives the variables and\n"
          "its optimizer the slot count (--slots: copies of each variable the\n"
          "optimizer keeps, counted in the per-PS bytes; default 0).\n"
          "A job with dense \"allreduce\" keeps its dense variables on every\n"
          "worker (listed with their bytes per worker: values, gradients and\n"
          "slots; --workers N, default the cluster's) and places only its\n"
          "sparse tables on the PS.\n"
          "dtype: float32 (default), float16, bfloat16, float64, int64, int32,\n"
          "       int8, uint8\n"
          "Defaults: MinSize(min_shard_bytes=256 KiB, max_shards=number of "
          "PS),\nbalanced placement (round_robin is TensorFlow's).\n");
}

/* NAME=D0xD1x...[:dtype]; a bare "NAME=" or "NAME=scalar" is rank 0. */
static int parse_var(const char *arg, tsr_var *v, char *err,
                     size_t errlen) {
  char *namebuf = v->name;
  const char *eq = strchr(arg, '=');
  if (!eq || eq == arg || (size_t)(eq - arg) >= sizeof v->name) {
    snprintf(err, errlen, "--var \"%s\": expected NAME=D0xD1[:dtype]", arg);
    return TSR_EINVAL;
  }
  memcpy(namebuf, arg, (size_t)(eq - arg));
  namebuf[eq - arg] = 0;
  v->dtype = TSR_DT_FLOAT32;
  v->rank = 0;
  const char *p = eq + 1;
  const char *colon = strchr(p, ':');
  if (colon && tsr_dtype_parse(colon + 1, &v->dtype)) {
    snprintf(err, errlen, "--var %s: dtype \"%s\" is not one of "
             "float32, float16, bfloat16, float64, int64, int32, int8, uint8",
             namebuf, colon + 1);
    return TSR_EINVAL;
  }
  if (*p == 0 || *p == ':' || strncmp(p, "scalar", 6) == 0) return 0;
  while (*p && *p != ':') {
    char *end;
    errno = 0;
    long long d = strtoll(p, &end, 10);
    if (end == p || errno) {
      snprintf(err, errlen, "--var %s: dimension \"%.20s\" is not an "
               "integer", namebuf, p);
      return TSR_EINVAL;
    }
    if (v->rank == TSR_MAX_RANK) {
      snprintf(err, errlen, "--var %s: more than %d dimensions", namebuf,
               TSR_MAX_RANK);
      return TSR_EINVAL;
    }
    v->shape[v->rank++] = d;
    p = end;
    if (*p == 'x' || *p == ',') p++;
    else if (*p && *p != ':') {
      snprintf(err, errlen, "--var %s: unexpected \"%c\" in shape",
               namebuf, *p);
      return TSR_EINVAL;
    }
  }
  return 0;
}

/* --var: one more variable (MAX_VARS at most). */
typedef struct {
  tsr_var *vars;
  size_t n;
} pt_vars;

static int add_var(void *data, const char *flag, const char *value,
                   char *err, size_t errlen) {
  (void)flag;
  pt_vars *pv = data;
  if (pv->n == MAX_VARS) {
    snprintf(err, errlen, "more than %d variables", MAX_VARS);
    return TSR_EINVAL;
  }
  int rc = parse_var(value, &pv->vars[pv->n], err, errlen);
  if (!rc) pv->n++;
  return rc;
}

/* What a serving PS holds beside its shards: code, libraries, RPC
 * buffers (an idle PS is 4.5 MiB resident; one serving the
 * billion-parameter job 20 to 30 MiB more than its shards). */
#define PS_BASE_BYTES (32ll << 20)
/* A held row of a table made on first touch, beside its record: its id
 * (8 bytes) and its hash buckets (8 bytes each, 2 to 4 per row). */
#define PS_ROW_INDEX_BYTES (8 + 32)

/* The resident memory each PS will need (ps/README.md): a dense shard
 * its values and slots; a row-sparse one, materialized, its records and
 * a bit per row (the rows an increment saves); made on first touch, its
 * records, index and bit for every row it may hold (an upper bound: the
 * rows the data touches). Plus PS_BASE_BYTES. A checkpoint adds the rows
 * changed while it is written. */
static void ps_memory(const tsr_shard *shards, size_t n, const tsr_var *vars,
                      const int *var_slots, bool materialized, int n_ps,
                      int64_t *mem) {
  for (int i = 0; i < n_ps; i++) mem[i] = PS_BASE_BYTES;
  for (size_t i = 0; i < n; i++) {
    const tsr_shard *s = &shards[i];
    const tsr_var *v = &vars[s->var];
    int64_t width = 1;
    for (int d = 1; d < v->rank; d++) width *= v->shape[d];
    int64_t rec = width * 4 * (1 + var_slots[s->var]);
    int64_t b = s->rows * rec;
    if (v->kind == TSR_VAR_ROW_SPARSE)
      b += s->rows / 8 + (materialized ? 0 : s->rows * PS_ROW_INDEX_BYTES);
    if (s->ps >= 0 && s->ps < n_ps) mem[s->ps] += b;
  }
}

/* Prints text broken at spaces into lines of at most `width`. */
static void print_wrapped(const char *text, size_t width) {
  const char *p = text;
  while (*p) {
    size_t n = strlen(p);
    if (n > width) {
      n = width;
      while (n > 0 && p[n] != ' ') n--;
      if (n == 0) n = width;
    }
    printf("%.*s\n", (int)n, p);
    p += n;
    while (*p == ' ') p++;
  }
}

/* dense "allreduce": moves the dense variables (and their slot counts)
 * out of vars into *wv, keeping the sparse tables; 0 or TSR_ENOMEM. */
static int split_hybrid(tsr_var *vars, int *slots, size_t *n, tsr_var **wv,
                        int **ws, size_t *nw) {
  *wv = calloc(*n ? *n : 1, sizeof **wv);
  *ws = calloc(*n ? *n : 1, sizeof **ws);
  if (!*wv || !*ws) return TSR_ENOMEM;
  size_t k = 0;
  *nw = 0;
  for (size_t i = 0; i < *n; i++) {
    if (vars[i].kind == TSR_VAR_ROW_SPARSE) {
      vars[k] = vars[i];
      slots[k++] = slots[i];
    } else {
      (*wv)[*nw] = vars[i];
      (*ws)[(*nw)++] = slots[i];
    }
  }
  *n = k;
  return 0;
}

/* The variables every worker holds (dense "allreduce"): values, gradient
 * and optimizer slots per worker; into root (JSON) or as a table. */
static void print_workers(const tsr_var *wv, const int *ws, size_t nw,
                          long long n_wk, bool json, json_t *root) {
  int64_t total = 0;
  json_t *arr = json ? json_array() : NULL;
  if (!json)
    printf("\non each of %lld workers (dense \"allreduce\": gradients "
           "all-reduced among the workers)\n%-24s %18s %14s\n", n_wk,
           "VARIABLE", "SHAPE", "BYTES");
  for (size_t i = 0; i < nw; i++) {
    const tsr_var *v = &wv[i];
    int64_t b = v->numel * (int64_t)tsr_dtype_size(v->dtype) * (2 + ws[i]);
    total += b;
    char shape[64];
    size_t o = 0;
    shape[0] = 0;
    for (int d = 0; d < v->rank && o + 24 < sizeof shape; d++)
      o += (size_t)snprintf(shape + o, sizeof shape - o, "%s%lld", d ? "x" : "",
                            (long long)v->shape[d]);
    if (json) {
      json_t *e = json_object();
      json_object_set_new(e, "variable", json_string(v->name));
      json_object_set_new(e, "shape", json_string(shape));
      json_object_set_new(e, "bytes_per_worker", json_integer(b));
      json_array_append_new(arr, e);
    } else {
      printf("%-24s %18s %14lld\n", v->name, shape, (long long)b);
    }
  }
  if (json) {
    json_t *w = json_object();
    json_object_set_new(w, "dense", json_string("allreduce"));
    json_object_set_new(w, "num_workers", json_integer(n_wk));
    json_object_set_new(w, "variables", arr);
    json_object_set_new(w, "bytes_per_worker", json_integer(total));
    if (root) {
      json_object_set_new(root, "workers", w);
    } else {
      json_t *r = json_object();
      json_object_set_new(r, "num_ps", json_integer(0));
      json_object_set_new(r, "shards", json_array());
      json_object_set_new(r, "workers", w);
      char *s = json_dumps(r, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
      printf("%s\n", s);
      free(s);
      json_decref(r);
    }
  } else {
    printf("%-24s %18s %14lld   (values, gradients and optimizer slots)\n",
           "per worker", "", (long long)total);
  }
}

int chief_cmd_partition(int argc, char **argv) {
  tsr_var *vars = calloc(MAX_VARS, sizeof *vars);
  int *var_slots = malloc(MAX_VARS * sizeof *var_slots); /* -1: --slots */
  for (int i = 0; var_slots && i < MAX_VARS; i++) var_slots[i] = -1;
  int rc = 2;
  pt_vars pv = {vars, 0};
  long long n_ps = -1, n_wk = -1; /* -1: from the cluster */
  bool hybrid = false;      /* dense "allreduce": dense ones on the workers */
  tsr_var *wvars = NULL;    /* those, with their slots */
  int *wslots = NULL;
  size_t n_wvars = 0;
  const char *kind = NULL, *job_path = NULL, *cluster_file = NULL,
             *placement = NULL;
  long long slots = -1; /* -1: the optimizer's */
  long long min_b = 0, max_b = 0, max_s = 0, num_s = 0;
  bool json = false, have_min = false, have_max = false, have_maxs = false,
       have_num = false, materialized = false;
  tsr_shard *shards = NULL;
  size_t n_shards = 0;
  if (!vars || !var_slots) goto out;
  const tsr_arg opts[] = {
      TSR_ARG_CALL("var", add_var, &pv),
      TSR_ARG_INT("ps", &n_ps, 1, INT_MAX),
      TSR_ARG_STR("partitioner", &kind),
      /* any number: the partitioner's own check names a bad one */
      TSR_ARG_INT_SEEN("min-shard-bytes", &min_b, LLONG_MIN, LLONG_MAX,
                       &have_min),
      TSR_ARG_INT_SEEN("max-shard-bytes", &max_b, LLONG_MIN, LLONG_MAX,
                       &have_max),
      TSR_ARG_INT_SEEN("max-shards", &max_s, LLONG_MIN, LLONG_MAX,
                       &have_maxs),
      TSR_ARG_INT_SEEN("num-shards", &num_s, LLONG_MIN, LLONG_MAX,
                       &have_num),
      TSR_ARG_STR("job", &job_path),
      TSR_ARG_STR("cluster", &cluster_file),
      TSR_ARG_FLAG("json", &json),
      TSR_ARG_STR("placement", &placement),
      TSR_ARG_INT("slots", &slots, 0, 16),
      TSR_ARG_INT("workers", &n_wk, 1, INT_MAX),
      TSR_ARG_END};
  static const tsr_arg_cmd cmd = {.name = "tessera partition",
                                  .usage = usage};
  int prc = tsr_arg_parse(&cmd, opts, argc, argv, NULL);
  if (prc) {
    rc = tsr_arg_status(prc);
    goto out;
  }
  size_t n_vars = pv.n;
  char err[TSR_ERRBUF];
  tsr_partitioner part;
  tsr_partitioner_default(&part);
  if (job_path) {
    tsr_job job;
    if (tsr_job_load(job_path, NULL, &job, err, sizeof err)) {
      fprintf(stderr, "tessera partition: %s\n", err);
      goto out;
    }
    part = job.partitioner;
    materialized = job.sparse_materialized;
    hybrid = job.dense_allreduce;
    bool slots_given = slots >= 0;
    if (slots < 0) slots = kern_optim_num_slots(&job.optimizer);
    if (n_vars == 0 && job.model) {
      /* the model's own variables, as the chief will create them */
      tsr_model *m;
      if (tsr_model_from_job(&job, NULL, &m, err, sizeof err)) {
        fprintf(stderr, "tessera partition: %s\n", err);
        tsr_job_free(&job);
        goto out;
      }
      const tsr_var *vi;
      size_t nv;
      tsr_model_variables(m, &vi, &nv);
      for (size_t i = 0; i < nv && n_vars < MAX_VARS; i++, n_vars++) {
        vars[n_vars] = vi[i];
        /* a moving statistic's rule has no slots, as the chief places it */
        tsr_optim_spec vo;
        tsr_var_optimizer(&vi[i], &job.optimizer, &vo);
        var_slots[n_vars] = slots_given ? (int)slots : kern_optim_num_slots(&vo);
      }
      tsr_model_free(m);
    }
    tsr_job_free(&job);
  }
  if (kind) {
    if (!strcmp(kind, "min_size")) {
      part.kind = TSR_PART_MIN_SIZE;
    } else if (!strcmp(kind, "max_size")) {
      part.kind = TSR_PART_MAX_SIZE;
      part.max_shards = 0;
    } else if (!strcmp(kind, "fixed")) {
      part.kind = TSR_PART_FIXED;
    } else {
      fprintf(stderr, "tessera partition: --partitioner \"%s\" is not "
                      "min_size, max_size or fixed\n", kind);
      goto out;
    }
  }
  if (placement &&
      tsr_placement_parse(placement, &part.placement, err, sizeof err)) {
    fprintf(stderr, "tessera partition: --%s\n", err);
    goto out;
  }
  for (size_t i = 0; i < n_vars; i++)
    if (var_slots[i] < 0) var_slots[i] = slots > 0 ? (int)slots : 0;
  if (have_min) part.min_shard_bytes = min_b;
  if (have_max) part.max_shard_bytes = max_b;
  if (have_maxs) part.max_shards = max_s;
  if (have_num) part.num_shards = num_s;
  if (part.kind == TSR_PART_MAX_SIZE && !have_max && part.max_shard_bytes == 0) {
    fprintf(stderr, "tessera partition: max_size needs --max-shard-bytes\n");
    goto out;
  }
  if (part.kind == TSR_PART_FIXED && !have_num && !job_path) {
    fprintf(stderr, "tessera partition: fixed needs --num-shards\n");
    goto out;
  }
  if (tsr_partitioner_check(&part, err, sizeof err)) {
    fprintf(stderr, "tessera partition: %s\n", err);
    goto out;
  }
  if (hybrid &&
      split_hybrid(vars, var_slots, &n_vars, &wvars, &wslots, &n_wvars))
    goto out;
  if (n_ps < 0 || n_wk < 0) {
    tsr_cluster c;
    if (cluster_file || getenv("TF_CONFIG")) {
      if (tsr_cluster_load(cluster_file, NULL, &c, err, sizeof err)) {
        fprintf(stderr, "tessera partition: %s\n", err);
        goto out;
      }
      if (n_ps < 0) n_ps = c.n[TSR_TASK_PS];
      if (n_wk < 0) n_wk = c.n[TSR_TASK_WORKER];
      tsr_cluster_free(&c);
    } else {
      if (n_ps < 0) n_ps = 1;
      if (n_wk < 0) n_wk = 1;
    }
  }
  if (hybrid && n_vars == 0) {
    /* every variable on the workers: no PS to place anything on */
    print_workers(wvars, wslots, n_wvars, n_wk, json, NULL);
    rc = 0;
    goto out;
  }
  if (n_ps <= 0) {
    fprintf(stderr, "tessera partition: --ps %lld must be > 0\n", n_ps);
    goto out;
  }
  if (n_vars == 0) {
    fprintf(stderr, "tessera partition: no variables; give --var "
                    "NAME=D0xD1 (see --help)\n");
    goto out;
  }
  if (tsr_partition_plan(&part, vars, var_slots, n_vars, (int)n_ps, &shards, &n_shards,
                         err, sizeof err)) {
    fprintf(stderr, "tessera partition: %s\n", err);
    goto out;
  }
  int64_t *per_ps = calloc((size_t)n_ps, sizeof *per_ps);
  int64_t *mem = calloc((size_t)n_ps, sizeof *mem);
  if (!per_ps || !mem) {
    free(per_ps);
    free(mem);
    goto out;
  }
  double balance = tsr_partition_balance(shards, n_shards, vars, var_slots,
                                         (int)n_ps, per_ps);
  ps_memory(shards, n_shards, vars, var_slots, materialized, (int)n_ps, mem);
  bool any_sparse = false;
  for (size_t i = 0; i < n_vars; i++)
    any_sparse |= vars[i].kind == TSR_VAR_ROW_SPARSE;
  if (json) {
    json_t *root = json_object();
    json_t *arr = json_array();
    for (size_t i = 0; i < n_shards; i++) {
      const tsr_shard *s = &shards[i];
      const tsr_var *v = &vars[s->var];
      int64_t row_elems = 1;
      for (int d = 1; d < v->rank; d++) row_elems *= v->shape[d];
      json_t *o = json_object();
      json_object_set_new(o, "variable", json_string(v->name));
      json_object_set_new(o, "shard", json_integer(s->shard));
      json_object_set_new(o, "num_shards", json_integer(s->num_shards));
      json_object_set_new(o, "row_start", json_integer(s->row0));
      json_object_set_new(o, "rows", json_integer(s->rows));
      json_object_set_new(o, "bytes", json_integer(s->rows * row_elems *
                                                   (int64_t)tsr_dtype_size(v->dtype)));
      json_object_set_new(o, "ps", json_integer(s->ps));
      json_array_append_new(arr, o);
    }
    json_object_set_new(root, "num_ps", json_integer(n_ps));
    json_object_set_new(root, "placement",
                        json_string(tsr_placement_name(part.placement)));
    json_object_set_new(root, "shards", arr);
    json_t *tot = json_array();
    for (long long i = 0; i < n_ps; i++)
      json_array_append_new(tot, json_integer(per_ps[i]));
    json_object_set_new(root, "ps_bytes", tot);
    json_t *mj = json_array();
    for (long long i = 0; i < n_ps; i++)
      json_array_append_new(mj, json_integer(mem[i]));
    json_object_set_new(root, "ps_memory_bytes", mj);
    json_object_set_new(root, "sparse_rows",
                        json_string(materialized ? "materialized"
                                                 : "on_touch"));
    json_object_set_new(root, "max_over_mean", json_real(balance));
    if (hybrid) print_workers(wvars, wslots, n_wvars, n_wk, json, root);
    char *s = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    printf("%s\n", s);
    free(s);
    json_decref(root);
  } else {
    printf("%-24s %6s %12s %12s %14s %4s\n", "VARIABLE", "SHARD", "ROWS",
           "ROW RANGE", "BYTES", "PS");
    for (size_t i = 0; i < n_shards; i++) {
      const tsr_shard *s = &shards[i];
      const tsr_var *v = &vars[s->var];
      int64_t row_elems = 1;
      for (int d = 1; d < v->rank; d++) row_elems *= v->shape[d];
      char range[48], shard[24];
      snprintf(range, sizeof range, "%lld-%lld", (long long)s->row0,
               (long long)(s->row0 + s->rows));
      snprintf(shard, sizeof shard, "%d/%d", s->shard, s->num_shards);
      printf("%-24s %6s %12lld %12s %14lld %4d\n", v->name, shard,
             (long long)s->rows, range,
             (long long)(s->rows * row_elems * (int64_t)tsr_dtype_size(v->dtype)), s->ps);
    }
    printf("\n%-6s %14s %14s   (%s placement; optimizer slots included)\n",
           "PS", "BYTES", "MEMORY", tsr_placement_name(part.placement));
    for (long long i = 0; i < n_ps; i++)
      printf("%-6lld %14lld %14lld\n", i, (long long)per_ps[i],
             (long long)mem[i]);
    printf("max/mean %.3f\n", balance);
    char note[600];
    snprintf(note, sizeof note, "MEMORY: what each PS holds resident: values "
             "and slots, a bit per row of a row-sparse table, %d MiB of "
             "process%s; a checkpoint adds the rows changed while it is "
             "written.", (int)(PS_BASE_BYTES >> 20),
             !any_sparse     ? ""
             : materialized ? " (row-sparse tables materialized: no row index)"
                            : ", and for tables whose rows are made on first "
                              "touch the id and hash of every row (an upper "
                              "bound: the rows the data touches)");
    print_wrapped(note, 76);
    if (hybrid) print_workers(wvars, wslots, n_wvars, n_wk, json, NULL);
  }
  free(per_ps);
  free(mem);
  rc = 0;
out:
  free(shards);
  free(vars);
  free(var_slots);
  free(wvars);
  free(wslots);
  return rc;
}
