#!/usr/bin/env python3
"""Fails for any function over --max lines (60) in the repository's C/C++, Python and shell files.

usage: function_length.py [--max N] ROOT     check every file below ROOT (build*/ and .git left out)
       function_length.py self-test           the scanners on samples that must and must not count

Each long function is one line `FILE:LINE: NAME is N lines (max 60)`; the exit status is 1 when
there is one. A function's lines run from its name to its closing brace (C/C++, shell) or its last
statement (Python). C/C++ is read by a scanner that blanks comments, strings, character literals
and preprocessor lines, then walks the braces: namespaces, classes, structs and extern "C" blocks
are entered, a brace after a parameter list (its qualifiers and attributes) or after a lambda's
introducer opens a function (a lambda inside one is part of it), a brace inside a head (a braced
default argument, a braced member initialiser of a constructor) is passed over with the head going
on, and any other brace (an initializer, an enum) is passed over. Python is read with ast (each
def, nested ones too). Shell is read with comments, quoted strings, ${...} and here-documents
blanked; a function (`name()` or `function name`) ends at the } that closes its { group, that {
on the name's line or a later one.
Standard library only.
"""
import ast
import os
import re
import sys

MAX_LINES = 60
C_EXTENSIONS = (".c", ".cc", ".cpp", ".cxx", ".h", ".hh", ".hpp")


def blank_c(text):
    """text with comments, string and character literals and preprocessor lines blanked (newlines
    kept, so that offsets keep their line numbers)."""
    out, i, n = [], 0, len(text)
    line_start = True
    while i < n:
        c = text[i]
        if line_start and c == "#":  # a preprocessor line, with its continuations
            while i < n and not (text[i] == "\n" and text[i - 1] != "\\"):
                out.append("\n" if text[i] == "\n" else " ")
                i += 1
            continue
        if c == "/" and text.startswith("//", i):
            while i < n and text[i] != "\n":
                out.append(" ")
                i += 1
            continue
        if c == "/" and text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            out.append(re.sub(r"[^\n]", " ", text[i:end]))
            i = end
            continue
        raw = re.match(r'(?:u8|[uUL])?R"([^()\\ ]{0,16})\(', text[i:i + 24])
        if raw and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            close = text.find(")" + raw.group(1) + '"', i + raw.end())
            end = n if close < 0 else close + len(raw.group(1)) + 2
            out.append('"' + re.sub(r"[^\n]", " ", text[i + 1:end - 1]) + '"')
            i = end
            continue
        if c == '"' or (c == "'" and not (i > 0 and text[i - 1].isalnum())):
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(c + " " * (min(j, n) - i - 1) + (c if j < n else ""))
            i = j + 1
            continue
        out.append(c)
        line_start = c == "\n" or (line_start and c in " \t")
        i += 1
    return "".join(out)


def matching(text, i, open_c, close_c):
    """The index of the bracket closing the one at text[i]."""
    depth = 0
    for j in range(i, len(text)):
        if text[j] == open_c:
            depth += 1
        elif text[j] == close_c:
            depth -= 1
            if depth == 0:
                return j
    return len(text) - 1


def top_level_parens(head):
    """(open, close) of each parenthesised group of head at depth 0."""
    groups, j = [], 0
    while j < len(head):
        if head[j] == "(":
            k = matching(head, j, "(", ")")
            groups.append((j, k))
            j = k
        j += 1
    return groups


SCOPE = re.compile(r"^(?:template\s*<.*?>\s*)?(?:(?:inline\s+)?namespace\b|extern\s*\"\s*\"|"
                   r"(?:class|struct|union)\b)", re.S)
QUALIFIERS = re.compile(r"^(?:\s|const\b|volatile\b|noexcept\b|override\b|final\b|mutable\b|"
                        r"try\b|&|->.*|requires\b.*)*$", re.S)
LABELS = re.compile(r"\b(?:public|private|protected)\s*:(?!:)|\bBOOST_AUTO_TEST_SUITE(?:_END)?\s*"
                    r"\([^)]*\)")
