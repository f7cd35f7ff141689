/* Integration: a real ps-server listening on an ipc:// socket (a Unix socket path in a fresh
 * directory, where a stale socket file of a dead server already lies): a client of the
 * library creates and pulls a variable over ipc, and a push resent with the same sequence
 * number through a raw REQ socket dialled to the ipc URL is dropped as a duplicate. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>

#include "cluster_proc.h"
#include "ps_proc.h"
#include "psclient.h"

static const char *server_bin;
static char dir[64], sock_path[96], url[160], spec[256], log_path[128];
static pid_t server = -1;

/* Leaves a socket file that nobody listens on, as a SIGKILLed server does. */
static void make_stale_socket(const char *path)
{
    struct sockaddr_un sun = {.sun_family = AF_UNIX};
    snprintf(sun.sun_path, sizeof(sun.sun_path), "%s", path);
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    assert_int_equal(bind(fd, (struct sockaddr *)&sun, sizeof(sun)), 0);
    close(fd);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_true(S_ISSOCK(st.st_mode));
}

static nng_socket dial(int recv_timeout_ms)
{
    nng_socket s;
    assert_int_equal(nng_req0_open(&s), 0);
    nng_socket_set_ms(s, NNG_OPT_RECVTIMEO, recv_timeout_ms);
    assert_int_equal(nng_dial(s, url, NULL, 0), 0);
    return s;
}

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof(dir), "/tmp/ps-it-ipc-XXXXXX");
    if (mkdtemp(dir) == NULL)
        return -1;
    snprintf(sock_path, sizeof(sock_path), "%s/ps-0.sock", dir);
    snprintf(url, sizeof(url), "ipc://%s", sock_path);
    snprintf(spec, sizeof(spec),
             "{\"cluster\":{\"ps\":[\"%s\"]},\"task\":{\"type\":\"ps\",\"index\":0}}", url);
    snprintf(log_path, sizeof(log_path), "%s/server.log", dir);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    if (server > 0) { /* the test failed: show what the server said */
        kill(server, SIGKILL);
        test_wait_exit(server, 5000);
        FILE *f = fopen(log_path, "r");
        char line[1024];
        while (f != NULL && fgets(line, sizeof(line), f) != NULL)
            fputs(line, stderr);
        if (f != NULL)
            fclose(f);
    }
    unlink(sock_path);
    unlink(log_path);
    rmdir(dir);
    return 0;
}

static void start_server(void)
{
    server = fork();
    assert_true(server >= 0);
    if (server == 0) {
        int fd = open(log_path, O_WRONLY | O_CREAT | O_APPEND, 0600);
        if (fd >= 0) {
            dup2(fd, STDERR_FILENO);
            close(fd);
        }
        setenv("TF_CONFIG", spec, 1);
        execl(server_bin, server_bin, "--log-format", "json", (char *)NULL);
        _exit(127);
    }
    /* Listening once it says so (it has removed the stale socket first). */
    for (int i = 0; i < 200; i++) {
        if (test_file_contains(log_path, "serving on ipc://"))
            return;
        assert_int_equal(kill(server, 0), 0);
        usleep(50 * 1000);
    }
    fail_msg("ps-server did not listen on %s (log %s)", url, log_path);
}

static void test_ipc_exactly_once(void **state)
{
    (void)state;
    make_stale_socket(sock_path);
    start_server();

    ps_config *cfg;
    ps_client *c = NULL;
    char tf[300];
    snprintf(tf, sizeof(tf), "{\"cluster\":{\"ps\":[\"%s\"]}}", url);
    assert_int_equal(ps_config_create(&cfg), PS_OK);
    assert_int_equal(ps_config_set(cfg, "cluster", tf), PS_OK);
    assert_int_equal(ps_config_set(cfg, "deadline-ms", "20000"), PS_OK);
    if (ps_client_open(&c, cfg) != PS_OK)
        fail_msg("open over ipc: %s", ps_last_error());
    ps_config_destroy(cfg);

    ps_var *v = test_make_var(c, "ipc/replay", 1);
    assert_non_null(v);
    nng_socket s = dial(5000);
    int st;
    bool dup;
    test_raw_push(s, "ipc/replay", -1, 0x1bc, 7, 3.0f, &st, &dup);
    assert_int_equal(st, PS_OK);
    assert_false(dup);
    test_raw_push(s, "ipc/replay", -1, 0x1bc, 7, 3.0f, &st, &dup); /* resent: dropped */
    assert_int_equal(st, PS_OK);
    assert_true(dup);
    nng_close(s);
    s = dial(5000); /* a new connection does not make it new */
    test_raw_push(s, "ipc/replay", -1, 0x1bc, 7, 3.0f, &st, &dup);
    assert_int_equal(st, PS_OK);
    assert_true(dup);
    test_raw_push(s, "ipc/replay", -1, 0x1bc, 8, 1.0f, &st, &dup); /* next: applied */
    assert_int_equal(st, PS_OK);
    assert_false(dup);
    nng_close(s);

    float val;
    assert_int_equal(ps_pull(c, v, &val), PS_OK);
    assert_true(val == -4.0f); /* 3 + 1, the resends not counted */
    ps_server_stats stats;
    assert_int_equal(ps_server_status(c, 0, &stats), PS_OK);
    assert_int_equal(stats.duplicates_dropped, 2);
    ps_client_close(c);

    assert_int_equal(kill(server, SIGTERM), 0);
    assert_int_equal(test_wait_exit(server, 10000), 0);
    server = -1;
}

int main(int argc, char **argv)
{
    server_bin = test_server_bin(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ipc_exactly_once),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
