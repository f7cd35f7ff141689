/* Hashes of the code base, each written once: splitmix64's finaliser (mix64) and generator
 * step (splitmix64_next), and 64-bit FNV-1a (fnv1a, fnv1a_update).
 *
 * Their values are part of the product: row placement (placement_table_hash), the initial
 * values of table rows, the order of a worker's data and the start of the etcd key prefix
 * derive from them, so they never change (tests/unit/test_hash.c pins them). Pure functions,
 * no state: thread-safe. */
#ifndef PSD_COMMON_HASH_H
#define PSD_COMMON_HASH_H

#include <stddef.h>
#include <stdint.h>

/* The golden-ratio increment of splitmix64's state (2^64 / phi). */
#define HASH_GOLDEN_GAMMA UINT64_C(0x9E3779B97F4A7C15)

/* splitmix64's finaliser (Stafford's variant 13): a bijection of 64-bit words whose output
 * bits each depend on every input bit. mix64(0) is 0. */
static inline uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

/* The next number of the splitmix64 generator whose state is *state (advanced by one step).
 * From state 0: 0xe220a8397b1dcdaf, 0x6e789e6aa1b965f4, 0x06c45d188009454f, ... */
static inline uint64_t splitmix64_next(uint64_t *state)
{
    return mix64(*state += HASH_GOLDEN_GAMMA);
}

/* 64-bit FNV-1a: h (FNV1A_INIT to start) extended by the n bytes at p. */
#define FNV1A_INIT UINT64_C(0xCBF29CE484222325)
static inline uint64_t fnv1a_update(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= UINT64_C(0x100000001B3);
    }
    return h;
}

/* 64-bit FNV-1a of the n bytes at p. */
static inline uint64_t fnv1a(const void *p, size_t n)
{
    return fnv1a_update(FNV1A_INIT, p, n);
}

#endif
