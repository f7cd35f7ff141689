/* The clock table of a server state (sync.h): workers' clocks and liveness, staleness waits
 * and BSP barriers, evictions of silent workers, and export/import for checkpoints. */
#include "sync.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "metrics.h"
#include "server.h"
#include "status.h"
#include "timeutil.h"

/* clock and known change under sync_state.lock; live and last_ns are atomic as well, so that
 * a request from a worker already live notes its time without the lock (sync_heard). */
typedef struct worker_entry {
    int64_t clock;
    _Atomic uint64_t last_ns;
    bool known; /* expected from the spec or heard from */
    atomic_bool live;
    /* Left the barrier (ClockRequest.finished) as client left_client: that client's later
     * requests do not re-register it; another client's (a new process) do. */
    bool left;
    uint64_t left_client;
} worker_entry;

/* A parked read: a pull of one range (v, offset, count), or a generic one (answer != NULL,
 * e.g. a Step's pulls) that its owner answers and frees through answer/drop. */
typedef struct waiter {
    rpc_call *call;
    variable *v; /* pull: referenced while parked */
    int32_t worker;
    int64_t clock, need;
    uint64_t offset, count;
    uint64_t start_ns, deadline_ns;
    sync_answer_fn answer;
    sync_drop_fn drop;
    void *arg;
    char what[160]; /* generic: what waits, for the timeout message */
    struct waiter *next;
} waiter;

struct sync_state {
    pthread_mutex_t lock;    /* workers, waiters, applied_min */
    pthread_mutex_t advance; /* one thread at a time applies BSP updates and wakes waits */
    worker_entry *workers;
    int max_workers;
    int64_t applied_min; /* waits are decided against this: BSP updates below it are applied */
    /* The slowest live worker's clock as of the last change under the lock, for readers that
     * do not take it (sync_min_clock: every push-pull and step reply). */
    atomic_int_fast64_t min_clock;
    /* The slowest live worker's clock when last there was one: where the barrier stands
     * once every worker has left or been evicted (a worker rejoining then starts there). */
    int64_t frontier;
    waiter *waiters;
    uint64_t timeout_ns;
    bool mean;
    /* A replicated group's state (sync_set_logged): liveness changes only through its log. */
    sync_evict_fn evict;
    void *evict_arg;
    atomic_uint_fast64_t evictions;
    atomic_int_fast64_t st_max;
    atomic_uint_fast64_t st_hist[STALENESS_BUCKETS];
    atomic_uint_fast64_t st_pulls, st_waits, st_wait_ms, st_timeouts;
};

_Static_assert(STALENESS_BUCKETS == sizeof(((variable *)0)->st_hist) / sizeof(uint64_t),
               "variable histogram size");

/* The barrier hook of the process (sync_set_barrier_fn). */
static _Atomic(sync_barrier_fn) barrier_fn;

void sync_set_barrier_fn(sync_barrier_fn fn)
{
    atomic_store(&barrier_fn, fn);
}

/* Metrics (metrics.h): pulls parked on the staleness bound now, and how long they waited. */
static metric *m_waiting, *m_wait_seconds, *m_staleness;

sync_state *sync_create(int n_expected, uint32_t timeout_ms, bool mean, int max_workers)
{
    m_waiting = metrics_gauge("psd_pulls_waiting",
                              "Pulls parked until the staleness bound lets them read.");
    m_wait_seconds = metrics_histogram("psd_pull_wait_seconds",
                                       "Time pulls waited for the staleness bound (every wait, "
                                       "answered or timed out).",
                                       metrics_latency_buckets, metrics_latency_buckets_len);
    static const double gaps[] = {0, 1, 2, 4, 8, 16, 32, 64};
    m_staleness = metrics_histogram("psd_pull_staleness_clocks",
                                    "Staleness workers' pulls observed: the reader's clock minus "
                                    "the slowest live worker's.",
                                    gaps, sizeof(gaps) / sizeof(gaps[0]));
    sync_state *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return NULL;
    s->workers = calloc((size_t)max_workers, sizeof(*s->workers));
    if (s->workers == NULL) {
        free(s);
        return NULL;
    }
    s->max_workers = max_workers;
    s->timeout_ns = (uint64_t)timeout_ms * 1000000u;
    s->mean = mean;
    uint64_t now = time_now_ns();
    for (int i = 0; i < n_expected && i < max_workers; i++) {
        s->workers[i].known = true;
        s->workers[i].live = true;
        s->workers[i].last_ns = now;
    }
    s->applied_min = n_expected > 0 ? 0 : INT64_MAX;
    atomic_init(&s->min_clock, n_expected > 0 ? 0 : INT64_MAX);
    pthread_mutex_init(&s->lock, NULL);
    pthread_mutex_init(&s->advance, NULL);
    return s;
}

