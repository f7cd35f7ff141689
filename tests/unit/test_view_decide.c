/* view_decide (common/view_decide.c): the next view from the installed one, the registered
 * servers, their restored copies and this server's catch-up and unreachable marks; a model
 * of random schedules of kills, restarts, copies, writes and cuts between servers (each
 * still reaching etcd) checks that every primary holds every acknowledged update. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
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
    memset(cur2.v.behind, 0, sizeof(cur2.v.behind)); /* its rejoin made it in sync again */
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
    view_set_in_sync(&cur.v, 0, 1, false); /* out of the view while 0 and 2 went on */
    view_set_in_sync(&cur.v, 1, 1, false);
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
    assert_int_equal(next.v.primary[1], 2);   /* the primary stays where it is */
    assert_true(view_in_sync(&next.v, 0, 1)); /* caught up: in sync again */
    assert_true(view_in_sync(&next.v, 1, 1));
}

static void test_unreachable_backup_out_of_sync(void **state)
{
    (void)state;
    /* 3 servers, 2 replicas: group g = {g, g+1}. Server 0, primary of group 0, cannot reach
     * server 1, which keeps its lease. */
    view_record cur = full(3, 2, 5);
    int64_t reg[VIEW_MAX_SERVERS] = {100, 101, 102};
    view_record next;
    view_inputs in = inputs(&cur, reg, 0, 3, 2);
    in.unreachable[1] = true;
    assert_int_equal(view_decide(&in, &next), VIEW_PROPOSE);
    assert_int_equal(next.v.epoch, 6);
    assert_false(view_in_sync(&next.v, 0, 1)); /* out of sync in the group 0 leads */
    assert_true(view_in_sync(&next.v, 0, 0));
    assert_int_equal(next.v.live[1], 1); /* still live: it keeps its lease */
    assert_int_equal(next.v.primary[0], 0);
    assert_true(view_in_sync(&next.v, 1, 1)); /* group 1 = {1, 2}: server 0 is no member */
    assert_int_equal(next.v.primary[1], 1);
    /* Only the group's primary takes a member out: server 2 backs group 1 up, and server 1
     * is no member of group 2 = {2, 0}. */
    in = inputs(&cur, reg, 2, 3, 2);
    in.unreachable[1] = true;
    assert_int_equal(view_decide(&in, &next), VIEW_KEEP);
    /* Once out of sync, nothing more to do; a primary not registered proposes nothing. */
    view_set_in_sync(&cur.v, 0, 1, false);
    in = inputs(&cur, reg, 0, 3, 2);
    in.unreachable[1] = true;
    assert_int_equal(view_decide(&in, &next), VIEW_KEEP);
    view_set_in_sync(&cur.v, 0, 1, true);
    reg[0] = 0;
    assert_int_not_equal(view_decide(&in, &next), VIEW_PROPOSE);
}

/* 3 servers, 2 replicas, group 0 = {0, 1}. Server 1 dies: 0 serves group 0 alone, and 1 is
 * out of sync there. Then 0 dies: group 0 has no live member; 0 alone is in sync. */
static view_record backup_then_primary_died(void)
{
    view_record cur = full(3, 2, 4);
    int64_t reg[VIEW_MAX_SERVERS] = {100, 0, 102};
    view_record next, next2;
    view_inputs in = inputs(&cur, reg, 2, 3, 2); /* 2 takes group 1 over: it proposes */
    assert_int_equal(view_decide(&in, &next), VIEW_PROPOSE);
    assert_int_equal(next.v.primary[0], 0);
    assert_false(view_in_sync(&next.v, 0, 1));
    assert_true(view_in_sync(&next.v, 0, 0));
    assert_int_equal(next.v.primary[1], 2); /* group 1 = {1, 2} */
    reg[0] = 0;
    in = inputs(&next, reg, 2, 3, 2);
    assert_int_equal(view_decide(&in, &next2), VIEW_PROPOSE);
    assert_int_equal(next2.v.primary[0], -1);
    assert_true(view_in_sync(&next2.v, 0, 0)); /* kept: no in-sync member lives on */
    assert_false(view_in_sync(&next2.v, 0, 1));
    assert_int_equal(next2.v.primary[2], 2); /* group 2 = {2, 0} */
    assert_false(view_in_sync(&next2.v, 2, 0));
    return next2;
}

