/* `tessera ckpt inspect PATH` and `tessera ckpt export PATH --npz OUT`
 * (--keras, --weights-h5: export_keras.h): PATH is a checkpoint root (its
 * newest committed checkpoint is used) or one ckpt-<step> folder. Export
 * writes every variable in model.get_weights()'s order under its Keras
 * name, so
 *   z = numpy.load(OUT); model.set_weights([z[k] for k in z.files])
 * loads it into the Keras model. Rows of an embedding table that training
 * never touched were never created on the PS; export gives them their
 * initial values (the same deterministic ones the PS would have made).
 * `inspect` checks the checkpoint as a restore would (chief_ckpt_verify:
 * every byte of every listed file; for an increment, of every checkpoint
 * it builds on too) and exits 1 naming the damage, with or without
 * --verify (which also prints that all is intact). Export of an increment
 * overlays its rows on the checkpoints it builds on, the whole one first.
 */
#include "chief/ckpt/ckpt.h"
#include "chief/ckpt/ckpt_read.h"
#include "chief/cli/cli.h"
#include "artifacts/weights/export_keras.h"
#include "common/arg.h"
#include "common/err.h"
#include "kernels/init.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f, const void *data) {
  (void)data;
  fprintf(f, "usage: tessera ckpt inspect PATH [--json] [--verify]\n"
             "       tessera ckpt export PATH [--npz OUT.npz] [--keras "
             "OUT.keras]\n"
             "              [--weights-h5 OUT.weights.h5 | OUT.h5]\n"
             "  Sequential and Functional Keras models; the npz in "
             "get_weights order.\n"
             "  --weights-h5: NAME.weights.h5 for Keras 3 and tf_keras's "
             "load_weights,\n"
             "  NAME.h5 for tf_keras's HDF5 layout.\n"
             "  --npz writes input_stats.json beside the npz (and so does "
             "--weights-h5)\n"
             "  when training normalized or scaled its inputs; --keras "
             "carries them\n"
             "  as a Normalization layer after each input.\n"
             "PATH: a checkpoint folder (the newest committed checkpoint in "
             "it) or one ckpt-<step> folder.\n"
             "inspect reads every byte of every file the manifest lists "
             "(sizes, CRCs, each part's own checks, every part present, no "
             "file unlisted) and exits 1 on any damage; --verify also says "
             "when all is intact.\n");
}

/* Manifest order first (the model's), then anything else found. */
static const chief_ckpt_var *find_var(const chief_ckpt_var *v, size_t n,
                                      const char *name) {
  for (size_t i = 0; i < n; i++)
    if (strcmp(v[i].name, name) == 0) return &v[i];
  return NULL;
}

static void shape_text(const chief_ckpt_var *v, char *buf, size_t len) {
  size_t o = (size_t)snprintf(buf, len, "[");
  for (int d = 0; d < v->rank && o < len; d++)
    o += (size_t)snprintf(buf + o, len - o, "%s%lld", d ? ", " : "",
                          (long long)v->shape[d]);
  if (o < len) snprintf(buf + o, len - o, "]");
}

