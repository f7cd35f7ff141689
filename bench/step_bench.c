/* ps-step-bench: one worker training step on a backend, against the time of its GEMMs alone
 * measured in the same run (bench/RESULTS.md, "CUDA backend").
 *
 *   ps-step-bench [--device cuda|cpu] [--gpu N] [--tf32] [--layers 784,4096,4096,10]
 *                 [--batch 512] [--seconds S] [--trials N]
 *
 * For the MLP of --layers at --batch it times, each as the best of --trials trials of at least
 * --seconds each, after a warm-up:
 *   gemm      the GEMMs of one step and nothing else (forward x W, backward dW and dX), on
 *             buffers of the step's shapes: the floor of the step's compute;
 *   compute   model_train_step with the gradients left on the device (every kernel of the
 *             step, the loss read back): the compute the target compares with gemm;
 *   step      model_train_step as ps-worker runs it: gradients copied to pinned host memory
 *             layer by layer (overlapping the layers below) and read by the host.
 * Inputs are random (fixed seed), labels random; the model is Glorot-initialized. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "model.h"
#include "program.h"

typedef struct bench_cfg {
    const char *device;
    int gpu;
    bool tf32;
    const char *layers;
    int batch;
    double seconds;
    int trials;
} bench_cfg;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t rng = 0x5eed;

static uint64_t next_u64(void)
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return rng >> 16;
}

/* Uniform in [-1, 1). */
static float frand(void)
{
    return (float)((double)(next_u64() >> 24) / (double)(1ull << 24)) * 2.0f - 1.0f;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: ps-step-bench [--device cuda|cpu|auto] [--gpu N] [--tf32]\n"
               "                     [--layers 784,4096,4096,10] [--batch 512] [--seconds S]\n"
               "                     [--trials N]\n"
               "Times one training step of an MLP on a backend against its GEMMs alone.\n");
}

static int parse_int(const char *flag, const char *v, int lo, int hi, int *out)
{
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno != 0 || *end != '\0' || end == v || x < lo || x > hi) {
        fprintf(stderr, "ps-step-bench: %s %s: expected an integer in %d..%d\n", flag, v, lo, hi);
        return -1;
    }
    *out = (int)x;
    return 0;
}

static int parse_args(int argc, char **argv, bench_cfg *c)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            exit(0);
        } else if (strcmp(a, "--version") == 0) {
            program_print_version(stdout, "ps-step-bench");
            exit(0);
        } else if (strcmp(a, "--tf32") == 0) {
            c->tf32 = true;
            continue;
        }
        if (strcmp(a, "--device") != 0 && strcmp(a, "--layers") != 0 && strcmp(a, "--gpu") != 0 &&
            strcmp(a, "--batch") != 0 && strcmp(a, "--trials") != 0 &&
            strcmp(a, "--seconds") != 0) {
            fprintf(stderr, "ps-step-bench: unknown option '%s' (see --help)\n", a);
            return -1;
        }
        if (v == NULL) {
            fprintf(stderr, "ps-step-bench: %s needs a value (see --help)\n", a);
            return -1;
        }
        i++;
        if (strcmp(a, "--device") == 0) {
            c->device = v;
        } else if (strcmp(a, "--layers") == 0) {
            c->layers = v;
        } else if (strcmp(a, "--gpu") == 0) {
            if (parse_int(a, v, 0, 1023, &c->gpu) != 0)
                return -1;
        } else if (strcmp(a, "--batch") == 0) {
            if (parse_int(a, v, 1, 1 << 20, &c->batch) != 0)
                return -1;
        } else if (strcmp(a, "--trials") == 0) {
            if (parse_int(a, v, 1, 1000, &c->trials) != 0)
                return -1;
        } else if (strcmp(a, "--seconds") == 0) {
            char *end;
            c->seconds = strtod(v, &end);
            if (*end != '\0' || !(c->seconds > 0.0 && c->seconds <= 600.0)) {
                fprintf(stderr, "ps-step-bench: --seconds %s: expected a number in (0, 600]\n", v);
                return -1;
            }
        } else {
            fprintf(stderr, "ps-step-bench: unknown option '%s' (see --help)\n", a);
            return -1;
        }
    }
    return 0;
}

/* Device buffers of the step's shapes, for the GEMM-only pass. */
typedef struct gemm_set {
    int L, batch;
    const int *sizes;
    backend_buf *act[MODEL_MAX_LAYERS + 1], *delta[MODEL_MAX_LAYERS + 1];
    backend_buf *w[MODEL_MAX_LAYERS + 1], *dw[MODEL_MAX_LAYERS + 1];
} gemm_set;

