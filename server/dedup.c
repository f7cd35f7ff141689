/* The exactly-once table (dedup.h): per client a window of the sequence numbers applied, in
 * shards with their LRU lists, eviction (idle, least recently heard), tombstones and floors
 * for evicted clients, and export/import for checkpoints and copies. */
#include "dedup.h"

#include <pthread.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hash.h"
#include "log.h"
#include "metrics.h"
#include "timeutil.h"

/* Shards of the table (a power of two) and hash buckets per shard. Every push takes its
 * client's shard lock, so pushes of different clients rarely meet on one lock or line. */
#define DEDUP_SHARD_BITS 6
#define DEDUP_SHARDS (1u << DEDUP_SHARD_BITS)
#define DEDUP_SHARD_BUCKETS 64u

/* Tombstones: sets of TOMB_WAYS slots; without a client bound, TOMB_SETS_UNBOUNDED sets. */
#define TOMB_WAYS 4u
#define TOMB_SETS_UNBOUNDED 16384u
/* Floors of forgotten clients: 2^FLOOR_BITS seqs, two per id. */
#define FLOOR_BITS 20
#define FLOOR_BUCKETS (1u << FLOOR_BITS)
/* Evictions and forgotten tombstones are logged at most this often. */
#define EVICT_LOG_NS (10ull * 1000000000ull)
/* First word of dedup_export_floors' array. */
#define FLOORS_FORMAT 2u /* 2: with every window's time and LRU order; 1 is read too */

typedef enum floor_kind { FLOOR_NONE, FLOOR_TOMBSTONE, FLOOR_HASH } floor_kind;

typedef struct client_window {
    uint64_t client;
    uint64_t highest;    /* highest seq marked; bit 0 of the window is `highest` */
    uint64_t *bits;      /* bit i set: seq (highest - i) applied */
    uint64_t last_ms;    /* when last heard from: the op time (time_op_ms) of its update */
    uint64_t tick;       /* when last heard from, in the table's count of hearings */
    uint64_t tomb_floor; /* evicted once: seqs up to this may have been applied */
    int floor_kind;      /* where tomb_floor came from (floor_kind) */
    struct client_window *next;
    struct client_window *lru_prev, *lru_next; /* most recently heard first, in its shard */
} client_window;

typedef struct tombstone {
    uint64_t client;
    uint64_t highest; /* 0: empty slot */
} tombstone;

/* Where the counts of dedup_begin's refusals go, by dedup_result. */
enum { REFUSE_WINDOW, REFUSE_EVICTED, REFUSE_UNPROVEN, REFUSE_MEMORY, REFUSE_KINDS };
_Static_assert(DEDUP_NO_MEMORY - DEDUP_TOO_OLD == REFUSE_MEMORY, "REFUSE_* follow dedup_result");

/* The clients whose hash selects this shard. lock guards the buckets, the LRU list and every
 * window's fields; a window is added or removed only with the table's admit lock held too. */
typedef struct shard {
    alignas(64) pthread_mutex_t lock;
    client_window *buckets[DEDUP_SHARD_BUCKETS];
    client_window *lru_head, *lru_tail;
} shard;

struct dedup {
    shard shards[DEDUP_SHARDS];
    /* Membership: held to add or evict a client (so max_clients holds across shards), to set
     * the limits and to export. Guards nclients, the counts, the limits, the tombstones and
     * the floors.
     * Order: admit, then shards in ascending index; a shard's lock alone never waits for admit
     * (dedup_begin drops it first). */
    pthread_mutex_t admit;
    uint32_t words;
    uint64_t nclients;
    uint64_t max_clients, idle_ms;
    atomic_uint_fast64_t ticks; /* hearings: orders the least recently heard across shards */
    uint64_t evicted_full, evicted_idle;
    tombstone *tombs; /* ntsets sets of TOMB_WAYS slots */
    size_t ntsets;
    uint64_t ntombs;    /* slots in use */
    uint64_t *floors;   /* FLOOR_BUCKETS, NULL until the first fold */
    uint64_t floor_all; /* folded when floors could not be had: the floor of every id */
    uint64_t forgotten;
    /* Since the last log line: */
    uint64_t log_ns, log_full, log_idle, log_forgotten;
    metric *m_evict_full, *m_evict_idle, *m_forgotten, *m_refused[REFUSE_KINDS];
};

