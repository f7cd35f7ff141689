/* A process's memory budget (budget.h). */
#include "budget.h"

#include <stddef.h>

void budget_set_max(mem_budget *b, uint64_t max)
{
    atomic_store(&b->max, max);
}

uint64_t budget_max(mem_budget *b)
{
    return b ? atomic_load(&b->max) : 0;
}

uint64_t budget_held(mem_budget *b)
{
    return b ? (uint64_t)atomic_load(&b->held) : 0;
}

bool budget_take(mem_budget *b, uint64_t bytes)
{
    if (b == NULL)
        return true;
    uint64_t max = atomic_load(&b->max);
    uint_fast64_t held = atomic_load(&b->held);
    do {
        if (max && (bytes > max || held > max - bytes))
            return false;
    } while (!atomic_compare_exchange_weak(&b->held, &held, held + bytes));
    return true;
}

void budget_force(mem_budget *b, uint64_t bytes)
{
    if (b)
        atomic_fetch_add(&b->held, bytes);
}

void budget_give(mem_budget *b, uint64_t bytes)
{
    if (b == NULL)
        return;
    uint_fast64_t held = atomic_load(&b->held);
    while (!atomic_compare_exchange_weak(&b->held, &held, held > bytes ? held - bytes : 0))
        ;
}
