/* CUDA conformance: every op of backend.h, and one whole training step, on the CPU
 * and on CUDA agree within 1e-4 relative error.
 *
 * Inputs are random and fresh each run (the seed comes from the clock and is
 * printed; PS_TEST_SEED=N repeats a run), uniform in +-[0.05, 1] so that no
 * input is zero. The relative error of a result is
 *     max_i |cuda_i - cpu_i| / max_i |cpu_i|
 * for ops, and the same in the 2-norm for the training step's gradients (a
 * pre-activation within rounding of zero may take the other side of relu on
 * the two devices; the 2-norm keeps one such element from deciding the test).
 *
 * Without a device (or in a build without the CUDA backend) the program prints
 * why and exits 77, which meson reports as skipped. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "backend.h"
#include "hash.h"
#include "model.h"

#define TOL 1e-4
#define SKIP_EXIT 77

static backend *cpu, *gpu;
static uint64_t rng_state, run_seed;

static uint64_t next_u64(void)
{
    return splitmix64_next(&rng_state);
}

/* Uniform in [0.05, 1] with a random sign: never zero. */
static float rnd(void)
{
    double u = (double)(next_u64() >> 11) * (1.0 / 9007199254740992.0);
    float v = (float)(0.05 + 0.95 * u);
    return (next_u64() & 1) ? v : -v;
}

static float *rnd_array(size_t n)
{
    float *a = malloc((n ? n : 1) * sizeof(float));
    assert_non_null(a);
    for (size_t i = 0; i < n; i++)
        a[i] = rnd();
    return a;
}

/* A pair of device buffers (CPU, CUDA) holding the same bytes. */
typedef struct pair {
    backend_buf *c, *g;
    size_t bytes;
} pair;

static pair pair_new(const void *host, size_t bytes)
{
    pair p = {NULL, NULL, bytes};
    assert_int_equal(backend_buf_alloc(cpu, bytes, &p.c), 0);
    assert_int_equal(backend_buf_alloc(gpu, bytes, &p.g), 0);
    if (host != NULL) {
        assert_int_equal(backend_upload(cpu, p.c, 0, host, bytes), 0);
        assert_int_equal(backend_upload(gpu, p.g, 0, host, bytes), 0);
    }
    return p;
}

static pair pair_rnd(size_t n, float **host_out)
{
    float *h = rnd_array(n);
    pair p = pair_new(h, n * sizeof(float));
    if (host_out != NULL)
        *host_out = h;
    else
        free(h);
    return p;
}

static void pair_free(pair *p)
{
    backend_buf_free(cpu, p->c);
    backend_buf_free(gpu, p->g);
}

/* Downloads both and returns the relative error (max norm); fails on NaN or a size mismatch. */
static double pair_relerr(const pair *p, const char *what)
{
    size_t n = p->bytes / sizeof(float);
    float *a = malloc((n ? n : 1) * sizeof(float)), *b = malloc((n ? n : 1) * sizeof(float));
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal(backend_download(cpu, p->c, 0, a, p->bytes), 0);
    assert_int_equal(backend_sync(cpu), 0);
    assert_int_equal(backend_download(gpu, p->g, 0, b, p->bytes), 0);
    assert_int_equal(backend_sync(gpu), 0);
    double maxref = 0.0, maxdiff = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i]) || isnan(b[i]))
            fail_msg("%s: element %zu is NaN (cpu %g, cuda %g)", what, i, a[i], b[i]);
        maxref = fmax(maxref, fabs((double)a[i]));
        maxdiff = fmax(maxdiff, fabs((double)a[i] - (double)b[i]));
    }
    free(a);
    free(b);
    return maxref > 0.0 ? maxdiff / maxref : maxdiff;
}

