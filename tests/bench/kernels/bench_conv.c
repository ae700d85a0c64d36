/* CPU training step of the Fashion-MNIST CNN (Conv2D 32 3x3, MaxPooling2D,
 * Conv2D 64 3x3, MaxPooling2D, Flatten, Dense 128, Dropout, Dense 10) at
 * batch 128, against the sgemm rate OpenBLAS reaches on exactly the step's
 * matrix products in the same run, with the im2col/col2im and pooling
 * times beside them, so the table says where a conv step goes and whether
 * a direct convolution would pay (the first layer's products have k = 9).
 * RATIO cnn_step_vs_products = (time of the bare products) / (time of the
 * step), goal 0.5. One OpenBLAS thread, as a worker runs. Usage:
 * bench_conv [reps] */
#include "common/err.h"
#include "kernels/kern_nn.h"
#include "worker/model_exec.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmpd(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

#define Q "\""
static const char *model_json =
    "{" Q "class_name" Q ": " Q "Sequential" Q ", " Q "config" Q ": {" Q
    "layers" Q ": [{" Q "class_name" Q ": " Q "InputLayer" Q ", " Q "config" Q
    ": {" Q "batch_input_shape" Q ": [null, 28, 28, 1]}}, {" Q "class_name" Q
    ": " Q "Conv2D" Q ", " Q "config" Q ": {" Q "filters" Q ": 32, " Q
    "kernel_size" Q ": 3, " Q "activation" Q ": " Q "relu" Q "}}, {" Q
    "class_name" Q ": " Q "MaxPooling2D" Q ", " Q "config" Q ": {}}, {" Q
    "class_name" Q ": " Q "Conv2D" Q ", " Q "config" Q ": {" Q "filters" Q
    ": 64, " Q "kernel_size" Q ": 3, " Q "activation" Q ": " Q "relu" Q
    "}}, {" Q "class_name" Q ": " Q "MaxPooling2D" Q ", " Q "config" Q
    ": {}}, {" Q "class_name" Q ": " Q "Flatten" Q ", " Q "config" Q ": {}}, {"
    Q "class_name" Q ": " Q "Dense" Q ", " Q "config" Q ": {" Q "units" Q
    ": 128, " Q "activation" Q ": " Q "relu" Q "}}, {" Q "class_name" Q ": "
    Q "Dropout" Q ", " Q "config" Q ": {" Q "rate" Q ": 0.5}}, {" Q
    "class_name" Q ": " Q "Dense" Q ", " Q "config" Q ": {" Q "units" Q
    ": 10, " Q "activation" Q ": " Q "softmax" Q "}}]}}";

#define B 128
/* the step's products {ta, tb, m, n, k}: conv1 fwd, dW; conv2 fwd, dW,
 * dcols; dense fwd, dW, dx; dense_1 fwd, dW, dx */
static const int prods[][5] = {
    {0, 0, B * 676, 32, 9},    {1, 0, 9, 32, B * 676},
    {0, 0, B * 121, 64, 288},  {1, 0, 288, 64, B * 121},
    {0, 1, B * 121, 288, 64},  {0, 0, B, 128, 1600},
    {1, 0, 1600, 128, B},      {0, 1, B, 1600, 128},
    {0, 0, B, 10, 128},        {1, 0, 128, 10, B},
    {0, 1, B, 128, 10}};
#define NP (sizeof prods / sizeof prods[0])

static double median(double *t, int n) {
  qsort(t, (size_t)n, sizeof *t, cmpd);
  return t[n / 2];
}

