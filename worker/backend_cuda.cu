/* backend_cuda.cu - the CUDA implementation of backend.h (cuBLAS GEMMs, small kernels).
 *
 * Streams. Ops run on a compute stream (cuBLAS is bound to it); uploads and
 * downloads run on a copy stream, so that downloading layer k's gradient
 * overlaps computing layer k-1. backend.h orders everything as one queue; the
 * two streams keep that order with events:
 *  - a copy waits for every op queued before it: before the first copy after
 *    an op, the copy stream waits on an event recorded on the compute stream;
 *  - an op waits for the copies it depends on: every buffer remembers the
 *    sequence number of its last upload and last download on the copy stream,
 *    and an op that reads a buffer with a pending upload, or writes a buffer
 *    with a pending upload or download, makes the compute stream wait on an
 *    event recorded on the copy stream. Downloads of buffers that later ops
 *    only read (the gradients being pushed) therefore never stall compute.
 * backend_event records one CUDA event on each stream; waiting waits for both.
 *
 * Memory. Device buffers come from cudaMalloc; host buffers from
 * cudaMallocHost (pinned, page aligned). Freeing either synchronizes the
 * backend first, so that no queued op or copy still uses it.
 *
 * Math. GEMMs are cublasSgemm on row-major data (C = op(A) op(B) row-major is
 * C^T = op(B)^T op(A)^T column-major, so A and B swap places). They use full
 * FP32 unless backend_options.tf32 is set (ps-worker --tf32), which selects
 * CUBLAS_TF32_TENSOR_OP_MATH (about 1e-3 relative error: faster, but
 * no longer within the conformance test's 1e-4 of the CPU). Kernels use
 * accurate expf/logf/tanhf (no fast math). Precision of the reductions:
 *  - col_sum: float partial sums over rows, as the CPU backend;
 *  - softmax_xent: max, sum of exponentials and each row's loss in float (one
 *    warp per row), the sums over rows of loss and correct in double;
 *  - sum_squares: double throughout, as the CPU backend.
 * The reductions over rows and blocks write per-block partials and sum them
 * in a fixed order in a second kernel (no atomics), so results are
 * bit-for-bit reproducible from run to run on the same device. The one
 * exception is embbag_backward: rows that several examples share get their
 * sums by atomicAdd, in an order that may change between runs (float rounding
 * only).
 *
 * Errors. Every CUDA and cuBLAS status is checked; a failure records a
 * message such as "cudaMalloc(12.0 MiB): out of memory
 * (cudaErrorMemoryAllocation)" for backend_errmsg and returns BACKEND_ENOMEM
 * (allocation failures) or BACKEND_EDEVICE. Errors of kernels that fail while
 * running surface at the next call that waits (sync, event wait) or checks
 * (a launch), since CUDA reports them late.
 *
 * The device is selected again (cudaSetDevice) on entry when the calling
 * thread's current device differs, so a backend may move between threads. */
extern "C" {
#include "backend.h"
}

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <initializer_list>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

namespace
{

/* Threads per block of the elementwise and reduction kernels. */
constexpr int kThreads = 256;
/* Most blocks of a reduction (the second pass sums their partials). */
constexpr int kMaxReduceBlocks = 1024;
/* Rows of softmax_xent per block: one warp each. */
constexpr int kRowsPerBlock = kThreads / 32;

struct cuda_backend {
    backend base; /* first: backend.c's view */
    int dev;
    bool tf32;
    cudaStream_t compute;
    cudaStream_t copy;
    cublasHandle_t blas;
    cudaEvent_t join_compute; /* recorded on compute, waited on by copy */
    cudaEvent_t join_copy;    /* recorded on copy, waited on by compute */
    bool compute_dirty;       /* ops queued since the copy stream last joined compute */
    uint64_t copy_seq;        /* copies queued so far */
    uint64_t joined_seq;      /* copies compute has waited for */
    double *scratch;          /* 2 * kMaxReduceBlocks partial sums */
};

struct cuda_buf {
    backend_buf base; /* first: backend.c's view */
    void *ptr;        /* NULL for 0 bytes */
    /* Sequence numbers (cuda_backend.copy_seq) of the last copies touching the buffer.
     * Bookkeeping only, so updated through const handles too. */
    mutable uint64_t up_seq;
    mutable uint64_t down_seq;
};

} // namespace

struct backend_event {
    cudaEvent_t on_compute;
    cudaEvent_t on_copy;
};

