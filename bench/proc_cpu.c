/* CPU time of a process by pid (proc_cpu.h). */
#include "proc_cpu.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

double proc_cpu_s(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return 0;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    /* After "pid (comm) " (comm may hold spaces and parentheses): state ppid pgrp session
     * tty_nr tpgid flags minflt cminflt majflt cmajflt utime stime. */
    const char *p = strrchr(buf, ')');
    unsigned long long ut, st;
    if (p == NULL ||
        sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
        return 0;
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}
