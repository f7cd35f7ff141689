#!/usr/bin/env bash
# Integration test of ps-worker --model embbag-mlp on apt's package index, with real processes.
#
#   test_embbag_apt.sh PS_LOCAL PS_WORKER APT_FEATURES [PSCTL]
#       Converts a deterministic slice of the Packages lists apt has fetched (a quarter of the
#       package names, by hash) with tools/apt_features.py, then ps-local (2 ps-server processes,
#       1 ps-worker) trains the embedding bag over the sparse table and the MLP for 3 epochs.
#       The test accuracy worker 0 prints must beat the majority-class baseline (the training
#       set's most frequent section, scored on the test set, computed here) by 0.15. Also: the
#       worker refuses --model embbag-mlp without sparse files, and a file with a bad id, with
#       exit code 2 and a message naming the problem, as it refuses --save-model with it. Then
#       the same training with the table mostly on disk (--embed-ram-rows, the servers'
#       cold-dir), the next batch's ids prefetched each step: the same accuracy bound. Then
#       (with etcd and PSCTL) 2 workers train while ps-local --add-server grows the cluster
#       from 2 servers to 3: psctl add-server must finish during the run, moving table rows,
#       and the accuracy bound must hold.
#
# Exit 77 (skipped) when apt has no Packages list (apt-get update never ran) or Debian's
# /usr/bin/python3 is missing.
set -u
PS_LOCAL=${1:?ps-local}
PS_WORKER=${2:?ps-worker}
APT_FEATURES=${3:?apt_features.py}
PSCTL=${4:-}

if [ ! -x /usr/bin/python3 ]; then
    echo "skip: /usr/bin/python3 (Debian's Python) is not installed" >&2
    exit 77
fi
if [ -z "$(apt-get indextargets --format '$(FILENAME)' 'Created-By: Packages' 2>/dev/null |
    while read -r f; do [ -e "$f" ] && echo "$f"; done)" ]; then
    echo "skip: apt has no Packages list on this machine (apt-get update never ran)" >&2
    exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() {
    echo "FAIL: $*" >&2
    exit 1
}

/usr/bin/python3 "$APT_FEATURES" --out-dir "$tmp" --sample-percent 25 --buckets 262144 \
    >"$tmp/convert.out" 2>&1
rc=$?
[ $rc -eq 77 ] && exit 77
[ $rc -eq 0 ] || fail "apt_features.py exited $rc: $(cat "$tmp/convert.out")"
cat "$tmp/convert.out"
ntrain=$(wc -l <"$tmp/train.txt")
ntest=$(wc -l <"$tmp/test.txt")
[ "$ntrain" -gt 5000 ] && [ "$ntest" -gt 1000 ] || fail "slice too small: $ntrain train, $ntest test"

# Majority baseline: the training set's most frequent label, scored on the test set.
major=$(cut -d' ' -f1 "$tmp/train.txt" | sort | uniq -c | sort -k1,1nr -k2,2n | head -1 |
    awk '{print $2}')
baseline=$(awk -v m="$major" '$1 == m {k++} END {printf "%.4f", k / NR}' "$tmp/test.txt")
echo "majority class $major: baseline accuracy $baseline on $ntest test packages"

classes=$(wc -l <"$tmp/sections.txt")
"$PS_LOCAL" --ps 2 --workers 1 --timeout 120 -- --model embbag-mlp \
    --train-sparse "$tmp/train.txt" --test-sparse "$tmp/test.txt" --layers "32,64,$classes" \
    --batch-size 64 --epochs 3 --lr 0.003 --log-every 100 >"$tmp/run.out" 2>"$tmp/run.err"
rc=$?
[ $rc -eq 0 ] || fail "ps-local exited $rc: $(tail -20 "$tmp/run.err")"
cat "$tmp/run.out"
acc=$(sed -n 's/^test_accuracy=\([0-9.]*\).*/\1/p' "$tmp/run.out")
[ -n "$acc" ] || fail "no test_accuracy line on stdout: $(cat "$tmp/run.out")"
awk -v a="$acc" -v b="$baseline" 'BEGIN {exit !(a >= b + 0.15)}' ||
    fail "test accuracy $acc is not 0.15 above the majority baseline $baseline"
echo "ok: test accuracy $acc against majority baseline $baseline"

# The same with the table mostly on disk: 2,000 rows in RAM per server (the servers' cold-dir
# from PS_COLD_DIR), each step prefetching the next batch's ids. Skipped without RocksDB.
mkdir "$tmp/cold"
PS_COLD_DIR="$tmp/cold" "$PS_LOCAL" --ps 2 --workers 1 --timeout 120 -- --model embbag-mlp \
    --train-sparse "$tmp/train.txt" --test-sparse "$tmp/test.txt" --layers "32,64,$classes" \
    --batch-size 64 --epochs 3 --lr 0.003 --log-every 100 --embed-ram-rows 2000 \
    >"$tmp/cold.out" 2>"$tmp/cold.err"
rc=$?
if [ $rc -ne 0 ] && grep -q "built without RocksDB" "$tmp/cold.err"; then
    echo "skip: the cold tier (built without RocksDB)"
