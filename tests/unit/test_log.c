/* Unit tests for common/log.c: escaping, line shape, filtering, truncation
 * and concurrent writers. stderr is captured with dup2 onto a temp file. */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <json-c/json.h>

#include "log.h"

#define assert_contains(hay, needle)                                                               \
    do {                                                                                           \
        if (strstr((hay), (needle)) == NULL)                                                       \
            fail_msg("expected \"%s\" to contain \"%s\"", (hay), (needle));                        \
    } while (0)

/* ---- stderr capture ---- */

static int capture_saved = -1;
static FILE *capture_file;

static void capture_begin(void)
{
    capture_file = tmpfile();
    assert_non_null(capture_file);
    fflush(stderr);
    capture_saved = dup(STDERR_FILENO);
    assert_true(capture_saved >= 0);
    assert_true(dup2(fileno(capture_file), STDERR_FILENO) >= 0);
}

/* Restores stderr and returns what was written (caller frees). */
static char *capture_end(void)
{
    long n;
    char *buf;

    fflush(stderr);
    assert_true(dup2(capture_saved, STDERR_FILENO) >= 0);
    close(capture_saved);
    capture_saved = -1;
    assert_int_equal(fseek(capture_file, 0, SEEK_END), 0);
    n = ftell(capture_file);
    assert_true(n >= 0);
    rewind(capture_file);
    buf = malloc((size_t)n + 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)n, capture_file), (size_t)n);
    buf[n] = '\0';
    fclose(capture_file);
    capture_file = NULL;
    return buf;
}

static size_t count_lines(const char *s)
{
    size_t n = 0;
    for (; *s != '\0'; s++)
        n += *s == '\n';
    return n;
}

/* Parses one JSON line (without its newline) and checks the common fields. */
static struct json_object *parse_line(const char *line, size_t len, const char *level,
                                      const char *role, int task)
{
    struct json_tokener *tok = json_tokener_new();
    struct json_object *obj, *f;

    obj = json_tokener_parse_ex(tok, line, (int)len);
    if (obj == NULL || json_tokener_get_error(tok) != json_tokener_success)
        fail_msg("line is not JSON: %.*s", (int)len, line);
    json_tokener_free(tok);
    assert_true(json_object_is_type(obj, json_type_object));
    assert_true(json_object_object_get_ex(obj, "ts", &f));
    assert_int_equal(strlen(json_object_get_string(f)), strlen("2026-11-22T10:00:00.123Z"));
    assert_int_equal(json_object_get_string(f)[23], 'Z');
    assert_true(json_object_object_get_ex(obj, "level", &f));
    assert_string_equal(json_object_get_string(f), level);
    assert_true(json_object_object_get_ex(obj, "role", &f));
    assert_string_equal(json_object_get_string(f), role);
    assert_true(json_object_object_get_ex(obj, "task", &f));
    assert_true(json_object_is_type(f, json_type_int));
    assert_int_equal(json_object_get_int(f), task);
    assert_true(json_object_object_get_ex(obj, "msg", &f));
    assert_true(json_object_is_type(f, json_type_string));
    return obj;
}

static const char *msg_of(struct json_object *obj)
{
    struct json_object *f;
    assert_true(json_object_object_get_ex(obj, "msg", &f));
    return json_object_get_string(f);
}

/* ---- tests ---- */

/* Must run first: the logger works before log_init. */
static void test_before_init(void **state)
{
    char *out;
    struct json_object *obj;

    (void)state;
    capture_begin();
    log_debug("hidden at the default level");
    log_info("before init %d", 7);
    out = capture_end();
    assert_int_equal(count_lines(out), 1);
    obj = parse_line(out, strlen(out) - 1, "info", "?", -1);
    assert_string_equal(msg_of(obj), "before init 7");
    json_object_put(obj);
    free(out);
}

/* Must run second: a library adopts an identity until a program calls log_init, which then
 * stays. */
