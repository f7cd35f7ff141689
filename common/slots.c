/* Slots (slots.h): the slot of a name, a table row or a part, and the slot map's owners. */
#include "slots.h"

#include "hash.h"
#include "placement.h"

slot_map slots_static(uint32_t nslots, uint32_t nservers)
{
    return (slot_map){.nslots = nslots, .nservers = nservers, .owner = NULL};
}

bool slots_count_valid(uint64_t n)
{
    return n >= 1 && n <= (1u << 24) && (n & (n - 1)) == 0;
}

uint32_t slots_of_name(const char *name, uint32_t nslots)
{
    return slots_of_hash(placement_hash(name), nslots);
}

uint32_t slots_of_row(const char *table, int64_t id, uint32_t nslots)
{
    return slots_of_hash(placement_table_hash(table, id), nslots);
}

uint32_t slots_of_part(const char *name, uint64_t part, uint32_t nslots)
{
    return slots_of_hash(placement_part_hash(name, part), nslots);
}

uint32_t slots_owner(const slot_map *m, uint32_t slot)
{
    if (m->nservers == 0)
        return 0;
    if (m->owner)
        return m->owner[slot & (m->nslots - 1)];
    return slot % m->nservers;
}

uint32_t slots_name_owner(const slot_map *m, const char *name)
{
    return slots_owner(m, slots_of_name(name, m->nslots));
}

uint32_t slots_row_owner(const slot_map *m, const char *table, int64_t id)
{
    return slots_owner(m, slots_of_row(table, id, m->nslots));
}

uint32_t slots_part_owner(const slot_map *m, const char *name, uint64_t part)
{
    return slots_owner(m, slots_of_part(name, part, m->nslots));
}

uint64_t slots_stream_client(uint64_t client, uint32_t from)
{
    uint64_t k = mix64(client ^ mix64(((uint64_t)from + 1) * 0x9E3779B97F4A7C15ull));
    return k == client ? k ^ 1 : k;
}

uint64_t slots_piece_client(uint64_t stream, uint64_t seq, uint64_t version, uint32_t to)
{
    uint64_t k = mix64(
        stream ^ mix64(seq ^ mix64(version ^ mix64(((uint64_t)to + 1) * 0xC2B2AE3D27D4EB4Full))));
    return k == stream ? k ^ 1 : k;
}
