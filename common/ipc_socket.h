/* The files of ipc:// sockets: whether a live Unix socket is bound to one, read from the
 * kernel's table (/proc/net/unix, Linux) rather than by connecting, since a bare connect()
 * that closes without the SP handshake was seen to stop a live nng IPC listener from serving. */
#ifndef PSD_COMMON_IPC_SOCKET_H
#define PSD_COMMON_IPC_SOCKET_H

#include <stdbool.h>

/* Whether a socket bound to path is in the kernel's table: 1 when one is (with accepting, only
 * one that accepts connections, i.e. listens), 0 when none is, -1 when the table cannot be
 * read. Blocks on reading the table only. */
int ipc_socket_bound(const char *path, bool accepting);

#endif
