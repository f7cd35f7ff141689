/* options.h - the one table of settings and the values of one program.
 *
 * Every setting of every program is a row of options_table.def. That row
 * drives the command-line flag (--name), the environment variable, the key in
 * the JSON config file, the --help text and the README table, and gives the
 * setting its id (OPT_THREADS, of a type that only the matching getter takes:
 * see "Typed getters" below). Sources are applied in precedence order
 *     defaults < config file < environment < command line
 * and this module is the only place in the project that calls getenv() for
 * our own settings.
 *
 * Value syntax by type:
 *   OPT_INT     decimal integer, e.g. "42", "-1"
 *   OPT_DOUBLE  finite decimal number, e.g. "0.5", "1e-3"
 *   OPT_BOOL    true|false|yes|no|on|off|1|0 (case-insensitive)
 *   OPT_STRING  any text
 *   OPT_SIZE    byte count with optional binary suffix K, M, G or T (also
 *               KiB/KB...; 1K = 1024), e.g. "64M"; no fractions
 *   OPT_ENUM    one of the row's choices "a|b|c" (case-insensitive)
 *   OPT_LIST    texts: each --name VALUE on the command line adds one (the
 *               value is taken as is, even when it starts with "--"); the
 *               environment gives one, a config file a string or an array of
 *               strings. The command line replaces what file and environment
 *               gave. The default is the empty list.
 * Numbers may have surrounding white space; bounds (min, max) are inclusive.
 *
 * An options object is not thread-safe for writing; once loaded, concurrent
 * getters are safe.
 */
#ifndef PS_COMMON_OPTIONS_H
#define PS_COMMON_OPTIONS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef enum {
    OPT_INT,
    OPT_DOUBLE,
    OPT_BOOL,
    OPT_STRING,
    OPT_SIZE,
    OPT_ENUM,
    OPT_LIST
} option_type;

/* Which programs accept an option (bit mask in option_def.scope). */
enum {
    OPT_SCOPE_SERVER = 1u,    /* ps-server */
    OPT_SCOPE_WORKER = 2u,    /* ps-worker */
    OPT_SCOPE_CLIENT = 4u,    /* libpsclient configuration */
    OPT_SCOPE_TOOL = 8u,      /* ps-bench */
    OPT_SCOPE_LAUNCHER = 16u, /* ps-local */
};
#define OPT_SCOPE_ALL                                                                              \
    (OPT_SCOPE_SERVER | OPT_SCOPE_WORKER | OPT_SCOPE_CLIENT | OPT_SCOPE_TOOL | OPT_SCOPE_LAUNCHER)

/* One row of the settings table. */
typedef struct option_def {
    const char *name;    /* flag name without dashes, e.g. "max-message-bytes" */
    option_type type;    /* how values are parsed */
    unsigned scope;      /* OPT_SCOPE_* bits: which programs accept it */
    const char *defval;  /* default as text ("" allowed for strings; "" for lists) */
    double min, max;     /* inclusive bounds for INT/DOUBLE/SIZE (both 0: unbounded) */
    const char *choices; /* OPT_ENUM: "a|b|c", else NULL */
    const char *env;     /* env variable; NULL = "PS_" + upper(name), '-' -> '_' */
    const char *help;    /* one sentence for --help and the README */
} option_def;

/* ---- ids ----
 * Each row of options_table.def has an id constant OPT_<ID> whose type says
 * which getter reads it: opt_int_id (INT and SIZE), opt_double_id, opt_bool_id,
 * opt_str_id (STRING), opt_enum_id, opt_list_id. The types are distinct
 * structs, so a misspelt id does not compile (undeclared identifier) and
 * neither does an id passed to the getter of another type (incompatible
 * argument). `row` is the option's index in options_table. */
typedef struct opt_int_id {
    unsigned short row;
} opt_int_id;
typedef struct opt_double_id {
    unsigned short row;
} opt_double_id;
typedef struct opt_bool_id {
    unsigned short row;
} opt_bool_id;
typedef struct opt_str_id {
    unsigned short row;
} opt_str_id;
typedef struct opt_enum_id {
    unsigned short row;
} opt_enum_id;
typedef struct opt_list_id {
    unsigned short row;
} opt_list_id;

