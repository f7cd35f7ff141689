/* spec_fields.h - the one list of a variable spec's scalar fields.
 *
 * Every field that the public ps_var_spec (client/psclient.h) and the wire's VariableSpec
 * (proto/ps.proto) both carry, under the same name, is a row:
 *
 *   X(field, public_type, wire_type, default)
 *
 * default is the field's value when the caller sets none (ps_var_spec_init; for the
 * optimizer's fields also ps_table_spec_init and the server's optimizer_params_default),
 * written in the public header's terms (it is read only where client/psclient.h is).
 *
 * Copying a spec to and from the wire (client/variables.c), comparing two specs
 * (server/store.c, spec_diff) and printing one expand this list, so a new field is one row
 * here plus its declaration in the two structs. The fields that are not plain scalars (name,
 * shape) and the placement the client computes (split, num_servers) are handled beside it.
 *
 * PS_SPEC_HPARAMS is the subset that configures the optimizer: doubles in the spec, floats in
 * the server's optimizer_params (server/optimizer.h), which is generated from it.
 * PS_TABLE_HPARAMS are the optimizer's settings that only sparse tables carry (ps_table_spec,
 * the wire's TableSpec: FTRL's), in the same form. PS_HPARAM_KIND_DEFAULTS are the defaults
 * that an optimizer changes for itself, X(ID, field, default) with ID as in
 * common/optimizers.h (FTRL and ROWWISE_ADAGRAD, the tables' own, included); a field's default is
 * its row's unless a row here names the kind. These three lists are the one place of the
 * optimizers' defaults. */
#ifndef PS_COMMON_SPEC_FIELDS_H
#define PS_COMMON_SPEC_FIELDS_H

#define PS_SPEC_HPARAMS(X)                                                                         \
    X(learning_rate, double, double, 0.01)                                                         \
    X(momentum, double, double, 0.9)                                                               \
    X(beta1, double, double, 0.9)                                                                  \
    X(beta2, double, double, 0.999)                                                                \
    X(epsilon, double, double, 1e-8)                                                               \
    X(initial_accumulator, double, double, 0.1)                                                    \
    X(weight_decay, double, double, 0.01)

#define PS_TABLE_HPARAMS(X)                                                                        \
    X(ftrl_beta, double, double, 1.0)                                                              \
    X(l1, double, double, 0.0)                                                                     \
    X(l2, double, double, 0.0)

#define PS_HPARAM_KIND_DEFAULTS(X)                                                                 \
    X(ADAGRAD, epsilon, 1e-7)         /* as Keras */                                               \
    X(ROWWISE_ADAGRAD, epsilon, 1e-7) /* as Adagrad */                                             \
    X(ADAM, learning_rate, 0.001)                                                                  \
    X(ADAMW, learning_rate, 0.001)                                                                 \
    X(FTRL, learning_rate, 0.05) /* FTRL's alpha */

#define PS_SPEC_FIELDS(X)                                                                          \
    X(dtype, ps_dtype, Psd__V1__DType, PS_FLOAT32)                                                 \
    X(initializer, ps_initializer, Psd__V1__Initializer, PS_INIT_ZEROS)                            \
    X(init_a, double, double, 0.0)                                                                 \
    X(init_b, double, double, 0.0)                                                                 \
    X(seed, uint64_t, uint64_t, 0)                                                                 \
    X(optimizer, ps_optimizer, Psd__V1__Optimizer, PS_OPT_SGD)                                     \
    X(nesterov, bool, protobuf_c_boolean, false)                                                   \
    X(staleness, int, int32_t, PS_STALENESS_DEFAULT)                                               \
    PS_SPEC_HPARAMS(X)

#endif /* PS_COMMON_SPEC_FIELDS_H */