void sync_destroy(sync_state *s)
{
    if (s == NULL)
        return;
    /* sync_cancel_all has answered (and released) every wait by now; a waiter left over is
     * freed without a release, since the store (and so its variables) may be gone already. */
    while (s->waiters) {
        waiter *w = s->waiters;
        s->waiters = w->next;
        if (w->answer)
            w->drop(w->arg, false);
        free(w);
    }
    pthread_mutex_destroy(&s->lock);
    pthread_mutex_destroy(&s->advance);
    free(s->workers);
    free(s);
}

int sync_bucket(int64_t gap)
{
    if (gap <= 0)
        return 0;
    if (gap <= 8)
        return (int)gap;
    if (gap <= 16)
        return 9;
    if (gap <= 32)
        return 10;
    if (gap <= 64)
        return 11;
    return 12;
}

static int64_t min_live_locked(const sync_state *s)
{
    int64_t m = INT64_MAX;
    for (int i = 0; i < s->max_workers; i++)
        if (s->workers[i].live && s->workers[i].clock < m)
            m = s->workers[i].clock;
    return m;
}

/* After a change of clocks or liveness, with the lock held. */
static void publish_min_locked(sync_state *s)
{
    int64_t m = min_live_locked(s);
    if (m != INT64_MAX && m > s->frontier)
        s->frontier = m;
    atomic_store(&s->min_clock, m);
}

int64_t sync_min_clock(server_state *st)
{
    return atomic_load(&st->sync->min_clock);
}

/* Registers or refreshes a worker; called with the lock held. client: the caller's
 * Envelope.client_id, or 0 when unknown (then a worker that left is not re-registered). */
static void heard_locked(sync_state *s, int32_t worker, uint64_t client, bool logged)
{
    if (worker < 0 || worker >= s->max_workers)
        return;
    worker_entry *w = &s->workers[worker];
    w->last_ns = time_now_ns();
    if (w->live)
        return;
    if (s->evict && !logged)
        return; /* a replicated group: only its logged requests re-register (sync_set_logged) */
    if (w->left && (client == 0 || client == w->left_client))
        return; /* a finished worker's last calls (its final pulls): it stays out */
    int64_t m = min_live_locked(s);
    bool rejoin = w->known;
    w->known = true;
    w->live = true;
    w->left = false;
    /* Continue from the current clock: never hold the live workers back. With none live,
     * from where the barrier stood when the last one left or was evicted. */
    if (m == INT64_MAX)
        m = s->frontier;
    if (w->clock < m)
        w->clock = m;
    if (s->applied_min == INT64_MAX || s->applied_min > w->clock)
        s->applied_min = w->clock; /* it was the only one: its bound applies again */
    publish_min_locked(s);
    log_info("worker %d %s at clock %lld", worker, rejoin ? "re-registered" : "registered",
             (long long)w->clock);
}

void sync_heard_all(server_state *st)
{
    sync_state *s = st->sync;
    pthread_mutex_lock(&s->lock);
    uint64_t now = time_now_ns();
    for (int i = 0; i < s->max_workers; i++)
        if (atomic_load(&s->workers[i].live))
            atomic_store_explicit(&s->workers[i].last_ns, now, memory_order_relaxed);
    pthread_mutex_unlock(&s->lock);
}

void sync_heard(server_state *st, int32_t worker)
{
    sync_state *s = st->sync;
    if (worker < 0 || worker >= s->max_workers)
        return;
    /* The common case, a live worker: its time, without the lock that every worker's requests
     * would otherwise queue on. */
    worker_entry *w = &s->workers[worker];
    if (atomic_load(&w->live)) {
        atomic_store_explicit(&w->last_ns, time_now_ns(), memory_order_relaxed);
        return;
    }
    pthread_mutex_lock(&st->sync->lock);
    heard_locked(st->sync, worker, 0, true);
    pthread_mutex_unlock(&st->sync->lock);
}

