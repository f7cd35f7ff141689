/* backend_cpu.c - the CPU implementation of backend.h (OpenBLAS cblas_sgemm).
 *
 * "Device" buffers are 64-byte aligned host memory, every op runs to
 * completion before it returns, so sync and events are no-ops. OpenBLAS runs
 * with opts->blas_threads threads (1 by default: several workers share a
 * machine, and one BLAS thread pool each would fight for the cores). */
#include "backend.h"

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

typedef struct cpu_backend {
    backend base;
} cpu_backend;

typedef struct cpu_buf {
    backend_buf base;
    void *data;
} cpu_buf;

struct backend_event {
    int unused;
};

static float *fdata(const backend_buf *b)
{
    return (float *)((const cpu_buf *)b)->data;
}

static void *aligned(size_t bytes)
{
    void *p = NULL;
    /* posix_memalign(0) may return NULL; always ask for at least one line. */
    size_t sz = (bytes + 63) & ~(size_t)63;
    if (sz < bytes)
        return NULL;
    if (posix_memalign(&p, 64, sz == 0 ? 64 : sz) != 0)
        return NULL;
    return p;
}

static void cpu_close(backend *be)
{
    free(be);
}

static int cpu_buf_alloc(backend *be, size_t bytes, backend_buf **out)
{
    cpu_buf *b = malloc(sizeof(*b));
    if (b == NULL)
        return backend_fail(be, BACKEND_ENOMEM, "out of memory");
    b->data = aligned(bytes);
    if (b->data == NULL) {
        free(b);
        return backend_fail(be, BACKEND_ENOMEM, "out of memory allocating %zu bytes", bytes);
    }
    b->base.bytes = bytes;
    *out = &b->base;
    return 0;
}

static void cpu_buf_free(backend *be, backend_buf *buf)
{
    cpu_buf *b = (cpu_buf *)buf;
    free(b->data);
    free(b);
}

static void *cpu_host_alloc(backend *be, size_t bytes)
{
    return aligned(bytes);
}

static void cpu_host_free(backend *be, void *p)
{
    free(p);
}

static int cpu_upload(backend *be, backend_buf *buf, size_t off, const void *src, size_t bytes)
{
    char *dst = (char *)((cpu_buf *)buf)->data + off;
    if (bytes != 0 && dst != src) /* src may be the buffer itself (backend_buf_host_ptr) */
        memcpy(dst, src, bytes);
    return 0;
}

static void *cpu_host_ptr(backend *be, backend_buf *buf)
{
    (void)be;
    return ((cpu_buf *)buf)->data;
}

static int cpu_download(backend *be, const backend_buf *buf, size_t off, void *dst, size_t bytes)
{
    const char *src = (const char *)((const cpu_buf *)buf)->data + off;
    if (bytes != 0 && dst != src)
        memcpy(dst, src, bytes);
    return 0;
}

static int cpu_memset_zero(backend *be, backend_buf *buf, size_t off, size_t bytes)
{
    if (bytes != 0)
        memset((char *)((cpu_buf *)buf)->data + off, 0, bytes);
    return 0;
}

static int cpu_sync(backend *be)
{
    return 0;
}

static int cpu_event_create(backend *be, backend_event **out)
{
    *out = malloc(sizeof(**out));
    if (*out == NULL)
        return backend_fail(be, BACKEND_ENOMEM, "out of memory");
    return 0;
}

static void cpu_event_destroy(backend *be, backend_event *ev)
{
    free(ev);
}

static int cpu_event_record(backend *be, backend_event *ev)
{
    return 0;
}

static int cpu_event_wait(backend *be, backend_event *ev)
{
    return 0;
}

static int cpu_gemm(backend *be, bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                    const backend_buf *a, const backend_buf *b, float beta, backend_buf *c)
{
    float *C = fdata(c);
    if (k == 0) {
        /* BLAS leaves C untouched for k == 0 only when beta == 1; define it fully. */
        for (size_t i = 0; i < (size_t)m * (size_t)n; i++)
            C[i] = beta == 0.0f ? 0.0f : beta * C[i];
        return 0;
    }
    /* BLAS semantics: with beta == 0, C is not read (NaN in it does not leak); the unit tests
     * check that OpenBLAS keeps to it. */
    int lda = trans_a ? m : k;
    int ldb = trans_b ? k : n;
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, fdata(a), lda, fdata(b), ldb,
                beta, C, n);
    return 0;
}

static int cpu_bias_add(backend *be, backend_buf *y, const backend_buf *bias, int m, int n)
{
    float *Y = fdata(y);
    const float *bv = fdata(bias);
    for (int i = 0; i < m; i++) {
        float *row = Y + (size_t)i * (size_t)n;
        for (int j = 0; j < n; j++)
            row[j] += bv[j];
    }
    return 0;
}

