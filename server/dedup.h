/* Exactly-once pushes: per client, the sequence numbers already applied.
 *
 * Each client (a random 64-bit id per client instance) numbers its updating requests 1, 2,
 * 3, ... The transport may deliver one twice (nng REQ resends, client retries) and, with many
 * requests in flight, out of order. Per client we keep the highest number seen and a bitmap
 * of the `window` numbers below it, like IPsec's anti-replay window.
 *
 * Concurrency: the table is split into 64 shards by a hash of the client id, each with its own
 * lock, so a request of a known client (every push) takes only its shard's lock and requests
 * of different clients rarely wait for each other. Adding a client, evicting one, setting the
 * limits, dedup_clients, dedup_evicted and dedup_export take one table-wide lock as well (and,
 * to evict, every shard's lock): the limits below hold for the whole table, not per shard. */
#ifndef PSD_SERVER_DEDUP_H
#define PSD_SERVER_DEDUP_H

#include <stdint.h>

typedef struct dedup dedup;

typedef enum dedup_result {
    DEDUP_NEW,       /* not seen: now marked; apply it (or dedup_unmark on failure) */
    DEDUP_DUPLICATE, /* applied already: drop it */
    DEDUP_TOO_OLD,   /* older than the window: can't tell, refuse it */
} dedup_result;

/* window: sequence numbers remembered per client (rounded up to a multiple of 64).
 * Returns NULL on allocation failure. */
dedup *dedup_create(uint32_t window);
void dedup_destroy(dedup *d);

/* Bounds the clients remembered (0: no bound): when a new client would make more than
 * max_clients, the least recently heard one is evicted, and so is any client not heard from
 * for idle_ms (0: never). An evicted client leaves a tombstone (its id and highest seq, 16
 * bytes, in a table of 4 * max_clients slots indexed by a hash of the id, where a colliding
 * eviction overwrites an older one): a push of it at or below that seq is DEDUP_TOO_OLD
 * (refused, ABORTED: it may have been applied), one above starts a fresh window. Only a
 * client whose tombstone was overwritten as well can have a resent push applied twice.
 * "Least recently heard" and max_clients are over all shards: the same table-wide LRU as with
 * one lock. Both evictions happen only when a client is added (an idle client stays until
 * then; a lower max_clients evicts nothing at once). The call drops every tombstone. */
int dedup_set_limits(dedup *d, uint64_t max_clients, uint64_t idle_ms);

/* Clients evicted so far. */
uint64_t dedup_evicted(dedup *d);

/* Checks and marks (client, seq) atomically. seq 0 is never deduplicated (returns NEW
 * without marking). Returns DEDUP_TOO_OLD also when memory for a new client can't be had. */
dedup_result dedup_begin(dedup *d, uint64_t client, uint64_t seq);

/* Clears the mark of a request that dedup_begin accepted but that was not applied. */
void dedup_unmark(dedup *d, uint64_t client, uint64_t seq);

/* Number of clients tracked. */
uint64_t dedup_clients(dedup *d);

/* Checkpoints. dedup_export copies every client's window, under every shard's lock, into one
 * malloc'd array of *nclients entries of (2 + *words) words each: client id, highest seq,
 * then the bitmap (bit i of the bitmap: seq highest - i applied). Returns NULL on allocation
 * failure (*nclients is then 0 and nothing is wrong if the table is empty: check it). */
uint64_t *dedup_export(dedup *d, uint64_t *nclients, uint32_t *words);

/* Sets one client's window from an export (bitmap of `words` words; a window of another size
 * keeps the common part). Returns 0, or -1 when memory can't be had. */
int dedup_import(dedup *d, uint64_t client, uint64_t highest, const uint64_t *bits, uint32_t words);

#endif
