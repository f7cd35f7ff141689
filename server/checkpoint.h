/* Durable checkpoints of one server's shard, and their restore at start: the interface the
 * rest of the server includes.
 *
 * A checkpoint holds every variable this server holds (its packed VariableSpec, range,
 * parameters, optimizer slots, version, staleness bound, BSP aggregate), the clock table,
 * the exactly-once dedup windows (so that a push resent after a restore is still dropped),
 * the sparse tables and a replica group's log position. Each concept in its own file:
 *   ckpt_format.h    the file format: header, records, the one table of record types
 *   ckpt_frame.h     its framing: the checksummed record writer and reader
 *   ckpt_snapshot.h  the consistent copy of the state a checkpoint writes
 *   checkpointer.h   the thread, its queue, the creates waiting to be durable, health
 *   ckpt_restore.h   reading the newest valid chain of files and applying it
 *   ckpt_dir.h       the directory: listing, pruning, the lock, the record of the last server
 *   ckpt_types.h     the configuration and results they share
 *   checkpoint.c     the cluster's hash a header records
 * Includes and calls run one way: each of checkpointer, ckpt_restore, ckpt_format,
 * ckpt_snapshot, ckpt_dir, ckpt_frame and ckpt_types uses only those after it in this list. */
#ifndef PSD_SERVER_CHECKPOINT_H
#define PSD_SERVER_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "checkpointer.h"
#include "ckpt_dir.h"
#include "ckpt_format.h"
#include "ckpt_restore.h"
#include "ckpt_types.h"

/* FNV-1a hash of the ps addresses joined by ','. */
uint64_t checkpoint_cluster_hash(char *const *ps, size_t n);

#endif