static int cpu_col_sum(backend *be, const backend_buf *x, int m, int n, float alpha, float beta,
                       backend_buf *out)
{
    const float *X = fdata(x);
    float *o = fdata(out);
    /* Row-wise accumulation keeps the inner loop contiguous (vectorizable). */
    float *acc = calloc((size_t)n, sizeof(float));
    if (acc == NULL)
        return backend_fail(be, BACKEND_ENOMEM, "out of memory");
    for (int i = 0; i < m; i++) {
        const float *row = X + (size_t)i * (size_t)n;
        for (int j = 0; j < n; j++)
            acc[j] += row[j];
    }
    for (int j = 0; j < n; j++)
        o[j] = alpha * acc[j] + (beta == 0.0f ? 0.0f : beta * o[j]);
    free(acc);
    return 0;
}

static int cpu_act_forward(backend *be, backend_act act, const backend_buf *x, backend_buf *y,
                           size_t n)
{
    const float *X = fdata(x);
    float *Y = fdata(y);
    switch (act) {
    case BACKEND_ACT_RELU:
        for (size_t i = 0; i < n; i++)
            Y[i] = X[i] > 0.0f ? X[i] : 0.0f;
        break;
    case BACKEND_ACT_TANH:
        for (size_t i = 0; i < n; i++)
            Y[i] = tanhf(X[i]);
        break;
    case BACKEND_ACT_IDENTITY:
        if (X != Y)
            memmove(Y, X, n * sizeof(float));
        break;
    }
    return 0;
}

static int cpu_act_backward(backend *be, backend_act act, const backend_buf *y,
                            const backend_buf *dy, backend_buf *dx, size_t n)
{
    const float *Y = fdata(y);
    const float *dY = fdata(dy);
    float *dX = fdata(dx);
    switch (act) {
    case BACKEND_ACT_RELU:
        /* Both loads unconditional, so that the select vectorizes instead of branching on
         * the (random) sign of every activation. */
        for (size_t i = 0; i < n; i++) {
            float g = dY[i];
            dX[i] = Y[i] > 0.0f ? g : 0.0f;
        }
        break;
    case BACKEND_ACT_TANH:
        for (size_t i = 0; i < n; i++)
            dX[i] = dY[i] * (1.0f - Y[i] * Y[i]);
        break;
    case BACKEND_ACT_IDENTITY:
        if (dX != dY)
            memmove(dX, dY, n * sizeof(float));
        break;
    }
    return 0;
}

static int cpu_softmax_xent(backend *be, const backend_buf *logits, const backend_buf *labels,
                            int m, int c, float grad_scale, backend_buf *dlogits, backend_buf *loss,
                            backend_buf *correct)
{
    const float *Z = fdata(logits);
    const int32_t *lab = (const int32_t *)((const cpu_buf *)labels)->data;
    float *dZ = dlogits != NULL ? fdata(dlogits) : NULL;
    double loss_sum = 0.0;
    double n_correct = 0.0;
    for (int i = 0; i < m; i++) {
        const float *z = Z + (size_t)i * (size_t)c;
        float *dz = dZ != NULL ? dZ + (size_t)i * (size_t)c : NULL;
        int32_t y = lab[i];
        bool valid = y >= 0 && y < c;
        float zmax = z[0];
        int amax = 0;
        for (int j = 1; j < c; j++) {
            if (z[j] > zmax) {
                zmax = z[j];
                amax = j;
            }
        }
        double sum = 0.0;
        for (int j = 0; j < c; j++)
            sum += exp((double)z[j] - (double)zmax);
        double log_sum = log(sum);
        if (valid) {
            loss_sum += log_sum - ((double)z[y] - (double)zmax);
            if (amax == y)
                n_correct += 1.0;
        }
        if (dz != NULL) {
            /* dz may alias z: every read of z for this row happened above, except the
             * exponent below, which reads z[j] before writing dz[j]. */
            for (int j = 0; j < c; j++) {
                double p = exp((double)z[j] - (double)zmax - log_sum);
                double g = valid ? p - (j == y ? 1.0 : 0.0) : 0.0;
                dz[j] = (float)(grad_scale * g);
            }
        }
    }
    if (loss != NULL)
        fdata(loss)[0] = (float)loss_sum;
    if (correct != NULL)
        fdata(correct)[0] = (float)n_correct;
    return 0;
}

static int cpu_axpy(backend *be, size_t n, float alpha, const backend_buf *x, backend_buf *y)
{
    const float *X = fdata(x);
    float *Y = fdata(y);
    for (size_t i = 0; i < n; i++)
        Y[i] += alpha * X[i];
    return 0;
}

static int cpu_scale(backend *be, size_t n, float alpha, backend_buf *x)
{
    float *X = fdata(x);
    for (size_t i = 0; i < n; i++)
        X[i] *= alpha;
    return 0;
}

static int cpu_sum_squares(backend *be, const backend_buf *x, size_t n, float alpha, float beta,
                           backend_buf *out)
{
    const float *X = fdata(x);
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        s += (double)X[i] * (double)X[i];
    float *o = fdata(out);
    o[0] = (float)(alpha * s + (beta == 0.0f ? 0.0 : (double)beta * (double)o[0]));
    return 0;
}

/* The row number idx holds, or -1 when it names no row of r (padding). */
static inline long embbag_row(float v, int r)
{
    return v >= 0.0f && v < (float)r ? (long)v : -1;
}

