/* spec_fields.h - the one list of a variable spec's scalar fields.
 *
 * Every field that the public ps_var_spec (client/psclient.h) and the wire's VariableSpec
 * (proto/ps.proto) both carry, under the same name, is a row:
 *
 *   X(field, public_type, wire_type)
 *
 * Copying a spec to and from the wire (client/variables.c), comparing two specs
 * (server/store.c, spec_diff) and printing one expand this list, so a new field is one row
 * here plus its declaration in the two structs. The fields that are not plain scalars (name,
 * shape) and the placement the client computes (split, num_servers) are handled beside it.
 *
 * PS_SPEC_HPARAMS is the subset that configures the optimizer: doubles in the spec, floats in
 * the server's optimizer_params (server/optimizer.h), which is generated from it. */
#ifndef PS_COMMON_SPEC_FIELDS_H
#define PS_COMMON_SPEC_FIELDS_H

#define PS_SPEC_HPARAMS(X)                                                                         \
    X(learning_rate, double, double)                                                               \
    X(momentum, double, double)                                                                    \
    X(beta1, double, double)                                                                       \
    X(beta2, double, double)                                                                       \
    X(epsilon, double, double)                                                                     \
    X(initial_accumulator, double, double)                                                         \
    X(weight_decay, double, double)

#define PS_SPEC_FIELDS(X)                                                                          \
    X(dtype, ps_dtype, Psd__V1__DType)                                                             \
    X(initializer, ps_initializer, Psd__V1__Initializer)                                           \
    X(init_a, double, double)                                                                      \
    X(init_b, double, double)                                                                      \
    X(seed, uint64_t, uint64_t)                                                                    \
    X(optimizer, ps_optimizer, Psd__V1__Optimizer)                                                 \
    X(nesterov, bool, protobuf_c_boolean)                                                          \
    X(staleness, int, int32_t)                                                                     \
    PS_SPEC_HPARAMS(X)

#endif /* PS_COMMON_SPEC_FIELDS_H */
