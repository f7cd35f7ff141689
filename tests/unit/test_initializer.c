/* Unit tests for server/initializer.c: exact values, distribution moments,
 * Glorot limits and fans, shard independence, determinism and validation. */
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "initializer.h"

#define NS 100000 /* samples for the statistical checks */

static float samples[NS];

static void moments(const float *x, size_t n, double *mean, double *var)
{
    double s = 0.0, s2 = 0.0;
    for (size_t i = 0; i < n; i++)
        s += x[i];
    *mean = s / (double)n;
    for (size_t i = 0; i < n; i++)
        s2 += (x[i] - *mean) * (x[i] - *mean);
    *var = s2 / (double)(n - 1);
}

static initializer_params make(initializer_kind kind, double a, double b, uint64_t seed)
{
    initializer_params p = {.kind = kind, .a = a, .b = b, .seed = seed};
    return p;
}

static void test_zeros_constant(void **state)
{
    (void)state;
    float out[7];
    memset(out, 0x7f, sizeof(out));
    initializer_params p = make(INITIALIZER_ZEROS, 5.0, 6.0, 1);
    assert_int_equal(initializer_validate(&p, NULL, 0, NULL, 0), 0);
    initializer_fill(&p, NULL, 0, 12345, out, 7);
    for (int i = 0; i < 7; i++)
        assert_true(out[i] == 0.0f && !signbit(out[i]));
    p = make(INITIALIZER_CONSTANT, -2.5, 0.0, 1);
    assert_int_equal(initializer_validate(&p, NULL, 0, NULL, 0), 0);
    initializer_fill(&p, NULL, 0, 0, out, 7);
    for (int i = 0; i < 7; i++)
        assert_true(out[i] == -2.5f);
    p = make(INITIALIZER_CONSTANT, 0.1, 0.0, 1); /* rounded to the nearest float */
    initializer_fill(&p, NULL, 0, 99, out, 7);
    for (int i = 0; i < 7; i++)
        assert_true(out[i] == 0.1f);
}

static void test_uniform(void **state)
{
    (void)state;
    const double a = -2.0, b = 3.0;
    initializer_params p = make(INITIALIZER_UNIFORM, a, b, 42);
    assert_int_equal(initializer_validate(&p, NULL, 0, NULL, 0), 0);
    initializer_fill(&p, NULL, 0, 0, samples, NS);
    int hist[10] = {0};
    for (size_t i = 0; i < NS; i++) {
        assert_true(samples[i] >= a && samples[i] < b);
        hist[(int)((samples[i] - a) / (b - a) * 10.0)]++;
    }
    double mean, var;
    moments(samples, NS, &mean, &var);
    /* mean (a+b)/2 = 0.5, var (b-a)^2/12 = 25/12; stderr of the mean 0.0046 */
    assert_true(fabs(mean - 0.5) < 0.025);
    assert_true(fabs(var - 25.0 / 12.0) < 0.05);
    for (int k = 0; k < 10; k++) /* 10000 expected per bucket, sd ~95 */
        assert_true(abs(hist[k] - NS / 10) < 500);
    /* lag-1 correlation of neighbouring elements is ~0 (sd 1/sqrt(NS) = 0.003) */
    double c = 0.0;
    for (size_t i = 0; i + 1 < NS; i++)
        c += (samples[i] - mean) * (samples[i + 1] - mean);
    assert_true(fabs(c / (double)(NS - 1) / var) < 0.02);
}

/* A range holding only a few floats: every value stays in [a, b). */
static void test_uniform_narrow(void **state)
{
    (void)state;
    float lo = 1.0f, hi = nextafterf(nextafterf(1.0f, 2.0f), 2.0f); /* 2 floats in [lo, hi) */
    initializer_params p = make(INITIALIZER_UNIFORM, lo, hi, 7);
    assert_int_equal(initializer_validate(&p, NULL, 0, NULL, 0), 0);
    float out[1000];
    initializer_fill(&p, NULL, 0, 0, out, 1000);
    int seen_lo = 0;
    for (int i = 0; i < 1000; i++) {
        assert_true(out[i] >= lo && out[i] < hi);
        seen_lo += out[i] == lo;
    }
    assert_true(seen_lo > 0 && seen_lo < 1000);
}

