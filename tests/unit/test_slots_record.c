/* The published slot map (common/slots_record.c): the static map, joined servers, moved slots,
 * its JSON both ways (the format proto/README.md gives), and the bounds the parser checks. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "slots_record.h"

static const char *const two[] = {"10.0.0.1:2222", "10.0.0.2:2222"};

static void test_static_map(void **state)
{
    (void)state;
    slots_record r;
    char err[256];
    assert_int_equal(slots_record_static(&r, SLOTS_DEFAULT, two, 2, err, sizeof(err)), 0);
    assert_int_equal(r.version, 1);
    assert_int_equal(slots_record_count(&r, 0), 2048);
    assert_int_equal(slots_record_count(&r, 1), 2048);
    assert_false(slots_record_moved(&r));
    slot_map m = slots_record_map(&r);
    assert_null(m.owner); /* the static map itself while nothing moved */
    assert_int_equal(m.nservers, 2);
    char *j = slots_record_to_json(&r);
    assert_string_equal(j,
                        "{\"version\":1,\"slots\":4096,\"base\":2,\"servers\":[\"10.0.0.1:2222\","
                        "\"10.0.0.2:2222\"],\"moved\":[]}");
    free(j);
    slots_record_free(&r);
}

static void test_join_and_moves_round_trip(void **state)
{
    (void)state;
    slots_record r, back;
    char err[256];
    assert_int_equal(slots_record_static(&r, SLOTS_DEFAULT, two, 2, err, sizeof(err)), 0);
    assert_int_equal(slots_record_add_server(&r, "10.0.0.3:2222"), 2);
    assert_int_equal(slots_record_find(&r, "10.0.0.3:2222"), 2);
    assert_int_equal(slots_record_find(&r, "10.0.0.4:2222"), -1);
    assert_false(slots_record_moved(&r)); /* a joined server owns nothing */
    assert_int_equal(slots_record_map(&r).nservers, 2);
    r.owner[5] = 2;
    r.owner[2024] = 2;
    r.owner[7] = 0;
    r.version = 3;
    assert_true(slots_record_moved(&r));
    slot_map m = slots_record_map(&r);
    assert_non_null(m.owner);
    assert_int_equal(m.nservers, 3);
    assert_int_equal(slots_name_owner(&m, "foobar"), 2); /* slot 2024 */
    assert_int_equal(slots_owner(&m, 6), 0);
    char *j = slots_record_to_json(&r);
    assert_non_null(strstr(j, "\"moved\":[[5,2],[7,0],[2024,2]]"));
    assert_int_equal(slots_record_from_json(j, &back, err, sizeof(err)), 0);
    assert_int_equal(back.version, 3);
    assert_int_equal(back.base, 2);
    assert_int_equal(back.nservers, 3);
    assert_string_equal(back.addr[2], "10.0.0.3:2222");
    assert_memory_equal(back.owner, r.owner, SLOTS_DEFAULT * sizeof(uint32_t));
    assert_int_equal(slots_record_count(&back, 2), 2);
    free(j);
    slots_record_free(&back);
    slots_record_free(&r);
}

static void test_parse_bounds(void **state)
{
    (void)state;
    static const struct {
        const char *text, *why;
    } bad[] = {
        {"[]", "not a JSON object"},
        {"{\"version\":0,\"slots\":4096,\"base\":1,\"servers\":[\"a:1\"]}", "\"version\""},
        {"{\"version\":1,\"slots\":4000,\"base\":1,\"servers\":[\"a:1\"]}", "\"slots\""},
        {"{\"version\":1,\"slots\":4096,\"base\":2,\"servers\":[\"a:1\"]}", "\"base\""},
        {"{\"version\":1,\"slots\":4096,\"base\":1,\"servers\":[]}", "\"servers\""},
        {"{\"version\":1,\"slots\":4096,\"base\":2,\"servers\":[\"a:1\",\"a:1\"]}", "both a:1"},
        {"{\"version\":1,\"slots\":4096,\"base\":1,\"servers\":[\"a:1\"],\"moved\":[[4096,0]]}",
         "\"moved\"[0]"},
        {"{\"version\":1,\"slots\":4096,\"base\":1,\"servers\":[\"a:1\"],\"moved\":[[1,1]]}",
         "\"moved\"[0]"},
        {"{\"version\":1,\"slots\":4096,\"base\":1,\"servers\":[\"a:1\",\"b:1\"],\"moved\":[[2,1],"
         "[1,1]]}",
         "\"moved\"[1]"},
        {"{\"version\":1,\"slots\":4096,\"base\":1,\"servers\":[\"a:1\"]} x", "not a JSON object"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        slots_record r;
        char err[256] = "";
        assert_int_equal(slots_record_from_json(bad[i].text, &r, err, sizeof(err)), ETCD_EFAILED);
        if (strstr(err, bad[i].why) == NULL)
            fail_msg("%s: \"%s\" does not say %s", bad[i].text, err, bad[i].why);
        assert_null(r.owner);
    }
    /* "moved" may be absent: the static map of base servers. */
    slots_record r;
    char err[256];
    assert_int_equal(slots_record_from_json("{\"version\":4,\"slots\":8,\"base\":3,\"servers\":"
                                            "[\"a:1\",\"b:1\",\"c:1\",\"d:1\"]}",
                                            &r, err, sizeof(err)),
                     0);
    assert_int_equal(slots_record_count(&r, 0), 3);
    assert_int_equal(slots_record_count(&r, 3), 0);
    slots_record_free(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_static_map),
        cmocka_unit_test(test_join_and_moves_round_trip),
        cmocka_unit_test(test_parse_bounds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
