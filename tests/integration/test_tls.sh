#!/usr/bin/env bash
# Mutual TLS and the admin role (docs/operations.md, Security), with real ps-server processes
# on loopback and certificates made here with the openssl CLI:
#
#   test_tls.sh PS_SERVER TLS_CLIENT [PS_WORKER]
#
# TLS: connections failing their handshake (a ClientHello, a FIN and a reset; a FIN and a
# reset; 4 bytes and a reset) leave the server serving and a connected client's connection
# up; a client with a certificate of the cluster CA pushes and pulls; one with no
# certificate, one of another CA and an expired one are refused within their deadline (the
# client's message says the server refused its certificate, the server's log names the peer
# and the reason); a plain-TCP client and a client that does not trust the server's CA get
# nothing. Roles: Shutdown without a token is UNAUTHENTICATED, with a wrong one
# PERMISSION_DENIED, with the admin token OK (over TLS and over plain TCP); a server without
# admin-token-file allows admin methods from loopback only. With PS_WORKER and Fashion-MNIST:
# one epoch of training over TLS reaches test accuracy >= 0.75.
# Exit 77 (skipped) without the openssl CLI.
set -u
PS_SERVER=${1:?ps-server}
CLIENT=${2:?test_tls_client}
PS_WORKER=${3:-}
PS_SERVER=$(realpath "$PS_SERVER")
CLIENT=$(realpath "$CLIENT")
[ -z "$PS_WORKER" ] || PS_WORKER=$(realpath "$PS_WORKER")
DATA_DIR=${PS_TEST_FASHION_DIR:-/usr/share/datasets/fashion-mnist}
# shellcheck source=../support/procs.sh
. "$(cd "$(dirname "$0")" && pwd)/../support/procs.sh"
command -v openssl >/dev/null || { echo "SKIP: no openssl CLI (apt-get install openssl)"; exit 77; }

tmp=$(mktemp -d /tmp/ps-test-tls-XXXXXX)
procs_on_exit
cd "$tmp" || exit 1

# ---- certificates ----------------------------------------------------------------------------
ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
mkca() { # name
    openssl req -x509 "${ec[@]}" -keyout "$1.key" -out "$1.pem" -days 3 -subj "/CN=$1" \
        2>>openssl.log || fail "openssl: cannot make CA $1"
}
mkcert() { # name CA CN
    openssl req "${ec[@]}" -keyout "$1.key" -out "$1.csr" -subj "/CN=$3" 2>>openssl.log &&
        printf 'subjectAltName=DNS:%s\n' "$3" >"$1.ext" &&
        openssl x509 -req -in "$1.csr" -CA "$2.pem" -CAkey "$2.key" -CAcreateserial \
            -out "$1.pem" -days 2 -extfile "$1.ext" 2>>openssl.log || fail "openssl: cannot make $1"
}
mkca ca
mkca other-ca
mkcert server ca ps-server
mkcert worker ca worker-0
mkcert admin ca admin
mkcert stranger other-ca worker-0
# Expired: valid for one day in 2020 (openssl 3.0's x509 has no -not_before; `openssl ca` has
# -startdate/-enddate).
mkdir -p ca-db
: >ca-db/index.txt
echo 01 >ca-db/serial
cat >ca.cnf <<CNF
[ca]
default_ca = ca_default
[ca_default]
database = $tmp/ca-db/index.txt
new_certs_dir = $tmp/ca-db
serial = $tmp/ca-db/serial
default_md = sha256
policy = policy_any
[policy_any]
commonName = supplied
CNF
openssl req "${ec[@]}" -keyout expired.key -out expired.csr -subj "/CN=worker-0" 2>>openssl.log &&
    openssl ca -batch -config ca.cnf -cert ca.pem -keyfile ca.key -in expired.csr \
        -out expired.pem -startdate 20200101000000Z -enddate 20200102000000Z -notext \
        2>>openssl.log || fail "openssl ca: cannot make the expired certificate"
