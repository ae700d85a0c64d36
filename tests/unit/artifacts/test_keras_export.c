/* Keras weight files (artifacts/weights/export_keras.h): model.layers order of
 * Functional models (checked against what Keras 3.15 and tf_keras 2.21
 * list for the same graph), saving paths numbered per class whatever the
 * layer names, the .weights.h5 and legacy .h5 layouts written and read
 * back, the npz's arr_<k> in get_weights order, each input's own
 * Normalization in the .keras config, and every limit and refusal. */
#include "artifacts/weights/export_keras.h"
#include "artifacts/weights/npz.h"
#include "common/err.h"
#include "../tmpdir.h"
#include "keras_archive.h"

#include <hdf5.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

/* ---- a model's variables with distinct values ----------------------------*/

typedef struct {
  char name[64];
  int rank;
  int64_t shape[4];
  float *data;
} tvar;

static size_t numel(const tvar *v) {
  size_t n = 1;
  for (int d = 0; d < v->rank; d++) n *= (size_t)v->shape[d];
  return n;
}

/* shape: a (rank 1), a x b (rank 2), a x b x 1 x b (rank 4) */
static void tvar_set(tvar *v, const char *name, int rank, int64_t a,
                     int64_t b, float base) {
  snprintf(v->name, sizeof v->name, "%s", name);
  v->rank = rank;
  v->shape[0] = a;
  v->shape[1] = b;
  v->shape[2] = 1;
  v->shape[3] = b;
  v->data = malloc(numel(v) * sizeof(float));
  for (size_t i = 0; i < numel(v); i++) v->data[i] = base + (float)i;
}

static void to_export(const tvar *t, size_t n, chief_export_var *ev) {
  for (size_t i = 0; i < n; i++)
    ev[i] = (chief_export_var){t[i].name, t[i].rank, t[i].shape, t[i].data};
}

static void tvars_free(tvar *t, size_t n) {
  for (size_t i = 0; i < n; i++) free(t[i].data);
}

static json_t *parse(const char *s) {
  json_error_t je;
  json_t *j = json_loads(s, 0, &je);
  if (!j) fail_msg("bad test JSON: %s at %d", je.text, je.position);
  return j;
}

/* The graph Keras 3.15 and tf_keras 2.21 list as img, conv2d,
 * batch_normalization, re_lu, max_pooling2d, conv2d_1,
 * layer_normalization, add, aux, global_average_pooling2d, dense,
 * concatenate, dense_1 (a Conv/BN/LN branch added to itself, an aux
 * input through a Dense, concatenated), its layers listed shuffled, in
 * Keras 2 (legacy lists) or Keras 3 (__keras_tensor__) spelling. */
#define K2(n) "[[[\"" n "\", 0, 0, {}]]]"
#define L(name, cls, in)                                                  \
  "{\"name\": \"" name "\", \"class_name\": \"" cls "\", \"config\": "    \
  "{\"name\": \"" name "\"}, \"inbound_nodes\": " in "}"
static const char *graph_k2 =
    "{\"class_name\": \"Functional\", \"config\": {\"layers\": ["
    L("dense_1", "Dense", K2("concatenate")) ","
    L("concatenate", "Concatenate",
      "[[[\"global_average_pooling2d\", 0, 0, {}], [\"dense\", 0, 0, {}]]]") ","
    L("dense", "Dense", K2("aux")) ","
    "{\"name\": \"aux\", \"class_name\": \"InputLayer\", \"config\": "
    "{\"batch_input_shape\": [null, 3], \"name\": \"aux\"}, "
    "\"inbound_nodes\": []},"
    L("global_average_pooling2d", "GlobalAveragePooling2D", K2("add")) ","
    L("add", "Add",
      "[[[\"max_pooling2d\", 0, 0, {}], [\"layer_normalization\", 0, 0, {}]]]")
    ","
    L("layer_normalization", "LayerNormalization", K2("conv2d_1")) ","
    L("conv2d_1", "Conv2D", K2("max_pooling2d")) ","
    L("max_pooling2d", "MaxPooling2D", K2("re_lu")) ","
    L("re_lu", "ReLU", K2("batch_normalization")) ","
    L("batch_normalization", "BatchNormalization", K2("conv2d")) ","
    L("conv2d", "Conv2D", K2("img")) ","
    "{\"name\": \"img\", \"class_name\": \"InputLayer\", \"config\": "
    "{\"batch_input_shape\": [null, 8, 8, 1], \"name\": \"img\"}, "
    "\"inbound_nodes\": []}"
    "], \"input_layers\": [[\"img\", 0, 0], [\"aux\", 0, 0]], "
    "\"output_layers\": [[\"dense_1\", 0, 0]]}}";

