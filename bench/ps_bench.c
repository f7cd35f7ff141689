/* ps-bench: wire throughput and latency of pull, push and push-pull against real ps-server
 * processes, beside a raw nng baseline (one REQ socket, one request in flight, the whole tensor
 * in one nng_msg, an 8-byte reply), and the cost of the allocator's configuration.
 *
 *   ps-bench [--server-bin PATH] [--seconds S] [--sizes 4K,64K,1M,16M,64M] [--servers 1,2] ...
 *   ps-bench --quick      smoke test: tiny sizes, every pulled value checked, exit 0 iff all ok
 *   ps-bench --sweep      client settings (connections x chunk-bytes) at 1 MiB and 16 MiB
 *   ps-bench --transport both     every cell over loopback TCP and over ipc://, side by side
 *   ps-bench --clients 1,8        push-mc: 1, then 8 clients (threads) pushing at once
 *   ps-bench --help
 *
 * The bench starts every process it talks to (servers on free loopback ports or ipc:// sockets,
 * the raw baseline server, allocator variants) as children that die with it. */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/un.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <nng/nng.h>

#ifdef PSD_WITH_JEMALLOC
#include <jemalloc/jemalloc.h>
#endif
#include "jemalloc_conf.h"

#include "bench.h"
#include "ipc_socket.h"
#include "options.h"
#include "proc_cpu.h"
#include "program.h"

/* jemalloc 5.3's own defaults for what jemalloc_conf.h changes (read with mallctl from a
 * program without malloc_conf: opt.oversize_threshold 8388608, opt.dirty_decay_ms 10000,
 * opt.muzzy_decay_ms 0, opt.thp default). MALLOC_CONF in the environment overrides the
 * compiled-in string key by key; with the oversize arena in use again, jemalloc_conf.h leaves
 * arena 0 alone, so this variant runs jemalloc as shipped. */
#define JEMALLOC_DEFAULTS                                                                          \
    "oversize_threshold:8388608,dirty_decay_ms:10000,muzzy_decay_ms:0,thp:default"

#define MAX_LIST 16
#define MAX_OPTS 32
#define MAX_SERVERS 8
#define MAX_CLIENT_COUNTS 8 /* entries of --clients */
#define MAX_CLIENTS 64      /* clients of one push-mc cell */

/* How the client reaches the servers (--transport). */
enum transport { TR_TCP, TR_IPC, TR_COUNT };
static const char *const transport_names[TR_COUNT] = {"tcp", "ipc"};

typedef struct variant {
    char label[80];
    char conf[256]; /* MALLOC_CONF for the children ("" : the compiled-in malloc_conf alone) */
    char bench_bin[PATH_MAX], server_bin[PATH_MAX];
} variant;

typedef struct bench_opts {
    char self[PATH_MAX];
    char server_bin[PATH_MAX];
    double seconds, warmup;
    size_t sizes[MAX_LIST];
    int nsizes;
    int servers[MAX_LIST];
    int nservers;
    bool kinds[OPK_COUNT]; /* operations to time */
    bool push_mc;          /* and push-mc, at every count of clients[] */
    int clients[MAX_CLIENT_COUNTS], nclients;
    int transports[TR_COUNT], ntransports; /* tcp, ipc or both (tcp first) */
    bool no_raw;
    const char *client_opts[MAX_OPTS]; /* name=value */
    int nclient_opts;
    const char *server_opts[MAX_OPTS];
    int nserver_opts;
    const char *split_threshold;
    size_t compare_size;
    variant variants[MAX_LIST];
    int nvariants;
    bool no_variants;
    bool quick, sweep, variant_child, check;
    int sweep_conns[MAX_LIST], nsweep_conns;
    size_t sweep_chunks[MAX_LIST];
    int nsweep_chunks;
    size_t sweep_sizes[MAX_LIST];
    int nsweep_sizes;
    unsigned timeout_s;
    options *opts;                /* the settings (scope OPT_SCOPE_TOOL); owns the strings */
    char client_flag_opts[2][96]; /* --connections and --chunk-bytes as NAME=VALUE */
} bench_opts;

static const char usage_line[] =
    "[OPTIONS]\n"
    "Measures pull, push and push-pull throughput (GB/s of tensor payload, 1 GB = 1e9 bytes)\n"
    "and latency (p50, p99) against ps-server processes it starts itself, beside a raw nng\n"
    "baseline, and compares the project's jemalloc settings with jemalloc's defaults; push-mc\n"
    "times several clients pushing at once (--clients), --transport tcp, ipc or both.";

/* ---- small parsers ------------------------------------------------------------------------ */

static int parse_size(const char *s, size_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s || errno)
        return -1;
    unsigned long long mul = 1;
    switch (*end) {
    case 'k':
    case 'K':
        mul = 1ull << 10;
        end++;
        break;
    case 'm':
    case 'M':
        mul = 1ull << 20;
        end++;
        break;
    case 'g':
    case 'G':
        mul = 1ull << 30;
        end++;
        break;
    default:
        break;
    }
    if (*end == 'i' && end[1] == 'B')
        end += 2;
    else if (*end == 'B')
        end++;
    if (*end != '\0' || v == 0 || v > SIZE_MAX / mul)
        return -1;
    *out = (size_t)(v * mul);
    return 0;
}

static int parse_size_list(const char *s, size_t *out, int *n)
{
    char buf[512];
    snprintf(buf, sizeof(buf), "%s", s);
    *n = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        if (*n == MAX_LIST || parse_size(tok, &out[*n]) != 0)
            return -1;
        if (out[*n] % sizeof(float) != 0)
            return -1;
        (*n)++;
    }
    return *n ? 0 : -1;
}

static int parse_int_list(const char *s, int *out, int *n, int lo, int hi)
{
    char buf[512];
    snprintf(buf, sizeof(buf), "%s", s);
    *n = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        char *end;
        long v = strtol(tok, &end, 10);
        if (*n == MAX_LIST || *end || v < lo || v > hi)
            return -1;
        out[(*n)++] = (int)v;
    }
    return *n ? 0 : -1;
}

static const char *size_label(size_t b, char *buf, size_t cap)
{
    if (b >= (1u << 20) && b % (1u << 20) == 0)
        snprintf(buf, cap, "%zu MiB", b >> 20);
    else if (b >= 1024 && b % 1024 == 0)
        snprintf(buf, cap, "%zu KiB", b >> 10);
    else
        snprintf(buf, cap, "%zu B", b);
    return buf;
}

/* ---- allocator ---------------------------------------------------------------------------- */

/* Describes the allocator in effect, as read back from it, and checks that nng's messages (and
 * so every tensor on the wire) are allocated by it. */
static void malloc_describe(char *buf, size_t cap)
{
#ifdef PSD_WITH_JEMALLOC
    const char *version = "?", *thp = "?";
    size_t oversize = 0, tcache_max = 0;
    ssize_t dirty = 0, muzzy = 0;
    unsigned narenas = 0;
/* Reads a jemalloc setting or counter into var (left as it was if the name is unknown). */
#define MALLCTL_GET(name, var)                                                                     \
    do {                                                                                           \
        size_t mallctl_sz_ = sizeof(var);                                                          \
        mallctl((name), &(var), &mallctl_sz_, NULL, 0);                                            \
    } while (0)
    MALLCTL_GET("version", version);
    MALLCTL_GET("opt.oversize_threshold", oversize);
    MALLCTL_GET("opt.dirty_decay_ms", dirty);
    MALLCTL_GET("opt.muzzy_decay_ms", muzzy);
    MALLCTL_GET("opt.thp", thp);
    MALLCTL_GET("opt.narenas", narenas);
    MALLCTL_GET("opt.tcache_max", tcache_max);
    /* thread.allocated counts what this thread allocated through jemalloc. */
    uint64_t before = 0, after = 0;
    MALLCTL_GET("thread.allocated", before);
    nng_msg *m = NULL;
    size_t probe = (size_t)4 << 20;
    if (nng_msg_alloc(&m, probe) == 0) {
        MALLCTL_GET("thread.allocated", after);
        nng_msg_free(m);
    }
    size_t arena0 = 0;
    MALLCTL_GET("arena.0.oversize_threshold", arena0);
    char ver[16];
    snprintf(ver, sizeof(ver), "%.5s", version);
    snprintf(buf, cap,
             "jemalloc %s: oversize_threshold=%zu (arena 0: %zu) dirty_decay_ms=%zd "
             "muzzy_decay_ms=%zd thp=%s narenas=%u tcache_max=%zu; nng messages from jemalloc: %s",
             ver, oversize, arena0, dirty, muzzy, thp, narenas, tcache_max,
             after - before >= probe ? "yes" : "NO");
#else
    snprintf(buf, cap, "glibc malloc (built without jemalloc)");
#endif
}

/* ---- ipc:// sockets ----------------------------------------------------------------------- */

/* The private directory of the ipc:// sockets of the servers and of the raw baseline, made at
 * the first need ("" until then), and the socket paths in it in use. ipc_cleanup() unlinks them
 * and removes the directory on every way out: the end of main, exit() (atexit) and the fatal
 * signals (a handler in front of the one of children_install_guard). */
#define MAX_IPC_PATHS 64
static char ipc_dir[PATH_MAX];
static char ipc_paths[MAX_IPC_PATHS][sizeof(((struct sockaddr_un *)0)->sun_path)];
static volatile sig_atomic_t ipc_used[MAX_IPC_PATHS];
static int ipc_seq;
static const int ipc_signals[] = {SIGINT, SIGTERM, SIGHUP, SIGALRM};
static struct sigaction ipc_old_actions[sizeof(ipc_signals) / sizeof(ipc_signals[0])];

