/* Unit: the client's loss accounting (client/acks.c). A restart or a failover seen in push
 * replies counts the acknowledged updates lost and this client's own pushes among them: under
 * BSP, where a push joins the aggregate that makes the next version, the own count is not
 * above the updates' (it was one more: "1557 acknowledged updates ... 1558 of them this
 * client's own pushes"), and a failover to a primary that holds the aggregate loses nothing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "../../client/acks.h"

/* One push reply per version from process `instance`, versions from..to (one own push per
 * update, a single worker). */
static void pushes(var_ack *a, uint64_t instance, uint64_t from, uint64_t to, bool bsp,
                   bool replicated)
{
    for (uint64_t v = from; v <= to; v++) {
        ack_reply r = {.instance = instance, .version = v, .bsp = bsp, .replicated = replicated};
        ack_loss l;
        var_ack_note(a, &r, &l);
        assert_int_equal(l.lost, 0);
    }
}

static void test_bsp_restart_own_not_above_lost(void **state)
{
    (void)state;
    var_ack a = {0};
    /* Under BSP the reply to the push for step k reports version k - 1 (the aggregate is
     * applied at the clock): pushes at versions 0..1557. */
    pushes(&a, 11, 0, 1557, true, false);
    /* The server restarted from a checkpoint at version 0. */
    ack_reply r = {.instance = 12, .version = 0, .restored_version = 0, .bsp = true};
    ack_loss l;
    var_ack_note(&a, &r, &l);
    assert_int_equal(l.lost, 1558);
    assert_int_equal(l.own_lost, 1558);
    assert_true(l.own_lost <= l.lost);
    var_ack_free(&a);
}

static void test_asp_restart_counts(void **state)
{
    (void)state;
    var_ack a = {0};
    /* ASP: a push's reply reports the version its update made. */
    pushes(&a, 21, 1, 100, false, false);
    ack_reply r = {.instance = 22, .version = 41, .restored_version = 40};
    ack_loss l;
    var_ack_note(&a, &r, &l);
    assert_int_equal(l.lost, 60);
    assert_int_equal(l.own_lost, 60);
    assert_false(l.own_bound);
    /* A late reply of the process before counts nothing again. */
    ack_reply late = {.instance = 21, .version = 100};
    var_ack_note(&a, &late, &l);
    assert_int_equal(l.lost, 0);
    var_ack_free(&a);
}

static void test_bsp_failover_loses_nothing(void **state)
{
    (void)state;
    var_ack a = {0};
    pushes(&a, 31, 0, 20, true, true);
    /* The new primary holds the aggregate the last push joined: its reply to the next push
     * reports the same version (the clock has not moved yet). Nothing is lost. */
    ack_reply r = {.instance = 32, .version = 20, .bsp = true, .replicated = true};
    ack_loss l;
    var_ack_note(&a, &r, &l);
    assert_int_equal(l.lost, 0);
    assert_int_equal(l.own_lost, 0);
    /* A new primary behind what was acknowledged: those updates are lost, own among them. */
    pushes(&a, 32, 21, 30, true, true);
    ack_reply behind = {.instance = 33, .version = 25, .bsp = true, .replicated = true};
    var_ack_note(&a, &behind, &l);
    assert_int_equal(l.lost, 5);
    assert_int_equal(l.own_lost, 5);
    var_ack_free(&a);
}

static void test_own_marks_capped(void **state)
{
    (void)state;
    var_ack a = {0};
    pushes(&a, 41, 1, OWN_ACKS_MAX + 100, false, false);
    ack_reply r = {.instance = 42, .version = 1, .restored_version = 0};
    ack_loss l;
    var_ack_note(&a, &r, &l);
    assert_int_equal(l.lost, OWN_ACKS_MAX + 100);
    assert_true(l.own_lost <= l.lost);
    assert_true(l.own_bound); /* older own marks were dropped */
    var_ack_free(&a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bsp_restart_own_not_above_lost),
        cmocka_unit_test(test_asp_restart_counts),
        cmocka_unit_test(test_bsp_failover_loses_nothing),
        cmocka_unit_test(test_own_marks_capped),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
