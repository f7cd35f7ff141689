/* ps-local: starts and stops a whole local cluster (ps-server and ps-worker processes on
 * loopback) as one command.
 *
 *   ps-local [--ps N] [--workers N] [--chief] [--base-port P] [--timeout S] [--grace-ms MS]
 *            [--server PATH] [--worker PATH] [--server-arg ARG]... [--] [WORKER ARGS...]
 *
 * Its settings are rows of the project's option table (common/options_table.def, scope
 * OPT_SCOPE_LAUNCHER: flags, PS_LOCAL_* environment variables, --config file, --help). The
 * first argument that is not one of them (or everything after --) goes to every ps-worker,
 * after --progress=<--worker-progress> (off: the workers share the terminal).
 *
 * Every child gets TF_CONFIG with the cluster and its own task; free loopback ports are found
 * by binding (or taken from --base-port up). The children share a process group of their own
 * and die with the launcher (PR_SET_PDEATHSIG), so nothing outlives it even if it is killed.
 *
 * Lifecycle: when every worker has exited 0 the servers are stopped (SIGTERM) and ps-local
 * exits 0. When any child fails (non-zero exit, signal, or a server exiting early), or on
 * SIGINT/SIGTERM/SIGHUP, or after --timeout, everything is stopped: SIGTERM, then SIGKILL to
 * the group after --grace-ms. With --restart on-failure a failed child (not one that exited 2,
 * a configuration error) is started again with the same task, up to --max-restarts times
 * each; each restart is logged with the exit status or signal. Exit code: 0 success; the
 * failed child's exit code (128+N if it died of signal N); 128+N when ps-local itself got
 * signal N; 124 on timeout; 2 for bad usage.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "options.h"

#define MAX_TASKS 256

typedef enum { ROLE_PS, ROLE_CHIEF, ROLE_WORKER } role_kind;

typedef struct child {
    role_kind role;
    int index;
    pid_t pid;
    bool running;
    int status; /* wait status once exited */
    int restarts;
} child;

static const char *role_names[] = {"ps", "chief", "worker"};

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void say(const char *fmt, ...)
{
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    fprintf(stderr, "ps-local: %s\n", line);
    fflush(stderr);
}

static const char usage_line[] =
    "[OPTIONS] [--] [ps-worker options...]\n"
    "Runs a local cluster on loopback: N ps-server and M ps-worker processes.\n"
    "Arguments after the options (or after --) go to every ps-worker.\n"
    "Exit code: 0 when every worker succeeded, else the failing process's code.";

static bool is_executable(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode) && access(p, X_OK) == 0;
}

/* Finds `name` beside this executable, or in ../../SUBDIR of it (the build tree, where
 * ps-local is deploy/local/ps-local), or returns the bare name for execvp's PATH search. */
static void find_program(const char *name, const char *subdir, char *out, size_t cap)
{
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n > 0) {
        self[n] = '\0';
        char *slash = strrchr(self, '/');
        if (slash != NULL) {
            *slash = '\0';
            int w = snprintf(out, cap, "%s/%s", self, name);
            if (w > 0 && (size_t)w < cap && is_executable(out))
                return;
            w = snprintf(out, cap, "%s/../../%s/%s", self, subdir, name);
            if (w > 0 && (size_t)w < cap && is_executable(out))
                return;
        }
    }
    snprintf(out, cap, "%s", name);
}

/* Reserves `count` distinct free TCP ports on host by binding port 0; all sockets stay open
 * until every port is chosen so that no port is handed out twice. */
static int probe_ports(const char *host, int count, int *ports)
{
    int fds[MAX_TASKS * 2];
    int rc = 0, opened = 0;
    for (int i = 0; i < count; i++) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            rc = -1;
            break;
        }
        fds[opened++] = fd;
        struct sockaddr_in sa;
        memset(&sa, 0, sizeof(sa));
        sa.sin_family = AF_INET;
        sa.sin_port = 0;
        if (inet_pton(AF_INET, host, &sa.sin_addr) != 1 ||
            bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
            rc = -1;
            break;
        }
        socklen_t len = sizeof(sa);
        if (getsockname(fd, (struct sockaddr *)&sa, &len) != 0) {
            rc = -1;
            break;
        }
        ports[i] = ntohs(sa.sin_port);
    }
    for (int i = 0; i < opened; i++)
        close(fds[i]);
    return rc;
}

