/* Start-up shared by the executables: settings from the one option table (file, environment,
 * flags), --help, logging, and the cluster spec. */
#ifndef PSD_COMMON_PROGRAM_H
#define PSD_COMMON_PROGRAM_H

#include <stdbool.h>
#include <stdio.h>

#include "cluster.h"
#include "options.h"

/* Exit code of a program given a bad configuration (wrong flag, bad cluster spec). */
#define PROGRAM_EXIT_CONFIG 2

typedef struct program {
    options *opts;
    cluster_spec cluster;
    bool has_cluster;
    const char *positional[64];
    int npositional;
} program;

/* Loads settings of `scope` from argv, initialises logging for `role`, and, if need_cluster,
 * parses the cluster spec (TF_CONFIG or --cluster/--task). On --help (or --version) prints
 * the help (the version) and returns 0 with *exit_now set; on a bad setting or spec logs what is
 * wrong and returns PROGRAM_EXIT_CONFIG with *exit_now set (nothing is left to free then).
 * Otherwise returns 0, *exit_now false, and the caller ends with program_end. */
int program_start(program *p, int argc, char **argv, unsigned scope, const char *role,
                  const char *usage, bool need_cluster, bool *exit_now);

/* Frees what program_start made. */
void program_end(program *p);

/* The program's name for messages: the last component of argv0 ("ps-server", not
 * "build/server/ps-server"). */
const char *program_name(const char *argv0);

/* Prints "NAME VERSION", the wire protocol version and the build's optional features (CUDA,
 * jemalloc, OpenBLAS) to out. */
void program_print_version(FILE *out, const char *name);

/* True if argv has --version before any "--" (program_start handles it; programs that parse
 * their own flags call this first and then program_print_version). */
bool program_wants_version(int argc, char **argv);

#endif
