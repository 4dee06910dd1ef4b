#!/usr/bin/env python3
"""ctest docs_links: every relative link of README.md and docs/*.md points at a file or folder
that exists, and every `name` a docs link shows in code font occurs in the file it links to, so a
renamed function or a moved file fails the suite instead of leaving a dead link.
  tests/docs_links.py SOURCE_DIR"""
import os
import re
import sys

root = sys.argv[1]
pages = [os.path.join(root, "README.md")] + sorted(
    os.path.join(root, "docs", f) for f in os.listdir(os.path.join(root, "docs")) if f.endswith(".md"))
link = re.compile(r"\[([^\]]*)\]\(([^)\s]+)\)")
bad, checked = [], 0
for page in pages:
    text = re.sub(r"^```.*?^```", "", open(page, encoding="utf-8").read(), flags=re.S | re.M)  # code blocks
    for shown, target in link.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue  # a URL or an anchor on the same page
        path = os.path.normpath(os.path.join(os.path.dirname(page), target.split("#")[0]))
        checked += 1
        where = f"{os.path.relpath(page, root)}: ({target})"
        if not os.path.exists(path):
            bad.append(f"{where}: no such file")
            continue
        m = re.fullmatch(r"`([A-Za-z_][A-Za-z0-9_:]*)`", shown)
        if m and os.path.isfile(path) and not path.endswith((".md", ".svg", ".png")):
            name = m.group(1).split("::")[-1]
            if name not in open(path, encoding="utf-8", errors="replace").read():
                bad.append(f"{where}: '{name}' does not occur in the file")
for b in bad:
    print("docs_links:", b)
print(f"docs_links: {checked} relative links checked, {len(bad)} bad")
sys.exit(1 if bad else 0)
