/* options_load.c - the sources of option values: the environment, a JSON
 * config file and the command line; see options.h for the contract. */
#include <json-c/json.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "options_internal.h"
#include "util.h"

int options_load_env(options *o, char *err, size_t errlen)
{
    char envbuf[OPTIONS_ENV_MAX], prefix[OPTIONS_ENV_MAX + 32];

    if (o == NULL)
        return errf(err, errlen, "options_load_env: NULL options");
    for (size_t i = 0; i < o->n; i++) {
        const char *env, *value;
        if (!(o->table[i].scope & o->scope))
            continue;
        env = options_env_name(&o->table[i], envbuf, sizeof envbuf);
        value = getenv(env);
        if (value == NULL || value[0] == '\0')
            continue;
        if (options_apply(o, (int)i, value, OPTIONS_SRC_ENV, err, errlen) != 0) {
            snprintf(prefix, sizeof prefix, "environment variable %s", env);
            options_err_prefix(err, errlen, prefix);
            return -1;
        }
    }
    return 0;
}

/* Text form of one config-file value for row d, into *text (owned by val).
 * Returns 0, or -1 with a message. */
static int options_json_text(const option_def *d, struct json_object *val, const char **text,
                             char *err, size_t errlen)
{
    switch (json_object_get_type(val)) {
    case json_type_string:
        *text = json_object_get_string(val);
        if (strlen(*text) != (size_t)json_object_get_string_len(val))
            return errf(err, errlen, "%s: string contains a NUL character", d->name);
        return 0;
    case json_type_boolean:
        *text = json_object_get_boolean(val) ? "true" : "false";
        return 0;
    case json_type_int:
    case json_type_double:
        *text = json_object_to_json_string_ext(val, JSON_C_TO_STRING_PLAIN);
        return 0;
    case json_type_object:
    case json_type_array:
        if (d->type == OPT_STRING) {
            *text = json_object_to_json_string_ext(val, JSON_C_TO_STRING_PLAIN);
            return 0;
        }
        return errf(err, errlen, "%s: expected a string, number or boolean, got %s", d->name,
                    json_type_to_name(json_object_get_type(val)));
    case json_type_null:
    default:
        return errf(err, errlen, "%s: null is not a value", d->name);
    }
}

/* Applies one config-file value to row idx: a LIST takes a string or an
 * array of strings, which replace its items. */
static int options_apply_json(options *o, int idx, struct json_object *val, char *err,
                              size_t errlen)
{
    const option_def *d = &o->table[idx];
    const char *text = NULL;

    if (d->type != OPT_LIST)
        return options_json_text(d, val, &text, err, errlen) != 0 ||
                       options_apply(o, idx, text, OPTIONS_SRC_FILE, err, errlen) != 0
                   ? -1
                   : 0;
    if (json_object_is_type(val, json_type_string)) {
        if (options_json_text(d, val, &text, err, errlen) != 0)
            return -1;
        options_list_clear(o, idx);
        return options_apply(o, idx, text, OPTIONS_SRC_FILE, err, errlen);
    }
    if (!json_object_is_type(val, json_type_array))
        return errf(err, errlen, "%s: expected a string or an array of strings, got %s", d->name,
                    json_type_to_name(json_object_get_type(val)));
    for (size_t i = 0; i < json_object_array_length(val); i++) {
        struct json_object *item = json_object_array_get_idx(val, i);
        if (!json_object_is_type(item, json_type_string))
            return errf(err, errlen, "%s[%zu]: expected a string, got %s", d->name, i,
                        json_type_to_name(json_object_get_type(item)));
    }
    options_list_clear(o, idx);
    for (size_t i = 0; i < json_object_array_length(val); i++) {
        if (options_json_text(d, json_object_array_get_idx(val, i), &text, err, errlen) != 0 ||
            options_apply(o, idx, text, OPTIONS_SRC_FILE, err, errlen) != 0)
            return -1;
    }
    o->vals[idx].source = OPTIONS_SRC_FILE; /* also for an empty array */
    return 0;
}

