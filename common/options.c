/* options.c - settings from defaults, a config file, the environment and the
 * command line, all driven by one table; see options.h for the contract. */
#include "options.h"

#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#define OPTIONS_NAME_MAX 64
#define OPTIONS_ENV_MAX (OPTIONS_NAME_MAX + 8)
#define OPTIONS_FILE_MAX (1024 * 1024)
#define OPTIONS_QUOTE_MAX 96 /* longest value quoted back in an error */
#define OPTIONS_HELP_WIDTH 100
#define OPTIONS_HELP_LEFT_MAX 34

typedef enum {
    OPTIONS_SRC_DEFAULT,
    OPTIONS_SRC_SET,
    OPTIONS_SRC_FILE,
    OPTIONS_SRC_ENV,
    OPTIONS_SRC_ARGV,
} options_source;

typedef struct options_value {
    char *text; /* canonical text, owned */
    union {
        int64_t i; /* INT, SIZE */
        double d;  /* DOUBLE */
        bool b;    /* BOOL */
    } v;
    options_source source;
} options_value;

struct options {
    const option_def *table;
    size_t n;
    unsigned scope;
    options_value *vals; /* one per table row */
};

static void options_errf(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void options_errf(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;

    if (err == NULL || errlen == 0)
        return;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* Prefixes the message already in err with "prefix: ". */
static void options_err_prefix(char *err, size_t errlen, const char *prefix)
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

/* Writes s as a double-quoted, printable, length-limited string for errors. */
static const char *options_quote(char *buf, size_t cap, const char *s)
{
    size_t o = 0;

    if (s == NULL)
        s = "(null)";
    buf[o++] = '"';
    for (; *s != '\0'; s++) {
        unsigned char c = (unsigned char)*s;
        if (o + 8 >= cap || o > OPTIONS_QUOTE_MAX) {
            memcpy(buf + o, "...", 3);
            o += 3;
            break;
        }
        if (c == '"' || c == '\\') {
            buf[o++] = '\\';
            buf[o++] = (char)c;
        } else if (c < 0x20 || c == 0x7F) {
            o += (size_t)snprintf(buf + o, cap - o, "\\x%02x", c);
        } else {
            buf[o++] = (char)c;
        }
    }
    buf[o++] = '"';
    buf[o] = '\0';
    return buf;
}

/* ---- value parsing ---- */

static const char *options_skip_space(const char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    return s;
}

static bool options_only_space(const char *s)
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

static bool options_has_bounds(const option_def *d)
{
    return !(d->min == 0 && d->max == 0);
}

static void options_format_bounds(char *buf, size_t cap, const option_def *d)
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

/* Parses text for row d into *out (allocating out->text). On error writes
 * "<name>: <what is wrong>" into err and returns -1; *out is untouched. */
static int options_parse_value(const option_def *d, const char *text, options_value *out, char *err,
                               size_t errlen)
{
    char q[OPTIONS_QUOTE_MAX + 16], range[80];
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
        if (rc == -1) {
            options_errf(err, errlen, "%s: %s is not an integer", d->name, q);
            return -1;
        }
        if (rc == -2 ||
            (options_has_bounds(d) && ((double)v.v.i < d->min || (double)v.v.i > d->max))) {
            options_format_bounds(range, sizeof range, d);
            options_errf(err, errlen, "%s: %s is out of range %s", d->name, q, range);
            return -1;
        }
        snprintf(canon, sizeof canon, "%" PRId64, v.v.i);
        store = canon;
        break;
    case OPT_SIZE:
        rc = options_parse_size(text, &v.v.i);
        if (rc == -1) {
            options_errf(err, errlen,
                         "%s: %s is not a size (a whole number of bytes with an optional "
                         "K, M, G or T suffix, e.g. 64M)",
                         d->name, q);
            return -1;
        }
        if (rc == -2 ||
            (options_has_bounds(d) && ((double)v.v.i < d->min || (double)v.v.i > d->max))) {
            options_format_bounds(range, sizeof range, d);
            options_errf(err, errlen, "%s: %s is out of range %s", d->name, q, range);
            return -1;
        }
        store = options_skip_space(text);
        break;
    case OPT_DOUBLE: {
        char *end;
        const char *p = options_skip_space(text);
        errno = 0;
        v.v.d = strtod(p, &end);
        if (*p == '\0' || end == p || !options_only_space(end) || !isfinite(v.v.d)) {
            options_errf(err, errlen, "%s: %s is not a finite number", d->name, q);
            return -1;
        }
        if (options_has_bounds(d) && (v.v.d < d->min || v.v.d > d->max)) {
            options_format_bounds(range, sizeof range, d);
            options_errf(err, errlen, "%s: %s is out of range %s", d->name, q, range);
            return -1;
        }
        store = p;
        break;
    }
    case OPT_BOOL:
        if (options_parse_bool(text, &v.v.b) != 0) {
            options_errf(err, errlen, "%s: %s is not a boolean (true|false|yes|no|on|off|1|0)",
                         d->name, q);
            return -1;
        }
        store = v.v.b ? "true" : "false";
        break;
    case OPT_ENUM: {
        size_t len = 0;
        const char *c = options_find_choice(d->choices, text, &len);
        if (c == NULL) {
            options_errf(err, errlen, "%s: %s is not one of %s", d->name, q,
                         d->choices != NULL ? d->choices : "(no choices)");
            return -1;
        }
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
    default:
        options_errf(err, errlen, "%s: option has an unknown type %d", d->name, (int)d->type);
        return -1;
    }
    v.text = strdup(store);
    if (v.text == NULL) {
        options_errf(err, errlen, "%s: out of memory", d->name);
        return -1;
    }
    *out = v;
    return 0;
}

/* ---- lookup ---- */

static int options_find_n(const option_def *table, size_t n, const char *name, size_t len)
{
    for (size_t i = 0; i < n; i++)
        if (strlen(table[i].name) == len && strncmp(table[i].name, name, len) == 0)
            return (int)i;
    return -1;
}

static int options_find(const options *o, const char *name)
{
    if (o == NULL || name == NULL)
        return -1;
    return options_find_n(o->table, o->n, name, strlen(name));
}

static const char *options_env_name(const option_def *d, char *buf, size_t cap)
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

static void options_scope_names(char *buf, size_t cap, unsigned scope)
{
    static const char *const names[] = {"server", "worker", "client", "tool"};
    size_t o = 0;

    buf[0] = '\0';
    for (unsigned i = 0; i < 4; i++) {
        if (scope & (1u << i)) {
            int w = snprintf(buf + o, cap - o, "%s%s", o > 0 ? ", " : "", names[i]);
            if (w < 0 || (size_t)w >= cap - o)
                break;
            o += (size_t)w;
        }
    }
}

/* Edit distance of short strings (longer ones compare as far apart). */
static size_t options_distance(const char *a, size_t la, const char *b)
{
    size_t lb = strlen(b), prev[OPTIONS_NAME_MAX + 1], cur[OPTIONS_NAME_MAX + 1];

    if (la > OPTIONS_NAME_MAX || lb > OPTIONS_NAME_MAX)
        return SIZE_MAX;
    for (size_t j = 0; j <= lb; j++)
        prev[j] = j;
    for (size_t i = 1; i <= la; i++) {
        cur[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t del = prev[j] + 1, ins = cur[j - 1] + 1;
            size_t sub = prev[j - 1] + (a[i - 1] != b[j - 1]);
            cur[j] = del < ins ? del : ins;
            if (sub < cur[j])
                cur[j] = sub;
        }
        memcpy(prev, cur, (lb + 1) * sizeof prev[0]);
    }
    return prev[lb];
}

/* Writes "unknown option --name" plus a suggestion for a near in-scope name. */
static void options_unknown(const options *o, const char *dashes, const char *name, size_t len,
                            char *err, size_t errlen)
{
    char q[OPTIONS_QUOTE_MAX + 16], shown[OPTIONS_QUOTE_MAX];
    const char *best = NULL;
    size_t best_d = SIZE_MAX;

    snprintf(shown, sizeof shown, "%s%.*s", dashes, (int)(len < 80 ? len : 80), name);
    for (size_t i = 0; i < o->n; i++) {
        size_t dist;
        if (!(o->table[i].scope & o->scope))
            continue;
        dist = options_distance(name, len, o->table[i].name);
        if (dist < best_d) {
            best_d = dist;
            best = o->table[i].name;
        }
    }
    options_quote(q, sizeof q, shown);
    if (best != NULL && best_d <= 2 && best_d < len)
        options_errf(err, errlen, "unknown option %s (did you mean %s%s?)", q, dashes, best);
    else
        options_errf(err, errlen, "unknown option %s", q);
}

static void options_out_of_scope(const options *o, int idx, const char *dashes, char *err,
                                 size_t errlen)
{
    char mine[64], theirs[64];

    options_scope_names(mine, sizeof mine, o->scope);
    options_scope_names(theirs, sizeof theirs, o->table[idx].scope);
    options_errf(err, errlen, "option %s%s is not accepted by this program (%s); it applies to: %s",
                 dashes, o->table[idx].name, mine, theirs);
}

/* Parses and stores a value for row idx; the old value stays on error. */
static int options_apply(options *o, int idx, const char *value, options_source src, char *err,
                         size_t errlen)
{
    options_value v;

    if (options_parse_value(&o->table[idx], value, &v, err, errlen) != 0)
        return -1;
    free(o->vals[idx].text);
    v.source = src;
    o->vals[idx] = v;
    return 0;
}

/* ---- table and lifecycle ---- */

int options_table_validate(const option_def *table, size_t n, char *err, size_t errlen)
{
    char envbuf[OPTIONS_ENV_MAX], envbuf2[OPTIONS_ENV_MAX], msg[256];

    if (table == NULL && n > 0) {
        options_errf(err, errlen, "options table is NULL");
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        const option_def *d = &table[i];
        options_value v;
        size_t len;

        if (d->name == NULL || d->name[0] == '\0') {
            options_errf(err, errlen, "options table row %zu: empty name", i);
            return -1;
        }
        len = strlen(d->name);
        if (len > OPTIONS_NAME_MAX ||
            strspn(d->name, "abcdefghijklmnopqrstuvwxyz0123456789-") != len || d->name[0] == '-') {
            options_errf(err, errlen,
                         "option %s: name must be 1..%d of [a-z0-9-], not starting with '-'",
                         d->name, OPTIONS_NAME_MAX);
            return -1;
        }
        if (strcmp(d->name, "help") == 0) {
            options_errf(err, errlen, "option help: the name is reserved for --help");
            return -1;
        }
        if (d->scope == 0 || (d->scope & ~(unsigned)OPT_SCOPE_ALL) != 0) {
            options_errf(err, errlen, "option %s: scope 0x%x is empty or has unknown bits", d->name,
                         d->scope);
            return -1;
        }
        if (d->help == NULL || d->help[0] == '\0') {
            options_errf(err, errlen, "option %s: missing help text", d->name);
            return -1;
        }
        if (d->type == OPT_ENUM && (d->choices == NULL || d->choices[0] == '\0')) {
            options_errf(err, errlen, "option %s: ENUM without choices", d->name);
            return -1;
        }
        if (d->min > d->max) {
            options_errf(err, errlen, "option %s: min %g > max %g", d->name, d->min, d->max);
            return -1;
        }
        if (d->defval == NULL) {
            options_errf(err, errlen, "option %s: NULL default (use \"\" for none)", d->name);
            return -1;
        }
        if (options_parse_value(d, d->defval, &v, msg, sizeof msg) != 0) {
            options_errf(err, errlen, "option %s: bad default: %s", d->name, msg);
            return -1;
        }
        free(v.text);
        for (size_t j = 0; j < i; j++) {
            if (strcmp(table[j].name, d->name) == 0) {
                options_errf(err, errlen, "option %s: duplicate name (rows %zu and %zu)", d->name,
                             j, i);
                return -1;
            }
            if (strcmp(options_env_name(&table[j], envbuf, sizeof envbuf),
                       options_env_name(d, envbuf2, sizeof envbuf2)) == 0) {
                options_errf(err, errlen, "option %s: environment variable %s also used by %s",
                             d->name, envbuf2, table[j].name);
                return -1;
            }
            /* "--no-x" negates BOOL x, so no option may be called "no-x". */
            if ((table[j].type == OPT_BOOL && strncmp(d->name, "no-", 3) == 0 &&
                 strcmp(d->name + 3, table[j].name) == 0) ||
                (d->type == OPT_BOOL && strncmp(table[j].name, "no-", 3) == 0 &&
                 strcmp(table[j].name + 3, d->name) == 0)) {
                options_errf(err, errlen, "option %s: clashes with --no-%s of a BOOL option",
                             d->name, d->type == OPT_BOOL ? d->name : table[j].name);
                return -1;
            }
        }
    }
    return 0;
}

int options_create_with_table(options **out, const option_def *table, size_t n, unsigned scope)
{
    options *o;
    char msg[256];

    if (out == NULL)
        return -1;
    *out = NULL;
    o = calloc(1, sizeof *o);
    if (o == NULL)
        return -1;
    o->vals = calloc(n > 0 ? n : 1, sizeof o->vals[0]);
    if (o->vals == NULL) {
        free(o);
        return -1;
    }
    o->table = table;
    o->n = n;
    o->scope = scope;
    for (size_t i = 0; i < n; i++) {
        if (options_parse_value(&table[i], table[i].defval, &o->vals[i], msg, sizeof msg) != 0) {
            assert(0 && "options table default does not parse; run options_table_validate");
            options_destroy(o);
            return -1;
        }
        o->vals[i].source = OPTIONS_SRC_DEFAULT;
    }
    *out = o;
    return 0;
}

int options_create(options **out, unsigned scope)
{
    return options_create_with_table(out, options_table, options_table_len, scope);
}

void options_destroy(options *o)
{
    if (o == NULL)
        return;
    for (size_t i = 0; i < o->n; i++)
        free(o->vals[i].text);
    free(o->vals);
    free(o);
}

/* ---- sources ---- */

int options_set(options *o, const char *name, const char *value, char *err, size_t errlen)
{
    int idx;

    if (o == NULL || name == NULL) {
        options_errf(err, errlen, "options_set: NULL %s", o == NULL ? "options" : "name");
        return -1;
    }
    idx = options_find(o, name);
    if (idx < 0) {
        options_unknown(o, "", name, strlen(name), err, errlen);
        return -1;
    }
    if (!(o->table[idx].scope & o->scope)) {
        options_out_of_scope(o, idx, "", err, errlen);
        return -1;
    }
    return options_apply(o, idx, value, OPTIONS_SRC_SET, err, errlen);
}

int options_load_env(options *o, char *err, size_t errlen)
{
    char envbuf[OPTIONS_ENV_MAX], prefix[OPTIONS_ENV_MAX + 32];

    if (o == NULL) {
        options_errf(err, errlen, "options_load_env: NULL options");
        return -1;
    }
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

/* Reads a whole file of at most max bytes into a NUL-terminated buffer. */
static char *options_read_file(const char *path, size_t max, size_t *len, char *err, size_t errlen)
{
    FILE *f;
    char *buf;
    size_t n;
    struct stat st;

    f = fopen(path, "rb");
    if (f == NULL) {
        options_errf(err, errlen, "cannot open: %s", strerror(errno));
        return NULL;
    }
    if (fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) {
        fclose(f);
        options_errf(err, errlen, "is a directory");
        return NULL;
    }
    buf = malloc(max + 2);
    if (buf == NULL) {
        fclose(f);
        options_errf(err, errlen, "out of memory");
        return NULL;
    }
    n = fread(buf, 1, max + 1, f);
    if (ferror(f)) {
        options_errf(err, errlen, "read error: %s", strerror(errno));
        fclose(f);
        free(buf);
        return NULL;
    }
    fclose(f);
    if (n > max) {
        options_errf(err, errlen, "larger than %zu bytes", max);
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

/* Text form of one config-file value for row d, into *text (owned by val or
 * by *alloc). Returns 0, or -1 with a message. */
static int options_json_text(const option_def *d, struct json_object *val, const char **text,
                             char *err, size_t errlen)
{
    switch (json_object_get_type(val)) {
    case json_type_string:
        *text = json_object_get_string(val);
        if (strlen(*text) != (size_t)json_object_get_string_len(val)) {
            options_errf(err, errlen, "%s: string contains a NUL character", d->name);
            return -1;
        }
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
        options_errf(err, errlen, "%s: expected a string, number or boolean, got %s", d->name,
                     json_type_to_name(json_object_get_type(val)));
        return -1;
    case json_type_null:
    default:
        options_errf(err, errlen, "%s: null is not a value", d->name);
        return -1;
    }
}

int options_load_file(options *o, const char *path, char *err, size_t errlen)
{
    char prefix[512], q[OPTIONS_QUOTE_MAX + 16];
    struct json_tokener *tok = NULL;
    struct json_object *root = NULL;
    char *buf = NULL;
    size_t len = 0;
    int rc = -1;

    if (o == NULL || path == NULL || path[0] == '\0') {
        options_errf(err, errlen, "config file: %s", o == NULL ? "NULL options" : "no path given");
        return -1;
    }
    snprintf(prefix, sizeof prefix, "config file %s", path);
    buf = options_read_file(path, OPTIONS_FILE_MAX, &len, err, errlen);
    if (buf == NULL)
        goto fail_prefix;
    if (strlen(buf) != len) {
        options_errf(err, errlen, "contains a NUL byte at offset %zu", strlen(buf));
        goto fail_prefix;
    }
    tok = json_tokener_new();
    if (tok == NULL) {
        options_errf(err, errlen, "out of memory");
        goto fail_prefix;
    }
    json_tokener_set_flags(tok, JSON_TOKENER_STRICT);
    root = json_tokener_parse_ex(tok, buf, (int)len);
    {
        enum json_tokener_error jerr = json_tokener_get_error(tok);
        size_t end = json_tokener_get_parse_end(tok);
        if (root == NULL || jerr != json_tokener_success || !options_only_space(buf + end)) {
            size_t line = 1, col = 1;
            for (size_t i = 0; i < end && i < len; i++) {
                col = buf[i] == '\n' ? 1 : col + 1;
                line += buf[i] == '\n';
            }
            if (root != NULL)
                options_errf(err, errlen,
                             "invalid JSON at line %zu, column %zu: trailing data after the object",
                             line, col);
            else if (jerr == json_tokener_continue)
                options_errf(err, errlen, "invalid JSON: unexpected end of file");
            else
                options_errf(err, errlen, "invalid JSON at line %zu, column %zu: %s", line, col,
                             json_tokener_error_desc(jerr));
            goto fail_prefix;
        }
    }
    if (!json_object_is_type(root, json_type_object)) {
        options_errf(err, errlen, "expected a JSON object of option names, got %s",
                     json_type_to_name(json_object_get_type(root)));
        goto fail_prefix;
    }
    json_object_object_foreach(root, key, val)
    {
        int idx = options_find(o, key);
        const char *text = NULL;

        if (idx < 0) {
            options_unknown(o, "", key, strlen(key), err, errlen);
            goto fail_prefix;
        }
        if (strcmp(key, "config") == 0) {
            options_errf(err, errlen, "%s: a config file cannot name another config file",
                         options_quote(q, sizeof q, key));
            goto fail_prefix;
        }
        if (!(o->table[idx].scope & o->scope))
            continue; /* another program's setting in a shared file */
        if (options_json_text(&o->table[idx], val, &text, err, errlen) != 0 ||
            options_apply(o, idx, text, OPTIONS_SRC_FILE, err, errlen) != 0)
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

typedef struct options_assign {
    int idx;
    const char *value;
} options_assign;

/* Parses argv into assignments without applying them. Records the first
 * error in err and keeps scanning so that a later --help still wins. */
static int options_scan_argv(const options *o, int argc, char **argv, options_assign *as,
                             size_t *nas, const char **positional, int *npositional, bool *help,
                             char *err, size_t errlen)
{
    char msg[512], q[OPTIONS_QUOTE_MAX + 16];
    bool failed = false, rest_positional = false;

#define OPTIONS_FAIL(...)                                                                          \
    do {                                                                                           \
        if (!failed)                                                                               \
            options_errf(err, errlen, __VA_ARGS__);                                                \
        failed = true;                                                                             \
    } while (0)

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *name, *eq, *value;
        size_t len;
        int idx;
        bool negated = false;

        if (a == NULL)
            continue;
        if (!rest_positional && strcmp(a, "--") == 0) {
            rest_positional = true;
            continue;
        }
        if (!rest_positional && (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0)) {
            *help = true;
            continue;
        }
        if (rest_positional || a[0] != '-' || a[1] == '\0') {
            if (positional == NULL || npositional == NULL)
                OPTIONS_FAIL("command line: unexpected argument %s (this program takes no "
                             "positional arguments)",
                             options_quote(q, sizeof q, a));
            else
                positional[(*npositional)++] = a;
            continue;
        }
        if (a[1] != '-') {
            OPTIONS_FAIL("command line: unknown option %s (options are spelled --name)",
                         options_quote(q, sizeof q, a));
            continue;
        }
        name = a + 2;
        eq = strchr(name, '=');
        len = eq != NULL ? (size_t)(eq - name) : strlen(name);
        idx = options_find_n(o->table, o->n, name, len);
        if (idx < 0 && len > 3 && strncmp(name, "no-", 3) == 0) {
            idx = options_find_n(o->table, o->n, name + 3, len - 3);
            if (idx >= 0 && o->table[idx].type == OPT_BOOL)
                negated = true;
            else
                idx = -1;
        }
        if (idx < 0) {
            options_unknown(o, "--", name, len, msg, sizeof msg);
            OPTIONS_FAIL("command line: %s", msg);
            continue;
        }
        if (negated) {
            if (eq != NULL) {
                OPTIONS_FAIL("command line: --no-%s takes no value", o->table[idx].name);
                continue;
            }
            value = "false";
        } else if (eq != NULL) {
            value = eq + 1;
        } else if (o->table[idx].type == OPT_BOOL) {
            value = "true";
        } else if (i + 1 >= argc || argv[i + 1] == NULL) {
            OPTIONS_FAIL("command line: --%s needs a value (--%s=VALUE or --%s VALUE)",
                         o->table[idx].name, o->table[idx].name, o->table[idx].name);
            continue;
        } else if (strncmp(argv[i + 1], "--", 2) == 0) {
            OPTIONS_FAIL("command line: --%s needs a value, got option %s (use --%s=VALUE for "
                         "a value starting with --)",
                         o->table[idx].name, options_quote(q, sizeof q, argv[i + 1]),
                         o->table[idx].name);
            i++;
            continue;
        } else {
            value = argv[++i];
        }
        if (!(o->table[idx].scope & o->scope)) {
            options_out_of_scope(o, idx, "--", msg, sizeof msg);
            OPTIONS_FAIL("command line: %s", msg);
            continue;
        }
        as[*nas].idx = idx;
        as[*nas].value = value;
        (*nas)++;
    }
#undef OPTIONS_FAIL
    return failed ? -1 : 0;
}

int options_load(options *o, int argc, char **argv, const char **positional, int *npositional,
                 char *err, size_t errlen)
{
    options_assign *as = NULL;
    size_t nas = 0;
    bool help = false;
    const char *config_path = NULL;
    char envbuf[OPTIONS_ENV_MAX], prefix[OPTIONS_NAME_MAX + 32];
    int config_idx, rc = -1;

    if (o == NULL || argc < 0 || (argc > 0 && argv == NULL)) {
        options_errf(err, errlen, "options_load: invalid arguments");
        return -1;
    }
    if (npositional != NULL)
        *npositional = 0;
    as = calloc(argc > 0 ? (size_t)argc : 1, sizeof *as);
    if (as == NULL) {
        options_errf(err, errlen, "options_load: out of memory");
        return -1;
    }
    if (options_scan_argv(o, argc, argv, as, &nas, positional, npositional, &help, err, errlen) !=
        0) {
        rc = -1;
        if (help) {
            rc = OPTIONS_HELP; /* --help wins over other mistakes on the line */
            options_errf(err, errlen, "%s", "");
        }
        goto out;
    }
    if (help) {
        rc = OPTIONS_HELP;
        goto out;
    }

    /* The config file comes first in precedence, so find its name before
     * anything else is applied: command line, then environment, then o. */
    config_idx = options_find(o, "config");
    if (config_idx >= 0 && (o->table[config_idx].scope & o->scope)) {
        for (size_t i = 0; i < nas; i++)
            if (as[i].idx == config_idx)
                config_path = as[i].value;
        if (config_path == NULL) {
            config_path = getenv(options_env_name(&o->table[config_idx], envbuf, sizeof envbuf));
            if (config_path != NULL && config_path[0] == '\0')
                config_path = NULL;
        }
        if (config_path == NULL)
            config_path = o->vals[config_idx].text;
        /* Loading the file cannot change "config" (files may not set it), so
         * config_path stays valid; env and argv below record the name. */
        if (config_path != NULL && config_path[0] != '\0' &&
            options_load_file(o, config_path, err, errlen) != 0)
            goto out;
    }
    if (options_load_env(o, err, errlen) != 0)
        goto out;
    for (size_t i = 0; i < nas; i++) {
        if (options_apply(o, as[i].idx, as[i].value, OPTIONS_SRC_ARGV, err, errlen) != 0) {
            snprintf(prefix, sizeof prefix, "command line --%s", o->table[as[i].idx].name);
            options_err_prefix(err, errlen, prefix);
            goto out;
        }
    }
    rc = 0;
out:
    free(as);
    return rc;
}

/* ---- getters ---- */

static const options_value *options_get(const options *o, const char *name, unsigned type_mask)
{
    int idx = options_find(o, name);

    if (idx < 0) {
        assert(0 && "options_get: unknown option name");
        return NULL;
    }
    if (!(type_mask & (1u << o->table[idx].type))) {
        assert(0 && "options_get: getter does not match the option's type");
        return NULL;
    }
    return &o->vals[idx];
}

int64_t options_get_int(const options *o, const char *name)
{
    const options_value *v = options_get(o, name, 1u << OPT_INT | 1u << OPT_SIZE);
    return v != NULL ? v->v.i : 0;
}

double options_get_double(const options *o, const char *name)
{
    const options_value *v =
        options_get(o, name, 1u << OPT_DOUBLE | 1u << OPT_INT | 1u << OPT_SIZE);
    int idx = options_find(o, name);

    if (v == NULL)
        return 0;
    return o->table[idx].type == OPT_DOUBLE ? v->v.d : (double)v->v.i;
}

bool options_get_bool(const options *o, const char *name)
{
    const options_value *v = options_get(o, name, 1u << OPT_BOOL);
    return v != NULL ? v->v.b : false;
}

const char *options_get_str(const options *o, const char *name)
{
    const options_value *v = options_get(o, name, ~0u);
    return v != NULL && v->text != NULL ? v->text : "";
}

bool options_is_set(const options *o, const char *name)
{
    int idx = options_find(o, name);
    return idx >= 0 && o->vals[idx].source != OPTIONS_SRC_DEFAULT;
}

/* ---- documentation ---- */

enum {
    OPTIONS_GROUP_GENERAL,
    OPTIONS_GROUP_SERVER,
    OPTIONS_GROUP_CLIENT,
    OPTIONS_GROUP_WORKER,
    OPTIONS_GROUP_TOOL,
    OPTIONS_GROUP_COUNT
};

static const char *const options_group_titles[OPTIONS_GROUP_COUNT] = {
    "General options", "Server options", "Client options (libpsclient)", "Worker options",
    "Tool options"};

static int options_group(const option_def *d)
{
    if ((d->scope & OPT_SCOPE_SERVER) && (d->scope & (OPT_SCOPE_WORKER | OPT_SCOPE_CLIENT)))
        return OPTIONS_GROUP_GENERAL;
    if (d->scope & OPT_SCOPE_SERVER)
        return OPTIONS_GROUP_SERVER;
    if (d->scope & OPT_SCOPE_CLIENT)
        return OPTIONS_GROUP_CLIENT;
    if (d->scope & OPT_SCOPE_WORKER)
        return OPTIONS_GROUP_WORKER;
    return OPTIONS_GROUP_TOOL;
}

static const char *options_type_label(const option_def *d)
{
    switch (d->type) {
    case OPT_INT:
        return "N";
    case OPT_DOUBLE:
        return "X";
    case OPT_STRING:
        return "STR";
    case OPT_SIZE:
        return "SIZE";
    case OPT_ENUM:
        return d->choices;
    case OPT_BOOL:
    default:
        return "";
    }
}

static void options_flag_text(char *buf, size_t cap, const option_def *d)
{
    if (d->type == OPT_BOOL)
        snprintf(buf, cap, "--[no-]%s", d->name);
    else
        snprintf(buf, cap, "--%s=%s", d->name, options_type_label(d));
}

/* Marks a space that must not break a line: "[default: X]" stays whole. */
#define OPTIONS_NBSP '\x01'

/* Writes words of text wrapped to OPTIONS_HELP_WIDTH, continuation lines
 * indented by indent; col is the current column. OPTIONS_NBSP prints as a
 * space that does not break. */
static void options_wrap(FILE *f, const char *text, size_t indent, size_t col)
{
    const char *p = text;

    while (*p != '\0') {
        size_t w;
        while (*p == ' ')
            p++;
        w = strcspn(p, " ");
        if (w == 0)
            break;
        if (col > indent && col + 1 + w > OPTIONS_HELP_WIDTH) {
            fprintf(f, "\n%*s", (int)indent, "");
            col = indent;
        } else if (col > indent) {
            fputc(' ', f);
            col++;
        }
        for (size_t i = 0; i < w; i++)
            fputc(p[i] == OPTIONS_NBSP ? ' ' : p[i], f);
        col += w;
        p += w;
    }
    fputc('\n', f);
}

/* Appends " " and seg to text, seg's spaces made unbreakable. */
static void options_append_unbroken(char *text, size_t cap, const char *seg)
{
    size_t n = strlen(text);

    if (n + 1 < cap)
        text[n++] = ' ';
    for (; *seg != '\0' && n + 1 < cap; seg++)
        text[n++] = *seg == ' ' ? OPTIONS_NBSP : *seg;
    text[n] = '\0';
}

static void options_print_help_table(FILE *f, const option_def *table, size_t n,
                                     const char *program, const char *usage_line, unsigned scope)
{
    char flag[OPTIONS_NAME_MAX + 128], envbuf[OPTIONS_ENV_MAX], text[1024], seg[256];
    size_t left = 0;

    fprintf(f, "Usage: %s %s\n", program != NULL ? program : "program",
            usage_line != NULL ? usage_line : "[OPTIONS]");
    for (size_t i = 0; i < n; i++) {
        if (!(table[i].scope & scope))
            continue;
        options_flag_text(flag, sizeof flag, &table[i]);
        if (strlen(flag) > left)
            left = strlen(flag);
    }
    if (left > OPTIONS_HELP_LEFT_MAX)
        left = OPTIONS_HELP_LEFT_MAX;
    for (int g = 0; g < OPTIONS_GROUP_COUNT; g++) {
        bool titled = false;
        for (size_t i = 0; i < n; i++) {
            const option_def *d = &table[i];
            size_t flen;
            if (!(d->scope & scope) || options_group(d) != g)
                continue;
            if (!titled) {
                fprintf(f, "\n%s:\n", options_group_titles[g]);
                titled = true;
            }
            options_flag_text(flag, sizeof flag, d);
            flen = strlen(flag);
            snprintf(text, sizeof text, "%s", d->help);
            if (d->defval[0] != '\0') {
                snprintf(seg, sizeof seg, "[default: %s]", d->defval);
                options_append_unbroken(text, sizeof text, seg);
            }
            snprintf(seg, sizeof seg, "(env: %s)", options_env_name(d, envbuf, sizeof envbuf));
            options_append_unbroken(text, sizeof text, seg);
            fprintf(f, "  %s", flag);
            if (flen > left) {
                fprintf(f, "\n%*s", (int)(left + 4), "");
            } else {
                fprintf(f, "%*s", (int)(left - flen + 2), "");
            }
            options_wrap(f, text, left + 4, left + 4);
        }
    }
    fprintf(f, "\nSettings apply in the order: defaults < config file (--config) < environment < "
               "command line.\nSizes take a K, M, G or T suffix (1K = 1024). Booleans also take "
               "--no-NAME.\n");
}

void options_print_help(FILE *f, const char *program, const char *usage_line, unsigned scope)
{
    if (f == NULL)
        return;
    options_print_help_table(f, options_table, options_table_len, program, usage_line, scope);
}

/* Writes s with markdown table metacharacters escaped. */
static void options_md_cell(FILE *f, const char *s)
{
    for (; *s != '\0'; s++) {
        if (*s == '|')
            fputs("\\|", f);
        else if (*s == '\n')
            fputc(' ', f);
        else
            fputc(*s, f);
    }
}

void options_print_markdown(FILE *f, unsigned scope)
{
    static const char *const type_names[] = {"int", "double", "bool", "string", "size", "enum"};
    char envbuf[OPTIONS_ENV_MAX], range[80];

    if (f == NULL)
        return;
    fprintf(f, "| Flag | Environment | Type | Default | Description |\n");
    fprintf(f, "|------|-------------|------|---------|-------------|\n");
    for (size_t i = 0; i < options_table_len; i++) {
        const option_def *d = &options_table[i];
        if (!(d->scope & scope))
            continue;
        fprintf(f, "| `--%s` | `%s` | %s", d->name, options_env_name(d, envbuf, sizeof envbuf),
                (unsigned)d->type < sizeof type_names / sizeof type_names[0] ? type_names[d->type]
                                                                             : "?");
        if (d->type == OPT_ENUM) {
            fputs(": ", f);
            options_md_cell(f, d->choices);
        } else if ((d->type == OPT_INT || d->type == OPT_SIZE || d->type == OPT_DOUBLE) &&
                   options_has_bounds(d)) {
            options_format_bounds(range, sizeof range, d);
            fprintf(f, " %s", range);
        }
        fputs(" | ", f);
        if (d->defval[0] != '\0') {
            fputc('`', f);
            options_md_cell(f, d->defval);
            fputc('`', f);
        }
        fputs(" | ", f);
        options_md_cell(f, d->help);
        fputs(" |\n", f);
    }
}