/* Tessera's creation order of that model's variables (layers parsed as
 * they become ready) */
static const char *const graph_vars[] = {
    "dense/kernel", "dense/bias", "conv2d/kernel",
    "batch_normalization/gamma", "batch_normalization/beta",
    "batch_normalization/moving_mean", "batch_normalization/moving_variance",
    "conv2d_1/kernel", "conv2d_1/bias", "layer_normalization/gamma",
    "layer_normalization/beta", "dense_1/kernel", "dense_1/bias"};
/* Keras's model.weights for it */
static const char *const graph_keras[] = {
    "conv2d/kernel", "batch_normalization/gamma", "batch_normalization/beta",
    "batch_normalization/moving_mean", "batch_normalization/moving_variance",
    "conv2d_1/kernel", "conv2d_1/bias", "layer_normalization/gamma",
    "layer_normalization/beta", "dense/kernel", "dense/bias",
    "dense_1/kernel", "dense_1/bias"};
#define N_GRAPH (sizeof graph_vars / sizeof graph_vars[0])

static void check_order(const char *model_json) {
  json_t *m = parse(model_json);
  size_t order[N_GRAPH];
  char err[256] = "";
  assert_int_equal(chief_keras_weight_order(m, graph_vars, N_GRAPH, order,
                                            err, sizeof err), 0);
  for (size_t k = 0; k < N_GRAPH; k++)
    assert_string_equal(graph_vars[order[k]], graph_keras[k]);
  json_decref(m);
}

static void test_functional_order(void **state) {
  (void)state;
  check_order(graph_k2);
  /* the same graph in Keras 3's spelling of the calls */
  json_t *m = parse(graph_k2);
  json_t *layers = json_object_get(json_object_get(m, "config"), "layers");
  for (size_t i = 0; i < json_array_size(layers); i++) {
    json_t *l = json_array_get(layers, i);
    json_t *ib = json_object_get(l, "inbound_nodes");
    if (!json_array_size(ib)) continue;
    json_t *args = json_array();
    json_t *refs = json_array_get(ib, 0);
    for (size_t k = 0; k < json_array_size(refs); k++)
      json_array_append_new(
          args, json_pack("{ss s{s[n] ss s[sii]}}", "class_name",
                          "__keras_tensor__", "config", "shape", "dtype",
                          "float32", "keras_history",
                          json_string_value(json_array_get(
                              json_array_get(refs, k), 0)),
                          0, 0));
    json_t *call = json_array_size(args) == 1
                       ? json_pack("{s[O]s{}}", "args",
                                   json_array_get(args, 0), "kwargs")
                       : json_pack("{s[O]s{}}", "args", args, "kwargs");
    json_decref(args);
    json_object_set_new(l, "inbound_nodes", json_pack("[o]", call));
  }
  char *s = json_dumps(m, 0);
  check_order(s);
  free(s);
  json_decref(m);
}

/* Sequential layers named apart from their classes: the saving paths
 * are the classes numbered; the .weights.h5 and the legacy .h5 read back
 * into fresh buffers. */
static const char *seq_json =
    "{\"class_name\": \"Sequential\", \"config\": {\"name\": \"s\", "
    "\"layers\": ["
    "{\"class_name\": \"InputLayer\", \"config\": {\"batch_input_shape\": "
    "[null, 4, 4, 1], \"name\": \"pixels\"}},"
    "{\"class_name\": \"Conv2D\", \"config\": {\"name\": \"c1\"}},"
    "{\"class_name\": \"BatchNormalization\", \"config\": {\"name\": \"b\", "
    "\"axis\": [3]}},"
    "{\"class_name\": \"Conv2D\", \"config\": {\"name\": \"c2\"}},"
    "{\"class_name\": \"Flatten\", \"config\": {\"name\": \"f\"}},"
    "{\"class_name\": \"Dense\", \"config\": {\"name\": \"out\"}}]}}";

