/* Exactly-once window: duplicates, reordering, window edges, many clients, eviction,
 * export/import, and many threads at once. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dedup.h"
#include "timeutil.h"
#include "metrics.h"

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

/* dedup_peek says what dedup_begin would, and marks nothing. */
static void test_peek(void **state)
{
    (void)state;
    dedup *d = dedup_create(64);
    assert_int_equal(dedup_peek(d, 3, 10), DEDUP_NEW); /* unknown client */
    assert_int_equal(dedup_peek(d, 3, 10), DEDUP_NEW); /* still: nothing marked */
    assert_int_equal(dedup_begin(d, 3, 10), DEDUP_NEW);
    assert_int_equal(dedup_peek(d, 3, 10), DEDUP_DUPLICATE);
    assert_int_equal(dedup_peek(d, 3, 9), DEDUP_NEW);   /* below the highest, unmarked */
    assert_int_equal(dedup_peek(d, 3, 11), DEDUP_NEW);  /* above it */
    assert_int_equal(dedup_begin(d, 3, 11), DEDUP_NEW); /* the peeks marked neither */
    assert_int_equal(dedup_begin(d, 3, 9), DEDUP_NEW);
    assert_int_equal(dedup_begin(d, 3, 200), DEDUP_NEW);
    assert_int_equal(dedup_peek(d, 3, 10), DEDUP_TOO_OLD); /* out of the window: can't tell */
    assert_int_equal(dedup_peek(d, 3, 0), DEDUP_NEW);      /* seq 0 is never deduplicated */
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
    assert_int_equal(dedup_begin(d, 0xA1, 1), DEDUP_EVICTED); /* its tombstone; evicts 0xB2 */
    assert_int_equal(dedup_begin(d, 0xA1, 2), DEDUP_NEW);
    assert_int_equal(dedup_begin(d, 0xC3, 1), DEDUP_DUPLICATE); /* heard since: kept */
    assert_int_equal(dedup_begin(d, 0xB2, 1), DEDUP_EVICTED);   /* evicted second */
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

/* 110 clients with room for 100, each pushing seq 1 and resending it: the 10 evicted (and
 * those their resends evict in turn) are refused, never applied twice; 1,000 likewise. */
static void test_eviction_resend_never_new(void **state)
{
    (void)state;
    static const uint64_t counts[] = {110, 200, 1000};
    for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]); k++) {
        dedup *d = dedup_create(64);
        assert_int_equal(dedup_set_limits(d, 100, 0), 0);
        uint64_t n = counts[k], refused = 0;
        for (uint64_t c = 1; c <= n; c++)
            assert_int_equal(dedup_begin(d, c * 0x9e3779b97f4a7c15ull, 1), DEDUP_NEW);
        for (uint64_t c = 1; c <= n; c++) {
            dedup_result r = dedup_begin(d, c * 0x9e3779b97f4a7c15ull, 1);
            /* Unproven: its tombstone was folded into the floors (1,000 evictions and more
             * through 400 slots). */
            assert_true(r == DEDUP_DUPLICATE || r == DEDUP_EVICTED || r == DEDUP_UNPROVEN);
            refused += r != DEDUP_DUPLICATE;
        }
        assert_true(refused >= n - 100);
        /* Their next pushes are new: above their tombstones, and above every floor (all 1). */
        for (uint64_t c = 1; c <= n; c++)
            assert_int_equal(dedup_begin(d, c * 0x9e3779b97f4a7c15ull, 2), DEDUP_NEW);
        dedup_destroy(d);
    }
}

/* 20 clients push seq 1..3, then 100,000 fresh ids push once each (far more than the table
 * and its tombstones hold), then the 20 resend seq 3: none is applied again, and their seq 4
 * is new (their tombstones, of higher seqs, outlast the flood's). */
