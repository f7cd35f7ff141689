/* data_csv.c - CSV reader for users' own data: label first, then features. */
#include "data.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "util.h"

/* Parses one field [s, end) as a finite number. Leading/trailing blanks are
 * allowed. Returns false for anything else. */
static bool parse_num(const char *s, const char *end, double *out)
{
    while (s < end && (*s == ' ' || *s == '\t'))
        s++;
    while (end > s && (end[-1] == ' ' || end[-1] == '\t'))
        end--;
    if (s == end || end - s > 63)
        return false;
    char tmp[64];
    memcpy(tmp, s, (size_t)(end - s));
    tmp[end - s] = '\0';
    char *stop = NULL;
    errno = 0;
    double v = strtod(tmp, &stop);
    if (stop != tmp + (end - s) || errno == ERANGE || !isfinite(v))
        return false;
    *out = v;
    return true;
}

static size_t count_fields(const char *line)
{
    size_t n = 1;
    for (const char *p = line; *p != '\0'; p++)
        n += *p == ',';
    return n;
}

int data_load_csv(const char *path, dataset *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof(*out));
    struct stat st;
    if (stat(path, &st) != 0)
        return errf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
    if (S_ISDIR(st.st_mode))
        return errf(err, errlen, "%s: is a directory, expected a CSV file", path);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return errf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
    char *line = NULL;
    size_t linecap = 0;
    ssize_t len;
    size_t lineno = 0, fields = 0, n = 0, cap = 0;
    bool seen_first = false;
    int maxlab = -1;
    int rc = -1;
    while ((len = getline(&line, &linecap, f)) >= 0) {
        lineno++;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
            line[--len] = '\0';
        if ((size_t)len != strlen(line)) {
            errf(err, errlen, "%s:%zu: NUL byte in line: not a text CSV file", path, lineno);
            goto out;
        }
        const char *p = line;
        while (*p == ' ' || *p == '\t')
            p++;
        if (*p == '\0')
            continue;
        size_t nf = count_fields(line);
        if (!seen_first) {
            seen_first = true;
            if (nf < 2) {
                errf(err, errlen, "%s:%zu: %zu field(s); expected a label and at least one feature",
                     path, lineno, nf);
                goto out;
            }
            fields = nf;
            const char *comma = strchr(line, ',');
            double dummy;
            if (!parse_num(line, comma, &dummy))
                continue; /* a header line */
        }
        if (nf != fields) {
            errf(err, errlen, "%s:%zu: %zu fields, but the first line has %zu", path, lineno, nf,
                 fields);
            goto out;
        }
        if (n == cap) {
            size_t ncap = cap == 0 ? 1024 : cap * 2;
            size_t dim = fields - 1;
            if (ncap > SIZE_MAX / sizeof(float) / dim) {
                errf(err, errlen, "%s: too many rows", path);
                goto out;
            }
            float *nx = realloc(out->x, ncap * dim * sizeof(float));
            if (nx != NULL)
                out->x = nx;
            int32_t *ny = realloc(out->y, ncap * sizeof(int32_t));
            if (ny != NULL)
                out->y = ny;
            if (nx == NULL || ny == NULL) {
                errf(err, errlen, "%s: out of memory at line %zu", path, lineno);
                goto out;
            }
            cap = ncap;
        }
        const char *s = line;
        for (size_t k = 0; k < fields; k++) {
            const char *e = strchr(s, ',');
            if (e == NULL)
                e = s + strlen(s);
            double v;
            if (!parse_num(s, e, &v)) {
                errf(err, errlen, "%s:%zu: field %zu is not a number: '%.*s'", path, lineno, k + 1,
                     (int)((e - s) > 40 ? 40 : (e - s)), s);
                goto out;
            }
            if (k == 0) {
                if (v < 0 || v >= DATA_MAX_CLASSES || v != floor(v)) {
                    errf(err, errlen,
                         "%s:%zu: label '%.*s' is not a class index (an integer in 0..%d)", path,
                         lineno, (int)((e - s) > 40 ? 40 : (e - s)), s, DATA_MAX_CLASSES - 1);
                    goto out;
                }
                out->y[n] = (int32_t)v;
                if ((int)v > maxlab)
                    maxlab = (int)v;
            } else {
                out->x[n * (fields - 1) + (k - 1)] = (float)v;
            }
            s = *e == ',' ? e + 1 : e;
        }
        n++;
    }
    if (ferror(f)) {
        errf(err, errlen, "%s: read error: %s", path, strerror(errno));
        goto out;
    }
    if (n == 0) {
        errf(err, errlen, "%s: no data rows", path);
        goto out;
    }
    out->n = n;
    out->dim = fields - 1;
    out->num_classes = maxlab + 1;
    rc = 0;
out:
    free(line);
    fclose(f);
    if (rc != 0)
        dataset_free(out);
    return rc;
}
