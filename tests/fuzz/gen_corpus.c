/* Writes the seed corpora of the fuzz harnesses, run from the repository root (tests/fuzz/run.sh
 * builds it as tests/fuzz_gen_corpus):
 *   tests/fuzz/corpus/fuzz_frame/     one valid request per method kind;
 *   tests/fuzz/corpus/fuzz_dispatch/  valid requests of every ps-server method on the
 *                                     variables fuzz_dispatch.c creates, as frames and in its
 *                                     structured mode (method byte, flags, fields, body). */
#include <stdio.h>
#include <string.h>
#include "frame.h"
static const char *dir = "tests/fuzz/corpus/fuzz_frame";
static void write_file(const char *name, const void *p, size_t n)
{
    char path[256];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (f == NULL) {
        perror(path);
        return;
    }
    fwrite(p, 1, n, f);
    fclose(f);
}
static void put(const char *name, const envelope *env, const void *seg, size_t n)
{
    nng_msg *m;
    if (frame_build(&m, env, seg, n, NULL) != 0)
        return;
    write_file(name, nng_msg_body(m), nng_msg_len(m));
    nng_msg_free(m);
}
/* fuzz_dispatch's structured mode: byte 0 the index in server_methods, byte 1 its flags
 * (fuzz_dispatch.c), bytes 2..7 offset, count, worker, clock, seq, client; then the body. */
