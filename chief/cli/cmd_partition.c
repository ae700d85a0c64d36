/* `tessera partition`: prints every shard's row range and PS for a list of
 * variables, as the chief would place them. Variables come from --var
 * NAME=D0xD1[:dtype] flags; the partitioner from flags or a job file. */
#include "chief/cli/cli.h"
#include "common/cluster.h"
#include "common/err.h"
#include "common/job.h"
#include "common/partition.h"
#include "kernels/optim.h"
#include "worker/model.h"

#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_VARS 4096

static void usage(FILE *f) {
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
static int parse_var(const char *arg, tsr_var *v) {
  char *namebuf = v->name;
  const char *eq = strchr(arg, '=');
  if (!eq || eq == arg || (size_t)(eq - arg) >= sizeof v->name) {
    fprintf(stderr, "tessera partition: --var \"%s\": expected "
                    "NAME=D0xD1[:dtype]\n", arg);
    return TSR_EINVAL;
  }
  memcpy(namebuf, arg, (size_t)(eq - arg));
  namebuf[eq - arg] = 0;
  v->dtype = TSR_DT_FLOAT32;
  v->rank = 0;
  const char *p = eq + 1;
  const char *colon = strchr(p, ':');
  if (colon && tsr_dtype_parse(colon + 1, &v->dtype)) {
    fprintf(stderr, "tessera partition: --var %s: dtype \"%s\" is not one of "
                    "float32, float16, bfloat16, float64, int64, int32, int8, "
                    "uint8\n",
            namebuf, colon + 1);
    return TSR_EINVAL;
  }
  if (*p == 0 || *p == ':' || strncmp(p, "scalar", 6) == 0) return 0;
  while (*p && *p != ':') {
    char *end;
    errno = 0;
    long long d = strtoll(p, &end, 10);
    if (end == p || errno) {
      fprintf(stderr, "tessera partition: --var %s: dimension \"%.20s\" is "
                      "not an integer\n", namebuf, p);
      return TSR_EINVAL;
    }
    if (v->rank == TSR_MAX_RANK) {
      fprintf(stderr, "tessera partition: --var %s: more than %d "
                      "dimensions\n", namebuf, TSR_MAX_RANK);
      return TSR_EINVAL;
    }
    v->shape[v->rank++] = d;
    p = end;
    if (*p == 'x' || *p == ',') p++;
    else if (*p && *p != ':') {
      fprintf(stderr, "tessera partition: --var %s: unexpected \"%c\" in "
                      "shape\n", namebuf, *p);
      return TSR_EINVAL;
    }
  }
  return 0;
}

static long long parse_ll(const char *flag, const char *s, int *bad) {
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (!*s || *end || errno) {
    fprintf(stderr, "tessera partition: %s \"%s\" is not an integer\n", flag,
            s);
    *bad = 1;
  }
  return v;
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
  static const struct option opts[] = {
      {"var", required_argument, 0, 'v'},
      {"ps", required_argument, 0, 'p'},
      {"partitioner", required_argument, 0, 'P'},
      {"min-shard-bytes", required_argument, 0, 'm'},
      {"max-shard-bytes", required_argument, 0, 'M'},
      {"max-shards", required_argument, 0, 'k'},
      {"num-shards", required_argument, 0, 'n'},
      {"job", required_argument, 0, 'J'},
      {"cluster", required_argument, 0, 'c'},
      {"json", no_argument, 0, 'j'},
      {"placement", required_argument, 0, 'L'},
      {"slots", required_argument, 0, 's'},
      {"workers", required_argument, 0, 'w'},
      {"help", no_argument, 0, 'h'},
      {0, 0, 0, 0}};
  tsr_var *vars = calloc(MAX_VARS, sizeof *vars);
  int *var_slots = malloc(MAX_VARS * sizeof *var_slots); /* -1: --slots */
  for (int i = 0; var_slots && i < MAX_VARS; i++) var_slots[i] = -1;
  int rc = 2;
  size_t n_vars = 0;
  long long n_ps = -1, n_wk = -1;
  bool hybrid = false;      /* dense "allreduce": dense ones on the workers */
  tsr_var *wvars = NULL;    /* those, with their slots */
  int *wslots = NULL;
  size_t n_wvars = 0;
  const char *kind = NULL, *job_path = NULL, *cluster_file = NULL,
             *placement = NULL;
  long long slots = -1;
  long long min_b = -1, max_b = -1, max_s = -1, num_s = -1;
  bool json = false, have_min = false, have_max = false, have_maxs = false,
       have_num = false;
  int bad = 0;
  tsr_shard *shards = NULL;
  size_t n_shards = 0;
  if (!vars || !var_slots) goto out;
  optind = 1;
  int ch;
  while ((ch = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (ch) {
      case 'v':
        if (n_vars == MAX_VARS) {
          fprintf(stderr, "tessera partition: more than %d variables\n",
                  MAX_VARS);
          goto out;
        }
        if (parse_var(optarg, &vars[n_vars]))
          goto out;
        n_vars++;
        break;
      case 'p': n_ps = parse_ll("--ps", optarg, &bad); break;
      case 'P': kind = optarg; break;
      case 'm': min_b = parse_ll("--min-shard-bytes", optarg, &bad); have_min = true; break;
      case 'M': max_b = parse_ll("--max-shard-bytes", optarg, &bad); have_max = true; break;
      case 'k': max_s = parse_ll("--max-shards", optarg, &bad); have_maxs = true; break;
      case 'n': num_s = parse_ll("--num-shards", optarg, &bad); have_num = true; break;
      case 'J': job_path = optarg; break;
      case 'c': cluster_file = optarg; break;
      case 'j': json = true; break;
      case 'L': placement = optarg; break;
      case 's': slots = parse_ll("--slots", optarg, &bad); break;
      case 'w': n_wk = parse_ll("--workers", optarg, &bad); break;
      case 'h': usage(stdout); rc = 0; goto out;
      default: usage(stderr); goto out;
    }
  }
  if (bad) goto out;
  if (optind < argc) {
    fprintf(stderr, "tessera partition: unexpected argument \"%s\"\n",
            argv[optind]);
    goto out;
  }
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
  if (slots > 16) {
    fprintf(stderr, "tessera partition: --slots %lld must be 0..16\n", slots);
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
  if (!per_ps) goto out;
  double balance = tsr_partition_balance(shards, n_shards, vars, var_slots,
                                         (int)n_ps, per_ps);
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
    printf("\n%-6s %14s   (%s placement; optimizer slots included)\n", "PS",
           "BYTES", tsr_placement_name(part.placement));
    for (long long i = 0; i < n_ps; i++)
      printf("%-6lld %14lld\n", i, (long long)per_ps[i]);
    printf("max/mean %.3f\n", balance);
    if (hybrid) print_workers(wvars, wslots, n_wvars, n_wk, json, NULL);
  }
  free(per_ps);
  rc = 0;
out:
  free(shards);
  free(vars);
  free(var_slots);
  free(wvars);
  free(wslots);
  return rc;
}