static void test_out_of_sync_member_never_serves(void **state)
{
    (void)state;
    view_record cur = backup_then_primary_died();
    /* Server 1 restarts and catches up on group 1 (primary 2): live, but group 0 stays
     * without a primary, since 1 missed what 0 acknowledged alone. */
    int64_t reg[VIEW_MAX_SERVERS] = {0, 111, 102};
    view_record next, next2;
    view_inputs in = inputs(&cur, reg, 1, 3, 2);
    in.caught_up[1] = true;
    assert_int_equal(view_decide(&in, &next), VIEW_PROPOSE);
    assert_int_equal(next.v.live[1], 1);
    assert_int_equal(next.v.primary[0], -1);
    assert_true(view_in_sync(&next.v, 1, 1));
    assert_false(view_in_sync(&next.v, 0, 1));
    /* Nobody else changes that. */
    in = inputs(&next, reg, 2, 3, 2);
    assert_int_equal(view_decide(&in, &next2), VIEW_KEEP);
    /* Server 0 comes back with its copy: it serves group 0 again once caught up on group 2. */
    reg[0] = 120;
    in = inputs(&next, reg, 0, 3, 2);
    assert_int_equal(view_decide(&in, &next2), VIEW_KEEP);
    in.caught_up[2] = true;
    assert_int_equal(view_decide(&in, &next2), VIEW_PROPOSE);
    assert_int_equal(next2.v.primary[0], 0);
    assert_true(view_in_sync(&next2.v, 2, 0));
    assert_false(view_in_sync(&next2.v, 0, 1));
    /* Server 1, live, copies group 0 from 0 and is in sync there once caught up. */
    view_record next3;
    in = inputs(&next2, reg, 1, 3, 2);
    assert_int_equal(view_decide(&in, &next3), VIEW_KEEP);
    in.caught_up[0] = true;
    assert_int_equal(view_decide(&in, &next3), VIEW_PROPOSE);
    assert_true(view_in_sync(&next3.v, 0, 1));
    assert_int_equal(next3.v.primary[0], 0);
}

/* An operator forces a waiting group onto a live out-of-sync member (psctl force-primary): it
 * serves the group and is its only member in sync; the in-sync member that comes back later is
 * behind and copies. An override for an earlier view, a member that is not live, a server that
 * is no member and a group that has a primary change nothing. */
static void test_forced_primary(void **state)
{
    (void)state;
    view_record cur = backup_then_primary_died();
    int64_t reg[VIEW_MAX_SERVERS] = {0, 111, 102};
    view_record next, next2, next3;
    view_inputs in = inputs(&cur, reg, 1, 3, 2);
    in.caught_up[1] = true;
    assert_int_equal(view_decide(&in, &next), VIEW_PROPOSE);
    assert_int_equal(next.v.primary[0], -1);
    /* Forced onto server 1 (live, member of group 0 = {0, 1}): any live server proposes it. */
    in = inputs(&next, reg, 2, 3, 2);
    in.forced[0] = true;
    in.forced_to[0] = 1;
    assert_int_equal(view_decide(&in, &next2), VIEW_FALLBACK);
    in.self = 1;
    assert_int_equal(view_decide(&in, &next2), VIEW_PROPOSE);
    assert_int_equal(next2.v.primary[0], 1);
    assert_true(view_in_sync(&next2.v, 0, 1));
    assert_false(view_in_sync(&next2.v, 0, 0));
    assert_int_equal(next2.v.primary[1], next.v.primary[1]);
    assert_int_equal(next2.v.primary[2], next.v.primary[2]);
    /* Server 0 comes back: group 0 stays with 1; 0 is in sync there once it copied. */
    reg[0] = 130;
    in = inputs(&next2, reg, 0, 3, 2);
    in.caught_up[2] = true;
    in.caught_up[0] = true;
    assert_int_equal(view_decide(&in, &next3), VIEW_PROPOSE);
    assert_int_equal(next3.v.primary[0], 1);
    assert_true(view_in_sync(&next3.v, 0, 0));
    /* Nothing forced: a server that is no member (2 in group 0), one not live, a group with a
     * primary. */
    in = inputs(&next, reg, 1, 3, 2);
    reg[0] = 0;
    in.forced[0] = true;
    in.forced_to[0] = 2;
    assert_int_equal(view_decide(&in, &next2), VIEW_KEEP);
    in.forced_to[0] = 0;
    assert_int_equal(view_decide(&in, &next2), VIEW_KEEP);
    in.forced[0] = false;
    in.forced[1] = true;
    in.forced_to[1] = 1;
    assert_int_equal(view_decide(&in, &next2), VIEW_KEEP);
    assert_int_equal(next2.v.primary[1], 2);
}

