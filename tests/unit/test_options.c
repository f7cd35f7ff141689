/* Unit tests for the options module (common/options*.c) and the real table in
 * options_table.def. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "http_endpoint.h"
#include "options.h"

#define ERRLEN 512
#define ARGC(a) ((int)(sizeof(a) / sizeof((a)[0])))

#define assert_contains(hay, needle)                                                               \
    do {                                                                                           \
        if (strstr((hay), (needle)) == NULL)                                                       \
            fail_msg("expected \"%s\" to contain \"%s\"", (hay), (needle));                        \
    } while (0)

/* A private table with the types the real one does not use yet. */
static const option_def test_table[] = {
    {.name = "verbose",
     .type = OPT_BOOL,
     .scope = OPT_SCOPE_TOOL,
     .defval = "false",
     .help = "Say more."},
    {.name = "rate",
     .type = OPT_DOUBLE,
     .scope = OPT_SCOPE_TOOL,
     .defval = "0.5",
     .min = 0,
     .max = 1,
     .help = "A fraction."},
    {.name = "count",
     .type = OPT_INT,
     .scope = OPT_SCOPE_TOOL,
     .defval = "3",
     .min = 1,
     .max = 10,
     .env = "TEST_OPTIONS_COUNT",
     .help = "How many."},
    {.name = "name", .type = OPT_STRING, .scope = OPT_SCOPE_TOOL, .defval = "", .help = "A name."},
};

/* Removes every variable the real and test tables read, so that the
 * environment of whoever runs the tests cannot change the results. */
static int clear_env(void **state)
{
    static const char *const vars[] = {
        "PS_CONFIG",
        "PS_LOG_LEVEL",
        "PS_LOG_FORMAT",
        "PS_CLUSTER",
        "PS_TASK",
        "TF_CONFIG",
        "PS_LISTEN",
        "PS_THREADS",
        "PS_RPC_CONTEXTS",
        "PS_DEDUP_WINDOW",
        "PS_DEADLINE_MS",
        "PS_MAX_MESSAGE_BYTES",
        "PS_VERBOSE",
        "PS_RATE",
        "TEST_OPTIONS_COUNT",
        "PS_NAME",
        "PS_RETRIES",
        "PS_INLINE_MAX_BYTES",
        "PS_LOCAL_SERVER_ARG",
        "PS_LOCAL_PS",
        "PS_LOCAL_WORKERS",
        "PS_LOCAL_TIMEOUT",
        "PS_BENCH_TIMEOUT",
        "PS_PROGRESS",
    };
    (void)state;
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        unsetenv(vars[i]);
    return 0;
}

/* Writes text to a new temp file; returns its path (static buffer). */
static const char *write_temp(const char *text)
{
    static char path[64];
    int fd;

    snprintf(path, sizeof path, "/tmp/test_options_XXXXXX");
    fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    return path;
}

static void test_table_is_valid(void **state)
{
    char err[ERRLEN] = "";
    static const option_def bad_default[] = {{.name = "x",
                                              .type = OPT_INT,
                                              .scope = OPT_SCOPE_TOOL,
                                              .defval = "11",
                                              .min = 1,
                                              .max = 10,
                                              .help = "h"}};
    static const option_def dup[] = {
        {.name = "x", .type = OPT_INT, .scope = OPT_SCOPE_TOOL, .defval = "1", .help = "h"},
        {.name = "x", .type = OPT_INT, .scope = OPT_SCOPE_TOOL, .defval = "1", .help = "h"}};
    static const option_def bad_name[] = {{.name = "Bad_Name",
                                           .type = OPT_STRING,
                                           .scope = OPT_SCOPE_TOOL,
                                           .defval = "",
                                           .help = "h"}};

    (void)state;
    if (options_table_validate(options_table, options_table_len, err, sizeof err) != 0)
        fail_msg("options_table is invalid: %s", err);
    assert_int_equal(options_table_validate(test_table, ARGC(test_table), err, sizeof err), 0);
    assert_int_equal(options_table_validate(bad_default, 1, err, sizeof err), -1);
    assert_contains(err, "option x: bad default");
    assert_int_equal(options_table_validate(dup, 2, err, sizeof err), -1);
    assert_contains(err, "duplicate");
    assert_int_equal(options_table_validate(bad_name, 1, err, sizeof err), -1);
    assert_contains(err, "Bad_Name");
}