/* Appends printf output to a growing buffer; returns false when it does not fit. */
static bool append(char *buf, size_t cap, size_t *len, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static bool append(char *buf, size_t cap, size_t *len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf + *len, cap - *len, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= cap - *len)
        return false;
    *len += (size_t)n;
    return true;
}

static bool add_list(char *buf, size_t cap, size_t *len, const char *key, const char *host,
                     const int *ports, int count, bool *first)
{
    if (count == 0)
        return true;
    if (!append(buf, cap, len, "%s\"%s\":[", *first ? "" : ",", key))
        return false;
    *first = false;
    for (int i = 0; i < count; i++)
        if (!append(buf, cap, len, "%s\"%s:%d\"", i ? "," : "", host, ports[i]))
            return false;
    return append(buf, cap, len, "]");
}

static volatile sig_atomic_t got_signal;

static void note_signal(int sig)
{
    got_signal = sig;
}

static void on_sigchld(int sig)
{
    (void)sig;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static pid_t spawn(const char *path, char *const argv[], const char *tf_config, pid_t *pgid,
                   pid_t launcher)
{
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        /* Die with the launcher, whatever kills it; check for the race where it is gone. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != launcher)
            _exit(127);
        setpgid(0, *pgid);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        signal(SIGHUP, SIG_DFL);
        signal(SIGCHLD, SIG_DFL);
        setenv("TF_CONFIG", tf_config, 1);
        execvp(path, argv);
        fprintf(stderr, "ps-local: cannot run %s: %s\n", path, strerror(errno));
        _exit(127);
    }
    setpgid(pid, *pgid); /* also from the parent, so that it holds before either runs on */
    if (*pgid == 0)
        *pgid = pid;
    return pid;
}

static int exit_code_of(int status)
{
    if (WIFEXITED(status))
        return WEXITSTATUS(status);
    if (WIFSIGNALED(status))
        return 128 + WTERMSIG(status);
    return 1;
}

static void describe(const child *c, char *buf, size_t cap)
{
    if (WIFEXITED(c->status))
        snprintf(buf, cap, "%s %d (pid %d) exited with code %d", role_names[c->role], c->index,
                 (int)c->pid, WEXITSTATUS(c->status));
    else if (WIFSIGNALED(c->status))
        snprintf(buf, cap, "%s %d (pid %d) was killed by signal %d (%s)", role_names[c->role],
                 c->index, (int)c->pid, WTERMSIG(c->status), strsignal(WTERMSIG(c->status)));
    else
        snprintf(buf, cap, "%s %d (pid %d) stopped", role_names[c->role], c->index, (int)c->pid);
}

/* Reaps every exited child; returns the number reaped. */
static int reap(child *kids, int n)
{
    int reaped = 0;
    for (;;) {
        int status;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid <= 0)
            break;
        for (int i = 0; i < n; i++) {
            if (kids[i].pid == pid && kids[i].running) {
                kids[i].running = false;
                kids[i].status = status;
                reaped++;
            }
        }
    }
    return reaped;
}

static int count_running(const child *kids, int n)
{
    int r = 0;
    for (int i = 0; i < n; i++)
        r += kids[i].running;
    return r;
}

/* Waits up to `seconds` for SIGCHLD while children run. */
static void wait_children(const sigset_t *set, double seconds)
{
    if (seconds <= 0)
        return;
    struct timespec ts;
    ts.tv_sec = (time_t)seconds;
    ts.tv_nsec = (long)((seconds - (double)ts.tv_sec) * 1e9);
    sigtimedwait(set, NULL, &ts);
}

/* SIGTERM to every running child, then SIGKILL to the whole group after the grace period. */
static void stop_all(child *kids, int n, pid_t pgid, double grace_s, const sigset_t *set)
{
    for (int i = 0; i < n; i++)
        if (kids[i].running)
            kill(kids[i].pid, SIGTERM);
    double deadline = now_s() + grace_s;
    reap(kids, n);
    while (count_running(kids, n) > 0 && now_s() < deadline) {
        wait_children(set, deadline - now_s() < 0.1 ? deadline - now_s() : 0.1);
        reap(kids, n);
    }
    if (count_running(kids, n) > 0)
        say("%d process(es) still running after %.1f s: killing them", count_running(kids, n),
            grace_s);
    if (pgid > 0)
        killpg(pgid, SIGKILL); /* also whatever the children started */
    while (count_running(kids, n) > 0) {
        wait_children(set, 0.1);
        reap(kids, n);
    }
}

