/* Placement and slots: pure, stable functions every client computes alike. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>

#include "placement.h"
#include "slots.h"

/* The static map of n servers over the default slots. */
static slot_map map_of(uint32_t n)
{
    return slots_static(SLOTS_DEFAULT, n);
}

static void test_hash_is_stable(void **state)
{
    (void)state;
    /* FNV-1a 64 reference values: the placement of existing variables depends on them. */
    assert_true(placement_hash("") == 0xcbf29ce484222325ull);
    assert_true(placement_hash("a") == 0xaf63dc4c8601ec8cull);
    assert_true(placement_hash("foobar") == 0x85944171f73967e8ull);
    /* Slot: the hash's low 12 bits; owner under the static map: slot % N. */
    assert_int_equal(slots_of_name("foobar", SLOTS_DEFAULT), 0x7e8);
    assert_int_equal(slots_of_name("", SLOTS_DEFAULT), 805);
    assert_int_equal(slots_of_name("a", SLOTS_DEFAULT), 3212);
    assert_int_equal(slots_name_owner(&(slot_map){SLOTS_DEFAULT, 1, NULL}, "foobar"), 0);
    slot_map m3 = map_of(3), m7 = map_of(7);
    assert_int_equal(slots_name_owner(&m3, "foobar"), 2024 % 3);
    assert_int_equal(slots_name_owner(&m7, "a"), 3212 % 7);
    assert_int_equal(slots_name_owner(&m7, "layer0/weights"), 4);
}

