/* The checkpoint file format: its header, its records, and the one table of record types
 * (ckpt_format.c) that writes a snapshot (ckpt_snapshot.h) as a file and reads a file back
 * (ckpt_loaded), the framing being ckpt_frame.h's.
 *
 * A checkpoint holds every variable this server holds (its packed VariableSpec, range,
 * parameters, optimizer slots, version, staleness bound, BSP aggregate), the clock table and
 * the exactly-once dedup windows, so that a push resent after a restore is still dropped.
 *
 * File `ckpt-<task>-<seq>.psc` in the checkpoint directory, little-endian:
 *   header (64 bytes): magic "PSDCKPT\0", u32 format version (2), u32 header size (64),
 *     u32 num_servers, u32 task index, u64 FNV-1a hash of the ps address list, u64 sequence
 *     number, u64 creation time (Unix ns), 8 reserved bytes (a delta's previous file, below),
 *     u32 slots (0: written before slots, no record 11), u32 CRC-32 of the 60 before.
 *   records: u32 type, u32 flags (0 but for a variable record's CKPT_VAR_INITIAL), u64 payload
 *     length, payload, u32 CRC-32 of type, flags, length and payload. Types: 1 variable, 2
 *     dedup table, 3 clock table, 4 end (payload: u64 records before it, u64 sum of their
 *     payload lengths), 5 (version 2) what proves evicted clients' pushes applied: the
 *     windows' floors, the tombstones and the hashed floors (words of dedup_export_floors).
 *     6 a sparse table (u32 spec length, packed TableSpec, u32 floats per row, u32 0, u64
 *     rows, then per row, oldest update first: i64 id, i64 update time in ms, its floats:
 *     parameters then optimizer slots); written only when the server holds tables.
 *     7 (deltas only) a sparse table's changes since the previous file: u32 spec length,
 *     packed TableSpec, u32 floats per row, u32 partitions, then per partition: u32 flags
 *     (CKPT_PART_WHOLE: the partition's every row, replacing it), u32 0, u64 removed ids,
 *     u64 rows, the removed ids (i64), the rows as in record 6.
 *     8 (after record 3, only when a known worker is not live) the clock table's rest: i64 the
 *     barrier's frontier (where a worker joining with none live starts), u64 n, then n times
 *     u32 worker id, u32 0, u64 the client it finished as (workers that finished: that client
 *     does not rejoin). Files without it restore as before (no worker finished, frontier 0).
 *     9 (replicated servers, replicas > 1) the replica group's log position: u64 the view epoch
 *     the server was at, u64 the group's next log sequence number (the file holds every logged
 *     operation before it). A restart publishes it so that the first view makes the member
 *     with the newest copy the group's primary (view.h, view_copy).
 *     11 (first, files of servers with slots) the slot map the file's state is placed by: u32
     slots S, u32 server tasks N, u32 flags (1: the static map, slot s -> s mod N, and nothing
     follows), u32 0, then unless static S times u32 the slot's server task. A file without it
     was written before slots: its rows and variables held whole are placed by hash mod N.
     10 (after the tables, for each table with min_count > 1) the table's admission sketches:
 *     u32 name length, the name, u32 0, u64 n, then n bytes (table_sketch_save: per partition
 *     u32 events, then its u16 counters), so that a restored copy admits ids exactly as the
 *     one it was taken from. A table without it (older files) restores with empty sketches.
 *     12 instead of record 6 for a table with a cold tier (ram_rows) whose cut was linked
 *     (table.h, table_cut_link): its rows on disk are a copy of its cold store, the directory
 *     ckpt-<task>-<seq>.cold/<i> beside the file (i: the table's place among the file's
 *     tables; ckpt_dir.h), whose table files are hard links to the store's (and to earlier
 *     copies'), not rows in the file. Payload: u32 spec length, packed TableSpec, u32 floats
 *     per row, u32 partitions, u32 length of the copy's name, u32 0, the name (relative to
 *     the file's directory, no NUL), then per partition u64 rows in the copy, then u64 RAM
 *     rows and the RAM rows as in record 6 (each partition's oldest update first). Restore
 *     opens the copy as the table's cold tier (hard links, every block's checksum read:
 *     a damaged copy makes the file unusable, the copy named), then inserts the RAM rows.
 *     A copy image (a replica's, sent to another host) and a table whose store could not
 *     be copied are written as record 6.
 * Deltas (checkpoint-full-every > 1): format version 3, bytes 48..55 of the header the
 *   sequence number of the previous file of the chain (a full one or a delta). A delta holds
 *   the variables, dedup and clock records whole (as a full file), and of each table either
 *   record 6 (a table new since the previous file, or one it could not diff) or record 7; a
 *   table of the previous file absent from a delta was deleted. Restore reads the full file,
 *   then each delta in order; the newest file of a chain whose deltas are all valid is the
 *   restore point. A damaged delta ends the chain there: the state of the file before it is
 *   restored and the log says which file was skipped and why. Pruning keeps whole chains.
 *     A file without its end record is truncated. Version 1 files (no record 5, no
 *     CKPT_VAR_INITIAL records) are read too.
 * It is written to `.ckpt-<task>-<seq>.psc.tmp`, fsynced, renamed, and the directory fsynced
 * (its stores' copies, ckpt-<task>-<seq>.cold, made and fsynced before the rename); the last
 * `checkpoint-keep` are kept, and the copies of the files deleted go with them. */
