/* Child processes of ps-bench (servers, the raw baseline server, allocator variants): started
 * with PR_SET_PDEATHSIG so that none outlives the bench, registered so that every exit path
 * (normal end, error, signal, the run's alarm) kills and reaps them. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"

extern char **environ;

#define MAX_CHILDREN 64

static volatile pid_t children[MAX_CHILDREN];

static void register_child(pid_t pid)
{
    for (int i = 0; i < MAX_CHILDREN; i++) {
        if (children[i] == 0) {
            children[i] = pid;
            return;
        }
    }
}

static void unregister_child(pid_t pid)
{
    for (int i = 0; i < MAX_CHILDREN; i++)
        if (children[i] == pid)
            children[i] = 0;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* Environment for the child: ours, minus the names `extra` sets, plus `extra`. Built before
 * fork so that the child only calls async-signal-safe functions. */
static char **make_env(char *const extra[])
{
    size_t n = 0, m = 0;
    while (environ[n])
        n++;
    while (extra && extra[m])
        m++;
    char **env = calloc(n + m + 1, sizeof(char *));
    if (env == NULL)
        return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        bool overridden = false;
        for (size_t j = 0; j < m; j++) {
            const char *eq = strchr(extra[j], '=');
            size_t len = eq ? (size_t)(eq - extra[j]) : strlen(extra[j]);
            if (strncmp(environ[i], extra[j], len) == 0 && environ[i][len] == '=')
                overridden = true;
        }
        if (!overridden)
            env[k++] = environ[i];
    }
    for (size_t j = 0; j < m; j++)
        env[k++] = extra[j];
    env[k] = NULL;
    return env;
}

pid_t child_start(char *const argv[], char *const env[], int *out_fd)
{
    char **envp = make_env(env);
    if (envp == NULL) {
        fprintf(stderr, "ps-bench: out of memory\n");
        return -1;
    }
    int pfd[2] = {-1, -1};
    if (out_fd && pipe2(pfd, O_CLOEXEC) != 0) {
        fprintf(stderr, "ps-bench: pipe: %s\n", strerror(errno));
        free(envp);
        return -1;
    }
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "ps-bench: fork: %s\n", strerror(errno));
        free(envp);
        if (out_fd) {
            close(pfd[0]);
            close(pfd[1]);
        }
        return -1;
    }
    if (pid == 0) {
        /* Die with the bench, whatever way it ends; and if it is already gone, go now. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(127);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        if (out_fd)
            dup2(pfd[1], STDOUT_FILENO);
        execve(argv[0], argv, envp);
        static const char msg[] = "ps-bench: cannot execute child program\n";
        ssize_t w = write(STDERR_FILENO, msg, sizeof(msg) - 1);
        (void)w;
        _exit(127);
    }
    free(envp);
    register_child(pid);
    if (out_fd) {
        close(pfd[1]);
        *out_fd = pfd[0];
    }
    return pid;
}

static int reap(pid_t pid, int timeout_ms)
{
    int st;
    for (int waited = 0;; waited += 5) {
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid) {
            unregister_child(pid);
            return st;
        }
        if (r < 0) {
            unregister_child(pid);
            return -1;
        }
        if (waited >= timeout_ms)
            return -2;
        sleep_ms(5);
    }
}

int child_stop(pid_t pid, int grace_ms)
{
    if (pid <= 0)
        return -1;
    kill(pid, SIGTERM);
    int st = reap(pid, grace_ms);
    if (st == -2) {
        kill(pid, SIGKILL);
        st = reap(pid, 5000);
    }
    return st;
}

int child_wait(pid_t pid, int timeout_ms)
{
    int st = reap(pid, timeout_ms);
    if (st == -2) {
        fprintf(stderr, "ps-bench: child %d still running after %d ms: killed\n", (int)pid,
                timeout_ms);
        kill(pid, SIGKILL);
        reap(pid, 5000);
        return -1;
    }
    if (st < 0)
        return -1;
    if (WIFEXITED(st))
        return WEXITSTATUS(st);
    if (WIFSIGNALED(st))
        return 128 + WTERMSIG(st);
    return -1;
}

void children_kill_all(void)
{
    for (int i = 0; i < MAX_CHILDREN; i++) {
        pid_t pid = children[i];
        if (pid > 0)
            child_stop(pid, 2000);
    }
}

static void on_fatal_signal(int sig)
{
    /* Only async-signal-safe calls: SIGKILL every child, then leave. */
    for (int i = 0; i < MAX_CHILDREN; i++)
        if (children[i] > 0)
            kill(children[i], SIGKILL);
    static const char msg[] = "ps-bench: interrupted or out of time: children killed\n";
    ssize_t w = write(STDERR_FILENO, msg, sizeof(msg) - 1);
    (void)w;
    _exit(128 + sig);
}

void children_install_guard(unsigned timeout_s)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_fatal_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    sigaction(SIGALRM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    atexit(children_kill_all);
    if (timeout_s)
        alarm(timeout_s);
}

int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in a;
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    socklen_t len = sizeof(a);
    int port = -1;
    if (bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

int wait_port(int port, pid_t child, int timeout_ms)
{
    struct sockaddr_in a;
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons((uint16_t)port);
    for (int waited = 0; waited <= timeout_ms; waited += 10) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
            return -1;
        int rc = connect(fd, (struct sockaddr *)&a, sizeof(a));
        close(fd);
        if (rc == 0)
            return 0;
        int st;
        if (waitpid(child, &st, WNOHANG) == child) {
            unregister_child(child);
            fprintf(stderr, "ps-bench: child %d exited (status %d) before listening on %d\n",
                    (int)child, st, port);
            return -1;
        }
        sleep_ms(10);
    }
    fprintf(stderr, "ps-bench: nothing listens on 127.0.0.1:%d after %d ms\n", port, timeout_ms);
    return -1;
}
