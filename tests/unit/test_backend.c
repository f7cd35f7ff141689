/* Unit tests of worker/backend*.c: every op of the CPU backend against a naive reference
 * loop, the argument checks, and backend selection by name. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend.h"

static backend *be;
static uint64_t rng = 12345;

static float frand(void)
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng >> 40) & 0xffffff) / (float)0x1000000 * 2.0f - 1.0f;
}

static float *rand_array(size_t n)
{
    float *a = malloc((n ? n : 1) * sizeof(float));
    assert_non_null(a);
    for (size_t i = 0; i < n; i++)
        a[i] = frand();
    return a;
}

static backend_buf *to_dev(const void *host, size_t bytes)
{
    backend_buf *b = NULL;
    assert_int_equal(backend_buf_alloc(be, bytes, &b), 0);
    assert_int_equal(backend_upload(be, b, 0, host, bytes), 0);
    return b;
}

static void from_dev(const backend_buf *b, void *host, size_t bytes)
{
    assert_int_equal(backend_download(be, b, 0, host, bytes), 0);
    assert_int_equal(backend_sync(be), 0);
}

static void assert_close(const float *got, const float *want, size_t n, double tol)
{
    for (size_t i = 0; i < n; i++) {
        double scale = fabs(want[i]) > 1.0 ? fabs(want[i]) : 1.0;
        if (!(fabs((double)got[i] - (double)want[i]) <= tol * scale))
            fail_msg("element %zu: got %.9g, want %.9g", i, got[i], want[i]);
    }
}

static int setup(void **state)
{
    backend_options o;
    backend_options_init(&o);
    char err[256];
    return backend_open("cpu", &o, &be, NULL, err, sizeof(err));
}

static int teardown(void **state)
{
    backend_close(be);
    return 0;
}

static void test_open_by_name(void **state)
{
    backend *b = NULL;
    const char *why = NULL;
    char err[256] = "";
    int rc = backend_open("cuda", NULL, &b, &why, err, sizeof(err));
#ifdef WORKER_HAVE_CUDA
    /* Built with CUDA: a device answers (GPU machines) or the error says why none does. */
    bool have_gpu = rc == 0;
    if (have_gpu) {
        assert_string_equal(backend_name(b), "cuda");
        assert_non_null(strstr(backend_desc(b), "device 0"));
        backend_close(b);
        b = NULL;
    } else {
        assert_int_equal(rc, BACKEND_EUNAVAIL);
        assert_null(b);
        assert_non_null(strstr(err, "CUDA device"));
    }
    /* An ordinal beyond any machine's devices is refused, with or without a GPU. */
    backend_options big;
    backend_options_init(&big);
    big.device_index = 1023;
    assert_int_equal(backend_open("cuda", &big, &b, &why, err, sizeof(err)), BACKEND_EUNAVAIL);
    assert_null(b);
    assert_non_null(strstr(err, "CUDA device"));
#else
    bool have_gpu = false;
    assert_int_equal(rc, BACKEND_EUNAVAIL);
    assert_null(b);
    assert_non_null(strstr(err, "CUDA backend not built"));
#endif
    assert_int_equal(backend_open("tpu", NULL, &b, &why, err, sizeof(err)), BACKEND_EINVAL);
    assert_non_null(strstr(err, "tpu"));
    assert_int_equal(backend_open("auto", NULL, &b, &why, err, sizeof(err)), 0);
    assert_string_equal(backend_name(b), have_gpu ? "cuda" : "cpu");
    assert_non_null(why);
    assert_non_null(strstr(why, have_gpu ? "using cuda" : "using cpu"));
    backend_close(b);
    assert_int_equal(backend_open("cpu", NULL, &b, &why, err, sizeof(err)), 0);
    assert_null(why);
    backend_close(b);
    backend_options o;
    backend_options_init(&o);
    o.blas_threads = 0;
    assert_int_equal(backend_open("cpu", &o, &b, NULL, err, sizeof(err)), BACKEND_EINVAL);
    backend_close(NULL);
}

