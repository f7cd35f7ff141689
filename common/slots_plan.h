/* The slot moves that even out a slot map over a set of servers: what psctl add-server,
 * remove-server and rebalance will carry out, batch by batch (docs/design.md, "Placement").
 * Pure functions over a slots_record (slots_record.h). */
#ifndef PSD_COMMON_SLOTS_PLAN_H
#define PSD_COMMON_SLOTS_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "slots_record.h"

/* One slot to move: its owner now and the server it goes to. */
typedef struct slot_move {
    uint32_t slot, from, to;
} slot_move;

/* Plans the fewest moves after which the servers i with member[i] (r->nservers entries) own
 * every slot, each floor(S/m) or ceil(S/m) of them (m members; the extra ones stay with the
 * members that own the most now, lower index first among equals), and the others none. Every
 * slot moves at most once, from its owner now; a member never gives a slot and receives one.
 * The moves come in slot order, receivers taking turns, so that each server's new slots spread
 * over the slot space. *out (caller frees; NULL when none) gets *n moves. Returns 0, or -1
 * with why in err (no member, out of memory). */
int slots_plan(const slots_record *r, const bool *member, slot_move **out, size_t *n, char *err,
               size_t errlen);

/* Applies moves to r's owners and adds one to its version. Each move's from must be its
 * slot's owner at that point (a slot listed twice must chain) and its to a listed server:
 * false and r unchanged otherwise, or when out of memory. */
bool slots_apply(slots_record *r, const slot_move *moves, size_t n);

#endif
