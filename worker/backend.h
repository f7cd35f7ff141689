/* backend.h - the worker's math, behind one interface (CPU now, CUDA next).
 *
 * A backend owns "device" memory and runs ops on it. The CPU backend's device
 * is host memory and every op completes before it returns; a GPU backend queues
 * ops on a compute stream and copies on a copy stream. Callers must therefore
 * write code that is correct for the asynchronous case:
 *
 *  - Device memory is only reachable through opaque backend_buf handles
 *    (backend_buf_alloc/free). Never dereference one on the host.
 *  - Host <-> device copies go through backend_upload / backend_download.
 *    They are ordered after every op queued earlier on the same backend, and
 *    ops queued later see the uploaded data. The host buffer must stay valid
 *    and untouched until the copy has completed: after backend_sync(), or
 *    after backend_event_wait() on an event recorded after the copy. Host
 *    buffers from backend_host_alloc (pinned on a GPU) make copies fastest.
 *  - Scalar results (loss, correct count, sum of squares) are written to device
 *    buffers and must be downloaded.
 *  - Events let the caller overlap work: record an event after downloading
 *    layer k's gradient, queue layer k-1's backward, wait for the event and
 *    push layer k's gradient while layer k-1 is computing.
 *
 * Matrices are dense, row-major, float32, with no padding (the leading
 * dimension is the number of columns). Labels are int32. Buffers may be used
 * by any number of ops; no op requires its output to differ from its inputs
 * unless it says so.
 *
 * Error handling: functions that can fail return 0 or a negative
 * backend_error and, when the backend has one, a message via backend_errmsg().
 * Ops with bad shapes (a caller bug) return BACKEND_EINVAL and do nothing.
 * A backend is used by one thread at a time.
 */
#ifndef WORKER_BACKEND_H
#define WORKER_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct backend backend;
typedef struct backend_buf backend_buf;
typedef struct backend_event backend_event;

typedef enum backend_error {
    BACKEND_OK = 0,
    BACKEND_EINVAL = -1,   /* bad argument or shape */
    BACKEND_ENOMEM = -2,   /* host or device memory exhausted */
    BACKEND_EUNAVAIL = -3, /* backend not built, or no device answers */
    BACKEND_EDEVICE = -4,  /* device error while running */
} backend_error;

typedef enum backend_act {
    BACKEND_ACT_RELU = 0,
    BACKEND_ACT_TANH = 1,
    BACKEND_ACT_IDENTITY = 2,
} backend_act;

/* Options for backend_open. Fill with backend_options_init. */
typedef struct backend_options {
    int blas_threads; /* CPU: BLAS threads (>= 1); default 1 so workers don't share cores */
    int device_index; /* GPU ordinal (CUDA: --gpu N); ignored by the CPU backend */
    bool tf32;        /* CUDA: GEMMs in TF32 tensor-core math (--tf32; ~1e-3 relative error) */
} backend_options;

void backend_options_init(backend_options *o);

/* Opens the backend named `name`: "cpu", "cuda" or "auto" (CUDA when built
 * and a device answers, else CPU). On success returns 0 and *out; *why (may be
 * NULL) then points at a sentence explaining the choice, e.g. "device auto:
 * CUDA backend not built, using cpu", valid until the thread's next call (NULL
 * when the name was explicit). On
 * failure returns BACKEND_EINVAL (unknown name) or BACKEND_EUNAVAIL (e.g.
 * "cuda" without a CUDA build) and writes a message into err (errlen bytes,
 * may be NULL). Free with backend_close. Does not block beyond device init. */
int backend_open(const char *name, const backend_options *opts, backend **out, const char **why,
                 char *err, size_t errlen);

/* Frees the backend. Every buffer and event must have been freed first.
 * NULL is a no-op. */
void backend_close(backend *be);

/* Name of an open backend ("cpu", "cuda"); static storage. */
const char *backend_name(const backend *be);

/* One line describing the open backend's device (CUDA: "NVIDIA H100 (device 0, compute
 * capability 9.0, 79.1 GiB), FP32 GEMMs"), or "" when the backend has none to give. */
const char *backend_desc(const backend *be);

/* Message of the last failed call on be ("" if none); valid until the next call. */
const char *backend_errmsg(const backend *be);

/* Comma-separated names of the backends this build contains, e.g. "cpu". */
const char *backend_available(void);

/* ---- memory ------------------------------------------------------------------------------ */

/* Allocates `bytes` of device memory (contents undefined; 0 bytes is allowed).
 * Returns 0 or BACKEND_ENOMEM. */
int backend_buf_alloc(backend *be, size_t bytes, backend_buf **out);
/* Frees a buffer once every op queued on it has completed. NULL is a no-op. */
void backend_buf_free(backend *be, backend_buf *buf);
/* Size in bytes given at allocation. */
size_t backend_buf_size(const backend_buf *buf);

/* The buffer's memory as a host pointer when the device is the host (the CPU backend), so
 * that a caller may read and write it in place instead of copying; NULL when it is not
 * host-addressable (a GPU). Uploads and downloads from or to that same pointer copy nothing. */
