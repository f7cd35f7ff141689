/* The distinct ids of a table call (id_dups.h). */
#include "id_dups.h"

#include <stdlib.h>
#include <string.h>

#include "hash.h"

/* Open addressing over the caller's ids: an id with its distinct index + 1 (0: empty), so that a
 * probe reads one entry and no second array. */
typedef struct dup_slot {
    int64_t id;
    uint32_t u1;
} dup_slot;

void id_dups_free(id_dups *d)
{
    if (d == NULL)
        return;
    free(d->ids);
    free(d->sums);
    free(d->first);
    free(d->next);
    free(d);
}

/* The set of ids of[0..n) name (of[i]: ids[i]'s distinct index, first occurrences numbered in
 * order), with grads their sums. NULL when out of memory. */
static id_dups *dups_make(const int64_t *ids, size_t n, const uint32_t *of, size_t nu,
                          const float *grads, size_t dim)
{
    id_dups *d = calloc(1, sizeof(*d));
    size_t *last = malloc(nu * sizeof(*last));
    if (d != NULL) {
        d->n = nu;
        d->first = malloc(nu * sizeof(*d->first));
        d->ids = malloc(nu * sizeof(*d->ids));
        d->next = malloc(n * sizeof(*d->next));
        d->sums = grads ? malloc(nu * dim * sizeof(float)) : NULL;
    }
    if (d == NULL || last == NULL || d->first == NULL || d->ids == NULL || d->next == NULL ||
        (grads && d->sums == NULL)) {
        free(last);
        id_dups_free(d);
        return NULL;
    }
    size_t seen = 0;
    for (size_t i = 0; i < n; i++) {
        size_t u = of[i];
        d->next[i] = SIZE_MAX;
        if (u == seen) { /* its first occurrence */
            seen++;
            d->first[u] = last[u] = i;
            d->ids[u] = ids[i];
            if (grads)
                memcpy(d->sums + u * dim, grads + i * dim, dim * sizeof(float));
            continue;
        }
        d->next[last[u]] = i;
        last[u] = i;
        if (grads) {
            float *acc = d->sums + u * dim;
            const float *g = grads + i * dim;
            for (size_t k = 0; k < dim; k++)
                acc[k] += g[k];
        }
    }
    free(last);
    return d;
}

int id_dups_find(const int64_t *ids, size_t n, const float *grads, size_t dim, id_dups **out)
{
    *out = NULL;
    if (n < 2)
        return 0;
    if (n >= UINT32_MAX)
        return -1; /* sent as they are */
    size_t cap = 16;
    while (cap < 2 * n)
        cap *= 2;
    dup_slot *slot = calloc(cap, sizeof(*slot));
    uint32_t *of = malloc(n * sizeof(*of));
    if (slot == NULL || of == NULL) {
        free(slot);
        free(of);
        return -1;
    }
    uint32_t nu = 0;
    for (size_t i = 0; i < n; i++) {
        size_t j = (size_t)mix64((uint64_t)ids[i]) & (cap - 1);
        while (slot[j].u1 != 0 && slot[j].id != ids[i])
            j = (j + 1) & (cap - 1);
        if (slot[j].u1 == 0) {
            slot[j].id = ids[i];
            slot[j].u1 = ++nu;
        }
        of[i] = slot[j].u1 - 1;
    }
    free(slot);
    if (nu == n) {
        free(of);
        return 0;
    }
    id_dups *d = dups_make(ids, n, of, nu, grads, dim);
    free(of);
    if (d == NULL)
        return -1;
    *out = d;
    return 0;
}

void id_dups_copy_row(const id_dups *d, size_t u, float *rows, size_t dim)
{
    if (d == NULL)
        return;
    const float *row = rows + d->first[u] * dim;
    for (size_t i = d->next[d->first[u]]; i != SIZE_MAX; i = d->next[i])
        memcpy(rows + i * dim, row, dim * sizeof(float));
}
