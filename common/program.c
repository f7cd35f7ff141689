#include "program.h"

#include <stdio.h>
#include <string.h>

#include "log.h"

int program_start(program *p, int argc, char **argv, unsigned scope, const char *role,
                  const char *usage, bool need_cluster, bool *exit_now)
{
    char err[512];
    memset(p, 0, sizeof(*p));
    *exit_now = true;
    if (options_create(&p->opts, scope) != 0) {
        fprintf(stderr, "%s: out of memory\n", argv[0]);
        return 1;
    }
    p->npositional = 0;
    int rc = options_load(p->opts, argc, argv, argc <= 64 ? p->positional : NULL,
                          argc <= 64 ? &p->npositional : NULL, err, sizeof(err));
    if (rc == OPTIONS_HELP) {
        options_print_help(stdout, argv[0], usage, scope);
        program_end(p);
        return 0;
    }
    if (rc != 0) {
        fprintf(stderr, "%s: %s (see --help)\n", argv[0], err);
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
