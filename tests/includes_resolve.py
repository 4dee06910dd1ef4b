#!/usr/bin/env python3
"""ctest includes_resolve: every `#include "graft/..."` or `<graft/...>` in the repository (the
C++ sources, the headers, the C++ blocks of the docs) names a file under include/ of the source
tree, with no build: the public headers live in include/graft/ (the fmt layout), and a reader or a
tool can follow every include. The internal headers (ops/internal/, autograd/internal/) are
included from the source root instead ("ops/internal/kernels.h"), so none may be named graft/...
  tests/includes_resolve.py SOURCE_DIR"""
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s*[<"](graft/[^>"]+)[>"]', re.M)
SCANNED = (".h", ".cpp", ".c", ".md", ".in")


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
    for m in INCLUDE.finditer(text):
        if not os.path.isfile(os.path.join(root, "include", m.group(1))):
            line = text.count("\n", 0, m.start()) + 1
            yield f"{os.path.relpath(path, root)}:{line}: #include {m.group(1)}: no include/{m.group(1)}"


def main():
    root = os.path.abspath(sys.argv[1])
    bad, n = [], 0
    for path in scanned_files(root):
        n += 1
        bad.extend(unresolved(root, path))
    for b in bad:
        print("includes_resolve:", b)
    print(f"includes_resolve: {n} files scanned, {len(bad)} graft/... includes name no file under include/")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
