#include "placement.h"

#include <string.h>

uint64_t fnv1a_update(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

uint64_t placement_hash(const char *name)
{
    return fnv1a_update(FNV1A_INIT, name, strlen(name));
}

uint32_t placement_owner(const char *name, uint32_t num_servers)
{
    return num_servers ? (uint32_t)(placement_hash(name) % num_servers) : 0;
}

bool placement_is_split(uint64_t numel, uint64_t bytes, uint64_t threshold_bytes,
                        uint32_t num_servers)
{
    return num_servers >= 2 && numel >= num_servers && bytes >= threshold_bytes;
}

void placement_range(uint64_t numel, uint32_t num_servers, uint32_t server, uint64_t *offset,
                     uint64_t *count)
{
    uint64_t base = numel / num_servers, extra = numel % num_servers;
    /* The first `extra` servers hold one element more. */
    *offset = server * base + (server < extra ? server : extra);
    *count = base + (server < extra ? 1 : 0);
}

/* splitmix64's finalizer (Stafford's variant 13), as proto/README.md writes it. */
static uint64_t placement_mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

uint64_t placement_table_hash(const char *name, int64_t id)
{
    return placement_mix64(placement_hash(name) ^
                           placement_mix64((uint64_t)id + 0x9E3779B97F4A7C15ull));
}

uint32_t placement_table_owner(const char *name, int64_t id, uint32_t num_servers)
{
    return num_servers ? (uint32_t)(placement_table_hash(name, id) % num_servers) : 0;
}
