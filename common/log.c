/* log.c - JSON-lines logging to stderr; see log.h for the contract. */
#include "log.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#define LOG_ROLE_MAX 32
#define LOG_ELLIPSIS "..."
#define LOG_FIELDS_TRUNCATED_JSON ",\"fields_truncated\":true"
#define LOG_FIELDS_TRUNCATED_TEXT " fields_truncated=true"

/* Identity and format; guarded by log_mutex. The minimum level is also kept
 * in an atomic so that filtered-out calls take no lock. */
static pthread_mutex_t log_mutex = PTHREAD_MUTEX_INITIALIZER;
static char log_role[LOG_ROLE_MAX] = "?";
static int log_task = -1;
static log_format log_fmt = LOG_FORMAT_AUTO;
static bool log_set_by_program; /* guarded by log_mutex: log_init was called */
static atomic_int log_min_level = LOG_INFO;
static log_sink_fn log_sink;        /* guarded by log_mutex; NULL: stderr */
static void *log_sink_arg;          /* guarded by log_mutex */
static log_message_fn log_msg_sink; /* guarded by log_mutex; NULL: none */
static void *log_msg_sink_arg;      /* guarded by log_mutex */

static const char *const log_level_names[] = {"debug", "info", "warn", "error"};
static const char *const log_level_upper[] = {"DEBUG", "INFO", "WARN", "ERROR"};

/* A bounded output buffer: appends never overflow, they set `full`. */
typedef struct log_buf {
    char *p;
    size_t len;
    size_t cap; /* usable bytes, excluding the terminating NUL */
    int full;
} log_buf;

