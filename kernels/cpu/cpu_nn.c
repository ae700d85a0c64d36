/* CPU backend of kern_nn.h's image ops: im2col/col2im with one memcpy per
 * run of valid window columns, pooling, global average pooling, strided
 * column copies and the l1/l2 gradient; the normalizations are in
 * cpu_norm.c, direct convolutions in cpu_dnnl.c. Plain loops over
 * contiguous channels that gcc vectorizes (-O3 -fno-math-errno; restrict
 * where an int32 and a float array are written together, since the build
 * has -fno-strict-aliasing). Every op over a batch runs over the context's
 * pool in ranges of whole examples, each of which touches only its own
 * examples. Nothing here fails.
 */
#include "kernels/cpu/cpu_int.h"
#include "kernels/kern_math.h"
#include "kernels/kern_nn_int.h"
#include "common/err.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#ifdef KERN_HAVE_DNNL
#include "kernels/cpu/cpu_dnnl.h"
#endif

#define NN_GRAIN (1 << 15) /* floats an example range should touch */

/* Examples per range for ops that touch `per` floats an example. */
static int64_t ex_grain(int64_t per) {
  return per >= NN_GRAIN ? 1 : NN_GRAIN / (per > 0 ? per : 1);
}

typedef struct {
  const kern_win *g;
  const float *x;       /* im2col: the images; col2im: the columns */
  float *y;             /* im2col: the columns; col2im: the images */
  const float *dy;
  float *dx;
  int32_t *arg;
  const int32_t *carg;
  kern_pool2d kind;
  float beta;
} win_job;

static void im2col_range(void *a, int64_t b0, int64_t b1, int tid) {
  const win_job *j = a;
  const kern_win *g = j->g;
  int64_t K = kern_win_patch(g), C = g->c;
  for (int64_t b = b0; b < b1; b++) {
    const float *xb = j->x + b * g->h * g->w * C;
    for (int64_t oy = 0; oy < g->oh; oy++)
      for (int64_t ox = 0; ox < g->ow; ox++) {
        float *row = j->y + ((b * g->oh + oy) * g->ow + ox) * K;
        int64_t x0 = ox * g->sw - g->pl;
        /* the window's columns that fall inside the image: [k0, k1) */
        int64_t k0 = x0 < 0 ? -x0 : 0;
        int64_t k1 = x0 + g->kw > g->w ? g->w - x0 : g->kw;
        if (k1 < k0) k1 = k0;
        for (int64_t ky = 0; ky < g->kh; ky++) {
          float *r = row + ky * g->kw * C;
          int64_t iy = oy * g->sh - g->pt + ky;
          if (iy < 0 || iy >= g->h) {
            memset(r, 0, (size_t)(g->kw * C) * sizeof *r);
            continue;
          }
          if (k0 > 0) memset(r, 0, (size_t)(k0 * C) * sizeof *r);
          if (k1 > k0)
            memcpy(r + k0 * C, xb + (iy * g->w + x0 + k0) * C,
                   (size_t)((k1 - k0) * C) * sizeof *r);
          if (k1 < g->kw)
            memset(r + k1 * C, 0, (size_t)((g->kw - k1) * C) * sizeof *r);
        }
      }
  }
}

static int cpu_im2col(void *impl, const kern_win *g, int64_t n,
                      const float *x, float *cols) {
  win_job j = {.g = g, .x = x, .y = cols};
  kern__cpu_par(impl, n, ex_grain(g->oh * g->ow * kern_win_patch(g)),
                im2col_range, &j);
  return 0;
}

KERN__HOT static void col2im_range(void *a, int64_t b0, int64_t b1, int tid) {
  const win_job *j = a;
  const kern_win *g = j->g;
  int64_t K = kern_win_patch(g), C = g->c, img = g->h * g->w * C;
  if (j->beta == 0.0f)
    memset(j->y + b0 * img, 0, (size_t)((b1 - b0) * img) * sizeof(float));
  for (int64_t b = b0; b < b1; b++) {
    float *db = j->y + b * img;
    for (int64_t oy = 0; oy < g->oh; oy++)
      for (int64_t ox = 0; ox < g->ow; ox++) {
        const float *row = j->x + ((b * g->oh + oy) * g->ow + ox) * K;
        int64_t x0 = ox * g->sw - g->pl;
        int64_t k0 = x0 < 0 ? -x0 : 0;
        int64_t k1 = x0 + g->kw > g->w ? g->w - x0 : g->kw;
        for (int64_t ky = 0; ky < g->kh; ky++) {
          int64_t iy = oy * g->sh - g->pt + ky;
          if (iy < 0 || iy >= g->h || k1 <= k0) continue;
          const float *r = row + (ky * g->kw + k0) * C;
          float *d = db + (iy * g->w + x0 + k0) * C;
          int64_t len = (k1 - k0) * C;
          for (int64_t i = 0; i < len; i++) d[i] += r[i];
        }
      }
  }
}

