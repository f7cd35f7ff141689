/* view_decide (common/view_agent.c): the next view from the installed one, the registered
 * servers, their restored copies and this server's catch-up marks. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "view_agent.h"

/* A view of n servers, r replicas, every server live with lease 100 + i, primary[g] = g. */
static view_record full(uint32_t n, uint32_t r, uint64_t epoch)
{
    view_record v;
    memset(&v, 0, sizeof(v));
    v.v.epoch = epoch;
    v.v.num_servers = n;
    v.v.replicas = r;
    for (uint32_t i = 0; i < n; i++) {
        v.v.live[i] = 1;
        v.v.primary[i] = (int32_t)i;
        v.lease[i] = 100 + i;
    }
    return v;
}

static view_inputs inputs(const view_record *cur, const int64_t *reg, uint32_t self, uint32_t n,
                          uint32_t r)
{
    view_inputs in;
    memset(&in, 0, sizeof(in));
    in.cur = cur;
    in.reg = reg;
    in.self = self;
    in.num_servers = n;
    in.replicas = r;
    return in;
}

static void test_initial(void **state)
{
    (void)state;
    int64_t reg[VIEW_MAX_SERVERS] = {100, 0, 102};
    view_record next;
    /* Not everyone registered, grace not over: wait. */
    view_inputs in = inputs(NULL, reg, 0, 3, 2);
    assert_int_equal(view_decide(&in, &next), VIEW_KEEP);
    /* After the grace: the registered ones; server 0 (lowest) proposes, 2 falls back. */
    in.grace_over = true;
    assert_int_equal(view_decide(&in, &next), VIEW_PROPOSE);
    assert_int_equal(next.v.epoch, 1);
    assert_int_equal(next.v.live[0], 1);
    assert_int_equal(next.v.live[1], 0);
    assert_int_equal(next.v.primary[0], 0);
    assert_int_equal(next.v.primary[1], 2); /* group 1 = {1, 2} */
    assert_int_equal(next.v.primary[2], 2);
    assert_int_equal(next.lease[2], 102);
    in.self = 2;
    assert_int_equal(view_decide(&in, &next), VIEW_FALLBACK);
    /* A server not registered itself proposes nothing. */
    in.self = 1;
    assert_int_equal(view_decide(&in, &next), VIEW_KEEP);
    /* Everyone registered: no grace needed. */
    reg[1] = 101;
    in = inputs(NULL, reg, 0, 3, 2);
    assert_int_equal(view_decide(&in, &next), VIEW_PROPOSE);
    for (int g = 0; g < 3; g++)
        assert_int_equal(next.v.primary[g], g);
}

static void test_stable(void **state)
{
    (void)state;
    view_record cur = full(3, 2, 5);
    int64_t reg[VIEW_MAX_SERVERS] = {100, 101, 102};
    view_record next;
    for (uint32_t s = 0; s < 3; s++) {
        view_inputs in = inputs(&cur, reg, s, 3, 2);
        assert_int_equal(view_decide(&in, &next), VIEW_KEEP);
    }
    /* Another shape: never touched here. */
    view_inputs in = inputs(&cur, reg, 0, 3, 3);
    assert_int_equal(view_decide(&in, &next), VIEW_KEEP);
}

static void test_primary_dies(void **state)
{
    (void)state;
    view_record cur = full(3, 2, 5);
    int64_t reg[VIEW_MAX_SERVERS] = {100, 0, 102};
    view_record next;
    /* Group 1 = {1, 2}: server 2 takes over and is the one to propose; 0 falls back. */
    view_inputs in = inputs(&cur, reg, 2, 3, 2);
    assert_int_equal(view_decide(&in, &next), VIEW_PROPOSE);
    assert_int_equal(next.v.epoch, 6);
    assert_int_equal(next.v.live[1], 0);
    assert_int_equal(next.lease[1], 0);
    assert_int_equal(next.v.primary[0], 0);
    assert_int_equal(next.v.primary[1], 2);
    assert_int_equal(next.v.primary[2], 2);
    in.self = 0;
    view_record next0;
    assert_int_equal(view_decide(&in, &next0), VIEW_FALLBACK);
    assert_memory_equal(&next, &next0, sizeof(next));
    /* Once installed, nothing more to do. */
    in.cur = &next;
    assert_int_equal(view_decide(&in, &next0), VIEW_KEEP);
}

static void test_restart_is_a_death(void **state)
{
    (void)state;
    /* Server 0 restarted within the TTL: its key holds another lease. */
    view_record cur = full(3, 2, 2);
    int64_t reg[VIEW_MAX_SERVERS] = {900, 101, 102};
    view_record next;
    view_inputs in = inputs(&cur, reg, 1, 3, 2);
    assert_int_equal(view_decide(&in, &next), VIEW_PROPOSE); /* 1 is group 0's next member */
    assert_int_equal(next.v.live[0], 0);
    assert_int_equal(next.v.primary[0], 1);
    /* The restarted server itself neither proposes its removal first nor rejoins at once. */
    in.self = 0;
    assert_int_equal(view_decide(&in, &next), VIEW_FALLBACK);
    assert_int_equal(next.v.live[0], 0);
}

