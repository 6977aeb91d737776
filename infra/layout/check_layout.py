#!/usr/bin/env python3
"""The house rules of the source tree, checked (make test runs it):

1. No Rust file over 500 lines unless its top (its first 30 lines) says why ("Why ...").
2. No circle of modules inside a crate: no module uses (through `crate::`, `super::` or its
   own child modules) a module that uses it back, directly or around a longer loop. What two
   modules share moves down a floor.
3. The operator's crate (infra/payctl) and the laptop's Lambda (infra/local) never depend on
   the proving ground (infra/proving).
4. No compiled Python (`__pycache__`, `.pyc`) is tracked.
5. No flat folder: a folder anywhere in the repository holding more than a dozen Rust files
   says why at the top of its root file (`lib.rs`, `main.rs`, `mod.rs` or the `<folder>.rs`
   beside it: a line with "Why flat"), or is split.
6. No circle of rooms: a crate's rooms are its top-level folders and files; no two rooms use
   each other, directly or around a longer loop, even where no two modules do (a use through
   the crate root's `pub use`, a `{...}` group or `super::super::` counts).
7. A room says what it may use: a line "May use: a, b (...)." in its root file (a folder's
   `mod.rs`, a top-level file itself) names the rooms it uses, all of them and nothing else
   ("nothing else" / "every other folder" allowed). Required in the crates of ROOMED; checked
   wherever it is written. Unit tests aside (the `#[cfg(test)] mod tests` at a file's end), as
   in rule 2: a test may build its fixture from a floor above.

Usage: check_layout.py [ROOT]  (exit 1 naming each breach); check_layout.py --self-test
"""
import os
import re
import sys

LIMIT = 500
CRATES = ["sqs-once/src", "shared/src", "infra/local/src", "infra/payctl/src", "infra/proving/src", "infra/sim/src"]
ROOMED = ["shared/src"]
FLAT = 12


def module_name(src, path):
    parts = os.path.relpath(path, src)[:-3].split(os.sep)
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return "::".join(parts)


def code_of(text):
    """The code alone: no comments, no string or char literals, no unit-test module at its end."""
    text = re.sub(r"#\[cfg\(test\)\]\s*(?:pub(?:\([a-z]+\))?\s+)?mod tests\s*\{.*", "", text, flags=re.S)
    text = re.sub(r"'(?:\\.|[^'\\\n])'", "''", text)
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', text)
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def expand_groups(code):
    """`crate::{a::X, b::{c, d}}` written out as `crate::a::X crate::b::c crate::b::d`."""
    head = re.compile(r"\b((?:crate|super|self)(?:::[A-Za-z_][A-Za-z0-9_]*)*)::\{")
    while True:
        m = head.search(code)
        if not m:
            return code
        depth, i = 1, m.end()
        while i < len(code) and depth:
            depth += {"{": 1, "}": -1}.get(code[i], 0)
            i += 1
        inner = code[m.end():i - 1]
        items, depth, cur = [], 0, ""
        for ch in inner:
            if ch == "," and depth == 0:
                items.append(cur)
                cur = ""
                continue
            depth += {"{": 1, "}": -1}.get(ch, 0)
            cur += ch
        items.append(cur)
        paths = [m.group(1) + "::" + it.strip() for it in items if it.strip() and it.strip() != "self"]
        if any(it.strip() == "self" for it in items):
            paths.append(m.group(1))
        code = code[:m.start()] + " " + " ".join(paths) + " " + code[i:]


def root_exports(lib_text, mods):
    """The crate root's `pub use` names, each with the module it names: `crate::payment_store`
    is a use of `payments` as surely as `crate::payments::payment_store`."""
    found = {}
    for path in re.findall(r"\bpub use ((?:[A-Za-z_][A-Za-z0-9_]*::)+[A-Za-z_][A-Za-z0-9_]*)",
                           expand_groups(code_of(lib_text).replace("pub use ", "pub use crate::"))):
        parts = path.split("::")
        if parts[0] == "crate":
            parts = parts[1:]
        for n in range(len(parts) - 1, 0, -1):
            if "::".join(parts[:n]) in mods:
                found[parts[-1]] = "::".join(parts[:n])
                break
    return found


