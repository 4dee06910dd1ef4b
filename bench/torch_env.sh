# Sourced by bench/run.sh and bench/quality.sh: the PyTorch peer's Debian packages, installed
# only when missing, and OpenBLAS (openmp) as the BLAS PyTorch loads. Sets PY, SUDO and blas.
PY=/usr/bin/python3  # Debian's python3-torch lives in the system interpreter
SUDO=$([ "$(id -u)" = 0 ] || echo sudo)

# ---- the PyTorch peer's packages, only when missing ----------------------------------------
missing=""
for p in python3-torch libopenblas0-openmp; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
  echo "bench: installing$missing"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing >/dev/null
fi
# PyTorch's BLAS is whatever libblas.so.3 points to: never Debian's reference BLAS.
ARCH=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)
for lib in libblas.so.3 liblapack.so.3; do
  want=/usr/lib/$ARCH/openblas-openmp/$lib
  cur=$(readlink -f "/etc/alternatives/$lib-$ARCH" 2>/dev/null || true)
  if [ -e "$want" ] && [ "$cur" != "$(readlink -f "$want")" ]; then
    echo "bench: pointing $lib to $want"
    $SUDO update-alternatives --set "$lib-$ARCH" "$want" >/dev/null
  fi
done
blas=$(readlink -f "/etc/alternatives/libblas.so.3-$ARCH")
case "$blas" in
  *openblas-openmp*) ;;
  *) echo "bench: libblas.so.3 is $blas, not OpenBLAS (openmp): refusing to benchmark" >&2; exit 1 ;;
esac


# field LINE KEY: the number after "KEY": in a RESULT line.
field() { sed -n "s/.*\"$2\": *\\([0-9.eE+-]*\\).*/\\1/p" <<<"$1"; }

# pick_openblas_coretype [train]: OpenBLAS's own detection (unset) against forcing HASWELL (AVX2)
# and, on CPUs with AVX-512, SKYLAKEX, timed by PyTorch's 1024^3 sgemm, or with `train` by
# PyTorch's tiny training step (small, varied shapes: on this project's Xeon the two core types
# that tie on the sgemm differ 1.7x on the toy translation steps). Sets best_ct, best_gf (the
# sgemm GFLOP/s, or 1000 / step ms) and best_line (the winner's RESULT line).
pick_openblas_coretype() {
  local coretypes=("" HASWELL) ct line gf
  grep -qw avx512f /proc/cpuinfo && coretypes+=(SKYLAKEX)
  best_ct="" best_gf=0 best_line=""
  for ct in "${coretypes[@]}"; do
    if [ "${1:-}" = train ]; then
      line=$(OPENBLAS_CORETYPE=$ct $PY bench/torch_peer.py --what train --config tiny --warmup 1 --steps 5 | grep '^RESULT ')
      gf=$(field "$line" ms | awk '{ print 1000 / $1 }')
      echo "  PyTorch tiny training step, OPENBLAS_CORETYPE=${ct:-(unset)}: $(awk -v g="$gf" 'BEGIN { printf "%.0f", 1000 / g }') ms" >&2
    else
      # The best of 3 processes: core types within a few percent swap places from run to run.
      line="" gf=0
      for _ in 1 2 3; do
        local l g
        l=$(OPENBLAS_CORETYPE=$ct $PY bench/torch_peer.py --what sgemm --n 1024 | grep '^RESULT ')
        g=$(field "$l" gflops)
        if awk -v a="$g" -v b="$gf" 'BEGIN { exit !(a > b) }'; then line=$l gf=$g; fi
      done
      echo "  PyTorch 1024^3 sgemm, OPENBLAS_CORETYPE=${ct:-(unset)}: $gf GFLOP/s (best of 3)" >&2
    fi
    if awk -v a="$gf" -v b="$best_gf" 'BEGIN { exit !(a > b) }'; then
      best_ct=$ct best_gf=$gf best_line=$line
    fi
  done
}