void *backend_buf_host_ptr(backend *be, backend_buf *buf);

/* Host memory suited to copies (pinned on a GPU, 64-byte aligned always).
 * Returns NULL when out of memory. backend_host_free(be, NULL) is a no-op. */
void *backend_host_alloc(backend *be, size_t bytes);
void backend_host_free(backend *be, void *p);

/* Queues a copy of `bytes` bytes from host src to buf at byte offset `off`.
 * BACKEND_EINVAL if the range exceeds the buffer. */
int backend_upload(backend *be, backend_buf *buf, size_t off, const void *src, size_t bytes);
/* Queues a copy of `bytes` bytes of buf at byte offset `off` to host dst,
 * after every op queued before it. dst is valid after sync or an event wait. */
int backend_download(backend *be, const backend_buf *buf, size_t off, void *dst, size_t bytes);
/* Queues buf[off .. off+bytes) = 0. */
int backend_memset_zero(backend *be, backend_buf *buf, size_t off, size_t bytes);

/* Blocks until every queued op and copy has completed. Returns 0 or
 * BACKEND_EDEVICE (an asynchronous failure surfaced here). */
int backend_sync(backend *be);

/* Events: a point in the backend's queue that the host can wait for. */
int backend_event_create(backend *be, backend_event **out);
void backend_event_destroy(backend *be, backend_event *ev);
/* Marks the point after everything queued so far (ops and copies). */
int backend_event_record(backend *be, backend_event *ev);
/* Blocks until the recorded point has been reached. An event never recorded is
 * complete. */
int backend_event_wait(backend *be, backend_event *ev);

/* ---- ops (all float32 unless stated) ----------------------------------------------------- */

/* C[m x n] = alpha * op(A) * op(B) + beta * C, where op(A) is m x k (A is
 * stored k x m when trans_a) and op(B) is k x n (B stored n x k when trans_b).
 * C must not alias A or B. beta == 0 ignores C's prior contents (even NaN). */
int backend_gemm(backend *be, bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                 const backend_buf *a, const backend_buf *b, float beta, backend_buf *c);

/* Y[i, j] += bias[j] for the m x n matrix Y. */
int backend_bias_add(backend *be, backend_buf *y, const backend_buf *bias, int m, int n);

/* out[j] = alpha * sum_i X[i, j] + beta * out[j] for the m x n matrix X (the
 * bias gradient). beta == 0 ignores out's prior contents. */
int backend_col_sum(backend *be, const backend_buf *x, int m, int n, float alpha, float beta,
                    backend_buf *out);

/* Y = act(X) elementwise over n values; Y may be X. */
int backend_act_forward(backend *be, backend_act act, const backend_buf *x, backend_buf *y,
                        size_t n);

/* dX = dY * act'(.) elementwise, expressed through the forward OUTPUT Y
 * (relu: Y > 0; tanh: 1 - Y^2; identity: 1). dX may be dY. */
int backend_act_backward(backend *be, backend_act act, const backend_buf *y, const backend_buf *dy,
                         backend_buf *dx, size_t n);

/* Softmax cross-entropy over the m x c matrix of logits and the m int32
 * labels (each in [0, c); a label outside is a caller bug: the row counts as
 * loss 0, not correct, and a zero gradient). Outputs, each optional (NULL):
 *  - dlogits (m x c): grad_scale * (softmax(logits) - onehot(label)); may
 *    alias logits;
 *  - loss (1 float): sum over rows of -log softmax(logits)[label];
 *  - correct (1 float): number of rows whose first arg max equals the label.
 * Numerically stable (max subtracted); accumulates in double on the CPU. */
int backend_softmax_xent(backend *be, const backend_buf *logits, const backend_buf *labels, int m,
                         int c, float grad_scale, backend_buf *dlogits, backend_buf *loss,
                         backend_buf *correct);

/* Y = alpha * X + Y over n values. */
int backend_axpy(backend *be, size_t n, float alpha, const backend_buf *x, backend_buf *y);

/* X = alpha * X over n values. */
int backend_scale(backend *be, size_t n, float alpha, backend_buf *x);

/* out[0] (1 float) = alpha * sum X^2 + beta * out[0] over n values (the L2
 * term); accumulates in double on the CPU. */
int backend_sum_squares(backend *be, const backend_buf *x, size_t n, float alpha, float beta,
                        backend_buf *out);

/* Embedding bag (sum or mean pooling of gathered rows). idx is an m x s matrix of float32 row
 * numbers into rows (r x d): example i pools the rows idx[i, 0..s) that lie in [0, r) (negative
 * entries pad, as do any >= r, which a caller should not pass); the numbers are exact integers
 * below 2^24. Y (m x d) = for each example the sum of its rows, or with `mean` their mean (an
 * example with no row gets zeros). Y must not alias idx or rows. */
int backend_embbag_forward(backend *be, const backend_buf *idx, const backend_buf *rows, int m,
                           int s, int r, int d, bool mean, backend_buf *y);
