#!/usr/bin/env bash
# Loading the base model's weights, file to first token, fp32 / bf16 / int8 (issue 49). bench/run.sh
# runs it after its own report; it also runs alone:
#   bench/load_bench.sh [BUILD_DIR] [MD] [ROUNDS]   (defaults: build, bench/results/latest.md, 3)
# Saves the base decoding model once as a translate run directory (graft_bench --what save_model),
# writes its int8 and bf16 exports (--what export), then loads it in a fresh process per row and
# round (--what load: load, keep_for_inference, the first decoded token of one sentence) as
# translate does: fp32 (model.safetensors), bf16 and int8 from their exports, and bf16 and int8
# converted after loading the float32 file (a copy of the run without exports). The rows run
# interleaved, ROUNDS rounds; the best time and the lowest peak RSS of each are kept. Prints a
# markdown table and appends (or replaces) its section of MD.
set -euo pipefail

cd "$(dirname "$0")/.."
BUILD=${1:-build}
MD=${2:-bench/results/latest.md}
ROUNDS=${3:-3}
GB="$BUILD/bench/graft_bench"
export OMP_NUM_THREADS=${BENCH_THREADS:-2}
DIR=$(mktemp -d /tmp/graft_load.XXXXXX)
trap 'rm -rf "$DIR"' EXIT

"$GB" --what save_model --config base --out "$DIR/run" >/dev/null
mkdir "$DIR/convert"
cp "$DIR/run/config.json" "$DIR/run/model.safetensors" "$DIR/convert/"
for p in int8 bf16; do "$GB" --what export --model "$DIR/run" --precision $p >/dev/null; done

ROWS=("fp32 run" "bf16 run" "bf16 convert" "int8 run" "int8 convert")
declare -A best_ms first_ms peak_mib
field() { sed -n "s/.*\"$2\": *\\([0-9.eE+-]*\\).*/\\1/p" <<<"$1"; }
for ((r = 0; r < ROUNDS; ++r)); do
  for row in "${ROWS[@]}"; do
    read -r p where <<<"$row"
    line=$("$GB" --what load --model "$DIR/$where" --precision "$p" | grep '^RESULT ')
    total=$(field "$line" total_ms) first=$(field "$line" first_token_ms) rss=$(field "$line" peak_rss_mib)
    if [ -z "${best_ms[$row]:-}" ] || awk -v a="$total" -v b="${best_ms[$row]}" 'BEGIN { exit !(a < b) }'; then
      best_ms[$row]=$total first_ms[$row]=$first
    fi
    if [ -z "${peak_mib[$row]:-}" ] || awk -v a="$rss" -v b="${peak_mib[$row]}" 'BEGIN { exit !(a < b) }'; then
      peak_mib[$row]=$rss
    fi
  done
done

size() { awk -v b="$(stat -c %s "$1")" 'BEGIN { printf "%.1f", b / 1048576 }'; }
{
  echo "## Loading base: file to first token ($OMP_NUM_THREADS threads, best of $ROUNDS)"
  echo
  echo "| precision | file | file MiB | load + first token ms | of which first token ms | peak RSS MiB |"
  echo "|---|---|---:|---:|---:|---:|"
  for row in "${ROWS[@]}"; do
    read -r p where <<<"$row"
    case $row in
      "fp32 run" | *convert) file=model.safetensors ;;
      *) file=model.$p.safetensors ;;
    esac
    label=$p
    [ "$where" = convert ] && label="$p (converted after loading float32)"
    printf '| %s | %s | %s | %.0f | %.0f | %.0f |\n' "$label" "$file" "$(size "$DIR/run/$file")" \
      "${best_ms[$row]}" "${first_ms[$row]}" "${peak_mib[$row]}"
  done
} >"$DIR/section.md"
cat "$DIR/section.md"
if [ -f "$MD" ]; then
  # Replace an earlier section of this script (up to the next "## " heading), else append.
  awk -v sec="$DIR/section.md" '
    /^## Loading base: file to first token/ { skip = 1; while ((getline l < sec) > 0) print l; next }
    skip && /^## / { skip = 0 }
    !skip { print }' "$MD" >"$DIR/md"
  grep -q '^## Loading base: file to first token' "$MD" || { echo; cat "$DIR/section.md"; } >>"$DIR/md"
  cp "$DIR/md" "$MD"
fi
