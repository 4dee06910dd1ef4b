#!/usr/bin/env python3
"""The doc tests' two halves that are not compiling: finding the examples and checking their output.

  tests/doc_output.py extract OUT_DIR PAGE...         each ```cpp block of the pages into
                                                      OUT_DIR/NAME.cpp, its expected output into
                                                      OUT_DIR/NAME.expected
  tests/doc_output.py compare EXPECTED ACTUAL [NAME]  exit 1, saying where, if ACTUAL does not match
  tests/doc_output.py self-test                       the matcher on samples that must and must
                                                      not match

The rule (docs/testing.md#doc-tests): a ```cpp block's expected standard output is the first
```text block after it in the same section, that is before the next heading and the next ```cpp
block; a ```cpp block with no such block must print nothing. In the expected text
  - `{~}` stands for a number or the tail of one (digits, with an optional sign, point and
    exponent; at least one digit), for what varies with the CPU and the thread count: `0.5{~}`
    matches 0.544 (not 0.5 nor 0.601), `{~} ms` matches 12.3 ms and 1e-05 ms, and no `{~}`
    matches `nan`;
  - `{*}` stands for any text within the line (at least one character), for words that vary
    (the kernel oneDNN picked, a sampled continuation);
  - either may carry what one run printed, for the reader and not compared: `loss {~0.544}`,
    `bf16 matmuls: {*oneDNN brg:avx512_core_bf16}`;
  - spacing is not compared: runs of spaces count as one, and leading and trailing spaces and
    blank lines at the end are ignored.
Everything else is compared character for character, line for line."""
import os
import re
import sys

MARK = re.compile(r"\{([~*])[^{}\n]*\}")  # {~...} a number, {*...} any text in the line
STANDS_FOR = {"~": r"[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?", "*": r".+"}


