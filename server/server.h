/* State of one ps-server process (or of one replica group's copy): its variables, tables,
 * dedup window, clock table and counters. The method table is methods.h; the tables are
 * table_registry.h. */
#ifndef PSD_SERVER_SERVER_H
#define PSD_SERVER_SERVER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "dedup.h"
#include "rpc_server.h"
#include "store.h"
#include "sync.h"
#include "table_registry.h"

#define SERVER_MAX_WORKERS 4096

typedef struct server_state {
    uint32_t task_index;
    uint32_t num_servers;
    uint64_t start_ns;
    store *vars;
    dedup *dedup;
    rpc_server *rpc;
    atomic_uint_fast64_t updates_applied;
    atomic_uint_fast64_t duplicates_dropped;
    atomic_bool shutdown_requested;
    sync_state *sync;
    int32_t default_staleness; /* for specs that ask for the server's default (-2) */
    /* Variables created by clients, counted; bumped with the store's update lock held, so a
     * checkpoint's snapshot holds exactly the variables of create_gen <= its own. */
    atomic_uint_fast64_t create_gen;
    struct server_tables *tables;     /* sparse tables (table_registry.c); NULL: none yet */
    uint64_t max_bytes;               /* max-server-bytes in force (server_set_limits) */
    atomic_uint_fast64_t table_bytes; /* bytes the tables hold */
    struct view_agent *view_agent;    /* replicas > 1: the failover agent (view_agent.h) */
    /* A replica group's state (replicas > 1): its tables' rows expire only through sweeps its
     * primary logs (server_tables_sweep_due), never on a push by the copy's own clock. */
    bool replicated;
    /* The running checkpointer of this state (checkpointer_of), NULL: none. */
    struct checkpointer *_Atomic ck;
} server_state;

/* Sets the limits of st's store and dedup table: max_bytes 0 means 75% of physical memory
 * (max-server-bytes). Logs them. Returns 0, or -1 when memory can't be had (var_rpc.c). */
int server_set_limits(server_state *st, uint64_t max_bytes, uint64_t max_vars,
                      uint64_t dedup_max_clients, uint64_t dedup_idle_ms);

#endif
