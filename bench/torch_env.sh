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