/* Async-signal-safe. */
static void ipc_cleanup(void)
{
    if (ipc_dir[0] == '\0')
        return;
    for (int i = 0; i < MAX_IPC_PATHS; i++) {
        if (ipc_used[i]) {
            unlink(ipc_paths[i]);
            ipc_used[i] = 0;
        }
    }
    rmdir(ipc_dir);
    ipc_dir[0] = '\0';
}

static void ipc_on_signal(int sig)
{
    ipc_cleanup();
    for (size_t i = 0; i < sizeof(ipc_signals) / sizeof(ipc_signals[0]); i++) {
        if (ipc_signals[i] != sig)
            continue;
        void (*h)(int) = ipc_old_actions[i].sa_handler;
        if (h != SIG_DFL && h != SIG_IGN && !(ipc_old_actions[i].sa_flags & SA_SIGINFO))
            h(sig);
    }
    signal(sig, SIG_DFL);
    raise(sig);
}

/* Makes ipc_dir under $TMPDIR (or /tmp when that is unset, too long for socket paths or not
 * plain enough for a JSON string). Returns 0, or -1 with a message. */
static int ipc_dir_make(void)
{
    if (ipc_dir[0] != '\0')
        return 0;
    const char *tmp = getenv("TMPDIR");
    /* "DIR/ps-bench.XXXXXX/raw-NNNN.sock" must fit sun_path (107 bytes + NUL). */
    if (tmp == NULL || tmp[0] != '/' || strlen(tmp) > 107 - 32 || strpbrk(tmp, "\"\\") != NULL)
        tmp = "/tmp";
    snprintf(ipc_dir, sizeof(ipc_dir), "%s/ps-bench.XXXXXX", tmp);
    if (mkdtemp(ipc_dir) == NULL) {
        fprintf(stderr, "ps-bench: cannot create a directory for the ipc sockets (%s): %s\n",
                ipc_dir, strerror(errno));
        ipc_dir[0] = '\0';
        return -1;
    }
    atexit(ipc_cleanup);
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = ipc_on_signal;
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < sizeof(ipc_signals) / sizeof(ipc_signals[0]); i++)
        sigaction(ipc_signals[i], &sa, &ipc_old_actions[i]);
    return 0;
}

/* A fresh socket path "ipc_dir/PREFIX-N.sock", its URL (ipc://PATH) in url. Returns its slot
 * (for ipc_path_release), or -1 with a message. */
static int ipc_path_new(const char *prefix, char *url, size_t cap)
{
    int slot = 0;
    while (slot < MAX_IPC_PATHS && ipc_used[slot])
        slot++;
    if (ipc_dir_make() != 0)
        return -1;
    int n = slot < MAX_IPC_PATHS ? snprintf(ipc_paths[slot], sizeof(ipc_paths[slot]),
                                            "%s/%s-%d.sock", ipc_dir, prefix, ipc_seq++)
                                 : -1;
    if (n < 0 || (size_t)n >= sizeof(ipc_paths[slot]) ||
        (size_t)snprintf(url, cap, "ipc://%s", ipc_paths[slot]) >= cap) {
        fprintf(stderr, "ps-bench: no room for another ipc socket path\n");
        return -1;
    }
    ipc_used[slot] = 1;
    return slot;
}

static void ipc_path_release(int slot)
{
    if (slot < 0 || !ipc_used[slot])
        return;
    unlink(ipc_paths[slot]);
    ipc_used[slot] = 0;
}

/* Waits until a socket listens at path, or the child exits (left to be reaped by child_stop),
 * or timeout_ms passes. Returns 0 when it listens. */
