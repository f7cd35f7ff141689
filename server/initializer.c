/* Deterministic, shard-independent initializers: see initializer.h.
 *
 * Generator: for a (seed, stream) pair a 64-bit key is derived once; the bits
 * of element i are splitmix64's output at position i from that key,
 *   bits(i) = mix64(key + (i + 1) * golden),
 * which is a pure function of (seed, stream, i). Uniform doubles take the top
 * 53 bits: u = (bits >> 11) * 2^-53, in [0, 1). Normal values use Box-Muller
 * on the uniforms of streams 0 and 1 at the same index. The random kinds call
 * only basic double arithmetic (UNIFORM, GLOROT) or log, sqrt and cos (NORMAL);
 * the float32 results are the same across libm implementations except, rarely,
 * for a NORMAL value one float ulp away. */
#include "initializer.h"

#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>

#include "hash.h"
#include "util.h"

#define GOLDEN_GAMMA UINT64_C(0x9E3779B97F4A7C15)
#define TWO_PI 6.283185307179586476925286766559

static const char *const kind_names[INITIALIZER_KIND_COUNT] = {"zeros", "constant", "uniform",
                                                               "normal", "glorot_uniform"};

static bool kind_valid(initializer_kind k)
{
    return (unsigned)k < INITIALIZER_KIND_COUNT;
}

static uint64_t stream_key(uint64_t seed, uint64_t stream)
{
    return mix64(mix64(seed) ^ mix64(stream * GOLDEN_GAMMA + UINT64_C(0x3C6EF372FE94F82A)));
}

/* Uniform double in [0, 1) for element i of the stream with the given key. */
static inline double unit_uniform(uint64_t key, uint64_t i)
{
    return (double)(mix64(key + (i + 1) * GOLDEN_GAMMA) >> 11) * 0x1.0p-53;
}

/* Smallest float >= x (x within float range). */
static float float_ceil(double x)
{
    float f = (float)x;
    if ((double)f < x)
        f = nextafterf(f, INFINITY);
    return f;
}

/* Largest float <= x (x within float range). */
static float float_floor(double x)
{
    float f = (float)x;
    if ((double)f > x)
        f = nextafterf(f, -INFINITY);
    return f;
}

/* Largest float < x (x within float range). */
static float float_below(double x)
{
    float f = float_floor(x);
    if ((double)f == x)
        f = nextafterf(f, -INFINITY);
    return f;
}

static bool in_float_range(double x)
{
    return isfinite(x) && fabs(x) <= (double)FLT_MAX;
}

static double glorot_limit(const uint64_t *shape, size_t ndims)
{
    double fan_in, fan_out;
    initializer_fan(shape, ndims, &fan_in, &fan_out);
    /* Keras' VarianceScaling(fan_avg) divides by max(1, (fan_in + fan_out)/2): equal to
     * sqrt(6/(fan_in + fan_out)) for every variable with at least one element, and
     * finite for an empty one. */
    double avg = (fan_in + fan_out) / 2.0;
    return sqrt(3.0 / (avg > 1.0 ? avg : 1.0));
}

int initializer_validate(const initializer_params *p, const uint64_t *shape, size_t ndims,
                         char *err, size_t errlen)
{
    if (p == NULL) {
        errf(err, errlen, "initializer: params = NULL");
        return -1;
    }
    if (!kind_valid(p->kind)) {
        errf(err, errlen, "initializer: kind = %d: unknown initializer kind", (int)p->kind);
        return -1;
    }
    if (shape == NULL && ndims > 0) {
        errf(err, errlen, "initializer: shape = NULL with ndims = %zu", ndims);
        return -1;
    }
    switch (p->kind) {
    case INITIALIZER_ZEROS:
    case INITIALIZER_GLOROT_UNIFORM:
        return 0;
    case INITIALIZER_CONSTANT:
        if (!in_float_range(p->a)) {
            errf(err, errlen, "initializer: a = %g: constant must be finite within float32 range",
                 p->a);
            return -1;
        }
        return 0;
    case INITIALIZER_UNIFORM:
        if (!in_float_range(p->a)) {
            errf(err, errlen,
                 "initializer: a = %g: uniform bound must be finite within float32 range", p->a);
            return -1;
        }
        if (!in_float_range(p->b)) {
            errf(err, errlen,
                 "initializer: b = %g: uniform bound must be finite within float32 range", p->b);
            return -1;
        }
        if (!(p->a < p->b)) {
            errf(err, errlen, "initializer: b = %g: uniform range [a, b) needs a < b (a = %g)",
                 p->b, p->a);
            return -1;
        }
        if (!((double)float_ceil(p->a) < p->b)) {
            errf(err, errlen,
                 "initializer: b = %g: uniform range [a = %g, b) holds no float32 value", p->b,
                 p->a);
            return -1;
        }
        return 0;
    case INITIALIZER_NORMAL:
        if (!in_float_range(p->a)) {
            errf(err, errlen,
                 "initializer: a = %g: normal mean must be finite within float32 range", p->a);
            return -1;
        }
        if (!(isfinite(p->b) && p->b > 0.0)) {
            errf(err, errlen, "initializer: b = %g: normal stddev must be finite and > 0", p->b);
            return -1;
        }
        /* |z| <= sqrt(-2 ln 2^-53) < 8.6, so |value| < |a| + 10 b. */
        if (!(fabs(p->a) + 10.0 * p->b <= (double)FLT_MAX)) {
            errf(err, errlen, "initializer: b = %g: normal stddev too large for float32 (a = %g)",
                 p->b, p->a);
            return -1;
        }
        return 0;
    }
    return -1; /* unreachable: kind_valid() above */
}

