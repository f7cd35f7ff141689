#!/usr/bin/python3
"""Synthetic click log: Zipf-distributed feature ids over up to 10^8 keys with a known logistic
ground truth, in the sparse example format of ps-worker --train-sparse ("LABEL ID ID ...").

Every example has --ids ids, each drawn Zipf(--zipf) over ranks 1..--keys (numpy's Zipf,
redrawn past --keys) and mapped to an id by a fixed permutation of 0..keys-1 (so hot ids are
spread, as hashed features are). Every id k has a true weight w_k ~ Normal(0, --sigma), a pure
function of (k, --seed); an example is a click (label 1) with probability
sigmoid(--bias + sum of its ids' weights). The generator writes --out-dir/train.txt and
test.txt (--test-fraction of the examples, chosen by position) and prints, for the test set,
the Bayes-optimal accuracy and log loss (those of the true probabilities): the ceiling any
model can reach, and the majority-class accuracy.

Usage: bench/clicklog_gen.py --out-dir DIR [--examples 200000] [--keys 1048576] [--ids 8]
                             [--zipf 1.1] [--sigma 1.0] [--bias -1.0] [--seed 1]
                             [--test-fraction 0.2]
"""
import argparse
import math
import os
import sys

import numpy as np

M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def splitmix(x):
    with np.errstate(over='ignore'):
        z = x + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def true_weights(ids, seed, sigma):
    """w_k ~ Normal(0, sigma) by Box-Muller from two hashes of (k, seed)."""
    k = ids.astype(np.uint64) ^ np.uint64(seed * 0x632BE59BD9B4E019 & 0xFFFFFFFFFFFFFFFF)
    u1 = ((splitmix(k) >> np.uint64(11)).astype(np.float64) + 0.5) / 2.0**53
    u2 = ((splitmix(k ^ np.uint64(0xD1B54A32D192ED03)) >> np.uint64(11)).astype(np.float64)) / 2.0**53
    return sigma * np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * math.pi * u2)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--out-dir', required=True)
    ap.add_argument('--examples', type=int, default=200000)
    ap.add_argument('--keys', type=int, default=1 << 20)
    ap.add_argument('--ids', type=int, default=8)
    ap.add_argument('--zipf', type=float, default=1.1)
    ap.add_argument('--sigma', type=float, default=1.0)
    ap.add_argument('--bias', type=float, default=-1.0)
    ap.add_argument('--seed', type=int, default=1)
    ap.add_argument('--test-fraction', type=float, default=0.2)
    a = ap.parse_args()
    if not 1 <= a.keys <= 10**8 or a.examples < 2 or a.ids < 1 or not a.zipf > 1.0:
        ap.error('need 1 <= --keys <= 10^8, --examples >= 2, --ids >= 1, --zipf > 1')
    if not 0 < a.test_fraction < 1:
        ap.error('--test-fraction must be in (0, 1)')
    rng = np.random.default_rng(a.seed)
    n = a.examples * a.ids
    ranks = rng.zipf(a.zipf, n)
    while True:
        bad = ranks > a.keys
        if not bad.any():
            break
        ranks[bad] = rng.zipf(a.zipf, int(bad.sum()))
    # A fixed permutation of 0..keys-1: rank r -> (r * mult + add) mod keys, mult coprime to keys.
    mult = 2654435761 % a.keys or 1
    while math.gcd(mult, a.keys) != 1:
        mult += 1
    ids = ((ranks - 1).astype(np.int64) * mult + 12345) % a.keys
    ids = ids.reshape(a.examples, a.ids)
    logit = a.bias + true_weights(ids, a.seed, a.sigma).sum(axis=1)
    p = 1.0 / (1.0 + np.exp(-logit))
    labels = (rng.random(a.examples) < p).astype(np.int64)
    ntest = max(1, int(a.examples * a.test_fraction))
    ntrain = a.examples - ntest
    os.makedirs(a.out_dir, exist_ok=True)
    for name, lo, hi in (('train.txt', 0, ntrain), ('test.txt', ntrain, a.examples)):
        with open(os.path.join(a.out_dir, name), 'w') as f:
            block = np.concatenate([labels[lo:hi, None], ids[lo:hi]], axis=1)
            np.savetxt(f, block, fmt='%d', delimiter=' ')
    pt, yt = p[ntrain:], labels[ntrain:]
    bayes_acc = float(((pt > 0.5) == (yt == 1)).mean())
    bayes_ll = float(-np.mean(yt * np.log(pt) + (1 - yt) * np.log(1 - pt)))
    major = int(labels[:ntrain].mean() >= 0.5)
    major_acc = float((yt == major).mean())
    distinct = len(np.unique(ids))
    print(f'clicklog_gen: {ntrain} train, {ntest} test, {a.ids} ids each over {a.keys} keys '
          f'({distinct} distinct used), click rate {labels.mean():.3f}', file=sys.stderr)
    print(f'bayes_accuracy={bayes_acc:.4f} bayes_logloss={bayes_ll:.4f} '
          f'majority_accuracy={major_acc:.4f}')


if __name__ == '__main__':
    main()