static int wait_ipc(const char *path, pid_t child, int timeout_ms)
{
    for (int waited = 0; waited <= timeout_ms; waited += 10) {
        if (ipc_socket_bound(path, true) == 1)
            return 0;
        siginfo_t si;
        memset(&si, 0, sizeof(si));
        if (waitid(P_PID, (id_t)child, &si, WEXITED | WNOHANG | WNOWAIT) == 0 &&
            si.si_pid == child) {
            fprintf(stderr, "ps-bench: child %d exited before listening on %s\n", (int)child, path);
            return -1;
        }
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
    fprintf(stderr, "ps-bench: nothing listens on %s after %d ms\n", path, timeout_ms);
    return -1;
}

/* ---- clusters of ps-server children ------------------------------------------------------- */

typedef struct cluster {
    int n;
    int transport;
    pid_t pids[MAX_SERVERS];
    int ports[MAX_SERVERS];       /* tcp */
    int ipc_slots[MAX_SERVERS];   /* ipc (-1: none) */
    char json[144 * MAX_SERVERS]; /* {"cluster":{"ps":[...]}} for the client */
} cluster;

static void cluster_stop(cluster *cl)
{
    for (int i = 0; i < cl->n; i++) {
        if (cl->pids[i] > 0)
            child_stop(cl->pids[i], 3000);
        cl->pids[i] = 0;
        ipc_path_release(cl->ipc_slots[i]);
        cl->ipc_slots[i] = -1;
    }
}

static int cluster_start(const bench_opts *o, int n, int transport, cluster *cl)
{
    memset(cl, 0, sizeof(*cl));
    cl->n = n;
    cl->transport = transport;
    for (int i = 0; i < n; i++)
        cl->ipc_slots[i] = -1;
    char ps[136 * MAX_SERVERS] = "";
    for (int i = 0; i < n; i++) {
        char addr[128];
        if (transport == TR_IPC) {
            if ((cl->ipc_slots[i] = ipc_path_new("ps", addr, sizeof(addr))) < 0) {
                cluster_stop(cl);
                return -1;
            }
        } else {
            if ((cl->ports[i] = free_port()) < 0) {
                fprintf(stderr, "ps-bench: no free port\n");
                return -1;
            }
            snprintf(addr, sizeof(addr), "127.0.0.1:%d", cl->ports[i]);
        }
        size_t len = strlen(ps);
        snprintf(ps + len, sizeof(ps) - len, "%s\"%s\"", i ? "," : "", addr);
    }
    snprintf(cl->json, sizeof(cl->json), "{\"cluster\":{\"ps\":[%s]}}", ps);
    for (int i = 0; i < n; i++) {
        char tf[sizeof(ps) + 128];
        snprintf(tf, sizeof(tf),
                 "TF_CONFIG={\"cluster\":{\"ps\":[%s]},\"task\":{\"type\":\"ps\",\"index\":%d}}",
                 ps, i);
        char *env[] = {tf, NULL};
        char *argv[8 + 2 * MAX_OPTS];
        char optbuf[MAX_OPTS][160];
        int k = 0;
        argv[k++] = (char *)o->server_bin;
        argv[k++] = "--log-level=warn";
        argv[k++] = "--max-message-bytes=256M";
        for (int j = 0; j < o->nserver_opts; j++) {
            snprintf(optbuf[j], sizeof(optbuf[j]), "--%s", o->server_opts[j]);
            argv[k++] = optbuf[j];
        }
        argv[k] = NULL;
        cl->pids[i] = child_start(argv, env, NULL);
        if (cl->pids[i] < 0) {
            cl->pids[i] = 0;
            cluster_stop(cl);
            return -1;
        }
    }
    for (int i = 0; i < n; i++) {
        if (transport == TR_IPC) {
            if (wait_ipc(ipc_paths[cl->ipc_slots[i]], cl->pids[i], 10000) != 0) {
                cluster_stop(cl);
                return -1;
            }
        } else if (wait_port(cl->ports[i], cl->pids[i], 10000) != 0) {
            cl->pids[i] = 0;
            cluster_stop(cl);
            return -1;
        }
    }
    return 0;
}

/* Applies the bench's client settings (and `extra`, name/value pairs) to cfg, or, with cfg
 * NULL, to an options object to print what is in effect. */
static int apply_client_opts(const bench_opts *o, const cluster *cl, ps_config *cfg, options *opts,
                             const char *const *extra, int nextra)
{
    const char *pairs[2 * (MAX_OPTS + 8)];
    char namebuf[MAX_OPTS][64];
    int n = 0;
    if (cl) {
        pairs[n++] = "cluster";
        pairs[n++] = cl->json;
    }
    pairs[n++] = "max-message-bytes";
    pairs[n++] = "256M";
    pairs[n++] = "deadline-ms";
    pairs[n++] = "60000";
    pairs[n++] = "split-threshold-bytes";
    pairs[n++] = o->split_threshold;
    for (int i = 0; i < o->nclient_opts; i++) {
        const char *eq = strchr(o->client_opts[i], '=');
        snprintf(namebuf[i], sizeof(namebuf[i]), "%.*s", (int)(eq - o->client_opts[i]),
                 o->client_opts[i]);
        pairs[n++] = namebuf[i];
        pairs[n++] = eq + 1;
    }
    for (int i = 0; i < nextra; i++) {
        pairs[n++] = extra[2 * i];
        pairs[n++] = extra[2 * i + 1];
    }
    for (int i = 0; i < n; i += 2) {
        char err[400];
        if (cfg && ps_config_set(cfg, pairs[i], pairs[i + 1]) != PS_OK) {
            fprintf(stderr, "ps-bench: client setting %s: %s\n", pairs[i], ps_last_error());
            return -1;
        }
        if (opts && options_set(opts, pairs[i], pairs[i + 1], err, sizeof(err)) != 0) {
            fprintf(stderr, "ps-bench: client setting %s: %s\n", pairs[i], err);
            return -1;
        }
    }
    return 0;
}

static ps_client *client_open(const bench_opts *o, const cluster *cl, const char *const *extra,
                              int nextra)
{
    ps_config *cfg;
    if (ps_config_create(&cfg) != PS_OK)
        return NULL;
    ps_client *c = NULL;
    if (apply_client_opts(o, cl, cfg, NULL, extra, nextra) == 0) {
        int rc = ps_client_open(&c, cfg);
        if (rc != PS_OK) {
            fprintf(stderr, "ps-bench: open client: %s: %s\n", ps_strerror(rc), ps_last_error());
            c = NULL;
        }
    }
    ps_config_destroy(cfg);
    return c;
}

/* ---- the measurements --------------------------------------------------------------------- */

/* push-mc at one count of clients. */
typedef struct mc_result {
    int clients;
    cell_result agg; /* gbps and ops of all the clients; p50: the median of the clients' p50s;
                        p99: the worst client's; CPU per push */
    double pushes_s; /* of all the clients */
    double p50_min_us, p50_max_us;
    double server_busy; /* CPU seconds of the servers per second of the trial */
} mc_result;

typedef struct row {
    size_t bytes;
    cell_result raw;
    cell_result ps[OPK_COUNT];
    mc_result mc[MAX_CLIENT_COUNTS];
    int nshards;
} row;

/* The raw baseline's server, started once per run and transport (a child of the bench
 * binary). */
typedef struct raw_server {
    pid_t pid;
    int ipc_slot;
    char url[160];
} raw_server;

static void raw_server_stop(raw_server *rs)
{
    if (rs->pid > 0)
        child_stop(rs->pid, 2000);
    rs->pid = 0;
    ipc_path_release(rs->ipc_slot);
    rs->ipc_slot = -1;
}

static int raw_server_start(const bench_opts *o, int transport, raw_server *rs)
{
    memset(rs, 0, sizeof(*rs));
    rs->ipc_slot = -1;
    int port = -1;
    if (transport == TR_IPC) {
        if ((rs->ipc_slot = ipc_path_new("raw", rs->url, sizeof(rs->url))) < 0)
            return -1;
    } else {
        if ((port = free_port()) < 0)
            return -1;
        snprintf(rs->url, sizeof(rs->url), "tcp://127.0.0.1:%d", port);
    }
    char *argv[] = {(char *)o->self, "--raw-server", rs->url, NULL};
    rs->pid = child_start(argv, NULL, NULL);
    if (rs->pid < 0) {
        rs->pid = 0;
        raw_server_stop(rs);
        return -1;
    }
    if (transport == TR_IPC ? wait_ipc(ipc_paths[rs->ipc_slot], rs->pid, 10000) != 0
                            : wait_port(port, rs->pid, 10000) != 0) {
        if (transport == TR_TCP)
            rs->pid = 0; /* reaped by wait_port if it exited; else children_kill_all's */
        raw_server_stop(rs);
        return -1;
    }
    return 0;
}

/* "push" with one transport of tcp alone; "push/ipc" when ipc is in the run. */
static const char *cell_label(const bench_opts *o, const char *what, int transport, char *buf,
                              size_t cap)
{
    if (o->ntransports == 1 && transport == TR_TCP)
        snprintf(buf, cap, "%s", what);
    else
        snprintf(buf, cap, "%s/%s", what, transport_names[transport]);
    return buf;
}

static int measure_raw(const bench_opts *o, const raw_server *rs, int transport, size_t bytes,
                       cell_result *out)
{
    char label[32];
    faults_watch(&rs->pid, 1);
    *out = raw_cell(rs->url, bytes, o->seconds, o->warmup);
    cell_print(cell_label(o, "raw", transport, label, sizeof(label)), 1, bytes, out);
    faults_watch(NULL, 0);
    return out->errors ? -1 : 0;
}

/* ---- push-mc: several clients pushing at once ---------------------------------------------- */

/* What the clients of a push-mc cell share with the thread that times them. Every phase (the
 * warm-up, then each trial) starts and ends at the barrier; deadline_ns and stop are written
 * before the start, the clients' figures read after the end. */
typedef struct mc_shared {
    pthread_barrier_t barrier; /* the clients and the timing thread */
    uint64_t deadline_ns;
    uint64_t min_ops; /* per client */
    bool stop;
} mc_shared;

/* One client: a thread with its own ps_client (as separate worker processes have) and its own
 * variable "bench/<tag>/<bytes>". */
typedef struct mc_client {
    mc_shared *sh;
    const bench_opts *o;
    const cluster *cl;
    char tag[80];
    size_t bytes;
    pthread_t thread;
    ps_client *c;
    bench_var bv;
    bool open;
    int errors;
    uint64_t ops, end_ns;
    samples s;
} mc_client;

static void *mc_client_main(void *arg)
{
    mc_client *m = arg;
    m->c = client_open(m->o, m->cl, NULL, 0);
    if (m->c != NULL && bench_var_open(m->c, &m->bv, m->tag, m->bytes) == 0)
        m->open = true;
    else
        m->errors++;
    pthread_barrier_wait(&m->sh->barrier); /* ready */
    for (;;) {
        pthread_barrier_wait(&m->sh->barrier); /* a phase starts, or stop */
        if (m->sh->stop)
            break;
        m->ops = 0;
        m->s.n = 0;
        uint64_t now = bench_now_ns();
        while (m->errors == 0 && (m->ops < m->sh->min_ops || now < m->sh->deadline_ns)) {
            uint64_t a = now;
            int rc = ps_push(m->c, m->bv.var, m->bv.grad);
            if (rc != PS_OK) {
                fprintf(stderr, "ps-bench: push-mc %s: %s: %s\n", ps_var_name(m->bv.var),
                        ps_strerror(rc), ps_last_error());
                m->errors++;
                break;
            }
            m->bv.pushes++;
            now = bench_now_ns();
            samples_add(&m->s, (double)(now - a));
            m->ops++;
        }
        m->end_ns = now;
        pthread_barrier_wait(&m->sh->barrier); /* the phase ends */
    }
    /* Every push must have landed once: the variable is -pushes * BENCH_GRAD everywhere. */
    if (m->open && m->errors == 0 && bench_var_verify(m->c, &m->bv) != 0)
        m->errors++;
    if (m->open)
        bench_var_close(&m->bv);
    ps_client_close(m->c);
    samples_free(&m->s);
    return NULL;
}

static double self_cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
           (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

/* As the other cells do (cells.c): wait up to idle_wait_s for the machine to be 90% idle. */
static void mc_wait_idle(void)
{
    uint64_t start = bench_now_ns();
    while ((double)(bench_now_ns() - start) / 1e9 < idle_wait_s) {
        double b0, t0, b1, t1;
        machine_cpu(&b0, &t0);
        struct timespec ts = {0, 200 * 1000000L};
        nanosleep(&ts, NULL);
        machine_cpu(&b1, &t1);
        if (t1 <= t0 || (b1 - b0) / (t1 - t0) < 0.10)
            return;
    }
}

static int cmp_double_asc(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* One push-mc cell: nclients threads, each with its own client and variable of `bytes`,
 * pushing to the cluster at once: a warm-up, then cell_trials trials of o->seconds, the one
 * with the highest aggregate throughput reported (as every cell does). Aggregate GB/s: the
 * bytes of every client's pushes over the time from the common start to the last client's
 * last push. Returns 0, or -1 if a push failed or a variable came back wrong. */
static int mc_cell(const bench_opts *o, const cluster *cl, const char *tag, int nclients,
                   size_t bytes, mc_result *out)
{
    memset(out, 0, sizeof(*out));
    out->clients = nclients;
    mc_shared sh;
    memset(&sh, 0, sizeof(sh));
    mc_client *m = calloc((size_t)nclients, sizeof(*m));
    if (m == NULL || pthread_barrier_init(&sh.barrier, NULL, (unsigned)nclients + 1) != 0) {
        fprintf(stderr, "ps-bench: out of memory\n");
        free(m);
        out->agg.errors = 1;
        return -1;
    }
    for (int i = 0; i < nclients; i++) {
        m[i].sh = &sh;
        m[i].o = o;
        m[i].cl = cl;
        m[i].bytes = bytes;
        snprintf(m[i].tag, sizeof(m[i].tag), "%s-c%d-mc%d", tag, nclients, i);
        if (pthread_create(&m[i].thread, NULL, mc_client_main, &m[i]) != 0) {
            /* The barrier counts on every client: no way to go on without this one. */
            fprintf(stderr, "ps-bench: cannot start client thread %d\n", i);
            exit(1);
        }
    }
    pthread_barrier_wait(&sh.barrier); /* every client open */
    int errors = 0;
    for (int i = 0; i < nclients; i++)
        errors += m[i].errors;
    if (errors == 0)
        mc_wait_idle();
    double p50s[MAX_CLIENTS];
    for (int phase = 0; phase <= cell_trials && errors == 0; phase++) {
        double cpu0 = self_cpu_s(), srv0 = 0, busy0, total0;
        for (int i = 0; i < cl->n; i++)
            srv0 += proc_cpu_s(cl->pids[i]);
        machine_cpu(&busy0, &total0);
        uint64_t t0 = bench_now_ns();
        sh.min_ops = phase == 0 ? 2 : 3;
        sh.deadline_ns = t0 + (uint64_t)((phase == 0 ? o->warmup : o->seconds) * 1e9);
        pthread_barrier_wait(&sh.barrier); /* start */
        pthread_barrier_wait(&sh.barrier); /* end */
        uint64_t t1 = t0, ops = 0;
        for (int i = 0; i < nclients; i++) {
            errors += m[i].errors;
            ops += m[i].ops;
            if (m[i].end_ns > t1)
                t1 = m[i].end_ns;
        }
        if (phase == 0 || errors)
            continue;
        double cpu1 = self_cpu_s(), srv1 = 0, busy1, total1;
        for (int i = 0; i < cl->n; i++)
            srv1 += proc_cpu_s(cl->pids[i]);
        machine_cpu(&busy1, &total1);
        mc_result r;
        memset(&r, 0, sizeof(r));
        r.clients = nclients;
        r.agg.ran = true;
        r.agg.ops = ops;
        r.agg.seconds = (double)(t1 - t0) / 1e9;
        r.agg.gbps = (double)bytes * (double)ops / r.agg.seconds / 1e9;
        r.pushes_s = (double)ops / r.agg.seconds;
        for (int i = 0; i < nclients; i++) {
            p50s[i] = samples_pct_us(&m[i].s, 50);
            double p99 = samples_pct_us(&m[i].s, 99);
            if (p99 > r.agg.p99_us)
                r.agg.p99_us = p99;
        }
        qsort(p50s, (size_t)nclients, sizeof(double), cmp_double_asc);
        r.p50_min_us = p50s[0];
        r.p50_max_us = p50s[nclients - 1];
        r.agg.p50_us =
            nclients % 2 ? p50s[nclients / 2] : (p50s[nclients / 2 - 1] + p50s[nclients / 2]) / 2;
        r.agg.client_cpu_us = (cpu1 - cpu0) * 1e6 / (double)ops;
        r.agg.server_cpu_us = (srv1 - srv0) * 1e6 / (double)ops;
        r.server_busy = (srv1 - srv0) / r.agg.seconds;
        double total = total1 - total0, busy = busy1 - busy0, ours = cpu1 - cpu0 + srv1 - srv0;
        r.agg.other_cpu = total > 0 && busy > ours ? (busy - ours) / total : 0;
        if (!out->agg.ran || r.agg.gbps > out->agg.gbps)
            *out = r;
    }
    sh.stop = true;
    pthread_barrier_wait(&sh.barrier); /* stop: the clients verify and close */
    for (int i = 0; i < nclients; i++) {
        pthread_join(m[i].thread, NULL);
        errors += m[i].errors;
    }
    pthread_barrier_destroy(&sh.barrier);
    free(m);
    if (errors) {
        out->agg.ran = false;
        out->agg.errors = errors;
    }
    return errors ? -1 : 0;
}

static void mc_print(const char *label, int nservers, size_t bytes, const mc_result *r)
{
    if (r->agg.errors) {
        printf("cell %-9s servers=%d size=%-9zu clients=%-2d FAILED (%d errors)\n", label, nservers,
               bytes, r->clients, r->agg.errors);
    } else {
        printf("cell %-9s servers=%d size=%-9zu clients=%-2d ops=%-7llu %6.3f s %6.3f GB/s %9.0f "
               "pushes/s  per-client p50 %8.1f us (min %.1f, max %.1f)  p99 %8.1f us  per push: "
               "CPU %.0f + %.0f us  server CPU %.0f%%  others' CPU %.0f%%\n",
               label, nservers, bytes, r->clients, (unsigned long long)r->agg.ops, r->agg.seconds,
               r->agg.gbps, r->pushes_s, r->agg.p50_us, r->p50_min_us, r->p50_max_us, r->agg.p99_us,
               r->agg.client_cpu_us, r->agg.server_cpu_us, 100 * r->server_busy,
               100 * r->agg.other_cpu);
    }
    fflush(stdout);
}

/* ---- a pass over the sizes ----------------------------------------------------------------- */

/* One pass over the sizes with, for each transport tr[t], a cluster of nservers: for each size
 * and transport the raw baseline (when rs is not NULL: rs[t]), then the PS operations in kinds
 * and push-mc at every count of clients (when push_mc), one right after the other, so that the
 * figures compared were taken under the same conditions. Results go to rows[t][i]. */
static int run_pass(const bench_opts *o, int nservers, const int *tr, int ntr, const raw_server *rs,
                    const size_t *sizes, int nsizes, const bool *kinds, bool push_mc,
                    row *const *rows)
{
    cluster cl[TR_COUNT];
    ps_client *c[TR_COUNT] = {NULL};
    int started = 0, failed = 0;
    for (; started < ntr; started++) {
        if (cluster_start(o, nservers, tr[started], &cl[started]) != 0)
            break;
        if ((c[started] = client_open(o, &cl[started], NULL, 0)) == NULL) {
            cluster_stop(&cl[started]);
            break;
        }
    }
    if (started < ntr)
        failed++;
    char tag[32], label[32];
    snprintf(tag, sizeof(tag), "s%d", nservers);
    for (int i = 0; i < nsizes && !failed; i++) {
        for (int t = 0; t < ntr && !failed; t++) {
            bench_var bv;
            row *r = &rows[t][i];
            r->bytes = sizes[i];
            if (rs && measure_raw(o, &rs[t], tr[t], sizes[i], &r->raw) != 0) {
                failed++;
                break;
            }
            if (bench_var_open(c[t], &bv, tag, sizes[i]) != 0) {
                failed++;
                break;
            }
            r->nshards = ps_var_num_shards(bv.var);
            faults_watch(cl[t].pids, cl[t].n);
            for (int k = 0; k < OPK_COUNT; k++) {
                if (!kinds[k])
                    continue;
                r->ps[k] = ps_cell(c[t], &bv, (enum ps_op_kind)k, o->seconds, o->warmup, o->check);
                cell_print(cell_label(o, op_kind_names[k], tr[t], label, sizeof(label)), nservers,
                           sizes[i], &r->ps[k]);
                if (r->ps[k].errors) {
                    failed++;
                    break;
                }
            }
            faults_watch(NULL, 0);
            if (!failed && bench_var_verify(c[t], &bv) != 0)
                failed++;
            bench_var_close(&bv);
            for (int n = 0; push_mc && n < o->nclients && !failed; n++) {
                failed += mc_cell(o, &cl[t], tag, o->clients[n], sizes[i], &r->mc[n]) != 0;
                mc_print(cell_label(o, "push-mc", tr[t], label, sizeof(label)), nservers, sizes[i],
                         &r->mc[n]);
            }
        }
    }
    for (int t = 0; t < started; t++) {
        ps_client_close(c[t]);
        cluster_stop(&cl[t]);
    }
    return failed ? -1 : 0;
}

static double ratio(const cell_result *a, const cell_result *b)
{
    return a->ran && b->ran && b->gbps > 0 ? a->gbps / b->gbps : 0;
}

static void print_table(int nservers, const row *rows, int n)
{
    char sz[32];
    printf("\n| size | shards | raw GB/s | raw p50 µs | push GB/s | push p50 µs | push p99 µs | "
           "pull GB/s | pull p50 µs | pull p99 µs | push-pull GB/s | push-pull p50 µs | "
           "push-pull p99 µs | push/raw | pull/raw | others' CPU |\n");
    printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int i = 0; i < n; i++) {
        const row *r = &rows[i];
        if (r->bytes == 0)
            continue; /* not reached: the run failed before */
        printf("| %s | %d | %.2f | %.0f |", size_label(r->bytes, sz, sizeof(sz)), r->nshards,
               r->raw.gbps, r->raw.p50_us);
        for (int k = 0; k < OPK_COUNT; k++) {
            const cell_result *c = &r->ps[k];
            if (c->ran)
                printf(" %.2f | %.0f | %.0f |", c->gbps, c->p50_us, c->p99_us);
            else
                printf(" - | - | - |");
        }
        double other = r->raw.other_cpu;
        for (int k = 0; k < OPK_COUNT; k++)
            if (r->ps[k].other_cpu > other)
                other = r->ps[k].other_cpu;
        printf(" %.2f | %.2f | %.0f%% |\n", ratio(&r->ps[OPK_PUSH], &r->raw),
               ratio(&r->ps[OPK_PULL], &r->raw), 100 * other);
    }
    printf("\n(%d server%s; push-pull GB/s counts both directions; ratios are GB/s against the "
           "raw baseline measured just before, same transport; others' CPU: the most CPU other "
           "programs took from the machine during any cell of the row)\n",
           nservers, nservers == 1 ? "" : "s");
}

static const row *find_row(const row *rows, int n, size_t bytes)
{
    for (int i = 0; i < n; i++)
        if (rows[i].bytes == bytes)
            return &rows[i];
    return NULL;
}

static void print_targets(const row *rows, int n)
{
    const row *k4 = find_row(rows, n, 4096), *m1 = find_row(rows, n, 1u << 20),
              *m16 = find_row(rows, n, 16u << 20);
    printf("\nTargets (1 server):\n");
    const row *big[2] = {m1, m16};
    const double min_ratio[2] = {0.9, 2.0};
    for (int j = 0; j < 2; j++) {
        const row *r = big[j];
        if (r == NULL)
            continue;
        char sz[32];
        size_label(r->bytes, sz, sizeof(sz));
        for (int k = 0; k < 2; k++) {
            const cell_result *c = &r->ps[k == 0 ? OPK_PUSH : OPK_PULL];
            double q = ratio(c, &r->raw);
            printf("  %-4s %-6s %.2f GB/s (target >= 2.0): %-4s   %.2fx raw (target >= %.1fx): "
                   "%s\n",
                   k == 0 ? "push" : "pull", sz, c->gbps, c->gbps >= 2.0 ? "met" : "MISS", q,
                   min_ratio[j], q >= min_ratio[j] ? "met" : "MISS");
        }
    }
    if (k4 && k4->raw.p50_us > 0) {
        double q = k4->ps[OPK_PUSH].p50_us / k4->raw.p50_us;
        printf("  push 4 KiB p50 %.0f us = %.2fx the raw round trip of %.0f us (target <= 1.3x): "
               "%s\n",
               k4->ps[OPK_PUSH].p50_us, q, k4->raw.p50_us, q <= 1.3 ? "met" : "MISS");
    }
}

/* push-mc at every count of clients, by size. */
static void print_mc_table(const bench_opts *o, int nservers, const row *rows, int n)
{
    char sz[32];
    printf("\n| size | clients | shards | push-mc GB/s | pushes/s | pushes/s per client | "
           "per-client p50 µs | p50 min–max µs | worst p99 µs | GB/s vs 1 client | CPU µs/push "
           "client + server | server CPU | others' CPU |\n");
    printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int i = 0; i < n; i++) {
        const row *r = &rows[i];
        if (r->bytes == 0)
            continue;
        const mc_result *one = NULL;
        for (int j = 0; j < o->nclients; j++)
            if (r->mc[j].clients == 1 && r->mc[j].agg.ran)
                one = &r->mc[j];
        for (int j = 0; j < o->nclients; j++) {
            const mc_result *m = &r->mc[j];
            printf("| %s | %d | %d |", size_label(r->bytes, sz, sizeof(sz)), o->clients[j],
                   r->nshards);
            if (!m->agg.ran) {
                printf(" - | - | - | - | - | - | - | - | - | - |\n");
                continue;
            }
            char vs1[16] = "-";
            if (one && one->agg.gbps > 0)
                snprintf(vs1, sizeof(vs1), "%.2f", m->agg.gbps / one->agg.gbps);
            printf(" %.2f | %.0f | %.0f | %.0f | %.0f–%.0f | %.0f | %s | %.0f + %.0f | %.0f%% | "
                   "%.0f%% |\n",
                   m->agg.gbps, m->pushes_s, m->pushes_s / m->clients, m->agg.p50_us, m->p50_min_us,
                   m->p50_max_us, m->agg.p99_us, vs1, m->agg.client_cpu_us, m->agg.server_cpu_us,
                   100 * m->server_busy, 100 * m->agg.other_cpu);
        }
    }
    printf("\n(push-mc: N client threads in this process, each with its own ps_client and its own "
           "variable, pushing to the %d server%s at once; GB/s and pushes/s of all of them; "
           "per-client p50: the median of the clients' p50 latencies; server CPU: CPU seconds of "
           "the servers per second, 100%% = one core)\n",
           nservers, nservers == 1 ? "" : "s");
}

static double q_or_zero(double a, double b)
{
    return a > 0 && b > 0 ? a / b : 0;
}

static void print_pair(const char *sz, const char *op, const cell_result *a, const cell_result *b)
{
    if (!a->ran || !b->ran)
        return;
    printf("| %s | %s | %.2f | %.2f | %.2f | %.0f | %.0f | %.2f |\n", sz, op, a->gbps, b->gbps,
           q_or_zero(b->gbps, a->gbps), a->p50_us, b->p50_us, q_or_zero(b->p50_us, a->p50_us));
}

/* tcp (rows[TR_TCP]) and ipc (rows[TR_IPC]) side by side, every cell measured. */
static void print_transport_table(const bench_opts *o, int nservers, const row *tcp, const row *ipc,
                                  int n)
{
    char sz[32], op[48];
    printf("\n| size | op | tcp GB/s | ipc GB/s | ipc/tcp GB/s | tcp p50 µs | ipc p50 µs | "
           "ipc/tcp p50 |\n");
    printf("|---:|---|---:|---:|---:|---:|---:|---:|\n");
    for (int i = 0; i < n; i++) {
        if (tcp[i].bytes == 0 || ipc[i].bytes == 0)
            continue;
        size_label(tcp[i].bytes, sz, sizeof(sz));
        print_pair(sz, "raw", &tcp[i].raw, &ipc[i].raw);
        for (int k = 0; k < OPK_COUNT; k++)
            print_pair(sz, op_kind_names[k], &tcp[i].ps[k], &ipc[i].ps[k]);
        for (int j = 0; j < o->nclients; j++) {
            snprintf(op, sizeof(op), "push-mc, %d client%s", o->clients[j],
                     o->clients[j] == 1 ? "" : "s");
            print_pair(sz, op, &tcp[i].mc[j].agg, &ipc[i].mc[j].agg);
        }
    }
    printf("\n(%d server%s; ipc/tcp above 1 in GB/s, below 1 in p50: ipc is faster; push-mc p50: "
           "the median client's)\n",
           nservers, nservers == 1 ? "" : "s");
    /* The cells the wire targets name. */
    const row *k4t = find_row(tcp, n, 4096), *k4i = find_row(ipc, n, 4096);
    bool any = false;
    const size_t big[2] = {1u << 20, 16u << 20};
    for (int j = 0; j < 2; j++) {
        const row *t = find_row(tcp, n, big[j]), *p = find_row(ipc, n, big[j]);
        for (int k = 0; t && p && k < 2; k++) {
            const cell_result *a = &t->ps[k == 0 ? OPK_PUSH : OPK_PULL];
            const cell_result *b = &p->ps[k == 0 ? OPK_PUSH : OPK_PULL];
            if (!a->ran || !b->ran)
                continue;
            printf("%s  %-4s %-6s tcp %.2f GB/s, ipc %.2f GB/s: ipc/tcp %.2f\n",
                   any ? "" : "ipc against tcp:\n", k == 0 ? "push" : "pull",
                   size_label(big[j], sz, sizeof(sz)), a->gbps, b->gbps,
                   q_or_zero(b->gbps, a->gbps));
            any = true;
        }
    }
    if (k4t && k4i && k4t->ps[OPK_PUSH].ran && k4i->ps[OPK_PUSH].ran)
        printf("%s  push 4 KiB p50 tcp %.0f us, ipc %.0f us: ipc/tcp %.2f\n",
               any ? "" : "ipc against tcp:\n", k4t->ps[OPK_PUSH].p50_us, k4i->ps[OPK_PUSH].p50_us,
               q_or_zero(k4i->ps[OPK_PUSH].p50_us, k4t->ps[OPK_PUSH].p50_us));
}

/* ---- allocator variants ------------------------------------------------------------------- */

typedef struct variant_result {
    char desc[512];
    size_t nraw;
    size_t raw_bytes[MAX_LIST];
    cell_result raw[MAX_LIST];
    cell_result push, pull;
    bool ok;
} variant_result;

static void emit(const char *tag, size_t bytes, const cell_result *c)
{
    printf("@@%s %zu %.6f %.3f %.3f %d %.2f %.2f\n", tag, bytes, c->gbps, c->p50_us, c->p99_us,
           c->ran ? c->errors : 1, c->client_faults, c->server_faults);
}

/* In the child: the raw baseline at every size and push and pull at compare_size with one
 * server, reported as "@@" lines for the parent. */
static int variant_child_main(const bench_opts *o)
{
    char desc[512];
    malloc_describe(desc, sizeof(desc));
    printf("@@malloc %s\n", desc);
    row rows[MAX_LIST];
    memset(rows, 0, sizeof(rows));
    raw_server rs;
    int tr = o->transports[0];
    int rc = raw_server_start(o, tr, &rs);
    for (int i = 0; i < o->nsizes && rc == 0; i++) {
        rows[i].bytes = o->sizes[i];
        rc = measure_raw(o, &rs, tr, o->sizes[i], &rows[i].raw);
    }
    raw_server_stop(&rs);
    for (int i = 0; i < o->nsizes; i++)
        emit("raw", o->sizes[i], &rows[i].raw);
    row ps;
    memset(&ps, 0, sizeof(ps));
    const bool kinds[OPK_COUNT] = {true, true, false};
    row *psrows[1] = {&ps};
    if (run_pass(o, 1, &tr, 1, NULL, &o->compare_size, 1, kinds, false, psrows) != 0)
        rc = -1;
    emit("push", o->compare_size, &ps.ps[OPK_PUSH]);
    emit("pull", o->compare_size, &ps.ps[OPK_PULL]);
    fflush(stdout);
    return rc == 0 ? 0 : 1;
}

static void parse_result(const char *s, cell_result *c, size_t *bytes)
{
    memset(c, 0, sizeof(*c));
    if (sscanf(s, "%zu %lf %lf %lf %d %lf %lf", bytes, &c->gbps, &c->p50_us, &c->p99_us, &c->errors,
               &c->client_faults, &c->server_faults) == 7 &&
        c->errors == 0)
        c->ran = true;
}

static int run_variant(const bench_opts *o, const variant *v, variant_result *vr)
{
    memset(vr, 0, sizeof(*vr));
    printf("\nallocator variant \"%s\" (MALLOC_CONF=%s), a fresh bench process and servers:\n",
           v->label, v->conf);
    fflush(stdout);
    char a_seconds[32], a_warmup[32], a_sizes[512] = "", a_cmp[32];
    snprintf(a_seconds, sizeof(a_seconds), "--seconds=%g", o->seconds);
    snprintf(a_warmup, sizeof(a_warmup), "--warmup=%g", o->warmup);
    snprintf(a_cmp, sizeof(a_cmp), "--compare-size=%zu", o->compare_size);
    snprintf(a_sizes, sizeof(a_sizes), "--sizes=");
    for (int i = 0; i < o->nsizes; i++) {
        size_t len = strlen(a_sizes);
        snprintf(a_sizes + len, sizeof(a_sizes) - len, "%s%zu", i ? "," : "", o->sizes[i]);
    }
    char a_server[PATH_MAX + 16], a_split[64];
    snprintf(a_server, sizeof(a_server), "--server-bin=%s", v->server_bin);
    snprintf(a_split, sizeof(a_split), "--split-threshold=%s", o->split_threshold);
    char *argv[16 + 4 * MAX_OPTS];
    int k = 0;
    argv[k++] = (char *)v->bench_bin;
    argv[k++] = "--variant-child";
    argv[k++] = a_server;
    argv[k++] = a_seconds;
    argv[k++] = a_warmup;
    argv[k++] = a_sizes;
    argv[k++] = a_cmp;
    argv[k++] = a_split;
    char a_wait[48];
    snprintf(a_wait, sizeof(a_wait), "--wait-idle=%g", idle_wait_s);
    argv[k++] = a_wait;
    char a_trials[32];
    snprintf(a_trials, sizeof(a_trials), "--trials=%d", cell_trials);
    argv[k++] = a_trials;
    /* The first transport of the run (tcp with both); push-mc is not part of this comparison. */
    char a_transport[32];
    snprintf(a_transport, sizeof(a_transport), "--transport=%s", transport_names[o->transports[0]]);
    argv[k++] = a_transport;
    argv[k++] = "--ops=push,pull";
    for (int i = 0; i < o->nclient_opts; i++) {
        argv[k++] = "--client-opt";
        argv[k++] = (char *)o->client_opts[i];
    }
    for (int i = 0; i < o->nserver_opts; i++) {
        argv[k++] = "--server-opt";
        argv[k++] = (char *)o->server_opts[i];
    }
    argv[k] = NULL;
    char envbuf[300];
    snprintf(envbuf, sizeof(envbuf), "MALLOC_CONF=%s", v->conf);
    char *env[] = {envbuf, NULL};
    int fd;
    pid_t pid = child_start(argv, env, &fd);
    if (pid < 0)
        return -1;
    FILE *f = fdopen(fd, "r");
    char line[1024];
    while (f && fgets(line, sizeof(line), f)) {
        size_t bytes;
        if (strncmp(line, "@@malloc ", 9) == 0) {
            snprintf(vr->desc, sizeof(vr->desc), "%.500s", line + 9);
            vr->desc[strcspn(vr->desc, "\n")] = '\0';
            printf("  %s\n", vr->desc);
        } else if (strncmp(line, "@@raw ", 6) == 0 && vr->nraw < MAX_LIST) {
            parse_result(line + 6, &vr->raw[vr->nraw], &bytes);
            vr->raw_bytes[vr->nraw++] = bytes;
        } else if (strncmp(line, "@@push ", 7) == 0) {
            parse_result(line + 7, &vr->push, &bytes);
        } else if (strncmp(line, "@@pull ", 7) == 0) {
            parse_result(line + 7, &vr->pull, &bytes);
        } else {
            printf("  %s", line);
        }
        fflush(stdout);
    }
    if (f)
        fclose(f);
    int rc = child_wait(pid, (int)(60 * 1000 + o->seconds * 1000 * 4 * (o->nsizes + 4)));
    vr->ok = rc == 0;
    return vr->ok ? 0 : -1;
}

static void print_variants(const bench_opts *o, const variant_result *vr, int nv)
{
    char sz[32], num[32];
    printf("\n| allocator (bench client and servers) |");
    for (int i = 0; i < o->nsizes; i++)
        printf(" raw %s GB/s |", size_label(o->sizes[i], sz, sizeof(sz)));
    size_label(o->compare_size, sz, sizeof(sz));
    printf(" push %s GB/s | pull %s GB/s | faults/op raw %s | faults/op push | faults/op pull "
           "|\n",
           sz, sz, sz);
    printf("|---|");
    for (int i = 0; i < o->nsizes + 5; i++)
        printf("---:|");
    printf("\n");
    for (int v = 0; v < nv; v++) {
        printf("| %s |", o->variants[v].label);
        const cell_result *cmp = NULL;
        for (int i = 0; i < o->nsizes; i++) {
            const cell_result *c = NULL;
            for (size_t j = 0; j < vr[v].nraw; j++)
                if (vr[v].raw_bytes[j] == o->sizes[i])
                    c = &vr[v].raw[j];
            if (c && c->ran)
                snprintf(num, sizeof(num), "%.2f", c->gbps);
            else
                snprintf(num, sizeof(num), "failed");
            if (o->sizes[i] == o->compare_size)
                cmp = c;
            printf(" %s |", num);
        }
        const cell_result *cells[3] = {&vr[v].push, &vr[v].pull, cmp};
        for (int k = 0; k < 2; k++) {
            if (cells[k]->ran)
                printf(" %.2f |", cells[k]->gbps);
            else
                printf(" failed |");
        }
        const cell_result *fl[3] = {cmp, &vr[v].push, &vr[v].pull};
        for (int k = 0; k < 3; k++) {
            if (fl[k] && fl[k]->ran)
                printf(" %.0f / %.0f |", fl[k]->client_faults, fl[k]->server_faults);
            else
                printf(" - |");
        }
        printf("\n");
    }
    printf("\n(faults/op: minor page faults per operation, client / server processes; 1 server)\n");
    for (int v = 0; v < nv; v++)
        printf("- %s: MALLOC_CONF=\"%s\" -> %s\n", o->variants[v].label, o->variants[v].conf,
               vr[v].desc);
}

/* ---- sweep of client settings ------------------------------------------------------------- */

static int run_sweep(const bench_opts *o)
{
    cluster cl;
    if (cluster_start(o, 1, o->transports[0], &cl) != 0)
        return -1;
    int failed = 0;
    ps_client *c0 = client_open(o, &cl, NULL, 0);
    bench_var vars[MAX_LIST];
    int nvars = 0;
    for (int i = 0; c0 && i < o->nsweep_sizes; i++) {
        if (bench_var_open(c0, &vars[i], "sweep", o->sweep_sizes[i]) != 0)
            failed++;
        else
            nvars++;
    }
    if (c0 == NULL || failed) {
        ps_client_close(c0);
        cluster_stop(&cl);
        return -1;
    }
    faults_watch(cl.pids, cl.n);
    /* results[chunk][conn][size][push|pull|push-pull] */
    static cell_result res[MAX_LIST][MAX_LIST][MAX_LIST][OPK_COUNT];
    for (int ch = 0; ch < o->nsweep_chunks && !failed; ch++) {
        for (int cn = 0; cn < o->nsweep_conns && !failed; cn++) {
            char chunk[32], conns[16];
            snprintf(chunk, sizeof(chunk), "%zu", o->sweep_chunks[ch]);
            snprintf(conns, sizeof(conns), "%d", o->sweep_conns[cn]);
            const char *extra[] = {"chunk-bytes", chunk, "connections", conns};
            ps_client *c = client_open(o, &cl, extra, 2);
            if (c == NULL) {
                failed++;
                break;
            }
            printf("-- chunk-bytes=%zu connections=%d\n", o->sweep_chunks[ch], o->sweep_conns[cn]);
            for (int i = 0; i < nvars && !failed; i++) {
                if (bench_var_rebind(c, &vars[i], "sweep") != 0) {
                    failed++;
                    break;
                }
                for (int k = 0; k < OPK_COUNT; k++) {
                    if (!o->kinds[k])
                        continue;
                    cell_result *r = &res[ch][cn][i][k];
                    *r = ps_cell(c, &vars[i], (enum ps_op_kind)k, o->seconds, o->warmup, o->check);
                    cell_print(op_kind_names[k], 1, vars[i].bytes, r);
                    failed += r->errors != 0;
                }
            }
            ps_client_close(c);
        }
    }
    for (int i = 0; i < nvars && !failed; i++)
        if (bench_var_rebind(c0, &vars[i], "sweep") != 0 || bench_var_verify(c0, &vars[i]) != 0)
            failed++;
    char sz[32];
    printf("\n| chunk-bytes | connections |");
    int ncols = 0;
    for (int i = 0; i < nvars; i++) {
        size_label(vars[i].bytes, sz, sizeof(sz));
        for (int k = 0; k < OPK_COUNT; k++) {
            if (o->kinds[k]) {
                printf(" %s %s GB/s |", op_kind_names[k], sz);
                ncols++;
            }
        }
    }
    printf(" others' CPU |\n|---:|---:|");
    for (int i = 0; i <= ncols; i++)
        printf("---:|");
    printf("\n");
    for (int ch = 0; ch < o->nsweep_chunks; ch++) {
        for (int cn = 0; cn < o->nsweep_conns; cn++) {
            printf("| %s | %d |", size_label(o->sweep_chunks[ch], sz, sizeof(sz)),
                   o->sweep_conns[cn]);
            double other = 0;
            for (int i = 0; i < nvars; i++) {
                for (int k = 0; k < OPK_COUNT; k++) {
                    if (!o->kinds[k])
                        continue;
                    printf(" %.2f |", res[ch][cn][i][k].gbps);
                    if (res[ch][cn][i][k].other_cpu > other)
                        other = res[ch][cn][i][k].other_cpu;
                }
            }
            printf(" %.0f%% |\n", 100 * other);
        }
    }
    for (int i = 0; i < nvars; i++)
        bench_var_close(&vars[i]);
    ps_client_close(c0);
    cluster_stop(&cl);
    return failed ? -1 : 0;
}

/* ---- main --------------------------------------------------------------------------------- */

static void cpu_model(char *buf, size_t cap)
{
    snprintf(buf, cap, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    while (f && fgets(line, sizeof(line), f)) {
        if (strncmp(line, "model name", 10) == 0) {
            const char *p = strchr(line, ':');
            if (p) {
                snprintf(buf, cap, "%s", p + 2);
                buf[strcspn(buf, "\n")] = '\0';
            }
            break;
        }
    }
    if (f)
        fclose(f);
}

/* CPU time of the whole machine and of this process tree, to tell how much of the run other
 * programs took: the bench shares the machine's cores with whatever else runs. */
typedef struct cpu_mark {
    double busy_s, total_s, ours_s;
} cpu_mark;

static void cpu_mark_take(cpu_mark *m)
{
    memset(m, 0, sizeof(*m));
    machine_cpu(&m->busy_s, &m->total_s);
    struct rusage self, kids;
    getrusage(RUSAGE_SELF, &self);
    getrusage(RUSAGE_CHILDREN, &kids);
    m->ours_s = (double)(self.ru_utime.tv_sec + self.ru_stime.tv_sec + kids.ru_utime.tv_sec +
                         kids.ru_stime.tv_sec) +
                (double)(self.ru_utime.tv_usec + self.ru_stime.tv_usec + kids.ru_utime.tv_usec +
                         kids.ru_stime.tv_usec) /
                    1e6;
}

static void cpu_mark_report(const cpu_mark *a, const cpu_mark *b)
{
    double total = b->total_s - a->total_s, busy = b->busy_s - a->busy_s;
    double ours = b->ours_s - a->ours_s;
    if (total <= 0)
        return;
    double other = busy > ours ? busy - ours : 0;
    printf("\nCPU during the run: machine %.0f%% busy; this benchmark (all its processes) %.0f%%, "
           "other programs %.0f%%%s\n",
           100 * busy / total, 100 * ours / total, 100 * other / total,
           other / total > 0.05 ? " (figures disturbed: other programs shared the cores)" : "");
}

static void print_header(const bench_opts *o, const char *malloc_desc)
{
    char cpu[256], date[64];
    cpu_model(cpu, sizeof(cpu));
    struct utsname u;
    uname(&u);
    time_t now = time(NULL);
    strftime(date, sizeof(date), "%Y-%m-%d %H:%M:%S", localtime(&now));
    printf("ps-bench %s (libpsclient %s), %s\n", PSD_VERSION, ps_version(), date);
    double load[3] = {0, 0, 0};
    getloadavg(load, 3);
    const char *how = o->ntransports == 2          ? "loopback TCP and Unix sockets (ipc://)"
                      : o->transports[0] == TR_IPC ? "Unix sockets (ipc://)"
                                                   : "loopback TCP";
    printf("machine: %ld online CPUs (nproc), %s, Linux %s, %s; load average %.2f\n",
           sysconf(_SC_NPROCESSORS_ONLN), cpu, u.release, how, load[0]);
    printf("allocator: %s\n", malloc_desc);
    options *opts;
    if (options_create(&opts, OPT_SCOPE_CLIENT) == 0) {
        if (apply_client_opts(o, NULL, NULL, opts, NULL, 0) == 0)
            printf("client: connections=%s chunk-bytes=%s split-threshold-bytes=%s\n",
                   opt_text(opts, OPT_CONNECTIONS), opt_text(opts, OPT_CHUNK_BYTES),
                   opt_text(opts, OPT_SPLIT_THRESHOLD_BYTES));
        options_destroy(opts);
    }
    if (window_ops)
        printf("experiment: tensors over %zu bytes moved as range operations of that size, %zu in "
               "flight (--window)\n",
               window_bytes, window_ops);
    printf("server: %s", o->server_bin);
    for (int i = 0; i < o->nserver_opts; i++)
        printf(" --%s", o->server_opts[i]);
    printf(" (other settings at their defaults)\n");
    printf("cells: best of %d trials of %.2f s after %.2f s of warm-up, each cell after waiting "
           "up to %g s for the machine to be idle; 1 GB = 1e9 bytes\n\n",
           cell_trials, o->seconds, o->warmup, idle_wait_s);
    fflush(stdout);
}

static int add_variant(bench_opts *o, const char *label, const char *conf, const char *bench_bin,
                       const char *server_bin)
{
    if (o->nvariants == MAX_LIST)
        return -1;
    variant *v = &o->variants[o->nvariants++];
    snprintf(v->label, sizeof(v->label), "%s", label);
    snprintf(v->conf, sizeof(v->conf), "%s", conf);
    snprintf(v->bench_bin, sizeof(v->bench_bin), "%s", bench_bin);
    snprintf(v->server_bin, sizeof(v->server_bin), "%s", server_bin);
    return 0;
}

/* Adds every item of a NAME=VALUE list to names[], checking the form; returns 0 or -1. */
static int add_assignments(const options *opts, opt_list_id id, const char **names, int *n)
{
    const char *const *items;
    size_t count = opt_list(opts, id, &items);
    for (size_t i = 0; i < count; i++) {
        const char *eq = strchr(items[i], '=');
        if (eq == NULL || eq == items[i] || *n == MAX_OPTS) {
            fprintf(stderr, "ps-bench: bad value \"%s\" for --%s (NAME=VALUE)\n", items[i],
                    opt_def(id)->name);
            return -1;
        }
        names[(*n)++] = items[i];
    }
    return 0;
}

/* Reads a list setting with parse(); on error names the flag. */
#define PARSE_LIST_OPT(id, call)                                                                   \
    do {                                                                                           \
        if ((call) != 0) {                                                                         \
            fprintf(stderr, "ps-bench: bad value \"%s\" for --%s\n", opt_text(o->opts, id),        \
                    opt_def(id)->name);                                                            \
            return -1;                                                                             \
        }                                                                                          \
    } while (0)

static int parse_args(bench_opts *o, int argc, char **argv)
{
    char err[512];
    if (program_wants_version(argc, argv)) {
        program_print_version(stdout, "ps-bench");
        exit(0);
    }
    ssize_t n = readlink("/proc/self/exe", o->self, sizeof(o->self) - 1);
    if (n <= 0) {
        fprintf(stderr, "ps-bench: cannot read /proc/self/exe\n");
        return -1;
    }
    o->self[n] = '\0';
    if (options_create(&o->opts, OPT_SCOPE_TOOL) != 0) {
        fprintf(stderr, "ps-bench: out of memory\n");
        return -1;
    }
    int rc = options_load(o->opts, argc, argv, NULL, NULL, err, sizeof(err));
    if (rc == OPTIONS_HELP) {
        options_print_help(stdout, "ps-bench", usage_line, OPT_SCOPE_TOOL);
        exit(0);
    }
    if (rc != 0) {
        fprintf(stderr, "ps-bench: %s (see --help)\n", err);
        return -1;
    }
    const options *opts = o->opts;
    if (opt_str(opts, OPT_BENCH_RAW_SERVER)[0] != '\0')
        exit(raw_server_main(opt_str(opts, OPT_BENCH_RAW_SERVER)));
    if (opt_str(opts, OPT_BENCH_SERVER_BIN)[0] != '\0') {
        snprintf(o->server_bin, sizeof(o->server_bin), "%s", opt_str(opts, OPT_BENCH_SERVER_BIN));
    } else {
        snprintf(o->server_bin, sizeof(o->server_bin), "%s", o->self);
        char *slash = strrchr(o->server_bin, '/');
        snprintf(slash + 1, sizeof(o->server_bin) - (size_t)(slash + 1 - o->server_bin),
                 "../server/ps-server");
    }
    o->quick = opt_bool(opts, OPT_BENCH_QUICK);
    o->sweep = opt_bool(opts, OPT_BENCH_SWEEP);
    o->check = opt_bool(opts, OPT_BENCH_CHECK);
    o->no_variants = opt_bool(opts, OPT_BENCH_NO_VARIANTS);
    o->variant_child = opt_bool(opts, OPT_BENCH_VARIANT_CHILD);
    o->no_raw = opt_bool(opts, OPT_BENCH_NO_RAW);
    raw_copy = !opt_bool(opts, OPT_BENCH_RAW_NOCOPY);
    o->seconds = opt_double(opts, OPT_BENCH_SECONDS);
    o->warmup = opt_double(opts, OPT_BENCH_WARMUP);
    PARSE_LIST_OPT(OPT_BENCH_SIZES,
                   parse_size_list(opt_str(opts, OPT_BENCH_SIZES), o->sizes, &o->nsizes));
    PARSE_LIST_OPT(OPT_BENCH_SERVERS, parse_int_list(opt_str(opts, OPT_BENCH_SERVERS), o->servers,
                                                     &o->nservers, 1, MAX_SERVERS));
    PARSE_LIST_OPT(OPT_BENCH_SWEEP_CONNECTIONS,
                   parse_int_list(opt_str(opts, OPT_BENCH_SWEEP_CONNECTIONS), o->sweep_conns,
                                  &o->nsweep_conns, 1, 64));
    PARSE_LIST_OPT(OPT_BENCH_SWEEP_CHUNKS, parse_size_list(opt_str(opts, OPT_BENCH_SWEEP_CHUNKS),
                                                           o->sweep_chunks, &o->nsweep_chunks));
    PARSE_LIST_OPT(OPT_BENCH_SWEEP_SIZES, parse_size_list(opt_str(opts, OPT_BENCH_SWEEP_SIZES),
                                                          o->sweep_sizes, &o->nsweep_sizes));
    {
        int clients[MAX_LIST], nc = 0;
        bool ok =
            parse_int_list(opt_str(opts, OPT_BENCH_CLIENTS), clients, &nc, 1, MAX_CLIENTS) == 0 &&
            nc <= MAX_CLIENT_COUNTS;
        PARSE_LIST_OPT(OPT_BENCH_CLIENTS, ok ? 0 : -1);
        memcpy(o->clients, clients, (size_t)nc * sizeof(int));
        o->nclients = nc;
    }
    {
        const char *tr = opt_enum(opts, OPT_BENCH_TRANSPORT);
        o->ntransports = 0;
        if (strcmp(tr, "ipc") != 0)
            o->transports[o->ntransports++] = TR_TCP;
        if (strcmp(tr, "tcp") != 0)
            o->transports[o->ntransports++] = TR_IPC;
    }
    {
        char buf[128];
        bool bad = false;
        snprintf(buf, sizeof(buf), "%s", opt_str(opts, OPT_BENCH_OPS));
        memset(o->kinds, 0, sizeof(o->kinds));
        for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok && !bad;
             tok = strtok_r(NULL, ",", &save)) {
            int k = 0;
            while (k < OPK_COUNT && strcmp(tok, op_kind_names[k]) != 0)
                k++;
            if (k < OPK_COUNT)
                o->kinds[k] = true;
            else if (strcmp(tok, "push-mc") == 0)
                o->push_mc = true;
            else
                bad = true;
        }
        PARSE_LIST_OPT(OPT_BENCH_OPS, bad ? -1 : 0);
        /* --clients alone: push-mc alone. */
        if (opt_is_set(opts, OPT_BENCH_CLIENTS) && !opt_is_set(opts, OPT_BENCH_OPS)) {
            memset(o->kinds, 0, sizeof(o->kinds));
            o->push_mc = true;
        }
        if (opt_is_set(opts, OPT_BENCH_CLIENTS) && !o->push_mc) {
            fprintf(stderr, "ps-bench: --clients is the number of clients of push-mc: add push-mc "
                            "to --ops\n");
            return -1;
        }
    }
    if (opt_str(opts, OPT_BENCH_WINDOW)[0] != '\0') {
        const char *val = opt_str(opts, OPT_BENCH_WINDOW);
        char *end;
        window_ops = strtoul(val, &end, 10);
        window_bytes = (size_t)1 << 20;
        PARSE_LIST_OPT(
            OPT_BENCH_WINDOW,
            window_ops == 0 || (*end && (*end != ':' || parse_size(end + 1, &window_bytes))) ? -1
                                                                                             : 0);
    }
    o->split_threshold = opt_text(opts, OPT_BENCH_SPLIT_THRESHOLD);
    o->compare_size = (size_t)opt_int(opts, OPT_BENCH_COMPARE_SIZE);
    o->timeout_s = (unsigned)opt_int(opts, OPT_BENCH_TIMEOUT);
    cell_trials = (int)opt_int(opts, OPT_BENCH_TRIALS);
    idle_wait_s = opt_double(opts, OPT_BENCH_WAIT_IDLE);
    /* Client settings: --connections and --chunk-bytes (rows of the client table), then
     * every --client-opt. */
    const opt_int_id client_flags[2] = {OPT_CONNECTIONS, OPT_CHUNK_BYTES};
    for (int j = 0; j < 2; j++) {
        if (!opt_is_set(opts, client_flags[j]))
            continue;
        snprintf(o->client_flag_opts[j], sizeof(o->client_flag_opts[j]), "%s=%s",
                 opt_def(client_flags[j])->name, opt_text(opts, client_flags[j]));
        o->client_opts[o->nclient_opts++] = o->client_flag_opts[j];
    }
    if (add_assignments(opts, OPT_BENCH_CLIENT_OPT, o->client_opts, &o->nclient_opts) != 0 ||
        add_assignments(opts, OPT_BENCH_SERVER_OPT, o->server_opts, &o->nserver_opts) != 0)
        return -1;
    const char *const *variants;
    size_t nvariants = opt_list(opts, OPT_BENCH_MALLOC_VARIANT, &variants);
    for (size_t i = 0; i < nvariants; i++) {
        const char *val = variants[i], *e = strchr(val, '=');
        char label[80];
        if (e != NULL && e != val)
            snprintf(label, sizeof(label), "%.*s", (int)(e - val), val);
        if (e == NULL || e == val || add_variant(o, label, e + 1, "", "") != 0) {
            fprintf(stderr, "ps-bench: bad value \"%s\" for --malloc-variant (LABEL=MALLOC_CONF)\n",
                    val);
            return -1;
        }
    }
    const char *glibc_build = opt_str(opts, OPT_BENCH_GLIBC_BUILD)[0] != '\0'
                                  ? opt_str(opts, OPT_BENCH_GLIBC_BUILD)
                                  : NULL;
    bool explicit_seconds = opt_is_set(opts, OPT_BENCH_SECONDS);
    bool explicit_wait = opt_is_set(opts, OPT_BENCH_WAIT_IDLE);
    bool explicit_trials = opt_is_set(opts, OPT_BENCH_TRIALS);
    if (!explicit_wait && o->quick)
        idle_wait_s = 0;
    if (!explicit_trials && o->quick)
        cell_trials = 1;
    if (o->quick) {
        /* Small enough for a test suite; the 64 KiB and 256 KiB tensors are still split over
         * two servers and cut in several chunks, so every path of the client is taken. */
        if (!explicit_seconds)
            o->seconds = 0.05;
        o->warmup = 0.01;
        o->check = true;
        parse_size_list("4K,64K,256K", o->sizes, &o->nsizes);
        o->compare_size = 256u << 10;
        o->split_threshold = "64K";
        static const char *quick_opts[] = {"chunk-bytes=32K", "connections=2"};
        for (int j = 0; j < 2 && o->nclient_opts < MAX_OPTS; j++)
            o->client_opts[o->nclient_opts++] = quick_opts[j];
        if (!opt_is_set(opts, OPT_BENCH_TIMEOUT))
            o->timeout_s = 50;
    }
    if (o->nvariants == 0 && !o->variant_child) {
        /* The same cells in fresh processes, one after the other, so that the rows compare
         * like with like. */
        if (!o->quick) {
            add_variant(o, "project settings (jemalloc_conf.h)", "", "", "");
            /* calloc then zeroes recycled extents by purging them (jemalloc_conf.h) */
            add_variant(o, "project settings but thp:default", "thp:default", "", "");
        }
        add_variant(o, "jemalloc defaults", JEMALLOC_DEFAULTS, "", "");
    }
    if (glibc_build) {
        char b[PATH_MAX], s[PATH_MAX];
        snprintf(b, sizeof(b), "%s/bench/ps-bench", glibc_build);
        snprintf(s, sizeof(s), "%s/server/ps-server", glibc_build);
        add_variant(o, "glibc malloc", "", b, s);
    }
    for (int v = 0; v < o->nvariants; v++) {
        if (o->variants[v].bench_bin[0] == '\0')
            snprintf(o->variants[v].bench_bin, sizeof(o->variants[v].bench_bin), "%s", o->self);
        if (o->variants[v].server_bin[0] == '\0')
            snprintf(o->variants[v].server_bin, sizeof(o->variants[v].server_bin), "%s",
                     o->server_bin);
    }
    if (o->sweep && o->ntransports > 1) {
        fprintf(stderr, "ps-bench: --sweep takes one --transport (tcp or ipc)\n");
        return -1;
    }
    if (access(o->server_bin, X_OK) != 0) {
        fprintf(stderr, "ps-bench: server binary %s: %s (use --server-bin)\n", o->server_bin,
                strerror(errno));
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    static bench_opts o;
    if (parse_args(&o, argc, argv) != 0)
        return 2;
    children_install_guard(o.timeout_s);
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (o.variant_child)
        return variant_child_main(&o);

    char desc[512];
    cpu_mark mark0, mark1;
    cpu_mark_take(&mark0);
    malloc_describe(desc, sizeof(desc));
    print_header(&o, desc);
    int failed = 0;
    if (o.sweep) {
        failed = run_sweep(&o) != 0;
        printf("\n%s\n", failed ? "FAILED" : "ok");
        children_kill_all();
        ipc_cleanup();
        return failed ? 1 : 0;
    }

    /* rows[transport index][cluster size][tensor size] */
    static row rows[TR_COUNT][MAX_LIST][MAX_LIST];
    raw_server rs[TR_COUNT];
    int nrs = 0;
    for (; !o.no_raw && nrs < o.ntransports; nrs++)
        if (raw_server_start(&o, o.transports[nrs], &rs[nrs]) != 0) {
            failed++;
            break;
        }
    for (int s = 0; s < o.nservers && !failed; s++) {
        row *r[TR_COUNT] = {rows[0][s], rows[1][s]};
        if (run_pass(&o, o.servers[s], o.transports, o.ntransports, o.no_raw ? NULL : rs, o.sizes,
                     o.nsizes, o.kinds, o.push_mc, r) != 0)
            failed++;
    }
    for (int t = 0; t < nrs; t++)
        raw_server_stop(&rs[t]);

    variant_result vr[MAX_LIST];
    int nv = o.no_variants ? 0 : o.nvariants;
    for (int v = 0; v < nv; v++)
        if (run_variant(&o, &o.variants[v], &vr[v]) != 0)
            failed++;

    bool any_kind = !o.no_raw;
    for (int k = 0; k < OPK_COUNT; k++)
        any_kind |= o.kinds[k];
    for (int s = 0; s < o.nservers; s++) {
        for (int t = 0; t < o.ntransports; t++) {
            const char *tname = transport_names[o.transports[t]];
            const row *r = rows[t][s];
            if (o.ntransports == 1 && o.transports[0] == TR_TCP)
                printf("\n### %d server%s\n", o.servers[s], o.servers[s] == 1 ? "" : "s");
            else
                printf("\n### %d server%s, %s\n", o.servers[s], o.servers[s] == 1 ? "" : "s",
                       tname);
            if (any_kind) {
                print_table(o.servers[s], r, o.nsizes);
                if (o.servers[s] == 1 && (o.kinds[OPK_PUSH] || o.kinds[OPK_PULL]))
                    print_targets(r, o.nsizes);
            }
            if (o.push_mc)
                print_mc_table(&o, o.servers[s], r, o.nsizes);
        }
        if (o.ntransports == 2) {
            printf("\n### %d server%s, tcp and ipc\n", o.servers[s], o.servers[s] == 1 ? "" : "s");
            print_transport_table(&o, o.servers[s], rows[0][s], rows[1][s], o.nsizes);
        }
    }
    if (nv > 0) {
        printf("\n### Allocator\n");
        print_variants(&o, vr, nv);
    }
    children_kill_all();
    cpu_mark_take(&mark1);
    cpu_mark_report(&mark0, &mark1);
    printf("\n%s\n", failed ? "FAILED: some operation failed or returned wrong values"
                            : "ok: every operation succeeded and every value checked is right");
    children_kill_all();
    ipc_cleanup();
    return failed ? 1 : 0;
}