/* Client ids are hashed with mix64 (hash.h): client ids of tests and tools are small
 * integers, and the shard (top bits) and the bucket (low bits) must not follow each other. */

static shard *shard_of(dedup *d, uint64_t h)
{
    return &d->shards[h >> (64 - DEDUP_SHARD_BITS)];
}

static client_window **bucket_of(shard *sh, uint64_t h)
{
    return &sh->buckets[h % DEDUP_SHARD_BUCKETS];
}

static void lru_unlink(shard *sh, client_window *w)
{
    if (w->lru_prev)
        w->lru_prev->lru_next = w->lru_next;
    else
        sh->lru_head = w->lru_next;
    if (w->lru_next)
        w->lru_next->lru_prev = w->lru_prev;
    else
        sh->lru_tail = w->lru_prev;
    w->lru_prev = w->lru_next = NULL;
}

static void lru_push_front(shard *sh, client_window *w)
{
    w->lru_prev = NULL;
    w->lru_next = sh->lru_head;
    if (sh->lru_head)
        sh->lru_head->lru_prev = w;
    sh->lru_head = w;
    if (sh->lru_tail == NULL)
        sh->lru_tail = w;
}

/* The two floors of an id (independent of its shard, bucket and tombstone set). */
static void floor_pos(uint64_t client, uint32_t *a, uint32_t *b)
{
    uint64_t h = mix64(client ^ 0x6a09e667f3bcc909ull);
    *a = (uint32_t)(h & (FLOOR_BUCKETS - 1));
    *b = (uint32_t)((h >> 32) & (FLOOR_BUCKETS - 1));
}

/* The floor of an id that has neither a window nor a tombstone: no forgotten client of this
 * id can have had a seq above it applied. With admit held. */
static uint64_t floor_of(const dedup *d, uint64_t client)
{
    uint64_t f = 0;
    if (d->floors) {
        uint32_t a, b;
        floor_pos(client, &a, &b);
        f = d->floors[a] < d->floors[b] ? d->floors[a] : d->floors[b];
    }
    return f > d->floor_all ? f : d->floor_all;
}

/* Forgets a tombstone, keeping its proof in the floors; with admit held. */
static void fold(dedup *d, uint64_t client, uint64_t highest)
{
    if (d->floors == NULL)
        d->floors = calloc(FLOOR_BUCKETS, sizeof(uint64_t));
    if (d->floors) {
        uint32_t a, b;
        floor_pos(client, &a, &b);
        if (d->floors[a] < highest)
            d->floors[a] = highest;
        if (d->floors[b] < highest)
            d->floors[b] = highest;
    } else if (d->floor_all < highest) {
        d->floor_all = highest; /* no memory: every unknown id inherits it (safe, coarse) */
    }
    d->forgotten++;
    d->log_forgotten++;
    metric_inc(d->m_forgotten);
}

static tombstone *tomb_set(const dedup *d, uint64_t client)
{
    return &d->tombs[(mix64(client) >> 8) % d->ntsets * TOMB_WAYS];
}

/* Records that client's seqs up to highest may have been applied; with admit held. A full
 * set keeps the highest four of the five seqs and folds the lowest into the floors (a client
 * that pushed much is the one a flood of new ids must not cost its next pushes). */
static void tomb_put(dedup *d, uint64_t client, uint64_t highest)
{
    if (highest == 0)
        return;
    if (d->tombs == NULL) {
        fold(d, client, highest);
        return;
    }
    tombstone *set = tomb_set(d, client);
    tombstone *empty = NULL, *low = NULL;
    for (uint32_t i = 0; i < TOMB_WAYS; i++) {
        tombstone *t = &set[i];
        if (t->highest == 0) {
            if (empty == NULL)
                empty = t;
        } else if (t->client == client) {
            if (t->highest < highest)
                t->highest = highest;
            return;
        } else if (low == NULL || t->highest < low->highest) {
            low = t;
        }
    }
    if (empty) {
        *empty = (tombstone){client, highest};
        d->ntombs++;
    } else if (low->highest < highest) {
        fold(d, low->client, low->highest);
        *low = (tombstone){client, highest};
    } else {
        fold(d, client, highest);
    }
}