/* Writes the position of a JSON syntax error (or trailing data) into err. */
static void options_json_error(const char *buf, size_t len, struct json_object *root,
                               enum json_tokener_error jerr, size_t end, char *err, size_t errlen)
{
    size_t line = 1, col = 1;

    for (size_t i = 0; i < end && i < len; i++) {
        col = buf[i] == '\n' ? 1 : col + 1;
        line += buf[i] == '\n';
    }
    if (root != NULL)
        errf(err, errlen, "invalid JSON at line %zu, column %zu: trailing data after the object",
             line, col);
    else if (jerr == json_tokener_continue)
        errf(err, errlen, "invalid JSON: unexpected end of file");
    else
        errf(err, errlen, "invalid JSON at line %zu, column %zu: %s", line, col,
             json_tokener_error_desc(jerr));
}

int options_load_file(options *o, const char *path, char *err, size_t errlen)
{
    char prefix[512], q[OPTIONS_QUOTE_MAX + 16];
    struct json_tokener *tok = NULL;
    struct json_object *root = NULL;
    char *buf = NULL;
    size_t len = 0;
    int rc = -1;

    if (o == NULL || path == NULL || path[0] == '\0')
        return errf(err, errlen, "config file: %s", o == NULL ? "NULL options" : "no path given");
    snprintf(prefix, sizeof prefix, "config file %s", path);
    buf = read_file(path, OPTIONS_FILE_MAX, &len, err, errlen);
    if (buf == NULL)
        goto fail_prefix;
    if (strlen(buf) != len) {
        errf(err, errlen, "contains a NUL byte at offset %zu", strlen(buf));
        goto fail_prefix;
    }
    tok = json_tokener_new();
    if (tok == NULL) {
        errf(err, errlen, "out of memory");
        goto fail_prefix;
    }
    json_tokener_set_flags(tok, JSON_TOKENER_STRICT);
    root = json_tokener_parse_ex(tok, buf, (int)len);
    {
        enum json_tokener_error jerr = json_tokener_get_error(tok);
        size_t end = json_tokener_get_parse_end(tok);
        if (root == NULL || jerr != json_tokener_success || !options_only_space(buf + end)) {
            options_json_error(buf, len, root, jerr, end, err, errlen);
            goto fail_prefix;
        }
    }
    if (!json_object_is_type(root, json_type_object)) {
        errf(err, errlen, "expected a JSON object of option names, got %s",
             json_type_to_name(json_object_get_type(root)));
        goto fail_prefix;
    }
    json_object_object_foreach(root, key, val)
    {
        int idx = options_find(o, key);

        if (idx < 0) {
            options_unknown(o, "", key, strlen(key), err, errlen);
            goto fail_prefix;
        }
        if (strcmp(key, "config") == 0) {
            errf(err, errlen, "%s: a config file cannot name another config file",
                 options_quote(q, sizeof q, key));
            goto fail_prefix;
        }
        if (!(o->table[idx].scope & o->scope))
            continue; /* another program's setting in a shared file */
        if (options_apply_json(o, idx, val, err, errlen) != 0)
            goto fail_prefix;
    }
    rc = 0;
    goto out;

fail_prefix:
    options_err_prefix(err, errlen, prefix);
out:
    json_object_put(root);
    if (tok != NULL)
        json_tokener_free(tok);
    free(buf);
    return rc;
}

/* ---- command line ---- */

typedef struct options_assign {
    int idx;
    const char *value;
} options_assign;

/* What options_scan_argv fills in. */
typedef struct options_scan {
    options_assign *as; /* argc entries */
    size_t nas;
    const char **positional; /* NULL: the program takes none */
    int *npositional;
    bool help;
    bool failed;
} options_scan;

/* Records the first error in err and keeps scanning, so that a later --help
 * still wins. */
