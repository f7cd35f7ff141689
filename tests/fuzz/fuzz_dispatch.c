/* libFuzzer harness: the ps-server's method dispatch on a real store. Each input runs through
 * rpc_server_handle_bytes (common/rpc_server.h: the generic checks of the RPC layer, then the
 * handler of server/methods.c, no socket) against one server_state (store, dedup table, sync
 * state) built once with a few variables (async, BSP, SSP, Adam).
 *
 * Two modes, by the input's first byte:
 *   'P' (the frame magic): the whole input is a request frame, as received from a socket;
 *   else (structured):     byte 0 picks a method of server_methods, byte 1 holds flags, bytes
 *                          2..7 envelope fields, the rest is the method's body; the harness
 *                          frames it (with a segment when asked), so the fuzzer reaches the
 *                          handlers past the frame checks. With bit 7 of byte 0 set (a
 *                          burst), the request goes out as BURST clients in turn (client
 *                          bytes p[7], p[7]+1, ...), then again as each of them: far more
 *                          clients than the dedup table holds (DEDUP_CLIENTS), so the second
 *                          round meets evicted clients, tombstones and hashed floors.
 * Invariants: no crash (ASan/UBSan), and every reply parses as a frame that is a reply, with a
 * known status and a valid UTF-8 message (not empty on errors); when the request's frame
 * parses, the reply echoes its id and method, and in structured mode an OK reply of a method
 * with RPC_REPLY_RANGE carries the requested range and no (client, seq) of a Push or PushPull
 * is ever applied twice (an OK reply that is not a duplicate), over the whole run. Build with
 * -Dfuzz=true; tests/fuzz/run.sh runs it. */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nng/nng.h>

#include "frame.h"
#include "log.h"
#include "methods.h"
#include "rpc_server.h"
#include "server.h"
#include "status.h"
#include "table_bsp.h"
#include "timeutil.h"
#include "util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define ADMIN_TOKEN "fuzz-admin-token"
#define MAX_MESSAGE (1u << 20)
#define MAX_SEGMENT 256 /* elements of a structured mode segment */
#define DEDUP_CLIENTS 8 /* dedup-max-clients of the harness: evictions are frequent */
#define BURST 48        /* clients of a burst */

static server_state st;
static rpc_server *srv;
static bool verbose; /* FUZZ_DISPATCH_VERBOSE set: each reply's method, status and message */
/* Structured mode: (client byte, seq) of the Push and PushPull requests applied so far. */
static uint8_t applied[256][256 / 8];

/* Structured mode, byte 1. */
enum {
    F_TENSOR = 1u << 0,  /* Envelope.tensor (FLOAT32, offset, count) */
    F_SEGMENT = 1u << 1, /* a segment of count elements, from the input's bytes */
    F_ADMIN = 1u << 2,   /* the admin token (else none, or a wrong one with F_WRONG) */
    F_WRONG = 1u << 3,   /* a wrong admin token */
    F_WORKER = 1u << 4,  /* worker_id = byte 4 (else -1) */
    F_DTYPE = 1u << 5,   /* tensor dtype = byte 5 (else FLOAT32) */
    F_UNKNOWN = 1u << 6, /* method number = byte 0 itself (mostly unknown methods) */
    F_BIGCNT = 1u << 7,  /* count = byte 3 << 56 | byte 3 (overflowing ranges) */
};

static void fail(const char *what)
{
    log_msg(LOG_ERROR, "fuzz_dispatch invariant broken: %s", what);
    abort();
}

/* Checks one reply against the invariants; req_env is the request's envelope when known. */
static void check_reply(const void *reply, size_t len, const envelope *req_env, const rpc_method *m,
                        bool *push_applied)
{
    nng_msg *msg;
    if (nng_msg_alloc(&msg, len) != 0)
        return;
    memcpy(nng_msg_body(msg), reply, len);
    frame f;
    memset(&f, 0, sizeof(f));
    char err[256];
    if (frame_parse(msg, &f, err, sizeof(err)) != STATUS_OK)
        fail("reply does not parse as a frame");
    const envelope *env = f.env;
    if (!env->is_reply)
        fail("reply without is_reply");
    if (env->status < 0 || env->status >= STATUS_COUNT)
        fail("reply status out of range");
    const char *mess = env->message ? env->message : "";
    if (verbose)
        fprintf(stderr, "fuzz_dispatch: method %d: %s %s\n", (int)env->method,
                status_name(env->status), mess);
    if (!utf8_text_ok(mess, strlen(mess), NULL))
        fail("reply message is not valid UTF-8");
    if (env->status != STATUS_OK && mess[0] == '\0')
        fail("error reply without a message");
    if (env->status == STATUS_OK && f.has_segment && env->tensor == NULL)
        fail("segment without a tensor range");
    if (req_env) {
        if (env->request_id != req_env->request_id || env->method != req_env->method)
            fail("reply does not echo the request's id and method");
        if (env->status == STATUS_OK && m && (m->flags & RPC_REPLY_RANGE)) {
            if (env->tensor == NULL || req_env->tensor == NULL ||
                env->tensor->offset != req_env->tensor->offset ||
                env->tensor->count != req_env->tensor->count ||
                env->tensor->dtype != req_env->tensor->dtype ||
                f.segment_len != (size_t)env->tensor->count * frame_dtype_size(env->tensor->dtype))
                fail("OK reply of a ranged method without the requested range");
        }
        if (env->status == STATUS_OK &&
            (env->method == PSD__V1__METHOD__PUSH || env->method == PSD__V1__METHOD__PUSH_PULL)) {
            Psd__V1__PushReply *r =
                psd__v1__push_reply__unpack(NULL, env->body.len, env->body.data);
            if (r == NULL)
                fail("OK push reply without a PushReply body");
            *push_applied = !r->duplicate;
            psd__v1__push_reply__free_unpacked(r, NULL);
        }
    }
    frame_fini(&f);
    nng_msg_free(msg);
}

