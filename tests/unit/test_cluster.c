/* Unit tests for common/cluster.c: TF_CONFIG parsing, validation messages,
 * task overrides, options sources and URLs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "cluster.h"
#include "options.h"

#define ERRLEN 512

#define assert_contains(hay, needle)                                                               \
    do {                                                                                           \
        if (strstr((hay), (needle)) == NULL)                                                       \
            fail_msg("expected \"%s\" to contain \"%s\"", (hay), (needle));                        \
    } while (0)

static void assert_zeroed(const cluster_spec *c)
{
    assert_null(c->ps);
    assert_null(c->worker);
    assert_null(c->chief);
    assert_int_equal(c->n_ps + c->n_worker + c->n_chief, 0);
    assert_string_equal(c->task_type, "");
}

static void test_tf_config(void **state)
{
    cluster_spec c;
    char err[ERRLEN] = "";
    const char *json = "{\"cluster\": {\"chief\": [\"c0:2220\"],"
                       " \"ps\": [\"ps0.example.com:2222\", \"10.0.0.2:2222\"],"
                       " \"worker\": [\"w0:2223\", \"w1:2223\"],"
                       " \"evaluator\": [\"ev:1\"]},"
                       " \"task\": {\"type\": \"worker\", \"index\": 1},"
                       " \"environment\": \"cloud\"}";

    (void)state;
    if (cluster_parse(json, &c, err, sizeof err) != 0)
        fail_msg("parse failed: %s", err);
    assert_int_equal(c.n_ps, 2);
    assert_string_equal(c.ps[0], "ps0.example.com:2222");
    assert_string_equal(c.ps[1], "10.0.0.2:2222");
    assert_int_equal(c.n_worker, 2);
    assert_string_equal(c.worker[1], "w1:2223");
    assert_int_equal(c.n_chief, 1);
    assert_string_equal(c.chief[0], "c0:2220");
    assert_string_equal(c.task_type, "worker");
    assert_int_equal(c.task_index, 1);
    assert_string_equal(cluster_task_address(&c), "w1:2223");
    cluster_fini(&c);
    assert_zeroed(&c);
    cluster_fini(&c); /* twice is fine */
    cluster_fini(NULL);
}

static void test_bare_cluster(void **state)
{
    cluster_spec c;
    char err[ERRLEN] = "";

    (void)state;
    assert_int_equal(
        cluster_parse("{\"ps\":[\"a:1\"],\"worker\":[\"b:2\",\"c:3\"]}", &c, err, sizeof err), 0);
    assert_int_equal(c.n_ps, 1);
    assert_int_equal(c.n_worker, 2);
    assert_int_equal(c.n_chief, 0);
    assert_string_equal(c.task_type, "");
    assert_int_equal(c.task_index, -1);
    assert_null(cluster_task_address(&c));
    cluster_fini(&c);

    /* TF_CONFIG may carry an empty task */
    assert_int_equal(
        cluster_parse("{\"cluster\":{\"ps\":[\"a:1\"]},\"task\":{}}", &c, err, sizeof err), 0);
    assert_int_equal(c.task_index, -1);
    cluster_fini(&c);
}

static void test_ipv6(void **state)
{
    cluster_spec c;
    char err[ERRLEN] = "", url[64];

    (void)state;
    if (cluster_parse("{\"cluster\":{\"ps\":[\"[::1]:2222\",\"[fe80::1%eth0]:2223\"]},"
                      "\"task\":{\"type\":\"ps\",\"index\":0}}",
                      &c, err, sizeof err) != 0)
        fail_msg("parse failed: %s", err);
    assert_string_equal(cluster_task_address(&c), "[::1]:2222");
    assert_int_equal(cluster_url(cluster_task_address(&c), url, sizeof url), 0);
    assert_string_equal(url, "tcp://[::1]:2222");
    cluster_fini(&c);
}

typedef struct bad_case {
    const char *json;
    const char *message; /* must appear in the error */
} bad_case;

