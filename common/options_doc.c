/* options_doc.c - documentation generated from the table: the --help text of
 * a program and the README's markdown tables; see options.h. */
#include <stdio.h>
#include <string.h>

#include "options_internal.h"

#define OPTIONS_HELP_WIDTH 100
#define OPTIONS_HELP_LEFT_MAX 34

enum {
    OPTIONS_GROUP_GENERAL,
    OPTIONS_GROUP_SERVER,
    OPTIONS_GROUP_CLIENT,
    OPTIONS_GROUP_WORKER,
    OPTIONS_GROUP_LAUNCHER,
    OPTIONS_GROUP_TOOL,
    OPTIONS_GROUP_COUNT
};

static const char *const options_group_titles[OPTIONS_GROUP_COUNT] = {
    "General options",
    "Server options",
    "Client options (libpsclient)",
    "Worker options",
    "Launcher options (ps-local)",
    "Benchmark options (ps-bench)"};

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
    if (d->scope & OPT_SCOPE_LAUNCHER)
        return OPTIONS_GROUP_LAUNCHER;
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
    case OPT_LIST:
        return "ARG";
    case OPT_BOOL:
    default:
        return "";
    }
}

static void options_flag_text(char *buf, size_t cap, const option_def *d)
{
    if (d->type == OPT_BOOL && strncmp(d->name, "no-", 3) == 0)
        snprintf(buf, cap, "--%s", d->name); /* "--no-no-x" helps nobody */
    else if (d->type == OPT_BOOL)
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

void options_print_markdown(FILE *f, unsigned scope, unsigned exclude)
{
    static const char *const type_names[] = {"int",  "double", "bool", "string",
                                             "size", "enum",   "list"};
    char envbuf[OPTIONS_ENV_MAX], range[80];

    if (f == NULL)
        return;
    fprintf(f, "| Flag | Environment | Type | Default | Description |\n");
    fprintf(f, "|------|-------------|------|---------|-------------|\n");
    for (size_t i = 0; i < options_table_len; i++) {
        const option_def *d = &options_table[i];
        if (!(d->scope & scope) || (d->scope & exclude))
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
