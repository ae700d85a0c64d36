/* Keras weight files of the sequence layers (artifacts/weights/): where
 * Keras 3 and tf_keras keep the variables of the layers made of
 * sub-layers (Bidirectional's forward_layer/cell and backward_layer/cell,
 * an RNN's cell, MultiHeadAttention's query_dense ... output_dense, with
 * tf_keras's _query_dense ..., TimeDistributed's layer), Attention's
 * scale as Keras's scalar in every file and the npz, model.layers order
 * through a tensor passed by keyword (tf_keras's mha(g, value=c)), the
 * .keras config of that call, and the refusals. The graph and its order
 * are what tf_keras 2.21 and Keras 3.15 list for it:
 * x, bi, g, c, mha, att, td. */
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

typedef struct {
  const char *name;
  int rank;
  int64_t shape[3];
} tspec;

/* In Tessera's creation order (the JSON's layer order), not Keras's. */
static const tspec specs[] = {
    {"c/kernel", 3, {1, 3, 4}},
    {"c/bias", 1, {4}},
    {"bi/forward_lstm/lstm_cell/kernel", 2, {3, 8}},
    {"bi/forward_lstm/lstm_cell/recurrent_kernel", 2, {2, 8}},
    {"bi/forward_lstm/lstm_cell/bias", 1, {8}},
    {"bi/backward_lstm/lstm_cell/kernel", 2, {3, 8}},
    {"bi/backward_lstm/lstm_cell/recurrent_kernel", 2, {2, 8}},
    {"bi/backward_lstm/lstm_cell/bias", 1, {8}},
    {"g/gru_cell/kernel", 2, {4, 6}},
    {"g/gru_cell/recurrent_kernel", 2, {2, 6}},
    {"g/gru_cell/bias", 2, {2, 6}},
    {"mha/query/kernel", 3, {2, 1, 2}},
    {"mha/query/bias", 2, {1, 2}},
    {"mha/key/kernel", 3, {4, 1, 2}},
    {"mha/key/bias", 2, {1, 2}},
    {"mha/value/kernel", 3, {4, 1, 2}},
    {"mha/value/bias", 2, {1, 2}},
    {"mha/attention_output/kernel", 3, {1, 2, 2}},
    {"mha/attention_output/bias", 1, {2}},
    {"att/scale", 1, {1}},
    {"td/kernel", 2, {2, 3}},
    {"td/bias", 1, {3}},
};
#define NV (sizeof specs / sizeof *specs)

/* get_weights: x, bi, g, c, mha, att, td */
static const char *const keras_order[NV] = {
    "bi/forward_lstm/lstm_cell/kernel",
    "bi/forward_lstm/lstm_cell/recurrent_kernel",
    "bi/forward_lstm/lstm_cell/bias",
    "bi/backward_lstm/lstm_cell/kernel",
    "bi/backward_lstm/lstm_cell/recurrent_kernel",
    "bi/backward_lstm/lstm_cell/bias",
    "g/gru_cell/kernel",
    "g/gru_cell/recurrent_kernel",
    "g/gru_cell/bias",
    "c/kernel",
    "c/bias",
    "mha/query/kernel",
    "mha/query/bias",
    "mha/key/kernel",
    "mha/key/bias",
    "mha/value/kernel",
    "mha/value/bias",
    "mha/attention_output/kernel",
    "mha/attention_output/bias",
    "att/scale",
    "td/kernel",
    "td/bias"};

#define LAYER(name, cls, cfg, in)                   \
  "{\"name\": \"" name "\", \"class_name\": \"" cls \
  "\", \"config\": "                                \
  "{\"name\": \"" name "\"" cfg "}, \"inbound_nodes\": " in "}"
#define MHA_SHAPES                                                      \
  ", \"num_heads\": 1, \"key_dim\": 2, \"query_shape\": [null, 4, 2], " \
  "\"value_shape\": [null, 4, 4], \"key_shape\": [null, 4, 4], "        \
  "\"softmax_robust_masking\": false"