/* Runs one request message; the request's envelope, when its frame parses (as the server's
 * first check does), says what the reply must echo. */
static bool run(const void *req, size_t len, const rpc_method *m)
{
    bool push_applied = false;
    nng_msg *msg;
    if (nng_msg_alloc(&msg, len) != 0)
        return false;
    if (len)
        memcpy(nng_msg_body(msg), req, len);
    frame f;
    memset(&f, 0, sizeof(f));
    char err[256];
    bool parsed = len <= MAX_MESSAGE && frame_parse(msg, &f, err, sizeof(err)) == STATUS_OK;
    void *reply;
    size_t n;
    if (rpc_server_handle_bytes(srv, req, len, &reply, &n) == 0) {
        check_reply(reply, n, parsed ? f.env : NULL, m, &push_applied);
        free(reply);
    } /* else out of memory */
    if (parsed)
        frame_fini(&f);
    nng_msg_free(msg);
    return push_applied;
}

/* Sends a CreateVariable for the harness's fixed variables; they must be created. */
static void create(const char *name, uint64_t numel, Psd__V1__Optimizer opt, int32_t staleness)
{
    Psd__V1__VariableSpec sp = PSD__V1__VARIABLE_SPEC__INIT;
    sp.name = (char *)name;
    sp.dtype = PSD__V1__DTYPE__FLOAT32;
    sp.n_shape = 1;
    sp.shape = &numel;
    sp.optimizer = opt;
    sp.learning_rate = 0.1;
    sp.beta1 = 0.9;
    sp.beta2 = 0.999;
    sp.epsilon = 1e-8;
    sp.staleness = staleness;
    sp.num_servers = 1;
    Psd__V1__CreateVariableRequest cr = PSD__V1__CREATE_VARIABLE_REQUEST__INIT;
    cr.spec = &sp;
    uint8_t body[512];
    envelope env = PSD__V1__ENVELOPE__INIT;
    env.method = PSD__V1__METHOD__CREATE_VARIABLE;
    env.request_id = 1;
    env.body.data = body;
    env.body.len = psd__v1__create_variable_request__pack(&cr, body);
    nng_msg *msg;
    if (frame_build(&msg, &env, NULL, 0, NULL) != 0)
        abort();
    run(nng_msg_body(msg), nng_msg_len(msg), NULL);
    nng_msg_free(msg);
    variable *v = store_find(st.vars, name); /* a reference: released at once */
    if (v == NULL)
        abort();
    variable_release(v);
}

/* Frees the server state at exit, before LeakSanitizer's check (atexit handlers run in
 * reverse order, and this one is registered after the sanitizer's): the state lives for the
 * whole run, so anything left after this is a real leak of some input's handling. */
static void fini(void)
{
    rpc_server_close_local(srv);
    srv = NULL;
    store_destroy(st.vars);
    dedup_destroy(st.dedup);
    sync_destroy(st.sync);
}

