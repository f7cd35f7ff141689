/* Server-side optimizers: see optimizer.h for the contracts.
 *
 * The apply loops are the server's hot path (one pass over up to 64 MiB per
 * push). Each kind has its own loop with restrict-qualified pointers and no
 * branches, so that the compiler vectorizes SGD, momentum and Adagrad (Adam
 * calls libm per element and stays scalar unless libmvec is allowed). */
#include "optimizer.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static const char *const kind_names[OPTIMIZER_KIND_COUNT] = {"sgd", "momentum", "adagrad", "adam"};

static bool kind_valid(optimizer_kind k)
{
    return (unsigned)k < OPTIMIZER_KIND_COUNT;
}

static void set_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void set_err(char *err, size_t errlen, const char *fmt, ...)
{
    if (err == NULL || errlen == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

void optimizer_params_default(optimizer_params *p, optimizer_kind kind)
{
    if (p == NULL)
        return;
    memset(p, 0, sizeof(*p));
    p->kind = kind;
    p->lr = kind == OPTIMIZER_ADAM ? 0.001f : 0.01f;
    p->momentum = 0.9f;
    p->nesterov = false;
    p->beta1 = 0.9f;
    p->beta2 = 0.999f;
    p->epsilon = kind == OPTIMIZER_ADAGRAD ? 1e-7f : 1e-8f;
    p->initial_accumulator = 0.1f;
}

/* Each check is written so that NaN fails it (comparisons with NaN are false). */
static int check_unit_interval(const char *field, float v, char *err, size_t errlen)
{
    if (isfinite(v) && v >= 0.0f && v < 1.0f)
        return 0;
    set_err(err, errlen, "optimizer: %s = %g: must be in [0, 1)", field, (double)v);
    return -1;
}

static int check_positive(const char *field, float v, char *err, size_t errlen)
{
    if (isfinite(v) && v > 0.0f)
        return 0;
    set_err(err, errlen, "optimizer: %s = %g: must be finite and > 0", field, (double)v);
    return -1;
}

int optimizer_validate(const optimizer_params *p, char *err, size_t errlen)
{
    if (p == NULL) {
        set_err(err, errlen, "optimizer: params = NULL");
        return -1;
    }
    if (!kind_valid(p->kind)) {
        set_err(err, errlen, "optimizer: kind = %d: unknown optimizer kind", (int)p->kind);
        return -1;
    }
    if (check_positive("lr", p->lr, err, errlen) != 0)
        return -1;
    switch (p->kind) {
    case OPTIMIZER_SGD:
        return 0;
    case OPTIMIZER_MOMENTUM:
        return check_unit_interval("momentum", p->momentum, err, errlen);
    case OPTIMIZER_ADAGRAD:
        if (check_positive("epsilon", p->epsilon, err, errlen) != 0)
            return -1;
        if (!(isfinite(p->initial_accumulator) && p->initial_accumulator >= 0.0f)) {
            set_err(err, errlen, "optimizer: initial_accumulator = %g: must be finite and >= 0",
                    (double)p->initial_accumulator);
            return -1;
        }
        return 0;
    case OPTIMIZER_ADAM:
        if (check_unit_interval("beta1", p->beta1, err, errlen) != 0)
            return -1;
        if (check_unit_interval("beta2", p->beta2, err, errlen) != 0)
            return -1;
        return check_positive("epsilon", p->epsilon, err, errlen);
    }
    return -1; /* unreachable: kind_valid() above */
}

const char *optimizer_name(optimizer_kind k)
{
    return kind_valid(k) ? kind_names[k] : "unknown";
}

static int ascii_lower(int c)
{
    return c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c;
}

static bool ascii_ieq(const char *a, const char *b)
{
    for (; *a != '\0' && *b != '\0'; a++, b++) {
        if (ascii_lower((unsigned char)*a) != ascii_lower((unsigned char)*b))
            return false;
    }
    return *a == *b;
}

int optimizer_parse(const char *name, optimizer_kind *out)
{
    if (name == NULL || out == NULL)
        return -1;
    for (int k = 0; k < OPTIMIZER_KIND_COUNT; k++) {
        if (ascii_ieq(name, kind_names[k])) {
            *out = (optimizer_kind)k;
            return 0;
        }
    }
    return -1;
}

size_t optimizer_slot_count(optimizer_kind k)
{
    switch (k) {
    case OPTIMIZER_SGD:
        return 0;
    case OPTIMIZER_MOMENTUM:
    case OPTIMIZER_ADAGRAD:
        return 1;
    case OPTIMIZER_ADAM:
        return 3;
    }
    return 0;
}

static void fill_floats(float *restrict a, float v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        a[i] = v;
}

void optimizer_init_slots(const optimizer_params *p, float *const *slots, size_t n)
{
    if (p == NULL || slots == NULL || n == 0 || !kind_valid(p->kind))
        return;
    size_t ns = optimizer_slot_count(p->kind);
    for (size_t s = 0; s < ns; s++) {
        if (slots[s] == NULL)
            return;
    }
    for (size_t s = 0; s < ns; s++)
        fill_floats(slots[s], p->kind == OPTIMIZER_ADAGRAD ? p->initial_accumulator : 0.0f, n);
}

/* Reads the i-th float of an unaligned buffer; memcpy of 4 bytes compiles to a
 * plain (unaligned) load, and keeps the access free of strict-aliasing and
 * alignment undefined behaviour. */
static inline float load_grad(const unsigned char *restrict g, size_t i)
{
    float v;
    memcpy(&v, g + i * sizeof(float), sizeof(float));
    return v;
}

/* The update loops are compiled twice, for AVX2 and for the x86-64 baseline (SSE2), and the
 * dynamic loader picks one for the CPU at start-up (GCC function multiversioning). The build
 * uses ISO C (-std=c11), so no multiply-add is contracted into an FMA: both versions compute
 * the same IEEE operations in the same order and give bit-identical results. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__)
#define OPT_LOOP __attribute__((target_clones("avx2", "default")))
#else
#define OPT_LOOP
#endif

OPT_LOOP static void apply_sgd(float lr, float *restrict w, const unsigned char *restrict g,
                               size_t n)
{
    for (size_t i = 0; i < n; i++)
        w[i] -= lr * load_grad(g, i);
}

/* TensorFlow's ApplyMomentum: the accumulator is a = mu*a + g (no (1 - mu)
 * dampening) and the step is lr*a; Nesterov looks ahead: lr*(g + mu*a). */
OPT_LOOP static void apply_momentum(float lr, float mu, float *restrict w,
                                    const unsigned char *restrict g, float *restrict a, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float gi = load_grad(g, i);
        float ai = mu * a[i] + gi;
        a[i] = ai;
        w[i] -= lr * ai;
    }
}

OPT_LOOP static void apply_nesterov(float lr, float mu, float *restrict w,
                                    const unsigned char *restrict g, float *restrict a, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float gi = load_grad(g, i);
        float ai = mu * a[i] + gi;
        a[i] = ai;
        w[i] -= lr * (gi + mu * ai);
    }
}