/* Removes and returns client's tombstone (0: none); with admit held. */
static uint64_t tomb_take(dedup *d, uint64_t client)
{
    if (d->tombs == NULL)
        return 0;
    tombstone *set = tomb_set(d, client);
    for (uint32_t i = 0; i < TOMB_WAYS; i++) {
        if (set[i].highest && set[i].client == client) {
            uint64_t h = set[i].highest;
            set[i] = (tombstone){0, 0};
            d->ntombs--;
            return h;
        }
    }
    return 0;
}

/* With sh's lock held. */
static client_window *lookup(shard *sh, uint64_t client, uint64_t h)
{
    for (client_window *w = *bucket_of(sh, h); w; w = w->next)
        if (w->client == client)
            return w;
    return NULL;
}

/* Marks w heard now, with its shard's lock held: at the op time of the update (time_op_ms: in
 * a replicated group the time its primary logged it, the same on every copy) and the table's
 * next tick (a group applies its updates one at a time, in log order, so every copy counts its
 * hearings alike): copies evict the same clients, idle or least recently heard. */
static void heard(dedup *d, client_window *w)
{
    w->last_ms = time_op_ms();
    w->tick = atomic_fetch_add(&d->ticks, 1) + 1;
}

static void touch(dedup *d, shard *sh, client_window *w)
{
    heard(d, w);
    lru_unlink(sh, w);
    lru_push_front(sh, w);
}

/* Removes w from the table, leaving its tombstone; with admit and sh's lock held. */
static void evict(dedup *d, shard *sh, client_window *w, bool idle)
{
    client_window **p = bucket_of(sh, mix64(w->client));
    while (*p != w)
        p = &(*p)->next;
    *p = w->next;
    lru_unlink(sh, w);
    tomb_put(d, w->client, w->highest);
    free(w->bits);
    free(w);
    d->nclients--;
    if (idle) {
        d->evicted_idle++;
        d->log_idle++;
        metric_inc(d->m_evict_idle);
    } else {
        d->evicted_full++;
        d->log_full++;
        metric_inc(d->m_evict_full);
    }
}

/* One warning per EVICT_LOG_NS at most, with what happened since the last; with admit held. */
static void log_evictions(dedup *d, uint64_t now)
{
    if (d->log_full + d->log_idle + d->log_forgotten == 0 || now - d->log_ns < EVICT_LOG_NS)
        return;
    log_warn("dedup table: %llu clients evicted for room (dedup-max-clients %llu, least recently "
             "heard first) and %llu for idleness (dedup-idle-ms) since the last report; %llu "
             "tombstones held, %llu forgotten into hashed floors (%llu in this period); their "
             "resent pushes are refused with ABORTED, never applied twice",
             (unsigned long long)d->log_full, (unsigned long long)d->max_clients,
             (unsigned long long)d->log_idle, (unsigned long long)d->ntombs,
             (unsigned long long)d->forgotten, (unsigned long long)d->log_forgotten);
    d->log_ns = now;
    d->log_full = d->log_idle = d->log_forgotten = 0;
}

static void lock_all(dedup *d)
{
    for (uint32_t i = 0; i < DEDUP_SHARDS; i++)
        pthread_mutex_lock(&d->shards[i].lock);
}

static void unlock_all(dedup *d)
{
    for (uint32_t i = DEDUP_SHARDS; i-- > 0;)
        pthread_mutex_unlock(&d->shards[i].lock);
}

/* Makes room for one more client, with admit held: evicts the idle, then the least recently
 * heard of the whole table while it holds max_clients. Takes every shard (ascending), since
 * the oldest client may be in any; only adding a client, which is rare, pays for it. */
static void make_room(dedup *d)
{
    if (d->idle_ms == 0 && (d->max_clients == 0 || d->nclients < d->max_clients))
        return;
    lock_all(d);
    uint64_t now = time_op_ms();
    if (d->idle_ms) {
        for (uint32_t i = 0; i < DEDUP_SHARDS; i++) {
            shard *sh = &d->shards[i];
            while (sh->lru_tail && now > sh->lru_tail->last_ms &&
                   now - sh->lru_tail->last_ms > d->idle_ms)
                evict(d, sh, sh->lru_tail, true);
        }
    }
    while (d->max_clients && d->nclients >= d->max_clients) {
        shard *oldest = NULL;
        for (uint32_t i = 0; i < DEDUP_SHARDS; i++) {
            shard *sh = &d->shards[i];
            if (sh->lru_tail && (oldest == NULL || sh->lru_tail->tick < oldest->lru_tail->tick))
                oldest = sh;
        }
        if (oldest == NULL)
            break;
        evict(d, oldest, oldest->lru_tail, false);
    }
    unlock_all(d);
    log_evictions(d, time_now_ns());
}