namespace
{

cuda_backend *cbe(backend *be)
{
    return reinterpret_cast<cuda_backend *>(be);
}

const cuda_buf *cbuf(const backend_buf *b)
{
    return reinterpret_cast<const cuda_buf *>(b);
}

float *fptr(backend_buf *b)
{
    return static_cast<float *>(reinterpret_cast<cuda_buf *>(b)->ptr);
}

const float *fptr(const backend_buf *b)
{
    return static_cast<const float *>(cbuf(b)->ptr);
}

/* "512 B", "12.0 KiB", "3.5 GiB" */
const char *human_bytes(size_t bytes, char *buf, size_t cap)
{
    static const char *const units[] = {"KiB", "MiB", "GiB", "TiB"};
    if (bytes < 1024) {
        snprintf(buf, cap, "%zu B", bytes);
        return buf;
    }
    double v = (double)bytes / 1024.0;
    int u = 0;
    while (v >= 1024.0 && u < 3) {
        v /= 1024.0;
        u++;
    }
    snprintf(buf, cap, "%.1f %s", v, units[u]);
    return buf;
}

const char *cublas_status_name(cublasStatus_t s)
{
    switch (s) {
    case CUBLAS_STATUS_SUCCESS:
        return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
        return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
        return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
        return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
        return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR:
        return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED:
        return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
        return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
        return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR:
        return "CUBLAS_STATUS_LICENSE_ERROR";
    }
    return "CUBLAS_STATUS_(unknown)";
}

/* Records "<what>: <detail>" where what is fmt's text. */
int fail_v(cuda_backend *cb, int code, const char *detail, const char *fmt, va_list ap)
{
    char what[160];
    vsnprintf(what, sizeof(what), fmt, ap);
    return backend_fail(&cb->base, code, "%s: %s", what, detail);
}

int cuda_fail(cuda_backend *cb, cudaError_t e, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Records "<what>: <CUDA's message> (<error name>)"; ENOMEM for allocation failures. */
int cuda_fail(cuda_backend *cb, cudaError_t e, const char *fmt, ...)
{
    char detail[192];
    snprintf(detail, sizeof(detail), "%s (%s)", cudaGetErrorString(e), cudaGetErrorName(e));
    va_list ap;
    va_start(ap, fmt);
    int rc = fail_v(cb, e == cudaErrorMemoryAllocation ? BACKEND_ENOMEM : BACKEND_EDEVICE, detail,
                    fmt, ap);
    va_end(ap);
    return rc;
}

int blas_fail(cuda_backend *cb, cublasStatus_t s, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Records "<what>: <cuBLAS status name>"; ENOMEM for allocation failures. */
int blas_fail(cuda_backend *cb, cublasStatus_t s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = fail_v(cb, s == CUBLAS_STATUS_ALLOC_FAILED ? BACKEND_ENOMEM : BACKEND_EDEVICE,
                    cublas_status_name(s), fmt, ap);
    va_end(ap);
    return rc;
}

} // namespace

/* Each evaluates `call` once; on failure records the message (printf-style
 * description of the call in the remaining arguments) and returns from the
 * enclosing function with the backend error code. */
#define CUDA_CHECK(cb, call, ...)                                                                  \
    do {                                                                                           \
        cudaError_t cuda_check_err_ = (call);                                                      \
        if (cuda_check_err_ != cudaSuccess)                                                        \
            return cuda_fail((cb), cuda_check_err_, __VA_ARGS__);                                  \
    } while (0)

#define CUBLAS_CHECK(cb, call, ...)                                                                \
    do {                                                                                           \
        cublasStatus_t cublas_check_st_ = (call);                                                  \
        if (cublas_check_st_ != CUBLAS_STATUS_SUCCESS)                                             \
            return blas_fail((cb), cublas_check_st_, __VA_ARGS__);                                 \
    } while (0)

/* A kernel launch reports configuration errors (and earlier sticky errors) only here. */
#define LAUNCH_CHECK(cb, name) CUDA_CHECK(cb, cudaGetLastError(), "%s kernel launch", name)

/* Propagates a non-zero return. */
#define TRY(expr)                                                                                  \
    do {                                                                                           \
        int try_rc_ = (expr);                                                                      \
        if (try_rc_ != 0)                                                                          \
            return try_rc_;                                                                        \
    } while (0)

/* ---- kernels ----------------------------------------------------------------------------- */

namespace
{

__global__ void k_probe(double *out)
{
    out[0] = 0.0;
}

/* C = beta * C over n values (beta == 0 writes zeros, ignoring NaN): gemm with k == 0. */
__global__ void k_scale_or_zero(float *c, size_t n, float beta)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        c[i] = beta == 0.0f ? 0.0f : beta * c[i];
}

/* Grid: x over columns (blockDim.x each), y over rows (strided by gridDim.y). */
__global__ void k_bias_add(float *y, const float *bias, int m, int n)
{
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= n)
        return;
    float b = bias[j];
    for (int i = blockIdx.y; i < m; i += gridDim.y)
        y[(size_t)i * (size_t)n + j] += b;
}

/* Block 32 x 32: threadIdx.x picks a column of the block's 32, threadIdx.y a
 * residue class of rows; the 32 partial sums of a column are added in order. */
__global__ void k_col_sum(const float *x, int m, int n, float alpha, float beta, float *out)
{
    __shared__ float part[32][33];
    int j = blockIdx.x * 32 + threadIdx.x;
    float acc = 0.0f;
    if (j < n)
        for (int i = threadIdx.y; i < m; i += 32)
            acc += x[(size_t)i * (size_t)n + j];
    part[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && j < n) {
        float s = 0.0f;
        for (int t = 0; t < 32; t++)
            s += part[t][threadIdx.x];
        out[j] = alpha * s + (beta == 0.0f ? 0.0f : beta * out[j]);
    }
}

__global__ void k_relu(const float *x, float *y, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float v = x[i];
        y[i] = v > 0.0f ? v : 0.0f;
    }
}

__global__ void k_tanh(const float *x, float *y, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] = tanhf(x[i]);
}

__global__ void k_relu_backward(const float *y, const float *dy, float *dx, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float g = dy[i];
        dx[i] = y[i] > 0.0f ? g : 0.0f;
    }
}

__global__ void k_tanh_backward(const float *y, const float *dy, float *dx, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float v = y[i];
        dx[i] = dy[i] * (1.0f - v * v);
    }
}

__global__ void k_axpy(size_t n, float alpha, const float *x, float *y)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] += alpha * x[i];
}

