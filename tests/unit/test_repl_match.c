/* repl_match_batch (server/repl_match.c): the rules, then random schedules of appends,
 * batches and failovers against a model of a primary and its backups, checking that nothing
 * committed is ever lost or replaced and that a primary counts only what a backup holds. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "repl_match.h"

static void test_rules(void **state)
{
    (void)state;
    const uint64_t e[4] = {3, 3, 5, 5}; /* lsns 10..13 */
    /* Nothing applied: any log starts with it. */
    assert_int_equal(repl_match_batch(0, 0, false, 0, 0, 1, 0, NULL, 0), REPL_MATCHED);
    /* Past the primary's log end: diverged, or (verified) a batch delivered late. */
    assert_int_equal(repl_match_batch(14, 5, false, 13, 13, 10, 4, e, 4), REPL_DIVERGED);
    assert_int_equal(repl_match_batch(14, 5, true, 13, 13, 10, 4, e, 4), REPL_UNCHECKED);
    /* Its last position in the batch: the epochs decide. */
    assert_int_equal(repl_match_batch(11, 3, false, 13, 9, 10, 4, e, 4), REPL_MATCHED);
    assert_int_equal(repl_match_batch(12, 3, true, 13, 9, 10, 4, e, 4), REPL_DIVERGED);
    /* Not in the batch: verified before, or within the commit point. */
    assert_int_equal(repl_match_batch(9, 3, true, 13, 5, 10, 4, e, 4), REPL_UNCHECKED);
    assert_int_equal(repl_match_batch(9, 3, false, 13, 9, 12, 2, e + 2, 2), REPL_MATCHED);
    assert_int_equal(repl_match_batch(9, 3, false, 13, 8, 12, 2, e + 2, 2), REPL_DIVERGED);
    /* Its last epoch unknown (restored without one): as if not in the batch. */
    assert_int_equal(repl_match_batch(11, 0, false, 13, 9, 10, 4, e, 4), REPL_DIVERGED);
    assert_int_equal(repl_match_batch(11, 0, true, 13, 9, 10, 4, e, 4), REPL_UNCHECKED);
    /* A sender without epochs: only the log end is checked. */
    assert_int_equal(repl_match_batch(11, 7, false, 13, 0, 10, 4, e, 0), REPL_UNCHECKED);
}

#define SRV 3
#define MAXLOG 512

typedef struct copy {
    uint64_t len, epoch[MAXLOG + 1], id[MAXLOG + 1];
    bool verified;
} copy;

typedef struct sim {
    uint64_t rng, seed;
    copy s[SRV];
    uint32_t primary;
    uint64_t epoch, committed, next_id;
    uint64_t acked[SRV];               /* the primary's view of each backup */
    uint64_t committed_id[MAXLOG + 1]; /* what was committed at each position */
} sim;

static uint32_t sim_rand(sim *m, uint32_t below)
{
    m->rng = m->rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)((m->rng >> 33) % below);
}

static void sim_check_committed(sim *m)
{
    const copy *p = &m->s[m->primary];
    for (uint64_t k = 1; k <= m->committed; k++)
        if (p->len < k || p->id[k] != m->committed_id[k])
            fail_msg("seed %llu: committed lsn %llu lost or replaced at the primary",
                     (unsigned long long)m->seed, (unsigned long long)k);
}

static void sim_commit(sim *m)
{
    uint64_t low = m->s[m->primary].len;
    for (uint32_t b = 0; b < SRV; b++)
        if (b != m->primary && m->acked[b] < low)
            low = m->acked[b];
    for (uint64_t k = m->committed + 1; k <= low; k++)
        m->committed_id[k] = m->s[m->primary].id[k];
    if (low > m->committed)
        m->committed = low;
}

static void sim_batch(sim *m, uint32_t b)
{
    copy *p = &m->s[m->primary], *c = &m->s[b];
    uint64_t first = m->acked[b] + 1;
    uint64_t most = p->len >= first ? p->len - first + 1 : 0;
    size_t n = most ? (size_t)sim_rand(m, (uint32_t)most + 1) : 0;
    repl_match r = repl_match_batch(c->len, c->len ? c->epoch[c->len] : 0, c->verified, p->len,
                                    m->committed, first, n, &p->epoch[first], n);
    if (r == REPL_DIVERGED) {
        *c = *p; /* a copy of the primary's group */
        c->verified = true;
        m->acked[b] = p->len;
        return;
    }
    if (r == REPL_MATCHED)
        c->verified = true;
    for (size_t i = 0; i < n; i++) {
        uint64_t lsn = first + i;
        if (lsn == c->len + 1) {
            c->len++;
            c->epoch[lsn] = p->epoch[lsn];
            c->id[lsn] = p->id[lsn];
        }
    }
    if (c->len <= p->len)
        m->acked[b] = c->len; /* its reply: applied up to there */
    /* What the primary counts is there, at the backup, as the primary logged it. */
    for (uint64_t k = 1; k <= m->acked[b]; k++)
        if (c->epoch[k] != p->epoch[k] || c->id[k] != p->id[k])
            fail_msg("seed %llu: backup %u counted at lsn %llu (of %llu) without the primary's "
                     "operation there",
                     (unsigned long long)m->seed, b, (unsigned long long)k,
                     (unsigned long long)m->acked[b]);
}

static void sim_failover(sim *m)
{
    /* Any server holding every committed operation may take over (the in-sync members). */
    uint32_t q = sim_rand(m, SRV);
    const copy *c = &m->s[q];
    if (c->len < m->committed)
        return;
    for (uint64_t k = 1; k <= m->committed; k++)
        if (c->id[k] != m->committed_id[k])
            return;
    m->primary = q;
    m->epoch++;
    for (uint32_t b = 0; b < SRV; b++) {
        m->acked[b] = m->committed; /* what every member had applied */
        m->s[b].verified = b == q;
    }
}

static void test_random_schedules(void **state)
{
    (void)state;
    const char *one = getenv("PSD_MATCH_SEED");
    uint64_t first = one ? strtoull(one, NULL, 10) : 1, last = one ? first : 5000;
    for (uint64_t seed = first; seed <= last; seed++) {
        sim *m = calloc(1, sizeof(*m));
        assert_non_null(m);
        m->rng = m->seed = seed;
        m->epoch = 1;
        for (uint32_t b = 0; b < SRV; b++)
            m->s[b].verified = true;
        for (int step = 0; step < 600; step++) {
            uint32_t e = sim_rand(m, 10);
            copy *p = &m->s[m->primary];
            if (e < 4 && p->len < MAXLOG) {
                p->len++;
                p->epoch[p->len] = m->epoch;
                p->id[p->len] = ++m->next_id;
            } else if (e < 9) {
                uint32_t b = sim_rand(m, SRV);
                if (b != m->primary)
                    sim_batch(m, b);
            } else {
                sim_failover(m);
            }
            sim_commit(m);
            sim_check_committed(m);
        }
        free(m);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rules),
        cmocka_unit_test(test_random_schedules),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
