/* kern.h front end: picks a backend, loads the CUDA module on demand, and
 * forwards every op through the backend's vtable.
 *
 * Happy path (CPU machine): kern_open(AUTO) sees no /dev/nvidia* node,
 * logs once that it uses the CPU, and never touches the CUDA libraries.
 * On a GPU machine: dlopen(libtsr_kern_cuda.so) -> its device count -> the
 * CUDA backend. Failure modes: the module missing or not loading (dlerror),
 * an ABI mismatch, zero devices (error 35 without a driver): AUTO falls back
 * to the CPU, GPU returns TSR_ENODEVICE naming the reason.
 */
#include "kernels/kern_int.h"
#include "kernels/kern_plan.h"
#include "common/err.h"
#include "common/log.h"
#include "tsr_config.h"

#include <cblas.h>
#include <dlfcn.h>
#include <glob.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define KERN_MODULE_FILE "libtsr_kern_cuda.so"

struct kern_ctx {
  const kern__ops *ops;
  void *impl;
  int device;
  char msg[320];  /* why the last failing op failed */
};

/* Loaded once per process; never unloaded (CUDA libraries do not support
 * being unloaded and reloaded cleanly). */
static pthread_once_t kern__auto_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t kern__mod_lock = PTHREAD_MUTEX_INITIALIZER;
static const kern__module *kern__mod;
static void *kern__mod_handle; /* for the module's other symbols */

int kern_module_path(char *buf, size_t len) {
  const char *env = getenv("TESSERA_MODULE_DIR");
  const char *dirs[3];
  int nd = 0;
  if (env && *env) dirs[nd++] = env;
#ifdef KERN_BUILD_MODULE_DIR
  dirs[nd++] = KERN_BUILD_MODULE_DIR;
#endif
  dirs[nd++] = TSR_MODULE_DIR;
  for (int i = 0; i < nd; i++) {
    snprintf(buf, len, "%s/%s", dirs[i], KERN_MODULE_FILE);
    if (access(buf, R_OK) == 0) return 0;
  }
  snprintf(buf, len, "%s/%s", TSR_MODULE_DIR, KERN_MODULE_FILE);
  return TSR_ENOTFOUND;
}

static bool kern__dev_nodes(void) {
  glob_t g;
  bool any = glob("/dev/nvidia[0-9]*", 0, NULL, &g) == 0 && g.gl_pathc > 0;
  globfree(&g);
  return any;
}

/* Loads the module (once) and asks it for the device count. */
static int kern__load(const kern_opts *o, int *count, char *why, size_t len) {
  *count = 0;
  /* the cheap check spares CPU machines the module's load time; an explicit
   * GPU request always asks the CUDA runtime */
  if (!o->force_module && o->device != KERN_DEVICE_GPU && !kern__dev_nodes()) {
    return tsr_errf(why, len, TSR_ENODEVICE,
                    "no NVIDIA device node (/dev/nvidia*) on this machine");
  }
  pthread_mutex_lock(&kern__mod_lock);
  int rc = 0;
  if (!kern__mod) {
    char path[4096];
    if (o->module_path) {
      snprintf(path, sizeof path, "%s", o->module_path);
    } else if (kern_module_path(path, sizeof path)) {
      rc = tsr_errf(why, len, TSR_ENODEVICE, "the CUDA module %s is not "
                    "installed (this build has no GPU backend, or it was "
                    "built without -Dgpu)", path);
      goto out;
    }
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      rc = tsr_errf(why, len, TSR_ENODEVICE,
                    "cannot load the CUDA module %s: %s", path, dlerror());
      goto out;
    }
    const kern__module *m = (const kern__module *)dlsym(h, KERN__MODULE_SYMBOL);
    if (!m || m->abi != KERN__ABI) {
      rc = tsr_errf(why, len, TSR_ENODEVICE, "%s: %s", path,
                    m ? "module ABI version differs from this binary"
                      : "not a tessera CUDA module (symbol missing)");
      dlclose(h);
      goto out;
    }
    kern__mod = m;
    kern__mod_handle = h;
  }
  if (why && len) why[0] = 0;
  rc = kern__mod->device_count(count, why, len);
  if (rc == 0 && *count == 0) {
    if (why && len && !why[0])
      tsr_errf(why, len, 0, "the CUDA runtime sees no GPU");
    rc = TSR_ENODEVICE;
  }
out:
  pthread_mutex_unlock(&kern__mod_lock);
  return rc;
}

