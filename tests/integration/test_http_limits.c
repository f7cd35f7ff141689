/* Integration: the HTTP endpoint (http-listen) under abuse, against a real ps-server whose
 * open-files limit is 1,024. 1,100 idle connections to the HTTP port: /livez and a new
 * data-port client still answer in time, the server holds a bounded number of descriptors and
 * does not spin. A slowloris connection (headers a line at a time) and a silent one are closed
 * at the header timeout (5 s from the connection). 70 connections that each send a byte of
 * their headers every 100 ms do not keep /livez and /readyz from answering. Ten concurrent
 * /metrics scrapes of 5,000 variables all answer while a data call stays fast, and the server's
 * memory grows by at most a few texts.
 *
 * usage: it_http_limits PS-SERVER */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "cluster_proc.h"
#include "ps_proc.h"
#include "timeutil.h"

#define IDLE_CONNS 1100
#define TRICKLERS 70
#define PROBES 30
#define SCRAPES 10
#define NVARS 5000

static const char *server_bin;
static test_ps ps;
static int hport;
static ps_client *client;

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static uint64_t ms_since(uint64_t t0)
{
    return (time_now_ns() - t0) / 1000000u;
}

/* A connection to the HTTP port (blocking connect; non-blocking afterwards when nb). */
static int http_connect(bool nb)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)hport)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (nb)
        fcntl(fd, F_SETFL, O_NONBLOCK);
    int rc = connect(fd, (struct sockaddr *)&sa, sizeof(sa));
    assert_true(rc == 0 || (nb && errno == EINPROGRESS));
    return fd;
}

/* GET path on a fresh connection, waiting at most 10 s. Returns the status (-1: none) and the
 * body's length in *len when len is not NULL. */
static int http_get(const char *path, size_t *len)
{
    int fd = http_connect(false);
    struct timeval tv = {10, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    char req[256];
    int n = snprintf(req, sizeof(req),
                     "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", path);
    assert_int_equal(write(fd, req, (size_t)n), n);
    char buf[65536];
    size_t got = 0, total = 0;
    ssize_t r;
    while ((r = read(fd, buf + got, sizeof(buf) - 1 - got)) > 0) {
        total += (size_t)r;
        got = got + (size_t)r < 4096 ? got + (size_t)r : 4096; /* keep the head only */
    }
    close(fd);
    buf[got] = '\0';
    int status = -1;
    if (sscanf(buf, "HTTP/1.%*d %d", &status) != 1)
        status = -1;
    if (len)
        *len = total;
    return status;
}

/* CPU seconds (user + system) the server used so far. */
static double server_cpu_s(void)
{
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)ps.pid);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')');
    assert_non_null(p);
    unsigned long ut = 0, st = 0;
    /* Fields after the command: state ppid pgrp session tty tpgid flags minflt cminflt majflt
     * cmajflt utime stime. */
    assert_int_equal(sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st),
                     2);
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

/* Descriptors the server has open. */
static int server_fds(void)
{
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "ls /proc/%d/fd | wc -l", (int)ps.pid);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    int n = -1;
    assert_int_equal(fscanf(p, "%d", &n), 1);
    pclose(p);
    return n;
}

/* The server's resident set in KiB. */
static long server_rss_kib(void)
{
    char path[64], line[256];
    snprintf(path, sizeof(path), "/proc/%d/status", (int)ps.pid);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    long kib = -1;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "VmRSS: %ld", &kib) == 1)
            break;
    fclose(f);
    return kib;
}

/* TCP sockets of either end of a connection to the HTTP port that are not yet closed (all
 * but the listener and TIME_WAIT ones), from /proc/net/tcp. */
static int http_conns_held(void)
{
    FILE *f = fopen("/proc/net/tcp", "r");
    assert_non_null(f);
    char line[512];
    int n = 0;
    while (fgets(line, sizeof(line), f)) {
        unsigned lport, rport, st;
        if (sscanf(line, " %*d: %*x:%x %*x:%x %x", &lport, &rport, &st) == 3 &&
            ((int)lport == hport || (int)rport == hport) && st != 0x0A && st != 0x06)
            n++;
    }
    fclose(f);
    return n;
}

/* Waits until the server has let go of every connection an earlier test opened to the HTTP
 * port (those still in its accept queue included), so that they play no part in the next. */
static void http_settle(void)
{
    uint64_t t0 = time_now_ns();
    int held;
    while ((held = http_conns_held()) > 0) {
        if (ms_since(t0) > 30000)
            fail_msg("the server still holds %d HTTP connections after 30 s", held);
        sleep_ms(50);
    }
}