#ifndef PSD_SERVER_CKPT_FORMAT_H
#define PSD_SERVER_CKPT_FORMAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ckpt_frame.h"
#include "server.h"
#include "table.h"

/* Record types; ckpt_format.c holds the table of them. */
enum {
    CKPT_REC_VARIABLE = 1,
    CKPT_REC_DEDUP = 2,
    CKPT_REC_SYNC = 3,
    CKPT_REC_END = 4,
    CKPT_REC_DEDUP_FLOORS = 5,
    CKPT_REC_TABLE = 6,
    CKPT_REC_TABLE_DELTA = 7,
    CKPT_REC_SYNC_OUT = 8,
    CKPT_REC_REPLICA = 9,
    CKPT_REC_TABLE_SKETCH = 10,
    CKPT_REC_SLOTS = 11,
    CKPT_REC_TABLE_COLD = 12, /* a table, its rows on disk in a copy of its cold store */
};
/* Flags of a partition in a table delta record: WHOLE, every row (replaces the partition). */
enum { CKPT_PART_WHOLE = 1 };
/* Flags of a variable record: INITIAL, never updated (version 0, no BSP aggregate): the
 * payload is the meta part alone, and the restore fills the values with the spec's
 * initializer (deterministic: a pure function of the spec), so that the checkpoint made for a
 * create costs the spec, not the shard. */
enum { CKPT_VAR_INITIAL = 1 };

typedef struct ckpt_snapshot ckpt_snapshot; /* ckpt_snapshot.h */

/* What a file's header says besides its format version. */
typedef struct ckpt_file_id {
    uint32_t num_servers, task;
    uint64_t cluster_hash; /* checkpoint_cluster_hash of the ps addresses */
    uint64_t seq;
    uint64_t prev; /* a delta: the previous file of its chain (0: a full checkpoint) */
} ckpt_file_id;

/* Bytes ckpt_file_write writes for s. */
uint64_t ckpt_file_size(const ckpt_snapshot *s);

/* Writes s into w's file: the header (a delta's when id->prev != 0), every record, the end
 * record; flushes w. Returns 0, or -1 with w's message. */
int ckpt_file_write(ckpt_writer *w, const ckpt_snapshot *s, const ckpt_file_id *id);

/* A sparse table a file holds, made but not registered yet, with its packed TableSpec. */
typedef struct loaded_table {
    table *t;
    uint8_t *spec;
    size_t len;
} loaded_table;

