/* Keras optimizers over float32 arrays (see optim.h for the rules).
 *
 * Happy path: kern_optim_apply() picks the loop for the optimizer kind and
 * runs it once over n elements; every loop is a single pass with restrict
 * pointers and no calls except sqrtf, so gcc vectorizes it (the file is
 * built with -fno-math-errno so sqrtf becomes the vector instruction; the
 * optimize attribute asks for the dynamic cost model that -O2 lacks).
 * Per-apply scalars (Adam's alpha, FTRL's adjusted l2) are computed once in
 * double and rounded to float. Failure modes: step < 1 (TSR_EINVAL).
 * Slots are only ever touched by the loop of their optimizer.
 */
#include "kernels/optim.h"
#include "common/err.h"

#include <math.h>

#define KERN__VEC __attribute__((optimize("tree-vectorize", \
                                          "vect-cost-model=dynamic")))

int kern_optim_num_slots(const tsr_optim_spec *spec) {
  switch (spec->kind) {
    case TSR_OPT_SGD: return spec->momentum > 0 ? 1 : 0;
    case TSR_OPT_ADAGRAD: return 1;
    case TSR_OPT_RMSPROP:
      return 1 + (spec->centered ? 1 : 0) + (spec->momentum > 0 ? 1 : 0);
    case TSR_OPT_ADAM: return 2;
    case TSR_OPT_FTRL: return 2;
    case TSR_OPT_MOVING_AVERAGE: return 0;
    case TSR_OPT_ADAMW: return 2;
    case TSR_OPT_NADAM: return 2;
    case TSR_OPT_ADAMAX: return 2;
    case TSR_OPT__COUNT: break;
  }
  return 0;
}

const char *kern_optim_slot_name(const tsr_optim_spec *spec, int slot) {
  if (slot < 0 || slot >= kern_optim_num_slots(spec)) return NULL;
  switch (spec->kind) {
    case TSR_OPT_SGD: return "momentum";
    case TSR_OPT_ADAGRAD: return "accumulator";
    case TSR_OPT_RMSPROP:
      if (slot == 0) return "velocity";
      if (slot == 1 && spec->centered) return "average_gradient";
      return "momentum";
    case TSR_OPT_ADAM: return slot == 0 ? "m" : "v";
    case TSR_OPT_FTRL: return slot == 0 ? "accumulator" : "linear";
    case TSR_OPT_MOVING_AVERAGE: return NULL;
    case TSR_OPT_ADAMW: return slot == 0 ? "m" : "v";
    case TSR_OPT_NADAM: return slot == 0 ? "m" : "v";
    case TSR_OPT_ADAMAX: return slot == 0 ? "m" : "u";
    case TSR_OPT__COUNT: break;
  }
  return NULL;
}

void kern_optim_init_slots(const tsr_optim_spec *spec, float *const *slots,
                           size_t n) {
  int ns = kern_optim_num_slots(spec);
  for (int s = 0; s < ns; s++) {
    float v = 0.0f;
    if ((spec->kind == TSR_OPT_ADAGRAD || spec->kind == TSR_OPT_FTRL) &&
        s == 0)
      v = (float)spec->initial_accumulator_value;
    float *p = slots[s];
    for (size_t i = 0; i < n; i++) p[i] = v;
  }
}

/* ---- SGD -----------------------------------------------------------------*/

KERN__VEC static void sgd_plain(float *restrict w, const float *restrict g,
                                float lr_s, size_t n) {
  for (size_t i = 0; i < n; i++) w[i] -= lr_s * g[i];
}

KERN__VEC static void sgd_momentum(float *restrict w, const float *restrict g,
                                   float *restrict v, float lr, float s,
                                   float m, int nesterov, size_t n) {
  if (nesterov) {
    for (size_t i = 0; i < n; i++) {
      float gi = g[i] * s;
      float vi = m * v[i] - lr * gi;
      v[i] = vi;
      w[i] += m * vi - lr * gi;
    }
  } else {
    for (size_t i = 0; i < n; i++) {
      float vi = m * v[i] - lr * (g[i] * s);
      v[i] = vi;
      w[i] += vi;
    }
  }
}

/* ---- Adagrad -------------------------------------------------------------*/

KERN__VEC static void adagrad(float *restrict w, const float *restrict g,
                              float *restrict a, float lr, float s, float eps,
                              size_t n) {
  for (size_t i = 0; i < n; i++) {
    float gi = g[i] * s;
    float ai = a[i] + gi * gi;
    a[i] = ai;
    w[i] -= lr * gi / (sqrtf(ai) + eps);
  }
}