/* Adagrad with epsilon added outside the square root, as Keras/TF2's Adagrad
 * (and TF1's ApplyAdagradV2): p -= lr*g/(sqrt(acc) + eps). TF1's ApplyAdagrad
 * had no epsilon at all and relied on initial_accumulator > 0; with epsilon
 * outside the root, initial_accumulator = 0 is also safe. */
OPT_LOOP static void apply_adagrad(float lr, float eps, float *restrict w,
                                   const unsigned char *restrict g, float *restrict acc, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float gi = load_grad(g, i);
        float ac = acc[i] + gi * gi;
        acc[i] = ac;
        w[i] -= lr * gi / (sqrtf(ac) + eps);
    }
}

/* Adam (Kingma & Ba, algorithm 1, epsilon outside the root) with a per-element
 * step count t: ranges of one variable are pushed as independent chunks, so
 * the step count cannot be a per-variable scalar. t is stored as float, which
 * counts exactly up to 2^24 steps; beyond that t stops growing, which is
 * harmless because both bias corrections are 1 to float precision by then.
 *
 * The bias corrections 1 - b^t are computed as -expm1(t*ln(b)) rather than
 * 1 - powf(b, t): the expm1 form keeps full relative precision when b^t is
 * close to 1 (small t, b2 = 0.999), where 1 - powf(b, t) cancels to ~1e-4
 * relative error.
 *
 * Speed: two libm calls per element cost ~25 ns/element (0.4 s for a 64 MiB
 * tensor), so the range is processed in blocks of ADAM_BLOCK elements; a block
 * whose elements all have the same t (the usual case: a server receives whole
 * ranges) computes the corrections once and runs a branch-free vectorizable
 * loop; other blocks compute them per element. Both loops evaluate the same
 * expressions, so an element's result does not depend on its neighbours. */
#define ADAM_BLOCK 1024

typedef struct adam_consts {
    float lr, b1, omb1, b2, omb2, eps;
    float l1, l2; /* ln(b1), ln(b2); -inf for b = 0 */
} adam_consts;