# A lambda with no parameter list: its introducer after `=`, `(`, `,` or `return` (not an array's
# bound), then its specifiers.
LAMBDA = re.compile(r"(?:^|[=(,{;]|\breturn)\s*\[[^\[\]]*\]\s*"
                    r"(?:(?:mutable|constexpr|consteval|noexcept|static)\b\s*|->[^{]*)*$", re.S)
ATTRIBUTES = re.compile(r"\[\[.*?\]\]", re.S)


def open_argument(head):
    """The argument being written at the head's end when a parenthesis is still open there (the
    text after the innermost open one and its last comma), or None."""
    opened, depth = [], 0
    for j, c in enumerate(head):
        if c in "([":
            opened.append(j)
        elif c in ")]" and opened:
            opened.pop()
    if not opened or head[opened[-1]] != "(":
        return None
    start = opened[-1] + 1
    for j in range(start, len(head)):
        depth += head[j] in "([{"
        depth -= head[j] in ")]}"
        if head[j] == "," and depth == 0:
            start = j + 1
    return head[start:]


def classify_head(head):
    """'scope', 'function', 'init' (a brace inside a head that goes on: a member's braced
    initialiser in a constructor's initializer list, a braced default argument) or 'other', for
    the text before a brace."""
    h = head.strip()
    if SCOPE.match(h) and "(" not in h.split("{")[0].split(":")[0]:
        return "scope"
    argument = open_argument(h)
    if argument is not None:  # f(..., [](int i) {  is a lambda;  f(std::vector<int> v = {  is not
        return "function" if classify_head(argument) == "function" else "init"
    if LAMBDA.search(h):
        return "function"
    groups = top_level_parens(h)
    if not groups:
        return "other"
    after = ATTRIBUTES.sub(" ", h[groups[-1][1] + 1:])
    if QUALIFIERS.match(after):
        first = h[:groups[0][0]].split()
        if first and first[-1] in ("if", "for", "while", "switch", "catch", "return"):
            return "other"
        return "function"
    if re.search(r"(?<!:):(?!:)", after) or re.match(r"^\s*,", after):
        if h.endswith("}"):  # S(int a) : x_(a), y_{a} {  (the initialiser passed over as 'init')
            return "function"
        return "init" if re.search(r"[\w>]\s*$", h) else "other"
    return "other"


def function_name(head):
    h = LABELS.sub(" ", head).strip()
    h = re.sub(r"^template\s*<.*?>\s*", "", h, flags=re.S)
    groups = top_level_parens(h)
    before = h[:groups[0][0]] if groups else h
    if re.match(r"^\s*BOOST_\w*TEST_CASE", before) and groups:
        return h[groups[0][0] + 1:groups[0][1]].split(",")[0].strip()
    assign = re.search(r"([\w:]+)\s*=\s*[^=]*$", before)
    if assign and "operator" not in before:
        return assign.group(1)
    m = re.search(r"(operator\s*\(\s*\)|operator\s*\S+|(?:\w+(?:<[^()]*?>)?::)*~?\w+)\s*$", before)
    return m.group(1).strip() if m else "lambda"


def c_functions(text):
    """(name, first line, lines) of each function defined in C/C++ source text."""
    s = blank_c(text)
    found, head_start, i, n = [], 0, 0, len(s)
    while i < n:
        c = s[i]
        if c in ";}":
            head_start = i + 1
        elif c == "{":
            head = s[head_start:i]
            kind = classify_head(head)
            if kind == "scope":
                head_start = i + 1  # its members are read as top-level declarations
            else:
                close = matching(s, i, "{", "}")
                if kind == "function":
                    spaces = lambda m: re.sub(r"[^\n]", " ", m.group(0))
                    cleaned = re.sub(r"^\s*template\s*<.*?>", spaces, LABELS.sub(spaces, head),
                                     flags=re.S)
                    offset = head_start + len(cleaned) - len(cleaned.lstrip())
                    first = s.count("\n", 0, offset) + 1
                    found.append((function_name(head), first, s.count("\n", 0, close) + 2 - first))
                if kind != "init":
                    head_start = close + 1
                i = close
        i += 1
    return found