const char *initializer_name(initializer_kind k)
{
    return enum_name(ENUM_NAMES(kind_names), (int)k, "unknown");
}

int initializer_parse(const char *name, initializer_kind *out)
{
    int k;
    if (out == NULL || enum_parse(ENUM_NAMES(kind_names), name, &k) != 0)
        return -1;
    *out = (initializer_kind)k;
    return 0;
}

void initializer_fan(const uint64_t *shape, size_t ndims, double *fan_in, double *fan_out)
{
    double fi, fo;
    if (ndims == 0) {
        fi = fo = 1.0;
    } else if (shape == NULL) {
        fi = fo = 0.0;
    } else if (ndims == 1) {
        fi = fo = (double)shape[0];
    } else {
        double rf = 1.0;
        for (size_t d = 0; d + 2 < ndims; d++)
            rf *= (double)shape[d];
        fi = (double)shape[ndims - 2] * rf;
        fo = (double)shape[ndims - 1] * rf;
    }
    if (fan_in != NULL)
        *fan_in = fi;
    if (fan_out != NULL)
        *fan_out = fo;
}

/* Uniform on [lo, hi] in float: lo + (hi - lo)*u computed in double, rounded to
 * float and clamped into [flo, fhi] (the float rounding of a value just below
 * hi may round up to hi or past it). */
static void fill_uniform(uint64_t key, uint64_t offset, double lo, double hi, float flo, float fhi,
                         float *out, size_t n)
{
    const double width = hi - lo;
    for (size_t j = 0; j < n; j++) {
        float v = (float)(lo + width * unit_uniform(key, offset + j));
        v = v < flo ? flo : v;
        out[j] = v > fhi ? fhi : v;
    }
}

static void fill_normal(uint64_t seed, uint64_t offset, double mean, double stddev, float *out,
                        size_t n)
{
    const uint64_t k0 = stream_key(seed, 0), k1 = stream_key(seed, 1);
    for (size_t j = 0; j < n; j++) {
        /* 1 - u1 is in (0, 1], so the log never sees 0. */
        double u1 = 1.0 - unit_uniform(k0, offset + j);
        double u2 = unit_uniform(k1, offset + j);
        double z = sqrt(-2.0 * log(u1)) * cos(TWO_PI * u2);
        out[j] = (float)(mean + stddev * z);
    }
}

void initializer_fill(const initializer_params *p, const uint64_t *shape, size_t ndims,
                      uint64_t offset, float *out, size_t n)
{
    if (p == NULL || out == NULL || n == 0)
        return;
    switch (p->kind) {
    case INITIALIZER_CONSTANT:
        for (size_t j = 0; j < n; j++)
            out[j] = (float)p->a;
        return;
    case INITIALIZER_UNIFORM:
        /* [a, b): results clamped into [smallest float >= a, largest float < b]. */
        fill_uniform(stream_key(p->seed, 0), offset, p->a, p->b, float_ceil(p->a),
                     float_below(p->b), out, n);
        return;
    case INITIALIZER_NORMAL:
        fill_normal(p->seed, offset, p->a, p->b, out, n);
        return;
    case INITIALIZER_GLOROT_UNIFORM: {
        double l = glorot_limit(shape, ndims);
        float fl = float_floor(l);
        fill_uniform(stream_key(p->seed, 0), offset, -l, l, -fl, fl, out, n);
        return;
    }
    case INITIALIZER_ZEROS:
        break;
    }
    for (size_t j = 0; j < n; j++)
        out[j] = 0.0f;
}

uint64_t initializer_row_seed(uint64_t seed, uint64_t table_key, int64_t id)
{
    uint64_t h = mix64(seed + GOLDEN_GAMMA);
    h = mix64(h ^ table_key);
    return mix64(h + (uint64_t)id * GOLDEN_GAMMA);
}

void initializer_fill_row(const initializer_params *p, uint64_t table_key, int64_t id, float *out,
                          size_t dim)
{
    if (p == NULL || out == NULL)
        return;
    initializer_params row = *p;
    row.seed = initializer_row_seed(p->seed, table_key, id);
    uint64_t shape[1] = {dim};
    initializer_fill(&row, shape, 1, 0, out, dim);
}