int kern_gpu_count(const kern_opts *opts, int *count, char *why, size_t len) {
  kern_opts d = {0};
  int rc = kern__load(opts ? opts : &d, count, why, len);
  if (rc == TSR_ENODEVICE) rc = 0;
  return rc;
}

static char kern__auto_why[512];
static void kern__say_cpu(void) {
  tsr_info("device auto: %s; using the CPU (OpenBLAS %s)", kern__auto_why,
           kern_cpu_corename());
}

/* Says once per process why AUTO runs on the CPU (the first reason). */
static void kern__auto_cpu(const char *why) {
  pthread_mutex_lock(&kern__mod_lock);
  if (!kern__auto_why[0])
    snprintf(kern__auto_why, sizeof kern__auto_why, "%s", why);
  pthread_mutex_unlock(&kern__mod_lock);
  pthread_once(&kern__auto_once, kern__say_cpu);
}

static int kern__open_on(const kern__ops *ops, int dev, const kern_opts *o,
                         kern_ctx **out, char *err, size_t errlen) {
  kern_ctx *c = calloc(1, sizeof *c);
  if (!c) return TSR_ENOMEM;
  c->ops = ops;
  c->device = dev;
  int rc = ops->open(&c->impl, dev, o->cpu_threads, err, errlen);
  if (rc) {
    free(c);
    return rc;
  }
  *out = c;
  return 0;
}

int kern_open(const kern_opts *opts, kern_ctx **out, char *err,
              size_t errlen) {
  kern_opts d = {0};
  const kern_opts *o = opts ? opts : &d;
  *out = NULL;
  if (o->device == KERN_DEVICE_CPU)
    return kern__open_on(&kern__cpu_ops, 0, o, out, err, errlen);
  int n = 0;
  char why[512];
  int rc = kern__load(o, &n, why, sizeof why);
  if (rc == 0 && o->gpu_index >= n) {
    snprintf(why, sizeof why, "GPU %d asked for, %d visible", o->gpu_index,
             n);
    rc = TSR_ENODEVICE;
  }
  if (rc == 0) {
    /* a device the module cannot use (too old, busy) is no usable GPU */
    why[0] = 0;
    rc = kern__open_on(kern__mod->ops, o->gpu_index, o, out, why,
                       sizeof why);
    if (rc == 0) return 0;
    if (!why[0]) snprintf(why, sizeof why, "%s", tsr_strerror(rc));
  }
  if (o->device == KERN_DEVICE_GPU) {
    return tsr_errf(err, errlen, TSR_ENODEVICE,
                    "--device gpu: no usable GPU: %s", why);
  }
  kern__auto_cpu(why);
  return kern__open_on(&kern__cpu_ops, 0, o, out, err, errlen);
}

void kern_close(kern_ctx *ctx) {
  if (!ctx) return;
  ctx->ops->close(ctx->impl);
  free(ctx);
}

const char *kern_backend_name(const kern_ctx *c) { return c->ops->name; }
const char *kern_last_error(const kern_ctx *c) { return c->msg; }
void *kern__module_sym(const char *name) {
  pthread_mutex_lock(&kern__mod_lock);
  void *p = kern__mod_handle ? dlsym(kern__mod_handle, name) : NULL;
  pthread_mutex_unlock(&kern__mod_lock);
  return p;
}

const kern__ops *kern__ctx_ops(const kern_ctx *c) { return c->ops; }
void *kern__ctx_impl(const kern_ctx *c) { return c->impl; }
bool kern_is_host(const kern_ctx *c) { return c->ops->host; }
int kern_threads(const kern_ctx *c) {
  return c->ops->threads ? c->ops->threads(c->impl) : 1;
}
int kern_device_index(const kern_ctx *c) { return c->device; }

const char *const kern_device_names[] = {
    [KERN_DEVICE_AUTO] = "auto", [KERN_DEVICE_CPU] = "cpu",
    [KERN_DEVICE_GPU] = "gpu", [KERN_DEVICE_GPU + 1] = NULL};

const char *kern_cpu_corename(void) {
  const char *s = openblas_get_corename();
  return s ? s : "unknown";
}

static const char *const kern__act_names[KERN_ACT__COUNT] = {
    "linear", "relu", "relu6", "leaky_relu", "sigmoid", "tanh", "softmax",
    "elu", "selu", "gelu", "swish", "softplus", "softsign", "exponential"};

const char *kern_act_name(kern_act a) {
  return (unsigned)a < KERN_ACT__COUNT ? kern__act_names[a] : "?";
}

