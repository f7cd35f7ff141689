/* The restore of a server's shard at start: the newest valid checkpoint of its task, a full
 * file and the deltas of its chain, read (ckpt_format.h) and applied to the server's state. */
#ifndef PSD_SERVER_CKPT_RESTORE_H
#define PSD_SERVER_CKPT_RESTORE_H

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

#endif
