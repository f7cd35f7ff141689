/* The row index of a sparse table partition: see table_index.h. */
#include "table_index.h"

#include <stdlib.h>
#include <sys/mman.h>

_Static_assert(sizeof(table_index_entry) == 12, "index entries are 12 bytes");

#define MIN_CAP 16u
#define MAX_CAP (UINT32_C(1) << 31)

/* Arrays of at least this many bytes are mapped from the kernel directly rather than taken
 * from the allocator: when a partition's index doubles, the old array goes back to the kernel
 * at once (munmap) instead of staying resident as the allocator's dirty pages for seconds
 * (jemalloc's dirty_decay_ms), which at 10^8 rows held about 0.1x of the raw row bytes; fresh
 * mappings are zero pages, so no memset either. */
#define MAP_MIN_BYTES ((size_t)1 << 21)

static table_index_entry *entries_alloc(uint32_t cap)
{
    size_t bytes = (size_t)cap * sizeof(table_index_entry);
    if (bytes < MAP_MIN_BYTES)
        return calloc(cap, sizeof(table_index_entry));
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
#ifdef MADV_HUGEPAGE
    (void)madvise(p, bytes, MADV_HUGEPAGE); /* random probes: fewer TLB misses where allowed */
#endif
    return p;
}

static void entries_free(table_index_entry *e, uint32_t cap)
{
    size_t bytes = (size_t)cap * sizeof(table_index_entry);
    if (e == NULL)
        return;
    if (bytes < MAP_MIN_BYTES)
        free(e);
    else
        munmap(e, bytes);
}

uint32_t table_index_cap_for(uint64_t rows)
{
    uint32_t cap = MIN_CAP;
    while (cap < MAX_CAP && rows * 4 > (uint64_t)cap * 3)
        cap *= 2;
    return cap;
}

int table_index_init(table_index *ix, uint32_t cap)
{
    ix->cap = cap;
    ix->count = 0;
    ix->e = entries_alloc(cap);
    return ix->e != NULL ? 0 : -1;
}

void table_index_fini(table_index *ix)
{
    entries_free(ix->e, ix->cap);
    ix->e = NULL;
    ix->cap = ix->count = 0;
}

void table_index_delete_at(table_index *ix, uint32_t i)
{
    uint32_t mask = ix->cap - 1, j = i;
    for (;;) {
        j = (j + 1) & mask;
        if (ix->e[j].slot1 == 0)
            break;
        uint32_t home = (uint32_t)table_id_hash(ix->e[j].id) & mask;
        /* Entry j may move back to i only if its home is not in (i, j] (cyclically). */
        bool stays = i <= j ? (i < home && home <= j) : (i < home || home <= j);
        if (stays)
            continue;
        ix->e[i] = ix->e[j];
        i = j;
    }
    ix->e[i].slot1 = 0;
    ix->count--;
}

int table_index_grow(table_index *ix)
{
    if (ix->cap >= MAX_CAP)
        return -1;
    uint32_t ncap = ix->cap * 2, mask = ncap - 1;
    table_index_entry *ne = entries_alloc(ncap);
    if (ne == NULL)
        return -1;
    for (uint32_t i = 0; i < ix->cap; i++) {
        if (ix->e[i].slot1 == 0)
            continue;
        uint32_t j = (uint32_t)table_id_hash(ix->e[i].id) & mask;
        while (ne[j].slot1 != 0)
            j = (j + 1) & mask;
        ne[j] = ix->e[i];
    }
    entries_free(ix->e, ix->cap);
    ix->e = ne;
    ix->cap = ncap;
    return 0;
}
