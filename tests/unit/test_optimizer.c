/* Unit tests for server/optimizer.c: every optimizer checked over two steps
 * against values computed by hand (arithmetic in the comments), plus
 * validation, naming and unaligned gradient buffers. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "optimizer.h"

#define N 3
#define REL_TOL 1e-6

/* |got - want| <= REL_TOL * max(|want|, 1e-30); abs fallback for want = 0. */
static void assert_close(double got, double want, const char *what, int i)
{
    double tol = REL_TOL * fabs(want);
    if (want == 0.0)
        tol = 1e-12;
    if (!(fabs(got - want) <= tol)) {
        print_error("%s[%d] = %.9g, want %.9g\n", what, i, got, want);
        fail();
    }
}

static void assert_vec(const float *got, const double *want, const char *what)
{
    for (int i = 0; i < N; i++)
        assert_close(got[i], want[i], what, i);
}

/* Runs two steps of p on w = {1, 2, 3} with gradients g1 then g2, checking the
 * parameters after each step against want1 and want2. Slots are returned in s. */
static void run_two_steps(const optimizer_params *p, const float g1[N], const float g2[N],
                          const double want1[N], const double want2[N], float s[3][N])
{
    float w[N] = {1.0f, 2.0f, 3.0f};
    float *slots[3] = {s[0], s[1], s[2]};
    char err[128];
    assert_int_equal(optimizer_validate(p, err, sizeof(err)), 0);
    memset(s, 0xff, sizeof(float) * 3 * N); /* garbage: init_slots must overwrite */
    optimizer_init_slots(p, slots, N);
    optimizer_apply(p, w, g1, slots, N);
    assert_vec(w, want1, "step1 w");
    optimizer_apply(p, w, g2, slots, N);
    assert_vec(w, want2, "step2 w");
}

static void test_sgd(void **state)
{
    (void)state;
    optimizer_params p;
    optimizer_params_default(&p, OPTIMIZER_SGD);
    p.learning_rate = 0.1f;
    const float g1[N] = {0.5f, -1.0f, 2.0f}, g2[N] = {1.0f, 0.0f, -0.5f};
    /* step 1: w = {1 - 0.1*0.5, 2 + 0.1*1, 3 - 0.1*2}   = {0.95, 2.1, 2.8}
     * step 2: w = {0.95 - 0.1*1, 2.1 - 0, 2.8 + 0.1*0.5} = {0.85, 2.1, 2.85} */
    const double w1[N] = {0.95, 2.1, 2.8}, w2[N] = {0.85, 2.1, 2.85};
    float s[3][N];
    run_two_steps(&p, g1, g2, w1, w2, s);
    assert_int_equal(optimizer_slot_count(OPTIMIZER_SGD), 0);
}

static void test_momentum(void **state)
{
    (void)state;
    optimizer_params p;
    optimizer_params_default(&p, OPTIMIZER_MOMENTUM);
    p.learning_rate = 0.1f;
    p.momentum = 0.9f;
    const float g1[N] = {0.5f, -1.0f, 2.0f}, g2[N] = {1.0f, 0.0f, -0.5f};
    /* step 1: a = 0.9*0 + g1 = {0.5, -1, 2}; w = {1 - 0.05, 2 + 0.1, 3 - 0.2} = {0.95, 2.1, 2.8}
     * step 2: a = 0.9*a + g2 = {0.45 + 1, -0.9 + 0, 1.8 - 0.5} = {1.45, -0.9, 1.3}
     *         w = {0.95 - 0.145, 2.1 + 0.09, 2.8 - 0.13}     = {0.805, 2.19, 2.67} */
    const double w1[N] = {0.95, 2.1, 2.8}, w2[N] = {0.805, 2.19, 2.67};
    const double a2[N] = {1.45, -0.9, 1.3};
    float s[3][N];
    run_two_steps(&p, g1, g2, w1, w2, s);
    assert_vec(s[0], a2, "accumulator");
    assert_int_equal(optimizer_slot_count(OPTIMIZER_MOMENTUM), 1);
}

