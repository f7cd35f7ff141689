/* CPU time of a process (any of this machine's, by pid), for the benches that count what their
 * server processes spend beside their own wall times. */
#ifndef PSD_BENCH_PROC_CPU_H
#define PSD_BENCH_PROC_CPU_H

#include <sys/types.h>

/* CPU seconds (user and system, all its threads) process pid used so far, from /proc/PID/stat;
 * 0 if unreadable. */
double proc_cpu_s(pid_t pid);

#endif
