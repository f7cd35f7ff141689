/* The variables a server holds: its shard of each, with the optimizer state beside it.
 *
 * Lifetime: a variable is reference counted. The store holds one reference while the variable
 * is linked under its name; store_find, store_insert and store_list hand out pointers that
 * carry one reference each, and every holder (a handler, a parked pull, a snapshot, a sweep)
 * gives it back with variable_release when done. store_remove unlinks a variable (DeleteVariable)
 * and hands the store's reference to the caller; the last release frees the variable and gives
 * its bytes back to the store's accounting. Cost on the hot path: one atomic increment (under
 * the store's read lock) and one atomic decrement per call. */
#ifndef PSD_SERVER_STORE_H
#define PSD_SERVER_STORE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "optimizer.h"
#include "ps.pb-c.h"

typedef struct variable {
    char *name;
    Psd__V1__VariableSpec *spec; /* owned copy, as created */
    uint64_t numel;              /* elements in the whole variable */
    uint64_t offset, count;      /* this server's range */
    optimizer_params opt;
    float *params;
    float *slots[OPTIMIZER_MAX_SLOTS];
    size_t nslots;
    pthread_mutex_t lock;         /* guards params, slots and the BSP aggregate */
    atomic_uint_fast64_t version; /* updates applied to this shard */
    int32_t staleness;            /* -1 async, 0 BSP, > 0 SSP */
    /* BSP: gradients summed for the open clock, and which workers contributed. */
    float *agg;
    uint64_t *agg_workers; /* bitmap over worker ids */
    int agg_count;         /* distinct workers in agg_workers */
    /* Observed staleness of pulls by workers (histogram buckets: see sync.h). */
    atomic_int_fast64_t st_max;
    atomic_uint_fast64_t st_hist[13];
    atomic_uint_fast64_t st_pulls, st_waits, st_wait_ms, st_timeouts;
    atomic_uint_fast32_t refs; /* references: the store's while linked, plus each holder's */
    atomic_bool deleted;       /* unlinked by store_remove: parks no more pulls */
    struct store *owner;       /* whose byte accounting the last release updates (NULL: none) */
    uint64_t restored_version; /* version when serving began (handlers.c), 0 if created since */
    struct variable *next;
} variable;

typedef struct store store;

store *store_create(void);
/* Frees every variable still linked, whatever references remain: call once nothing uses the
 * store (the RPC server stopped, parked pulls answered). NULL is a no-op. */
void store_destroy(store *s);

/* Makes a variable for this server's range [offset, offset+count) of `spec` (copied),
 * with parameters initialised and optimizer slots set. Returns NULL and a message in err if
 * memory can't be had or the spec is invalid for the optimizer/initializer. */
variable *variable_create(const Psd__V1__VariableSpec *spec, uint64_t numel, uint64_t offset,
                          uint64_t count, char *err, size_t errlen);
/* The same with parameters and slots allocated but not initialised (a restore fills them). */
variable *variable_create_unfilled(const Psd__V1__VariableSpec *spec, uint64_t numel,
                                   uint64_t offset, uint64_t count, char *err, size_t errlen);
/* Frees a variable that was never inserted (a create returns it with one reference, the
 * caller's). Inserted variables are freed by their last variable_release instead. */
void variable_destroy(variable *v);
/* Takes one more reference on a variable the caller already holds a reference to. */
void variable_retain(variable *v);
/* Gives one reference back; the last frees the variable and, if it was inserted, subtracts its
 * bytes from its store's. NULL is a no-op. Never call it holding the store's lock. */
void variable_release(variable *v);

/* Limits on what clients may create (0: none): bytes of parameters plus optimizer slots, and
 * variables. Checkpoint restores insert regardless (store_insert does not check them). */
void store_set_limits(store *s, uint64_t max_bytes, uint64_t max_vars);

/* Bytes a shard of count elements with nslots optimizer slots holds. */
uint64_t store_shard_bytes(uint64_t count, size_t nslots);

/* Reserves room for one more variable of `bytes` before it is allocated. Returns 0, or
 * RESOURCE_EXHAUSTED's status (status.h) with a message naming the limit and its setting
 * (max-server-bytes, max-variables) in err. Every successful reserve is matched by
 * store_unreserve once the variable was inserted (or not). */
int store_reserve(store *s, uint64_t bytes, char *err, size_t errlen);
void store_unreserve(store *s, uint64_t bytes);

/* Inserts v unless a variable of that name exists: then returns the existing one (referenced)
 * and leaves v with the caller. Returns v itself when inserted: the caller's creation
 * reference became the store's, and the pointer returned carries a new one for the caller.
 * Either way the caller releases the pointer returned. */
variable *store_insert(store *s, variable *v);
/* The variable of that name with a reference for the caller, or NULL. */
variable *store_find(store *s, const char *name);
/* Unlinks the variable of that name (the name may be created again at once) and returns it
 * with the store's reference, now the caller's; marks it deleted. NULL if absent. */
variable *store_remove(store *s, const char *name);
/* Snapshot of all variables: the array is the caller's, and each entry carries a reference;
 * give both back with store_list_release. */
size_t store_list(store *s, variable ***out);
/* Releases each of the n variables of a store_list array and frees the array (NULL: no-op). */
void store_list_release(variable **vars, size_t n);
/* Bytes of parameters and optimizer state held, including deleted variables whose last
 * reference is still held. */
uint64_t store_bytes(store *s);

/* Snapshot consistency. Every update holds update_begin..update_end (a shared lock) from its
 * exactly-once mark through the change of parameters/aggregate, so that a snapshot, taken
 * between store_freeze and store_thaw (the exclusive side), never sees a push marked as
 * applied without its update. Not recursive: an updating thread takes it once. */
void store_update_begin(store *s);
void store_update_end(store *s);
void store_freeze(store *s);
void store_thaw(store *s);

/* Compares two specs field by field (shape, the fields of common/spec_fields.h, then the
 * placement); returns NULL if equal or the name of the first field that differs, and writes
 * "A vs B" (a's value, then b's) into detail (capacity cap; may be NULL). */
const char *spec_diff(const Psd__V1__VariableSpec *a, const Psd__V1__VariableSpec *b, char *detail,
                      size_t cap);

#endif