/* A table delta record, checked but not applied (its rows apply over the previous file's). */
typedef struct ckpt_table_delta {
    char *name;
    uint8_t *spec;
    size_t spec_len;
    uint32_t row_floats, nparts;
    uint8_t *body; /* the partitions, as in the record */
    uint64_t body_len;
} ckpt_table_delta;

/* What a file restores, before it is applied. */
typedef struct ckpt_loaded {
    variable **vars;
    size_t nvars, cap;
    uint64_t *dedup;
    uint64_t dedup_clients;
    uint32_t dedup_words;
    uint64_t *floors; /* a dedup_export_floors array; NULL in a version 1 file */
    size_t nfloors;
    sync_worker_rec *workers;
    size_t nworkers;
    int64_t applied_min;
    int64_t frontier; /* SYNC_NO_FRONTIER without record 8 */
    bool have_sync;
    uint64_t bytes;
    loaded_table *tables; /* [ntables] */
    size_t ntables;
    struct loaded_sketch {
        char *name;
        uint8_t *data;
        size_t len;
    } * sketches; /* records 10: admission sketches by table name */
    size_t nsketches;
    ckpt_table_delta *tdeltas; /* a delta file's table records 7 */
    size_t ntdeltas;
    uint64_t prev; /* a delta file: the previous file of its chain (0: a full file) */
    bool has_pos;  /* record 9 */
    uint64_t pos_epoch, pos_lsn;
    bool has_slots; /* record 11: */
    uint32_t slots_n, slots_servers;
    uint32_t *slot_owner; /* [slots_n]; NULL: the static map */
} ckpt_loaded;

/* Which files a read accepts and what it keeps of them. */
typedef struct ckpt_source {
    uint32_t num_servers, task; /* what the header must say (else CKPT_REFUSED) */
    /* NULL: every table row. Else only the rows whose slot `keep` gives to task `self` (a
     * restore onto another number of servers: ckpt_restore.c). */
    const slot_map *keep;
    uint32_t self;
} ckpt_source;

/* Reads the whole file at path, named with sequence number name_seq, into *l, a file of the
 * task and cluster size src names (st's tables are made, not registered). Fills *seq_out.
 * Returns 0, -1 (damaged: err says why; *l empty) or CKPT_REFUSED (made for another cluster
 * shape or task). */
int ckpt_file_read(const char *path, server_state *st, const ckpt_source *src,
                   uint64_t cluster_hash, uint64_t name_seq, ckpt_loaded *l, uint64_t *seq_out,
                   char *err, size_t errlen);

/* What a file's header and its slot record (11, when first) say: the placement it holds. */
typedef struct ckpt_shape {
    uint32_t num_servers, task;
    uint64_t created_ns; /* the header's creation time (Unix ns) */
    bool has_slots;      /* a slot record: */
    bool slots_fixed;    /* the static map of slots_servers over slots_n slots */
    uint32_t slots_n, slots_servers;
} ckpt_shape;

/* Reads the shape of the file at path (its header and first record's head, no checksums of
 * records). Returns 0, or -1 with a message (unreadable header). */
int ckpt_peek_shape(const char *path, ckpt_shape *out, char *err, size_t errlen);

/* Frees what l holds and zeroes it. */
void ckpt_loaded_free(ckpt_loaded *l);

/* A packed TableSpec spec (len bytes) with num_servers set to num_servers: malloc'd, its
 * length in *out_len; NULL when it does not decode or memory runs out. */
uint8_t *ckpt_table_spec_for(const uint8_t *spec, size_t len, uint32_t num_servers,
                             size_t *out_len);

/* A restored row's update time from the one stored: rows' update times are wall-clock ms
 * (ttl_ms counts from them); files of older servers hold monotonic ones, far below any
 * wall-clock time of this century: such a row's age starts again at the restore. */
int64_t ckpt_row_time(int64_t updated_ms);

#endif
