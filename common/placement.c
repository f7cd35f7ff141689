/* Placement (placement.h): the hashes of variables and table rows, a split variable's ranges and
 * its fixed parts. */
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

bool placement_is_parts(uint64_t numel, uint64_t bytes, uint64_t threshold_bytes)
{
    return numel > PLACEMENT_PART_ELEMS && bytes >= threshold_bytes;
}

uint64_t placement_part_count(uint64_t numel)
{
    return (numel >> PLACEMENT_PART_SHIFT) + ((numel & (PLACEMENT_PART_ELEMS - 1)) != 0);
}

void placement_part_range(uint64_t numel, uint64_t part, uint64_t *offset, uint64_t *count)
{
    uint64_t lo = part << PLACEMENT_PART_SHIFT;
    *offset = lo;
    *count =
        lo >= numel ? 0 : (numel - lo < PLACEMENT_PART_ELEMS ? numel - lo : PLACEMENT_PART_ELEMS);
}

uint64_t placement_part_hash(const char *name, uint64_t part)
{
    /* The table row hash with the part index as id (placement_table_hash_of without the
     * round trip through int64_t): one function to specify and to test. */
    return mix64(placement_hash(name) ^ mix64(part + HASH_GOLDEN_GAMMA));
}
