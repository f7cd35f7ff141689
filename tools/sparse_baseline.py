#!/usr/bin/python3
"""Accuracy of scikit-learn's LogisticRegression on a sparse example file pair (the format of
tools/apt_features.py and ps-worker --train-sparse): each id a binary feature, the same features
and split as ps-worker sees. Prints "baseline_accuracy=A majority_accuracy=B" on stdout.

Usage: tools/sparse_baseline.py TRAIN TEST [--C 1.0] [--max-iter 200]
Needs Debian's python3-sklearn (run with /usr/bin/python3)."""
import argparse
import sys
import time

import numpy as np
import scipy.sparse as sp
from sklearn.linear_model import LogisticRegression


def load(path):
    labels, indptr, indices = [], [0], []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith('#'):
                continue
            fields = line.split()
            labels.append(int(fields[0]))
            indices += [int(x) for x in fields[1:]]
            indptr.append(len(indices))
    return np.array(labels), np.array(indices, np.int64), np.array(indptr)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('train')
    ap.add_argument('test')
    ap.add_argument('--C', type=float, default=1.0)
    ap.add_argument('--max-iter', type=int, default=200)
    a = ap.parse_args()
    ytr, itr, ptr = load(a.train)
    yte, ite, pte = load(a.test)
    # One column per id the training set uses (ids are any int64); the test set's other ids
    # would have zero weight anyway and are dropped.
    used = np.unique(itr)
    col_tr = np.searchsorted(used, itr)
    xtr = sp.csr_matrix((np.ones(len(itr), np.float32), col_tr, ptr), shape=(len(ytr), len(used)))
    rows_te = np.repeat(np.arange(len(yte)), np.diff(pte))
    pos = np.searchsorted(used, ite)
    known = (pos < len(used)) & (used[np.minimum(pos, len(used) - 1)] == ite)
    xte = sp.csr_matrix((np.ones(int(known.sum()), np.float32), (rows_te[known], pos[known])),
                        shape=(len(yte), len(used)))
    t0 = time.time()
    clf = LogisticRegression(C=a.C, max_iter=a.max_iter)
    clf.fit(xtr, ytr)
    acc = float((clf.predict(xte) == yte).mean())
    majority = float((yte == np.bincount(ytr).argmax()).mean())
    print(f'sparse_baseline: {xtr.shape[0]} train, {xte.shape[0]} test, {len(used)} features, '
          f'fit {time.time() - t0:.1f} s', file=sys.stderr)
    print(f'baseline_accuracy={acc:.4f} majority_accuracy={majority:.4f}')


if __name__ == '__main__':
    main()