static void test_rejoin_not_with_a_primary_move(void **state)
{
    (void)state;
    /* 3 servers, 3 replicas: every group is {0, 1, 2}. Server 1 rejoins, caught up on every
     * group (group 0 copied from server 0), while server 0 dies: the view that moves group 0
     * to server 2 does not add server 1 (its copy of group 0 came from 0, and 2 counts it from
     * its own commit point); it copies group 0 from 2 and is added in a later view. */
    view_record cur = full(3, 3, 6);
    cur.v.live[1] = 0;
    cur.lease[1] = 0;
    cur.v.primary[1] = 2;
    for (uint32_t g = 0; g < 3; g++)
        view_set_in_sync(&cur.v, g, 1, false);
    int64_t reg[VIEW_MAX_SERVERS] = {0, 555, 102};
    view_record next;
    view_inputs in = inputs(&cur, reg, 1, 3, 3);
    in.caught_up[0] = in.caught_up[1] = in.caught_up[2] = true;
    assert_int_equal(view_decide(&in, &next), VIEW_FALLBACK); /* server 2 proposes the move */
    assert_int_equal(next.v.live[1], 0);
    assert_int_equal(next.v.primary[0], 2);
    view_record cur2 = next, next2;
    in = inputs(&cur2, reg, 1, 3, 3);
    in.caught_up[1] = in.caught_up[2] = true; /* group 0's mark cleared: copying it again */
    assert_int_equal(view_decide(&in, &next2), VIEW_KEEP);
    in.caught_up[0] = true;
    assert_int_equal(view_decide(&in, &next2), VIEW_PROPOSE);
    assert_int_equal(next2.v.live[1], 1);
    for (uint32_t g = 0; g < 3; g++)
        assert_true(view_in_sync(&next2.v, g, 1));
}

