/* ps-local: starts and stops a whole local cluster (ps-server and ps-worker processes on
 * loopback) as one command.
 *
 *   ps-local [--ps N] [--workers N] [--chief] [--base-port P] [--timeout S] [--grace-ms MS]
 *            [--server PATH] [--worker PATH] [--python PATH] [--server-arg ARG]...
 *            [--] [WORKER ARGS...]
 *
 * Its settings are rows of the project's option table (common/options_table.def, scope
 * OPT_SCOPE_LAUNCHER: flags, PS_LOCAL_* environment variables, --config file, --help). The
 * first argument that is not one of them (or everything after --) goes to every worker; a
 * ps-worker gets --progress=<--worker-progress> (off: the workers share the terminal) before
 * them, any other worker program only them. A --worker ending in .py is run by the --python
 * interpreter.
 *
 * Every child gets TF_CONFIG with the cluster and its own task; free loopback ports are found
 * by binding (or taken from --base-port up). With --transport ipc the ps tasks listen on ipc://
 * sockets in a private directory under $TMPDIR (or /tmp), ps-local.PID.XXXXXX, removed at exit and
 * on SIGTERM, SIGINT and SIGHUP; one that a SIGKILLed launcher left (its PID gone, no socket
 * listening) is removed by the next ps-local that starts. The workers' entries stay host:port. The
 * children share a process group of their own and die with the launcher (PR_SET_PDEATHSIG), so
 * nothing outlives it even if it is killed.
 *
 * Each line a child writes on stderr is labelled with its role and index (the text form
 * "worker 1: ..." on a terminal, the JSON line's role and task otherwise); stdout is passed
 * through (by convention only worker 0 writes there: its result line). The summary counts the
 * workers that exited 0.
 *
 * Lifecycle: when every worker has exited 0 the servers are stopped (SIGTERM) and ps-local
 * exits 0. When any child fails (non-zero exit, signal, or a server exiting early), or on
 * SIGINT/SIGTERM/SIGHUP, or after --timeout, everything is stopped: SIGTERM, then SIGKILL to
 * the group after --grace-ms. With --restart on-failure a failed child (not one that exited 2,
 * a configuration error) is started again with the same task, up to --max-restarts times
 * each; each restart is logged with the exit status or signal. Exit code: 0 success; the
 * failed child's exit code (128+N if it died of signal N); 128+N when ps-local itself got
 * signal N; 124 on timeout; 2 for bad usage. With --replicas R > 1 a ps that dies (and is not
 * restarted) does not stop the cluster while fewer than R have died: each task's state has R
 * copies on distinct servers, one of which takes over, and the workers follow it.
 * With --add-server ps-local starts its own etcd (replicas 1), passes the coordinator to every
 * process, and once the workers started and every server serves (the slot map is published),
 * or --add-server-after seconds later, starts one more ps-server with --join on a port of its
 * own; once that one serves it runs psctl add-server
 * (its output comes through as "psctl" lines). A psctl that fails stops the cluster; the
 * summary says whether the server was added.
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <json-c/json.h>

#include "events.h"
#include "local_etcd.h"

#include "log.h"
#include "options.h"
#include "program.h"

#define MAX_TASKS 256

/* ROLE_CTL: the psctl that --add-server runs. */
typedef enum { ROLE_PS, ROLE_CHIEF, ROLE_WORKER, ROLE_CTL } role_kind;
/* Children at most: the tasks, and with --add-server the joined server and psctl. */
#define MAX_KIDS (MAX_TASKS + 2)

/* Size of the buffer that collects one child's stderr line; a longer line is passed on in
 * pieces. */
#define LINE_CAP (LOG_LINE_MAX + 64)

typedef struct child {
    role_kind role;
    int index;
    pid_t pid;
    bool running;
    int status; /* wait status once exited */
    int restarts;
    /* a ps that died with --replicas > 1: its groups went to other copies */
    bool failed_over;
    /* the server --add-server starts (ps-server --join); whether a server said it serves */
    bool joined, serving;
    int err_fd; /* read end of its stderr pipe, -1 once closed */
    char line[LINE_CAP];
    size_t line_len;
    /* Its latest step log line (workers). */
    bool has_step;
    long long step, total_steps;
    int epoch;
    double loss, samples_per_s;
    /* Its end-of-training line ("trained N steps ..."). */
    bool has_result;
    long long result_steps;
    double result_wall_s, result_samples_per_s, result_loss;
} child;

static const char *role_names[] = {"ps", "chief", "worker", "psctl"};

/* Human mode (stderr is a terminal): a live progress line, text lines. Otherwise every line on
 * stderr is a JSON line (README, "Log lines"). */
static bool human;
static bool bar_shown;
static double bar_last;

static void bar_clear(void)
{
    if (bar_shown) {
        fputs("\r\033[K", stderr);
        bar_shown = false;
    }
}

static void write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return;
        p += w;
        n -= (size_t)w;
    }
}

/* One JSON log line of the launcher (role "ps-local", task -1) or, for a child's line that is
 * not JSON, in that child's name; fields is a JSON object body fragment or NULL. */
static void emit_json(const char *level, const char *role, int task, const char *msg,
                      const char *fields)
{
    char ts[96], esc[LOG_LINE_MAX / 2], line[LOG_LINE_MAX + 256];
    struct timespec now;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &now);
    gmtime_r(&now.tv_sec, &tm);
    snprintf(ts, sizeof(ts), "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
             tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
             (int)(now.tv_nsec / 1000000L) % 1000);
    log_json_escape(esc, sizeof(esc), msg);
    int n = snprintf(
        line, sizeof(line),
        "{\"ts\":\"%s\",\"level\":\"%s\",\"role\":\"%s\",\"task\":%d,\"msg\":\"%s\"%s%s}\n", ts,
        level, role, task, esc, fields != NULL ? "," : "", fields != NULL ? fields : "");
    if (n > 0)
        write_all(STDERR_FILENO, line, (size_t)n < sizeof(line) ? (size_t)n : sizeof(line) - 1);
}