static void test_nesterov(void **state)
{
    (void)state;
    optimizer_params p;
    optimizer_params_default(&p, OPTIMIZER_MOMENTUM);
    p.learning_rate = 0.1f;
    p.momentum = 0.9f;
    p.nesterov = true;
    const float g1[N] = {0.5f, -1.0f, 2.0f}, g2[N] = {1.0f, 0.0f, -0.5f};
    /* step 1: a = g1 = {0.5, -1, 2}; g + 0.9*a = 1.9*g1 = {0.95, -1.9, 3.8}
     *         w = {1 - 0.095, 2 + 0.19, 3 - 0.38} = {0.905, 2.19, 2.62}
     * step 2: a = 0.9*a + g2 = {1.45, -0.9, 1.3}
     *         g + 0.9*a = {1 + 1.305, 0 - 0.81, -0.5 + 1.17} = {2.305, -0.81, 0.67}
     *         w = {0.905 - 0.2305, 2.19 + 0.081, 2.62 - 0.067} = {0.6745, 2.271, 2.553} */
    const double w1[N] = {0.905, 2.19, 2.62}, w2[N] = {0.6745, 2.271, 2.553};
    const double a2[N] = {1.45, -0.9, 1.3};
    float s[3][N];
    run_two_steps(&p, g1, g2, w1, w2, s);
    assert_vec(s[0], a2, "accumulator");
}

static void test_adagrad(void **state)
{
    (void)state;
    optimizer_params p;
    optimizer_params_default(&p, OPTIMIZER_ADAGRAD);
    p.learning_rate = 0.1f;
    p.initial_accumulator = 9.0f;
    p.epsilon = 1.0f; /* large on purpose: checks eps is added outside the sqrt */
    const float g1[N] = {4.0f, 0.0f, -4.0f}, g2[N] = {-12.0f, 4.0f, 12.0f};
    /* step 1: acc = 9 + g1^2 = {25, 9, 25}, sqrt = {5, 3, 5}
     *         w = {1 - 0.1*4/(5+1), 2 - 0, 3 + 0.1*4/(5+1)} = {1 - 1/15, 2, 3 + 1/15}
     *           = {14/15, 2, 46/15}
     * step 2: acc = acc + g2^2 = {25 + 144, 9 + 16, 25 + 144} = {169, 25, 169}, sqrt = {13, 5, 13}
     *         w = {14/15 + 1.2/14, 2 - 0.4/6, 46/15 - 1.2/14}
     *           = {14/15 + 3/35, 2 - 1/15, 46/15 - 3/35} = {107/105, 29/15, 313/105}
     * (eps inside the sqrt would give 1 - 0.4/sqrt(26) = 0.92155 at step 1 instead.) */
    const double w1[N] = {14.0 / 15, 2.0, 46.0 / 15};
    const double w2[N] = {107.0 / 105, 29.0 / 15, 313.0 / 105};
    const double acc2[N] = {169.0, 25.0, 169.0};
    float s[3][N];
    run_two_steps(&p, g1, g2, w1, w2, s);
    assert_vec(s[0], acc2, "accumulator");
    assert_int_equal(optimizer_slot_count(OPTIMIZER_ADAGRAD), 1);
}

static void test_adagrad_init_slots(void **state)
{
    (void)state;
    optimizer_params p;
    optimizer_params_default(&p, OPTIMIZER_ADAGRAD);
    float acc[N] = {0};
    float *slots[1] = {acc};
    optimizer_init_slots(&p, slots, N);
    for (int i = 0; i < N; i++)
        assert_true(acc[i] == 0.1f);
}

static void test_adam(void **state)
{
    (void)state;
    optimizer_params p;
    optimizer_params_default(&p, OPTIMIZER_ADAM);
    p.learning_rate = 0.1f;
    p.beta1 = 0.5f;
    p.beta2 = 0.75f;
    p.epsilon = 1.0f;
    const float g1[N] = {1.0f, -3.0f, 0.5f}, g2[N] = {-1.0f, 3.0f, 0.5f};
    /* step 1 (t = 1): 1 - b1 = 0.5, 1 - b2 = 0.25
     *   m = 0.5*g1 = {0.5, -1.5, 0.25};  mhat = m/0.5 = g1
     *   v = 0.25*g1^2 = {0.25, 2.25, 0.0625};  vhat = v/0.25 = g1^2, sqrt = {1, 3, 0.5}
     *   w = {1 - 0.1*1/(1+1), 2 + 0.1*3/(3+1), 3 - 0.1*0.5/(0.5+1)}
     *     = {1 - 0.05, 2 + 0.075, 3 - 1/30} = {0.95, 2.075, 89/30}
     * step 2 (t = 2): 1 - b1^2 = 0.75, 1 - b2^2 = 1 - 0.5625 = 0.4375
     *   m = 0.5*m + 0.5*g2 = {0.25 - 0.5, -0.75 + 1.5, 0.125 + 0.25} = {-0.25, 0.75, 0.375}
     *   mhat = m/0.75 = {-1/3, 1, 0.5}
     *   v = 0.75*v + 0.25*g2^2 = {0.1875 + 0.25, 1.6875 + 2.25, 0.046875 + 0.0625}
     *     = {0.4375, 3.9375, 0.109375}
     *   vhat = v/0.4375 = {1, 9, 0.25}, sqrt = {1, 3, 0.5}
     *   w = {0.95 + 0.1*(1/3)/2, 2.075 - 0.1*1/4, 89/30 - 0.1*0.5/1.5}
     *     = {0.95 + 1/60, 2.075 - 0.025, 89/30 - 1/30} = {29/30, 2.05, 88/30} */
    const double w1[N] = {0.95, 2.075, 89.0 / 30};
    const double w2[N] = {29.0 / 30, 2.05, 88.0 / 30};
    const double m2[N] = {-0.25, 0.75, 0.375}, v2[N] = {0.4375, 3.9375, 0.109375};
    const double t2[N] = {2, 2, 2};
    float s[3][N];
    run_two_steps(&p, g1, g2, w1, w2, s);
    assert_vec(s[0], m2, "m");
    assert_vec(s[1], v2, "v");
    assert_vec(s[2], t2, "t");
    assert_int_equal(optimizer_slot_count(OPTIMIZER_ADAM), 3);
}