static const char *model_tmpl =
    "{\"class_name\": \"Functional\", \"config\": {\"layers\": ["
    "{\"name\": \"x\", \"class_name\": \"InputLayer\", \"config\": "
    "{\"batch_input_shape\": [null, 4, 3], \"name\": \"x\"}, "
    "\"inbound_nodes\": []},"
    LAYER("c", "Conv1D", "", "[[[\"x\", 0, 0, {}]]]") ","
    LAYER("bi", "Bidirectional",
          ", \"layer\": {\"class_name\": \"LSTM\", \"config\": {\"name\": "
          "\"lstm\", \"units\": 2, \"time_major\": false}}",
          "[[[\"x\", 0, 0, {}]]]") ","
    LAYER("g", "GRU", ", \"time_major\": false", "[[[\"bi\", 0, 0, {}]]]") ","
    LAYER("mha", "MultiHeadAttention", "%s",
          "[[[\"g\", 0, 0, {\"value\": [\"c\", 0, 0]}]]]") ","
    LAYER("att", "Attention", ", \"use_scale\": true",
          "[[[\"mha\", 0, 0, {}], [\"g\", 0, 0, {}]]]") ","
    LAYER("td", "TimeDistributed",
          ", \"layer\": {\"class_name\": \"Dense\", \"config\": {\"name\": "
          "\"dense\", \"units\": 3}}",
          "[[[\"att\", 0, 0, {}]]]")
    "], \"input_layers\": [[\"x\", 0, 0]], \"output_layers\": "
    "[[\"td\", 0, 0]]}}";

static json_t *model_with(const char *mha_cfg) {
  char buf[8192];
  snprintf(buf, sizeof buf, model_tmpl, mha_cfg);
  json_error_t je;
  json_t *j = json_loads(buf, 0, &je);
  if (!j) fail_msg("bad test JSON: %s at %d", je.text, je.position);
  return j;
}

static size_t numel(const tspec *s) {
  size_t n = 1;
  for (int d = 0; d < s->rank; d++) n *= (size_t)s->shape[d];
  return n;
}

/* Distinct values: variable i holds 1000 i + k. */
static void make(float **data, chief_export_var *ev) {
  for (size_t i = 0; i < NV; i++) {
    data[i] = malloc(numel(&specs[i]) * sizeof(float));
    for (size_t k = 0; k < numel(&specs[i]); k++)
      data[i][k] = (float)(1000 * i + k);
    ev[i] = (chief_export_var){specs[i].name, specs[i].rank, specs[i].shape,
                               data[i]};
  }
}

static void release(float **data) {
  for (size_t i = 0; i < NV; i++) free(data[i]);
}

/* Each test's folder, model (with the recorded shapes) and variables. */
typedef struct {
  char dir[256];
  json_t *m;
  float *data[NV];
  chief_export_var ev[NV];
} fixture;

static int fx_setup(void **state) {
  fixture *f = calloc(1, sizeof *f);
  test_tmpdir(f->dir, sizeof f->dir);
  f->m = model_with(MHA_SHAPES);
  make(f->data, f->ev);
  *state = f;
  return 0;
}

static int fx_teardown(void **state) {
  fixture *f = *state;
  release(f->data);
  json_decref(f->m);
  test_rmtree(f->dir);
  free(f);
  return 0;
}

static size_t find(const char *name) {
  for (size_t i = 0; i < NV; i++)
    if (!strcmp(specs[i].name, name)) return i;
  fail_msg("no variable %s", name);
  return 0;
}

/* The dataset's rank, and its first value in *first; -1 if absent. */
static int h5_rank(const char *path, const char *obj, float *first) {
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
  hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
  int rank = -1;
  if (f >= 0 && H5Lexists(f, obj, H5P_DEFAULT) > 0 &&
      H5Oexists_by_name(f, obj, H5P_DEFAULT) > 0) {
    hid_t ds = H5Dopen2(f, obj, H5P_DEFAULT);
    hid_t sp = H5Dget_space(ds);
    rank = H5Sget_simple_extent_ndims(sp);
    hssize_t n = H5Sget_simple_extent_npoints(sp);
    float *buf = malloc((size_t)n * sizeof(float));
    H5Dread(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf);
    *first = buf[0];
    free(buf);
    H5Sclose(sp);
    H5Dclose(ds);
  }
  if (f >= 0) H5Fclose(f);
  return rank;
}