/* Adds client to sh, with admit and sh's lock held. NULL when memory can't be had. */
static client_window *create(dedup *d, shard *sh, uint64_t client, uint64_t h)
{
    client_window *w = calloc(1, sizeof(*w));
    if (w == NULL)
        return NULL;
    w->bits = calloc(d->words, sizeof(uint64_t));
    if (w->bits == NULL) {
        free(w);
        return NULL;
    }
    w->client = client;
    heard(d, w);
    /* Evicted before: everything up to its highest counts as possibly applied. Else it may
     * still be a forgotten one: its hash's floor stands for its highest. */
    uint64_t f = tomb_take(d, client);
    w->floor_kind = f ? FLOOR_TOMBSTONE : FLOOR_NONE;
    if (f == 0) {
        f = floor_of(d, client);
        w->floor_kind = f ? FLOOR_HASH : FLOOR_NONE;
    }
    w->highest = f;
    w->tomb_floor = f;
    client_window **b = bucket_of(sh, h);
    w->next = *b;
    *b = w;
    lru_push_front(sh, w);
    d->nclients++;
    return w;
}

/* The window of client, made if new, marked heard now. Returns with the client's shard
 * (*out) locked, also when the window is NULL (memory could not be had). The hot path, a
 * known client, takes only the shard's lock; a new one is added under admit. */
static client_window *acquire(dedup *d, uint64_t client, shard **out)
{
    uint64_t h = mix64(client);
    shard *sh = shard_of(d, h);
    *out = sh;
    pthread_mutex_lock(&sh->lock);
    client_window *w = lookup(sh, client, h);
    if (w) {
        touch(d, sh, w);
        return w;
    }
    pthread_mutex_unlock(&sh->lock);
    pthread_mutex_lock(&d->admit);
    /* Added meanwhile by another request of the same client? Clients are added only under
     * admit, so once it is held the answer stays until it is released. */
    pthread_mutex_lock(&sh->lock);
    w = lookup(sh, client, h);
    if (w) {
        touch(d, sh, w);
        pthread_mutex_unlock(&d->admit);
        return w;
    }
    pthread_mutex_unlock(&sh->lock);
    make_room(d);
    pthread_mutex_lock(&sh->lock);
    w = create(d, sh, client, h);
    pthread_mutex_unlock(&d->admit);
    return w;
}

int dedup_set_limits(dedup *d, uint64_t max_clients, uint64_t idle_ms)
{
    if (max_clients > SIZE_MAX / TOMB_WAYS / sizeof(tombstone))
        return -1;
    size_t nsets = max_clients ? (size_t)max_clients : TOMB_SETS_UNBOUNDED;
    tombstone *tombs = calloc(nsets * TOMB_WAYS, sizeof(*tombs));
    if (tombs == NULL)
        return -1;
    pthread_mutex_lock(&d->admit);
    /* The tombstones move into the new table (a smaller one folds what does not fit). */
    tombstone *old = d->tombs;
    size_t nold = d->ntsets * TOMB_WAYS;
    d->tombs = tombs;
    d->ntsets = nsets;
    d->ntombs = 0;
    for (size_t i = 0; old && i < nold; i++)
        tomb_put(d, old[i].client, old[i].highest);
    free(old);
    d->max_clients = max_clients;
    d->idle_ms = idle_ms;
    pthread_mutex_unlock(&d->admit);
    return 0;
}

uint64_t dedup_evicted(dedup *d)
{
    pthread_mutex_lock(&d->admit);
    uint64_t n = d->evicted_full + d->evicted_idle;
    pthread_mutex_unlock(&d->admit);
    return n;
}

uint64_t dedup_tombstones(dedup *d)
{
    pthread_mutex_lock(&d->admit);
    uint64_t n = d->ntombs;
    pthread_mutex_unlock(&d->admit);
    return n;
}

