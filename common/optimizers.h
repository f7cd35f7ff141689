/* optimizers.h - the list of optimizers, one row each, shared by server, client and worker.
 *
 *   X(ID, name, value, suggested_lr)
 *
 * ID            suffix of the enum constants: OPTIMIZER_<ID> (server/optimizer.h, generated
 *               from this list), PS_OPT_<ID> (client/psclient.h, public ABI) and
 *               PSD__V1__OPTIMIZER__OPT_<ID> (proto/ps.proto, wire format). The last two are
 *               written by hand in their files, because those are read without this header;
 *               client/variables.c and server/optimizer.c check them against `value` at
 *               compile time, so a missing or renumbered constant does not build.
 * name          the canonical lower-case name (flags, logs, ps_optimizer_parse).
 * value         the stable number on the wire and in checkpoints: append, never renumber.
 * suggested_lr  the learning rate ps-worker uses when none is given (--lr 0).
 *
 * The optimizer's behaviour (slot count, validation, initial slots, update) is its row in
 * server/optimizer.c's registry; its defaults are in common/spec_fields.h. docs/design.md has the
 * recipe for adding one. */
#ifndef PS_COMMON_OPTIMIZERS_H
#define PS_COMMON_OPTIMIZERS_H

#define PS_OPTIMIZERS(X)                                                                           \
    X(SGD, "sgd", 0, 0.1)                                                                          \
    X(MOMENTUM, "momentum", 1, 0.01)                                                               \
    X(ADAGRAD, "adagrad", 2, 0.05)                                                                 \
    X(ADAM, "adam", 3, 0.001)                                                                      \
    X(ADAMW, "adamw", 4, 0.001)

/* "|sgd|momentum|...": the names joined, each after a '|' (skip the first character for an
 * option's choices: PS_OPTIMIZER_CHOICES + 1). A string literal. */
#define PS_OPTIMIZER_CHOICE_(ID, name, value, lr) "|" name
#define PS_OPTIMIZER_CHOICES PS_OPTIMIZERS(PS_OPTIMIZER_CHOICE_)

/* Number of optimizers (their values are 0 .. PS_OPTIMIZER_COUNT - 1). */
#define PS_OPTIMIZER_ONE_(ID, name, value, lr) +1
#define PS_OPTIMIZER_COUNT (0 PS_OPTIMIZERS(PS_OPTIMIZER_ONE_))

#endif /* PS_COMMON_OPTIMIZERS_H */
