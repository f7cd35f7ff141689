/* Integration: edges of the admin role and of the server's start-up, against real ps-server
 * processes. A server listening on [::] sees a 127.0.0.1 client as ::ffff:127.0.0.1 and still
 * takes it for loopback (admin calls allowed without a token); a token file whose first line is
 * only blanks is refused at start (exit 2, naming it); the start-up line and --help list every
 * admin method, DeleteVariable included; a default-deadline-ms above max-deadline-ms is cut to
 * it with a warning at start, and a request without a deadline gets the cut one; proto/README's
 * method table says UNIMPLEMENTED exactly for the methods the server does not implement.
 *
 * usage: it_admin_edges PS-SERVER PROTO-README */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster_proc.h"
#include "ps_proc.h"
#include "timeutil.h"

static const char *server_bin, *proto_readme;

/* The one line of the log at path that contains `what`, in line (cap bytes); false if none. */
static bool log_line(const char *path, const char *what, char *line, size_t cap)
{
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    bool found = false;
    while (!found && fgets(line, (int)cap, f))
        found = strstr(line, what) != NULL;
    fclose(f);
    return found;
}

static void test_loopback_through_any_v6(void **state)
{
    (void)state;
    test_ps p;
    test_ps_init(&p, server_bin, "psd-admin-v6");
    char listen[64];
    snprintf(listen, sizeof(listen), "tcp://[::]:%d", p.port);
    const char *extra[] = {"--listen", listen, NULL};
    test_ps_start(&p, extra);
    ps_client *c = test_ps_open_client(&p, NULL, NULL);
    assert_non_null(c);
    /* Checkpoint passes the admin check (loopback) and fails on what follows: no
     * checkpoint-dir. Before, ::ffff:127.0.0.1 was not loopback: PERMISSION_DENIED. */
    assert_int_equal(ps_checkpoint(c), PS_FAILED_PRECONDITION);
    assert_non_null(strstr(ps_last_error(), "checkpoint-dir"));
    assert_non_null(test_make_var(c, "v6_admin", 4));
    assert_int_equal(ps_var_delete(c, "v6_admin"), PS_OK);
    ps_client_close(c);
    /* The start-up line names every admin method. */
    char line[2048];
    assert_true(log_line(p.log, "admin methods (", line, sizeof(line)));
    assert_non_null(strstr(line, "Shutdown"));
    assert_non_null(strstr(line, "Checkpoint"));
    assert_non_null(strstr(line, "DeleteVariable"));
    test_ps_signal_wait(&p, SIGTERM, 0);
    test_ps_cleanup(&p);
}

static void test_blank_token_refused(void **state)
{
    (void)state;
    test_ps p;
    test_ps_init(&p, server_bin, "psd-admin-token");
    char token[300];
    snprintf(token, sizeof(token), "%s/admin.token", p.dir);
    FILE *f = fopen(token, "w");
    assert_non_null(f);
    fputs("    \t  \nsecond line\n", f);
    fclose(f);
    const char *extra[] = {"--admin-token-file", token, NULL};
    pid_t pid = test_server_spawn(server_bin, p.spec, 0, extra, p.log);
    assert_true(pid > 0);
    assert_int_equal(test_wait_exit(pid, 10000), 2);
    assert_true(test_file_contains(p.log, "only blanks"));
    test_ps_cleanup(&p);
}

static void test_help_lists_admin_methods(void **state)
{
    (void)state;
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "'%s' --help", server_bin);
    FILE *h = popen(cmd, "r");
    assert_non_null(h);
    static char text[1 << 17];
    size_t n = fread(text, 1, sizeof(text) - 1, h);
    text[n] = '\0';
    assert_int_equal(pclose(h), 0);
    /* The help wraps lines: look at the admin-token-file entry with blanks squeezed. */
    const char *at = strstr(text, "--admin-token-file");
    assert_non_null(at);
    char entry[600];
    size_t k = 0;
    for (const char *s = at; *s && k < sizeof(entry) - 1 && s < at + 1500; s++) {
        if (s > at && strncmp(s, "\n  --", 5) == 0)
            break;
        bool blank = *s == ' ' || *s == '\n';
        if (!(blank && k > 0 && entry[k - 1] == ' '))
            entry[k++] = blank ? ' ' : *s;
    }
    entry[k] = '\0';
    assert_non_null(strstr(entry, "Shutdown"));
    assert_non_null(strstr(entry, "Checkpoint"));
    assert_non_null(strstr(entry, "DeleteVariable"));
}

