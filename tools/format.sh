#!/bin/sh
# Formats the C sources and headers smelt owns with the repository's .clang-format.
#
#   tools/format.sh [FILE...]          reformat in place
#   tools/format.sh --check [FILE...]  change nothing; list the files that are not
#                                      formatted and exit 1 if there are any
#
# Without FILEs it takes every *.c, *.h and *.cu file that git tracks or would
# track (new files included, ignored ones such as build folders left out),
# except data: tests/fixtures/, tests/corpus/ and tests/fuzz/corpus/. The lexer
# and parser that flex and bison generate live in build folders, so they are
# never formatted. CI runs the check with Debian 12's clang-format (14);
# another version may lay some lines out differently.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

check=0
case "${1:-}" in
--check) check=1; shift ;;
-h | --help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
-*) echo "usage: tools/format.sh [--check] [FILE...]" >&2; exit 2 ;;
esac

if ! command -v clang-format >/dev/null 2>&1; then
    echo "tools/format.sh: clang-format is not installed (tools/setup.sh installs it)" >&2
    exit 2
fi

# The owned files, one per line, relative to the repository root.
owned_files() {
    if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
        git ls-files --cached --others --exclude-standard -- '*.c' '*.h' '*.cu' \
            ':!tests/fixtures/' ':!tests/corpus/' ':!tests/fuzz/corpus/'
    else # an unpacked archive: the same set, by name
        find . \( -name .git -o -name '.cache' -o -path './build*' -o -path ./tests/fixtures \
            -o -path ./tests/corpus -o -path ./tests/fuzz/corpus \) -prune -o \
            -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' \) -print | sed 's|^\./||' | sort
    fi
}

list=$(mktemp)
trap 'rm -f "$list"' EXIT
if [ $# -gt 0 ]; then
    printf '%s\n' "$@" >"$list"
else
    owned_files >"$list"
fi

total=0
bad=0
unformatted=""
while IFS= read -r file; do
    [ -f "$file" ] || continue # tracked but deleted in this work tree
    total=$((total + 1))
    if [ "$check" -eq 1 ]; then
        clang-format --style=file --dry-run -Werror "$file" >/dev/null 2>&1 || {
            bad=$((bad + 1))
            unformatted="$unformatted $file"
        }
    else
        clang-format --style=file -i "$file"
    fi
done <"$list"

if [ "$check" -eq 0 ]; then
    echo "tools/format.sh: formatted $total files"
    exit 0
fi
if [ -z "$unformatted" ]; then
    echo "tools/format.sh: all $total files are formatted"
    exit 0
fi
echo "tools/format.sh: $bad of $total files are not formatted as .clang-format says" \
    "($(clang-format --version | sed 's/.*version //')):"
for file in $unformatted; do echo "    $file"; done
echo "Run tools/format.sh (or tools/format.sh FILE...) to reformat them."
exit 1