def normalised_lines(text):
    """The lines as compared: spacing collapsed, trailing blank lines dropped."""
    lines = [" ".join(line.split()) for line in text.split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def line_pattern(expected_line):
    """The regular expression an expected line (already normalised) stands for."""
    pattern, end = "", 0
    for mark in MARK.finditer(expected_line):
        pattern += re.escape(expected_line[end:mark.start()]) + STANDS_FOR[mark.group(1)]
        end = mark.end()
    return re.compile(pattern + re.escape(expected_line[end:]))


def first_mismatch(expected, actual):
    """None if ACTUAL matches EXPECTED, else (line number, expected line, actual line), 1-based,
    with None for a line that is missing on one side."""
    want, got = normalised_lines(expected), normalised_lines(actual)
    for i in range(max(len(want), len(got))):
        w = want[i] if i < len(want) else None
        g = got[i] if i < len(got) else None
        if w is None or g is None or not line_pattern(w).fullmatch(g):
            return i + 1, w, g
    return None


def blocks(lines):
    """(first line index of the body, body lines, fence tag) of each fenced block."""
    i = 0
    while i < len(lines):
        m = re.match(r"\s*```(\S*)", lines[i])  # the tag is the info string's first word
        if m:
            j = i + 1
            while j < len(lines) and lines[j].strip() != "```":
                j += 1
            yield i + 1, lines[i + 1:j], m.group(1), i
            i = j
        i += 1


def examples(path):
    """(line number of the block's first line, program, expected output) of each ```cpp block."""
    lines = open(path, encoding="utf-8").read().split("\n")
    found = list(blocks(lines))
    inside = {i for start, body, _, fence in found for i in range(fence, start + len(body) + 1)}
    headings = [i for i, line in enumerate(lines) if i not in inside and re.match(r"#{1,6} ", line)]
    for n, (start, body, tag, _) in enumerate(found):
        if tag != "cpp":
            continue
        expected = ""
        for _, later_body, later_tag, fence in found[n + 1:]:
            if later_tag == "cpp" or any(start < h < fence for h in headings):
                break
            if later_tag == "text":
                expected = "\n".join(later_body) + "\n"
                break
        yield start + 1, "\n".join(body) + "\n", expected


DEFINES_OP = re.compile(r"GRAFT_DECLARE_OP|\bunary_row\s*<|\bautograd::record\s*\(")


def unchecked_op(program):
    """Why a program that defines an op (declares one, builds a table row or records a tape entry)
    does not check it, or None: an example op must run gradcheck and gradgradcheck, so a docs
    example cannot teach a backward that is wrong at the first or the second order."""
    if not DEFINES_OP.search(program):
        return None
    missing = [check for check in ("gradcheck", "gradgradcheck") if not re.search(rf"\b{check}\s*\(", program)]
    return f"defines an op but never calls {' nor '.join(missing)}" if missing else None


def check_ops_checked(pages):
    """Exits with the page and line of each example that defines an op without checking it."""
    bad = [f"{path}:{line}: the C++ example {why}" for path in pages
           for line, program, _ in examples(path) if (why := unchecked_op(program))]
    if bad:
        sys.exit("\n".join(bad) + "\n(every example that defines an op runs gradcheck and gradgradcheck"
                 " on it: docs/testing.md#doc-tests)")


def extract(out_dir, pages):
    check_ops_checked(pages)
    root = os.path.dirname(os.path.abspath(pages[0]))
    for path in pages:
        for line, program, expected in examples(path):
            name = re.sub(r"[^A-Za-z0-9]+", "_", os.path.relpath(os.path.abspath(path), root)) + f"_L{line - 1}"
            with open(os.path.join(out_dir, name + ".cpp"), "w", encoding="utf-8") as f:
                f.write(f'#line {line} "{path}"\n' + program)
            with open(os.path.join(out_dir, name + ".expected"), "w", encoding="utf-8") as f:
                f.write(expected)


def compare(expected_path, actual_path, name="the example"):
    expected = open(expected_path, encoding="utf-8").read()
    actual = open(actual_path, encoding="utf-8", errors="replace").read()
    where = first_mismatch(expected, actual)
    if where is None:
        return 0
    line, want, got = where
    if not expected.strip():
        print(f"{name} has no ```text block after it, so it must print nothing; it printed:", file=sys.stderr)
        print(actual, end="", file=sys.stderr)
        return 1
    print(f"{name}: its output differs from the ```text block after it at line {line}:", file=sys.stderr)
    print(f"  the text block: {want if want is not None else '(no more lines)'}", file=sys.stderr)
    print(f"  printed:        {got if got is not None else '(no more lines)'}", file=sys.stderr)
    print("the whole output (in the text block, {~} marks a number that varies with the CPU or the thread"
          " count, {*} any text; docs/testing.md#doc-tests):", file=sys.stderr)
    print(actual, end="", file=sys.stderr)
    return 1


SAMPLES = [  # (expected, actual, matches)
    ("step 20  loss 0.901\n", "step 20  loss 0.901\n", True),
    ("step 20  loss 0.901\n", "step 20  loss 0.902\n", False),
    ("step 20  loss 0.9{~}\n", "step 20  loss 0.913\n", True),
    ("step 20  loss 0.9{~}\n", "step 20  loss 0.9\n", False),
    ("step 20  loss 0.9{~}\n", "step 20  loss 1.013\n", False),
    ("step 20  loss {~}\n", "step 20  loss nan\n", False),
    ("step 20  loss {~}\n", "step 20  loss \n", False),
    ("step {~}\n", "step 2 loss 1\n", False),
    ("{~} ms, {~} tokens/s\n", "12.5 ms, 3.1e+04 tokens/s\n", True),
    ("{~} ms\n", "-1.5e-03 ms\n", True),
    ("{~} ms\n", "fast ms\n", False),
    ("error {~}e-10\n", "error 6.1e-10\n", True),
    ("a\nb\n", "a\n", False),
    ("a\n", "a\nb\n", False),
    ("a\n", "a\n\n\n", True),
    ("  a   b\n", "a b  \n", True),
    ("a b\n", "ab\n", False),
    ("", "", True),
    ("", "anything\n", False),
    ("x (y) [z] * . +\n", "x (y) [z] * . +\n", True),
    ("x.y\n", "xzy\n", False),
    ("step 20  loss {~0.901}\n", "step 20  loss 0.5\n", True),
    ("step 20  loss {~0.901}\n", "step 20  loss inf\n", False),
    ("loss {~1} ({~2} ms)\n", "loss 3 (4 ms)\n", True),
    ("loss {~1} ({~2} ms)\n", "loss 3 (4 s)\n", False),
    ("bf16 matmuls: {*oneDNN brg}\n", "bf16 matmuls: reference path (no kernel)\n", True),
    ("bf16 matmuls: {*}\n", "bf16 matmuls:\n", False),
    ("bf16 matmuls: {*}\n", "bf16 kernels: x\n", False),
    ("a {*}\nb\n", "a x\ny\nb\n", False),
    ('"a fo{*ol and his}" (same)\n', '"a fool, a fool" (same)\n', True),
    ("digraph g {\n}\n", "digraph g {\n}\n", True),
    ("{~\n", "{~\n", True),
]

PAGE = """# Page
```cpp
int main() { std::puts("one"); }
```

Its output:

```sh
# build and run it
./one
```

```text
one
```

## Next section
```cpp
int main() {}
```

Prose, then a heading before any text block.

### Sub
```text
not the output of the block above
```
```cpp
int main() {}
```
```cpp
int main() { std::puts("four"); }
```
```text
four {~}
```
```cpp reverse.cpp
int main() { std::puts("five"); }
```
```text title
five
```
"""


OP_SAMPLES = [  # (program, checked)
    ('int main() { std::puts("no op"); }', True),
    ('GRAFT_DECLARE_OP("f", "custom");\nint main() { gradcheck(fn, x); gradgradcheck(fn, x); }', True),
    ('GRAFT_DECLARE_OP("f", "custom");\nint main() { gradcheck(fn, x); }', False),
    ('GRAFT_DECLARE_OP("f", "custom");\nint main() { gradgradcheck(fn, x); }', False),
    ("const UnaryOp k = unary_row<f, df>({});\nint main() {}", False),
    ("int main() { autograd::record(\"f\", {x}, {y}, {x}, fn); gradcheck(a, b); gradgradcheck(a, b); }", True),
]


def self_test_ops_checked():
    """The op rule on samples, and on the repository's own README.md and docs/*.md."""
    bad = [f"unchecked_op({program!r}): want {'none' if checked else 'a reason'}"
           for program, checked in OP_SAMPLES if (unchecked_op(program) is None) != checked]
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    docs = os.path.join(root, "docs")
    pages = [os.path.join(root, "README.md")] + sorted(
        os.path.join(docs, f) for f in os.listdir(docs) if f.endswith(".md"))
    bad += [f"{os.path.relpath(path, root)}:{line}: the C++ example {why}" for path in pages
            for line, program, _ in examples(path) if (why := unchecked_op(program))]
    return bad


def self_test():
    import contextlib
    import io
    import tempfile
    bad = []
    for expected, actual, matches in SAMPLES:
        if (first_mismatch(expected, actual) is None) != matches:
            bad.append(f"{expected!r} against {actual!r}: want {'a match' if matches else 'a mismatch'}")
    with tempfile.TemporaryDirectory() as d:
        page = os.path.join(d, "page.md")
        open(page, "w", encoding="utf-8").write(PAGE)
        got = [(line, expected) for line, _, expected in examples(page)]
        want = [(3, "one\n"), (19, ""), (29, ""), (32, "four {~}\n"), (38, "five\n")]
        if got != want:
            bad.append(f"the examples of the sample page: {got}, want {want}")
        extract(d, [page])
        for printed, status in (("four 4.25\n", 0), ("five 4.25\n", 1)):
            with open(os.path.join(d, "out"), "w") as f:
                f.write(printed)
            with contextlib.redirect_stderr(io.StringIO()):
                if compare(os.path.join(d, "page_md_L31.expected"), os.path.join(d, "out")) != status:
                    bad.append(f"compare() of {printed!r}: want exit status {status}")
    bad += self_test_ops_checked()
    for b in bad:
        print("doc_output self-test:", b, file=sys.stderr)
    print(f"doc_output self-test: {len(SAMPLES)} samples and a sample page, {len(bad)} wrong")
    return 1 if bad else 0


if __name__ == "__main__":
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd == "extract" and len(sys.argv) > 3:
        extract(sys.argv[2], sys.argv[3:])
    elif cmd == "compare" and len(sys.argv) in (4, 5):
        sys.exit(compare(*sys.argv[2:]))
    elif cmd == "self-test":
        sys.exit(self_test())
    else:
        sys.exit(__doc__)
