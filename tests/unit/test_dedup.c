/* Exactly-once window: duplicates, reordering, window edges, many clients, eviction,
 * export/import, and many threads at once. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "dedup.h"

static void test_in_order_and_duplicates(void **state)
{
    (void)state;
    dedup *d = dedup_create(128);
    assert_non_null(d);
    for (uint64_t s = 1; s <= 300; s++)
        assert_int_equal(dedup_begin(d, 1, s), DEDUP_NEW);
    assert_int_equal(dedup_begin(d, 1, 300), DEDUP_DUPLICATE);
    assert_int_equal(dedup_begin(d, 1, 250), DEDUP_DUPLICATE);
    assert_int_equal(dedup_begin(d, 1, 173), DEDUP_DUPLICATE); /* 127 behind: in window */
    assert_int_equal(dedup_begin(d, 1, 172), DEDUP_TOO_OLD);   /* 128 behind: out */
    assert_int_equal(dedup_begin(d, 2, 300), DEDUP_NEW);       /* other client */
    assert_int_equal(dedup_begin(d, 1, 0), DEDUP_NEW);         /* seq 0: never deduplicated */
    assert_int_equal(dedup_begin(d, 1, 0), DEDUP_NEW);
    assert_int_equal(dedup_clients(d), 2);
    dedup_destroy(d);
}

static void test_out_of_order(void **state)
{
    (void)state;
    dedup *d = dedup_create(64);
    assert_int_equal(dedup_begin(d, 7, 10), DEDUP_NEW);
    assert_int_equal(dedup_begin(d, 7, 5), DEDUP_NEW); /* late but unseen */
    assert_int_equal(dedup_begin(d, 7, 5), DEDUP_DUPLICATE);
    assert_int_equal(dedup_begin(d, 7, 75), DEDUP_NEW); /* shift by 65 words-crossing */
    assert_int_equal(dedup_begin(d, 7, 12), DEDUP_NEW); /* 63 behind, unseen */
    assert_int_equal(dedup_begin(d, 7, 12), DEDUP_DUPLICATE);
    assert_int_equal(dedup_begin(d, 7, 10), DEDUP_TOO_OLD); /* 65 behind */
    /* Shifts by amounts that are not multiples of 64 keep every mark. */
    dedup *e = dedup_create(256);
    for (uint64_t s = 1; s <= 1000; s += 3)
        assert_int_equal(dedup_begin(e, 1, s), DEDUP_NEW);
    for (uint64_t s = 1000 - 250; s <= 1000; s++) {
        dedup_result want = ((s - 1) % 3 == 0) ? DEDUP_DUPLICATE : DEDUP_NEW;
        assert_int_equal(dedup_begin(e, 1, s), want);
    }
    dedup_destroy(e);
    dedup_destroy(d);
}

static void test_unmark(void **state)
{
    (void)state;
    dedup *d = dedup_create(64);
    assert_int_equal(dedup_begin(d, 3, 4), DEDUP_NEW);
    dedup_unmark(d, 3, 4); /* the update failed: may be sent again */
    assert_int_equal(dedup_begin(d, 3, 4), DEDUP_NEW);
    assert_int_equal(dedup_begin(d, 3, 4), DEDUP_DUPLICATE);
    dedup_unmark(d, 99, 4); /* unknown client: no effect */
    dedup_destroy(d);
}

static void test_many_clients(void **state)
{
    (void)state;
    dedup *d = dedup_create(64);
    for (uint64_t c = 1; c <= 5000; c++)
        assert_int_equal(dedup_begin(d, c * 0x9e3779b97f4a7c15ull, 1), DEDUP_NEW);
    for (uint64_t c = 1; c <= 5000; c++)
        assert_int_equal(dedup_begin(d, c * 0x9e3779b97f4a7c15ull, 1), DEDUP_DUPLICATE);
    assert_int_equal(dedup_clients(d), 5000);
    dedup_destroy(d);
    dedup_destroy(NULL);
}

/* Eviction is table-wide, not per shard: the least recently heard client of all goes (the
 * integration test `limits` does the same through a server). */