/* The launcher's settings, from the option table. */
typedef struct launch_config {
    options *opts;
    const char **rest; /* worker arguments: argc entries */
    int nrest;
} launch_config;

/* Loads the settings; returns -1 to go on, else the exit code (0 after --help, 2 for a bad
 * setting, 1 without memory). */
static int load_config(launch_config *lc, int argc, char **argv)
{
    char err[512];
    if (options_create(&lc->opts, OPT_SCOPE_LAUNCHER) != 0 ||
        (lc->rest = calloc((size_t)argc + 1, sizeof(*lc->rest))) == NULL) {
        say("out of memory");
        return 1;
    }
    int rc = options_load_ex(lc->opts, argc, argv, OPTIONS_LOAD_REST_POSITIONAL, lc->rest,
                             &lc->nrest, err, sizeof(err));
    if (rc == OPTIONS_HELP) {
        options_print_help(stdout, "ps-local", usage_line, OPT_SCOPE_LAUNCHER);
        return 0;
    }
    if (rc != 0) {
        say("%s (see --help)", err);
        return 2;
    }
    return -1;
}

static void free_config(launch_config *lc)
{
    options_destroy(lc->opts);
    free(lc->rest);
}

/* --print-ports N: prints N free ports of host. */
static int print_ports(const char *host, int n)
{
    int ports[MAX_TASKS];
    if (probe_ports(host, n, ports) != 0) {
        say("--print-ports: cannot find free ports");
        return 1;
    }
    for (int k = 0; k < n; k++)
        printf("%d\n", ports[k]);
    return 0;
}

static int run(const launch_config *lc);

/* What starting (or restarting) one task needs. */
typedef struct task_args {
    const char *cluster, *server_path, *worker_path;
    char *progress;
    const char *const *server_args;
    int n_server_args;
    const char **worker_args;
    int n_worker_args;
    char **cargv; /* room for every argument */
    char *tf;
    size_t tf_cap;
} task_args;

/* Starts the task of kid (role, index) with its TF_CONFIG and arguments. Returns 0, or -1
 * (said why). */
static int start_task(const task_args *ta, child *kid, pid_t *pgid, pid_t self)
{
    snprintf(ta->tf, ta->tf_cap, "{\"cluster\":%s,\"task\":{\"type\":\"%s\",\"index\":%d}}",
             ta->cluster, role_names[kid->role], kid->index);
    int na = 0;
    const char *path = kid->role == ROLE_PS ? ta->server_path : ta->worker_path;
    ta->cargv[na++] = (char *)path;
    if (kid->role == ROLE_PS) {
        for (int j = 0; j < ta->n_server_args; j++)
            ta->cargv[na++] = (char *)ta->server_args[j];
    } else {
        ta->cargv[na++] = ta->progress;
        for (int j = 0; j < ta->n_worker_args; j++)
            ta->cargv[na++] = (char *)ta->worker_args[j];
    }
    ta->cargv[na] = NULL;
    pid_t pid = spawn(path, ta->cargv, ta->tf, pgid, self);
    if (pid < 0) {
        say("cannot start %s: %s", path, strerror(errno));
        return -1;
    }
    kid->pid = pid;
    kid->running = true;
    say("started %s %d (pid %d)", role_names[kid->role], kid->index, (int)pid);
    return 0;
}

int main(int argc, char **argv)
{
    launch_config lc = {0};
    int rc = load_config(&lc, argc, argv);
    if (rc < 0)
        rc = run(&lc);
    free_config(&lc);
    return rc;
}

