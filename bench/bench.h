/* Internals of ps-bench shared by its files: child processes, timing and statistics, the raw nng
 * baseline and the parameter-server cells. Not installed. */
#ifndef PSD_BENCH_BENCH_H
#define PSD_BENCH_BENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <psclient.h>

/* ---- time and statistics ------------------------------------------------------------------ */

uint64_t bench_now_ns(void);

/* Latencies of one cell, in nanoseconds; grows as needed. */
typedef struct samples {
    double *v;
    size_t n, cap;
} samples;

void samples_add(samples *s, double ns);
void samples_free(samples *s);
/* Nearest-rank percentile (0 < p <= 100) in microseconds; sorts s in place. 0 if empty. */
double samples_pct_us(samples *s, double p);

/* What one cell measured. gbps counts tensor payload bytes (1e9 bytes per GB); push-pull counts
 * both directions (the gradient sent and the parameters received). */
typedef struct cell_result {
    bool ran;
    int errors;   /* failed operations (the cell then reports no figures) */
    uint64_t ops; /* timed operations */
    double seconds;
    double gbps;
    double p50_us, p99_us;
    double client_faults, server_faults; /* minor page faults per operation */
    double other_cpu; /* share of the machine's CPU time other programs used during the cell */
    double client_cpu_us, server_cpu_us; /* CPU time per operation (client, servers) */
} cell_result;

/* Before each cell, wait up to this many seconds for other programs to quiet down. */
extern double idle_wait_s;
/* Trials per cell; a cell reports its best trial. */
extern int cell_trials;

/* Experiment (--window): tensors larger than window_bytes are moved as successive range
 * operations of window_bytes with at most window_ops in flight (0: off, one library call). */
extern size_t window_ops, window_bytes;

/* Server processes whose page faults the following cells count (n = 0: none). */
void faults_watch(const pid_t *pids, int n);

/* Busy and total CPU seconds of the whole machine since boot, from /proc/stat (0 if unreadable). */
void machine_cpu(double *busy_s, double *total_s);

void cell_print(const char *label, int nservers, size_t bytes, const cell_result *r);

/* ---- child processes ---------------------------------------------------------------------- */

/* Starts argv[0] (a path) with argv and the extra environment entries env ("NAME=value", NULL
 * terminated; NULL for none) added to this process's environment. The child dies with SIGKILL
 * when this process dies (PR_SET_PDEATHSIG). If out_fd is not NULL the child's stdout is a pipe
 * whose read end is returned there. Returns the pid, or -1 with a message on stderr. The pid is
 * registered so that children_kill_all() reaps it. */
pid_t child_start(char *const argv[], char *const env[], int *out_fd);

/* Sends SIGTERM to one child, waits up to grace_ms, then SIGKILL; reaps it. Returns its exit
 * status as from waitpid, or -1. */
int child_stop(pid_t pid, int grace_ms);

/* Waits up to timeout_ms for a child to exit by itself; SIGKILL after that. Returns the exit
 * code (0..255), 128 + signal, or -1. */
int child_wait(pid_t pid, int timeout_ms);

/* Kills and reaps every child still registered. Safe to call more than once. */
void children_kill_all(void);

/* Installs handlers so that SIGINT, SIGTERM, SIGHUP and SIGALRM kill every child and exit, and
 * arms alarm(timeout_s) as the whole run's deadline (0: none). */
void children_install_guard(unsigned timeout_s);

/* A free TCP port on 127.0.0.1 (bound, read, released), or -1. */
int free_port(void);

/* Waits until 127.0.0.1:port accepts a TCP connection, or the child exits, or timeout_ms
 * passes. Returns 0 when it accepts. */
int wait_port(int port, pid_t child, int timeout_ms);

/* ---- raw nng baseline --------------------------------------------------------------------- */

/* --raw-server URL: a REP socket that answers every request with 8 bytes. Runs until killed.
 * Returns an exit code. */
int raw_server_main(const char *url);

/* One cell of the baseline: one REQ socket to url, one request in flight, the whole tensor of
 * `bytes` copied from a user buffer into one nng_msg, an 8-byte reply. */
cell_result raw_cell(const char *url, size_t bytes, double seconds, double warmup_s);

/* false: skip the copy into the message (exploration of the transport alone). */
extern bool raw_copy;

/* ---- parameter-server cells --------------------------------------------------------------- */

enum ps_op_kind { OPK_PUSH, OPK_PULL, OPK_PUSH_PULL, OPK_COUNT };
extern const char *const op_kind_names[OPK_COUNT];

/* Tensor of one size in the cluster: a float32 vector with SGD at learning rate 1, initialised
 * to zeros, so that after n pushes of the constant gradient BENCH_GRAD every element is exactly
 * -n * BENCH_GRAD (float arithmetic on multiples of a power of two). */
#define BENCH_GRAD (1.0f / 1024.0f)

typedef struct bench_var {
    ps_var *var;
    size_t bytes;
    uint64_t pushes; /* pushes and push-pulls applied so far, by this process */
    float *grad;     /* numel floats of BENCH_GRAD */
    float *dst;      /* numel floats */
} bench_var;

/* Creates (or finds) the variable "bench/<tag>/<bytes>" and its buffers. Returns 0 or -1. */
int bench_var_open(ps_client *c, bench_var *bv, const char *tag, size_t bytes);
/* Finds the same variable through another client, keeping buffers and push count. */
int bench_var_rebind(ps_client *c, bench_var *bv, const char *tag);
void bench_var_close(bench_var *bv);

/* Times one operation on bv: warm-up, then as many operations as fit in `seconds` (at least
 * 3). Keeps bv->pushes up to date. With check, every pulled tensor is compared with what the
 * pushes so far must have produced (costs a pass over it: for smoke tests). */
cell_result ps_cell(ps_client *c, bench_var *bv, enum ps_op_kind k, double seconds, double warmup_s,
                    bool check);

/* Pulls bv and checks every element is -pushes * BENCH_GRAD. Returns 0, or -1 with a message
 * on stderr. */
int bench_var_verify(ps_client *c, bench_var *bv);

#endif