static void log_buf_put(log_buf *b, const char *s, size_t n)
{
    if (n > b->cap - b->len) {
        n = b->cap - b->len;
        b->full = 1;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void log_buf_puts(log_buf *b, const char *s)
{
    log_buf_put(b, s, strlen(s));
}

/* Length of the valid UTF-8 sequence starting at s (n bytes available), or
 * 0 if the bytes there are not valid UTF-8 (overlong, surrogate, > U+10FFFF,
 * truncated). */
static size_t log_utf8_len(const unsigned char *s, size_t n)
{
    unsigned char c = s[0];
    size_t len;
    unsigned char lo = 0x80, hi = 0xBF;

    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF)
        len = 2;
    else if (c >= 0xE0 && c <= 0xEF)
        len = 3;
    else if (c >= 0xF0 && c <= 0xF4)
        len = 4;
    else
        return 0;
    if (n < len)
        return 0;
    if (c == 0xE0)
        lo = 0xA0;
    else if (c == 0xED)
        hi = 0x9F;
    else if (c == 0xF0)
        lo = 0x90;
    else if (c == 0xF4)
        hi = 0x8F;
    if (s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < len; i++)
        if (s[i] < 0x80 || s[i] > 0xBF)
            return 0;
    return len;
}

/* Escapes src[0..srclen) into dst (cap bytes, NUL included) and returns the
 * number of source bytes consumed; *written gets the output length. json != 0
 * produces a JSON string body; json == 0 produces text for the human format,
 * where only control characters are escaped. Stops before any escape or
 * character that would not fit whole. */
static size_t log_escape(char *dst, size_t cap, const char *src, size_t srclen, int json,
                         size_t *written)
{
    size_t in = 0, out = 0;
    char tmp[8];

    if (cap == 0) {
        *written = 0;
        return 0;
    }
    while (in < srclen) {
        unsigned char c = (unsigned char)src[in];
        const char *piece = tmp;
        size_t plen, consume = 1;

        if (c == '"' && json) {
            piece = "\\\"";
            plen = 2;
        } else if (c == '\\' && json) {
            piece = "\\\\";
            plen = 2;
        } else if (c == '\n') {
            piece = "\\n";
            plen = 2;
        } else if (c == '\t') {
            piece = "\\t";
            plen = 2;
        } else if (c == '\r') {
            piece = "\\r";
            plen = 2;
        } else if (c < 0x20 || c == 0x7F) {
            if (json && c == '\b') {
                piece = "\\b";
                plen = 2;
            } else if (json && c == '\f') {
                piece = "\\f";
                plen = 2;
            } else {
                snprintf(tmp, sizeof tmp, json ? "\\u%04x" : "\\x%02x", c);
                plen = strlen(tmp);
            }
        } else if (c < 0x80 || !json) {
            piece = src + in;
            plen = 1;
        } else {
            size_t ulen = log_utf8_len((const unsigned char *)src + in, srclen - in);
            if (ulen == 0) {
                piece = "\\ufffd";
                plen = 6;
            } else {
                piece = src + in;
                plen = ulen;
                consume = ulen;
            }
        }
        if (plen > cap - 1 - out)
            break;
        memcpy(dst + out, piece, plen);
        out += plen;
        in += consume;
    }
    dst[out] = '\0';
    *written = out;
    return in;
}

void log_json_escape(char *dst, size_t cap, const char *src)
{
    size_t written;

    if (dst == NULL || cap == 0)
        return;
    if (src == NULL)
        src = "";
    log_escape(dst, cap, src, strlen(src), 1, &written);
}

int log_level_parse(const char *s, log_level *out)
{
    if (s == NULL || out == NULL)
        return -1;
    for (int i = LOG_DEBUG; i <= LOG_ERROR; i++) {
        if (strcasecmp(s, log_level_names[i]) == 0) {
            *out = (log_level)i;
            return 0;
        }
    }
    if (strcasecmp(s, "warning") == 0) {
        *out = LOG_WARN;
        return 0;
    }
    return -1;
}

int log_format_parse(const char *s, log_format *out)
{
    static const char *const names[] = {"auto", "json", "text"};

    if (s == NULL || out == NULL)
        return -1;
    for (int i = LOG_FORMAT_AUTO; i <= LOG_FORMAT_TEXT; i++) {
        if (strcasecmp(s, names[i]) == 0) {
            *out = (log_format)i;
            return 0;
        }
    }
    return -1;
}

const char *log_level_name(log_level lvl)
{
    if ((int)lvl < LOG_DEBUG || (int)lvl > LOG_ERROR)
        return "?";
    return log_level_names[lvl];
}

static log_format log_resolve_format(log_format fmt)
{
    if (fmt == LOG_FORMAT_JSON || fmt == LOG_FORMAT_TEXT)
        return fmt;
    return isatty(STDERR_FILENO) ? LOG_FORMAT_TEXT : LOG_FORMAT_JSON;
}

/* Sets the identity under log_mutex; by_program marks a log_init call. */
static bool log_set_identity(const char *role, int task_index, log_level min_level, log_format fmt,
                             bool by_program)
{
    int saved_errno = errno;
    bool set = false;

    if ((int)min_level < LOG_DEBUG || (int)min_level > LOG_ERROR)
        min_level = LOG_INFO;
    pthread_mutex_lock(&log_mutex);
    if (by_program || !log_set_by_program) {
        snprintf(log_role, sizeof log_role, "%s", role != NULL ? role : "?");
        log_task = task_index < -1 ? -1 : task_index;
        log_fmt = log_resolve_format(fmt);
        atomic_store(&log_min_level, (int)min_level);
        log_set_by_program = log_set_by_program || by_program;
        set = true;
    }
    pthread_mutex_unlock(&log_mutex);
    errno = saved_errno;
    return set;
}

void log_init(const char *role, int task_index, log_level min_level, log_format fmt)
{
    log_set_identity(role, task_index, min_level, fmt, true);
}

bool log_adopt(const char *role, int task_index, log_level min_level, log_format fmt)
{
    return log_set_identity(role, task_index, min_level, fmt, false);
}

bool log_enabled(log_level lvl)
{
    return (int)lvl >= atomic_load(&log_min_level);
}

static void log_timestamp(char *buf, size_t cap)
{
    struct timespec ts;
    struct tm tm;
    int ms;

    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    ms = (int)(ts.tv_nsec / 1000000L) % 1000;
    snprintf(buf, cap, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1,
             tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ms);
}

/* Converts a JSON object-body fragment ("k":v,"k2":"s") to " k=v k2=\"s\"" for
 * the text format: keys lose their quotes, values stay as written. Returns -1
 * if the result does not fit in b. */
static int log_fields_to_text(log_buf *b, const char *f)
{
    int depth = 0, expect_key = 1;

    while (*f != '\0' && !b->full) {
        char c = *f;

        if (c == '"') {
            /* Copy a whole string; keys at depth 0 are copied without quotes. */
            int bare = depth == 0 && expect_key;
            const char *start = f++;
            while (*f != '\0' && *f != '"') {
                if (*f == '\\' && f[1] != '\0')
                    f++;
                f++;
            }
            if (bare) {
                log_buf_puts(b, " ");
                log_buf_put(b, start + 1, (size_t)(f - start - 1));
                expect_key = 0;
            } else {
                log_buf_put(b, start, (size_t)(f - start) + (*f == '"'));
            }
            if (*f == '"')
                f++;
            continue;
        }
        if (depth == 0 && (c == ' ' || c == '\t' || c == '\n' || c == '\r')) {
            f++;
            continue;
        }
        if (depth == 0 && c == ':') {
            log_buf_puts(b, "=");
        } else if (depth == 0 && c == ',') {
            expect_key = 1;
        } else {
            if (c == '{' || c == '[')
                depth++;
            else if ((c == '}' || c == ']') && depth > 0)
                depth--;
            log_buf_put(b, &c, 1);
        }
        f++;
    }
    return b->full ? -1 : 0;
}

static void log_write_all(const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(STDERR_FILENO, p, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return;
        }
        p += w;
        n -= (size_t)w;
    }
}