static int cpu_col2im(void *impl, const kern_win *g, int64_t n,
                      const float *cols, float beta, float *dx) {
  win_job j = {.g = g, .x = cols, .y = dx, .beta = beta};
  kern__cpu_par(impl, n, ex_grain(g->oh * g->ow * kern_win_patch(g)),
                col2im_range, &j);
  return 0;
}

/* One output position of a max pool over C channels: the first maximum in
 * row-major window order wins, as in TF. */
static inline void max_at(const float *restrict xb, int64_t C, int64_t w,
                   int64_t ya, int64_t yb, int64_t xa, int64_t xe,
                   float *restrict yo, int32_t *restrict ao) {
  int64_t first = (ya * w + xa) * C;
  memcpy(yo, xb + first, (size_t)C * sizeof *yo);
  if (ao)
    for (int64_t ch = 0; ch < C; ch++) ao[ch] = (int32_t)(first + ch);
  for (int64_t iy = ya; iy < yb; iy++)
    for (int64_t ix = iy == ya ? xa + 1 : xa; ix < xe; ix++) {
      int64_t base = (iy * w + ix) * C;
      const float *restrict xr = xb + base;
      if (ao) {
        for (int64_t ch = 0; ch < C; ch++) {
          bool gt = xr[ch] > yo[ch];
          yo[ch] = gt ? xr[ch] : yo[ch];
          ao[ch] = gt ? (int32_t)(base + ch) : ao[ch];
        }
      } else {
        for (int64_t ch = 0; ch < C; ch++)
          yo[ch] = xr[ch] > yo[ch] ? xr[ch] : yo[ch];
      }
    }
}

static inline void avg_at(const float *restrict xb, int64_t C, int64_t w,
                   int64_t ya, int64_t yb, int64_t xa, int64_t xe,
                   float *restrict yo) {
  memset(yo, 0, (size_t)C * sizeof *yo);
  for (int64_t iy = ya; iy < yb; iy++)
    for (int64_t ix = xa; ix < xe; ix++) {
      const float *restrict xr = xb + (iy * w + ix) * C;
      for (int64_t ch = 0; ch < C; ch++) yo[ch] += xr[ch];
    }
  float inv = 1.0f / (float)((yb - ya) * (xe - xa));
  for (int64_t ch = 0; ch < C; ch++) yo[ch] *= inv;
}

KERN__HOT static void pool_fwd_range(void *a, int64_t b0, int64_t b1, int tid) {
  const win_job *j = a;
  const kern_win *g = j->g;
  int64_t C = g->c, img = g->h * g->w * C;
  for (int64_t b = b0; b < b1; b++) {
    const float *xb = j->x + b * img;
    for (int64_t oy = 0; oy < g->oh; oy++) {
      int64_t ya, yb;
      kern_math_window(oy, g->sh, g->pt, g->kh, g->h, &ya, &yb);
      for (int64_t ox = 0; ox < g->ow; ox++) {
        int64_t o = ((b * g->oh + oy) * g->ow + ox) * C;
        int64_t xa, xe;
        kern_math_window(ox, g->sw, g->pl, g->kw, g->w, &xa, &xe);
        if (j->kind == KERN_POOL2D_AVG)
          avg_at(xb, C, g->w, ya, yb, xa, xe, j->y + o);
        else
          max_at(xb, C, g->w, ya, yb, xa, xe, j->y + o,
                 j->arg ? j->arg + o : NULL);
      }
    }
  }
}

static int cpu_pool_fwd(void *impl, const kern_win *g, int64_t n,
                        kern_pool2d kind, const float *x, float *y,
                        int32_t *arg) {
  win_job j = {.g = g, .x = x, .y = y, .arg = arg, .kind = kind};
  kern__cpu_par(impl, n, ex_grain(g->h * g->w * g->c), pool_fwd_range, &j);
  return 0;
}

