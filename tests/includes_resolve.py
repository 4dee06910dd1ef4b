#!/usr/bin/env python3
"""ctest includes_resolve: every `#include "graft/..."` or `<graft/...>` in the repository (the
C++ sources, the headers, the C++ blocks of the docs) names a file under include/ of the source
tree, with no build: the public headers live in include/graft/ (the fmt layout), and a reader or a
tool can follow every include. The internal headers (ops/internal/, autograd/internal/) are
included from the source root instead ("ops/internal/kernels.h"), so none may be named graft/...
It also holds the layers to their edges (README's Layout; CMakeLists.txt links the libraries so):
a file of a layer, source or public header, includes the public headers of the layers below it
only: autograd <- ops <- nn <- nn/train <- models, and nn/text on autograd and nn/train alone.
  tests/includes_resolve.py SOURCE_DIR"""
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s*[<"](graft/[^>"]+)[>"]', re.M)
SCANNED = (".h", ".cpp", ".c", ".md", ".in")
# What each layer may include (its own headers and those of the layers it links).
# testing/ (graft_testing, the op records) links ops; no shipped layer includes it.
ALLOWED = {
    "autograd": {"autograd"},
    "ops": {"autograd", "ops"},
    "nn": {"autograd", "ops", "nn"},
    "nn/train": {"autograd", "ops", "nn", "nn/train"},
    "nn/text": {"autograd", "nn/text", "nn/train"},
    "models": {"autograd", "ops", "nn", "nn/train", "nn/text", "models"},
    "testing": {"autograd", "ops", "testing"},
}


def layer_of(rel):
    """The layer a repository path (or a graft/... include) belongs to, or None."""
    rel = re.sub(r"^(include/)?graft/", "", rel)
    for layer in sorted(ALLOWED, key=len, reverse=True):
        if rel.startswith(layer + "/"):
            return layer
    return None


def scanned_files(root):
    """The repository's C++ and Markdown files, less .git and any build tree (a CMakeCache.txt)."""
    for top, dirs, files in os.walk(root):
        if ".git" in dirs:
            dirs.remove(".git")
        if "CMakeCache.txt" in files and top != root:
            dirs.clear()
            continue
        dirs[:] = [d for d in dirs if not os.path.exists(os.path.join(top, d, "CMakeCache.txt"))]
        for f in files:
            if f.endswith(SCANNED):
                yield os.path.join(top, f)


def unresolved(root, path):
    """The graft/... includes of one file that name no file under ROOT/include/."""
    text = open(path, encoding="utf-8", errors="replace").read()
    rel = os.path.relpath(path, root)
    for m in INCLUDE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        if not os.path.isfile(os.path.join(root, "include", m.group(1))):
            yield f"{rel}:{line}: #include {m.group(1)}: no include/{m.group(1)}"
        elif layer_of(rel) and layer_of(m.group(1)) not in ALLOWED[layer_of(rel)]:
            yield f"{rel}:{line}: #include {m.group(1)}: layer {layer_of(rel)} may not include {layer_of(m.group(1))}"


def main():
    root = os.path.abspath(sys.argv[1])
    bad, n = [], 0
    for path in scanned_files(root):
        n += 1
        bad.extend(unresolved(root, path))
    for b in bad:
        print("includes_resolve:", b)
    print(f"includes_resolve: {n} files scanned, {len(bad)} graft/... includes missing under include/ or against the layers")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