def python_functions(text, path):
    tree = ast.parse(text, filename=path)
    return [(node.name, node.lineno, node.end_lineno - node.lineno + 1)
            for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]


HEREDOC = re.compile(r"<<(-?)\s*(['\"]?)([A-Za-z_]\w*)\2")


def blank_sh(text):
    """Shell text with comments, quoted strings, ${...} and here-documents blanked (newlines
    kept, so that offsets keep their line numbers)."""
    out, i, n, heredocs = [], 0, len(text), []
    spaces = lambda t: re.sub(r"[^\n]", " ", t)
    while i < n:
        c, end = text[i], i + 1
        if c == "\n" and heredocs:  # the here-documents opened on the line just ended
            for dash, word in heredocs:
                while end < n:
                    stop = text.find("\n", end) % (n + 1)
                    line, end = text[end:stop], stop + 1
                    if (line.lstrip("\t") if dash else line) == word:
                        break
            heredocs = []
        elif c == "<" and text[i - 1:i] != "<" and HEREDOC.match(text, i):  # not <<<, $((a << b))
            m = HEREDOC.match(text, i)
            heredocs.append((m.group(1), m.group(3)))
            end = m.end()
        elif c == "#" and (i == 0 or text[i - 1] in " \t\n;&|()"):
            end = text.find("\n", i) % (n + 1)
        elif c == "\\":
            end = i + 2
        elif c in "'\"":
            end = i + 1
            while end < n and text[end] != c:
                end += 2 if c == '"' and text[end] == "\\" else 1
            end += 1
        elif text.startswith("${", i):
            end = matching(text, i + 1, "{", "}") + 1
        out.append(c if end == i + 1 and c not in "'\"#\\" else spaces(text[i:end]))
        i = end
    return "".join(out)[:n]


SHELL_HEAD = re.compile(r"^[ \t]*(?:function[ \t]+([A-Za-z_][\w:.-]*)(?:[ \t]*\([ \t]*\))?|"
                        r"([A-Za-z_][\w:.-]*)[ \t]*\([ \t]*\))\s*", re.M)
# A { or } where a command starts (so not `echo }`), the reserved words that may come before one.
BRACE_WORD = re.compile(r"(?:^|(?<=[;&|()]))[ \t]*(?:(?:then|do|else|!)[ \t]+)?(\{)(?=\s)|"
                        r"(?:^|(?<=[;&|]))[ \t]*(\})(?=[\s;&|)<>]|$)", re.M)


def shell_functions(text):
    """(name, first line, lines) of each function of shell text whose body is a { } group, the
    brace on the name's line or a later one; the group ends at the } that closes it."""
    s, found = blank_sh(text), []
    for m in SHELL_HEAD.finditer(s):
        if not re.match(r"\{\s", s[m.end():m.end() + 2]):
            continue
        depth = 1
        for brace in BRACE_WORD.finditer(s, m.end() + 1):
            depth += 1 if brace.group(1) else -1
            if depth == 0:
                first = s.count("\n", 0, m.start()) + 1
                found.append((m.group(1) or m.group(2), first,
                              s.count("\n", 0, brace.start(2)) + 2 - first))
                break
    return found


def functions_of(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    if path.endswith(C_EXTENSIONS):
        return c_functions(text)
    if path.endswith(".py"):
        return python_functions(text, path)
    if path.endswith(".sh"):
        return shell_functions(text)
    return []


def source_files(root):
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not (d.startswith("build") or d == ".git"))
        for name in sorted(filenames):
            if name.endswith(C_EXTENSIONS + (".py", ".sh")):
                yield os.path.join(dirpath, name)


def long_functions(root, max_lines):
    for path in source_files(root):
        rel = os.path.relpath(path, root)
        for name, line, count in functions_of(path):
            if count > max_lines:
                yield "%s:%d: %s is %d lines (max %d)" % (rel, line, name, count, max_lines)


