/* options_value.c - parsing and validating option values and the table's
 * rows; see options.h for the syntax of each type. */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "options_internal.h"
#include "util.h"

void options_err_prefix(char *err, size_t errlen, const char *prefix)
{
    char *copy;

    if (err == NULL || errlen == 0)
        return;
    copy = strdup(err);
    if (copy == NULL)
        return; /* keep the unprefixed message rather than lose it */
    snprintf(err, errlen, "%s: %s", prefix, copy);
    free(copy);
}

const char *options_quote(char *buf, size_t cap, const char *s)
{
    return quote_text(buf, cap, s, OPTIONS_QUOTE_MAX);
}

static const char *options_skip_space(const char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    return s;
}

bool options_only_space(const char *s)
{
    return *options_skip_space(s) == '\0';
}

/* Parses a decimal int64; 0, -1 if not a number, -2 if out of int64 range. */
static int options_parse_i64(const char *s, int64_t *out)
{
    char *end;
    long long v;

    s = options_skip_space(s);
    if (*s == '\0' || !(isdigit((unsigned char)*s) || *s == '-' || *s == '+'))
        return -1;
    errno = 0;
    v = strtoll(s, &end, 10);
    if (end == s || !options_only_space(end))
        return -1;
    if (errno == ERANGE)
        return -2;
    *out = v;
    return 0;
}

/* Parses "<digits>[K|M|G|T][i][B]"; 0, -1 if malformed, -2 if too large. */
static int options_parse_size(const char *s, int64_t *out)
{
    uint64_t v = 0, mul = 1;
    const char *p = options_skip_space(s);

    if (!isdigit((unsigned char)*p))
        return -1;
    for (; isdigit((unsigned char)*p); p++) {
        if (v > (UINT64_MAX - 9) / 10)
            return -2;
        v = v * 10 + (uint64_t)(*p - '0');
    }
    p = options_skip_space(p);
    switch (toupper((unsigned char)*p)) {
    case 'K':
        mul = 1ull << 10;
        break;
    case 'M':
        mul = 1ull << 20;
        break;
    case 'G':
        mul = 1ull << 30;
        break;
    case 'T':
        mul = 1ull << 40;
        break;
    default:
        break;
    }
    if (mul != 1) {
        p++;
        if (*p == 'i' || *p == 'I')
            if (toupper((unsigned char)p[1]) == 'B')
                p++;
    }
    if (toupper((unsigned char)*p) == 'B')
        p++;
    if (!options_only_space(p))
        return -1;
    if (v > (uint64_t)INT64_MAX / mul)
        return -2;
    *out = (int64_t)(v * mul);
    return 0;
}

/* Parses true|false|yes|no|on|off|1|0, case-insensitive, surrounding space
 * allowed. */
static int options_parse_bool(const char *s, bool *out)
{
    static const char *const yes[] = {"true", "yes", "on", "1"};
    static const char *const no[] = {"false", "no", "off", "0"};
    size_t n;

    s = options_skip_space(s);
    n = strlen(s);
    while (n > 0 && isspace((unsigned char)s[n - 1]))
        n--;
    for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++) {
        if (n == strlen(yes[i]) && strncasecmp(s, yes[i], n) == 0) {
            *out = true;
            return 0;
        }
        if (n == strlen(no[i]) && strncasecmp(s, no[i], n) == 0) {
            *out = false;
            return 0;
        }
    }
    return -1;
}

/* Finds s among the "a|b|c" choices; returns the choice's start and length. */
static const char *options_find_choice(const char *choices, const char *s, size_t *len)
{
    const char *p = choices;

    while (p != NULL && *p != '\0') {
        const char *bar = strchr(p, '|');
        size_t n = bar != NULL ? (size_t)(bar - p) : strlen(p);
        if (n == strlen(s) && strncasecmp(p, s, n) == 0) {
            *len = n;
            return p;
        }
        p = bar != NULL ? bar + 1 : NULL;
    }
    return NULL;
}

/* Formats a byte count with the largest exact binary suffix: 4096 -> "4K". */
static void options_format_size(char *buf, size_t cap, double bytes)
{
    static const char suffix[] = "KMGT";
    uint64_t v = (uint64_t)bytes;
    int s = -1;

    while (v != 0 && v % 1024 == 0 && s < 3) {
        v /= 1024;
        s++;
    }
    if (s < 0)
        snprintf(buf, cap, "%" PRIu64, v);
    else
        snprintf(buf, cap, "%" PRIu64 "%c", v, suffix[s]);
}

bool options_has_bounds(const option_def *d)
{
    return !(d->min == 0 && d->max == 0);
}

