#!/usr/bin/env python3
"""Import circles between Sluice's modules (docs/DESIGN.md, "Module dependencies").

Each file under src/ is read for the module paths it names (`use crate::a::b`, a
`crate::a::b::X` in the code, `super::`, a child module's name); comments, string
literals and `#[cfg(test)]` code are skipped (a test may reach anywhere). A module is
counted at its second level (`ops::metrics`, `pipeline::request`, `state`). A circle
inside one top-level module (`store` re-exports `store::ledger`, which uses `store::Db`)
is that module's own business; the rule is that no circle runs through modules of two
top-level ones (one top-level module may have parts at two layers). Every strongly
connected group spanning two or more top-level modules is printed with its edges between
top-level modules and the files that make them; the exit status is 1 when there is one.

Usage: scripts/module-cycles.py [SRC_DIR]   (default: src)
"""

import functools
import os
import re
import sys

SRC = sys.argv[1] if len(sys.argv) > 1 else "src"

# A path segment chain after `crate::` / `super::` / inside a `use crate::{...}` group.
IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def module_of(path):
    """`src/a/b/c.rs` -> ['a', 'b', 'c']; `mod.rs` is its folder; lib.rs/main.rs -> []."""
    rel = os.path.relpath(path, SRC)[: -len(".rs")].split(os.sep)
    if rel[-1] == "mod":
        rel = rel[:-1]
    if rel in (["lib"], ["main"]):
        return []
    return rel


def is_module(parts):
    """Whether `crate::parts` names a module (a file or a folder under src/)."""
    return _is_module(tuple(parts))


@functools.lru_cache(maxsize=None)
def _is_module(parts):
    base = os.path.join(SRC, *parts)
    return os.path.isfile(base + ".rs") or os.path.isdir(base)


def node(parts):
    """The second-level module a module path belongs to (the longest prefix of at most
    two segments that is a module), or None for the crate root."""
    out = []
    for p in parts[:2]:
        if not is_module(out + [p]):
            break
        out.append(p)
    return "::".join(out) or None


RAW = re.compile(r'b?r(#*)"')
CHAR = re.compile(r"'(?:\\[^']{1,10}|[^'\\])'")
SPECIAL = re.compile(r"//|/\*|\"|'|\bb?r#*\"")


def strip(text):
    """The code without comments, string literals and char literals (a doc link to
    `crate::x` is not a dependency): a small scanner, as regular expressions alone cannot
    tell `r"` in `"for"` from a raw string."""
    out, i, n = [], 0, len(text)
    while i < n:
        m = SPECIAL.search(text, i)
        if m is None:
            out.append(text[i:])
            break
        out.append(text[i : m.start()])
        i, tok = m.start(), m.group()
        if tok == "//":
            i = text.find("\n", i)
            i = n if i == -1 else i
        elif tok == "/*":
            depth, i = 1, i + 2
            while i < n and depth:
                two = text[i : i + 2]
                depth += {"/*": 1, "*/": -1}.get(two, 0)
                i += 2 if two in ("/*", "*/") else 1
            out.append(" ")
        elif tok == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            out.append('""')
            i += 1
        elif tok == "'":
            c = CHAR.match(text, i)
            out.append("' '" if c else "'")
            i = c.end() if c else i + 1
        else:
            raw = RAW.match(text, i)
            close = '"' + raw.group(1)
            j = text.find(close, raw.end())
            i = n if j == -1 else j + len(close)
            out.append('""')
    return "".join(out)


def expand_groups(text):
    """`crate::{a::b, c}` -> `crate::a::b crate::c` (one level of braces at a time)."""
    group = re.compile(r"((?:crate|super|self)(?:::" + IDENT + r")*)::\{([^{}]*)\}")
    while True:
        new = group.sub(
            lambda m: " ".join(
                m.group(1) + "::" + item.strip()
                for item in m.group(2).split(",")
                if item.strip()
            ),
            text,
        )
        if new == text:
            return text
        text = new


def without_tests(text):
    """The code without its `#[cfg(test)]` items (a test may reach anywhere)."""
    out, pos = [], 0
    for m in re.finditer(r"#\[cfg\(test\)\]", text):
        if m.start() < pos:
            continue
        out.append(text[pos : m.start()])
        end = text.find(";", m.end())
        brace = text.find("{", m.end())
        if brace == -1 or (end != -1 and end < brace):
            pos = end + 1
            continue
        depth, i = 0, brace
        while i < len(text):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
            if depth == 0:
                break
        pos = i
    out.append(text[pos:])
    return "".join(out)


def test_files(path, text):
    """The files a `#[cfg(test)] mod name;` in `path` declares."""
    folder = os.path.dirname(path)
    if os.path.basename(path) not in ("mod.rs", "lib.rs", "main.rs"):
        folder = path[: -len(".rs")]
    names = re.findall(r"#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(" + IDENT + r")\s*;", text)
    return {os.path.join(folder, n + ".rs") for n in names} | {
        os.path.join(folder, n, "mod.rs") for n in names
    }


def referenced(here, text):
    """Every module path (as segments) the file's code names."""
    text = re.sub(r"\bin\s+crate::", "in ", expand_groups(without_tests(strip(text))))
    found = []
    for m in re.finditer(r"\b((?:crate|super)(?:::(?:super|" + IDENT + r"))+)", text):
        segs = m.group(1).split("::")
        if segs[0] == "crate":
            parts = segs[1:]
        else:
            base = list(here)
            while segs and segs[0] == "super":
                base = base[:-1]
                segs = segs[1:]
            parts = base + segs
        found.append([p for p in parts if p != "self"])
    # A path that starts at a child module (`use prices::parse_effective`, `ledger::settle(..)`).
    for m in re.finditer(r"(?<![:\w])(" + IDENT + r")::", text):
        if m.group(1) not in ("crate", "super", "self") and is_module(here + [m.group(1)]):
            found.append(here + [m.group(1)])
    return found


def graph():
    edges = {}
    texts = {}
    for root, _, files in os.walk(SRC):
        for f in files:
            if f.endswith(".rs"):
                path = os.path.join(root, f)
                with open(path, encoding="utf-8") as fh:
                    texts[path] = fh.read()
    tests = set()
    for path, text in texts.items():
        tests |= test_files(path, strip(text))
    for path in sorted(texts):
        if path in tests:
            continue
        if True:
            here = module_of(path)
            src_node = node(here)
            if src_node is None:
                continue
            text = texts[path]
            for parts in referenced(here, text):
                dst = node(parts)
                if dst is None or dst == src_node:
                    continue
                edges.setdefault(src_node, {}).setdefault(dst, set()).add(path)
    return edges


def components(edges):
    """Tarjan's strongly connected components, iteratively."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]
    nodes = sorted(set(edges) | {d for ds in edges.values() for d in ds})
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, {}))))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges.get(w, {})))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len({c.split("::")[0] for c in comp}) > 1:
                    out.append(sorted(comp))
    return sorted(out)


def main():
    edges = graph()
    cycles = components(edges)
    for comp in cycles:
        print("cycle: " + " <-> ".join(comp))
        for a in comp:
            for b in sorted(edges.get(a, {})):
                if b in comp and a.split("::")[0] != b.split("::")[0]:
                    files = ", ".join(sorted(edges[a][b]))
                    print(f"  {a} -> {b}  ({files})")
    if not cycles:
        print("no import cycles between top-level modules")
    return 1 if cycles else 0


if __name__ == "__main__":
    sys.exit(main())
