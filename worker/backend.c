/* backend.c - selection by name and the generic argument checks of backend.h.
 *
 * Every public op checks its shapes against the buffer sizes here, once, so
 * that a caller bug is an error return and never an out-of-bounds access in
 * an implementation. */
#include "backend.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "util.h"

void backend_options_init(backend_options *o)
{
    memset(o, 0, sizeof(*o));
    o->blas_threads = 1;
    o->device_index = 0;
}

void backend_put_err(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    verrf(err, errlen, fmt, ap);
    va_end(ap);
}

const char *backend_available(void)
{
#ifdef WORKER_HAVE_CUDA
    return "cpu,cuda";
#else
    return "cpu";
#endif
}

int backend_open(const char *name, const backend_options *opts, backend **out, const char **why,
                 char *err, size_t errlen)
{
    backend_options defaults;
    if (opts == NULL) {
        backend_options_init(&defaults);
        opts = &defaults;
    }
    if (why != NULL)
        *why = NULL;
    *out = NULL;
    if (name == NULL)
        name = "auto";
    if (strcmp(name, "cpu") == 0)
        return backend_cpu_create(opts, out, err, errlen);
    if (strcmp(name, "cuda") == 0) {
#ifdef WORKER_HAVE_CUDA
        return backend_cuda_create(opts, out, err, errlen);
#else
        /* A request for a backend this build lacks is a configuration error, reported before
         * the worker connects anywhere. */
        backend_put_err(err, errlen, "CUDA backend not built (this build has: %s)",
                        backend_available());
        return BACKEND_EUNAVAIL;
#endif
    }
    if (strcmp(name, "auto") == 0) {
#ifdef WORKER_HAVE_CUDA
        int rc = backend_cuda_create(opts, out, err, errlen);
        if (rc == 0 && why != NULL)
            *why = "device auto: a CUDA device answers, using cuda";
        if (rc != BACKEND_EUNAVAIL)
            return rc;
        if (why != NULL) {
            /* The reason CUDA declined goes into the one line the caller logs. */
            static _Thread_local char why_buf[384];
            snprintf(why_buf, sizeof(why_buf), "device auto: %s; using cpu",
                     err != NULL && errlen > 0 && err[0] != '\0' ? err : "no CUDA device answers");
            *why = why_buf;
        }
        if (err != NULL && errlen > 0)
            err[0] = '\0';
#else
        if (why != NULL)
            *why = "device auto: CUDA backend not built, using cpu";
#endif
        return backend_cpu_create(opts, out, err, errlen);
    }
    backend_put_err(err, errlen, "unknown backend '%s' (expected cpu, cuda or auto)", name);
    return BACKEND_EINVAL;
}

void backend_close(backend *be)
{
    if (be != NULL)
        be->vt->close(be);
}

const char *backend_desc(const backend *be)
{
    return be->desc;
}

const char *backend_name(const backend *be)
{
    return be->vt->name;
}

const char *backend_errmsg(const backend *be)
{
    return be->errmsg;
}

int backend_fail(backend *be, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    verrf(be->errmsg, sizeof(be->errmsg), fmt, ap);
    va_end(ap);
    return code;
}

/* True when buf holds at least `count` elements of `elem` bytes (no overflow). */
static bool holds(const backend_buf *buf, size_t count, size_t elem)
{
    if (buf == NULL)
        return false;
    if (count != 0 && elem > SIZE_MAX / count)
        return false;
    return buf->bytes >= count * elem;
}

static bool holds2(const backend_buf *buf, int rows, int cols, size_t elem)
{
    if (rows < 0 || cols < 0)
        return false;
    if (cols != 0 && (size_t)rows > SIZE_MAX / (size_t)cols)
        return false;
    return holds(buf, (size_t)rows * (size_t)cols, elem);
}

#define F4 sizeof(float)

/* ---- memory ---- */

int backend_buf_alloc(backend *be, size_t bytes, backend_buf **out)
{
    *out = NULL;
    return be->vt->buf_alloc(be, bytes, out);
}

void backend_buf_free(backend *be, backend_buf *buf)
{
    if (buf != NULL)
        be->vt->buf_free(be, buf);
}