static void vsay(const char *level, const char *fields, const char *fmt, va_list ap)
    __attribute__((format(printf, 3, 0)));

static void vsay(const char *level, const char *fields, const char *fmt, va_list ap)
{
    char line[1024];
    vsnprintf(line, sizeof(line), fmt, ap);
    if (human) {
        bar_clear();
        fprintf(stderr, "ps-local: %s\n", line);
        fflush(stderr);
    } else {
        emit_json(level, "ps-local", -1, line, fields);
    }
}

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void say(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsay("info", NULL, fmt, ap);
    va_end(ap);
}

/* A line about a failure: level "error" in JSON. */
static void say_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void say_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsay("error", NULL, fmt, ap);
    va_end(ap);
}

static void say_fields(const char *fields, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void say_fields(const char *fields, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsay("info", fields, fmt, ap);
    va_end(ap);
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

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* Whether `path` names ps-worker (which takes --progress); other worker programs get only the
 * worker arguments. */
static bool is_ps_worker(const char *path)
{
    const char *slash = strrchr(path, '/');
    return strcmp(slash != NULL ? slash + 1 : path, "ps-worker") == 0;
}

/* For a Python worker run from the build tree: PSD_LIBRARY (how the psd package finds
 * libpsclient, client/python/README.md) names the build's library unless it is set already.
 * An installed libpsclient is found by the package itself. */
static void set_psd_library(void)
{
    char self[PATH_MAX], lib[PATH_MAX + 32];
    if (getenv("PSD_LIBRARY") != NULL)
        return;
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n <= 0)
        return;
    self[n] = '\0';
    char *slash = strrchr(self, '/');
    if (slash == NULL)
        return;
    *slash = '\0';
    int w = snprintf(lib, sizeof(lib), "%s/../../client/libpsclient.so", self);
    if (w > 0 && (size_t)w < sizeof(lib) && access(lib, R_OK) == 0)
        setenv("PSD_LIBRARY", lib, 1);
}

/* Reserves `count` distinct free TCP ports on host by binding port 0; all sockets stay open
 * until every port is chosen so that no port is handed out twice. */
static int probe_ports(const char *host, int count, int *ports)
{
    int fds[MAX_TASKS * 2 + 3];
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

/* Private directory of the ps tasks' ipc:// sockets ("" with tcp), and how many sockets
 * (ps-0.sock ...) it may hold; removed by remove_ipc_dir at exit (after SIGTERM, SIGINT and
 * SIGHUP too). Its name holds the launcher's pid, ps-local.PID.XXXXXX, so that a directory left
 * by a launcher that was SIGKILLed is known as stale (its owner is gone) and removed by the
 * next launcher that starts (remove_stale_ipc_dirs). */
static char ipc_dir[PATH_MAX];
static int ipc_count;

/* Where the socket directories go: $TMPDIR, or /tmp when that is unset or too long for
 * "DIR/ps-local.PID.XXXXXX/ps-NNN.sock" to fit sun_path (107 bytes + NUL). */
static const char *ipc_parent(void)
{
    const char *tmp = getenv("TMPDIR");
    if (tmp == NULL || tmp[0] != '/' || strlen(tmp) > 107 - 40)
        tmp = "/tmp";
    return tmp;
}

/* Creates ipc_dir under ipc_parent(). Returns 0, or -1 with errno set. */
static int make_ipc_dir(int count)
{
    snprintf(ipc_dir, sizeof(ipc_dir), "%s/ps-local.%ld.XXXXXX", ipc_parent(), (long)getpid());
    if (mkdtemp(ipc_dir) == NULL) {
        ipc_dir[0] = '\0';
        return -1;
    }
    ipc_count = count;
    return 0;
}

/* True if a process listens on the unix socket at path. */
static bool socket_is_live(const char *path)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof(sa.sun_path))
        return false;
    memcpy(sa.sun_path, path, strlen(path) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return true; /* cannot tell: keep it */
    bool live = connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
    close(fd);
    return live;
}

/* Removes dir (one ps-local.PID.XXXXXX of ours) if it is stale: its owner pid no longer runs
 * and none of its ps-N.sock sockets has a listener. Only those sockets go; a directory that
 * holds anything else stays. */
static void remove_if_stale(const char *parent, const char *name)
{
    char *end;
    long pid = strtol(name + strlen("ps-local."), &end, 10);
    if (end == name + strlen("ps-local.") || *end != '.' || strlen(end + 1) != 6 || pid <= 0 ||
        pid == (long)getpid())
        return;
    if (kill((pid_t)pid, 0) == 0 || errno != ESRCH)
        return; /* the owner runs (EPERM: someone else's process) */
    char dir[PATH_MAX], path[PATH_MAX + 300];
    snprintf(dir, sizeof(dir), "%s/%s", parent, name);
    struct stat st;
    if (lstat(dir, &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid())
        return;
    DIR *d = opendir(dir);
    if (d == NULL)
        return;
    struct dirent *e;
    bool live = false;
    while (!live && (e = readdir(d)) != NULL) {
        int n;
        char tail;
        if (sscanf(e->d_name, "ps-%d.soc%c", &n, &tail) == 2 && tail == 'k') {
            snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
            live = socket_is_live(path);
        }
    }
    if (!live) {
        rewinddir(d);
        while ((e = readdir(d)) != NULL) {
            int n;
            char tail;
            if (sscanf(e->d_name, "ps-%d.soc%c", &n, &tail) == 2 && tail == 'k') {
                snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
                unlink(path);
            }
        }
    }
    closedir(d);
    if (live)
        return;
    if (rmdir(dir) == 0)
        say("removed %s, left by ps-local pid %ld, which is no longer running", dir, pid);
    else
        say("not removing %s, left by ps-local pid %ld: %s", dir, pid, strerror(errno));
}

/* Removes the socket directories that launchers killed with SIGKILL left in ipc_parent(). */
static void remove_stale_ipc_dirs(void)
{
    const char *parent = ipc_parent();
    DIR *d = opendir(parent);
    if (d == NULL)
        return;
    struct dirent *e;
    char names[64][NAME_MAX + 1];
    int n = 0;
    /* Collected first: removing entries while reading the directory may skip others. */
    while (n < 64 && (e = readdir(d)) != NULL)
        if (strncmp(e->d_name, "ps-local.", strlen("ps-local.")) == 0 &&
            strlen(e->d_name) <= NAME_MAX)
            memcpy(names[n++], e->d_name, strlen(e->d_name) + 1);
    closedir(d);
    for (int i = 0; i < n; i++)
        remove_if_stale(parent, names[i]);
}

static void remove_ipc_dir(void)
{
    char path[PATH_MAX + 32];
    if (ipc_dir[0] == '\0')
        return;
    for (int i = 0; i < ipc_count; i++) {
        snprintf(path, sizeof(path), "%s/ps-%d.sock", ipc_dir, i);
        unlink(path);
    }
    if (rmdir(ipc_dir) != 0)
        say_error("cannot remove %s: %s", ipc_dir, strerror(errno));
    ipc_dir[0] = '\0';
}

/* Adds "key":[...] of host:port addresses, or of ipc://ipc_dir/ps-N.sock when ipc is set. */
static bool add_list(char *buf, size_t cap, size_t *len, const char *key, const char *host,
                     const int *ports, int count, bool ipc, bool *first)
{
    if (count == 0)
        return true;
    if (!append(buf, cap, len, "%s\"%s\":[", *first ? "" : ",", key))
        return false;
    *first = false;
    for (int i = 0; i < count; i++) {
        bool ok = ipc ? append(buf, cap, len, "%s\"ipc://%s/ps-%d.sock\"", i ? "," : "", ipc_dir, i)
                      : append(buf, cap, len, "%s\"%s:%d\"", i ? "," : "", host, ports[i]);
        if (!ok)
            return false;
    }
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
                   pid_t launcher, int err_w, bool out_too)
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
        if (err_w >= 0 && dup2(err_w, STDERR_FILENO) < 0)
            _exit(127);
        if (out_too && err_w >= 0 && dup2(err_w, STDOUT_FILENO) < 0)
            _exit(127);
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

static double training_start;

static double json_num(json_object *o, const char *key, bool *ok)
{
    json_object *v;
    if (!json_object_object_get_ex(o, key, &v) ||
        !(json_object_is_type(v, json_type_double) || json_object_is_type(v, json_type_int))) {
        *ok = false;
        return 0.0;
    }
    return json_object_get_double(v);
}

static void format_duration(char *buf, size_t cap, double s)
{
    long t = s < 0 ? 0 : (long)(s + 0.5);
    if (t >= 3600)
        snprintf(buf, cap, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
    else
        snprintf(buf, cap, "%ld:%02ld", t / 60, t % 60);
}

/* The live progress line: all workers together. */
static void bar_draw(const child *kids, int n, bool force)
{
    double now = now_s();
    if (!human || (!force && now - bar_last < 0.1))
        return;
    long long step = 0, total = 0;
    int workers = 0, epoch = 0;
    double loss = 0.0, sps = 0.0;
    for (int i = 0; i < n; i++) {
        const child *c = &kids[i];
        if (c->role == ROLE_PS || !c->has_step)
            continue;
        workers++;
        step += c->step;
        total += c->total_steps;
        loss += c->loss;
        if (c->running)
            sps += c->samples_per_s;
        if (c->epoch > epoch)
            epoch = c->epoch;
    }
    if (workers == 0)
        return;
    bar_last = now;
    double frac = total > 0 ? (double)step / (double)total : 0.0;
    if (frac > 1.0)
        frac = 1.0;
    enum { WIDTH = 20 };
    char bar[WIDTH + 1], el[32], eta[32], line[512];
    int fill = (int)(frac * WIDTH);
    for (int i = 0; i < WIDTH; i++)
        bar[i] = i < fill ? '=' : (i == fill ? '>' : ' ');
    bar[WIDTH] = '\0';
    double elapsed = now - training_start;
    format_duration(el, sizeof(el), elapsed);
    if (frac > 0)
        format_duration(eta, sizeof(eta), elapsed * (1.0 - frac) / frac);
    else
        snprintf(eta, sizeof(eta), "?");
    int len = snprintf(line, sizeof(line),
                       "[%s] %3.0f%% epoch %d step %lld/%lld loss %.4f %.0f samples/s %s ETA %s",
                       bar, frac * 100.0, epoch, step, total, loss / workers, sps, el, eta);
    struct winsize ws;
    if (len > 0 && ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 1 &&
        len >= (int)ws.ws_col)
        line[ws.ws_col - 1] = '\0';
    fprintf(stderr, "\r\033[K%s", line);
    fflush(stderr);
    bar_shown = true;
}

/* One line of a child's stderr (without its newline). Without a terminal it is passed on as
 * it is when it is JSON, else wrapped in a JSON line; on a terminal step lines feed the
 * progress line and the others are printed as text. Either way the statistics are taken. */
static void child_line(child *c, char *line, size_t len)
{
    line[len] = '\0';
    json_object *o = len > 0 && line[0] == '{' ? json_tokener_parse(line) : NULL;
    if (o != NULL && !json_object_is_type(o, json_type_object)) {
        json_object_put(o);
        o = NULL;
    }
    bool step_line = false;
    const char *msg = line, *level = "info";
    if (o != NULL) {
        json_object *v;
        if (json_object_object_get_ex(o, "msg", &v) && json_object_is_type(v, json_type_string))
            msg = json_object_get_string(v);
        if (json_object_object_get_ex(o, "level", &v) && json_object_is_type(v, json_type_string))
            level = json_object_get_string(v);
        bool ok = true;
        long long s = 0, t = 0;
        double step = json_num(o, "step", &ok), loss = json_num(o, "loss", &ok);
        double sps = json_num(o, "samples_per_s", &ok), epoch = json_num(o, "epoch", &ok);
        if (c->role == ROLE_PS && strstr(msg, "serving on") != NULL)
            c->serving = true;
        if (ok && c->role != ROLE_PS && sscanf(msg, "step %lld/%lld", &s, &t) == 2) {
            step_line = true;
            c->has_step = true;
            c->step = (long long)step;
            c->total_steps = t;
            c->loss = loss;
            c->samples_per_s = sps;
            c->epoch = (int)epoch;
        }
        ok = true;
        double steps = json_num(o, "steps", &ok), wall = json_num(o, "wall_s", &ok);
        double rsps = json_num(o, "samples_per_s", &ok);
        double rloss = json_num(o, "loss", &ok);
        if (ok && c->role != ROLE_PS && c->role != ROLE_CTL) {
            c->has_result = true;
            c->result_steps = (long long)steps;
            c->result_wall_s = wall;
            c->result_samples_per_s = rsps;
            c->result_loss = rloss;
            if (c->has_step)
                c->step = c->total_steps;
        }
    }
    if (!human) {
        if (o != NULL) {
            line[len] = '\n';
            write_all(STDERR_FILENO, line, len + 1);
        } else {
            emit_json("info", role_names[c->role], c->index, line, NULL);
        }
    } else if (!step_line) {
        bar_clear();
        if (strcmp(level, "info") == 0 || o == NULL)
            fprintf(stderr, "%s %d: %s\n", role_names[c->role], c->index, msg);
        else
            fprintf(stderr, "%s %d: %s: %s\n", role_names[c->role], c->index, level, msg);
        fflush(stderr);
    }
    if (o != NULL)
        json_object_put(o);
}

/* Reads what child c has written; at EOF closes its pipe. */
static void child_read(child *c)
{
    for (;;) {
        if (c->line_len == LINE_CAP - 1) { /* a line too long: pass on what there is */
            child_line(c, c->line, c->line_len);
            c->line_len = 0;
        }
        ssize_t r = read(c->err_fd, c->line + c->line_len, LINE_CAP - 1 - c->line_len);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return; /* EAGAIN */
        if (r == 0) {
            if (c->line_len > 0)
                child_line(c, c->line, c->line_len);
            c->line_len = 0;
            close(c->err_fd);
            c->err_fd = -1;
            return;
        }
        size_t have = c->line_len + (size_t)r, from = 0;
        for (size_t i = c->line_len; i < have; i++) {
            if (c->line[i] == '\n') {
                child_line(c, c->line + from, i - from);
                from = i + 1;
            }
        }
        memmove(c->line, c->line + from, have - from);
        c->line_len = have - from;
    }
}

/* Waits up to `seconds` for output of a child, a signal or SIGCHLD, and takes the output. */
static void wait_events(child *kids, int n, double seconds)
{
    struct pollfd fds[MAX_KIDS];
    int map[MAX_KIDS], nfds = 0;
    for (int i = 0; i < n; i++) {
        if (kids[i].err_fd >= 0) {
            fds[nfds] = (struct pollfd){.fd = kids[i].err_fd, .events = POLLIN};
            map[nfds++] = i;
        }
    }
    if (seconds < 0)
        seconds = 0;
    struct timespec ts;
    ts.tv_sec = (time_t)seconds;
    ts.tv_nsec = (long)((seconds - (double)ts.tv_sec) * 1e9);
    sigset_t none;
    sigemptyset(&none);
    int r = ppoll(fds, (nfds_t)nfds, &ts, &none);
    for (int k = 0; r > 0 && k < nfds; k++)
        if (fds[k].revents != 0)
            child_read(&kids[map[k]]);
    bar_draw(kids, n, false);
}

/* Takes whatever the children left in their pipes once they are gone. */
static void drain_all(child *kids, int n)
{
    for (int i = 0; i < n; i++)
        if (kids[i].err_fd >= 0 && !kids[i].running)
            child_read(&kids[i]);
}

static int count_running_role(const child *kids, int n, bool ps)
{
    int r = 0;
    for (int i = 0; i < n; i++)
        r += kids[i].running && (kids[i].role == ROLE_PS) == ps;
    return r;
}

/* SIGTERM to the workers, and once they are gone (they may be in calls to the servers) to the
 * servers; SIGKILL to the whole group for what is left after the grace period. */
static void stop_all(child *kids, int n, pid_t pgid, double grace_s)
{
    double deadline = now_s() + grace_s;
    for (int pass = 0; pass < 2; pass++) {
        bool ps = pass == 1;
        for (int i = 0; i < n; i++)
            if (kids[i].running && (kids[i].role == ROLE_PS) == ps)
                kill(kids[i].pid, SIGTERM);
        reap(kids, n);
        while (count_running_role(kids, n, ps) > 0 && now_s() < deadline) {
            wait_events(kids, n, deadline - now_s() < 0.1 ? deadline - now_s() : 0.1);
            reap(kids, n);
        }
    }
    if (count_running(kids, n) > 0) {
        say_error("%d process(es) still running after %.1f s: killing them (SIGKILL)",
                  count_running(kids, n), grace_s);
    }
    if (pgid > 0)
        killpg(pgid, SIGKILL); /* also whatever the children started */
    while (count_running(kids, n) > 0) {
        wait_events(kids, n, 0.1);
        reap(kids, n);
    }
    drain_all(kids, n);
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
        say_error("out of memory");
        return 1;
    }
    int rc = options_load_ex(lc->opts, argc, argv, OPTIONS_LOAD_REST_POSITIONAL, lc->rest,
                             &lc->nrest, err, sizeof(err));
    if (rc == OPTIONS_HELP) {
        options_print_help(stdout, "ps-local", usage_line, OPT_SCOPE_LAUNCHER);
        return 0;
    }
    if (rc != 0) {
        say_error("%s (see --help)", err);
        return 2;
    }
    /* A flag that is not ps-local's, before any "--", is a mistake rather than the start of
     * the worker arguments: say so before anything starts. */
    if (lc->nrest > 0 && lc->rest[0][0] == '-') {
        for (int j = 1; j < argc; j++) {
            if (argv[j] == lc->rest[0] && strcmp(argv[j - 1], "--") != 0) {
                say_error("unknown option '%s' (ps-worker options go after --; see --help)",
                          argv[j]);
                return 2;
            }
        }
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
        say_error("--print-ports: cannot find free ports");
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
    const char *python; /* interpreter of a worker script, or NULL */
    char *progress;     /* --progress=... for ps-worker, or NULL */
    char *logdir;       /* --logdir=... for ps-worker, or NULL */
    const char *const *server_args;
    int n_server_args;
    const char **worker_args;
    int n_worker_args;
    char **cargv; /* room for every argument */
    char *tf;
    size_t tf_cap;
    /* --add-server: the joined server's --listen, and psctl's path and coordinator */
    const char *join_listen, *psctl_path, *coordinator, *join_addr;
} task_args;

/* Starts the task of kid (role, index) with its TF_CONFIG and arguments. Returns 0, or -1
 * (said why). */
static int start_task(const task_args *ta, child *kid, pid_t *pgid, pid_t self)
{
    if (kid->joined || kid->role == ROLE_CTL) /* no task of the spec */
        snprintf(ta->tf, ta->tf_cap, "{\"cluster\":%s}", ta->cluster);
    else
        snprintf(ta->tf, ta->tf_cap, "{\"cluster\":%s,\"task\":{\"type\":\"%s\",\"index\":%d}}",
                 ta->cluster, role_names[kid->role], kid->index);
    int na = 0;
    const char *path = kid->role == ROLE_PS ? ta->server_path : ta->worker_path;
    if (kid->role == ROLE_CTL) {
        /* psctl --cluster SPEC --coordinator EP add-server HOST:PORT */
        path = ta->psctl_path;
        ta->cargv[na++] = (char *)path;
        ta->cargv[na++] = "--cluster";
        ta->cargv[na++] = (char *)ta->cluster;
        ta->cargv[na++] = "--coordinator";
        ta->cargv[na++] = (char *)ta->coordinator;
        ta->cargv[na++] = "--batch-slots";
        ta->cargv[na++] = "128";
        ta->cargv[na++] = "add-server";
        ta->cargv[na++] = (char *)ta->join_addr;
    } else if (kid->role != ROLE_PS && ta->python != NULL) {
        ta->cargv[na++] = (char *)ta->python; /* python3 SCRIPT.py ARGS... */
        ta->cargv[na++] = (char *)path;
        path = ta->python;
    } else {
        ta->cargv[na++] = (char *)path;
    }
    if (kid->role == ROLE_CTL) {
    } else if (kid->role == ROLE_PS) {
        for (int j = 0; j < ta->n_server_args; j++)
            ta->cargv[na++] = (char *)ta->server_args[j];
        if (kid->joined) {
            ta->cargv[na++] = "--join";
            ta->cargv[na++] = (char *)ta->join_listen;
        }
    } else {
        if (ta->progress != NULL)
            ta->cargv[na++] = ta->progress;
        if (ta->logdir != NULL)
            ta->cargv[na++] = ta->logdir;
        for (int j = 0; j < ta->n_worker_args; j++)
            ta->cargv[na++] = (char *)ta->worker_args[j];
    }
    ta->cargv[na] = NULL;
    /* Its stderr comes through a pipe (child_line). A restarted task gets a new one. */
    if (kid->err_fd >= 0) {
        child_read(kid);
        if (kid->err_fd >= 0)
            close(kid->err_fd);
        kid->err_fd = -1;
    }
    int pfd[2];
    if (pipe2(pfd, O_CLOEXEC) != 0) {
        say_error("cannot make a pipe: %s", strerror(errno));
        return -1;
    }
    fcntl(pfd[0], F_SETFL, fcntl(pfd[0], F_GETFL) | O_NONBLOCK);
    pid_t pid = spawn(path, ta->cargv, ta->tf, pgid, self, pfd[1], kid->role == ROLE_CTL);
    int saved = errno;
    close(pfd[1]);
    if (pid < 0) {
        close(pfd[0]);
        say_error("cannot start %s: %s", path, strerror(saved));
        return -1;
    }
    kid->err_fd = pfd[0];
    kid->line_len = 0;
    kid->pid = pid;
    kid->running = true;
    if (kid->joined)
        say("started ps %d (pid %d) with --join at %s (--add-server)", kid->index, (int)pid,
            ta->join_addr);
    else if (kid->role == ROLE_CTL)
        say("started psctl add-server %s (pid %d)", ta->join_addr, (int)pid);
    else
        say("started %s %d (pid %d)", role_names[kid->role], kid->index, (int)pid);
    return 0;
}

/* The end of a run: what each worker did, in one line each and one for the cluster. */
static void summarize(const child *kids, int n, double wall_s, const char *added)
{
    long long steps = 0;
    double sps = 0.0, loss = 0.0;
    int workers = 0, results = 0;
    for (int i = 0; i < n; i++) {
        const child *c = &kids[i];
        if (c->role == ROLE_PS || c->role == ROLE_CTL)
            continue;
        /* Finished: exited 0, whether or not it wrote a result line ps-local understands. */
        if (!c->running && WIFEXITED(c->status) && WEXITSTATUS(c->status) == 0)
            workers++;
        if (c->has_result) {
            results++;
            steps += c->result_steps;
            sps += c->result_samples_per_s;
            loss += c->result_loss;
        } else if (c->has_step) {
            steps += c->step;
        }
    }
    char fields[512];
    int fl = snprintf(fields, sizeof(fields),
                      "\"summary\":true,\"workers_finished\":%d,\"steps\":%lld,\"wall_s\":%.3f,"
                      "\"samples_per_s\":%.1f,\"loss\":%.5f",
                      workers, steps, wall_s, sps, results > 0 ? loss / results : 0.0);
    if (added != NULL && fl > 0 && (size_t)fl < sizeof(fields))
        snprintf(fields + fl, sizeof(fields) - (size_t)fl, ",\"add_server\":\"%s\"", added);
    say_fields(fields,
               "summary: %d worker(s) finished, %lld steps in total, %.1f s, %.0f samples/s, "
               "final loss %.4f%s%s",
               workers, steps, wall_s, sps, results > 0 ? loss / results : 0.0,
               added != NULL ? "; add-server: " : "", added != NULL ? added : "");
}

int main(int argc, char **argv)
{
    human = isatty(STDERR_FILENO);
    if (program_wants_version(argc, argv)) {
        program_print_version(stdout, "ps-local");
        return 0;
    }
    launch_config lc = {0};
    int rc = load_config(&lc, argc, argv);
    if (rc < 0)
        rc = run(&lc);
    remove_ipc_dir();
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
    const char *python = NULL;
    const char *const *server_args = NULL;
    int n_server_args = (int)opt_list(o, OPT_LOCAL_SERVER_ARG, &server_args);
    if (opt_int(o, OPT_LOCAL_PRINT_PORTS) > 0)
        return print_ports(host, (int)opt_int(o, OPT_LOCAL_PRINT_PORTS));
    if (strlen(opt_str(o, OPT_LOCAL_SERVER)) >= sizeof(server_path) ||
        strlen(opt_str(o, OPT_LOCAL_WORKER)) >= sizeof(worker_path)) {
        say_error("--server or --worker: path longer than %d bytes", PATH_MAX - 1);
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
        say_error("too many worker arguments");
        return 2;
    }
    struct in_addr probe_addr;
    if (base_port == 0 && inet_pton(AF_INET, host, &probe_addr) != 1) {
        say_error("--host %s: probing ports needs an IPv4 address; give --base-port", host);
        return 2;
    }
    if (base_port != 0 && base_port + n_tasks - 1 > 65535) {
        say_error("--base-port %ld: not enough ports below 65536 for %d tasks", base_port, n_tasks);
        return 2;
    }
    if (server_path[0] == '\0')
        find_program("ps-server", "server", server_path, sizeof(server_path));
    if (worker_path[0] == '\0')
        find_program("ps-worker", "worker", worker_path, sizeof(worker_path));
    if (ends_with(worker_path, ".py")) {
        /* A script runs under the interpreter named (its #! line may find one without the
         * packages it needs), whether or not it is executable. */
        python = opt_str(o, OPT_LOCAL_PYTHON);
        if (access(worker_path, R_OK) != 0) {
            say_error("--worker %s: %s", worker_path, strerror(errno));
            return 2;
        }
        if (python[0] == '\0' || (strchr(python, '/') != NULL && !is_executable(python))) {
            say_error("--python '%s': not an executable file (the interpreter of --worker %s; "
                      "Debian: apt-get install python3)",
                      python, worker_path);
            return 2;
        }
        set_psd_library();
    }

    /* Replication, or a server added during the run: an etcd of our own on loopback (its 2
     * ports after the tasks'; the added server's after those). */
    long n_replicas = (long)opt_int(o, OPT_LOCAL_REPLICAS);
    bool add_server = opt_bool(o, OPT_LOCAL_ADD_SERVER);
    bool want_etcd = n_replicas > 1 || add_server;
    int n_etcd_ports = want_etcd ? 2 : 0, n_add_ports = add_server ? 1 : 0;
    char etcd_bin[PATH_MAX] = "", psctl_path[PATH_MAX] = "";
    if (add_server && n_replicas > 1) {
        say_error("--add-server needs --replicas 1: slots move between the servers of a cluster "
                  "without replica groups");
        return 2;
    }
    if (add_server && strcmp(opt_enum(o, OPT_LOCAL_TRANSPORT), "ipc") == 0) {
        say_error("--add-server needs --transport tcp: a server joins at a host:port address");
        return 2;
    }
    if (add_server) {
        if (strlen(opt_str(o, OPT_LOCAL_PSCTL)) >= sizeof(psctl_path)) {
            say_error("--psctl: path longer than %d bytes", PATH_MAX - 1);
            return 2;
        }
        snprintf(psctl_path, sizeof(psctl_path), "%s", opt_str(o, OPT_LOCAL_PSCTL));
        if (psctl_path[0] == '\0')
            find_program("psctl", "client", psctl_path, sizeof(psctl_path));
    }
    if (n_replicas > n_ps) {
        say_error("--replicas %ld: more than --ps %ld (each copy of a task's state needs its own "
                  "server)",
                  n_replicas, n_ps);
        return 2;
    }
    if (want_etcd && local_etcd_find(opt_str(o, OPT_LOCAL_ETCD), etcd_bin, sizeof(etcd_bin)) != 0) {
        char what[64];
        snprintf(what, sizeof(what), add_server ? "--add-server" : "--replicas %ld", n_replicas);
        say_error("%s needs etcd (the coordinator), found neither %s: install "
                  "Debian's etcd-server (deploy/setup.sh --etcd) or give --etcd PATH",
                  what,
                  opt_str(o, OPT_LOCAL_ETCD)[0] ? opt_str(o, OPT_LOCAL_ETCD)
                                                : "/usr/bin/etcd nor etcd in PATH");
        return 2;
    }
    int ports[MAX_TASKS * 2 + 3];
    int n_ports = n_tasks + n_etcd_ports + n_add_ports;
    if (base_port != 0) {
        if (base_port + n_ports - 1 > 65535) {
            say_error("--base-port %ld: not enough ports below 65536 for %d tasks and etcd",
                      base_port, n_tasks);
            return 2;
        }
        for (int k = 0; k < n_ports; k++)
            ports[k] = (int)base_port + k;
    } else if (probe_ports(host, n_ports, ports) != 0) {
        say_error("cannot find %d free ports on %s: %s", n_tasks, host, strerror(errno));
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
    /* Signals are taken synchronously in the loop below; caught from here on, before the
     * socket directory exists, so that SIGTERM, SIGINT and SIGHUP always remove it. */
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

    remove_stale_ipc_dirs();
    /* Workers never listen: their entries stay host:port whatever the transport. */
    const char *transport = opt_enum(o, OPT_LOCAL_TRANSPORT);
    bool ipc = strcmp(transport, "ipc") == 0; /* auto: tcp, the faster for training */
    if (ipc && make_ipc_dir((int)n_ps) != 0) {
        say_error("cannot create a directory for the ipc sockets: %s", strerror(errno));
        return 1;
    }
    fits = fits &&
           add_list(cluster, sizeof(cluster), &len, "ps", host, ps_ports, (int)n_ps, ipc, &first);
    fits = fits && add_list(cluster, sizeof(cluster), &len, "chief", host, chief_ports, n_chief,
                            false, &first);
    fits = fits && add_list(cluster, sizeof(cluster), &len, "worker", host, worker_ports,
                            n_plain_workers, false, &first);
    fits = fits && append(cluster, sizeof(cluster), &len, "}");
    if (!fits) {
        say_error("cluster spec too long");
        return 2;
    }

    say("cluster %s: %ld ps, %ld worker(s)%s; server %s, worker %s%s%s", cluster, n_ps, n_workers,
        chief ? " (worker 0 as chief)" : "", server_path, python != NULL ? python : "",
        python != NULL ? " " : "", worker_path);

    static local_etcd etcd;
    /* --logdir: the event files of every task under one directory, checked first. */
    const char *logdir = opt_str(o, OPT_LOCAL_LOGDIR);
    static char logdir_arg[PATH_MAX + 16], events_dir_arg[PATH_MAX + 16];
    if (logdir[0] != '\0') {
        char lerr[PATH_MAX + 256];
        if (strlen(logdir) >= PATH_MAX || event_dir_make(logdir, lerr, sizeof(lerr)) != 0) {
            say_error("--logdir: %s", strlen(logdir) >= PATH_MAX ? "path too long" : lerr);
            return 2;
        }
        snprintf(logdir_arg, sizeof(logdir_arg), "--logdir=%s", logdir);
        snprintf(events_dir_arg, sizeof(events_dir_arg), "--events-dir=%s", logdir);
    }
    const char **all_server_args = calloc((size_t)n_server_args + 4, sizeof(char *));
    static char replicas_arg[64], coordinator_arg[96], join_listen[128], join_addr[96];
    if (all_server_args == NULL) {
        say_error("out of memory");
        return 1;
    }
    int n_ours = 0;
    if (want_etcd) {
        char eerr[2048];
        if (local_etcd_start(&etcd, etcd_bin, ipc_parent(), ports[n_tasks], ports[n_tasks + 1],
                             eerr, sizeof(eerr)) != 0) {
            say_error("%s", eerr);
            free(all_server_args);
            return 1;
        }
        if (add_server)
            say("etcd %s (pid %d) at %s, data in %s, for --add-server", etcd_bin, (int)etcd.pid,
                etcd.endpoint, etcd.dir);
        else
            say("etcd %s (pid %d) at %s, data in %s, for --replicas %ld", etcd_bin, (int)etcd.pid,
                etcd.endpoint, etcd.dir, n_replicas);
        snprintf(coordinator_arg, sizeof(coordinator_arg), "--coordinator=%s", etcd.endpoint);
        all_server_args[n_ours++] = coordinator_arg;
        /* The workers' clients read the slot map (and views) there too. */
        setenv("PS_COORDINATOR", etcd.endpoint, 1);
    }
    if (n_replicas > 1) {
        snprintf(replicas_arg, sizeof(replicas_arg), "--replicas=%ld", n_replicas);
        all_server_args[n_ours++] = replicas_arg;
        /* The workers' clients know the cluster is replicated before any reply says so: a
         * first call to a server that died meanwhile follows its group to the new primary
         * instead of waiting its whole deadline on the dead one. */
        setenv("PS_REPLICAS", replicas_arg + strlen("--replicas="), 1);
    }
    if (add_server) {
        snprintf(join_addr, sizeof(join_addr), "%s:%d", host, ports[n_tasks + n_etcd_ports]);
        snprintf(join_listen, sizeof(join_listen), "--listen=tcp://%s", join_addr);
    }
    if (logdir[0] != '\0')
        all_server_args[n_ours++] = events_dir_arg;
    for (int j = 0; j < n_server_args; j++) /* the user's come last and win */
        all_server_args[j + n_ours] = server_args[j];
    server_args = all_server_args;
    n_server_args += n_ours;

    child kids[MAX_KIDS];
    int n_kids = 0;
    pid_t pgid = 0, self = getpid();
    char tf[16384 + 128];
    char **cargv = calloc((size_t)(n_worker_args + n_server_args + 12), sizeof(char *));
    if (cargv == NULL) {
        say_error("out of memory");
        local_etcd_stop(&etcd);
        free(all_server_args);
        return 1;
    }
    int exit_code = 0;
    bool failed = false;
    task_args ta = {.cluster = cluster,
                    .server_path = server_path,
                    .worker_path = worker_path,
                    .python = python,
                    .progress = python == NULL && is_ps_worker(worker_path) ? progress : NULL,
                    .logdir = python == NULL && is_ps_worker(worker_path) && logdir[0] != '\0'
                                  ? logdir_arg
                                  : NULL,
                    .server_args = server_args,
                    .n_server_args = n_server_args,
                    .worker_args = lc->rest,
                    .n_worker_args = n_worker_args,
                    .cargv = cargv,
                    .tf = tf,
                    .tf_cap = sizeof(tf),
                    .join_listen = join_listen,
                    .psctl_path = psctl_path,
                    .coordinator = etcd.endpoint,
                    .join_addr = join_addr};
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
        kids[n_kids] = (child){.role = role, .index = index, .err_fd = -1};
        if (start_task(&ta, &kids[n_kids], &pgid, self) != 0) {
            exit_code = 1;
            failed = true;
            break;
        }
        n_kids++;
    }

    double start = now_s();
    training_start = start;
    const bool restart = strcmp(opt_enum(o, OPT_LOCAL_RESTART), "on-failure") == 0;
    const int max_restarts = (int)opt_int(o, OPT_LOCAL_MAX_RESTARTS);
    int ps_gone = 0; /* servers that died and were not restarted (failed_over) */
    /* --add-server: the joined server once the time came, psctl once it serves. */
    const double add_after = (double)opt_int(o, OPT_LOCAL_ADD_SERVER_AFTER);
    int joined_kid = -1, ctl_kid = -1;
    char added[256] = "";
    while (!failed) {
        reap(kids, n_kids);
        drain_all(kids, n_kids); /* an exited child's last lines come before what follows */
        /* The cluster's servers publish the slot map before they serve: a server joins once
         * every one of them said it serves. */
        bool cluster_serves = true;
        for (int k = 0; k < n_kids; k++)
            if (kids[k].role == ROLE_PS && !kids[k].joined && !kids[k].serving)
                cluster_serves = false;
        if (add_server && joined_kid < 0 && cluster_serves && now_s() - start >= add_after) {
            kids[n_kids] =
                (child){.role = ROLE_PS, .index = (int)n_ps, .err_fd = -1, .joined = true};
            if (start_task(&ta, &kids[n_kids], &pgid, self) != 0) {
                exit_code = 1;
                break;
            }
            joined_kid = n_kids++;
        }
        if (joined_kid >= 0 && ctl_kid < 0 && kids[joined_kid].serving) {
            kids[n_kids] = (child){.role = ROLE_CTL, .index = 0, .err_fd = -1};
            if (start_task(&ta, &kids[n_kids], &pgid, self) != 0) {
                exit_code = 1;
                break;
            }
            ctl_kid = n_kids++;
        }
        /* Any failure, or a server ending before the workers, stops the cluster. */
        int workers_left = 0;
        for (int k = 0; k < n_kids; k++) {
            const child *c = &kids[k];
            if (c->role == ROLE_CTL) {
                if (c->running || added[0] != '\0' || failed)
                    continue;
                if (WIFEXITED(c->status) && WEXITSTATUS(c->status) == 0) {
                    snprintf(added, sizeof(added),
                             "ps %ld (%s) joined and psctl add-server gave it its share of the "
                             "slots",
                             n_ps, join_addr);
                    say("add-server: %s", added);
                    continue;
                }
                char what[256];
                describe(c, what, sizeof(what));
                say_error("%s: the server was not added; stopping the cluster", what);
                exit_code = 1;
                failed = true;
                continue;
            }
            if (c->role != ROLE_PS && c->running)
                workers_left++;
            if (c->running || failed || c->failed_over)
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
                /* Replicated: every task's state has n_replicas copies on distinct servers
                 * (ring order), so fewer than n_replicas dead servers leave each group a copy
                 * that takes over; the workers follow it. Not a reason to stop. */
                if (c->role == ROLE_PS && n_replicas > 1 && ps_gone + 1 < n_replicas &&
                    !got_signal) {
                    kids[k].failed_over = true;
                    ps_gone++;
                    say("%s; its replica groups fail over to their other copies (--replicas "
                        "%ld): training goes on with %ld of %ld servers",
                        what, n_replicas, n_ps - ps_gone, n_ps);
                    continue;
                }
                say_error("%s; stopping the cluster", what);
                if (c->role != ROLE_PS && c->index == 0)
                    say_error("worker 0, the evaluator, died: no evaluation of the model was made");
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
            say_error("timed out after %ld s; stopping the cluster", timeout_s);
            exit_code = 124;
            failed = true;
            break;
        }
        wait_events(kids, n_kids, 0.2);
    }
    stop_all(kids, n_kids, pgid, (double)grace_ms / 1000.0);
    if (!failed) {
        /* Servers stopped on our SIGTERM: exit codes 0 or 128+15 are the expected ones. */
        for (int k = 0; k < n_kids; k++) {
            const child *c = &kids[k];
            if (c->role != ROLE_PS || c->failed_over)
                continue;
            bool expected = (WIFEXITED(c->status) && WEXITSTATUS(c->status) == 0) ||
                            (WIFSIGNALED(c->status) && WTERMSIG(c->status) == SIGTERM);
            if (!expected) {
                char what[256];
                describe(c, what, sizeof(what));
                say_error("%s while stopping", what);
            }
        }
    }
    local_etcd_stop(&etcd); /* after the servers: they revoke their leases as they stop */
    free(cargv);
    free(all_server_args);
    summarize(kids, n_kids, now_s() - start,
              !add_server        ? NULL
              : added[0] != '\0' ? added
                                 : "no server added (the run ended before psctl add-server did)");
    say("%s (exit code %d)", exit_code == 0 ? "training succeeded" : "training failed", exit_code);
    return exit_code;
}
