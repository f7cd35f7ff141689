/* The generic checks every request to the RPC server passes before its handler runs, on the
 * socket and in process alike (rpc_server.h): size, frame, method, connection cap, the method
 * table's flags (range, segment, admin role, reply size), body and deadline. Private to
 * common/rpc_*.c. */
#ifndef PSD_COMMON_RPC_VALIDATE_H
#define PSD_COMMON_RPC_VALIDATE_H

#include <stdbool.h>

#include "rpc_server.h"

/* Parses and checks the request c holds (its bytes, its receive time set), setting its frame,
 * method, deadline and unpacked body. False: c was answered with the error (a reply is set,
 * not sent), and the request was logged when it was malformed. */
bool rpc_validate(rpc_call *c);

#endif
