# shellcheck shell=bash
# Network namespaces as separate hosts, for tests/integration/test_netns.sh and
# bench/netns_bench.sh (source this file; needs root, iproute2, and iptables for loss).
#
#   netns_skip_reason            prints why namespaces cannot be used here (empty: they can)
#   netns_create N               N hosts: namespaces $NETNS_PREFIX-h0..h(N-1), each with lo and
#                                an eth0 at 10.77.$NETNS_NET.(i+1)/24, all cabled by veth pairs to
#                                a bridge in a namespace of its own ($NETNS_PREFIX-br). Nothing
#                                is created in the caller's namespace.
#   netns_addr I                 host I's address
#   netns_exec I CMD...          runs CMD in host I (exec: the pid stays the command's)
#   netns_loss I PERCENT         host I drops PERCENT % of the packets it receives on eth0
#                                (iptables statistic match; 0 removes the rule)
#   netns_link I up|down         cuts or restores host I's cable (its port on the bridge)
#   netns_destroy                kills what runs in the namespaces, deletes them (and with them
#                                the veths, the bridge and the iptables rules); safe to call
#                                twice or after a partial netns_create
#
# NETNS_PREFIX and NETNS_NET are chosen at random when sourced (psnt-XXXXXX, 10.77.(64..191).0/24);
# every namespace name starts with the prefix, so runs side by side do not clash.

NETNS_PREFIX=${NETNS_PREFIX:-psnt-$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')}
NETNS_NET=${NETNS_NET:-$((64 + RANDOM % 128))}

netns_skip_reason() {
    if [ "$(id -u)" -ne 0 ]; then
        echo "not root (network namespaces need CAP_SYS_ADMIN and CAP_NET_ADMIN)"
        return
    fi
    if ! command -v ip >/dev/null 2>&1; then
        echo "ip (iproute2) not installed"
        return
    fi
    local probe="$NETNS_PREFIX-probe" err
    if ! err=$(ip netns add "$probe" 2>&1); then
        echo "ip netns add failed: $err"
        return
    fi
    if ! err=$(ip link add name pv0 netns "$probe" type veth peer name pv1 netns "$probe" 2>&1); then
        ip netns del "$probe" 2>/dev/null
        echo "veth pairs unavailable: $err"
        return
    fi
    ip netns del "$probe"
}

netns_addr() { echo "10.77.$NETNS_NET.$(($1 + 1))"; }

netns_exec() {
    local i=$1
    shift
    exec ip netns exec "$NETNS_PREFIX-h$i" "$@"
}

netns_create() {
    local n=$1 i ns br="$NETNS_PREFIX-br"
    ip netns add "$br" || return 1
    ip -n "$br" link add br0 type bridge || return 1
    ip -n "$br" link set br0 up || return 1
    ip -n "$br" link set lo up || return 1
    for ((i = 0; i < n; i++)); do
        ns="$NETNS_PREFIX-h$i"
        ip netns add "$ns" || return 1
        ip -n "$ns" link set lo up || return 1
        ip link add name eth0 netns "$ns" type veth peer name "p$i" netns "$br" || return 1
        ip -n "$br" link set "p$i" master br0 || return 1
        ip -n "$br" link set "p$i" up || return 1
        ip -n "$ns" addr add "$(netns_addr "$i")/24" dev eth0 || return 1
        ip -n "$ns" link set eth0 up || return 1
    done
    return 0
}

netns_loss() {
    local ns="$NETNS_PREFIX-h$1" pct=$2
    ip netns exec "$ns" iptables -F INPUT || return 1
    [ "$pct" = 0 ] && return 0
    ip netns exec "$ns" iptables -A INPUT -i eth0 -m statistic --mode random \
        --probability "$(awk -v p="$pct" 'BEGIN { printf "%.4f", p / 100 }')" -j DROP
}

netns_link() {
    ip -n "$NETNS_PREFIX-br" link set "p$1" "$2"
}

netns_destroy() {
    local ns pids
    for ns in $(ip netns list 2>/dev/null | awk '{ print $1 }' | grep "^$NETNS_PREFIX-"); do
        pids=$(ip netns pids "$ns" 2>/dev/null)
        if [ -n "$pids" ]; then
            # shellcheck disable=SC2086
            kill -KILL $pids 2>/dev/null
        fi
        ip netns del "$ns" 2>/dev/null
    done
}
