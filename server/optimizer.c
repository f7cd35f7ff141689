/* Server-side optimizers: see optimizer.h for the contracts.
 *
 * Every optimizer is one row of `registry` below: its slot count, the checks of the fields it
 * uses, the initial values of its slots and its update.
 * Names and numbers come from common/optimizers.h.
 *
 * The apply loops are the server's hot path (one pass over up to 64 MiB per
 * push). Each kind has its own loop with restrict-qualified pointers and no
 * branches, so that the compiler vectorizes SGD, momentum and Adagrad (Adam
 * calls libm per element and stays scalar unless libmvec is allowed). */
#include "optimizer.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "util.h"

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

/* Row-wise Adagrad (FBGEMM's EXACT_ROWWISE_ADAGRAD, TorchRec's default for embeddings): one
 * accumulator per row takes the mean of the row's squared gradient, and every element of the
 * row steps by lr*g/(sqrt(acc) + eps). */
OPT_LOOP static float row_mean_square(const unsigned char *restrict g, size_t n)
{
    float s = 0.0f;
    for (size_t i = 0; i < n; i++) {
        float gi = load_grad(g, i);
        s += gi * gi;
    }
    return s / (float)n;
}

OPT_LOOP static void apply_scaled(float rate, float *restrict w, const unsigned char *restrict g,
                                  size_t n)
{
    for (size_t i = 0; i < n; i++)
        w[i] -= rate * load_grad(g, i);
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

/* A table row's Adam step: its one step count t (optimizer_apply_row), the corrections
 * computed once as in adam_uniform_t, so that a row gets the values a range of a variable
 * whose elements all had step t - 1 would. */
OPT_LOOP static void adam_row(const adam_consts *c, float tn, float *restrict w,
                              const unsigned char *restrict g, float *restrict m, float *restrict v,
                              size_t n)
{
    const float lr = c->lr, b1 = c->b1, omb1 = c->omb1, b2 = c->b2, omb2 = c->omb2, eps = c->eps;
    const float bc1 = bias_correction(tn, c->l1), bc2 = bias_correction(tn, c->l2);
    for (size_t i = 0; i < n; i++) {
        float gi = load_grad(g, i);
        float mi = b1 * m[i] + omb1 * gi;
        float vi = b2 * v[i] + omb2 * gi * gi;
        m[i] = mi;
        v[i] = vi;
        w[i] -= lr * (mi / bc1) / (sqrtf(vi / bc2) + eps);
    }
}

static adam_consts adam_consts_of(const optimizer_params *p)
{
    return (adam_consts){
        .lr = p->learning_rate,
        .b1 = p->beta1,
        .omb1 = 1.0f - p->beta1,
        .b2 = p->beta2,
        .omb2 = 1.0f - p->beta2,
        .eps = p->epsilon,
        .l1 = (float)log1p((double)p->beta1 - 1.0), /* b - 1 is exact in double */
        .l2 = (float)log1p((double)p->beta2 - 1.0),
    };
}

static void apply_adam_loop(const optimizer_params *p, float *restrict w,
                            const unsigned char *restrict g, float *restrict m, float *restrict v,
                            float *restrict t, size_t n)
{
    const adam_consts c = adam_consts_of(p);
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

/* AdamW's decoupled weight decay: w *= 1 - lr*wd, before the Adam step (PyTorch's order). */
OPT_LOOP static void decay_weights(float keep, float *restrict w, size_t n)
{
    for (size_t i = 0; i < n; i++)
        w[i] *= keep;
}

/* FTRL-Proximal, per coordinate (McMahan et al., "Ad Click Prediction: a View from the
 * Trenches", 2013, algorithm 1), with z and n as slots and the weight written back after each
 * step, so that a pull reads the current weight like any other optimizer's. The first step
 * folds the initial weight into z (z -= s*w with n = 0 before: s = |g|/alpha), so a row's
 * initializer value is kept rather than reset. n = 0 implies z = 0 (both change only with a
 * non-zero g), so the division never sees a zero denominator: |z| <= l1 takes the 0 branch. */
OPT_LOOP static void apply_ftrl(float alpha, float beta, float l1, float l2, float *restrict w,
                                const unsigned char *restrict g, float *restrict z,
                                float *restrict nacc, size_t n)
{
    const float inv_alpha = 1.0f / alpha;
    for (size_t i = 0; i < n; i++) {
        float gi = load_grad(g, i);
        float ni = nacc[i] + gi * gi;
        float sigma = (sqrtf(ni) - sqrtf(nacc[i])) * inv_alpha;
        float zi = z[i] + gi - sigma * w[i];
        z[i] = zi;
        nacc[i] = ni;
        float az = fabsf(zi);
        float shrunk = zi > 0.0f ? zi - l1 : zi + l1;
        w[i] = az <= l1 ? 0.0f : -shrunk / ((beta + sqrtf(ni)) * inv_alpha + l2);
    }
}

/* ---- the registry ------------------------------------------------------------------------ */

typedef struct optimizer_ops {
    /* State arrays per variable (at most OPTIMIZER_MAX_SLOTS). */
    size_t slots;
    /* Checks the fields the kind uses besides learning_rate (checked for all); NULL: none. */
    int (*validate)(const optimizer_params *p, char *err, size_t errlen);
    /* Initial slot values; NULL: every slot 0. */
    void (*init)(const optimizer_params *p, float *const *slots, size_t n);
    /* The update (see optimizer_apply); NULL for a kind only table rows have. */
    void (*apply)(const optimizer_params *p, float *params, const unsigned char *grad,
                  float *const *slots, size_t n);
    /* A table row's own shape and update (optimizer_row_shape_of, optimizer_apply_row) where
     * they differ from a variable's: apply_row NULL means the row is a range of `slots`
     * arrays updated by `apply`, initialized by `init`. */
    size_t row_slots, row_scalars, row_counts;
    void (*init_row)(const optimizer_params *p, float *const *slots, float *scalars,
                     uint32_t *counts, size_t dim);
    void (*apply_row)(const optimizer_params *p, float *w, const unsigned char *grad,
                      float *const *slots, float *scalars, uint32_t *counts, size_t dim);
    /* Refused with 16-bit rows: the reason (optimizer_row_shape narrow_ok false); NULL: fine. */
    const char *not_narrow;
} optimizer_ops;

/* Each check is written so that NaN fails it (comparisons with NaN are false). */
static int check_unit_interval(const char *field, float v, char *err, size_t errlen)
{
    if (isfinite(v) && v >= 0.0f && v < 1.0f)
        return 0;
    return errf(err, errlen, "optimizer: %s = %g: must be in [0, 1)", field, (double)v);
}

static int check_positive(const char *field, float v, char *err, size_t errlen)
{
    if (isfinite(v) && v > 0.0f)
        return 0;
    return errf(err, errlen, "optimizer: %s = %g: must be finite and > 0", field, (double)v);
}

static int check_non_negative(const char *field, float v, char *err, size_t errlen)
{
    if (isfinite(v) && v >= 0.0f)
        return 0;
    return errf(err, errlen, "optimizer: %s = %g: must be finite and >= 0", field, (double)v);
}

static void sgd_apply(const optimizer_params *p, float *w, const unsigned char *g,
                      float *const *slots, size_t n)
{
    (void)slots;
    apply_sgd(p->learning_rate, w, g, n);
}

static int momentum_validate(const optimizer_params *p, char *err, size_t errlen)
{
    return check_unit_interval("momentum", p->momentum, err, errlen);
}

static void momentum_apply(const optimizer_params *p, float *w, const unsigned char *g,
                           float *const *slots, size_t n)
{
    if (p->nesterov)
        apply_nesterov(p->learning_rate, p->momentum, w, g, slots[0], n);
    else
        apply_momentum(p->learning_rate, p->momentum, w, g, slots[0], n);
}

static int adagrad_validate(const optimizer_params *p, char *err, size_t errlen)
{
    if (check_positive("epsilon", p->epsilon, err, errlen) != 0)
        return -1;
    return check_non_negative("initial_accumulator", p->initial_accumulator, err, errlen);
}

static void fill_floats(float *restrict a, float v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        a[i] = v;
}

static void adagrad_init(const optimizer_params *p, float *const *slots, size_t n)
{
    fill_floats(slots[0], p->initial_accumulator, n);
}

static void adagrad_apply(const optimizer_params *p, float *w, const unsigned char *g,
                          float *const *slots, size_t n)
{
    apply_adagrad(p->learning_rate, p->epsilon, w, g, slots[0], n);
}

static int adam_validate(const optimizer_params *p, char *err, size_t errlen)
{
    if (check_unit_interval("beta1", p->beta1, err, errlen) != 0)
        return -1;
    if (check_unit_interval("beta2", p->beta2, err, errlen) != 0)
        return -1;
    return check_positive("epsilon", p->epsilon, err, errlen);
}

static void adam_apply(const optimizer_params *p, float *w, const unsigned char *g,
                       float *const *slots, size_t n)
{
    apply_adam_loop(p, w, g, slots[0], slots[1], slots[2], n);
}

/* A row's step count: one more, saturating (t past 2^24 no longer changes the corrections). */
static float row_step(uint32_t *counts)
{
    if (counts[0] != UINT32_MAX)
        counts[0]++;
    return (float)counts[0];
}

static void adam_apply_row(const optimizer_params *p, float *w, const unsigned char *g,
                           float *const *slots, float *scalars, uint32_t *counts, size_t dim)
{
    (void)scalars;
    const adam_consts c = adam_consts_of(p);
    adam_row(&c, row_step(counts), w, g, slots[0], slots[1], dim);
}

static int adamw_validate(const optimizer_params *p, char *err, size_t errlen)
{
    if (adam_validate(p, err, errlen) != 0)
        return -1;
    if (check_non_negative("weight_decay", p->weight_decay, err, errlen) != 0)
        return -1;
    if ((double)p->learning_rate * p->weight_decay > 1.0)
        return errf(err, errlen,
                    "optimizer: learning_rate * weight_decay = %g: must be <= 1 (the decay "
                    "multiplies the weights by 1 - learning_rate * weight_decay)",
                    (double)p->learning_rate * p->weight_decay);
    return 0;
}

static void adamw_apply(const optimizer_params *p, float *w, const unsigned char *g,
                        float *const *slots, size_t n)
{
    if (p->weight_decay != 0.0f)
        decay_weights(1.0f - p->learning_rate * p->weight_decay, w, n);
    apply_adam_loop(p, w, g, slots[0], slots[1], slots[2], n);
}

static void adamw_apply_row(const optimizer_params *p, float *w, const unsigned char *g,
                            float *const *slots, float *scalars, uint32_t *counts, size_t dim)
{
    if (p->weight_decay != 0.0f)
        decay_weights(1.0f - p->learning_rate * p->weight_decay, w, dim);
    adam_apply_row(p, w, g, slots, scalars, counts, dim);
}

static void rowwise_adagrad_init_row(const optimizer_params *p, float *const *slots, float *scalars,
                                     uint32_t *counts, size_t dim)
{
    (void)slots, (void)counts, (void)dim;
    scalars[0] = p->initial_accumulator;
}

static void rowwise_adagrad_apply_row(const optimizer_params *p, float *w, const unsigned char *g,
                                      float *const *slots, float *scalars, uint32_t *counts,
                                      size_t dim)
{
    (void)slots, (void)counts;
    float acc = scalars[0] + row_mean_square(g, dim);
    scalars[0] = acc;
    apply_scaled(p->learning_rate / (sqrtf(acc) + p->epsilon), w, g, dim);
}

static int ftrl_validate(const optimizer_params *p, char *err, size_t errlen)
{
    if (check_non_negative("ftrl_beta", p->ftrl_beta, err, errlen) != 0)
        return -1;
    if (check_non_negative("l1", p->l1, err, errlen) != 0)
        return -1;
    return check_non_negative("l2", p->l2, err, errlen);
}

static void ftrl_apply(const optimizer_params *p, float *w, const unsigned char *g,
                       float *const *slots, size_t n)
{
    apply_ftrl(p->learning_rate, p->ftrl_beta, p->l1, p->l2, w, g, slots[0], slots[1], n);
}

static const optimizer_ops registry[] = {
    [OPTIMIZER_SGD] = {.slots = 0, .apply = sgd_apply},
    [OPTIMIZER_MOMENTUM] = {.slots = 1, .validate = momentum_validate, .apply = momentum_apply},
    [OPTIMIZER_ADAGRAD] = {.slots = 1,
                           .validate = adagrad_validate,
                           .init = adagrad_init,
                           .apply = adagrad_apply},
    /* A variable's t is per element (its ranges are pushed as independent chunks); a row's is
     * one counter (a row is always updated whole). */
    [OPTIMIZER_ADAM] = {.slots = 3,
                        .validate = adam_validate,
                        .apply = adam_apply,
                        .row_slots = 2,
                        .row_counts = 1,
                        .apply_row = adam_apply_row},
    [OPTIMIZER_ADAMW] = {.slots = 3,
                         .validate = adamw_validate,
                         .apply = adamw_apply,
                         .row_slots = 2,
                         .row_counts = 1,
                         .apply_row = adamw_apply_row,
                         .not_narrow = "adamw's decay multiplies the weights by 1 - learning_rate "
                                       "* weight_decay each step, a change 16-bit rounding loses"},
    /* z and n start at 0. */
    [OPTIMIZER_FTRL] = {.slots = 2, .validate = ftrl_validate, .apply = ftrl_apply},
    /* Table rows only (no variable update). */
    [OPTIMIZER_ROWWISE_ADAGRAD] = {.validate = adagrad_validate,
                                   .row_scalars = 1,
                                   .init_row = rowwise_adagrad_init_row,
                                   .apply_row = rowwise_adagrad_apply_row},
};

_Static_assert(sizeof(registry) / sizeof(registry[0]) == OPTIMIZER_KIND_COUNT,
               "one registry row per optimizer of common/optimizers.h");

static const char *const kind_names[] = {
#define PS_OPTIMIZER_NAME_(ID, name, value, lr) [value] = name,
    PS_OPTIMIZERS(PS_OPTIMIZER_NAME_)
#undef PS_OPTIMIZER_NAME_
        [OPTIMIZER_FTRL] = "ftrl",
    [OPTIMIZER_ROWWISE_ADAGRAD] = "rowwise_adagrad",
};

/* A kind is valid when it has a row with an update (a hole in the table does not count). */
bool optimizer_kind_valid(int k)
{
    return k >= 0 && k < OPTIMIZER_KIND_COUNT &&
           (registry[k].apply != NULL || registry[k].apply_row != NULL) &&
           registry[k].slots <= OPTIMIZER_MAX_SLOTS && registry[k].row_slots <= OPTIMIZER_MAX_SLOTS;
}

void optimizer_params_default(optimizer_params *p, optimizer_kind kind)
{
    if (p == NULL)
        return;
    memset(p, 0, sizeof(*p));
    p->kind = kind;
#define PS_HPARAM_DEFAULT_(field, pt, wt, def) p->field = (float)(def);
    PS_SPEC_HPARAMS(PS_HPARAM_DEFAULT_)
    PS_TABLE_HPARAMS(PS_HPARAM_DEFAULT_)
#undef PS_HPARAM_DEFAULT_
    p->nesterov = false;
#define PS_HPARAM_KIND_DEFAULT_(ID, field, def)                                                    \
    if (kind == OPTIMIZER_##ID)                                                                    \
        p->field = (float)(def);
    PS_HPARAM_KIND_DEFAULTS(PS_HPARAM_KIND_DEFAULT_)
#undef PS_HPARAM_KIND_DEFAULT_
}

int optimizer_validate(const optimizer_params *p, char *err, size_t errlen)
{
    if (p == NULL)
        return errf(err, errlen, "optimizer: params = NULL");
    if (!optimizer_kind_valid(p->kind))
        return errf(err, errlen, "optimizer: kind = %d: unknown optimizer kind", (int)p->kind);
    if (check_positive("learning_rate", p->learning_rate, err, errlen) != 0)
        return -1;
    const optimizer_ops *ops = &registry[p->kind];
    return ops->validate != NULL ? ops->validate(p, err, errlen) : 0;
}

const char *optimizer_name(optimizer_kind k)
{
    return enum_name(ENUM_NAMES(kind_names), (int)k, "unknown");
}

int optimizer_parse(const char *name, optimizer_kind *out)
{
    int k;
    if (out == NULL || enum_parse(ENUM_NAMES(kind_names), name, &k) != 0)
        return -1;
    *out = (optimizer_kind)k;
    return 0;
}

size_t optimizer_slot_count(optimizer_kind k)
{
    return optimizer_kind_valid(k) ? registry[k].slots : 0;
}

/* True when every slot pointer the kind needs is there. */
static bool slots_present(const optimizer_ops *ops, float *const *slots)
{
    if (ops->slots == 0)
        return true;
    if (slots == NULL)
        return false;
    for (size_t s = 0; s < ops->slots; s++) {
        if (slots[s] == NULL)
            return false;
    }
    return true;
}

void optimizer_init_slots(const optimizer_params *p, float *const *slots, size_t n)
{
    if (p == NULL || slots == NULL || n == 0 || !optimizer_kind_valid(p->kind))
        return;
    const optimizer_ops *ops = &registry[p->kind];
    if (!slots_present(ops, slots))
        return;
    if (ops->init != NULL) {
        ops->init(p, slots, n);
        return;
    }
    for (size_t s = 0; s < ops->slots; s++)
        fill_floats(slots[s], 0.0f, n);
}

size_t optimizer_apply_finite(const optimizer_params *p, float *params, const void *grad,
                              float *const *slots, size_t n, size_t *first_bad)
{
    enum { BLOCK = 1024 };
    float saved[(1 + OPTIMIZER_MAX_SLOTS) * BLOCK];
    size_t nslots = optimizer_kind_valid(p->kind) ? optimizer_slot_count(p->kind) : 0, bad = 0;
    const unsigned char *g = grad;
    for (size_t k = 0; k < n; k += BLOCK) {
        size_t m = n - k < BLOCK ? n - k : BLOCK;
        float *bs[OPTIMIZER_MAX_SLOTS] = {0};
        memcpy(saved, params + k, m * sizeof(float));
        for (size_t s = 0; s < nslots; s++) {
            bs[s] = slots[s] + k;
            memcpy(saved + (s + 1) * BLOCK, bs[s], m * sizeof(float));
        }
        optimizer_apply(p, params + k, g + k * sizeof(float), bs, m);
        for (size_t i = 0; i < m; i++) {
            bool finite = isfinite(params[k + i]);
            for (size_t s = 0; s < nslots; s++)
                finite = finite && isfinite(bs[s][i]);
            if (finite)
                continue;
            params[k + i] = saved[i];
            for (size_t s = 0; s < nslots; s++)
                bs[s][i] = saved[(s + 1) * BLOCK + i];
            if (bad++ == 0)
                *first_bad = k + i;
        }
    }
    return bad;
}

void optimizer_apply(const optimizer_params *p, float *params, const void *grad,
                     float *const *slots, size_t n)
{
    if (p == NULL || params == NULL || grad == NULL || n == 0 || !optimizer_kind_valid(p->kind))
        return;
    const optimizer_ops *ops = &registry[p->kind];
    if (ops->apply == NULL || !slots_present(ops, slots))
        return;
    ops->apply(p, params, grad, slots, n);
}

void optimizer_row_shape_of(optimizer_kind k, optimizer_row_shape *out)
{
    memset(out, 0, sizeof(*out));
    if (!optimizer_kind_valid(k))
        return;
    const optimizer_ops *ops = &registry[k];
    out->slots = ops->apply_row != NULL ? ops->row_slots : ops->slots;
    out->scalars = ops->row_scalars;
    out->counts = ops->row_counts;
    out->narrow_ok = ops->not_narrow == NULL;
}

const char *optimizer_not_narrow(optimizer_kind k)
{
    return optimizer_kind_valid(k) ? registry[k].not_narrow : NULL;
}

void optimizer_init_row(const optimizer_params *p, float *const *slots, float *scalars,
                        uint32_t *counts, size_t dim)
{
    if (p == NULL || !optimizer_kind_valid(p->kind))
        return;
    const optimizer_ops *ops = &registry[p->kind];
    if (ops->apply_row == NULL) {
        optimizer_init_slots(p, slots, dim);
        return;
    }
    for (size_t s = 0; s < ops->row_slots; s++)
        fill_floats(slots[s], 0.0f, dim);
    fill_floats(scalars, 0.0f, ops->row_scalars);
    for (size_t c = 0; c < ops->row_counts; c++)
        counts[c] = 0;
    if (ops->init_row != NULL)
        ops->init_row(p, slots, scalars, counts, dim);
}

void optimizer_apply_row(const optimizer_params *p, float *w, const void *grad, float *const *slots,
                         float *scalars, uint32_t *counts, size_t dim)
{
    if (p == NULL || !optimizer_kind_valid(p->kind) || dim == 0)
        return;
    const optimizer_ops *ops = &registry[p->kind];
    if (ops->apply_row == NULL)
        ops->apply(p, w, grad, slots, dim);
    else
        ops->apply_row(p, w, grad, slots, scalars, counts, dim);
}
