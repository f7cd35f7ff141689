/* Durable checkpoints of one server's shard, and their restore at start.
 *
 * A checkpoint holds every variable this server holds (its packed VariableSpec, range,
 * parameters, optimizer slots, version, staleness bound, BSP aggregate), the clock table and
 * the exactly-once dedup windows, so that a push resent after a restore is still dropped.
 *
 * File `ckpt-<task>-<seq>.psc` in the checkpoint directory, little-endian:
 *   header (64 bytes): magic "PSDCKPT\0", u32 format version (2), u32 header size (64),
 *     u32 num_servers, u32 task index, u64 FNV-1a hash of the ps address list, u64 sequence
 *     number, u64 creation time (Unix ns), 12 reserved bytes, u32 CRC-32 of the 60 before.
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
 * It is written to `.ckpt-<task>-<seq>.psc.tmp`, fsynced, renamed, and the directory fsynced;
 * the last `checkpoint-keep` are kept.
 *
 * Consistency: the state is copied between store_freeze and store_thaw (store.h), which every
 * update excludes from its dedup mark through its apply; the file is then written from the
 * copy while updates go on. */
#ifndef PSD_SERVER_CHECKPOINT_H
#define PSD_SERVER_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "rpc_server.h"
#include "server.h"

#define CKPT_MAGIC "PSDCKPT"
#define CKPT_FORMAT_VERSION 2u     /* written for full checkpoints */
#define CKPT_FORMAT_DELTA 3u       /* written for deltas (header names the previous file) */
#define CKPT_FORMAT_VERSION_MIN 1u /* oldest read: no dedup tombstone record, no INITIAL flag */
#define CKPT_HEADER_SIZE 64u

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
};
/* Flags of a partition in a table delta record: WHOLE, every row (replaces the partition). */
enum { CKPT_PART_WHOLE = 1 };
/* Flags of a variable record: INITIAL, never updated (version 0, no BSP aggregate): the
 * payload is the meta part alone, and the restore fills the values with the spec's
 * initializer (deterministic: a pure function of the spec), so that the checkpoint made for a
 * create costs the spec, not the shard. */
enum { CKPT_VAR_INITIAL = 1 };

typedef struct checkpoint_config {
    const char *dir;          /* "" or NULL: checkpoints off */
    int keep;                 /* restore points of this task kept (>= 1), whole chains */
    int full_every;           /* every this many checkpoints one is full, the rest deltas; 1
                                 (or less): every one full, and no chain kept: its tables' cuts
                                 are snapshot cuts (table.h), which leave another checkpointer's
                                 chain of the same state its deltas (copy images) */
    int64_t interval_s;       /* periodic checkpoints (0: none) */
    int64_t interval_updates; /* after this many updates (0: off) */
    uint64_t cluster_hash;    /* checkpoint_cluster_hash of the ps addresses */
    const char *failpoint;    /* tests only: "checkpoint-crash-mid-write" */
} checkpoint_config;

typedef struct checkpoint_info {
    char path[4200];
    uint64_t seq;
    uint64_t bytes;
    uint32_t variables;
    uint64_t pause_us;   /* checkpoint: time updates were held off */
    uint64_t ms;         /* checkpoint: request to durable; restore: time to read */
    uint64_t versions;   /* sum of its variables' versions (updates applied, per shard) */
    uint64_t base;       /* checkpoint: the previous file a delta is relative to (0: full);
                            restore: the full file the chain started from */
    uint64_t table_rows; /* rows of sparse tables written or restored (a delta: changed) */
    uint32_t deltas;     /* restore: deltas applied over the full file */
    uint64_t skipped;    /* restore: seq of a newer delta of the chain found unusable (0: none) */
    bool has_position;   /* the file holds a replica group's log position (record 9): */
    uint64_t epoch, lsn; /* its view epoch and next log sequence number */
} checkpoint_info;

/* A replicated group's log position, for record 9: called with hold true just before the state
 * is copied, it keeps the group's log still (no operation applied) until it is called again
 * with hold false just after the copy, and fills *epoch and *lsn (the next log sequence
 * number: the copy holds every operation before it). Returns false when the state has no
 * position (a copy not yet usable): no record then. */
typedef bool (*checkpoint_position_fn)(void *arg, bool hold, uint64_t *epoch, uint64_t *lsn);

/* How the checkpoints of a checkpointer fare (checkpointer_health). */
typedef struct checkpoint_health {
    uint64_t failures;     /* failed checkpoints since start */
    uint64_t failures_row; /* failed since the last success (0 after one) */
    uint64_t last_seq;     /* newest durable checkpoint (restored or written; 0: none) */
    double age_s;          /* seconds since the newest written, or since start if none yet */
    char last_error[512];  /* the newest failure's message ("" if none) */
} checkpoint_health;

typedef struct checkpointer checkpointer;

