/* train_embbag.h - ps-worker --model embbag-mlp: an embedding bag over a sparse table of the
 * parameter servers in front of the MLP of --layers.
 *
 * The examples are sparse (data_load_sparse: a list of feature ids each). The first layer pools
 * (sum, or mean) the rows of an example's ids from the table "<model>/emb" (dim = --layers'
 * first size, a row made by the servers on first push from a uniform initializer), the rest is
 * the MLP of --layers after it. Per step: the batch's distinct ids are pulled from the table
 * with the dense variables, forward and backward run, the dense gradients are pushed as the
 * backward pass produces them and the rows' gradients (summed per distinct id) in one table
 * push, then the clock. Worker 0 waits for the others (up to --done-wait-ms), evaluates on the
 * test set and prints "test_accuracy=... test_loss=... steps=... samples_per_s=..." on stdout.
 */
#ifndef WORKER_TRAIN_EMBBAG_H
#define WORKER_TRAIN_EMBBAG_H

#include <stdbool.h>

#include "train.h"

/* Gives both sets the same width (the larger one's), padding the other's examples with -1.
 * Returns 0 or -1 (out of memory). */
int train_embbag_same_width(dataset *a, dataset *b);

/* Trains as above; cfg->model.sizes[0] is the row dimension, the data sets' dim the ids per
 * example (the same in both). Returns a TRAIN_EXIT_* code (errors logged). */
int train_embbag_run(ps_client *client, backend *be, const train_config *cfg, bool mean,
                     const dataset *train, const dataset *test, train_result *res);

#endif /* WORKER_TRAIN_EMBBAG_H */
