/* Test helper of test_chaos.sh: whether every copy of every replica group is the same. Asks
 * each member of each group (group g on servers g, g + 1, ..., g + REPLICAS - 1 in ring order)
 * for a checksum of its copy (REPLICATE with checksum set: the group's applied log position
 * and a checksum over its variables and tables), again every 250 ms until, for every group,
 * every member answers with the same position and the same checksum.
 *
 *   replica_checksums CLUSTER REPLICAS TIMEOUT_S [TOKEN_FILE]
 *
 * CLUSTER: the {"ps":[...]} spec; TOKEN_FILE: the servers' admin-token-file (REPLICATE is an
 * admin method: needed from other hosts than the servers'). Prints one line per group
 * ("group G: lsn L, checksum X, variables V on servers A B"). Exit 0 once every group agrees;
 * 1 when some group did not within TIMEOUT_S (each member's last answer named, and whether
 * copies at the same position differ); 2 on bad arguments. */
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>

#include "cluster.h"
#include "frame.h"
#include "rpc_client.h"

#define MAX_SERVERS 64

/* One member's last answer about a group. */
typedef struct answer {
    int status; /* 0 OK, a status, or -1 no reply */
    uint64_t lsn, sum;
    uint32_t vars;
    char err[160];
} answer;

static long long mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* REPLICATE with checksum set to the server at hostport about group g. */
static void ask(const char *hostport, uint32_t g, const char *token, answer *out)
{
    memset(out, 0, sizeof(*out));
    out->status = -1;
    char url[300];
    nng_socket s;
    if (cluster_url(hostport, url, sizeof(url)) != 0 || nng_req0_open(&s) != 0) {
        snprintf(out->err, sizeof(out->err), "bad address %s", hostport);
        return;
    }
    nng_socket_set_ms(s, NNG_OPT_RECVTIMEO, 5000);
    nng_socket_set_ms(s, NNG_OPT_SENDTIMEO, 5000);
    Psd__V1__ReplicateRequest rq = PSD__V1__REPLICATE_REQUEST__INIT;
    rq.group = g;
    rq.checksum = true;
    uint8_t body[64];
    envelope env = PSD__V1__ENVELOPE__INIT;
    env.method = PSD__V1__METHOD__REPLICATE;
    env.body.data = body;
    env.body.len = psd__v1__replicate_request__pack(&rq, body);
    if (token[0]) {
        env.auth_token.data = (uint8_t *)token;
        env.auth_token.len = strlen(token);
    }
    nng_msg *req = NULL, *rep = NULL;
    int rv = nng_dial(s, url, NULL, 0);
    if (rv == 0)
        rv = frame_build(&req, &env, NULL, 0, NULL);
    if (rv == 0 && (rv = nng_sendmsg(s, req, 0)) != 0)
        nng_msg_free(req);
    if (rv == 0)
        rv = nng_recvmsg(s, &rep, 0);
    if (rv != 0) {
        snprintf(out->err, sizeof(out->err), "no answer: %s", nng_strerror(rv));
        nng_close(s);
        return;
    }
    frame f;
    char err[256];
    if (frame_parse(rep, &f, err, sizeof(err)) != 0) {
        snprintf(out->err, sizeof(out->err), "bad reply: %.140s", err);
    } else if (f.env->status != 0) {
        out->status = (int)f.env->status;
        snprintf(out->err, sizeof(out->err), "status %d: %.120s", out->status,
                 f.env->message ? f.env->message : "");
    } else {
        Psd__V1__ReplicateReply *r =
            psd__v1__replicate_reply__unpack(NULL, f.env->body.len, f.env->body.data);
        if (r == NULL) {
            snprintf(out->err, sizeof(out->err), "a reply that does not decode");
        } else {
            out->status = 0;
            out->lsn = r->applied_lsn;
            out->sum = r->checksum;
            out->vars = r->variables;
            psd__v1__replicate_reply__free_unpacked(r, NULL);
        }
    }
    frame_fini(&f);
    nng_msg_free(rep);
    nng_close(s);
}

/* Whether the r answers agree; *same_lsn_differ: they all answered at one position but with
 * different checksums. */
static bool agree(const answer *a, int r, bool *same_lsn_differ)
{
    *same_lsn_differ = false;
    for (int k = 0; k < r; k++)
        if (a[k].status != 0)
            return false;
    bool lsn_eq = true, sum_eq = true;
    for (int k = 1; k < r; k++) {
        lsn_eq = lsn_eq && a[k].lsn == a[0].lsn;
        sum_eq = sum_eq && a[k].sum == a[0].sum && a[k].vars == a[0].vars;
    }
    *same_lsn_differ = lsn_eq && !sum_eq;
    return lsn_eq && sum_eq;
}

int main(int argc, char **argv)
{
    if (argc < 4 || argc > 5) {
        fprintf(stderr, "usage: %s CLUSTER REPLICAS TIMEOUT_S [TOKEN_FILE]\n", argv[0]);
        return 2;
    }
    cluster_spec cl;
    char err[512];
    if (cluster_parse(argv[1], &cl, err, sizeof(err)) != 0) {
        fprintf(stderr, "cluster: %s\n", err);
        return 2;
    }
    int n = (int)cl.n_ps, r = atoi(argv[2]);
    long long limit = mono_ms() + 1000LL * atoi(argv[3]);
    char token[256] = "";
    if (argc == 5 && rpc_read_token(argv[4], token, sizeof(token), err, sizeof(err)) != 0) {
        fprintf(stderr, "token: %s\n", err);
        return 2;
    }
    if (n > MAX_SERVERS || r < 1 || r > n) {
        fprintf(stderr, "replicas %d with %d servers\n", r, n);
        return 2;
    }
    static answer a[MAX_SERVERS][MAX_SERVERS];
    bool done[MAX_SERVERS] = {false}, differ[MAX_SERVERS] = {false};
    int left = n;
    for (;;) {
        for (int g = 0; g < n; g++) {
            if (done[g])
                continue;
            for (int k = 0; k < r; k++)
                ask(cl.ps[(g + k) % n], (uint32_t)g, token, &a[g][k]);
            bool d;
            if (agree(a[g], r, &d)) {
                done[g] = true;
                left--;
                printf("group %d: lsn %" PRIu64 ", checksum %016" PRIx64 ", variables %u on "
                       "servers",
                       g, a[g][0].lsn, a[g][0].sum, a[g][0].vars);
                for (int k = 0; k < r; k++)
                    printf(" %d", (g + k) % n);
                printf("\n");
            }
            differ[g] = d;
        }
        if (left == 0 || mono_ms() >= limit)
            break;
        usleep(250 * 1000);
    }
    for (int g = 0; g < n; g++) {
        if (done[g])
            continue;
        printf("group %d: copies %s after %s s:\n", g,
               differ[g] ? "DIFFER at the same log position" : "did not converge", argv[3]);
        for (int k = 0; k < r; k++) {
            const answer *x = &a[g][k];
            if (x->status == 0)
                printf("  server %d: lsn %" PRIu64 ", checksum %016" PRIx64 ", variables %u\n",
                       (g + k) % n, x->lsn, x->sum, x->vars);
            else
                printf("  server %d: %s\n", (g + k) % n, x->err);
        }
    }
    cluster_fini(&cl);
    return left == 0 ? 0 : 1;
}
