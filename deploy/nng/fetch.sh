#!/usr/bin/env bash
# Fetches Debian's source package of nng 1.5.2 into subprojects/nng (git-ignored) and applies
# deploy/nng/patches/*.patch, for the build to link a fixed nng statically (docs/design.md,
# "nng"). The build uses it only while the system's nng is older than 1.6.0.
#
# Idempotent: a tree whose stamp (subprojects/nng/.psd-patches) names the current patches is
# left alone at once. Otherwise the source is downloaded with apt-get from deb-src entries for
# the archives this machine already uses (read from /etc/apt/sources.list, sources.list.d/*.list
# and deb822 sources.list.d/*.sources), through a private apt state in a temporary directory:
# the system's apt configuration and lists are not touched, and root is not needed.
# Needs apt-get, dpkg-source (dpkg-dev, part of build-essential) and patch.
set -euo pipefail

version=1.5.2-2
root=$(cd "$(dirname "$0")/../.." && pwd)
patches="$root/deploy/nng/patches"
dest="$root/subprojects/nng"

# The stamp: one "sha256  name" line per patch, in order (meson.build computes the same).
stamp=$(cd "$patches" && for p in *.patch; do
    printf '%s  %s\n' "$(sha256sum "$p" | cut -d' ' -f1)" "$p"
done)
if [ -f "$dest/.psd-patches" ] && [ "$(cat "$dest/.psd-patches")" = "$stamp" ]; then
    exit 0
fi

for tool in apt-get dpkg-source patch; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "nng/fetch: $tool is missing (install build-essential and patch)" >&2
        exit 1
    fi
done

work=$(mktemp -d "${TMPDIR:-/tmp}/psd-nng.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/cache/archives/partial" "$work/src"

# deb-src lines for the binary archives the machine uses (main component only).
{
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -f "$f" ] || continue
        awk '$1 == "deb" {
                opts = ""; i = 2
                if ($2 ~ /^\[/) { while (i <= NF && $i !~ /\]$/) { opts = opts " " $i; i++ }
                                  opts = opts " " $i; i++ }
                uri = $i; suite = $(i + 1)
                for (j = i + 2; j <= NF; j++) if ($j == "main") {
                    sub(/^ /, "", opts)
                    print "deb-src " (opts != "" ? opts " " : "") uri " " suite " main"
                }
            }' "$f"
    done
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] || continue
        # deb822: stanzas separated by blank lines; continuation lines start with a space.
        awk 'function flush() {
                if (types ~ /(^| )deb( |$)/ && comps ~ /(^| )main( |$)/ && enabled !~ /^no$/) {
                    n = split(uris, u, " "); m = split(suites, s, " ")
                    opt = (signed ~ /^\//) ? "[signed-by=" signed "] " : ""
                    for (a = 1; a <= n; a++) for (b = 1; b <= m; b++)
                        print "deb-src " opt u[a] " " s[b] " main"
                }
                types = uris = suites = comps = signed = enabled = ""
            }
            /^[ \t]*$/ { flush(); next }
            /^#/ { next }
            /^[ \t]/ { next }
            { key = tolower($1); sub(/:$/, "", key); $1 = ""; sub(/^ +/, "")
              if (key == "types") types = $0
              else if (key == "uris") uris = $0
              else if (key == "suites") suites = $0
              else if (key == "components") comps = $0
              else if (key == "signed-by") signed = $0
              else if (key == "enabled") enabled = tolower($0) }
            END { flush() }' "$f"
    done
} | sort -u >"$work/sources.list"
if [ ! -s "$work/sources.list" ]; then
    echo "nng/fetch: no Debian archive with a main component in /etc/apt/sources.list or" \
        "/etc/apt/sources.list.d/: cannot fetch nng's source" >&2
    exit 1
fi

apt=(apt-get -q -o Dir::Etc::SourceList="$work/sources.list" -o Dir::Etc::SourceParts=/nonexistent
    -o Dir::State::Lists="$work/lists" -o Dir::Cache="$work/cache"
    -o APT::Sandbox::User="$(id -un)")
archives=$(awk '{ i = 2; if ($2 ~ /^\[/) { while ($i !~ /\]$/) i++; i++ }
                  printf "%s%s %s", (NR > 1 ? ", " : ""), $i, $(i + 1) }' "$work/sources.list")
echo "nng/fetch: downloading Debian's source of nng $version (deb-src of $archives)" >&2
"${apt[@]}" update >"$work/update.log" 2>&1 || {
    cat "$work/update.log" >&2
    echo "nng/fetch: apt-get update of the deb-src entries failed" >&2
    exit 1
}
(cd "$work/src" && "${apt[@]}" source "nng=$version") >"$work/source.log" 2>&1 || {
    cat "$work/source.log" >&2
    echo "nng/fetch: apt-get source nng=$version failed (the patches are made for that version)" >&2
    exit 1
}

tree="$work/src/nng-1.5.2"
for p in "$patches"/*.patch; do
    patch -d "$tree" -p1 --batch --forward --quiet <"$p" || {
        echo "nng/fetch: $(basename "$p") does not apply to nng $version" >&2
        exit 1
    }
done
printf '%s\n' "$stamp" >"$tree/.psd-patches"

mkdir -p "$root/subprojects"
rm -rf "$dest"
mv "$tree" "$dest"
echo "nng/fetch: nng $version with $(ls "$patches"/*.patch | wc -l) patches in subprojects/nng" >&2