static void record_staleness(server_state *st, variable *v, int64_t gap, bool waited,
                             uint64_t wait_ns)
{
    sync_state *s = st->sync;
    if (gap < 0)
        gap = 0;
    int b = sync_bucket(gap);
    metric_observe(m_staleness, (double)gap);
    atomic_fetch_add(&s->st_hist[b], 1);
    atomic_fetch_add(&v->st_hist[b], 1);
    atomic_fetch_add(&s->st_pulls, 1);
    atomic_fetch_add(&v->st_pulls, 1);
    int_fast64_t cur = atomic_load(&s->st_max);
    while (gap > cur && !atomic_compare_exchange_weak(&s->st_max, &cur, gap)) {
    }
    cur = atomic_load(&v->st_max);
    while (gap > cur && !atomic_compare_exchange_weak(&v->st_max, &cur, gap)) {
    }
    if (waited) {
        uint64_t ms = wait_ns / 1000000u;
        metric_observe(m_wait_seconds, (double)wait_ns * 1e-9);
        atomic_fetch_add(&s->st_waits, 1);
        atomic_fetch_add(&v->st_waits, 1);
        atomic_fetch_add(&s->st_wait_ms, ms);
        atomic_fetch_add(&v->st_wait_ms, ms);
    }
}

static void reply_pull(rpc_call *call, variable *v, uint64_t offset, uint64_t count)
{
    Psd__V1__PullReply rep = PSD__V1__PULL_REPLY__INIT;
    rep.version = atomic_load(&v->version);
    /* The reply's dtype is the request's (RPC_RANGE: the request has a tensor). */
    int dtype = rpc_call_envelope(call)->tensor->dtype;
    uint8_t *dst = rpc_reply_ok_tensor(call, &rep.base, dtype, offset, count);
    if (dst == NULL)
        return;
    uint64_t first = offset - v->offset;
    variable_lock_range(v, first, count);
    frame_put_floats(dst, v->params + first, (size_t)count, dtype);
    variable_unlock_range(v, first, count);
}

static void describe_blockers(sync_state *s, const waiter *w, uint64_t now, char *buf, size_t cap);

static void waiter_free(waiter *w)
{
    if (w->answer == NULL)
        variable_release(w->v);
    free(w);
}

/* Applies a BSP variable's aggregate, if any, as one optimizer step. */
static void bsp_apply(server_state *st, variable *v)
{
    sync_state *s = st->sync;
    store_update_begin(st->vars); /* checkpoint consistency (store.h) */
    variable_lock_all(v);
    if (v->agg_count > 0) {
        if (s->mean && v->agg_count > 1) {
            float scale = 1.0f / (float)v->agg_count;
            for (uint64_t i = 0; i < v->count; i++)
                v->agg[i] *= scale;
        }
        float *slots[OPTIMIZER_MAX_SLOTS];
        for (size_t i = 0; i < v->nslots; i++)
            slots[i] = v->slots[i];
        size_t first_bad = 0;
        size_t bad =
            optimizer_apply_finite(&v->opt, v->params, v->agg, slots, (size_t)v->count, &first_bad);
        if (bad > 0)
            log_error("variable \"%s\": the BSP update of element %llu would leave it non-finite "
                      "(inf or NaN): %zu elements left unchanged, the others applied",
                      v->name, (unsigned long long)(v->offset + first_bad), bad);
        memset(v->agg, 0, (size_t)v->count * sizeof(float));
        memset(v->agg_workers, 0, v->agg_words * sizeof(uint64_t));
        v->agg_count = 0;
        atomic_fetch_add(&v->version, 1);
        atomic_fetch_add(&st->updates_applied, 1);
    }
    variable_unlock_all(v);
    store_update_end(st->vars);
}

int sync_aggregate(server_state *st, variable *v, int32_t worker, const void *grad, int dtype,
                   uint64_t first, uint64_t count)
{
    sync_state *s = st->sync;
    /* Made once (all stripes, briefly); then only this push's range is locked. */
    if (variable_agg_ensure(v, s->max_workers) != 0)
        return -1;
    variable_lock_range(v, first, count);
    const uint8_t *g = grad;
    float *a = v->agg + first;
    size_t esize = frame_dtype_size(dtype);
    float block[1024];
    for (uint64_t i = 0; i < count; i += 1024) {
        size_t n = count - i < 1024 ? (size_t)(count - i) : 1024;
        frame_get_floats(block, g + esize * i, n, dtype);
        for (size_t j = 0; j < n; j++)
            a[i + j] += block[j];
    }
    variable_agg_mark(v, worker, s->max_workers);
    variable_unlock_range(v, first, count);
    return 0;
}

/* When the slowest live worker's clock has moved: applies BSP aggregates (all workers are
 * past the clock they were pushed for: the variables', then the barrier hook's), then answers the
 * pulls the bound now allows. */