/* Per-element step counts: elements that have seen different numbers of
 * updates get their own bias correction. */
static void test_adam_per_element_t(void **state)
{
    (void)state;
    optimizer_params p;
    optimizer_params_default(&p, OPTIMIZER_ADAM);
    p.learning_rate = 0.1f;
    p.beta1 = 0.5f;
    p.beta2 = 0.75f;
    p.epsilon = 1.0f;
    float w[2] = {1.0f, 1.0f}, m[2] = {0}, v[2] = {0}, t[2] = {0};
    float *slots[3] = {m, v, t};
    const float g[2] = {1.0f, 1.0f};
    optimizer_init_slots(&p, slots, 2);
    optimizer_apply(&p, w, g, slots, 1); /* only element 0: w0 = 1 - 0.1*1/(1+1) = 0.95 */
    float *slots1[3] = {m + 1, v + 1, t + 1};
    optimizer_apply(&p, w + 1, g + 1, slots1, 1); /* element 1 alone: also its first step */
    assert_close(w[0], 0.95, "w", 0);
    assert_close(w[1], 0.95, "w", 1);
    assert_true(t[0] == 1.0f && t[1] == 1.0f);
    /* both at t = 2 with g = 1: m = 0.75, mhat = 1; v = 0.75*0.25 + 0.25 = 0.4375,
     * vhat = 1: w = 0.95 - 0.1*1/2 = 0.9 */
    optimizer_apply(&p, w, g, slots, 2);
    assert_close(w[0], 0.9, "w", 0);
    assert_close(w[1], 0.9, "w", 1);
}

/* Adam processes blocks whose elements share t with hoisted bias corrections
 * and other blocks per element: results must be bit-identical to applying each
 * element on its own, whatever the mix of step counts and block boundaries. */
static void test_adam_mixed_t_blocks(void **state)
{
    (void)state;
    enum { M = 2500 }; /* spans several internal blocks, with a partial last one */
    static float w[M], m[M], v[M], t[M], rw[M], rm[M], rv[M], rt[M], g[M];
    float *slots[3] = {m, v, t};
    optimizer_params p;
    optimizer_params_default(&p, OPTIMIZER_ADAM);
    p.learning_rate = 0.01f;
    for (int i = 0; i < M; i++) {
        w[i] = rw[i] = (float)(i % 17) * 0.25f - 2.0f;
        g[i] = (float)((i * 7919) % 101 - 50) * 0.03f;
    }
    optimizer_init_slots(&p, slots, M);
    memcpy(rm, m, sizeof(m));
    memcpy(rv, v, sizeof(v));
    memcpy(rt, t, sizeof(t));
    /* ranges: whole, whole, a piece straddling blocks, a scattered element, whole */
    const size_t ranges[][2] = {{0, M}, {0, M}, {1000, 1700}, {2049, 2050}, {3, 5}, {0, M}};
    for (size_t r = 0; r < sizeof(ranges) / sizeof(ranges[0]); r++) {
        size_t lo = ranges[r][0], hi = ranges[r][1];
        float *s_off[3] = {m + lo, v + lo, t + lo};
        optimizer_apply(&p, w + lo, g + lo, s_off, hi - lo);
        for (size_t i = lo; i < hi; i++) {
            float *one[3] = {rm + i, rv + i, rt + i};
            optimizer_apply(&p, rw + i, g + i, one, 1);
        }
    }
    assert_true(t[0] == 3.0f && t[1000] == 4.0f && t[2049] == 4.0f && t[4] == 4.0f);
    assert_memory_equal(t, rt, sizeof(t));
    assert_memory_equal(m, rm, sizeof(m));
    assert_memory_equal(v, rv, sizeof(v));
    assert_memory_equal(w, rw, sizeof(w));
}

