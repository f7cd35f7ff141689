/* data.c - data set helpers: scaling, worker shards, shuffles, batch gather. */
#include "data.h"

#include <stdlib.h>
#include <string.h>

#include "hash.h"

void dataset_free(dataset *d)
{
    if (d == NULL)
        return;
    free(d->x);
    free(d->y);
    free(d->ids);
    memset(d, 0, sizeof(*d));
}

void dataset_minmax(const dataset *d, float *lo, float *hi)
{
    size_t total = d->n * d->dim;
    if (total == 0) {
        *lo = 0.0f;
        *hi = 1.0f;
        return;
    }
    float a = d->x[0], b = d->x[0];
    for (size_t i = 1; i < total; i++) {
        if (d->x[i] < a)
            a = d->x[i];
        if (d->x[i] > b)
            b = d->x[i];
    }
    *lo = a;
    *hi = b;
}

void dataset_scale(dataset *d, float lo, float hi)
{
    size_t total = d->n * d->dim;
    float range = hi - lo;
    for (size_t i = 0; i < total; i++) {
        float v = range > 0.0f ? (d->x[i] - lo) / range : 0.0f;
        d->x[i] = v < 0.0f ? 0.0f : (v > 1.0f ? 1.0f : v);
    }
}

uint64_t data_rng_next(uint64_t *state)
{
    return splitmix64_next(state);
}

/* Uniform in [0, bound) without modulo bias worth caring about (bound < 2^32). */
static uint32_t below(uint64_t *state, uint32_t bound)
{
    return (uint32_t)(((data_rng_next(state) >> 32) * (uint64_t)bound) >> 32);
}

static void shuffle(uint32_t *a, size_t n, uint64_t *state)
{
    for (size_t i = n; i > 1; i--) {
        size_t j = below(state, (uint32_t)i);
        uint32_t t = a[i - 1];
        a[i - 1] = a[j];
        a[j] = t;
    }
}

int data_shard_init(data_shard *s, size_t total, int task, int count, uint64_t seed)
{
    memset(s, 0, sizeof(*s));
    if (count < 1 || task < 0 || task >= count || total > UINT32_MAX)
        return -1;
    size_t first = total * (size_t)task / (size_t)count;
    size_t last = total * (size_t)(task + 1) / (size_t)count;
    if (last <= first)
        return -1;
    uint32_t *all = malloc((total ? total : 1) * sizeof(uint32_t));
    if (all == NULL)
        return -1;
    for (size_t i = 0; i < total; i++)
        all[i] = (uint32_t)i;
    uint64_t st = seed ^ 0x5eed5eed5eed5eedull;
    shuffle(all, total, &st);
    s->n = last - first;
    memmove(all, all + first, s->n * sizeof(uint32_t));
    s->index = all;
    s->seed = seed ^ ((uint64_t)task * HASH_GOLDEN_GAMMA);
    return 0;
}

void data_shard_free(data_shard *s)
{
    if (s == NULL)
        return;
    free(s->index);
    memset(s, 0, sizeof(*s));
}

void data_shard_shuffle(data_shard *s, uint64_t epoch)
{
    uint64_t st = s->seed + epoch * 0xd1b54a32d192ed03ull;
    data_rng_next(&st);
    shuffle(s->index, s->n, &st);
}

void data_gather(const dataset *d, const uint32_t *order, size_t count, float *x, int32_t *y)
{
    for (size_t i = 0; i < count; i++) {
        memcpy(x + i * d->dim, d->x + (size_t)order[i] * d->dim, d->dim * sizeof(float));
        y[i] = d->y[order[i]];
    }
}