KERN__HOT static void pool_grad_range(void *a, int64_t b0, int64_t b1, int tid) {
  const win_job *j = a;
  const kern_win *g = j->g;
  int64_t C = g->c, img = g->h * g->w * C;
  if (j->beta == 0.0f)
    memset(j->dx + b0 * img, 0, (size_t)((b1 - b0) * img) * sizeof(float));
  for (int64_t b = b0; b < b1; b++) {
    float *db = j->dx + b * img;
    for (int64_t oy = 0; oy < g->oh; oy++)
      for (int64_t ox = 0; ox < g->ow; ox++) {
        int64_t o = ((b * g->oh + oy) * g->ow + ox) * C;
        const float *dyo = j->dy + o;
        if (j->kind == KERN_POOL2D_MAX) {
          const int32_t *ao = j->carg + o;
          for (int64_t ch = 0; ch < C; ch++) db[ao[ch]] += dyo[ch];
          continue;
        }
        int64_t ya, yb, xa, xe;
        kern_math_window(oy, g->sh, g->pt, g->kh, g->h, &ya, &yb);
        kern_math_window(ox, g->sw, g->pl, g->kw, g->w, &xa, &xe);
        float inv = 1.0f / (float)((yb - ya) * (xe - xa));
        for (int64_t iy = ya; iy < yb; iy++)
          for (int64_t ix = xa; ix < xe; ix++) {
            float *d = db + (iy * g->w + ix) * C;
            for (int64_t ch = 0; ch < C; ch++) d[ch] += dyo[ch] * inv;
          }
      }
  }
}

/* Windows that tile the image from its corner (stride = window, no
 * padding, none past the edge), as Keras's default pools: each element is
 * in one window at most, so the max pool's gradient is written once per
 * element (the winner gets dy, the others 0) instead of zeroed and
 * scattered into. */
static bool tiles(const kern_win *g) {
  return g->sh == g->kh && g->sw == g->kw && g->pt == 0 && g->pl == 0 &&
         g->oh * g->kh <= g->h && g->ow * g->kw <= g->w;
}

KERN__HOT static void max_grad_tiled_range(void *a, int64_t b0, int64_t b1,
                                           int tid) {
  const win_job *j = a;
  const kern_win *g = j->g;
  int64_t C = g->c, img = g->h * g->w * C;
  int64_t ch_rows = g->oh * g->kh, ch_cols = g->ow * g->kw;
  bool add = j->beta != 0.0f;
  for (int64_t b = b0; b < b1; b++) {
    float *db = j->dx + b * img;
    for (int64_t oy = 0; oy < g->oh; oy++)
      for (int64_t ky = 0; ky < g->kh; ky++) {
        int64_t iy = oy * g->kh + ky;
        for (int64_t ox = 0; ox < g->ow; ox++) {
          int64_t o = ((b * g->oh + oy) * g->ow + ox) * C;
          const float *restrict dyo = j->dy + o;
          const int32_t *restrict ao = j->carg + o;
          for (int64_t kx = 0; kx < g->kw; kx++) {
            int64_t base = (iy * g->w + ox * g->kw + kx) * C;
            float *restrict d = db + base;
            int32_t at = (int32_t)base;
            if (add)
              for (int64_t ch = 0; ch < C; ch++)
                d[ch] += ao[ch] == at + (int32_t)ch ? dyo[ch] : 0.0f;
            else
              for (int64_t ch = 0; ch < C; ch++)
                d[ch] = ao[ch] == at + (int32_t)ch ? dyo[ch] : 0.0f;
          }
        }
        /* columns no window covers (valid padding's leftover) */
        if (!add && ch_cols < g->w)
          memset(db + (iy * g->w + ch_cols) * C, 0,
                 (size_t)((g->w - ch_cols) * C) * sizeof *db);
      }
    if (!add && ch_rows < g->h)
      memset(db + ch_rows * g->w * C, 0,
             (size_t)((g->h - ch_rows) * g->w * C) * sizeof *db);
  }
}