static size_t seq_vars(tvar *t) {
  tvar_set(&t[0], "c1/kernel", 4, 2, 3, 1);
  tvar_set(&t[1], "c1/bias", 1, 3, 1, 100);
  tvar_set(&t[2], "b/gamma", 1, 3, 1, 200);
  tvar_set(&t[3], "b/beta", 1, 3, 1, 300);
  tvar_set(&t[4], "b/moving_mean", 1, 3, 1, 400);
  tvar_set(&t[5], "b/moving_variance", 1, 3, 1, 500);
  tvar_set(&t[6], "c2/kernel", 2, 3, 2, 600); /* shapes need not be real */
  tvar_set(&t[7], "out/kernel", 2, 8, 2, 700);
  tvar_set(&t[8], "out/bias", 1, 2, 1, 800);
  return 9;
}

static bool h5_has(const char *path, const char *obj) {
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
  hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
  bool ok = f >= 0 && H5Lexists(f, obj, H5P_DEFAULT) > 0 &&
            H5Oexists_by_name(f, obj, H5P_DEFAULT) > 0;
  if (f >= 0) H5Fclose(f);
  return ok;
}

static void roundtrip(const char *file, const json_t *m, tvar *t, size_t n) {
  chief_export_var ev[16] = {{0}};
  to_export(t, n, ev);
  char err[512] = "";
  assert_int_equal(chief_export_weights_h5(file, m, ev, n, err, sizeof err),
                   0);
  tvar back[16];
  chief_import_var iv[16];
  for (size_t i = 0; i < n; i++) {
    back[i] = t[i];
    back[i].data = calloc(numel(&t[i]), sizeof(float));
    iv[i] = (chief_import_var){t[i].name, t[i].rank, t[i].shape,
                               back[i].data};
  }
  int rc = chief_weights_load(file, m, iv, n, err, sizeof err);
  if (rc) fail_msg("%s: %s", file, err);
  for (size_t i = 0; i < n; i++)
    assert_memory_equal(back[i].data, t[i].data, numel(&t[i]) * 4);
  tvars_free(back, n);
}

static void test_sequential_files(void **state) {
  (void)state;
  char dir[256], p[512];
  test_tmpdir(dir, sizeof dir);
  tvar t[16];
  size_t n = seq_vars(t);
  json_t *m = parse(seq_json);
  snprintf(p, sizeof p, "%s/w.weights.h5", dir);
  roundtrip(p, m, t, n);
  assert_true(h5_has(p, "layers/conv2d/vars/1"));
  assert_true(h5_has(p, "layers/batch_normalization/vars/3"));
  assert_true(h5_has(p, "layers/conv2d_1/vars/0"));
  assert_false(h5_has(p, "layers/conv2d_1/vars/1"));
  assert_true(h5_has(p, "layers/dense/vars/1"));
  snprintf(p, sizeof p, "%s/w.h5", dir);
  roundtrip(p, m, t, n);
  assert_true(h5_has(p, "c1/c1/bias:0"));
  assert_true(h5_has(p, "b/b/moving_variance:0"));
  assert_true(h5_has(p, "out/out/kernel:0"));
  assert_true(h5_has(p, "f")); /* every layer has its group */
  /* another name is refused, naming both */
  chief_export_var ev[16];
  to_export(t, n, ev);
  char err[512] = "";
  snprintf(p, sizeof p, "%s/w.bin", dir);
  assert_int_equal(chief_export_weights_h5(p, m, ev, n, err, sizeof err),
                   TSR_ECONFIG);
  assert_non_null(strstr(err, "NAME.weights.h5"));
  assert_non_null(strstr(err, "NAME.h5"));
  /* a file of other shapes is refused naming the dataset and the shapes */
  int64_t wrong = 4;
  t[1].shape[0] = wrong;
  float buf[4];
  chief_import_var iv[16];
  for (size_t i = 0; i < n; i++)
    iv[i] = (chief_import_var){t[i].name, t[i].rank, t[i].shape,
                               i == 1 ? buf : t[i].data};
  snprintf(p, sizeof p, "%s/w.weights.h5", dir);
  assert_int_equal(chief_weights_load(p, m, iv, n, err, sizeof err),
                   TSR_ESHAPE);
  assert_non_null(strstr(err, "layers/conv2d/vars/1 has shape 3, the "
                              "model's c1/bias is 4"));
  json_decref(m);
  tvars_free(t, n);
  test_rmtree(dir);
}

/* np.savez(*model.get_weights()): arr_<k> is the k-th in Keras's order,
 * not in Tessera's creation order. */
