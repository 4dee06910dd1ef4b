#!/usr/bin/env python3
"""ctest includes_resolve: every `#include "graft/..."` or `<graft/...>` in the repository (the
C++ sources, the headers, the C++ blocks of the docs) names a file under include/ of the source
tree, with no build: the public headers live in include/graft/ (the fmt layout), and a reader or a
tool can follow every include. The internal headers (ops/internal/, autograd/internal/) are
included from the source root instead ("ops/internal/kernels.h"), so none may be named graft/...,
and a public header includes none of them nor any other header by a path outside graft/: only
include/graft/ is installed, so an installed user would have no such file.
It also holds the layers to their edges (README's Layout; CMakeLists.txt links the libraries so):
a file of a layer includes the public headers of the layers below it only: autograd <- ops <- nn
<- nn/train <- models, and nn/text on autograd and nn/train alone. The table below is narrowed by
CMakeLists.txt's links: a source may include what its library links, PUBLIC or PRIVATE, and
what those link PUBLIC; a public header only what its library links PUBLIC, so that a consumer's
include finds every header it names (graft_text links graft_train PRIVATE: nn/text/*.cpp may
include graft/nn/train/..., include/graft/nn/text/*.h may not).
  tests/includes_resolve.py SOURCE_DIR   the samples below, then the tree
  tests/includes_resolve.py self-test    the samples alone: trees that must and must not pass"""
import os
import re
import sys
import tempfile

INCLUDE = re.compile(r'^\s*#\s*include\s*[<"](graft/[^>"]+)[>"]', re.M)
ANY_INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', re.M)
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


def link_edges(root):
    """{layer: (the layers its library links PUBLIC, those it links PRIVATE)} from the
    graft_add_layer(NAME DIR...) and target_link_libraries(graft_NAME ...) calls of
    ROOT/CMakeLists.txt (a library's layer is its first folder); other libraries are left out."""
    text = re.sub(r"#[^\n]*", "", open(os.path.join(root, "CMakeLists.txt")).read())
    layer = {"graft_" + m.group(1): m.group(2)
             for m in re.finditer(r"graft_add_layer\(\s*(\w+)\s+([\w/]+)", text)}
    edges = {dir_: (set(), set()) for dir_ in layer.values()}
    for m in re.finditer(r"target_link_libraries\(\s*(\w+)([^)]*)\)", text):
        if m.group(1) not in layer:
            continue
        scope = "PUBLIC"
        for word in m.group(2).split():
            if word in ("PUBLIC", "PRIVATE", "INTERFACE"):
                scope = word
            elif word in layer:
                edges[layer[m.group(1)]][scope == "PRIVATE"].add(layer[word])
    return edges


def allowed_sets(edges):
    """{layer: (what its sources may include, what its public headers may include)}: ALLOWED
    narrowed to the layer, what it links (PUBLIC and PRIVATE, or PUBLIC alone) and what those
    link PUBLIC, on to the end."""
    def reach(layer, private):
        seen, todo = {layer}, set(edges[layer][0]) | (edges[layer][1] if private else set())
        while todo:
            lay = todo.pop()
            if lay not in seen:
                seen.add(lay)
                todo |= edges[lay][0]
        return seen
    return {lay: (ALLOWED[lay] & reach(lay, True), ALLOWED[lay] & reach(lay, False))
            for lay in ALLOWED if lay in edges}


def unresolved(root, path, allowed):
    """The graft/... includes of one file that name no file under ROOT/include/ or cross the
    layers, and the includes of a public header that an installed user could not follow."""
    text = open(path, encoding="utf-8", errors="replace").read()
    rel = os.path.relpath(path, root).replace(os.sep, "/")
    public = rel.startswith("include/graft/")
    layer = layer_of(rel)
    for m in INCLUDE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        target = layer_of(m.group(1))
        if not os.path.isfile(os.path.join(root, "include", m.group(1))):
            yield f"{rel}:{line}: #include {m.group(1)}: no include/{m.group(1)}"
        elif layer in allowed and target not in allowed[layer][public]:
            kind = "a public header of layer" if public else "layer"
            why = " (its library links it PRIVATE)" if target in allowed[layer][0] else ""
            yield (f"{rel}:{line}: #include {m.group(1)}: {kind} {layer} may not include "
                   f"{target}{why}")
    for m in ANY_INCLUDE.finditer(text) if public else ():
        name = m.group(2)
        in_tree = os.path.isfile(os.path.join(root, name))  # <ops/internal/x.h>, not <vector>
        if not name.startswith("graft/") and (m.group(1) == '"' or in_tree):
            line = text.count("\n", 0, m.start()) + 1
            shown = f'"{name}"' if m.group(1) == '"' else f"<{name}>"
            yield (f"{rel}:{line}: #include {shown}: a public header includes a header "
                   f"outside graft/ (only include/graft/ is installed)")


