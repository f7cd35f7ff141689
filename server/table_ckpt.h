/* Checkpoints of sparse tables: a cut of every table of the registry (table.h's table_cut: its
 * packed TableSpec and each partition's rows, oldest first, whole or changed since the
 * previous cut), for the checkpoint writer; and the rows of a set of slots, for a slot move. */
#ifndef PSD_SERVER_TABLE_CKPT_H
#define PSD_SERVER_TABLE_CKPT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "table_registry.h"

typedef struct server_table_copy {
    uint8_t *spec;
    size_t spec_len;
    uint32_t row_floats, nparts;
    uint64_t rows;                  /* rows copied (after server_tables_copy_finish), those
                                     * on disk included (read as they are written) */
    uint64_t removed;               /* removed ids copied (delta cuts) */
    bool delta;                     /* changes since the cut `base`, else every row */
    const struct table_rows *parts; /* [nparts], after server_tables_copy_finish: RAM rows;
                                     * a partition's rows on disk come from table_cut_cold_rows
                                     * on cut */
    struct table_cut *cut;
    const char *name;  /* the table's (held by the cut) */
    uint8_t *sketch;   /* its admission sketches as of the cut (table_sketch_save) */
    size_t sketch_len; /* 0: the table admits every id */
    char *cold_dir;    /* a linked cut (table_cut_link): its copy of the cold store, relative
                        * to the checkpoint directory; parts then hold RAM rows only and
                        * table_cut_cold_count each partition's rows in it. NULL: none */
} server_table_copy;
/* Cuts of every table, in three steps. server_tables_copy_prepare (before holding updates
 * off: it allocates the copies' memory, table_cut_prepare) fills *out, *n. server_tables_copy
 * (with every update held off, store_freeze) takes them, starts a cut of every table
 * registered now (table_cut_start; a table created since the prepare is prepared there, one
 * deleted since is dropped) and puts the started cuts in *out, *n: O(tables). base: the id of
 * the previous chain cut for deltas (0: whole); id: this cut's (table_cut_id_new: chain cuts,
 * which consume the tables' change marks; 0: snapshot cuts, whole, which leave them to the
 * chain); track: record removals. Both return 0 (*out NULL when there are no tables) or -1
 * when memory runs out (free *out anyway). Only the checkpointer of a chain may take its chain
 * cuts (another chain cut of a table makes the chain's next cut of it whole). cold_at (NULL:
 * none): the cut of each table with a cold tier is linked (table_cut_link), its store copied
 * into cold_at/<i> (i: its index in *out; cold_at must exist) and named cold_rel/<i> in its
 * cold_dir; a table whose store cannot be copied is cut as without cold_at (a warning). */
int server_tables_copy_prepare(server_state *st, uint64_t base, server_table_copy **out, size_t *n);
int server_tables_copy(server_state *st, uint64_t base, uint64_t id, bool track,
                       const char *cold_at, const char *cold_rel, server_table_copy **out,
                       size_t *n);
/* Copies what the cuts still need, after updates are let go again (each partition under its
 * own lock). Returns 0, or -1 when memory ran out. */
int server_tables_copy_finish(server_table_copy *c, size_t n);
void server_tables_copy_free(server_table_copy *c, size_t n);

/* The rows of t whose slot (slots_of_row over nslots slots) is set in the bitmap `slots`
 * (nslots bits), each with its parameters, optimizer slots and update time, into *out (free
 * with table_rows_free), copied one partition at a time under its lock: for a slot move, whose
 * slots take no update meanwhile. Returns 0, or -1 when memory runs out (*out empty). */
int server_table_slot_rows(table *t, const uint64_t *slots, uint32_t nslots, table_rows *out);
/* Removes t's rows in the slots set in `slots` (the source of a slot move, once the map
 * gave them to another server). Returns how many. */
size_t server_table_drop_slots(table *t, const uint64_t *slots, uint32_t nslots);

#endif
