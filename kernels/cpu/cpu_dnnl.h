/* The CPU backend's convolutions through oneDNN (Debian's libdnnl, built
 * only when meson finds it; KERN_HAVE_DNNL): kern__nn_ops's conv_* entries
 * for fp32.
 *
 * Happy path: activations stay NHWC as the model holds them; the kernel is
 * reordered from Keras's [kh, kw, c, f] into the layout oneDNN's kernel
 * wants once per call; the batch is cut into items of a fixed number of
 * examples (by the geometry alone), each one oneDNN primitive run
 * single-threaded on a pool thread. The kernel gradient is summed from
 * the items' partial gradients in item order, so the result does not
 * depend on the number of threads. oneDNN's OpenMP runtime never starts a
 * thread of its own: every thread that runs a primitive asks OpenMP for
 * one thread first.
 * Failure modes: a primitive oneDNN cannot create or run (TSR_EIO, with
 * the oneDNN status and the geometry in the last error), no memory
 * (TSR_ENOMEM).
 */
#ifndef TSR_KERN_CPU_DNNL_H
#define TSR_KERN_CPU_DNNL_H

#include "kernels/cpu/cpu_int.h"

int kern__dnnl_open(struct kern__dnnl **out, int threads, char *err,
                    size_t len);
void kern__dnnl_close(struct kern__dnnl *d);

int kern__dnnl_conv_fwd(void *impl, const kern_win *g, int64_t n, int64_t f,
                        const float *x, const float *w, const float *bias,
                        bool relu, float *y);
int kern__dnnl_conv_bwd_data(void *impl, const kern_win *g, int64_t n,
                             int64_t f, const float *dy, const float *w,
                             float beta, float *dx);
int kern__dnnl_conv_bwd_filter(void *impl, const kern_win *g, int64_t n,
                               int64_t f, const float *x, const float *dy,
                               float *dw, float *db);
/* "oneDNN 2.6.3" */
const char *kern__dnnl_name(void *impl);

#endif
