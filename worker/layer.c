/* layer.c - the layer table of layer.h: names to ops. */
#include "layer.h"

#include <stdio.h>
#include <string.h>

#include "util.h"

/* One row per layer type; names are unique. */
static const layer_ops *const layer_table[] = {
    &layer_dense_ops,
    &layer_relu_ops,
    &layer_tanh_ops,
    &layer_identity_ops,
    &layer_embbag_ops,
    &layer_embbag_mean_ops,
};

#define LAYER_TABLE_LEN (sizeof(layer_table) / sizeof(layer_table[0]))

const layer_ops *layer_find(const char *name)
{
    if (name == NULL)
        return NULL;
    for (size_t i = 0; i < LAYER_TABLE_LEN; i++)
        if (strcmp(layer_table[i]->name, name) == 0)
            return layer_table[i];
    return NULL;
}

const char *layer_names(char *buf, size_t cap)
{
    if (cap == 0)
        return buf;
    size_t used = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < LAYER_TABLE_LEN && used < cap; i++) {
        int w = snprintf(buf + used, cap - used, "%s%s", i ? ", " : "", layer_table[i]->name);
        if (w < 0)
            break;
        used += (size_t)w;
    }
    return buf;
}

int layer_create(backend *be, int in, const layer_spec *spec, layer **out, char *err, size_t errlen)
{
    *out = NULL;
    const layer_ops *ops = layer_find(spec->type);
    if (ops == NULL) {
        char names[128];
        return errf(err, errlen, "unknown layer type '%s' (known: %s)",
                    spec->type ? spec->type : "(null)", layer_names(names, sizeof(names)));
    }
    if (in < 1)
        return errf(err, errlen, "%s: %d input features (expected >= 1)", ops->name, in);
    return ops->create(be, in, spec, out, err, errlen);
}

void layer_destroy(layer *l)
{
    if (l != NULL)
        l->ops->destroy(l);
}
