/* options_internal.h - what the files of the options module share; private to
 * options.c (the object and its getters), options_value.c (parsing and
 * validating values, the table check), options_load.c (environment, config
 * file, command line) and options_doc.c (--help and markdown). */
#ifndef PS_COMMON_OPTIONS_INTERNAL_H
#define PS_COMMON_OPTIONS_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "options.h"

#define OPTIONS_NAME_MAX 64
#define OPTIONS_ENV_MAX (OPTIONS_NAME_MAX + 16)
#define OPTIONS_FILE_MAX (1024 * 1024)
#define OPTIONS_QUOTE_MAX 96 /* longest value quoted back in an error */

typedef enum {
    OPTIONS_SRC_DEFAULT,
    OPTIONS_SRC_SET,
    OPTIONS_SRC_FILE,
    OPTIONS_SRC_ENV,
    OPTIONS_SRC_ARGV,
} options_source;

typedef struct options_value {
    char *text; /* canonical text, owned (a LIST's items joined by ", ") */
    union {
        int64_t i; /* INT, SIZE */
        double d;  /* DOUBLE */
        bool b;    /* BOOL */
    } v;
    char **items; /* LIST: nitems owned strings */
    size_t nitems;
    options_source source;
} options_value;

struct options {
    const option_def *table;
    size_t n;
    unsigned scope;
    options_value *vals; /* one per table row */
};

/* ---- options_value.c ---- */

/* Writes s as a double-quoted, printable, length-limited string for errors. */
const char *options_quote(char *buf, size_t cap, const char *s);

/* Prefixes the message already in err with "prefix: ". */
void options_err_prefix(char *err, size_t errlen, const char *prefix);

/* True if s is empty or only white space. */
bool options_only_space(const char *s);

/* Parses text for row d into *out (allocating out->text; a LIST gets the one
 * item text). On error writes "<name>: <what is wrong>" into err and returns
 * -1; *out is untouched. */
int options_parse_value(const option_def *d, const char *text, options_value *out, char *err,
                        size_t errlen);

/* Frees what a value owns and zeroes it. */
void options_value_free(options_value *v);

/* Appends item to a LIST value (updating its text). Returns 0, or -1 with a
 * message on ENOMEM (the value is then unchanged). */
int options_list_append(const option_def *d, options_value *v, const char *item, char *err,
                        size_t errlen);

/* The row's environment variable: d->env, or "PS_" + upper(name) in buf. */
const char *options_env_name(const option_def *d, char *buf, size_t cap);

bool options_has_bounds(const option_def *d);
/* "min..max" as the type shows them (sizes with suffixes). */
void options_format_bounds(char *buf, size_t cap, const option_def *d);

/* ---- options.c ---- */

/* Row of `name` (len bytes) in o's table: the one in o's scope when two rows
 * share the name, else the first; -1 if none. */
int options_find_n(const options *o, const char *name, size_t len);
int options_find(const options *o, const char *name);

/* Writes "unknown option --name" plus a suggestion for a near in-scope name. */
void options_unknown(const options *o, const char *dashes, const char *name, size_t len, char *err,
                     size_t errlen);

/* Writes "option --name is not accepted by this program (...)". */
void options_out_of_scope(const options *o, int idx, const char *dashes, char *err, size_t errlen);

/* Parses and stores a value for row idx from source src; the old value stays
 * on error. A LIST gets one more item, except that a value from the
 * environment replaces the list. */
int options_apply(options *o, int idx, const char *value, options_source src, char *err,
                  size_t errlen);

/* Empties a LIST (before a source that replaces it). */
void options_list_clear(options *o, int idx);

#endif /* PS_COMMON_OPTIONS_INTERNAL_H */