static void test_npz_keras_order(void **state) {
  (void)state;
  char dir[256], p[512], err[512] = "";
  test_tmpdir(dir, sizeof dir);
  json_t *m = parse(graph_k2);
  tvar t[N_GRAPH];
  for (size_t i = 0; i < N_GRAPH; i++)
    tvar_set(&t[i], graph_vars[i], 1, 2, 1, (float)(10 * i));
  snprintf(p, sizeof p, "%s/k.npz", dir);
  chief_npz *z;
  assert_int_equal(chief_npz_open(&z, p, err, sizeof err), 0);
  for (size_t k = 0; k < N_GRAPH; k++) {
    size_t v = 0;
    while (strcmp(graph_vars[v], graph_keras[k])) v++;
    char an[16];
    snprintf(an, sizeof an, "arr_%zu", k);
    assert_int_equal(chief_npz_add_f32(z, an, t[v].shape, 1, t[v].data, err,
                                       sizeof err), 0);
  }
  assert_int_equal(chief_npz_close(z, err, sizeof err), 0);
  float got[N_GRAPH][2];
  chief_import_var iv[N_GRAPH];
  for (size_t i = 0; i < N_GRAPH; i++)
    iv[i] = (chief_import_var){t[i].name, 1, t[i].shape, got[i]};
  assert_int_equal(chief_weights_load(p, m, iv, N_GRAPH, err, sizeof err), 0);
  for (size_t i = 0; i < N_GRAPH; i++)
    assert_memory_equal(got[i], t[i].data, 8);
  json_decref(m);
  tvars_free(t, N_GRAPH);
  test_rmtree(dir);
}

/* ---- the .keras config --------------------------------------------------*/

/* Two inputs placed by name away from their order: each Normalization
 * takes its own columns; the readers of the inputs read the
 * Normalizations. */
static void test_keras_functional_inputs(void **state) {
  (void)state;
  static const char *model =
      "{\"class_name\": \"Functional\", \"config\": {\"name\": \"f\", "
      "\"layers\": ["
      "{\"name\": \"s1\", \"class_name\": \"InputLayer\", \"config\": "
      "{\"batch_input_shape\": [null, 3], \"name\": \"s1\"}, "
      "\"inbound_nodes\": []},"
      "{\"name\": \"age\", \"class_name\": \"InputLayer\", \"config\": "
      "{\"batch_input_shape\": [null, 2], \"name\": \"age\"}, "
      "\"inbound_nodes\": []},"
      "{\"name\": \"cat\", \"class_name\": \"Concatenate\", \"config\": "
      "{\"name\": \"cat\"}, \"inbound_nodes\": [[[\"age\", 0, 0, {}], "
      "[\"s1\", 0, 0, {}]]]},"
      "{\"name\": \"d\", \"class_name\": \"Dense\", \"config\": "
      "{\"name\": \"d\", \"units\": 1}, \"inbound_nodes\": "
      "[[[\"cat\", 0, 0, {}]]]}],"
      "\"input_layers\": [[\"s1\", 0, 0], [\"age\", 0, 0]], "
      "\"output_layers\": [[\"d\", 0, 0]]}}";
  char dir[256], p[512], err[512] = "";
  test_tmpdir(dir, sizeof dir);
  json_t *m = parse(model);
  json_t *input = parse("{\"scale\": [1, 2, 4, 8, 16], \"shift\": [1, 1, 1, "
                        "1, 1], \"columns\": {\"age\": 0, \"s1\": 2}}");
  tvar t[2];
  tvar_set(&t[0], "d/kernel", 2, 5, 1, 0);
  tvar_set(&t[1], "d/bias", 1, 1, 1, 0);
  chief_export_var ev[2];
  to_export(t, 2, ev);
  snprintf(p, sizeof p, "%s/m.keras", dir);
  assert_int_equal(chief_export_keras(p, m, input, ev, 2, err, sizeof err),
                   0);
  json_t *cfg = test_keras_config(p);
  const json_t *ns = json_object_get(test_keras_layer(cfg, "s1_normalization"),
                                     "config");
  const json_t *na = json_object_get(test_keras_layer(cfg, "age_normalization"),
                                     "config");
  /* s1 reads columns 2..4: mean -1/4, -1/8, -1/16; variance 1/16, ... */
  assert_int_equal(json_array_size(json_object_get(ns, "mean")), 3);
  assert_true(json_number_value(json_array_get(json_object_get(ns, "mean"),
                                               0)) == -0.25);
  assert_true(json_number_value(json_array_get(
                  json_object_get(ns, "variance"), 2)) == 1.0 / 256);
  assert_true(json_number_value(json_array_get(json_object_get(na, "mean"),
                                               1)) == -0.5);
  /* cat reads the Normalizations, in its order */
  char *ib = json_dumps(json_object_get(test_keras_layer(cfg, "cat"),
                                        "inbound_nodes"), JSON_COMPACT);
  assert_string_equal(ib, "[[[\"age_normalization\",0,0,{}],"
                          "[\"s1_normalization\",0,0,{}]]]");
  free(ib);
  json_decref(cfg);
  /* an image: one value per channel when the map is the same for every
   * pixel, else one per element over the image's axes */
  static const char *img =
      "{\"class_name\": \"Sequential\", \"config\": {\"layers\": ["
      "{\"class_name\": \"Flatten\", \"config\": {\"name\": \"f\", "
      "\"batch_input_shape\": [null, 2, 1, 2]}},"
      "{\"class_name\": \"Dense\", \"config\": {\"name\": \"d\"}}]}}";
  json_t *mi = parse(img);
  json_t *uni = parse("{\"scale\": [2, 4, 2, 4], \"shift\": [0, 0, 0, 0]}");
  t[0].shape[0] = 4;
  to_export(t, 2, ev);
  assert_int_equal(chief_export_keras(p, mi, uni, ev, 2, err, sizeof err), 0);
  cfg = test_keras_config(p);
  const json_t *n = json_object_get(
      json_array_get(json_object_get(json_object_get(cfg, "config"),
                                     "layers"), 1), "config");
  char *s = json_dumps(n, JSON_COMPACT);
  assert_non_null(strstr(s, "\"axis\":-1"));
  assert_non_null(strstr(s, "\"variance\":[0.25,0.0625]"));
  free(s);
  json_decref(cfg);
  json_t *per = parse("{\"scale\": [2, 4, 1, 4], \"shift\": [0, 0, 0, 0]}");
  assert_int_equal(chief_export_keras(p, mi, per, ev, 2, err, sizeof err), 0);
  cfg = test_keras_config(p);
  n = json_object_get(json_array_get(json_object_get(json_object_get(
                                         cfg, "config"), "layers"), 1),
                      "config");
  s = json_dumps(n, JSON_COMPACT);
  assert_non_null(strstr(s, "\"axis\":[1,2,3]"));
  assert_non_null(strstr(s, "\"variance\":[[[0.25,0.0625]],[[1.0,0.0625]]]"));
  free(s);
  json_decref(cfg);
  json_decref(per);
  json_decref(uni);
  json_decref(mi);
  json_decref(input);
  json_decref(m);
  tvars_free(t, 2);
  test_rmtree(dir);
}