size_t backend_buf_size(const backend_buf *buf)
{
    return buf->bytes;
}

void *backend_buf_host_ptr(backend *be, backend_buf *buf)
{
    if (be == NULL || buf == NULL || be->vt->host_ptr == NULL)
        return NULL;
    return be->vt->host_ptr(be, buf);
}

void *backend_host_alloc(backend *be, size_t bytes)
{
    return be->vt->host_alloc(be, bytes);
}

void backend_host_free(backend *be, void *p)
{
    if (p != NULL)
        be->vt->host_free(be, p);
}

static bool range_ok(const backend_buf *buf, size_t off, size_t bytes)
{
    return buf != NULL && off <= buf->bytes && bytes <= buf->bytes - off;
}

int backend_upload(backend *be, backend_buf *buf, size_t off, const void *src, size_t bytes)
{
    if (!range_ok(buf, off, bytes) || (src == NULL && bytes != 0))
        return backend_fail(be, BACKEND_EINVAL, "upload: range [%zu, +%zu) outside buffer", off,
                            bytes);
    return be->vt->upload(be, buf, off, src, bytes);
}

int backend_download(backend *be, const backend_buf *buf, size_t off, void *dst, size_t bytes)
{
    if (!range_ok(buf, off, bytes) || (dst == NULL && bytes != 0))
        return backend_fail(be, BACKEND_EINVAL, "download: range [%zu, +%zu) outside buffer", off,
                            bytes);
    return be->vt->download(be, buf, off, dst, bytes);
}

int backend_memset_zero(backend *be, backend_buf *buf, size_t off, size_t bytes)
{
    if (!range_ok(buf, off, bytes))
        return backend_fail(be, BACKEND_EINVAL, "memset: range [%zu, +%zu) outside buffer", off,
                            bytes);
    return be->vt->memset_zero(be, buf, off, bytes);
}

int backend_sync(backend *be)
{
    return be->vt->sync(be);
}

int backend_event_create(backend *be, backend_event **out)
{
    *out = NULL;
    return be->vt->event_create(be, out);
}

void backend_event_destroy(backend *be, backend_event *ev)
{
    if (ev != NULL)
        be->vt->event_destroy(be, ev);
}

int backend_event_record(backend *be, backend_event *ev)
{
    return be->vt->event_record(be, ev);
}

int backend_event_wait(backend *be, backend_event *ev)
{
    return be->vt->event_wait(be, ev);
}

/* ---- ops ---- */

int backend_gemm(backend *be, bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                 const backend_buf *a, const backend_buf *b, float beta, backend_buf *c)
{
    if (m < 0 || n < 0 || k < 0 || !holds2(a, m, k, F4) || !holds2(b, k, n, F4) ||
        !holds2(c, m, n, F4) || c == a || c == b)
        return backend_fail(be, BACKEND_EINVAL, "gemm: bad shape m=%d n=%d k=%d", m, n, k);
    if (m == 0 || n == 0)
        return 0;
    return be->vt->gemm(be, trans_a, trans_b, m, n, k, alpha, a, b, beta, c);
}

int backend_bias_add(backend *be, backend_buf *y, const backend_buf *bias, int m, int n)
{
    if (!holds2(y, m, n, F4) || !holds2(bias, 1, n, F4))
        return backend_fail(be, BACKEND_EINVAL, "bias_add: bad shape m=%d n=%d", m, n);
    if (m == 0 || n == 0)
        return 0;
    return be->vt->bias_add(be, y, bias, m, n);
}

int backend_col_sum(backend *be, const backend_buf *x, int m, int n, float alpha, float beta,
                    backend_buf *out)
{
    if (!holds2(x, m, n, F4) || !holds2(out, 1, n, F4))
        return backend_fail(be, BACKEND_EINVAL, "col_sum: bad shape m=%d n=%d", m, n);
    if (n == 0)
        return 0;
    return be->vt->col_sum(be, x, m, n, alpha, beta, out);
}

static bool act_ok(backend_act act)
{
    return act == BACKEND_ACT_RELU || act == BACKEND_ACT_TANH || act == BACKEND_ACT_IDENTITY;
}