static void test_memory(void **state)
{
    float host[8] = {1, 2, 3, 4, 5, 6, 7, 8}, out[8];
    backend_buf *b = to_dev(host, sizeof(host));
    assert_int_equal(backend_buf_size(b), sizeof(host));
    assert_int_equal(backend_memset_zero(be, b, 2 * sizeof(float), 3 * sizeof(float)), 0);
    assert_int_equal(backend_upload(be, b, 7 * sizeof(float), host, sizeof(float)), 0);
    from_dev(b, out, sizeof(out));
    float want[8] = {1, 2, 0, 0, 0, 6, 7, 1};
    assert_memory_equal(out, want, sizeof(want));
    /* Ranges outside the buffer are refused and leave it alone. */
    assert_int_equal(backend_upload(be, b, 4, host, sizeof(host)), BACKEND_EINVAL);
    assert_int_equal(backend_download(be, b, sizeof(host) + 1, out, 0), BACKEND_EINVAL);
    assert_int_equal(backend_memset_zero(be, b, SIZE_MAX, 2), BACKEND_EINVAL);
    assert_true(strlen(backend_errmsg(be)) > 0);
    backend_event *ev = NULL;
    assert_int_equal(backend_event_create(be, &ev), 0);
    assert_int_equal(backend_event_wait(be, ev), 0); /* never recorded: complete */
    assert_int_equal(backend_event_record(be, ev), 0);
    assert_int_equal(backend_event_wait(be, ev), 0);
    backend_event_destroy(be, ev);
    void *h = backend_host_alloc(be, 100);
    assert_non_null(h);
    assert_int_equal((uintptr_t)h % 64, 0);
    backend_host_free(be, h);
    backend_buf *z = NULL;
    assert_int_equal(backend_buf_alloc(be, 0, &z), 0);
    backend_buf_free(be, z);
    backend_buf_free(be, b);
    backend_buf_free(be, NULL);
}

/* C = alpha op(A) op(B) + beta C, naively. */
static void ref_gemm(bool ta, bool tb, int m, int n, int k, float alpha, const float *A,
                     const float *B, float beta, float *C)
{
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double s = 0;
            for (int p = 0; p < k; p++) {
                double a = ta ? A[p * m + i] : A[i * k + p];
                double b = tb ? B[j * k + p] : B[p * n + j];
                s += a * b;
            }
            C[i * n + j] = (float)(alpha * s + (beta == 0 ? 0.0 : beta * C[i * n + j]));
        }
}

static void check_gemm(bool ta, bool tb, int m, int n, int k, float alpha, float beta)
{
    float *A = rand_array((size_t)m * k), *B = rand_array((size_t)k * n);
    float *C = rand_array((size_t)m * n), *want = malloc((size_t)m * n * sizeof(float) + 4);
    if (beta == 0.0f && m * n > 0)
        C[0] = NAN; /* must be ignored */
    memcpy(want, C, (size_t)m * n * sizeof(float));
    ref_gemm(ta, tb, m, n, k, alpha, A, B, beta, want);
    backend_buf *a = to_dev(A, (size_t)m * k * 4), *b = to_dev(B, (size_t)k * n * 4);
    backend_buf *c = to_dev(C, (size_t)m * n * 4);
    assert_int_equal(backend_gemm(be, ta, tb, m, n, k, alpha, a, b, beta, c), 0);
    from_dev(c, C, (size_t)m * n * 4);
    assert_close(C, want, (size_t)m * n, 1e-5);
    backend_buf_free(be, a);
    backend_buf_free(be, b);
    backend_buf_free(be, c);
    free(A);
    free(B);
    free(C);
    free(want);
}

