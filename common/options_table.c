/* options_table.c - every setting of every program, in one table.
 *
 * Add a row here and the flag, environment variable, config-file key,
 * --help line and README entry all exist. Names are [a-z0-9-]; keep rows of
 * one subsystem together. options_table_validate() (run by the unit tests)
 * checks that every default parses and lies within its bounds.
 */
#include "options.h"

#define KiB 1024.0
#define MiB (1024.0 * KiB)
#define GiB (1024.0 * MiB)
#define TiB (1024.0 * GiB)

#define S OPT_SCOPE_SERVER
#define W OPT_SCOPE_WORKER
#define C OPT_SCOPE_CLIENT
#define T OPT_SCOPE_TOOL

/* The client library reads the C options, and ps-worker is a client, so every
 * C row also carries W. */
const option_def options_table[] = {
    /* ---- general (every program) ---- */
    {.name = "config",
     .type = OPT_STRING,
     .scope = S | W | C | T,
     .defval = "",
     .env = "PS_CONFIG",
     .help = "JSON config file: an object of option names to values."},
    {.name = "log-level",
     .type = OPT_ENUM,
     .scope = S | W | C | T,
     .defval = "info",
     .choices = "debug|info|warn|error",
     .help = "Lowest level of log lines written to stderr."},
    {.name = "log-format",
     .type = OPT_ENUM,
     .scope = S | W | C | T,
     .defval = "auto",
     .choices = "auto|json|text",
     .help = "Log line format; auto is text on a terminal, JSON lines otherwise."},

    /* ---- cluster ---- */
    {.name = "cluster",
     .type = OPT_STRING,
     .scope = S | W | C | T,
     .defval = "",
     .help = "Cluster spec as TF_CONFIG-style JSON text, or @path to a JSON file; "
             "takes precedence over TF_CONFIG."},
    {.name = "task",
     .type = OPT_STRING,
     .scope = S | W | T,
     .defval = "",
     .help = "Own task as type:index, e.g. ps:0 or worker:1; overrides the task in the "
             "cluster spec."},
    {.name = "tf-config",
     .type = OPT_STRING,
     .scope = S | W | C | T,
     .defval = "",
     .env = "TF_CONFIG",
     .help = "The standard TF_CONFIG JSON (cluster and task), as set by Kubeflow's TFJob."},

    /* ---- limits shared by server and client ---- */
    {.name = "max-message-bytes",
     .type = OPT_SIZE,
     .scope = S | W | C | T,
     .defval = "64M",
     .min = 4 * KiB,
     .max = 2 * GiB,
     .help = "Largest request or reply accepted; larger ones get RESOURCE_EXHAUSTED."},

    /* ---- ps-server ---- */
    {.name = "listen",
     .type = OPT_STRING,
     .scope = S,
     .defval = "",
     .help = "nng URL to listen on instead of the task's own cluster address, e.g. "
             "tcp://0.0.0.0:2222."},
    {.name = "threads",
     .type = OPT_INT,
     .scope = S,
     .defval = "2",
     .min = 1,
     .max = 256,
     .help = "Worker threads applying updates off nng's callback threads."},
    {.name = "rpc-contexts",
     .type = OPT_INT,
     .scope = S,
     .defval = "64",
     .min = 1,
     .max = 4096,
     .help = "Concurrent requests a server has in progress."},
    {.name = "inline-max-bytes",
     .type = OPT_SIZE,
     .scope = S,
     .defval = "64K",
     .min = 0,
     .max = 1 * GiB,
     .help = "Requests up to this size are handled on the I/O callback (latency); larger "
             "ones go to the worker threads."},
    {.name = "default-deadline-ms",
     .type = OPT_INT,
     .scope = S,
     .defval = "30000",
     .min = 1,
     .max = 3600000,
     .help = "Deadline for requests that carry none."},
    {.name = "dedup-window",
     .type = OPT_INT,
     .scope = S,
     .defval = "4096",
     .min = 64,
     .max = 1048576,
     .help = "Per-client window of sequence numbers remembered for exactly-once pushes."},
    {.name = "shutdown-grace-ms",
     .type = OPT_INT,
     .scope = S,
     .defval = "2000",
     .min = 0,
     .max = 600000,
     .help = "Time given to requests in progress to finish at shutdown."},

    /* ---- client library (and so ps-worker and tools) ---- */
    {.name = "deadline-ms",
     .type = OPT_INT,
     .scope = C | W | T,
     .defval = "30000",
     .min = 1,
     .max = 3600000,
     .help = "Deadline of each client call."},
    {.name = "retries",
     .type = OPT_INT,
     .scope = C | W | T,
     .defval = "5",
     .min = 0,
     .max = 100,
     .help = "Retries on UNAVAILABLE, with exponential backoff."},
    {.name = "retry-backoff-ms",
     .type = OPT_INT,
     .scope = C | W | T,
     .defval = "50",
     .min = 1,
     .max = 60000,
     .help = "First retry backoff; it doubles on each retry."},
    {.name = "resend-ms",
     .type = OPT_INT,
     .scope = C | W | T,
     .defval = "2000",
     .min = 10,
     .max = 3600000,
     .help = "nng REQ resend interval (at-least-once transport)."},
    {.name = "connections",
     .type = OPT_INT,
     .scope = C | W | T,
     .defval = "4",
     .min = 1,
     .max = 64,
     .help = "TCP connections per server."},
    {.name = "chunk-bytes",
     .type = OPT_SIZE,
     .scope = C | W | T,
     .defval = "1M",
     .min = 4 * KiB,
     .max = 1 * GiB,
     .help = "Tensors larger than this are sent as pipelined chunks."},
    {.name = "split-threshold-bytes",
     .type = OPT_SIZE,
     .scope = C | W | T,
     .defval = "1M",
     .min = 0,
     .max = 1 * TiB,
     .help = "Variables at least this large are split in ranges over all servers; smaller "
             "ones live whole on one server."},
    {.name = "worker-id",
     .type = OPT_INT,
     .scope = C | W | T,
     .defval = "-1",
     .min = -1,
     .max = 1000000,
     .help = "Task index the client reports; -1 takes it from the task."},

    /* ---- ps-worker ---- */
    /* (worker flags go here) */
};

const size_t options_table_len = sizeof options_table / sizeof options_table[0];