int backend_act_forward(backend *be, backend_act act, const backend_buf *x, backend_buf *y,
                        size_t n)
{
    if (!act_ok(act) || !holds(x, n, F4) || !holds(y, n, F4))
        return backend_fail(be, BACKEND_EINVAL, "act_forward: bad arguments (n=%zu)", n);
    if (n == 0)
        return 0;
    return be->vt->act_forward(be, act, x, y, n);
}

int backend_act_backward(backend *be, backend_act act, const backend_buf *y, const backend_buf *dy,
                         backend_buf *dx, size_t n)
{
    if (!act_ok(act) || !holds(y, n, F4) || !holds(dy, n, F4) || !holds(dx, n, F4))
        return backend_fail(be, BACKEND_EINVAL, "act_backward: bad arguments (n=%zu)", n);
    if (n == 0)
        return 0;
    return be->vt->act_backward(be, act, y, dy, dx, n);
}

int backend_softmax_xent(backend *be, const backend_buf *logits, const backend_buf *labels, int m,
                         int c, float grad_scale, backend_buf *dlogits, backend_buf *loss,
                         backend_buf *correct)
{
    if (c <= 0 || !holds2(logits, m, c, F4) || !holds2(labels, m, 1, sizeof(int32_t)) ||
        (dlogits != NULL && !holds2(dlogits, m, c, F4)) || (loss != NULL && !holds(loss, 1, F4)) ||
        (correct != NULL && !holds(correct, 1, F4)))
        return backend_fail(be, BACKEND_EINVAL, "softmax_xent: bad shape m=%d c=%d", m, c);
    return be->vt->softmax_xent(be, logits, labels, m, c, grad_scale, dlogits, loss, correct);
}

int backend_axpy(backend *be, size_t n, float alpha, const backend_buf *x, backend_buf *y)
{
    if (!holds(x, n, F4) || !holds(y, n, F4))
        return backend_fail(be, BACKEND_EINVAL, "axpy: bad arguments (n=%zu)", n);
    if (n == 0)
        return 0;
    return be->vt->axpy(be, n, alpha, x, y);
}

int backend_scale(backend *be, size_t n, float alpha, backend_buf *x)
{
    if (!holds(x, n, F4))
        return backend_fail(be, BACKEND_EINVAL, "scale: bad arguments (n=%zu)", n);
    if (n == 0)
        return 0;
    return be->vt->scale(be, n, alpha, x);
}

int backend_sum_squares(backend *be, const backend_buf *x, size_t n, float alpha, float beta,
                        backend_buf *out)
{
    if (!holds(x, n, F4) || !holds(out, 1, F4))
        return backend_fail(be, BACKEND_EINVAL, "sum_squares: bad arguments (n=%zu)", n);
    return be->vt->sum_squares(be, x, n, alpha, beta, out);
}

int backend_embbag_forward(backend *be, const backend_buf *idx, const backend_buf *rows, int m,
                           int s, int r, int d, bool mean, backend_buf *y)
{
    if (m < 0 || s < 0 || r < 0 || d < 1 || r > (1 << 24) || !holds2(idx, m, s, F4) ||
        !holds2(rows, r, d, F4) || !holds2(y, m, d, F4) || y == idx || y == rows)
        return backend_fail(be, BACKEND_EINVAL, "embbag_forward: bad shape m=%d s=%d r=%d d=%d", m,
                            s, r, d);
    if (m == 0)
        return 0;
    return be->vt->embbag_forward(be, idx, rows, m, s, r, d, mean, y);
}

int backend_embbag_backward(backend *be, const backend_buf *idx, const backend_buf *dy, int m,
                            int s, int r, int d, bool mean, backend_buf *drows)
{
    if (m < 0 || s < 0 || r < 0 || d < 1 || r > (1 << 24) || !holds2(idx, m, s, F4) ||
        !holds2(dy, m, d, F4) || !holds2(drows, r, d, F4) || drows == idx || drows == dy)
        return backend_fail(be, BACKEND_EINVAL, "embbag_backward: bad shape m=%d s=%d r=%d d=%d", m,
                            s, r, d);
    if (r == 0)
        return 0;
    return be->vt->embbag_backward(be, idx, dy, m, s, r, d, mean, drows);
}
