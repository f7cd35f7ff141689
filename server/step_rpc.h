/* Step (step_rpc.c): a training step's pushes, clock and pulls with this server, in one
 * message. */
#ifndef PSD_SERVER_STEP_RPC_H
#define PSD_SERVER_STEP_RPC_H

#include "rpc_server.h"

void handle_step(rpc_call *call, void *arg);

#endif