static void advance(server_state *st)
{
    sync_state *s = st->sync;
    pthread_mutex_lock(&s->advance);
    pthread_mutex_lock(&s->lock);
    int64_t m = min_live_locked(s);
    bool forward = m > s->applied_min;
    bool moved = m != s->applied_min;
    pthread_mutex_unlock(&s->lock);
    if (!moved) {
        pthread_mutex_unlock(&s->advance);
        return;
    }
    if (forward) {
        variable **vars;
        size_t n = store_list(st->vars, &vars);
        for (size_t i = 0; vars && i < n; i++)
            if (vars[i]->staleness == 0)
                bsp_apply(st, vars[i]);
        store_list_release(vars, n);
        sync_barrier_fn barrier = atomic_load(&barrier_fn);
        if (barrier)
            barrier(st, s->mean);
    }
    waiter *ready = NULL;
    pthread_mutex_lock(&s->lock);
    s->applied_min = m;
    for (waiter **pp = &s->waiters; *pp;) {
        waiter *w = *pp;
        if (w->need <= m) {
            *pp = w->next;
            w->next = ready;
            ready = w;
        } else {
            pp = &w->next;
        }
    }
    pthread_mutex_unlock(&s->lock);
    uint64_t now = time_now_ns();
    while (ready) {
        waiter *w = ready;
        ready = w->next;
        if (w->answer) {
            metric_observe(m_wait_seconds, (double)(now - w->start_ns) * 1e-9);
            w->answer(st, w->call, w->arg, m, now - w->start_ns);
        } else {
            record_staleness(st, w->v, m == INT64_MAX ? 0 : w->clock - m, true, now - w->start_ns);
            reply_pull(w->call, w->v, w->offset, w->count);
        }
        rpc_call_resume(w->call);
        metric_gauge_add(m_waiting, -1);
        waiter_free(w);
    }
    pthread_mutex_unlock(&s->advance);
}

int64_t sync_clock(server_state *st, int32_t worker, uint64_t client, int64_t clock,
                   int64_t *min_clock)
{
    sync_state *s = st->sync;
    if (worker < 0 || worker >= s->max_workers) {
        /* Not a worker this state tracks (callers check SERVER_MAX_WORKERS; a state may be
         * made for fewer): nothing to record, as in sync_heard and sync_pull. */
        *min_clock = sync_min_clock(st);
        return clock;
    }
    pthread_mutex_lock(&s->lock);
    heard_locked(s, worker, client, true);
    worker_entry *w = &s->workers[worker];
    if (clock > w->clock)
        w->clock = clock;
    int64_t rec = w->clock;
    publish_min_locked(s);
    pthread_mutex_unlock(&s->lock);
    advance(st);
    *min_clock = sync_min_clock(st);
    return rec;
}

void sync_leave(server_state *st, int32_t worker, uint64_t client, int64_t clock)
{
    sync_state *s = st->sync;
    if (worker < 0 || worker >= s->max_workers)
        return;
    pthread_mutex_lock(&s->lock);
    worker_entry *w = &s->workers[worker];
    bool was_live = w->live;
    w->last_ns = time_now_ns();
    w->known = true;
    if (clock > w->clock)
        w->clock = clock;
    w->live = false;
    w->left = true;
    w->left_client = client;
    publish_min_locked(s);
    int64_t rec = w->clock;
    pthread_mutex_unlock(&s->lock);
    log_info("worker %d finished at clock %lld and left the barrier%s", worker, (long long)rec,
             was_live ? ": no wait counts it any more" : " (it had been evicted)");
    advance(st); /* the slowest live worker may be another one now */
}

size_t sync_parked_for(server_state *st, int32_t worker, char *buf, size_t cap)
{
    sync_state *s = st->sync;
    if (cap > 0)
        buf[0] = '\0';
    if (worker < 0 || worker >= s->max_workers || cap == 0)
        return 0;
    size_t n = 0;
    pthread_mutex_lock(&s->lock);
    const waiter *oldest = NULL;
    for (const waiter *w = s->waiters; w; w = w->next) {
        if (w->worker != worker)
            continue;
        n++;
        if (oldest == NULL || w->start_ns < oldest->start_ns)
            oldest = w;
    }
    if (oldest != NULL)
        describe_blockers(s, oldest, time_now_ns(), buf, cap);
    pthread_mutex_unlock(&s->lock);
    return n;
}

void sync_record_read(server_state *st, variable *v, int32_t worker, int64_t clock)
{
    if (worker < 0 || worker >= st->sync->max_workers)
        return;
    int64_t m = sync_min_clock(st);
    record_staleness(st, v, m == INT64_MAX ? 0 : clock - m, false, 0);
}