def edges_of(files):
    """files: {module: text}. Returns {module: set(modules it uses)}."""
    mods = set(files)
    exports = root_exports(files.get("", ""), mods)
    edges = {m: set() for m in mods}
    ident = r"(?:[A-Za-z_][A-Za-z0-9_]*::)*[A-Za-z_][A-Za-z0-9_]*"
    for m, text in files.items():
        code = expand_groups(code_of(text))
        parts_of_m = m.split("::") if m else []

        def add(target):
            parts = target.split("::")
            if parts[0] in exports and parts[0] not in mods:
                parts = exports[parts[0]].split("::") + parts[1:]
            # the longest known module that the path names (crate::a::b names a::b, or a)
            for n in range(len(parts), 0, -1):
                cand = "::".join(parts[:n])
                if cand in mods:
                    if cand != m and not m.startswith(cand + "::"):
                        edges[m].add(cand)
                    return

        for path in re.findall(r"\bcrate::(" + ident + ")", code):
            add(path)
        for supers, path in re.findall(r"(?<![A-Za-z0-9_:])((?:super::)+)(" + ident + ")", code):
            up = supers.count("super::")
            base = parts_of_m[:-up] if up <= len(parts_of_m) else []
            add("::".join(base + [path]))
            if "::".join(base) in mods and not re.match(r"[a-z_][a-z0-9_]*(::|$)", path):
                # super::Item: an item of the ancestor module itself
                if "::".join(base) != m:
                    edges[m].add("::".join(base))
        for supers in re.findall(r"(?<![A-Za-z0-9_:])((?:super::)+)\*", code):
            base = "::".join(parts_of_m[:-supers.count("super::")])
            if base in mods and base != m:
                edges[m].add(base)
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
    """The rooms a room's root file says it may use: None when it says nothing, "all", a set,
    or a string that says why the line cannot be read."""
    doc = " ".join(l.strip()[3:].strip() for l in text.split("\n") if l.strip().startswith("//!"))
    doc = re.sub(r"\([^)]*\)", "", doc).replace("`", "")
    found = re.findall(r"May use: (.*?)(?:\.(?:\s|$)|$)", doc)
    if not found:
        return None
    if len(found) > 1:
        return "it says \"May use:\" twice"
    said = found[0].strip()
    if said == "every other folder":
        return "all"
    if said in ("nothing", "nothing else"):
        return set()
    words = [w.strip() for w in re.split(r",|\band\b", said) if w.strip()]
    odd = [w for w in words if not re.fullmatch(r"[a-z_][a-z0-9_]*", w)]
    if odd:
        return f"its \"May use:\" names {odd}, which are not room names (list them, comma-separated)"
    return set(words)


def room_breaches(crate, files, edges, required):
    """Rules 6 and 7 for one crate. files: {module: text}."""
    breaches = []
    rooms = rooms_of(edges)
    for c in cycles(rooms):
        breaches.append(f"{crate}: rooms in a circle: {' -> '.join(c)}")
    for room in sorted(m for m in files if m and "::" not in m):
        folder = any(k.startswith(room + "::") for k in files)
        where = f"{crate}/{room}/mod.rs" if folder else f"{crate}/{room}.rs"
        said = declared_uses(files[room])
        uses = rooms.get(room, set())
        if said is None:
            if required:
                breaches.append(f"{where}: says nothing of what it may use (a line \"May use: ...\")")
            continue
        if isinstance(said, str) and said != "all":
            breaches.append(f"{where}: {said}")
            continue
        if said == "all":
            continue
        unknown = said - set(rooms)
        if unknown:
            breaches.append(f"{where}: may use {', '.join(sorted(unknown))}, which is no room of the crate")
        extra = uses - said
        if extra:
            breaches.append(f"{crate}/{room}: uses {', '.join(sorted(extra))} but {where} does not say it may")
        stale = (said & set(rooms)) - uses
        if stale:
            breaches.append(f"{where}: says it may use {', '.join(sorted(stale))}, which it does not use (say what is true)")
    return breaches


def flat_folders(root):
    """Every folder of Rust files in the repository: {path: (its .rs files, [its root files'
    texts])}. A folder's root file is its lib.rs, main.rs or mod.rs, or the `<folder>.rs`
    beside it."""
    folders = {}
    for d, dirs, names in os.walk(root):
        dirs[:] = [x for x in dirs if x not in ("target", ".git", "node_modules") and not x.startswith(".")]
        rs = [n for n in names if n.endswith(".rs")]
        if not rs:
            continue
        roots = [os.path.join(d, n) for n in ("lib.rs", "main.rs", "mod.rs") if n in names]
        beside = d.rstrip(os.sep) + ".rs"
        if os.path.isfile(beside):
            roots.append(beside)
        folders[os.path.relpath(d, root)] = (len(rs), [open(p, encoding="utf-8").read() for p in roots])
    return folders