static void test_defaults(void **state)
{
    options *o = NULL;

    (void)state;
    assert_int_equal(options_create(&o, OPT_SCOPE_SERVER), 0);
    assert_non_null(o);
    assert_int_equal(opt_int(o, OPT_THREADS), 0);
    assert_int_equal(opt_int(o, OPT_RPC_CONTEXTS), 64);
    assert_int_equal(opt_int(o, OPT_MAX_MESSAGE_BYTES), 64 << 20);
    assert_int_equal(opt_int(o, OPT_INLINE_MAX_BYTES), 64 << 10);
    assert_int_equal(opt_int(o, OPT_DEFAULT_DEADLINE_MS), 30000);
    assert_int_equal(opt_int(o, OPT_DEDUP_WINDOW), 4096);
    assert_int_equal(opt_int(o, OPT_SHUTDOWN_GRACE_MS), 2000);
    assert_string_equal(opt_enum(o, OPT_LOG_LEVEL), "info");
    assert_string_equal(opt_enum(o, OPT_LOG_FORMAT), "auto");
    assert_string_equal(opt_str(o, OPT_CLUSTER), "");
    assert_false(opt_is_set(o, OPT_THREADS));
    /* out of scope: readable at its default, never settable */
    assert_int_equal(opt_int(o, OPT_WORKER_ID), -1);
    assert_int_equal(opt_int(o, OPT_SPLIT_THRESHOLD_BYTES), 1 << 20);
    assert_false(options_is_set(o, "no-such-option"));
    options_destroy(o);
    options_destroy(NULL);

    assert_int_equal(options_create(&o, OPT_SCOPE_CLIENT), 0);
    assert_int_equal(opt_int(o, OPT_RETRIES), 5);
    assert_int_equal(opt_int(o, OPT_CHUNK_BYTES), 1 << 20);
    assert_int_equal(opt_int(o, OPT_CONNECTIONS), 4);
    options_destroy(o);
}

static void test_set_good_and_bad(void **state)
{
    options *o = NULL;
    char err[ERRLEN];

    (void)state;
    assert_int_equal(options_create(&o, OPT_SCOPE_SERVER), 0);
    assert_int_equal(options_set(o, "threads", "8", err, sizeof err), 0);
    assert_int_equal(opt_int(o, OPT_THREADS), 8);
    assert_true(opt_is_set(o, OPT_THREADS));

    assert_int_equal(options_set(o, "threads", "-1", err, sizeof err), -1);
    assert_contains(err, "threads: \"-1\" is out of range 0..256");
    assert_int_equal(options_set(o, "threads", "257", err, sizeof err), -1);
    assert_contains(err, "out of range");
    assert_int_equal(options_set(o, "threads", "abc", err, sizeof err), -1);
    assert_contains(err, "threads: \"abc\" is not an integer");
    assert_int_equal(options_set(o, "threads", "4x", err, sizeof err), -1);
    assert_int_equal(options_set(o, "threads", "", err, sizeof err), -1);
    assert_int_equal(options_set(o, "threads", "99999999999999999999", err, sizeof err), -1);
    assert_int_equal(opt_int(o, OPT_THREADS), 8); /* unchanged by failures */
    assert_int_equal(options_set(o, "threads", " 16 ", err, sizeof err), 0);
    assert_int_equal(opt_int(o, OPT_THREADS), 16);

    assert_int_equal(options_set(o, "max-message-bytes", "1G", err, sizeof err), 0);
    assert_int_equal(opt_int(o, OPT_MAX_MESSAGE_BYTES), INT64_C(1) << 30);
    assert_int_equal(options_set(o, "max-message-bytes", "512KiB", err, sizeof err), 0);
    assert_int_equal(opt_int(o, OPT_MAX_MESSAGE_BYTES), 512 * 1024);
    assert_int_equal(options_set(o, "max-message-bytes", "8192", err, sizeof err), 0);
    assert_int_equal(opt_int(o, OPT_MAX_MESSAGE_BYTES), 8192);
    assert_int_equal(options_set(o, "max-message-bytes", "64Q", err, sizeof err), -1);
    assert_contains(err, "max-message-bytes: \"64Q\" is not a size");
    assert_int_equal(options_set(o, "max-message-bytes", "1.5M", err, sizeof err), -1);
    assert_contains(err, "is not a size");
    assert_int_equal(options_set(o, "max-message-bytes", "-1", err, sizeof err), -1);
    assert_int_equal(options_set(o, "max-message-bytes", "1K", err, sizeof err), -1);
    assert_contains(err, "out of range 4K..2G");
    assert_int_equal(options_set(o, "max-message-bytes", "3G", err, sizeof err), -1);
    assert_int_equal(options_set(o, "max-message-bytes", "99999999999T", err, sizeof err), -1);
    assert_int_equal(opt_int(o, OPT_MAX_MESSAGE_BYTES), 8192);

    assert_int_equal(options_set(o, "log-level", "DEBUG", err, sizeof err), 0);
    assert_string_equal(opt_enum(o, OPT_LOG_LEVEL), "debug");
    assert_int_equal(options_set(o, "log-level", "verbose", err, sizeof err), -1);
    assert_contains(err, "log-level: \"verbose\" is not one of debug|info|warn|error");
    assert_int_equal(options_set(o, "log-level", "deb", err, sizeof err), -1);

    assert_int_equal(options_set(o, "threadz", "3", err, sizeof err), -1);
    assert_contains(err, "unknown option \"threadz\"");
    assert_contains(err, "did you mean threads");
    assert_int_equal(options_set(o, "deadline-ms", "100", err, sizeof err), -1);
    assert_contains(err, "deadline-ms is not accepted by this program");

    assert_int_equal(options_set(o, "listen", "tcp://0.0.0.0:2222", err, sizeof err), 0);
    assert_string_equal(opt_str(o, OPT_LISTEN), "tcp://0.0.0.0:2222");
    options_destroy(o);
}

