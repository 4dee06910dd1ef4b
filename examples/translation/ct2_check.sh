#!/usr/bin/env bash
# graft against CTranslate2 on the same weights (ctest: ctranslate2_check; make ctranslate2):
# the run is converted by ct2_convert.py and both decode the test set, greedy and beam 4 with the
# length penalty matched (ct2_check.py: >= 99% of sentences with the same ids, BLEU within 0.1).
#   examples/translation/ct2_check.sh BUILD_DIR [RUN TEST.tsv]
# Without RUN, a tiny model is trained for 300 steps on generated toy data (the ctest). The
# packages come from the virtual environment BUILD_DIR/pyvenv (bench/pyvenv.sh; `make test` and
# `make ctranslate2` fill it from PyPI): without ctranslate2 there, exit 77 (ctest: skipped) with
# a message. Never the system python's packages: the check must not depend on what pip put there.
set -euo pipefail
BUILD=$(cd "$1" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
T=$BUILD/examples/translation/translate
PY=$BUILD/pyvenv/bin/python
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}

if ! [ -x "$PY" ] || ! "$PY" -c 'import ctranslate2, sacrebleu, sentencepiece' 2>/dev/null; then
  echo "ct2_check: skipped: ctranslate2, sacrebleu and sentencepiece do not import from $BUILD/pyvenv" \
       "(make ctranslate2 installs them from PyPI)"
  exit 77
fi

W=$(mktemp -d /tmp/graft_ct2.XXXXXX)
trap '[[ -n ${KEEP:-} ]] || rm -rf "$W"' EXIT
if [ $# -ge 3 ]; then
  RUN=$2 DATA=$3
else
  "$T" generate-data --out "$W/data" --seed 5 --train 6000 --valid 50 --test 100 >/dev/null
  "$T" train --data "$W/data" --out "$W/run" --preset tiny --steps 300 --batch-tokens 1500 --vocab 300 \
    --warmup 100 --valid-every 300 --seed 2 --positions relative >/dev/null 2>"$W/train.log" ||
    { cat "$W/train.log" >&2; exit 1; }
  RUN=$W/run DATA=$W/data/test.tsv
fi
"$PY" "$HERE/ct2_check.py" --translate "$T" --run "$RUN" --data "$DATA" --work "$W/check" --beams 1,4