openssl x509 -in expired.pem -noout -checkend 0 >/dev/null && fail "expired.pem is not expired"
echo "s3cret-admin-token" >admin.token
echo "not-the-token" >wrong.token

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# start_server LOG ARGS...: starts ps-server on a fresh port ($port), waits until it serves.
start_server() {
    local log=$1
    shift
    port=$(port)
    "$PS_SERVER" --cluster "{\"ps\":[\"${host:-127.0.0.1}:$port\"]}" --task ps:0 \
        ${listen:+--listen "$listen$port"} --log-format text "$@" >"$log" 2>&1 &
    server=$!
    pids+=("$server")
    wait_log "$log" "serving on" 10 || fail "ps-server did not start ($log: $(tail -n 5 "$log"))"
}

# expect NAME STATUS TEXT ACTION SETTINGS...: runs the client, whose first output line must
# start with STATUS and contain TEXT.
expect() {
    local name=$1 want=$2 text=$3 action=$4
    shift 4
    local start end out rc
    start=$(date +%s%N)
    # Bounded: the client prints its status line before ps_client_close, which must not hang.
    out=$(timeout 20 "$CLIENT" "$action" "cluster={\"ps\":[\"${host:-127.0.0.1}:$port\"]}" "$@" \
        2>"$name.err")
    rc=$?
    end=$(date +%s%N)
    [ "$rc" -ne 124 ] || fail "$name: the client did not exit within 20 s (\"$out\"; hung in close?)"
    case "$out" in
    "$want:"*"$text"*) echo "ok   $name ($(((end - start) / 1000000)) ms): $out" ;;
    *) fail "$name: got \"$out\", want $want ...$text... (stderr: $(tail -n 3 "$name.err"))" ;;
    esac
}

tls_common=(tls-ca=ca.pem tls-server-name=ps-server deadline-ms=3000)
worker=("${tls_common[@]}" tls-cert=worker.pem tls-key=worker.key)
admin=("${tls_common[@]}" tls-cert=admin.pem tls-key=admin.key admin-token-file=admin.token)

# ---- TLS -------------------------------------------------------------------------------------
start_server tls.log --tls-ca ca.pem --tls-cert server.pem --tls-key server.key \
    --admin-token-file admin.token
grep -q "security: mutual TLS" tls.log || fail "ps-server does not say TLS is on"
# PS_TLS_ENGINE (tls-engine) picks the engine of ps-server, ps-worker and the client.
[ -z "${PS_TLS_ENGINE:-}" ] || grep -q "tls-engine $PS_TLS_ENGINE" tls.log ||
    fail "ps-server does not use tls-engine $PS_TLS_ENGINE: $(grep security: tls.log)"
# Connections that fail before the TLS handshake completes cost the server nothing: the next
# client is served. A ClientHello, a FIN and a reset within 2 ms (when the reset comes between
# the server's read of the hello and its reply, the reply fails with EPIPE, and Debian's nng
# 1.5.2 alone stops listening: this test failed 3 runs in 3 with it; docs/design.md, "nng"),
# a FIN then a reset, and 4 bytes, a wait and a reset. The last ones while a client with the
# worker's certificate holds a connection (TLS and the SP header done), which must stay open.
python3 - "$port" <<'PY' || fail "failed handshakes: see above"
import socket, ssl, struct, sys, time
port = int(sys.argv[1])
def reset(s):
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
ctx.check_hostname = False
ctx.verify_mode = ssl.CERT_NONE
def hello_fin_reset(i):
    s = socket.create_connection(("127.0.0.1", port))
    out = ssl.MemoryBIO()
    try:
        ctx.wrap_bio(ssl.MemoryBIO(), out).do_handshake()
    except ssl.SSLWantReadError:
        pass
    s.sendall(out.read())
    s.shutdown(socket.SHUT_WR)
    time.sleep([0.0002, 0.0004, 0.0007, 0.001, 0.0015][i % 5])
    reset(s)
    time.sleep(0.15)  # past the rest of a listener that saw an error
for i in range(20):
    hello_fin_reset(i)
# The established client: TLS with the worker's certificate, then the SP header (REQ).
wctx = ssl.create_default_context(cafile="ca.pem")
wctx.load_cert_chain("worker.pem", "worker.key")
est = wctx.wrap_socket(socket.create_connection(("127.0.0.1", port)), server_hostname="ps-server")
est.sendall(b"\x00SP\x00\x00\x30\x00\x00")
est.settimeout(5)
head = b""
while len(head) < 8:
    chunk = est.recv(8 - len(head))
    if not chunk:
        sys.exit("the established client's connection closed during the SP handshake")
    head += chunk
