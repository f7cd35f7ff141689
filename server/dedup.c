#include "dedup.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "timeutil.h"

typedef struct client_window {
    uint64_t client;
    uint64_t highest;    /* highest seq marked; bit 0 of the window is `highest` */
    uint64_t *bits;      /* bit i set: seq (highest - i) applied */
    uint64_t last_ns;    /* when last heard from */
    uint64_t tomb_floor; /* evicted once: seqs up to this may have been applied */
    struct client_window *next;
    struct client_window *lru_prev, *lru_next; /* most recently heard first */
} client_window;

typedef struct tombstone {
    uint64_t client;
    uint64_t highest; /* 0: empty slot */
} tombstone;

struct dedup {
    pthread_mutex_t lock;
    uint32_t words;
    uint32_t nbuckets;
    uint64_t nclients;
    client_window **buckets;
    client_window *lru_head, *lru_tail;
    uint64_t max_clients, idle_ns, evicted;
    tombstone *tombs;
    size_t ntombs;
};

static uint32_t bucket_of(const dedup *d, uint64_t client)
{
    return (uint32_t)((client * 0x9e3779b97f4a7c15ull) >> 56) % d->nbuckets;
}

static void lru_unlink(dedup *d, client_window *w)
{
    if (w->lru_prev)
        w->lru_prev->lru_next = w->lru_next;
    else
        d->lru_head = w->lru_next;
    if (w->lru_next)
        w->lru_next->lru_prev = w->lru_prev;
    else
        d->lru_tail = w->lru_prev;
    w->lru_prev = w->lru_next = NULL;
}

static void lru_push_front(dedup *d, client_window *w)
{
    w->lru_prev = NULL;
    w->lru_next = d->lru_head;
    if (d->lru_head)
        d->lru_head->lru_prev = w;
    d->lru_head = w;
    if (d->lru_tail == NULL)
        d->lru_tail = w;
}

static tombstone *tomb_slot(dedup *d, uint64_t client)
{
    return d->tombs ? &d->tombs[((client * 0xbf58476d1ce4e5b9ull) >> 17) % d->ntombs] : NULL;
}

/* Removes w from the table, leaving its tombstone. */
static void evict(dedup *d, client_window *w)
{
    client_window **p = &d->buckets[bucket_of(d, w->client)];
    while (*p != w)
        p = &(*p)->next;
    *p = w->next;
    lru_unlink(d, w);
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

int dedup_set_limits(dedup *d, uint64_t max_clients, uint64_t idle_ms)
{
    pthread_mutex_lock(&d->lock);
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
    pthread_mutex_unlock(&d->lock);
    return rc;
}

uint64_t dedup_evicted(dedup *d)
{
    pthread_mutex_lock(&d->lock);
    uint64_t n = d->evicted;
    pthread_mutex_unlock(&d->lock);
    return n;
}

dedup *dedup_create(uint32_t window)
{
    dedup *d = calloc(1, sizeof(*d));
    if (d == NULL)
        return NULL;
    d->words = (window + 63) / 64;
    if (d->words == 0)
        d->words = 1;
    d->nbuckets = 256;
    d->buckets = calloc(d->nbuckets, sizeof(*d->buckets));
    if (d->buckets == NULL) {
        free(d);
        return NULL;
    }
    pthread_mutex_init(&d->lock, NULL);
    return d;
}

void dedup_destroy(dedup *d)
{
    if (d == NULL)
        return;
    for (uint32_t i = 0; i < d->nbuckets; i++) {
        client_window *w = d->buckets[i];
        while (w) {
            client_window *n = w->next;
            free(w->bits);
            free(w);
            w = n;
        }
    }
    free(d->buckets);
    free(d->tombs);
    pthread_mutex_destroy(&d->lock);
    free(d);
}

static client_window *find(dedup *d, uint64_t client, bool create)
{
    uint32_t b = bucket_of(d, client);
    uint64_t now = time_now_ns();
    for (client_window *w = d->buckets[b]; w; w = w->next) {
        if (w->client == client) {
            if (create) {
                w->last_ns = now;
                lru_unlink(d, w);
                lru_push_front(d, w);
            }
            return w;
        }
    }
    if (!create)
        return NULL;
    /* Make room: the idle, then the least recently heard beyond max_clients. */
    while (d->lru_tail && d->idle_ns && now - d->lru_tail->last_ns > d->idle_ns)
        evict(d, d->lru_tail);
    while (d->max_clients && d->nclients >= d->max_clients && d->lru_tail)
        evict(d, d->lru_tail);
    client_window *w = calloc(1, sizeof(*w));
    if (w == NULL)
        return NULL;
    w->bits = calloc(d->words, sizeof(uint64_t));
    if (w->bits == NULL) {
        free(w);
        return NULL;
    }
    w->client = client;
    w->last_ns = now;
    tombstone *t = tomb_slot(d, client);
    if (t && t->client == client && t->highest) {
        /* Evicted before: everything up to its highest counts as possibly applied. */
        w->highest = t->highest;
        t->highest = 0;
        w->tomb_floor = w->highest;
    }
    w->next = d->buckets[b];
    d->buckets[b] = w;
    lru_push_front(d, w);
    d->nclients++;
    return w;
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
    pthread_mutex_lock(&d->lock);
    client_window *w = find(d, client, true);
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
    pthread_mutex_unlock(&d->lock);
    return res;
}

void dedup_unmark(dedup *d, uint64_t client, uint64_t seq)
{
    if (seq == 0)
        return;
    pthread_mutex_lock(&d->lock);
    client_window *w = find(d, client, false);
    if (w && seq <= w->highest) {
        uint64_t age = w->highest - seq;
        if (age < (uint64_t)d->words * 64)
            w->bits[age / 64] &= ~(1ull << (age % 64));
    }
    pthread_mutex_unlock(&d->lock);
}

uint64_t dedup_clients(dedup *d)
{
    pthread_mutex_lock(&d->lock);
    uint64_t n = d->nclients;
    pthread_mutex_unlock(&d->lock);
    return n;
}

uint64_t *dedup_export(dedup *d, uint64_t *nclients, uint32_t *words)
{
    pthread_mutex_lock(&d->lock);
    size_t per = 2 + (size_t)d->words;
    uint64_t *out = malloc((d->nclients ? (size_t)d->nclients : 1) * per * sizeof(uint64_t));
    uint64_t k = 0;
    if (out) {
        for (uint32_t i = 0; i < d->nbuckets; i++) {
            for (client_window *w = d->buckets[i]; w; w = w->next) {
                uint64_t *e = out + k * per;
                e[0] = w->client;
                e[1] = w->highest;
                memcpy(e + 2, w->bits, d->words * sizeof(uint64_t));
                k++;
            }
        }
    }
    *words = d->words;
    pthread_mutex_unlock(&d->lock);
    *nclients = k;
    return out;
}

int dedup_import(dedup *d, uint64_t client, uint64_t highest, const uint64_t *bits, uint32_t words)
{
    pthread_mutex_lock(&d->lock);
    client_window *w = find(d, client, true);
    if (w != NULL) {
        uint32_t n = words < d->words ? words : d->words;
        memset(w->bits, 0, d->words * sizeof(uint64_t));
        memcpy(w->bits, bits, n * sizeof(uint64_t));
        w->highest = highest;
    }
    pthread_mutex_unlock(&d->lock);
    return w ? 0 : -1;
}
