/* Zipf-distributed ids (zipf.h). */
#include "zipf.h"

#include <math.h>
#include <stdlib.h>

#include "hash.h"

int zipf_init(zipf *z, uint64_t n, double s, uint64_t seed)
{
    z->cdf = malloc(n * sizeof(double));
    if (z->cdf == NULL)
        return -1;
    double acc = 0;
    for (uint64_t r = 0; r < n; r++) {
        acc += pow((double)(r + 1), -s);
        z->cdf[r] = acc;
    }
    for (uint64_t r = 0; r < n; r++)
        z->cdf[r] /= acc;
    z->n = n;
    z->state = seed;
    return 0;
}

void zipf_free(zipf *z)
{
    free(z->cdf);
    z->cdf = NULL;
}

uint64_t zipf_draw(zipf *z)
{
    z->state += UINT64_C(0x9E3779B97F4A7C15);
    double u = (double)(mix64(z->state) >> 11) * 0x1.0p-53;
    uint64_t lo = 0, hi = z->n - 1;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (z->cdf[mid] < u)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

int64_t zipf_rank_id(uint64_t r)
{
    return (int64_t)mix64(r + 1);
}
