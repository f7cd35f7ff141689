/* Integration test of the HTTP endpoint (http-listen): a real ps-server, pushes through
 * libpsclient, and /metrics, /livez, /readyz scraped over a plain socket; then a short
 * ps-worker run scraped while it trains.
 *
 * usage: it_metrics PS-SERVER PS-WORKER */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "cluster_proc.h"
#include "ps_proc.h"

static const char *server_bin, *worker_bin;

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* The value of the sample whose name and labels are exactly `series` (e.g.
 * psd_rpc_requests_total{method="Push",status="OK"}); 0 if absent (counters not yet made). */
static double sample(const char *text, const char *series)
{
    size_t n = strlen(series);
    for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
        if (strncmp(p, series, n) == 0 && p[n] == ' ')
            return strtod(p + n + 1, NULL);
    }
    return 0.0;
}

/* Sum of every sample of `prefix` (name and the start of its labels). */
static double sample_sum(const char *text, const char *prefix)
{
    double sum = 0.0;
    size_t n = strlen(prefix);
    for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
        if (strncmp(p, prefix, n) == 0) {
            const char *sp = strchr(p, ' ');
            if (sp)
                sum += strtod(sp + 1, NULL);
        }
    }
    return sum;
}

static char *scrape(int port)
{
    char *body;
    int st = test_http_get(port, "/metrics", &body);
    assert_int_equal(st, 200);
    assert_non_null(body);
    return body;
}

/* Every line is a comment (HELP/TYPE) or "name[{labels}] value" with a number. */
static void check_format(const char *text)
{
    for (const char *p = text; *p;) {
        const char *e = strchr(p, '\n');
        assert_non_null(e);
        if (*p != '#') {
            const char *sp = e;
            while (sp > p && sp[-1] != ' ')
                sp--;
            assert_true(sp > p);
            char *end;
            char num[64];
            size_t k = (size_t)(e - sp) < sizeof(num) - 1 ? (size_t)(e - sp) : sizeof(num) - 1;
            memcpy(num, sp, k);
            num[k] = '\0';
            (void)strtod(num, &end);
            if (*end != '\0' && strcmp(num, "+Inf") != 0 && strcmp(num, "NaN") != 0)
                fail_msg("bad sample line: %.*s", (int)(e - p), p);
        } else {
            assert_true(strncmp(p, "# HELP ", 7) == 0 || strncmp(p, "# TYPE ", 7) == 0);
        }
        p = e + 1;
    }
}

static void test_server_metrics(void **state)
{
    (void)state;
    test_ps p;
    test_ps_init(&p, server_bin, "ps-test-metrics");
    int hport = test_free_port();
    char haddr[64];
    snprintf(haddr, sizeof(haddr), "127.0.0.1:%d", hport);
    const char *extra[] = {"--http-listen", haddr, NULL};
    test_ps_start(&p, extra);
    int st = -1;
    for (int i = 0; i < 100 && (st = test_http_get(hport, "/readyz", NULL)) != 200; i++)
        sleep_ms(50);
    assert_int_equal(st, 200);
    assert_int_equal(test_http_get(hport, "/livez", NULL), 200);
    assert_int_equal(test_http_get(hport, "/no-such-page", NULL), 404);

    enum { N = 25, ELEMS = 1024 };
    ps_client *c = test_ps_open_client(&p, NULL, NULL);
    assert_non_null(c);
    ps_var *v = test_make_var(c, "metrics_w", ELEMS);
    assert_non_null(v);
    char *before = scrape(hport);
    check_format(before);
    for (int i = 0; i < N; i++)
        test_push_const(c, v, ELEMS, 1.0f);
    char *after = scrape(hport);
    check_format(after);

    assert_int_equal(sample(after, "psd_server_updates_applied_total") -
                         sample(before, "psd_server_updates_applied_total"),
                     N);
    const char *ok = "psd_rpc_requests_total{method=\"Push\",status=\"OK\"}";
    assert_int_equal(sample(after, ok) - sample(before, ok), N);
    const char *in = "psd_rpc_received_bytes_total{method=\"Push\"}";
    assert_true(sample(after, in) - sample(before, in) >= (double)N * ELEMS * sizeof(float));
    const char *out = "psd_rpc_sent_bytes_total{method=\"Push\"}";
    assert_true(sample(after, out) > sample(before, out));
    /* The latency histogram counts what the method counter counts, and its +Inf bucket too. */
    double push_all = sample_sum(after, "psd_rpc_requests_total{method=\"Push\",");
    assert_true(push_all >= N);
    assert_int_equal(sample(after, "psd_rpc_request_duration_seconds_count{method=\"Push\"}"),
                     push_all);
    assert_int_equal(
        sample(after, "psd_rpc_request_duration_seconds_bucket{method=\"Push\",le=\"+Inf\"}"),
        push_all);
    assert_true(sample(after, "psd_rpc_request_duration_seconds_sum{method=\"Push\"}") > 0);
    /* Per-variable state from the server's collector. */
    assert_int_equal(sample(after, "psd_variable_version{variable=\"metrics_w\"}"), N);
    assert_true(sample(after, "psd_variable_memory_bytes{variable=\"metrics_w\"}") >=
                ELEMS * sizeof(float));
    assert_true(sample(after, "psd_server_memory_bytes") >= ELEMS * sizeof(float));
    assert_non_null(strstr(after, "# TYPE psd_rpc_request_duration_seconds histogram\n"));
    assert_non_null(strstr(after, "# TYPE psd_rpc_requests_total counter\n"));
    free(before);
    free(after);
    ps_client_close(c);
    test_ps_signal_wait(&p, SIGTERM, 0);
    test_ps_cleanup(&p);
}