static void put_structured(const char *name, uint8_t method_index, uint8_t flags,
                           const uint8_t fields[6], const uint8_t *body, size_t n)
{
    uint8_t b[512];
    b[0] = method_index;
    b[1] = flags;
    memcpy(b + 2, fields, 6);
    if (n)
        memcpy(b + 8, body, n);
    write_file(name, b, 8 + n);
}
static void dispatch_corpus(void)
{
    dir = "tests/fuzz/corpus/fuzz_dispatch";
    uint8_t body[256];
    size_t n;
    float g[4] = {0.5f, -1, 2, 0.25f};
    envelope env = PSD__V1__ENVELOPE__INIT;
    env.request_id = 7;
    env.worker_id = -1;
    Psd__V1__TensorMeta t = PSD__V1__TENSOR_META__INIT;
    t.dtype = PSD__V1__DTYPE__FLOAT32;
    t.offset = 4;
    t.count = 4;
    /* CreateVariable: a new one, and one that exists with another spec. */
    Psd__V1__CreateVariableRequest cr = PSD__V1__CREATE_VARIABLE_REQUEST__INIT;
    Psd__V1__VariableSpec sp = PSD__V1__VARIABLE_SPEC__INIT;
    uint64_t dims[2] = {2, 8};
    sp.name = "new/b";
    sp.dtype = PSD__V1__DTYPE__FLOAT32;
    sp.n_shape = 2;
    sp.shape = dims;
    sp.optimizer = PSD__V1__OPTIMIZER__OPT_ADAMW;
    sp.learning_rate = 0.01;
    sp.beta1 = 0.9;
    sp.beta2 = 0.999;
    sp.epsilon = 1e-8;
    sp.weight_decay = 0.01;
    sp.initializer = PSD__V1__INITIALIZER__INIT_ZEROS;
    sp.staleness = -2;
    sp.num_servers = 1;
    cr.spec = &sp;
    env.method = PSD__V1__METHOD__CREATE_VARIABLE;
    env.body.data = body;
    env.body.len = n = psd__v1__create_variable_request__pack(&cr, body);
    put("create", &env, NULL, 0);
    put_structured("s-create", 0, 0, (const uint8_t[6]){0}, body, n);
    sp.name = "layer1/w"; /* exists with 12 elements and SGD */
    env.body.len = psd__v1__create_variable_request__pack(&cr, body);
    put("create-exists", &env, NULL, 0);
    /* LookupVariable, ListVariables. */
    Psd__V1__LookupVariableRequest lk = PSD__V1__LOOKUP_VARIABLE_REQUEST__INIT;
    lk.name = "adam/w";
    env.method = PSD__V1__METHOD__LOOKUP_VARIABLE;
    env.body.len = n = psd__v1__lookup_variable_request__pack(&lk, body);
    put("lookup", &env, NULL, 0);
    put_structured("s-lookup", 1, 0, (const uint8_t[6]){0}, body, n);
    Psd__V1__ListVariablesRequest lr = PSD__V1__LIST_VARIABLES_REQUEST__INIT;
    lr.page_token = "bsp/w";
    lr.page_size = 2;
    env.method = PSD__V1__METHOD__LIST_VARIABLES;
    env.body.len = n = psd__v1__list_variables_request__pack(&lr, body);
    put("list", &env, NULL, 0);
    put_structured("s-list", 2, 0, (const uint8_t[6]){0}, body, n);
    /* Pull, Push, PushPull on the async variable, then as worker 1 on the BSP and SSP ones. */
    Psd__V1__PullRequest pr = PSD__V1__PULL_REQUEST__INIT;
    pr.name = "layer1/w";
    env.method = PSD__V1__METHOD__PULL;
    env.tensor = &t;
    env.body.len = n = psd__v1__pull_request__pack(&pr, body);
    put("pull", &env, NULL, 0);
    put_structured("s-pull", 3, 0x01, (const uint8_t[6]){4, 4, 0, 0, 0, 0}, body, n);
    Psd__V1__PushRequest ps = PSD__V1__PUSH_REQUEST__INIT;
    ps.name = "layer1/w";
    env.method = PSD__V1__METHOD__PUSH;
    env.client_id = 0x1001;
    env.seq = 1;
    env.body.len = n = psd__v1__push_request__pack(&ps, body);
    put("push", &env, g, sizeof(g));
    put_structured("s-push", 4, 0x03, (const uint8_t[6]){4, 4, 0, 0, 1, 1}, body, n);
    env.method = PSD__V1__METHOD__PUSH_PULL;
    env.seq = 2;
    put("pushpull", &env, g, sizeof(g));
    put_structured("s-pushpull", 5, 0x03, (const uint8_t[6]){0, 4, 0, 0, 2, 1}, body, n);
    ps.name = "bsp/w";
    env.method = PSD__V1__METHOD__PUSH;
    env.worker_id = 1;
    env.clock = 0;
    env.seq = 3;
    env.body.len = n = psd__v1__push_request__pack(&ps, body);
    put("push-bsp", &env, g, sizeof(g));
    put_structured("s-push-bsp", 4, 0x13, (const uint8_t[6]){0, 4, 1, 0, 3, 2}, body, n);
    pr.name = "ssp/w";
    env.method = PSD__V1__METHOD__PULL;
    env.clock = 3;
    env.seq = 0;
    env.body.len = n = psd__v1__pull_request__pack(&pr, body);
    put("pull-ssp", &env, NULL, 0);
    put_structured("s-pull-ssp", 3, 0x11, (const uint8_t[6]){0, 16, 1, 3, 0, 0}, body, n);
    /* Clock (no body), ServerStatus, and the admin methods with the harness's token. */
    env.method = PSD__V1__METHOD__CLOCK;
    env.tensor = NULL;
    env.clock = 1;
    env.body.len = 0;
    put("clock", &env, NULL, 0);
    put_structured("s-clock", 6, 0x10, (const uint8_t[6]){0, 0, 1, 1, 0, 0}, NULL, 0);
    Psd__V1__ServerStatusRequest sr = PSD__V1__SERVER_STATUS_REQUEST__INIT;
    sr.max_variables = 3;
    env.method = PSD__V1__METHOD__SERVER_STATUS;
    env.worker_id = -1;
    env.body.len = n = psd__v1__server_status_request__pack(&sr, body);
    put("status", &env, NULL, 0);
    put_structured("s-status", 7, 0, (const uint8_t[6]){0}, body, n);
    sr.variable = "adam/w";
    env.body.len = psd__v1__server_status_request__pack(&sr, body);
    put("status-one", &env, NULL, 0);
    env.method = PSD__V1__METHOD__CHECKPOINT;
    env.body.len = 0;
    env.auth_token.data = (uint8_t *)"fuzz-admin-token";
    env.auth_token.len = strlen("fuzz-admin-token");
    put("checkpoint", &env, NULL, 0);
    put_structured("s-checkpoint", 8, 0x04, (const uint8_t[6]){0}, NULL, 0);
    /* Step: a push and a pull of two variables with the clock, as worker 1; then the same
     * pushes in bfloat16. */
    env.auth_token.data = NULL;
    env.auth_token.len = 0;
    Psd__V1__StepItem a = PSD__V1__STEP_ITEM__INIT, b = PSD__V1__STEP_ITEM__INIT;
    a.name = "layer1/w";
    a.offset = 4;
    a.count = 4;
    a.push = true;
    a.seq = 9;
    a.pull = true;
    b.name = "ssp/w";
    b.count = 2;
    b.pull = true;
    Psd__V1__StepItem *items[2] = {&a, &b};
    Psd__V1__StepRequest st = PSD__V1__STEP_REQUEST__INIT;
    st.n_items = 2;
    st.items = items;
    st.advance_clock = true;
    env.method = PSD__V1__METHOD__STEP;
    env.worker_id = 1;
    env.clock = 2;
    env.client_id = 0x1002;
    t.offset = 0;
    t.count = 4;
    env.tensor = &t;
    env.body.len = n = psd__v1__step_request__pack(&st, body);
    put("step", &env, g, sizeof(g));
    put_structured("s-step", 11, 0x13, (const uint8_t[6]){0, 4, 1, 2, 0, 3}, body, n);
    uint16_t h[4] = {0x3f00, 0xbf80, 0x4000, 0x3e80};
    t.dtype = PSD__V1__DTYPE__BFLOAT16;
    put("step-bf16", &env, h, sizeof(h));
    /* Dedup-table evictions: bursts (bit 7 of byte 0) of pushes of 48 clients, then their
     * resends, through the harness's table of 8 clients: the resends of evicted clients must
     * be refused, never applied twice. Async, push-pull and BSP (worker 1), seq 1 and 200. */
    ps.name = "layer1/w";
    n = psd__v1__push_request__pack(&ps, body);
    put_structured("s-push-evict", 0x80 | 4, 0x03, (const uint8_t[6]){4, 4, 0, 0, 1, 0x20}, body,
                   n);
    put_structured("s-pushpull-evict", 0x80 | 5, 0x03, (const uint8_t[6]){0, 4, 0, 0, 200, 0x60},
                   body, n);
    ps.name = "bsp/w";
    n = psd__v1__push_request__pack(&ps, body);
    put_structured("s-push-bsp-evict", 0x80 | 4, 0x13, (const uint8_t[6]){0, 4, 1, 0, 7, 0xa0},
                   body, n);
    /* Sparse tables: create "emb" (dim 4, SGD), pull three ids (one twice), push their
     * gradients after the ids in one segment, and the same push with a NaN. */
    Psd__V1__TableSpec ts = PSD__V1__TABLE_SPEC__INIT;
    ts.name = "emb";
    ts.dim = 4;
    ts.learning_rate = 0.1;
    ts.staleness = -1;
    ts.num_servers = 1;
    Psd__V1__TableCreateRequest tcr = PSD__V1__TABLE_CREATE_REQUEST__INIT;
    tcr.spec = &ts;
    env.method = PSD__V1__METHOD__TABLE_CREATE;
    env.worker_id = -1;
    env.clock = 0;
    env.tensor = NULL;
    env.body.len = psd__v1__table_create_request__pack(&tcr, body);
    put("table-create", &env, NULL, 0);
    struct {
        int64_t ids[3];
        float g[12];
    } tseg = {{1, -2, 1}, {0.5f, -1, 2, 0.25f, 1, 1, 1, 1, 0.5f, -1, 2, 0.25f}};
    Psd__V1__TablePullRequest tpr = PSD__V1__TABLE_PULL_REQUEST__INIT;
    tpr.name = "emb";
    tpr.n = 3;
    t.dtype = PSD__V1__DTYPE__FLOAT32;
    t.offset = 0;
    t.count = 6; /* 3 ids of 8 bytes, in 4-byte words */
    env.tensor = &t;
    env.method = PSD__V1__METHOD__TABLE_PULL;
    env.body.len = psd__v1__table_pull_request__pack(&tpr, body);
    put("table-pull", &env, tseg.ids, sizeof(tseg.ids));
    Psd__V1__TablePushRequest tps = PSD__V1__TABLE_PUSH_REQUEST__INIT;
    tps.name = "emb";
    tps.n = 3;
    t.count = sizeof(tseg) / 4;
    env.method = PSD__V1__METHOD__TABLE_PUSH;
    env.client_id = 0x1003;
    env.seq = 11;
    env.body.len = psd__v1__table_push_request__pack(&tps, body);
    put("table-push", &env, &tseg, sizeof(tseg));
    uint32_t nan_bits = 0x7fc00000u;
    memcpy(&tseg.g[5], &nan_bits, 4);
    env.seq = 12;
    put("table-push-nan", &env, &tseg, sizeof(tseg));
    /* The same push on a bfloat16 wire: 3 ids (12 elements of 2 bytes), then 12 gradients. */
    struct {
        int64_t ids[3];
        uint16_t g[12];
    } bseg = {{1, -2, 1},
              {0x3f00, 0xbf80, 0x4000, 0x3e80, 0x3f80, 0x3f80, 0x3f80, 0x3f80, 0x3f00, 0xbf80,
               0x4000, 0x3e80}};
    t.dtype = PSD__V1__DTYPE__BFLOAT16;
    t.count = sizeof(bseg) / 2;
    env.seq = 13;
    put("table-push-bf16", &env, &bseg, sizeof(bseg));
    /* A Step with a dense-free table item that pushes (its own seq) and pulls the same ids. */
    Psd__V1__StepTableItem sti = PSD__V1__STEP_TABLE_ITEM__INIT;
    sti.name = "emb";
    sti.n = 3;
    sti.push = true;
    sti.seq = 14;
    sti.pull = true;
    Psd__V1__StepTableItem *stis[1] = {&sti};
    Psd__V1__StepRequest tsr = PSD__V1__STEP_REQUEST__INIT;
    tsr.n_table_items = 1;
    tsr.table_items = stis;
    t.dtype = PSD__V1__DTYPE__FLOAT32;
    t.count = sizeof(tseg) / 4;
    memcpy(&tseg.g[5], &(float){1.0f}, 4);
    env.method = PSD__V1__METHOD__STEP;
    env.seq = 0;
    env.body.len = psd__v1__step_request__pack(&tsr, body);
    put("table-step", &env, &tseg, sizeof(tseg));
    /* A page of the table's rows (TableExport, admin), from a cursor in partition 3. */
    Psd__V1__TableExportRequest ter = PSD__V1__TABLE_EXPORT_REQUEST__INIT;
    ter.name = "emb";
    ter.cursor = (3ull << 32) | 5;
    ter.max_rows = 2;
    env.method = PSD__V1__METHOD__TABLE_EXPORT;
    env.tensor = NULL;
    env.client_id = 0;
    env.seq = 0;
    env.body.len = psd__v1__table_export_request__pack(&ter, body);
    put("table-export", &env, NULL, 0);
}
int main(void)
{
    uint8_t body[256];
    envelope env = PSD__V1__ENVELOPE__INIT;
    Psd__V1__PullRequest pr = PSD__V1__PULL_REQUEST__INIT;
    pr.name = "layer1/w";
    Psd__V1__TensorMeta t = PSD__V1__TENSOR_META__INIT;
    t.dtype = 1;
    t.count = 4;
    env.method = PSD__V1__METHOD__PULL;
    env.request_id = 1;
    env.tensor = &t;
    env.body.data = body;
    env.body.len = psd__v1__pull_request__pack(&pr, body);
    put("pull", &env, NULL, 0);
    float g[4] = {1, 2, 3, 4};
    env.method = PSD__V1__METHOD__PUSH;
    env.seq = 3;
    env.client_id = 42;
    put("push", &env, g, sizeof(g));
    Psd__V1__CreateVariableRequest cr = PSD__V1__CREATE_VARIABLE_REQUEST__INIT;
    Psd__V1__VariableSpec sp = PSD__V1__VARIABLE_SPEC__INIT;
    uint64_t dims[2] = {3, 4};
    sp.name = "caf\xc3\xa9";
    sp.dtype = 1;
    sp.n_shape = 2;
    sp.shape = dims;
    sp.num_servers = 1;
    cr.spec = &sp;
    env.method = PSD__V1__METHOD__CREATE_VARIABLE;
    env.tensor = NULL;
    env.seq = 0;
    env.body.len = psd__v1__create_variable_request__pack(&cr, body);
    put("create", &env, NULL, 0);
    Psd__V1__ListVariablesRequest lr = PSD__V1__LIST_VARIABLES_REQUEST__INIT;
    lr.page_token = "a/b";
    lr.page_size = 10;
    env.method = PSD__V1__METHOD__LIST_VARIABLES;
    env.body.len = psd__v1__list_variables_request__pack(&lr, body);
    put("list", &env, NULL, 0);
    Psd__V1__ServerStatusRequest sr = PSD__V1__SERVER_STATUS_REQUEST__INIT;
    sr.variable = "x";
    sr.max_variables = 5;
    env.method = PSD__V1__METHOD__SERVER_STATUS;
    env.body.len = psd__v1__server_status_request__pack(&sr, body);
    put("status", &env, NULL, 0);
    dispatch_corpus();
    return 0;
}