static void test_bool_double_custom_table(void **state)
{
    options *o = NULL;
    char err[ERRLEN];
    char *argv[] = {"tool", "--verbose", "--rate=0.25"};
    char *argv2[] = {"tool", "--verbose", "--no-verbose"};
    char *argv3[] = {"tool", "--no-verbose=1"};
    char *argv4[] = {"tool", "--no-count"};

    (void)state;
    assert_int_equal(options_create_with_table(&o, test_table, ARGC(test_table), OPT_SCOPE_TOOL),
                     0);
    assert_false(options_get_bool(o, "verbose"));
    assert_true(options_get_double(o, "rate") == 0.5);
    assert_int_equal(options_load(o, ARGC(argv), argv, NULL, NULL, err, sizeof err), 0);
    assert_true(options_get_bool(o, "verbose"));
    assert_true(options_get_double(o, "rate") == 0.25);
    assert_int_equal(options_load(o, ARGC(argv2), argv2, NULL, NULL, err, sizeof err), 0);
    assert_false(options_get_bool(o, "verbose"));
    assert_true(options_is_set(o, "verbose"));
    assert_int_equal(options_load(o, ARGC(argv3), argv3, NULL, NULL, err, sizeof err), -1);
    assert_contains(err, "--no-verbose takes no value");
    assert_int_equal(options_load(o, ARGC(argv4), argv4, NULL, NULL, err, sizeof err), -1);
    assert_contains(err, "unknown option \"--no-count\"");

    assert_int_equal(options_set(o, "verbose", "YES", err, sizeof err), 0);
    assert_true(options_get_bool(o, "verbose"));
    assert_int_equal(options_set(o, "verbose", "off", err, sizeof err), 0);
    assert_false(options_get_bool(o, "verbose"));
    assert_int_equal(options_set(o, "verbose", "maybe", err, sizeof err), -1);
    assert_contains(err, "verbose: \"maybe\" is not a boolean");
    assert_int_equal(options_set(o, "rate", "1.5", err, sizeof err), -1);
    assert_contains(err, "rate: \"1.5\" is out of range 0..1");
    assert_int_equal(options_set(o, "rate", "nan", err, sizeof err), -1);
    assert_contains(err, "not a finite number");
    assert_int_equal(options_set(o, "rate", "1e-3", err, sizeof err), 0);
    assert_true(options_get_double(o, "rate") == 1e-3);
    /* a custom env name */
    setenv("TEST_OPTIONS_COUNT", "7", 1);
    assert_int_equal(options_load_env(o, err, sizeof err), 0);
    assert_int_equal(options_get_int(o, "count"), 7);
    setenv("TEST_OPTIONS_COUNT", "70", 1);
    assert_int_equal(options_load_env(o, err, sizeof err), -1);
    assert_contains(err, "environment variable TEST_OPTIONS_COUNT: count: \"70\" is out of range");
    unsetenv("TEST_OPTIONS_COUNT");
    options_destroy(o);
}

