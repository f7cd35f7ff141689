/* State of one ps-server process (or of one replica group's copy): its variables, tables,
 * dedup window, clock table and counters. The method table is methods.h; the tables are
 * table_registry.h. */
#ifndef PSD_SERVER_SERVER_H
#define PSD_SERVER_SERVER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "budget.h"
#include "dedup.h"
#include "rpc_server.h"
#include "slots.h"
#include "store.h"
#include "sync.h"
#include "table_registry.h"

#define SERVER_MAX_WORKERS 4096

typedef struct server_state {
    uint32_t task_index;
    uint32_t num_servers;
    /* Who holds each slot (slots.h); read it with server_slots, which gives a state made
     * without one (a replica group's copy) the static map of num_servers servers. */
    slot_map slots;
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
    struct server_tables *tables; /* sparse tables (table_registry.c); NULL: none yet */
    /* What its variables and tables may hold (max-server-bytes, or its share of it for a
     * replica group's copy); owned by the state (server_set_limits); NULL: no limit. */
    mem_budget *budget;
    atomic_uint_fast64_t table_bytes; /* bytes the tables hold */
    struct view_agent *view_agent;    /* replicas > 1: the failover agent (view_agent.h) */
    /* A replica group's state (replicas > 1): its tables' rows expire only through sweeps its
     * primary logs (server_tables_sweep_due), never on a push by the copy's own clock. */
    bool replicated;
    /* The running checkpointer of this state (checkpointer_of), NULL: none. */
    struct checkpointer *_Atomic ck;
    /* replicas > 1: a rejoin copy replaces what this state holds (variables, tables, dedup and
     * sync state) with this lock held for writing, and its group's order lock; code that reads
     * them holding neither (metrics, the checkpointer's thread, reads served unlogged) holds it
     * for reading (server_state_read_begin). NULL: never replaced. */
    pthread_rwlock_t *swap;
} server_state;

/* st's slot map: the one it holds, or the static map of its num_servers for a state made
 * without one. */
static inline slot_map server_slots(const server_state *st)
{
    if (st->slots.nslots != 0 && (st->slots.owner != NULL || st->slots.nservers == st->num_servers))
        return st->slots;
    return slots_static(SLOTS_DEFAULT, st->num_servers);
}

/* Brackets code that reads what st holds without its group's order lock (server_state.swap).
 * Never held while taking a group's order lock or the view's lock. */
static inline void server_state_read_begin(server_state *st)
{
    if (st->swap)
        pthread_rwlock_rdlock(st->swap);
}

static inline void server_state_read_end(server_state *st)
{
    if (st->swap)
        pthread_rwlock_unlock(st->swap);
}

/* Sets the limits of st (made with its store and dedup table): max_bytes is the process's
 * max-server-bytes (0: 75% of physical memory); with replicas r > 1 a process holds copies
 * of r replica groups, and each copy's variables and tables may hold max_bytes / r (the same
 * share at every copy of a group, so that the copies decide alike). max_vars on its store, and
 * the dedup table's limits. Logs them. Returns 0, or -1 when memory can't be had. */
int server_set_limits(server_state *st, uint64_t max_bytes, uint32_t replicas, uint64_t max_vars,
                      uint64_t dedup_max_clients, uint64_t dedup_idle_ms);

/* Frees what st holds: tables, variables, dedup and sync state, its budget; the pointers are
 * left NULL. No call, checkpointer or metrics collector may still use them. */
void server_state_clear(server_state *st);
/* States whose contents this process holds (server_set_limits to server_state_clear): with
 * replicas r, r once every copy a rejoin replaced was freed. */
uint64_t server_states_held(void);

/* server_state_clear, then frees st itself (made on the heap). NULL: nothing. */
void server_state_free(server_state *st);

#endif