#include "options_table.h" /* enum option_row and the OPT_<ID> constants */

/* The project's settings (options_table.c), OPTION_ROW_COUNT rows. */
extern const option_def options_table[];
extern const size_t options_table_len;

/* Returned by options_load when --help or -h was given. */
#define OPTIONS_HELP 1

/* The values of every option for one program (opaque). */
typedef struct options options;

/* Checks a table for mistakes: empty names, names that are not [a-z0-9-], a
 * name used twice by programs that share a scope bit, an environment
 * variable used twice, a default that does not parse or is out of bounds (a
 * LIST's must be ""), an ENUM without choices, min > max, no scope bit.
 * Returns 0, or -1 with a message naming the row in err (cap errlen).
 * Non-blocking; the unit tests run it on options_table. */
int options_table_validate(const option_def *table, size_t n, char *err, size_t errlen);

/* Creates *out holding every option of options_table at its default; only
 * options whose scope intersects `scope` may later be set. Returns 0, or -1
 * on ENOMEM or a default that does not parse (a table bug, asserted in debug
 * builds); *out is then NULL. Free with options_destroy. */
int options_create(options **out, unsigned scope);

/* Same as options_create with another table, which must outlive *out. Used by
 * tests and by tools with a private table; such an object is read by name
 * (options_get_*), not with the typed getters. */
int options_create_with_table(options **out, const option_def *table, size_t n, unsigned scope);

/* Frees o and every string it owns; NULL is a no-op. */
void options_destroy(options *o);

/* Each loader below returns 0, or -1 and writes into err (cap errlen, always
 * NUL-terminated when errlen > 0) a message naming the source, the option and
 * what is wrong, e.g. `environment PS_THREADS: threads: "abc" is not an
 * integer`. On error the option concerned keeps its previous value; options
 * applied earlier by the same call stay applied. None of them blocks, except
 * options_load_file and options_load, which read a file. */

/* Sets one option from text, validating type, bounds and choices (a LIST
 * gets one more item). An unknown name, or a name outside o's scope, is an
 * error. Marks the option as set. When two rows share a name (programs with
 * disjoint scopes), the one in o's scope is meant. */
int options_set(options *o, const char *name, const char *value, char *err, size_t errlen);

/* Reads the environment variable of every in-scope option (getenv). Unset or
 * empty variables are skipped. Variables of out-of-scope options are ignored,
 * so one environment can serve every program. */
int options_load_env(options *o, char *err, size_t errlen);

/* Reads a JSON config file: one object {"name": value, ...}. Values may be
 * JSON strings, numbers or booleans; a STRING option also takes an object or
 * array, stored as its compact JSON text (so "cluster" can be written
 * inline); a LIST option takes a string or an array of strings. Unknown keys
 * are errors naming the key and the file; keys of known options outside o's
 * scope are ignored, so one file can serve every program. The key "config"
 * is refused. Files over 1 MiB are refused. */
int options_load_file(options *o, const char *path, char *err, size_t errlen);

/* Loads everything, in precedence order: defaults < config file < environment
 * < command line. argv[0] is skipped. Accepted arguments:
 *   --name=value, --name value     any option (the value may not start with
 *                                  "--", except for a LIST option)
 *   --name, --no-name              BOOL options (also --name=false)
 *   --config FILE                  the config file (else env PS_CONFIG, else
 *                                  the value already in o)
 *   --help, -h                     return OPTIONS_HELP, load nothing, no error
 *   --                             every later argument is positional
 * Any other argument not starting with '-' (and "-" itself) is positional:
 * positional[] (caller-provided, argc entries) receives pointers into argv and
 * *npositional their count. If positional or npositional is NULL the program
 * takes none and a positional argument is an error. Returns 0, OPTIONS_HELP,
 * or -1 with a message in err (unknown options suggest the closest name). */