static void test_validation_errors(void **state)
{
    static const bad_case cases[] = {
        {"{\"cluster\":{\"ps\":[\"127.0.0.1:1\",\"127.0.0.1\"]}}",
         "cluster.ps[1]: \"127.0.0.1\" is not host:port (missing :port)"},
        {"{\"cluster\":{\"ps\":[\"h:0\"]}}", "cluster.ps[0]: \"h:0\" is not host:port (port 0 out "
                                             "of range 1..65535)"},
        {"{\"cluster\":{\"ps\":[\"h:65536\"]}}", "port 65536 out of range 1..65535"},
        {"{\"cluster\":{\"ps\":[\"h:http\"]}}", "cluster.ps[0]: \"h:http\" is not host:port (port "
                                                "is not a number"},
        {"{\"cluster\":{\"ps\":[\"h:\"]}}", "(empty port)"},
        {"{\"cluster\":{\"ps\":[\":80\"]}}", "(empty host)"},
        {"{\"cluster\":{\"ps\":[\"\"]}}", "cluster.ps[0]: \"\" is not host:port (empty address)"},
        {"{\"cluster\":{\"ps\":[\"a:1\"],\"worker\":[\"bad host:1\"]}}",
         "cluster.worker[0]: \"bad host:1\" is not host:port (bad host name)"},
        {"{\"cluster\":{\"ps\":[\"-a:1\"]}}", "(bad host name)"},
        {"{\"cluster\":{\"ps\":[\"300.1.1.1:80\"]}}", "(bad IPv4 address)"},
        {"{\"cluster\":{\"ps\":[\"::1:80\"]}}", "must be in brackets"},
        {"{\"cluster\":{\"ps\":[\"[zz::1]:80\"]}}", "(bad IPv6 address)"},
        {"{\"cluster\":{\"ps\":[\"[::1:80\"]}}", "closing ']'"},
        {"{\"cluster\":{\"ps\":[\"[::1]\"]}}", "missing :port"},
        {"{\"cluster\":{\"ps\":[]}}", "cluster.ps: empty; at least one ps task is required"},
        {"{\"cluster\":{\"worker\":[\"a:1\"]}}", "cluster.ps: missing"},
        {"{\"worker\":[\"a:1\"]}", "cluster.ps: missing"},
        {"{\"cluster\":{\"ps\":\"a:1\"}}", "cluster.ps: expected an array of \"host:port\" "
                                           "strings, got string"},
        {"{\"cluster\":{\"ps\":[\"a:1\"],\"worker\":[2222]}}",
         "cluster.worker[0]: expected a \"host:port\" string, got int"},
        {"{\"cluster\":{\"ps\":[\"a:1\"],\"chief\":[\"A:1\"]}}",
         "cluster.chief[0]: address \"A:1\" duplicates cluster.ps[0]"},
        {"{\"cluster\":{\"ps\":[\"a:1\",\"b:1\"],\"worker\":[\"b:1\"]}}",
         "cluster.worker[0]: address \"b:1\" duplicates cluster.ps[1]"},
        {"{\"cluster\":[\"a:1\"]}", "cluster: expected an object"},
        {"{\"cluster\":{\"ps\":[\"a:1\"]},\"task\":{\"type\":\"master\",\"index\":0}}",
         "task.type \"master\" is not one of ps, worker, chief, evaluator"},
        {"{\"cluster\":{\"ps\":[\"a:1\"]},\"task\":{\"type\":\"chief\",\"index\":0}}",
         "task.type \"chief\": cluster has no chief tasks"},
        {"{\"cluster\":{\"ps\":[\"a:1\",\"b:2\"]},\"task\":{\"type\":\"ps\",\"index\":3}}",
         "task.index 3 out of range: cluster has 2 ps tasks"},
        {"{\"cluster\":{\"ps\":[\"a:1\"],\"worker\":[\"w:1\"]},\"task\":{\"type\":\"worker\","
         "\"index\":1}}",
         "task.index 1 out of range: cluster has 1 worker task"},
        {"{\"cluster\":{\"ps\":[\"a:1\"]},\"task\":{\"type\":\"ps\",\"index\":-1}}",
         "task.index -1 out of range"},
        {"{\"cluster\":{\"ps\":[\"a:1\"]},\"task\":{\"type\":\"ps\",\"index\":\"0\"}}",
         "task.index: expected an integer, got string"},
        {"{\"cluster\":{\"ps\":[\"a:1\"]},\"task\":{\"type\":\"ps\"}}", "task.index: missing"},
        {"{\"cluster\":{\"ps\":[\"a:1\"]},\"task\":{\"index\":0}}", "task.type: missing"},
        {"{\"cluster\":{\"ps\":[\"a:1\"]},\"task\":{\"type\":1,\"index\":0}}",
         "task.type: expected a string"},
        {"{\"cluster\":{\"ps\":[\"a:1\"]},\"task\":\"ps:0\"}", "task: expected an object"},
        {"{\"ps\":[\"a:1\"],\"task\":{\"type\":\"ps\",\"index\":0}}", "task: a task needs"},
        {"{\"cluster\":{\"ps\":[\"a:1\"]}", "invalid JSON"},
        {"{\"cluster\":\n{\"ps\":[\"a:1\",]}}", "invalid JSON at line 2"},
        {"{\"ps\":[\"a:1\"]} trailing", "invalid JSON"},
        {"{\"ps\":[\"a:1\"]} {}", "invalid JSON at line 1, column 16"},
        {"[\"a:1\"]", "expected a JSON object, got array"},
        {"", "cluster spec is empty"},
        {"  \n", "cluster spec is empty"},
    };
    char err[ERRLEN];

    (void)state;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cluster_spec c;
        memset(&c, 0x5a, sizeof c); /* parse must not read or free what was there */
        err[0] = '\0';
        if (cluster_parse(cases[i].json, &c, err, sizeof err) != -1)
            fail_msg("case %zu accepted: %s", i, cases[i].json);
        if (strstr(err, cases[i].message) == NULL)
            fail_msg("case %zu: %s\n  error:    %s\n  expected: %s", i, cases[i].json, err,
                     cases[i].message);
        assert_zeroed(&c);
        cluster_fini(&c);
    }
    assert_int_equal(cluster_parse(NULL, &(cluster_spec){0}, err, sizeof err), -1);
}