static void test_flood_keeps_guarantee(void **state)
{
    (void)state;
    dedup *d = dedup_create(64);
    assert_int_equal(dedup_set_limits(d, 256, 0), 0);
    for (uint64_t c = 1; c <= 20; c++)
        for (uint64_t s = 1; s <= 3; s++)
            assert_int_equal(dedup_begin(d, 0x1e9a1000 + c, s), DEDUP_NEW);
    uint64_t x = 0x243f6a8885a308d3ull;
    for (int i = 0; i < 100000; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        dedup_result r = dedup_begin(d, x, 1);
        assert_true(r == DEDUP_NEW || r == DEDUP_UNPROVEN);
    }
    assert_int_equal(dedup_clients(d), 256);
    assert_true(dedup_forgotten(d) > 90000);
    assert_true(dedup_tombstones(d) <= 4 * 256);
    for (uint64_t c = 1; c <= 20; c++) {
        uint64_t floor = 0;
        assert_int_equal(dedup_begin_floor(d, 0x1e9a1000 + c, 3, &floor), DEDUP_EVICTED);
        assert_int_equal(floor, 3);
        assert_int_equal(dedup_begin(d, 0x1e9a1000 + c, 2), DEDUP_EVICTED);
    }
    for (uint64_t c = 1; c <= 20; c++)
        assert_int_equal(dedup_begin(d, 0x1e9a1000 + c, 4), DEDUP_NEW);
    for (uint64_t c = 1; c <= 20; c++)
        assert_int_equal(dedup_begin(d, 0x1e9a1000 + c, 4), DEDUP_DUPLICATE);

    /* The flood's own ids, forgotten: a resend of seq 1 is refused whichever of window,
     * tombstone or floor still knows it. */
    x = 0x243f6a8885a308d3ull;
    for (int i = 0; i < 100000; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        dedup_result r = dedup_begin(d, x, 1);
        assert_true(r == DEDUP_DUPLICATE || r == DEDUP_EVICTED || r == DEDUP_UNPROVEN);
    }
    /* A never-seen id is new above its floor; where the floors cover it (both of its hashed
     * floors set by the flood), seq 1 is refused as unproven, seq 2 is new. */
    int unproven = 0, fresh = 0;
    for (uint64_t c = 1; c <= 3000; c++) {
        uint64_t id = 0xf0f0000000000000ull + c, floor = 0;
        dedup_result r = dedup_begin_floor(d, id, 1, &floor);
        if (r == DEDUP_UNPROVEN) {
            assert_int_equal(floor, 1);
            unproven++;
        } else {
            assert_int_equal(r, DEDUP_NEW);
            fresh++;
        }
        assert_int_equal(dedup_begin(d, id, 2), DEDUP_NEW);
    }
    assert_true(unproven > 0);
    assert_true(fresh > unproven);
    print_message("after the flood: %d of 3000 new ids refused at seq 1, %llu forgotten\n",
                  unproven, (unsigned long long)dedup_forgotten(d));
    dedup_destroy(d);
}

/* Random pushes and resends of 3,000 clients through a table of 40 (160 tombstones): no
 * (client, seq) is ever new twice, whatever the evictions and folds did. */
static void test_random_never_twice(void **state)
{
    (void)state;
    enum { CL = 3000, SQ = 64 };
    static uint8_t applied[CL][SQ + 1];
    memset(applied, 0, sizeof(applied));
    dedup *d = dedup_create(64);
    assert_int_equal(dedup_set_limits(d, 40, 0), 0);
    uint64_t x = 7, news = 0, refused = 0;
    for (int i = 0; i < 400000; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t c = (uint32_t)((x >> 33) % CL);
        uint32_t s = 1 + (uint32_t)((x >> 20) % SQ);
        dedup_result r = dedup_begin(d, 0xc0ffee00000000ull + c, s);
        if (r == DEDUP_NEW) {
            assert_int_equal(applied[c][s], 0);
            applied[c][s] = 1;
            news++;
        } else if (r == DEDUP_DUPLICATE) {
            assert_int_equal(applied[c][s], 1);
        } else {
            refused++;
        }
        if (i == 200000) { /* limits set again keep every tombstone and floor */
            assert_int_equal(dedup_set_limits(d, 30, 0), 0);
        }
    }
    print_message("%llu applied, %llu refused, %llu forgotten\n", (unsigned long long)news,
                  (unsigned long long)refused, (unsigned long long)dedup_forgotten(d));
    assert_true(news > 1000);
    dedup_destroy(d);
}