/* ---- refusals and limits --------------------------------------------------*/

static void expect_refused(const char *model_json, const char *const *names,
                           size_t n, int code, const char *msg) {
  json_t *m = parse(model_json);
  size_t order[300];
  char err[512] = "";
  assert_int_equal(chief_keras_weight_order(m, names, n, order, err,
                                            sizeof err), code);
  if (!strstr(err, msg)) fail_msg("\"%s\" does not say \"%s\"", err, msg);
  json_decref(m);
}

static void test_refusals(void **state) {
  (void)state;
  const char *d[] = {"dense/kernel", "stray/kernel"};
  expect_refused(seq_json, d + 1, 1, TSR_ECONFIG,
                 "variable stray/kernel belongs to no layer of the model");
  const char *two[] = {"d/kernel", "d/bias"};
  expect_refused("{\"class_name\": \"Sequential\", \"config\": {\"layers\": ["
                 "{\"class_name\": \"Dense\", \"config\": {\"name\": \"d\"}},"
                 "{\"class_name\": \"Dense\", \"config\": {\"name\": \"d\"}}]}}",
                 two, 2, TSR_ECONFIG, "two layers are named 'd'");
  expect_refused("{\"class_name\": \"MyModel\", \"config\": {}}", d, 1,
                 TSR_EUNSUPPORTED, "model class MyModel");
  expect_refused(
      "{\"class_name\": \"Functional\", \"config\": {\"layers\": ["
      L("a", "Dense", K2("b")) "," L("b", "Dense", K2("a")) ","
      "{\"name\": \"x\", \"class_name\": \"InputLayer\", \"config\": {}, "
      "\"inbound_nodes\": []}], \"input_layers\": [[\"x\", 0, 0]], "
      "\"output_layers\": [[\"a\", 0, 0]]}}",
      d, 0, TSR_ECONFIG, "is part of a cycle");
  expect_refused(
      "{\"class_name\": \"Functional\", \"config\": {\"layers\": ["
      L("a", "Dense", K2("nowhere")) ","
      "{\"name\": \"x\", \"class_name\": \"InputLayer\", \"config\": {}, "
      "\"inbound_nodes\": []}], \"input_layers\": [[\"x\", 0, 0]], "
      "\"output_layers\": [[\"a\", 0, 0]]}}",
      d, 0, TSR_ECONFIG, "layer 'a' reads layer 'nowhere'");
  /* the built-in model: the order is its own; a Keras file is refused */
  json_t *b = parse("{\"builtin\": \"wide_deep\"}");
  size_t order[2];
  char err[512] = "";
  assert_int_equal(chief_keras_weight_order(b, d, 2, order, err, sizeof err),
                   0);
  assert_int_equal(order[1], 1);
  chief_export_var ev[1] = {{"x/y", 1, (int64_t[]){1}, (float[]){0}}};
  assert_int_equal(chief_export_weights_h5("/nonexistent/w.h5", b, ev, 1,
                                           err, sizeof err),
                   TSR_EUNSUPPORTED);
  assert_non_null(strstr(err, "no Keras counterpart"));
  json_decref(b);
}