static void test_gemm(void **state)
{
    const int shapes[][3] = {{1, 1, 1}, {3, 5, 7}, {17, 9, 33}, {64, 10, 128}, {5, 1, 3}};
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++)
        for (int t = 0; t < 4; t++) {
            check_gemm(t & 1, t & 2, shapes[s][0], shapes[s][1], shapes[s][2], 1.0f, 0.0f);
            check_gemm(t & 1, t & 2, shapes[s][0], shapes[s][1], shapes[s][2], 0.5f, 2.0f);
        }
    check_gemm(false, false, 4, 3, 0, 1.0f, 0.0f); /* k = 0: C = 0 */
    check_gemm(false, false, 4, 3, 0, 1.0f, 3.0f); /* k = 0: C = beta C */
}

static void test_gemm_bad_shapes(void **state)
{
    float h[12] = {0};
    backend_buf *a = to_dev(h, 6 * 4), *b = to_dev(h, 6 * 4), *c = to_dev(h, 4 * 4);
    assert_int_equal(backend_gemm(be, false, false, 2, 2, 3, 1, a, b, 0, c), 0);
    assert_int_equal(backend_gemm(be, false, false, 3, 2, 3, 1, a, b, 0, c), BACKEND_EINVAL);
    assert_int_equal(backend_gemm(be, false, false, 2, 2, 4, 1, a, b, 0, c), BACKEND_EINVAL);
    assert_int_equal(backend_gemm(be, false, false, -1, 2, 3, 1, a, b, 0, c), BACKEND_EINVAL);
    assert_int_equal(backend_gemm(be, false, false, 2, 2, 3, 1, a, b, 0, a), BACKEND_EINVAL);
    assert_int_equal(backend_gemm(be, false, false, 2, 2, 3, 1, NULL, b, 0, c), BACKEND_EINVAL);
    assert_int_equal(backend_gemm(be, false, false, 1 << 30, 1 << 30, 3, 1, a, b, 0, c),
                     BACKEND_EINVAL);
    assert_non_null(strstr(backend_errmsg(be), "gemm"));
    backend_buf_free(be, a);
    backend_buf_free(be, b);
    backend_buf_free(be, c);
}

static void test_bias_and_col_sum(void **state)
{
    const int m = 13, n = 7;
    float *Y = rand_array(m * n), *bias = rand_array(n), want[13 * 7], got[13 * 7];
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++)
            want[i * n + j] = Y[i * n + j] + bias[j];
    backend_buf *y = to_dev(Y, sizeof(got)), *b = to_dev(bias, n * 4);
    assert_int_equal(backend_bias_add(be, y, b, m, n), 0);
    from_dev(y, got, sizeof(got));
    assert_close(got, want, m * n, 1e-6);
    assert_int_equal(backend_bias_add(be, y, b, m, n + 1), BACKEND_EINVAL);

    /* out = alpha * column sums + beta * out */
    float out[7], wsum[7];
    for (int j = 0; j < n; j++) {
        double s = 0;
        for (int i = 0; i < m; i++)
            s += got[i * n + j];
        wsum[j] = (float)(0.5 * s + 2.0 * bias[j]);
    }
    assert_int_equal(backend_col_sum(be, y, m, n, 0.5f, 2.0f, b), 0);
    from_dev(b, out, sizeof(out));
    assert_close(out, wsum, n, 1e-5);
    /* beta 0 ignores NaN */
    float nan1 = NAN;
    assert_int_equal(backend_upload(be, b, 0, &nan1, 4), 0);
    assert_int_equal(backend_col_sum(be, y, m, n, 1.0f, 0.0f, b), 0);
    from_dev(b, out, sizeof(out));
    assert_false(isnan(out[0]));
    backend_buf_free(be, y);
    backend_buf_free(be, b);
    free(Y);
    free(bias);
}