static void init(void)
{
    log_init("fuzz", 0, LOG_ERROR, LOG_FORMAT_TEXT); /* bad requests are logged at WARN */
    verbose = getenv("FUZZ_DISPATCH_VERBOSE") != NULL;
    st.task_index = 0;
    st.num_servers = 1;
    st.start_ns = time_now_ns();
    st.default_staleness = -1;
    st.vars = store_create();
    st.dedup = dedup_create(1024);
    st.sync = sync_create(0, 10000, true, 64);
    if (st.vars == NULL || st.dedup == NULL || st.sync == NULL ||
        server_set_limits(&st, 64u << 20, 1, 256, DEDUP_CLIENTS, 60000) != 0)
        abort();
    sync_set_barrier_fn(server_tables_bsp_apply); /* as ps-server's start-up */
    rpc_server_config cfg = {
        .max_message = MAX_MESSAGE,
        .inline_max = 64 << 10,
        .default_deadline_ms = 10000,
        .max_deadline_ms = 60000,
        .methods = server_methods,
        .n_methods = server_methods_len,
        .handler_arg = &st,
        .admin_token = ADMIN_TOKEN,
    };
    srv = rpc_server_open_local(&cfg);
    if (srv == NULL)
        abort();
    st.rpc = srv;
    create("layer1/w", 12, PSD__V1__OPTIMIZER__OPT_SGD, -1);
    create("bsp/w", 16, PSD__V1__OPTIMIZER__OPT_MOMENTUM, 0);
    create("ssp/w", 16, PSD__V1__OPTIMIZER__OPT_ADAGRAD, 2);
    create("adam/w", 64, PSD__V1__OPTIMIZER__OPT_ADAM, -1);
    atexit(fini);
}

/* One structured request, as client byte `client`. */
static void structured_one(const uint8_t *data, size_t size, const uint8_t p[8], uint8_t client)
{
    const uint8_t *body = size > 8 ? data + 8 : NULL;
    size_t body_len = size > 8 ? size - 8 : 0;
    unsigned fl = p[1];
    const rpc_method *m = NULL;
    envelope env = PSD__V1__ENVELOPE__INIT;
    if (fl & F_UNKNOWN) {
        env.method = (Psd__V1__Method)p[0];
    } else {
        m = &server_methods[(p[0] & 0x7fu) % server_methods_len];
        env.method = (Psd__V1__Method)m->method;
    }
    static uint64_t next_id;
    env.request_id = ++next_id;
    env.worker_id = (fl & F_WORKER) ? (int8_t)p[4] : -1;
    env.clock = (int8_t)p[5];
    env.client_id = 0x1000u + client;
    env.seq = p[6];
    if (fl & F_ADMIN) {
        env.auth_token.data = (uint8_t *)(fl & F_WRONG ? "fuzz-admin-tokeN" : ADMIN_TOKEN);
        env.auth_token.len = strlen(ADMIN_TOKEN);
    }
    env.body.data = (uint8_t *)body;
    env.body.len = body_len;
    Psd__V1__TensorMeta t = PSD__V1__TENSOR_META__INIT;
    float seg[MAX_SEGMENT];
    size_t seg_bytes = 0;
    if (fl & (F_TENSOR | F_SEGMENT)) {
        t.dtype = (fl & F_DTYPE) ? (Psd__V1__DType)p[5] : PSD__V1__DTYPE__FLOAT32;
        t.offset = p[2];
        t.count = (fl & F_BIGCNT) ? ((uint64_t)p[3] << 56 | p[3]) : p[3];
        env.tensor = &t;
        size_t esize = frame_dtype_size(t.dtype);
        if ((fl & F_SEGMENT) && t.count <= MAX_SEGMENT && esize > 0) {
            /* Gradient values from the input (any bit pattern: NaN, Inf, denormals), in
             * FLOAT32 or BFLOAT16. */
            uint8_t *b = (uint8_t *)seg;
            seg_bytes = (size_t)t.count * esize;
            for (size_t i = 0; i < seg_bytes; i++)
                b[i] = data[(i * 7 + 3) % size];
        }
    }
    nng_msg *msg;
    if (frame_build(&msg, &env, seg_bytes ? seg : NULL, seg_bytes, NULL) != 0)
        return; /* e.g. an envelope over FRAME_MAX_ENVELOPE */
    bool push_applied = run(nng_msg_body(msg), nng_msg_len(msg), m);
    nng_msg_free(msg);
    if (push_applied && env.seq != 0) { /* seq 0 is never deduplicated */
        uint8_t bit = (uint8_t)(1u << (env.seq % 8));
        if (applied[client][env.seq / 8] & bit)
            fail("a push was applied twice (same client and seq)");
        applied[client][env.seq / 8] |= bit;
    }
}

static void structured(const uint8_t *data, size_t size)
{
    uint8_t p[8] = {0};
    memcpy(p, data, size < 8 ? size : 8);
    if (!(p[0] & 0x80)) {
        structured_one(data, size, p, p[7] & 15u); /* few clients: the windows fill */
        return;
    }
    for (int round = 0; round < 2; round++) /* the pushes, then their resends */
        for (int i = 0; i < BURST; i++)
            structured_one(data, size, p, (uint8_t)(p[7] + i));
}

/* libFuzzer calls this once before any input: state made here is not charged to the first
 * input by libFuzzer's per-input leak check. */
int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    init();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (srv == NULL)
        init();
    if (size == 0)
        return 0;
    if (data[0] == FRAME_MAGIC0)
        run(data, size, NULL); /* a frame as received */
    else
        structured(data, size);
    return 0;
}
