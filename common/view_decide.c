/* The failover decision (view_agent.h, "the decision"): the next view of a replicated cluster
 * from the installed one, the registered servers and their restored copies. A pure function
 * of its inputs, apart from the agent's threads so that tests drive it directly. */
#include "view_agent.h"

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

int32_t view_first_live(const view *v, uint32_t g)
{
    for (uint32_t k = 0; k < v->replicas; k++) {
        uint32_t s = view_member(v, g, k);
        if (v->live[s])
            return (int32_t)s;
    }
    return -1;
}

/* The first live in-sync member of group g in ring order, -1 when none (view.behind). */
static int32_t first_in_sync(const view *v, uint32_t g)
{
    for (uint32_t k = 0; k < v->replicas; k++) {
        uint32_t s = view_member(v, g, k);
        if (v->live[s] && view_in_sync(v, g, s))
            return (int32_t)s;
    }
    return -1;
}

bool view_waits(const view *v)
{
    for (uint32_t g = 0; g < v->num_servers; g++)
        if (v->primary[g] < 0)
            return true;
    return false;
}

bool view_from_scratch(const view_record *cur, const int64_t *reg, uint32_t n)
{
    for (uint32_t i = 0; cur && i < n; i++)
        if (cur->v.live[i] && reg[i] == cur->lease[i])
            return false;
    return true;
}

const view_copy *view_inputs_copy(const view_inputs *in, int32_t s, uint32_t g)
{
    for (size_t i = 0; s >= 0 && i < in->ncopies; i++)
        if (in->copies[i].server == (uint32_t)s && in->copies[i].group == g)
            return &in->copies[i];
    return NULL;
}

/* The primary of group g in a view made from scratch: among the live members that the view
 * left over (old, may be NULL) holds in sync, the one with the newest restored copy, the first
 * in ring order when none is newer; -1 when none of them lives, or none of the live ones holds a
 * copy while one that is away may (the group waits for it). An
 * out-of-sync member's copy is never taken, however new its epoch: it may miss what the in-sync
 * ones acknowledged without it. */
static int32_t newest_live(const view_inputs *in, const view *old, const view *v, uint32_t g)
{
    int32_t p = -1;
    const view_copy *best = NULL;
    bool missing = false; /* an in-sync member is not live: it may hold the only copy */
    for (uint32_t k = 0; k < v->replicas; k++) {
        uint32_t s = view_member(v, g, k);
        if (old && !view_in_sync(old, g, s))
            continue;
        if (!v->live[s]) {
            missing = true;
            continue;
        }
        const view_copy *c = view_inputs_copy(in, (int32_t)s, g);
        if (p < 0 || (c && (best == NULL || view_copy_newer(c, best)))) {
            best = c;
            p = (int32_t)s;
        }
    }
    /* None of the live ones restored a copy while another one is away: wait for it. */
    return best == NULL && missing && old ? -1 : p;
}

