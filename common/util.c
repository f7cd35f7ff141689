/* Shared helpers: see util.h. */
#include "util.h"
#include "timeutil.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int verrf(char *err, size_t errlen, const char *fmt, va_list ap)
{
    if (err != NULL && errlen > 0)
        vsnprintf(err, errlen, fmt, ap);
    return -1;
}

int errf(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    verrf(err, errlen, fmt, ap);
    va_end(ap);
    return -1;
}

char *read_file(const char *path, size_t max, size_t *len, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        errf(err, errlen, "cannot open: %s", strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) {
        fclose(f);
        errf(err, errlen, "is a directory");
        return NULL;
    }
    char *buf = malloc(max + 2);
    if (buf == NULL) {
        fclose(f);
        errf(err, errlen, "out of memory");
        return NULL;
    }
    size_t n = fread(buf, 1, max + 1, f);
    if (ferror(f)) {
        errf(err, errlen, "read error: %s", strerror(errno));
        fclose(f);
        free(buf);
        return NULL;
    }
    fclose(f);
    if (n > max) {
        errf(err, errlen, "larger than %zu bytes", max);
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    if (len != NULL)
        *len = n;
    return buf;
}

size_t utf8_seq_len(const unsigned char *p, size_t n)
{
    if (n == 0)
        return 0;
    unsigned c = p[0];
    if (c < 0x80)
        return 1;
    size_t k;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
        k = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        k = 3;
        if (c == 0xE0)
            lo = 0xA0; /* overlong */
        else if (c == 0xED)
            hi = 0x9F; /* surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        k = 4;
        if (c == 0xF0)
            lo = 0x90; /* overlong */
        else if (c == 0xF4)
            hi = 0x8F; /* above U+10FFFF */
    } else {
        return 0;
    }
    if (n < k || p[1] < lo || p[1] > hi)
        return 0;
    for (size_t i = 2; i < k; i++)
        if (p[i] < 0x80 || p[i] > 0xBF)
            return 0;
    return k;
}

bool utf8_text_ok(const void *p, size_t n, size_t *bad_at)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n;) {
        size_t k = b[i] == 0 ? 0 : utf8_seq_len(b + i, n - i);
        if (k == 0) {
            if (bad_at)
                *bad_at = i;
            return false;
        }
        i += k;
    }
    return true;
}

const char *utf8_sanitize(char *buf, size_t cap, const char *s)
{
    if (cap == 0)
        return buf;
    size_t o = 0, n = strlen(s);
    for (size_t i = 0; i < n;) {
        size_t k = utf8_seq_len((const unsigned char *)s + i, n - i);
        if (k == 0) {
            if (o + 5 > cap)
                break;
            snprintf(buf + o, cap - o, "\\x%02x", (unsigned char)s[i]);
            o += 4;
            i++;
        } else {
            if (o + k + 1 > cap)
                break;
            memcpy(buf + o, s + i, k);
            o += k;
            i += k;
        }
    }
    buf[o] = '\0';
    return buf;
}

const char *quote_text(char *buf, size_t cap, const char *s, size_t max)
{
    size_t o = 0;
    if (cap < 16) {
        if (cap > 0)
            buf[0] = '\0';
        return buf;
    }
    if (s == NULL)
        s = "(null)";
    buf[o++] = '"';
    for (; *s != '\0'; s++) {
        unsigned char c = (unsigned char)*s;
        if (o + 8 >= cap || o > max) {
            memcpy(buf + o, "...", 3);
            o += 3;
            break;
        }
        if (c == '"' || c == '\\') {
            buf[o++] = '\\';
            buf[o++] = (char)c;
        } else if (c < 0x20 || c == 0x7F) {
            o += (size_t)snprintf(buf + o, cap - o, "\\x%02x", c);
        } else if (c >= 0x80) {
            size_t k = utf8_seq_len((const unsigned char *)s, strnlen(s, 4));
            if (k == 0 || o + k + 8 >= cap) {
                o += (size_t)snprintf(buf + o, cap - o, "\\x%02x", c);
            } else {
                memcpy(buf + o, s, k);
                o += k;
                s += k - 1;
            }
        } else {
            buf[o++] = (char)c;
        }
    }
    buf[o++] = '"';
    buf[o] = '\0';
    return buf;
}

static int ascii_lower(int c)
{
    return c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c;
}

bool ascii_ieq(const char *a, const char *b)
{
    for (; *a != '\0' && *b != '\0'; a++, b++) {
        if (ascii_lower((unsigned char)*a) != ascii_lower((unsigned char)*b))
            return false;
    }
    return *a == *b;
}

const char *enum_name(enum_names e, int v, const char *unknown)
{
    if (v < 0 || (size_t)v >= e.n || e.names[v] == NULL)
        return unknown;
    return e.names[v];
}

int enum_parse(enum_names e, const char *s, int *out)
{
    if (s == NULL || out == NULL)
        return -1;
    for (size_t k = 0; k < e.n; k++) {
        if (e.names[k] != NULL && ascii_ieq(s, e.names[k])) {
            *out = (int)k;
            return 0;
        }
    }
    return -1;
}

const char *enum_list(enum_names e, const char *sep, char *buf, size_t cap)
{
    if (cap == 0)
        return buf;
    size_t off = 0;
    buf[0] = '\0';
    for (size_t k = 0; k < e.n && off < cap; k++) {
        if (e.names[k] == NULL)
            continue;
        int w = snprintf(buf + off, cap - off, "%s%s", off ? sep : "", e.names[k]);
        if (w < 0)
            break;
        off += (size_t)w;
    }
    return buf;
}

bool name_valid(const char *name, size_t max_len)
{
    size_t n = strlen(name);
    if (n == 0 || n > max_len)
        return false;
    for (size_t i = 0; i < n; i++) {
        char ch = name[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '_' || ch == '.' || ch == '/' || ch == ':' || ch == '-'))
            return false;
    }
    return true;
}

_Thread_local uint64_t time_op_ms_in_force;

uint64_t time_wall_forward_ms(void)
{
    static _Atomic uint64_t last;
    uint64_t t = time_wall_ms(), seen = atomic_load(&last);
    while (t > seen && !atomic_compare_exchange_weak(&last, &seen, t))
        ;
    return t > seen ? t : seen;
}
