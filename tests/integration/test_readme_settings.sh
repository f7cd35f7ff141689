#!/usr/bin/env bash
# README.md's settings tables must be what the option table generates.
#
#   test_readme_settings.sh PS_OPTIONS_DOC README.md
#
# Regenerates every table between <!-- settings:SECTION --> and <!-- /settings --> with
# ps-options-doc and fails, printing the diff and the command that updates the README, when
# the file differs. Also fails when the README has none of the five tables.
set -u
doc=${1:?ps-options-doc}
readme=${2:?README.md}

for section in server client worker local bench; do
    grep -qx "<!-- settings:$section -->" "$readme" || {
        echo "FAIL: $readme has no <!-- settings:$section --> table" >&2
        exit 1
    }
done
tmp=$(mktemp /tmp/ps-readme-XXXXXX)
trap 'rm -f "$tmp"' EXIT
"$doc" --print "$readme" >"$tmp" || {
    echo "FAIL: ps-options-doc --print $readme exited $?" >&2
    exit 1
}
if ! diff -u --label "$readme" --label "$readme (generated)" "$readme" "$tmp"; then
    echo >&2
    echo "FAIL: the settings tables of $readme differ from the option table" >&2
    echo "      (common/options_table.def). Regenerate them with" >&2
    echo "          meson compile -C BUILD_DIR readme-settings" >&2
    echo "      or  BUILD_DIR/common/ps-options-doc --update README.md" >&2
    exit 1
fi
echo "PASS"
