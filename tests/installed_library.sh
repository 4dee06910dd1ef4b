#!/usr/bin/env bash
# graft as an installed library (ctest: installed_library). Installs the build into a temporary
# prefix, then checks what a user of that prefix gets:
#   - the libraries with their SONAME, the CMake package, graft.pc, the programs in bin/;
#   - no internal header installed, and every installed header compiles on its own;
#   - tests/consumer built twice, through find_package(graft) and through pkg-config, and run
#     against a checkpoint written by the installed `translate`;
#   - every ```cpp block of README.md and docs/*.md compiled against the prefix and run, its output
#     compared with the ```text block after it (doc tests: the documentation cannot drift from the
#     API nor from what the examples print).
#   tests/installed_library.sh BUILD_DIR
set -euo pipefail
BUILD=$(cd "$1" && pwd)
SRC=$(cd "$(dirname "$0")/.." && pwd)
W=$(mktemp -d "${TMPDIR:-/tmp}/graft_install.XXXXXX")
trap '[[ -n ${KEEP:-} ]] || rm -rf "$W"' EXIT  # KEEP=1 keeps the prefix for a look
P=$W/prefix
fail() { echo "installed_library: $*" >&2; exit 1; }

cmake --install "$BUILD" --prefix "$P" >/dev/null
LIBDIR=$(dirname "$(find "$P" -name graft.pc -path '*/pkgconfig/*' | head -n 1)")/..
[[ -f $LIBDIR/pkgconfig/graft.pc ]] || fail "no graft.pc under $P"
LIBDIR=$(cd "$LIBDIR" && pwd)
VERSION=$(sed -n 's/^#define GRAFT_VERSION_STRING "\([0-9.]*\)"$/\1/p' "$SRC/include/graft/version.h")
[[ -n $VERSION ]] || fail "no GRAFT_VERSION_STRING in include/graft/version.h"

# What is installed.
for prog in translate lm classify embed; do [[ -x $P/bin/$prog ]] || fail "bin/$prog is not installed"; done
[[ -f $LIBDIR/cmake/graft/graftConfig.cmake && -f $LIBDIR/cmake/graft/graftConfigVersion.cmake ]] ||
  fail "the CMake package is not installed"
for layer in autograd ops nn train text models testing; do
  lib=$LIBDIR/libgraft_$layer.so
  if [[ -e $lib ]]; then
    soname=$(objdump -p "$lib" | awk '/SONAME/ {print $2}')
    [[ $soname == "libgraft_$layer.so.${VERSION%.*}" ]] || fail "$lib: SONAME '$soname', want libgraft_$layer.so.${VERSION%.*}"
    [[ -f $LIBDIR/libgraft_$layer.so.$VERSION ]] || fail "libgraft_$layer.so.$VERSION is not installed"
  else
    [[ -f $LIBDIR/libgraft_$layer.a ]] || fail "neither libgraft_$layer.so nor .a is installed"
  fi
done
# The model fetch script beside the programs, and the installed embed's default --model: both the
# user's cache (${XDG_CACHE_HOME:-~/.cache}/graft/all-MiniLM-L6-v2), never the prefix or a source
# tree. No network here: a model directory already in place is all the script needs to find.
[[ -x $P/bin/graft-fetch-model ]] || fail "bin/graft-fetch-model is not installed"
model=$W/home/.cache/graft/all-MiniLM-L6-v2
mkdir -p "$model" && touch "$model/model.safetensors" "$model/tokenizer.json" "$model/config.json"
(cd "$W" && env -u XDG_CACHE_HOME HOME="$W/home" "$P/bin/graft-fetch-model") 2>"$W/fetch.log" &&
  grep -qF "fetch_model: $model (already there)" "$W/fetch.log" ||
  { cat "$W/fetch.log" >&2; fail "graft-fetch-model did not default to \$HOME/.cache/graft/all-MiniLM-L6-v2"; }
fetch=$(cd "$P/bin" && pwd -P)/graft-fetch-model
for env_var in "HOME=$W/nohome" "XDG_CACHE_HOME=$W/xdg"; do
  default=$W/nohome/.cache/graft/all-MiniLM-L6-v2
  [[ $env_var == XDG* ]] && default=$W/xdg/graft/all-MiniLM-L6-v2
  rc=0
  env -u XDG_CACHE_HOME "$env_var" "$P/bin/embed" similarity a b 2>"$W/embed.log" || rc=$?
  [[ $rc -eq 2 ]] && grep -qF "'$default' is not a directory (the default): fetch all-MiniLM-L6-v2 into it with '$fetch $default'" "$W/embed.log" ||
    { cat "$W/embed.log" >&2; fail "embed without --model ($env_var): exit $rc, not 2 naming $default and $fetch"; }
done
echo "installed_library: graft-fetch-model and embed agree on the model's default place, the user's cache"

# The installed headers are the source tree's include/graft/, file for file (the fmt layout).
diff -r "$SRC/include/graft" "$P/include/graft" >"$W/diff" ||
  { cat "$W/diff" >&2; fail "the installed include/graft differs from the source tree's include/graft"; }
