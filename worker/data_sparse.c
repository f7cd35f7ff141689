/* data_sparse.c - reader of sparse example files: a label and a list of feature ids per line.
 *
 * Format (text): one example per line, "LABEL ID ID ...", fields separated by blanks; LABEL an
 * integer class in [0, DATA_MAX_CLASSES), each ID an integer in [0, 2^63) (a hashed feature:
 * the row of an embedding table); an example may have no id. Blank lines and lines starting
 * with '#' are skipped. tools/apt_features.py writes such files from apt's package index. */
#include "data.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "util.h"

/* One parsed line: its label and ids (into a growing scratch array). */
static int parse_line(const char *path, size_t lineno, char *line, int32_t *label, int64_t **ids,
                      size_t *nids, size_t *idcap, char *err, size_t errlen)
{
    char *p = line, *end = NULL;
    errno = 0;
    long lab = strtol(p, &end, 10);
    if (end == p || errno != 0 || lab < 0 || lab >= DATA_MAX_CLASSES)
        return errf(err, errlen, "%s:%zu: the label must be an integer in 0..%d", path, lineno,
                    DATA_MAX_CLASSES - 1);
    *label = (int32_t)lab;
    *nids = 0;
    p = end;
    for (;;) {
        while (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n')
            p++;
        if (*p == '\0')
            break;
        errno = 0;
        long long id = strtoll(p, &end, 10);
        if (end == p || errno != 0 ||
            (*end != '\0' && *end != ' ' && *end != '\t' && *end != '\r' && *end != '\n')) {
            int len = (int)strcspn(p, " \t\r\n");
            return errf(err, errlen, "%s:%zu: '%.*s' is not an integer id", path, lineno,
                        len < 20 ? len : 20, p);
        }
        if (id < 0)
            return errf(err, errlen, "%s:%zu: id %lld is negative (ids are 0..2^63-1)", path,
                        lineno, id);
        if (*nids == *idcap) {
            size_t ncap = *idcap ? *idcap * 2 : 64;
            int64_t *n = realloc(*ids, ncap * sizeof(int64_t));
            if (n == NULL)
                return errf(err, errlen, "%s:%zu: out of memory", path, lineno);
            *ids = n;
            *idcap = ncap;
        }
        (*ids)[(*nids)++] = (int64_t)id;
        p = end;
    }
    return 0;
}

int data_load_sparse(const char *path, size_t max_ids, dataset *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof(*out));
    struct stat st;
    if (stat(path, &st) != 0)
        return errf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
    if (S_ISDIR(st.st_mode))
        return errf(err, errlen, "%s: is a directory, expected a sparse example file", path);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return errf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
    /* Two passes: the widest line sets dim, then the examples are filled in. */
    char *line = NULL;
    size_t linecap = 0, lineno = 0, n = 0, width = 0, nids = 0, idcap = 0;
    int64_t *ids = NULL;
    int rc = 0, maxlab = -1;
    int32_t label = 0;
    for (int pass = 0; pass < 2 && rc == 0; pass++) {
        rewind(f);
        lineno = 0;
        size_t row = 0;
        while (rc == 0 && getline(&line, &linecap, f) >= 0) {
            lineno++;
            char *s = line;
            while (*s == ' ' || *s == '\t')
                s++;
            if (*s == '#' || *s == '\n' || *s == '\r' || *s == '\0')
                continue;
            rc = parse_line(path, lineno, s, &label, &ids, &nids, &idcap, err, errlen);
            if (rc != 0)
                break;
            if (pass == 0) {
                if (nids > max_ids) {
                    rc = errf(err, errlen, "%s:%zu: %zu ids, more than the %zu an example may have",
                              path, lineno, nids, max_ids);
                    break;
                }
                if (nids > width)
                    width = nids;
                if (label > maxlab)
                    maxlab = label;
                n++;
                continue;
            }
            int64_t *x = out->ids + row * width;
            for (size_t j = 0; j < width; j++)
                x[j] = j < nids ? ids[j] : -1;
            out->y[row++] = label;
        }
        if (rc == 0 && ferror(f))
            rc = errf(err, errlen, "%s: read error: %s", path, strerror(errno));
        if (rc == 0 && pass == 0) {
            if (n == 0) {
                rc = errf(err, errlen, "%s: no examples", path);
                break;
            }
            if (width == 0)
                width = 1; /* every example without ids: one padding column */
            if ((uint64_t)n * width * sizeof(int64_t) > DATA_MAX_BYTES) {
                rc = errf(err, errlen, "%s: %zu examples of %zu ids exceed %llu bytes", path, n,
                          width, (unsigned long long)DATA_MAX_BYTES);
                break;
            }
            out->ids = malloc(n * width * sizeof(int64_t));
            out->y = malloc(n * sizeof(int32_t));
            if (out->ids == NULL || out->y == NULL)
                rc = errf(err, errlen, "%s: out of memory for %zu examples", path, n);
            out->n = n;
            out->dim = width;
            out->num_classes = maxlab + 1;
        }
    }
    free(line);
    free(ids);
    fclose(f);
    if (rc != 0)
        dataset_free(out);
    return rc;
}
