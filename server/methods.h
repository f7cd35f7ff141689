/* The method table of ps-server (methods.c): what it serves, and which methods change state. */
#ifndef PSD_SERVER_METHODS_H
#define PSD_SERVER_METHODS_H

#include <stdbool.h>
#include <stddef.h>

#include "rpc_server.h"

extern const rpc_method server_methods[];
extern const size_t server_methods_len;

/* True when method changes state (RPC_LOGGED in server_methods): a replicated group's primary
 * logs it and its backups apply it in log order. False for methods not in the table. */
bool server_method_logged(int method);

#endif
