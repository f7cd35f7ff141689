/* Integration: connections that fail mid-handshake leave a real ps-server's data port serving.
 * Peers open TCP connections to the port and leave before the SP handshake completes, in the
 * ways that broke nng 1.5.2's listener (deploy/nng/patches): 4 bytes of a header, a wait past
 * the server's own header, then a reset (SO_LINGER 0); a half-close (FIN) followed by a reset,
 * which the server's next read or write sees as EPIPE (nng 1.5.2 took that for the listener's
 * own close and never accepted again); a bare reset and a bare close. Meanwhile one plain
 * client connected before them keeps its one connection (its socket saw one pipe added and none
 * removed) and is answered, and after each kind a new client connects and is answered. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>

#include "cluster_proc.h"
#include "ps_proc.h"

static const char *server_bin;

static atomic_int pipes_added, pipes_removed;

static void pipe_cb(nng_pipe p, nng_pipe_ev ev, void *arg)
{
    (void)p;
    (void)arg;
    atomic_fetch_add(ev == NNG_PIPE_EV_ADD_POST ? &pipes_added : &pipes_removed, 1);
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* A ServerStatus request on s: 0 when the server answered OK. */
static int status_call(nng_socket s)
{
    envelope env = PSD__V1__ENVELOPE__INIT;
    env.method = PSD__V1__METHOD__SERVER_STATUS;
    env.request_id = 1;
    frame f;
    nng_msg *m;
    int st = test_raw_request(s, &env, NULL, 0, &f, &m);
    if (st > -1000) {
        frame_fini(&f);
        nng_msg_free(m);
    }
    return st;
}

/* A new client's first call is answered within 5 s (the listener still accepts). */
static void new_client_is_answered(int port, const char *after)
{
    nng_socket s = test_raw_dial(port, 5000);
    int st = status_call(s);
    if (st != 0)
        fail_msg("after %s, a new client got no answer (%d): the listener stopped accepting", after,
                 st);
    nng_close(s);
}

static int tcp_connect(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    return fd;
}

/* Closes fd with a reset (SO_LINGER 0) instead of a FIN. */
static void tcp_reset(int fd)
{
    struct linger lg = {.l_onoff = 1, .l_linger = 0};
    assert_int_equal(setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg)), 0);
    close(fd);
}

/* Reads the server's 8-byte SP header (it sends it first): the handshake is under way. */
static void read_server_header(int fd)
{
    unsigned char h[8];
    size_t got = 0;
    while (got < sizeof(h)) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        assert_int_equal(poll(&pfd, 1, 5000), 1);
        ssize_t n = recv(fd, h + got, sizeof(h) - got, 0);
        assert_true(n > 0);
        got += (size_t)n;
    }
    assert_int_equal(h[1], 'S');
    assert_int_equal(h[2], 'P');
}

/* n connections that each half-close (FIN) and then reset: the server's socket is in
 * CLOSE_WAIT when the reset comes, so its next read or write fails with EPIPE. With gaps of 0
 * to 2 ms between the two, since which side acts first varies. */
static void half_close_then_reset(int port, int first, int n)
{
    static const long gap_us[] = {0, 20, 100, 500, 2000};
    for (int i = first; i < first + n; i++) {
        int fd = tcp_connect(port);
        shutdown(fd, SHUT_WR);
        struct timespec gap = {0, gap_us[i % 5] * 1000L};
        nanosleep(&gap, NULL);
        tcp_reset(fd);
    }
}

static void test_failed_handshakes_keep_the_port_serving(void **state)
{
    (void)state;
    test_ps p;
    test_ps_init(&p, server_bin, "psd-handshake");
    test_ps_start(&p, NULL);

    /* Half-closes then resets before any client came, one at a time with each gap: the
     * server's first write of the handshake (its header, at once on accepting) fails with
     * EPIPE. Spaced out: nng 1.5.2 rests its listener 100 ms after an error of a connection
     * (the start's probe of the port is one), and a failure while it rests goes unnoticed. */
    sleep_ms(300);
    for (int i = 0; i < 10; i++) {
        half_close_then_reset(p.port, i, 1);
        sleep_ms(150); /* past the rest of a listener that saw an error */
    }
    new_client_is_answered(p.port, "half-closes and resets on a fresh server");

    nng_socket est;
    assert_int_equal(nng_req0_open(&est), 0);
    nng_pipe_notify(est, NNG_PIPE_EV_ADD_POST, pipe_cb, NULL);
    nng_pipe_notify(est, NNG_PIPE_EV_REM_POST, pipe_cb, NULL);
    nng_socket_set_ms(est, NNG_OPT_RECVTIMEO, 5000);
    char url[64];
    snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", p.port);
    assert_int_equal(nng_dial(est, url, NULL, 0), 0);
    assert_int_equal(status_call(est), 0);
    assert_int_equal(atomic_load(&pipes_added), 1);

    /* 4 bytes of a header, a wait past the server's header, a reset. */
    int fd = tcp_connect(p.port);
    assert_int_equal(send(fd, "\0SP\0", 4, MSG_NOSIGNAL), 4);
    read_server_header(fd);
    sleep_ms(1500);
    tcp_reset(fd);
    sleep_ms(200);
    assert_int_equal(status_call(est), 0);
    new_client_is_answered(p.port, "4 bytes and a reset");

    half_close_then_reset(p.port, 0, 40);
    sleep_ms(200);
    assert_int_equal(status_call(est), 0);
    new_client_is_answered(p.port, "half-closes and resets");

    /* Bare resets and bare closes, some with a partial header. */
    for (int i = 0; i < 20; i++) {
        fd = tcp_connect(p.port);
        if (i % 4 >= 2)
            (void)send(fd, "\0S", 2, MSG_NOSIGNAL);
        if (i % 2)
            tcp_reset(fd);
        else
            close(fd);
    }
    sleep_ms(200);
    assert_int_equal(status_call(est), 0);
    new_client_is_answered(p.port, "resets and closes");

    /* The established client never lost its connection. */
    assert_int_equal(atomic_load(&pipes_added), 1);
    assert_int_equal(atomic_load(&pipes_removed), 0);
    nng_close(est);
    test_ps_signal_wait(&p, SIGTERM, 0);
    test_ps_cleanup(&p);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s PS_SERVER_BINARY\n", argv[0]);
        return 2;
    }
    server_bin = argv[1];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_failed_handshakes_keep_the_port_serving),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
