/* Optimizers: every kind and variant runs several steps over an array with
 * varied gradients (including a gradient scale, as sync mode uses) and is
 * compared with a float64 reference written here from the published
 * Keras/TF update rules (keras/src/optimizers/ and
 * keras/src/optimizers/schedules/learning_rate_schedule.py), with weight
 * decay, clipvalue and every learning-rate schedule. Also the slot counts,
 * names and initial values, and the worker-side norm clipping. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "kernels/optim.h"

enum { N = 1031, STEPS = 7 };

/* The learning rate of update t (1-based) from Keras's formulas, written
 * apart from common/optim_spec.c: the schedule sees t - 1 iterations. */
static double ref_lr(const tsr_optim_spec *o, int t) {
  const tsr_lr_schedule *s = &o->schedule;
  double step = t - 1, lr0 = s->initial, ds = s->decay_steps;
  switch (s->kind) {
    case TSR_LR_CONSTANT: return o->learning_rate;
    case TSR_LR_EXPONENTIAL:
      return lr0 * pow(s->decay_rate,
                       s->staircase ? floor(step / ds) : step / ds);
    case TSR_LR_INVERSE_TIME:
      return lr0 / (1 + s->decay_rate *
                            (s->staircase ? floor(step / ds) : step / ds));
    case TSR_LR_PIECEWISE: {
      int i = 0;
      while (i < s->n_boundaries && step > s->boundaries[i]) i++;
      return s->values[i];
    }
    case TSR_LR_COSINE: {
      double target = s->warmup ? s->warmup_target : lr0;
      double ws = s->warmup ? s->warmup_steps : 0;
      if (step > ds + ws) step = ds + ws;
      if (step < ws) return lr0 + (target - lr0) * step / ws;
      double c = 0.5 * (1 + cos(M_PI * (step - ws) / ds));
      return target * ((1 - s->alpha) * c + s->alpha);
    }
    case TSR_LR_COSINE_RESTARTS: {
      /* walk the periods: ds, ds*t_mul, ... */
      double start = 0, len = ds, mfac = 1;
      while (step >= start + len) {
        start += len;
        len *= s->t_mul;
        mfac *= s->m_mul;
      }
      double c = 0.5 * mfac * (1 + cos(M_PI * (step - start) / len));
      return lr0 * ((1 - s->alpha) * c + s->alpha);
    }
    case TSR_LR_POLYNOMIAL: {
      double d = ds;
      if (s->cycle) d = ds * (step == 0 ? 1 : ceil(step / ds));
      else if (step > ds) step = ds;
      return (lr0 - s->end_lr) * pow(1 - step / d, s->power) + s->end_lr;
    }
  }
  return NAN;
}

/* Reference state in double. */
typedef struct {
  double w[N], s[3][N];
} ref_state;

static double grad_at(int step, int i) {
  /* mixed signs and magnitudes, some exact zeros */
  if ((i * 7 + step) % 23 == 0) return 0.0;
  return sin(0.37 * i + 1.3 * step) * (0.1 + (i % 5));
}