/* AdamW against a naive loop in double precision written from the definition (Loshchilov &
 * Hutter, PyTorch's torch.optim.AdamW): per step, w *= 1 - lr*wd; m = b1*m + (1-b1)*g;
 * v = b2*v + (1-b2)*g^2; w -= lr * (m/(1-b1^t)) / (sqrt(v/(1-b2^t)) + eps). Ten steps over
 * a range that spans several internal blocks, gradients of both signs and scales. */
static void test_adamw_against_naive(void **state)
{
    (void)state;
    enum { M = 2100, STEPS = 10 };
    static float w[M], m[M], v[M], t[M], g[M];
    static double rw[M], rm[M], rv[M];
    float *slots[3] = {m, v, t};
    optimizer_params p;
    optimizer_params_default(&p, OPTIMIZER_ADAMW);
    p.learning_rate = 0.01f;
    p.weight_decay = 0.1f;
    p.beta1 = 0.9f;
    p.beta2 = 0.99f;
    p.epsilon = 1e-6f;
    char err[128];
    assert_int_equal(optimizer_validate(&p, err, sizeof(err)), 0);
    assert_int_equal(optimizer_slot_count(OPTIMIZER_ADAMW), 3);
    for (int i = 0; i < M; i++)
        w[i] = (float)(rw[i] = (double)((i % 23) - 11) * 0.125);
    memset(rm, 0, sizeof(rm));
    memset(rv, 0, sizeof(rv));
    memset(m, 0xff, sizeof(m)); /* garbage: init_slots must overwrite */
    optimizer_init_slots(&p, slots, M);
    const double lr = p.learning_rate, wd = p.weight_decay, b1 = p.beta1, b2 = p.beta2,
                 eps = p.epsilon;
    for (int step = 1; step <= STEPS; step++) {
        for (int i = 0; i < M; i++)
            g[i] =
                (float)((double)(((i + 1) * (step + 3) * 7919) % 201 - 100) * 0.01 * (1 + i % 3));
        optimizer_apply(&p, w, g, slots, M);
        for (int i = 0; i < M; i++) {
            rw[i] *= 1.0 - lr * wd;
            rm[i] = b1 * rm[i] + (1.0 - b1) * g[i];
            rv[i] = b2 * rv[i] + (1.0 - b2) * g[i] * g[i];
            double mhat = rm[i] / (1.0 - pow(b1, step)), vhat = rv[i] / (1.0 - pow(b2, step));
            rw[i] -= lr * mhat / (sqrt(vhat) + eps);
        }
        for (int i = 0; i < M; i++) {
            if (!(fabs(w[i] - rw[i]) <= 1e-5 * fmax(fabs(rw[i]), 1.0))) {
                print_error("step %d: w[%d] = %.9g, naive %.9g\n", step, i, w[i], rw[i]);
                fail();
            }
        }
    }
    assert_true(t[0] == (float)STEPS && t[M - 1] == (float)STEPS);
}

/* AdamW with weight_decay 0 is Adam, bit for bit. */
static void test_adamw_zero_decay_is_adam(void **state)
{
    (void)state;
    enum { M = 300 };
    float w[M], rw[M], g[M], s[3][M], rs[3][M];
    float *slots[3] = {s[0], s[1], s[2]}, *rslots[3] = {rs[0], rs[1], rs[2]};
    optimizer_params pw, pa;
    optimizer_params_default(&pw, OPTIMIZER_ADAMW);
    optimizer_params_default(&pa, OPTIMIZER_ADAM);
    pw.weight_decay = 0.0f;
    for (int i = 0; i < M; i++) {
        w[i] = rw[i] = (float)i * 0.01f - 1.0f;
        g[i] = (float)((i * 31) % 17 - 8) * 0.1f;
    }
    optimizer_init_slots(&pw, slots, M);
    optimizer_init_slots(&pa, rslots, M);
    for (int k = 0; k < 3; k++) {
        optimizer_apply(&pw, w, g, slots, M);
        optimizer_apply(&pa, rw, g, rslots, M);
    }
    assert_memory_equal(w, rw, sizeof(w));
    assert_memory_equal(s, rs, sizeof(s));
}