static void options_scan_fail(options_scan *s, char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void options_scan_fail(options_scan *s, char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;

    if (!s->failed) {
        va_start(ap, fmt);
        verrf(err, errlen, fmt, ap);
        va_end(ap);
    }
    s->failed = true;
}

static void options_scan_positional(options_scan *s, const char *a, char *err, size_t errlen)
{
    char q[OPTIONS_QUOTE_MAX + 16];

    if (s->positional == NULL || s->npositional == NULL)
        options_scan_fail(s, err, errlen,
                          "command line: unexpected argument %s (this program takes no "
                          "positional arguments)",
                          options_quote(q, sizeof q, a));
    else
        s->positional[(*s->npositional)++] = a;
}

/* Row of the option that argument a ("--name[=value]" or "--no-name") names
 * among all of o's table; -1 if none. *negated: a "--no-" form of a BOOL. */
static int options_arg_row(const options *o, const char *a, bool *negated)
{
    const char *name = a + 2, *eq = strchr(name, '=');
    size_t len = eq != NULL ? (size_t)(eq - name) : strlen(name);
    int idx = options_find_n(o, name, len);

    *negated = false;
    if (idx < 0 && len > 3 && strncmp(name, "no-", 3) == 0) {
        idx = options_find_n(o, name + 3, len - 3);
        if (idx >= 0 && o->table[idx].type == OPT_BOOL)
            *negated = true;
        else
            idx = -1;
    }
    return idx;
}

/* Parses argv into assignments without applying them. */
static void options_scan_argv(const options *o, int argc, char **argv, unsigned flags,
                              options_scan *s, char *err, size_t errlen)
{
    char msg[512], q[OPTIONS_QUOTE_MAX + 16];
    bool rest_positional = false;
    bool stop_at_rest = (flags & OPTIONS_LOAD_REST_POSITIONAL) != 0;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *eq, *value;
        int idx;
        bool negated = false;

        if (a == NULL)
            continue;
        if (rest_positional) {
            options_scan_positional(s, a, err, errlen);
            continue;
        }
        if (strcmp(a, "--") == 0) {
            rest_positional = true;
            continue;
        }
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            s->help = true;
            continue;
        }
        idx = strncmp(a, "--", 2) == 0 && a[2] != '\0' ? options_arg_row(o, a, &negated) : -1;
        if (stop_at_rest && (idx < 0 || !(o->table[idx].scope & o->scope))) {
            /* Not one of ours: it and everything after it belong to someone else. */
            rest_positional = true;
            options_scan_positional(s, a, err, errlen);
            continue;
        }
        if (a[0] != '-' || a[1] == '\0') {
            options_scan_positional(s, a, err, errlen);
            continue;
        }
        if (a[1] != '-') {
            options_scan_fail(s, err, errlen,
                              "command line: unknown option %s (options are spelled --name)",
                              options_quote(q, sizeof q, a));
            continue;
        }
        eq = strchr(a + 2, '=');
        if (idx < 0) {
            options_unknown(o, "--", a + 2, eq != NULL ? (size_t)(eq - a - 2) : strlen(a + 2), msg,
                            sizeof msg);
            options_scan_fail(s, err, errlen, "command line: %s", msg);
            continue;
        }
        const char *name = o->table[idx].name;
        if (negated) {
            if (eq != NULL) {
                options_scan_fail(s, err, errlen, "command line: --no-%s takes no value", name);
                continue;
            }
            value = "false";
        } else if (eq != NULL) {
            value = eq + 1;
        } else if (o->table[idx].type == OPT_BOOL) {
            value = "true";
        } else if (i + 1 >= argc || argv[i + 1] == NULL) {
            options_scan_fail(s, err, errlen,
                              "command line: --%s needs a value (--%s=VALUE or --%s VALUE)", name,
                              name, name);
            continue;
        } else if (strncmp(argv[i + 1], "--", 2) == 0 && o->table[idx].type != OPT_LIST) {
            options_scan_fail(s, err, errlen,
                              "command line: --%s needs a value, got option %s (use --%s=VALUE "
                              "for a value starting with --)",
                              name, options_quote(q, sizeof q, argv[i + 1]), name);
            i++;
            continue;
        } else {
            value = argv[++i];
        }
        if (!(o->table[idx].scope & o->scope)) {
            options_out_of_scope(o, idx, "--", msg, sizeof msg);
            options_scan_fail(s, err, errlen, "command line: %s", msg);
            continue;
        }
        s->as[s->nas].idx = idx;
        s->as[s->nas].value = value;
        s->nas++;
    }
}

