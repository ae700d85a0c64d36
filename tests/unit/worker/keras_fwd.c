/* keras_fwd: runs a Keras model.to_json() document through the executor on
 * given weights and inputs, for keras_compare.py to set beside Keras's own
 * outputs and gradients.
 *
 *   keras_fwd MODEL.json LOSS --vars
 *       prints "name numel" per variable, in the model's order
 *   keras_fwd MODEL.json LOSS WEIGHTS.f32 X.f32 Y.f32 N OUT.f32
 *       WEIGHTS: every variable's float32 values in that order; X: N rows of
 *       the model's dense features; Y: N labels. Writes to OUT: the
 *       inference outputs [N, out_dim], the training-mode outputs [N,
 *       out_dim] (batch statistics), the training loss (mean over the batch
 *       plus regularization) and the gradients of that loss, variable by
 *       variable (a moving statistic's "gradient" is its batch statistic).
 *   keras_fwd --check DIR
 *       runs DIR/model.json on DIR/w.f32, x.f32, y.f32 (DIR/n examples) and
 *       compares the result with DIR/expect.f32, Keras's figures in the
 *       same layout (keras_compare.py TSR_KERAS_WRITE_REF writes them):
 *       outputs and loss within 1e-5, each gradient within 2e-4 (relative
 *       to its norm, as keras_compare.py).
 * Exit 0, or 1 with a message on stderr. */
#include "common/err.h"
#include "worker/model_exec.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static float *slurp(const char *path, size_t want) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  float *b = malloc((want ? want : 1) * sizeof *b);
  size_t got = fread(b, sizeof *b, want, f);
  fclose(f);
  if (got != want) {
    fprintf(stderr, "keras_fwd: %s has %zu floats, want %zu\n", path, got,
            want);
    free(b);
    return NULL;
  }
  return b;
}

static int run_main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: keras_fwd MODEL.json LOSS --vars | WEIGHTS X Y "
            "N OUT\n");
    return 1;
  }
  json_error_t je;
  json_t *j = json_load_file(argv[1], 0, &je);
  if (!j) {
    fprintf(stderr, "keras_fwd: %s: %s\n", argv[1], je.text);
    return 1;
  }
  char err[1024];
  tsr_model *m;
  if (tsr_model_build(j, argv[2], NULL, 0, NULL, &m, err, sizeof err)) {
    fprintf(stderr, "keras_fwd: %s\n", err);
    return 1;
  }
  json_decref(j);
  const tsr_var *vi;
  size_t nv;
  tsr_model_variables(m, &vi, &nv);
  if (!strcmp(argv[3], "--vars")) {
    for (size_t v = 0; v < nv; v++)
      printf("%s %lld\n", vi[v].name, (long long)vi[v].numel);
    tsr_model_free(m);
    return 0;
  }
  if (argc < 8) return 1;
  int64_t n = atoll(argv[6]), nd = tsr_model_input_dense(m),
          od = tsr_model_output_dim(m);
  size_t tot = 0;
  for (size_t v = 0; v < nv; v++) tot += (size_t)vi[v].numel;
  float *w = slurp(argv[3], tot), *x = slurp(argv[4], (size_t)(n * nd)),
        *y = slurp(argv[5], (size_t)n);
  if (!w || !x || !y) return 1;
  float **p = calloc(nv, sizeof *p), **g = calloc(nv, sizeof *g);
  float **full = calloc(nv, sizeof *full);
  kern_opts ko = {.device = KERN_DEVICE_CPU};
  kern_ctx *c;
  wk_exec *e;
  if (kern_open(&ko, &c, err, sizeof err) ||
      wk_exec_open(m, c, n, KERN_F32, &e, err, sizeof err)) {
    fprintf(stderr, "keras_fwd: %s\n", err);
    return 1;
  }
  wk_batch b = {.n = n, .n_dense = nd, .x = x, .y = y};
  if (wk_exec_prepare(e, &b, 0, n, NULL, err, sizeof err)) {
    fprintf(stderr, "keras_fwd: %s\n", err);
    return 1;
  }
  /* a row-sparse variable (an Embedding) takes the rows of the batch's
   * ids; its gradient is scattered back to the full table */
  size_t off = 0;
  for (size_t v = 0; v < nv; v++) {
    full[v] = w + off;
    g[v] = calloc((size_t)vi[v].numel, sizeof(float));
    p[v] = full[v];
    if (vi[v].kind != TSR_VAR_DENSE) {
      const int64_t *ids;
      int64_t nr;
      wk_exec_rows(e, (int)v, &ids, &nr);
      p[v] = malloc((size_t)(nr * vi[v].row_dim + 1) * sizeof(float));
      for (int64_t r = 0; r < nr; r++)
        memcpy(p[v] + r * vi[v].row_dim, full[v] + ids[r] * vi[v].row_dim,
               (size_t)vi[v].row_dim * sizeof(float));
    }
    off += (size_t)vi[v].numel;
  }
  FILE *out = fopen(argv[7], "wb");
  if (!out) return 1;
  wk_run_opts o = {.train = false, .grad_scale = 1.0f / (float)n, .seed = 1};
  wk_run_result r;
  if (wk_exec_run(e, p, NULL, &o, &r)) return 1;
  fwrite(r.pred, sizeof(float), (size_t)(n * od), out);
  o.train = true;
  if (wk_exec_run(e, p, g, &o, &r)) return 1;
  fwrite(r.pred, sizeof(float), (size_t)(n * od), out);
  float loss = (float)(r.loss_sum / (double)n);
  fwrite(&loss, sizeof loss, 1, out);
  for (size_t v = 0; v < nv; v++) {
    if (vi[v].kind != TSR_VAR_DENSE) { /* rows back to their ids */
      const int64_t *ids;
      int64_t nr;
      wk_exec_rows(e, (int)v, &ids, &nr);
      float *gf = calloc((size_t)vi[v].numel, sizeof(float));
      for (int64_t q = 0; q < nr; q++)
        memcpy(gf + ids[q] * vi[v].row_dim, g[v] + q * vi[v].row_dim,
               (size_t)vi[v].row_dim * sizeof(float));
      free(g[v]);
      free(p[v]);
      g[v] = gf;
    }
    fwrite(g[v], sizeof(float), (size_t)vi[v].numel, out);
  }
  fclose(out);
  for (size_t v = 0; v < nv; v++) free(g[v]);
  free(p);
  free(full);
  free(g);
  free(w);
  free(x);
  free(y);
  wk_exec_close(e);
  kern_close(c);
  tsr_model_free(m);
  return 0;
}