static void expect_close(const pair *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void expect_close(const pair *p, const char *fmt, ...)
{
    char what[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    double e = pair_relerr(p, what);
    if (!(e <= TOL))
        fail_msg("%s: relative error %.3g > %g (PS_TEST_SEED=%llu)", what, e, TOL,
                 (unsigned long long)run_seed);
}

static void test_copies(void **state)
{
    /* Uploads and downloads at offsets, and memset_zero of a middle range. */
    size_t n = 1000;
    float *h = rnd_array(n);
    pair p = pair_new(NULL, n * sizeof(float));
    assert_int_equal(backend_upload(cpu, p.c, 0, h, n * sizeof(float)), 0);
    assert_int_equal(backend_upload(gpu, p.g, 0, h, 100 * sizeof(float)), 0);
    assert_int_equal(
        backend_upload(gpu, p.g, 100 * sizeof(float), h + 100, (n - 100) * sizeof(float)), 0);
    expect_close(&p, "upload at an offset");
    assert_int_equal(backend_memset_zero(cpu, p.c, 40, 400), 0);
    assert_int_equal(backend_memset_zero(gpu, p.g, 40, 400), 0);
    expect_close(&p, "memset_zero");
    float part[10];
    assert_int_equal(backend_download(gpu, p.g, 500 * sizeof(float), part, sizeof(part)), 0);
    assert_int_equal(backend_sync(gpu), 0);
    assert_memory_equal(part, h + 500, sizeof(part));
    pair_free(&p);
    free(h);
}

static void test_gemm(void **state)
{
    /* Shapes of the worker's layers (784 inputs, odd sizes, k = 1) in all four transpositions,
     * with beta 0 over a NaN-free random C and beta 1 (accumulate). */
    static const int shapes[][3] = {{64, 256, 784}, {37, 53, 71}, {128, 10, 128}, {5, 7, 1}};
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        int m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
        for (int t = 0; t < 4; t++) {
            bool ta = t & 1, tb = (t >> 1) & 1;
            for (int bi = 0; bi < 2; bi++) {
                float beta = bi == 0 ? 0.0f : 1.0f;
                float alpha = 0.5f + (float)fabs(rnd());
                pair a = pair_rnd((size_t)m * k, NULL), b = pair_rnd((size_t)k * n, NULL);
                pair c = pair_rnd((size_t)m * n, NULL);
                assert_int_equal(backend_gemm(cpu, ta, tb, m, n, k, alpha, a.c, b.c, beta, c.c), 0);
                assert_int_equal(backend_gemm(gpu, ta, tb, m, n, k, alpha, a.g, b.g, beta, c.g), 0);
                expect_close(&c, "gemm m=%d n=%d k=%d%s%s beta=%g", m, n, k, ta ? " A^T" : "",
                             tb ? " B^T" : "", beta);
                pair_free(&a);
                pair_free(&b);
                pair_free(&c);
            }
        }
    }
}

static void test_bias_and_col_sum(void **state)
{
    int m = 129, n = 300;
    pair y = pair_rnd((size_t)m * n, NULL), bias = pair_rnd((size_t)n, NULL);
    assert_int_equal(backend_bias_add(cpu, y.c, bias.c, m, n), 0);
    assert_int_equal(backend_bias_add(gpu, y.g, bias.g, m, n), 0);
    expect_close(&y, "bias_add");
    pair out = pair_rnd((size_t)n, NULL);
    float alpha = 1.0f / (float)m, beta = 0.75f;
    assert_int_equal(backend_col_sum(cpu, y.c, m, n, alpha, beta, out.c), 0);
    assert_int_equal(backend_col_sum(gpu, y.g, m, n, alpha, beta, out.g), 0);
    expect_close(&out, "col_sum beta=%g", beta);
    assert_int_equal(backend_col_sum(cpu, y.c, m, n, 1.0f, 0.0f, out.c), 0);
    assert_int_equal(backend_col_sum(gpu, y.g, m, n, 1.0f, 0.0f, out.g), 0);
    expect_close(&out, "col_sum beta=0");
    pair_free(&y);
    pair_free(&bias);
    pair_free(&out);
}

/* Embedding bag: gather-pool forward and scatter backward, sum and mean, with padding, rows
 * shared by many examples (the atomics' collisions) and an example without rows. */
static void test_embbag(void **state)
{
    int m = 300, s = 17, r = 64, d = 40;
    float *idx = malloc((size_t)m * s * sizeof(float));
    assert_non_null(idx);
    for (int i = 0; i < m; i++)
        for (int j = 0; j < s; j++)
            idx[(size_t)i * s + j] =
                i == 5 || next_u64() % 4 == 0 ? -1.0f : (float)(next_u64() % (uint64_t)r);
    pair ix = pair_new(idx, (size_t)m * s * sizeof(float));
    pair rows = pair_rnd((size_t)r * d, NULL), dy = pair_rnd((size_t)m * d, NULL);
    pair y = pair_new(NULL, (size_t)m * d * sizeof(float));
    pair drows = pair_new(NULL, (size_t)r * d * sizeof(float));
    for (int mean = 0; mean < 2; mean++) {
        assert_int_equal(backend_embbag_forward(cpu, ix.c, rows.c, m, s, r, d, mean, y.c), 0);
        assert_int_equal(backend_embbag_forward(gpu, ix.g, rows.g, m, s, r, d, mean, y.g), 0);
        expect_close(&y, "embbag_forward mean=%d", mean);
        assert_int_equal(backend_embbag_backward(cpu, ix.c, dy.c, m, s, r, d, mean, drows.c), 0);
        assert_int_equal(backend_embbag_backward(gpu, ix.g, dy.g, m, s, r, d, mean, drows.g), 0);
        expect_close(&drows, "embbag_backward mean=%d", mean);
    }
    pair_free(&ix);
    pair_free(&rows);
    pair_free(&dy);
    pair_free(&y);
    pair_free(&drows);
    free(idx);
}

static void test_activations(void **state)
{
    static const backend_act acts[] = {BACKEND_ACT_RELU, BACKEND_ACT_TANH, BACKEND_ACT_IDENTITY};
    size_t n = 70001; /* not a multiple of any block size */
    for (size_t i = 0; i < 3; i++) {
        backend_act act = acts[i];
        const char *name = act == BACKEND_ACT_RELU   ? "relu"
                           : act == BACKEND_ACT_TANH ? "tanh"
                                                     : "identity";
        pair x = pair_rnd(n, NULL), y = pair_new(NULL, n * sizeof(float));
        assert_int_equal(backend_act_forward(cpu, act, x.c, y.c, n), 0);
        assert_int_equal(backend_act_forward(gpu, act, x.g, y.g, n), 0);
        expect_close(&y, "%s forward", name);
        /* Backward from the same forward output on both sides. */
        float *yh = malloc(n * sizeof(float));
        assert_non_null(yh);
        assert_int_equal(backend_download(cpu, y.c, 0, yh, n * sizeof(float)), 0);
        assert_int_equal(backend_sync(cpu), 0);
        pair ys = pair_new(yh, n * sizeof(float));
        pair dy = pair_rnd(n, NULL), dx = pair_new(NULL, n * sizeof(float));
        assert_int_equal(backend_act_backward(cpu, act, ys.c, dy.c, dx.c, n), 0);
        assert_int_equal(backend_act_backward(gpu, act, ys.g, dy.g, dx.g, n), 0);
        expect_close(&dx, "%s backward", name);
        /* In place: dX is dY. */
        assert_int_equal(backend_act_backward(cpu, act, ys.c, dy.c, dy.c, n), 0);
        assert_int_equal(backend_act_backward(gpu, act, ys.g, dy.g, dy.g, n), 0);
        expect_close(&dy, "%s backward in place", name);
        /* In place forward: Y is X. */
        assert_int_equal(backend_act_forward(cpu, act, x.c, x.c, n), 0);
        assert_int_equal(backend_act_forward(gpu, act, x.g, x.g, n), 0);
        expect_close(&x, "%s forward in place", name);
        free(yh);
        pair_free(&x);
        pair_free(&y);
        pair_free(&ys);
        pair_free(&dy);
        pair_free(&dx);
    }
}

static void test_softmax_xent(void **state)
{
    static const int shapes[][2] = {{128, 10}, {333, 47}, {7, 1000}, {1, 1}};
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        int m = shapes[s][0], c = shapes[s][1];
        float *zh = rnd_array((size_t)m * c);
        for (size_t i = 0; i < (size_t)m * c; i++)
            zh[i] *= 8.0f; /* logits of a few units, as a trained network has */
        int32_t *yh = malloc((size_t)m * sizeof(int32_t));
        assert_non_null(yh);
        for (int i = 0; i < m; i++)
            yh[i] = (int32_t)(next_u64() % (uint64_t)c);
        pair z = pair_new(zh, (size_t)m * c * sizeof(float));
        pair y = pair_new(yh, (size_t)m * sizeof(int32_t));
        pair dz = pair_new(NULL, (size_t)m * c * sizeof(float));
        pair loss = pair_new(NULL, sizeof(float)), correct = pair_new(NULL, sizeof(float));
        float scale = 1.0f / (float)m;
        assert_int_equal(backend_softmax_xent(cpu, z.c, y.c, m, c, scale, dz.c, loss.c, correct.c),
                         0);
        assert_int_equal(backend_softmax_xent(gpu, z.g, y.g, m, c, scale, dz.g, loss.g, correct.g),
                         0);
        expect_close(&dz, "softmax_xent gradient m=%d c=%d", m, c);
        expect_close(&loss, "softmax_xent loss m=%d c=%d", m, c);
        expect_close(&correct, "softmax_xent correct m=%d c=%d", m, c);
        /* The gradient in place over the logits, without the sums. */
        assert_int_equal(backend_softmax_xent(cpu, z.c, y.c, m, c, scale, z.c, NULL, NULL), 0);
        assert_int_equal(backend_softmax_xent(gpu, z.g, y.g, m, c, scale, z.g, NULL, NULL), 0);
        expect_close(&z, "softmax_xent in place m=%d c=%d", m, c);
        free(zh);
        free(yh);
        pair_free(&z);
        pair_free(&y);
        pair_free(&dz);
        pair_free(&loss);
        pair_free(&correct);
    }
}