static void test_evaluator_task(void **state)
{
    cluster_spec c;
    char err[ERRLEN];

    (void)state;
    assert_int_equal(cluster_parse("{\"cluster\":{\"ps\":[\"a:1\"]},"
                                   "\"task\":{\"type\":\"evaluator\",\"index\":0}}",
                                   &c, err, sizeof err),
                     0);
    assert_string_equal(c.task_type, "evaluator");
    assert_null(cluster_task_address(&c)); /* evaluators have no address */
    cluster_fini(&c);
}

static void test_set_task(void **state)
{
    cluster_spec c;
    char err[ERRLEN];

    (void)state;
    assert_int_equal(cluster_parse("{\"cluster\":{\"ps\":[\"a:1\",\"b:1\"],\"worker\":[\"w0:1\","
                                   "\"w1:1\"]},\"task\":{\"type\":\"ps\",\"index\":0}}",
                                   &c, err, sizeof err),
                     0);
    assert_int_equal(cluster_set_task(&c, "ps:1", err, sizeof err), 0);
    assert_string_equal(cluster_task_address(&c), "b:1");
    assert_int_equal(cluster_set_task(&c, "worker:0", err, sizeof err), 0);
    assert_string_equal(c.task_type, "worker");
    assert_int_equal(c.task_index, 0);

    assert_int_equal(cluster_set_task(&c, "worker:5", err, sizeof err), -1);
    assert_contains(err, "task \"worker:5\": index 5 out of range: cluster has 2 worker tasks");
    assert_int_equal(cluster_set_task(&c, "chief:0", err, sizeof err), -1);
    assert_contains(err, "cluster has no chief tasks");
    assert_int_equal(cluster_set_task(&c, "boss:0", err, sizeof err), -1);
    assert_contains(err, "\"boss\" is not one of ps, worker, chief, evaluator");
    static const char *const malformed[] = {"worker",
                                            "worker:",
                                            ":1",
                                            "worker:-1",
                                            "worker:x",
                                            "worker:1x",
                                            "averyveryverylongtype:0",
                                            "worker:12345678901"};
    for (size_t i = 0; i < sizeof malformed / sizeof malformed[0]; i++) {
        if (cluster_set_task(&c, malformed[i], err, sizeof err) != -1)
            fail_msg("accepted task %s", malformed[i]);
        assert_contains(err, "expected type:index, e.g. worker:0");
    }
    /* failures left the task alone */
    assert_string_equal(c.task_type, "worker");
    assert_int_equal(c.task_index, 0);
    cluster_fini(&c);
}

static void test_url(void **state)
{
    char buf[32];

    (void)state;
    assert_int_equal(cluster_url("host:2222", buf, sizeof buf), 0);
    assert_string_equal(buf, "tcp://host:2222");
    assert_int_equal(cluster_url("[::1]:1", buf, sizeof buf), 0);
    assert_string_equal(buf, "tcp://[::1]:1");
    assert_int_equal(cluster_url("a-very-long-host-name.example.com:2222", buf, sizeof buf), -1);
    assert_string_equal(buf, "");
    assert_int_equal(cluster_url("h:1", buf, 10), 0); /* exactly fits: 9 chars + NUL */
    assert_int_equal(cluster_url("h:12", buf, 10), -1);
    assert_int_equal(cluster_url(NULL, buf, sizeof buf), -1);
    assert_int_equal(cluster_url("", buf, sizeof buf), -1);
    assert_int_equal(cluster_url("h:1", NULL, 0), -1);
}