static void test_normal(void **state)
{
    (void)state;
    initializer_params p = make(INITIALIZER_NORMAL, 1.0, 2.0, 7);
    assert_int_equal(initializer_validate(&p, NULL, 0, NULL, 0), 0);
    initializer_fill(&p, NULL, 0, 0, samples, NS);
    double mean, var, m4 = 0.0;
    moments(samples, NS, &mean, &var);
    /* stderr: mean 2/sqrt(NS) = 0.0063; stddev 2/sqrt(2 NS) = 0.0045 */
    assert_true(fabs(mean - 1.0) < 0.04);
    assert_true(fabs(sqrt(var) - 2.0) < 0.03);
    size_t within1 = 0;
    for (size_t i = 0; i < NS; i++) {
        assert_true(isfinite(samples[i]));
        double z = (samples[i] - 1.0) / 2.0;
        m4 += z * z * z * z;
        within1 += fabs(z) < 1.0;
    }
    /* kurtosis 3 and P(|z| < 1) = 0.6827 distinguish a normal from a uniform */
    assert_true(fabs(m4 / NS - 3.0) < 0.15);
    assert_true(fabs((double)within1 / NS - 0.6827) < 0.01);
}

static void test_fan(void **state)
{
    (void)state;
    double fi = -1, fo = -1;
    initializer_fan(NULL, 0, &fi, &fo);
    assert_true(fi == 1.0 && fo == 1.0);
    const uint64_t s1[] = {7};
    initializer_fan(s1, 1, &fi, &fo);
    assert_true(fi == 7.0 && fo == 7.0);
    const uint64_t s2[] = {3, 5};
    initializer_fan(s2, 2, &fi, &fo);
    assert_true(fi == 3.0 && fo == 5.0);
    const uint64_t s3[] = {2, 3, 4}; /* rf = 2: fan_in = 3*2, fan_out = 4*2 */
    initializer_fan(s3, 3, &fi, &fo);
    assert_true(fi == 6.0 && fo == 8.0);
    const uint64_t s4[] = {3, 3, 64, 128}; /* conv kernel: rf = 9: 576, 1152 */
    initializer_fan(s4, 4, &fi, &fo);
    assert_true(fi == 576.0 && fo == 1152.0);
    initializer_fan(s4, 4, NULL, &fo); /* NULL outputs are skipped */
    initializer_fan(NULL, 3, &fi, &fo);
    assert_true(fi == 0.0 && fo == 0.0);
}

static void test_glorot(void **state)
{
    (void)state;
    const uint64_t shape[] = {3, 3, 64, 128}; /* 73728 elements */
    const size_t n = 3 * 3 * 64 * 128;
    const double l = sqrt(6.0 / (576.0 + 1152.0)); /* sqrt(1/288) = 0.058926 */
    initializer_params p = make(INITIALIZER_GLOROT_UNIFORM, 0.0, 0.0, 3);
    assert_int_equal(initializer_validate(&p, shape, 4, NULL, 0), 0);
    initializer_fill(&p, shape, 4, 0, samples, n);
    double maxabs = 0.0;
    for (size_t i = 0; i < n; i++) {
        assert_true(fabs(samples[i]) <= l);
        maxabs = fmax(maxabs, fabs(samples[i]));
    }
    assert_true(maxabs > 0.999 * l);
    double mean, var;
    moments(samples, n, &mean, &var);
    assert_true(fabs(mean) < 0.002);                     /* stderr 0.034/sqrt(n) = 1.3e-4 */
    assert_true(fabs(var / (l * l / 3.0) - 1.0) < 0.02); /* U(-l, l) variance l^2/3 */

    /* 2-d [4, 6]: l = sqrt(6/10) */
    const uint64_t s2[] = {4, 6};
    float out[24];
    initializer_fill(&p, s2, 2, 0, out, 24);
    for (int i = 0; i < 24; i++)
        assert_true(fabs(out[i]) <= sqrt(0.6));
    /* an empty variable is valid (nothing to fill) */
    const uint64_t s0[] = {0, 5};
    assert_int_equal(initializer_validate(&p, s0, 2, NULL, 0), 0);
}

