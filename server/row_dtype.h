/* The storage types of a sparse table's parameters (table.h, table_spec.dtype): float32, or
 * 16 bits (bfloat16, float16) with the optimizer's state kept in float32. Rows are read and
 * updated in float32: a 16-bit row's parameters are widened (exactly) before and narrowed
 * (rounded to nearest, ties to even) after. Private to the server. */
#ifndef SERVER_ROW_DTYPE_H
#define SERVER_ROW_DTYPE_H

#include <stddef.h>
#include <stdint.h>

typedef enum row_dtype {
    ROW_FLOAT32 = 0,
    ROW_BFLOAT16 = 1,
    ROW_FLOAT16 = 2,
} row_dtype;

/* Bytes of one parameter: 4 or 2 (0 for a value outside the enum). */
size_t row_dtype_size(row_dtype d);

/* "float32", "bfloat16", "float16"; "unknown" outside the enum. */
const char *row_dtype_name(row_dtype d);

/* dst[0..n) = src[0..n) widened to float32 (src: n values of d, any alignment). */
void row_dtype_widen(row_dtype d, float *dst, const void *src, size_t n);

/* dst[0..n) = src[0..n) rounded to d (dst: any alignment). A finite value beyond d's range
 * becomes an infinity (float16 past 65504, bfloat16 past about 3.4e38), NaN stays NaN. */
void row_dtype_narrow(row_dtype d, void *dst, const float *src, size_t n);

#endif /* SERVER_ROW_DTYPE_H */