/* The config file to read: from the command line, else the environment, else
 * the value already in o; NULL for none. */
static const char *options_config_path(const options *o, const options_scan *s)
{
    char envbuf[OPTIONS_ENV_MAX];
    int idx = options_find(o, "config");
    const char *path = NULL;

    if (idx < 0 || !(o->table[idx].scope & o->scope))
        return NULL;
    for (size_t i = 0; i < s->nas; i++)
        if (s->as[i].idx == idx)
            path = s->as[i].value;
    if (path == NULL) {
        path = getenv(options_env_name(&o->table[idx], envbuf, sizeof envbuf));
        if (path != NULL && path[0] == '\0')
            path = NULL;
    }
    if (path == NULL)
        path = o->vals[idx].text;
    return path != NULL && path[0] != '\0' ? path : NULL;
}

int options_load_ex(options *o, int argc, char **argv, unsigned flags, const char **positional,
                    int *npositional, char *err, size_t errlen)
{
    options_scan s = {.positional = positional, .npositional = npositional};
    const char *config_path;
    char prefix[OPTIONS_NAME_MAX + 32];
    int rc = -1;

    if (o == NULL || argc < 0 || (argc > 0 && argv == NULL))
        return errf(err, errlen, "options_load: invalid arguments");
    if (npositional != NULL)
        *npositional = 0;
    s.as = calloc(argc > 0 ? (size_t)argc : 1, sizeof *s.as);
    if (s.as == NULL)
        return errf(err, errlen, "options_load: out of memory");
    options_scan_argv(o, argc, argv, flags, &s, err, errlen);
    if (s.help) {
        rc = OPTIONS_HELP; /* --help wins over other mistakes on the line */
        errf(err, errlen, "%s", "");
        goto out;
    }
    if (s.failed)
        goto out;

    /* The config file comes first in precedence, so find its name before
     * anything else is applied. Loading the file cannot change "config"
     * (files may not set it), so config_path stays valid. */
    config_path = options_config_path(o, &s);
    if (config_path != NULL && options_load_file(o, config_path, err, errlen) != 0)
        goto out;
    if (options_load_env(o, err, errlen) != 0)
        goto out;
    /* A list given on the command line replaces what file and environment
     * gave; its occurrences add up. */
    for (size_t i = 0; i < s.nas; i++) {
        bool first = true;
        for (size_t j = 0; j < i; j++)
            first = first && s.as[j].idx != s.as[i].idx;
        if (first && o->table[s.as[i].idx].type == OPT_LIST)
            options_list_clear(o, s.as[i].idx);
    }
    for (size_t i = 0; i < s.nas; i++) {
        if (options_apply(o, s.as[i].idx, s.as[i].value, OPTIONS_SRC_ARGV, err, errlen) != 0) {
            snprintf(prefix, sizeof prefix, "command line --%s", o->table[s.as[i].idx].name);
            options_err_prefix(err, errlen, prefix);
            goto out;
        }
    }
    rc = 0;
out:
    free(s.as);
    return rc;
}

int options_load(options *o, int argc, char **argv, const char **positional, int *npositional,
                 char *err, size_t errlen)
{
    return options_load_ex(o, argc, argv, 0, positional, npositional, err, errlen);
}
