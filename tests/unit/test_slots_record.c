/* The published slot map (common/slots_record.c): the static map, joined servers, moved slots,
 * its JSON both ways (the format proto/README.md gives), and the bounds the parser checks; the
 * moves that even it out (common/slots_plan.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "slots_plan.h"
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

/* Plans the moves for member over r, checks them (each slot once, from its owner, every
 * member within one slot of S/m, the others empty, no server both giving and receiving),
 * applies them and returns how many there were. */
static size_t plan_and_check(slots_record *r, const bool *member)
{
    slot_move *mv;
    size_t n;
    char err[128];
    uint32_t before[8] = {0}, m = 0;
    for (uint32_t s = 0; s < r->nslots; s++)
        before[r->owner[s]]++;
    for (uint32_t i = 0; i < r->nservers; i++)
        m += member[i];
    assert_int_equal(slots_plan(r, member, &mv, &n, err, sizeof(err)), 0);
    bool gives[8] = {false}, takes[8] = {false};
    for (size_t i = 0; i < n; i++) {
        assert_true(i == 0 || mv[i].slot > mv[i - 1].slot);
        assert_int_equal(r->owner[mv[i].slot], mv[i].from);
        assert_true(member[mv[i].to]);
        gives[mv[i].from] = takes[mv[i].to] = true;
    }
    for (uint32_t i = 0; i < r->nservers; i++)
        assert_false(gives[i] && takes[i]);
    uint64_t v = r->version;
    assert_true(slots_apply(r, mv, n));
    assert_int_equal(r->version, v + 1);
    for (uint32_t i = 0; i < r->nservers; i++) {
        uint32_t c = slots_record_count(r, i);
        if (!member[i])
            assert_int_equal(c, 0);
        else
            assert_true(c == r->nslots / m || c == r->nslots / m + 1);
    }
    /* The fewest moves: every slot above a server's share moves, no other. */
    size_t surplus = 0;
    for (uint32_t i = 0; i < r->nservers; i++) {
        uint32_t now = slots_record_count(r, i);
        if (before[i] > now)
            surplus += before[i] - now;
    }
    assert_int_equal(n, surplus);
    free(mv);
    return n;
}

static void test_plan_add_remove_rebalance(void **state)
{
    (void)state;
    slots_record r;
    char err[128];
    assert_int_equal(slots_record_static(&r, SLOTS_DEFAULT, two, 2, err, sizeof(err)), 0);
    assert_int_equal(slots_record_add_server(&r, "10.0.0.3:2222"), 2);
    /* Add server 2 to 2: a third of the slots (1365: 4096 = 1366 + 1365 + 1365) moves. */
    bool three[3] = {true, true, true};
    assert_int_equal(plan_and_check(&r, three), 1365);
    assert_int_equal(slots_record_count(&r, 2), 1365);
    /* The published form lists exactly the moved slots and reads back the same. */
    char *j = slots_record_to_json(&r);
    slots_record back;
    assert_int_equal(slots_record_from_json(j, &back, err, sizeof(err)), 0);
    assert_memory_equal(back.owner, r.owner, SLOTS_DEFAULT * sizeof(uint32_t));
    slots_record_free(&back);
    free(j);
    /* Already even: nothing to do. */
    assert_int_equal(plan_and_check(&r, three), 0);
    /* Remove server 0: its slots go to 1 and 2, nothing else moves. */
    bool not0[3] = {false, true, true};
    size_t had0 = slots_record_count(&r, 0);
    assert_int_equal(plan_and_check(&r, not0), had0);
    /* No member: refused. */
    bool none[3] = {false, false, false};
    slot_move *mv;
    size_t n;
    assert_int_equal(slots_plan(&r, none, &mv, &n, err, sizeof(err)), -1);
    /* A move from a server that does not own the slot, or to one not listed: refused. */
    slot_move wrong = {.slot = 0, .from = 0, .to = 1};
    wrong.from = r.owner[0] == 1 ? 2 : 1;
    uint64_t v = r.version;
    assert_false(slots_apply(&r, &wrong, 1));
    slot_move far = {.slot = 0, .from = r.owner[0], .to = 3};
    assert_false(slots_apply(&r, &far, 1));
    slot_move twice[2] = {{0, r.owner[0], 0}, {0, r.owner[0], 0}};
    if (r.owner[0] != 0)
        assert_false(slots_apply(&r, twice, 2));
    assert_int_equal(r.version, v);
    slots_record_free(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_static_map),
        cmocka_unit_test(test_join_and_moves_round_trip),
        cmocka_unit_test(test_parse_bounds),
        cmocka_unit_test(test_plan_add_remove_rebalance),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