static void test_adopt_until_init(void **state)
{
    char *out;
    struct json_object *obj;

    (void)state;
    assert_true(log_adopt("worker", 3, LOG_INFO, LOG_FORMAT_JSON));
    capture_begin();
    log_info("adopted");
    out = capture_end();
    obj = parse_line(out, strlen(out) - 1, "info", "worker", 3);
    json_object_put(obj);
    free(out);

    log_init("ps", 1, LOG_INFO, LOG_FORMAT_JSON);
    assert_false(log_adopt("client", -1, LOG_DEBUG, LOG_FORMAT_TEXT));
    capture_begin();
    log_debug("still filtered");
    log_info("the program's");
    out = capture_end();
    assert_int_equal(count_lines(out), 1);
    obj = parse_line(out, strlen(out) - 1, "info", "ps", 1);
    assert_string_equal(msg_of(obj), "the program's");
    json_object_put(obj);
    free(out);
}

static void test_escape(void **state)
{
    char buf[64];

    (void)state;
    log_json_escape(buf, sizeof buf, "a\"b\\c");
    assert_string_equal(buf, "a\\\"b\\\\c");
    log_json_escape(buf, sizeof buf, "\n\t\r\b\f\x01\x1f");
    assert_string_equal(buf, "\\n\\t\\r\\b\\f\\u0001\\u001f");
    log_json_escape(buf, sizeof buf, "h\xc3\xa9llo \xe2\x82\xac");
    assert_string_equal(buf, "h\xc3\xa9llo \xe2\x82\xac");
    log_json_escape(buf, sizeof buf,
                    "bad\xff"
                    "end\xc3");
    assert_string_equal(buf, "bad\\ufffdend\\ufffd");
    log_json_escape(buf, sizeof buf, "\xed\xa0\x80"); /* a UTF-16 surrogate */
    assert_string_equal(buf, "\\ufffd\\ufffd\\ufffd");
    log_json_escape(buf, sizeof buf, NULL);
    assert_string_equal(buf, "");
}

static void test_escape_truncates_safely(void **state)
{
    char buf[8];

    (void)state;
    memset(buf, 'x', sizeof buf);
    log_json_escape(buf, 4, "\"\"\"");
    assert_string_equal(buf, "\\\""); /* the second \" would need 2 of 1 bytes left */
    log_json_escape(buf, 6, "\x01");
    assert_string_equal(buf, ""); /* \u0001 needs 6 + NUL */
    log_json_escape(buf, 7, "\x01");
    assert_string_equal(buf, "\\u0001");
    log_json_escape(buf, 2, "\xc3\xa9");
    assert_string_equal(buf, ""); /* never split a UTF-8 character */
    log_json_escape(buf, 1, "abc");
    assert_string_equal(buf, "");
    buf[0] = 'q';
    log_json_escape(buf, 0, "abc");
    assert_int_equal(buf[0], 'q');
    log_json_escape(buf, sizeof buf, "abcdefghij");
    assert_string_equal(buf, "abcdefg");
}

static void test_parse_level_format(void **state)
{
    log_level l = LOG_DEBUG;
    log_format f = LOG_FORMAT_AUTO;

    (void)state;
    assert_int_equal(log_level_parse("warn", &l), 0);
    assert_int_equal(l, LOG_WARN);
    assert_int_equal(log_level_parse("ERROR", &l), 0);
    assert_int_equal(l, LOG_ERROR);
    assert_int_equal(log_level_parse("verbose", &l), -1);
    assert_int_equal(l, LOG_ERROR);
    assert_int_equal(log_level_parse(NULL, &l), -1);
    assert_int_equal(log_format_parse("json", &f), 0);
    assert_int_equal(f, LOG_FORMAT_JSON);
    assert_int_equal(log_format_parse("text", &f), 0);
    assert_int_equal(f, LOG_FORMAT_TEXT);
    assert_int_equal(log_format_parse("xml", &f), -1);
    assert_string_equal(log_level_name(LOG_WARN), "warn");
    assert_string_equal(log_level_name((log_level)42), "?");
}

