/* Consistency across workers: the clock table, worker liveness, pulls that wait for a
 * staleness bound, and BSP aggregation (DESIGN.md §6).
 *
 * Each worker (worker_id >= 0) has a clock and a last-heard time. Workers named in the
 * cluster spec are expected from the start; a worker silent for longer than the timeout is
 * evicted (logged) and the waits it held resume; one that comes back re-registers at least at
 * the clock of the slowest live worker.
 *
 * A pull at clock c of a variable with bound s >= 0 waits until every live worker's clock is
 * >= c - s and, for s = 0 (BSP), until the aggregated update of the clocks before is applied.
 * Every wait ends: when the bound allows, or at the request's deadline with
 * DEADLINE_EXCEEDED naming the workers it waited for, or UNAVAILABLE at shutdown. */
#ifndef PSD_SERVER_SYNC_H
#define PSD_SERVER_SYNC_H

#include <stdbool.h>
#include <stdint.h>

#include "rpc_server.h"
#include "store.h"

#define STALENESS_BUCKETS 13

typedef struct server_state server_state;
typedef struct sync_state sync_state;

/* n_expected workers (ids 0..n-1) are registered at clock 0 from now. timeout_ms: silence
 * after which a worker is evicted. mean: BSP divides the sum of gradients by the number of
 * workers that contributed. Returns NULL on allocation failure. */
sync_state *sync_create(int n_expected, uint32_t timeout_ms, bool mean, int max_workers);
void sync_destroy(sync_state *s);

/* A replicated group's state: its clock table changes only through the group's log, so that
 * every replica evicts and re-registers the same workers at the same point of the log (BSP
 * aggregates are applied when they are). From now on sync_sweep does not evict a silent worker
 * itself but calls evict(arg, worker) (no lock held), which logs the eviction and applies it
 * (sync_evict) in log order; and a pull (not logged) does not re-register an evicted worker. */
typedef void (*sync_evict_fn)(void *arg, int32_t worker);
void sync_set_logged(server_state *st, sync_evict_fn evict, void *arg);
/* The barrier hook: called when the slowest live worker's clock moves forward, after the dense
 * variables' BSP aggregates are applied and before the pulls it allows are answered (with the
 * state and whether BSP divides sums by the pushes that made them); the server's start-up
 * registers the sparse tables' (server_tables_bsp_apply), so that this module does not depend
 * on tables. One for the process (every server_state), set before any request is served;
 * NULL: none. */
typedef void (*sync_barrier_fn)(server_state *st, bool mean);
void sync_set_barrier_fn(sync_barrier_fn fn);
/* Evicts worker (if live) as the sweep does when it has been silent too long: its waits
 * resume, BSP aggregates it held back are applied. A logged eviction's apply, on every
 * replica. */
void sync_evict(server_state *st, int32_t worker);
/* Whether worker is live and silent for longer than the timeout now. */
bool sync_worker_silent(server_state *st, int32_t worker);
/* Whether a request of worker from client would register it (again) here: a worker in range
 * that this state does not count live (never heard from, or evicted), other than a finished
 * worker's last calls. A replicated group logs such a request, even a read. */
bool sync_would_register(server_state *st, int32_t worker, uint64_t client);
/* Whether the requests this thread handles from now on are logged (replicated groups: only a
 * logged request re-registers a worker that sync_wait hears from). True unless set. */
void sync_set_thread_logged(bool logged);

/* Bucket of a staleness gap in the histogram (see StalenessStats in ps.proto). */
int sync_bucket(int64_t gap);

/* Notes that a worker was heard from (any request). Re-registers an evicted worker. */
void sync_heard(server_state *st, int32_t worker);
/* Every live worker counts as heard from now: a server taking a replica group over could not
 * hear its workers while the group was failing over (their silence starts when it serves). */
void sync_heard_all(server_state *st);

/* CLOCK: records the worker's clock (never lowering it). Returns the clock recorded and
 * *min_clock the slowest live worker's. May apply BSP updates and resume waiting pulls.
 * client: the caller's Envelope.client_id (a worker that left as that client stays out). */
int64_t sync_clock(server_state *st, int32_t worker, uint64_t client, int64_t clock,
                   int64_t *min_clock);

/* CLOCK with finished set: records the clock and takes the worker out of the barrier (not
 * live: no wait counts it), until a request of a client other than `client` re-registers it.
 * May apply BSP updates and resume waiting pulls. */
void sync_leave(server_state *st, int32_t worker, uint64_t client, int64_t clock);

/* What the calls of `worker` parked on this server wait for, written into buf (the blockers
 * as in a timed-out wait's message, of the oldest such call; "" if none). Returns how many of
 * its calls are parked. */
