/* The storage types of table parameters: see row_dtype.h. bfloat16 uses the wire's conversion
 * (common/frame.h); float16 is converted here, exactly as IEEE 754 binary16 with round to
 * nearest, ties to even (subnormals included). */
#include "row_dtype.h"

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
    case ROW_FLOAT16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, s + 2 * i, sizeof(h));
            dst[i] = f32_of_f16(h);
        }
        return;
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
    case ROW_FLOAT16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h = f16_of_f32(src[i]);
            memcpy(o + 2 * i, &h, sizeof(h));
        }
        return;
    }
}