for internal in ops/internal ops/kernels.h; do
  [[ ! -e $P/include/graft/$internal ]] || fail "the internal header $internal is installed"
done
grep -rq 'dnnl\|oneapi' "$P/include/graft" && fail "an installed header mentions oneDNN: $(grep -rl 'dnnl\|oneapi' "$P/include/graft")"
grep -q "#define GRAFT_VERSION_STRING \"$VERSION\"" "$P/include/graft/version.h" || fail "graft/version.h does not say $VERSION"

export PKG_CONFIG_PATH=$LIBDIR/pkgconfig
[[ $(pkg-config --modversion graft) == "$VERSION" ]] || fail "graft.pc says $(pkg-config --modversion graft), want $VERSION"
read -r -a CFLAGS <<<"$(pkg-config --cflags graft)"
read -r -a LIBS <<<"$(pkg-config --libs graft)"

# Every installed header on its own: one translation unit each.
n=0
while IFS= read -r h; do
  rel=${h#"$P/include/"}
  echo "#include <$rel>" >"$W/one.cpp"
  g++ "${CFLAGS[@]}" -fsyntax-only "$W/one.cpp" 2>"$W/err" || { cat "$W/err" >&2; fail "<$rel> does not compile on its own"; }
  n=$((n + 1))
done < <(find "$P/include/graft" -name '*.h' | sort)
echo "installed_library: $n installed headers compile on their own"

# A checkpoint from the installed program (a few steps of a tiny model).
"$P/bin/translate" generate-data --out "$W/data" --seed 3 --train 200 --valid 10 --test 5 >/dev/null
OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} "$P/bin/translate" train --data "$W/data" --out "$W/run" --steps 4 \
  --batch-tokens 256 --vocab 100 --warmup 2 --valid-every 4 >/dev/null 2>"$W/train.log" ||
  { cat "$W/train.log" >&2; fail "the installed translate did not train"; }

# The consumer through find_package(graft) ...
cmake -S "$SRC/tests/consumer" -B "$W/cmake" -DCMAKE_PREFIX_PATH="$P" -DCMAKE_BUILD_TYPE=Release >"$W/log" 2>&1 ||
  { cat "$W/log" >&2; fail "find_package(graft) failed"; }
cmake --build "$W/cmake" >"$W/log" 2>&1 || { cat "$W/log" >&2; fail "the consumer did not build through find_package"; }
"$W/cmake/consumer" "$W/run" || fail "the consumer built through find_package failed"
# ... and through pkg-config (the rpath stands in for installing into a system directory).
g++ -O1 "${CFLAGS[@]}" -DPACKAGE_VERSION="\"$(pkg-config --modversion graft)\"" "$SRC/tests/consumer/main.cpp" \
  -lgraft_testing "${LIBS[@]}" -Wl,-rpath,"$LIBDIR" -o "$W/consumer_pc" 2>"$W/log" || { cat "$W/log" >&2; fail "the consumer did not build through pkg-config"; }
"$W/consumer_pc" "$W/run" || fail "the consumer built through pkg-config failed"
echo "installed_library: find_package and pkg-config consumers both ran against $P"

# Doc tests: each ```cpp block is a whole program, and what it prints must match the ```text block
# after it (tests/doc_output.py says the rule, docs/testing.md#doc-tests shows it).
shopt -s nullglob
mkdir -p "$W/doc"
python3 "$SRC/tests/doc_output.py" extract "$W/doc" "$SRC/README.md" "$SRC"/docs/*.md
n=0
drifted=()
for cpp in "$W"/doc/*.cpp; do
  name=$(basename "$cpp" .cpp)
  # graft_testing (the op-record registry, not in graft.pc's Libs) for the examples that check an op.
  g++ -O1 "${CFLAGS[@]}" "$cpp" -lgraft_testing "${LIBS[@]}" -Wl,-rpath,"$LIBDIR" -o "$W/doc/$name" 2>"$W/err" ||
    { cat "$W/err" >&2; fail "the C++ example $name does not compile against the installed library"; }
  (cd "$W/doc" && timeout 120 "./$name" >"$W/doc/$name.out" 2>"$W/doc/$name.err") ||
    { tail -n 20 "$W/doc/$name.out" "$W/doc/$name.err" >&2; fail "the C++ example $name failed when run"; }
  python3 "$SRC/tests/doc_output.py" compare "$W/doc/$name.expected" "$W/doc/$name.out" "the C++ example $name" ||
    drifted+=("$name")
  n=$((n + 1))
done
[[ $n -gt 0 ]] || fail 'README.md and docs/ hold no C++ example (a block fenced as cpp)'
[[ ${#drifted[@]} -eq 0 ]] || fail "${#drifted[@]} of $n C++ examples do not print what their pages say: ${drifted[*]}"
echo "installed_library: $n C++ examples of the README and docs/ compiled, ran and printed what their pages say"