void options_format_bounds(char *buf, size_t cap, const option_def *d)
{
    char lo[32], hi[32];

    if (d->type == OPT_SIZE) {
        options_format_size(lo, sizeof lo, d->min);
        options_format_size(hi, sizeof hi, d->max);
    } else if (d->type == OPT_INT) {
        snprintf(lo, sizeof lo, "%.0f", d->min);
        snprintf(hi, sizeof hi, "%.0f", d->max);
    } else {
        snprintf(lo, sizeof lo, "%g", d->min);
        snprintf(hi, sizeof hi, "%g", d->max);
    }
    snprintf(buf, cap, "%s..%s", lo, hi);
}

static int options_out_of_range(const option_def *d, const char *q, char *err, size_t errlen)
{
    char range[80];

    options_format_bounds(range, sizeof range, d);
    return errf(err, errlen, "%s: %s is out of range %s", d->name, q, range);
}

int options_parse_value(const option_def *d, const char *text, options_value *out, char *err,
                        size_t errlen)
{
    char q[OPTIONS_QUOTE_MAX + 16];
    char canon[64];
    const char *store = text;
    options_value v = {0};
    int rc;

    if (text == NULL)
        text = "";
    options_quote(q, sizeof q, text);
    switch (d->type) {
    case OPT_INT:
        rc = options_parse_i64(text, &v.v.i);
        if (rc == -1)
            return errf(err, errlen, "%s: %s is not an integer", d->name, q);
        if (rc == -2 ||
            (options_has_bounds(d) && ((double)v.v.i < d->min || (double)v.v.i > d->max)))
            return options_out_of_range(d, q, err, errlen);
        snprintf(canon, sizeof canon, "%" PRId64, v.v.i);
        store = canon;
        break;
    case OPT_SIZE:
        rc = options_parse_size(text, &v.v.i);
        if (rc == -1)
            return errf(err, errlen,
                        "%s: %s is not a size (a whole number of bytes with an optional "
                        "K, M, G or T suffix, e.g. 64M)",
                        d->name, q);
        if (rc == -2 ||
            (options_has_bounds(d) && ((double)v.v.i < d->min || (double)v.v.i > d->max)))
            return options_out_of_range(d, q, err, errlen);
        store = options_skip_space(text);
        break;
    case OPT_DOUBLE: {
        char *end;
        const char *p = options_skip_space(text);
        errno = 0;
        v.v.d = strtod(p, &end);
        if (*p == '\0' || end == p || !options_only_space(end) || !isfinite(v.v.d))
            return errf(err, errlen, "%s: %s is not a finite number", d->name, q);
        if (options_has_bounds(d) && (v.v.d < d->min || v.v.d > d->max))
            return options_out_of_range(d, q, err, errlen);
        store = p;
        break;
    }
    case OPT_BOOL:
        if (options_parse_bool(text, &v.v.b) != 0)
            return errf(err, errlen, "%s: %s is not a boolean (true|false|yes|no|on|off|1|0)",
                        d->name, q);
        store = v.v.b ? "true" : "false";
        break;
    case OPT_ENUM: {
        size_t len = 0;
        const char *c = options_find_choice(d->choices, text, &len);
        if (c == NULL)
            return errf(err, errlen, "%s: %s is not one of %s", d->name, q,
                        d->choices != NULL ? d->choices : "(no choices)");
        if (len >= sizeof canon)
            len = sizeof canon - 1;
        memcpy(canon, c, len);
        canon[len] = '\0';
        store = canon;
        break;
    }
    case OPT_STRING:
        store = text;
        break;
    case OPT_LIST:
        v.items = malloc(sizeof v.items[0]);
        if (v.items == NULL || (v.items[0] = strdup(text)) == NULL) {
            free(v.items);
            return errf(err, errlen, "%s: out of memory", d->name);
        }
        v.nitems = 1;
        store = text;
        break;
    default:
        return errf(err, errlen, "%s: option has an unknown type %d", d->name, (int)d->type);
    }
    v.text = strdup(store);
    if (v.text == NULL) {
        options_value_free(&v);
        return errf(err, errlen, "%s: out of memory", d->name);
    }
    *out = v;
    return 0;
}

void options_value_free(options_value *v)
{
    for (size_t i = 0; i < v->nitems; i++)
        free(v->items[i]);
    free(v->items);
    free(v->text);
    memset(v, 0, sizeof *v);
}