static void test_precedence_file_env_argv(void **state)
{
    options *o = NULL;
    char err[ERRLEN];
    const char *path = write_temp("{\"threads\": 3, \"rpc-contexts\": 10, \"dedup-window\": 100,\n"
                                  " \"log-level\": \"warn\", \"deadline-ms\": 5}\n");
    char pathcopy[64];
    char *argv[] = {"ps-server", "--config", pathcopy, "--dedup-window=300"};

    (void)state;
    snprintf(pathcopy, sizeof pathcopy, "%s", path);
    setenv("PS_RPC_CONTEXTS", "20", 1);
    setenv("PS_DEDUP_WINDOW", "200", 1);
    assert_int_equal(options_create(&o, OPT_SCOPE_SERVER), 0);
    if (options_load(o, ARGC(argv), argv, NULL, NULL, err, sizeof err) != 0)
        fail_msg("load failed: %s", err);
    assert_int_equal(opt_int(o, OPT_THREADS), 3);        /* file */
    assert_int_equal(opt_int(o, OPT_RPC_CONTEXTS), 20);  /* env over file */
    assert_int_equal(opt_int(o, OPT_DEDUP_WINDOW), 300); /* argv over env */
    assert_string_equal(opt_enum(o, OPT_LOG_LEVEL), "warn");
    assert_int_equal(opt_int(o, OPT_DEFAULT_DEADLINE_MS), 30000); /* untouched */
    assert_string_equal(opt_str(o, OPT_CONFIG), pathcopy);
    assert_true(opt_is_set(o, OPT_THREADS));
    assert_false(opt_is_set(o, OPT_LISTEN));
    options_destroy(o);

    /* PS_CONFIG names the file when --config does not */
    setenv("PS_CONFIG", pathcopy, 1);
    char *argv2[] = {"ps-server"};
    assert_int_equal(options_create(&o, OPT_SCOPE_SERVER), 0);
    assert_int_equal(options_load(o, ARGC(argv2), argv2, NULL, NULL, err, sizeof err), 0);
    assert_int_equal(opt_int(o, OPT_THREADS), 3);
    assert_int_equal(opt_int(o, OPT_DEDUP_WINDOW), 200);
    options_destroy(o);

    /* a missing config file is an error naming it */
    setenv("PS_CONFIG", "/nonexistent/ps.json", 1);
    assert_int_equal(options_create(&o, OPT_SCOPE_SERVER), 0);
    assert_int_equal(options_load(o, ARGC(argv2), argv2, NULL, NULL, err, sizeof err), -1);
    assert_contains(err, "config file /nonexistent/ps.json: cannot open");
    options_destroy(o);

    /* a bad environment value names the variable */
    unsetenv("PS_CONFIG");
    setenv("PS_THREADS", "many", 1);
    assert_int_equal(options_create(&o, OPT_SCOPE_SERVER), 0);
    assert_int_equal(options_load(o, ARGC(argv2), argv2, NULL, NULL, err, sizeof err), -1);
    assert_contains(err, "environment variable PS_THREADS: threads: \"many\" is not an integer");
    options_destroy(o);

    clear_env(NULL);
    unlink(pathcopy);
}

static void test_help(void **state)
{
    options *o = NULL;
    char err[ERRLEN];
    char *argv[] = {"ps-server", "--help"};
    char *argv2[] = {"ps-server", "--bogus", "-h"};
    char *argv3[] = {"ps-server", "--", "--help"};
    const char *pos[4];
    int npos = -1;
    char *text = NULL;
    size_t len = 0;
    FILE *f;

    (void)state;
    assert_int_equal(options_create(&o, OPT_SCOPE_SERVER), 0);
    assert_int_equal(options_load(o, ARGC(argv), argv, NULL, NULL, err, sizeof err), OPTIONS_HELP);
    assert_int_equal(options_load(o, ARGC(argv2), argv2, NULL, NULL, err, sizeof err),
                     OPTIONS_HELP);
    assert_int_equal(options_load(o, ARGC(argv3), argv3, pos, &npos, err, sizeof err), 0);
    assert_int_equal(npos, 1);
    assert_string_equal(pos[0], "--help");
    options_destroy(o);

    f = open_memstream(&text, &len);
    assert_non_null(f);
    options_print_help(f, "ps-server", "[OPTIONS]", OPT_SCOPE_SERVER);
    fclose(f);
    assert_contains(text, "Usage: ps-server [OPTIONS]");
    assert_contains(text, "Server options:");
    assert_contains(text, "--threads=N");
    assert_contains(text, "[default: 0]");
    assert_contains(text, "(env: PS_THREADS)");
    assert_contains(text, "(env: TF_CONFIG)");
    assert_contains(text, "--log-level=debug|info|warn|error");
    assert_null(strstr(text, "--deadline-ms")); /* a client option */
    free(text);

    f = open_memstream(&text, &len);
    options_print_help(f, "ps-worker", NULL, OPT_SCOPE_WORKER);
    fclose(f);
    assert_contains(text, "--deadline-ms=N");
    assert_null(strstr(text, "--threads="));
    free(text);

    f = open_memstream(&text, &len);
    options_print_markdown(f, OPT_SCOPE_ALL, 0);
    fclose(f);
    assert_contains(text, "| Flag | Environment | Type | Default | Description |");
    assert_contains(text, "| `--threads` | `PS_THREADS` | int 0..256 | `0` |");
    assert_contains(text, "enum: debug\\|info\\|warn\\|error");
    assert_contains(text,
                    "| `--max-message-bytes` | `PS_MAX_MESSAGE_BYTES` | size 4K..2G | `64M` |");
    free(text);
}