static void test_json_line(void **state)
{
    char *out;
    struct json_object *obj, *f;
    const char *nl;

    (void)state;
    log_init("ps", 3, LOG_DEBUG, LOG_FORMAT_JSON);
    capture_begin();
    errno = EAGAIN;
    log_info("hello %s \"q\" \\ tab\tnl\n", "world");
    assert_int_equal(errno, EAGAIN); /* logging leaves errno alone */
    log_fields(LOG_WARN, "\"step\":3,\"loss\":0.5,\"name\":\"a b\"", "step %d done", 3);
    out = capture_end();
    assert_int_equal(count_lines(out), 2);

    nl = strchr(out, '\n');
    obj = parse_line(out, (size_t)(nl - out), "info", "ps", 3);
    assert_string_equal(msg_of(obj), "hello world \"q\" \\ tab\tnl\n");
    json_object_put(obj);

    obj = parse_line(nl + 1, strlen(nl + 1) - 1, "warn", "ps", 3);
    assert_string_equal(msg_of(obj), "step 3 done");
    assert_true(json_object_object_get_ex(obj, "step", &f));
    assert_int_equal(json_object_get_int(f), 3);
    assert_true(json_object_object_get_ex(obj, "loss", &f));
    assert_true(json_object_get_double(f) == 0.5);
    assert_true(json_object_object_get_ex(obj, "name", &f));
    assert_string_equal(json_object_get_string(f), "a b");
    json_object_put(obj);
    free(out);
}

static void test_level_filter(void **state)
{
    char *out;

    (void)state;
    log_init("worker", 0, LOG_WARN, LOG_FORMAT_JSON);
    assert_false(log_enabled(LOG_INFO));
    assert_true(log_enabled(LOG_ERROR));
    capture_begin();
    log_debug("no");
    log_info("no");
    log_warn("yes");
    log_error("yes");
    out = capture_end();
    assert_int_equal(count_lines(out), 2);
    assert_contains(out, "\"level\":\"warn\"");
    assert_contains(out, "\"level\":\"error\"");
    free(out);
}

static void test_text_format(void **state)
{
    char *out;

    (void)state;
    log_init("worker", 1, LOG_INFO, LOG_FORMAT_TEXT);
    capture_begin();
    log_fields(LOG_INFO, "\"step\":3,\"name\":\"x y\"", "pushed %d", 2);
    log_fields(LOG_INFO, "\"step\":3,\"name\":\"x y\"", "%s", "");
    log_error("two\nlines");
    out = capture_end();
    assert_int_equal(count_lines(out), 3);
    /* The message says what the fields say: they are not printed twice. */
    assert_contains(out, "Z INFO worker/1: pushed 2\n");
    assert_contains(out, "Z INFO worker/1:  step=3 name=\"x y\"\n");
    assert_contains(out, "Z ERROR worker/1: two\\nlines\n");
    assert_int_equal(out[4], '-'); /* starts with the timestamp */
    free(out);
}

