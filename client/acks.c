/* The client's loss accounting (acks.h): acknowledgement marks per variable and server, and
 * what a restart or a failover lost of them. */
#include "acks.h"

#include <stdlib.h>
#include <string.h>

/* Records the mark of an own push. */
static void own_note(var_ack *a, uint64_t mark)
{
    if (a->nown == a->capown) {
        if (a->capown < OWN_ACKS_MAX) {
            size_t cap = a->capown ? a->capown * 2 : 64;
            uint64_t *p = realloc(a->own, cap * sizeof(*p));
            if (p == NULL)
                return; /* not counted: the count stays a lower bound */
            a->own = p;
            a->capown = cap;
        } else {
            /* Full: the older half goes; below it the count is a lower bound. */
            size_t half = a->nown / 2;
            if (a->own[half - 1] > a->own_dropped)
                a->own_dropped = a->own[half - 1];
            memmove(a->own, a->own + half, (a->nown - half) * sizeof(*a->own));
            a->nown -= half;
        }
    }
    a->own[a->nown++] = mark;
}

/* How many own pushes recorded for the instance that is gone made marks above `kept` (their
 * updates are lost); forgets them all. *bound: the count may be low (older ones were dropped,
 * and kept is below them). */
static uint64_t own_lost_since(var_ack *a, uint64_t kept, bool *bound)
{
    uint64_t n = 0;
    for (size_t i = 0; i < a->nown; i++)
        n += a->own[i] > kept;
    *bound = a->own_dropped > kept;
    a->nown = 0;
    a->own_dropped = 0;
    return n;
}

void var_ack_note(var_ack *a, const ack_reply *r, ack_loss *loss)
{
    memset(loss, 0, sizeof(*loss));
    if (r->instance == 0 || r->instance == a->prev_instance)
        return; /* a server that does not say which process it is; a late reply of the one
                 * before */
    /* Under BSP a push joins the clock's aggregate: the update it is part of makes the next
     * version, and a new primary holds that aggregate too (it is replicated). */
    uint64_t mark = r->version + (r->bsp ? 1 : 0);
    if (a->instance != 0 && r->instance != a->instance) {
        /* Replicated: only a mark below the acknowledged one shows a loss. Otherwise a
         * restart from its checkpoint: what it acknowledged above the restored version. */
        uint64_t kept = r->replicated ? mark : r->restored_version;
        loss->acked = a->acked;
        loss->kept = kept;
        loss->lost = a->acked > kept ? a->acked - kept : 0;
        if (loss->lost || !r->replicated)
            loss->own_lost = own_lost_since(a, kept, &loss->own_bound);
        a->prev_instance = a->instance;
        a->acked = 0;
    }
    a->instance = r->instance;
    if (mark > a->acked)
        a->acked = mark;
    own_note(a, mark);
}

void var_ack_free(var_ack *a)
{
    free(a->own);
    memset(a, 0, sizeof(*a));
}