static void test_eviction_lru_and_tombstones(void **state)
{
    (void)state;
    dedup *d = dedup_create(64);
    assert_int_equal(dedup_set_limits(d, 2, 0), 0);
    assert_int_equal(dedup_begin(d, 0xA1, 1), DEDUP_NEW);
    assert_int_equal(dedup_begin(d, 0xA1, 1), DEDUP_DUPLICATE);
    assert_int_equal(dedup_begin(d, 0xB2, 1), DEDUP_NEW);
    assert_int_equal(dedup_begin(d, 0xC3, 1), DEDUP_NEW); /* evicts 0xA1 */
    assert_int_equal(dedup_clients(d), 2);
    assert_int_equal(dedup_evicted(d), 1);
    assert_int_equal(dedup_begin(d, 0xA1, 1), DEDUP_TOO_OLD); /* its tombstone; evicts 0xB2 */
    assert_int_equal(dedup_begin(d, 0xA1, 2), DEDUP_NEW);
    assert_int_equal(dedup_begin(d, 0xC3, 1), DEDUP_DUPLICATE); /* heard since: kept */
    assert_int_equal(dedup_begin(d, 0xB2, 1), DEDUP_TOO_OLD);   /* evicted second */
    assert_int_equal(dedup_evicted(d), 3);                      /* 0xB2 then 0xA1 */
    dedup_destroy(d);

    /* Many clients over every shard: the bound holds for the table, the newest stay. */
    d = dedup_create(64);
    assert_int_equal(dedup_set_limits(d, 100, 0), 0);
    for (uint64_t c = 1; c <= 1000; c++)
        assert_int_equal(dedup_begin(d, c, 1), DEDUP_NEW);
    assert_int_equal(dedup_clients(d), 100);
    assert_int_equal(dedup_evicted(d), 900);
    for (uint64_t c = 901; c <= 1000; c++)
        assert_int_equal(dedup_begin(d, c, 1), DEDUP_DUPLICATE);
    assert_int_equal(dedup_evicted(d), 900);
    dedup_destroy(d);

    /* Idle clients go when the next one is added. */
    d = dedup_create(64);
    assert_int_equal(dedup_set_limits(d, 0, 1), 0);
    for (uint64_t c = 1; c <= 10; c++)
        assert_int_equal(dedup_begin(d, c, 1), DEDUP_NEW);
    nanosleep(&(struct timespec){0, 5 * 1000000}, NULL);
    assert_int_equal(dedup_clients(d), 10);
    assert_int_equal(dedup_begin(d, 11, 1), DEDUP_NEW);
    assert_int_equal(dedup_clients(d), 1);
    assert_int_equal(dedup_evicted(d), 10);
    dedup_destroy(d);
}

/* An export holds every client of every shard, and imports into a fresh table restore them. */
static void test_export_import(void **state)
{
    (void)state;
    dedup *d = dedup_create(128);
    for (uint64_t c = 1; c <= 300; c++)
        for (uint64_t s = 1; s <= c % 7 + 1; s++)
            assert_int_equal(dedup_begin(d, c * 1000003, s), DEDUP_NEW);
    uint64_t n;
    uint32_t words;
    uint64_t *e = dedup_export(d, &n, &words);
    assert_non_null(e);
    assert_int_equal(n, 300);
    assert_int_equal(words, 2);
    dedup *r = dedup_create(128);
    for (uint64_t i = 0; i < n; i++) {
        const uint64_t *x = e + i * (2 + words);
        assert_int_equal(dedup_import(r, x[0], x[1], x + 2, words), 0);
    }
    free(e);
    assert_int_equal(dedup_clients(r), 300);
    for (uint64_t c = 1; c <= 300; c++) {
        uint64_t top = c % 7 + 1;
        for (uint64_t s = 1; s <= top; s++)
            assert_int_equal(dedup_begin(r, c * 1000003, s), DEDUP_DUPLICATE);
        assert_int_equal(dedup_begin(r, c * 1000003, top + 1), DEDUP_NEW);
    }
    dedup_destroy(r);
    dedup_destroy(d);
}

/* Threads with a client each, all at once: every seq is new once, then a duplicate. */
#define DT 8
#define DSEQS 100000

typedef struct seq_arg {
    dedup *d;
    uint64_t client;
    uint64_t bad;
} seq_arg;

static void *seq_main(void *arg)
{
    seq_arg *a = arg;
    for (uint64_t s = 1; s <= DSEQS; s++) {
        if (dedup_begin(a->d, a->client, s) != DEDUP_NEW)
            a->bad++;
        if (dedup_begin(a->d, a->client, s) != DEDUP_DUPLICATE)
            a->bad++;
        if (s > 64 && dedup_begin(a->d, a->client, s - 64) != DEDUP_DUPLICATE)
            a->bad++; /* still in the 128-seq window */
    }
    return NULL;
}

static void test_threads_distinct_clients(void **state)
{
    (void)state;
    dedup *d = dedup_create(128);
    seq_arg a[DT];
    pthread_t t[DT];
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < DT; i++) {
        a[i] = (seq_arg){.d = d, .client = 0x5eed0000u + (uint64_t)i};
        assert_int_equal(pthread_create(&t[i], NULL, seq_main, &a[i]), 0);
    }
    for (int i = 0; i < DT; i++)
        pthread_join(t[i], NULL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    for (int i = 0; i < DT; i++)
        assert_int_equal(a[i].bad, 0);
    assert_int_equal(dedup_clients(d), DT);
    print_message("%d threads x %d seqs x 3 checks: %.1f ms\n", DT, DSEQS,
                  (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-6);
    dedup_destroy(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_in_order_and_duplicates),
        cmocka_unit_test(test_out_of_order),
        cmocka_unit_test(test_unmark),
        cmocka_unit_test(test_many_clients),
        cmocka_unit_test(test_eviction_lru_and_tombstones),
        cmocka_unit_test(test_export_import),
        cmocka_unit_test(test_threads_distinct_clients),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