/* The gradient read from a buffer at an odd address gives the same bits. */
static void test_unaligned_grad(void **state)
{
    (void)state;
    enum { M = 37 };
    const optimizer_kind kinds[] = {OPTIMIZER_SGD, OPTIMIZER_MOMENTUM, OPTIMIZER_ADAGRAD,
                                    OPTIMIZER_ADAM};
    float g[M];
    for (int i = 0; i < M; i++)
        g[i] = (float)(i - 18) * 0.37f;
    _Alignas(16) unsigned char buf[sizeof(g) + 1];
    memcpy(buf + 1, g, sizeof(g));
    for (size_t k = 0; k < sizeof(kinds) / sizeof(kinds[0]); k++) {
        for (int nesterov = 0; nesterov < 2; nesterov++) {
            optimizer_params p;
            optimizer_params_default(&p, kinds[k]);
            p.nesterov = nesterov;
            float wa[M], wb[M], sa[3][M], sb[3][M];
            float *slots_a[3] = {sa[0], sa[1], sa[2]}, *slots_b[3] = {sb[0], sb[1], sb[2]};
            for (int i = 0; i < M; i++)
                wa[i] = wb[i] = (float)i * 0.1f;
            optimizer_init_slots(&p, slots_a, M);
            optimizer_init_slots(&p, slots_b, M);
            for (int step = 0; step < 3; step++) {
                optimizer_apply(&p, wa, g, slots_a, M);
                optimizer_apply(&p, wb, buf + 1, slots_b, M);
            }
            assert_memory_equal(wa, wb, sizeof(wa));
            for (size_t s = 0; s < optimizer_slot_count(kinds[k]); s++)
                assert_memory_equal(sa[s], sb[s], sizeof(sa[s]));
            assert_true(wa[0] != 0.0f); /* something happened */
        }
    }
}

static void test_defaults(void **state)
{
    (void)state;
    optimizer_params p;
    optimizer_params_default(&p, OPTIMIZER_ADAM);
    assert_true(p.learning_rate == 0.001f && p.beta1 == 0.9f && p.beta2 == 0.999f &&
                p.epsilon == 1e-8f);
    optimizer_params_default(&p, OPTIMIZER_ADAGRAD);
    assert_true(p.learning_rate == 0.01f && p.epsilon == 1e-7f && p.initial_accumulator == 0.1f);
    optimizer_params_default(&p, OPTIMIZER_MOMENTUM);
    assert_true(p.learning_rate == 0.01f && p.momentum == 0.9f && !p.nesterov);
    optimizer_params_default(&p, OPTIMIZER_ADAMW);
    assert_true(p.learning_rate == 0.001f && p.beta1 == 0.9f && p.beta2 == 0.999f &&
                p.epsilon == 1e-8f && p.weight_decay == 0.01f);
    for (int k = 0; k < OPTIMIZER_KIND_COUNT; k++) {
        optimizer_params_default(&p, (optimizer_kind)k);
        assert_int_equal(optimizer_validate(&p, NULL, 0), 0);
    }
    optimizer_params_default(NULL, OPTIMIZER_SGD); /* no crash */
}

/* Expects validation of p to fail with a message containing `field`. */
static void expect_invalid(const optimizer_params *p, const char *field)
{
    char err[256] = "";
    assert_int_equal(optimizer_validate(p, err, sizeof(err)), -1);
    if (strstr(err, field) == NULL) {
        print_error("message \"%s\" does not name \"%s\"\n", err, field);
        fail();
    }
}

