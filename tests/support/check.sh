# shellcheck shell=bash
# The command-line tests' check (source it; the test sets fail=0 first and reads $fail at the
# end):
#   check NAME WANT-EXIT TEXT CMD...   runs CMD; ok when it exits WANT-EXIT and prints TEXT, else
#                                      FAIL with the last 40 lines of its output and fail=1

check() {
    local name=$1 want=$2 text=$3
    shift 3
    out=$("$@" 2>&1)
    rc=$?
    if [ "$rc" -ne "$want" ] || ! grep -q -- "$text" <<<"$out"; then
        echo "FAIL $name: exit $rc (want $want), output: $(tail -n 40 <<<"$out")"
        fail=1
    else
        echo "ok   $name"
    fi
}
