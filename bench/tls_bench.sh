#!/usr/bin/env bash
# Mutual TLS against plain TCP, in the same run: ps-bench (1 server, push and pull) alternating
# plain and TLS for ROUNDS rounds, with certificates made here by the openssl CLI (as
# tests/integration/test_tls.sh does). Prints a Markdown table: GB/s and p50 of each mode per
# round, the ratio TLS/plain and the machine's load (1-minute load average as each run began),
# then the medians over the rounds (of the GB/s, and of each round's ratios).
#
#   bench/tls_bench.sh [BUILD_DIR [ROUNDS [SIZES]]]     (defaults: build 2 4K,1M,16M)
#
# Extra ps-bench options: PS_TLS_BENCH_ARGS (e.g. "--seconds=1 --trials=5"); PS_TLS_BENCH_KEEP=DIR
# keeps ps-bench's outputs there.
set -eu
BUILD=${1:-build}
ROUNDS=${2:-2}
SIZES=${3:-4K,1M,16M}
BENCH=$(realpath "$BUILD/bench/ps-bench")
command -v openssl >/dev/null || { echo "tls_bench.sh: needs the openssl CLI" >&2; exit 2; }

tmp=$(mktemp -d /tmp/ps-tls-bench-XXXXXX)
keep=${PS_TLS_BENCH_KEEP:-}
trap '[ -z "$keep" ] || { mkdir -p "$keep" && cp "$tmp"/*.out "$tmp"/*.err "$tmp/rows" "$keep"/; }; rm -rf "$tmp"' EXIT
ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
openssl req -x509 "${ec[@]}" -keyout "$tmp/ca.key" -out "$tmp/ca.pem" -days 3 -subj "/CN=ca" \
    2>>"$tmp/openssl.log"
for pair in server:ps-server client:worker-0; do
    name=${pair%%:*} cn=${pair#*:}
    openssl req "${ec[@]}" -keyout "$tmp/$name.key" -out "$tmp/$name.csr" -subj "/CN=$cn" \
        2>>"$tmp/openssl.log"
    printf 'subjectAltName=DNS:%s\n' "$cn" >"$tmp/$name.ext"
    openssl x509 -req -in "$tmp/$name.csr" -CA "$tmp/ca.pem" -CAkey "$tmp/ca.key" \
        -CAcreateserial -out "$tmp/$name.pem" -days 2 -extfile "$tmp/$name.ext" \
        2>>"$tmp/openssl.log"
done

# shellcheck disable=SC2054 # commas inside option values
common=(--servers=1 "--sizes=$SIZES" --ops=push,pull --no-raw --no-variants --wait-idle=2)
# shellcheck disable=SC2206
extra=(${PS_TLS_BENCH_ARGS:-})
tls=(--server-opt "tls-ca=$tmp/ca.pem" --server-opt "tls-cert=$tmp/server.pem"
    --server-opt "tls-key=$tmp/server.key"
    --client-opt "tls-ca=$tmp/ca.pem" --client-opt "tls-cert=$tmp/client.pem"
    --client-opt "tls-key=$tmp/client.key" --client-opt "tls-server-name=ps-server")

echo "# ps-bench ${common[*]} ${extra[*]}" >&2
echo "# TLS adds: ${tls[*]//$tmp\//}" >&2
for round in $(seq 1 "$ROUNDS"); do
    for mode in plain tls; do
        args=("${common[@]}" "${extra[@]}")
        [ "$mode" = plain ] || args+=("${tls[@]}")
        load=$(cut -d' ' -f1 /proc/loadavg 2>/dev/null || echo 0)
        echo "# round $round $mode (load $load)" >&2
        "$BENCH" "${args[@]}" >"$tmp/$mode.$round.out" 2>"$tmp/$mode.$round.err" || {
            echo "ps-bench ($mode, round $round) failed:" >&2
            tail -n 20 "$tmp/$mode.$round.err" >&2
            exit 1
        }
        # Table rows "| size | shards | raw.. | raw p50 | push GB/s | p50 | p99 | pull GB/s | p50 | ..."
        awk -F'|' -v m="$mode" -v r="$round" -v l="$load" '
            $3 ~ /^ *1 *$/ && $2 ~ /[0-9]/ {
                gsub(/ /, "", $2)
                printf "%s %s %s push %s %s %s\n", r, m, $2, $6 + 0, $7 + 0, l
                printf "%s %s %s pull %s %s %s\n", r, m, $2, $9 + 0, $10 + 0, l
            }' "$tmp/$mode.$round.out" >>"$tmp/rows"
    done
done
if grep -q "refused" "$tmp"/tls.*.err; then
    echo "warning: the TLS runs' logs mention refusals:" >&2
    grep -h "refused" "$tmp"/tls.*.err | head -n 3 >&2
fi

echo "| size | op | round | plain GB/s | TLS GB/s | TLS/plain | plain p50 µs | TLS p50 µs | TLS/plain p50 | load plain, TLS |"
echo "|---:|---|---:|---:|---:|---:|---:|---:|---:|---|"
awk '
    { key = $3 " " $4 " " $1; g[key, $2] = $5; p[key, $2] = $6; l[key, $2] = $7
      if (!(key in seen)) { seen[key] = 1; order[n++] = key } }
    END {
        for (i = 0; i < n; i++) {
            k = order[i]; split(k, f, " ")
            gp = g[k, "plain"]; gt = g[k, "tls"]; pp = p[k, "plain"]; pt = p[k, "tls"]
            printf "| %s | %s | %s | %.2f | %.2f | %.2f | %.0f | %.0f | %.2f | %s, %s |\n", f[1], f[2],
                f[3], gp, gt, (gp > 0 ? gt / gp : 0), pp, pt, (pp > 0 ? pt / pp : 0),
                l[k, "plain"], l[k, "tls"]
        }
    }' "$tmp/rows"
echo
echo "Medians over $ROUNDS round(s):"
echo
echo "| size | op | plain GB/s | TLS GB/s | TLS/plain GB/s | plain p50 µs | TLS p50 µs | TLS/plain p50 |"
echo "|---:|---|---:|---:|---:|---:|---:|---:|"
awk '
    function median(list,    a, m, i, j, t) {
        m = split(list, a, " ")
        for (i = 2; i <= m; i++) for (j = i; j > 1 && a[j - 1] + 0 > a[j] + 0; j--) {
            t = a[j]; a[j] = a[j - 1]; a[j - 1] = t
        }
        return m % 2 ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2
    }
    { key = $3 " " $4 " " $1; g[key, $2] = $5; p[key, $2] = $6
      c = $3 " " $4; if (!(c in seen)) { seen[c] = 1; order[n++] = c }; rounds[c] = rounds[c] " " $1 }
    END {
        for (i = 0; i < n; i++) {
            c = order[i]; split(rounds[c], rs, " "); gp = gt = pp = pt = rg = rp = ""
            for (r in rs) {
                k = c " " rs[r]; if (done[k]++) continue
                gp = gp " " g[k, "plain"]; gt = gt " " g[k, "tls"]
                pp = pp " " p[k, "plain"]; pt = pt " " p[k, "tls"]
                if (g[k, "plain"] > 0) rg = rg " " g[k, "tls"] / g[k, "plain"]
                if (p[k, "plain"] > 0) rp = rp " " p[k, "tls"] / p[k, "plain"]
            }
            split(c, f, " ")
            printf "| %s | %s | %.2f | %.2f | %.2f | %.0f | %.0f | %.2f |\n", f[1], f[2],
                median(gp), median(gt), median(rg), median(pp), median(pt), median(rp)
        }
    }' "$tmp/rows"
