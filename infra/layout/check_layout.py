#!/usr/bin/env python3
"""The house rules of the source tree, checked (make test runs it):

1. No Rust file over 500 lines unless its top (its first 30 lines) says why ("Why ...").
2. No circle of modules inside a crate: no module uses (through `crate::`, `super::` or its
   own child modules) a module that uses it back, directly or around a longer loop. What two
   modules share moves down a floor.
3. The operator's crate (infra/payctl) and the laptop's Lambda (infra/local) never depend on
   the proving ground (infra/proving).
4. No compiled Python (`__pycache__`, `.pyc`) is tracked.
5. No flat folder: a crate folder holding more than a dozen Rust files says why at the top of
   its root file (`lib.rs`, `main.rs` or `mod.rs`: a line with "Why flat"), or is split.
6. No circle of rooms: a crate's rooms are its top-level folders and files; no two rooms use
   each other, directly or around a longer loop, even where no two modules do.
7. A folder says what it may use: a line "May use: a, b (...)." in its `mod.rs` names the rooms
   it uses, all of them and nothing else ("nothing else" / "every other folder" allowed).
   Required in the crates of ROOMED; checked wherever it is written.

Usage: check_layout.py [ROOT]  (exit 1 naming each breach); check_layout.py --self-test
"""
import os
import re
import sys

LIMIT = 500
CRATES = ["sqs-once/src", "shared/src", "infra/local/src", "infra/payctl/src", "infra/proving/src"]
ROOMED = ["shared/src"]
FLAT = 12


def module_name(src, path):
    parts = os.path.relpath(path, src)[:-3].split(os.sep)
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return "::".join(parts)


def code_of(text):
    """The text without comments and without the unit-test module at its end."""
    text = re.sub(r"#\[cfg\(test\)\]\s*(?:pub(?:\([a-z]+\))?\s+)?mod tests\s*\{.*", "", text, flags=re.S)
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


def rooms_of(edges):
    """The room graph: module edges between different top-level rooms (the crate root, `lib`,
    is no room: it only declares them)."""
    rooms = {}
    for m, targets in edges.items():
        if not m:
            continue
        room = m.split("::")[0]
        rooms.setdefault(room, set())
        for t in targets:
            if t and t.split("::")[0] != room:
                rooms[room].add(t.split("::")[0])
    return rooms


def declared_uses(text):
    """The rooms a folder's `mod.rs` says it may use, or None when it says nothing."""
    doc = " ".join(l.strip()[3:].strip() for l in text.split("\n") if l.strip().startswith("//!"))
    m = re.search(r"May use: (.*?)(?:\.(?:\s|$)|$)", doc)
    if not m:
        return None
    said = re.sub(r"\([^)]*\)", "", m.group(1))
    if said.strip().startswith("every other folder"):
        return "all"
    if said.strip().startswith("nothing"):
        return set()
    return {w.strip() for w in said.split(",") if w.strip()}


def room_breaches(crate, files, edges, required):
    """Rules 6 and 7 for one crate. files: {module: text}."""
    breaches = []
    rooms = rooms_of(edges)
    for c in cycles(rooms):
        breaches.append(f"{crate}: rooms in a circle: {' -> '.join(c)}")
    folders = {m for m in files if m and "::" not in m and any(k.startswith(m + "::") for k in files)}
    for folder in sorted(folders):
        said = declared_uses(files[folder])
        uses = rooms.get(folder, set())
        if said is None:
            if required:
                breaches.append(f"{crate}/{folder}/mod.rs: says nothing of what it may use (a line \"May use: ...\")")
            continue
        if said == "all":
            continue
        unknown = said - set(rooms)
        if unknown:
            breaches.append(f"{crate}/{folder}/mod.rs: may use {', '.join(sorted(unknown))}, which is no room of the crate")
        extra = uses - said
        if extra:
            breaches.append(f"{crate}/{folder}: uses {', '.join(sorted(extra))} but its mod.rs does not say it may")
        stale = (said & set(rooms)) - uses
        if stale:
            breaches.append(f"{crate}/{folder}/mod.rs: says it may use {', '.join(sorted(stale))}, which it does not use (say what is true)")
    return breaches