static void test_owners_spread(void **state)
{
    (void)state;
    int count[4] = {0};
    char name[32];
    for (int i = 0; i < 4000; i++) {
        snprintf(name, sizeof(name), "layer%d/weights", i);
        count[slots_name_owner(&(slot_map){SLOTS_DEFAULT, 4, NULL}, name)]++;
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
    /* Slots (the hash's low 12 bits) and owners under the static map (slot % N), as
     * proto/README.md prints them. */
    assert_int_equal(slots_of_row("emb", 0, SLOTS_DEFAULT), 2681);
    assert_int_equal(slots_of_row("emb", 1, SLOTS_DEFAULT), 3135);
    assert_int_equal(slots_of_row("emb", -1, SLOTS_DEFAULT), 2347);
    assert_int_equal(slots_of_row("user_id", 123456789, SLOTS_DEFAULT), 2737);
    assert_int_equal(slots_of_row("", INT64_MAX, SLOTS_DEFAULT), 2273);
    assert_int_equal(slots_of_row("emb", INT64_MIN, SLOTS_DEFAULT), 2429);
    slot_map m7 = map_of(7), m3 = map_of(3), m1 = map_of(1), m0 = map_of(0);
    assert_int_equal(slots_row_owner(&m7, "emb", 1), 6);
    assert_int_equal(slots_row_owner(&m7, "user_id", 123456789), 0);
    assert_int_equal(slots_row_owner(&m7, "emb", INT64_MIN), 0);
    assert_int_equal(slots_row_owner(&m3, "emb", 0), 2);
    assert_int_equal(slots_row_owner(&m3, "", INT64_MAX), 2);
    assert_int_equal(slots_row_owner(&m1, "emb", 1), 0);
    assert_int_equal(slots_row_owner(&m0, "emb", 1), 0);
    /* The name matters: the same id of two tables lands apart somewhere. */
    slot_map m16 = map_of(16);
    int differ = 0;
    for (int64_t id = 0; id < 64; id++)
        differ += slots_row_owner(&m16, "a", id) != slots_row_owner(&m16, "b", id);
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
        slot_map m = map_of(n);
        for (int64_t i = 0; i < ROWS; i++) {
            int64_t id = (i % 3 == 0) ? i : (i % 3 == 1) ? -i * 4096 : i << 32;
            count[slots_row_owner(&m, "clicks/ad_id", id)]++;
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

/* The static map: slot s -> s % N; with N a power of two it gives every row and variable the
 * server hash % N gave before slots (old checkpoints and clients of such clusters agree). An
 * explicit owner table overrides it slot by slot. */
static void test_slot_map(void **state)
{
    (void)state;
    assert_true(slots_count_valid(4096) && slots_count_valid(1) && slots_count_valid(1u << 24));
    assert_false(slots_count_valid(0) || slots_count_valid(3000) || slots_count_valid(1u << 25));
    const uint32_t pow2[] = {1, 2, 4, 8};
    char name[32];
    for (size_t k = 0; k < 4; k++) {
        slot_map m = map_of(pow2[k]);
        for (int64_t id = -500; id < 500; id++)
            assert_int_equal(slots_row_owner(&m, "emb", id),
                             placement_table_hash("emb", id) % pow2[k]);
        for (int i = 0; i < 500; i++) {
            snprintf(name, sizeof(name), "v%d", i);
            assert_int_equal(slots_name_owner(&m, name), placement_hash(name) % pow2[k]);
        }
    }
    static uint32_t owner[SLOTS_DEFAULT];
    for (uint32_t s = 0; s < SLOTS_DEFAULT; s++)
        owner[s] = s % 3;
    owner[2681] = 1; /* slot of ("emb", 0), moved from 2 to 1 */
    slot_map moved = {.nslots = SLOTS_DEFAULT, .nservers = 3, .owner = owner};
    slot_map m3 = map_of(3);
    assert_int_equal(slots_row_owner(&m3, "emb", 0), 2);
    assert_int_equal(slots_row_owner(&moved, "emb", 0), 1);
    for (int64_t id = 1; id < 1000; id++)
        if (slots_of_row("emb", id, SLOTS_DEFAULT) != 2681)
            assert_int_equal(slots_row_owner(&moved, "emb", id), slots_row_owner(&m3, "emb", id));
}

/* slots_row_owner_h (the table's name hashed once) places every row where slots_row_owner
 * does, under the static map and an explicit one. */
static void test_row_owner_with_name_hash(void **state)
{
    (void)state;
    uint32_t owners[64];
    for (uint32_t s = 0; s < 64; s++)
        owners[s] = (s * 7) % 5;
    slot_map maps[2] = {slots_static(64, 3), {.nslots = 64, .nservers = 5, .owner = owners}};
    uint64_t h = placement_hash("emb/t");
    for (int m = 0; m < 2; m++)
        for (int64_t id = -5000; id < 5000; id += 7)
            assert_int_equal(slots_row_owner_h(&maps[m], h, id),
                             slots_row_owner(&maps[m], "emb/t", id));
}

/* Known answers for parts, from an independent Python transcription of proto/README.md's
 * "Parts of a split variable" (the vectors printed there): part k's hash is the table row hash
 * of the variable's name with k as id. */
static void test_part_known_answers(void **state)
{
    (void)state;
    assert_true(placement_part_hash("big", 0) == 0x1fe3b929aee7d874ull);
    assert_true(placement_part_hash("big", 1) == 0xf765a2823108f93aull);
    assert_true(placement_part_hash("big", 2) == 0xceab955b33e8c8bfull);
    assert_true(placement_part_hash("big", 3) == 0xc688a3874b741777ull);
    assert_true(placement_part_hash("layer0/weights", 15) == 0x9af27c5fbc4646a2ull);
    assert_true(placement_part_hash("", 0) == 0xaebe53f85cdc3c4cull);
    assert_true(placement_part_hash("big/w", 2) == 0x1a0fd700a6d84343ull);
    const struct {
        const char *name;
        uint64_t part;
        uint32_t slot, of2, of3, of7;
    } ka[] = {
        {"big", 0, 2164, 0, 1, 1},
        {"big", 1, 2362, 0, 1, 3},
        {"big", 2, 2239, 1, 1, 6},
        {"big", 3, 1911, 1, 0, 0},
        {"layer0/weights", 0, 794, 0, 2, 3},
        {"layer0/weights", 1, 1351, 1, 1, 0},
        {"layer0/weights", 2, 2607, 1, 0, 3},
        {"layer0/weights", 15, 1698, 0, 0, 4},
        {"big/w", 0, 42, 0, 0, 0},
        {"big/w", 1, 4086, 0, 0, 5},
        {"big/w", 2, 835, 1, 1, 2},
        {"big/w", 3, 4029, 1, 0, 4},
        {"", 0, 3148, 0, 1, 5},
    };
    slot_map m2 = map_of(2), m3 = map_of(3), m7 = map_of(7);
    for (size_t i = 0; i < sizeof(ka) / sizeof(ka[0]); i++) {
        assert_int_equal(slots_of_part(ka[i].name, ka[i].part, SLOTS_DEFAULT), ka[i].slot);
        assert_int_equal(slots_part_owner(&m2, ka[i].name, ka[i].part), ka[i].of2);
        assert_int_equal(slots_part_owner(&m3, ka[i].name, ka[i].part), ka[i].of3);
        assert_int_equal(slots_part_owner(&m7, ka[i].name, ka[i].part), ka[i].of7);
    }
    /* The same function as a table row's slot with the part index as id. */
    for (uint64_t k = 0; k < 1000; k++)
        assert_int_equal(slots_of_part("emb", k, SLOTS_DEFAULT),
                         slots_of_row("emb", (int64_t)k, SLOTS_DEFAULT));
}

/* The cut in parts: 2^18 elements each, the last shorter, whatever the cluster size. */
static void test_part_cut(void **state)
{
    (void)state;
    assert_true(PLACEMENT_PART_ELEMS == 262144u);
    assert_true(placement_part_count(0) == 0);
    assert_true(placement_part_count(1) == 1);
    assert_true(placement_part_count(PLACEMENT_PART_ELEMS) == 1);
    assert_true(placement_part_count(PLACEMENT_PART_ELEMS + 1) == 2);
    /* Cut in parts: more than one part's elements and at least the threshold, any N. */
    assert_false(placement_is_parts(PLACEMENT_PART_ELEMS, 4 * PLACEMENT_PART_ELEMS, 0));
    assert_true(placement_is_parts(PLACEMENT_PART_ELEMS + 1, 4 * PLACEMENT_PART_ELEMS + 4, 0));
    assert_false(
        placement_is_parts(PLACEMENT_PART_ELEMS + 1, 4 * PLACEMENT_PART_ELEMS + 4, 64u << 20));
    const uint64_t sizes[] = {PLACEMENT_PART_ELEMS + 1, 3 * PLACEMENT_PART_ELEMS,
                              3 * PLACEMENT_PART_ELEMS + 5, 1000003};
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        uint64_t n = sizes[i], next = 0, parts = placement_part_count(n);
        for (uint64_t k = 0; k < parts; k++) {
            uint64_t off, cnt;
            placement_part_range(n, k, &off, &cnt);
            assert_true(off == next && cnt >= 1 && cnt <= PLACEMENT_PART_ELEMS);
            assert_true(k + 1 == parts || cnt == PLACEMENT_PART_ELEMS);
            assert_true(placement_part_of(off) == k && placement_part_of(off + cnt - 1) == k);
            next = off + cnt;
        }
        assert_true(next == n);
    }
}

/* A variable of 2^18 * 3 + 5 elements ("big": 4 parts, the last of 5 elements) on 1, 2 and 3
 * servers under the static map, and after a slot move: every element is held by exactly one
 * server, the one owning its part's slot; the parts themselves never change. */
static void test_parts_on_servers(void **state)
{
    (void)state;
    const uint64_t n = 3 * PLACEMENT_PART_ELEMS + 5;
    assert_true(placement_part_count(n) == 4);
    uint64_t off, cnt;
    placement_part_range(n, 3, &off, &cnt);
    assert_true(off == 786432 && cnt == 5);
    /* Owners of parts 0..3 (slots 2164, 2362, 2239, 1911) for 1, 2 and 3 servers. */
    const uint32_t want[3][4] = {{0, 0, 0, 0}, {0, 0, 1, 1}, {1, 1, 1, 0}};
    for (uint32_t ns = 1; ns <= 3; ns++) {
        slot_map m = map_of(ns);
        uint64_t held[3] = {0}, total = 0;
        for (uint64_t k = 0; k < 4; k++) {
            uint32_t o = slots_part_owner(&m, "big", k);
            assert_int_equal(o, want[ns - 1][k]);
            placement_part_range(n, k, &off, &cnt);
            held[o] += cnt;
            total += cnt;
        }
        assert_true(total == n);
        if (ns == 3) /* a server may hold no part at all */
            assert_true(held[0] == 5 && held[1] == n - 5 && held[2] == 0);
        if (ns == 2)
            assert_true(held[0] == 2 * PLACEMENT_PART_ELEMS && held[1] == PLACEMENT_PART_ELEMS + 5);
    }
    /* Part 1's slot moves to a server that joined (task 3 of a 3-server spec): only part 1
     * changes owner. */
    static uint32_t owner[SLOTS_DEFAULT];
    for (uint32_t s = 0; s < SLOTS_DEFAULT; s++)
        owner[s] = s % 3;
    owner[2362] = 3;
    slot_map moved = {.nslots = SLOTS_DEFAULT, .nservers = 4, .owner = owner};
    assert_int_equal(slots_part_owner(&moved, "big", 0), 1);
    assert_int_equal(slots_part_owner(&moved, "big", 1), 3);
    assert_int_equal(slots_part_owner(&moved, "big", 2), 1);
    assert_int_equal(slots_part_owner(&moved, "big", 3), 0);
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
        cmocka_unit_test(test_slot_map),
        cmocka_unit_test(test_row_owner_with_name_hash),
        cmocka_unit_test(test_part_known_answers),
        cmocka_unit_test(test_part_cut),
        cmocka_unit_test(test_parts_on_servers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