static void log_vemit(log_level lvl, const char *fields, const char *fmt, va_list ap)
    __attribute__((format(printf, 3, 0)));

static void log_vemit(log_level lvl, const char *fields, const char *fmt, va_list ap)
{
    char msg[LOG_LINE_MAX];
    char line[LOG_LINE_MAX + 1];
    char fieldtext[LOG_LINE_MAX / 2];
    char head[160 + LOG_ROLE_MAX * 6];
    char ts[80];
    char role[LOG_ROLE_MAX * 6 + 1];
    log_buf b = {line, 0, LOG_LINE_MAX, 0};
    int task, json, fields_dropped = 0, msg_truncated = 0, n = 0;
    log_format fmt_now;
    size_t msglen, tail_len, budget, written, consumed;

    if ((int)lvl < LOG_DEBUG || (int)lvl > LOG_ERROR)
        lvl = LOG_ERROR; /* an invalid level must not hide the line */
    if (!log_enabled(lvl))
        return;

    pthread_mutex_lock(&log_mutex);
    task = log_task;
    fmt_now = log_resolve_format(log_fmt);
    json = fmt_now == LOG_FORMAT_JSON;
    log_escape(role, sizeof role, log_role, strlen(log_role), json, &written);
    pthread_mutex_unlock(&log_mutex);

    msg[0] = '\0';
    if (fmt != NULL)
        n = vsnprintf(msg, sizeof msg, fmt, ap);
    if (n < 0)
        msg[0] = '\0';
    else if ((size_t)n >= sizeof msg)
        msg_truncated = 1;
    msglen = strlen(msg);

    /* Another logger takes the message: it formats the line as its own. */
    pthread_mutex_lock(&log_mutex);
    if (log_msg_sink != NULL) {
        log_msg_sink((int)lvl, msg, fields, log_msg_sink_arg);
        pthread_mutex_unlock(&log_mutex);
        return;
    }
    pthread_mutex_unlock(&log_mutex);
    log_timestamp(ts, sizeof ts);
    if (fields != NULL && fields[0] == ',')
        fields++;
    if (fields != NULL && fields[0] == '\0')
        fields = NULL;

    /* Header, then the size of what follows the message, so that the message
     * gets whatever room is left. Fields that take more than half a line are
     * dropped rather than cut, since a cut fragment would not be valid JSON. */
    if (json) {
        snprintf(head, sizeof head,
                 "{\"ts\":\"%s\",\"level\":\"%s\",\"role\":\"%s\",\"task\":%d,\"msg\":\"", ts,
                 log_level_names[lvl], role, task);
        if (fields != NULL && strlen(fields) + 1 >= LOG_LINE_MAX / 2)
            fields_dropped = 1;
        tail_len = strlen("\"}\n");
        if (fields_dropped)
            tail_len += strlen(LOG_FIELDS_TRUNCATED_JSON);
        else if (fields != NULL)
            tail_len += 1 + strlen(fields);
    } else {
        log_buf fb = {fieldtext, 0, sizeof fieldtext - 1, 0};
        fieldtext[0] = '\0';
        snprintf(head, sizeof head, "%s %s %s/%d: ", ts, log_level_upper[lvl], role, task);
        /* The message is the human rendition of the line: the fields (for programs reading
         * JSON) would repeat its values, so the text form shows them only without one. */
        if (fields != NULL && msg[0] != '\0')
            fields = NULL;
        if (fields != NULL && log_fields_to_text(&fb, fields) != 0)
            fields_dropped = 1;
        tail_len = 1 + (fields_dropped ? strlen(LOG_FIELDS_TRUNCATED_TEXT) : fb.len);
    }
    log_buf_puts(&b, head);

    budget = b.cap - b.len;
    if (budget > tail_len + strlen(LOG_ELLIPSIS))
        budget -= tail_len + strlen(LOG_ELLIPSIS);
    else
        budget = 0;
    consumed = log_escape(line + b.len, budget + 1, msg, msglen, json, &written);
    b.len += written;
    if (consumed < msglen || msg_truncated)
        log_buf_puts(&b, LOG_ELLIPSIS);

    if (json) {
        log_buf_puts(&b, "\"");
        if (fields_dropped) {
            log_buf_puts(&b, LOG_FIELDS_TRUNCATED_JSON);
        } else if (fields != NULL) {
            log_buf_puts(&b, ",");
            log_buf_puts(&b, fields);
        }
        log_buf_puts(&b, "}\n");
    } else {
        log_buf_puts(&b, fields_dropped ? LOG_FIELDS_TRUNCATED_TEXT : fieldtext);
        log_buf_puts(&b, "\n");
    }
    if (b.full) /* unreachable given the budget; still end the line */
        line[b.len - 1] = '\n';

    pthread_mutex_lock(&log_mutex);
    if (log_sink != NULL) {
        line[b.len - 1] = '\0'; /* the sink gets the line without its newline */
        log_sink((int)lvl, line, log_sink_arg);
    } else {
        log_write_all(line, b.len);
    }
    pthread_mutex_unlock(&log_mutex);
}