SAMPLES = [  # (language, source, the functions and lengths the scanner must find)
    ("cpp", 'namespace a {\nint f(int x) {\n  // }\n  const char* s = "}{";\n  return x;\n}\n}\n',
     [("f", 2, 5)]),
    ("cpp", "struct S {\n  S(int a) : x_{a}, y_(a) {\n    g();\n  }\n  int x_{1}, y_;\n"
     "  void m() const;\n};\n", [("S", 2, 3)]),
    ("cpp", "void run() {\n  auto l = [&](int i) {\n    if (i) { return; }\n  };\n}\n"
     "int table[] = {1, 2,\n 3};\nenum class E { a, b };\n", [("run", 1, 5)]),
    ("cpp", "BOOST_AUTO_TEST_SUITE(s)\n\nBOOST_AUTO_TEST_CASE(checks) {\n  char c = '}';\n"
     '  auto r = R"x(})x";\n}\n#define M { {\n', [("checks", 3, 4)]),
    ("cpp", "template <class T>\nauto Foo<T>::bar() const -> T& {\n  return *p;\n}\n"
     'extern "C" {\nvoid c_fn(void) {\n}\n}\n', [("Foo<T>::bar", 2, 3), ("c_fn", 6, 2)]),
    ("py", "def f(a):\n    def g():\n        return 1\n\n    return g\n", [("f", 1, 5), ("g", 2, 2)]),
    ("sh", 'f() {\n  echo "}"\n  if x; then\n    y\n  fi\n}\nfunction g {\n  :\n}\n',
     [("f", 1, 6), ("g", 7, 3)]),
    # Each sample below was missed or miscounted by the scanners before they read it.
    ("cpp", "struct S {\n  S(int a) : x_(a), y_{a} {\n    g();\n  }\n  int x_, y_;\n};\n"
     "struct T {\n  T(int a) : x_{a} {\n  }\n  int x_;\n};\n", [("S", 2, 3), ("T", 8, 2)]),
    ("cpp", "void f(std::vector<int> v = {}, int n = int{2}) {\n  g(v);\n}\n"
     "std::vector<int> w({1, 2});\nbool r = add(\"x\", [](int i) {\n  return i;\n});\n",
     [("f", 1, 3), ("r", 5, 3)]),
    ("cpp", "const auto t = [] {\n  return 1;\n}();\nint table[3] {1, 2, 3};\n"
     "int g() {\n  return t;\n}\n", [("t", 1, 3), ("g", 5, 3)]),
    ("cpp", "int f(int x) [[gnu::cold]] {\n  return x;\n}\n", [("f", 1, 3)]),
    ("sh", "f()\n{\n  :\n}\nif x; then\n  g() {\n    :\n}\nfi\nh(){\n  :\n    }\n",
     [("f", 1, 4), ("g", 6, 3), ("h", 10, 3)]),
    ("sh", "k() {\n  cat <<EOF\n}\nEOF\n  echo $((1 << 2)) ${x:-}} } # }\n}\n"
     "one() { echo '}'; }\n", [("k", 1, 6), ("one", 7, 1)]),
]


def self_test():
    bad = 0
    for lang, src, want in SAMPLES:
        got = {"cpp": c_functions, "py": lambda t: python_functions(t, "<sample>"),
               "sh": shell_functions}[lang](src)
        if sorted(got) != sorted(want):
            print("self-test: %s sample %r: found %s, want %s" % (lang, src[:30], got, want))
            bad += 1
    print("self-test: %d of %d samples right" % (len(SAMPLES) - bad, len(SAMPLES)))
    return 1 if bad else 0


def main(argv):
    if argv[1:] == ["self-test"]:
        return self_test()
    max_lines, args = MAX_LINES, argv[1:]
    if len(args) == 3 and args[0] == "--max":
        max_lines, args = int(args[1]), args[2:]
    if len(args) != 1:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    found = list(long_functions(args[0], max_lines))
    for line in found:
        print(line)
    print("%d function(s) over %d lines" % (len(found), max_lines))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