static void test_limits(void **state) {
  (void)state;
  /* 256 layers plan; 257 are refused */
  for (int n = 256; n <= 257; n++) {
    json_t *ls = json_array();
    json_array_append_new(ls, json_pack("{ss s{s[ni]}}", "class_name",
                                        "InputLayer", "config",
                                        "batch_input_shape", 4));
    for (int i = 0; i < n; i++) {
      char nm[32];
      snprintf(nm, sizeof nm, "d%d", i);
      json_array_append_new(ls, json_pack("{ss s{ss}}", "class_name", "Dense",
                                          "config", "name", nm));
    }
    json_t *m = json_pack("{ss s{so}}", "class_name", "Sequential", "config",
                          "layers", ls);
    char *s = json_dumps(m, 0);
    if (n == 256) {
      json_t *mm = parse(s);
      size_t order[1];
      char err[256] = "";
      assert_int_equal(chief_keras_weight_order(mm, NULL, 0, order, err,
                                                sizeof err), 0);
      json_decref(mm);
    } else {
      expect_refused(s, NULL, 0, TSR_ERANGE, "over 256 layers");
    }
    free(s);
    json_decref(m);
  }
  /* a layer reading 9 tensors; a model of 17 inputs */
  json_t *ls = json_array(), *ins = json_array(), *refs = json_array();
  for (int i = 0; i < 17; i++) {
    char nm[32];
    snprintf(nm, sizeof nm, "in%d", i);
    json_array_append_new(ls, json_pack("{ss ss s{s[ni]} s[]}", "name", nm,
                                        "class_name", "InputLayer", "config",
                                        "batch_input_shape", 1,
                                        "inbound_nodes"));
    json_array_append_new(ins, json_pack("[sii]", nm, 0, 0));
    if (i < 9) json_array_append_new(refs, json_pack("[sii{}]", nm, 0, 0));
  }
  json_array_append_new(ls, json_pack("{ss ss s{} s[o]}", "name", "cat",
                                      "class_name", "Concatenate", "config",
                                      "inbound_nodes", refs));
  json_t *m = json_pack("{ss s{so so s[[sii]]}}", "class_name", "Functional",
                        "config", "layers", ls, "input_layers", ins,
                        "output_layers", "cat", 0, 0);
  char *s = json_dumps(m, 0);
  expect_refused(s, NULL, 0, TSR_ERANGE, "layer 'cat': more than 8 inputs");
  json_array_remove(ls, json_array_size(ls) - 1);
  json_array_append_new(ls, json_pack("{ss ss s{} s[[[sii{}]]]}", "name",
                                      "cat", "class_name", "Dense", "config",
                                      "inbound_nodes", "in0", 0, 0));
  free(s);
  s = json_dumps(m, 0);
  expect_refused(s, NULL, 0, TSR_ERANGE, "more than 16 input_layers");
  free(s);
  json_decref(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_functional_order),
      cmocka_unit_test(test_sequential_files),
      cmocka_unit_test(test_npz_keras_order),
      cmocka_unit_test(test_keras_functional_inputs),
      cmocka_unit_test(test_refusals),
      cmocka_unit_test(test_limits),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
