/* Exactly-once window: duplicates, reordering, window edges, many clients. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_in_order_and_duplicates),
        cmocka_unit_test(test_out_of_order),
        cmocka_unit_test(test_unmark),
        cmocka_unit_test(test_many_clients),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
