/* A checkpoint's snapshot: a consistent copy of a server's state, taken while updates are held
 * off (store_freeze .. store_thaw, store.h) and written afterwards while updates go on.
 *
 * The state is made of components (variables, dedup windows, the clock table, sparse tables),
 * each a row of one table in ckpt_snapshot.c with three steps: prepare (before the pause:
 * allocate, so the pause does not wait on memory), take (during it: copy or mark) and finish
 * (after it: complete the copy). A replica group's log position, when there is one, brackets
 * the pause: the group's log is held still before the store freezes and let go after it thaws,
 * so the copy holds exactly the operations before the position. */
#ifndef PSD_SERVER_CKPT_SNAPSHOT_H
#define PSD_SERVER_CKPT_SNAPSHOT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ckpt_types.h"
#include "server.h"
#include "table_ckpt.h"

/* Words of a BSP aggregate's worker bitmap in a checkpoint. */
#define CKPT_AGG_WORDS ((SERVER_MAX_WORKERS + 63) / 64)

/* A variable's copy. */
typedef struct ckpt_snap_var {
    variable *src; /* identity only: not dereferenced after the copy */
    uint8_t *spec;
    size_t spec_len;
    uint64_t numel, offset, count, version;
    int32_t staleness;
    uint32_t nslots, has_agg;
    int32_t agg_count;
    bool initial;    /* never updated: its values are its spec's initializer's (no data) */
    float *data;     /* params, slots, then the aggregate if has_agg */
    size_t data_cap; /* floats allocated */
    uint64_t agg_workers[CKPT_AGG_WORDS];
} ckpt_snap_var;

typedef struct ckpt_snapshot {
    ckpt_snap_var *vars;
    size_t nvars, cap;
    uint64_t *dedup;
    uint64_t dedup_clients;
    uint32_t dedup_words;
    uint64_t *floors; /* dedup_export_floors */
    size_t nfloors;
    sync_worker_rec *workers;
    size_t nworkers;
    int64_t applied_min;
    int64_t frontier;
    uint64_t create_gen; /* server_state.create_gen when taken: every variable up to it is in */
    server_table_copy *tables;
    size_t ntables;
    bool has_pos; /* record 9 */
    uint64_t pos_epoch, pos_lsn;
    slot_map slots;        /* record 11: the slot map the state is placed by (taken whole between
                            * two moves' commits) */
    uint32_t *slots_owner; /* the copy slots.owner points at, or NULL */
} ckpt_snapshot;

/* Takes the snapshot of st into *s. base, cut, track: the tables' cuts (server_tables_copy).
 * position (NULL: none) gives the replica position. *pause_ns: how long updates were held
 * off. Returns 0, or -1 with a message (s then empty). */
int ckpt_snapshot_take(server_state *st, ckpt_snapshot *s, uint64_t base, uint64_t cut, bool track,
                       checkpoint_position_fn position, void *position_arg, uint64_t *pause_ns,
                       char *err, size_t errlen);
/* ckpt_snapshot_take with the cuts of tables with a cold tier linked (server_tables_copy's
 * cold_at, cold_rel): their stores copied by hard links, for a checkpoint written to the
 * local directory that holds cold_at. Copies sent elsewhere (a replica's copy image) take
 * the rows instead (ckpt_snapshot_take). */
int ckpt_snapshot_take_linked(server_state *st, ckpt_snapshot *s, uint64_t base, uint64_t cut,
                              bool track, const char *cold_at, const char *cold_rel,
                              checkpoint_position_fn position, void *position_arg,
                              uint64_t *pause_ns, char *err, size_t errlen);

/* Frees what s holds and zeroes it. */
void ckpt_snapshot_free(ckpt_snapshot *s);

#endif
