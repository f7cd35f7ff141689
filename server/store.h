/* The variables a server holds: its shard of each, with the optimizer state beside it.
 * Variables are never removed while the server runs, so a variable pointer found once stays
 * valid until store_destroy. */
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
    struct variable *next;
} variable;

typedef struct store store;

store *store_create(void);
void store_destroy(store *s); /* frees every variable; NULL is a no-op */

/* Makes a variable for this server's range [offset, offset+count) of `spec` (copied),
 * with parameters initialised and optimizer slots set. Returns NULL and a message in err if
 * memory can't be had or the spec is invalid for the optimizer/initializer. */
variable *variable_create(const Psd__V1__VariableSpec *spec, uint64_t numel, uint64_t offset,
                          uint64_t count, char *err, size_t errlen);
/* The same with parameters and slots allocated but not initialised (a restore fills them). */
variable *variable_create_unfilled(const Psd__V1__VariableSpec *spec, uint64_t numel,
                                   uint64_t offset, uint64_t count, char *err, size_t errlen);
void variable_destroy(variable *v);

/* Inserts v unless a variable of that name exists: then returns the existing one and leaves v
 * with the caller. Returns v itself when inserted (the store owns it from then on). */
variable *store_insert(store *s, variable *v);
variable *store_find(store *s, const char *name);
/* Snapshot of all variables (array owned by the caller, variables by the store). */
size_t store_list(store *s, variable ***out);
/* Bytes of parameters and optimizer state held. */
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
