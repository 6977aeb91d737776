#!/usr/bin/env python3
"""The house rules of the source tree, checked (make test runs it):

1. No Rust file over 500 lines unless its top (its first 30 lines) says why ("Why ...").
2. No circle of modules inside a crate: no module uses (through `crate::`, `super::` or its
   own child modules) a module that uses it back, directly or around a longer loop. What two
   modules share moves down a floor.
3. The operator's crate (infra/payctl) and the laptop's Lambda (infra/local) never depend on
   the proving ground (infra/proving).
4. No compiled Python (`__pycache__`, `.pyc`) is tracked.

Usage: check_layout.py [ROOT]  (exit 1 naming each breach); check_layout.py --self-test
"""
import os
import re
import sys

LIMIT = 500
CRATES = ["sqs-once/src", "shared/src", "infra/local/src", "infra/payctl/src", "infra/proving/src"]


def module_name(src, path):
    parts = os.path.relpath(path, src)[:-3].split(os.sep)
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return "::".join(parts)


def code_of(text):
    """The text without comments and without the unit-test module at its end."""
    text = re.sub(r"#\[cfg\(test\)\]\s*mod tests\s*\{.*", "", text, flags=re.S)
    return "\n".join(l for l in text.split("\n") if not l.strip().startswith("//"))


def edges_of(files):
    """files: {module: text}. Returns {module: set(modules it uses)}."""
    mods = set(files)
    edges = {m: set() for m in mods}
    for m, text in files.items():
        code = code_of(text)
        parent = "::".join(m.split("::")[:-1])

        def add(target):
            # the longest known module that the path names (crate::a::b names a::b, or a)
            parts = target.split("::")
            for n in range(len(parts), 0, -1):
                cand = "::".join(parts[:n])
                if cand in mods:
                    if cand != m and not m.startswith(cand + "::"):
                        edges[m].add(cand)
                    return

        for path in re.findall(r"\bcrate::((?:[a-z_][a-z0-9_]*::)*[a-z_][a-z0-9_]*)", code):
            add(path)
        for path in re.findall(r"\bsuper::((?:[a-z_][a-z0-9_]*::)*[a-z_][a-z0-9_]*)", code):
            add(parent + "::" + path if parent else path)
        if parent != m and re.search(r"\bsuper::(\*|\{|[A-Z])", code):
            if parent in mods:
                edges[m].add(parent)
        for child in re.findall(r"^\s*(?:pub(?:\([a-z]+\))? )?use ([a-z_][a-z0-9_]*)::", code, flags=re.M):
            add(m + "::" + child if m else child)
    return edges


def cycles(edges):
    """Every circle, once, as a list of modules."""
    found, seen = [], set()
    for start in sorted(edges):
        stack = [(start, [start])]
        while stack:
            node, path = stack.pop()
            for nxt in sorted(edges.get(node, ())):
                if nxt == start:
                    key = frozenset(path)
                    if key not in seen:
                        seen.add(key)
                        found.append(path + [start])
                elif nxt not in path and nxt > start:
                    stack.append((nxt, path + [nxt]))
    return found


def check(root):
    breaches = []
    for crate in CRATES:
        src = os.path.join(root, crate)
        files = {}
        for d, _, names in os.walk(src):
            for n in names:
                if n.endswith(".rs"):
                    p = os.path.join(d, n)
                    files[module_name(src, p)] = open(p, encoding="utf-8").read()
        for c in cycles(edges_of(files)):
            breaches.append(f"{crate}: modules in a circle: {' -> '.join(x or 'lib' for x in c)}")
    for d, dirs, names in os.walk(root):
        dirs[:] = [x for x in dirs if x not in ("target", ".git") and not x.startswith(".venv") and not x.startswith(".aws-sam")]
        for n in names:
            if n.endswith(".rs"):
                p = os.path.join(d, n)
                lines = open(p, encoding="utf-8").read().split("\n")
                if len(lines) > LIMIT and not any("Why" in l for l in lines[:30]):
                    breaches.append(f"{os.path.relpath(p, root)}: {len(lines)} lines and no reason at its top (split it, or say why)")
    if os.path.isdir(os.path.join(root, ".git")):
        import subprocess
        tracked = subprocess.run(["git", "-C", root, "ls-files"], capture_output=True, text=True).stdout.split("\n")
        for p in tracked:
            if "__pycache__/" in p or p.endswith(".pyc"):
                breaches.append(f"{p}: compiled Python is tracked (it changes with every run)")
    for crate in ("infra/payctl", "infra/local"):
        toml = open(os.path.join(root, crate, "Cargo.toml"), encoding="utf-8").read()
        if re.search(r"^proving\b", toml, flags=re.M):
            breaches.append(f"{crate} depends on the proving ground")
    return breaches


def self_test():
    circle = {"a": "use crate::b::X;", "b": "fn f() { crate::a::g() }", "c": "use crate::a;"}
    assert cycles(edges_of(circle)) == [["a", "b", "a"]], cycles(edges_of(circle))
    loop3 = {"a": "use crate::b;", "b": "use crate::c;", "c": "use crate::a;"}
    assert len(cycles(edges_of(loop3))) == 1
    floors = {"a": "use crate::b;", "b": "use crate::c;", "c": ""}
    assert cycles(edges_of(floors)) == []
    parent_child = {"p": "mod k;\nuse k::run;", "p::k": "use super::Shared;"}
    assert cycles(edges_of(parent_child)) == [["p", "p::k", "p"]]
    down = {"p": "mod k;\nmod s;\nuse k::run;", "p::k": "use super::s::Shared;", "p::s": ""}
    assert cycles(edges_of(down)) == []
    in_tests = {"a": "use crate::b;", "b": "fn f() {}\n#[cfg(test)]\nmod tests {\n use crate::a;\n}"}
    assert cycles(edges_of(in_tests)) == []
    in_docs = {"a": "use crate::b;", "b": "/// see [`crate::a`]\nfn f() {}"}
    assert cycles(edges_of(in_docs)) == []
    print("check_layout self-test: 7 cases ok")


if __name__ == "__main__":
    if sys.argv[1:] == ["--self-test"]:
        self_test()
        sys.exit(0)
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..")
    found = check(os.path.abspath(root))
    for b in found:
        print(b, file=sys.stderr)
    if found:
        sys.exit(1)
    print(f"layout: no module circles in {len(CRATES)} crates; no file over {LIMIT} lines without a reason; payctl and lambda-local stand apart from the proving ground")