/* `var`'s first value at `obj`, with `rank` dims */
static void expect_at(const char *path, const char *obj, const char *var,
                      int rank) {
  float first = -1;
  int got = h5_rank(path, obj, &first);
  if (got != rank)
    fail_msg("%s: %s has rank %d, want %d", path, obj, got, rank);
  if (first != (float)(1000 * find(var)))
    fail_msg("%s: %s holds %g, not %s", path, obj, first, var);
}

static void h5_unlink(const char *path, const char *obj) {
  hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
  assert_true(f >= 0);
  assert_true(H5Ldelete(f, obj, H5P_DEFAULT) >= 0);
  H5Fclose(f);
}

/* Loads path into fresh buffers and compares every variable; returns the
 * loader's code (err filled). */
static int load_cmp(const char *path, const json_t *m, char *err,
                    size_t errlen) {
  float *back[NV];
  chief_import_var iv[NV];
  for (size_t i = 0; i < NV; i++) {
    back[i] = calloc(numel(&specs[i]), sizeof(float));
    iv[i] = (chief_import_var){specs[i].name, specs[i].rank, specs[i].shape,
                               back[i]};
  }
  int rc = chief_weights_load(path, m, iv, NV, err, errlen);
  for (size_t i = 0; !rc && i < NV; i++)
    for (size_t k = 0; k < numel(&specs[i]); k++)
      if (back[i][k] != (float)(1000 * i + k))
        fail_msg("%s: %s[%zu] = %g", path, specs[i].name, k, back[i][k]);
  release(back);
  return rc;
}

static void test_order(void **state) {
  const json_t *m = ((fixture *)*state)->m;
  const char *names[NV];
  size_t order[NV];
  char err[512] = "";
  for (size_t i = 0; i < NV; i++) names[i] = specs[i].name;
  /* c is read only through mha's value=: without it c belongs to no layer */
  if (chief_keras_weight_order(m, names, NV, order, err, sizeof err))
    fail_msg("%s", err);
  for (size_t k = 0; k < NV; k++)
    assert_string_equal(names[order[k]], keras_order[k]);
}

static void test_weights_h5(void **state) {
  fixture *f = *state;
  char p[512], err[512] = "";
  snprintf(p, sizeof p, "%s/w.weights.h5", f->dir);
  assert_int_equal(chief_export_weights_h5(p, f->m, f->ev, NV, err, sizeof err),
                   0);
  static const struct {
    const char *obj, *var;
    int rank;
  } at[] = {
      {"layers/conv1d/vars/1", "c/bias", 1},
      {"layers/bidirectional/forward_layer/cell/vars/0",
       "bi/forward_lstm/lstm_cell/kernel", 2},
      {"layers/bidirectional/forward_layer/cell/vars/2",
       "bi/forward_lstm/lstm_cell/bias", 1},
      {"layers/bidirectional/backward_layer/cell/vars/1",
       "bi/backward_lstm/lstm_cell/recurrent_kernel", 2},
      {"layers/gru/cell/vars/2", "g/gru_cell/bias", 2},
      {"layers/multi_head_attention/query_dense/vars/0", "mha/query/kernel", 3},
      {"layers/multi_head_attention/_query_dense/vars/1", "mha/query/bias", 2},
      {"layers/multi_head_attention/key_dense/vars/0", "mha/key/kernel", 3},
      {"layers/multi_head_attention/_value_dense/vars/1", "mha/value/bias", 2},
      {"layers/multi_head_attention/output_dense/vars/0",
       "mha/attention_output/kernel", 3},
      {"layers/multi_head_attention/_output_dense/vars/1",
       "mha/attention_output/bias", 1},
      {"layers/attention/vars/0", "att/scale", 0},
      {"layers/time_distributed/layer/vars/0", "td/kernel", 2},
      {"layers/time_distributed/layer/vars/1", "td/bias", 1},
  };
  for (size_t i = 0; i < sizeof at / sizeof *at; i++)
    expect_at(p, at[i].obj, at[i].var, at[i].rank);
  float first;
  assert_int_equal(h5_rank(p, "layers/bidirectional/vars/0", &first), -1);
  assert_int_equal(h5_rank(p, "layers/multi_head_attention/vars/0", &first),
                   -1);
  if (load_cmp(p, f->m, err, sizeof err)) fail_msg("%s", err);
  /* tf_keras's own .weights.h5 has only _query_dense, ... */
  static const char *const k3[] = {"query_dense", "key_dense", "value_dense",
                                   "output_dense"};
  char obj[128];
  for (int i = 0; i < 4; i++) {
    snprintf(obj, sizeof obj, "layers/multi_head_attention/%s", k3[i]);
    h5_unlink(p, obj);
  }
  if (load_cmp(p, f->m, err, sizeof err))
    fail_msg("tf_keras's layout: %s", err);
  /* neither name: refused, naming both */
  h5_unlink(p, "layers/multi_head_attention/_key_dense");
  assert_int_equal(load_cmp(p, f->m, err, sizeof err), TSR_ENOTFOUND);
  assert_non_null(strstr(err,
                         "w.weights.h5: no dataset "
                         "layers/multi_head_attention/key_dense/vars/0 "
                         "(nor tf_keras's layers/multi_head_attention/"
                         "_key_dense/vars/0) for mha/key/kernel"));
  /* tf_keras's .h5: Tessera's names, the scale a scalar */
  snprintf(p, sizeof p, "%s/w.h5", f->dir);
  assert_int_equal(chief_export_weights_h5(p, f->m, f->ev, NV, err, sizeof err),
                   0);
  expect_at(p, "att/att/scale:0", "att/scale", 0);
  expect_at(p, "bi/bi/backward_lstm/lstm_cell/kernel:0",
            "bi/backward_lstm/lstm_cell/kernel", 2);
  expect_at(p, "mha/mha/attention_output/kernel:0",
            "mha/attention_output/kernel", 3);
  if (load_cmp(p, f->m, err, sizeof err)) fail_msg("%s", err);
}