static void test_activations(void **state)
{
    const size_t n = 101;
    float *X = rand_array(n), *dY = rand_array(n), Y[101], want[101], dX[101];
    X[0] = 0.0f; /* relu'(0) = 0 by convention (Y > 0) */
    backend_buf *x = to_dev(X, n * 4), *y = NULL, *dy = to_dev(dY, n * 4), *dx = NULL;
    assert_int_equal(backend_buf_alloc(be, n * 4, &y), 0);
    assert_int_equal(backend_buf_alloc(be, n * 4, &dx), 0);
    for (int a = 0; a < 3; a++) {
        backend_act act = (backend_act)a;
        assert_int_equal(backend_act_forward(be, act, x, y, n), 0);
        from_dev(y, Y, sizeof(Y));
        for (size_t i = 0; i < n; i++)
            want[i] = act == BACKEND_ACT_RELU   ? (X[i] > 0 ? X[i] : 0)
                      : act == BACKEND_ACT_TANH ? tanhf(X[i])
                                                : X[i];
        assert_close(Y, want, n, 1e-6);
        assert_int_equal(backend_act_backward(be, act, y, dy, dx, n), 0);
        from_dev(dx, dX, sizeof(dX));
        for (size_t i = 0; i < n; i++)
            want[i] = act == BACKEND_ACT_RELU   ? (Y[i] > 0 ? dY[i] : 0)
                      : act == BACKEND_ACT_TANH ? dY[i] * (1 - Y[i] * Y[i])
                                                : dY[i];
        assert_close(dX, want, n, 1e-6);
    }
    /* In place. */
    assert_int_equal(backend_act_forward(be, BACKEND_ACT_RELU, x, x, n), 0);
    from_dev(x, Y, sizeof(Y));
    for (size_t i = 0; i < n; i++)
        assert_true(Y[i] >= 0);
    assert_int_equal(backend_act_forward(be, (backend_act)7, x, y, n), BACKEND_EINVAL);
    assert_int_equal(backend_act_forward(be, BACKEND_ACT_RELU, x, y, n + 1), BACKEND_EINVAL);
    backend_buf_free(be, x);
    backend_buf_free(be, y);
    backend_buf_free(be, dy);
    backend_buf_free(be, dx);
    free(X);
    free(dY);
}

static void test_softmax_xent(void **state)
{
    enum { M = 9, C = 5 };
    float *Z = rand_array(M * C);
    for (int i = 0; i < M * C; i++)
        Z[i] *= 5.0f;
    Z[0] = 80.0f; /* large logits must not overflow */
    int32_t lab[M] = {0, 1, 2, 3, 4, 0, 1, 2, 3};
    double loss = 0, correct = 0;
    float want[M * C];
    const float scale = 1.0f / M;
    for (int i = 0; i < M; i++) {
        double mx = Z[i * C];
        int am = 0;
        for (int j = 1; j < C; j++)
            if (Z[i * C + j] > mx) {
                mx = Z[i * C + j];
                am = j;
            }
        double s = 0;
        for (int j = 0; j < C; j++)
            s += exp(Z[i * C + j] - mx);
        loss += -(Z[i * C + lab[i]] - mx - log(s));
        correct += am == lab[i];
        for (int j = 0; j < C; j++)
            want[i * C + j] = (float)(scale * (exp(Z[i * C + j] - mx) / s - (j == lab[i])));
    }
    backend_buf *z = to_dev(Z, sizeof(want)), *l = to_dev(lab, sizeof(lab));
    backend_buf *dz = NULL, *lossb = NULL, *corrb = NULL;
    assert_int_equal(backend_buf_alloc(be, sizeof(want), &dz), 0);
    assert_int_equal(backend_buf_alloc(be, 4, &lossb), 0);
    assert_int_equal(backend_buf_alloc(be, 4, &corrb), 0);
    assert_int_equal(backend_softmax_xent(be, z, l, M, C, scale, dz, lossb, corrb), 0);
    float got[M * C], lg, cg;
    from_dev(dz, got, sizeof(got));
    from_dev(lossb, &lg, 4);
    from_dev(corrb, &cg, 4);
    assert_close(got, want, M * C, 1e-5);
    assert_float_equal(lg, loss, 1e-4 * loss);
    assert_float_equal(cg, correct, 0);
    /* Rows sum to zero gradient. */
    for (int i = 0; i < M; i++) {
        double s = 0;
        for (int j = 0; j < C; j++)
            s += got[i * C + j];
        assert_true(fabs(s) < 1e-6);
    }
    /* Outputs optional; dlogits may alias logits. */
    assert_int_equal(backend_softmax_xent(be, z, l, M, C, scale, NULL, NULL, NULL), 0);
    assert_int_equal(backend_softmax_xent(be, z, l, M, C, scale, z, NULL, NULL), 0);
    from_dev(z, got, sizeof(got));
    assert_close(got, want, M * C, 1e-5);
    /* A label out of range counts as nothing and gets no gradient. */
    int32_t badlab[M] = {0, 1, 2, 3, 4, 0, 1, 2, 99};
    assert_int_equal(backend_upload(be, l, 0, badlab, sizeof(badlab)), 0);
    assert_int_equal(backend_upload(be, z, 0, Z, sizeof(want)), 0);
    assert_int_equal(backend_softmax_xent(be, z, l, M, C, scale, dz, lossb, corrb), 0);
    from_dev(dz, got, sizeof(got));
    for (int j = 0; j < C; j++)
        assert_float_equal(got[8 * C + j], 0.0f, 0);
    assert_int_equal(backend_softmax_xent(be, z, l, M + 1, C, scale, dz, lossb, corrb),
                     BACKEND_EINVAL);
    assert_int_equal(backend_softmax_xent(be, z, l, M, 0, scale, dz, lossb, corrb), BACKEND_EINVAL);
    backend_buf_free(be, z);
    backend_buf_free(be, l);
    backend_buf_free(be, dz);
    backend_buf_free(be, lossb);
    backend_buf_free(be, corrb);
    free(Z);
}