int options_load(options *o, int argc, char **argv, const char **positional, int *npositional,
                 char *err, size_t errlen);

/* Flags of options_load_ex. */
enum {
    /* The first argument that is not an option of this program (a positional
     * argument, "-x", an unknown or out-of-scope --name) ends the options: it
     * and every later argument are positional, e.g. to pass them on to another
     * program. A "--" ending the options is dropped. */
    OPTIONS_LOAD_REST_POSITIONAL = 1u,
};

/* options_load with flags (OPTIONS_LOAD_*); options_load is flags 0. */
int options_load_ex(options *o, int argc, char **argv, unsigned flags, const char **positional,
                    int *npositional, char *err, size_t errlen);

/* ---- Typed getters (options_table only) ----
 * The id's type is checked at compile time. Options outside o's scope return
 * their default. opt_int serves INT and SIZE; opt_enum returns the canonical
 * choice (as spelt in the table); opt_list stores the items in *items (may be
 * NULL) and returns their count. Returned strings are owned by o and valid
 * until the option is set again or o is destroyed. Using them on an object
 * made by options_create_with_table is a programming error (asserts in debug
 * builds, returns 0 / false / "" in release builds). */
int64_t opt_int(const options *o, opt_int_id id);
double opt_double(const options *o, opt_double_id id);
bool opt_bool(const options *o, opt_bool_id id);
const char *opt_str(const options *o, opt_str_id id);
const char *opt_enum(const options *o, opt_enum_id id);
size_t opt_list(const options *o, opt_list_id id, const char *const **items);

/* Row of an id of any type (a compile error for anything else). */
#define OPT_ROW(id)                                                                                \
    ((unsigned)_Generic((id), opt_int_id : 0, opt_double_id : 0, opt_bool_id : 0, opt_str_id : 0,  \
                        opt_enum_id : 0, opt_list_id : 0) +                                        \
     (unsigned)(id).row)

/* True if a source other than the default set the option (any id type). */
#define opt_is_set(o, id) options_is_set_row((o), OPT_ROW(id))
/* The option's value as text, canonical for its type (any id type): what
 * ps_config_set takes back. */
#define opt_text(o, id) options_text_row((o), OPT_ROW(id))
/* The option's row in options_table (any id type). */
#define opt_def(id) (&options_table[OPT_ROW(id)])

bool options_is_set_row(const options *o, unsigned row);
const char *options_text_row(const options *o, unsigned row);

/* ---- By-name getters ----
 * For tables other than options_table (tests) and names only known at run
 * time. `name` must be a row of o's table of a matching type; anything else
 * is a programming error: it asserts in debug builds and returns 0 / false /
 * "" in release builds. Options outside o's scope return their default.
 * options_get_int serves INT and SIZE; options_get_double serves DOUBLE (and
 * INT/SIZE, converted); options_get_str serves STRING and ENUM (the canonical
 * choice), and returns the value's text for the other types. */
int64_t options_get_int(const options *o, const char *name);
double options_get_double(const options *o, const char *name);
bool options_get_bool(const options *o, const char *name);
const char *options_get_str(const options *o, const char *name);

/* True if a source other than the default (options_set, file, environment,
 * command line) set the option, even to its default value. False for unknown
 * names. */
bool options_is_set(const options *o, const char *name);

/* Writes the --help text for the options of `scope` to f: "Usage: PROGRAM
 * USAGE_LINE", then the options grouped (general, server, client, worker,
 * launcher, tool) and aligned, each as "--name=TYPE  help [default: X]
 * (env: PS_X)". usage_line NULL means "[OPTIONS]". */
void options_print_help(FILE *f, const char *program, const char *usage_line, unsigned scope);

/* Writes a markdown table (flag | env | type | default | help) of the options
 * whose scope intersects `scope` but not `exclude`, for the README. */
void options_print_markdown(FILE *f, unsigned scope, unsigned exclude);

#endif /* PS_COMMON_OPTIONS_H */
