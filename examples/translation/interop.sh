#!/usr/bin/env bash
# The PyTorch round trip (make interop; ctest: torch_roundtrip): a small model trained by
# `translate` is loaded into torch.nn.Transformer, and a PyTorch model's weights become a graft run
# that `translate` loads and decodes; both directions compare logits, loss and every gradient on
# one batch (examples/translation/torch_roundtrip.py). Exit 77 (ctest: skipped) where PyTorch is
# not installed.
#   examples/translation/interop.sh BUILD_DIR
set -euo pipefail
BUILD=$(cd "$1" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
T=$BUILD/examples/translation/translate
W=$(mktemp -d /tmp/graft_interop.XXXXXX)
trap '[[ -n ${KEEP:-} ]] || rm -rf "$W"' EXIT
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}

"$T" generate-data --out "$W/data" --seed 3 --train 400 --valid 20 --test 5 >/dev/null
"$T" train --data "$W/data" --out "$W/run" --preset tiny --steps 40 --vocab 100 --warmup 10 --valid-every 40 \
  >/dev/null 2>"$W/train.log" || { cat "$W/train.log" >&2; exit 1; }
/usr/bin/python3 "$HERE/torch_roundtrip.py" --translate "$T" --run "$W/run" --work "$W/check"
