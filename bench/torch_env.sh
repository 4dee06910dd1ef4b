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


source bench/results_lib.sh  # field, result

# pick_openblas_coretype: OpenBLAS's own detection (unset) against forcing HASWELL (AVX2) and, on
# CPUs with AVX-512, SKYLAKEX, timed by PyTorch's 1024^3 sgemm, the best of 3 processes each (core
# types within a few percent swap places from run to run). On this project's Xeon two core types
# that tied on the sgemm were 1.7x apart on the toy translation steps (docs/performance.md): the
# pick is logged so a reader can see how close it was. Sets best_ct, best_gf (GFLOP/s) and
# best_line (the winner's RESULT line).
pick_openblas_coretype() {
  local coretypes=("" HASWELL) ct line gf l g
  grep -qw avx512f /proc/cpuinfo && coretypes+=(SKYLAKEX)
  best_ct="" best_gf=0 best_line=""
  for ct in "${coretypes[@]}"; do
    line="" gf=0
    for _ in 1 2 3; do
      l=$(OPENBLAS_CORETYPE=$ct $PY bench/torch_peer.py --what sgemm --n 1024 | grep '^RESULT ')
      g=$(field "$l" gflops)
      if awk -v a="$g" -v b="$gf" 'BEGIN { exit !(a > b) }'; then line=$l gf=$g; fi
    done
    echo "  PyTorch 1024^3 sgemm, OPENBLAS_CORETYPE=${ct:-(unset)}: $gf GFLOP/s (best of 3)" >&2
    if awk -v a="$gf" -v b="$best_gf" 'BEGIN { exit !(a > b) }'; then
      best_ct=$ct best_gf=$gf best_line=$line
    fi
  done
}
