#!/usr/bin/env bash
# The English fortunes (Debian's `fortunes` package, its UTF-8 ".u8" topic files less ascii-art)
# as a collection for `embed search`: one fortune per line, its lines joined by single spaces,
# those of 20 to 1000 characters, in file order.
#   examples/embed/fortunes_collection.sh [FORTUNES_DIR] > collection.txt
set -euo pipefail
dir=${1:-/usr/share/games/fortunes}
files=$(ls "$dir"/*.u8 2>/dev/null | grep -v '/ascii-art\.u8$' || true)
[ -n "$files" ] || { echo "fortunes_collection: no $dir/*.u8 (apt-get install fortunes)" >&2; exit 1; }
# Record separator: a line holding only "%". Control characters (old overstrikes) are dropped.
# shellcheck disable=SC2086
LC_ALL=C awk 'BEGIN { RS = "\n%\n" }
  { gsub(/[\001-\010\013-\037\177]/, ""); gsub(/[ \t\n\r]+/, " "); sub(/^ /, ""); sub(/ $/, "");
    if (length($0) >= 20 && length($0) <= 1000) print }' $files