/* Filling [0, N) at once equals filling it in uneven pieces, bit for bit, for
 * every kind: values depend on the element index only. */
static void test_shard_independence(void **state)
{
    (void)state;
    enum { N = 10007 };
    static float whole[N], pieces[N];
    const uint64_t shape[] = {97, 103, 1}; /* 9991 elements; indices past it still defined */
    const initializer_params ps[] = {
        make(INITIALIZER_ZEROS, 0, 0, 1),           make(INITIALIZER_CONSTANT, 3.25, 0, 1),
        make(INITIALIZER_UNIFORM, -1, 1, 11),       make(INITIALIZER_NORMAL, 0, 1, 12),
        make(INITIALIZER_GLOROT_UNIFORM, 0, 0, 13),
    };
    /* uneven pieces: [0, 1), [1, 4001), [4001, N) */
    const size_t cut[] = {0, 1, 4001, N};
    for (size_t k = 0; k < sizeof(ps) / sizeof(ps[0]); k++) {
        memset(whole, 0xff, sizeof(whole));
        memset(pieces, 0, sizeof(pieces));
        initializer_fill(&ps[k], shape, 3, 0, whole, N);
        for (int c = 0; c < 3; c++)
            initializer_fill(&ps[k], shape, 3, cut[c], pieces + cut[c], cut[c + 1] - cut[c]);
        assert_memory_equal(whole, pieces, sizeof(whole));
        /* and element by element, from the far end */
        for (size_t i = N; i-- > N - 50;) {
            float one;
            initializer_fill(&ps[k], shape, 3, i, &one, 1);
            assert_memory_equal(&one, &whole[i], sizeof(one));
        }
    }
    /* a large offset (a shard deep into a huge variable) is just another index */
    float far1[4], far2[2];
    const initializer_params u = make(INITIALIZER_UNIFORM, 0, 1, 5);
    initializer_fill(&u, NULL, 0, UINT64_C(1) << 40, far1, 4);
    initializer_fill(&u, NULL, 0, (UINT64_C(1) << 40) + 2, far2, 2);
    assert_memory_equal(far1 + 2, far2, sizeof(far2));
}

static void test_seeds(void **state)
{
    (void)state;
    enum { N = 1000 };
    static float x[N], y[N], z[N];
    const initializer_kind kinds[] = {INITIALIZER_UNIFORM, INITIALIZER_NORMAL,
                                      INITIALIZER_GLOROT_UNIFORM};
    const uint64_t shape[] = {10, 100};
    for (size_t k = 0; k < 3; k++) {
        initializer_params p = make(kinds[k], 0.0, 1.0, 1234);
        initializer_fill(&p, shape, 2, 0, x, N);
        initializer_fill(&p, shape, 2, 0, y, N);
        assert_memory_equal(x, y, sizeof(x)); /* same seed: same values */
        p.seed = 1235;
        initializer_fill(&p, shape, 2, 0, z, N);
        int same = 0;
        for (int i = 0; i < N; i++)
            same += x[i] == z[i];
        assert_true(same < 5); /* different seed: different values */
        /* neighbouring elements differ too (no stuck generator) */
        int repeats = 0;
        for (int i = 0; i + 1 < N; i++)
            repeats += x[i] == x[i + 1];
        assert_true(repeats < 5);
    }
}

/* Regression pin: the generator defines the initial model. Changing it silently
 * changes every freshly created variable, so the first uniform values of seed 0
 * are fixed here (recorded from this implementation; uniform values use only
 * exact double arithmetic, so they are the same on every platform). */