__global__ void k_scale(size_t n, float alpha, float *x)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] *= alpha;
}

/* Sum over the block of v (blockDim.x == kThreads); the result is valid in thread 0. */
__device__ double block_sum(double v, double *sh)
{
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int s = kThreads / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s)
            sh[threadIdx.x] += sh[threadIdx.x + s];
        __syncthreads();
    }
    return sh[0];
}

/* partial[blockIdx.x] = sum of x^2 over the block's grid-stride share. */
__global__ void k_sum_squares(const float *x, size_t n, double *partial)
{
    __shared__ double sh[kThreads];
    double acc = 0.0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        double v = (double)x[i];
        acc += v * v;
    }
    double s = block_sum(acc, sh);
    if (threadIdx.x == 0)
        partial[blockIdx.x] = s;
}

/* out[0] = alpha * sum(partial[0..np)) + beta * out[0] (one block). */
__global__ void k_sum_squares_final(const double *partial, int np, float alpha, float beta,
                                    float *out)
{
    __shared__ double sh[kThreads];
    double acc = 0.0;
    for (int i = threadIdx.x; i < np; i += blockDim.x)
        acc += partial[i];
    double s = block_sum(acc, sh);
    if (threadIdx.x == 0)
        out[0] = (float)((double)alpha * s + (beta == 0.0f ? 0.0 : (double)beta * (double)out[0]));
}

/* One warp per row (kRowsPerBlock rows per block, grid-strided). Writes the
 * row's gradient when dz != NULL, and the block's sums of loss and correct to
 * partial[blockIdx.x] and partial[kMaxReduceBlocks + blockIdx.x] when
 * partial != NULL. dz may alias z: every lane reads the row (max, sum, z[y])
 * before any lane writes it. */
__global__ void k_softmax_xent(const float *z, const int32_t *labels, int m, int c,
                               float grad_scale, float *dz, double *partial)
{
    __shared__ double sh_loss[kRowsPerBlock];
    __shared__ double sh_correct[kRowsPerBlock];
    const unsigned full = 0xffffffffu;
    int lane = threadIdx.x & 31;
    int warp = threadIdx.x >> 5;
    double loss_acc = 0.0, correct_acc = 0.0;
    for (int row = blockIdx.x * kRowsPerBlock + warp; row < m; row += gridDim.x * kRowsPerBlock) {
        const float *zr = z + (size_t)row * (size_t)c;
        /* Max and first arg max: lane-local over j = lane, lane + 32, ... (increasing, so the
         * first maximum is kept), then across lanes preferring the lower index on ties. */
        float vmax = zr[0];
        int imax = 0;
        for (int j = lane; j < c; j += 32) {
            float v = zr[j];
            if (v > vmax) {
                vmax = v;
                imax = j;
            }
        }
        for (int off = 16; off > 0; off >>= 1) {
            float ov = __shfl_xor_sync(full, vmax, off);
            int oi = __shfl_xor_sync(full, imax, off);
            if (ov > vmax || (ov == vmax && oi < imax)) {
                vmax = ov;
                imax = oi;
            }
        }
        float sum = 0.0f;
        for (int j = lane; j < c; j += 32)
            sum += expf(zr[j] - vmax);
        for (int off = 16; off > 0; off >>= 1)
            sum += __shfl_xor_sync(full, sum, off);
        float log_sum = logf(sum);
        int32_t y = labels[row];
        bool valid = y >= 0 && y < c;
        float zy = valid ? zr[y] : 0.0f;
        if (lane == 0 && valid) {
            loss_acc += (double)(log_sum - (zy - vmax));
            if (imax == y)
                correct_acc += 1.0;
        }
        __syncwarp();
        if (dz != NULL) {
            float *dr = dz + (size_t)row * (size_t)c;
            for (int j = lane; j < c; j += 32) {
                float p = expf(zr[j] - vmax - log_sum);
                float g = valid ? p - (j == y ? 1.0f : 0.0f) : 0.0f;
                dr[j] = grad_scale * g;
            }
        }
        __syncwarp();
    }
    if (partial == NULL)
        return;
    if (lane == 0) {
        sh_loss[warp] = loss_acc;
        sh_correct[warp] = correct_acc;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        double l = 0.0, k = 0.0;
        for (int w = 0; w < kRowsPerBlock; w++) {
            l += sh_loss[w];
            k += sh_correct[w];
        }
        partial[blockIdx.x] = l;
        partial[kMaxReduceBlocks + blockIdx.x] = k;
    }
}

/* loss[0], correct[0] = sums of the np partials of k_softmax_xent (one block). */
__global__ void k_softmax_xent_final(const double *partial, int np, float *loss, float *correct)
{
    __shared__ double sh[kThreads];
    double l = 0.0, k = 0.0;
    for (int i = threadIdx.x; i < np; i += blockDim.x) {
        l += partial[i];
        k += partial[kMaxReduceBlocks + i];
    }
    double sl = block_sum(l, sh);
    if (threadIdx.x == 0 && loss != NULL)
        loss[0] = (float)sl;
    __syncthreads();
    double sk = block_sum(k, sh);
    if (threadIdx.x == 0 && correct != NULL)
        correct[0] = (float)sk;
}

/* The row number v names, or -1 when it names no row of r (padding). */
__device__ inline long embbag_row(float v, int r)
{
    return v >= 0.0f && v < (float)r ? (long)v : -1;
}

/* Embedding bag forward: one block per example (strided by gridDim.x), threads over the row's
 * d columns; each output is summed in the order of the example's entries, as the CPU does. */