static int cpu_embbag_forward(backend *be, const backend_buf *idx, const backend_buf *rows, int m,
                              int s, int r, int d, bool mean, backend_buf *y)
{
    (void)be;
    const float *ix = fdata(idx), *R = fdata(rows);
    float *Y = fdata(y);
    for (int i = 0; i < m; i++) {
        float *yi = Y + (size_t)i * (size_t)d;
        memset(yi, 0, (size_t)d * sizeof(float));
        int count = 0;
        for (int j = 0; j < s; j++) {
            long row = embbag_row(ix[(size_t)i * (size_t)s + (size_t)j], r);
            if (row < 0)
                continue;
            const float *src = R + (size_t)row * (size_t)d;
            for (int k = 0; k < d; k++)
                yi[k] += src[k];
            count++;
        }
        if (mean && count > 1)
            for (int k = 0; k < d; k++)
                yi[k] /= (float)count;
    }
    return 0;
}

static int cpu_embbag_backward(backend *be, const backend_buf *idx, const backend_buf *dy, int m,
                               int s, int r, int d, bool mean, backend_buf *drows)
{
    (void)be;
    const float *ix = fdata(idx), *dY = fdata(dy);
    float *dR = fdata(drows);
    memset(dR, 0, (size_t)r * (size_t)d * sizeof(float));
    for (int i = 0; i < m; i++) {
        const float *iv = ix + (size_t)i * (size_t)s;
        int count = 0;
        for (int j = 0; j < s; j++)
            count += embbag_row(iv[j], r) >= 0;
        if (count == 0)
            continue;
        float w = mean ? 1.0f / (float)count : 1.0f;
        const float *g = dY + (size_t)i * (size_t)d;
        for (int j = 0; j < s; j++) {
            long row = embbag_row(iv[j], r);
            if (row < 0)
                continue;
            float *dst = dR + (size_t)row * (size_t)d;
            for (int k = 0; k < d; k++)
                dst[k] += w * g[k];
        }
    }
    return 0;
}

static const backend_vtable cpu_vtable = {
    .name = "cpu",
    .close = cpu_close,
    .buf_alloc = cpu_buf_alloc,
    .buf_free = cpu_buf_free,
    .host_alloc = cpu_host_alloc,
    .host_free = cpu_host_free,
    .upload = cpu_upload,
    .download = cpu_download,
    .host_ptr = cpu_host_ptr,
    .memset_zero = cpu_memset_zero,
    .sync = cpu_sync,
    .event_create = cpu_event_create,
    .event_destroy = cpu_event_destroy,
    .event_record = cpu_event_record,
    .event_wait = cpu_event_wait,
    .gemm = cpu_gemm,
    .bias_add = cpu_bias_add,
    .col_sum = cpu_col_sum,
    .act_forward = cpu_act_forward,
    .act_backward = cpu_act_backward,
    .softmax_xent = cpu_softmax_xent,
    .axpy = cpu_axpy,
    .scale = cpu_scale,
    .sum_squares = cpu_sum_squares,
    .embbag_forward = cpu_embbag_forward,
    .embbag_backward = cpu_embbag_backward,
};

const char *backend_cpu_blas_core(void)
{
#ifdef WORKER_HAVE_OPENBLAS_THREADS
    const char *name = openblas_get_corename();
    return name != NULL ? name : "";
#else
    return "";
#endif
}

const char *backend_cpu_better_coretype(void)
{
#if defined(WORKER_HAVE_OPENBLAS_THREADS) && (defined(__x86_64__) || defined(__i386__))
    if (getenv("OPENBLAS_CORETYPE") != NULL)
        return NULL;
    const char *core = backend_cpu_blas_core();
    /* The generic fallbacks of OpenBLAS's dynamic-arch x86 builds. */
    static const char *const fallbacks[] = {"Prescott", "Core2",      "Nehalem", "Sandybridge",
                                            "Penryn",   "Dunnington", "Atom"};
    bool fallback = false;
    for (size_t i = 0; i < sizeof(fallbacks) / sizeof(fallbacks[0]); i++)
        fallback = fallback || strcasecmp(core, fallbacks[i]) == 0;
    if (!fallback)
        return NULL;
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
        return "SkylakeX";
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        strcasecmp(core, "Haswell") != 0)
        return "Haswell";
    return NULL;
#else
    return NULL;
#endif
}

int backend_cpu_create(const backend_options *opts, backend **out, char *err, size_t errlen)
{
    if (opts->blas_threads < 1) {
        if (err != NULL && errlen > 0)
            snprintf(err, errlen, "blas threads must be >= 1 (got %d)", opts->blas_threads);
        return BACKEND_EINVAL;
    }
    cpu_backend *cb = calloc(1, sizeof(*cb));
    if (cb == NULL) {
        if (err != NULL && errlen > 0)
            snprintf(err, errlen, "out of memory");
        return BACKEND_ENOMEM;
    }
    cb->base.vt = &cpu_vtable;
#ifdef WORKER_HAVE_OPENBLAS_THREADS
    openblas_set_num_threads(opts->blas_threads);
#endif
    *out = &cb->base;
    return 0;
}