void log_set_message_sink(log_level min_level, log_message_fn fn, void *arg)
{
    if ((int)min_level < LOG_DEBUG || (int)min_level > LOG_ERROR)
        min_level = LOG_INFO;
    pthread_mutex_lock(&log_mutex);
    log_msg_sink = fn;
    log_msg_sink_arg = fn != NULL ? arg : NULL;
    atomic_store(&log_min_level, (int)min_level);
    pthread_mutex_unlock(&log_mutex);
}

void log_set_sink(log_sink_fn fn, void *arg)
{
    pthread_mutex_lock(&log_mutex);
    log_sink = fn;
    log_sink_arg = fn != NULL ? arg : NULL;
    pthread_mutex_unlock(&log_mutex);
}

void log_msg(log_level lvl, const char *fmt, ...)
{
    int saved_errno = errno;
    va_list ap;

    va_start(ap, fmt);
    log_vemit(lvl, NULL, fmt, ap);
    va_end(ap);
    errno = saved_errno;
}

void log_fields(log_level lvl, const char *fields_json, const char *fmt, ...)
{
    int saved_errno = errno;
    va_list ap;

    va_start(ap, fmt);
    log_vemit(lvl, fields_json, fmt, ap);
    va_end(ap);
    errno = saved_errno;
}

bool log_every_due(log_every *e, uint32_t every_ms, uint64_t now_ns)
{
    if (e->logged && now_ns - e->last_ns < (uint64_t)every_ms * 1000000u)
        return false;
    e->logged = true;
    e->last_ns = now_ns;
    return true;
}

void log_every_reset(log_every *e)
{
    e->logged = false;
}