/* FNV-1a hash of the ps addresses joined by ','. */
uint64_t checkpoint_cluster_hash(char *const *ps, size_t n);

/* Result of checkpoint_restore. */
enum {
    CKPT_RESTORED = 0,
    CKPT_NONE = 1,     /* no checkpoint of this task in the directory: start empty */
    CKPT_REFUSED = -2, /* made for another cluster shape or task (configuration error) */
    CKPT_FAILED = -1,  /* unreadable directory, or no valid checkpoint among those found */
};

/* Restores the newest valid checkpoint of st's task from cfg->dir into st (whose store,
 * dedup table and clock table are new and empty). A corrupt or truncated one is skipped with a
 * warning naming the file and the reason, and the previous one is tried. Fills *info for a
 * restore and *max_seq with the highest sequence number found (0 if none), for the next
 * checkpoint. Leftover temporary files of the task are removed. Returns a CKPT_* value, with a
 * message in err for the negative ones. */
int checkpoint_restore(server_state *st, const checkpoint_config *cfg, checkpoint_info *info,
                       uint64_t *max_seq, char *err, size_t errlen);

/* Makes dir and its parents if missing and checks it is a writable directory. Returns 0, or
 * -1 with a message (a configuration error: e.g. a path below a regular file). */
int checkpoint_mkdir(const char *dir, char *err, size_t errlen);

/* A checkpointer for st writing into cfg->dir (made if missing) from sequence number
 * next_seq. No thread yet. Returns NULL with a message in err. */
checkpointer *checkpointer_create(server_state *st, const checkpoint_config *cfg, uint64_t next_seq,
                                  char *err, size_t errlen);
/* Starts the background thread: periodic checkpoints and the Checkpoint RPC's requests.
 * Returns 0, or -1 with a message. */
int checkpointer_start(checkpointer *ck, char *err, size_t errlen);
/* Writes a checkpoint now (serialised with the thread's). Returns 0 with *info filled, or -1
 * with a message naming the file and the failing step. */
int checkpoint_write(checkpointer *ck, checkpoint_info *info, char *err, size_t errlen);
/* Parks a Checkpoint RPC and has the thread answer it once a checkpoint begun after it is
 * durable. Replies at once when it can't be parked. */
void checkpointer_request(checkpointer *ck, rpc_call *call);
/* Answers parked requests and stops and joins the thread (call before the RPC server
 * stops); checkpoint_write still works afterwards. NULL is a no-op. */
void checkpointer_stop(checkpointer *ck);
/* Parks a CreateVariable call until its variable is in a durable checkpoint, so that a
 * variable whose creation was acknowledged survives any crash: v's create_gen is compared
 * with the newest durable checkpoint's (a restored variable's is 0). rep is the reply to send
 * then (copied; shard and staleness only). Returns false when v is durable already (the
 * caller replies); true when the call was parked (answered by the thread once a checkpoint
 * holding v is durable, or UNAVAILABLE naming the failure, which a retry of the create
 * tries again) or answered with an error at once. Creates that arrive while a checkpoint is
 * written share the next one. */
bool checkpointer_await_create(checkpointer *ck, rpc_call *call, const variable *v,
                               const Psd__V1__CreateVariableReply *rep);
/* The same for a TableCreate call: gen is the table's create_gen (server_state.create_gen,
 * bumped under the store's update lock when the table was registered; 0 for a restored one),
 * the reply a TableCreateReply with `created`. */
bool checkpointer_await_table_create(checkpointer *ck, rpc_call *call, uint64_t gen,
                                     const char *name, bool created);
/* Failures, age of the newest checkpoint and the last error. NULL ck: zeroed. */
void checkpointer_health(checkpointer *ck, checkpoint_health *out);
/* Writes the directory's record of this server (checkpoint_state.h) naming the newest durable
 * checkpoint: clean false when it starts serving, true after a successful final checkpoint
 * of a clean shutdown (a restart then says nothing was lost). Failures are logged. */
void checkpointer_record(checkpointer *ck, bool clean);
/* Sets the function that gives the checkpoints of ck a log position (NULL: none), waiting for
 * a checkpoint being written. */
void checkpointer_set_position(checkpointer *ck, checkpoint_position_fn fn, void *arg);
/* The sequence number the next checkpoint of ck takes. */
uint64_t checkpointer_next_seq(checkpointer *ck);
/* Sets the restored checkpoint (seq, versions) as the newest durable one. */
void checkpointer_set_restored(checkpointer *ck, uint64_t seq, uint64_t versions);
/* Stops the thread if running and frees ck. NULL is a no-op. */
void checkpointer_destroy(checkpointer *ck);

/* The checkpointer serving st's RPCs (set by checkpointer_start, cleared by checkpointer_stop),
 * or NULL: checkpoints off for st. */
checkpointer *checkpointer_of(const server_state *st);

#endif