uint64_t dedup_forgotten(dedup *d)
{
    pthread_mutex_lock(&d->admit);
    uint64_t n = d->forgotten;
    pthread_mutex_unlock(&d->admit);
    return n;
}

dedup *dedup_create(uint32_t window)
{
    dedup *d = aligned_alloc(alignof(dedup), sizeof(dedup));
    if (d == NULL)
        return NULL;
    memset(d, 0, sizeof(*d));
    d->words = (window + 63) / 64;
    if (d->words == 0)
        d->words = 1;
    for (uint32_t i = 0; i < DEDUP_SHARDS; i++)
        pthread_mutex_init(&d->shards[i].lock, NULL);
    pthread_mutex_init(&d->admit, NULL);
    /* Without dedup_set_limits nothing is evicted; the tombstone table is made there. */
    metric_family *ev =
        metrics_family(METRIC_COUNTER, "psd_dedup_evictions_total",
                       "Clients evicted from the exactly-once table: reason=capacity "
                       "(dedup-max-clients) or idle (dedup-idle-ms).",
                       "reason", NULL, 0);
    d->m_evict_full = metrics_series1(ev, "capacity");
    d->m_evict_idle = metrics_series1(ev, "idle");
    d->m_forgotten = metrics_counter("psd_dedup_tombstones_forgotten_total",
                                     "Tombstones of evicted clients folded into the hashed "
                                     "floors (their ids can no longer be told from new ones).");
    metric_family *rf = metrics_family(
        METRIC_COUNTER, "psd_dedup_refused_total",
        "Pushes refused with ABORTED because they could not be proven new: reason=window, "
        "evicted, unproven or memory.",
        "reason", NULL, 0);
    static const char *const why[REFUSE_KINDS] = {"window", "evicted", "unproven", "memory"};
    for (int i = 0; i < REFUSE_KINDS; i++)
        d->m_refused[i] = metrics_series1(rf, why[i]);
    return d;
}

void dedup_destroy(dedup *d)
{
    if (d == NULL)
        return;
    for (uint32_t i = 0; i < DEDUP_SHARDS; i++) {
        shard *sh = &d->shards[i];
        for (uint32_t b = 0; b < DEDUP_SHARD_BUCKETS; b++) {
            client_window *w = sh->buckets[b];
            while (w) {
                client_window *n = w->next;
                free(w->bits);
                free(w);
                w = n;
            }
        }
        pthread_mutex_destroy(&sh->lock);
    }
    free(d->tombs);
    free(d->floors);
    pthread_mutex_destroy(&d->admit);
    free(d);
}

/* Shifts the window so that bit 0 stands for seq `to` (> highest). */
static void advance(client_window *w, uint32_t words, uint64_t to)
{
    uint64_t shift = to - w->highest;
    uint64_t nbits = (uint64_t)words * 64;
    if (w->highest == 0 || shift >= nbits) {
        memset(w->bits, 0, words * sizeof(uint64_t));
    } else {
        uint64_t ws = shift / 64, bs = shift % 64;
        for (int64_t i = (int64_t)words - 1; i >= 0; i--) {
            uint64_t v = 0;
            if ((uint64_t)i >= ws) {
                uint64_t src = (uint64_t)i - ws;
                v = w->bits[src] << bs;
                if (bs && src > 0)
                    v |= w->bits[src - 1] >> (64 - bs);
            }
            w->bits[i] = v;
        }
    }
    w->highest = to;
}

dedup_result dedup_begin_floor(dedup *d, uint64_t client, uint64_t seq, uint64_t *floor)
{
    if (seq == 0)
        return DEDUP_NEW;
    dedup_result res;
    shard *sh;
    client_window *w = acquire(d, client, &sh);
    if (w == NULL) {
        res = DEDUP_NO_MEMORY;
    } else if (seq <= w->tomb_floor) {
        res = w->floor_kind == FLOOR_HASH ? DEDUP_UNPROVEN : DEDUP_EVICTED;
        if (floor)
            *floor = w->tomb_floor;
    } else if (seq > w->highest) {
        advance(w, d->words, seq);
        w->bits[0] |= 1;
        res = DEDUP_NEW;
    } else {
        uint64_t age = w->highest - seq;
        if (age >= (uint64_t)d->words * 64) {
            res = DEDUP_TOO_OLD;
        } else if (w->bits[age / 64] & (1ull << (age % 64))) {
            res = DEDUP_DUPLICATE;
        } else {
            w->bits[age / 64] |= 1ull << (age % 64);
            res = DEDUP_NEW;
        }
    }
    pthread_mutex_unlock(&sh->lock);
    if (res >= DEDUP_TOO_OLD) /* refusals: in the order of REFUSE_* */
        metric_inc(d->m_refused[res - DEDUP_TOO_OLD]);
    return res;
}

