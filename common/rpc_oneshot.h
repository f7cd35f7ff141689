/* rpc_oneshot.h - one request to a server named by its address, waited for: a connection of
 * its own, opened for the call and closed after it. For the calls that go to a server no
 * connection set holds (psctl's slot moves, a server sending a batch of slots to another). */
#ifndef PSD_COMMON_RPC_ONESHOT_H
#define PSD_COMMON_RPC_ONESHOT_H

#include <stddef.h>
#include <stdint.h>

#include "rpc_client.h"

typedef struct rpc_oneshot_reply {
    int status;
    char message[1024];
    uint8_t *body; /* the reply's body (malloc'd; NULL when empty or on error) */
    size_t body_len;
    uint32_t moved_to; /* the reply's Envelope.moved_to (0: none) */
} rpc_oneshot_reply;

/* Sends method with body (packed) and an opaque segment of seg_len bytes (a multiple of 4;
 * declared FLOAT32) to addr ("host:port", or a URL) with token as Envelope.auth_token (NULL:
 * none), within deadline_ms, with retries of UNAVAILABLE replies. Returns the call's status
 * (the server's, or a transport one), the reply in *out (free its body). */
int rpc_oneshot(const char *addr, const rpc_tls *tls, int method, const ProtobufCMessage *body,
                const void *seg, size_t seg_len, const char *token, uint32_t deadline_ms,
                rpc_oneshot_reply *out);

#endif