static void test_truncation(void **state)
{
    char *big = malloc(20000), *fields = malloc(6000), *out;
    struct json_object *obj, *f;
    const char *msg;

    (void)state;
    assert_non_null(big);
    assert_non_null(fields);
    memset(big, 'a', 19999);
    big[19999] = '\0';
    big[100] = '"'; /* escapes must not break the cut */
    snprintf(fields, 6000, "\"blob\":\"%05000d\"", 0);

    log_init("ps", 0, LOG_INFO, LOG_FORMAT_JSON);
    capture_begin();
    log_info("%s", big);
    log_fields(LOG_INFO, fields, "%s", big);
    out = capture_end();
    assert_int_equal(count_lines(out), 2);
    {
        const char *nl = strchr(out, '\n');
        assert_true((size_t)(nl - out) + 1 <= LOG_LINE_MAX);
        obj = parse_line(out, (size_t)(nl - out), "info", "ps", 0);
        msg = msg_of(obj);
        assert_true(strlen(msg) > 4000);
        assert_string_equal(msg + strlen(msg) - 3, "...");
        json_object_put(obj);

        assert_true(strlen(nl + 1) <= LOG_LINE_MAX);
        obj = parse_line(nl + 1, strlen(nl + 1) - 1, "info", "ps", 0);
        assert_true(json_object_object_get_ex(obj, "fields_truncated", &f));
        assert_true(json_object_get_boolean(f));
        assert_false(json_object_object_get_ex(obj, "blob", NULL));
        json_object_put(obj);
    }
    free(out);
    free(big);
    free(fields);
}

#define THREADS 8
#define LINES_PER_THREAD 200

static void *writer(void *arg)
{
    char pad[1500];
    int id = (int)(intptr_t)arg;

    memset(pad, 'a' + id, sizeof pad - 1);
    pad[sizeof pad - 1] = '\0';
    for (int i = 0; i < LINES_PER_THREAD; i++)
        log_fields(LOG_INFO, "\"k\":1", "t%d i%d %s", id, i, pad);
    return NULL;
}

static void test_concurrent_lines_do_not_interleave(void **state)
{
    pthread_t th[THREADS];
    char *out, *line;
    size_t n = 0;

    (void)state;
    log_init("worker", 2, LOG_INFO, LOG_FORMAT_JSON);
    capture_begin();
    for (int t = 0; t < THREADS; t++)
        assert_int_equal(pthread_create(&th[t], NULL, writer, (void *)(intptr_t)t), 0);
    for (int t = 0; t < THREADS; t++)
        pthread_join(th[t], NULL);
    out = capture_end();
    line = out;
    while (*line != '\0') {
        char *nl = strchr(line, '\n');
        struct json_object *obj;
        assert_non_null(nl);
        obj = parse_line(line, (size_t)(nl - line), "info", "worker", 2);
        json_object_put(obj);
        n++;
        line = nl + 1;
    }
    assert_int_equal(n, THREADS * LINES_PER_THREAD);
    free(out);
}

/* log_every: the first line is due, then one per interval, and at once after a reset. Times
 * are given, not read from a clock. */
static void test_log_every(void **state)
{
    (void)state;
    const uint64_t ms = 1000000u, t0 = 123456789u * ms;
    log_every e = {0};
    assert_true(log_every_due(&e, 5000, t0));
    assert_false(log_every_due(&e, 5000, t0));
    assert_false(log_every_due(&e, 5000, t0 + 4999 * ms));
    assert_true(log_every_due(&e, 5000, t0 + 5000 * ms));
    assert_false(log_every_due(&e, 5000, t0 + 9999 * ms)); /* counted from the last line */
    assert_true(log_every_due(&e, 5000, t0 + 10000 * ms));
    log_every_reset(&e);
    assert_true(log_every_due(&e, 5000, t0 + 10001 * ms));
    assert_false(log_every_due(&e, 5000, t0 + 10002 * ms));
    log_every z = {0}; /* the first line is due whatever the time */
    assert_true(log_every_due(&z, 5000, 0));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_before_init),
        cmocka_unit_test(test_adopt_until_init),
        cmocka_unit_test(test_escape),
        cmocka_unit_test(test_escape_truncates_safely),
        cmocka_unit_test(test_parse_level_format),
        cmocka_unit_test(test_json_line),
        cmocka_unit_test(test_level_filter),
        cmocka_unit_test(test_text_format),
        cmocka_unit_test(test_truncation),
        cmocka_unit_test(test_concurrent_lines_do_not_interleave),
        cmocka_unit_test(test_log_every),
    };
    return cmocka_run_group_tests_name("log", tests, NULL, NULL);
}