dedup_result dedup_peek(dedup *d, uint64_t client, uint64_t seq)
{
    if (seq == 0)
        return DEDUP_NEW;
    dedup_result res;
    shard *sh;
    client_window *w = acquire(d, client, &sh);
    if (w == NULL)
        return DEDUP_NO_MEMORY;
    if (seq <= w->tomb_floor)
        res = w->floor_kind == FLOOR_HASH ? DEDUP_UNPROVEN : DEDUP_EVICTED;
    else if (seq > w->highest)
        res = DEDUP_NEW;
    else if (w->highest - seq >= (uint64_t)d->words * 64)
        res = DEDUP_TOO_OLD;
    else
        res = w->bits[(w->highest - seq) / 64] & (1ull << ((w->highest - seq) % 64))
                  ? DEDUP_DUPLICATE
                  : DEDUP_NEW;
    pthread_mutex_unlock(&sh->lock);
    return res;
}

dedup_result dedup_begin(dedup *d, uint64_t client, uint64_t seq)
{
    return dedup_begin_floor(d, client, seq, NULL);
}

void dedup_unmark(dedup *d, uint64_t client, uint64_t seq)
{
    if (seq == 0)
        return;
    uint64_t h = mix64(client);
    shard *sh = shard_of(d, h);
    pthread_mutex_lock(&sh->lock);
    client_window *w = lookup(sh, client, h);
    if (w && seq <= w->highest) {
        uint64_t age = w->highest - seq;
        if (age < (uint64_t)d->words * 64)
            w->bits[age / 64] &= ~(1ull << (age % 64));
    }
    pthread_mutex_unlock(&sh->lock);
}

uint64_t dedup_clients(dedup *d)
{
    pthread_mutex_lock(&d->admit);
    uint64_t n = d->nclients;
    pthread_mutex_unlock(&d->admit);
    return n;
}

uint64_t *dedup_export(dedup *d, uint64_t *nclients, uint32_t *words)
{
    pthread_mutex_lock(&d->admit);
    lock_all(d);
    size_t per = 2 + (size_t)d->words;
    uint64_t *out = malloc((d->nclients ? (size_t)d->nclients : 1) * per * sizeof(uint64_t));
    uint64_t k = 0;
    for (uint32_t i = 0; out && i < DEDUP_SHARDS; i++) {
        shard *sh = &d->shards[i];
        for (uint32_t b = 0; b < DEDUP_SHARD_BUCKETS; b++) {
            for (client_window *w = sh->buckets[b]; w; w = w->next) {
                uint64_t *e = out + k * per;
                e[0] = w->client;
                e[1] = w->highest;
                memcpy(e + 2, w->bits, d->words * sizeof(uint64_t));
                k++;
            }
        }
    }
    *words = d->words;
    unlock_all(d);
    pthread_mutex_unlock(&d->admit);
    *nclients = k;
    return out;
}

int dedup_import(dedup *d, uint64_t client, uint64_t highest, const uint64_t *bits, uint32_t words)
{
    shard *sh;
    client_window *w = acquire(d, client, &sh);
    if (w != NULL) {
        uint32_t n = words < d->words ? words : d->words;
        memset(w->bits, 0, d->words * sizeof(uint64_t));
        memcpy(w->bits, bits, n * sizeof(uint64_t));
        w->highest = highest;
    }
    pthread_mutex_unlock(&sh->lock);
    return w ? 0 : -1;
}