static void test_blas1(void **state)
{
    size_t n = 200003;
    pair x = pair_rnd(n, NULL), y = pair_rnd(n, NULL);
    assert_int_equal(backend_axpy(cpu, n, -0.37f, x.c, y.c), 0);
    assert_int_equal(backend_axpy(gpu, n, -0.37f, x.g, y.g), 0);
    expect_close(&y, "axpy");
    assert_int_equal(backend_scale(cpu, n, 1.7f, y.c), 0);
    assert_int_equal(backend_scale(gpu, n, 1.7f, y.g), 0);
    expect_close(&y, "scale");
    pair out = pair_rnd(1, NULL);
    assert_int_equal(backend_sum_squares(cpu, x.c, n, 0.5f, 0.25f, out.c), 0);
    assert_int_equal(backend_sum_squares(gpu, x.g, n, 0.5f, 0.25f, out.g), 0);
    expect_close(&out, "sum_squares beta=0.25");
    assert_int_equal(backend_sum_squares(cpu, y.c, n, 1.0f, 0.0f, out.c), 0);
    assert_int_equal(backend_sum_squares(gpu, y.g, n, 1.0f, 0.0f, out.g), 0);
    expect_close(&out, "sum_squares beta=0");
    pair_free(&x);
    pair_free(&y);
    pair_free(&out);
}

