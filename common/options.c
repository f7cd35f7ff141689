/* options.c - the options object: creation, lookup by name, setting one
 * value, and the getters; see options.h for the contract. Values are parsed
 * in options_value.c, loaded in options_load.c, documented in options_doc.c. */
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "options_internal.h"
#include "util.h"

/* ---- table and lifecycle ---- */

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
        int rc;
        if (table[i].type == OPT_LIST) {
            o->vals[i].text = strdup(""); /* an empty list */
            rc = o->vals[i].text != NULL ? 0 : -1;
        } else {
            rc = options_parse_value(&table[i], table[i].defval, &o->vals[i], msg, sizeof msg);
            assert(rc == 0 && "options table default does not parse; run options_table_validate");
        }
        if (rc != 0) {
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
        options_value_free(&o->vals[i]);
    free(o->vals);
    free(o);
}

/* ---- lookup ---- */

int options_find_n(const options *o, const char *name, size_t len)
{
    int first = -1;

    for (size_t i = 0; i < o->n; i++) {
        if (strlen(o->table[i].name) != len || strncmp(o->table[i].name, name, len) != 0)
            continue;
        if (o->table[i].scope & o->scope)
            return (int)i;
        if (first < 0)
            first = (int)i;
    }
    return first;
}

int options_find(const options *o, const char *name)
{
    if (o == NULL || name == NULL)
        return -1;
    return options_find_n(o, name, strlen(name));
}

static void options_scope_names(char *buf, size_t cap, unsigned scope)
{
    static const char *const names[] = {"server", "worker", "client", "ps-bench", "ps-local"};
    size_t o = 0;

    buf[0] = '\0';
    for (unsigned i = 0; i < sizeof names / sizeof names[0]; i++) {
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

void options_unknown(const options *o, const char *dashes, const char *name, size_t len, char *err,
                     size_t errlen)
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
        errf(err, errlen, "unknown option %s (did you mean %s%s?)", q, dashes, best);
    else
        errf(err, errlen, "unknown option %s", q);
}

void options_out_of_scope(const options *o, int idx, const char *dashes, char *err, size_t errlen)
{
    char mine[80], theirs[80];

    options_scope_names(mine, sizeof mine, o->scope);
    options_scope_names(theirs, sizeof theirs, o->table[idx].scope);
    errf(err, errlen, "option %s%s is not accepted by this program (%s); it applies to: %s", dashes,
         o->table[idx].name, mine, theirs);
}

/* ---- setting values ---- */

void options_list_clear(options *o, int idx)
{
    options_value *v = &o->vals[idx];
    char *empty = strdup("");

    if (empty == NULL)
        return; /* keep the old items rather than lose the text */
    for (size_t i = 0; i < v->nitems; i++)
        free(v->items[i]);
    v->nitems = 0;
    free(v->text);
    v->text = empty;
}

int options_apply(options *o, int idx, const char *value, options_source src, char *err,
                  size_t errlen)
{
    const option_def *d = &o->table[idx];
    options_value v;

    if (d->type == OPT_LIST) {
        if (src == OPTIONS_SRC_ENV)
            options_list_clear(o, idx);
        if (options_list_append(d, &o->vals[idx], value != NULL ? value : "", err, errlen) != 0)
            return -1;
        o->vals[idx].source = src;
        return 0;
    }
    if (options_parse_value(d, value, &v, err, errlen) != 0)
        return -1;
    options_value_free(&o->vals[idx]);
    v.source = src;
    o->vals[idx] = v;
    return 0;
}

int options_set(options *o, const char *name, const char *value, char *err, size_t errlen)
{
    int idx;

    if (o == NULL || name == NULL)
        return errf(err, errlen, "options_set: NULL %s", o == NULL ? "options" : "name");
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

/* ---- typed getters ---- */

/* The value of a row of options_table of one of the types in type_mask. */
static const options_value *options_row(const options *o, unsigned row, unsigned type_mask)
{
    if (o == NULL || o->table != options_table || row >= o->n) {
        assert(0 && "typed option getter on an object of another table");
        return NULL;
    }
    if (!(type_mask & (1u << o->table[row].type))) {
        assert(0 && "option id of another type (options_table.h out of date?)");
        return NULL;
    }
    return &o->vals[row];
}

int64_t opt_int(const options *o, opt_int_id id)
{
    const options_value *v = options_row(o, id.row, 1u << OPT_INT | 1u << OPT_SIZE);
    return v != NULL ? v->v.i : 0;
}

double opt_double(const options *o, opt_double_id id)
{
    const options_value *v = options_row(o, id.row, 1u << OPT_DOUBLE);
    return v != NULL ? v->v.d : 0.0;
}

bool opt_bool(const options *o, opt_bool_id id)
{
    const options_value *v = options_row(o, id.row, 1u << OPT_BOOL);
    return v != NULL && v->v.b;
}

const char *opt_str(const options *o, opt_str_id id)
{
    const options_value *v = options_row(o, id.row, 1u << OPT_STRING);
    return v != NULL && v->text != NULL ? v->text : "";
}

const char *opt_enum(const options *o, opt_enum_id id)
{
    const options_value *v = options_row(o, id.row, 1u << OPT_ENUM);
    return v != NULL && v->text != NULL ? v->text : "";
}

size_t opt_list(const options *o, opt_list_id id, const char *const **items)
{
    const options_value *v = options_row(o, id.row, 1u << OPT_LIST);

    if (items != NULL)
        *items = v != NULL ? (const char *const *)v->items : NULL;
    return v != NULL ? v->nitems : 0;
}

bool options_is_set_row(const options *o, unsigned row)
{
    const options_value *v = options_row(o, row, ~0u);
    return v != NULL && v->source != OPTIONS_SRC_DEFAULT;
}

const char *options_text_row(const options *o, unsigned row)
{
    const options_value *v = options_row(o, row, ~0u);
    return v != NULL && v->text != NULL ? v->text : "";
}

/* ---- by-name getters ---- */

static const options_value *options_get(const options *o, const char *name, unsigned type_mask,
                                        int *idx_out)
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
    if (idx_out != NULL)
        *idx_out = idx;
    return &o->vals[idx];
}

int64_t options_get_int(const options *o, const char *name)
{
    const options_value *v = options_get(o, name, 1u << OPT_INT | 1u << OPT_SIZE, NULL);
    return v != NULL ? v->v.i : 0;
}

double options_get_double(const options *o, const char *name)
{
    int idx = -1;
    const options_value *v =
        options_get(o, name, 1u << OPT_DOUBLE | 1u << OPT_INT | 1u << OPT_SIZE, &idx);

    if (v == NULL)
        return 0;
    return o->table[idx].type == OPT_DOUBLE ? v->v.d : (double)v->v.i;
}

bool options_get_bool(const options *o, const char *name)
{
    const options_value *v = options_get(o, name, 1u << OPT_BOOL, NULL);
    return v != NULL ? v->v.b : false;
}

const char *options_get_str(const options *o, const char *name)
{
    const options_value *v = options_get(o, name, ~0u, NULL);
    return v != NULL && v->text != NULL ? v->text : "";
}

bool options_is_set(const options *o, const char *name)
{
    int idx = options_find(o, name);
    return idx >= 0 && o->vals[idx].source != OPTIONS_SRC_DEFAULT;
}