int dedup_merge(dedup *d, uint64_t client, uint64_t highest, const uint64_t *bits, uint32_t words)
{
    shard *sh;
    client_window *w = acquire(d, client, &sh);
    if (w != NULL && highest != 0) {
        if (highest > w->highest)
            advance(w, d->words, highest);
        /* Bit i of the import is seq highest - i: bit (w->highest - highest) + i of w. */
        uint64_t off = w->highest - highest, nbits = (uint64_t)d->words * 64;
        uint64_t in = (uint64_t)words * 64;
        for (uint64_t i = 0; i < in && off + i < nbits; i++)
            if ((bits[i / 64] >> (i % 64)) & 1) {
                uint64_t j = off + i;
                w->bits[j / 64] |= UINT64_C(1) << (j % 64);
            }
    }
    pthread_mutex_unlock(&sh->lock);
    return w ? 0 : -1;
}

/* dedup_export_floors' array, in words: FLOORS_FORMAT, floor_all; n, then n windows' (client,
 * floor, floor_kind); n, then n tombstones' (client, highest); n, then n nonzero floors'
 * (index, seq); (format 2) the table's ticks; n, then every window's (client, time last heard
 * in ms, tick), shard by shard from the least recently heard, so that an import evicts as the
 * exporter would. */
uint64_t *dedup_export_floors(dedup *d, size_t *nwords)
{
    pthread_mutex_lock(&d->admit);
    lock_all(d);
    uint64_t nwin = 0, nfl = 0;
    for (uint32_t i = 0; i < DEDUP_SHARDS; i++)
        for (uint32_t b = 0; b < DEDUP_SHARD_BUCKETS; b++)
            for (client_window *w = d->shards[i].buckets[b]; w; w = w->next)
                nwin += w->tomb_floor != 0;
    for (uint32_t i = 0; d->floors && i < FLOOR_BUCKETS; i++)
        nfl += d->floors[i] != 0;
    size_t n =
        7 + 3 * (size_t)nwin + 2 * (size_t)d->ntombs + 2 * (size_t)nfl + 3 * (size_t)d->nclients;
    uint64_t *out = malloc(n * sizeof(uint64_t));
    if (out) {
        size_t k = 0;
        out[k++] = FLOORS_FORMAT;
        out[k++] = d->floor_all;
        out[k++] = nwin;
        for (uint32_t i = 0; i < DEDUP_SHARDS; i++) {
            for (uint32_t b = 0; b < DEDUP_SHARD_BUCKETS; b++) {
                for (client_window *w = d->shards[i].buckets[b]; w; w = w->next) {
                    if (w->tomb_floor) {
                        out[k++] = w->client;
                        out[k++] = w->tomb_floor;
                        out[k++] = (uint64_t)w->floor_kind;
                    }
                }
            }
        }
        out[k++] = d->ntombs;
        for (size_t i = 0; d->tombs && i < d->ntsets * TOMB_WAYS; i++) {
            if (d->tombs[i].highest) {
                out[k++] = d->tombs[i].client;
                out[k++] = d->tombs[i].highest;
            }
        }
        out[k++] = nfl;
        for (uint32_t i = 0; d->floors && i < FLOOR_BUCKETS; i++) {
            if (d->floors[i]) {
                out[k++] = i;
                out[k++] = d->floors[i];
            }
        }
        out[k++] = atomic_load(&d->ticks);
        out[k++] = d->nclients;
        for (uint32_t i = 0; i < DEDUP_SHARDS; i++) {
            for (client_window *w = d->shards[i].lru_tail; w; w = w->lru_prev) {
                out[k++] = w->client;
                out[k++] = w->last_ms;
                out[k++] = w->tick;
            }
        }
        *nwords = k;
    } else {
        *nwords = 0;
    }
    unlock_all(d);
    pthread_mutex_unlock(&d->admit);
    return out;
}

/* Raises client's floor to f (of kind), in its window if it has one, else in its tombstone;
 * with admit held. */
static void import_floor(dedup *d, uint64_t client, uint64_t f, int kind)
{
    uint64_t h = mix64(client);
    shard *sh = shard_of(d, h);
    pthread_mutex_lock(&sh->lock);
    client_window *w = lookup(sh, client, h);
    if (w) {
        if (w->tomb_floor < f) {
            w->tomb_floor = f;
            w->floor_kind = kind;
        }
        if (w->highest < f)
            advance(w, d->words, f);
    }
    pthread_mutex_unlock(&sh->lock);
    if (w == NULL) /* evicted while importing (a lower dedup-max-clients) */
        tomb_put(d, client, f);
}

