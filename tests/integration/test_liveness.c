/* Integration: no silent hangs. Heartbeats keep a worker live on one server while its calls
 * block on another; a client rides through a server restart within its deadline and says
 * that it waits; a server stopped past the deadline gives DEADLINE_EXCEEDED naming it. Real
 * ps-server processes on loopback. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cluster_proc.h"
#include "psclient.h"
#include "timeutil.h"

static const char *server_bin;

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static uint64_t ms_since(uint64_t t0)
{
    return (time_now_ns() - t0) / 1000000u;
}

/* Opens a client of the cluster; worker < 0: not a worker (no heartbeats, no clock). */
static ps_client *open_client(const test_cluster *tc, int worker, const char *deadline_ms)
{
    char tf[1400];
    test_cluster_tf_config(tc, worker >= 0 ? "worker" : NULL, worker, tf, sizeof(tf));
    ps_config *cfg;
    ps_client *c = NULL;
    assert_int_equal(ps_config_create(&cfg), PS_OK);
    assert_int_equal(ps_config_set(cfg, "tf-config", tf), PS_OK);
    assert_int_equal(ps_config_set(cfg, "deadline-ms", deadline_ms), PS_OK);
    assert_int_equal(ps_config_set(cfg, "heartbeat-ms", "100"), PS_OK);
    assert_int_equal(ps_config_set(cfg, "retry-max-backoff-ms", "200"), PS_OK);
    if (ps_client_open(&c, cfg) != PS_OK)
        fail_msg("ps_client_open: %s", ps_last_error());
    ps_config_destroy(cfg);
    return c;
}

/* Our own stderr (where the client library logs) goes to a file while captured. */
typedef struct capture {
    int saved;
    char path[64];
} capture;

static void capture_start(capture *cp)
{
    snprintf(cp->path, sizeof(cp->path), "/tmp/psd-liveness-XXXXXX");
    int fd = mkstemp(cp->path);
    assert_true(fd >= 0);
    fflush(stderr);
    cp->saved = dup(2);
    assert_true(cp->saved >= 0);
    assert_int_equal(dup2(fd, 2), 2);
    close(fd);
}

/* Restores stderr, echoes what was captured and returns it (malloc'd). */
static char *capture_end(capture *cp)
{
    fflush(stderr);
    dup2(cp->saved, 2);
    close(cp->saved);
    FILE *f = fopen(cp->path, "rb");
    assert_non_null(f);
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    buf[n] = '\0';
    fclose(f);
    unlink(cp->path);
    fputs(buf, stderr);
    return strdup(buf);
}

/* ---- heartbeats independent of blocked calls ---------------------------------------------- */

typedef struct clock_call {
    ps_client *c;
    int rc;
    char err[512];
} clock_call;

static void *clock_thread(void *arg)
{
    clock_call *cc = arg;
    cc->rc = ps_clock(cc->c, NULL);
    snprintf(cc->err, sizeof(cc->err), "%s", ps_last_error());
    return NULL;
}

static void test_heartbeats_while_blocked(void **state)
{
    (void)state;
    test_cluster tc;
    const char *extra[] = {"--worker-timeout-ms", "1000", NULL};
    assert_int_equal(test_cluster_start_workers(&tc, server_bin, 2, 1, extra), 0);
    ps_client *w = open_client(&tc, 0, "8000");
    ps_client *obs = open_client(&tc, -1, "2000");
    sleep_ms(300);

    /* ps 1 stops: the worker's clock call blocks on it. */
    assert_int_equal(kill(tc.pids[1], SIGSTOP), 0);
    clock_call cc = {.c = w};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, clock_thread, &cc), 0);
    uint64_t t0 = time_now_ns();
    int polls = 0;
    while (ms_since(t0) < 3500) { /* 3.5 times the liveness timeout */
        ps_server_stats st;
        assert_int_equal(ps_server_status(obs, 0, &st), PS_OK);
        if (st.live_workers != 1 || st.evictions != 0)
            fail_msg("ps 0 lost the worker after %llu ms while its calls blocked on ps 1: "
                     "live_workers %u, evictions %llu",
                     (unsigned long long)ms_since(t0), st.live_workers,
                     (unsigned long long)st.evictions);
        polls++;
        sleep_ms(200);
    }
    assert_true(polls >= 10);
    assert_int_equal(kill(tc.pids[1], SIGCONT), 0);
    pthread_join(th, NULL);
    if (cc.rc != PS_OK)
        fail_msg("the clock blocked on ps 1 failed after SIGCONT: %s: %s", ps_strerror(cc.rc),
                 cc.err);
    ps_client_close(obs);
    ps_client_close(w);
    assert_int_equal(test_cluster_stop(&tc), 0);
}

/* ---- riding through a restart ---------------------------------------------------------------- */

static ps_var *make_var(ps_client *c, int n)
{
    ps_var_spec s;
    ps_var_spec_init(&s, "live/w");
    s.ndims = 1;
    s.dims[0] = (uint64_t)n;
    s.optimizer = PS_OPT_SGD;
    s.learning_rate = 0.1;
    s.staleness = PS_STALENESS_ASYNC;
    ps_var *v = NULL;
    if (ps_var_create(c, &s, &v) != PS_OK)
        fail_msg("ps_var_create: %s", ps_last_error());
    return v;
}

typedef struct pusher {
    ps_client *c;
    ps_var *v;
    atomic_int stop;
    int calls, ok, recreated, slow;
    int bad_rc;
    char bad[512];
} pusher;