/* A ServerStatus on the open client; returns its time in ms. */
static uint64_t timed_status(void)
{
    uint64_t t0 = time_now_ns();
    ps_server_stats st;
    assert_int_equal(ps_server_status(client, 0, &st), PS_OK);
    return ms_since(t0);
}

static int setup(void **state)
{
    (void)state;
    test_ps_init(&ps, server_bin, "psd-http-limits");
    hport = test_free_port();
    char haddr[64];
    snprintf(haddr, sizeof(haddr), "127.0.0.1:%d", hport);
    const char *extra[] = {"--http-listen", haddr, NULL};
    /* The server gets an open-files limit of 1,024; this process keeps its own. */
    struct rlimit old, low;
    assert_int_equal(getrlimit(RLIMIT_NOFILE, &old), 0);
    if (old.rlim_max < IDLE_CONNS + 200) {
        fprintf(stderr, "open-files hard limit %llu is too low for this test\n",
                (unsigned long long)old.rlim_max);
        return -1;
    }
    low = old;
    low.rlim_cur = 1024;
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &low), 0);
    test_ps_start(&ps, extra);
    old.rlim_cur = old.rlim_max;
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &old), 0);
    int st = -1;
    for (int i = 0; i < 100 && (st = http_get("/readyz", NULL)) != 200; i++)
        sleep_ms(50);
    assert_int_equal(st, 200);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    if (client)
        ps_client_close(client);
    test_ps_signal_wait(&ps, SIGTERM, 0);
    test_ps_cleanup(&ps);
    return 0;
}

static void test_idle_connections(void **state)
{
    (void)state;
    int base_fds = server_fds();
    static int fds[IDLE_CONNS];
    for (int i = 0; i < IDLE_CONNS; i++)
        fds[i] = http_connect(true);
    sleep_ms(500);
    /* Probes and a new data-port client still get in, in time. */
    uint64_t t0 = time_now_ns();
    assert_int_equal(http_get("/livez", NULL), 200);
    assert_true(ms_since(t0) < 2000);
    t0 = time_now_ns();
    client = test_ps_open_client(&ps, NULL, NULL);
    assert_non_null(client);
    assert_true(timed_status() < 3000);
    assert_true(ms_since(t0) < 3000);
    /* Bounded descriptors: the HTTP side holds at most its cap (64), not 1,100. */
    int held = server_fds();
    fprintf(stderr, "server descriptors: %d before, %d with %d idle HTTP connections\n", base_fds,
            held, IDLE_CONNS);
    assert_true(held < base_fds + 100);
    /* And no spinning while they stay open. */
    double cpu0 = server_cpu_s();
    sleep_ms(1000);
    double cpu = server_cpu_s() - cpu0;
    fprintf(stderr, "server CPU with idle connections: %.2f s in 1 s\n", cpu);
    assert_true(cpu < 0.5);
    /* Closed with a reset: a connection the listener completed by a SYN cookie but never
     * queued would otherwise reach the server's accept queue with this side's FIN
     * retransmitted seconds later, and such late arrivals would crowd the next tests. */
    for (int i = 0; i < IDLE_CONNS; i++) {
        struct linger lg = {1, 0};
        setsockopt(fds[i], SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
        close(fds[i]);
    }
    http_settle();
}

/* Waits until the server closes fd (reads EOF or a reset) without answering, sending `drip`
 * every 500 ms if not NULL; returns the ms since t0 (taken before the connection was opened),
 * or fails after limit_ms or on a reply. */
static uint64_t wait_closed(int fd, uint64_t t0, const char *drip, uint64_t limit_ms)
{
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 500) > 0) {
            char b[512];
            ssize_t r = recv(fd, b, sizeof(b) - 1, MSG_DONTWAIT);
            if (r == 0 || (r < 0 && errno != EAGAIN))
                return ms_since(t0);
            if (r > 0) {
                b[r] = '\0';
                fail_msg("the server answered an incomplete request after %llu ms: %.80s",
                         (unsigned long long)ms_since(t0), b);
            }
        }
        if (drip && send(fd, drip, strlen(drip), MSG_NOSIGNAL) < 0)
            return ms_since(t0);
        if (ms_since(t0) > limit_ms)
            fail_msg("the server kept the connection open for %llu ms",
                     (unsigned long long)ms_since(t0));
    }
}