static void ref_step(const tsr_optim_spec *o, int t, ref_state *r,
                     const float *g32, double scale) {
  double lr = ref_lr(o, t);
  for (int i = 0; i < N; i++) {
    double g = (double)g32[i] * scale;
    if (o->clipvalue > 0) g = fmax(-o->clipvalue, fmin(o->clipvalue, g));
    double *w = &r->w[i];
    *w -= *w * o->weight_decay * lr;
    switch (o->kind) {
      case TSR_OPT_SGD:
        if (o->momentum > 0) {
          double *v = &r->s[0][i];
          *v = o->momentum * *v - lr * g;
          if (o->nesterov)
            *w += o->momentum * *v - lr * g;
          else
            *w += *v;
        } else {
          *w -= lr * g;
        }
        break;
      case TSR_OPT_ADAGRAD: {
        double *a = &r->s[0][i];
        *a += g * g;
        *w -= lr * g / (sqrt(*a) + o->epsilon);
        break;
      }
      case TSR_OPT_RMSPROP: {
        double *ms = &r->s[0][i];
        *ms = o->rho * *ms + (1 - o->rho) * g * g;
        double denom = *ms;
        if (o->centered) {
          double *mg = &r->s[1][i];
          *mg = o->rho * *mg + (1 - o->rho) * g;
          denom -= *mg * *mg;
        }
        if (o->momentum > 0) {
          double *mom = &r->s[o->centered ? 2 : 1][i];
          *mom = o->momentum * *mom + lr * g / sqrt(denom + o->epsilon);
          *w -= *mom;
        } else {
          *w -= lr * g / (sqrt(denom) + o->epsilon);
        }
        break;
      }
      case TSR_OPT_ADAM:
      case TSR_OPT_ADAMW: {
        double *m = &r->s[0][i], *v = &r->s[1][i];
        *m = o->beta_1 * *m + (1 - o->beta_1) * g;
        *v = o->beta_2 * *v + (1 - o->beta_2) * g * g;
        double b2t = pow(o->beta_2, t), b1t = pow(o->beta_1, t);
        double alpha = lr * sqrt(1 - b2t) / (1 - b1t);
        *w -= alpha * *m / (sqrt(*v) + o->epsilon);
        break;
      }
      case TSR_OPT_NADAM: {
        double *m = &r->s[0][i], *v = &r->s[1][i], b1 = o->beta_1;
        double u_prod = 1; /* u_1 * ... * u_t */
        for (int k = 1; k <= t; k++) u_prod *= b1 * (1 - 0.5 * pow(0.96, k));
        double u_t = b1 * (1 - 0.5 * pow(0.96, t));
        double u_t1 = b1 * (1 - 0.5 * pow(0.96, t + 1));
        *m = b1 * *m + (1 - b1) * g;
        *v = o->beta_2 * *v + (1 - o->beta_2) * g * g;
        double m_hat = u_t1 * *m / (1 - u_prod * u_t1) +
                       (1 - u_t) * g / (1 - u_prod);
        double v_hat = *v / (1 - pow(o->beta_2, t));
        *w -= lr * m_hat / (sqrt(v_hat) + o->epsilon);
        break;
      }
      case TSR_OPT_ADAMAX: {
        double *m = &r->s[0][i], *u = &r->s[1][i];
        *m = o->beta_1 * *m + (1 - o->beta_1) * g;
        *u = fmax(o->beta_2 * *u, fabs(g));
        *w -= lr * *m / ((1 - pow(o->beta_1, t)) * (*u + o->epsilon));
        break;
      }
      case TSR_OPT__COUNT:
        break;
      case TSR_OPT_FTRL: {
        /* tensorflow/core/kernels/training_ops.cc, ApplyFtrlV2 */
        double *acc = &r->s[0][i], *lin = &r->s[1][i];
        double p = o->learning_rate_power;
        double l2 = o->l2 + o->beta / (2 * lr);
        double gs = g + 2 * o->l2_shrinkage * *w;
        double na = *acc + g * g;
        *lin += gs - (pow(na, -p) - pow(*acc, -p)) / lr * *w;
        double quad = pow(na, -p) / lr + 2 * l2;
        *w = fabs(*lin) > o->l1 ? ((*lin > 0 ? o->l1 : -o->l1) - *lin) / quad
                                : 0.0;
        *acc = na;
        break;
      }
      case TSR_OPT_MOVING_AVERAGE:
        /* Keras: moving = moving * momentum + batch * (1 - momentum) */
        *w = *w * o->momentum + g * (1 - o->momentum);
        break;
    }
  }
}

