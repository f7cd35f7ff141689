/* Test support for cmocka integration tests: one real ps-server process with a log file and a
 * directory of its own, clients of it, and raw envelope requests over a REQ socket. Failures
 * fail the running cmocka test. */
#ifndef PSD_TESTS_PS_PROC_H
#define PSD_TESTS_PS_PROC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <nng/nng.h>

#include "frame.h"
#include "psclient.h"

typedef struct test_ps {
    const char *server_bin;
    int port;
    pid_t pid;
    char spec[128]; /* {"ps":["127.0.0.1:port"]} */
    char dir[256];  /* a fresh directory under /tmp, removed by test_ps_cleanup */
    char log[300];  /* dir/server.log: the server's stderr */
} test_ps;

/* A free port, its cluster spec, and a fresh directory /tmp/<prefix>-XXXXXX. */
void test_ps_init(test_ps *p, const char *server_bin, const char *prefix);

/* Starts the server (flags `extra`, NULL-terminated, may be NULL) with its stderr appended to
 * p->log and waits until it listens (at most 10 s); otherwise prints the log and fails. */
void test_ps_start(test_ps *p, const char *const *extra);

/* Sends sig to the server and asserts that it exits with `expect` (test_wait_exit). */
void test_ps_signal_wait(test_ps *p, int sig, int expect);

/* SIGKILLs the server if it still runs, and removes its directory. */
void test_ps_cleanup(test_ps *p);

/* A client of the server (deadline 20 s), with resend-ms and chunk-bytes when not NULL; NULL
 * (and a line on stderr) if it cannot be opened. */
ps_client *test_ps_open_client(const test_ps *p, const char *resend_ms, const char *chunk);

struct test_cluster;

/* A client of the cluster tc as worker `worker` (its TF_CONFIG), with the settings `settings`
 * (name, value, name, value, ..., NULL; may be NULL); fails the test, naming the setting or the
 * open that failed, if it cannot be opened. */
ps_client *test_cluster_open_worker(const struct test_cluster *tc, int worker,
                                    const char *const *settings);

/* Creates a 1-D float variable of n elements with SGD learning rate 1 (from zeros, its values
 * are minus the sum of the gradients pushed); NULL (and a line on stderr) on failure. */
ps_var *test_make_var(ps_client *c, const char *name, uint64_t n);
/* The same with a staleness bound (PS_STALENESS_*, or s > 0). */
ps_var *test_make_var_bound(ps_client *c, const char *name, uint64_t n, int staleness);

/* Looks up a variable; NULL (and a line on stderr) on failure. */
ps_var *test_find_var(ps_client *c, const char *name);

/* Pushes the gradient g to every one of the n elements. */
void test_push_const(ps_client *c, ps_var *v, size_t n, float g);

/* Pushes g to every element of the rows of ids [first, first + n) of a table of dim floats a
 * row, 6,000 ids a push; asserts each push is PS_OK (naming its first id on stderr if not). */
void test_table_push_range(ps_table *t, uint32_t dim, int64_t first, int64_t n, float g);

/* Asserts that every one of the n elements of the variable equals want. */
void test_expect_all(ps_client *c, const char *name, size_t n, float want);

/* Forks n processes that each _exit(body(id, arg)) (id 0..n-1) and asserts they all exit 0. */
void test_fork_clients(int n, int (*body)(int id, const void *arg), const void *arg);

/* A REQ socket dialled to the loopback port, with a receive timeout of recv_timeout_ms. */
nng_socket test_raw_dial(int port, int recv_timeout_ms);

/* One raw request on s: returns the reply's status and the parsed frame in *f / *m (caller:
 * frame_fini and nng_msg_free), or -1000 - the nng error if no reply came (e.g. the server
 * died; *f and *m are then unset). */
int test_raw_request(nng_socket s, envelope *env, const void *seg, size_t seglen, frame *f,
                     nng_msg **m);

/* The same on a fresh connection to the loopback port (receive timeout 15 s). */
int test_raw_call(int port, envelope *env, const void *seg, size_t seglen, frame *f, nng_msg **m);

/* REPLICATE with checksum set, to the server on loopback port `port`, about replica group
 * `group` (epoch: the view epoch sent, 0 none): the reply's status as test_raw_call returns it
 * (-2000: a reply that does not decode), and when 0 its checksum, variables and applied lsn
 * (each pointer may be NULL). */
/* The view epoch the server on port answers with (its ServerStatus reply's envelope); 0 when
 * it does not answer. */
uint64_t test_server_epoch(int port);
/* The coordinator prefix the servers of tc use by default (view_default_prefix over its
 * 127.0.0.1:port addresses). */
void test_view_prefix(const struct test_cluster *tc, char *buf, size_t cap);
int test_group_checksum(int port, uint32_t group, uint64_t epoch, uint64_t *sum, uint32_t *vars,
                        uint64_t *lsn);

/* The reply to a raw push: its status (-1000 - the nng error: no reply) and, when OK, the
 * PushReply's fields (otherwise false and 0). */
typedef struct test_push_reply {
    int status;
    bool duplicate;
    uint64_t version, restored_version;
} test_push_reply;

/* A raw push of one float to element 0 of `name` as client `client` with sequence number seq
 * (also the request id) and worker id worker_id. */
test_push_reply test_raw_push_reply(nng_socket s, const char *name, int worker_id, uint64_t client,
                                    uint64_t seq, float value);

/* The same (test_raw_push_reply): the reply's status in *status, and whether it was dropped as
 * a duplicate in *duplicate (false unless the status is OK). */
void test_raw_push(nng_socket s, const char *name, int worker_id, uint64_t client, uint64_t seq,
                   float value, int *status, bool *duplicate);

/* GET path from 127.0.0.1:port: the HTTP status (-1: no answer) and, when body is not NULL,
 * the body (malloc'd, NUL-terminated; NULL without an answer). */
int test_http_get(int port, const char *path, char **body);

#endif