/* ---- one whole training step -------------------------------------------------------------- */

static double l2_relerr(const float *got, const float *want, size_t n)
{
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)got[i] - (double)want[i];
        num += d * d;
        den += (double)want[i] * (double)want[i];
    }
    return den > 0.0 ? sqrt(num / den) : sqrt(num);
}

static void training_step(backend_act act, float l2)
{
    model_config cfg;
    char err[256];
    assert_int_equal(model_parse_layers("784,256,128,10", &cfg, err, sizeof(err)), 0);
    cfg.act = act;
    cfg.l2 = l2;
    int batch = 128;
    model *mc = NULL, *mg = NULL;
    assert_int_equal(model_create(cpu, &cfg, batch, "conf", &mc, err, sizeof(err)), 0);
    assert_int_equal(model_create(gpu, &cfg, batch, "conf", &mg, err, sizeof(err)), 0);
    /* The same random parameters on both: Glorot kernels, random non-zero biases. */
    uint64_t seed = next_u64();
    model_init_glorot(mc, seed);
    model_init_glorot(mg, seed);
    for (int i = 0; i < model_num_params(mc); i++) {
        model_param *pc = model_get_param(mc, i), *pg = model_get_param(mg, i);
        if (!pc->is_kernel)
            for (size_t j = 0; j < pc->numel; j++)
                pc->host[j] = 0.1f * rnd();
        memcpy(pg->host, pc->host, pc->numel * sizeof(float));
    }
    assert_int_equal(model_upload_params(mc), 0);
    assert_int_equal(model_upload_params(mg), 0);
    /* A batch of images in [0, 1] and random labels. */
    float *x = malloc((size_t)batch * 784 * sizeof(float));
    int32_t *y = malloc((size_t)batch * sizeof(int32_t));
    assert_non_null(x);
    assert_non_null(y);
    for (size_t i = 0; i < (size_t)batch * 784; i++)
        x[i] = (float)fabs(rnd());
    for (int i = 0; i < batch; i++)
        y[i] = (int32_t)(next_u64() % 10);
    assert_int_equal(model_set_batch(mc, x, y, batch), 0);
    assert_int_equal(model_set_batch(mg, x, y, batch), 0);
    model_stats sc, sg;
    assert_int_equal(model_train_step(mc, NULL, NULL, &sc), 0);
    assert_int_equal(model_train_step(mg, NULL, NULL, &sg), 0);
    double le = fabs(sg.loss - sc.loss) / fabs(sc.loss);
    if (!(le <= TOL))
        fail_msg("training step loss: cpu %.9g cuda %.9g, relative error %.3g", sc.loss, sg.loss,
                 le);
    assert_true(fabs(sg.correct - sc.correct) <= 1.0);
    for (int i = 0; i < model_num_params(mc); i++) {
        model_param *pc = model_get_param(mc, i), *pg = model_get_param(mg, i);
        double e = l2_relerr(pg->grad_host, pc->grad_host, pc->numel);
        if (!(e <= TOL))
            fail_msg("training step (%s, l2 %g): gradient of %s: relative error %.3g > %g "
                     "(PS_TEST_SEED=%llu)",
                     model_activation_name(act), (double)l2, pc->name, e, TOL,
                     (unsigned long long)run_seed);
    }
    free(x);
    free(y);
    model_destroy(mc);
    model_destroy(mg);
}