__global__ void k_embbag_forward(const float *idx, const float *rows, int m, int s, int r, int d,
                                 bool mean, float *y)
{
    for (int i = blockIdx.x; i < m; i += gridDim.x) {
        const float *iv = idx + (size_t)i * (size_t)s;
        int count = 0;
        for (int j = 0; j < s; j++)
            count += embbag_row(iv[j], r) >= 0;
        for (int k = threadIdx.x; k < d; k += blockDim.x) {
            float acc = 0.0f;
            for (int j = 0; j < s; j++) {
                long row = embbag_row(iv[j], r);
                if (row >= 0)
                    acc += rows[(size_t)row * (size_t)d + k];
            }
            if (mean && count > 1)
                acc /= (float)count;
            y[(size_t)i * (size_t)d + k] = acc;
        }
    }
}

/* Embedding bag backward: one block per example, threads over columns, each valid entry's
 * share of dy added into its row with atomicAdd (rows shared by examples collide). */
__global__ void k_embbag_backward(const float *idx, const float *dy, int m, int s, int r, int d,
                                  bool mean, float *drows)
{
    for (int i = blockIdx.x; i < m; i += gridDim.x) {
        const float *iv = idx + (size_t)i * (size_t)s;
        int count = 0;
        for (int j = 0; j < s; j++)
            count += embbag_row(iv[j], r) >= 0;
        if (count == 0)
            continue;
        float w = mean ? 1.0f / (float)count : 1.0f;
        for (int k = threadIdx.x; k < d; k += blockDim.x) {
            float g = w * dy[(size_t)i * (size_t)d + k];
            for (int j = 0; j < s; j++) {
                long row = embbag_row(iv[j], r);
                if (row >= 0)
                    atomicAdd(&drows[(size_t)row * (size_t)d + k], g);
            }
        }
    }
}

/* Blocks for a grid-stride loop over n values. */
unsigned grid_for(size_t n)
{
    size_t blocks = (n + kThreads - 1) / kThreads;
    if (blocks < 1)
        blocks = 1;
    if (blocks > 65536)
        blocks = 65536;
    return (unsigned)blocks;
}

/* ---- ordering between the streams -------------------------------------------------------- */

/* Makes the current thread use the backend's device. */
int enter(cuda_backend *cb)
{
    int cur = -1;
    if (cudaGetDevice(&cur) == cudaSuccess && cur == cb->dev)
        return 0;
    CUDA_CHECK(cb, cudaSetDevice(cb->dev), "cudaSetDevice(%d)", cb->dev);
    return 0;
}

/* Before queuing a copy: the copy stream waits for every op queued so far. */
int copy_after_compute(cuda_backend *cb)
{
    if (!cb->compute_dirty)
        return 0;
    CUDA_CHECK(cb, cudaEventRecord(cb->join_compute, cb->compute), "cudaEventRecord(compute)");
    CUDA_CHECK(cb, cudaStreamWaitEvent(cb->copy, cb->join_compute, 0),
               "cudaStreamWaitEvent(copy on compute)");
    cb->compute_dirty = false;
    return 0;
}

bool copy_pending(const cuda_backend *cb, const backend_buf *b, bool written)
{
    if (b == NULL)
        return false;
    const cuda_buf *x = cbuf(b);
    uint64_t last = x->up_seq;
    if (written && x->down_seq > last)
        last = x->down_seq;
    return last > cb->joined_seq;
}

/* Before queuing an op that reads `reads` and writes `writes` (NULLs allowed): the compute
 * stream waits for the copy stream if one of them has a copy it must follow. Marks compute
 * as having new work. */
int begin_op(cuda_backend *cb, std::initializer_list<const backend_buf *> reads,
             std::initializer_list<const backend_buf *> writes)
{
    TRY(enter(cb));
    bool wait = false;
    if (cb->joined_seq != cb->copy_seq) {
        for (const backend_buf *b : reads)
            wait = wait || copy_pending(cb, b, false);
        for (const backend_buf *b : writes)
            wait = wait || copy_pending(cb, b, true);
    }
    if (wait) {
        CUDA_CHECK(cb, cudaEventRecord(cb->join_copy, cb->copy), "cudaEventRecord(copy)");
        CUDA_CHECK(cb, cudaStreamWaitEvent(cb->compute, cb->join_copy, 0),
                   "cudaStreamWaitEvent(compute on copy)");
        cb->joined_seq = cb->copy_seq;
    }
    cb->compute_dirty = true;
    return 0;
}

/* Waits for both streams; afterwards no cross-stream wait is needed. */
int sync_all(cuda_backend *cb)
{
    TRY(enter(cb));
    CUDA_CHECK(cb, cudaStreamSynchronize(cb->compute), "compute stream");
    CUDA_CHECK(cb, cudaStreamSynchronize(cb->copy), "copy stream");
    cb->joined_seq = cb->copy_seq;
    cb->compute_dirty = false;
    return 0;
}

/* ---- vtable ------------------------------------------------------------------------------ */

void destroy(cuda_backend *cb)
{
    if (cb->compute != NULL || cb->copy != NULL)
        (void)sync_all(cb);
    if (cb->blas != NULL)
        cublasDestroy(cb->blas);
    if (cb->scratch != NULL)
        cudaFree(cb->scratch);
    if (cb->join_compute != NULL)
        cudaEventDestroy(cb->join_compute);
    if (cb->join_copy != NULL)
        cudaEventDestroy(cb->join_copy);
    if (cb->compute != NULL)
        cudaStreamDestroy(cb->compute);
    if (cb->copy != NULL)
        cudaStreamDestroy(cb->copy);
    free(cb);
}