static void test_slow_headers_closed(void **state)
{
    (void)state;
    http_settle();
    /* The header timeout runs from the connection, which the server accepted after t0: it
     * closes the connection 5 s after t0 at the earliest, however late (a loaded machine)
     * it or this process get to run; the upper limit only ends a test that would hang. */
    uint64_t t0 = time_now_ns();
    int slow = http_connect(false);
    const char *start = "GET /livez HTTP/1.1\r\nHost: 127.0.0.1\r\n";
    assert_int_equal(write(slow, start, strlen(start)), (ssize_t)strlen(start));
    uint64_t ms = wait_closed(slow, t0, "X-Slow: 1\r\n", 30000);
    fprintf(stderr, "slowloris connection closed after %llu ms\n", (unsigned long long)ms);
    assert_true(ms >= 5000); /* at the header timeout, not at once and not renewed by a line */
    close(slow);
    t0 = time_now_ns();
    int silent = http_connect(false);
    ms = wait_closed(silent, t0, NULL, 30000);
    fprintf(stderr, "silent connection closed after %llu ms\n", (unsigned long long)ms);
    assert_true(ms >= 5000);
    close(silent);
    /* A kept-alive connection serves a second request on it. */
    int ka = http_connect(false);
    const char *req =
        "GET /livez HTTP/1.1\r\nHost: x\r\n\r\nGET /livez HTTP/1.1\r\nHost: x\r\n\r\n";
    assert_int_equal(write(ka, req, strlen(req)), (ssize_t)strlen(req));
    char buf[1024];
    size_t got = 0;
    t0 = time_now_ns();
    while (ms_since(t0) < 30000) {
        struct pollfd p = {.fd = ka, .events = POLLIN};
        if (poll(&p, 1, 200) > 0) {
            ssize_t r = read(ka, buf + got, sizeof(buf) - 1 - got);
            assert_true(r > 0);
            got += (size_t)r;
            buf[got] = '\0';
            const char *second = strstr(buf, "HTTP/1.1 200");
            if (second && strstr(second + 1, "HTTP/1.1 200") && strstr(buf, "ok\nHTTP") &&
                buf[got - 1] == '\n')
                break;
        }
    }
    const char *first = strstr(buf, "HTTP/1.1 200 OK");
    assert_non_null(first);
    assert_non_null(strstr(first + 1, "HTTP/1.1 200 OK"));
    close(ka);
}

/* A connection to the HTTP port that will send its headers a byte at a time. */
static int trickler_open(void)
{
    int fd = http_connect(false);
    fcntl(fd, F_SETFL, O_NONBLOCK);
    return fd;
}

/* Whether the server closed fd (EOF or a reset); does not block. */
static bool peer_closed(int fd)
{
    char b[512];
    ssize_t r = recv(fd, b, sizeof(b), MSG_DONTWAIT);
    return r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
}

/* TRICKLERS connections (more than the server serves at once) each send one byte of headers
 * that never end every 100 ms, and one closed by the server is opened again at once: /livez
 * still answers 200 to every one of PROBES probes made meanwhile, and /readyz to every third. What
 * is counted is answers, not their speed, so a loaded machine changes nothing but the time the test
 * takes. */
static void test_trickling_connections_leave_probes(void **state)
{
    (void)state;
    http_settle();
    static const char head[] = "GET /livez HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ";
    int fds[TRICKLERS];
    size_t sent[TRICKLERS] = {0};
    for (int i = 0; i < TRICKLERS; i++)
        fds[i] = trickler_open();
    int ok = 0, ready_ok = 0, reopened = 0, status[PROBES], ready[PROBES / 3];
    uint64_t t0 = time_now_ns();
    for (int p = 0; p < PROBES; p++) {
        for (int i = 0; i < TRICKLERS; i++) {
            if (peer_closed(fds[i])) {
                close(fds[i]);
                fds[i] = trickler_open();
                sent[i] = 0;
                reopened++;
            }
            char ch = sent[i] < sizeof(head) - 1 ? head[sent[i]] : 'a';
            if (send(fds[i], &ch, 1, MSG_NOSIGNAL | MSG_DONTWAIT) == 1)
                sent[i]++;
        }
        status[p] = http_get("/livez", NULL);
        ok += status[p] == 200;
        if (p % 3 == 0) {
            ready[p / 3] = http_get("/readyz", NULL);
            ready_ok += ready[p / 3] == 200;
        }
        sleep_ms(100);
    }
    fprintf(stderr,
            "/livez answered 200 to %d of %d probes, /readyz to %d of %d, in %llu ms beside %d "
            "trickling connections (%d of them closed by the server and opened again)\n",
            ok, PROBES, ready_ok, PROBES / 3, (unsigned long long)ms_since(t0), TRICKLERS,
            reopened);
    for (int p = 0; p < PROBES; p++)
        if (status[p] != 200 || (p % 3 == 0 && ready[p / 3] != 200))
            fprintf(stderr, "probe %d: /livez %d, /readyz %d\n", p, status[p],
                    p % 3 == 0 ? ready[p / 3] : 0);
    for (int i = 0; i < TRICKLERS; i++)
        close(fds[i]);
    assert_int_equal(ok, PROBES);
    assert_int_equal(ready_ok, PROBES / 3);
    assert_true(reopened >= TRICKLERS - 64); /* the server really was full */
}