else
    [ $rc -eq 0 ] || fail "ps-local with --embed-ram-rows exited $rc: $(tail -20 "$tmp/cold.err")"
    grep -q "table prefetch" "$tmp/cold.err" &&
        fail "a prefetch failed: $(grep "table prefetch" "$tmp/cold.err" | head -3)"
    cacc=$(sed -n 's/^test_accuracy=\([0-9.]*\).*/\1/p' "$tmp/cold.out")
    [ -n "$cacc" ] || fail "no test_accuracy line with --embed-ram-rows: $(cat "$tmp/cold.out")"
    awk -v a="$cacc" -v b="$baseline" 'BEGIN {exit !(a >= b + 0.15)}' ||
        fail "with --embed-ram-rows: test accuracy $cacc is not 0.15 above $baseline"
    echo "ok: with 2000 rows in RAM per server and prefetching, test accuracy $cacc"
fi

# A third server joins while 2 workers train: its share of the table's rows (and of the small
# variables) moves to it during the run. Needs etcd (Debian's etcd-server).
if [ -z "$PSCTL" ] || [ ! -x "${PSD_ETCD:-/usr/bin/etcd}" ]; then
    echo "skip: adding a server during training (no psctl given, or no etcd)"
else
    etcd_arg=()
    [ -n "${PSD_ETCD:-}" ] && etcd_arg=(--etcd "$PSD_ETCD")
    "$PS_LOCAL" --ps 2 --workers 2 --add-server --psctl "$PSCTL" "${etcd_arg[@]}" --timeout 160 \
        -- --model embbag-mlp --train-sparse "$tmp/train.txt" --test-sparse "$tmp/test.txt" \
        --layers "32,64,$classes" --batch-size 64 --epochs 12 --lr 0.003 --log-every 100 \
        >"$tmp/add.out" 2>"$tmp/add.err"
    rc=$?
    [ $rc -eq 0 ] || fail "ps-local --add-server exited $rc: $(tail -20 "$tmp/add.err")"
    moved=$(sed -n 's/.*add-server: done: [0-9]* slots moved in [0-9]* batches (\([0-9]*\) rows.*/\1/p' \
        "$tmp/add.err" | head -1)
    [ -n "$moved" ] && [ "$moved" -gt 0 ] ||
        fail "psctl add-server did not finish moving rows during the run: $(grep -E 'add-server|psctl' "$tmp/add.err" | tail -5)"
    grep -q '"add_server":"ps 2 (.*) joined and psctl add-server gave it its share' "$tmp/add.err" ||
        fail "the summary does not say ps 2 joined: $(grep summary "$tmp/add.err")"
    aacc=$(sed -n 's/^test_accuracy=\([0-9.]*\).*/\1/p' "$tmp/add.out" | head -1)
    [ -n "$aacc" ] || fail "no test_accuracy line with --add-server: $(cat "$tmp/add.out")"
    awk -v a="$aacc" -v b="$baseline" 'BEGIN {exit !(a >= b + 0.15)}' ||
        fail "with --add-server: test accuracy $aacc is not 0.15 above $baseline"
    echo "ok: a third server joined during training ($moved table rows moved), test accuracy $aacc"
fi

# Configuration errors: exit 2 with a message naming the problem.
cfg='{"cluster":{"ps":["127.0.0.1:1"],"worker":["127.0.0.1:2"]},"task":{"type":"worker","index":0}}'
expect_config_error() {
    local what=$1 want=$2
    shift 2
    TF_CONFIG=$cfg "$PS_WORKER" --model embbag-mlp "$@" >"$tmp/err" 2>&1
    local rc=$?
    [ $rc -eq 2 ] || fail "$what: exit $rc (want 2): $(cat "$tmp/err")"
    grep -qF -- "$want" "$tmp/err" || fail "$what: no '$want' in: $(cat "$tmp/err")"
    echo "ok: $what refused"
}
expect_config_error "no sparse files" "--model embbag-mlp needs --train-sparse and --test-sparse" \
    --layers 8,4
printf '1 5 x7\n' >"$tmp/bad.txt"
expect_config_error "a bad id" "bad.txt:1: 'x7' is not an integer id" --layers 8,4 \
    --train-sparse "$tmp/bad.txt" --test-sparse "$tmp/test.txt"
expect_config_error "--save-model" "--save-model is not supported with --model embbag-mlp" \
    --layers "8,$classes" --train-sparse "$tmp/train.txt" --test-sparse "$tmp/test.txt" \
    --save-model "$tmp/m.bin"
TF_CONFIG=$cfg "$PS_WORKER" --layers 8,4 --train-sparse "$tmp/train.txt" \
    --test-sparse "$tmp/test.txt" >"$tmp/err" 2>&1
rc=$?
[ $rc -eq 2 ] || fail "sparse files without --model embbag-mlp: exit $rc (want 2)"
grep -qF -- "--train-sparse and --test-sparse are the data of --model embbag-mlp" "$tmp/err" ||
    fail "sparse files without --model embbag-mlp: $(cat "$tmp/err")"
echo "ok: sparse files without --model embbag-mlp refused"
echo "ok"