static void test_default_deadline_cut_and_logged(void **state)
{
    (void)state;
    test_ps p;
    test_ps_init(&p, server_bin, "psd-admin-deadline");
    const char *extra[] = {"--max-deadline-ms", "1500", "--worker-timeout-ms", "60000", NULL};
    test_ps_start(&p, extra);
    char line[2048];
    assert_true(log_line(p.log, "default-deadline-ms", line, sizeof(line)));
    assert_non_null(strstr(line, "30000"));
    assert_non_null(strstr(line, "1500"));
    /* A pull that waits (BSP, clock 5 while no worker got there), sent without a deadline, ends
     * with DEADLINE_EXCEEDED after the cut default (1.5 s), not 30 s. */
    ps_client *c = test_ps_open_client(&p, NULL, NULL);
    assert_non_null(c);
    assert_non_null(test_make_var_bound(c, "dl_w", 1, 0));
    nng_socket s = test_raw_dial(p.port, 10000);
    uint8_t body[64];
    Psd__V1__PullRequest r = PSD__V1__PULL_REQUEST__INIT;
    r.name = "dl_w";
    Psd__V1__TensorMeta t = PSD__V1__TENSOR_META__INIT;
    t.dtype = PSD__V1__DTYPE__FLOAT32;
    t.count = 1;
    envelope env = PSD__V1__ENVELOPE__INIT;
    env.method = PSD__V1__METHOD__PULL;
    env.request_id = 1;
    env.worker_id = 0;
    env.clock = 5;
    env.tensor = &t;
    env.body.data = body;
    env.body.len = psd__v1__pull_request__pack(&r, body);
    frame f;
    nng_msg *m;
    uint64_t t0 = time_now_ns();
    int status = test_raw_request(s, &env, NULL, 0, &f, &m);
    uint64_t ms = (time_now_ns() - t0) / 1000000u;
    assert_true(status > -1000);
    fprintf(stderr, "pull without a deadline: status %d after %llu ms: %s\n", status,
            (unsigned long long)ms, f.env->message);
    assert_int_equal(status, PS_DEADLINE_EXCEEDED);
    assert_in_range(ms, 1000, 8000);
    frame_fini(&f);
    nng_msg_free(m);
    nng_close(s);
    ps_client_close(c);
    test_ps_signal_wait(&p, SIGTERM, 0);
    test_ps_cleanup(&p);
}

/* Every method of proto/README.md's table is answered by a server, UNIMPLEMENTED exactly where
 * the table says so (an empty request: any other status, e.g. INVALID_ARGUMENT, means the method
 * is there). Shutdown is left out: it would stop the server. */
static void test_proto_readme_methods(void **state)
{
    (void)state;
    FILE *f = fopen(proto_readme, "r");
    assert_non_null(f);
    test_ps p;
    test_ps_init(&p, server_bin, "psd-admin-proto");
    test_ps_start(&p, NULL);
    nng_socket s = test_raw_dial(p.port, 10000);
    char line[4096];
    int rows = 0;
    while (fgets(line, sizeof(line), f)) {
        int num;
        char name[64];
        if (sscanf(line, "| %d | %63[A-Z_] |", &num, name) != 2)
            continue;
        rows++;
        if (strcmp(name, "SHUTDOWN") == 0)
            continue;
        bool says_unimplemented = strstr(line, "UNIMPLEMENTED") != NULL;
        envelope env = PSD__V1__ENVELOPE__INIT;
        env.method = (Psd__V1__Method)num;
        env.request_id = (uint64_t)num;
        frame fr;
        nng_msg *m;
        int status = test_raw_request(s, &env, NULL, 0, &fr, &m);
        assert_true(status > -1000);
        if ((status == PS_UNIMPLEMENTED) != says_unimplemented)
            fail_msg("%s (%d): the server answers %d (%s) but proto/README.md says %s", name, num,
                     status, fr.env->message,
                     says_unimplemented ? "UNIMPLEMENTED" : "it is implemented");
        frame_fini(&fr);
        nng_msg_free(m);
    }
    fclose(f);
    assert_true(rows >= 12);
    nng_close(s);
    test_ps_signal_wait(&p, SIGTERM, 0);
    test_ps_cleanup(&p);
}

int main(int argc, char **argv)
{
    server_bin = test_server_bin(argc, argv);
    if (argc < 3) {
        fprintf(stderr, "usage: %s PS_SERVER PROTO_README\n", argv[0]);
        return 2;
    }
    proto_readme = argv[2];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_loopback_through_any_v6),
        cmocka_unit_test(test_blank_token_refused),
        cmocka_unit_test(test_help_lists_admin_methods),
        cmocka_unit_test(test_default_deadline_cut_and_logged),
        cmocka_unit_test(test_proto_readme_methods),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
