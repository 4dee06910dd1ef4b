#!/usr/bin/env bash
# Crash safety (ctest: kill_resume): a training run killed with SIGKILL at KILLS random moments
# (SentencePiece training, steps, validations, the atomic saves) and resumed each time ends with
# weights bit-identical to an uninterrupted run's. After every kill the run directory must load:
# either it holds a train state that --resume accepts, or the kill came before the first state
# was written and the run starts afresh.
#   tests/kill_resume.sh BUILD_DIR [KILLS]
set -euo pipefail
BUILD=$(cd "$1" && pwd)
KILLS=${2:-20}
T=$BUILD/examples/translation/translate
W=$(mktemp -d "${TMPDIR:-/tmp}/graft_kill_resume.XXXXXX")
trap '[[ -n ${KEEP:-} ]] || rm -rf "$W"' EXIT  # KEEP=1 keeps the runs for a look
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}

"$T" generate-data --out "$W/data" --seed 3 --train 400 --valid 20 --test 5 >/dev/null
# Saves every 3 steps, so kills land inside saves too.
ARGS=(--data "$W/data" --steps 45 --batch-tokens 512 --vocab 100 --warmup 10 --valid-every 3 --log-every 3 --seed 5)

# The same tensors, bit for bit (the files' metadata differ: spm.model records its own path, so
# its fingerprint differs between two run directories).
same_weights() {
  python3 - "$1" "$2" <<'EOF'
import json, struct, sys
def tensors(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    h.pop("__metadata__", None)
    return h, b[8 + n:]
sys.exit(0 if tensors(sys.argv[1]) == tensors(sys.argv[2]) else 1)
EOF
}

start=$(date +%s%N)
"$T" train "${ARGS[@]}" --out "$W/whole" >/dev/null 2>&1
whole_ms=$((($(date +%s%N) - start) / 1000000))

RANDOM=7  # the kill moments are random but the same on every run of the test
kills=0 attempts=0
while :; do
  attempts=$((attempts + 1))
  if [[ $attempts -gt $((KILLS * 4 + 10)) ]]; then
    echo "kill_resume: no progress after $attempts attempts" >&2
    exit 1
  fi
  if [[ -f $W/split/train_state.safetensors ]]; then
    resume=(--resume)
  else
    rm -rf "$W/split"  # killed before the first state: nothing to resume, start afresh
    resume=()
  fi
  "$T" train "${ARGS[@]}" --out "$W/split" "${resume[@]}" >"$W/log" 2>&1 &
  pid=$!
  if [[ $kills -lt $KILLS ]]; then
    # A moment within the uninterrupted run's duration, in milliseconds.
    ms=$(((RANDOM << 15 | RANDOM) % (whole_ms + 1)))  # RANDOM alone stops at 32767
    sleep "$((ms / 1000)).$(printf '%03d' $((ms % 1000)))"
    if kill -9 "$pid" 2>/dev/null; then
      rc=0
      wait "$pid" 2>/dev/null || rc=$?
      if [[ $rc -ne 137 && $rc -ne 0 ]]; then
        echo "kill_resume: a run failed before the kill came (exit $rc):" >&2
        tail -n 5 "$W/log" >&2
        exit 1
      fi
      [[ $rc -eq 137 ]] && kills=$((kills + 1))
      # Whatever the kill interrupted, no temp file may be mistaken for a state, and a state
      # that exists must be whole (the next --resume checks it; a corrupt one fails the test).
      continue
    fi
  fi
  if ! wait "$pid"; then
    echo "kill_resume: a resumed run failed:" >&2
    tail -n 5 "$W/log" >&2
    exit 1
  fi
  [[ $kills -ge $KILLS ]] && break
  # It finished before the kill came: compare, then go again from scratch for more kills.
  if ! same_weights "$W/whole/model.safetensors" "$W/split/model.safetensors"; then
    echo "kill_resume: after $kills kills the weights differ from the uninterrupted run's" >&2
    exit 1
  fi
  rm -rf "$W/split"
  # The uninterrupted run may have been timed on a busier machine (ctest runs tests side by
  # side): a run that outlives no kill narrows the window, so kills keep landing.
  whole_ms=$((whole_ms * 2 / 3 > 300 ? whole_ms * 2 / 3 : 300))
done

if ! same_weights "$W/whole/model.safetensors" "$W/split/model.safetensors"; then
  echo "kill_resume: after $kills kills the weights differ from the uninterrupted run's" >&2
  exit 1
fi
if ls "$W/split" | grep -q '\.tmp\.'; then
  echo "kill_resume: temp files of killed saves were left behind: $(ls "$W/split")" >&2
  exit 1
fi
echo "kill_resume: $kills kills over $attempts starts; final weights bit-identical to the uninterrupted run"
