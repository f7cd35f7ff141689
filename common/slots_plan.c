/* slots_plan.c - the slot moves that even out a slot map (slots_plan.h). */
#include "slots_plan.h"

#include <stdlib.h>
#include <string.h>

#include "util.h"

int slots_plan(const slots_record *r, const bool *member, slot_move **out, size_t *n, char *err,
               size_t errlen)
{
    *out = NULL;
    *n = 0;
    uint32_t ns = r->nservers, m = 0;
    for (uint32_t i = 0; i < ns; i++)
        m += member[i];
    if (m == 0)
        return errf(err, errlen, "no server would hold the slots"), -1;
    uint32_t *have = calloc(ns, sizeof(*have));
    uint32_t *want = calloc(ns, sizeof(*want));
    uint32_t *order = calloc(ns, sizeof(*order));
    slot_move *mv = NULL;
    int rc = -1;
    if (have == NULL || want == NULL || order == NULL)
        goto oom;
    for (uint32_t s = 0; s < r->nslots; s++)
        have[r->owner[s]]++;
    /* Members by slots owned, most first (lower index first among equals): the first
     * S mod m of them keep one slot above S / m. */
    uint32_t k = 0;
    for (uint32_t i = 0; i < ns; i++)
        if (member[i])
            order[k++] = i;
    for (uint32_t a = 1; a < m; a++)
        for (uint32_t b = a; b > 0 && have[order[b]] > have[order[b - 1]]; b--) {
            uint32_t t = order[b];
            order[b] = order[b - 1];
            order[b - 1] = t;
        }
    for (uint32_t j = 0; j < m; j++)
        want[order[j]] = r->nslots / m + (j < r->nslots % m ? 1 : 0);
    size_t total = 0;
    for (uint32_t i = 0; i < ns; i++)
        if (have[i] > want[i])
            total += have[i] - want[i];
    if (total > 0 && (mv = calloc(total, sizeof(*mv))) == NULL)
        goto oom;
    /* Givers give their slots in slot order; receivers take turns. */
    uint32_t next = 0;
    size_t got = 0;
    for (uint32_t s = 0; s < r->nslots && got < total; s++) {
        uint32_t from = r->owner[s];
        if (have[from] <= want[from])
            continue;
        while (have[next] >= want[next])
            next = (next + 1) % ns;
        mv[got++] = (slot_move){.slot = s, .from = from, .to = next};
        have[from]--;
        have[next]++;
        next = (next + 1) % ns;
    }
    *out = mv;
    *n = got;
    mv = NULL;
    rc = 0;
    goto done;
oom:
    errf(err, errlen, "out of memory");
done:
    free(mv);
    free(have);
    free(want);
    free(order);
    return rc;
}

bool slots_apply(slots_record *r, const slot_move *moves, size_t n)
{
    /* Checked on a copy, move by move, so that a slot listed twice is refused too. */
    uint32_t *owner = malloc((size_t)r->nslots * sizeof(*owner));
    if (owner == NULL)
        return false;
    memcpy(owner, r->owner, (size_t)r->nslots * sizeof(*owner));
    for (size_t i = 0; i < n; i++) {
        if (moves[i].slot >= r->nslots || owner[moves[i].slot] != moves[i].from ||
            moves[i].to >= r->nservers) {
            free(owner);
            return false;
        }
        owner[moves[i].slot] = moves[i].to;
    }
    free(r->owner);
    r->owner = owner;
    r->version++;
    return true;
}
