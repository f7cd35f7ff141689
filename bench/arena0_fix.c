/* Measurement device for a proposed change to common/jemalloc_conf.h, preloaded
 * (LD_PRELOAD) into the bench's children by the "arena 0 fix" allocator variant.
 *
 * jemalloc 5.3 creates arena 0 while it boots, before malloc_init_narenas() reads
 * opt.oversize_threshold (arena_init_huge), so arena 0 keeps the default threshold of 8 MiB:
 * with "oversize_threshold:0" (huge arena disabled) every extent of 8 MiB or more freed into
 * arena 0, the arena of the main thread, is purged at once (extent_record ->
 * extent_maximally_purge: MADV_DONTNEED) and faulted in again by the next allocation, whatever
 * dirty_decay_ms says. Arenas 1..n get the configured value. This sets arena 0's threshold to
 * what the others have. */
#include <stddef.h>

#include <jemalloc/jemalloc.h>

void psbench_arena0_fix(void) __attribute__((constructor));

void psbench_arena0_fix(void)
{
    size_t opt = 1, sz = sizeof(opt);
    if (mallctl("opt.oversize_threshold", &opt, &sz, NULL, 0) != 0 || opt != 0)
        return; /* the huge arena is in use: arena 0 never sees oversize extents */
    size_t off = (size_t)7 << 60; /* beyond SC_LARGE_MAXCLASS, as arenas 1..n have */
    mallctl("arena.0.oversize_threshold", NULL, NULL, &off, sizeof(off));
}