static void test_argv_forms_and_positional(void **state)
{
    options *o = NULL;
    char err[ERRLEN];
    const char *pos[16];
    int npos = -1;
    char *argv[] = {"ps-server",          "a", "--threads", "4",  "b",
                    "--listen=tcp://x:1", "-", "--",        "--c"};
    char *argv_no_pos[] = {"ps-server", "stray"};
    char *argv_missing[] = {"ps-server", "--threads"};
    char *argv_dash[] = {"ps-server", "--threads", "--listen=x"};
    char *argv_unknown[] = {"ps-server", "--thread=3"};
    char *argv_short[] = {"ps-server", "-t"};
    char *argv_scope[] = {"ps-server", "--retries=3"};
    char *argv_value[] = {"ps-server", "--threads=300"};

    (void)state;
    assert_int_equal(options_create(&o, OPT_SCOPE_SERVER), 0);
    if (options_load(o, ARGC(argv), argv, pos, &npos, err, sizeof err) != 0)
        fail_msg("load failed: %s", err);
    assert_int_equal(npos, 4);
    assert_string_equal(pos[0], "a");
    assert_string_equal(pos[1], "b");
    assert_string_equal(pos[2], "-");
    assert_string_equal(pos[3], "--c");
    assert_int_equal(opt_int(o, OPT_THREADS), 4);
    assert_string_equal(opt_str(o, OPT_LISTEN), "tcp://x:1");

    assert_int_equal(options_load(o, ARGC(argv_no_pos), argv_no_pos, NULL, NULL, err, sizeof err),
                     -1);
    assert_contains(err, "unexpected argument \"stray\"");
    assert_int_equal(options_load(o, ARGC(argv_missing), argv_missing, NULL, NULL, err, sizeof err),
                     -1);
    assert_contains(err, "--threads needs a value");
    assert_int_equal(options_load(o, ARGC(argv_dash), argv_dash, NULL, NULL, err, sizeof err), -1);
    assert_contains(err, "--threads needs a value, got option \"--listen=x\"");
    assert_int_equal(options_load(o, ARGC(argv_unknown), argv_unknown, NULL, NULL, err, sizeof err),
                     -1);
    assert_contains(err, "unknown option \"--thread\" (did you mean --threads?)");
    assert_int_equal(options_load(o, ARGC(argv_short), argv_short, NULL, NULL, err, sizeof err),
                     -1);
    assert_contains(err, "unknown option \"-t\"");
    assert_int_equal(options_load(o, ARGC(argv_scope), argv_scope, NULL, NULL, err, sizeof err),
                     -1);
    assert_contains(err, "--retries is not accepted by this program");
    assert_int_equal(options_load(o, ARGC(argv_value), argv_value, NULL, NULL, err, sizeof err),
                     -1);
    assert_contains(err, "command line --threads: threads: \"300\" is out of range 0..256");
    options_destroy(o);
}

static void test_file_errors_and_forms(void **state)
{
    options *o = NULL;
    char err[ERRLEN], path[64];

    (void)state;
    assert_int_equal(options_create(&o, OPT_SCOPE_SERVER), 0);

    snprintf(path, sizeof path, "%s", write_temp("{\"threads\": 2, \"nosuch-key\": 1}"));
    assert_int_equal(options_load_file(o, path, err, sizeof err), -1);
    assert_contains(err, path);
    assert_contains(err, "unknown option \"nosuch-key\"");
    unlink(path);

    snprintf(path, sizeof path, "%s", write_temp("{\"threads\": 2,\n \"listen\": }"));
    assert_int_equal(options_load_file(o, path, err, sizeof err), -1);
    assert_contains(err, "invalid JSON at line 2");
    unlink(path);

    snprintf(path, sizeof path, "%s", write_temp("[1, 2]"));
    assert_int_equal(options_load_file(o, path, err, sizeof err), -1);
    assert_contains(err, "expected a JSON object");
    unlink(path);

    snprintf(path, sizeof path, "%s", write_temp("{\"threads\": \"x\"}"));
    assert_int_equal(options_load_file(o, path, err, sizeof err), -1);
    assert_contains(err, "threads: \"x\" is not an integer");
    unlink(path);

    snprintf(path, sizeof path, "%s", write_temp("{\"threads\": 2.5}"));
    assert_int_equal(options_load_file(o, path, err, sizeof err), -1);
    assert_contains(err, "is not an integer");
    unlink(path);

    snprintf(path, sizeof path, "%s", write_temp("{\"config\": \"/etc/other.json\"}"));
    assert_int_equal(options_load_file(o, path, err, sizeof err), -1);
    assert_contains(err, "cannot name another config file");
    unlink(path);

    /* strings, numbers and inline objects; other programs' keys are skipped */
    snprintf(path, sizeof path, "%s",
             write_temp("{\"threads\": \"6\", \"max-message-bytes\": \"128M\", "
                        "\"inline-max-bytes\": 0, \"retries\": 3,"
                        "\"cluster\": {\"ps\": [\"h:1\"]}}"));
    if (options_load_file(o, path, err, sizeof err) != 0)
        fail_msg("load failed: %s", err);
    assert_int_equal(opt_int(o, OPT_THREADS), 6);
    assert_int_equal(opt_int(o, OPT_MAX_MESSAGE_BYTES), 128 << 20);
    assert_int_equal(opt_int(o, OPT_INLINE_MAX_BYTES), 0);
    assert_false(opt_is_set(o, OPT_RETRIES));
    assert_string_equal(opt_str(o, OPT_CLUSTER), "{\"ps\":[\"h:1\"]}");
    unlink(path);
    options_destroy(o);
}