void sync_record(server_state *st, variable *v, int64_t clock, int64_t min_clock, uint64_t wait_ns)
{
    record_staleness(st, v, min_clock == INT64_MAX ? 0 : clock - min_clock, wait_ns > 0, wait_ns);
}

/* Deadline of a parked read: a little before the caller gives up, so that it hears which
 * worker it waited for rather than a bare transport timeout. The margin (a quarter of the
 * budget, at most 250 ms) covers the request's way in, the sweep's 50 ms tick and the reply's
 * way back on a loaded machine (100 ms was not always enough on 2 busy cores). */
static uint64_t wait_deadline(rpc_call *call, uint64_t start_ns)
{
    uint64_t dl = rpc_call_deadline_ns(call);
    uint64_t budget = dl > start_ns ? dl - start_ns : 0;
    uint64_t margin = budget / 4 < 250000000u ? budget / 4 : 250000000u;
    return dl - margin;
}

/* Parks a call with the lock held: a waiter for `need`, linked, with its deadline; the caller
 * fills what it answers with. NULL (and the error reply set) when the call can't be parked
 * (out of memory, or max-parked calls parked already). */
static waiter *park_locked(sync_state *s, rpc_call *call, int32_t worker, int64_t clock,
                           int64_t need)
{
    waiter *w = calloc(1, sizeof(*w));
    if (w == NULL || rpc_call_defer(call) != 0) {
        free(w);
        rpc_reply_error(call, STATUS_RESOURCE_EXHAUSTED,
                        "too many pulls waiting for the staleness bound on this server");
        return NULL;
    }
    w->call = call;
    w->worker = worker;
    w->clock = clock;
    w->need = need;
    w->start_ns = time_now_ns();
    w->deadline_ns = wait_deadline(call, w->start_ns);
    w->next = s->waiters;
    s->waiters = w;
    metric_gauge_add(m_waiting, 1);
    return w;
}

static _Thread_local bool thread_unlogged; /* sync_set_thread_logged(false) */

void sync_wait(server_state *st, rpc_call *call, int32_t worker, int64_t clock, int64_t need,
               const char *what, sync_answer_fn answer, sync_drop_fn drop, void *arg)
{
    sync_state *s = st->sync;
    if (worker < 0 || worker >= s->max_workers) {
        answer(st, call, arg, sync_min_clock(st), 0); /* not a worker: never waits */
        return;
    }
    pthread_mutex_lock(&s->lock);
    heard_locked(s, worker, rpc_call_envelope(call)->client_id, !thread_unlogged);
    int64_t m = min_live_locked(s);
    if (need <= s->applied_min) {
        pthread_mutex_unlock(&s->lock);
        answer(st, call, arg, m, 0);
        return;
    }
    waiter *w = park_locked(s, call, worker, clock, need);
    if (w == NULL) {
        pthread_mutex_unlock(&s->lock);
        drop(arg, false);
        return;
    }
    w->answer = answer;
    w->drop = drop;
    w->arg = arg;
    snprintf(w->what, sizeof(w->what), "%s", what);
    pthread_mutex_unlock(&s->lock);
}

void sync_pull(server_state *st, rpc_call *call, variable *v, int32_t worker, int64_t clock,
               uint64_t offset, uint64_t count)
{
    sync_state *s = st->sync;
    if (worker < 0 || worker >= s->max_workers) {
        reply_pull(call, v, offset, count); /* not a worker: never waits, not counted */
        return;
    }
    pthread_mutex_lock(&s->lock);
    /* A pull is not an update: in a replicated group it is not logged, so it does not
     * re-register an evicted worker there (the worker's next clock or push does). */
    heard_locked(s, worker, rpc_call_envelope(call)->client_id, false);
    int64_t m = min_live_locked(s);
    int64_t need = v->staleness >= 0 ? clock - v->staleness : INT64_MIN;
    if (v->staleness < 0 || need <= s->applied_min) {
        pthread_mutex_unlock(&s->lock);
        record_staleness(st, v, m == INT64_MAX ? 0 : clock - m, false, 0);
        reply_pull(call, v, offset, count);
        return;
    }
    /* Checked under the lock that sync_delete sweeps under: a pull either parks before the
     * sweep (and is answered by it) or sees the mark here. */
    if (atomic_load(&v->deleted)) {
        pthread_mutex_unlock(&s->lock);
        rpc_reply_error(call, STATUS_NOT_FOUND, "variable \"%s\" was deleted", v->name);
        return;
    }
    waiter *w = park_locked(s, call, worker, clock, need);
    if (w == NULL) {
        pthread_mutex_unlock(&s->lock);
        return;
    }
    variable_retain(v);
    w->v = v;
    w->offset = offset;
    w->count = count;
    pthread_mutex_unlock(&s->lock);
}

