/* The checkpointer of a server's state: the background thread that writes its checkpoints
 * (periodic ones, and those the Checkpoint RPC asks for, parked in a queue), the creates
 * parked until what they made is durable, the chain of deltas, the health of its checkpoints
 * and the replica position they carry. One checkpoint is written at a time: a snapshot
 * (ckpt_snapshot.h), the file (ckpt_format.h) written beside it, fsynced, renamed into place,
 * the directory fsynced and pruned (ckpt_dir.h).
 *
 * Consistency: the state is copied between store_freeze and store_thaw (store.h), which every
 * update excludes from its dedup mark through its apply; the file is then written from the
 * copy while updates go on. */
#ifndef PSD_SERVER_CHECKPOINTER_H
#define PSD_SERVER_CHECKPOINTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ckpt_types.h"
#include "rpc_server.h"
#include "server.h"

/* How the checkpoints of a checkpointer fare (checkpointer_health). */
typedef struct checkpoint_health {
    uint64_t failures;     /* failed checkpoints since start */
    uint64_t failures_row; /* failed since the last success (0 after one) */
    uint64_t last_seq;     /* newest durable checkpoint (restored or written; 0: none) */
    double age_s;          /* seconds since the newest written, or since start if none yet */
    char last_error[512];  /* the newest failure's message ("" if none) */
} checkpoint_health;

typedef struct checkpointer checkpointer;

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
/* Returns once a checkpoint ck was writing when called (if any) is written: one that begins
 * later takes its snapshot of the state as it is then. */
void checkpointer_barrier(checkpointer *ck);
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
/* Writes the directory's record of this server (ckpt_dir.h) naming the newest durable
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
