#!/usr/bin/env bash
# Crash safety (ctest: kill_resume): a training run killed with SIGKILL KILLS times, each resume
# killed again, ends with weights bit-identical to an uninterrupted run's. After every kill the
# run directory must load: either it holds a train state that --resume accepts, or the kill came
# before the first state was written and the run starts afresh.
#
# The kill moments are random file operations on the run directory (SentencePiece's files, the
# config, the atomic saves and commits), counted by the LD_PRELOAD shim tests/fileop_shim.c, each
# within a start's first two checkpoints: what a kill leaves on disk depends only on the last file
# operation before it, so these moments reach every state a kill at any time can, and the test's
# cost is bounded in runs and steps, not wall time (a loaded machine makes it slower, never
# flaky).
#   tests/kill_resume.sh BUILD_DIR SHIM [KILLS]
set -euo pipefail
BUILD=$(cd "$1" && pwd)
SHIM=$2
KILLS=${3:-20}
T=$BUILD/examples/translation/translate
W=$(mktemp -d "${TMPDIR:-/tmp}/graft_kill_resume.XXXXXX")
trap '[[ -n ${KEEP:-} ]] || rm -rf "$W"' EXIT  # KEEP=1 keeps the runs for a look
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
# The sanitizer build's runtime must come first among the libraries; the shim only wraps libc.
export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0

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

GRAFT_FILEOP_DIR="$W/whole" GRAFT_FILEOP_LOG="$W/whole.ops" LD_PRELOAD=$SHIM \
  "$T" train "${ARGS[@]}" --out "$W/whole" >/dev/null 2>&1
ops=$(wc -l <"$W/whole.ops")
# Each start is killed within as many operations as a fresh run makes up to its second commit
# (SentencePiece, the config and two checkpoints; a resumed run gets through two or three in
# them), so it costs a few steps and the next resume goes on from where it was: the kills walk
# through the whole run, a fresh start now and then when one came before the first checkpoint.
window=$(grep -n ' rename .*/checkpoint$' "$W/whole.ops" | sed -n '2s/:.*//p')
window=${window:-$ops}

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
  # Before which of this start's file operations the kill comes (one the start may not reach
  # lets it finish); none once KILLS kills were made.
  kill_at=0
  [[ $kills -lt $KILLS ]] && kill_at=$((RANDOM % window + 1))
  rc=0
  GRAFT_FILEOP_DIR="$W/split" GRAFT_FILEOP_KILL=$kill_at LD_PRELOAD=$SHIM \
    "$T" train "${ARGS[@]}" --out "$W/split" "${resume[@]}" >"$W/log" 2>&1 || rc=$?
  if [[ $rc -eq 137 ]]; then
    # Whatever the kill interrupted, no temp file may be mistaken for a state, and a state
    # that exists must be whole (the next --resume checks it; a corrupt one fails the test).
    kills=$((kills + 1))
    continue
  fi
  if [[ $rc -ne 0 ]]; then
    echo "kill_resume: a run failed (exit $rc):" >&2
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
done

if ! same_weights "$W/whole/model.safetensors" "$W/split/model.safetensors"; then
  echo "kill_resume: after $kills kills the weights differ from the uninterrupted run's" >&2
  exit 1
fi
if ls "$W/split" | grep -q '\.tmp\.'; then
  echo "kill_resume: temp files of killed saves were left behind: $(ls "$W/split")" >&2
  exit 1
fi
echo "kill_resume: $kills kills (each within a start's first $window of the run's $ops file operations) over $attempts starts; final weights bit-identical to the uninterrupted run"