for i in range(5):
    hello_fin_reset(i)
for i in range(4):
    s = socket.create_connection(("127.0.0.1", port))
    s.shutdown(socket.SHUT_WR)
    time.sleep(0.001 * i)
    reset(s)
s = socket.create_connection(("127.0.0.1", port))
s.sendall(b"\x16\x03\x01\x00")
time.sleep(1.5)
reset(s)
time.sleep(0.5)
est.setblocking(False)
try:
    if est.recv(1) == b"":
        sys.exit("the established client's connection was closed by the failed handshakes")
except ssl.SSLWantReadError:
    pass  # open, nothing to read
est.close()
PY
expect tls-pushpull OK "" pushpull "${worker[@]}"
expect tls-no-cert DEADLINE_EXCEEDED "refused this client's certificate" pushpull \
    "${tls_common[@]}"
grep -q "refused TLS connection from 127.0.0.1:[0-9]*: no client certificate" tls.log ||
    fail "the server log does not name the refused client without a certificate"
# The refused client redials (backing off) for its 3 s; the server logs at most one refusal
# line per peer address a second.
lines=$(grep -c "refused TLS connection" tls.log)
[ "$lines" -le 4 ] || fail "$lines refusal lines in 3 s for one address (want <= 4: one a second)"
for bad in stranger expired; do
    sleep 1.1 # past the rate limit of the last line for 127.0.0.1: the first refusal is logged
    before=$(grep -c "refused TLS connection" tls.log)
    expect "tls-$bad" DEADLINE_EXCEEDED "refused this client's certificate" pushpull \
        "${tls_common[@]}" tls-cert=$bad.pem tls-key=$bad.key
    after=$(grep -c "refused TLS connection" tls.log)
    [ "$after" -gt "$before" ] || fail "the server logged no refusal of the $bad certificate"
done
grep -q "refused TLS connection from 127.0.0.1:[0-9]*: .*(and [0-9]* more from this address in the last [0-9.]* s, not logged)" tls.log ||
    fail "no refusal line counts the refusals left out by the rate limit"
echo "ok   refusal lines: $(grep -c "refused TLS connection" tls.log) for 3 refused clients"
expect tls-untrusted-server DEADLINE_EXCEEDED "no connection completed its handshake" pushpull \
    tls-ca=other-ca.pem tls-server-name=ps-server deadline-ms=2000 tls-cert=stranger.pem \
    tls-key=stranger.key
expect tls-wrong-name DEADLINE_EXCEEDED "no connection completed its handshake" pushpull \
    tls-ca=ca.pem tls-server-name=someone-else deadline-ms=2000 tls-cert=worker.pem \
    tls-key=worker.key
expect tls-plain-client DEADLINE_EXCEEDED "" pushpull deadline-ms=2000
expect tls-shutdown-worker UNAUTHENTICATED "Shutdown is an admin method" shutdown "${worker[@]}"
expect tls-shutdown-wrong-token PERMISSION_DENIED "does not match" shutdown "${worker[@]}" \
    admin-token-file=wrong.token
expect tls-checkpoint-worker UNAUTHENTICATED "Checkpoint is an admin method" checkpoint \
    "${worker[@]}"
kill -0 "$server" 2>/dev/null || fail "ps-server died"
expect tls-shutdown-admin OK "" shutdown "${admin[@]}"
wait_for "$server" 10 || fail "ps-server exited $? after Shutdown"
grep -q "refused Shutdown from 127.0.0.1:[0-9]*: no admin token" tls.log ||
    fail "the server log does not name the refused Shutdown"

# ---- plain TCP with an admin token ------------------------------------------------------------
start_server token.log --admin-token-file admin.token
grep -q "security: plain TCP" token.log || fail "ps-server does not say TLS is off"
expect token-pushpull OK "" pushpull deadline-ms=3000
expect token-none UNAUTHENTICATED "no admin token" shutdown deadline-ms=3000
expect token-wrong PERMISSION_DENIED "does not match the server's admin-token-file" shutdown \
    deadline-ms=3000 admin-token-file=wrong.token
