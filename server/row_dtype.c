/* The storage types of table parameters: see row_dtype.h. bfloat16 uses the wire's conversion
 * (common/frame.h); float16 is converted here, exactly as IEEE 754 binary16 with round to
 * nearest, ties to even (subnormals included). */
#include "row_dtype.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>

#include "frame.h"

size_t row_dtype_size(row_dtype d)
{
    switch (d) {
    case ROW_FLOAT32:
        return 4;
    case ROW_BFLOAT16:
    case ROW_FLOAT16:
        return 2;
    }
    return 0;
}

const char *row_dtype_name(row_dtype d)
{
    switch (d) {
    case ROW_FLOAT32:
        return "float32";
    case ROW_BFLOAT16:
        return "bfloat16";
    case ROW_FLOAT16:
        return "float16";
    }
    return "unknown";
}

static float f32_of_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

static uint32_t bits_of_f32(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

/* float32 to binary16, round to nearest even: subnormal results by a float addition that
 * lines the mantissa up (the FPU rounds), normal ones by adding half an ulp (plus the odd bit)
 * before the shift, whose carry also rounds up into the next exponent or infinity. */
static uint16_t f16_of_f32(float f)
{
    uint32_t x = bits_of_f32(f);
    uint32_t sign = x & 0x80000000u;
    x ^= sign;
    uint16_t o;
    if (x >= (127u + 16u) << 23) { /* 2^16 and up, inf, NaN */
        o = x > 0x7f800000u ? 0x7e00u : 0x7c00u;
    } else if (x < 113u << 23) { /* below 2^-14: binary16 subnormal or zero */
        const uint32_t magic = ((127u - 15u) + (23u - 10u) + 1u) << 23;
        o = (uint16_t)(bits_of_f32(f32_of_bits(x) + f32_of_bits(magic)) - magic);
    } else {
        uint32_t odd = (x >> 13) & 1u;
        x += ((uint32_t)(15 - 127) << 23) + 0xfffu + odd;
        o = (uint16_t)(x >> 13);
    }
    return (uint16_t)(o | (sign >> 16));
}

static float f32_of_f16(uint16_t h)
{
    const uint32_t exp_mask = 0x7c00u << 13;
    uint32_t o = ((uint32_t)h & 0x7fffu) << 13;
    uint32_t exp = o & exp_mask;
    o += (127u - 15u) << 23;
    if (exp == exp_mask) { /* inf, NaN */
        o += (128u - 16u) << 23;
    } else if (exp == 0) { /* zero, subnormal: renormalized by a float subtraction */
        o += 1u << 23;
        o = bits_of_f32(f32_of_bits(o) - f32_of_bits(113u << 23));
    }
    return f32_of_bits(o | ((uint32_t)h & 0x8000u) << 16);
}

/* float16 by the CPU's conversion instructions (F16C: every x86-64 CPU with AVX2 has them),
 * 8 values at a time, picked at run time; the same IEEE results as the functions above. */
#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
#define ROW_F16C 1

/* F16C and AVX by CPUID leaf 1 (ECX bits 29 and 28), with the OS saving the AVX registers
 * (OSXSAVE, bit 27, and XCR0's SSE and AVX state bits): what gcc's and clang's
 * __builtin_cpu_supports would say, which clang 14 does not know for "f16c". */
static bool cpu_f16c(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return false;
    if (!(c & (1u << 27)) || !(c & (1u << 28)) || !(c & (1u << 29)))
        return false;
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (lo & 6u) == 6u;
}

static bool have_f16c(void)
{
    static atomic_int known = -1; /* -1: not asked yet */
    int k = atomic_load_explicit(&known, memory_order_relaxed);
    if (k < 0) {
        k = cpu_f16c();
        atomic_store_explicit(&known, k, memory_order_relaxed);
    }
    return k > 0;
}

__attribute__((target("avx,f16c"))) static size_t widen_f16c(float *dst, const unsigned char *s,
                                                             size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const void *)(s + 2 * i))));
    return i;
}

__attribute__((target("avx,f16c"))) static size_t narrow_f16c(unsigned char *o, const float *src,
                                                              size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((void *)(o + 2 * i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    return i;
}
#endif

void row_dtype_widen(row_dtype d, float *dst, const void *src, size_t n)
{
    const unsigned char *s = src;
    switch (d) {
    case ROW_FLOAT32:
        memcpy(dst, src, n * sizeof(float));
        return;
    case ROW_BFLOAT16:
        frame_get_floats(dst, s, n, PSD__V1__DTYPE__BFLOAT16);
        return;
    case ROW_FLOAT16: {
        size_t i = 0;
#ifdef ROW_F16C
        if (have_f16c())
            i = widen_f16c(dst, s, n);
#endif
        for (; i < n; i++) {
            uint16_t h;
            memcpy(&h, s + 2 * i, sizeof(h));
            dst[i] = f32_of_f16(h);
        }
        return;
    }
    }
}

void row_dtype_narrow(row_dtype d, void *dst, const float *src, size_t n)
{
    unsigned char *o = dst;
    switch (d) {
    case ROW_FLOAT32:
        memcpy(dst, src, n * sizeof(float));
        return;
    case ROW_BFLOAT16:
        frame_put_floats(o, src, n, PSD__V1__DTYPE__BFLOAT16);
        return;
    case ROW_FLOAT16: {
        size_t i = 0;
#ifdef ROW_F16C
        if (have_f16c())
            i = narrow_f16c(o, src, n);
#endif
        for (; i < n; i++) {
            uint16_t h = f16_of_f32(src[i]);
            memcpy(o + 2 * i, &h, sizeof(h));
        }
        return;
    }
    }
}
