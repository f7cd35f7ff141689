/* slot_move.h - what a server holds of a batch of slots, moved between live servers (docs/
 * design.md, "Moving slots"): the source's export of the batch (table rows with their
 * optimizer state and update times, variables that are not split with theirs and their
 * versions, and its exactly-once windows), the target's install of it, and either side's drop
 * of the batch (the target's rollback, the source's end once the map gave the slots away).
 *
 * Exactly-once across a move. A client numbers its updates per server (client_next_seq): the
 * seqs of its stream to the source mean nothing in the target's own window of that client.
 * So the target keeps the source's windows under another key, slots_stream_client(client,
 * source), and a client that resends an update the source refused as moved sends it to the
 * new owner with that key as its client id and the same seq: applied there once, whether the
 * source had applied it before the move (the mark came with the export) or not. A request
 * that follows two moves composes the key per hop, as the windows' keys were composed by the
 * exports (each export carries every window of the source, those it imported included).
 *
 * The package is one byte string (format in slot_move.c), checked whole (a CRC-32C and every
 * bound) before the install changes anything. Split dense variables are not in it: they stay
 * in ranges over the servers of the cluster spec. A batch holding a BSP (staleness 0)
 * variable or table is refused: the aggregate of the open clock would not move with it. */
#ifndef PSD_SERVER_SLOT_MOVE_H
#define PSD_SERVER_SLOT_MOVE_H

#include <stddef.h>
#include <stdint.h>

#include "server.h"

/* What an export or install moved. */
typedef struct slot_move_counts {
    uint64_t rows;      /* table rows */
    uint64_t ids;       /* of a package of changes: the row ids it lists (every row held) */
    uint64_t variables; /* variables held whole */
    uint64_t windows;   /* exactly-once windows */
    uint64_t bytes;     /* the package's size */
} slot_move_counts;

/* The bitmap (nslots bits, nslots / 64 words, made zero by the caller) of the slots listed. */
void slot_set_mark(uint64_t *bits, uint32_t nslots, const uint32_t *slots, size_t n);
static inline bool slot_set_has(const uint64_t *bits, uint32_t slot)
{
    return (bits[slot / 64] >> (slot % 64)) & 1;
}

/* The source: the package of what st holds in the slots set in `bits` (st's slot count),
 * into *out (caller frees) of *len bytes. Call it while updates to those slots are refused
 * and none is being applied. Returns 0, or a STATUS_* with why in err: FAILED_PRECONDITION
 * for a BSP variable or table in the batch, RESOURCE_EXHAUSTED when memory runs out. */
int slot_move_export(server_state *st, const uint64_t *bits, uint8_t **out, size_t *len,
                     slot_move_counts *counts, char *err, size_t errlen);

/* Pre-copy. The source: the snapshot of the batch, sent while it still takes updates: the
 * package of slot_move_export less the windows (they go with the changes, under the freeze).
 * Call it with the batch not frozen (each table partition is copied consistently). */
int slot_move_export_snapshot(server_state *st, const uint64_t *bits, uint8_t **out, size_t *len,
                              slot_move_counts *counts, char *err, size_t errlen);
/* The source: the package (format 2) of the changes to the batch since a snapshot
 * of it (slot_move_export_snapshot): the rows made
 * or updated at or after since_ms (a time of time_wall_forward_ms, read before the snapshot
 * once every update in flight had left: slot_gate_drain), every row id the batch holds, its
 * variables held whole (each whole) and the windows. Call it with the batch frozen, as
 * slot_move_export. Returns as slot_move_export. */
int slot_move_export_changes(server_state *st, const uint64_t *bits, int64_t since_ms,
                             uint8_t **out, size_t *len, slot_move_counts *counts, char *err,
                             size_t errlen);

/* The target: installs a package made by slot_move_export on server `from` for the slots set
 * in `bits` (each of the package's slots must be set there). Whatever st held in those slots
 * before (a failed earlier attempt) is dropped first. Tables the package names that st does
 * not hold are created from the package's specs; its windows are merged (dedup_merge) under
 * slots_stream_client(client, from). Returns 0, or a STATUS_* with why in err, nothing of the
 * package installed then (INVALID_ARGUMENT: a malformed package, or one of other slots;
 * ALREADY_EXISTS: a name that is another kind here; RESOURCE_EXHAUSTED: memory or
 * max-server-bytes). A package of changes (slot_move_export_changes) is applied over what st
 * holds of the batch (the snapshot the caller installed before): its rows overwrite, the rows
 * and tables it does not list are dropped, its variables replace the batch's. */
int slot_move_install(server_state *st, uint32_t from, const uint64_t *bits, const uint8_t *pkg,
                      size_t len, slot_move_counts *counts, char *err, size_t errlen);

/* The target: installs a snapshot (a package of slot_move_export_snapshot) as slot_move_install
 * does, and notes its row ids (one staged batch per process), so that the package of changes
 * that follows removes the rows removed since without reading the tables. Any other install,
 * and slot_move_unstage (a rollback), forgets them. */
int slot_move_stage(server_state *st, uint32_t from, const uint64_t *bits, const uint8_t *pkg,
                    size_t len, slot_move_counts *counts, char *err, size_t errlen);
void slot_move_unstage(void);

/* True when pkg (len bytes) is a package of changes (format 2; not checked further). */
bool slot_move_is_changes(const uint8_t *pkg, size_t len);

/* Drops what st holds in the slots set in `bits`: the rows of every table and the variables
 * held whole. Returns the rows and variables dropped. */
uint64_t slot_move_drop(server_state *st, const uint64_t *bits);

#endif