static void test_ipc(void **state)
{
    cluster_spec c;
    char err[256], url[160];
    char path[200];

    (void)state;
    assert_int_equal(cluster_parse("{\"cluster\":{\"ps\":[\"ipc:///run/psd/ps-0.sock\",\"h:2\"],"
                                   "\"worker\":[\"w:1\"]},\"task\":{\"type\":\"ps\",\"index\":0}}",
                                   &c, err, sizeof err),
                     0);
    assert_int_equal(c.n_ps, 2);
    assert_string_equal(cluster_task_address(&c), "ipc:///run/psd/ps-0.sock");
    assert_true(cluster_is_ipc(c.ps[0]));
    assert_false(cluster_is_ipc(c.ps[1]));
    assert_false(cluster_is_ipc(NULL));
    assert_int_equal(cluster_url(c.ps[0], url, sizeof url), 0);
    assert_string_equal(url, "ipc:///run/psd/ps-0.sock");
    assert_int_equal(cluster_url(c.ps[1], url, sizeof url), 0);
    assert_string_equal(url, "tcp://h:2");
    assert_int_equal(cluster_url(c.ps[0], url, 10), -1); /* does not fit */
    assert_string_equal(url, "");
    cluster_fini(&c);

    /* A relative path is nng's too; the longest path a Unix socket takes is accepted. */
    memset(path, 'p', CLUSTER_IPC_PATH_MAX);
    path[CLUSTER_IPC_PATH_MAX] = '\0';
    char json[400];
    snprintf(json, sizeof json, "{\"ps\":[\"ipc://%s\",\"ipc://rel.sock\"]}", path);
    assert_int_equal(cluster_parse(json, &c, err, sizeof err), 0);
    assert_int_equal(c.n_ps, 2);
    cluster_fini(&c);

    static const bad_case cases[] = {
        {"{\"ps\":[\"a:1\",\"tls+tcp://a:2\"]}",
         "cluster.ps[1]: \"tls+tcp://a:2\": unsupported scheme \"tls+tcp://\""},
        {"{\"ps\":[\"tcp://a:2\"]}", "cluster.ps[0]: \"tcp://a:2\": unsupported scheme"},
        {"{\"ps\":[\"a:1\"],\"worker\":[\"abstract://x\"]}", "cluster.worker[0]"},
        {"{\"ps\":[\"ipc://\"]}", "cluster.ps[0]: \"ipc://\": empty ipc:// path"},
        {"{\"ps\":[\"ipc:///a.sock\",\"ipc:///a.sock\"]}",
         "cluster.ps[1]: address \"ipc:///a.sock\" duplicates cluster.ps[0]"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        err[0] = '\0';
        assert_int_equal(cluster_parse(cases[i].json, &c, err, sizeof err), -1);
        if (strstr(err, cases[i].message) == NULL)
            fail_msg("case %zu: error \"%s\" lacks \"%s\"", i, err, cases[i].message);
    }
    snprintf(json, sizeof json, "{\"ps\":[\"ipc://%sx\"]}", path); /* one byte too long */
    assert_int_equal(cluster_parse(json, &c, err, sizeof err), -1);
    assert_non_null(strstr(err, "cluster.ps[0]"));
    assert_non_null(strstr(err, "longer than 107 bytes"));
}

static void test_from_options(void **state)
{
    options *o = NULL;
    cluster_spec c;
    char err[ERRLEN], path[64], arg[80];
    int fd;
    const char *file_json = "{\"cluster\":{\"ps\":[\"f0:1\",\"f1:1\"]},"
                            "\"task\":{\"type\":\"ps\",\"index\":1}}";

    (void)state;
    assert_int_equal(options_create(&o, OPT_SCOPE_SERVER), 0);
    assert_int_equal(cluster_from_options(o, &c, err, sizeof err), -1);
    assert_string_equal(err, "no cluster spec: set TF_CONFIG or --cluster");
    assert_zeroed(&c);

    assert_int_equal(options_set(o, "tf-config",
                                 "{\"cluster\":{\"ps\":[\"t0:1\"]},\"task\":{\"type\":\"ps\","
                                 "\"index\":0}}",
                                 err, sizeof err),
                     0);
    assert_int_equal(cluster_from_options(o, &c, err, sizeof err), 0);
    assert_string_equal(cluster_task_address(&c), "t0:1");
    cluster_fini(&c);

    /* --cluster wins over TF_CONFIG, --task overrides the task */
    assert_int_equal(options_set(o, "cluster", "{\"ps\":[\"c0:1\",\"c1:1\"]}", err, sizeof err), 0);
    assert_int_equal(options_set(o, "task", "ps:1", err, sizeof err), 0);
    assert_int_equal(cluster_from_options(o, &c, err, sizeof err), 0);
    assert_int_equal(c.n_ps, 2);
    assert_string_equal(cluster_task_address(&c), "c1:1");
    cluster_fini(&c);

    assert_int_equal(options_set(o, "task", "ps:2", err, sizeof err), 0);
    assert_int_equal(cluster_from_options(o, &c, err, sizeof err), -1);
    assert_contains(err, "--task: task \"ps:2\": index 2 out of range: cluster has 2 ps tasks");
    assert_zeroed(&c);
    assert_int_equal(options_set(o, "task", "", err, sizeof err), 0);

    /* errors name the source */
    assert_int_equal(options_set(o, "cluster", "{\"ps\":[\"c0\"]}", err, sizeof err), 0);
    assert_int_equal(cluster_from_options(o, &c, err, sizeof err), -1);
    assert_contains(err, "--cluster: cluster.ps[0]: \"c0\" is not host:port");
    assert_int_equal(options_set(o, "cluster", "", err, sizeof err), 0);
    assert_int_equal(options_set(o, "tf-config", "{\"cluster\":{}}", err, sizeof err), 0);
    assert_int_equal(cluster_from_options(o, &c, err, sizeof err), -1);
    assert_contains(err, "TF_CONFIG: cluster.ps: missing");

    /* @file */
    snprintf(path, sizeof path, "/tmp/test_cluster_XXXXXX");
    fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, file_json, strlen(file_json)), (ssize_t)strlen(file_json));
    close(fd);
    snprintf(arg, sizeof arg, "@%s", path);
    assert_int_equal(options_set(o, "cluster", arg, err, sizeof err), 0);
    if (cluster_from_options(o, &c, err, sizeof err) != 0)
        fail_msg("from file: %s", err);
    assert_string_equal(cluster_task_address(&c), "f1:1");
    cluster_fini(&c);
    unlink(path);
    assert_int_equal(cluster_from_options(o, &c, err, sizeof err), -1);
    assert_contains(err, "cluster file ");
    assert_contains(err, path);
    assert_contains(err, "cannot open");

    /* a file with a NUL byte, or a directory, is refused by name */
    snprintf(path, sizeof path, "/tmp/test_cluster_XXXXXX");
    fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "{\"ps\":[\"a:1\"]}\0x", 17), 17);
    close(fd);
    snprintf(arg, sizeof arg, "@%s", path);
    assert_int_equal(options_set(o, "cluster", arg, err, sizeof err), 0);
    assert_string_equal(opt_str(o, OPT_CLUSTER), arg);
    assert_int_equal(cluster_from_options(o, &c, err, sizeof err), -1);
    assert_contains(err, path);
    assert_contains(err, "contains a NUL byte");
    assert_zeroed(&c);
    unlink(path);
    assert_int_equal(options_set(o, "cluster", "@/tmp", err, sizeof err), 0);
    assert_int_equal(cluster_from_options(o, &c, err, sizeof err), -1);
    assert_contains(err, "cluster file /tmp: is a directory");
    options_destroy(o);

    /* the client library has no `task` option: it reads as unset */
    assert_int_equal(options_create(&o, OPT_SCOPE_CLIENT), 0);
    assert_int_equal(options_set(o, "cluster", "{\"ps\":[\"a:1\"]}", err, sizeof err), 0);
    assert_int_equal(cluster_from_options(o, &c, err, sizeof err), 0);
    assert_null(cluster_task_address(&c));
    cluster_fini(&c);
    options_destroy(o);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tf_config),
        cmocka_unit_test(test_bare_cluster),
        cmocka_unit_test(test_ipv6),
        cmocka_unit_test(test_validation_errors),
        cmocka_unit_test(test_evaluator_task),
        cmocka_unit_test(test_set_task),
        cmocka_unit_test(test_url),
        cmocka_unit_test(test_ipc),
        cmocka_unit_test(test_from_options),
    };
    return cmocka_run_group_tests_name("cluster", tests, NULL, NULL);
}
