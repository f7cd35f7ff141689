/* ps-options-doc: the README's settings tables, generated from the option table.
 *
 *   ps-options-doc SECTION            print the markdown table of one section
 *   ps-options-doc --print FILE       print FILE with every marked table regenerated
 *   ps-options-doc --update FILE      regenerate the marked tables of FILE in place
 *
 * A marked table is every line between "<!-- settings:SECTION -->" and "<!-- /settings -->"
 * (each on a line of its own). SECTION is one of server, client, worker (its own settings,
 * without the client ones), local (ps-local) and bench (ps-bench). Exit code 0, or 2 with a
 * message naming the file and line for a bad marker or an unreadable file. Built, not
 * installed; the meson test readme-settings compares README.md with --print. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "options.h"
#include "program.h"
#include "util.h"

#define DOC_FILE_MAX (4 * 1024 * 1024)

typedef struct doc_section {
    const char *name;
    unsigned scope, exclude;
} doc_section;

static const doc_section doc_sections[] = {
    {"server", OPT_SCOPE_SERVER, 0},
    {"client", OPT_SCOPE_CLIENT, 0},
    {"worker", OPT_SCOPE_WORKER, OPT_SCOPE_CLIENT},
    {"local", OPT_SCOPE_LAUNCHER, 0},
    {"bench", OPT_SCOPE_TOOL, 0},
};

static const char begin_prefix[] = "<!-- settings:";
static const char begin_suffix[] = " -->";
static const char end_marker[] = "<!-- /settings -->";

static const doc_section *doc_find(const char *name, size_t len)
{
    for (size_t i = 0; i < sizeof doc_sections / sizeof doc_sections[0]; i++)
        if (strlen(doc_sections[i].name) == len && strncmp(doc_sections[i].name, name, len) == 0)
            return &doc_sections[i];
    return NULL;
}

/* The section a begin marker line names (NULL with *is_marker false if the line is no
 * marker; NULL with *is_marker true for an unknown section). */
static const doc_section *doc_begin(const char *line, size_t len, bool *is_marker)
{
    size_t plen = sizeof begin_prefix - 1, slen = sizeof begin_suffix - 1;

    *is_marker = len > plen + slen && strncmp(line, begin_prefix, plen) == 0 &&
                 strncmp(line + len - slen, begin_suffix, slen) == 0;
    if (!*is_marker)
        return NULL;
    return doc_find(line + plen, len - plen - slen);
}

static bool doc_is_end(const char *line, size_t len)
{
    return len == sizeof end_marker - 1 && strncmp(line, end_marker, len) == 0;
}

/* Writes text to out with every marked table regenerated. Returns 0, or -1 with a message
 * on stderr. */
static int doc_rewrite(const char *path, const char *text, FILE *out)
{
    const doc_section *open = NULL;
    size_t lineno = 0, open_line = 0;

    for (const char *p = text; *p != '\0';) {
        const char *nl = strchr(p, '\n');
        size_t len = nl != NULL ? (size_t)(nl - p) : strlen(p);
        bool is_marker;
        const doc_section *s = doc_begin(p, len, &is_marker);

        lineno++;
        if (is_marker) {
            if (open != NULL) {
                fprintf(stderr,
                        "ps-options-doc: %s:%zu: settings marker inside the table opened "
                        "at line %zu (missing %s)\n",
                        path, lineno, open_line, end_marker);
                return -1;
            }
            if (s == NULL) {
                fprintf(stderr,
                        "ps-options-doc: %s:%zu: unknown settings section %.*s (one of server, "
                        "client, worker, local, bench)\n",
                        path, lineno, (int)len, p);
                return -1;
            }
            fprintf(out, "%.*s\n", (int)len, p);
            options_print_markdown(out, s->scope, s->exclude);
            open = s;
            open_line = lineno;
        } else if (doc_is_end(p, len)) {
            if (open == NULL) {
                fprintf(stderr, "ps-options-doc: %s:%zu: %s without an opening marker\n", path,
                        lineno, end_marker);
                return -1;
            }
            fprintf(out, "%.*s\n", (int)len, p);
            open = NULL;
        } else if (open == NULL) {
            fprintf(out, "%.*s%s", (int)len, p, nl != NULL ? "\n" : "");
        }
        p += len + (nl != NULL);
    }
    if (open != NULL) {
        fprintf(stderr, "ps-options-doc: %s:%zu: settings table never closed (missing %s)\n", path,
                open_line, end_marker);
        return -1;
    }
    return 0;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: ps-options-doc SECTION | --print FILE | --update FILE\n"
               "  SECTION        print the settings table of server, client, worker, local or "
               "bench\n"
               "  --print FILE   print FILE with every table between <!-- settings:SECTION --> "
               "and\n"
               "                 <!-- /settings --> regenerated\n"
               "  --update FILE  regenerate those tables in FILE itself\n");
}

int main(int argc, char **argv)
{
    char err[256];
    size_t len = 0;

    if (argc == 2 && strcmp(argv[1], "--version") == 0) {
        program_print_version(stdout, "ps-options-doc");
        return 0;
    }
    if (argc == 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        usage(stdout);
        return 0;
    }
    if (argc == 2 && argv[1][0] != '-') {
        const doc_section *s = doc_find(argv[1], strlen(argv[1]));
        if (s == NULL) {
            fprintf(stderr, "ps-options-doc: unknown section \"%s\"\n", argv[1]);
            usage(stderr);
            return 2;
        }
        options_print_markdown(stdout, s->scope, s->exclude);
        return 0;
    }
    if (argc != 3 || (strcmp(argv[1], "--print") != 0 && strcmp(argv[1], "--update") != 0)) {
        if (argc >= 2 && argv[1][0] == '-' && strcmp(argv[1], "--print") != 0 &&
            strcmp(argv[1], "--update") != 0)
            fprintf(stderr, "ps-options-doc: unknown option '%s'\n", argv[1]);
        usage(stderr);
        return 2;
    }
    const char *path = argv[2];
    char *text = read_file(path, DOC_FILE_MAX, &len, err, sizeof err);
    if (text == NULL) {
        fprintf(stderr, "ps-options-doc: %s: %s\n", path, err);
        return 2;
    }
    if (strlen(text) != len) {
        fprintf(stderr, "ps-options-doc: %s: contains a NUL byte\n", path);
        free(text);
        return 2;
    }
    int rc = 0;
    if (strcmp(argv[1], "--print") == 0) {
        rc = doc_rewrite(path, text, stdout) == 0 ? 0 : 2;
    } else {
        char *out = NULL;
        size_t outlen = 0;
        FILE *mem = open_memstream(&out, &outlen);
        if (mem == NULL) {
            rc = 2;
        } else {
            rc = doc_rewrite(path, text, mem) == 0 ? 0 : 2;
            fclose(mem);
        }
        if (rc == 0 && (outlen != len || memcmp(out, text, len) != 0)) {
            FILE *f = fopen(path, "w");
            if (f == NULL || fwrite(out, 1, outlen, f) != outlen || fclose(f) != 0) {
                fprintf(stderr, "ps-options-doc: cannot write %s\n", path);
                rc = 2;
            }
        }
        free(out);
    }
    free(text);
    return rc;
}
