/* rpc_oneshot.h - one request to a server named by its address, waited for: a connection of
 * its own, opened for the call and closed after it. For the calls that go to a server no
 * connection set holds (psctl's slot moves, a server sending a batch of slots to another). */
#ifndef PSD_COMMON_RPC_ONESHOT_H
#define PSD_COMMON_RPC_ONESHOT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rpc_client.h"

typedef struct rpc_oneshot_reply {
    int status;
    char message[1024];
    uint8_t *body; /* the reply's body (malloc'd; NULL when empty or on error) */
    size_t body_len;
    uint32_t moved_to;        /* the reply's Envelope.moved_to (0: none) */
    uint64_t server_instance; /* the reply's Envelope.server_instance (0: no reply) */
} rpc_oneshot_reply;

/* Sends method with body (packed) and an opaque segment of seg_len bytes (a multiple of 4;
 * declared FLOAT32) to addr ("host:port", or a URL) with token as Envelope.auth_token (NULL:
 * none), within deadline_ms, with retries of UNAVAILABLE replies. Returns the call's status
 * (the server's, or a transport one), the reply in *out (free its body). */
int rpc_oneshot(const char *addr, const rpc_tls *tls, int method, const ProtobufCMessage *body,
                const void *seg, size_t seg_len, const char *token, uint32_t deadline_ms,
                rpc_oneshot_reply *out);

/* The same call, waited for in steps: started (0, or its status with why in *out: nothing to
 * end then), waited for up to wait_ms at a time (true once it completed), and ended: the
 * connection closed (a call still waiting completes with CANCELLED: nothing of it is resent
 * after that), *call freed, the status returned and in *out. out must outlive the call; so must
 * seg and token. For a caller that watches something else while a long call runs (psctl, the
 * source of a batch while the batch is sent). */
typedef struct rpc_oneshot_call rpc_oneshot_call;
int rpc_oneshot_start(const char *addr, const rpc_tls *tls, int method,
                      const ProtobufCMessage *body, const void *seg, size_t seg_len,
                      const char *token, uint32_t deadline_ms, rpc_oneshot_reply *out,
                      rpc_oneshot_call **call);
bool rpc_oneshot_wait(rpc_oneshot_call *c, uint32_t wait_ms);
int rpc_oneshot_end(rpc_oneshot_call *c);

#endif
