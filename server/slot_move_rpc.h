/* slot_move_rpc.h - the methods that move a batch of slots between live servers (replicas 1
 * with a coordinator; docs/design.md, "Moving slots"): SLOT_MOVE (admin, from psctl: send a
 * batch, commit it, or abort it) and SLOT_INSTALL (server to server, with the cluster token:
 * the batch's packages, source to target: a snapshot staged while the batch takes updates, then
 * the changes since under the freeze, or the batch whole), and the moves' counts for /metrics. */
#ifndef PSD_SERVER_SLOT_MOVE_RPC_H
#define PSD_SERVER_SLOT_MOVE_RPC_H

#include <stdint.h>

#include "rpc_client.h"
#include "rpc_server.h"

typedef struct slot_move_config {
    const char *endpoints; /* coordinator */
    const char *prefix;    /* the cluster's prefix in etcd (no trailing '/') */
    rpc_tls tls;           /* how this server reaches the others */
    const char *failpoint; /* tests only: "slot-move-hold" (see slot_move_rpc.c); NULL: none */
} slot_move_config;

/* Keeps cfg (its strings must live as long as the server) for the handlers. */
void slot_move_rpc_init(const slot_move_config *cfg);

/* Handlers; arg is the server_state. */
void handle_slot_move(rpc_call *call, void *arg);
void handle_slot_install(rpc_call *call, void *arg);

/* Batches this server sent: started, committed (finished), failed before the commit (their
 * slots stayed here); and the bytes of the batches it sent. */
typedef struct slot_move_stats {
    uint64_t started, finished, failed, bytes;
} slot_move_stats;
void slot_move_stats_get(slot_move_stats *out);

#endif
