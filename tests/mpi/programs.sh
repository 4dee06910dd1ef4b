#!/usr/bin/env bash
# The three programs under `mpirun -np 2 ... train`: each trains one model on two ranks (the
# summary line says so), rank 0 alone writing the run directory, and --resume continues it.
#   tests/mpi/programs.sh BUILD_DIR MPIEXEC
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
BUILD=$(cd "$1" && pwd)
mpiexec=$2
W=$(mktemp -d "${TMPDIR:-/tmp}/graft_mpi_programs.XXXXXX")
trap '[[ -n ${KEEP:-} ]] || rm -rf "$W"' EXIT
export OMP_NUM_THREADS=1
two() { bash "$here/mpirun.sh" "$mpiexec" 2 "$@"; }

# expect_run NAME LOG FILES...: the log says two ranks trained, rank 0 alone reported the result,
# and the run directory has FILES.
expect_run() {
  local name=$1 log=$2
  shift 2
  grep -q "data parallel: 2 ranks" "$log" || { echo "FAIL $name: no data-parallel summary"; cat "$log"; exit 1; }
  # Counted anywhere in a line: mpirun forwards a rank's stdout and stderr separately, so the
  # result can land right after a progress line whose newline has not arrived yet.
  [[ $(grep -o "trained steps" "$log" | wc -l) == 1 ]] || { echo "FAIL $name: not one result line"; cat "$log"; exit 1; }
  for f in "$@"; do [[ -s $f ]] || { echo "FAIL $name: $f missing"; exit 1; }; done
  echo "ok   $name: $(grep -m1 "data parallel: 2 ranks" "$log")"
}

T=$BUILD/examples/translation/translate
"$T" generate-data --out "$W/data" --seed 3 --train 300 --valid 20 --test 5 >/dev/null
two "$T" train --data "$W/data" --out "$W/tr" --preset tiny --steps 6 --vocab 100 --valid-every 3 \
  --batch-tokens 512 >"$W/tr.log" 2>&1 || { cat "$W/tr.log"; exit 1; }
expect_run translate "$W/tr.log" "$W/tr/model.safetensors" "$W/tr/train_state.safetensors" "$W/tr/metrics.csv"
[[ $(grep -c '^6,' "$W/tr/metrics.csv") == 1 ]] || { echo "FAIL translate: metrics.csv"; cat "$W/tr/metrics.csv"; exit 1; }
two "$T" train --data "$W/data" --out "$W/tr" --preset tiny --steps 9 --vocab 100 --valid-every 3 \
  --batch-tokens 512 --resume >"$W/tr2.log" 2>&1 || { cat "$W/tr2.log"; exit 1; }
grep -q "resumed at step 6" "$W/tr2.log" || { echo "FAIL translate: resume"; cat "$W/tr2.log"; exit 1; }
echo "ok   translate --resume: $(grep -m1 "resumed at step" "$W/tr2.log")"

python3 -c "import sys; open(sys.argv[1],'w').write(''.join(f'a rolling stone {i} gathers no moss\n%\n' for i in range(60)))" "$W/moss.txt"
two "$BUILD/examples/lm/lm" train --out "$W/lm" --text "$W/moss.txt" --steps 4 --context 16 --batch-rows 4 \
  --valid-every 2 --collective-timeout 60 >"$W/lm.log" 2>&1 || { cat "$W/lm.log"; exit 1; }
expect_run lm "$W/lm.log" "$W/lm/train_state.safetensors" "$W/lm/metrics.csv"

mkdir -p "$W/tsv"
python3 - "$W/tsv" <<'PY'
import sys
rows = [f"{lab}\t{w} {w} number {i}" for i in range(40) for lab, w in (("a", "apple"), ("b", "banana"))]
for name in ("train", "valid", "test"):
    open(f"{sys.argv[1]}/{name}.tsv", "w").write("\n".join(rows) + "\n")
PY
two "$BUILD/examples/classify/classify" train --data "$W/tsv" --out "$W/cl" --steps 4 --valid-every 2 --ngram-buckets 1024 \
  >"$W/cl.log" 2>&1 || { cat "$W/cl.log"; exit 1; }
expect_run classify "$W/cl.log" "$W/cl/train_state.safetensors" "$W/cl/metrics.csv" "$W/cl/model.safetensors"