void cu_close(backend *be)
{
    destroy(cbe(be));
}

int cu_buf_alloc(backend *be, size_t bytes, backend_buf **out)
{
    cuda_backend *cb = cbe(be);
    TRY(enter(cb));
    cuda_buf *b = static_cast<cuda_buf *>(calloc(1, sizeof(*b)));
    if (b == NULL)
        return backend_fail(be, BACKEND_ENOMEM, "out of host memory");
    if (bytes != 0) {
        cudaError_t e = cudaMalloc(&b->ptr, bytes);
        if (e != cudaSuccess) {
            free(b);
            char hb[32];
            return cuda_fail(cb, e, "cudaMalloc(%s)", human_bytes(bytes, hb, sizeof(hb)));
        }
    }
    b->base.bytes = bytes;
    *out = &b->base;
    return 0;
}

void cu_buf_free(backend *be, backend_buf *buf)
{
    cuda_backend *cb = cbe(be);
    cuda_buf *b = reinterpret_cast<cuda_buf *>(buf);
    /* Queued ops and copies may still use it. */
    (void)sync_all(cb);
    if (b->ptr != NULL)
        cudaFree(b->ptr);
    free(b);
}

void *cu_host_alloc(backend *be, size_t bytes)
{
    cuda_backend *cb = cbe(be);
    if (enter(cb) != 0)
        return NULL;
    void *p = NULL;
    cudaError_t e = cudaMallocHost(&p, bytes < 64 ? 64 : bytes);
    if (e != cudaSuccess) {
        char hb[32];
        cuda_fail(cb, e, "cudaMallocHost(%s)", human_bytes(bytes, hb, sizeof(hb)));
        return NULL;
    }
    return p;
}

void cu_host_free(backend *be, void *p)
{
    cuda_backend *cb = cbe(be);
    (void)sync_all(cb);
    cudaFreeHost(p);
}

/* Queues a copy on the copy stream, after every op queued so far; *seq (the buffer's up_seq or
 * down_seq) records it for begin_op. */
int queue_copy(cuda_backend *cb, void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
               uint64_t *seq)
{
    if (bytes == 0)
        return 0;
    TRY(enter(cb));
    TRY(copy_after_compute(cb));
    char hb[32];
    CUDA_CHECK(cb, cudaMemcpyAsync(dst, src, bytes, kind, cb->copy), "cudaMemcpyAsync(%s, %s)",
               kind == cudaMemcpyHostToDevice ? "host to device" : "device to host",
               human_bytes(bytes, hb, sizeof(hb)));
    *seq = ++cb->copy_seq;
    return 0;
}

int cu_upload(backend *be, backend_buf *buf, size_t off, const void *src, size_t bytes)
{
    cuda_buf *b = reinterpret_cast<cuda_buf *>(buf);
    return queue_copy(cbe(be), static_cast<char *>(b->ptr) + off, src, bytes,
                      cudaMemcpyHostToDevice, &b->up_seq);
}

int cu_download(backend *be, const backend_buf *buf, size_t off, void *dst, size_t bytes)
{
    const cuda_buf *b = cbuf(buf);
    return queue_copy(cbe(be), dst, static_cast<const char *>(b->ptr) + off, bytes,
                      cudaMemcpyDeviceToHost, &b->down_seq);
}

int cu_memset_zero(backend *be, backend_buf *buf, size_t off, size_t bytes)
{
    cuda_backend *cb = cbe(be);
    if (bytes == 0)
        return 0;
    TRY(begin_op(cb, {}, {buf}));
    char hb[32];
    CUDA_CHECK(cb,
               cudaMemsetAsync(static_cast<char *>(reinterpret_cast<cuda_buf *>(buf)->ptr) + off, 0,
                               bytes, cb->compute),
               "cudaMemsetAsync(%s)", human_bytes(bytes, hb, sizeof(hb)));
    return 0;
}

int cu_sync(backend *be)
{
    return sync_all(cbe(be));
}

int cu_event_create(backend *be, backend_event **out)
{
    cuda_backend *cb = cbe(be);
    TRY(enter(cb));
    backend_event *ev = static_cast<backend_event *>(calloc(1, sizeof(*ev)));
    if (ev == NULL)
        return backend_fail(be, BACKEND_ENOMEM, "out of host memory");
    cudaError_t e = cudaEventCreateWithFlags(&ev->on_compute, cudaEventDisableTiming);
    if (e == cudaSuccess) {
        e = cudaEventCreateWithFlags(&ev->on_copy, cudaEventDisableTiming);
        if (e != cudaSuccess)
            cudaEventDestroy(ev->on_compute);
    }
    if (e != cudaSuccess) {
        free(ev);
        return cuda_fail(cb, e, "cudaEventCreate");
    }
    *out = ev;
    return 0;
}

void cu_event_destroy(backend *be, backend_event *ev)
{
    if (enter(cbe(be)) == 0) {
        cudaEventDestroy(ev->on_compute);
        cudaEventDestroy(ev->on_copy);
    }
    free(ev);
}

int cu_event_record(backend *be, backend_event *ev)
{
    cuda_backend *cb = cbe(be);
    TRY(enter(cb));
    CUDA_CHECK(cb, cudaEventRecord(ev->on_compute, cb->compute), "cudaEventRecord");
    CUDA_CHECK(cb, cudaEventRecord(ev->on_copy, cb->copy), "cudaEventRecord");
    return 0;
}