int kern_act_parse(const char *name, kern_act *out) {
  if (!name || !strcmp(name, "None") || !*name) {
    *out = KERN_ACT_LINEAR;
    return 0;
  }
  if (!strcmp(name, "silu")) {
    *out = KERN_ACT_SWISH;
    return 0;
  }
  for (int i = 0; i < KERN_ACT__COUNT; i++)
    if (!strcmp(name, kern__act_names[i])) {
      *out = (kern_act)i;
      return 0;
    }
  return TSR_EUNSUPPORTED;
}

const char *kern_act_list(void) {
  return "linear, relu, relu6, leaky_relu, sigmoid, tanh, softmax, elu, "
         "selu, gelu, swish, silu, softplus, softsign, exponential";
}

const char *kern_prec_name(kern_prec p) {
  return p == KERN_BF16 ? "bf16" : p == KERN_F16 ? "fp16" : "fp32";
}

/* ---- forwarding --------------------------------------------------------
 * Every op that can fail goes through KERN__DO, which clears the context's
 * message and, on failure, writes the op's name and the backend's reason. */
static int kern__failed(kern_ctx *c, int rc, const char *op) {
  const char *why = c->ops->last_error ? c->ops->last_error(c->impl) : "";
  snprintf(c->msg, sizeof c->msg, "%s on %s: %s", op, c->ops->name,
           why && *why ? why : tsr_strerror(rc));
  return rc;
}
#define KERN__DO(c, op, call)                         \
  do {                                                \
    (c)->msg[0] = 0;                                  \
    int rc_ = (call);                                 \
    return rc_ ? kern__failed((c), rc_, (op)) : 0;    \
  } while (0)