def flat_breaches(folders):
    """Rule 5. folders: {folder path: (number of .rs files in it, text of its root files)}."""
    breaches = []
    for folder, (count, root_text) in sorted(folders.items()):
        head = "\n".join(root_text.split("\n")[:40])
        if count > FLAT and "Why flat" not in head:
            breaches.append(f"{folder}: {count} Rust files side by side (over {FLAT}) and no \"Why flat\" at the top of its root file: split it by capability, or say why")
    return breaches


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
        edges = edges_of(files)
        for c in cycles(edges):
            breaches.append(f"{crate}: modules in a circle: {' -> '.join(x or 'lib' for x in c)}")
        breaches.extend(room_breaches(crate, files, edges, crate in ROOMED))
        folders = {}
        for d, _, names in os.walk(src):
            rs = [n for n in names if n.endswith(".rs")]
            roots = [n for n in ("lib.rs", "main.rs", "mod.rs") if n in names]
            text = "\n".join(open(os.path.join(d, n), encoding="utf-8").read() for n in roots)
            folders[os.path.relpath(d, root)] = (len(rs), text)
        breaches.extend(flat_breaches(folders))
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
    in_pub_tests = {"p": "mod k;\nuse k::*;", "p::k": "fn f() {}\n#[cfg(test)]\npub(crate) mod tests {\n use super::*;\n}"}
    assert cycles(edges_of(in_pub_tests)) == []
    # rooms: no two modules in a circle, but two folders are
    rooms = {"a": "//! May use: b.\nmod x;\nmod w;", "a::x": "use crate::b::y;", "a::w": "",
             "b": "//! May use: a.\nmod y;\nmod z;", "b::y": "", "b::z": "use crate::a::w;"}
    e = edges_of(rooms)
    assert cycles(e) == [], cycles(e)
    found = room_breaches("c", rooms, e, True)
    assert found == ["c: rooms in a circle: a -> b -> a"], found
    # a folder that uses a room it does not name, and one that names a room it does not use
    floors = {"a": "//! May use: nothing else.\nmod x;", "a::x": "use crate::b::y;",
              "b": "//! May use: a, t (logs).\nmod y;", "b::y": "", "t": ""}
    found = room_breaches("c", floors, edges_of(floors), True)
    assert found == ["c/a: uses b but its mod.rs does not say it may",
                     "c/b/mod.rs: says it may use a, t, which it does not use (say what is true)"], found
    # said nothing, where it must; said a room that does not exist
    quiet = {"a": "mod x;", "a::x": "", "b": "//! May use: q.\nmod y;", "b::y": ""}
    found = room_breaches("c", quiet, edges_of(quiet), True)
    assert found[0].startswith("c/a/mod.rs: says nothing") and "q, which is no room" in found[1], found
    assert room_breaches("c", quiet, edges_of(quiet), False) == [found[1]]
    # a true declaration over two lines, with a reason in brackets, passes
    good = {"a": "//! May use: b (its\n//! records), t.\nmod x;", "a::x": "use crate::b::y;\nuse crate::t::log;",
            "b": "//! May use: nothing else.\nmod y;", "b::y": "", "t": "", "e": "//! May use: every other folder.\nmod z;",
            "e::z": "use crate::a::x;"}
    assert room_breaches("c", good, edges_of(good), True) == [], room_breaches("c", good, edges_of(good), True)
    # flat folders
    assert flat_breaches({"s/src": (13, "//! a crate")})[0].startswith("s/src: 13 Rust files")
    assert flat_breaches({"s/src": (13, "//! Why flat: each file is one public module")}) == []
    assert flat_breaches({"s/src": (12, "")}) == []
    print("check_layout self-test: 16 cases ok")


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
    print(f"layout: no module or room circles in {len(CRATES)} crates; every folder of {', '.join(ROOMED)} says what it may use, truly; no folder over {FLAT} files or file over {LIMIT} lines without a reason; payctl and lambda-local stand apart from the proving ground")
