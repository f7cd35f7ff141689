/* options_table.h - ids of the settings, generated from options_table.def.
 *
 * Included by options.h (which defines the id types); not on its own. For a
 * row OPTION(THREADS, INT, .name = "threads", ...) of options_table.def this
 * makes
 *     OPTION_ROW_THREADS   its index in options_table (enum option_row)
 *     OPT_THREADS          a constant of type opt_int_id, which only opt_int
 *                          takes (see options.h: "Typed getters")
 * The type of the id follows the row's type: INT and SIZE opt_int_id, DOUBLE
 * opt_double_id, BOOL opt_bool_id, STRING opt_str_id, ENUM opt_enum_id, LIST
 * opt_list_id. */
#ifndef PS_COMMON_OPTIONS_TABLE_H
#define PS_COMMON_OPTIONS_TABLE_H

#define OPTION(ID, TYPE, ...) OPTION_ROW_##ID,
enum option_row {
#include "options_table.def"
    OPTION_ROW_COUNT
};
#undef OPTION

#define OPTION_ID_TYPE_INT opt_int_id
#define OPTION_ID_TYPE_SIZE opt_int_id
#define OPTION_ID_TYPE_DOUBLE opt_double_id
#define OPTION_ID_TYPE_BOOL opt_bool_id
#define OPTION_ID_TYPE_STRING opt_str_id
#define OPTION_ID_TYPE_ENUM opt_enum_id
#define OPTION_ID_TYPE_LIST opt_list_id

#define OPTION(ID, TYPE, ...) static const OPTION_ID_TYPE_##TYPE OPT_##ID = {OPTION_ROW_##ID};
#include "options_table.def"
#undef OPTION

#endif /* PS_COMMON_OPTIONS_TABLE_H */
