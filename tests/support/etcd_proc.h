/* etcd_proc.h - a throwaway etcd server for tests: its own data directory under /tmp, free
 * loopback ports, killed and removed by etcd_proc_stop. */
#ifndef PSD_TEST_ETCD_PROC_H
#define PSD_TEST_ETCD_PROC_H

#include <stdbool.h>
#include <sys/types.h>

typedef struct etcd_proc {
    pid_t pid;
    int client_port, peer_port;
    char dir[128];     /* data directory and log */
    char endpoint[64]; /* http://127.0.0.1:<client_port> */
} etcd_proc;

/* The etcd binary ($PSD_ETCD, else /usr/bin/etcd, else etcd on PATH), or NULL when there is
 * none: tests then exit 77 (skipped) saying so. */
const char *etcd_proc_binary(void);
/* Starts etcd and waits (up to 15 s) until it answers; 0 or -1 (message on stderr). */
int etcd_proc_start(etcd_proc *e);
/* SIGKILLs etcd (the data directory stays: etcd_proc_restart brings it back). */
void etcd_proc_kill(etcd_proc *e);
/* Starts etcd again on the same ports and data directory. */
int etcd_proc_restart(etcd_proc *e);
/* Kills etcd and removes its directory. */
void etcd_proc_stop(etcd_proc *e);

#endif
