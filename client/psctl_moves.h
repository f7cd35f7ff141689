/* psctl add-server, remove-server and rebalance: slots moved between live servers, batch by
 * batch, as slots_plan says (docs/operations.md, "Adding and removing servers"; docs/
 * design.md, "Moving slots"). Clusters with a coordinator and replicas 1 only. */
#ifndef PSD_CLIENT_PSCTL_MOVES_H
#define PSD_CLIENT_PSCTL_MOVES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cluster.h"
#include "options.h"

typedef struct psctl_move_opts {
    uint32_t batch_slots;          /* slots per batch (1..4096) */
    uint64_t max_bytes_per_second; /* 0: no cap */
    bool json;
} psctl_move_opts;

/* cmd: "add-server" (addr: a server of the map to give an even share), "remove-server" (addr:
 * the server to empty) or "rebalance" (addr NULL): the slots are evened out over the servers
 * that hold some, plus the one added, less the one removed (a server emptied before stays
 * out until it is added again).
 * Returns 0 when every move is done (or none was needed), 2 for a usage error (nothing
 * moved), 1 when a move failed (the failed batch rolled back; the ones before it stay done;
 * a rerun goes on from there). */
int psctl_moves(const options *o, const cluster_spec *cl, const char *cmd, const char *addr,
                const psctl_move_opts *mo);

/* A move record (the value of <prefix>/moves/current, len bytes) as one line into out: the
 * batch, its run's progress, its psctl and whether that psctl is gone (psctl slots). */
void psctl_move_describe(const char *rec, size_t len, char *out, size_t cap);

#endif
