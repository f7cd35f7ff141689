/* jemalloc settings for the executables (not the library: a library must not choose its
 * host's allocator settings). Include from exactly one file of each executable.
 *
 * Tensors travel in nng messages of up to tens of MiB, allocated and freed once per request,
 * and nng allocates every message body with calloc. With jemalloc 5.3's defaults each such
 * message costs a page fault per 4 KiB page, for two reasons; bench/RESULTS.md ("Wire
 * throughput", allocator table) measures both:
 *
 * - calloc of a recycled (dirty) extent is zeroed by purging it (madvise MADV_DONTNEED), so
 *   that the kernel faults in zero pages again as nng writes the message; jemalloc zeroes with
 *   memset instead only when thp is "always" (ehooks_default_zero_impl). thp:always also asks
 *   for transparent huge pages (MADV_HUGEPAGE) on jemalloc's own mappings, which only matters
 *   where the kernel's THP mode is "madvise" or "always"; on a kernel without THP support
 *   jemalloc ignores it and calloc purges again.
 * - allocations above oversize_threshold (default 8 MiB) go to an arena that returns memory
 *   to the kernel at once. oversize_threshold:0 turns that arena off and keeps large extents in
 *   the ordinary arenas, with dirty pages kept for a few seconds for reuse.
 *
 * MALLOC_CONF in the environment still overrides these. */
#ifndef PSD_COMMON_JEMALLOC_CONF_H
#define PSD_COMMON_JEMALLOC_CONF_H

#ifdef PSD_WITH_JEMALLOC
#include <stddef.h>

#include <jemalloc/jemalloc.h>

const char *malloc_conf = "oversize_threshold:0,dirty_decay_ms:5000,muzzy_decay_ms:5000,thp:always";

/* jemalloc 5.3 creates arena 0 while it boots, before it reads opt.oversize_threshold, so arena
 * 0 (the main thread's arena, where a single-threaded client builds its requests) keeps the
 * default threshold of 8 MiB: every extent of 8 MiB or more freed into it is purged at once
 * (extent_record -> extent_maximally_purge) and faulted in again by the next allocation,
 * whatever dirty_decay_ms says. Arenas 1..n get the configured value. This gives arena 0 what
 * the others have. It does nothing when the oversize arena is in use (MALLOC_CONF sets
 * oversize_threshold): arena 0 then never sees oversize extents. */
__attribute__((constructor)) static void psd_jemalloc_arena0_threshold(void)
{
    size_t opt = 1, sz = sizeof(opt);
    if (mallctl("opt.oversize_threshold", &opt, &sz, NULL, 0) != 0 || opt != 0)
        return;
    size_t off = (size_t)7 << 60; /* beyond SC_LARGE_MAXCLASS, as arenas 1..n have */
    mallctl("arena.0.oversize_threshold", NULL, NULL, &off, sizeof(off));
}
#endif

#endif