int options_list_append(const option_def *d, options_value *v, const char *item, char *err,
                        size_t errlen)
{
    size_t tlen = v->text != NULL ? strlen(v->text) : 0;
    char **items = realloc(v->items, (v->nitems + 1) * sizeof items[0]);
    char *copy = strdup(item);
    char *text = malloc(tlen + strlen(item) + 3);

    if (items != NULL)
        v->items = items;
    if (items == NULL || copy == NULL || text == NULL) {
        free(copy);
        free(text);
        return errf(err, errlen, "%s: out of memory", d->name);
    }
    snprintf(text, tlen + strlen(item) + 3, "%s%s%s", v->nitems > 0 ? v->text : "",
             v->nitems > 0 ? ", " : "", item);
    free(v->text);
    v->text = text;
    v->items[v->nitems++] = copy;
    return 0;
}

const char *options_env_name(const option_def *d, char *buf, size_t cap)
{
    size_t i = 0;

    if (d->env != NULL)
        return d->env;
    snprintf(buf, cap, "PS_");
    for (const char *p = d->name; *p != '\0' && i + 4 < cap; p++, i++)
        buf[3 + i] = *p == '-' ? '_' : (char)toupper((unsigned char)*p);
    buf[3 + i] = '\0';
    return buf;
}

/* Checks one row on its own. */
static int options_validate_row(const option_def *d, size_t i, char *err, size_t errlen)
{
    char msg[256];
    options_value v;
    size_t len;

    if (d->name == NULL || d->name[0] == '\0')
        return errf(err, errlen, "options table row %zu: empty name", i);
    len = strlen(d->name);
    if (len > OPTIONS_NAME_MAX || strspn(d->name, "abcdefghijklmnopqrstuvwxyz0123456789-") != len ||
        d->name[0] == '-')
        return errf(err, errlen,
                    "option %s: name must be 1..%d of [a-z0-9-], not starting with '-'", d->name,
                    OPTIONS_NAME_MAX);
    if (strcmp(d->name, "help") == 0)
        return errf(err, errlen, "option help: the name is reserved for --help");
    if (d->scope == 0 || (d->scope & ~(unsigned)OPT_SCOPE_ALL) != 0)
        return errf(err, errlen, "option %s: scope 0x%x is empty or has unknown bits", d->name,
                    d->scope);
    if (d->help == NULL || d->help[0] == '\0')
        return errf(err, errlen, "option %s: missing help text", d->name);
    if (d->type == OPT_ENUM && (d->choices == NULL || d->choices[0] == '\0'))
        return errf(err, errlen, "option %s: ENUM without choices", d->name);
    if (d->min > d->max)
        return errf(err, errlen, "option %s: min %g > max %g", d->name, d->min, d->max);
    if (d->defval == NULL)
        return errf(err, errlen, "option %s: NULL default (use \"\" for none)", d->name);
    if (d->type == OPT_LIST) {
        if (d->defval[0] != '\0' || options_has_bounds(d))
            return errf(err, errlen, "option %s: a LIST has no default and no bounds", d->name);
        return 0;
    }
    if (options_parse_value(d, d->defval, &v, msg, sizeof msg) != 0)
        return errf(err, errlen, "option %s: bad default: %s", d->name, msg);
    options_value_free(&v);
    return 0;
}

int options_table_validate(const option_def *table, size_t n, char *err, size_t errlen)
{
    char envbuf[OPTIONS_ENV_MAX], envbuf2[OPTIONS_ENV_MAX];

    if (table == NULL && n > 0)
        return errf(err, errlen, "options table is NULL");
    for (size_t i = 0; i < n; i++) {
        const option_def *d = &table[i];

        if (options_validate_row(d, i, err, errlen) != 0)
            return -1;
        for (size_t j = 0; j < i; j++) {
            /* One name may serve programs that never share an options object. */
            if (strcmp(table[j].name, d->name) == 0 && (table[j].scope & d->scope) != 0)
                return errf(err, errlen, "option %s: duplicate name (rows %zu and %zu)", d->name, j,
                            i);
            if (strcmp(options_env_name(&table[j], envbuf, sizeof envbuf),
                       options_env_name(d, envbuf2, sizeof envbuf2)) == 0)
                return errf(err, errlen, "option %s: environment variable %s also used by %s",
                            d->name, envbuf2, table[j].name);
            /* "--no-x" negates BOOL x, so no option may be called "no-x". */
            if ((table[j].type == OPT_BOOL && strncmp(d->name, "no-", 3) == 0 &&
                 strcmp(d->name + 3, table[j].name) == 0) ||
                (d->type == OPT_BOOL && strncmp(table[j].name, "no-", 3) == 0 &&
                 strcmp(table[j].name + 3, d->name) == 0))
                return errf(err, errlen, "option %s: clashes with --no-%s of a BOOL option",
                            d->name, d->type == OPT_BOOL ? d->name : table[j].name);
        }
    }
    return 0;
}
