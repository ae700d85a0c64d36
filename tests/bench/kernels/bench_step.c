/* CPU training step of an MLP 784-1024-1024-10 (relu, softmax, sparse
 * categorical cross-entropy, Adam) at batch 256, against the sgemm rate
 * OpenBLAS reaches on exactly the step's eight matrix products in the same
 * run. RATIO = (time of the bare products) / (time of the step): the share
 * of the sgemm rate the step keeps for its matmul work (goal 0.8).
 *
 * One OpenBLAS thread, as a worker runs. Reports which OpenBLAS kernel ran
 * and OPENBLAS_CORETYPE (left as the environment sets it). Usage:
 * bench_step [reps] */
#include "common/err.h"
#include "kernels/kern.h"
#include "worker/model.h"
#include "worker/train.h"

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

static const char *model_json =
    "{\"class_name\": \"Sequential\", \"config\": {\"layers\": ["
    "{\"class_name\": \"InputLayer\", \"config\": {\"batch_input_shape\": "
    "[null, 784]}}, {\"class_name\": \"Dense\", \"config\": {\"units\": 1024, "
    "\"activation\": \"relu\"}}, {\"class_name\": \"Dense\", \"config\": "
    "{\"units\": 1024, \"activation\": \"relu\"}}, {\"class_name\": \"Dense\", "
    "\"config\": {\"units\": 10, \"activation\": \"softmax\"}}]}}";

/* The step's products: {ta, tb, m, n, k} */
static const int prods[8][5] = {
    {0, 0, 256, 1024, 784},  {0, 0, 256, 1024, 1024}, {0, 0, 256, 10, 1024},
    {1, 0, 1024, 10, 256},   {0, 1, 256, 1024, 10},    {1, 0, 1024, 1024, 256},
    {0, 1, 256, 1024, 1024}, {1, 0, 784, 1024, 256}};

int main(int argc, char **argv) {
  int reps = argc > 1 ? atoi(argv[1]) : 30;
  if (reps < 3) reps = 3;
  char err[1024];
  const char *ct = getenv("OPENBLAS_CORETYPE");
  /* the model and trainer first: opening the CPU context sets 1 thread */
  json_error_t je;
  json_t *mj = json_loads(model_json, 0, &je);
  tsr_model *m;
  char *mets[] = {"accuracy"};
  if (tsr_model_build(mj, "sparse_categorical_crossentropy", mets, 1, NULL, &m,
                     err, sizeof err)) {
    fprintf(stderr, "%s\n", err);
    return 1;
  }
  json_decref(mj);
  tsr_optim_spec opt;
  tsr_optim_defaults(TSR_OPT_ADAM, &opt);
  wk_train_opts to = {.device = KERN_DEVICE_CPU, .cpu_threads = 1, .quiet = true};
  wk_trainer *t;
  if (wk_trainer_open(m, &opt, 1, TSR_PREC_FP32, &to, 256, &t, err, sizeof err)) {
    fprintf(stderr, "%s\n", err);
    return 1;
  }
  int64_t B = 256;
  float *x = malloc((size_t)B * 784 * sizeof(float));
  float *y = malloc((size_t)B * sizeof(float));
  srand(1);
  for (int64_t i = 0; i < B * 784; i++) x[i] = (float)rand() / RAND_MAX;
  for (int64_t i = 0; i < B; i++) y[i] = (float)(rand() % 10);
  wk_batch b = {.n = B, .n_dense = 784, .x = x, .y = y};

  /* baseline buffers */
  float *A = malloc(1024 * 1024 * sizeof(float)), *Bm = malloc(1024 * 1024 * sizeof(float)),
        *C = malloc(1024 * 1024 * sizeof(float));
  for (int i = 0; i < 1024 * 1024; i++) {
    A[i] = (float)rand() / RAND_MAX - 0.5f;
    Bm[i] = (float)rand() / RAND_MAX - 0.5f;
  }
  double flops = 0;
  for (int p = 0; p < 8; p++)
    flops += 2.0 * prods[p][2] * prods[p][3] * prods[p][4];

  double *ts = malloc((size_t)reps * sizeof(double)),
         *tg = malloc((size_t)reps * sizeof(double));
  double loss;
  bool applied;
  for (int w = 0; w < 3; w++) wk_trainer_step(t, &b, &loss, &applied, err, sizeof err);
  for (int r = 0; r < reps; r++) {
    /* alternate the two so drifts of the shared machine hit both */
    double t0 = now();
    for (int p = 0; p < 8; p++) {
      const int *q = prods[p];
      cblas_sgemm(CblasRowMajor, q[0] ? CblasTrans : CblasNoTrans,
                  q[1] ? CblasTrans : CblasNoTrans, q[2], q[3], q[4], 1.0f, A,
                  q[0] ? q[2] : q[4], Bm, q[1] ? q[4] : q[3], 0.0f, C, q[3]);
    }
    tg[r] = now() - t0;
    t0 = now();
    if (wk_trainer_step(t, &b, &loss, &applied, err, sizeof err)) {
      fprintf(stderr, "%s\n", err);
      return 1;
    }
    ts[r] = now() - t0;
  }
  qsort(ts, (size_t)reps, sizeof *ts, cmpd);
  qsort(tg, (size_t)reps, sizeof *tg, cmpd);
  double step = ts[reps / 2], gemm = tg[reps / 2];
  printf("OpenBLAS kernel: %s (OPENBLAS_CORETYPE=%s), 1 thread\n",
         kern_cpu_corename(), ct ? ct : "(unset)");
  printf("%-44s %10s %10s\n", "what (median of reps)", "ms", "GFLOP/s");
  printf("%-44s %10.3f %10.1f\n", "sgemm, the step's 8 products", gemm * 1e3,
         flops / gemm * 1e-9);
  printf("%-44s %10.3f %10.1f\n", "training step (fwd+bwd+Adam), batch 256",
         step * 1e3, flops / step * 1e-9);
  printf("loss after %d steps: %.4f\n", reps + 3, loss);
  printf("RATIO mlp_784_1024_1024_10_b256_step_vs_sgemm %.3f goal 0.8\n",
         gemm / step);
  wk_trainer_close(t);
  tsr_model_free(m);
  free(x);
  free(y);
  free(A);
  free(Bm);
  free(C);
  free(ts);
  free(tg);
  return 0;
}