static void run_case(const tsr_optim_spec *o, float scale) {
  static float w[N], g[N], slots_mem[3][N];
  static ref_state r;
  float *slots[3] = {slots_mem[0], slots_mem[1], slots_mem[2]};
  int ns = kern_optim_num_slots(o);
  kern_optim_init_slots(o, slots, N);
  for (int i = 0; i < N; i++) {
    w[i] = (float)(0.5 * cos(0.11 * i));
    r.w[i] = w[i];
    for (int s = 0; s < 3; s++) r.s[s][i] = s < ns ? slots_mem[s][i] : 0;
  }
  for (int t = 1; t <= STEPS; t++) {
    for (int i = 0; i < N; i++) g[i] = (float)grad_at(t, i);
    assert_int_equal(kern_optim_apply(o, t, w, g, scale, slots, N), 0);
    ref_step(o, t, &r, g, scale);
  }
  double worst = 0;
  for (int i = 0; i < N; i++) {
    double err = fabs((double)w[i] - r.w[i]) / (1e-3 + fabs(r.w[i]));
    if (err > worst) worst = err;
    for (int s = 0; s < ns; s++) {
      double e2 = fabs((double)slots_mem[s][i] - r.s[s][i]) /
                  (1e-3 + fabs(r.s[s][i]));
      if (e2 > worst) worst = e2;
    }
  }
  if (worst > 2e-4)
    fail_msg("%s momentum=%g nesterov=%d centered=%d: worst relative error "
             "%g", tsr_optim_name(o->kind), o->momentum, o->nesterov,
             o->centered, worst);
  /* the update really moved the weights */
  double moved = 0;
  for (int i = 0; i < N; i++) moved += fabs(r.w[i] - 0.5 * cos(0.11 * i));
  assert_true(moved > 1e-3);
}

static void sgd_variants(void **state) {
  (void)state;
  tsr_optim_spec o;
  tsr_optim_defaults(TSR_OPT_SGD, &o);
  run_case(&o, 1.0f);
  o.momentum = 0.9;
  run_case(&o, 1.0f);
  o.nesterov = true;
  run_case(&o, 0.5f);
}

static void adagrad_steps(void **state) {
  (void)state;
  tsr_optim_spec o;
  tsr_optim_defaults(TSR_OPT_ADAGRAD, &o);
  o.learning_rate = 0.05;
  run_case(&o, 1.0f);
  run_case(&o, 1.0f / 3);
}

static void rmsprop_variants(void **state) {
  (void)state;
  tsr_optim_spec o;
  tsr_optim_defaults(TSR_OPT_RMSPROP, &o);
  for (int c = 0; c < 2; c++)
    for (int m = 0; m < 2; m++) {
      o.centered = c;
      o.momentum = m ? 0.8 : 0.0;
      run_case(&o, 1.0f);
    }
}

static void adam_steps(void **state) {
  (void)state;
  tsr_optim_spec o;
  tsr_optim_defaults(TSR_OPT_ADAM, &o);
  run_case(&o, 1.0f);
  o.learning_rate = 0.01;
  o.beta_1 = 0.8;
  run_case(&o, 0.25f);
}

static void adamw_nadam_adamax(void **state) {
  (void)state;
  tsr_optim_spec o;
  tsr_optim_defaults(TSR_OPT_ADAMW, &o);
  assert_true(o.weight_decay == 0.004); /* Keras's AdamW default */
  o.weight_decay = 0.5;                 /* large enough to matter */
  o.learning_rate = 0.01;
  run_case(&o, 1.0f);
  tsr_optim_defaults(TSR_OPT_NADAM, &o);
  o.learning_rate = 0.01;
  run_case(&o, 1.0f);
  run_case(&o, 0.5f);
  tsr_optim_defaults(TSR_OPT_ADAMAX, &o);
  o.learning_rate = 0.02;
  run_case(&o, 1.0f);
  o.beta_2 = 0.5; /* u decays faster than |g| grows: both max branches */
  run_case(&o, 0.25f);
}

static void weight_decay_and_clipvalue(void **state) {
  (void)state;
  tsr_optim_spec o;
  for (int k = 0; k < TSR_OPT_FTRL; k++) {
    tsr_optim_defaults((tsr_opt_kind)k, &o);
    o.weight_decay = 0.3;
    run_case(&o, 1.0f);
    o.weight_decay = 0;
    o.clipvalue = 0.7; /* grad_at reaches 4.x: many elements clipped, across
                          the 1024-element chunk boundary */
    run_case(&o, 1.0f);
  }
}