static int buf_random(backend *be, size_t n, backend_buf **out)
{
    int rc = backend_buf_alloc(be, n * sizeof(float), out);
    if (rc != 0)
        return rc;
    float *h = backend_host_alloc(be, n * sizeof(float));
    if (h == NULL)
        return BACKEND_ENOMEM;
    for (size_t i = 0; i < n; i++)
        h[i] = frand();
    rc = backend_upload(be, *out, 0, h, n * sizeof(float));
    if (rc == 0)
        rc = backend_sync(be);
    backend_host_free(be, h);
    return rc;
}

static int gemm_set_init(backend *be, gemm_set *g, const model_config *cfg, int batch)
{
    memset(g, 0, sizeof(*g));
    g->L = cfg->num_sizes - 1;
    g->batch = batch;
    g->sizes = cfg->sizes;
    int rc = 0;
    for (int l = 0; l <= g->L && rc == 0; l++) {
        size_t n = (size_t)batch * (size_t)cfg->sizes[l];
        rc = buf_random(be, n, &g->act[l]);
        if (rc == 0)
            rc = buf_random(be, n, &g->delta[l]);
        if (rc == 0 && l >= 1)
            rc = buf_random(be, (size_t)cfg->sizes[l - 1] * (size_t)cfg->sizes[l], &g->w[l]);
        if (rc == 0 && l >= 1)
            rc = buf_random(be, (size_t)cfg->sizes[l - 1] * (size_t)cfg->sizes[l], &g->dw[l]);
    }
    return rc;
}

static void gemm_set_free(backend *be, gemm_set *g)
{
    for (int l = 0; l <= g->L; l++) {
        backend_buf_free(be, g->act[l]);
        backend_buf_free(be, g->delta[l]);
        backend_buf_free(be, g->w[l]);
        backend_buf_free(be, g->dw[l]);
    }
}

/* The GEMMs of one step, as model.c queues them. */
static int gemm_pass(backend *be, gemm_set *g)
{
    int b = g->batch, rc = 0;
    for (int l = 1; l <= g->L && rc == 0; l++)
        rc = backend_gemm(be, false, false, b, g->sizes[l], g->sizes[l - 1], 1.0f, g->act[l - 1],
                          g->w[l], 0.0f, g->act[l]);
    for (int l = g->L; l >= 1 && rc == 0; l--) {
        rc = backend_gemm(be, true, false, g->sizes[l - 1], g->sizes[l], b, 1.0f, g->act[l - 1],
                          g->delta[l], 0.0f, g->dw[l]);
        if (rc == 0 && l > 1)
            rc = backend_gemm(be, false, true, b, g->sizes[l - 1], g->sizes[l], 1.0f, g->delta[l],
                              g->w[l], 0.0f, g->delta[l - 1]);
    }
    return rc;
}

typedef int (*pass_fn)(void *arg);

static int run_gemm(void *arg)
{
    void **a = arg;
    return gemm_pass(a[0], a[1]);
}

static int run_step(void *arg)
{
    model *m = arg;
    model_stats st;
    return model_train_step(m, NULL, NULL, &st);
}

/* Best seconds per pass over `trials` trials of at least `seconds` each; the passes of a
 * trial are queued back to back and the trial ends with a sync. Returns -1.0 on error. */
static double time_pass(backend *be, pass_fn fn, void *arg, double seconds, int trials)
{
    for (int w = 0; w < 3; w++) /* warm-up: cuBLAS picks kernels, pages are touched */
        if (fn(arg) != 0 || backend_sync(be) != 0)
            return -1.0;
    double best = INFINITY;
    for (int t = 0; t < trials; t++) {
        long n = 0;
        double t0 = now_s(), el;
        do {
            if (fn(arg) != 0)
                return -1.0;
            n++;
            if (n % 4 == 0 && backend_sync(be) != 0)
                return -1.0;
            el = now_s() - t0;
        } while (el < seconds || n < 5);
        if (backend_sync(be) != 0)
            return -1.0;
        el = now_s() - t0;
        if (el / (double)n < best)
            best = el / (double)n;
    }
    return best;
}

