#!/usr/bin/env bash
# Nothing lost at any kill point (ctest: kill_every_file_op). For translate, lm and classify a
# short training run is killed with SIGKILL just before each file operation on its run directory
# in turn (every fsync, rename, link, symlink, unlink, mkdir and rmdir of the start and of two
# checkpoints, counted by the LD_PRELOAD shim tests/fileop_shim.c), then resumed with --resume to
# its end. After each, the run's metrics.csv (less the timing column), its best weights
# (model.safetensors) and its train state (tensors and metadata, less the elapsed time) must be
# those of an uninterrupted run. A kill before the run wrote its config leaves nothing to resume:
# --resume must say so, and the run then starts afresh.
#
# MODE fail (ctest: fail_every_file_op) makes each operation fail instead, with EIO or ENOSPC
# (odd operations EIO, even ones ENOSPC; FAIL_ERRNOS="EIO ENOSPC" tries both at each), counting
# also the creating opens, fflush and fclose a write can fail at (GRAFT_FILEOP_MORE). The run
# must end either well or with exit code 2 and a message naming the errno, and then --resume
# must take it to the same record, with no leftovers.
#   tests/kill_every_file_op.sh BUILD_DIR SHIM [STRIDE] [kill|fail]   (STRIDE n: every n-th operation)
set -euo pipefail
BUILD=$(cd "$1" && pwd)
SHIM=$2
STRIDE=${3:-1}
MODE=${4:-kill}
[[ $MODE == kill || $MODE == fail ]] || { echo "kill_every_file_op: MODE must be kill or fail, got '$MODE'" >&2; exit 2; }
NAME=${MODE}_every_file_op
VERB=$([[ $MODE == kill ]] && echo "killed before" || echo "failed at")
[[ $MODE == kill ]] || export GRAFT_FILEOP_MORE=1
W=$(mktemp -d "${TMPDIR:-/tmp}/graft_kill_ops.XXXXXX")
trap '[[ -n ${KEEP:-} ]] || rm -rf "$W"' EXIT  # KEEP=1 keeps the runs for a look
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
# The sanitizer build's runtime must come first among the libraries; the shim only wraps libc.
export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0

T=$BUILD/examples/translation/translate
LM=$BUILD/examples/lm/lm
CL=$BUILD/examples/classify/classify

"$T" generate-data --out "$W/tdata" --seed 3 --train 200 --valid 10 --test 5 >/dev/null
python3 -c "import sys; open(sys.argv[1],'w').write(''.join(f'a rolling stone {i} gathers no moss\n%\n' for i in range(60)))" "$W/text.txt"
mkdir -p "$W/cdata"
python3 - "$W/cdata" <<'EOF'
import sys
lines = [f"en\tthe cat {i} sat on the mat" if i % 2 else f"de\tdie Katze {i} sitzt auf der Matte" for i in range(40)]
open(sys.argv[1] + "/train.tsv", "w").write("\n".join(lines) + "\n")
open(sys.argv[1] + "/valid.tsv", "w").write("\n".join(lines[:10]) + "\n")
EOF

# Each program's command: 6 steps, a checkpoint every 3 (a first one, and one that replaces it).
train_cmd() {  # program run_dir
  case $1 in
    translate) echo "$T" train --data "$W/tdata" --out "$2" --steps 6 --valid-every 3 --log-every 3 \
                 --batch-tokens 256 --vocab 60 --warmup 10 --seed 5 ;;
    lm) echo "$LM" train --text "$W/text.txt" --out "$2" --steps 6 --valid-every 3 --context 16 \
          --batch-rows 4 --seed 5 ;;
    classify) echo "$CL" train --data "$W/cdata" --out "$2" --steps 6 --valid-every 3 \
                --ngram-buckets 256 --batch-rows 8 --seed 5 ;;
  esac
}

# The run's record, less what may differ between two equal runs: tokens/s, the training time,
# and the fingerprints of side files (spm.model records the path it was trained under).
record() {  # run_dir
  python3 - "$1" <<'EOF'
import hashlib, json, struct, sys
run = sys.argv[1]
def safetensors(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    meta = h.pop("__metadata__", {})
    return h, b[8 + n:], meta
out = []
for line in open(run + "/metrics.csv"):
    cells = line.rstrip("\n").split(",")
    out.append(",".join(cells[:3] + cells[4:]))
h, data, meta = safetensors(run + "/model.safetensors")
out += [json.dumps(h, sort_keys=True), hashlib.sha256(data).hexdigest(), "best step " + meta.get("step", "?")]
h, data, meta = safetensors(run + "/train_state.safetensors")
trainer = json.loads(meta["trainer"])
for k in ("elapsed_bits", "tied"):
    trainer.pop(k, None)
out += [json.dumps(h, sort_keys=True), hashlib.sha256(data).hexdigest(), json.dumps(trainer, sort_keys=True), meta["optimizer"]]
print("\n".join(out))
EOF
}

# A fresh run stopped at file operation n: killed before it (kill), or seeing it fail with
# errno $3 (fail). Returns the exit status in $rc.
interrupt() {  # program n errno run log
  local n=$2 cmd
  read -ra cmd <<<"$(train_cmd "$1" "$4")"
  rc=0
  if [[ $MODE == kill ]]; then
    GRAFT_FILEOP_DIR="$4" GRAFT_FILEOP_KILL=$n LD_PRELOAD=$SHIM "${cmd[@]}" >"$5" 2>&1 || rc=$?
  else
    GRAFT_FILEOP_DIR="$4" GRAFT_FILEOP_FAIL=$n GRAFT_FILEOP_ERRNO=$3 LD_PRELOAD=$SHIM "${cmd[@]}" >"$5" 2>&1 || rc=$?
  fi
}

# The message a failure with errno $1 must carry.
strerror() { case $1 in EIO) echo "Input/output error" ;; ENOSPC) echo "No space left on device" ;; esac; }