static void test_validate(void **state)
{
    (void)state;
    optimizer_params p;
    const float bad_lr[] = {0.0f, -0.1f, NAN, INFINITY};
    for (int k = 0; k < OPTIMIZER_KIND_COUNT; k++) {
        for (size_t i = 0; i < sizeof(bad_lr) / sizeof(bad_lr[0]); i++) {
            optimizer_params_default(&p, (optimizer_kind)k);
            p.learning_rate = bad_lr[i];
            expect_invalid(&p, "learning_rate");
        }
    }
    optimizer_params_default(&p, OPTIMIZER_SGD);
    p.learning_rate = -0.5f;
    char err[256];
    assert_int_equal(optimizer_validate(&p, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "-0.5")); /* the value is in the message */

    const float bad_unit[] = {1.0f, 1.5f, -0.1f, NAN, -INFINITY};
    for (size_t i = 0; i < sizeof(bad_unit) / sizeof(bad_unit[0]); i++) {
        optimizer_params_default(&p, OPTIMIZER_MOMENTUM);
        p.momentum = bad_unit[i];
        expect_invalid(&p, "momentum");
        optimizer_params_default(&p, OPTIMIZER_ADAM);
        p.beta1 = bad_unit[i];
        expect_invalid(&p, "beta1");
        optimizer_params_default(&p, OPTIMIZER_ADAM);
        p.beta2 = bad_unit[i];
        expect_invalid(&p, "beta2");
    }
    const float bad_wd[] = {-0.01f, NAN, INFINITY, 2000.0f /* lr * wd > 1 */};
    for (size_t i = 0; i < sizeof(bad_wd) / sizeof(bad_wd[0]); i++) {
        optimizer_params_default(&p, OPTIMIZER_ADAMW);
        p.weight_decay = bad_wd[i];
        expect_invalid(&p, "weight_decay");
        optimizer_params_default(&p, OPTIMIZER_ADAMW);
        p.beta1 = bad_unit[i % (sizeof(bad_unit) / sizeof(bad_unit[0]))];
        expect_invalid(&p, "beta1"); /* AdamW checks Adam's fields too */
    }
    optimizer_params_default(&p, OPTIMIZER_ADAMW);
    p.weight_decay = 0.0f; /* Adam */
    assert_int_equal(optimizer_validate(&p, NULL, 0), 0);
    optimizer_params_default(&p, OPTIMIZER_ADAM);
    p.weight_decay = -5.0f; /* not Adam's: ignored */
    assert_int_equal(optimizer_validate(&p, NULL, 0), 0);

    optimizer_params_default(&p, OPTIMIZER_MOMENTUM);
    p.momentum = 0.0f; /* plain SGD through the momentum path: allowed */
    assert_int_equal(optimizer_validate(&p, NULL, 0), 0);

    const float bad_eps[] = {0.0f, -1e-8f, NAN, INFINITY};
    for (size_t i = 0; i < sizeof(bad_eps) / sizeof(bad_eps[0]); i++) {
        optimizer_params_default(&p, OPTIMIZER_ADAM);
        p.epsilon = bad_eps[i];
        expect_invalid(&p, "epsilon");
        optimizer_params_default(&p, OPTIMIZER_ADAGRAD);
        p.epsilon = bad_eps[i];
        expect_invalid(&p, "epsilon");
    }
    optimizer_params_default(&p, OPTIMIZER_ADAGRAD);
    p.initial_accumulator = -1.0f;
    expect_invalid(&p, "initial_accumulator");
    p.initial_accumulator = NAN;
    expect_invalid(&p, "initial_accumulator");
    p.initial_accumulator = 0.0f;
    assert_int_equal(optimizer_validate(&p, NULL, 0), 0);

    /* fields of other kinds are ignored */
    optimizer_params_default(&p, OPTIMIZER_SGD);
    p.momentum = 7.0f;
    p.beta1 = NAN;
    p.epsilon = -1.0f;
    assert_int_equal(optimizer_validate(&p, err, sizeof(err)), 0);

    p.kind = (optimizer_kind)42;
    expect_invalid(&p, "kind");
    expect_invalid(NULL, "params");
    assert_int_equal(optimizer_validate(NULL, NULL, 0), -1);
    /* tiny buffer: truncated, still NUL-terminated */
    char small[4] = {'x', 'x', 'x', 'x'};
    optimizer_params_default(&p, OPTIMIZER_SGD);
    p.learning_rate = 0.0f;
    assert_int_equal(optimizer_validate(&p, small, sizeof(small)), -1);
    assert_int_equal(small[3], '\0');
}

static void test_names(void **state)
{
    (void)state;
    const char *names[] = {"sgd",   "momentum", "adagrad",        "adam",
                           "adamw", "ftrl",     "rowwise_adagrad"};
    _Static_assert(sizeof(names) / sizeof(names[0]) == OPTIMIZER_KIND_COUNT, "a name per kind");
    for (int k = 0; k < OPTIMIZER_KIND_COUNT; k++) {
        optimizer_kind out = OPTIMIZER_SGD;
        assert_string_equal(optimizer_name((optimizer_kind)k), names[k]);
        assert_int_equal(optimizer_parse(names[k], &out), 0);
        assert_int_equal(out, k);
    }
    optimizer_kind out = OPTIMIZER_SGD;
    assert_int_equal(optimizer_parse("Adam", &out), 0);
    assert_int_equal(out, OPTIMIZER_ADAM);
    out = OPTIMIZER_MOMENTUM;
    assert_int_equal(optimizer_parse("adamx", &out), -1);
    assert_int_equal(optimizer_parse("ada", &out), -1);
    assert_int_equal(optimizer_parse("", &out), -1);
    assert_int_equal(optimizer_parse(NULL, &out), -1);
    assert_int_equal(optimizer_parse("sgd", NULL), -1);
    assert_int_equal(out, OPTIMIZER_MOMENTUM); /* untouched on failure */
    assert_string_equal(optimizer_name((optimizer_kind)-1), "unknown");
    assert_string_equal(optimizer_name((optimizer_kind)OPTIMIZER_KIND_COUNT), "unknown");
    assert_int_equal(optimizer_slot_count((optimizer_kind)9), 0);
}