int main(int argc, char **argv)
{
    bench_cfg c = {.device = "cuda",
                   .gpu = 0,
                   .tf32 = false,
                   .layers = "784,4096,4096,10",
                   .batch = 512,
                   .seconds = 2.0,
                   .trials = 3};
    if (parse_args(argc, argv, &c) != 0)
        return 2;
    char err[512];
    model_config cfg;
    memset(&cfg, 0, sizeof(cfg));
    if (model_parse_layers(c.layers, &cfg, err, sizeof(err)) != 0) {
        fprintf(stderr, "ps-step-bench: --layers %s: %s\n", c.layers, err);
        return 2;
    }
    cfg.act = BACKEND_ACT_RELU;
    backend_options bo;
    backend_options_init(&bo);
    bo.device_index = c.gpu;
    bo.tf32 = c.tf32;
    backend *be = NULL;
    const char *why = NULL;
    if (backend_open(c.device, &bo, &be, &why, err, sizeof(err)) != 0) {
        fprintf(stderr, "ps-step-bench: --device %s: %s\n", c.device, err);
        return 2;
    }
    if (why != NULL)
        printf("%s\n", why);
    const char *desc = backend_desc(be);
    printf("backend %s%s%s; MLP %s relu, batch %d; best of %d trials of >= %.1f s\n",
           backend_name(be), desc[0] ? ": " : "", desc, c.layers, c.batch, c.trials, c.seconds);

    int rc = 1;
    model *m = NULL;
    gemm_set g;
    memset(&g, 0, sizeof(g));
    if (model_create(be, &cfg, c.batch, "bench", &m, err, sizeof(err)) != 0) {
        fprintf(stderr, "ps-step-bench: model: %s\n", err);
        goto out;
    }
    model_init_glorot(m, 1);
    float *x = malloc((size_t)c.batch * (size_t)cfg.sizes[0] * sizeof(float));
    int32_t *y = malloc((size_t)c.batch * sizeof(int32_t));
    if (x == NULL || y == NULL) {
        free(x);
        free(y);
        fprintf(stderr, "ps-step-bench: out of memory\n");
        goto out;
    }
    for (size_t i = 0; i < (size_t)c.batch * (size_t)cfg.sizes[0]; i++)
        x[i] = 0.5f * (frand() + 1.0f);
    for (int i = 0; i < c.batch; i++)
        y[i] = (int32_t)(next_u64() % (uint64_t)cfg.sizes[cfg.num_sizes - 1]);
    int mrc = model_upload_params(m);
    if (mrc == 0)
        mrc = model_set_batch(m, x, y, c.batch);
    free(x);
    free(y);
    if (mrc != 0) {
        fprintf(stderr, "ps-step-bench: %s\n", model_errmsg(m));
        goto out;
    }
    if (gemm_set_init(be, &g, &cfg, c.batch) != 0) {
        fprintf(stderr, "ps-step-bench: buffers: %s\n", backend_errmsg(be));
        goto out;
    }

    double flops = 0.0; /* of the GEMMs of one step */
    for (int l = 1; l < cfg.num_sizes; l++)
        flops += 2.0 * c.batch * cfg.sizes[l - 1] * cfg.sizes[l] * (l > 1 ? 3.0 : 2.0);
    size_t grad_bytes = model_total_params(m) * sizeof(float);

    void *gargs[2] = {be, &g};
    double t_gemm = time_pass(be, run_gemm, gargs, c.seconds, c.trials);
    model_set_grad_download(m, false);
    double t_compute = time_pass(be, run_step, m, c.seconds, c.trials);
    model_set_grad_download(m, true);
    double t_step = time_pass(be, run_step, m, c.seconds, c.trials);
    if (t_gemm < 0 || t_compute < 0 || t_step < 0) {
        fprintf(stderr, "ps-step-bench: %s %s\n", backend_errmsg(be), model_errmsg(m));
        goto out;
    }
    printf("%-8s %10s %12s %10s %14s\n", "pass", "ms/step", "samples/s", "x gemm", "");
    printf("%-8s %10.3f %12.0f %10.2f %14s\n", "gemm", t_gemm * 1e3, c.batch / t_gemm, 1.0, "");
    printf("%-8s %10.3f %12.0f %10.2f %14s\n", "compute", t_compute * 1e3, c.batch / t_compute,
           t_compute / t_gemm, "(grads on device)");
    printf("%-8s %10.3f %12.0f %10.2f %14s\n", "step", t_step * 1e3, c.batch / t_step,
           t_step / t_gemm, "(grads to host)");
    printf("gemm: %.1f GFLOP per step, %.1f TFLOP/s; gradients %.1f MiB per step (%.1f GB/s to "
           "host in the step pass)\n",
           flops * 1e-9, flops / t_gemm * 1e-12, (double)grad_bytes / (1024.0 * 1024.0),
           (double)grad_bytes / t_step * 1e-9);
    printf("result: compute %.2fx gemm (target <= 1.30x): %s\n", t_compute / t_gemm,
           t_compute / t_gemm <= 1.30 ? "met" : "not met");
    rc = 0;
out:
    gemm_set_free(be, &g);
    model_destroy(m);
    backend_close(be);
    return rc;
}
