/* A program's start (program.h): options from flags, environment and config file, the cluster
 * spec, logging, and the usage and error exits every binary shares. */
#include "program.h"

#include <stdio.h>
#include <string.h>

#include "frame.h"
#include "log.h"

#ifndef PSD_FEATURES
#define PSD_FEATURES "unknown"
#endif

const char *program_name(const char *argv0)
{
    if (argv0 == NULL || argv0[0] == '\0')
        return "?";
    const char *slash = strrchr(argv0, '/');
    return slash != NULL && slash[1] != '\0' ? slash + 1 : argv0;
}

void program_print_version(FILE *out, const char *name)
{
    fprintf(out, "%s %s\nprotocol %d.%d\nfeatures: %s\n", name, PSD_VERSION, FRAME_VERSION_MAJOR,
            FRAME_VERSION_MINOR, PSD_FEATURES);
    fflush(out);
}

bool program_wants_version(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--") == 0)
            return false;
        if (strcmp(argv[i], "--version") == 0)
            return true;
    }
    return false;
}

int program_start(program *p, int argc, char **argv, unsigned scope, const char *role,
                  const char *usage, bool need_cluster, bool *exit_now)
{
    char err[512];
    const char *name = program_name(argv[0]);
    memset(p, 0, sizeof(*p));
    *exit_now = true;
    if (program_wants_version(argc, argv)) {
        program_print_version(stdout, name);
        return 0;
    }
    if (options_create(&p->opts, scope) != 0) {
        fprintf(stderr, "%s: out of memory\n", name);
        return 1;
    }
    p->npositional = 0;
    int rc = options_load(p->opts, argc, argv, argc <= 64 ? p->positional : NULL,
                          argc <= 64 ? &p->npositional : NULL, err, sizeof(err));
    if (rc == OPTIONS_HELP) {
        options_print_help(stdout, name, usage, scope);
        program_end(p);
        return 0;
    }
    if (rc != 0) {
        fprintf(stderr, "%s: %s (see --help)\n", name, err);
        program_end(p);
        return PROGRAM_EXIT_CONFIG;
    }
    log_level lvl = LOG_INFO;
    log_format fmt = LOG_FORMAT_AUTO;
    log_level_parse(opt_enum(p->opts, OPT_LOG_LEVEL), &lvl);
    log_format_parse(opt_enum(p->opts, OPT_LOG_FORMAT), &fmt);
    if (need_cluster) {
        if (cluster_from_options(p->opts, &p->cluster, err, sizeof(err)) != 0) {
            log_init(role, -1, lvl, fmt);
            log_error("bad cluster spec: %s", err);
            program_end(p);
            return PROGRAM_EXIT_CONFIG;
        }
        p->has_cluster = true;
    }
    log_init(role, p->has_cluster ? p->cluster.task_index : -1, lvl, fmt);
    *exit_now = false;
    return 0;
}

void program_end(program *p)
{
    if (p->has_cluster)
        cluster_fini(&p->cluster);
    options_destroy(p->opts);
    memset(p, 0, sizeof(*p));
}
