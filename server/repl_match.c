/* repl_match.c - log matching of a backup against its primary's stream (repl_match.h). */
#include "repl_match.h"

repl_match repl_match_batch(uint64_t applied, uint64_t applied_epoch, bool verified,
                            uint64_t log_end, uint64_t committed, uint64_t first_lsn, size_t n,
                            const uint64_t *epochs, size_t n_epochs)
{
    if (applied == 0)
        return REPL_MATCHED;
    if (applied > log_end)
        /* Verified, it got all of it from this primary: the batch is older than what it
         * applied since (a resend that arrived late). */
        return verified ? REPL_UNCHECKED : REPL_DIVERGED;
    if (n_epochs != n)
        return REPL_UNCHECKED;
    if (applied_epoch != 0 && first_lsn <= applied && applied - first_lsn < n)
        return epochs[applied - first_lsn] == applied_epoch ? REPL_MATCHED : REPL_DIVERGED;
    if (verified)
        return REPL_UNCHECKED;
    return applied <= committed ? REPL_MATCHED : REPL_DIVERGED;
}