/* Names the live workers behind `need`, for a timed-out wait's message. */
static void describe_blockers(sync_state *s, const waiter *w, uint64_t now, char *buf, size_t cap)
{
    size_t off = 0;
    int n = 0;
    for (int i = 0; i < s->max_workers && off < cap; i++) {
        const worker_entry *e = &s->workers[i];
        if (!e->live || e->clock >= w->need)
            continue;
        off += (size_t)snprintf(
            buf + off, cap - off, "%sworker %d (clock %lld, last heard %llu ms ago)",
            n++ ? ", " : "", i, (long long)e->clock,
            (unsigned long long)(now > e->last_ns ? (now - e->last_ns) / 1000000u : 0));
    }
    if (n == 0)
        snprintf(buf, cap, "the aggregated update of clock %lld", (long long)(w->need - 1));
}

/* Whether worker e has been silent for longer than the timeout at now (lock held). */
static bool silent_locked(const sync_state *s, const worker_entry *e, uint64_t now)
{
    return e->live && now > e->last_ns && now - e->last_ns > s->timeout_ns;
}

static void evict_locked(sync_state *s, int32_t i, uint64_t now)
{
    worker_entry *e = &s->workers[i];
    e->live = false;
    publish_min_locked(s);
    atomic_fetch_add(&s->evictions, 1);
    log_warn("worker %d evicted: nothing heard for %llu ms (clock %lld); waits on it resume", i,
             (unsigned long long)(now > e->last_ns ? (now - e->last_ns) / 1000000u : 0),
             (long long)e->clock);
}

void sync_set_logged(server_state *st, sync_evict_fn evict, void *arg)
{
    sync_state *s = st->sync;
    pthread_mutex_lock(&s->lock);
    s->evict = evict;
    s->evict_arg = arg;
    pthread_mutex_unlock(&s->lock);
}

void sync_set_thread_logged(bool logged)
{
    thread_unlogged = !logged;
}

bool sync_would_register(server_state *st, int32_t worker, uint64_t client)
{
    sync_state *s = st->sync;
    if (worker < 0 || worker >= s->max_workers)
        return false;
    pthread_mutex_lock(&s->lock);
    const worker_entry *w = &s->workers[worker];
    bool would = !w->live && !(w->left && (client == 0 || client == w->left_client));
    pthread_mutex_unlock(&s->lock);
    return would;
}

bool sync_worker_silent(server_state *st, int32_t worker)
{
    sync_state *s = st->sync;
    if (worker < 0 || worker >= s->max_workers)
        return false;
    pthread_mutex_lock(&s->lock);
    bool silent = silent_locked(s, &s->workers[worker], time_now_ns());
    pthread_mutex_unlock(&s->lock);
    return silent;
}

void sync_evict(server_state *st, int32_t worker)
{
    sync_state *s = st->sync;
    if (worker < 0 || worker >= s->max_workers)
        return;
    pthread_mutex_lock(&s->lock);
    bool live = s->workers[worker].live;
    if (live)
        evict_locked(s, worker, time_now_ns());
    pthread_mutex_unlock(&s->lock);
    if (live)
        advance(st);
}

