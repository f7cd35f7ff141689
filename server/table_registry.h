/* The registry of the sparse tables one server holds, by name: each entry its table, the spec
 * it was created with and its references (the registry's and every call's that found it), under
 * one lock; the budget hook that charges the tables' memory to max-server-bytes; making and
 * registering a table from a packed TableSpec (TableCreate, restore, BSP aggregates); and
 * finding a table for a call, checking its ids and reading its rows.
 *
 * Every table exists on every server; each server holds the rows slots_row_owner gives
 * it and refuses ids it does not own. A table lives until DeleteVariable names it
 * (server_table_delete) or the server exits. A BSP table's aggregate (table_bsp.h) is a table
 * of this registry too, named the table's name and BSP_SUFFIX. */
#ifndef PSD_SERVER_TABLE_REGISTRY_H
#define PSD_SERVER_TABLE_REGISTRY_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "ps.pb-c.h"
#include "table.h"

typedef struct server_state server_state;

/* Ids per TablePull/TablePush request at most. */
#define SERVER_TABLE_MAX_IDS (1ull << 22)
/* Tables one server holds at most. */
#define SERVER_MAX_TABLES 1024

/* A BSP table's aggregate is a table named the table's name and this suffix (a character no
 * client name has); names of BSP tables are shorter by its length. */
#define BSP_SUFFIX "#bsp"
#define BSP_MAX_NAME (TABLE_MAX_NAME - 4)

/* True for the name of a BSP aggregate (no client's table has a '#'). */
static inline bool registry_is_bsp_name(const char *name)
{
    return strchr(name, '#') != NULL;
}

typedef struct table_entry {
    table *t;
    Psd__V1__TableSpec *spec; /* unpacked copy of the spec it was created with */
    _Atomic int64_t last_sweep_ms;
    _Atomic uint64_t refs;    /* the registry's reference and every call's that found it */
    _Atomic bool deleted;     /* unlinked by a delete: calls holding it answer NOT_FOUND */
    uint64_t create_gen;      /* server_state.create_gen at its creation; 0: restored */
    pthread_mutex_t bsp_lock; /* BSP: its aggregate's pushes against their apply */
} table_entry;

/* The entry of `name` (BSP aggregates included), referenced (registry_put), or NULL. */
table_entry *registry_find(server_state *st, const char *name);
/* Drops a reference; the last one frees the entry and its table. NULL: nothing. */
void registry_put(table_entry *e);
/* Every entry, referenced (registry_release), in creation order; NULL with *n 0 when there is
 * none, NULL with *n > 0 when memory runs out. */
table_entry **registry_list(server_state *st, size_t *n);
void registry_release(table_entry **es, size_t n);
/* Entries held, BSP aggregates included. */
size_t registry_held(server_state *st);
/* Tables held (BSP aggregates not counted: they are part of their tables). */
size_t server_tables_count(server_state *st);

/* The core's spec from the wire's; INVALID_ARGUMENT with a message for what only the wire
 * can get wrong (the core validates the rest). The budget is left unset (registry_budget). */
int registry_table_spec(const Psd__V1__TableSpec *s, table_spec *out, char *err, size_t errlen);
/* Points ts's budget hook at st (max-server-bytes, shared with the variables) and its cold tier
 * at the server's cold-dir (registry_set_cold_dir). */
void registry_budget(table_spec *ts, server_state *st);
/* The server's cold-dir (checked by its caller; NULL or "": none): tables with ram_rows keep
 * their cold rows under it. Set once at start, before any table is made. */
void registry_set_cold_dir(const char *dir);
/* True when a and b pack to the same bytes. */
bool registry_spec_equal(const Psd__V1__TableSpec *a, const Psd__V1__TableSpec *b);
/* TableCreate: registers t, made from the wire's spec s (copied), under its name, counted in
 * st->create_gen under the update lock (so that a checkpoint's copy holds exactly the tables
 * created up to the create_gen it reads, as for variables). Returns the entry, referenced:
 * the one registered now (*created set, t taken) or the one another call registered meanwhile
 * (t destroyed); NULL when memory ran out (t destroyed). */
table_entry *registry_add_created(server_state *st, table *t, const Psd__V1__TableSpec *s,
                                  bool *created);

bool server_table_exists(server_state *st, const char *name);
/* DeleteVariable naming a table: unlinks it (held against a checkpoint's copy like an update),
 * so that calls still holding it answer NOT_FOUND and its memory goes back to
 * max-server-bytes once the last of them is done; the name may be created again at once.
 * Returns 0, or -1 when this server holds no table of that name. */
int server_table_delete(server_state *st, const char *name);
/* Frees every table (at exit, no call in flight). */
void server_tables_free(server_state *st);

/* A table as the Step and table handlers use it: found by name and referenced, so that it
 * stays valid for the call. */
typedef struct table_entry server_table;
/* The table `name`, referenced (server_table_put), or NULL with *status NOT_FOUND and a
 * message in err (saying so when the name is a dense variable's). */
server_table *server_table_get(server_state *st, const char *name, int *status, char *err,
                               size_t errlen);
void server_table_put(server_table *e);
const char *server_table_name(const server_table *e);
uint32_t server_table_dim(const server_table *e);
int32_t server_table_staleness(const server_table *e);
/* True once the table was deleted (its calls in flight answer NOT_FOUND). */
bool server_table_deleted(const server_table *e);
/* Copies n ids (int64 little-endian, 8 x n bytes of seg, any alignment) into *ids (malloc'd)
 * and checks that n is in 1..SERVER_TABLE_MAX_IDS and this server owns each. Returns
 * STATUS_OK, or a status with a message naming the table, the id and its owner. */
int server_table_ids(server_state *st, const server_table *e, const uint8_t *seg, uint64_t n,
                     int64_t **ids, char *err, size_t errlen);
/* Writes the rows of ids[0..n) into dst (n x dim values of dtype, any alignment). Returns 0,
 * or -1 when memory runs out. */
int server_table_read(server_table *e, const int64_t *ids, uint64_t n, uint8_t *dst, int dtype);

/* Makes an unregistered table from a packed TableSpec (restore, BSP aggregates). Returns 0, or
 * -1 with a message in err. */
int server_table_make(server_state *st, const uint8_t *spec, size_t len, struct table **out,
                      char *err, size_t errlen);
/* Registers t (made by server_table_make) under its name. Returns 0, or -1 when a table of
 * that name exists or memory runs out (t stays the caller's). */
int server_table_register(server_state *st, struct table *t, const uint8_t *spec, size_t len);

/* Points st's tables' memory accounting at st (after st's contents were copied in from
 * another state). */
void server_tables_rebind(server_state *st);
/* A replica group's primary: calls log_sweep for each table with a ttl_ms whose rows were last
 * swept a second ago or more (and notes the sweep as done); the sweep is logged as an internal
 * TablePush (sweep) and applied by every copy at the same point of the log. */
void server_tables_sweep_due(server_state *st, void (*log_sweep)(void *arg, const char *name),
                             void *arg);
/* h extended (FNV-1a) by every table of st in name order (BSP aggregates included): its name,
 * then each row by id: the id, its parameters and optimizer slots (not its update time). For
 * comparing replicas in tests and tools; copies each table's rows to sort them. */
uint64_t server_tables_checksum(server_state *st, uint64_t h);

#endif