/* Bad pointers and kinds are ignored rather than crashing. */
static void test_bad_apply_args(void **state)
{
    (void)state;
    optimizer_params p;
    optimizer_params_default(&p, OPTIMIZER_ADAM);
    float w[2] = {1.0f, 2.0f}, g[2] = {1.0f, 1.0f}, m[2] = {0};
    float *partial[3] = {m, NULL, NULL};
    optimizer_apply(NULL, w, g, partial, 2);
    optimizer_apply(&p, NULL, g, partial, 2);
    optimizer_apply(&p, w, NULL, partial, 2);
    optimizer_apply(&p, w, g, NULL, 2);
    optimizer_apply(&p, w, g, partial, 2);
    optimizer_init_slots(&p, partial, 2);
    optimizer_init_slots(NULL, partial, 2);
    p.kind = (optimizer_kind)17;
    optimizer_apply(&p, w, g, partial, 2);
    optimizer_init_slots(&p, partial, 2);
    assert_true(w[0] == 1.0f && w[1] == 2.0f);
    optimizer_params_default(&p, OPTIMIZER_SGD);
    optimizer_apply(&p, w, g, NULL, 0); /* n = 0 */
    optimizer_apply(&p, w, g, NULL, 2); /* SGD needs no slots */
    assert_close(w[0], 1.0 - 0.01, "w", 0);
}

/* optimizer_apply_finite: the elements whose update would overflow float32 (a parameter, or
 * Adagrad's accumulator) keep their values; the others are updated as by optimizer_apply. */
static void test_apply_finite_keeps_overflowing_elements(void **state)
{
    (void)state;
    optimizer_params p;
    optimizer_params_default(&p, OPTIMIZER_SGD);
    p.learning_rate = 1.0f;
    enum { NE = 3000 }; /* over several blocks */
    static float w[NE], g[NE];
    for (int i = 0; i < NE; i++) {
        w[i] = i == 5 || i == 2500 ? 3e38f : 1.0f;
        g[i] = i == 5 || i == 2500 ? -3e38f : 0.5f;
    }
    size_t first = 99;
    assert_int_equal(optimizer_apply_finite(&p, w, g, NULL, NE, &first), 2);
    assert_int_equal(first, 5);
    for (int i = 0; i < NE; i++)
        assert_true(w[i] == (i == 5 || i == 2500 ? 3e38f : 0.5f));
    /* Adagrad: a gradient of 1e20 squares past FLT_MAX into the accumulator. */
    optimizer_params_default(&p, OPTIMIZER_ADAGRAD);
    float aw[3] = {1, 1, 1}, acc[3], ag[3] = {0.5f, 1e20f, 0.5f};
    float *slots[1] = {acc};
    optimizer_init_slots(&p, slots, 3);
    float acc0 = acc[1];
    assert_int_equal(optimizer_apply_finite(&p, aw, ag, slots, 3, &first), 1);
    assert_int_equal(first, 1);
    assert_true(aw[1] == 1.0f && acc[1] == acc0);
    assert_true(aw[0] < 1.0f && aw[2] < 1.0f && acc[0] > acc0);
}