static int inspect(const char *folder, int64_t step, json_t *man, bool json,
                   chief_ckpt_var *vars, size_t n) {
  if (json) {
    json_t *root = json_object();
    json_object_set_new(root, "folder", json_string(folder));
    json_object_set_new(root, "step", json_integer(step));
    json_object_set(root, "manifest", man);
    json_t *arr = json_array();
    for (size_t i = 0; i < n; i++) {
      json_t *o = json_object();
      json_object_set_new(o, "name", json_string(vars[i].name));
      json_t *sh = json_array();
      for (int d = 0; d < vars[i].rank; d++)
        json_array_append_new(sh, json_integer(vars[i].shape[d]));
      json_object_set_new(o, "shape", sh);
      json_object_set_new(o, "sparse", json_boolean(vars[i].sparse));
      json_object_set_new(o, "parts", json_integer(vars[i].n_parts));
      json_object_set_new(o, "rows_stored",
                          json_integer((json_int_t)vars[i].n_rows));
      json_object_set_new(o, "optimizer", json_string(vars[i].optimizer));
      json_t *sl = json_array();
      for (int k = 0; k < vars[i].n_slots; k++)
        json_array_append_new(sl, json_string(vars[i].slots[k]));
      json_object_set_new(o, "slots", sl);
      json_object_set_new(o, "applies", json_integer(vars[i].step));
      json_object_set_new(o, "bytes", json_integer((json_int_t)vars[i].bytes));
      json_array_append_new(arr, o);
    }
    json_object_set_new(root, "variables", arr);
    char *s = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    printf("%s\n", s ? s : "{}");
    free(s);
    json_decref(root);
    return 0;
  }
  json_t *rid = json_object_get(man, "run_id");
  json_t *ex = json_object_get(man, "examples");
  printf("checkpoint %s\nstep %" PRId64 ", run %016llx, %lld examples seen, "
         "model digest %s\n\n", folder, step,
         (unsigned long long)json_integer_value(rid),
         (long long)json_integer_value(ex),
         json_string_value(json_object_get(man, "model_digest"))
             ? json_string_value(json_object_get(man, "model_digest"))
             : "?");
  if (chief_ckpt_is_increment(man)) {
    json_t *prev = json_object_get(man, "previous");
    printf("an increment: the rows of row-sparse tables changed since the "
           "checkpoint of step %lld, over the whole checkpoint of step %lld "
           "(%lld links)\n\n",
           (long long)json_integer_value(json_object_get(prev, "step")),
           (long long)json_integer_value(json_object_get(man, "base_step")),
           (long long)json_integer_value(json_object_get(man, "links")));
  }
  printf("%-28s %-16s %-10s %5s %10s %-9s %-22s %8s %12s\n", "VARIABLE",
         "SHAPE", "KIND", "PARTS", "ROWS", "OPTIMIZER", "SLOTS", "APPLIES",
         "BYTES");
  for (size_t i = 0; i < n; i++) {
    char sh[64], slots[64] = "";
    shape_text(&vars[i], sh, sizeof sh);
    size_t o = 0;
    for (int k = 0; k < vars[i].n_slots && o < sizeof slots; k++)
      o += (size_t)snprintf(slots + o, sizeof slots - o, "%s%s",
                            k ? "," : "", vars[i].slots[k]);
    printf("%-28s %-16s %-10s %5d %10llu %-9s %-22s %8lld %12llu\n",
           vars[i].name, sh, vars[i].sparse ? "row-sparse" : "dense",
           vars[i].n_parts, (unsigned long long)vars[i].n_rows,
           vars[i].optimizer, o ? slots : "-", (long long)vars[i].step,
           (unsigned long long)vars[i].bytes);
  }
  return 0;
}

/* Initial values for rows the PS never created (sparse tables). */
static void fill_absent(const chief_ckpt_var *v, json_t *mvar, uint64_t seed,
                        float *val, const uint8_t *present) {
  tsr_init_spec spec = {TSR_INIT_UNIFORM, -0.05, 0.05, 0, 0};
  json_t *init = json_object_get(mvar, "init");
  if (json_is_object(init)) {
    const char *nm = json_string_value(json_object_get(init, "name"));
    if (nm && tsr_init_parse(nm, &spec) == 0) {
      spec.a = json_number_value(json_object_get(init, "a"));
      spec.b = json_number_value(json_object_get(init, "b"));
      spec.fan_in = json_integer_value(json_object_get(init, "fan_in"));
      spec.fan_out = json_integer_value(json_object_get(init, "fan_out"));
    }
  }
  uint64_t key = kern_init_var_key(v->name);
  for (int64_t r = 0; r < v->shape[0]; r++)
    if (!present[r])
      kern_init_fill(&spec, seed, key, (uint64_t)(r * v->width),
                     val + r * v->width, (size_t)v->width);
}

typedef struct {
  const char *npz, *keras, *h5;
} export_to;

/* The folder of `path` + "/input_stats.json". */
static void stats_path(const char *path, char *buf, size_t len) {
  const char *slash = strrchr(path, '/');
  if (slash)
    snprintf(buf, len, "%.*s/input_stats.json", (int)(slash - path), path);
  else
    snprintf(buf, len, "input_stats.json");
}