/* The typed getters read what the by-name API set, and ids name their rows. */
static void test_typed_getters(void **state)
{
    options *o = NULL;
    char err[ERRLEN];

    (void)state;
    assert_int_equal(options_create(&o, OPT_SCOPE_SERVER), 0);
    assert_int_equal(opt_int(o, OPT_THREADS), 0);
    assert_int_equal(opt_int(o, OPT_MAX_MESSAGE_BYTES), 64 << 20); /* SIZE */
    assert_string_equal(opt_enum(o, OPT_LOG_LEVEL), "info");
    assert_string_equal(opt_str(o, OPT_LISTEN), "");
    assert_false(opt_is_set(o, OPT_THREADS));
    assert_int_equal(options_set(o, "threads", " 8 ", err, sizeof err), 0);
    assert_int_equal(options_set(o, "log-level", "WARN", err, sizeof err), 0);
    assert_int_equal(opt_int(o, OPT_THREADS), 8);
    assert_true(opt_is_set(o, OPT_THREADS));
    assert_string_equal(opt_text(o, OPT_THREADS), "8");
    assert_string_equal(opt_enum(o, OPT_LOG_LEVEL), "warn");
    assert_string_equal(opt_def(OPT_THREADS)->name, "threads");
    assert_int_equal(opt_def(OPT_BSP_AGGREGATION)->type, OPT_ENUM);
    /* out of scope: the default */
    assert_true(opt_double(o, OPT_MOMENTUM) == 0.9);
    assert_false(opt_bool(o, OPT_NESTEROV));
    assert_true(opt_bool(o, OPT_FUSED_PUSH_PULL));
    options_destroy(o);
}

/* Every id is its row's name in capitals ('-' as '_'), LOCAL_ or BENCH_ before the names of
 * ps-local's and ps-bench's own settings, and the row's type matches the id's getter. */
static void test_ids_match_names(void **state)
{
#define OPTION(ID, TYPE, ...) {#ID, OPT_##TYPE},
    static const struct {
        const char *id;
        option_type type;
    } ids[] = {
#include "options_table.def"
    };
#undef OPTION
    (void)state;
    assert_int_equal(sizeof ids / sizeof ids[0], options_table_len);
    assert_int_equal(options_table_len, OPTION_ROW_COUNT);
    for (size_t i = 0; i < options_table_len; i++) {
        const option_def *d = &options_table[i];
        const char *id = ids[i].id;
        char want[80];
        size_t k = 0;
        if (d->scope == OPT_SCOPE_LAUNCHER) {
            if (strncmp(id, "LOCAL_", 6) != 0)
                fail_msg("id %s of ps-local's %s lacks LOCAL_", id, d->name);
            id += 6;
        } else if (d->scope == OPT_SCOPE_TOOL) {
            if (strncmp(id, "BENCH_", 6) != 0)
                fail_msg("id %s of ps-bench's %s lacks BENCH_", id, d->name);
            id += 6;
        }
        for (const char *p = d->name; *p != '\0' && k + 1 < sizeof want; p++)
            want[k++] = *p == '-' ? '_' : (char)(*p - ('a' <= *p && *p <= 'z' ? 'a' - 'A' : 0));
        want[k] = '\0';
        if (strcmp(id, want) != 0)
            fail_msg("row %zu: id %s does not match name %s", i, ids[i].id, d->name);
        assert_int_equal(ids[i].type, d->type);
    }
}

/* LIST options: command-line occurrences add up (values may start with "--") and replace
 * the environment's and the file's; a file gives a string or an array of strings. */
static void test_list_option(void **state)
{
    options *o = NULL;
    char err[ERRLEN], path[64];
    const char *const *items = NULL;
    char *argv[] = {"ps-local", "--server-arg", "--threads=4", "--server-arg=-x", "--ps", "2"};
    char *argv_none[] = {"ps-local"};

    (void)state;
    assert_int_equal(options_create(&o, OPT_SCOPE_LAUNCHER), 0);
    assert_int_equal(opt_list(o, OPT_LOCAL_SERVER_ARG, &items), 0);
    setenv("PS_LOCAL_SERVER_ARG", "--from-env", 1);
    assert_int_equal(options_load(o, ARGC(argv_none), argv_none, NULL, NULL, err, sizeof err), 0);
    assert_int_equal(opt_list(o, OPT_LOCAL_SERVER_ARG, &items), 1);
    assert_string_equal(items[0], "--from-env");
    if (options_load(o, ARGC(argv), argv, NULL, NULL, err, sizeof err) != 0)
        fail_msg("load failed: %s", err);
    assert_int_equal(opt_list(o, OPT_LOCAL_SERVER_ARG, &items), 2);
    assert_string_equal(items[0], "--threads=4");
    assert_string_equal(items[1], "-x");
    assert_string_equal(opt_text(o, OPT_LOCAL_SERVER_ARG), "--threads=4, -x");
    assert_int_equal(opt_int(o, OPT_LOCAL_PS), 2);
    unsetenv("PS_LOCAL_SERVER_ARG");

    snprintf(path, sizeof path, "%s", write_temp("{\"server-arg\": [\"a\", \"b\", \"c\"]}"));
    if (options_load_file(o, path, err, sizeof err) != 0)
        fail_msg("load failed: %s", err);
    assert_int_equal(opt_list(o, OPT_LOCAL_SERVER_ARG, &items), 3);
    assert_string_equal(items[2], "c");
    unlink(path);
    snprintf(path, sizeof path, "%s", write_temp("{\"server-arg\": [\"a\", 2]}"));
    assert_int_equal(options_load_file(o, path, err, sizeof err), -1);
    assert_contains(err, "server-arg[1]: expected a string, got int");
    unlink(path);
    assert_int_equal(opt_list(o, OPT_LOCAL_SERVER_ARG, NULL), 3); /* unchanged */
    options_destroy(o);
}