int dedup_import_floors(dedup *d, const uint64_t *w, size_t nwords)
{
    size_t k = 0;
    /* Each count is checked against the words left before its entries are read. */
    if (nwords < 3 || w[0] < 1 || w[0] > FLOORS_FORMAT)
        return -1;
    pthread_mutex_lock(&d->admit);
    int rc = -1;
    if (d->floor_all < w[1])
        d->floor_all = w[1];
    k = 2;
    uint64_t n = w[k++];
    if (n > (nwords - k) / 3)
        goto out;
    for (uint64_t i = 0; i < n; i++, k += 3) {
        if (w[k + 2] != FLOOR_TOMBSTONE && w[k + 2] != FLOOR_HASH)
            goto out;
        import_floor(d, w[k], w[k + 1], (int)w[k + 2]);
    }
    if (k >= nwords)
        goto out;
    n = w[k++];
    if (n > (nwords - k) / 2)
        goto out;
    for (uint64_t i = 0; i < n; i++, k += 2)
        tomb_put(d, w[k], w[k + 1]);
    if (k >= nwords)
        goto out;
    n = w[k++];
    if (n > (nwords - k) / 2 ||
        (n && d->floors == NULL && (d->floors = calloc(FLOOR_BUCKETS, sizeof(uint64_t))) == NULL)) {
        rc = n > (nwords - k) / 2 ? -1 : -2;
        goto out;
    }
    for (uint64_t i = 0; i < n; i++, k += 2) {
        if (w[k] >= FLOOR_BUCKETS)
            goto out;
        if (d->floors[w[k]] < w[k + 1])
            d->floors[w[k]] = w[k + 1];
    }
    if (w[0] >= 2) {
        /* The windows' times, each shard's from the least recently heard: pushed to the front
         * in that order, they leave every shard's LRU order as it was. */
        if (k + 1 >= nwords)
            goto out;
        atomic_store(&d->ticks, w[k++]);
        n = w[k++];
        if (n > (nwords - k) / 3)
            goto out;
        for (uint64_t i = 0; i < n; i++, k += 3) {
            uint64_t h = mix64(w[k]);
            shard *sh = shard_of(d, h);
            pthread_mutex_lock(&sh->lock);
            client_window *cw = lookup(sh, w[k], h);
            if (cw) {
                cw->last_ms = w[k + 1];
                cw->tick = w[k + 2];
                lru_unlink(sh, cw);
                lru_push_front(sh, cw);
            }
            pthread_mutex_unlock(&sh->lock);
        }
    }
    rc = k == nwords ? 0 : -1;
out:
    pthread_mutex_unlock(&d->admit);
    return rc;
}

/* ---- refusals ---- */

void dedup_refusal(dedup_result d, uint64_t client_id, uint64_t seq_no, uint64_t floor, char *err,
                   size_t errlen)
{
    unsigned long long seq = (unsigned long long)seq_no, client = (unsigned long long)client_id;
    if (d == DEDUP_EVICTED)
        snprintf(err, errlen,
                 "push seq %llu of client %016llx: the client was evicted from the dedup table "
                 "(dedup-max-clients, dedup-idle-ms) when its highest seq was %llu, so this one "
                 "may already have been applied: refused, not applied again (seqs above %llu "
                 "are accepted)",
                 seq, client, (unsigned long long)floor, (unsigned long long)floor);
    else if (d == DEDUP_UNPROVEN)
        snprintf(err, errlen,
                 "push seq %llu of client %016llx: the dedup table does not know this client "
                 "and cannot prove it is not one it evicted and forgot (dedup-max-clients "
                 "exceeded beyond the tombstones; floor %llu for this id), so this push may "
                 "already have been applied: refused, not applied (seqs above %llu are "
                 "accepted)",
                 seq, client, (unsigned long long)floor, (unsigned long long)floor);
    else if (d == DEDUP_NO_MEMORY)
        snprintf(err, errlen,
                 "push seq %llu of client %016llx: no memory for the client's dedup window, so "
                 "the push cannot be proven new: refused, it may or may not have been applied",
                 seq, client);
    else
        snprintf(err, errlen,
                 "push seq %llu of client %016llx is older than the dedup window "
                 "(dedup-window): refused, it may or may not have been applied",
                 seq, client);
}