static void test_uniform_golden(void **state)
{
    (void)state;
    initializer_params p = make(INITIALIZER_UNIFORM, 0.0, 1.0, 0);
    float out[4];
    initializer_fill(&p, NULL, 0, 0, out, 4);
    const float golden[4] = {0x1.0f36bep-1f, 0x1.88614p-3f, 0x1.b139f2p-1f, 0x1.56027ap-3f};
    for (int i = 0; i < 4; i++) {
        if (out[i] != golden[i]) {
            print_error("out[%d] = %a, want %a\n", i, (double)out[i], (double)golden[i]);
            fail();
        }
    }
}

/* Expects validation to fail with a message containing `field`. */
static void expect_invalid(const initializer_params *p, const uint64_t *shape, size_t ndims,
                           const char *field)
{
    char err[256] = "";
    assert_int_equal(initializer_validate(p, shape, ndims, err, sizeof(err)), -1);
    if (strstr(err, field) == NULL) {
        print_error("message \"%s\" does not name \"%s\"\n", err, field);
        fail();
    }
}

static void test_validate(void **state)
{
    (void)state;
    initializer_params p;
    p = make(INITIALIZER_UNIFORM, 1.0, 1.0, 0);
    expect_invalid(&p, NULL, 0, "b = 1"); /* a == b */
    p = make(INITIALIZER_UNIFORM, 2.0, 1.0, 0);
    expect_invalid(&p, NULL, 0, "b = 1"); /* a > b */
    p = make(INITIALIZER_UNIFORM, NAN, 1.0, 0);
    expect_invalid(&p, NULL, 0, "a = nan");
    p = make(INITIALIZER_UNIFORM, 0.0, INFINITY, 0);
    expect_invalid(&p, NULL, 0, "b = inf");
    p = make(INITIALIZER_UNIFORM, 0.0, 1e39, 0); /* beyond float32 */
    expect_invalid(&p, NULL, 0, "b = 1e+39");
    p = make(INITIALIZER_UNIFORM, 1.0, 1.0 + 1e-12, 0); /* no float in [a, b)? 1.0 is */
    assert_int_equal(initializer_validate(&p, NULL, 0, NULL, 0), 0);
    p = make(INITIALIZER_UNIFORM, 1.0 + 1e-12, 1.0 + 2e-12, 0); /* no float in between */
    expect_invalid(&p, NULL, 0, "no float32");
    p = make(INITIALIZER_NORMAL, 0.0, 0.0, 0);
    expect_invalid(&p, NULL, 0, "b = 0");
    p = make(INITIALIZER_NORMAL, 0.0, -1.0, 0);
    expect_invalid(&p, NULL, 0, "b = -1");
    p = make(INITIALIZER_NORMAL, 0.0, NAN, 0);
    expect_invalid(&p, NULL, 0, "b = nan");
    p = make(INITIALIZER_NORMAL, INFINITY, 1.0, 0);
    expect_invalid(&p, NULL, 0, "a = inf");
    p = make(INITIALIZER_NORMAL, 0.0, 1e38, 0); /* 8.6 sigma overflows float32 */
    expect_invalid(&p, NULL, 0, "b = 1e+38");
    p = make(INITIALIZER_CONSTANT, 1e300, 0.0, 0);
    expect_invalid(&p, NULL, 0, "a = 1e+300");
    p = make(INITIALIZER_CONSTANT, -INFINITY, 0.0, 0);
    expect_invalid(&p, NULL, 0, "a = -inf");
    p = make(INITIALIZER_CONSTANT, FLT_MAX, 0.0, 0);
    assert_int_equal(initializer_validate(&p, NULL, 0, NULL, 0), 0);
    p = make((initializer_kind)9, 0.0, 1.0, 0);
    expect_invalid(&p, NULL, 0, "kind = 9");
    p = make(INITIALIZER_GLOROT_UNIFORM, 0.0, 0.0, 0);
    expect_invalid(&p, NULL, 2, "shape");
    expect_invalid(NULL, NULL, 0, "params");
    assert_int_equal(initializer_validate(NULL, NULL, 0, NULL, 0), -1);
    /* a, b are ignored by zeros and glorot */
    p = make(INITIALIZER_ZEROS, NAN, -INFINITY, 0);
    assert_int_equal(initializer_validate(&p, NULL, 0, NULL, 0), 0);
    /* tiny buffer: truncated, NUL-terminated */
    char small[5] = "xxxx";
    p = make(INITIALIZER_NORMAL, 0.0, -1.0, 0);
    assert_int_equal(initializer_validate(&p, NULL, 0, small, sizeof(small)), -1);
    assert_int_equal(small[4], '\0');
    assert_int_equal(strlen(small), 4);
}