/* A table row's shape and update (optimizer_row_shape_of, optimizer_apply_row). */
static void test_row_shapes_and_updates(void **state)
{
    (void)state;
    struct {
        optimizer_kind k;
        size_t slots, scalars, counts;
        bool narrow;
    } want[] = {
        {OPTIMIZER_SGD, 0, 0, 0, true},
        {OPTIMIZER_MOMENTUM, 1, 0, 0, true},
        {OPTIMIZER_ADAGRAD, 1, 0, 0, true},
        {OPTIMIZER_ADAM, 2, 0, 1, true},
        {OPTIMIZER_ADAMW, 2, 0, 1, false},
        {OPTIMIZER_FTRL, 2, 0, 0, true},
        {OPTIMIZER_ROWWISE_ADAGRAD, 0, 1, 0, true},
    };
    _Static_assert(sizeof(want) / sizeof(want[0]) == OPTIMIZER_KIND_COUNT, "a row per kind");
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        optimizer_row_shape sh;
        optimizer_row_shape_of(want[i].k, &sh);
        assert_int_equal(sh.slots, want[i].slots);
        assert_int_equal(sh.scalars, want[i].scalars);
        assert_int_equal(sh.counts, want[i].counts);
        assert_int_equal(sh.narrow_ok, want[i].narrow);
        assert_int_equal(optimizer_not_narrow(want[i].k) == NULL, want[i].narrow);
    }
    optimizer_row_shape sh;
    optimizer_row_shape_of((optimizer_kind)99, &sh);
    assert_true(sh.slots == 0 && sh.scalars == 0 && sh.counts == 0 && !sh.narrow_ok);

    /* Adam and AdamW: a row with one step count gives what a variable's range whose elements
     * share t gives, bit for bit; the count is the row's steps. */
    enum { D = 37 };
    float g[D];
    for (int i = 0; i < D; i++)
        g[i] = (float)(i % 9) * 0.125f - 0.5f;
    const optimizer_kind adams[] = {OPTIMIZER_ADAM, OPTIMIZER_ADAMW};
    for (int a = 0; a < 2; a++) {
        optimizer_params p;
        optimizer_params_default(&p, adams[a]);
        float wv[D], wr[D], sv[3][D], sr[2][D];
        float *vslots[3] = {sv[0], sv[1], sv[2]}, *rslots[2] = {sr[0], sr[1]};
        uint32_t t = 99;
        for (int i = 0; i < D; i++)
            wv[i] = wr[i] = (float)i * 0.01f;
        optimizer_init_slots(&p, vslots, D);
        optimizer_init_row(&p, rslots, NULL, &t, D);
        assert_int_equal(t, 0);
        for (int step = 0; step < 4; step++) {
            optimizer_apply(&p, wv, g, vslots, D);
            optimizer_apply_row(&p, wr, g, rslots, NULL, &t, D);
        }
        assert_int_equal(t, 4);
        assert_memory_equal(wv, wr, sizeof(wv));
        assert_memory_equal(sv[0], sr[0], sizeof(sr[0]));
        assert_memory_equal(sv[1], sr[1], sizeof(sr[1]));
        t = UINT32_MAX; /* saturates */
        optimizer_apply_row(&p, wr, g, rslots, NULL, &t, D);
        assert_int_equal(t, UINT32_MAX);
    }

    /* Row-wise Adagrad against the formula, computed here in double. */
    optimizer_params p;
    optimizer_params_default(&p, OPTIMIZER_ROWWISE_ADAGRAD);
    assert_true(p.epsilon == 1e-7f && p.initial_accumulator == 0.1f);
    p.learning_rate = 0.3f;
    float w[D], acc = -1.0f;
    double rw[D], racc = p.initial_accumulator;
    for (int i = 0; i < D; i++)
        rw[i] = w[i] = (float)i * 0.02f;
    optimizer_init_row(&p, NULL, &acc, NULL, D);
    assert_true(acc == 0.1f);
    for (int step = 0; step < 5; step++) {
        optimizer_apply_row(&p, w, g, NULL, &acc, NULL, D);
        double ms = 0;
        for (int i = 0; i < D; i++)
            ms += (double)g[i] * g[i];
        racc += ms / D;
        for (int i = 0; i < D; i++)
            rw[i] -= p.learning_rate / (sqrt(racc) + p.epsilon) * g[i];
    }
    assert_true(fabs(acc - racc) < 1e-6);
    for (int i = 0; i < D; i++)
        assert_true(fabs(w[i] - rw[i]) < 1e-5);
    /* No variable update: optimizer_apply leaves a range alone. */
    float before[D];
    memcpy(before, w, sizeof(w));
    optimizer_apply(&p, w, g, NULL, D);
    assert_memory_equal(before, w, sizeof(w));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sgd),
        cmocka_unit_test(test_momentum),
        cmocka_unit_test(test_nesterov),
        cmocka_unit_test(test_adagrad),
        cmocka_unit_test(test_adagrad_init_slots),
        cmocka_unit_test(test_adam),
        cmocka_unit_test(test_adam_per_element_t),
        cmocka_unit_test(test_adam_mixed_t_blocks),
        cmocka_unit_test(test_adamw_against_naive),
        cmocka_unit_test(test_adamw_zero_decay_is_adam),
        cmocka_unit_test(test_unaligned_grad),
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_validate),
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_row_shapes_and_updates),
        cmocka_unit_test(test_bad_apply_args),
        cmocka_unit_test(test_apply_finite_keeps_overflowing_elements),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