static void test_in_sync_member_without_its_copy_waits(void **state)
{
    (void)state;
    /* Both members of group 0 die in one view: both stay in sync. */
    view_record cur = full(3, 2, 4);
    int64_t reg[VIEW_MAX_SERVERS] = {0, 0, 102};
    view_record next, next2;
    view_inputs in = inputs(&cur, reg, 2, 3, 2);
    assert_int_equal(view_decide(&in, &next), VIEW_PROPOSE);
    assert_int_equal(next.v.primary[0], -1);
    assert_true(view_in_sync(&next.v, 0, 0) && view_in_sync(&next.v, 0, 1));
    /* Server 1 restarts without a copy of group 0 (it only backed it up): it waits. */
    reg[1] = 111;
    in = inputs(&next, reg, 1, 3, 2);
    in.caught_up[1] = true;
    in.lacks[0] = true;
    assert_int_equal(view_decide(&in, &next2), VIEW_PROPOSE);
    assert_int_equal(next2.v.live[1], 1);
    assert_int_equal(next2.v.primary[0], -1);
    /* With its copy (restored, or kept while it lost only its lease) it serves it. */
    in.lacks[0] = false;
    assert_int_equal(view_decide(&in, &next2), VIEW_PROPOSE);
    assert_int_equal(next2.v.primary[0], 1);
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

/* ---- random schedules against a model of the servers ---- */

/* A model cluster: each server process holds, per group, how many of the group's updates it
 * applied (updates are numbered in order, so one count says which), what its checkpoint holds,
 * and its agent's marks. Updates are applied by the primary of the installed view and by the
 * in-sync live backups it waits for, and acknowledged once all of them applied it. */
#define MODEL_N 4
typedef struct model {
    uint32_t n, r;
    uint64_t rng, seed;
    bool trace;
    bool alive[MODEL_N];
    int64_t lease[MODEL_N], next_lease;
    uint64_t have[MODEL_N][MODEL_N], ck[MODEL_N][MODEL_N], ck_epoch[MODEL_N][MODEL_N];
    bool has_ck[MODEL_N][MODEL_N];
    bool caught_up[MODEL_N][MODEL_N], lacks[MODEL_N][MODEL_N];
    uint64_t acked[MODEL_N];
    bool cut[MODEL_N]; /* no other server reaches it, nor it them; etcd does */
    bool have_view;
    view_record cur;
} model;

static uint32_t model_rand(model *m, uint32_t below)
{
    m->rng = m->rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)((m->rng >> 33) % below);
}

/* Server s's process is the one the installed view names live. */
static bool model_in_view(const model *m, uint32_t s)
{
    return m->have_view && m->alive[s] && m->cur.v.live[s] && m->cur.lease[s] == m->lease[s];
}

/* Servers a and b reach each other (a == b always). */
static bool model_reach(const model *m, uint32_t a, uint32_t b)
{
    return a == b || (!m->cut[a] && !m->cut[b]);
}

static void model_write(model *m, uint32_t g)
{
    if (!m->have_view || m->cur.v.primary[g] < 0)
        return;
    uint32_t p = (uint32_t)m->cur.v.primary[g];
    if (!model_in_view(m, p))
        return;
    uint64_t x = m->have[p][g] + 1;
    bool all = true;
    for (uint32_t k = 0; k < m->r; k++) {
        uint32_t b = view_member(&m->cur.v, g, k);
        bool in_sync = m->cur.v.live[b] && view_in_sync(&m->cur.v, g, b);
        /* A rejoining backup is waited for once it caught up (repl_peer_counted). */
        bool catching = !in_sync && m->alive[b] && m->caught_up[b][g];
        bool waited = b != p && (in_sync || catching);
        if (waited && ((in_sync && !model_in_view(m, b)) || !model_reach(m, p, b)))
            all = false; /* a backup of the view died or is cut off: the primary waits */
        if (!model_reach(m, p, b))
            continue;
        if (b == p || (waited && model_in_view(m, b)) || (m->alive[b] && m->caught_up[b][g]))
            m->have[b][g] = x;
    }
    if (all)
        m->acked[g] = x;
}