static void test_backup_dies(void **state)
{
    (void)state;
    /* 4 servers, 3 replicas: group g = {g, g+1, g+2}. Server 3 dies: it is primary of group
     * 3 = {3, 0, 1}, so server 0 takes over and proposes. */
    view_record cur = full(4, 3, 9);
    int64_t reg[VIEW_MAX_SERVERS] = {100, 101, 102, 0};
    view_record next;
    view_inputs in = inputs(&cur, reg, 0, 4, 3);
    assert_int_equal(view_decide(&in, &next), VIEW_PROPOSE);
    assert_int_equal(next.v.primary[3], 0);
    /* Only a backup gone (primaries unchanged after the first view): the lowest live server
     * proposes. */
    view_record cur2 = next;
    cur2.v.epoch = 10;
    cur2.v.live[3] = 1;
    cur2.lease[3] = 103;
    cur2.v.primary[3] = 0;
    reg[3] = 103;
    reg[2] = 0; /* primary of group 2 = {2, 3, 0} -> 3 */
    in = inputs(&cur2, reg, 3, 4, 3);
    assert_int_equal(view_decide(&in, &next), VIEW_PROPOSE);
    assert_int_equal(next.v.primary[2], 3);
    cur2.v.primary[2] = 3; /* pretend 2 was only a backup everywhere */
    cur2.v.primary[1] = 1;
    in = inputs(&cur2, reg, 0, 4, 3);
    assert_int_equal(view_decide(&in, &next), VIEW_PROPOSE);
    assert_int_equal(next.v.live[2], 0);
    in.self = 1;
    assert_int_equal(view_decide(&in, &next), VIEW_FALLBACK);
}

static void test_rejoin(void **state)
{
    (void)state;
    view_record cur = full(3, 2, 6);
    cur.v.live[1] = 0;
    cur.lease[1] = 0;
    cur.v.primary[1] = 2;
    int64_t reg[VIEW_MAX_SERVERS] = {100, 555, 102};
    view_record next;
    /* Others do not add it. */
    view_inputs in = inputs(&cur, reg, 0, 3, 2);
    assert_int_equal(view_decide(&in, &next), VIEW_KEEP);
    in.self = 2;
    assert_int_equal(view_decide(&in, &next), VIEW_KEEP);
    /* Server 1 is a member of groups 1 and 0: both have primaries, both must be marked. */
    in.self = 1;
    assert_int_equal(view_decide(&in, &next), VIEW_KEEP);
    in.caught_up[1] = true;
    assert_int_equal(view_decide(&in, &next), VIEW_KEEP);
    in.caught_up[0] = true;
    assert_int_equal(view_decide(&in, &next), VIEW_PROPOSE);
    assert_int_equal(next.v.epoch, 7);
    assert_int_equal(next.v.live[1], 1);
    assert_int_equal(next.lease[1], 555);
    assert_int_equal(next.v.primary[1], 2); /* the primary stays where it is */
}

static void test_group_without_members(void **state)
{
    (void)state;
    /* 3 servers, 2 replicas; 1 and 2 die: group 1 = {1, 2} has no live member. */
    view_record cur = full(3, 2, 3);
    int64_t reg[VIEW_MAX_SERVERS] = {100, 0, 0};
    view_record next;
    view_inputs in = inputs(&cur, reg, 0, 3, 2);
    assert_int_equal(view_decide(&in, &next), VIEW_PROPOSE);
    assert_int_equal(next.v.primary[1], -1);
    assert_int_equal(next.v.primary[2], 0);
    /* Server 2 comes back: group 1 has no primary to catch up from, group 2's is 0. */
    view_record cur2 = next;
    reg[2] = 202;
    in = inputs(&cur2, reg, 2, 3, 2);
    assert_int_equal(view_decide(&in, &next), VIEW_KEEP);
    in.caught_up[2] = true;
    assert_int_equal(view_decide(&in, &next), VIEW_PROPOSE);
    assert_int_equal(next.v.primary[1], 2);
    assert_int_equal(next.v.primary[2], 0);
}

static void test_whole_cluster_restart(void **state)
{
    (void)state;
    /* Every live server of the stored view holds another lease now: a new view, epoch on. */
    view_record cur = full(3, 2, 8);
    cur.v.live[2] = 0;
    cur.v.primary[2] = 0;
    int64_t reg[VIEW_MAX_SERVERS] = {300, 301, 302};
    view_record next;
    view_inputs in = inputs(&cur, reg, 0, 3, 2);
    assert_int_equal(view_decide(&in, &next), VIEW_PROPOSE);
    assert_int_equal(next.v.epoch, 9);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(next.v.live[i], 1);
        assert_int_equal(next.v.primary[i], i);
        assert_int_equal(next.lease[i], 300 + i);
    }
}

