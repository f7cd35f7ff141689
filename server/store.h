/* The variables a server holds: its shard of each, with the optimizer state beside it. A
 * variable cut in parts (spec->parts) is held as its head (the spec, no elements) and the parts
 * the server's slots give it, each an entry of its own keyed by (name, part index) with the
 * part's range: a part is a shard.
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
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "budget.h"
#include "optimizer.h"
#include "ps.pb-c.h"

typedef struct variable {
    char *name;
    Psd__V1__VariableSpec *spec; /* owned copy, as created */
    uint64_t numel;              /* elements in the whole variable */
    uint64_t offset, count;      /* this server's range (of a part: the part's) */
    uint64_t part;               /* part index, or VARIABLE_HEAD (whole, ranges, or a head) */
    optimizer_params opt;
    float *params;
    float *slots[OPTIMIZER_MAX_SLOTS];
    size_t nslots;
    /* Range locks: stripe i guards elements [i << stripe_shift, (i + 1) << stripe_shift) of
     * params, every slot and agg, so that pushes to disjoint chunks apply in parallel. */
    struct variable_stripe *stripes;
    uint32_t nstripes;            /* 1 .. VARIABLE_MAX_STRIPES */
    uint32_t stripe_shift;        /* log2 of the elements per stripe */
    atomic_uint_fast64_t version; /* updates applied to this shard */
    int32_t staleness;            /* -1 async, 0 BSP, > 0 SSP */
    /* BSP: gradients summed for the open clock, and which workers contributed. agg's
     * elements are guarded by the stripes; agg_workers and agg_count by all stripes or by one
     * stripe plus agg_lock (variable_agg_mark). Made once by variable_agg_ensure. */
    float *agg;
    uint64_t *agg_workers; /* bitmap over worker ids */
    size_t agg_words;      /* words of agg_workers */
    int agg_count;         /* distinct workers in agg_workers */
    pthread_mutex_t agg_lock;
    atomic_bool agg_ready; /* agg and agg_workers exist (set once, by variable_agg_ensure) */
    /* Observed staleness of pulls by workers (histogram buckets: see sync.h). */
    atomic_int_fast64_t st_max;
    atomic_uint_fast64_t st_hist[13];
    atomic_uint_fast64_t st_pulls, st_waits, st_wait_ms, st_timeouts;
    atomic_uint_fast32_t refs; /* references: the store's while linked, plus each holder's */
    atomic_bool deleted;       /* unlinked by store_remove: parks no more pulls */
    struct store *owner;       /* whose byte accounting the last release updates (NULL: none) */
    uint64_t restored_version; /* version when serving began (sync_resume), 0 if created since */
    uint64_t create_gen;       /* server_state.create_gen at its creation; 0: restored */
    struct variable *next;
} variable;

/* variable.part of an entry that is not a part: a variable held whole, a range of a split
 * variable, or the head of a variable cut in parts. */
#define VARIABLE_HEAD UINT64_MAX

/* True if v is the head of a variable cut in parts (it holds no elements). */
static inline bool variable_is_head(const variable *v)
{
    return v->spec->parts && v->part == VARIABLE_HEAD;
}

typedef struct store store;

store *store_create(void);
/* Frees every variable still linked, whatever references remain: call once nothing uses the
 * store (the RPC server stopped, parked pulls answered). NULL is a no-op. */
void store_destroy(store *s);

/* Makes a variable for this server's range [offset, offset+count) of `spec` (copied),
 * with parameters initialised and optimizer slots set. With spec->parts, count 0 makes the
 * head and a range of one part (offset a multiple of PLACEMENT_PART_ELEMS) makes that part. Returns
 * NULL and a message in err if memory can't be had or the spec is invalid for the
 * optimizer/initializer. */
variable *variable_create(const Psd__V1__VariableSpec *spec, uint64_t numel, uint64_t offset,
                          uint64_t count, char *err, size_t errlen);
/* The same with parameters and slots allocated but not initialised (a restore fills them). */
variable *variable_create_unfilled(const Psd__V1__VariableSpec *spec, uint64_t numel,
                                   uint64_t offset, uint64_t count, char *err, size_t errlen);
/* Frees a variable that was never inserted (a create returns it with one reference, the
 * caller's). Inserted variables are freed by their last variable_release instead. */
