/* Internals of the CPU backend shared between its two files (memory and
 * products in cpu.c, activations and losses in cpu_ops.c), and the 16-bit
 * rounding that tests and the CUDA comparison use as the reference. */
#ifndef TSR_KERN_CPU_INT_H
#define TSR_KERN_CPU_INT_H

#include "kernels/kern_int.h"

int kern__cpu_bias_act(void *impl, float *z, const float *bias, float *y,
                       int64_t n, int64_t d, kern_act act, float alpha);
int kern__cpu_act_grad(void *impl, const float *dy, const float *z,
                       const float *y, float *dz, int64_t n, int64_t d,
                       kern_act act, float alpha);
int kern__cpu_loss(void *impl, kern_loss kind, float param, const float *p,
                   const float *y, int64_t n, int64_t d, float s,
                   float *ex_loss, float *grad);
/* Round to nearest even into bfloat16 / IEEE half, returned as float. */
float kern__round_bf16(float f);
float kern__round_f16(float f);

#endif