int main(int argc, char **argv) {
  int reps = argc > 1 ? atoi(argv[1]) : 15;
  if (reps < 3) reps = 3;
  const char *ct = getenv("OPENBLAS_CORETYPE");
  char err[1024];
  json_error_t je;
  json_t *j = json_loads(model_json, 0, &je);
  tsr_model *m;
  if (!j || tsr_model_build(j, "sparse_categorical_crossentropy", NULL, 0,
                           NULL, &m, err, sizeof err)) {
    fprintf(stderr, "bench_conv: %s\n", j ? err : je.text);
    return 1;
  }
  json_decref(j);
  kern_opts ko = {.device = KERN_DEVICE_CPU, .cpu_threads = 1};
  kern_ctx *c;
  wk_exec *e;
  if (kern_open(&ko, &c, err, sizeof err) ||
      wk_exec_open(m, c, B, KERN_F32, &e, err, sizeof err)) {
    fprintf(stderr, "bench_conv: %s\n", err);
    return 1;
  }
  float *x = malloc(B * 784 * sizeof *x), y[B];
  for (int i = 0; i < B * 784; i++) x[i] = (float)(i % 255) / 255.0f;
  for (int i = 0; i < B; i++) y[i] = (float)(i % 10);
  wk_batch b = {.n = B, .n_dense = 784, .x = x, .y = y};
  if (wk_exec_prepare(e, &b, 0, B, NULL, err, sizeof err)) return 1;
  const tsr_var *vi;
  size_t nv;
  tsr_model_variables(m, &vi, &nv);
  float *p[16], *g[16];
  for (size_t v = 0; v < nv; v++) {
    p[v] = malloc((size_t)vi[v].numel * sizeof(float));
    g[v] = malloc((size_t)vi[v].numel * sizeof(float));
    tsr_model_init_var(m, (int)v, 1, 0, p[v], (size_t)vi[v].numel);
  }
  /* buffers for the bare products and the data movement ops */
  size_t big = (size_t)B * 676 * 288;
  float *A = malloc(big * 4), *Bm = malloc(big * 4), *C = malloc(big * 4);
  for (size_t i = 0; i < big; i++) A[i] = Bm[i] = C[i] = 0.001f * (float)(i % 97);
  kern_win w1, w2, p1;
  kern_win_make(&w1, 28, 28, 1, 3, 3, 1, 1, false);
  kern_win_make(&w2, 13, 13, 32, 3, 3, 1, 1, false);
  kern_win_make(&p1, 26, 26, 32, 2, 2, 2, 2, false);
  double *ts = malloc((size_t)reps * sizeof *ts), *tp = malloc((size_t)reps * sizeof *tp);
  double *tc = malloc((size_t)reps * sizeof *tc), *tl = malloc((size_t)reps * sizeof *tl);
  double per[NP] = {0};
  wk_run_opts o = {.train = true, .grad_scale = 1.0f / B, .seed = 1};
  wk_run_result r;
  for (int it = -2; it < reps; it++) {
    double t0 = now();
    if (wk_exec_run(e, p, g, &o, &r)) return 1;
    double t1 = now();
    for (size_t k = 0; k < NP; k++) {
      double a = now();
      const int *q = prods[k];
      cblas_sgemm(CblasRowMajor, q[0] ? CblasTrans : CblasNoTrans,
                  q[1] ? CblasTrans : CblasNoTrans, q[2], q[3], q[4], 1.0f, A,
                  q[0] ? q[2] : q[4], Bm, q[1] ? q[4] : q[3], 0.0f, C, q[3]);
      if (it >= 0) per[k] += now() - a;
    }
    double t2 = now();
    /* im2col of both convolutions (forward and again in the backward),
     * col2im of the second */
    kern_im2col(c, &w1, B, A, C);
    kern_im2col(c, &w1, B, A, C);
    kern_im2col(c, &w2, B, A, C);
    kern_im2col(c, &w2, B, A, C);
    kern_col2im(c, &w2, B, C, 0.0f, Bm);
    double t3 = now();
    int32_t *arg = (int32_t *)Bm;
    kern_pool2d_fwd(c, &p1, B, KERN_POOL2D_MAX, A, C, arg);
    kern_pool2d_grad(c, &p1, B, KERN_POOL2D_MAX, C, arg, 0.0f, A);
    double t4 = now();
    if (it < 0) continue;
    ts[it] = t1 - t0;
    tp[it] = t2 - t1;
    tc[it] = t3 - t2;
    tl[it] = t4 - t3;
  }
  double step = median(ts, reps), prod = median(tp, reps);
  double cols = median(tc, reps), pool = median(tl, reps);
  printf("OpenBLAS kernel %s (OPENBLAS_CORETYPE=%s), one thread, batch %d\n",
         kern_cpu_corename(), ct ? ct : "unset", B);
  printf("%-40s %10s %10s\n", "product (m x n x k)", "ms", "GFLOP/s");
  const char *names[NP] = {"conv2d fwd", "conv2d dW", "conv2d_1 fwd",
                           "conv2d_1 dW", "conv2d_1 dcols", "dense fwd",
                           "dense dW", "dense dx", "dense_1 fwd",
                           "dense_1 dW", "dense_1 dx"};
  for (size_t k = 0; k < NP; k++) {
    double t = per[k] / reps, fl = 2.0 * prods[k][2] * prods[k][3] * prods[k][4];
    char what[96];
    snprintf(what, sizeof what, "%s (%d x %d x %d)", names[k], prods[k][2],
             prods[k][3], prods[k][4]);
    printf("%-40s %10.2f %10.1f\n", what, t * 1e3, fl / t * 1e-9);
  }
  printf("%-40s %10.2f\n", "training step (median)", step * 1e3);
  printf("%-40s %10.2f\n", "its products alone", prod * 1e3);
  printf("%-40s %10.2f\n", "im2col x4 + col2im", cols * 1e3);
  printf("%-40s %10.2f\n", "max pooling 26x26x32 fwd + bwd", pool * 1e3);
  printf("%-40s %10.0f\n", "examples/s", B / step);
  printf("RATIO cnn_step_vs_products %.3f goal 0.5\n", prod / step);
  for (size_t v = 0; v < nv; v++) {
    free(p[v]);
    free(g[v]);
  }
  free(A); free(Bm); free(C); free(x); free(ts); free(tp); free(tc); free(tl);
  wk_exec_close(e);
  kern_close(c);
  tsr_model_free(m);
  return 0;
}