/* ---- RMSprop -------------------------------------------------------------*/

KERN__VEC static void rmsprop(float *restrict w, const float *restrict g,
                              float *restrict ms, float *restrict mg,
                              float *restrict mom, float lr, float s,
                              float rho, float eps, float m, size_t n) {
  float r1 = 1.0f - rho;
  if (!mg && !mom) {
    for (size_t i = 0; i < n; i++) {
      float gi = g[i] * s;
      float msi = rho * ms[i] + r1 * gi * gi;
      ms[i] = msi;
      w[i] -= lr * gi / (sqrtf(msi) + eps);
    }
  } else if (mg && !mom) {
    for (size_t i = 0; i < n; i++) {
      float gi = g[i] * s;
      float msi = rho * ms[i] + r1 * gi * gi;
      float mgi = rho * mg[i] + r1 * gi;
      ms[i] = msi;
      mg[i] = mgi;
      w[i] -= lr * gi / (sqrtf(msi - mgi * mgi) + eps);
    }
  } else if (!mg) {
    for (size_t i = 0; i < n; i++) {
      float gi = g[i] * s;
      float msi = rho * ms[i] + r1 * gi * gi;
      ms[i] = msi;
      float mo = m * mom[i] + lr * gi / sqrtf(msi + eps);
      mom[i] = mo;
      w[i] -= mo;
    }
  } else {
    for (size_t i = 0; i < n; i++) {
      float gi = g[i] * s;
      float msi = rho * ms[i] + r1 * gi * gi;
      float mgi = rho * mg[i] + r1 * gi;
      ms[i] = msi;
      mg[i] = mgi;
      float mo = m * mom[i] + lr * gi / sqrtf(msi - mgi * mgi + eps);
      mom[i] = mo;
      w[i] -= mo;
    }
  }
}

/* ---- Adam ----------------------------------------------------------------*/

KERN__VEC static void adam(float *restrict w, const float *restrict g,
                           float *restrict m, float *restrict v, float s,
                           float b1, float b2, float alpha, float eps,
                           size_t n) {
  float c1 = 1.0f - b1, c2 = 1.0f - b2;
  for (size_t i = 0; i < n; i++) {
    float gi = g[i] * s;
    float mi = b1 * m[i] + c1 * gi;
    float vi = b2 * v[i] + c2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    w[i] -= alpha * mi / (sqrtf(vi) + eps);
  }
}

/* ---- Nadam (Keras 3 / tf_keras 2.11+) ----------------------------------*/

KERN__VEC static void nadam(float *restrict w, const float *restrict g,
                            float *restrict m, float *restrict v, float s,
                            float b1, float b2, float cm, float cg,
                            float inv_b2, float lr, float eps, size_t n) {
  float c1 = 1.0f - b1, c2 = 1.0f - b2;
  for (size_t i = 0; i < n; i++) {
    float gi = g[i] * s;
    float mi = b1 * m[i] + c1 * gi;
    float vi = b2 * v[i] + c2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    float mh = cm * mi + cg * gi;
    w[i] -= lr * mh / (sqrtf(vi * inv_b2) + eps);
  }
}

/* ---- Adamax --------------------------------------------------------------*/

KERN__VEC static void adamax(float *restrict w, const float *restrict g,
                             float *restrict m, float *restrict u, float s,
                             float b1, float b2, float lr_c, float eps,
                             size_t n) {
  float c1 = 1.0f - b1;
  for (size_t i = 0; i < n; i++) {
    float gi = g[i] * s;
    float mi = b1 * m[i] + c1 * gi;
    float ag = fabsf(gi), bu = b2 * u[i];
    float ui = bu > ag ? bu : ag;
    m[i] = mi;
    u[i] = ui;
    w[i] -= lr_c * mi / (ui + eps);
  }
}

/* Decoupled weight decay (Keras's _apply_weight_decay): w -= w * wd * lr. */
KERN__VEC static void decay(float *restrict w, float f, size_t n) {
  for (size_t i = 0; i < n; i++) w[i] -= w[i] * f;
}

/* ---- FTRL (ApplyFtrlV2) --------------------------------------------------*/

/* lr_power -0.5 (the default) turns every pow into a sqrt, which
 * vectorizes; other powers take the general loop. */
