/* What one server acknowledged of one variable's pushes (var_ack), and what a restart of that
 * server, or a failover of its replica group, lost of them: the client's loss accounting, kept
 * apart from the network so that it can be tested alone. */
#ifndef PSD_CLIENT_ACKS_H
#define PSD_CLIENT_ACKS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Versions of this client's own pushes kept per variable and server (var_ack.own): a push a
 * checkpoint older than this many of them could lose is counted from the rest (a lower bound,
 * said so). 8192 versions: 64 KiB per variable and server at most. */
#define OWN_ACKS_MAX 8192

/* The updates a restart of the server lost are those acknowledged above the version it
 * restored. Versions here are acknowledgement marks: the version an acknowledged push's update
 * makes (under BSP a push joins the clock's aggregate, and the update it is part of makes the
 * next version). */
typedef struct var_ack {
    uint64_t instance;      /* Envelope.server_instance of the latest push reply; 0: none yet */
    uint64_t prev_instance; /* the one before (its late replies are ignored) */
    uint64_t acked;         /* highest mark acknowledged by `instance` */
    /* The marks of this client's own pushes on `instance` (ascending as acknowledged), the
     * newest OWN_ACKS_MAX of them: a restart lost those above the restored version.
     * own_dropped: the highest mark dropped to stay within the cap (0: none), below which the
     * count is a lower bound. */
    uint64_t *own;
    size_t nown, capown;
    uint64_t own_dropped;
} var_ack;

/* A push reply, as var_ack_note takes it. */
typedef struct ack_reply {
    uint64_t instance;         /* Envelope.server_instance (0: the server does not say) */
    uint64_t version;          /* the variable's version the reply reports */
    uint64_t restored_version; /* the version the server's process restored at its start */
    bool bsp;                  /* the variable is BSP (staleness bound 0) */
    /* The cluster is replicated: another process answering is the group's new primary
     * (failover or rejoin), holding every update its predecessor acknowledged unless its
     * version says otherwise; not a restart from a checkpoint. */
    bool replicated;
} ack_reply;

/* What a change of the answering process lost. */
typedef struct ack_loss {
    uint64_t lost; /* acknowledged updates lost (a lower bound) */
    /* This client's own pushes among them (more than lost only where it pushed twice into
     * one BSP aggregate: one update) */
    uint64_t own_lost;
    bool own_bound; /* own_lost may be low (older own marks were dropped) */
    uint64_t acked; /* the highest mark the previous process acknowledged */
    uint64_t kept;  /* the mark the new process holds */
} ack_loss;

/* Takes a push reply of this client's into a (caller's lock held): notices a new process and
 * fills *loss with what it lost (zeroed if nothing), then records the push. */
void var_ack_note(var_ack *a, const ack_reply *r, ack_loss *loss);

/* Frees what a holds. */
void var_ack_free(var_ack *a);

#endif