static pid_t spawn(const char *const *argv, const char *log)
{
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, 2);
            dup2(fd, 1);
        }
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    return pid;
}

static void test_worker_metrics(void **state)
{
    (void)state;
    char dir[] = "/tmp/ps-test-wmetrics-XXXXXX";
    assert_non_null(mkdtemp(dir));
    /* A tiny separable CSV data set: label, then 4 features. */
    char csv[300], log[300], slog[300];
    snprintf(csv, sizeof(csv), "%s/data.csv", dir);
    snprintf(log, sizeof(log), "%s/worker.log", dir);
    snprintf(slog, sizeof(slog), "%s/server.log", dir);
    FILE *f = fopen(csv, "w");
    assert_non_null(f);
    for (int i = 0; i < 256; i++) {
        int y = i % 2;
        fprintf(f, "%d,%d,%g,%g,%g\n", y, y ? 1 : -1, (i % 7) / 7.0, (i % 5) / 5.0, y * 0.5);
    }
    fclose(f);
    int ps_port = test_free_port(), w_port = test_free_port(), hport = test_free_port();
    char spec[256], haddr[64], ps_addr[64];
    snprintf(spec, sizeof(spec), "{\"ps\":[\"127.0.0.1:%d\"],\"worker\":[\"127.0.0.1:%d\"]}",
             ps_port, w_port);
    snprintf(ps_addr, sizeof(ps_addr), "127.0.0.1:%d", ps_port);
    snprintf(haddr, sizeof(haddr), "127.0.0.1:%d", hport);
    const char *wargv[] = {worker_bin, "--cluster",       spec,    "--task",
                           "worker:0", "--train-csv",     csv,     "--test-csv",
                           csv,        "--layers",        "4,8,2", "--batch-size",
                           "16",       "--steps",         "40",    "--slow-worker",
                           "0",        "--slow-delay-ms", "100",   "--log-every",
                           "5",        "--progress",      "off",   "--http-listen",
                           haddr,      "--deadline-ms",   "30000", NULL};
    pid_t wpid = spawn(wargv, log);
    assert_true(wpid > 0);
    /* Not ready before the cluster answers (no server yet). */
    char *body = NULL;
    int st = -1;
    for (int i = 0; i < 100 && (st = test_http_get(hport, "/readyz", &body)) < 0; i++)
        sleep_ms(50);
    if (st != 503)
        fail_msg("worker /readyz before the server: %d %s", st, body ? body : "");
    assert_non_null(strstr(body, "not connected"));
    free(body);
    assert_int_equal(test_http_get(hport, "/livez", NULL), 200);

    pid_t spid = test_server_spawn(server_bin, spec, 0, NULL, slog);
    assert_true(spid > 0);
    char *text = NULL;
    bool seen = false;
    for (int i = 0; i < 300 && !seen; i++) {
        sleep_ms(50);
        free(text);
        text = NULL;
        if (test_http_get(hport, "/metrics", &text) == 200 &&
            sample(text, "psd_worker_steps_total") >= 3)
            seen = true;
    }
    if (!seen) {
        char cmd[700];
        snprintf(cmd, sizeof(cmd), "cat %s %s >&2", log, slog);
        assert_int_equal(system(cmd), 0);
        fail_msg("the worker's /metrics shows no steps");
    }
    check_format(text);
    assert_int_equal(test_http_get(hport, "/readyz", NULL), 200);
    double steps = sample(text, "psd_worker_steps_total");
    assert_true(sample(text, "psd_worker_step_phase_seconds_count{phase=\"pull\"}") >= steps);
    assert_true(sample(text, "psd_worker_step_phase_seconds_count{phase=\"compute\"}") >= steps);
    assert_true(sample(text, "psd_worker_step_phase_seconds_count{phase=\"push\"}") >= steps);
    assert_true(sample(text, "psd_worker_step_seconds_sum") > 0);
    assert_true(sample(text, "psd_worker_step_seconds_count") >= steps);
    assert_true(sample(text, "psd_worker_samples_total") >= 16 * steps);
    assert_non_null(strstr(text, "\npsd_worker_loss "));
    assert_non_null(strstr(text, "\npsd_worker_train_accuracy "));
    assert_int_equal(sample(text, "psd_worker_connected"), 1);
    free(text);
    assert_int_equal(test_wait_exit(wpid, 60000), 0);
    kill(spid, SIGTERM);
    test_wait_exit(spid, 20000);
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s PS-SERVER PS-WORKER\n", argv[0]);
        return 2;
    }
    server_bin = argv[1];
    worker_bin = argv[2];
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_server_metrics),
        cmocka_unit_test(test_worker_metrics),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