KERN__VEC static void ftrl_sqrt(float *restrict w, const float *restrict g,
                                float *restrict acc, float *restrict lin,
                                float lr, float s, float l1, float l2x2,
                                float shrink2, size_t n) {
  float inv_lr = 1.0f / lr;
  for (size_t i = 0; i < n; i++) {
    float gi = g[i] * s;
    float wi = w[i];
    float gs = gi + shrink2 * wi;
    float a0 = acc[i];
    float a1 = a0 + gi * gi;
    float sa1 = sqrtf(a1);
    float li = lin[i] + gs - (sa1 - sqrtf(a0)) * inv_lr * wi;
    lin[i] = li;
    acc[i] = a1;
    float quad = sa1 * inv_lr + l2x2;
    float clip = li > l1 ? l1 : (li < -l1 ? -l1 : li);
    w[i] = (clip - li) / quad;
  }
}

static void ftrl_pow(float *restrict w, const float *restrict g,
                     float *restrict acc, float *restrict lin, float lr,
                     float s, float l1, float l2x2, float shrink2, float p,
                     size_t n) {
  float inv_lr = 1.0f / lr;
  for (size_t i = 0; i < n; i++) {
    float gi = g[i] * s;
    float wi = w[i];
    float gs = gi + shrink2 * wi;
    float a0 = acc[i];
    float a1 = a0 + gi * gi;
    float pa1 = powf(a1, -p);
    float li = lin[i] + gs - (pa1 - powf(a0, -p)) * inv_lr * wi;
    lin[i] = li;
    acc[i] = a1;
    float quad = pa1 * inv_lr + l2x2;
    float clip = li > l1 ? l1 : (li < -l1 ? -l1 : li);
    w[i] = (clip - li) / quad;
  }
}

/* ---- moving average (non-trainable statistics) ---------------------------*/

KERN__VEC static void moving_average(float *restrict w,
                                     const float *restrict g, float a,
                                     float s, size_t n) {
  for (size_t i = 0; i < n; i++) w[i] += a * (g[i] * s - w[i]);
}

/* Nadam's product of momentum factors u_1 .. u_t, u_i = b1 (1 - 0.5 *
 * 0.96^i): b1^t times the factors in brackets, which are 1 in double past
 * i = 1100 (0.96^1100 < 1e-19). */
static double nadam_u_product(double b1, int64_t t) {
  double p = 1.0, d = 1.0;
  int64_t k = t < 1100 ? t : 1100;
  for (int64_t i = 1; i <= k; i++) {
    d *= 0.96;
    p *= 1.0 - 0.5 * d;
  }
  return p * pow(b1, (double)t);
}

/* One update of n elements with the gradient as given (scale applied). */
static int apply_chunk(const tsr_optim_spec *sp, int64_t step, double lr_d,
                       float *w, const float *g, float scale,
                       float *const *slots, size_t n) {
  float lr = (float)lr_d;
  if (sp->weight_decay > 0) decay(w, (float)(sp->weight_decay * lr_d), n);
  switch (sp->kind) {
    case TSR_OPT_SGD:
      if (sp->momentum > 0)
        sgd_momentum(w, g, slots[0], lr, scale, (float)sp->momentum,
                     sp->nesterov, n);
      else
        sgd_plain(w, g, lr * scale, n);
      return 0;
    case TSR_OPT_ADAGRAD:
      adagrad(w, g, slots[0], lr, scale, (float)sp->epsilon, n);
      return 0;
    case TSR_OPT_RMSPROP: {
      float *mg = sp->centered ? slots[1] : NULL;
      float *mom = sp->momentum > 0 ? slots[sp->centered ? 2 : 1] : NULL;
      rmsprop(w, g, slots[0], mg, mom, lr, scale, (float)sp->rho,
              (float)sp->epsilon, (float)sp->momentum, n);
      return 0;
    }
    case TSR_OPT_ADAM:
    case TSR_OPT_ADAMW: {
      double t = (double)step;
      double b1t = pow(sp->beta_1, t), b2t = pow(sp->beta_2, t);
      double alpha = lr_d * sqrt(1.0 - b2t) / (1.0 - b1t);
      adam(w, g, slots[0], slots[1], scale, (float)sp->beta_1,
           (float)sp->beta_2, (float)alpha, (float)sp->epsilon, n);
      return 0;
    }
    case TSR_OPT_NADAM: {
      double b1 = sp->beta_1, t = (double)step;
      double u_t = b1 * (1.0 - 0.5 * pow(0.96, t));
      double u_t1 = b1 * (1.0 - 0.5 * pow(0.96, t + 1.0));
      double up_t = nadam_u_product(b1, step);
      double up_t1 = up_t * u_t1;
      double cm = u_t1 / (1.0 - up_t1), cg = (1.0 - u_t) / (1.0 - up_t);
      double inv_b2 = 1.0 / (1.0 - pow(sp->beta_2, t));
      nadam(w, g, slots[0], slots[1], scale, (float)b1, (float)sp->beta_2,
            (float)cm, (float)cg, (float)inv_b2, lr, (float)sp->epsilon, n);
      return 0;
    }
    case TSR_OPT_ADAMAX: {
      double lr_c = lr_d / (1.0 - pow(sp->beta_1, (double)step));
      adamax(w, g, slots[0], slots[1], scale, (float)sp->beta_1,
             (float)sp->beta_2, (float)lr_c, (float)sp->epsilon, n);
      return 0;
    }
    case TSR_OPT_FTRL: {
      /* FTRL divides by the rate: a step where a schedule passes through
       * 0 (a warmup's start) leaves the shard and its slots as they were,
       * the limit every other rule reaches at rate 0, instead of NaN */
      if (!(lr_d > 0)) return 0;
      double l2 = sp->l2 + sp->beta / (2.0 * lr_d);
      float l2x2 = (float)(2.0 * l2), shrink2 = (float)(2.0 * sp->l2_shrinkage);
      if (sp->learning_rate_power == -0.5)
        ftrl_sqrt(w, g, slots[0], slots[1], lr, scale, (float)sp->l1, l2x2,
                  shrink2, n);
      else
        ftrl_pow(w, g, slots[0], slots[1], lr, scale, (float)sp->l1, l2x2,
                 shrink2, (float)sp->learning_rate_power, n);
      return 0;
    }
    case TSR_OPT_MOVING_AVERAGE:
      moving_average(w, g, lr, scale, n);
      return 0;
    case TSR_OPT__COUNT: break;
  }
  return TSR_EINVAL;
}