/* 1 - b^t given l = ln(b). b = 0 gives t*l = -inf and expm1f(-inf) = -1: 1. */
static inline float bias_correction(float t, float l)
{
    return -expm1f(t * l);
}

static bool all_equal(const float *restrict t, size_t n, float t0)
{
    int ne = 0;
    for (size_t i = 0; i < n; i++)
        ne |= t[i] != t0; /* NaN counts as different */
    return ne == 0;
}

/* Every t[i] equals tn - 1: corrections hoisted out of the loop. */
OPT_LOOP static void adam_uniform_t(const adam_consts *c, float tn, float *restrict w,
                                    const unsigned char *restrict g, float *restrict m,
                                    float *restrict v, float *restrict t, size_t n)
{
    const float lr = c->lr, b1 = c->b1, omb1 = c->omb1, b2 = c->b2, omb2 = c->omb2, eps = c->eps;
    const float bc1 = bias_correction(tn, c->l1), bc2 = bias_correction(tn, c->l2);
    for (size_t i = 0; i < n; i++) {
        float gi = load_grad(g, i);
        float mi = b1 * m[i] + omb1 * gi;
        float vi = b2 * v[i] + omb2 * gi * gi;
        t[i] = tn;
        m[i] = mi;
        v[i] = vi;
        w[i] -= lr * (mi / bc1) / (sqrtf(vi / bc2) + eps);
    }
}

OPT_LOOP static void adam_mixed_t(const adam_consts *c, float *restrict w,
                                  const unsigned char *restrict g, float *restrict m,
                                  float *restrict v, float *restrict t, size_t n)
{
    const float lr = c->lr, b1 = c->b1, omb1 = c->omb1, b2 = c->b2, omb2 = c->omb2, eps = c->eps;
    for (size_t i = 0; i < n; i++) {
        float gi = load_grad(g, i);
        float ti = t[i] + 1.0f;
        float mi = b1 * m[i] + omb1 * gi;
        float vi = b2 * v[i] + omb2 * gi * gi;
        t[i] = ti;
        m[i] = mi;
        v[i] = vi;
        float bc1 = bias_correction(ti, c->l1), bc2 = bias_correction(ti, c->l2);
        w[i] -= lr * (mi / bc1) / (sqrtf(vi / bc2) + eps);
    }
}

static void apply_adam(const optimizer_params *p, float *restrict w,
                       const unsigned char *restrict g, float *restrict m, float *restrict v,
                       float *restrict t, size_t n)
{
    const adam_consts c = {
        .lr = p->lr,
        .b1 = p->beta1,
        .omb1 = 1.0f - p->beta1,
        .b2 = p->beta2,
        .omb2 = 1.0f - p->beta2,
        .eps = p->epsilon,
        .l1 = (float)log1p((double)p->beta1 - 1.0), /* b - 1 is exact in double */
        .l2 = (float)log1p((double)p->beta2 - 1.0),
    };
    for (size_t off = 0; off < n; off += ADAM_BLOCK) {
        size_t k = n - off < ADAM_BLOCK ? n - off : ADAM_BLOCK;
        float t0 = t[off];
        if (all_equal(t + off, k, t0))
            adam_uniform_t(&c, t0 + 1.0f, w + off, g + off * sizeof(float), m + off, v + off,
                           t + off, k);
        else
            adam_mixed_t(&c, w + off, g + off * sizeof(float), m + off, v + off, t + off, k);
    }
}

void optimizer_apply(const optimizer_params *p, float *params, const void *grad,
                     float *const *slots, size_t n)
{
    if (p == NULL || params == NULL || grad == NULL || n == 0 || !kind_valid(p->kind))
        return;
    size_t ns = optimizer_slot_count(p->kind);
    if (ns > 0) {
        if (slots == NULL)
            return;
        for (size_t s = 0; s < ns; s++) {
            if (slots[s] == NULL)
                return;
        }
    }
    const unsigned char *g = grad;
    switch (p->kind) {
    case OPTIMIZER_SGD:
        apply_sgd(p->lr, params, g, n);
        break;
    case OPTIMIZER_MOMENTUM:
        if (p->nesterov)
            apply_nesterov(p->lr, p->momentum, params, g, slots[0], n);
        else
            apply_momentum(p->lr, p->momentum, params, g, slots[0], n);
        break;
    case OPTIMIZER_ADAGRAD:
        apply_adagrad(p->lr, p->epsilon, params, g, slots[0], n);
        break;
    case OPTIMIZER_ADAM:
        apply_adam(p, params, g, slots[0], slots[1], slots[2], n);
        break;
    }
}