void sync_sweep(server_state *st)
{
    sync_state *s = st->sync;
    bool evicted = false;
    waiter *expired = NULL;
    int32_t logged[16];
    int nlogged = 0;
    pthread_mutex_lock(&s->lock);
    /* Read the time under the lock: a worker heard a moment ago must not look heard in the
     * future (an unsigned difference would make it look silent for centuries). */
    uint64_t now = time_now_ns();
    for (int i = 0; i < s->max_workers; i++) {
        if (!silent_locked(s, &s->workers[i], now))
            continue;
        if (s->evict == NULL) {
            evict_locked(s, i, now);
            evicted = true;
        } else if (nlogged < (int)(sizeof(logged) / sizeof(logged[0]))) {
            logged[nlogged++] = i; /* through the group's log, below (the next sweep: more) */
        }
    }
    sync_evict_fn evict = s->evict;
    void *evict_arg = s->evict_arg;
    for (waiter **pp = &s->waiters; *pp;) {
        waiter *w = *pp;
        if (w->deadline_ns <= now) {
            *pp = w->next;
            char who[768];
            describe_blockers(s, w, now, who, sizeof(who));
            if (w->answer)
                rpc_reply_error(w->call, STATUS_DEADLINE_EXCEEDED,
                                "%s waited %llu ms and timed out waiting for %s", w->what,
                                (unsigned long long)((now - w->start_ns) / 1000000u), who);
            else
                rpc_reply_error(w->call, STATUS_DEADLINE_EXCEEDED,
                                "pull of \"%s\" at clock %lld (staleness bound %d) waited %llu "
                                "ms and timed out waiting for %s",
                                w->v->name, (long long)w->clock, (int)w->v->staleness,
                                (unsigned long long)((now - w->start_ns) / 1000000u), who);
            w->next = expired;
            expired = w;
        } else {
            pp = &w->next;
        }
    }
    pthread_mutex_unlock(&s->lock);
    while (expired) {
        waiter *w = expired;
        expired = w->next;
        atomic_fetch_add(&s->st_timeouts, 1);
        if (w->answer)
            w->drop(w->arg, true);
        else
            atomic_fetch_add(&w->v->st_timeouts, 1);
        metric_observe(m_wait_seconds, (double)(time_now_ns() - w->start_ns) * 1e-9);
        rpc_call_resume(w->call);
        metric_gauge_add(m_waiting, -1);
        waiter_free(w);
    }
    if (evicted)
        advance(st);
    for (int i = 0; i < nlogged; i++)
        evict(evict_arg, logged[i]);
}

void sync_delete(server_state *st, variable *v, const char *why)
{
    sync_state *s = st->sync;
    waiter *gone = NULL;
    pthread_mutex_lock(&s->lock);
    for (waiter **pp = &s->waiters; *pp;) {
        waiter *w = *pp;
        if (w->answer == NULL && w->v == v) {
            *pp = w->next;
            w->next = gone;
            gone = w;
        } else {
            pp = &w->next;
        }
    }
    pthread_mutex_unlock(&s->lock);
    while (gone) {
        waiter *w = gone;
        gone = w->next;
        rpc_reply_error(w->call, STATUS_NOT_FOUND, "%s", why);
        metric_observe(m_wait_seconds, (double)(time_now_ns() - w->start_ns) * 1e-9);
        rpc_call_resume(w->call);
        metric_gauge_add(m_waiting, -1);
        waiter_free(w);
    }
}

void sync_cancel_all(server_state *st, const char *why)
{
    sync_state *s = st->sync;
    pthread_mutex_lock(&s->lock);
    waiter *all = s->waiters;
    s->waiters = NULL;
    pthread_mutex_unlock(&s->lock);
    while (all) {
        waiter *w = all;
        all = w->next;
        rpc_reply_error(w->call, STATUS_UNAVAILABLE, "%s", why);
        if (w->answer)
            w->drop(w->arg, false);
        rpc_call_resume(w->call);
        metric_gauge_add(m_waiting, -1);
        waiter_free(w);
    }
}

static void fill_stats(Psd__V1__StalenessStats *out, uint64_t *hist, int64_t max,
                       const atomic_uint_fast64_t *h, uint64_t pulls, uint64_t waits,
                       uint64_t wait_ms, uint64_t timeouts)
{
    psd__v1__staleness_stats__init(out);
    for (int i = 0; i < STALENESS_BUCKETS; i++)
        hist[i] = atomic_load(&h[i]);
    out->max = max;
    out->histogram = hist;
    out->n_histogram = STALENESS_BUCKETS;
    out->pulls = pulls;
    out->waits = waits;
    out->wait_ms = wait_ms;
    out->timeouts = timeouts;
}

void sync_variable_stats(const variable *v, Psd__V1__StalenessStats *out, uint64_t *hist)
{
    fill_stats(out, hist, atomic_load(&v->st_max), v->st_hist, atomic_load(&v->st_pulls),
               atomic_load(&v->st_waits), atomic_load(&v->st_wait_ms),
               atomic_load(&v->st_timeouts));
}

