/* The files of ipc:// sockets (ipc_socket.h). */
#include "ipc_socket.h"

#include <stdio.h>
#include <string.h>

int ipc_socket_bound(const char *path, bool accepting)
{
    FILE *f = fopen("/proc/net/unix", "r");
    if (f == NULL)
        return -1;
    char line[4200];
    bool live = false;
    size_t plen = strlen(path);
    while (!live && fgets(line, sizeof(line), f) != NULL) {
        size_t n = strcspn(line, "\n");
        line[n] = '\0';
        /* "Num: RefCount Protocol Flags Type St Inode Path": the path is the last field;
         * Flags 00010000: accepting. */
        unsigned long flags = 0;
        live = n > plen && strcmp(line + n - plen, path) == 0 && line[n - plen - 1] == ' ' &&
               (!accepting ||
                (sscanf(line, "%*s %*s %*s %lx", &flags) == 1 && (flags & 0x10000) != 0));
    }
    fclose(f);
    return live ? 1 : 0;
}
