/* Internals of the CPU backend shared between its two files: memory,
 * products and the simple loops in cpu.c, activations and losses in
 * cpu_ops.c (their formulas are kern_math.h's). */
#ifndef TSR_KERN_CPU_INT_H
#define TSR_KERN_CPU_INT_H

#include "kernels/kern_int.h"

typedef struct {
  float *scratch[2];      /* 16-bit rounded copies of GEMM inputs */
  size_t scratch_n[2];    /* elements */
  char msg[256];          /* why the last failing op failed */
} kern__cpu;

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