/* Setting the limits again keeps the tombstones (a smaller table folds what does not fit). */
static void test_set_limits_keeps_tombstones(void **state)
{
    (void)state;
    dedup *d = dedup_create(64);
    assert_int_equal(dedup_set_limits(d, 10, 0), 0);
    for (uint64_t c = 1; c <= 30; c++)
        assert_int_equal(dedup_begin(d, c, 5), DEDUP_NEW);
    uint64_t held = dedup_tombstones(d); /* a set of 4 may have overflowed */
    assert_int_equal(held + dedup_forgotten(d), 20);
    assert_true(held >= 16);
    assert_int_equal(dedup_set_limits(d, 10, 0), 0);
    assert_int_equal(dedup_tombstones(d), held);
    assert_int_equal(dedup_set_limits(d, 1, 0), 0); /* 4 slots: the rest folded */
    assert_true(dedup_tombstones(d) <= 4);
    assert_int_equal(dedup_tombstones(d) + dedup_forgotten(d), 20);
    for (uint64_t c = 1; c <= 20; c++) {
        dedup_result r = dedup_begin(d, c, 5);
        assert_true(r == DEDUP_EVICTED || r == DEDUP_UNPROVEN);
    }
    /* Idle eviction is counted too, in the table and in the metrics registry. */
    metric_family *ev =
        metrics_family(METRIC_COUNTER, "psd_dedup_evictions_total", "", "reason", NULL, 0);
    metric_family *rf =
        metrics_family(METRIC_COUNTER, "psd_dedup_refused_total", "", "reason", NULL, 0);
    double idle0 = metric_value(metrics_series1(ev, "idle"));
    double full0 = metric_value(metrics_series1(ev, "capacity"));
    double refused0 = metric_value(metrics_series1(rf, "evicted"));
    dedup *e = dedup_create(64);
    assert_int_equal(dedup_set_limits(e, 0, 1), 0);
    assert_int_equal(dedup_begin(e, 1, 9), DEDUP_NEW);
    nanosleep(&(struct timespec){0, 5 * 1000000}, NULL);
    assert_int_equal(dedup_begin(e, 2, 1), DEDUP_NEW);
    assert_int_equal(dedup_evicted(e), 1);
    assert_int_equal(dedup_begin(e, 1, 9), DEDUP_EVICTED);
    /* (client 2 may have gone idle too by the time client 1 came back) */
    assert_true(metric_value(metrics_series1(ev, "idle")) == idle0 + (double)dedup_evicted(e));
    assert_true(metric_value(metrics_series1(ev, "capacity")) == full0);
    assert_true(metric_value(metrics_series1(rf, "evicted")) == refused0 + 1);
    dedup_destroy(e);
    dedup_destroy(d);
}

/* What proves evicted clients' pushes applied survives an export and import: windows with a
 * floor, tombstones and forgotten clients' floors. A malformed array is refused. */