/* The gradient of backend_embbag_forward with respect to rows: dRows (r x d) = 0, then for every
 * example i and each of its valid entries j, dRows[idx[i, j]] += dY[i] (divided by the example's
 * count of valid entries with `mean`). A row named twice gets both contributions. dRows must not
 * alias idx or dY. */
int backend_embbag_backward(backend *be, const backend_buf *idx, const backend_buf *dy, int m,
                            int s, int r, int d, bool mean, backend_buf *drows);

/* ---- implementation side ----------------------------------------------------------------- */

/* Each backend implements this table; backend.c dispatches to it after the
 * generic argument checks (buffer sizes against shapes), so implementations
 * may assume valid arguments. Not for callers. */
typedef struct backend_vtable {
    const char *name;
    void (*close)(backend *be);
    int (*buf_alloc)(backend *be, size_t bytes, backend_buf **out);
    void (*buf_free)(backend *be, backend_buf *buf);
    void *(*host_alloc)(backend *be, size_t bytes);
    void (*host_free)(backend *be, void *p);
    int (*upload)(backend *be, backend_buf *buf, size_t off, const void *src, size_t bytes);
    int (*download)(backend *be, const backend_buf *buf, size_t off, void *dst, size_t bytes);
    void *(*host_ptr)(backend *be, backend_buf *buf); /* optional (NULL: not host memory) */
    int (*memset_zero)(backend *be, backend_buf *buf, size_t off, size_t bytes);
    int (*sync)(backend *be);
    int (*event_create)(backend *be, backend_event **out);
    void (*event_destroy)(backend *be, backend_event *ev);
    int (*event_record)(backend *be, backend_event *ev);
    int (*event_wait)(backend *be, backend_event *ev);
    int (*gemm)(backend *be, bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                const backend_buf *a, const backend_buf *b, float beta, backend_buf *c);
    int (*bias_add)(backend *be, backend_buf *y, const backend_buf *bias, int m, int n);
    int (*col_sum)(backend *be, const backend_buf *x, int m, int n, float alpha, float beta,
                   backend_buf *out);
    int (*act_forward)(backend *be, backend_act act, const backend_buf *x, backend_buf *y,
                       size_t n);
    int (*act_backward)(backend *be, backend_act act, const backend_buf *y, const backend_buf *dy,
                        backend_buf *dx, size_t n);
    int (*softmax_xent)(backend *be, const backend_buf *logits, const backend_buf *labels, int m,
                        int c, float grad_scale, backend_buf *dlogits, backend_buf *loss,
                        backend_buf *correct);
    int (*axpy)(backend *be, size_t n, float alpha, const backend_buf *x, backend_buf *y);
    int (*scale)(backend *be, size_t n, float alpha, backend_buf *x);
    int (*sum_squares)(backend *be, const backend_buf *x, size_t n, float alpha, float beta,
                       backend_buf *out);
    int (*embbag_forward)(backend *be, const backend_buf *idx, const backend_buf *rows, int m,
                          int s, int r, int d, bool mean, backend_buf *y);
    int (*embbag_backward)(backend *be, const backend_buf *idx, const backend_buf *dy, int m, int s,
                           int r, int d, bool mean, backend_buf *drows);
} backend_vtable;

/* Common head of every backend object: implementations embed it first. */
struct backend {
    const backend_vtable *vt;
    char errmsg[256];
    char desc[192]; /* backend_desc */
};

/* Every buffer starts with its size; implementations embed this first. */
struct backend_buf {
    size_t bytes;
};

/* Writes a printf-style message into err (errlen bytes; nothing when err is NULL or errlen
 * is 0): the constructors' error out-parameter. */
void backend_put_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Records a message for backend_errmsg (printf-style) and returns code. */
int backend_fail(backend *be, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* OpenBLAS (0.3.21 in Debian 12) falls back to its slowest x86-64 kernels (Prescott, SSE3) on
 * CPU models it does not know, such as recent Xeons under a hypervisor; the choice is made
 * when the library loads, from OPENBLAS_CORETYPE. Returns the core type to set in the
 * environment before re-executing the program ("SkylakeX" with AVX-512, "Haswell" with AVX2 and
 * FMA) when OPENBLAS_CORETYPE is unset, OpenBLAS chose a fallback kernel and the CPU can run a
 * faster one; NULL otherwise (also without OpenBLAS). Does not block. */
const char *backend_cpu_better_coretype(void);

/* Name of the kernel set the BLAS uses ("SkylakeX"), or "" when unknown. */
const char *backend_cpu_blas_core(void);

/* Constructors of the built-in implementations (backend_open calls them). Each returns 0,
 * BACKEND_EINVAL (bad options), BACKEND_EUNAVAIL (no usable device: backend_open's "auto"
 * then falls back to the CPU) or BACKEND_ENOMEM, with a message in err. The CUDA one exists
 * in builds with WORKER_HAVE_CUDA defined. */
int backend_cpu_create(const backend_options *opts, backend **out, char *err, size_t errlen);
int backend_cuda_create(const backend_options *opts, backend **out, char *err, size_t errlen);

#endif /* WORKER_BACKEND_H */