static int run(const launch_config *lc)
{
    const options *o = lc->opts;
    long n_ps = (long)opt_int(o, OPT_LOCAL_PS), n_workers = (long)opt_int(o, OPT_LOCAL_WORKERS);
    long base_port = (long)opt_int(o, OPT_LOCAL_BASE_PORT);
    long timeout_s = (long)opt_int(o, OPT_LOCAL_TIMEOUT);
    long grace_ms = (long)opt_int(o, OPT_LOCAL_GRACE_MS);
    bool chief = opt_bool(o, OPT_LOCAL_CHIEF);
    const char *host = opt_str(o, OPT_LOCAL_HOST);
    char server_path[PATH_MAX], worker_path[PATH_MAX], progress[64];
    const char *const *server_args = NULL;
    int n_server_args = (int)opt_list(o, OPT_LOCAL_SERVER_ARG, &server_args);
    if (opt_int(o, OPT_LOCAL_PRINT_PORTS) > 0)
        return print_ports(host, (int)opt_int(o, OPT_LOCAL_PRINT_PORTS));
    if (strlen(opt_str(o, OPT_LOCAL_SERVER)) >= sizeof(server_path) ||
        strlen(opt_str(o, OPT_LOCAL_WORKER)) >= sizeof(worker_path)) {
        say("--server or --worker: path longer than %d bytes", PATH_MAX - 1);
        return 2;
    }
    snprintf(server_path, sizeof(server_path), "%s", opt_str(o, OPT_LOCAL_SERVER));
    snprintf(worker_path, sizeof(worker_path), "%s", opt_str(o, OPT_LOCAL_WORKER));
    /* Several workers share this terminal: progress bars would overwrite each other, so the
     * workers get --progress=off unless told otherwise (their own --progress comes later and
     * wins). */
    snprintf(progress, sizeof(progress), "--progress=%s", opt_enum(o, OPT_LOCAL_WORKER_PROGRESS));
    int n_worker_args = lc->nrest;
    int n_tasks = (int)(n_ps + n_workers);
    if (n_worker_args > 1000) {
        say("too many worker arguments");
        return 2;
    }
    struct in_addr probe_addr;
    if (base_port == 0 && inet_pton(AF_INET, host, &probe_addr) != 1) {
        say("--host %s: probing ports needs an IPv4 address; give --base-port", host);
        return 2;
    }
    if (base_port != 0 && base_port + n_tasks - 1 > 65535) {
        say("--base-port %ld: not enough ports below 65536 for %d tasks", base_port, n_tasks);
        return 2;
    }
    if (server_path[0] == '\0')
        find_program("ps-server", "server", server_path, sizeof(server_path));
    if (worker_path[0] == '\0')
        find_program("ps-worker", "worker", worker_path, sizeof(worker_path));

    int ports[MAX_TASKS * 2];
    if (base_port != 0) {
        for (int k = 0; k < n_tasks; k++)
            ports[k] = (int)base_port + k;
    } else if (probe_ports(host, n_tasks, ports) != 0) {
        say("cannot find %d free ports on %s: %s", n_tasks, host, strerror(errno));
        return 1;
    }
    const int *ps_ports = ports;
    const int *chief_ports = ports + n_ps;
    int n_chief = chief ? 1 : 0;
    const int *worker_ports = ports + n_ps + n_chief;
    int n_plain_workers = (int)n_workers - n_chief;

    char cluster[16384];
    size_t len = 0;
    bool first = true;
    bool fits = append(cluster, sizeof(cluster), &len, "{");
    fits =
        fits && add_list(cluster, sizeof(cluster), &len, "ps", host, ps_ports, (int)n_ps, &first);
    fits = fits &&
           add_list(cluster, sizeof(cluster), &len, "chief", host, chief_ports, n_chief, &first);
    fits = fits && add_list(cluster, sizeof(cluster), &len, "worker", host, worker_ports,
                            n_plain_workers, &first);
    fits = fits && append(cluster, sizeof(cluster), &len, "}");
    if (!fits) {
        say("cluster spec too long");
        return 2;
    }

    /* Signals are taken synchronously in the loop below. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGHUP);
    sigaddset(&set, SIGCHLD);
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = note_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    sa.sa_handler = on_sigchld;
    sigaction(SIGCHLD, &sa, NULL);
    sigprocmask(SIG_BLOCK, &set, NULL);

    say("cluster %s: %ld ps, %ld worker(s)%s; server %s, worker %s", cluster, n_ps, n_workers,
        chief ? " (worker 0 as chief)" : "", server_path, worker_path);

    child kids[MAX_TASKS];
    int n_kids = 0;
    pid_t pgid = 0, self = getpid();
    char tf[16384 + 128];
    char **cargv = calloc((size_t)(n_worker_args + n_server_args + 3), sizeof(char *));
    if (cargv == NULL) {
        say("out of memory");
        return 1;
    }
    int exit_code = 0;
    bool failed = false;
    task_args ta = {.cluster = cluster,
                    .server_path = server_path,
                    .worker_path = worker_path,
                    .progress = progress,
                    .server_args = server_args,
                    .n_server_args = n_server_args,
                    .worker_args = lc->rest,
                    .n_worker_args = n_worker_args,
                    .cargv = cargv,
                    .tf = tf,
                    .tf_cap = sizeof(tf)};
    for (int k = 0; k < n_tasks && !failed; k++) {
        role_kind role;
        int index;
        if (k < n_ps) {
            role = ROLE_PS;
            index = k;
        } else if (k - n_ps < n_chief) {
            role = ROLE_CHIEF;
            index = 0;
        } else {
            role = ROLE_WORKER;
            index = k - (int)n_ps - n_chief;
        }
        kids[n_kids] = (child){.role = role, .index = index};
        if (start_task(&ta, &kids[n_kids], &pgid, self) != 0) {
            exit_code = 1;
            failed = true;
            break;
        }
        n_kids++;
    }

    double start = now_s();
    const bool restart = strcmp(opt_enum(o, OPT_LOCAL_RESTART), "on-failure") == 0;
    const int max_restarts = (int)opt_int(o, OPT_LOCAL_MAX_RESTARTS);
    while (!failed) {
        reap(kids, n_kids);
        /* Any failure, or a server ending before the workers, stops the cluster. */
        int workers_left = 0;
        for (int k = 0; k < n_kids; k++) {
            const child *c = &kids[k];
            if (c->role != ROLE_PS && c->running)
                workers_left++;
            if (c->running || failed)
                continue;
            bool ok_exit = WIFEXITED(c->status) && WEXITSTATUS(c->status) == 0;
            if (!ok_exit || c->role == ROLE_PS) {
                char what[256];
                describe(c, what, sizeof(what));
                /* Exit code 2 is a configuration error: running it again cannot help. */
                bool config = WIFEXITED(c->status) && WEXITSTATUS(c->status) == 2;
                if (restart && !config && !got_signal && c->restarts < max_restarts) {
                    child *r = &kids[k];
                    r->restarts++;
                    say("%s; restarting it (restart %d of %d)", what, r->restarts, max_restarts);
                    if (start_task(&ta, r, &pgid, self) == 0) {
                        if (r->role != ROLE_PS)
                            workers_left++;
                        continue;
                    }
                    exit_code = 1;
                    failed = true;
                    continue;
                }
                if (restart && !config && c->restarts >= max_restarts)
                    say("%s; it was restarted %d time(s) already (--max-restarts)", what,
                        c->restarts);
                say("%s; stopping the cluster", what);
                if (c->role != ROLE_PS && c->index == 0)
                    say("worker 0, the evaluator, died: no evaluation of the model was made");
                exit_code = ok_exit ? 1 : exit_code_of(c->status);
                failed = true;
            }
        }
        if (failed)
            break;
        if (workers_left == 0) {
            say("all %d worker(s) finished in %.1f s; stopping the servers", (int)n_workers,
                now_s() - start);
            break;
        }
        if (got_signal) {
            say("received %s; stopping the cluster", strsignal(got_signal));
            exit_code = 128 + got_signal;
            failed = true;
            break;
        }
        if (timeout_s > 0 && now_s() - start >= (double)timeout_s) {
            say("timed out after %ld s; stopping the cluster", timeout_s);
            exit_code = 124;
            failed = true;
            break;
        }
        int sig = 0;
        struct timespec ts = {0, 200000000};
        sig = sigtimedwait(&set, NULL, &ts);
        if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP)
            got_signal = sig;
    }
    stop_all(kids, n_kids, pgid, (double)grace_ms / 1000.0, &set);
    if (!failed) {
        /* Servers stopped on our SIGTERM: exit codes 0 or 128+15 are the expected ones. */
        for (int k = 0; k < n_kids; k++) {
            const child *c = &kids[k];
            if (c->role != ROLE_PS)
                continue;
            bool expected = (WIFEXITED(c->status) && WEXITSTATUS(c->status) == 0) ||
                            (WIFSIGNALED(c->status) && WTERMSIG(c->status) == SIGTERM);
            if (!expected) {
                char what[256];
                describe(c, what, sizeof(what));
                say("%s while stopping", what);
            }
        }
    }
    free(cargv);
    say("%s (exit code %d)", exit_code == 0 ? "training succeeded" : "training failed", exit_code);
    return exit_code;
}
