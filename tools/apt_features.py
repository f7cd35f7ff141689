#!/usr/bin/python3
"""Turns apt's package index into a sparse classification data set: a package's Section from
hashed tokens of its fields.

Reads every Packages list apt has fetched (apt-get indextargets, apt-helper cat-file), keeps each
package name once (the first list in name order that has it), and writes, in --out-dir:

  train.txt, test.txt  one example per line: "LABEL ID ID ...", the format ps-worker reads with
                       --train-sparse/--test-sparse (ids distinct, in [0, --buckets))
  sections.txt         the section of each label, one a line (line k is label k)

Features, each a token hashed (BLAKE2b, 8 bytes, modulo --buckets) to an id:
  n:PART  each part of the package's name split at '-', '.' and '+'
  p:PRIO  the Priority
  m:ADDR  the Maintainer's e-mail address
  w:WORD  each lower-cased word (letters and digits) of the short Description
  d:NAME  every package named in Depends, Pre-Depends and Recommends (versions and
          alternatives' bars dropped: each alternative is a token)
An example keeps its first --max-ids (64) distinct ids in that order (a few meta-packages depend
on thousands of packages).
The label is the Section without its archive area ("contrib/", "non-free/", ...). A package goes
to the test set when the BLAKE2b hash of its name, modulo 100, is below --test-percent: the split
depends on the name only, so it stays the same whatever else changes. --sample-percent keeps
only the packages whose name hashes below it (another hash), for small runs.

Usage: tools/apt_features.py --out-dir DIR [--buckets 1048576] [--test-percent 20]
                             [--sample-percent 100] [--max-ids 64]
Exits 77 when apt has no Packages list (no apt-get update ever ran), 2 on bad arguments.
"""
import argparse
import hashlib
import os
import re
import subprocess
import sys


def h64(text, salt):
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8, person=salt).digest(),
                          'little')


def packages_lists():
    out = subprocess.run(['apt-get', 'indextargets', '--format', '$(FILENAME)',
                          'Created-By: Packages'], check=True, capture_output=True, text=True)
    return sorted(p for p in out.stdout.split() if os.path.exists(p))


def stanzas(path):
    text = subprocess.run(['/usr/lib/apt/apt-helper', 'cat-file', path], check=True,
                          capture_output=True, text=True).stdout
    for block in text.split('\n\n'):
        fields, key = {}, None
        for line in block.split('\n'):
            if not line:
                continue
            if line[0] in ' \t':
                continue  # continuation lines (long description, tags): not used
            key, _, value = line.partition(':')
            fields[key] = value.strip()
        if 'Package' in fields:
            yield fields


WORD = re.compile(r'[a-z0-9]+')


def tokens(f):
    toks = ['n:' + p for p in re.split(r'[-.+]', f['Package']) if p]
    if f.get('Priority'):
        toks.append('p:' + f['Priority'])
    m = re.search(r'<([^>]+)>', f.get('Maintainer', ''))
    if m:
        toks.append('m:' + m.group(1).lower())
    toks += ['w:' + w for w in WORD.findall(f.get('Description', '').lower())]
    for field in ('Depends', 'Pre-Depends', 'Recommends'):
        for alt in re.split(r'[,|]', f.get(field, '')):
            name = alt.strip().split(' ')[0].split(':')[0]
            if name:
                toks.append('d:' + name)
    return toks


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--out-dir', required=True)
    ap.add_argument('--buckets', type=int, default=1 << 20)
    ap.add_argument('--test-percent', type=int, default=20)
    ap.add_argument('--sample-percent', type=int, default=100)
    ap.add_argument('--max-ids', type=int, default=64)
    a = ap.parse_args()
    if not 1 <= a.buckets <= 1 << 62:
        ap.error('--buckets must be in 1..2^62')
    if a.max_ids < 1:
        ap.error('--max-ids must be >= 1')
    if not 0 < a.test_percent < 100 or not 0 < a.sample_percent <= 100:
        ap.error('--test-percent must be in 1..99 and --sample-percent in 1..100')
    lists = packages_lists()
    if not lists:
        print('apt_features: apt has no Packages list (run apt-get update)', file=sys.stderr)
        return 77
    seen, rows = set(), []
    for path in lists:
        for f in stanzas(path):
            name, section = f['Package'], f.get('Section', '')
            if name in seen or not section:
                continue
            seen.add(name)
            if h64(name, b'sample') % 100 >= a.sample_percent:
                continue
            # Distinct ids in token order (name, priority, maintainer, words, dependencies),
            # the first --max-ids of them: a few meta-packages depend on thousands.
            ids = list(dict.fromkeys(h64(t, b'feature') % a.buckets for t in tokens(f)))
            ids = sorted(ids[:a.max_ids])
            rows.append((name, section.split('/')[-1], ids))
    sections = sorted({r[1] for r in rows})
    label = {s: i for i, s in enumerate(sections)}
    os.makedirs(a.out_dir, exist_ok=True)
    counts = [0, 0]
    with open(os.path.join(a.out_dir, 'train.txt'), 'w') as tr, \
            open(os.path.join(a.out_dir, 'test.txt'), 'w') as te:
        for name, section, ids in sorted(rows):
            test = h64(name, b'split') % 100 < a.test_percent
            (te if test else tr).write(' '.join(map(str, [label[section]] + ids)) + '\n')
            counts[test] += 1
    with open(os.path.join(a.out_dir, 'sections.txt'), 'w') as s:
        s.write('\n'.join(sections) + '\n')
    print(f'apt_features: {len(rows)} packages from {len(lists)} lists, {len(sections)} sections: '
          f'{counts[0]} train, {counts[1]} test, ids < {a.buckets}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