void variable_destroy(variable *v);
/* Range locks. A shard's elements are grouped into stripes of a power of two of elements,
 * VARIABLE_STRIPE_ELEMS (a 1 MiB chunk of floats is 4 whole stripes) or, for a shard of more
 * than VARIABLE_MAX_STRIPES such stripes, the smallest doubling of it that makes at most
 * VARIABLE_MAX_STRIPES; a shard of up to VARIABLE_STRIPE_ELEMS elements has one stripe.
 * Clients cut a tensor into chunks from the shard's first element, so chunk-sized pushes of
 * one shard take disjoint stripes and apply in parallel; ranges that share a stripe (smaller
 * pieces, or 1 MiB chunks of a shard over 16 Mi floats, whose stripes are wider) take turns,
 * still with up to 64 applying at once. The bound keeps variable_lock_all at 64 uncontended
 * mutexes and a variable's locks within 4 KiB.
 * Stripes are taken in ascending order by every function here, so any number of threads may
 * lock ranges at once without deadlock. A thread holds at most one range (or all) of one
 * variable at a time: the mutexes are not recursive. Lock order: store_update_begin (or
 * store_freeze), then a variable's stripes, then its agg_lock. */
#define VARIABLE_STRIPE_ELEMS 65536u
#define VARIABLE_MAX_STRIPES 64u

/* Locks the stripes covering elements [first, first+count) of v's shard; `first` is relative
 * to the shard's start (an index into v->params, i.e. a global offset minus v->offset). An
 * empty range (count 0) locks the one stripe holding `first`, so that every range lock, even
 * of nothing, excludes variable_lock_all. Indexes past the shard's end are clamped to its
 * last stripe. Unlock with variable_unlock_range and the same first and count. */
void variable_lock_range(variable *v, uint64_t first, uint64_t count);
void variable_unlock_range(variable *v, uint64_t first, uint64_t count);
/* Locks (unlocks) every stripe of v, ascending: for whole-shard work such as a BSP apply or a
 * checkpoint's copy. */
void variable_lock_all(variable *v);
void variable_unlock_all(variable *v);
/* Stripe index of element `first` (clamped to the last stripe) and the number of elements a
 * stripe covers; for tests and metrics. */
uint32_t variable_stripe_of(const variable *v, uint64_t first);
uint64_t variable_stripe_elems(const variable *v);

/* Words of agg_workers made at the least: a checkpoint copies that many (SERVER_MAX_WORKERS
 * bits, checked in ckpt_snapshot.c), whatever max_workers the sync state was made with. */
#define VARIABLE_AGG_MIN_WORDS 64u

/* Makes v's BSP aggregate, once: agg (count zeroed floats) and agg_workers (words for
 * max_workers bits, at least VARIABLE_AGG_MIN_WORDS), sets agg_words and agg_ready.
 * Thread safe: concurrent callers allocate once; the first call takes variable_lock_all, so
 * call it holding none of v's stripes. Cheap (one atomic load) once made. Returns 0, or -1
 * when memory can't be had (nothing is allocated then, and a later call tries again). */
int variable_agg_ensure(variable *v, int max_workers);
/* Records that `worker` (0 <= worker < max_workers, else ignored) contributed to the open
 * aggregate, counting it in agg_count once. Call with a range of v locked (any range), after
 * adding the worker's gradient to agg, so that a variable_lock_all holder sees both or
 * neither; safe against other range holders marking at the same time. */
void variable_agg_mark(variable *v, int32_t worker, int max_workers);

/* Takes one more reference on a variable the caller already holds a reference to. */
void variable_retain(variable *v);
/* Gives one reference back; the last frees the variable and, if it was inserted, subtracts its
 * bytes from its store's. NULL is a no-op. Never call it holding the store's lock. */
void variable_release(variable *v);

/* Limits on what clients may create: the budget that the bytes of parameters plus optimizer
 * slots count against (NULL: none; budget.h: shared by every state of a process), and the
 * variables (0: no limit). Checkpoint restores insert regardless (store_insert does not check
 * them, and counts their bytes in the budget all the same). */
void store_set_limits(store *s, mem_budget *b, uint64_t max_vars);

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
/* The variable of that name (the head of one cut in parts) with a reference for the caller,
 * or NULL. */
variable *store_find(store *s, const char *name);
/* Part `part` of the variable `name` cut in parts, with a reference for the caller, or NULL
 * when this server does not hold it. */
variable *store_find_part(store *s, const char *name, uint64_t part);
/* Unlinks the variable of that name (the head of one cut in parts; the name may be created
 * again at once) and returns it with the store's reference, now the caller's; marks it
 * deleted. NULL if absent. */
variable *store_remove(store *s, const char *name);
/* Unlinks part `part` of the variable `name` as store_remove does. NULL if absent. */
variable *store_remove_part(store *s, const char *name, uint64_t part);
/* Snapshot of all entries (variables, heads and parts): the array is the caller's, and each
 * entry carries a reference; give both back with store_list_release. */
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