static void test_concurrent_scrapes(void **state)
{
    (void)state;
    for (int i = 0; i < NVARS; i++) {
        char name[32];
        snprintf(name, sizeof(name), "scrape/%05d", i);
        assert_non_null(test_make_var(client, name, 1));
    }
    size_t text_len = 0;
    assert_int_equal(http_get("/metrics", &text_len), 200);
    long rss0 = server_rss_kib();
    uint64_t calm = timed_status();
    /* Ten scrapes at once by slow readers (small receive buffers, nothing read for 500 ms). */
    int fds[SCRAPES];
    const char *req = "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    for (int i = 0; i < SCRAPES; i++) {
        fds[i] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        int small = 4096;
        setsockopt(fds[i], SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)hport)};
        sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        assert_int_equal(connect(fds[i], (struct sockaddr *)&sa, sizeof(sa)), 0);
        assert_int_equal(write(fds[i], req, strlen(req)), (ssize_t)strlen(req));
    }
    sleep_ms(500);
    uint64_t busy = timed_status();
    long rss1 = server_rss_kib();
    /* Read them all, round robin. */
    size_t got[SCRAPES] = {0};
    static char *text[SCRAPES];
    bool done[SCRAPES] = {false};
    int open = SCRAPES;
    uint64_t t0 = time_now_ns();
    while (open > 0 && ms_since(t0) < 30000) {
        for (int i = 0; i < SCRAPES; i++) {
            if (done[i])
                continue;
            if (text[i] == NULL)
                text[i] = calloc(1, 2 * text_len + 65536);
            assert_non_null(text[i]);
            size_t room = 2 * text_len + 65535 - got[i];
            ssize_t r = room ? recv(fds[i], text[i] + got[i], room, MSG_DONTWAIT) : 0;
            if (r > 0) {
                got[i] += (size_t)r;
            } else if (r == 0 || errno != EAGAIN) {
                done[i] = true;
                open--;
            }
        }
    }
    /* Renderings: scrapes that overlapped share one text, seen by its uptime sample. */
    char uptimes[SCRAPES][64];
    int renders = 0;
    for (int i = 0; i < SCRAPES; i++) {
        close(fds[i]);
        assert_true(done[i]);
        assert_true(got[i] >= text_len * 9 / 10); /* a whole text each */
        const char *u = strstr(text[i], "\npsd_server_uptime_seconds ");
        assert_non_null(u);
        snprintf(uptimes[i], sizeof(uptimes[i]), "%.*s", (int)strcspn(u + 1, "\n"), u + 1);
        bool seen = false;
        for (int j = 0; j < i && !seen; j++)
            seen = strcmp(uptimes[j], uptimes[i]) == 0;
        renders += !seen;
        free(text[i]);
        text[i] = NULL;
    }
    fprintf(stderr,
            "metrics text %zu bytes; %d renderings for %d concurrent scrapes; ServerStatus %llu "
            "ms alone, %llu ms during them; RSS %ld KiB before, %ld KiB during\n",
            text_len, renders, SCRAPES, (unsigned long long)calm, (unsigned long long)busy, rss0,
            rss1);
    assert_true(busy < 1000);
    assert_true(renders <= 3); /* one per burst read together, not one per scrape */
#ifndef __SANITIZE_ADDRESS__
    /* At most a few texts live at once, not one per scrape. (Under AddressSanitizer freed
     * memory sits in its quarantine and the resident set says nothing about that.) */
    assert_true(rss1 - rss0 < (long)(4 * text_len / 1024) + 8192);
#endif
}

int main(int argc, char **argv)
{
    server_bin = test_server_bin(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_idle_connections),
        cmocka_unit_test(test_slow_headers_closed),
        cmocka_unit_test(test_trickling_connections_leave_probes),
        cmocka_unit_test(test_concurrent_scrapes),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