static void model_decide(model *m, uint32_t s)
{
    int64_t reg[VIEW_MAX_SERVERS] = {0};
    bool every = true;
    for (uint32_t i = 0; i < m->n; i++) {
        reg[i] = m->alive[i] ? m->lease[i] : 0;
        every = every && m->alive[i];
    }
    view_copy copies[MODEL_N * MODEL_N];
    size_t nc = 0;
    for (uint32_t i = 0; i < m->n; i++)
        for (uint32_t g = 0; g < m->n; g++)
            if (m->alive[i] && m->has_ck[i][g])
                copies[nc++] = (view_copy){i, g, m->ck_epoch[i][g], m->ck[i][g]};
    view_inputs in = inputs(m->have_view ? &m->cur : NULL, reg, s, m->n, m->r);
    memcpy(in.caught_up, m->caught_up[s], sizeof(m->caught_up[s]));
    memcpy(in.lacks, m->lacks[s], sizeof(m->lacks[s]));
    for (uint32_t i = 0; i < m->n; i++)
        in.unreachable[i] = !model_reach(m, s, i);
    in.grace_over = every;
    in.known_epoch = m->have_view ? m->cur.v.epoch : 0;
    in.copies = copies;
    in.ncopies = nc;
    view_record next;
    view_change ch = view_decide(&in, &next);
    if (ch == VIEW_KEEP || (ch == VIEW_FALLBACK && model_rand(m, 3) != 0))
        return;
    view before = m->cur.v;
    bool had_view = m->have_view;
    bool served[MODEL_N]; /* the process the view left names live */
    for (uint32_t i = 0; i < m->n; i++)
        served[i] = model_in_view(m, i);
    m->cur = next;
    m->have_view = true;
    /* A live server taken out of sync in a group copies it again: its agent voids its mark
     * when it adopts the view (view_agent.c, adopt). */
    for (uint32_t g = 0; had_view && g < m->n; g++)
        for (uint32_t i = 0; i < m->n; i++)
            if (view_in_sync(&before, g, i) && before.live[i] && !view_in_sync(&next.v, g, i))
                m->caught_up[i][g] = false;
    /* A server copying a group whose primary moved copies it again (its mark is cleared). */
    for (uint32_t g = 0; g < m->n; g++)
        for (uint32_t i = 0; i < m->n && next.v.primary[g] != before.primary[g]; i++) {
            if (!(model_in_view(m, i) && view_in_sync(&next.v, g, i)))
                m->caught_up[i][g] = false;
            /* A server that served g and lives on: its checkpoints of g are removed. */
            if (i != g && served[i] && before.primary[g] == (int32_t)i)
                m->has_ck[i][g] = false;
        }
    /* So are those of a live backup: its copy moves on in memory only. */
    for (uint32_t g = 0; g < m->n; g++)
        for (uint32_t i = 0; i < m->n; i++)
            if (i != g && model_in_view(m, i) && next.v.primary[g] != (int32_t)i &&
                view_is_member(&next.v, g, i))
                m->has_ck[i][g] = false;
    if (m->trace) {
        printf("view %llu by %u:", (unsigned long long)next.v.epoch, s);
        for (uint32_t g = 0; g < m->n; g++)
            printf(" g%u p%d live%d behind%llx", g, next.v.primary[g], next.v.live[g],
                   (unsigned long long)next.v.behind[g]);
        printf("\n");
        for (uint32_t i = 0; i < m->n; i++) {
            printf("  s%u alive %d lease %lld/%lld:", i, m->alive[i], (long long)m->lease[i],
                   (long long)next.lease[i]);
            for (uint32_t g = 0; g < m->n; g++)
                printf(" g%u have %llu ck %d/%llu", g, (unsigned long long)m->have[i][g],
                       m->has_ck[i][g], (unsigned long long)m->ck[i][g]);
            printf("\n");
        }
    }
    for (uint32_t g = 0; g < m->n; g++) {
        int32_t p = next.v.primary[g];
        /* The invariant: a primary holds every acknowledged update of its group. */
        if (p >= 0 && model_in_view(m, (uint32_t)p) && m->have[p][g] < m->acked[g])
            fail_msg("seed %llu: group %u's primary %d holds %llu of %llu acknowledged updates",
                     (unsigned long long)m->seed, g, p, (unsigned long long)m->have[p][g],
                     (unsigned long long)m->acked[g]);
        for (uint32_t i = 0; i < m->n; i++)
            if (model_in_view(m, i) && view_is_member(&next.v, g, i) && view_in_sync(&next.v, g, i))
                m->lacks[i][g] = false;
    }
}

