/* log.h - JSON-lines (or human text) logging to stderr.
 *
 * Every log call formats one complete line into a private buffer and emits it
 * with one write(2) under a process-wide mutex, so lines from concurrent
 * threads never interleave. Lines longer than LOG_LINE_MAX bytes are truncated
 * and the message ends with "...". Logging never aborts and never allocates.
 *
 * JSON form (one object per line):
 *   {"ts":"2026-11-22T10:00:00.123Z","level":"info","role":"ps","task":0,"msg":"..."}
 * Text form (fields as key=value only when the message is empty):
 *   2026-11-22T10:00:00.123Z INFO ps/0: msg
 */
#ifndef PS_COMMON_LOG_H
#define PS_COMMON_LOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Longest line written, newline included; longer lines are truncated. */
#define LOG_LINE_MAX 8192

typedef enum { LOG_DEBUG, LOG_INFO, LOG_WARN, LOG_ERROR } log_level;

/* AUTO is TEXT when stderr is a terminal and JSON otherwise. */
typedef enum { LOG_FORMAT_AUTO, LOG_FORMAT_JSON, LOG_FORMAT_TEXT } log_format;

/* Sets the identity and filtering of every later line: role (e.g. "ps",
 * "worker"; copied, truncated to 31 bytes, NULL means "?"), the task index
 * (-1 if none), the lowest level written and the format. AUTO is resolved
 * here by isatty(stderr). May be called again (e.g. once the task is known);
 * thread-safe, does not block beyond a short mutex. Before the first call the
 * logger behaves as log_init("?", -1, LOG_INFO, LOG_FORMAT_AUTO). */
void log_init(const char *role, int task_index, log_level min_level, log_format fmt);

/* log_init for a library inside a program that never called log_init (a Python or C program
 * with a logger of its own, or none): sets the identity, level and format as log_init would and
 * returns true, unless log_init was called before, in which case the program's settings stay
 * and it returns false. Thread-safe. */
bool log_adopt(const char *role, int task_index, log_level min_level, log_format fmt);

/* Parses "debug", "info", "warn" (or "warning") or "error", case-insensitive,
 * into *out. Returns 0, or -1 (and leaves *out alone) for NULL or any other
 * text. */
int log_level_parse(const char *s, log_level *out);

/* Parses "auto", "json" or "text", case-insensitive, into *out. Returns 0, or
 * -1 (and leaves *out alone) for NULL or any other text. */
int log_format_parse(const char *s, log_format *out);

/* Lowercase name of a level ("debug", "info", "warn", "error"); "?" for a
 * value outside the enum. The string is static. */
const char *log_level_name(log_level lvl);

/* True if a line at lvl would be written under the current settings; lets
 * callers skip building expensive debug output. Thread-safe, non-blocking. */
bool log_enabled(log_level lvl);

/* Formats a message (printf-style) and writes one line at lvl if lvl is at
 * least the configured minimum. A NULL fmt logs an empty message. Never
 * fails; a write error on stderr is ignored (there is nowhere to report it). */
void log_msg(log_level lvl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Like log_msg, with extra structured fields. fields_json is a JSON object
 * body fragment such as "\"step\":3,\"loss\":0.5" that the caller guarantees is
 * valid JSON once wrapped in braces; it is written verbatim after "msg" in the
 * JSON form. The text form is for people and prints the message, which says the
 * same as the fields; it prints the fields as key=value pairs only when the
 * message is empty. NULL or "" means no
 * fields. If the fragment does not fit in the line it is dropped and the line
 * carries "fields_truncated":true instead, so the line stays valid JSON. */
void log_fields(log_level lvl, const char *fields_json, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* A process-wide sink for finished lines. When one is set, every line that
 * passes the minimum level is handed to fn(level, line, arg) instead of being
 * written to stderr: line is the whole line in the configured format, without
 * the trailing newline, valid only during the call. Calls are serialized
 * (under the logger's lock), so fn must not log or call log_set_sink itself.
 * NULL restores writing to stderr. Once log_set_sink returns, the previous
 * sink is no longer called. Thread-safe. */
typedef void (*log_sink_fn)(int level, const char *line, void *arg);
void log_set_sink(log_sink_fn fn, void *arg);

/* A process-wide sink for messages before they become lines, for a program whose own logger
 * (another copy of this module, e.g. a program linking libpsclient) should write them: while
 * one is set, every message at min_level or above is handed to fn(level, msg, fields, arg)
 * (fields: the log_fields fragment, or NULL) and nothing is written here; min_level replaces
 * the minimum level. Calls are serialized under the logger's lock: fn must not log through
 * this copy of the module (it may through another) nor call log_set_message_sink. NULL fn
 * restores writing lines here (the minimum level stays). Takes precedence over log_set_sink.
 * Thread-safe. */
typedef void (*log_message_fn)(int level, const char *msg, const char *fields_json, void *arg);
void log_set_message_sink(log_level min_level, log_message_fn fn, void *arg);

#define log_debug(...) log_msg(LOG_DEBUG, __VA_ARGS__)
#define log_info(...) log_msg(LOG_INFO, __VA_ARGS__)
#define log_warn(...) log_msg(LOG_WARN, __VA_ARGS__)
#define log_error(...) log_msg(LOG_ERROR, __VA_ARGS__)

/* A line that may repeat many times a second (a peer redialling, a condition polled), logged
 * at most once every interval: a zero-initialised log_every, then
 *     if (log_every_due(&e, 5000, time_now_ns()))
 *         log_warn(...);
 * Not thread-safe itself: the caller's lock, if any, guards it. */
typedef struct log_every {
    uint64_t last_ns; /* when the last line let through was due */
    bool logged;      /* false: none yet since the start or log_every_reset */
} log_every;

/* Whether the line e limits is to be logged at now_ns (a monotonic time, time_now_ns): the
 * first time, the first time after log_every_reset, and when every_ms or more have passed
 * since the last line it let through. When true, now_ns becomes the last line's time. */
bool log_every_due(log_every *e, uint32_t every_ms, uint64_t now_ns);

/* Forgets the last line: the next one is due at once (e.g. a new episode of a condition). */
void log_every_reset(log_every *e);

/* Writes src into dst as the body of a JSON string (no surrounding quotes):
 * '"' and '\\' are backslash-escaped, control characters become \n, \t, \r,
 * \b, \f or \u00XX, and bytes that are not valid UTF-8 become \ufffd. Always
 * NUL-terminates when cap > 0 (cap == 0 writes nothing); when the output does
 * not fit it stops before the escape sequence or UTF-8 character that would
 * not fit, so the result is never a broken escape. A NULL src is "". */
void log_json_escape(char *dst, size_t cap, const char *src);

#endif /* PS_COMMON_LOG_H */
