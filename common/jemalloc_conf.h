/* jemalloc settings for the executables (not the library: a library must not choose its
 * host's allocator settings). Include from exactly one file of each executable.
 *
 * Tensors travel in nng messages of up to tens of MiB, allocated and freed once per request.
 * jemalloc's default sends allocations above oversize_threshold (8 MiB) to an arena that
 * returns memory to the kernel eagerly, so every large message is page-faulted in afresh;
 * measured in bench/RESULTS.md. Keeping large extents in the ordinary arenas, with dirty pages
 * reused for a few seconds, makes a large message cost what it costs with glibc malloc.
 * MALLOC_CONF in the environment still overrides these. */
#ifndef PSD_COMMON_JEMALLOC_CONF_H
#define PSD_COMMON_JEMALLOC_CONF_H

#ifdef PSD_WITH_JEMALLOC
const char *malloc_conf = "oversize_threshold:0,dirty_decay_ms:5000,muzzy_decay_ms:5000";
#endif

#endif