int cu_event_wait(backend *be, backend_event *ev)
{
    cuda_backend *cb = cbe(be);
    TRY(enter(cb));
    /* A never-recorded CUDA event is complete, as backend.h asks. */
    CUDA_CHECK(cb, cudaEventSynchronize(ev->on_compute), "event wait (compute stream)");
    CUDA_CHECK(cb, cudaEventSynchronize(ev->on_copy), "event wait (copy stream)");
    return 0;
}

int cu_gemm(backend *be, bool trans_a, bool trans_b, int m, int n, int k, float alpha,
            const backend_buf *a, const backend_buf *b, float beta, backend_buf *c)
{
    cuda_backend *cb = cbe(be);
    TRY(begin_op(cb, {a, b, beta == 0.0f ? nullptr : c}, {c}));
    float *C = fptr(c);
    if (k == 0) {
        /* Nothing to multiply (and cuBLAS wants leading dimensions >= 1): C = beta C. */
        size_t mn = (size_t)m * (size_t)n;
        k_scale_or_zero<<<grid_for(mn), kThreads, 0, cb->compute>>>(C, mn, beta);
        LAUNCH_CHECK(cb, "gemm (k = 0)");
        return 0;
    }
    /* Row-major C (m x n) = op(A) op(B) is column-major C^T (n x m) = op(B)^T op(A)^T. The
     * row-major B seen column-major is B^T, so op(B)^T needs a transpose exactly when
     * trans_b; the same holds for A. Leading dimensions are the row-major column counts. */
    int lda = trans_a ? m : k;
    int ldb = trans_b ? k : n;
    CUBLAS_CHECK(cb,
                 cublasSgemm(cb->blas, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                             trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, fptr(b), ldb,
                             fptr(a), lda, &beta, C, n),
                 "cublasSgemm(m=%d n=%d k=%d%s%s)", m, n, k, trans_a ? " A^T" : "",
                 trans_b ? " B^T" : "");
    return 0;
}

int cu_bias_add(backend *be, backend_buf *y, const backend_buf *bias, int m, int n)
{
    cuda_backend *cb = cbe(be);
    TRY(begin_op(cb, {y, bias}, {y}));
    dim3 grid((unsigned)((n + kThreads - 1) / kThreads), (unsigned)(m < 65535 ? m : 65535));
    k_bias_add<<<grid, kThreads, 0, cb->compute>>>(fptr(y), fptr(bias), m, n);
    LAUNCH_CHECK(cb, "bias_add");
    return 0;
}

int cu_col_sum(backend *be, const backend_buf *x, int m, int n, float alpha, float beta,
               backend_buf *out)
{
    cuda_backend *cb = cbe(be);
    TRY(begin_op(cb, {x, beta == 0.0f ? nullptr : out}, {out}));
    dim3 block(32, 32);
    k_col_sum<<<(unsigned)((n + 31) / 32), block, 0, cb->compute>>>(fptr(x), m, n, alpha, beta,
                                                                    fptr(out));
    LAUNCH_CHECK(cb, "col_sum");
    return 0;
}

int cu_act_forward(backend *be, backend_act act, const backend_buf *x, backend_buf *y, size_t n)
{
    cuda_backend *cb = cbe(be);
    TRY(begin_op(cb, {x}, {y}));
    const float *X = fptr(x);
    float *Y = fptr(y);
    switch (act) {
    case BACKEND_ACT_RELU:
        k_relu<<<grid_for(n), kThreads, 0, cb->compute>>>(X, Y, n);
        LAUNCH_CHECK(cb, "relu");
        break;
    case BACKEND_ACT_TANH:
        k_tanh<<<grid_for(n), kThreads, 0, cb->compute>>>(X, Y, n);
        LAUNCH_CHECK(cb, "tanh");
        break;
    case BACKEND_ACT_IDENTITY:
        if (X != Y)
            CUDA_CHECK(
                cb, cudaMemcpyAsync(Y, X, n * sizeof(float), cudaMemcpyDeviceToDevice, cb->compute),
                "cudaMemcpyAsync(device to device)");
        break;
    }
    return 0;
}

int cu_act_backward(backend *be, backend_act act, const backend_buf *y, const backend_buf *dy,
                    backend_buf *dx, size_t n)
{
    cuda_backend *cb = cbe(be);
    TRY(begin_op(cb, {y, dy}, {dx}));
    const float *Y = fptr(y);
    const float *dY = fptr(dy);
    float *dX = fptr(dx);
    switch (act) {
    case BACKEND_ACT_RELU:
        k_relu_backward<<<grid_for(n), kThreads, 0, cb->compute>>>(Y, dY, dX, n);
        LAUNCH_CHECK(cb, "relu backward");
        break;
    case BACKEND_ACT_TANH:
        k_tanh_backward<<<grid_for(n), kThreads, 0, cb->compute>>>(Y, dY, dX, n);
        LAUNCH_CHECK(cb, "tanh backward");
        break;
    case BACKEND_ACT_IDENTITY:
        if (dX != dY)
            CUDA_CHECK(
                cb,
                cudaMemcpyAsync(dX, dY, n * sizeof(float), cudaMemcpyDeviceToDevice, cb->compute),
                "cudaMemcpyAsync(device to device)");
        break;
    }
    return 0;
}