/* The npz in get_weights order with the scale a scalar; read back, and an
 * older npz with the scale as [1] still loads; [2] is refused. */
static void test_npz(void **state) {
  fixture *f = *state;
  char p[512], err[512] = "";
  snprintf(p, sizeof p, "%s/w.npz", f->dir);
  assert_int_equal(chief_export_npz(p, f->m, f->ev, NV, err, sizeof err), 0);
  size_t len = 0;
  char *buf = test_slurp(p, &len);
  assert_non_null(buf);
  /* members in Keras's order; the scale's header says a scalar */
  size_t at = 0;
  for (size_t k = 0; k < NV; k++) {
    char member[128];
    snprintf(member, sizeof member, "%s.npy", keras_order[k]);
    const char *hit = memmem(buf + at, len - at, member, strlen(member));
    if (!hit) fail_msg("%s missing or out of order", member);
    at = (size_t)(hit - buf);
    if (!strcmp(keras_order[k], "att/scale")) {
      const char *sh = memmem(hit, len - at, "'shape': (", 10);
      assert_non_null(sh);
      assert_memory_equal(sh, "'shape': ()", 11);
    }
  }
  free(buf);
  if (load_cmp(p, f->m, err, sizeof err)) fail_msg("%s", err);
  for (int wrong = 1; wrong <= 2; wrong++) {
    chief_npz *z;
    snprintf(p, sizeof p, "%s/old%d.npz", f->dir, wrong);
    assert_int_equal(chief_npz_open(&z, p, err, sizeof err), 0);
    for (size_t i = 0; i < NV; i++) {
      int64_t dim = wrong; /* the scale as [1], then [2] */
      bool scale = !strcmp(specs[i].name, "att/scale");
      float pair[2] = {f->data[i][0], f->data[i][0]};
      assert_int_equal(
          chief_npz_add_f32(z, specs[i].name, scale ? &dim : specs[i].shape,
                            specs[i].rank, scale ? pair : f->data[i], err,
                            sizeof err),
          0);
    }
    assert_int_equal(chief_npz_close(z, err, sizeof err), 0);
    int rc = load_cmp(p, f->m, err, sizeof err);
    if (wrong == 1 && rc) fail_msg("[1]: %s", err);
    if (wrong == 2) {
      assert_int_equal(rc, TSR_ESHAPE);
      assert_non_null(strstr(err,
                             "att/scale.npy has shape 2, the model's "
                             "att/scale is 1 (Keras: a scalar)"));
    }
  }
}