size_t sync_parked_for(server_state *st, int32_t worker, char *buf, size_t cap);

/* PULL of [offset, offset+count) of v by worker at clock: replies now, or parks the call
 * until the bound allows (the parked pull holds its own reference on v; the caller keeps and
 * releases its own). A pull of a deleted variable that would park is answered NOT_FOUND. */
void sync_pull(server_state *st, rpc_call *call, variable *v, int32_t worker, int64_t clock,
               uint64_t offset, uint64_t count);

/* A read that waits like a pull, for reads of several variables at once (Step): answer(st,
 * call, arg, min_clock, wait_ns) runs, now or once every live worker's clock is >= need (and
 * the BSP updates below it are applied), and must set the call's reply; the call is resumed
 * after it. When the wait ends otherwise (deadline: DEADLINE_EXCEEDED naming `what` and the
 * workers waited for; shutdown: UNAVAILABLE; too many parked: RESOURCE_EXHAUSTED) the error
 * reply is set here and drop(arg, timed_out) runs instead. Either way exactly one of them runs,
 * once. A caller that is not a worker never waits. */
typedef void (*sync_answer_fn)(server_state *st, rpc_call *call, void *arg, int64_t min_clock,
                               uint64_t wait_ns);
typedef void (*sync_drop_fn)(void *arg, bool timed_out);
void sync_wait(server_state *st, rpc_call *call, int32_t worker, int64_t clock, int64_t need,
               const char *what, sync_answer_fn answer, sync_drop_fn drop, void *arg);

/* Records in v's and the server's staleness statistics a read by a worker at clock, with the
 * slowest live worker at min_clock, that waited wait_ns (0: did not wait). */
void sync_record(server_state *st, variable *v, int64_t clock, int64_t min_clock, uint64_t wait_ns);

/* Records the staleness of a read that does not wait (a push-pull's reply) by a worker. */
void sync_record_read(server_state *st, variable *v, int32_t worker, int64_t clock);

/* BSP push: adds the gradient (count values of wire dtype `dtype`, may be unaligned) to elements
 * [first, first + count) of the variable's aggregate for the open clock. Returns 0, or -1 if memory
 * for the aggregate can't be had. */
int sync_aggregate(server_state *st, variable *v, int32_t worker, const void *grad, int dtype,
                   uint64_t first, uint64_t count);

/* Evicts silent workers and ends expired waits. Call periodically (every ~50 ms). */
void sync_sweep(server_state *st);

/* DeleteVariable: answers the pulls parked on v (already unlinked by store_remove) with
 * NOT_FOUND and `why`, and drops their references. */
void sync_delete(server_state *st, variable *v, const char *why);

/* Ends every wait with UNAVAILABLE (shutdown). */
void sync_cancel_all(server_state *st, const char *why);

/* Clock of the slowest live worker (INT64_MAX if none). */
int64_t sync_min_clock(server_state *st);

/* Fills the status reply's worker table, staleness stats and evictions; the arrays it sets are
 * freed with sync_status_free. */
void sync_status(server_state *st, Psd__V1__ServerStatusReply *rep);
void sync_status_free(Psd__V1__ServerStatusReply *rep);

/* Copies a variable's observed staleness into a StalenessStats (hist: STALENESS_BUCKETS). */
void sync_variable_stats(const variable *v, Psd__V1__StalenessStats *out, uint64_t *hist);

/* Checkpoints: one worker's entry of the clock table. */
typedef struct sync_worker_rec {
    int32_t id;
    int64_t clock;
    bool known, live;
    /* Finished (ClockRequest.finished) as client left_client: that client does not rejoin. */
    bool left;
    uint64_t left_client;
} sync_worker_rec;

/* Copies the known workers' entries (malloc'd array, *n of them), the clock up to which BSP
 * updates are applied and the barrier's frontier (where a worker joining with none live
 * starts). Returns NULL with *n 0 on allocation failure or when none is known. */
sync_worker_rec *sync_export(server_state *st, size_t *n, int64_t *applied_min, int64_t *frontier);

/* Replaces the clock table with a checkpoint's (ids beyond the table are ignored; workers not
 * in it become unknown), and the frontier (SYNC_NO_FRONTIER: a file without it, kept as is). A
 * restored live worker counts as heard now. Call before serving; then sync_resume applies
 * what the restored clocks allow. */
#define SYNC_NO_FRONTIER INT64_MIN
void sync_import(server_state *st, const sync_worker_rec *w, size_t n, int64_t applied_min,
                 int64_t frontier);
/* After a restore, before serving: applies what the restored clocks allow, then records every
 * variable's version as its restored_version (out of memory: they stay 0, so clients overstate
 * a loss once rather than miss it). */
void sync_resume(server_state *st);

#endif
