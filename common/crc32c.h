/* crc32c.h - CRC-32C (Castagnoli), the checksum of TFRecord framing (common/events.c).
 *
 * Computed with the SSE4.2 crc32 instruction where the CPU has it (checked once at run time),
 * with a byte table otherwise; both give the same values. */
#ifndef PSD_COMMON_CRC32C_H
#define PSD_COMMON_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* CRC-32C of data[0..len), continuing from crc (0 for a fresh checksum):
 * crc32c(crc32c(0, a, n), b, m) is the CRC of a followed by b. crc32c(0, "123456789", 9) is
 * 0xe3069283. */
uint32_t crc32c(uint32_t crc, const void *data, size_t len);

/* The same with the byte table only (the tests compare the two ways). */
uint32_t crc32c_table(uint32_t crc, const void *data, size_t len);

/* TFRecord's masked CRC: rotated right by 15 bits plus 0xa282ead8, so that a CRC of data that
 * holds CRCs stays well distributed. */
static inline uint32_t crc32c_mask(uint32_t crc)
{
    return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

#endif /* PSD_COMMON_CRC32C_H */
