#!/usr/bin/python3
"""Lists the longest C++ functions of the tree (lines from the signature's
first line to the closing brace), for the restructuring notes:

    scripts/function-lengths.py [--over 150] [--top 25] [DIR...]

A function is a definition whose body opens at the end of a line and
closes with a `}` at the definition's own indentation: out-of-line
definitions, class-scope methods and lambdas assigned at that level.
Generated code (build/) is not read.
"""
import argparse
import os
import re
import sys

CONTROL = re.compile(r"^\s*(if|for|while|switch|else|do|namespace|struct|class|enum|union|extern|return|case|"
                     r"try|catch|template\s*<[^>]*>\s*(struct|class))\b")


def functions(path):
    lines = open(path, encoding="utf-8", errors="replace").read().split("\n")
    out = []
    i, stmt = 0, 0
    while i < len(lines):
        line = lines[i]
        bare = re.sub(r"//.*", "", line).rstrip()
        if not bare.strip() or bare.lstrip().startswith("#"):
            i += 1
            stmt = i
            continue
        if bare.endswith("{"):
            text = " ".join(l.strip() for l in lines[stmt:i + 1])
            head = text.split("(")[0]
            is_fn = ("(" in text and ")" in text and not CONTROL.match(text) and "=" not in head
                     and re.search(r"[\w>~\]]\s*$", head) is not None and not head.strip().startswith(("[", "!", "{")))
            if is_fn:
                indent = re.match(r"^\s*", lines[stmt]).group(0)
                close = re.compile("^" + re.escape(indent) + r"\}")
                j = i + 1
                while j < len(lines) and not close.match(lines[j]):
                    j += 1
                if j < len(lines):
                    out.append((j - stmt + 1, head.split()[-1] if head.split() else "?", stmt + 1))
                    i = j + 1
                    stmt = i
                    continue
        if bare.endswith((";", "{", "}")) or re.match(r"^\s*(public|private|protected|case [^:]*|default)\s*:$", bare):
            stmt = i + 1
        i += 1
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--over", type=int, default=150)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("dirs", nargs="*", default=["dialects", "formats", "lib", "passes", "runtime", "tools", "include"])
    args = ap.parse_args()
    rows = []
    for d in args.dirs:
        for root, _, files in os.walk(d):
            if "/build" in root or root.startswith("build"):
                continue
            for f in files:
                if f.endswith((".cpp", ".h", ".cu", ".cc")):
                    p = os.path.join(root, f)
                    rows += [(n, name, f"{p}:{line}") for n, name, line in functions(p)]
    rows.sort(reverse=True)
    over = [r for r in rows if r[0] > args.over]
    print(f"{len(rows)} functions, {len(over)} over {args.over} lines")
    for n, name, where in rows[:max(args.top, len(over))]:
        print(f"{n:5d}  {name}  {where}")


if __name__ == "__main__":
    sys.exit(main())