def check(root):
    """(files scanned, problems) for the tree at ROOT."""
    edges = link_edges(root)
    bad = [f"CMakeLists.txt: no graft_add_layer for layer {lay}"
           for lay in ALLOWED if lay not in edges]
    bad += [f"CMakeLists.txt: layer {lay} is not in includes_resolve.py's ALLOWED"
            for lay in edges if lay not in ALLOWED]
    allowed, n = allowed_sets(edges), 0
    for path in scanned_files(root):
        n += 1
        bad.extend(unresolved(root, path, allowed))
    return n, bad


SAMPLE_CMAKE = """graft_add_layer(autograd autograd)
graft_add_layer(ops ops ops/internal)
target_link_libraries(graft_ops PUBLIC graft_autograd PRIVATE DNNL::dnnl)
graft_add_layer(nn nn)
target_link_libraries(graft_nn PUBLIC graft_ops)
graft_add_layer(train nn/train)
target_link_libraries(graft_train PUBLIC graft_nn nlohmann_json::nlohmann_json)
graft_add_layer(text nn/text)
target_link_libraries(graft_text PUBLIC graft_autograd  # not graft_train
                      PRIVATE graft_train)
graft_add_layer(models models)
target_link_libraries(graft_models PUBLIC graft_nn graft_train graft_text)
graft_add_layer(testing testing testing/cases)
target_link_libraries(graft_testing PUBLIC graft_ops)
"""
SAMPLES = {  # path: (text, how many problems it must give)
    "include/graft/autograd/tensor.h": ("#include <vector>\n#include <nlohmann/json.hpp>\n", 0),
    "include/graft/ops/ops.h": ('#include "graft/autograd/tensor.h"\n', 0),
    "include/graft/ops/quoted.h": ('#include "ops/internal/kernels.h"\n#include "ops.h"\n', 2),
    "include/graft/ops/angled.h": ("#include <ops/internal/kernels.h>\n", 1),
    "ops/internal/kernels.h": ('#include "graft/ops/ops.h"\n', 0),
    "ops/ops.cpp": ('#include "ops/internal/kernels.h"\n#include "graft/ops/ops.h"\n', 0),
    "ops/up.cpp": ('#include "graft/nn/text/plain.h"\n', 1),
    "include/graft/nn/train/checkpoint.h": ('#include "graft/ops/ops.h"\n', 0),
    "include/graft/nn/text/tokenizer.h": ('#include "graft/nn/train/checkpoint.h"\n', 1),
    "include/graft/nn/text/plain.h": ('#include "graft/autograd/tensor.h"\n', 0),
    "nn/text/tokenizer.cpp": ('#include "graft/nn/train/checkpoint.h"\n'
                              '#include "graft/nn/text/tokenizer.h"\n', 0),
    "nn/text/ops_user.cpp": ('#include "graft/ops/ops.h"\n', 1),
    "include/graft/models/m.h": ('#include "graft/nn/text/plain.h"\n'
                                 '#include "graft/nn/train/checkpoint.h"\n', 0),
    "examples/x.cpp": ('#include "graft/nn/missing.h"\n#include "graft/models/m.h"\n', 1),
}


def self_test():
    """The checks on SAMPLES (each file its count of problems), and on a CMakeLists.txt that
    defines no nn/text library (one problem)."""
    wrong = []
    with tempfile.TemporaryDirectory() as root:
        for rel, (text, _) in list(SAMPLES.items()) + [("CMakeLists.txt", (SAMPLE_CMAKE, 0))]:
            os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
            open(os.path.join(root, rel), "w").write(text)
        _, bad = check(root)
        for rel, (_, want) in SAMPLES.items():
            got = [b for b in bad if b.startswith(rel + ":")]
            if len(got) != want:
                wrong.append(f"sample {rel}: {len(got)} problem(s) {got}, want {want}")
        open(os.path.join(root, "CMakeLists.txt"), "w").write(
            SAMPLE_CMAKE.replace("graft_add_layer(text nn/text)", ""))
        got = [b for b in check(root)[1] if b.startswith("CMakeLists.txt")]
        if len(got) != 1:
            wrong.append(f"sample CMakeLists.txt with no text library: {got}, want one problem")
    for w in wrong:
        print("includes_resolve: self-test:", w)
    total = len(SAMPLES) + 1
    print(f"includes_resolve: self-test: {total - len(wrong)} of {total} samples right")
    return 1 if wrong else 0


def main():
    if sys.argv[1:] == ["self-test"]:
        return self_test()
    if len(sys.argv) != 2:
        print("\n".join(__doc__.split("\n")[-2:]).rstrip('"'), file=sys.stderr)
        return 2
    failed = self_test()
    n, bad = check(os.path.abspath(sys.argv[1]))
    for b in bad:
        print("includes_resolve:", b)
    print(f"includes_resolve: {n} files scanned, {len(bad)} include(s) missing under include/, "
          f"against the layers or outside graft/ in a public header")
    return 1 if bad or failed else 0


if __name__ == "__main__":
    sys.exit(main())