int cu_softmax_xent(backend *be, const backend_buf *logits, const backend_buf *labels, int m, int c,
                    float grad_scale, backend_buf *dlogits, backend_buf *loss, backend_buf *correct)
{
    cuda_backend *cb = cbe(be);
    TRY(begin_op(cb, {logits, labels}, {dlogits, loss, correct}));
    bool sums = loss != NULL || correct != NULL;
    if (dlogits == NULL && !sums)
        return 0;
    int blocks = (m + kRowsPerBlock - 1) / kRowsPerBlock;
    if (blocks < 1)
        blocks = 1; /* m == 0 still writes zero sums */
    if (blocks > kMaxReduceBlocks)
        blocks = kMaxReduceBlocks;
    k_softmax_xent<<<blocks, kThreads, 0, cb->compute>>>(
        fptr(logits), static_cast<const int32_t *>(cbuf(labels)->ptr), m, c, grad_scale,
        dlogits != NULL ? fptr(dlogits) : nullptr, sums ? cb->scratch : nullptr);
    LAUNCH_CHECK(cb, "softmax_xent");
    if (sums) {
        k_softmax_xent_final<<<1, kThreads, 0, cb->compute>>>(
            cb->scratch, blocks, loss != NULL ? fptr(loss) : nullptr,
            correct != NULL ? fptr(correct) : nullptr);
        LAUNCH_CHECK(cb, "softmax_xent (sums)");
    }
    return 0;
}

int cu_axpy(backend *be, size_t n, float alpha, const backend_buf *x, backend_buf *y)
{
    cuda_backend *cb = cbe(be);
    TRY(begin_op(cb, {x, y}, {y}));
    k_axpy<<<grid_for(n), kThreads, 0, cb->compute>>>(n, alpha, fptr(x), fptr(y));
    LAUNCH_CHECK(cb, "axpy");
    return 0;
}

int cu_scale(backend *be, size_t n, float alpha, backend_buf *x)
{
    cuda_backend *cb = cbe(be);
    TRY(begin_op(cb, {x}, {x}));
    k_scale<<<grid_for(n), kThreads, 0, cb->compute>>>(n, alpha, fptr(x));
    LAUNCH_CHECK(cb, "scale");
    return 0;
}

int cu_sum_squares(backend *be, const backend_buf *x, size_t n, float alpha, float beta,
                   backend_buf *out)
{
    cuda_backend *cb = cbe(be);
    TRY(begin_op(cb, {x, beta == 0.0f ? nullptr : out}, {out}));
    unsigned blocks = grid_for(n);
    if (blocks > (unsigned)kMaxReduceBlocks)
        blocks = kMaxReduceBlocks;
    /* n == 0 (x may have no memory): one block over nothing writes a zero partial. */
    k_sum_squares<<<blocks, kThreads, 0, cb->compute>>>(fptr(x), n, cb->scratch);
    LAUNCH_CHECK(cb, "sum_squares");
    k_sum_squares_final<<<1, kThreads, 0, cb->compute>>>(cb->scratch, (int)blocks, alpha, beta,
                                                         fptr(out));
    LAUNCH_CHECK(cb, "sum_squares (sum)");
    return 0;
}

int cu_embbag_forward(backend *be, const backend_buf *idx, const backend_buf *rows, int m, int s,
                      int r, int d, bool mean, backend_buf *y)
{
    cuda_backend *cb = cbe(be);
    TRY(begin_op(cb, {idx, rows}, {y}));
    unsigned blocks = (unsigned)(m < 65535 ? m : 65535);
    unsigned threads = (unsigned)(d < kThreads ? ((d + 31) / 32) * 32 : kThreads);
    k_embbag_forward<<<blocks, threads, 0, cb->compute>>>(fptr(idx), fptr(rows), m, s, r, d, mean,
                                                          fptr(y));
    LAUNCH_CHECK(cb, "embbag_forward");
    return 0;
}

int cu_embbag_backward(backend *be, const backend_buf *idx, const backend_buf *dy, int m, int s,
                       int r, int d, bool mean, backend_buf *drows)
{
    cuda_backend *cb = cbe(be);
    TRY(begin_op(cb, {idx, dy}, {drows}));
    size_t rd = (size_t)r * (size_t)d;
    k_scale_or_zero<<<grid_for(rd), kThreads, 0, cb->compute>>>(fptr(drows), rd, 0.0f);
    LAUNCH_CHECK(cb, "embbag_backward (zero)");
    if (m > 0) {
        unsigned blocks = (unsigned)(m < 65535 ? m : 65535);
        unsigned threads = (unsigned)(d < kThreads ? ((d + 31) / 32) * 32 : kThreads);
        k_embbag_backward<<<blocks, threads, 0, cb->compute>>>(fptr(idx), fptr(dy), m, s, r, d,
                                                               mean, fptr(drows));
        LAUNCH_CHECK(cb, "embbag_backward");
    }
    return 0;
}

backend_vtable make_vtable()
{
    backend_vtable vt;
    memset(&vt, 0, sizeof(vt));
    vt.name = "cuda";
    vt.close = cu_close;
    vt.buf_alloc = cu_buf_alloc;
    vt.buf_free = cu_buf_free;
    vt.host_alloc = cu_host_alloc;
    vt.host_free = cu_host_free;
    vt.upload = cu_upload;
    vt.download = cu_download;
    vt.memset_zero = cu_memset_zero;
    vt.sync = cu_sync;
    vt.event_create = cu_event_create;
    vt.event_destroy = cu_event_destroy;
    vt.event_record = cu_event_record;
    vt.event_wait = cu_event_wait;
    vt.gemm = cu_gemm;
    vt.bias_add = cu_bias_add;
    vt.col_sum = cu_col_sum;
    vt.act_forward = cu_act_forward;
    vt.act_backward = cu_act_backward;
    vt.softmax_xent = cu_softmax_xent;
    vt.axpy = cu_axpy;
    vt.scale = cu_scale;
    vt.sum_squares = cu_sum_squares;
    vt.embbag_forward = cu_embbag_forward;
    vt.embbag_backward = cu_embbag_backward;
    return vt;
}

