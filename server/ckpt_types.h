/* The values checkpoints are described by, shared by the checkpointer (checkpointer.h), the
 * restore (ckpt_restore.h) and the snapshot (ckpt_snapshot.h): the configuration, what a
 * checkpoint or a restore did, the hook that gives a checkpoint a replica group's log
 * position, and what a restore returns. */
#ifndef PSD_SERVER_CKPT_TYPES_H
#define PSD_SERVER_CKPT_TYPES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

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
    uint32_t replicas;        /* the cluster's replicas (> 1: no restore onto another size) */
} checkpoint_config;

typedef struct checkpoint_info {
    char path[4200];
    uint64_t seq;
    uint64_t bytes;
    uint32_t variables;
    uint64_t pause_us;     /* checkpoint: time updates were held off */
    uint64_t ms;           /* checkpoint: request to durable; restore: time to read */
    uint64_t versions;     /* sum of its variables' versions (updates applied, per shard) */
    uint64_t base;         /* checkpoint: the previous file a delta is relative to (0: full);
                              restore: the full file the chain started from */
    uint64_t table_rows;   /* rows of sparse tables written or restored (a delta: changed) */
    uint32_t deltas;       /* restore: deltas applied over the full file */
    uint64_t skipped;      /* restore: seq of a newer delta of the chain found unusable (0: none) */
    uint32_t from_servers; /* restore: the cluster size of the files restored when they were
                              made by another one or before slots (every old task's files
                              read, this server's slots kept); 0: this server's own */
    bool has_position;     /* the file holds a replica group's log position (record 9): */
    uint64_t epoch, lsn;   /* its view epoch and next log sequence number */
} checkpoint_info;

/* A replicated group's log position, for record 9: called with hold true just before the state
 * is copied, it keeps the group's log still (no operation applied) until it is called again
 * with hold false just after the copy, and fills *epoch and *lsn (the next log sequence
 * number: the copy holds every operation before it). Returns false when the state has no
 * position (a copy not yet usable): no record then. */
typedef bool (*checkpoint_position_fn)(void *arg, bool hold, uint64_t *epoch, uint64_t *lsn);

/* Result of checkpoint_restore (ckpt_restore.h). */
enum {
    CKPT_RESTORED = 0,
    CKPT_NONE = 1,     /* no checkpoint of this task in the directory: start empty */
    CKPT_REFUSED = -2, /* made for another cluster shape or task (configuration error) */
    CKPT_FAILED = -1,  /* unreadable directory, or no valid checkpoint among those found */
};

#endif