# One interruption: a fresh run stopped at file operation n, resumed to its end, compared. Runs
# in a directory of its own.
interrupt_and_resume() {  # program n errno
  local prog=$1 n=$2 err=$3 run=$W/$prog-$2-$3-run op cmd
  op=$(sed -n "${n}p" "$W/$prog.ops")
  read -ra cmd <<<"$(train_cmd "$prog" "$run")"
  interrupt "$prog" "$n" "$err" "$run" "$run.log"
  if [[ $MODE == kill && $rc -ne 137 ]]; then
    echo "$NAME: $prog: the run was not killed before '$op' (exit $rc)" >&2
    return 1
  fi
  if [[ $MODE == fail ]]; then
    if [[ $rc -ne 0 && $rc -ne 2 ]]; then
      echo "$NAME: $prog: the run failed at '$op' ($err) with exit $rc, not 0 or 2:" >&2
      tail -n 5 "$run.log" >&2
      return 1
    fi
    if [[ $rc -eq 2 ]] && ! grep -q "$(strerror "$err")" "$run.log"; then
      echo "$NAME: $prog: the failure at '$op' ($err) does not say '$(strerror "$err")':" >&2
      tail -n 3 "$run.log" >&2
      return 1
    fi
  fi
  rc=0
  "${cmd[@]}" --resume >"$run.log" 2>&1 || rc=$?
  if [[ $rc -eq 2 ]] && grep -q "nothing to resume" "$run.log"; then
    rc=0  # stopped before the run wrote its config: afresh
    "${cmd[@]}" >"$run.log" 2>&1 || rc=$?
  fi
  if [[ $rc -ne 0 ]]; then
    echo "$NAME: $prog: the resume after '$op' ($MODE $err) failed (exit $rc):" >&2
    tail -n 5 "$run.log" >&2
    return 1
  fi
  if [[ $(record "$run") != "$(cat "$W/$prog.want")" ]]; then
    echo "$NAME: $prog: after '$op' ($MODE $err) the run differs from the uninterrupted one:" >&2
    diff "$W/$prog.want" <(record "$run") | head -n 10 >&2
    return 1
  fi
  if ls -a "$run" | grep -q '\.tmp\.\|graft-new-link' || [[ $(ls -d "$run"/ckpt-* | wc -l) -ne 1 ]]; then
    echo "$NAME: $prog: leftovers after '$op' ($MODE $err): $(ls -a "$run")" >&2
    return 1
  fi
  rm -rf "$run" "$run.log"
}

# The errnos operation n fails with.
errnos() {  # n
  if [[ $MODE == kill ]]; then echo -; elif [[ -n ${FAIL_ERRNOS:-} ]]; then echo "$FAIL_ERRNOS"
  elif (($1 % 2)); then echo EIO; else echo ENOSPC; fi
}

# Two runs at a time, one thread each: the runs are tiny, and the test stays short.
export OMP_NUM_THREADS=1
kills=0
for prog in ${PROGRAMS:-translate lm classify}; do  # PROGRAMS=lm: one of them
  read -ra whole <<<"$(train_cmd $prog "$W/$prog-whole")"
  if ! GRAFT_FILEOP_DIR="$W/$prog-whole" GRAFT_FILEOP_LOG="$W/$prog.ops" LD_PRELOAD=$SHIM "${whole[@]}" >"$W/log" 2>&1; then
    echo "$NAME: $prog: the uninterrupted run failed:" >&2
    tail -n 5 "$W/log" >&2
    exit 1
  fi
  record "$W/$prog-whole" >"$W/$prog.want"
  ops=$(wc -l <"$W/$prog.ops")
  [[ $ops -gt 20 ]] || { echo "$NAME: $prog: only $ops file operations counted" >&2; exit 1; }
  for ((n = 1; n <= ops; n += STRIDE)); do
    for err in $(errnos "$n"); do
      (interrupt_and_resume "$prog" "$n" "$err" || touch "$W/failed") &
      kills=$((kills + 1))
      [[ $(jobs -rp | wc -l) -lt 2 ]] || wait -n || true
    done
  done
  wait
  [[ ! -e $W/failed ]] || exit 1
  echo "$NAME: $prog: $ops file operations, $VERB $(( (ops + STRIDE - 1) / STRIDE )) of them, each resumed to the uninterrupted run's metrics, best weights and train state"
done
echo "$NAME: $kills ${MODE}s, nothing lost"
