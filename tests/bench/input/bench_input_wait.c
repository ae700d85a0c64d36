/* The share of step time a worker waits for its input: one epoch of the
 * Fashion-MNIST MLP (deploy/jobs/fashion_mnist.json: 784-256-128-10, Adam,
 * batch 128, shuffle buffer 60000, prefetch 4) trained on the CPU with the
 * standalone trainer, the input read through the pipeline.
 *
 * Waiting is wk_input_wait_seconds(): time the training loop spent blocked
 * in wk_input_next(). The first batch (which waits for the files to load,
 * as any first step does) is left out of both the wait and the loop time.
 * Ends with `RATIO input_fashion_mnist_not_waiting (1 - share) goal 0.95`
 * (the goal: under 5% waiting). On a shared, overloaded machine the
 * reader thread waits for a core and the wall-clock figure suffers, so the
 * CPU time of the reader per batch against the trainer's per step is
 * printed too: what the input costs when a core is free. Prints a note and no RATIO line
 * when Fashion-MNIST is not installed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "common/clock.h"
#include "common/err.h"
#include "common/job.h"
#include "worker/input.h"
#include "worker/model.h"
#include "worker/train.h"

int main(int argc, char **argv) {
  struct stat st;
  if (stat("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz",
           &st) != 0) {
    printf("Fashion-MNIST is not installed (Debian dataset-fashion-mnist): "
           "no input wait figure\n");
    return 0;
  }
  const char *src = getenv("TSR_SOURCE_DIR");
  char path[4096], err[512];
  if (argc > 1) /* another job file */
    snprintf(path, sizeof path, "%s", argv[1]);
  else
    snprintf(path, sizeof path, "%s/deploy/jobs/fashion_mnist.json",
             src ? src : "..");
  tsr_job job;
  if (tsr_job_load(path, NULL, &job, err, sizeof err)) {
    fprintf(stderr, "%s\n", err);
    return 1;
  }
  wk_input_opts io = {.worker_index = 0, .num_workers = 1,
                      .batch_size = job.batch_size, .epochs = 1,
                      .seed = job.seed};
  wk_input *in = NULL;
  tsr_model *m = NULL;
  wk_trainer *t = NULL;
  double t_open = tsr_now_s();
  if (wk_input_open(&job, WK_SPLIT_TRAIN, &io, &in, err, sizeof err) ||
      tsr_model_from_job(&job, wk_input_get_schema(in), &m, err, sizeof err)) {
    fprintf(stderr, "%s\n", err);
    return 1;
  }
  wk_train_opts to = {.device = KERN_DEVICE_CPU, .cpu_threads = 1,
                      .quiet = true};
  if (wk_trainer_open(m, &job.optimizer, job.seed, job.precision, &to,
                      job.batch_size, &t, err, sizeof err)) {
    fprintf(stderr, "%s\n", err);
    return 1;
  }
  const wk_batch *b;
  double loss = 0;
  bool applied;
  if (wk_input_next(in, &b) != 0 ||
      wk_trainer_step(t, b, &loss, &applied, err, sizeof err)) {
    fprintf(stderr, "first step: %s %s\n", err, wk_input_error(in));
    return 1;
  }
  double first = tsr_now_s() - t_open;
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  double cpu0 = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
  double rcpu0 = wk_input_reader_cpu_seconds(in);
  double w0 = wk_input_wait_seconds(in), t0 = tsr_now_s(), compute = 0;
  double in_next = 0;
  int64_t steps = 0;
  int rc;
  for (;;) {
    double n0 = tsr_now_s();
    rc = wk_input_next(in, &b);
    in_next += tsr_now_s() - n0;
    if (rc) break;
    double c0 = tsr_now_s();
    if (wk_trainer_step(t, b, &loss, &applied, err, sizeof err)) {
      fprintf(stderr, "step: %s\n", err);
      return 1;
    }
    compute += tsr_now_s() - c0;
    steps++;
  }
  double total = tsr_now_s() - t0, wait = wk_input_wait_seconds(in) - w0;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  double cpu = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec - cpu0;
  double rcpu = wk_input_reader_cpu_seconds(in) - rcpu0;
  if (rc != TSR_EEOF) {
    fprintf(stderr, "input: %s\n", wk_input_error(in));
    return 1;
  }
  printf("fashion-mnist MLP, standalone trainer on %s, 1 thread: open + first "
         "step %.2f s, then %lld steps in %.2f s (%.1f ms/step, compute %.1f "
         "ms/step), loss %.3f\n",
         wk_trainer_backend(t), first, (long long)steps, total,
         1e3 * total / (double)steps, 1e3 * compute / (double)steps, loss);
  printf("waiting for input: %.3f s of %.2f s (%.2f%%); inside "
         "wk_input_next() %.3f s\n",
         wait, total, 100 * wait / total, in_next);
  printf("CPU: training thread %.2f ms/step, input reader thread %.3f "
         "ms/batch (%.1f%% of a step)\n",
         1e3 * cpu / (double)steps, 1e3 * rcpu / (double)steps,
         100 * rcpu / cpu);
  printf("RATIO input_fashion_mnist_not_waiting %.4f goal 0.95\n",
         1 - wait / total);
  wk_trainer_close(t);
  tsr_model_free(m);
  wk_input_close(in);
  tsr_job_free(&job);
  return 0;
}
