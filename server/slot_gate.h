/* slot_gate.h - the slots a live server refuses while they move and after they moved
 * (replicas 1 with a coordinator; docs/design.md, "Moving slots"): its live copy of the slot
 * map's owners (server_state.slots points at it once a slot moved), the slots of a batch
 * being moved (frozen: updates and reads answered UNAVAILABLE "slot moving", which clients
 * retry) and the map version each move was committed at (a request for a slot that moved
 * away is answered FAILED_PRECONDITION with Envelope.moved_to naming its owner now).
 *
 * Handlers of requests that touch slots run between slot_gate_enter and slot_gate_leave
 * (methods.c wraps them): a freeze waits for every call inside to leave, so that once
 * slot_gate_freeze returns no update to the batch is being applied and none will be. One gate
 * per process: replicas 1 holds one server state. Off (every call passes, nothing taken)
 * until slot_gate_start. */
#ifndef PSD_SERVER_SLOT_GATE_H
#define PSD_SERVER_SLOT_GATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rpc_server.h"
#include "server.h"
#include "slots_record.h"

/* Turns the gate on for st, whose map is rec (its version and owners). Returns 0, or -1 when
 * memory can't be had. */
int slot_gate_start(server_state *st, const slots_record *rec);
/* Sets the failpoint (test-failpoint) the gate knows: slot-cut-hold (slot_gate.c). */
void slot_gate_failpoint(const char *failpoint);
/* True once slot_gate_start ran. */
bool slot_gate_on(void);

/* Before a handler of `call`: true to go on (call slot_gate_leave after the handler), false
 * when the call was answered (a slot it touches is moving, or moved away). */
bool slot_gate_enter(rpc_call *call, server_state *st);
void slot_gate_leave(void);

/* Freezes the slots listed (move_id names the batch). FAILED_PRECONDITION with why when one
 * is not this server's, or another batch is frozen (a batch frozen under the same move_id is
 * frozen again: a resumed move). Returns once no call inside the gate touches them. */
int slot_gate_freeze(server_state *st, const char *move_id, const uint32_t *slots, size_t n,
                     char *err, size_t errlen);
/* A Step's items, checked by its handler before anything of it is applied (the gate lets a
 * Step pass whole while no batch is frozen): true when the variable `name` (not split here;
 * of one cut in parts, the part holding element `offset`),
 * or each of the n rows at ids (8 bytes each) of table `name`, is this server's; false with
 * the call answered FAILED_PRECONDITION and Envelope.moved_to when one moved away. */
bool slot_gate_step_name(rpc_call *call, server_state *st, const char *name, uint64_t offset);
/* True once a slot of this server's map moved (requests are checked slot by slot). */
bool slot_gate_moved(void);
bool slot_gate_step_rows(rpc_call *call, server_state *st, const char *name, const uint8_t *ids,
                         uint64_t n);
/* Returns once every call that was inside the gate when it was called has left (the calls
 * after it pass): an update applied after it began took its time (time_op_ms) after it. */
void slot_gate_drain(void);
/* Lets the frozen batch go again (a move rolled back). */
void slot_gate_unfreeze(void);
/* Marks the slots listed as coming here (on: a batch installed here whose COMMIT or ABORT has
 * not come) or not (off). While a slot is coming, a request for it is answered UNAVAILABLE
 * "slot moving" (retried by clients), not FAILED_PRECONDITION "slot moved" to its old owner:
 * a client that read the flipped map before this server's COMMIT came waits for it. A COMMIT
 * (slot_gate_commit) clears its slots. */
void slot_gate_incoming(const uint32_t *slots, size_t n, bool on);
/* The map at `version` gives the slots listed to server `to`: the owners change, and the
 * batch, if frozen, is let go (a source answers its late requests with the new owner). */
void slot_gate_commit(server_state *st, const uint32_t *slots, size_t n, uint32_t to,
                      uint64_t version);
/* The owner of slot in this server's map, and that map's version. */
uint32_t slot_gate_owner(server_state *st, uint32_t slot);
uint64_t slot_gate_version(void);
/* st's slot map as it stands between two commits (a commit's batch wholly in or wholly out):
 * into *out, with its owners copied into *owner (caller frees; NULL for a static map, whose
 * owner is NULL too). Gate off: server_slots(st). Returns 0, or -1 when memory can't be had. */
int slot_gate_map_copy(const server_state *st, slot_map *out, uint32_t **owner);

#endif