static void test_export_import_floors(void **state)
{
    (void)state;
    dedup *d = dedup_create(64);
    assert_int_equal(dedup_set_limits(d, 8, 0), 0);
    for (uint64_t c = 1; c <= 2000; c++)
        assert_int_equal(dedup_begin(d, c * 0x51ed27ull, 3), DEDUP_NEW);
    /* A client back from its tombstone holds its floor in its window. */
    assert_int_equal(dedup_begin(d, 1999 * 0x51ed27ull, 4), DEDUP_NEW);
    uint64_t n, nf_before = dedup_forgotten(d);
    uint32_t words;
    size_t nw;
    uint64_t *e = dedup_export(d, &n, &words);
    uint64_t *f = dedup_export_floors(d, &nw);
    assert_non_null(e);
    assert_non_null(f);
    assert_true(nf_before > 0);
    dedup *r = dedup_create(64);
    assert_int_equal(dedup_set_limits(r, 8, 0), 0);
    for (uint64_t i = 0; i < n; i++) {
        const uint64_t *x = e + i * (2 + words);
        assert_int_equal(dedup_import(r, x[0], x[1], x + 2, words), 0);
    }
    assert_int_equal(dedup_import_floors(r, f, nw), 0);
    for (uint64_t c = 1; c <= 2000; c++) {
        dedup_result res = dedup_begin(r, c * 0x51ed27ull, 3);
        assert_true(res != DEDUP_NEW);
    }
    assert_true(dedup_begin(r, 1999 * 0x51ed27ull, 4) != DEDUP_NEW);
    /* Malformed: wrong format word, counts past the end, trailing words, bad index. */
    assert_int_equal(dedup_import_floors(r, f, 2), -1);
    uint64_t bad[8] = {3, 0, 0, 0, 0, 0, 0};
    assert_int_equal(dedup_import_floors(r, bad, 7), -1);
    uint64_t no_times[5] = {2, 0, 0, 0, 0}; /* format 2 without its times */
    assert_int_equal(dedup_import_floors(r, no_times, 5), -1);
    uint64_t v2[7] = {2, 0, 0, 0, 0, 0, 0};
    assert_int_equal(dedup_import_floors(r, v2, 7), 0);
    uint64_t big[5] = {1, 0, 1000, 0, 0};
    assert_int_equal(dedup_import_floors(r, big, 5), -1);
    uint64_t idx[7] = {1, 0, 0, 0, 1, 1u << 20, 5};
    assert_int_equal(dedup_import_floors(r, idx, 7), -1);
    uint64_t tail[6] = {1, 0, 0, 0, 0, 9};
    assert_int_equal(dedup_import_floors(r, tail, 6), -1);
    uint64_t ok[5] = {1, 0, 0, 0, 0};
    assert_int_equal(dedup_import_floors(r, ok, 5), 0);
    free(e);
    free(f);
    dedup_destroy(r);
    dedup_destroy(d);
}

/* The windows' times and LRU order travel with an export (format 2 of the floors): a table
 * imported from another evicts the same clients as it, idle or least recently heard, when both
 * go on with the same operations at the same op times (replica copies). */