void sync_status(server_state *st, Psd__V1__ServerStatusReply *rep)
{
    sync_state *s = st->sync;
    Psd__V1__StalenessStats *ss = malloc(sizeof(*ss));
    uint64_t *hist = malloc(STALENESS_BUCKETS * sizeof(uint64_t));
    if (ss && hist) {
        fill_stats(ss, hist, atomic_load(&s->st_max), s->st_hist, atomic_load(&s->st_pulls),
                   atomic_load(&s->st_waits), atomic_load(&s->st_wait_ms),
                   atomic_load(&s->st_timeouts));
        rep->staleness = ss;
    } else {
        free(ss);
        free(hist);
    }
    rep->evictions = atomic_load(&s->evictions);
    pthread_mutex_lock(&s->lock);
    uint64_t now = time_now_ns();
    int64_t m = min_live_locked(s);
    rep->min_clock = m == INT64_MAX ? -1 : m;
    size_t n = 0;
    for (int i = 0; i < s->max_workers; i++)
        n += s->workers[i].known;
    Psd__V1__WorkerStatus *ws = calloc(n ? n : 1, sizeof(*ws));
    Psd__V1__WorkerStatus **wp = calloc(n ? n : 1, sizeof(*wp));
    size_t k = 0;
    for (int i = 0; ws && wp && i < s->max_workers; i++) {
        const worker_entry *e = &s->workers[i];
        if (!e->known)
            continue;
        psd__v1__worker_status__init(&ws[k]);
        ws[k].id = i;
        ws[k].clock = e->clock;
        ws[k].live = e->live;
        ws[k].finished = e->left;
        ws[k].silent_ms = now > e->last_ns ? (now - e->last_ns) / 1000000u : 0;
        wp[k] = &ws[k];
        k++;
    }
    pthread_mutex_unlock(&s->lock);
    if (ws && wp && k > 0) {
        rep->workers = wp;
        rep->n_workers = k;
    } else {
        free(ws);
        free(wp);
    }
}

void sync_status_free(Psd__V1__ServerStatusReply *rep)
{
    if (rep->staleness) {
        free(rep->staleness->histogram);
        free(rep->staleness);
    }
    if (rep->workers) {
        free(rep->workers[0]);
        free(rep->workers);
    }
}

sync_worker_rec *sync_export(server_state *st, size_t *n, int64_t *applied_min, int64_t *frontier)
{
    sync_state *s = st->sync;
    pthread_mutex_lock(&s->lock);
    size_t k = 0;
    for (int i = 0; i < s->max_workers; i++)
        k += s->workers[i].known;
    sync_worker_rec *out = k ? malloc(k * sizeof(*out)) : NULL;
    size_t j = 0;
    for (int i = 0; out && i < s->max_workers; i++) {
        const worker_entry *e = &s->workers[i];
        if (!e->known)
            continue;
        out[j++] = (sync_worker_rec){.id = i,
                                     .clock = e->clock,
                                     .known = true,
                                     .live = e->live,
                                     .left = e->left,
                                     .left_client = e->left_client};
    }
    *applied_min = s->applied_min;
    *frontier = s->frontier;
    pthread_mutex_unlock(&s->lock);
    *n = out ? j : 0;
    return out;
}

void sync_import(server_state *st, const sync_worker_rec *w, size_t n, int64_t applied_min,
                 int64_t frontier)
{
    sync_state *s = st->sync;
    pthread_mutex_lock(&s->lock);
    uint64_t now = time_now_ns();
    memset(s->workers, 0, (size_t)s->max_workers * sizeof(*s->workers));
    for (size_t i = 0; i < n; i++) {
        if (w[i].id < 0 || w[i].id >= s->max_workers)
            continue;
        worker_entry *e = &s->workers[w[i].id];
        e->clock = w[i].clock;
        e->known = w[i].known;
        e->live = w[i].live;
        e->left = w[i].left;
        e->left_client = w[i].left_client;
        e->last_ns = now;
    }
    s->applied_min = applied_min;
    if (frontier != SYNC_NO_FRONTIER)
        s->frontier = frontier;
    publish_min_locked(s);
    pthread_mutex_unlock(&s->lock);
}

void sync_resume(server_state *st)
{
    advance(st);
    /* The version of every variable as this process begins serving, before any request and
     * before any sweep can evict a restored worker and apply a partial aggregate (a new update
     * of this process): push replies carry it (PushReply.restored_version), so that a client
     * that sees the server's instance change counts the updates acknowledged to it that the
     * restart lost. It includes the aggregates applied just above: the checkpoint held them
     * complete (taken between the last worker's clock and their apply), and the previous
     * process applied the same sums as the same versions. Kept in the variable (0 for one
     * created since), so a deleted variable's entry goes with it. */
    variable **vars;
    size_t n = store_list(st->vars, &vars);
    for (size_t i = 0; vars && i < n; i++)
        vars[i]->restored_version = atomic_load(&vars[i]->version);
    store_list_release(vars, n);
}
