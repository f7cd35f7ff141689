/* hash.h: the values of mix64, splitmix64_next and FNV-1a, and of the hashes built on them
 * (row placement, a table row's index hash, the default etcd prefix), pinned: placement, the
 * initial values of rows and the order of data depend on them and must never change. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "hash.h"
#include "placement.h"
#include "table_index.h"
#include "view_etcd.h"

static void test_mix64(void **state)
{
    (void)state;
    assert_true(mix64(0) == 0);
    assert_true(mix64(1) == 0x5692161d100b05e5ull);
    assert_true(mix64(12345) == 0xf36cf1164265dd51ull);
    assert_true(mix64(HASH_GOLDEN_GAMMA) == 0xe220a8397b1dcdafull);
}

static void test_splitmix64_sequence(void **state)
{
    (void)state;
    uint64_t s = 0; /* splitmix64's published reference sequence from seed 0 */
    assert_true(splitmix64_next(&s) == 0xe220a8397b1dcdafull);
    assert_true(splitmix64_next(&s) == 0x6e789e6aa1b965f4ull);
    assert_true(splitmix64_next(&s) == 0x06c45d188009454full);
    assert_true(s == 3 * HASH_GOLDEN_GAMMA);
}

static void test_fnv1a(void **state)
{
    (void)state;
    assert_true(fnv1a("", 0) == 0xcbf29ce484222325ull);
    assert_true(fnv1a("a", 1) == 0xaf63dc4c8601ec8cull);
    assert_true(fnv1a("foobar", 6) == 0x85944171f73967e8ull);
    /* Extending in pieces is hashing the whole. */
    assert_true(fnv1a_update(fnv1a("foo", 3), "bar", 3) == fnv1a("foobar", 6));
}

static void test_hashes_built_on_them(void **state)
{
    (void)state;
    assert_true(placement_table_hash("emb", 0) == 0x708636bfbbe3ca79ull);
    assert_true(placement_table_hash("emb", -1) == 0x9537ad31c89dd92bull);
    assert_true(placement_table_hash("emb", 42) == 0xd09245019c8c74c9ull);
    assert_true(table_id_hash(0) == 0xf2ee2134306ff565ull);
    assert_true(table_id_hash(7) == 0x250924992b7b8fb9ull);
    const char *servers[] = {"tcp://10.0.0.1:2222", "tcp://10.0.0.2:2222"};
    char prefix[64];
    view_default_prefix(servers, 2, prefix, sizeof(prefix));
    assert_string_equal(prefix, "/psd/375b57fe7c1c9616");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mix64),
        cmocka_unit_test(test_splitmix64_sequence),
        cmocka_unit_test(test_fnv1a),
        cmocka_unit_test(test_hashes_built_on_them),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
