/* The restore of a server's shard at start: the newest valid checkpoint of its task, a full
 * file and the deltas of its chain, read (ckpt_format.h) and applied to the server's state;
 * or, when the directory holds the checkpoints of a cluster of another size (or ones written
 * before slots), the slots this server holds now, from every old task's newest checkpoint. */
#ifndef PSD_SERVER_CKPT_RESTORE_H
#define PSD_SERVER_CKPT_RESTORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ckpt_types.h"
#include "server.h"

/* Restores the newest valid checkpoint of st's task from cfg->dir into st (whose store,
 * dedup table and clock table are new and empty). A corrupt or truncated one is skipped with a
 * warning naming the file and the reason, and the previous one is tried. Fills *info for a
 * restore and *max_seq with the highest sequence number found (0 if none), for the next
 * checkpoint. Leftover temporary files of the task are removed. Returns a CKPT_* value, with a
 * message in err for the negative ones. */
int checkpoint_restore(server_state *st, const checkpoint_config *cfg, checkpoint_info *info,
                       uint64_t *max_seq, char *err, size_t errlen);
/* When st's task has no checkpoint placed as st's slot map places it (files of another
 * cluster size, or written before slots when that placement differs), checkpoint_restore
 * restores the slots st holds from the files of every task of the newest such cluster in the
 * directory (its newest valid checkpoint each, deltas included): table rows, variables held
 * whole, this server's range of split variables (cut again for this cluster), their optimizer
 * slots and versions (the highest of the pieces); the exactly-once windows of every old task
 * (its own old task's winning for a client in several), the clock tables' union with each
 * worker's newest clock. info->from_servers is then the old cluster's size. A missing old
 * task's files leave its slots empty (logged) unless it held part of a split variable (then
 * CKPT_FAILED). With replicas > 1: CKPT_REFUSED with a message saying what to do. */

/* True if the checkpoint file at path is placed otherwise than the slot map `map` (a const
 * slot_map *) places this cluster: another cluster size, or written before slots when that
 * placement differs. Pruning keeps such files (ckpt_dir_prune's keep_file). */
bool checkpoint_file_foreign(const char *path, void *map);

#endif