/* Streams, events, cuBLAS and scratch of a backend whose device is current. */
int init_resources(cuda_backend *cb)
{
    CUDA_CHECK(cb, cudaStreamCreateWithFlags(&cb->compute, cudaStreamNonBlocking),
               "cudaStreamCreate(compute)");
    CUDA_CHECK(cb, cudaStreamCreateWithFlags(&cb->copy, cudaStreamNonBlocking),
               "cudaStreamCreate(copy)");
    CUDA_CHECK(cb, cudaEventCreateWithFlags(&cb->join_compute, cudaEventDisableTiming),
               "cudaEventCreate");
    CUDA_CHECK(cb, cudaEventCreateWithFlags(&cb->join_copy, cudaEventDisableTiming),
               "cudaEventCreate");
    CUDA_CHECK(cb, cudaMalloc(&cb->scratch, 2 * kMaxReduceBlocks * sizeof(double)),
               "cudaMalloc(scratch, 16.0 KiB)");
    CUBLAS_CHECK(cb, cublasCreate(&cb->blas), "cublasCreate");
    CUBLAS_CHECK(cb, cublasSetStream(cb->blas, cb->compute), "cublasSetStream");
    CUBLAS_CHECK(
        cb,
        cublasSetMathMode(cb->blas, cb->tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH),
        "cublasSetMathMode");
    return 0;
}

} // namespace

extern "C" int backend_cuda_create(const backend_options *opts, backend **out, char *err,
                                   size_t errlen)
{
    *out = NULL;
    int idx = opts->device_index;
    if (idx < 0) {
        backend_put_err(err, errlen, "GPU index %d must be >= 0", idx);
        return BACKEND_EINVAL;
    }
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        int driver = 0;
        (void)cudaDriverGetVersion(&driver);
        (void)cudaGetLastError(); /* clear, so that later calls do not report it */
        backend_put_err(err, errlen, "no CUDA device: cudaGetDeviceCount failed: %s (%s)%s",
                        cudaGetErrorString(e), cudaGetErrorName(e),
                        driver == 0 ? "; no NVIDIA driver is loaded" : "");
        return BACKEND_EUNAVAIL;
    }
    if (count <= 0) {
        backend_put_err(err, errlen, "no CUDA device: the driver reports 0 devices");
        return BACKEND_EUNAVAIL;
    }
    if (idx >= count) {
        backend_put_err(err, errlen, "no CUDA device %d: this machine has %d (valid: 0..%d)", idx,
                        count, count - 1);
        return BACKEND_EUNAVAIL;
    }
    e = cudaSetDevice(idx);
    if (e == cudaSuccess)
        e = cudaFree(0); /* creates the context now: a busy or prohibited device fails here */
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        backend_put_err(err, errlen, "CUDA device %d does not answer: %s (%s)", idx,
                        cudaGetErrorString(e), cudaGetErrorName(e));
        return BACKEND_EUNAVAIL;
    }

    cuda_backend *cb = static_cast<cuda_backend *>(calloc(1, sizeof(*cb)));
    if (cb == NULL) {
        backend_put_err(err, errlen, "out of memory");
        return BACKEND_ENOMEM;
    }
    static const backend_vtable vt = make_vtable();
    cb->base.vt = &vt;
    cb->dev = idx;
    cb->tf32 = opts->tf32;
    int rc = init_resources(cb);
    if (rc == 0) {
        /* One tiny kernel: a device this build has no code for (its kernels target sm_75 and
         * up) fails here, where "auto" can still fall back to the CPU. */
        k_probe<<<1, 1, 0, cb->compute>>>(cb->scratch);
        e = cudaGetLastError();
        if (e == cudaSuccess)
            e = cudaStreamSynchronize(cb->compute);
        if (e != cudaSuccess) {
            cudaDeviceProp prop;
            int major = 0, minor = 0;
            if (cudaGetDeviceProperties(&prop, idx) == cudaSuccess) {
                major = prop.major;
                minor = prop.minor;
            }
            (void)cudaGetLastError();
            backend_fail(&cb->base, BACKEND_EUNAVAIL,
                         "compute capability %d.%d cannot run this build's kernels: %s (%s)", major,
                         minor, cudaGetErrorString(e), cudaGetErrorName(e));
            rc = BACKEND_EUNAVAIL;
        }
    }
    if (rc != 0) {
        backend_put_err(err, errlen, "CUDA device %d: %s", idx, cb->base.errmsg);
        destroy(cb);
        return rc;
    }
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, idx) == cudaSuccess)
        snprintf(cb->base.desc, sizeof(cb->base.desc),
                 "%.96s (device %d, compute capability %d.%d, %.1f GiB), %s GEMMs", prop.name, idx,
                 prop.major, prop.minor, (double)prop.totalGlobalMem / (1024.0 * 1024.0 * 1024.0),
                 cb->tf32 ? "TF32" : "FP32");
    (void)cudaGetLastError();
    cb->base.errmsg[0] = '\0';
    *out = &cb->base;
    return 0;
}
