#!/usr/bin/env bash
# Length extrapolation (the experiment of the ALiBi paper, on Debian's English fortunes): the
# lm-mini model trained at context T once per position kind (same data, steps and seed), then
# bits per character on the validation documents at T, 2T and 4T (learned positions: T only,
# they do not exist past max_len = T).
#   examples/lm/extrapolation.sh BUILD_DIR [T] [STEPS] [KINDS]   (KINDS: e.g. "sinusoidal rope"; default all five)
set -euo pipefail
BUILD=${1:-build}
T=${2:-64}
STEPS=${3:-600}
KINDS=${4:-sinusoidal learned rope alibi relative}
LM=$BUILD/examples/lm/lm
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
echo "| positions | bpc at T=$T | 2T=$((2 * T)) | 4T=$((4 * T)) | train tokens/s |"
echo "|---|---:|---:|---:|---:|"
for p in $KINDS; do
  run=runs/lm_extrap_$p
  rm -rf "$run"
  tps=$("$LM" train --out "$run" --preset lm-mini --positions "$p" --context "$T" --batch-rows 32 --dropout 0.1 \
        --steps "$STEPS" --warmup 200 --valid-every "$STEPS" --seed 1 2>/dev/null |
        sed -n 's/.*(\([0-9.]*\) tokens\/s).*/\1/p')
  row="| $p"
  for c in "$T" $((2 * T)) $((4 * T)); do
    if [[ $p == learned && $c != "$T" ]]; then row="$row | n/a"; continue; fi
    bpc=$("$LM" evaluate --run "$run" --context "$c" | sed -n 's/.* \([0-9.]*\) bits\/char.*/\1/p')
    row="$row | $bpc"
  done
  echo "$row | $tps |"
done