static void test_names(void **state)
{
    (void)state;
    const char *names[] = {"zeros", "constant", "uniform", "normal", "glorot_uniform"};
    for (int k = 0; k < INITIALIZER_KIND_COUNT; k++) {
        initializer_kind out = INITIALIZER_ZEROS;
        assert_string_equal(initializer_name((initializer_kind)k), names[k]);
        assert_int_equal(initializer_parse(names[k], &out), 0);
        assert_int_equal(out, k);
    }
    initializer_kind out = INITIALIZER_NORMAL;
    assert_int_equal(initializer_parse("Glorot_Uniform", &out), 0);
    assert_int_equal(out, INITIALIZER_GLOROT_UNIFORM);
    out = INITIALIZER_NORMAL;
    assert_int_equal(initializer_parse("glorot", &out), -1);
    assert_int_equal(initializer_parse("zeros ", &out), -1);
    assert_int_equal(initializer_parse("", &out), -1);
    assert_int_equal(initializer_parse(NULL, &out), -1);
    assert_int_equal(initializer_parse("zeros", NULL), -1);
    assert_int_equal(out, INITIALIZER_NORMAL);
    assert_string_equal(initializer_name((initializer_kind)5), "unknown");
    assert_string_equal(initializer_name((initializer_kind)-3), "unknown");
}

/* Unvalidated or NULL arguments never crash. */
static void test_bad_fill_args(void **state)
{
    (void)state;
    float out[4] = {1, 1, 1, 1};
    initializer_params p = make(INITIALIZER_UNIFORM, 0.0, 1.0, 0);
    initializer_fill(NULL, NULL, 0, 0, out, 4);
    initializer_fill(&p, NULL, 0, 0, NULL, 4);
    assert_true(out[0] == 1.0f);
    p = make((initializer_kind)77, 0.0, 1.0, 0);
    initializer_fill(&p, NULL, 0, 0, out, 4); /* unknown kind: zeros */
    assert_true(out[0] == 0.0f && out[3] == 0.0f);
    p = make(INITIALIZER_GLOROT_UNIFORM, 0.0, 0.0, 0);
    initializer_fill(&p, NULL, 3, 0, out, 4); /* NULL shape: no crash, finite values */
    assert_true(isfinite(out[0]));
    p = make(INITIALIZER_UNIFORM, NAN, INFINITY, 0);
    initializer_fill(&p, NULL, 0, 0, out, 4);
    p = make(INITIALIZER_NORMAL, 0.0, -1.0, 0);
    initializer_fill(&p, NULL, 0, 0, out, 4);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_zeros_constant),
        cmocka_unit_test(test_uniform),
        cmocka_unit_test(test_uniform_narrow),
        cmocka_unit_test(test_normal),
        cmocka_unit_test(test_fan),
        cmocka_unit_test(test_glorot),
        cmocka_unit_test(test_shard_independence),
        cmocka_unit_test(test_seeds),
        cmocka_unit_test(test_uniform_golden),
        cmocka_unit_test(test_validate),
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_bad_fill_args),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