/* OPTIONS_LOAD_REST_POSITIONAL: the first argument that is not one of the program's options
 * ends them (ps-local passes the rest to its workers). */
static void test_rest_positional(void **state)
{
    options *o = NULL;
    char err[ERRLEN];
    const char *pos[16];
    int npos = -1;
    char *argv[] = {"ps-local", "--ps", "2", "--epochs", "5", "--workers", "3"};
    char *argv_dd[] = {"ps-local", "--workers=3", "--", "--ps", "1"};
    char *argv_pos[] = {"ps-local", "stray", "--ps", "3"};
    char *argv_bad[] = {"ps-local", "--ps", "x", "--epochs", "1"};
    char *argv_help[] = {"ps-local", "--chief", "-h"};
    char *argv_help_rest[] = {"ps-local", "--chief", "--", "-h"};

    (void)state;
    assert_int_equal(options_create(&o, OPT_SCOPE_LAUNCHER), 0);
    if (options_load_ex(o, ARGC(argv), argv, OPTIONS_LOAD_REST_POSITIONAL, pos, &npos, err,
                        sizeof err) != 0)
        fail_msg("load failed: %s", err);
    assert_int_equal(opt_int(o, OPT_LOCAL_PS), 2);
    assert_int_equal(opt_int(o, OPT_LOCAL_WORKERS), 2); /* --workers went to the rest */
    assert_int_equal(npos, 4);
    assert_string_equal(pos[0], "--epochs");
    assert_string_equal(pos[3], "3");
    /* without the flag an option of another program is an error */
    assert_int_equal(options_load(o, ARGC(argv), argv, pos, &npos, err, sizeof err), -1);
    assert_contains(err, "--epochs is not accepted by this program (ps-local)");

    assert_int_equal(options_load_ex(o, ARGC(argv_dd), argv_dd, OPTIONS_LOAD_REST_POSITIONAL, pos,
                                     &npos, err, sizeof err),
                     0);
    assert_int_equal(opt_int(o, OPT_LOCAL_WORKERS), 3);
    assert_int_equal(npos, 2);
    assert_string_equal(pos[0], "--ps");

    assert_int_equal(options_load_ex(o, ARGC(argv_pos), argv_pos, OPTIONS_LOAD_REST_POSITIONAL, pos,
                                     &npos, err, sizeof err),
                     0);
    assert_int_equal(npos, 3);
    assert_string_equal(pos[0], "stray");
    assert_int_equal(opt_int(o, OPT_LOCAL_PS), 2); /* untouched */

    assert_int_equal(options_load_ex(o, ARGC(argv_bad), argv_bad, OPTIONS_LOAD_REST_POSITIONAL, pos,
                                     &npos, err, sizeof err),
                     -1);
    assert_contains(err, "command line --ps: ps: \"x\" is not an integer");
    assert_int_equal(options_load_ex(o, ARGC(argv_help), argv_help, OPTIONS_LOAD_REST_POSITIONAL,
                                     pos, &npos, err, sizeof err),
                     OPTIONS_HELP);
    assert_int_equal(options_load_ex(o, ARGC(argv_help_rest), argv_help_rest,
                                     OPTIONS_LOAD_REST_POSITIONAL, pos, &npos, err, sizeof err),
                     0);
    assert_int_equal(npos, 1);
    assert_string_equal(pos[0], "-h");
    assert_true(opt_bool(o, OPT_LOCAL_CHIEF));
    options_destroy(o);
}