static void test_training_step_relu(void **state)
{
    training_step(BACKEND_ACT_RELU, 0.0f);
}

static void test_training_step_tanh_l2(void **state)
{
    training_step(BACKEND_ACT_TANH, 1e-3f);
}

int main(void)
{
    const char *s = getenv("PS_TEST_SEED");
    uint64_t seed = s != NULL ? strtoull(s, NULL, 10) : (uint64_t)time(NULL) ^ (uint64_t)clock();
    rng_state = run_seed = seed;
    char err[512] = "";
    backend_options o;
    backend_options_init(&o);
    int rc = backend_open("cuda", &o, &gpu, NULL, err, sizeof(err));
    if (rc == BACKEND_EUNAVAIL) {
        printf("SKIP: CUDA conformance needs a CUDA device: %s\n", err);
        return SKIP_EXIT;
    }
    if (rc != 0) {
        fprintf(stderr, "cuda backend: %s\n", err);
        return 1;
    }
    if (backend_open("cpu", &o, &cpu, NULL, err, sizeof(err)) != 0) {
        fprintf(stderr, "cpu backend: %s\n", err);
        return 1;
    }
    printf("CUDA conformance on %s; seed %llu (PS_TEST_SEED=%llu repeats it)\n", backend_desc(gpu),
           (unsigned long long)seed, (unsigned long long)seed);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_copies),
        cmocka_unit_test(test_gemm),
        cmocka_unit_test(test_bias_and_col_sum),
        cmocka_unit_test(test_activations),
        cmocka_unit_test(test_embbag),
        cmocka_unit_test(test_softmax_xent),
        cmocka_unit_test(test_blas1),
        cmocka_unit_test(test_training_step_relu),
        cmocka_unit_test(test_training_step_tanh_l2),
    };
    rc = cmocka_run_group_tests(tests, NULL, NULL);
    backend_close(cpu);
    backend_close(gpu);
    return rc;
}
