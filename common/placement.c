#include "placement.h"

uint64_t placement_hash(const char *name)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++) {
        h ^= *p;
        h *= 0x100000001b3ull;
    }
    return h;
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