static void test_export_import_times(void **state)
{
    (void)state;
    dedup *d = dedup_create(64);
    assert_int_equal(dedup_set_limits(d, 40, 5000), 0);
    uint64_t base = 1700000000000ull;
    for (uint64_t i = 0; i < 40; i++) {
        uint64_t c = (i * 17) % 40 + 1; /* heard in an order unlike their ids' */
        time_op_set(base + i * 100);
        assert_int_equal(dedup_begin(d, c * 0x9e37ull, 1), DEDUP_NEW);
    }
    assert_int_equal(dedup_evicted(d), 0);
    uint64_t n;
    uint32_t words;
    size_t nw;
    uint64_t *e = dedup_export(d, &n, &words);
    uint64_t *f = dedup_export_floors(d, &nw);
    assert_non_null(e);
    assert_non_null(f);
    dedup *r = dedup_create(64);
    assert_int_equal(dedup_set_limits(r, 40, 5000), 0);
    time_op_set(base + 60000); /* imported later: its own clock says nothing of the clients */
    for (uint64_t i = 0; i < n; i++) {
        const uint64_t *x = e + i * (2 + words);
        assert_int_equal(dedup_import(r, x[0], x[1], x + 2, words), 0);
    }
    assert_int_equal(dedup_import_floors(r, f, nw), 0);
    size_t nw2;
    uint64_t *f2 = dedup_export_floors(r, &nw2);
    assert_non_null(f2);
    assert_int_equal(nw2, nw);
    assert_memory_equal(f2, f, nw * sizeof(uint64_t)); /* same times, same LRU order */
    /* Both go on alike: new clients at the same op times evict the same ones. */
    for (uint64_t c = 41; c <= 60; c++) {
        time_op_set(base + 7800 + c * 10); /* the first ones idle, then the least recent */
        assert_int_equal(dedup_begin(d, c * 0x9e37ull, 1), DEDUP_NEW);
        assert_int_equal(dedup_begin(r, c * 0x9e37ull, 1), DEDUP_NEW);
    }
    time_op_set(0);
    uint64_t *g1 = dedup_export_floors(d, &nw);
    uint64_t *g2 = dedup_export_floors(r, &nw2);
    assert_int_equal(nw, nw2);
    assert_memory_equal(g1, g2, nw * sizeof(uint64_t));
    assert_int_equal(dedup_evicted(d), dedup_evicted(r));
    assert_true(dedup_evicted(d) > 0);
    free(e);
    free(f);
    free(f2);
    free(g1);
    free(g2);
    dedup_destroy(r);
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

/* dedup_merge: the union of two windows of one client's stream, in either order, the older
 * marks shifted into place; marks below the merged window are refused, never new. */
static void test_merge(void **state)
{
    (void)state;
    dedup *src = dedup_create(128), *dst = dedup_create(128);
    const uint64_t c = 0xabcdefull;
    /* The source applied 1..50 and 60; the target 55 and 70 (resends it took after a move). */
    for (uint64_t s = 1; s <= 50; s++)
        assert_int_equal(dedup_begin(src, c, s), DEDUP_NEW);
    assert_int_equal(dedup_begin(src, c, 60), DEDUP_NEW);
    assert_int_equal(dedup_begin(dst, c, 55), DEDUP_NEW);
    assert_int_equal(dedup_begin(dst, c, 70), DEDUP_NEW);
    uint64_t n;
    uint32_t words;
    uint64_t *e = dedup_export(src, &n, &words);
    assert_non_null(e);
    assert_int_equal(n, 1);
    assert_int_equal(dedup_merge(dst, e[0], e[1], e + 2, words), 0);
    assert_int_equal(dedup_merge(dst, e[0], e[1], e + 2, words), 0); /* twice: harmless */
    for (uint64_t s = 1; s <= 50; s++)
        assert_int_equal(dedup_begin(dst, c, s), DEDUP_DUPLICATE);
    assert_int_equal(dedup_begin(dst, c, 55), DEDUP_DUPLICATE);
    assert_int_equal(dedup_begin(dst, c, 60), DEDUP_DUPLICATE);
    assert_int_equal(dedup_begin(dst, c, 70), DEDUP_DUPLICATE);
    assert_int_equal(dedup_begin(dst, c, 51), DEDUP_NEW);
    assert_int_equal(dedup_begin(dst, c, 71), DEDUP_NEW);
    /* Into a table that never heard of the client; and a window ahead of the import's by more
     * than its size: the import's marks fall below it and are refused as too old. */
    dedup *fresh = dedup_create(128), *ahead = dedup_create(128);
    assert_int_equal(dedup_merge(fresh, e[0], e[1], e + 2, words), 0);
    assert_int_equal(dedup_begin(fresh, c, 60), DEDUP_DUPLICATE);
    assert_int_equal(dedup_begin(fresh, c, 59), DEDUP_NEW);
    assert_int_equal(dedup_begin(ahead, c, 1000), DEDUP_NEW);
    assert_int_equal(dedup_merge(ahead, e[0], e[1], e + 2, words), 0);
    assert_int_equal(dedup_begin(ahead, c, 60), DEDUP_TOO_OLD);
    assert_int_equal(dedup_begin(ahead, c, 1000), DEDUP_DUPLICATE);
    free(e);
    dedup_destroy(src);
    dedup_destroy(dst);
    dedup_destroy(fresh);
    dedup_destroy(ahead);
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
        cmocka_unit_test(test_peek),
        cmocka_unit_test(test_many_clients),
        cmocka_unit_test(test_eviction_lru_and_tombstones),
        cmocka_unit_test(test_export_import),
        cmocka_unit_test(test_eviction_resend_never_new),
        cmocka_unit_test(test_flood_keeps_guarantee),
        cmocka_unit_test(test_random_never_twice),
        cmocka_unit_test(test_set_limits_keeps_tombstones),
        cmocka_unit_test(test_export_import_floors),
        cmocka_unit_test(test_export_import_times),
        cmocka_unit_test(test_merge),
        cmocka_unit_test(test_threads_distinct_clients),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