static double rel(const float *a, const float *b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) {
    double d = (double)a[i] - b[i];
    num += d * d;
    den += (double)b[i] * b[i];
  }
  den = sqrt(den);
  return sqrt(num) / (den > 1e-3 ? den : 1e-3);
}

static int check(const char *dir) {
  char mj[4096], wf[4096], xf[4096], yf[4096], nf[4096], ef[4096];
  char of[] = "/tmp/keras_fwd_XXXXXX";
  snprintf(mj, sizeof mj, "%s/model.json", dir);
  snprintf(wf, sizeof wf, "%s/w.f32", dir);
  snprintf(xf, sizeof xf, "%s/x.f32", dir);
  snprintf(yf, sizeof yf, "%s/y.f32", dir);
  snprintf(nf, sizeof nf, "%s/n", dir);
  snprintf(ef, sizeof ef, "%s/expect.f32", dir);
  FILE *f = fopen(nf, "r");
  long long n = 0;
  if (!f || fscanf(f, "%lld", &n) != 1 || n < 1) {
    fprintf(stderr, "keras_fwd: %s: no example count\n", nf);
    if (f) fclose(f);
    return 1;
  }
  fclose(f);
  int fd = mkstemp(of);
  if (fd < 0) return 1;
  close(fd);
  char ns[32];
  snprintf(ns, sizeof ns, "%lld", n);
  const char *loss = "sparse_categorical_crossentropy";
  char *av[] = {"keras_fwd", mj, (char *)loss, wf, xf, yf, ns, of, NULL};
  int rc = run_main(8, av);
  json_error_t je;
  json_t *j = json_load_file(mj, 0, &je);
  char err[1024];
  tsr_model *m = NULL;
  if (rc || !j || tsr_model_build(j, loss, NULL, 0, NULL, &m, err,
                                  sizeof err)) {
    unlink(of);
    json_decref(j);
    return 1;
  }
  json_decref(j);
  const tsr_var *vi;
  size_t nv, tot = 2 * (size_t)n * (size_t)tsr_model_output_dim(m) + 1;
  tsr_model_variables(m, &vi, &nv);
  for (size_t v = 0; v < nv; v++) tot += (size_t)vi[v].numel;
  float *got = slurp(of, tot), *want = slurp(ef, tot);
  unlink(of);
  int fails = 0;
  if (!got || !want) fails++;
  size_t od = (size_t)n * (size_t)tsr_model_output_dim(m), off = 2 * od + 1;
  struct { const char *what; size_t at, cnt; double tol; } part[3] = {
      {"inference outputs", 0, od, 1e-5},
      {"training-mode outputs", od, od, 1e-5},
      {"training loss", 2 * od, 1, 1e-5}};
  for (int i = 0; got && want && i < 3; i++) {
    double e = rel(got + part[i].at, want + part[i].at, part[i].cnt);
    bool ok = e <= part[i].tol;
    printf("%s: %-50s rel err %9.2e (tol %.0e) %s\n", dir, part[i].what, e,
           part[i].tol, ok ? "ok" : "FAIL");
    fails += !ok;
  }
  for (size_t v = 0; got && want && v < nv; v++) {
    size_t cnt = (size_t)vi[v].numel;
    double e = rel(got + off, want + off, cnt);
    bool ok = e <= 2e-4;
    printf("%s: d loss / d %-38s rel err %9.2e (tol 2e-04) %s\n", dir,
           vi[v].name, e, ok ? "ok" : "FAIL");
    fails += !ok;
    off += cnt;
  }
  free(got);
  free(want);
  tsr_model_free(m);
  return fails ? 1 : 0;
}

int main(int argc, char **argv) {
  if (argc == 3 && !strcmp(argv[1], "--check")) return check(argv[2]);
  return run_main(argc, argv);
}
