#include "dedup.h"

#include <pthread.h>
#include <stdalign.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "timeutil.h"

/* Shards of the table (a power of two) and hash buckets per shard. Every push takes its
 * client's shard lock, so pushes of different clients rarely meet on one lock or line. */
#define DEDUP_SHARD_BITS 6
#define DEDUP_SHARDS (1u << DEDUP_SHARD_BITS)
#define DEDUP_SHARD_BUCKETS 64u

typedef struct client_window {
    uint64_t client;
    uint64_t highest;    /* highest seq marked; bit 0 of the window is `highest` */
    uint64_t *bits;      /* bit i set: seq (highest - i) applied */
    uint64_t last_ns;    /* when last heard from */
    uint64_t tomb_floor; /* evicted once: seqs up to this may have been applied */
    struct client_window *next;
    struct client_window *lru_prev, *lru_next; /* most recently heard first, in its shard */
} client_window;

typedef struct tombstone {
    uint64_t client;
    uint64_t highest; /* 0: empty slot */
} tombstone;

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
     * the limits and to export. Guards nclients, evicted, the limits and the tombstones.
     * Order: admit, then shards in ascending index; a shard's lock alone never waits for admit
     * (dedup_begin drops it first). */
    pthread_mutex_t admit;
    uint32_t words;
    uint64_t nclients;
    uint64_t max_clients, idle_ns, evicted;
    tombstone *tombs;
    size_t ntombs;
};

/* splitmix64's finaliser: client ids of tests and tools are small integers, and the shard
 * (top bits) and the bucket (low bits) must not follow each other. */
static uint64_t mix(uint64_t x)
{
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

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

static tombstone *tomb_slot(dedup *d, uint64_t client)
{
    return d->tombs ? &d->tombs[((client * 0xbf58476d1ce4e5b9ull) >> 17) % d->ntombs] : NULL;
}

/* With sh's lock held. */
static client_window *lookup(shard *sh, uint64_t client, uint64_t h)
{
    for (client_window *w = *bucket_of(sh, h); w; w = w->next)
        if (w->client == client)
            return w;
    return NULL;
}

/* Marks w heard now; with its shard's lock held, so last_ns follows each shard's LRU order
 * (and, the clock being monotonic, compares across shards). */
static void touch(shard *sh, client_window *w)
{
    w->last_ns = time_now_ns();
    lru_unlink(sh, w);
    lru_push_front(sh, w);
}

/* Removes w from the table, leaving its tombstone; with admit and sh's lock held. */
static void evict(dedup *d, shard *sh, client_window *w)
{
    client_window **p = bucket_of(sh, mix(w->client));
    while (*p != w)
        p = &(*p)->next;
    *p = w->next;
    lru_unlink(sh, w);
    tombstone *t = tomb_slot(d, w->client);
    if (t && w->highest) {
        t->client = w->client;
        t->highest = w->highest;
    }
    free(w->bits);
    free(w);
    d->nclients--;
    d->evicted++;
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
    if (d->idle_ns == 0 && (d->max_clients == 0 || d->nclients < d->max_clients))
        return;
    lock_all(d);
    uint64_t now = time_now_ns();
    if (d->idle_ns) {
        for (uint32_t i = 0; i < DEDUP_SHARDS; i++) {
            shard *sh = &d->shards[i];
            while (sh->lru_tail && now - sh->lru_tail->last_ns > d->idle_ns)
                evict(d, sh, sh->lru_tail);
        }
    }
    while (d->max_clients && d->nclients >= d->max_clients) {
        shard *oldest = NULL;
        for (uint32_t i = 0; i < DEDUP_SHARDS; i++) {
            shard *sh = &d->shards[i];
            if (sh->lru_tail &&
                (oldest == NULL || sh->lru_tail->last_ns < oldest->lru_tail->last_ns))
                oldest = sh;
        }
        if (oldest == NULL)
            break;
        evict(d, oldest, oldest->lru_tail);
    }
    unlock_all(d);
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
    w->last_ns = time_now_ns();
    tombstone *t = tomb_slot(d, client);
    if (t && t->client == client && t->highest) {
        /* Evicted before: everything up to its highest counts as possibly applied. */
        w->highest = t->highest;
        t->highest = 0;
        w->tomb_floor = w->highest;
    }
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
    uint64_t h = mix(client);
    shard *sh = shard_of(d, h);
    *out = sh;
    pthread_mutex_lock(&sh->lock);
    client_window *w = lookup(sh, client, h);
    if (w) {
        touch(sh, w);
        return w;
    }
    pthread_mutex_unlock(&sh->lock);
    pthread_mutex_lock(&d->admit);
    /* Added meanwhile by another request of the same client? Clients are added only under
     * admit, so once it is held the answer stays until it is released. */
    pthread_mutex_lock(&sh->lock);
    w = lookup(sh, client, h);
    if (w) {
        touch(sh, w);
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
    pthread_mutex_lock(&d->admit);
    free(d->tombs);
    d->tombs = NULL;
    d->ntombs = 0;
    int rc = 0;
    if (max_clients) {
        d->ntombs = (size_t)max_clients * 4;
        d->tombs = calloc(d->ntombs, sizeof(*d->tombs));
        if (d->tombs == NULL) {
            d->ntombs = 0;
            rc = -1;
        }
    }
    d->max_clients = max_clients;
    d->idle_ns = idle_ms * 1000000u;
    pthread_mutex_unlock(&d->admit);
    return rc;
}

uint64_t dedup_evicted(dedup *d)
{
    pthread_mutex_lock(&d->admit);
    uint64_t n = d->evicted;
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

dedup_result dedup_begin(dedup *d, uint64_t client, uint64_t seq)
{
    if (seq == 0)
        return DEDUP_NEW;
    dedup_result res;
    shard *sh;
    client_window *w = acquire(d, client, &sh);
    if (w == NULL || seq <= w->tomb_floor) {
        res = DEDUP_TOO_OLD;
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
    return res;
}

void dedup_unmark(dedup *d, uint64_t client, uint64_t seq)
{
    if (seq == 0)
        return;
    uint64_t h = mix(client);
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