/* `before`: the checkpoints an increment builds on, scanned, whole first
 * (none for a whole checkpoint). */
static int export_all(const export_to *to, json_t *man, chief_ckpt_var *vars,
                      size_t n, const chief_ckpt_scanned *before,
                      size_t n_before) {
  char err[1024];
  uint64_t seed = (uint64_t)json_integer_value(json_object_get(man, "seed"));
  json_t *mv = json_object_get(man, "variables");
  size_t nm = json_array_size(mv);
  /* order: the manifest's (the model's), then unlisted ones */
  size_t total = 0;
  const chief_ckpt_var **order = calloc(n + 1, sizeof *order);
  json_t **mvars = calloc(n + 1, sizeof *mvars);
  float **vals = calloc(n + 1, sizeof *vals);
  chief_export_var *ev = calloc(n + 1, sizeof *ev);
  int rc = 0;
  if (!order || !mvars || !vals || !ev) {
    rc = TSR_ENOMEM;
    snprintf(err, sizeof err, "out of memory");
    goto out;
  }
  for (size_t i = 0; i < nm; i++) {
    json_t *o = json_array_get(mv, i);
    const char *name = json_string_value(json_object_get(o, "name"));
    const chief_ckpt_var *v = name ? find_var(vars, n, name) : NULL;
    if (!v) {
      rc = TSR_ENOTFOUND;
      snprintf(err, sizeof err, "the manifest lists %s but no shard file "
               "holds it", name ? name : "?");
      goto out;
    }
    mvars[total] = o;
    order[total++] = v;
  }
  for (size_t i = 0; i < n; i++) {
    bool listed = false;
    for (size_t k = 0; k < total; k++) listed |= order[k] == &vars[i];
    if (!listed) order[total++] = &vars[i];
  }
  for (size_t i = 0; i < total && !rc; i++) {
    const chief_ckpt_var *v = order[i];
    int64_t dim0 = v->rank ? v->shape[0] : 1;
    vals[i] = malloc((size_t)(dim0 * v->width) * sizeof(float) + 1);
    uint8_t *present = malloc((size_t)dim0 + 1);
    if (!vals[i] || !present) {
      rc = TSR_ENOMEM;
      snprintf(err, sizeof err, "%s: out of memory", v->name);
    }
    /* an increment's rows over the checkpoints it builds on */
    if (!rc)
      rc = chief_ckpt_load_chain(v, before, n_before, vals[i], present, err,
                                 sizeof err);
    if (!rc && v->sparse) fill_absent(v, mvars[i], seed, vals[i], present);
    free(present);
    ev[i] = (chief_export_var){v->name, v->rank, v->shape, vals[i]};
  }
  json_t *model = json_object_get(man, "model");
  json_t *input = json_object_get(man, "input");
  char sp[4096];
  if (!rc && to->npz) {
    /* model.get_weights()'s order and shapes, so set_weights takes the
     * arrays as they come */
    rc = chief_export_npz(to->npz, model, ev, total, err, sizeof err);
    if (!rc) printf("wrote %zu arrays to %s\n", total, to->npz);
    stats_path(to->npz, sp, sizeof sp);
    if (!rc && input &&
        !(rc = chief_export_input_stats(sp, input, err, sizeof err)))
      printf("wrote the input normalization to %s\n", sp);
  }
  if (!rc && to->keras) {
    rc = chief_export_keras(to->keras, model, input, ev, total, err,
                            sizeof err);
    if (!rc)
      printf("wrote %s (Keras 3: keras.models.load_model)%s\n", to->keras,
             input ? ", with the input normalization" : "");
  }
  if (!rc && to->h5) {
    rc = chief_export_weights_h5(to->h5, model, ev, total, err, sizeof err);
    if (!rc)
      printf("wrote %s (%s)\n", to->h5,
             strstr(to->h5, ".weights.h5")
                 ? "Keras 3 and tf_keras: model.load_weights"
                 : "tf_keras's HDF5 layout: model.load_weights");
    stats_path(to->h5, sp, sizeof sp);
    if (!rc && input &&
        !(rc = chief_export_input_stats(sp, input, err, sizeof err)))
      printf("wrote the input normalization to %s\n", sp);
  }
out:
  if (rc) fprintf(stderr, "tessera ckpt export: %s\n", err);
  for (size_t i = 0; vals && i < total; i++) free(vals[i]);
  free(vals);
  free(ev);
  free(order);
  free(mvars);
  return rc ? 1 : 0;
}