/* A refusal of the front end itself. */
static int kern__refuse(kern_ctx *c, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int kern__refuse(kern_ctx *c, int rc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  tsr_verrf(c->msg, sizeof c->msg, rc, fmt, ap);
  va_end(ap);
  return rc;
}

void *kern_alloc(kern_ctx *c, size_t b) { return c->ops->alloc(c->impl, b); }
void kern_free(kern_ctx *c, void *p) {
  if (p) c->ops->free(c->impl, p);
}
void *kern_host_alloc(kern_ctx *c, size_t b) {
  return c->ops->host_alloc(c->impl, b);
}
void kern_host_free(kern_ctx *c, void *p) {
  if (p) c->ops->host_free(c->impl, p);
}
int kern_upload(kern_ctx *c, void *d, const void *s, size_t b) {
  if (!b) return 0;
  KERN__DO(c, "upload", c->ops->upload(c->impl, d, s, b));
}
int kern_download(kern_ctx *c, void *d, const void *s, size_t b) {
  if (!b) return 0;
  KERN__DO(c, "download", c->ops->download(c->impl, d, s, b));
}
int kern_copy(kern_ctx *c, void *d, const void *s, size_t b) {
  if (!b) return 0;
  KERN__DO(c, "copy", c->ops->copy(c->impl, d, s, b));
}
int kern_sync(kern_ctx *c) { KERN__DO(c, "sync", c->ops->sync(c->impl)); }

int kern_gemm(kern_ctx *c, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
              float alpha, const float *A, const float *B, float beta,
              float *C, kern_prec prec) {
  kern_gemm_args g;
  int rc = kern_plan_gemm(ta, tb, m, n, k, &g);
  if (rc)
    return kern__refuse(c, rc, "gemm %lld x %lld x %lld: %s", (long long)m,
                        (long long)n, (long long)k,
                        rc == TSR_ERANGE ? "a size over INT_MAX (BLAS "
                                           "libraries take int sizes)"
                                         : "a negative size");
  if (m == 0 || n == 0) return 0;
  KERN__DO(c, "gemm", c->ops->gemm(c->impl, ta, tb, m, n, k, alpha, A, B,
                                   beta, C, prec));
}
int kern_bias_act(kern_ctx *c, float *z, const float *bias, float *y,
                  int64_t n, int64_t d, kern_act act, float alpha) {
  if ((unsigned)act >= KERN_ACT__COUNT) return TSR_EINVAL;
  if (y == z && act != KERN_ACT_LINEAR && act != KERN_ACT_RELU)
    return TSR_EINVAL;
  if (n * d == 0) return 0;
  KERN__DO(c, "bias_act", c->ops->bias_act(c->impl, z, bias, y, n, d, act,
                                           alpha));
}
int kern_act_grad(kern_ctx *c, const float *dy, const float *z,
                  const float *y, float *dz, int64_t n, int64_t d,
                  kern_act act, float alpha) {
  if ((unsigned)act >= KERN_ACT__COUNT) return TSR_EINVAL;
  if (n * d == 0) return 0;
  KERN__DO(c, "act_grad", c->ops->act_grad(c->impl, dy, z, y, dz, n, d, act,
                                           alpha));
}
int kern_col_sum(kern_ctx *c, const float *dz, int64_t n, int64_t d,
                 float beta, float *db) {
  if (d == 0) return 0;
  KERN__DO(c, "col_sum", c->ops->col_sum(c->impl, dz, n, d, beta, db));
}
int kern_loss_eval_p(kern_ctx *c, kern_loss kind, float param,
                     const float *p, const float *y, int64_t n, int64_t d,
                     float grad_scale, float *ex_loss, float *grad) {
  if ((unsigned)kind >= KERN_LOSS__COUNT || d < 1) return TSR_EINVAL;
  if (n == 0) return 0;
  if (!(param > 0)) param = 1.0f;
  KERN__DO(c, "loss", c->ops->loss(c->impl, kind, param, p, y, n, d,
                                   grad_scale, ex_loss, grad));
}
int kern_loss_eval(kern_ctx *c, kern_loss kind, const float *p,
                   const float *y, int64_t n, int64_t d, float grad_scale,
                   float *ex_loss, float *grad) {
  return kern_loss_eval_p(c, kind, 1.0f, p, y, n, d, grad_scale, ex_loss,
                          grad);
}
int kern_embed_gather(kern_ctx *c, const float *rows, int64_t dim,
                      const int32_t *idx, const int32_t *bag_off, int64_t nb,
                      kern_pool pool, float *out, int64_t stride,
                      int64_t off) {
  if (nb == 0 || dim == 0) return 0;
  KERN__DO(c, "embed_gather", c->ops->gather(c->impl, rows, dim, idx, bag_off,
                                             nb, pool, out, stride, off));
}
int kern_embed_scatter(kern_ctx *c, const float *dout, int64_t stride,
                       int64_t off, int64_t dim, const int32_t *occ_off,
                       const int32_t *occ_bag, const float *occ_w,
                       int64_t n_uniq, float *grad) {
  if (n_uniq == 0 || dim == 0) return 0;
  KERN__DO(c, "embed_scatter",
           c->ops->scatter(c->impl, dout, stride, off, dim, occ_off, occ_bag,
                           occ_w, n_uniq, grad));
}
int kern_round(kern_ctx *c, float *x, size_t n, kern_prec prec) {
  if (prec == KERN_F32 || n == 0) return 0;
  KERN__DO(c, "round", c->ops->round(c->impl, x, n, prec));
}
int kern_all_finite(kern_ctx *c, const float *x, size_t n, bool *finite) {
  *finite = true;
  if (n == 0) return 0;
  KERN__DO(c, "all_finite", c->ops->all_finite(c->impl, x, n, finite));
}
int kern_scale(kern_ctx *c, float *x, size_t n, float a) {
  if (!n) return 0;
  KERN__DO(c, "scale", c->ops->scale(c->impl, x, n, a));
}
int kern_axpy(kern_ctx *c, float *y, const float *x, size_t n, float a) {
  if (!n) return 0;
  KERN__DO(c, "axpy", c->ops->axpy(c->impl, y, x, n, a));
}
int kern_dropout(kern_ctx *c, float *x, float *mask, size_t n, float rate,
                 uint64_t seed) {
  if (rate < 0 || rate >= 1) return TSR_EINVAL;
  if (!n) return 0;
  KERN__DO(c, "dropout", c->ops->dropout(c->impl, x, mask, n, rate, seed));
}
int kern_mul(kern_ctx *c, float *x, const float *mask, size_t n) {
  if (!n) return 0;
  KERN__DO(c, "mul", c->ops->mul(c->impl, x, mask, n));
}

int kern_allreduce_sum(kern_ctx *const *ctxs, float *const *bufs, int n_ctx,
                       size_t n) {
  if (n_ctx < 1) return TSR_EINVAL;
  if (n_ctx == 1 || n == 0) return 0;
  void *impls[64];
  if (n_ctx > 64)
    return kern__refuse(ctxs[0], TSR_ERANGE,
                        "all-reduce over %d replicas: at most 64", n_ctx);
  for (int i = 0; i < n_ctx; i++) {
    if (ctxs[i]->ops != ctxs[0]->ops) return TSR_EINVAL;
    impls[i] = ctxs[i]->impl;
  }
  KERN__DO(ctxs[0], "allreduce",
           ctxs[0]->ops->allreduce(impls, bufs, n_ctx, n));
}