#define KERN__CLIP_CHUNK 1024

int kern_optim_apply(const tsr_optim_spec *sp, int64_t step, float *w,
                     const float *g, float scale, float *const *slots,
                     size_t n) {
  if (step < 1 || (unsigned)sp->kind >= TSR_OPT__COUNT) return TSR_EINVAL;
  double lr = tsr_optim_lr(sp, step - 1);
  if (!(sp->clipvalue > 0))
    return apply_chunk(sp, step, lr, w, g, scale, slots, n);
  /* clipvalue: the scaled gradient clipped elementwise, chunk by chunk on
   * the stack (no allocation) */
  float cv = (float)sp->clipvalue;
  float tmp[KERN__CLIP_CHUNK];
  int ns = kern_optim_num_slots(sp);
  for (size_t off = 0; off < n; off += KERN__CLIP_CHUNK) {
    size_t k = n - off < KERN__CLIP_CHUNK ? n - off : KERN__CLIP_CHUNK;
    for (size_t i = 0; i < k; i++) {
      float x = g[off + i] * scale;
      tmp[i] = x > cv ? cv : x < -cv ? -cv : x;
    }
    float *sl[KERN_OPTIM_MAX_SLOTS];
    for (int s = 0; s < ns; s++) sl[s] = slots[s] + off;
    int rc = apply_chunk(sp, step, lr, w + off, tmp, 1.0f, sl, k);
    if (rc) return rc;
  }
  return 0;
}

double kern_optim_clip_norm(const tsr_optim_spec *sp, float *const *g,
                            const size_t *n, int count, float scale) {
  double clip = sp->clipnorm > 0 ? sp->clipnorm : sp->global_clipnorm;
  if (!(clip > 0) || count < 1) return 1.0;
  double s2 = (double)scale * (double)scale, total = 0, worst = 1.0;
  for (int a = 0; a < count; a++) {
    double ss = 0;
    for (size_t i = 0; i < n[a]; i++) ss += (double)g[a][i] * g[a][i];
    ss *= s2;
    if (sp->clipnorm > 0) {
      /* Keras's clip_by_norm: g * clipnorm / max(norm, clipnorm) */
      double norm = sqrt(ss);
      if (norm > clip) {
        float f = (float)(clip / norm);
        for (size_t i = 0; i < n[a]; i++) g[a][i] *= f;
        if (clip / norm < worst) worst = clip / norm;
      }
    }
    total += ss;
  }
  if (sp->clipnorm > 0) return worst;
  double norm = sqrt(total);
  if (!(norm > clip)) return 1.0; /* also a NaN norm: left as it is */
  float f = (float)(clip / norm);
  for (int a = 0; a < count; a++)
    for (size_t i = 0; i < n[a]; i++) g[a][i] *= f;
  return clip / norm;
}