view_change view_decide(const view_inputs *in, view_record *next)
{
    const view_record *cur = in->cur;
    uint32_t n = in->num_servers, self = in->self;
    memset(next, 0, sizeof(*next));
    if (cur && (cur->v.num_servers != n || cur->v.replicas != in->replicas))
        return VIEW_KEEP; /* another cluster's view: the caller says so */
    if (view_from_scratch(cur, in->reg, n)) {
        uint32_t registered = 0, lowest = n;
        for (uint32_t i = 0; i < n; i++)
            if (in->reg[i] != 0) {
                registered++;
                if (lowest == n)
                    lowest = i;
            }
        if (in->reg[self] == 0 || (registered < n && !in->grace_over))
            return VIEW_KEEP;
        uint64_t e = cur ? cur->v.epoch : 0;
        next->v.epoch = (e > in->known_epoch ? e : in->known_epoch) + 1;
        next->v.num_servers = n;
        next->v.replicas = in->replicas;
        for (uint32_t i = 0; i < n; i++)
            if (in->reg[i] != 0) {
                next->v.live[i] = 1;
                next->lease[i] = in->reg[i];
            }
        /* The in-sync sets of the view left over hold across a whole-cluster restart. */
        const view *old = cur && cur->v.epoch > 0 ? &cur->v : NULL;
        for (uint32_t g = 0; g < n; g++) {
            int32_t p = newest_live(in, old, &next->v, g);
            next->v.primary[g] = p;
            if (p < 0) {
                next->v.behind[g] = old ? old->behind[g] : 0;
                continue; /* waits for an in-sync member (any member without an old view) */
            }
            /* In sync: the live members whose copy is as new as the primary's; the others copy
             * from it first. */
            const view_copy *best = view_inputs_copy(in, p, g);
            for (uint32_t k = 0; k < in->replicas; k++) {
                uint32_t s = view_member(&next->v, g, k);
                const view_copy *c = view_inputs_copy(in, (int32_t)s, g);
                bool same = best == NULL ? c == NULL
                                         : c != NULL && !view_copy_newer(best, c) &&
                                               !view_copy_newer(c, best);
                view_set_in_sync(&next->v, g, s,
                                 next->v.live[s] && same && (!old || view_in_sync(old, g, s)));
            }
        }
        return lowest == self ? VIEW_PROPOSE : VIEW_FALLBACK;
    }
    *next = *cur;
    next->v.epoch = (cur->v.epoch > in->known_epoch ? cur->v.epoch : in->known_epoch) + 1;
    /* Epochs never go back: a view below one seen is installed again above it. */
    bool changed = cur->v.epoch < in->known_epoch, self_added = false;
    for (uint32_t i = 0; i < n; i++)
        if (cur->v.live[i] && in->reg[i] != cur->lease[i]) {
            next->v.live[i] = 0;
            next->lease[i] = 0;
            changed = true;
        }
    for (uint32_t g = 0; g < n; g++) {
        /* Members out of the view fall out of sync while an in-sync member lives on to
         * acknowledge updates without them; when none does, the set stays as it was: those
         * members hold everything acknowledged, and only one of them may serve the group. */
        if (first_in_sync(&next->v, g) >= 0)
            for (uint32_t k = 0; k < in->replicas; k++) {
                uint32_t s = view_member(&next->v, g, k);
                if (!next->v.live[s] && view_in_sync(&next->v, g, s)) {
                    view_set_in_sync(&next->v, g, s, false);
                    changed = true;
                }
            }
        int32_t p = next->v.primary[g];
        if (p < 0 || !next->v.live[p] || !view_in_sync(&next->v, g, (uint32_t)p))
            next->v.primary[g] = first_in_sync(&next->v, g);
    }
    /* A primary that cannot reach an in-sync member of its group while that member keeps its
     * lease (an asymmetric partition): the member falls out of sync, so that the primary
     * acknowledges without it and it never serves the group without copying it first. Only
     * the group's primary, live under its current lease, proposes it. */
    bool self_shrank = false;
    for (uint32_t g = 0; in->reg[self] != 0 && cur->v.live[self] && g < n; g++) {
        if (cur->v.primary[g] != (int32_t)self || next->v.primary[g] != (int32_t)self)
            continue;
        for (uint32_t k = 0; k < in->replicas; k++) {
            uint32_t s = view_member(&next->v, g, k);
            if (s != self && in->unreachable[s] && next->v.live[s] &&
                view_in_sync(&next->v, g, s)) {
                view_set_in_sync(&next->v, g, s, false);
                changed = self_shrank = true;
            }
        }
    }
    /* A group waiting without an in-sync member that an operator forced onto a live member:
     * that member serves it from its copy and is its only member in sync. */
    for (uint32_t g = 0; g < n; g++) {
        uint32_t s = in->forced_to[g];
        if (!in->forced[g] || next->v.primary[g] >= 0 || s >= n || !next->v.live[s])
            continue;
        bool member = false;
        for (uint32_t k = 0; k < in->replicas; k++)
            member = member || view_member(&next->v, g, k) == s;
        if (!member)
            continue;
        for (uint32_t k = 0; k < in->replicas; k++) {
            uint32_t m = view_member(&next->v, g, k);
            view_set_in_sync(&next->v, g, m, m == s);
        }
        next->v.primary[g] = (int32_t)s;
        changed = true;
    }
    /* A rejoining self: live once caught up on every group of it that has a primary, and then
     * in sync in those; the primary of a group that has none when it holds the group's newest
     * state (in sync, with a copy it kept or restored). */
    if (in->reg[self] != 0 && !cur->v.live[self]) {
        /* Not in a view that moves a primary of its groups: its copy came from the old one,
         * and the new one counts it from its own commit point (it copies again). */
        bool ready = true;
        for (uint32_t k = 0; k < in->replicas; k++) {
            uint32_t g = (self + n - k) % n;
            if (next->v.primary[g] >= 0 &&
                (!in->caught_up[g] || next->v.primary[g] != cur->v.primary[g]))
                ready = false;
        }
        if (ready) {
            next->v.live[self] = 1;
            next->lease[self] = in->reg[self];
            for (uint32_t k = 0; k < in->replicas; k++) {
                uint32_t g = (self + n - k) % n;
                if (next->v.primary[g] >= 0)
                    view_set_in_sync(&next->v, g, self, true);
                else if (in->lacks[g])
                    view_set_in_sync(&next->v, g, self, false); /* live, without the copy */
                else if (view_in_sync(&next->v, g, self))
                    next->v.primary[g] = (int32_t)self;
            }
            changed = self_added = true;
        }
    } else if (in->reg[self] != 0 && cur->v.live[self] && next->v.live[self]) {
        /* A live self out of sync in a group (it came back while the group had no primary):
         * in sync once its copy caught up with the primary's log. */
        for (uint32_t k = 0; k < in->replicas; k++) {
            uint32_t g = (self + n - k) % n;
            if (next->v.primary[g] >= 0 && next->v.primary[g] != (int32_t)self &&
                next->v.primary[g] == cur->v.primary[g] && !view_in_sync(&next->v, g, self) &&
                in->caught_up[g]) {
                view_set_in_sync(&next->v, g, self, true);
                changed = self_added = true;
            }
        }
    }
    int32_t designated = -1;
    for (uint32_t g = 0; g < n; g++)
        if (next->v.primary[g] != cur->v.primary[g]) {
            changed = true;
            if (designated < 0 && next->v.primary[g] >= 0)
                designated = next->v.primary[g];
        }
    if (!changed)
        return VIEW_KEEP;
    if (self_added || self_shrank || cur->v.epoch < in->known_epoch)
        return VIEW_PROPOSE;
    for (uint32_t i = 0; designated < 0 && i < n; i++)
        if (next->v.live[i])
            designated = (int32_t)i;
    return designated == (int32_t)self || designated < 0 ? VIEW_PROPOSE : VIEW_FALLBACK;
}
