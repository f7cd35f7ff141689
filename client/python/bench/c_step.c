/* The C side of step_overhead_bench.py, built as a shared library and called once per round
 * through ctypes with the Python client's own ps_client and ps_var handles, so that all modes
 * use the same connections, worker id and clock. Each function runs `steps` steps entirely in
 * C and writes each step's wall time in nanoseconds to ns[i]; returns PS_OK or the first error.
 *
 * c_step_loop: one ps_step per step, every variable's gradient pushed and parameters pulled,
 *     with PS_STEP_CLOCK (the request the C client makes for a training step).
 * c_torch_pattern_loop: the requests psd.torch's step makes for a non-asynchronous variable:
 *     ps_push_async of every gradient, wait for all, then one ps_step that pulls every
 *     variable with PS_STEP_CLOCK. */
#define _POSIX_C_SOURCE 200809L
#include <psclient.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int c_step_loop(ps_client *c, ps_var **vars, const float **grads, float **dsts, int n, int steps,
                int64_t *ns)
{
    ps_step_item *items = calloc((size_t)n, sizeof *items);
    if (items == NULL)
        return PS_RESOURCE_EXHAUSTED;
    int rc = PS_OK;
    for (int s = 0; s < steps && rc == PS_OK; s++) {
        int64_t t0 = now_ns();
        for (int i = 0; i < n; i++) {
            items[i].var = vars[i];
            items[i].offset = 0;
            items[i].count = (uint64_t)ps_var_numel(vars[i]);
            items[i].grad = grads[i];
            items[i].dst = dsts[i];
        }
        rc = ps_step(c, items, (size_t)n, PS_STEP_CLOCK);
        ns[s] = now_ns() - t0;
    }
    free(items);
    return rc;
}

int c_torch_pattern_loop(ps_client *c, ps_var **vars, const float **grads, float **dsts, int n,
                         int steps, int64_t *ns)
{
    ps_step_item *items = calloc((size_t)n, sizeof *items);
    ps_op **ops = calloc((size_t)n, sizeof *ops);
    int rc = items && ops ? PS_OK : PS_RESOURCE_EXHAUSTED;
    for (int s = 0; s < steps && rc == PS_OK; s++) {
        int64_t t0 = now_ns();
        int started = 0;
        for (int i = 0; i < n && rc == PS_OK; i++) {
            uint64_t count = (uint64_t)ps_var_numel(vars[i]);
            rc = ps_push_async(c, vars[i], 0, count, grads[i], NULL, NULL, &ops[i]);
            if (rc == PS_OK)
                started++;
        }
        for (int i = 0; i < started; i++) {
            int w = ps_op_wait(ops[i]);
            if (rc == PS_OK)
                rc = w;
            ps_op_destroy(ops[i]);
        }
        for (int i = 0; i < n; i++) {
            items[i].var = vars[i];
            items[i].offset = 0;
            items[i].count = (uint64_t)ps_var_numel(vars[i]);
            items[i].grad = NULL;
            items[i].dst = dsts[i];
        }
        if (rc == PS_OK)
            rc = ps_step(c, items, (size_t)n, PS_STEP_CLOCK);
        ns[s] = now_ns() - t0;
    }
    free(ops);
    free(items);
    return rc;
}
