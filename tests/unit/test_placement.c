/* Placement: a pure, stable function every client computes alike. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>

#include "placement.h"

static void test_hash_is_stable(void **state)
{
    (void)state;
    /* FNV-1a 64 reference values: the placement of existing variables depends on them. */
    assert_true(placement_hash("") == 0xcbf29ce484222325ull);
    assert_true(placement_hash("a") == 0xaf63dc4c8601ec8cull);
    assert_true(placement_hash("foobar") == 0x85944171f73967e8ull);
    assert_int_equal(placement_owner("foobar", 1), 0);
    assert_int_equal(placement_owner("foobar", 3), (uint32_t)(0x85944171f73967e8ull % 3));
}

static void test_owners_spread(void **state)
{
    (void)state;
    int count[4] = {0};
    char name[32];
    for (int i = 0; i < 4000; i++) {
        snprintf(name, sizeof(name), "layer%d/weights", i);
        count[placement_owner(name, 4)]++;
    }
    for (int s = 0; s < 4; s++)
        assert_in_range(count[s], 800, 1200);
}

static void test_split_decision(void **state)
{
    (void)state;
    assert_false(placement_is_split(1000000, 4000000, 1 << 20, 1)); /* one server */
    assert_true(placement_is_split(1000000, 4000000, 1 << 20, 2));
    assert_false(placement_is_split(1000, 4000, 1 << 20, 2)); /* small */
    assert_false(placement_is_split(1, 4, 0, 2));             /* fewer elements than servers */
    assert_true(placement_is_split(2, 8, 0, 2));
}

static void test_ranges_cover_exactly(void **state)
{
    (void)state;
    const uint64_t sizes[] = {2, 3, 7, 1000, 1000003};
    for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
        for (uint32_t n = 1; n <= 7; n++) {
            if (sizes[k] < n)
                continue;
            uint64_t next = 0, min = UINT64_MAX, max = 0;
            for (uint32_t s = 0; s < n; s++) {
                uint64_t off, cnt;
                placement_range(sizes[k], n, s, &off, &cnt);
                assert_true(off == next); /* contiguous, in order */
                next = off + cnt;
                min = cnt < min ? cnt : min;
                max = cnt > max ? cnt : max;
            }
            assert_true(next == sizes[k]);
            assert_true(max - min <= 1); /* balanced */
        }
    }
}

/* Known answers for table rows, from an independent Python transcription of proto/README.md's
 * "Placement of table rows" (also the vectors printed there). */
static void test_table_hash_known_answers(void **state)
{
    (void)state;
    assert_true(placement_table_hash("emb", 0) == 0x708636bfbbe3ca79ull);
    assert_true(placement_table_hash("emb", 1) == 0x8bf6fe335d65ac3full);
    assert_true(placement_table_hash("emb", -1) == 0x9537ad31c89dd92bull);
    assert_true(placement_table_hash("user_id", 123456789) == 0x1e926616d0069ab1ull);
    assert_true(placement_table_hash("", INT64_MAX) == 0x63682f260ef188e1ull);
    assert_true(placement_table_hash("emb", INT64_MIN) == 0xb3ca82681226397dull);
    assert_int_equal(placement_table_owner("emb", 1, 7), 5);
    assert_int_equal(placement_table_owner("user_id", 123456789, 7), 3);
    assert_int_equal(placement_table_owner("emb", INT64_MIN, 7), 4);
    assert_int_equal(placement_table_owner("emb", 1, 1), 0);
    assert_int_equal(placement_table_owner("emb", 1, 0), 0);
    /* The name matters: the same id of two tables lands apart somewhere. */
    int differ = 0;
    for (int64_t id = 0; id < 64; id++)
        differ += placement_table_owner("a", id, 16) != placement_table_owner("b", id, 16);
    assert_true(differ > 32);
}

/* Every table spans every server evenly: sequential, strided and negative ids alike. */
static void test_table_rows_balance(void **state)
{
    (void)state;
    const uint32_t sizes[] = {2, 3, 5, 8, 16};
    enum { ROWS = 200000 };
    for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
        uint32_t n = sizes[k], count[16] = {0};
        for (int64_t i = 0; i < ROWS; i++) {
            int64_t id = (i % 3 == 0) ? i : (i % 3 == 1) ? -i * 4096 : i << 32;
            count[placement_table_owner("clicks/ad_id", id, n)]++;
        }
        double fair = (double)ROWS / n;
        for (uint32_t s = 0; s < n; s++) {
            if (!(count[s] < fair * 1.03 && count[s] > fair * 0.97)) {
                print_error("%u servers: server %u holds %u rows, fair %.0f\n", n, s, count[s],
                            fair);
                fail();
            }
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hash_is_stable),
        cmocka_unit_test(test_owners_spread),
        cmocka_unit_test(test_split_decision),
        cmocka_unit_test(test_ranges_cover_exactly),
        cmocka_unit_test(test_table_hash_known_answers),
        cmocka_unit_test(test_table_rows_balance),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