static void schedules(void **state) {
  (void)state;
  tsr_optim_spec o;
  tsr_optim_defaults(TSR_OPT_SGD, &o);
  tsr_lr_schedule *s = &o.schedule;
  o.learning_rate = s->initial = 0.1;
  s->decay_steps = 3;
  s->decay_rate = 0.5;
  s->t_mul = 2;
  s->m_mul = 0.7;
  s->end_lr = 0.001;
  s->power = 2;
  s->alpha = 0.1;
  for (int k = TSR_LR_EXPONENTIAL; k <= TSR_LR_INVERSE_TIME; k++) {
    s->kind = (tsr_lr_kind)k;
    s->n_boundaries = 2;
    s->boundaries[0] = 1;
    s->boundaries[1] = 4;
    s->values[0] = 0.2;
    s->values[1] = 0.05;
    s->values[2] = 0.01;
    for (int v = 0; v < 2; v++) {
      s->staircase = s->cycle = v;
      s->warmup = v;
      s->warmup_target = 0.3;
      s->warmup_steps = 2;
      run_case(&o, 1.0f);
      /* and the rate itself, over a long range past decay_steps */
      for (int t = 1; t < 40; t++) {
        double want = ref_lr(&o, t), got = tsr_optim_lr(&o, t - 1);
        if (fabs(got - want) > 1e-12 * (1 + fabs(want)))
          fail_msg("%s (variant %d) at iteration %d: %.17g, want %.17g",
                   tsr_lr_schedule_name(s->kind), v, t - 1, got, want);
      }
    }
  }
  /* t_mul 1: equal periods */
  s->kind = TSR_LR_COSINE_RESTARTS;
  s->t_mul = 1;
  for (int t = 1; t < 20; t++)
    assert_true(fabs(tsr_optim_lr(&o, t - 1) - ref_lr(&o, t)) < 1e-12);
  /* a few Keras values by hand: ExponentialDecay(0.1, 10, 0.96) at step
   * 25 = 0.1 * 0.96^2.5; PiecewiseConstantDecay([10], [1, 0.5]) is 1 at
   * step 10 and 0.5 at 11 */
  s->kind = TSR_LR_EXPONENTIAL;
  s->initial = 0.1;
  s->decay_steps = 10;
  s->decay_rate = 0.96;
  s->staircase = false;
  assert_true(fabs(tsr_lr_schedule_at(s, 25) - 0.1 * pow(0.96, 2.5)) < 1e-15);
  s->kind = TSR_LR_PIECEWISE;
  s->n_boundaries = 1;
  s->boundaries[0] = 10;
  s->values[0] = 1;
  s->values[1] = 0.5;
  assert_true(tsr_lr_schedule_at(s, 10) == 1 && tsr_lr_schedule_at(s, 11) == 0.5);
}

static void clip_norms(void **state) {
  (void)state;
  tsr_optim_spec o;
  tsr_optim_defaults(TSR_OPT_SGD, &o);
  float a[4] = {3, 4, 0, 0}, b[2] = {0, 12};   /* norms 5 and 12 */
  float *g[2] = {a, b};
  size_t n[2] = {4, 2};
  assert_true(kern_optim_clip_norm(&o, g, n, 2, 1.0f) == 1.0); /* off */
  o.clipnorm = 6; /* each on its own: a stays, b to norm 6 */
  double f = kern_optim_clip_norm(&o, g, n, 2, 1.0f);
  assert_true(fabs(f - 0.5) < 1e-12);
  assert_true(a[0] == 3 && a[1] == 4 && fabs(b[1] - 6) < 1e-6);
  o.clipnorm = 0;
  o.global_clipnorm = 3.9; /* joint norm sqrt(25 + 36) */
  f = kern_optim_clip_norm(&o, g, n, 2, 1.0f);
  double want = 3.9 / sqrt(61.0);
  assert_true(fabs(f - want) < 1e-12);
  assert_true(fabs(a[0] - 3 * want) < 1e-6 && fabs(b[1] - 6 * want) < 1e-6);
  /* scale: the norm is of the scaled gradient (loss scale 1/8 here) */
  float c[1] = {8};
  float *gc[1] = {c};
  size_t nc[1] = {1};
  o.global_clipnorm = 0.5;
  f = kern_optim_clip_norm(&o, gc, nc, 1, 0.125f);
  assert_true(fabs(f - 0.5) < 1e-12 && fabs(c[0] - 4) < 1e-6);
}

