/* Internals of the CPU backend shared between its files: memory, products
 * and the simple loops in cpu.c, activations and losses in cpu_ops.c
 * (their formulas are kern_math.h's), the image ops in cpu_nn.c and
 * cpu_norm.c, convolutions through oneDNN in cpu_dnnl.c (when built with
 * it), the threads in cpu_pool.c. Every op that is worth it runs over the
 * context's pool; cut by size only, so the result does not depend on the
 * number of threads. */
#ifndef TSR_KERN_CPU_INT_H
#define TSR_KERN_CPU_INT_H

#include "kernels/cpu/cpu_pool.h"
#include "kernels/kern_int.h"
#include "kernels/kern_nn.h"

#define KERN__CPU_SCRATCH 4

/* The hot loops are compiled for AVX-512 and AVX2 (x86-64-v4, -v3)
 * machines besides the baseline, and the best clone is picked when the
 * program loads (an ifunc): the build stays generic x86-64. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define KERN__HOT                                                    \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", \
                               "default")))
#else
#define KERN__HOT
#endif

struct kern__dnnl; /* cpu_dnnl.c */

typedef struct {
  /* 0, 1: 16-bit rounded copies of GEMM inputs; 2, 3: per-item partial
   * sums of reductions and convolution temporaries */
  float *scratch[KERN__CPU_SCRATCH];
  size_t scratch_n[KERN__CPU_SCRATCH];  /* elements */
  kern__pool *pool;
  struct kern__dnnl *dnnl;  /* NULL without oneDNN */
  char msg[256];          /* why the last failing op failed */
} kern__cpu;

/* Scratch slot i with room for n floats (64-byte aligned, kept by the
 * context); NULL when out of memory. */
float *kern__cpu_scratch(kern__cpu *c, int i, size_t n);

/* fn(arg, r0, r1, tid) over [0, total) cut into ranges of `grain` units
 * (the last shorter); with one thread one call over the whole range. For
 * ops whose result does not depend on the cut (element-wise, per row). */
typedef void (*kern__range_fn)(void *arg, int64_t r0, int64_t r1, int tid);
void kern__cpu_par(kern__cpu *c, int64_t total, int64_t grain,
                   kern__range_fn fn, void *arg);
/* The same, cut the same way whatever the number of threads (for per-range
 * partial sums reduced in range order); returns the number of ranges. */
int64_t kern__cpu_par_fixed(kern__cpu *c, int64_t total, int64_t grain,
                            kern__range_fn fn, void *arg);
/* Ranges of kern__cpu_par_fixed for these sizes. */
int64_t kern__cpu_par_count(int64_t total, int64_t grain);

/* cpu_norm.c: the normalizations of kern_nn.h. */
int kern__cpu_moments(void *impl, const float *x, int64_t rows, int64_t c,
                      float *mean, float *var);
int kern__cpu_bn_apply(void *impl, const float *x, int64_t rows, int64_t c,
                       const float *mean, const float *var, float eps,
                       const float *gamma, const float *beta, float *y);
int kern__cpu_bn_grad(void *impl, const float *dy, const float *x,
                      int64_t rows, int64_t c, const float *mean,
                      const float *var, float eps, const float *gamma,
                      float beta_dx, float *dx, float *dgamma, float *dbeta);
int kern__cpu_ln_fwd(void *impl, const float *x, int64_t rows, int64_t d,
                     float eps, const float *gamma, const float *beta,
                     float *y, float *mean, float *rstd);
int kern__cpu_ln_grad(void *impl, const float *dy, const float *x,
                      int64_t rows, int64_t d, const float *mean,
                      const float *rstd, const float *gamma, float beta_dx,
                      float *dx, float *dgamma, float *dbeta);

/* Records why an op failed (for kern_last_error) and returns rc. */
int kern__cpu_fail(void *impl, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

int kern__cpu_bias_act(void *impl, float *z, const float *bias, float *y,
                       int64_t n, int64_t d, kern_act act, float alpha);
int kern__cpu_act_grad(void *impl, const float *dy, const float *z,
                       const float *y, float *dz, int64_t n, int64_t d,
                       kern_act act, float alpha);
int kern__cpu_loss(void *impl, kern_loss kind, float param, const float *p,
                   const float *y, int64_t n, int64_t d, float grad_scale,
                   float *ex_loss, float *grad);

#endif
