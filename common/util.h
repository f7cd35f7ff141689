/* util.h - small helpers every component shares: error messages into a caller's buffer,
 * reading a whole file, and names of enum values.
 *
 * Dependency-free (libc only) so that every library of the project, the worker's math
 * included, links it. */
#ifndef PS_COMMON_UTIL_H
#define PS_COMMON_UTIL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>

/* Writes a printf-style message into err (capacity errlen, always NUL-terminated, truncated
 * if longer). Does nothing when err is NULL or errlen is 0. Returns -1, so that a failing
 * function can end with `return errf(err, errlen, ...)`. */
int errf(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int verrf(char *err, size_t errlen, const char *fmt, va_list ap)
    __attribute__((format(printf, 3, 0)));

/* Reads the whole file at path, of at most max bytes, into a NUL-terminated buffer that the
 * caller frees; *len (may be NULL) receives its length. Returns NULL with a message in err
 * ("cannot open: No such file or directory", "is a directory", "larger than N bytes",
 * "read error: ...", "out of memory") on failure. A file holding a NUL byte is read whole:
 * callers that want text check strlen against *len. */
char *read_file(const char *path, size_t max, size_t *len, char *err, size_t errlen);

/* Names of an enum whose values are 0..n-1: names[k] is value k's name (NULL for a hole). */
typedef struct enum_names {
    const char *const *names;
    size_t n;
} enum_names;

#define ENUM_NAMES(array) ((enum_names){(array), sizeof(array) / sizeof((array)[0])})

/* Name of value v, or `unknown` (never NULL) when v is outside 0..n-1 or a hole. */
const char *enum_name(enum_names e, int v, const char *unknown);

/* Value whose name equals s, compared ASCII case-insensitively ("Adam" finds "adam").
 * Returns 0 and stores it in *out; returns -1 and leaves *out untouched for an unknown name
 * or a NULL argument. */
int enum_parse(enum_names e, const char *s, int *out);

/* Writes the names joined by sep ("sgd|momentum|adam") into buf (capacity cap, truncated,
 * always NUL-terminated when cap > 0); returns buf. For error messages and help text. */
const char *enum_list(enum_names e, const char *sep, char *buf, size_t cap);

/* Writes s into buf (capacity cap) as a double-quoted string for a message: '"' and '\\'
 * escaped, control bytes and bytes that are not valid UTF-8 as \xNN (valid UTF-8 is kept), cut with
 * "..." after about max bytes (or when buf is full); NULL is written as "(null)". Returns buf. cap
 * should be at least max + 16. */
const char *quote_text(char *buf, size_t cap, const char *s, size_t max);

/* Length of the valid UTF-8 sequence (1 to 4 bytes: no overlong forms, surrogates or code
 * points above U+10FFFF) that starts at p, of at most n bytes; 0 when the bytes there are not
 * valid UTF-8 (or n is 0). */
size_t utf8_seq_len(const unsigned char *p, size_t n);

/* True when the n bytes at p are valid UTF-8 with no NUL byte; otherwise *bad_at (may be NULL)
 * receives the offset of the first offending byte. */
bool utf8_text_ok(const void *p, size_t n, size_t *bad_at);

/* Copies the NUL-terminated s into buf (capacity cap, always NUL-terminated when cap > 0, cut
 * at a character boundary when full) with every byte that is not part of valid UTF-8 written
 * as \xNN, so that the result is valid UTF-8 whatever s holds (for proto3 string fields).
 * Returns buf. */
const char *utf8_sanitize(char *buf, size_t cap, const char *s);

/* Whether name is a valid variable or table name: 1 to max_len bytes of ASCII letters, digits
 * and _ . / : - (a name both the server and its logs can carry as it is). */
bool name_valid(const char *name, size_t max_len);

/* ASCII case-insensitive equality of two NUL-terminated strings (locale-independent). */
bool ascii_ieq(const char *a, const char *b);

#endif /* PS_COMMON_UTIL_H */