static void test_restart_prefers_newest_copy(void **state)
{
    (void)state;
    /* Server 1 died (epoch 2), server 2 served group 1 = {1, 2} since; then the whole cluster
     * stopped. Their restored copies of group 1: server 1's from epoch 1, server 2's from epoch
     * 2, so group 1's primary is server 2; groups 0 and 2 stay at their placement servers (an
     * equal copy does not move a group, an older one neither). */
    view_record cur = full(3, 2, 2);
    cur.v.live[1] = 0;
    cur.v.primary[1] = 2;
    int64_t reg[VIEW_MAX_SERVERS] = {300, 301, 302};
    view_copy copies[] = {
        {.server = 0, .group = 0, .epoch = 2, .lsn = 500},
        {.server = 1, .group = 1, .epoch = 1, .lsn = 1900},
        {.server = 2, .group = 1, .epoch = 2, .lsn = 1500},
        {.server = 2, .group = 2, .epoch = 2, .lsn = 70},
        {.server = 0, .group = 2, .epoch = 2, .lsn = 70},
        {.server = 1, .group = 0, .epoch = 1, .lsn = 400},
    };
    view_record next;
    view_inputs in = inputs(&cur, reg, 0, 3, 2);
    in.copies = copies;
    in.ncopies = sizeof(copies) / sizeof(copies[0]);
    assert_int_equal(view_decide(&in, &next), VIEW_PROPOSE);
    assert_int_equal(next.v.epoch, 3);
    assert_int_equal(next.v.primary[0], 0);
    assert_int_equal(next.v.primary[1], 2);
    assert_int_equal(next.v.primary[2], 2);
    /* Within an epoch the higher lsn is newer. */
    copies[1].epoch = 2;
    copies[1].lsn = 1600;
    assert_int_equal(view_decide(&in, &next), VIEW_PROPOSE);
    assert_int_equal(next.v.primary[1], 1);
    /* The newest copy's server is not registered: the newest among the live members. */
    copies[1].lsn = 1400;
    reg[2] = 0;
    in.grace_over = true;
    assert_int_equal(view_decide(&in, &next), VIEW_PROPOSE);
    assert_int_equal(next.v.primary[1], 1);
    assert_int_equal(next.v.primary[2], 0);
    /* A member with a copy beats one without. */
    reg[2] = 302;
    in.ncopies = 1; /* server 0's copy of group 0 only */
    copies[0].server = 1;
    assert_int_equal(view_decide(&in, &next), VIEW_PROPOSE);
    assert_int_equal(next.v.primary[0], 1);
    assert_int_equal(next.v.primary[1], 1);
    /* Copies do not matter while the view in force has a live server. */
    view_record live = full(3, 2, 5);
    int64_t reg5[VIEW_MAX_SERVERS] = {100, 101, 102};
    in = inputs(&live, reg5, 0, 3, 2);
    in.copies = copies;
    in.ncopies = 1;
    assert_int_equal(view_decide(&in, &next), VIEW_KEEP);
}

static void test_epochs_never_go_back(void **state)
{
    (void)state;
    /* etcd lost its data: a new first view starts above the highest epoch seen. */
    int64_t reg[VIEW_MAX_SERVERS] = {100, 101, 102};
    view_record next;
    view_inputs in = inputs(NULL, reg, 0, 3, 2);
    in.known_epoch = 41;
    assert_int_equal(view_decide(&in, &next), VIEW_PROPOSE);
    assert_int_equal(next.v.epoch, 42);
    /* A view below the highest epoch seen: the same view again above it, by whoever sees it. */
    view_record cur = full(3, 2, 3);
    in = inputs(&cur, reg, 2, 3, 2);
    in.known_epoch = 9;
    assert_int_equal(view_decide(&in, &next), VIEW_PROPOSE);
    assert_int_equal(next.v.epoch, 10);
    for (int g = 0; g < 3; g++)
        assert_int_equal(next.v.primary[g], g);
    in.known_epoch = 3;
    assert_int_equal(view_decide(&in, &next), VIEW_KEEP);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_initial),
        cmocka_unit_test(test_stable),
        cmocka_unit_test(test_primary_dies),
        cmocka_unit_test(test_restart_is_a_death),
        cmocka_unit_test(test_backup_dies),
        cmocka_unit_test(test_rejoin),
        cmocka_unit_test(test_group_without_members),
        cmocka_unit_test(test_whole_cluster_restart),
        cmocka_unit_test(test_restart_prefers_newest_copy),
        cmocka_unit_test(test_epochs_never_go_back),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