static void ftrl_variants(void **state) {
  (void)state;
  tsr_optim_spec o;
  tsr_optim_defaults(TSR_OPT_FTRL, &o);
  o.learning_rate = 0.05;
  run_case(&o, 1.0f);
  o.l1 = 0.01;
  o.l2 = 0.02;
  o.l2_shrinkage = 0.03;
  o.beta = 0.1;
  run_case(&o, 1.0f);
  o.learning_rate_power = -0.7; /* the general pow() loop */
  run_case(&o, 1.0f);
}

/* BatchNormalization's moving statistics: Keras's momentum rule, the
 * pushed statistic scaled like a gradient (1/k for a sync mean). */
static void moving_average_steps(void **state) {
  (void)state;
  tsr_optim_spec o;
  tsr_optim_defaults(TSR_OPT_MOVING_AVERAGE, &o);
  assert_int_equal(kern_optim_num_slots(&o), 0);
  assert_string_equal(tsr_optim_name(o.kind), "moving_average");
  o.momentum = 0.99;
  o.learning_rate = 1 - o.momentum;
  run_case(&o, 1.0f);
  o.momentum = 0.6;
  o.learning_rate = 1 - o.momentum;
  run_case(&o, 0.5f);
}

static void slots_and_errors(void **state) {
  (void)state;
  tsr_optim_spec o;
  tsr_optim_defaults(TSR_OPT_SGD, &o);
  assert_int_equal(kern_optim_num_slots(&o), 0);
  assert_null(kern_optim_slot_name(&o, 0));
  o.momentum = 0.5;
  assert_int_equal(kern_optim_num_slots(&o), 1);
  assert_string_equal(kern_optim_slot_name(&o, 0), "momentum");
  tsr_optim_defaults(TSR_OPT_ADAM, &o);
  assert_int_equal(kern_optim_num_slots(&o), 2);
  assert_string_equal(kern_optim_slot_name(&o, 0), "m");
  assert_string_equal(kern_optim_slot_name(&o, 1), "v");
  tsr_optim_defaults(TSR_OPT_ADAMAX, &o);
  assert_int_equal(kern_optim_num_slots(&o), 2);
  assert_string_equal(kern_optim_slot_name(&o, 1), "u");
  tsr_optim_defaults(TSR_OPT_RMSPROP, &o);
  o.centered = true;
  o.momentum = 0.1;
  assert_int_equal(kern_optim_num_slots(&o), 3);
  assert_string_equal(kern_optim_slot_name(&o, 1), "average_gradient");
  assert_string_equal(kern_optim_slot_name(&o, 2), "momentum");
  tsr_optim_defaults(TSR_OPT_ADAGRAD, &o);
  o.initial_accumulator_value = 0.25;
  float a[5];
  float *sl[1] = {a};
  kern_optim_init_slots(&o, sl, 5);
  for (int i = 0; i < 5; i++) assert_true(a[i] == 0.25f);
  float w[5] = {0}, g[5] = {0};
  assert_int_equal(kern_optim_apply(&o, 0, w, g, 1.0f, sl, 5), TSR_EINVAL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(sgd_variants),     cmocka_unit_test(adagrad_steps),
      cmocka_unit_test(rmsprop_variants), cmocka_unit_test(adam_steps),
      cmocka_unit_test(ftrl_variants),    cmocka_unit_test(slots_and_errors),
      cmocka_unit_test(moving_average_steps),
      cmocka_unit_test(adamw_nadam_adamax),
      cmocka_unit_test(weight_decay_and_clipvalue),
      cmocka_unit_test(schedules),        cmocka_unit_test(clip_norms),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
