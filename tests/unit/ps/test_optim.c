/* Optimizers: every kind and variant runs several steps over an array with
 * varied gradients (including a gradient scale, as sync mode uses) and is
 * compared with a float64 reference written here from the published
 * Keras/TF update rules. Also the slot counts, names and initial values. */
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
  double lr = o->learning_rate;
  for (int i = 0; i < N; i++) {
    double g = (double)g32[i] * scale;
    double *w = &r->w[i];
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
      case TSR_OPT_ADAM: {
        double *m = &r->s[0][i], *v = &r->s[1][i];
        *m = o->beta_1 * *m + (1 - o->beta_1) * g;
        *v = o->beta_2 * *v + (1 - o->beta_2) * g * g;
        double b2t = pow(o->beta_2, t), b1t = pow(o->beta_1, t);
        double alpha = lr * sqrt(1 - b2t) / (1 - b1t);
        double eps_hat = o->epsilon * sqrt(1 - b2t);
        *w -= alpha * *m / (sqrt(*v) + eps_hat);
        break;
      }
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
      cmocka_unit_test(ftrl_variants),
      cmocka_unit_test(moving_average_steps),
      cmocka_unit_test(slots_and_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