/* tf_keras's mha(g, value=c) becomes Keras 3's call with the value among
 * its kwargs, shaped as tf_keras recorded; the arguments Keras 3 refuses
 * go; without the recorded shape the export says so. */
static void test_keras3_call(void **state) {
  fixture *f = *state;
  char p[512], err[512] = "";
  snprintf(p, sizeof p, "%s/m.keras", f->dir);
  assert_int_equal(
      chief_export_keras(p, f->m, NULL, f->ev, NV, err, sizeof err), 0);
  json_t *cfg = test_keras_config(p);
  const json_t *mha = test_keras_layer(cfg, "mha");
  const json_t *call = json_array_get(json_object_get(mha, "inbound_nodes"), 0);
  const json_t *q = json_array_get(json_object_get(call, "args"), 0);
  const json_t *v = json_object_get(json_object_get(call, "kwargs"), "value");
  assert_string_equal(json_string_value(json_object_get(q, "class_name")),
                      "__keras_tensor__");
  const json_t *qc = json_object_get(q, "config"),
               *vc = json_object_get(v, "config");
  assert_string_equal(json_string_value(json_array_get(
                          json_object_get(qc, "keras_history"), 0)),
                      "g");
  assert_string_equal(json_string_value(json_array_get(
                          json_object_get(vc, "keras_history"), 0)),
                      "c");
  assert_int_equal(
      json_integer_value(json_array_get(json_object_get(vc, "shape"), 2)), 4);
  const json_t *mc = json_object_get(mha, "config");
  assert_null(json_object_get(mc, "query_shape"));
  assert_null(json_object_get(mc, "softmax_robust_masking"));
  const json_t *inner = json_object_get(
      json_object_get(json_object_get(test_keras_layer(cfg, "bi"), "config"),
                      "layer"),
      "config");
  assert_non_null(json_object_get(inner, "units"));
  assert_null(json_object_get(inner, "time_major"));
  assert_null(json_object_get(
      json_object_get(test_keras_layer(cfg, "g"), "config"), "time_major"));
  /* Attention's list of inputs stays a plain call */
  const json_t *att = json_array_get(
      json_object_get(test_keras_layer(cfg, "att"), "inbound_nodes"), 0);
  assert_int_equal(json_array_size(att), 2);
  json_decref(cfg);
  /* no value_shape recorded: refused, naming the layer and the key */
  json_t *bare = model_with(", \"num_heads\": 1, \"key_dim\": 2");
  assert_int_equal(
      chief_export_keras(p, bare, NULL, f->ev, NV, err, sizeof err),
      TSR_ECONFIG);
  assert_non_null(strstr(err,
                         "layer 'mha' (MultiHeadAttention): its value "
                         "argument's shape is not in the model"));
  json_decref(bare);
}

/* A sub-layer variable Keras has no place for, and a scale of more than
 * one number, are refused naming the variable. */
static void test_refusals(void **state) {
  fixture *f = *state;
  char p[512], err[512] = "";
  snprintf(p, sizeof p, "%s/w.weights.h5", f->dir);
  size_t q = find("mha/query/bias");
  f->ev[q].name = "mha/gate/kernel";
  assert_int_equal(chief_export_weights_h5(p, f->m, f->ev, NV, err, sizeof err),
                   TSR_EUNSUPPORTED);
  assert_non_null(strstr(err,
                         "variable mha/gate/kernel: a MultiHeadAttention "
                         "has query, key, value and attention_output "
                         "variables"));
  f->ev[q].name = specs[q].name;
  size_t s = find("att/scale");
  int64_t two = 2;
  f->ev[s].shape = &two;
  assert_int_equal(chief_export_weights_h5(p, f->m, f->ev, NV, err, sizeof err),
                   TSR_ESHAPE);
  assert_non_null(strstr(err,
                         "variable att/scale: an Attention's scale is "
                         "one number"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_order, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_weights_h5, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_npz, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_keras3_call, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_refusals, fx_setup, fx_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