static void model_step(model *m)
{
    uint32_t s = model_rand(m, m->n), g = model_rand(m, m->n), e = model_rand(m, 10);
    if (m->trace && (e <= 4 || e >= 8))
        printf("%s s%u g%u\n",
               (const char *[]){"kill", "restart", "copy", "write", "write", "", "", "", "cut",
                                "heal"}[e],
               s, g);
    switch (e) {
    case 8: /* cut off from the other servers, not from etcd (keeps its lease) */
        m->cut[s] = true;
        break;
    case 9:
        m->cut[s] = false;
        break;
    case 0: /* kill -9 */
        m->alive[s] = false;
        break;
    case 1: /* restart: memory lost, checkpoints restored */
        if (m->alive[s])
            break;
        m->alive[s] = true;
        m->lease[s] = m->next_lease++;
        for (uint32_t h = 0; h < m->n; h++) {
            m->have[s][h] = m->has_ck[s][h] ? m->ck[s][h] : 0;
            m->caught_up[s][h] = false;
            m->lacks[s][h] = h != s && !m->has_ck[s][h];
        }
        break;
    case 2: /* a copy from the primary, streamed up to its end */
        if (m->alive[s] && m->have_view && view_is_member(&m->cur.v, g, s) &&
            m->cur.v.primary[g] >= 0 && m->cur.v.primary[g] != (int32_t)s &&
            model_in_view(m, (uint32_t)m->cur.v.primary[g]) &&
            model_reach(m, s, (uint32_t)m->cur.v.primary[g]) &&
            (!model_in_view(m, s) || !view_in_sync(&m->cur.v, g, s))) {
            m->have[s][g] = m->have[m->cur.v.primary[g]][g];
            m->caught_up[s][g] = true;
            if (s != g)
                m->has_ck[s][g] = false; /* its checkpoints of g no longer hold its copy */
        }
        break;
    case 3:
    case 4:
        model_write(m, g);
        break;
    default:
        if (m->alive[s])
            model_decide(m, s);
        break;
    }
}

static void test_random_schedules(void **state)
{
    (void)state;
    /* PSD_VIEW_SEED=n runs seed n alone and prints its events. */
    const char *one = getenv("PSD_VIEW_SEED");
    uint64_t first = one ? strtoull(one, NULL, 10) : 1, last = one ? first : 20000;
    for (uint64_t seed = first; seed <= last; seed++) {
        model m;
        memset(&m, 0, sizeof(m));
        m.rng = m.seed = seed;
        m.trace = one != NULL;
        m.n = 3 + (uint32_t)(seed % 2);
        m.r = 2 + (uint32_t)(seed / 2 % 2);
        m.next_lease = 100;
        for (uint32_t i = 0; i < m.n; i++) {
            m.alive[i] = true;
            m.lease[i] = m.next_lease++;
        }
        for (int step = 0; step < 400; step++) {
            model_step(&m);
            /* Checkpoints as if their interval were 0: every server's own group and the
             * groups it serves (the model checks the view, not the checkpoint interval's
             * promise). */
            for (uint32_t i = 0; i < m.n; i++)
                for (uint32_t g = 0; g < m.n; g++)
                    if (m.alive[i] &&
                        (i == g || (model_in_view(&m, i) && m.cur.v.primary[g] == (int32_t)i))) {
                        m.ck[i][g] = m.have[i][g];
                        m.ck_epoch[i][g] = m.cur.v.epoch;
                        m.has_ck[i][g] = true;
                    }
        }
    }
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
        cmocka_unit_test(test_unreachable_backup_out_of_sync),
        cmocka_unit_test(test_group_without_members),
        cmocka_unit_test(test_out_of_sync_member_never_serves),
        cmocka_unit_test(test_forced_primary),
        cmocka_unit_test(test_in_sync_member_without_its_copy_waits),
        cmocka_unit_test(test_rejoin_not_with_a_primary_move),
        cmocka_unit_test(test_whole_cluster_restart),
        cmocka_unit_test(test_restart_prefers_newest_copy),
        cmocka_unit_test(test_epochs_never_go_back),
        cmocka_unit_test(test_random_schedules),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