expect token-missing-file INVALID_ARGUMENT "no-such.token" shutdown admin-token-file=no-such.token
expect token-ok OK "" shutdown deadline-ms=3000 admin-token-file=admin.token
wait_for "$server" 10 || fail "ps-server exited $? after Shutdown"

# ---- plain TCP without a token: loopback only -------------------------------------------------
other_ip=$(hostname -I 2>/dev/null | tr ' ' '\n' | grep -v '^127\.' | grep -E '^[0-9.]+$' | head -n 1)
if [ -n "$other_ip" ]; then
    host=$other_ip listen=tcp://0.0.0.0: start_server open.log
    host=$other_ip expect open-remote PERMISSION_DENIED "allowed only from loopback" shutdown \
        deadline-ms=3000
    kill -0 "$server" 2>/dev/null || fail "Shutdown from $other_ip stopped the server"
    grep -q "refused Shutdown from $other_ip" open.log || fail "no refusal logged for $other_ip"
    expect open-loopback OK "" shutdown deadline-ms=3000
    wait_for "$server" 10 || fail "ps-server exited $? after Shutdown"
else
    echo "skip open-remote: this host has no address but loopback"
fi
bad_start() { # LOG ARGS...: ps-server must exit 2 at once, its log naming $want
    local log=$1 rc
    shift
    timeout 10 "$PS_SERVER" --cluster "{\"ps\":[\"127.0.0.1:$(port)\"]}" --task ps:0 "$@" \
        >"$log" 2>&1
    rc=$?
    [ "$rc" -eq 2 ] && grep -q -- "$want" "$log" ||
        fail "ps-server $* exited $rc (want 2 and a message naming $want): $(cat "$log")"
    echo "ok   refused to start: $(grep -o -- "[^\"]*$want[^\"]*" "$log" | head -n 1)"
}
want=no-such.token bad_start missing.log --admin-token-file no-such.token
want=tls-key bad_start nokey.log --tls-ca ca.pem --tls-cert server.pem
want=no-such-ca.pem bad_start noca.log --tls-ca no-such-ca.pem --tls-cert server.pem \
    --tls-key server.key

# ---- training over TLS ------------------------------------------------------------------------
if [ -z "$PS_WORKER" ]; then
    echo "skip training: no ps-worker given"
elif [ ! -r "$DATA_DIR/train-images-idx3-ubyte.gz" ] && [ ! -r "$DATA_DIR/train-images-idx3-ubyte" ]; then
    echo "skip training: Fashion-MNIST not found in $DATA_DIR"
else
    wport=$(port)
    start_server train.log --tls-ca ca.pem --tls-cert server.pem --tls-key server.key
    cluster="{\"ps\":[\"127.0.0.1:$port\"],\"worker\":[\"127.0.0.1:$wport\"]}"
    TF_CONFIG="{\"cluster\":$cluster,\"task\":{\"type\":\"worker\",\"index\":0}}" \
        "$PS_WORKER" --layers 784,128,10 --epochs 1 --batch-size 64 --optimizer adam --seed 3 \
        --log-every 100 --data-dir "$DATA_DIR" --model-name tls_mlp --tls-ca ca.pem \
        --tls-cert worker.pem --tls-key worker.key --tls-server-name ps-server \
        >w0.out 2>w0.log &
    w0=$!
    pids+=("$w0")
    wait_for "$w0" 90 || fail "ps-worker over TLS exited $?"
    acc=$(accuracy_of w0.out)
    [ -n "$acc" ] || fail "ps-worker printed no test_accuracy= line"
    awk -v a="$acc" 'BEGIN { exit !(a >= 0.75) }' || fail "test accuracy $acc < 0.75 over TLS"
    grep -q "refused" train.log && fail "the server refused a connection of the TLS worker"
    echo "ok   training over TLS: test accuracy $acc after 1 epoch"
    kill -TERM "$server"
    wait_for "$server" 10 || fail "ps-server exited $? after SIGTERM"
fi
echo "all TLS and role checks passed"