def flat_breaches(folders):
    """Rule 5. folders: {folder path: (number of .rs files in it, [texts of its root files])}."""
    breaches = []
    for folder, (count, roots) in sorted(folders.items()):
        said = any("Why flat" in "\n".join(text.split("\n")[:40]) for text in roots)
        if count > FLAT and not said:
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
    breaches.extend(flat_breaches(flat_folders(root)))
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
    cases = 2
    # the same circle through the crate root's re-export, through a group, through super::super
    for via in ("fn f() { crate::w_fn() }", "use crate::{a::{w, x}};", "use super::super::a::w;"):
        hidden = dict(rooms, **{"": "pub mod a;\npub mod b;\npub use a::w::w_fn;", "b::z": via})
        assert room_breaches("c", hidden, edges_of(hidden), True) == ["c: rooms in a circle: a -> b -> a"], (via, room_breaches("c", hidden, edges_of(hidden), True))
        cases += 1
    # a use in a comment, a string or a test is no use
    quiet_use = dict(rooms, **{"b::z": 'fn f() { g("crate::a::w") } // crate::a::w\n/* crate::a::w */\n#[cfg(test)]\nmod tests { use crate::a::w; }'})
    assert cycles(rooms_of(edges_of(quiet_use))) == [], rooms_of(edges_of(quiet_use))
    # a room that uses a room it does not name, and one that names a room it does not use
    floors = {"a": "//! May use: nothing else.\nmod x;", "a::x": "use crate::b::y;",
              "b": "//! May use: a, t (logs).\nmod y;", "b::y": "", "t": "//! May use: nothing else."}
    found = room_breaches("c", floors, edges_of(floors), True)
    assert found == ["c/a: uses b but c/a/mod.rs does not say it may",
                     "c/b/mod.rs: says it may use a, t, which it does not use (say what is true)"], found
    # a file room must say it too: here t uses a and says nothing
    files_too = dict(floors, **{"t": "use crate::a::x;"})
    assert "c/t.rs: says nothing of what it may use" in " ".join(room_breaches("c", files_too, edges_of(files_too), True))
    # said nothing where it must; said a room that does not exist; said it twice; said prose
    quiet = {"a": "mod x;", "a::x": "", "b": "//! May use: q.\nmod y;", "b::y": ""}
    found = room_breaches("c", quiet, edges_of(quiet), True)
    assert found[0].startswith("c/a/mod.rs: says nothing") and "q, which is no room" in found[1], found
    assert room_breaches("c", quiet, edges_of(quiet), False) == [found[1]]
    twice = {"a": "//! May use: b.\n//! May use: b.\nmod x;", "a::x": "use crate::b::y;", "b": "//! May use: nothing else.\nmod y;", "b::y": ""}
    assert "twice" in " ".join(room_breaches("c", twice, edges_of(twice), True))
    prose = dict(twice, a="//! May use: every other folder except b.\nmod x;")
    assert "not room names" in " ".join(room_breaches("c", prose, edges_of(prose), True))
    # a true declaration over two lines, in backticks, with "and", with a reason in brackets, passes
    good = {"a": "//! May use: `b` (its\n//! records, e.g. x. y) and t.\nmod x;", "a::x": "use crate::b::y;\nuse crate::t::log;",
            "b": "//! May use: nothing else.\nmod y;", "b::y": "", "t": "//! May use: nothing else.",
            "e": "//! May use: every other folder.\nmod z;", "e::z": "use crate::a::x;"}
    assert room_breaches("c", good, edges_of(good), True) == [], room_breaches("c", good, edges_of(good), True)
    cases += 8
    # flat folders, and the scan that finds them
    assert flat_breaches({"s/src": (13, ["//! a crate"])})[0].startswith("s/src: 13 Rust files")
    assert flat_breaches({"s/src": (13, ["//! Why flat: each file is one public module"])}) == []
    assert flat_breaches({"s/src": (12, [])}) == []
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        os.makedirs(os.path.join(tmp, "t", "many"))
        for i in range(13):
            open(os.path.join(tmp, "t", "many", f"m{i}.rs"), "w").close()
        assert flat_breaches(flat_folders(tmp))[0].startswith(os.path.join("t", "many") + ": 13")
        with open(os.path.join(tmp, "t", "many.rs"), "w") as f:
            f.write("//! Why flat: one test a file\n")
        assert flat_breaches(flat_folders(tmp)) == []
    cases += 5
    print(f"check_layout self-test: {7 + 1 + cases} cases ok")


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
    print(f"layout: no module or room circles in {len(CRATES)} crates; every room of {', '.join(ROOMED)} says what it may use, truly; no folder over {FLAT} files or file over {LIMIT} lines without a reason; payctl and lambda-local stand apart from the proving ground")
