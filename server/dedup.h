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
 * limits, the counts and the exports take one table-wide lock as well (and, to evict, every
 * shard's lock): the limits below hold for the whole table, not per shard. The tombstones and
 * floors of evicted clients are guarded by that table-wide lock. */
#ifndef PSD_SERVER_DEDUP_H
#define PSD_SERVER_DEDUP_H

#include <stddef.h>
#include <stdint.h>

typedef struct dedup dedup;

typedef enum dedup_result {
    DEDUP_NEW,       /* not seen: now marked; apply it (or dedup_unmark on failure) */
    DEDUP_DUPLICATE, /* applied already: drop it */
    DEDUP_TOO_OLD,   /* older than the client's window: can't tell, refuse it */
    DEDUP_EVICTED,   /* the client was evicted and seq is at or below its highest seq then (its
                      * tombstone): it may have been applied, refuse it */
    DEDUP_UNPROVEN,  /* a client the table does not know, and seq is at or below the floor that
                      * forgotten evicted clients left on its id's hash: it may be one of them
                      * and the push may have been applied, refuse it */
    DEDUP_NO_MEMORY, /* memory for a new client's window could not be had: refuse it */
} dedup_result;

/* window: sequence numbers remembered per client (rounded up to a multiple of 64).
 * Returns NULL on allocation failure. */
dedup *dedup_create(uint32_t window);
void dedup_destroy(dedup *d);

/* Bounds the clients remembered (0: no bound): when a new client would make more than
 * max_clients, the least recently heard one is evicted, and so is any client not heard from
 * for idle_ms (0: never). Both evictions happen only when a client is added (an idle client
 * stays until then; a lower max_clients evicts nothing at once).
 *
 * Eviction never costs exactly-once: a push is applied only when the table can prove it new.
 * An evicted client leaves a tombstone (its id and highest seq, 16 bytes) in a 4-way
 * set-associative table of 4 * max_clients slots (65536 without a bound). Tombstones are
 * never overwritten: when a set is full, the one with the lowest highest seq of the five is
 * folded into the floors, an array of 2^20 seqs (8 MiB, made on the first fold) in which an
 * id's floor is the minimum of two entries chosen by a hash of it, each the maximum of the
 * highest seqs folded onto it. A client that comes back starts from its tombstone, else from
 * its floor: pushes at or below it are refused (DEDUP_EVICTED, DEDUP_UNPROVEN), newer ones
 * are new. A floor is never below the highest seq of any forgotten client that hashes onto
 * it, so a false match only refuses a push (ABORTED), never applies one twice; its price is
 * that a never-seen client whose seqs start below the floor of its hash is refused until it
 * numbers past it. Evictions under pressure are counted (psd_dedup_evictions_total{reason})
 * and logged at most every 10 s. The tombstones and floors are kept across calls (moved into
 * the new table). Returns 0, or -1 when the new tombstone table can't be had (nothing is
 * changed then). */
int dedup_set_limits(dedup *d, uint64_t max_clients, uint64_t idle_ms);

/* Clients evicted so far (for capacity and for idleness). */
uint64_t dedup_evicted(dedup *d);

/* Tombstones held, and tombstones folded into the floors so far. */
uint64_t dedup_tombstones(dedup *d);
uint64_t dedup_forgotten(dedup *d);

/* Checks and marks (client, seq) atomically. seq 0 is never deduplicated (returns NEW
 * without marking). */
dedup_result dedup_begin(dedup *d, uint64_t client, uint64_t seq);

/* What dedup_begin would answer for (client, seq), without marking it: DEDUP_NEW only when
 * the request is provably not applied (a server that answers a request moved uses it to know
 * that no part of it was applied here: server/slot_gate.c). Counts no refusal. */
dedup_result dedup_peek(dedup *d, uint64_t client, uint64_t seq);

/* The same, with the client's floor (its highest seq when evicted, or the floor of its hash)
 * in *floor when the result is DEDUP_EVICTED or DEDUP_UNPROVEN (for the refusal's message). */
dedup_result dedup_begin_floor(dedup *d, uint64_t client, uint64_t seq, uint64_t *floor);
/* The message of a push that dedup could not prove new (dedup_begin_floor's d other than
 * DEDUP_NEW and DEDUP_DUPLICATE; the push is refused ABORTED): why, and what the client can
 * know; floor as dedup_begin_floor gave it. */
void dedup_refusal(dedup_result d, uint64_t client, uint64_t seq, uint64_t floor, char *err,
                   size_t errlen);

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

/* Adds one client's window from an export (as dedup_import takes it) to what d knows of that
 * client: every seq either marks is marked (the window slides up to the higher of the two
 * highest seqs; marks that fall below it are dropped, and such seqs are then refused as too
 * old, never taken as new). For the window of the slots a server receives from another
 * (server/slot_move.c): the seqs the source applied of its clients' streams to it. Merging
 * twice is harmless. Returns 0, or -1 when memory can't be had. */
int dedup_merge(dedup *d, uint64_t client, uint64_t highest, const uint64_t *bits, uint32_t words);

/* What, besides the windows, proves a push already applied: each window's floor (from its
 * tombstone or its hash), the tombstones and the floors of forgotten clients. dedup_export_floors
 * copies it into one malloc'd array of *nwords words (format in dedup.c); NULL when memory
 * can't be had. dedup_import_floors merges such an array into d, after the windows were
 * imported (it only raises floors: importing twice is harmless). Returns 0, -1 when the array
 * is malformed (nothing of it applied past the error) or -2 when memory can't be had. */
uint64_t *dedup_export_floors(dedup *d, size_t *nwords);
int dedup_import_floors(dedup *d, const uint64_t *w, size_t nwords);

#endif