int chief_cmd_ckpt(int argc, char **argv) {
  if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
    usage(argc < 2 ? stderr : stdout, NULL);
    return argc < 2 ? 2 : 0;
  }
  const char *verb = argv[1];
  bool is_inspect = !strcmp(verb, "inspect"), is_export = !strcmp(verb, "export");
  if (!is_inspect && !is_export) {
    fprintf(stderr, "tessera ckpt: unknown action \"%s\" (inspect, export)\n",
            verb);
    return 2;
  }
  bool json = false, verify = false;
  const char *npz = NULL, *keras = NULL, *h5 = NULL;
  const tsr_arg opts[] = {TSR_ARG_FLAG("json", &json),
                          TSR_ARG_FLAG("verify", &verify),
                          TSR_ARG_STR("npz", &npz),
                          TSR_ARG_STR("keras", &keras),
                          TSR_ARG_STR("weights-h5", &h5), TSR_ARG_END};
  const tsr_arg_cmd cmd = {
      .name = is_inspect ? "tessera ckpt inspect" : "tessera ckpt export",
      .usage = usage};
  int n_args;
  int rc = tsr_arg_parse(&cmd, opts, argc - 1, argv + 1, &n_args);
  if (rc) return tsr_arg_status(rc);
  if (n_args < 1) {
    fprintf(stderr, "tessera ckpt %s: no PATH given\n", verb);
    return 2;
  }
  const char *path = argv[2];
  if (is_export && !npz && !keras && !h5) {
    fprintf(stderr, "tessera ckpt export: give --npz OUT.npz, --keras "
            "OUT.keras or --weights-h5 OUT.weights.h5\n");
    return 2;
  }
  char err[1024], folder[4096];
  int64_t step;
  json_t *man;
  if (chief_ckpt_read(path, &step, &man, folder, sizeof folder, err,
                      sizeof err)) {
    fprintf(stderr, "tessera ckpt %s: %s\n", verb, err);
    return 1;
  }
  char root[4096];
  chief_ckpt_root_of(folder, root, sizeof root);
  /* a damaged checkpoint is never shown (or exported) as if it were
   * whole */
  if (verify || is_inspect) {
    char why[1024];
    if (chief_ckpt_verify(folder, man, why, sizeof why) ||
        chief_ckpt_verify_chain(root, step, man, why, sizeof why)) {
      fprintf(stderr, "tessera ckpt %s: %s is damaged: %s\n", verb, folder,
              why);
      json_decref(man);
      return 1;
    }
  }
  chief_ckpt_var *vars;
  size_t n;
  if (chief_ckpt_scan(folder, &vars, &n, err, sizeof err)) {
    fprintf(stderr, "tessera ckpt %s: %s\n", verb, err);
    json_decref(man);
    return 1;
  }
  export_to to = {npz, keras, h5};
  chief_ckpt_scanned *before = NULL;
  size_t n_before = 0;
  if (is_export && chief_ckpt_scan_links(folder, step, man, &before,
                                         &n_before, err, sizeof err)) {
    fprintf(stderr, "tessera ckpt export: %s\n", err);
    rc = 1;
  }
  if (!rc)
    rc = is_inspect ? inspect(folder, step, man, json, vars, n)
                    : export_all(&to, man, vars, n, before, n_before);
  chief_ckpt_links_free(before, n_before);
  if (!rc && verify && !json)
    printf("\nverified: %zu file(s), every byte read, all intact\n",
           json_array_size(json_object_get(man, "files")));
  chief_ckpt_vars_free(vars, n);
  json_decref(man);
  return rc;
}
