/* A process's memory budget (max-server-bytes): every byte its variables and sparse tables
 * hold counts against one limit, whichever server state holds it (the server's own, or a copy
 * of a replica group it backs up). */
#ifndef PSD_SERVER_BUDGET_H
#define PSD_SERVER_BUDGET_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct mem_budget {
    _Atomic uint64_t max; /* the limit in bytes; 0: none */
    atomic_uint_fast64_t held;
    /* A replicated group's copy: its sparse tables count rows, not allocations (table.h,
     * table_budget.logical), so that every copy decides the same; set before any table. */
    bool tables_logical;
} mem_budget;

/* Said by a refusal for max-server-bytes: how to make room (docs/operations.md, "Adding and
 * removing servers"). */
#define BUDGET_FULL_HINT                                                                           \
    "this server is full: add a server (start one with ps-server --join, then run psctl "          \
    "add-server HOST:PORT) or raise max-server-bytes"

/* Sets the limit (0: none); what is held stays. */
void budget_set_max(mem_budget *b, uint64_t max);
uint64_t budget_max(mem_budget *b);
uint64_t budget_held(mem_budget *b);
/* Takes bytes if the limit allows them: true, or false with nothing taken. NULL b: true. */
bool budget_take(mem_budget *b, uint64_t bytes);
/* Takes bytes whatever the limit (what a restore brings back, or a row already made). */
void budget_force(mem_budget *b, uint64_t bytes);
/* Gives bytes back. NULL b: nothing. */
void budget_give(mem_budget *b, uint64_t bytes);

#endif
