/* options_table.c - the rows of options_table, from options_table.def. */
#include "options.h"
#include "optimizers.h"

#define S OPT_SCOPE_SERVER
#define W OPT_SCOPE_WORKER
#define C OPT_SCOPE_CLIENT
#define T OPT_SCOPE_TOOL
#define L OPT_SCOPE_LAUNCHER

#define KiB 1024.0
#define MiB (1024.0 * KiB)
#define GiB (1024.0 * MiB)
#define TiB (1024.0 * GiB)

#define OPTION(ID, TYPE, ...) [OPTION_ROW_##ID] = {.type = OPT_##TYPE, __VA_ARGS__},
const option_def options_table[] = {
#include "options_table.def"
};
#undef OPTION

_Static_assert(sizeof options_table / sizeof options_table[0] == OPTION_ROW_COUNT,
               "options_table has one row per id");
_Static_assert(OPTION_ROW_COUNT <= 65535, "a row must fit an id's unsigned short");

const size_t options_table_len = sizeof options_table / sizeof options_table[0];
