/* The distinct ids of a table call (id_dups.h). */
#include "id_dups.h"

#include <stdlib.h>
#include <string.h>

#include "hash.h"

/* Open addressing over the caller's ids: slot[j] is a distinct index + 1, 0 when empty. */
static size_t probe(const size_t *slot, size_t cap, const int64_t *ids, const size_t *first,
                    int64_t id)
{
    size_t j = (size_t)mix64((uint64_t)id) & (cap - 1);
    while (slot[j] != 0 && ids[first[slot[j] - 1]] != id)
        j = (j + 1) & (cap - 1);
    return j;
}

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

int id_dups_find(const int64_t *ids, size_t n, const float *grads, size_t dim, id_dups **out)
{
    *out = NULL;
    if (n < 2)
        return 0;
    size_t cap = 16;
    while (cap < 2 * n)
        cap *= 2;
    size_t *slot = calloc(cap, sizeof(*slot));
    size_t *first = malloc(n * sizeof(*first));
    if (slot == NULL || first == NULL) {
        free(slot);
        free(first);
        return -1;
    }
    size_t nu = 0;
    for (size_t i = 0; i < n; i++) {
        size_t j = probe(slot, cap, ids, first, ids[i]);
        if (slot[j] == 0) {
            first[nu] = i;
            slot[j] = ++nu;
        }
    }
    if (nu == n) {
        free(slot);
        free(first);
        return 0;
    }
    id_dups *d = calloc(1, sizeof(*d));
    size_t *last = malloc(nu * sizeof(*last));
    if (d != NULL) {
        d->n = nu;
        d->first = first;
        d->ids = malloc(nu * sizeof(*d->ids));
        d->next = malloc(n * sizeof(*d->next));
        d->sums = grads ? malloc(nu * dim * sizeof(float)) : NULL;
    }
    if (d == NULL || last == NULL || d->ids == NULL || d->next == NULL ||
        (grads && d->sums == NULL)) {
        if (d == NULL)
            free(first);
        free(slot);
        free(last);
        id_dups_free(d);
        return -1;
    }
    for (size_t u = 0; u < nu; u++) {
        last[u] = first[u];
        d->ids[u] = ids[first[u]];
        if (grads)
            memcpy(d->sums + u * dim, grads + first[u] * dim, dim * sizeof(float));
    }
    for (size_t i = 0; i < n; i++) {
        d->next[i] = SIZE_MAX;
        size_t u = slot[probe(slot, cap, ids, first, ids[i])] - 1;
        if (first[u] == i)
            continue;
        d->next[last[u]] = i;
        last[u] = i;
        if (grads) {
            float *acc = d->sums + u * dim;
            const float *g = grads + i * dim;
            for (size_t k = 0; k < dim; k++)
                acc[k] += g[k];
        }
    }
    free(slot);
    free(last);
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
