/* The distinct ids of a table call (ps_table_pull/push, a Step's table items): only those travel.
 * A push sends each distinct id once with the sum of its gradients, added in the caller's order
 * (as a server sums a request's duplicates, so the result is the same to the bit); a pull's row
 * is written to every place the caller asked for it. */
#ifndef PSD_CLIENT_ID_DUPS_H
#define PSD_CLIENT_ID_DUPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct id_dups {
    size_t n;      /* distinct ids */
    int64_t *ids;  /* [n] in order of first occurrence */
    float *sums;   /* [n * dim] summed gradients (a push), else NULL */
    size_t *first; /* [n] the caller's first index of each distinct id */
    size_t *next;  /* [caller's n] the caller's next index with the same id, SIZE_MAX: none */
} id_dups;

/* Finds the distinct ids of ids[0..n); with grads (n x dim floats) also their sums. *out is
 * NULL when the ids are distinct already (nothing to do), else a set to free with id_dups_free.
 * Returns 0, or -1 when out of memory (*out NULL). */
int id_dups_find(const int64_t *ids, size_t n, const float *grads, size_t dim, id_dups **out);
void id_dups_free(id_dups *d);

/* The caller's index where distinct id u's row goes first (u itself when d is NULL). */
static inline size_t id_dups_place(const id_dups *d, size_t u)
{
    return d ? d->first[u] : u;
}

/* Copies distinct id u's row, written at id_dups_place, to the caller's other places of it. */
void id_dups_copy_row(const id_dups *d, size_t u, float *rows, size_t dim);

#endif