/* Programs that never share an options object may use one name for different settings. */
static void test_shared_name_disjoint_scopes(void **state)
{
    options *o = NULL;
    char err[ERRLEN];
    const option_def disjoint[] = {
        {.name = "x", .type = OPT_INT, .scope = OPT_SCOPE_TOOL, .defval = "1", .help = "h"},
        {.name = "x",
         .type = OPT_STRING,
         .scope = OPT_SCOPE_LAUNCHER,
         .defval = "",
         .env = "PS_X2",
         .help = "h"}};
    const option_def overlapping[] = {
        {.name = "x", .type = OPT_INT, .scope = OPT_SCOPE_TOOL, .defval = "1", .help = "h"},
        {.name = "x",
         .type = OPT_INT,
         .scope = OPT_SCOPE_TOOL | OPT_SCOPE_LAUNCHER,
         .defval = "1",
         .env = "PS_X2",
         .help = "h"}};
    const option_def same_env[] = {
        {.name = "x", .type = OPT_INT, .scope = OPT_SCOPE_TOOL, .defval = "1", .help = "h"},
        {.name = "x", .type = OPT_INT, .scope = OPT_SCOPE_LAUNCHER, .defval = "1", .help = "h"}};

    (void)state;
    assert_int_equal(options_table_validate(disjoint, 2, err, sizeof err), 0);
    assert_int_equal(options_table_validate(overlapping, 2, err, sizeof err), -1);
    assert_contains(err, "duplicate name");
    assert_int_equal(options_table_validate(same_env, 2, err, sizeof err), -1);
    assert_contains(err, "environment variable PS_X also used by x");

    assert_int_equal(options_create(&o, OPT_SCOPE_LAUNCHER), 0);
    assert_int_equal(options_set(o, "timeout", "7", err, sizeof err), 0);
    assert_int_equal(opt_int(o, OPT_LOCAL_TIMEOUT), 7);
    assert_int_equal(opt_int(o, OPT_BENCH_TIMEOUT), 1200);
    options_destroy(o);
    assert_int_equal(options_create(&o, OPT_SCOPE_TOOL), 0);
    assert_int_equal(options_set(o, "timeout", "9", err, sizeof err), 0);
    assert_int_equal(opt_int(o, OPT_BENCH_TIMEOUT), 9);
    assert_int_equal(options_get_int(o, "timeout"), 9); /* by name: the row in scope */
    assert_int_equal(opt_int(o, OPT_LOCAL_TIMEOUT), 0);
    options_destroy(o);
}

/* The README's worker table: the worker's own settings without the client ones. */
static void test_markdown_exclude(void **state)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);

    (void)state;
    assert_non_null(f);
    options_print_markdown(f, OPT_SCOPE_WORKER, OPT_SCOPE_CLIENT);
    fclose(f);
    assert_contains(text, "| `--layers` | `PS_LAYERS` | string | `784,256,128,10` |");
    assert_contains(text, "enum: relu\\|tanh");
    assert_null(strstr(text, "--deadline-ms"));
    assert_null(strstr(text, "--config"));
    free(text);

    f = open_memstream(&text, &len);
    options_print_markdown(f, OPT_SCOPE_LAUNCHER, 0);
    fclose(f);
    assert_contains(text, "| `--server-arg` | `PS_LOCAL_SERVER_ARG` | list |  |");
    assert_contains(text, "| `--workers` | `PS_LOCAL_WORKERS` | int 1..128 | `2` |");
    free(text);
}

/* http-listen's value: host:port, :port (every interface) and a bare port, as Prometheus
 * exporters take it (port 0: any free port); anything else is refused with the forms named. */
static void test_http_listen_forms(void **state)
{
    (void)state;
    const char *good[] = {"127.0.0.1:0", ":0", "0", "*:0"};
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        http_endpoint *e = NULL;
        char err[256] = "";
        int rc = http_endpoint_start(&e, good[i], err, sizeof(err));
        if (rc != 0)
            fail_msg("http-listen \"%s\": %s", good[i], err);
        assert_non_null(e);
        assert_true(http_endpoint_port(e) > 0);
        http_endpoint_stop(e);
    }
    const char *bad[] = {"", "abc", "127.0.0.1", "70000", "1:2:x", "123456", ":"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        http_endpoint *e = NULL;
        char err[256] = "";
        assert_int_equal(http_endpoint_start(&e, bad[i], err, sizeof(err)), -1);
        assert_null(e);
        assert_non_null(strstr(err, "is not host:port, :port or port"));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_table_is_valid, clear_env),
        cmocka_unit_test_setup(test_defaults, clear_env),
        cmocka_unit_test_setup(test_set_good_and_bad, clear_env),
        cmocka_unit_test_setup(test_bool_double_custom_table, clear_env),
        cmocka_unit_test_setup(test_precedence_file_env_argv, clear_env),
        cmocka_unit_test_setup(test_help, clear_env),
        cmocka_unit_test_setup(test_argv_forms_and_positional, clear_env),
        cmocka_unit_test_setup(test_file_errors_and_forms, clear_env),
        cmocka_unit_test_setup(test_typed_getters, clear_env),
        cmocka_unit_test_setup(test_ids_match_names, clear_env),
        cmocka_unit_test_setup(test_list_option, clear_env),
        cmocka_unit_test_setup(test_rest_positional, clear_env),
        cmocka_unit_test_setup(test_shared_name_disjoint_scopes, clear_env),
        cmocka_unit_test_setup(test_markdown_exclude, clear_env),
        cmocka_unit_test(test_http_listen_forms),
    };
    return cmocka_run_group_tests_name("options", tests, NULL, NULL);
}
