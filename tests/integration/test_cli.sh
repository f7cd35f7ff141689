#!/usr/bin/env bash
# Command-line conventions of every executable:
#   --version prints "NAME VERSION", "protocol MAJOR.MINOR" and "features: CUDA ..., jemalloc
#   ..., OpenBLAS ..." on stdout and exits 0;
#   an unknown flag exits 2 with a message on stderr that starts with the program's name (not
#   its path) and says the flag is unknown; ps-local starts nothing then.
#
#   test_cli.sh VERSION EXECUTABLE...
# An executable given as a path that does not exist (optional programs) is skipped.
set -u
version=${1:?version}
shift
fails=0
fail() {
    echo "FAIL: $*" >&2
    fails=$((fails + 1))
}
checked=0
for exe in "$@"; do
    [ -x "$exe" ] || { echo "skip $exe (not built)"; continue; }
    name=$(basename "$exe")
    out=$("$exe" --version 2>&1)
    rc=$?
    [ "$rc" -eq 0 ] || fail "$name --version exited $rc"
    printf '%s\n' "$out" | sed -n 1p | grep -qx "$name $version" ||
        fail "$name --version: first line is '$(printf '%s\n' "$out" | sed -n 1p)', expected '$name $version'"
    printf '%s\n' "$out" | grep -qE '^protocol [0-9]+\.[0-9]+$' || fail "$name --version: no protocol line"
    printf '%s\n' "$out" | grep -qE '^features: CUDA (yes|no), jemalloc (yes|no), OpenBLAS (yes|no)$' ||
        fail "$name --version: no features line"
    case "$name" in
    ps-checkpoint-bench) ;; # takes positional arguments only
    ps-options-doc)
        err=$("$exe" --no-such-flag x 2>&1 >/dev/null)
        rc=$?
        [ "$rc" -eq 2 ] || fail "$name --no-such-flag exited $rc, expected 2"
        case "$err" in "$name:"*) ;; *) fail "$name: message does not start with '$name:': $err" ;; esac
        ;;
    *)
        err=$("$exe" --no-such-flag 2>&1 >/dev/null)
        rc=$?
        [ "$rc" -eq 2 ] || fail "$name --no-such-flag exited $rc, expected 2"
        # JSON (no terminal) or plain text: the program's name comes first either way.
        msg=$(printf '%s\n' "$err" | head -n 1)
        case "$msg" in
        "$name:"* | *"\"role\":\"$name\""*) ;;
        *) fail "$name: message does not start with '$name': $msg" ;;
        esac
        printf '%s\n' "$err" | grep -q 'unknown option' || fail "$name: message does not say 'unknown option': $err"
        if printf '%s\n' "$err" | grep -q started; then
            fail "$name started processes for a bad flag: $err"
        fi
        ;;
    esac
    checked=$((checked + 1))
done
[ "$checked" -gt 0 ] || fail "no executable checked"
[ "$fails" -eq 0 ] || exit 1
echo "PASS ($checked executables)"
