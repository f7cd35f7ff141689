/* repl_match.h - log matching of a replica group's backup against its primary's stream (the
 * job of Raft's prevLogTerm check and Kafka's leader epoch).
 *
 * Every logged operation carries the view epoch its primary logged it under, and a primary
 * numbers at most one operation per position in its tenure, so two copies whose operations at
 * one position carry the same epoch hold the same operations up to there. A backup remembers
 * the epoch of the last operation it applied, and whether the primary's stream has confirmed
 * its position since that primary took the group over ("verified"). Its state cannot be rolled
 * back: a backup that diverged copies the group again. A REPLICATE batch names the primary's
 * log end, its commit point and the epoch of each operation it carries. */
#ifndef PSD_SERVER_REPL_MATCH_H
#define PSD_SERVER_REPL_MATCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum repl_match {
    REPL_MATCHED,   /* what it applied is the primary's log up to there: verified from now on */
    REPL_UNCHECKED, /* nothing to compare in this batch; it was verified before */
    REPL_DIVERGED,  /* it holds operations this primary did not log: copy the group again */
} repl_match;

/* The match of a backup that applied up to lsn `applied` (0: nothing), the last of them logged
 * under `applied_epoch` (0: unknown), `verified` since the current primary took over, against
 * a batch of n operations from first_lsn on, logged under epochs[0..n_epochs), from a primary
 * whose log ends at log_end and whose operations up to `committed` every replica applied:
 *   - past the primary's log end: DIVERGED (an older primary's operations, never
 *     acknowledged by this one), or UNCHECKED when verified (a batch sent before what it
 *     applied since, delivered late);
 *   - the batch holds its last position: MATCHED when the epochs agree, DIVERGED when not;
 *   - otherwise UNCHECKED when verified, MATCHED when it applied no more than the commit point
 *     (those operations are every replica's), DIVERGED when it holds more it cannot check;
 *   - a sender that sends no epochs (n_epochs != n): UNCHECKED past the first rule. */
repl_match repl_match_batch(uint64_t applied, uint64_t applied_epoch, bool verified,
                            uint64_t log_end, uint64_t committed, uint64_t first_lsn, size_t n,
                            const uint64_t *epochs, size_t n_epochs);

#endif