static void test_axpy_scale_sumsq(void **state)
{
    const size_t n = 77;
    float *X = rand_array(n), *Y = rand_array(n), want[77], got[77];
    backend_buf *x = to_dev(X, n * 4), *y = to_dev(Y, n * 4), *s = NULL;
    for (size_t i = 0; i < n; i++)
        want[i] = Y[i] + 0.25f * X[i];
    assert_int_equal(backend_axpy(be, n, 0.25f, x, y), 0);
    from_dev(y, got, sizeof(got));
    assert_close(got, want, n, 1e-6);
    for (size_t i = 0; i < n; i++)
        want[i] *= -3.0f;
    assert_int_equal(backend_scale(be, n, -3.0f, y), 0);
    from_dev(y, got, sizeof(got));
    assert_close(got, want, n, 1e-6);
    double ss = 0;
    for (size_t i = 0; i < n; i++)
        ss += (double)X[i] * X[i];
    assert_int_equal(backend_buf_alloc(be, 4, &s), 0);
    assert_int_equal(backend_memset_zero(be, s, 0, 4), 0);
    assert_int_equal(backend_sum_squares(be, x, n, 0.5f, 0.0f, s), 0);
    assert_int_equal(backend_sum_squares(be, x, n, 1.0f, 1.0f, s), 0);
    float r;
    from_dev(s, &r, 4);
    assert_float_equal(r, 1.5 * ss, 1e-5 * ss);
    assert_int_equal(backend_axpy(be, n + 1, 1.0f, x, y), BACKEND_EINVAL);
    assert_int_equal(backend_sum_squares(be, x, n, 1, 0, NULL), BACKEND_EINVAL);
    backend_buf_free(be, x);
    backend_buf_free(be, y);
    backend_buf_free(be, s);
    free(X);
    free(Y);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_open_by_name),
        cmocka_unit_test(test_memory),
        cmocka_unit_test(test_gemm),
        cmocka_unit_test(test_gemm_bad_shapes),
        cmocka_unit_test(test_bias_and_col_sum),
        cmocka_unit_test(test_activations),
        cmocka_unit_test(test_softmax_xent),
        cmocka_unit_test(test_axpy_scale_sumsq),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