static int cpu_pool_grad(void *impl, const kern_win *g, int64_t n,
                         kern_pool2d kind, const float *dy,
                         const int32_t *arg, float beta, float *dx) {
  win_job j = {.g = g, .dy = dy, .dx = dx, .carg = arg, .kind = kind,
               .beta = beta};
  kern__cpu_par(impl, n, ex_grain(g->h * g->w * g->c),
                kind == KERN_POOL2D_MAX && tiles(g) ? max_grad_tiled_range
                                                    : pool_grad_range,
                &j);
  return 0;
}

typedef struct {
  const float *x;
  float *y;
  int64_t p, c;
  float beta;
} mid_job;

KERN__HOT static void mean_mid_range(void *a, int64_t b0, int64_t b1, int tid) {
  const mid_job *j = a;
  int64_t p = j->p, c = j->c;
  float inv = 1.0f / (float)p;
  for (int64_t b = b0; b < b1; b++) {
    float *yb = j->y + b * c;
    memset(yb, 0, (size_t)c * sizeof *yb);
    for (int64_t i = 0; i < p; i++) {
      const float *r = j->x + (b * p + i) * c;
      for (int64_t ch = 0; ch < c; ch++) yb[ch] += r[ch];
    }
    for (int64_t ch = 0; ch < c; ch++) yb[ch] *= inv;
  }
}

static int cpu_mean_mid(void *impl, const float *x, int64_t n, int64_t p,
                        int64_t c, float *y) {
  mid_job j = {.x = x, .y = y, .p = p, .c = c};
  kern__cpu_par(impl, n, ex_grain(p * c), mean_mid_range, &j);
  return 0;
}

KERN__HOT static void mean_mid_grad_range(void *a, int64_t b0, int64_t b1, int tid) {
  const mid_job *j = a;
  int64_t p = j->p, c = j->c;
  float inv = 1.0f / (float)p;
  for (int64_t b = b0; b < b1; b++)
    for (int64_t i = 0; i < p; i++) {
      float *r = j->y + (b * p + i) * c;
      const float *d = j->x + b * c;
      if (j->beta == 0.0f)
        for (int64_t ch = 0; ch < c; ch++) r[ch] = d[ch] * inv;
      else
        for (int64_t ch = 0; ch < c; ch++) r[ch] += d[ch] * inv;
    }
}

static int cpu_mean_mid_grad(void *impl, const float *dy, int64_t n,
                             int64_t p, int64_t c, float beta, float *dx) {
  mid_job j = {.x = dy, .y = dx, .p = p, .c = c, .beta = beta};
  kern__cpu_par(impl, n, ex_grain(p * c), mean_mid_grad_range, &j);
  return 0;
}

static int cpu_copy_cols(void *impl, int64_t rows, int64_t w,
                         const float *src, int64_t ss, int64_t so, float beta,
                         float *dst, int64_t ds, int64_t doff) {
  (void)impl;
  for (int64_t r = 0; r < rows; r++) {
    const float *s = src + r * ss + so;
    float *d = dst + r * ds + doff;
    if (beta == 0.0f)
      memcpy(d, s, (size_t)w * sizeof *d);
    else
      for (int64_t j = 0; j < w; j++) d[j] += s[j];
  }
  return 0;
}

static int cpu_l1l2_grad(void *impl, const float *w, size_t n, float a1,
                         float a2, float *g) {
  (void)impl;
  for (size_t i = 0; i < n; i++) g[i] += kern_math_l1l2_grad(w[i], a1, a2);
  return 0;
}

const kern__nn_ops kern__cpu_nn_ops = {
    .im2col = cpu_im2col,
    .col2im = cpu_col2im,
    .pool_fwd = cpu_pool_fwd,
    .pool_grad = cpu_pool_grad,
    .mean_mid = cpu_mean_mid,
    .mean_mid_grad = cpu_mean_mid_grad,
    .moments = kern__cpu_moments,
    .bn_apply = kern__cpu_bn_apply,
    .bn_grad = kern__cpu_bn_grad,
    .ln_fwd = kern__cpu_ln_fwd,
    .ln_grad = kern__cpu_ln_grad,
    .copy_cols = cpu_copy_cols,
    .l1l2_grad = cpu_l1l2_grad,
#ifdef KERN_HAVE_DNNL
    .conv_fwd = kern__dnnl_conv_fwd,
    .conv_bwd_data = kern__dnnl_conv_bwd_data,
    .conv_bwd_filter = kern__dnnl_conv_bwd_filter,
    .conv_name = kern__dnnl_name,
#endif
};
