/* crc32c.c - CRC-32C of crc32c.h: the SSE4.2 instruction, or a byte table. */
#include "crc32c.h"

#include <pthread.h>
#include <stdbool.h>
#include <string.h>

#define CRC32C_POLY 0x82f63b78u /* reversed Castagnoli polynomial */

static uint32_t crc_table[256];
static bool crc_hw;
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ CRC32C_POLY : c >> 1;
        crc_table[i] = c;
    }
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    crc_hw = __builtin_cpu_supports("sse4.2");
#endif
}

uint32_t crc32c_table(uint32_t crc, const void *data, size_t len)
{
    pthread_once(&crc_once, crc_init);
    const unsigned char *p = data;
    crc = ~crc;
    for (size_t i = 0; i < len; i++)
        crc = crc_table[(crc ^ p[i]) & 0xffu] ^ (crc >> 8);
    return ~crc;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("sse4.2"))) static uint32_t crc32c_sse42(uint32_t crc, const void *data,
                                                               size_t len)
{
    const unsigned char *p = data;
    uint64_t c = ~crc;
    while (len >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c = __builtin_ia32_crc32di(c, v);
        p += 8;
        len -= 8;
    }
    uint32_t c32 = (uint32_t)c;
    while (len > 0) {
        c32 = __builtin_ia32_crc32qi(c32, *p++);
        len--;
    }
    return ~c32;
}
#endif

uint32_t crc32c(uint32_t crc, const void *data, size_t len)
{
    pthread_once(&crc_once, crc_init);
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (crc_hw)
        return crc32c_sse42(crc, data, len);
#endif
    return crc32c_table(crc, data, len);
}