static void *push_loop(void *arg)
{
    pusher *p = arg;
    float g[64];
    for (int i = 0; i < 64; i++)
        g[i] = 1.0f;
    while (!atomic_load(&p->stop) && p->bad_rc == PS_OK) {
        uint64_t t0 = time_now_ns();
        int rc = ps_push(p->c, p->v, g);
        p->calls++;
        if (ms_since(t0) > 1000)
            p->slow++;
        if (rc == PS_OK) {
            p->ok++;
        } else if (rc == PS_NOT_FOUND) {
            /* The restarted server has no checkpoint: its variables are gone. */
            ps_var *v = make_var(p->c, 64);
            p->v = v;
            p->recreated++;
        } else {
            p->bad_rc = rc;
            snprintf(p->bad, sizeof(p->bad), "%s", ps_last_error());
        }
        sleep_ms(20);
    }
    return NULL;
}

static void test_ride_through_restart(void **state)
{
    (void)state;
    test_cluster tc;
    assert_int_equal(test_cluster_start(&tc, server_bin, 1, NULL), 0);
    capture cp;
    capture_start(&cp);
    ps_client *c = open_client(&tc, -1, "10000");
    pusher p = {.c = c, .v = make_var(c, 64)};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, push_loop, &p), 0);
    sleep_ms(300);
    int before = p.ok;
    assert_int_equal(kill(tc.pids[0], SIGKILL), 0);
    sleep_ms(3000); /* down for longer than the 2 s after which a wait is logged */
    assert_int_equal(test_cluster_respawn(&tc, server_bin, 0, NULL), 0);
    uint64_t t0 = time_now_ns();
    while (p.ok < before + 10 && ms_since(t0) < 8000 && p.bad_rc == PS_OK)
        sleep_ms(50);
    atomic_store(&p.stop, 1);
    pthread_join(th, NULL);
    ps_client_close(c);
    char *log = capture_end(&cp);
    if (p.bad_rc != PS_OK)
        fail_msg("a push failed across the restart: %s: %s", ps_strerror(p.bad_rc), p.bad);
    assert_true(before > 0);
    assert_true(p.ok >= before + 10); /* it kept pushing after the restart */
    assert_true(p.slow >= 1);         /* one call spanned the outage */
    if (strstr(log, "waiting for ps 0 at tcp://127.0.0.1:") == NULL)
        fail_msg("no \"waiting for ps 0\" line was logged during a 3 s outage");
    fprintf(stderr, "restart: %d pushes, %d OK, %d re-created after the restart\n", p.calls, p.ok,
            p.recreated);
    free(log);
    assert_int_equal(test_cluster_stop(&tc), 0);
}

/* True when /proc reports the thread at path stopped (state T or t). */
static bool thread_stopped(const char *path)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return true; /* gone: it cannot answer either */
    char buf[512] = "";
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')'); /* the state follows the command name */
    return p != NULL && p[1] == ' ' && (p[2] == 'T' || p[2] == 't');
}

/* Waits up to ms until every thread of pid is stopped: SIGSTOP takes effect asynchronously,
 * thread by thread. */
static bool wait_stopped(pid_t pid, int ms)
{
    char dir[64];
    snprintf(dir, sizeof(dir), "/proc/%d/task", (int)pid);
    for (int waited = 0; waited <= ms; waited += 5) {
        DIR *d = opendir(dir);
        if (d == NULL)
            return false;
        bool all = true;
        struct dirent *e;
        while (all && (e = readdir(d)) != NULL) {
            if (e->d_name[0] == '.')
                continue;
            char path[330];
            snprintf(path, sizeof(path), "%s/%s/stat", dir, e->d_name);
            all = thread_stopped(path);
        }
        closedir(d);
        if (all)
            return true;
        usleep(5000);
    }
    return false;
}

static void test_stopped_past_deadline(void **state)
{
    (void)state;
    test_cluster tc;
    assert_int_equal(test_cluster_start(&tc, server_bin, 1, NULL), 0);
    ps_client *c = open_client(&tc, -1, "1500");
    ps_var *v = make_var(c, 64);
    float g[64] = {0};
    assert_int_equal(ps_push(c, v, g), PS_OK);
    assert_int_equal(kill(tc.pids[0], SIGSTOP), 0);
    /* SIGSTOP takes effect asynchronously: wait until the kernel reports the process stopped,
     * or a server thread still running could answer the next push. */
    assert_true(wait_stopped(tc.pids[0], 5000));
    uint64_t t0 = time_now_ns();
    int rc = ps_push(c, v, g);
    uint64_t ms = ms_since(t0);
    char want[64];
    snprintf(want, sizeof(want), "127.0.0.1:%d", tc.ports[0]);
    fprintf(stderr, "stopped server: %s after %llu ms: %s\n", ps_strerror(rc),
            (unsigned long long)ms, ps_last_error());
    assert_int_equal(rc, PS_DEADLINE_EXCEEDED);
    assert_non_null(strstr(ps_last_error(), "ps 0"));
    assert_non_null(strstr(ps_last_error(), want));
    assert_in_range(ms, 1400, 4000);
    assert_int_equal(kill(tc.pids[0], SIGCONT), 0);
    rc = ps_push(c, v, g);
    if (rc != PS_OK)
        fail_msg("after SIGCONT: %s: %s", ps_strerror(rc), ps_last_error());
    ps_client_close(c);
    assert_int_equal(test_cluster_stop(&tc), 0);
}

int main(int argc, char **argv)
{
    server_bin = test_server_bin(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_heartbeats_while_blocked),
        cmocka_unit_test(test_ride_through_restart),
        cmocka_unit_test(test_stopped_past_deadline),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
