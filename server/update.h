/* The update path (update.c): a push, dense or of a table's rows, made exactly once by
 * (client, seq) and applied. */
#ifndef PSD_SERVER_UPDATE_H
#define PSD_SERVER_UPDATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rpc_server.h"
#include "store.h"
#include "table_registry.h"

/* One push: Push, PushPull or an item of Step. */
typedef struct push_in {
    uint64_t client, seq;
    int32_t worker;
    const uint8_t *grad; /* cnt values of dtype; may be unaligned */
    int dtype;
    uint64_t off, cnt; /* in the variable's index space, checked against the shard */
    bool assign;       /* grad holds values to write as they are (PushRequest.assign) */
} push_in;

/* Where a push-pull's reply goes, once the push is marked: `reply` allocates the reply (with
 * the push's outcome) and returns its segment area, or NULL with an error reply in place. */
typedef uint8_t *(*push_reply_fn)(void *arg, bool duplicate, uint64_t version);

/* Dedups by (client, seq), then applies the optimizer (or adds to the BSP aggregate),
 * reading the gradient in place from the request. With `reply`, copies the parameters just
 * after the update, in out_dtype, into the area it returns, in the same critical section.
 * Returns STATUS_OK with *duplicate and *version set, -1 when `reply` failed (its error reply
 * is in place), or an error status with a message in err: ABORTED when dedup could not prove
 * the push new (dedup_refusal), FAILED_PRECONDITION when the update of some elements would
 * have left them non-finite (those kept their values, the others were applied; a push-pull's
 * reply is then replaced by the error). A push that found v before a DeleteVariable unlinked
 * it applies to the unlinked shard (it is ordered before the delete). */
int update_push_one(server_state *st, variable *v, const push_in *in, push_reply_fn reply,
                    void *reply_arg, int out_dtype, bool *duplicate, uint64_t *version, char *err,
                    size_t errlen);

/* A push of n gradient rows (n x dim values of dtype, any alignment), exactly once by
 * (client, seq) like a dense push: STATUS_OK with *duplicate set, or ABORTED (dedup could not
 * prove it new), INVALID_ARGUMENT (a non-finite gradient: nothing applied, seq not marked),
 * RESOURCE_EXHAUSTED, each with a message in err. */
int server_table_push(server_state *st, server_table *e, uint64_t client, uint64_t seq,
                      int32_t worker, const int64_t *ids, uint64_t n, const uint8_t *grads,
                      int dtype, bool *duplicate, char *err, size_t errlen);

void handle_push(rpc_call *call, void *arg);
void handle_assign(rpc_call *call, void *arg);
void handle_push_pull(rpc_call *call, void *arg);

#endif
