/* Placement (placement.h): the hashes of variables and table rows, and a split variable's ranges.
 */
#include "placement.h"

#include <string.h>

uint64_t placement_hash(const char *name)
{
    return fnv1a(name, strlen(name));
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

uint64_t placement_table_hash(const char *name, int64_t id)
{
    /* mix64 is splitmix64's finaliser, as proto/README.md writes it. */
    return placement_table_hash_of(placement_hash(name), id);
}
