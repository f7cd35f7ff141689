/* Zipf-distributed ids for the table benchmarks (ps-table-bench, ps-kv-compare): ranks drawn by
 * inversion of the CDF, scrambled into ids so that hot ids are spread over every server. */
#ifndef PSD_BENCH_ZIPF_H
#define PSD_BENCH_ZIPF_H

#include <stdint.h>

typedef struct zipf {
    double *cdf; /* n doubles */
    uint64_t n;
    uint64_t state;
} zipf;

/* Zipf(s) over ranks 0..n-1, draws seeded by seed. Returns 0, or -1 when out of memory. */
int zipf_init(zipf *z, uint64_t n, double s, uint64_t seed);
void zipf_free(zipf *z);

/* The next rank (0 = most frequent). */
uint64_t zipf_draw(zipf *z);

/* The id of rank r: mix64(r + 1), as a two's complement int64. */
int64_t zipf_rank_id(uint64_t r);

#endif
