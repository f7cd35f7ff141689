/* data.h - training and test sets for ps-worker: IDX (MNIST format, plain or
 * gzip) and CSV readers, worker shards and per-epoch shuffles.
 *
 * Inputs are float32 scaled to [0, 1]; labels are int32 class indices. A
 * reader never crashes on bad input: it returns -1 and writes a message that
 * names the file and what is wrong with it (the caller exits with code 2). */
#ifndef WORKER_DATA_H
#define WORKER_DATA_H

#include <stddef.h>
#include <stdint.h>

/* Default location of Debian's dataset-fashion-mnist. */
#define DATA_DEFAULT_DIR "/usr/share/datasets/fashion-mnist"

/* Labels above this are rejected (a corrupt file, not a class). */
#define DATA_MAX_CLASSES 65536

/* Upper bound on the bytes of one decoded file, so that a lying header cannot
 * make a reader allocate without bound (4 GiB: 80x Fashion-MNIST's train set). */
#define DATA_MAX_BYTES ((uint64_t)4 << 30)

/* An in-memory data set: n examples of dim features each. Zero-initialize,
 * fill with a loader, free with dataset_free. */
typedef struct dataset {
    size_t n;
    size_t dim;
    int num_classes; /* 1 + largest label */
    float *x;        /* n * dim, row-major, in [0, 1]; NULL in a sparse set */
    int32_t *y;      /* n */
    int64_t *ids;    /* sparse sets (data_load_sparse): n * dim ids, -1 padding; else NULL */
} dataset;

/* Frees the arrays and zeroes *d. NULL is a no-op. */
void dataset_free(dataset *d);

/* Reads an IDX pair: images (type 0x08 unsigned byte, 2 or 3 dimensions:
 * n x features or n x rows x cols) and labels (0x08, 1 dimension n). Either
 * file may be gzip-compressed (detected by content, not name). Pixels are
 * divided by 255. Errors: missing/unreadable file, bad magic, wrong type or
 * rank, zero or oversized dimensions, truncated data, trailing bytes, corrupt
 * gzip stream, different counts in the two files, a label >= DATA_MAX_CLASSES.
 * Returns 0, or -1 with the message in err. */
int data_load_idx(const char *images_path, const char *labels_path, dataset *out, char *err,
                  size_t errlen);

/* Loads split "train" or "t10k" from an MNIST-layout directory, trying
 * "<dir>/<split>-images-idx3-ubyte" then the same with ".gz" (likewise for
 * labels). Returns 0, or -1 with a message naming the paths tried. */
int data_load_idx_dir(const char *dir, const char *split, dataset *out, char *err, size_t errlen);

/* Reads a CSV file of numbers, one example per line, the label (an integer
 * >= 0) first and the features after it; every line must have the same
 * number of fields. A first line that is not numeric is a header and skipped;
 * blank lines are skipped; "\r\n" line ends are accepted. Features are kept
 * unscaled: use dataset_minmax / dataset_scale. Errors name the file and
 * line. Returns 0, or -1 with the message in err. */
int data_load_csv(const char *path, dataset *out, char *err, size_t errlen);

/* Reads a sparse example file (data_sparse.c): one example per line, "LABEL ID ID ...", ids
 * integers in [0, 2^63), at most max_ids per line. dim is the most ids a line has; each example's
 * ids are the first of its dim entries of `ids`, the rest -1 (x stays NULL: the ids name rows of
 * an embedding bag, layer.h). Errors name the file and line. Returns 0, or -1 with the message
 * in err. */
int data_load_sparse(const char *path, size_t max_ids, dataset *out, char *err, size_t errlen);

/* Smallest and largest feature value of d (0 and 1 for an empty set). */
void dataset_minmax(const dataset *d, float *lo, float *hi);

/* x = clamp((x - lo) / (hi - lo), 0, 1) for every feature (x = 0 if hi <= lo).
 * Apply the training set's lo/hi to the test set too. */
void dataset_scale(dataset *d, float lo, float hi);

/* A worker's share of a data set: the indices it trains on, in the order of
 * the current epoch. */
typedef struct data_shard {
    size_t n;
    uint32_t *index; /* n indices into the data set */
    uint64_t seed;
} data_shard;

/* Chooses shard `task` of `count` (0 <= task < count): every worker permutes
 * 0..total-1 with the same seed and takes the task-th contiguous block, so the
 * shards are disjoint, cover the set, and each holds a random mix of classes.
 * Returns 0, or -1 (bad arguments, a shard with no example, out of memory). */
int data_shard_init(data_shard *s, size_t total, int task, int count, uint64_t seed);
void data_shard_free(data_shard *s);

/* Shuffles the shard's order for `epoch`: deterministic in the seed, the task
 * and the sequence of epochs shuffled so far. */
void data_shard_shuffle(data_shard *s, uint64_t epoch);

/* Copies examples order[first .. first+count) of the shard into x (count *
 * dim floats) and y (count labels). The caller guarantees first + count <= n. */
void data_gather(const dataset *d, const uint32_t *order, size_t count, float *x, int32_t *y);

/* splitmix64: the seedable generator used for shards and shuffles. */
uint64_t data_rng_next(uint64_t *state);

#endif /* WORKER_DATA_H */
