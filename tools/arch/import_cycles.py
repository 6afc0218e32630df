#!/usr/bin/env python3
"""Import circles between the source files of each crate (docs/architecture-changes.md).

A file A "imports" file B when A names a path `crate::m1::m2…` (or `super::…`) that resolves to
B's module. Files in one strongly connected component of that graph import each other, directly
or through others: a circle. Cargo forbids circles between crates, so only circles inside a crate
can exist; this prints, per crate, the number of files, of import edges and of circles (SCCs with
more than one file), and the files of each circle.

    python3 tools/arch/import_cycles.py [REPO_ROOT]
"""
import os
import re
import sys

PATH = re.compile(r"\b(crate|super)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")


def crate_roots(root):
    """(crate name, src folder) for every crate with a src/lib.rs or src/main.rs."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in ("target", ".git", "node_modules")]
        if "Cargo.toml" in filenames and os.path.isdir(os.path.join(dirpath, "src")):
            src = os.path.join(dirpath, "src")
            for top in ("lib.rs", "main.rs"):
                if os.path.isfile(os.path.join(src, top)):
                    yield os.path.relpath(dirpath, root), src, top
                    break


def module_files(src, top):
    """module path (tuple) -> file, for every .rs file under src."""
    mods = {}
    for dirpath, _, filenames in os.walk(src):
        for f in filenames:
            if not f.endswith(".rs"):
                continue
            rel = os.path.relpath(os.path.join(dirpath, f), src)
            parts = rel[:-3].split(os.sep)
            if parts[-1] == "mod" or (len(parts) == 1 and f == top):
                parts = parts[:-1]
            mods[tuple(parts)] = os.path.join(dirpath, f)
    return mods


def resolve(mods, path):
    """The longest module prefix of `path` that is a file."""
    for n in range(len(path), -1, -1):
        if tuple(path[:n]) in mods:
            return mods[tuple(path[:n])]
    return None


def sccs(nodes, edges):
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(comp)

    sys.setrecursionlimit(10000)
    for v in nodes:
        if v not in index:
            visit(v)
    return out


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    total = 0
    for name, src, top in sorted(crate_roots(root)):
        mods = module_files(src, top)
        by_file = {f: m for m, f in mods.items()}
        edges = {}
        for f, m in by_file.items():
            text = open(f, encoding="utf-8").read()
            # Test modules may reach anywhere; they are not part of the design.
            text = text.split("#[cfg(test)]")[0]
            # Comments (doc links included) name paths without depending on them.
            text = re.sub(r"//[^\n]*", "", text)
            for base, rest in PATH.findall(text):
                parts = rest.split("::")[1:]
                if base == "crate":
                    path = parts
                else:
                    here = list(m) if os.path.basename(f) in ("mod.rs", "lib.rs", "main.rs") else list(m[:-1])
                    ups = 1
                    while parts and parts[0] == "super":
                        parts, ups = parts[1:], ups + 1
                    path = here[: len(here) - ups + 1] + parts
                target = resolve(mods, path)
                if target and target != f:
                    edges.setdefault(f, set()).add(target)
        circles = [c for c in sccs(list(by_file), edges) if len(c) > 1]
        total += len(circles)
        n_edges = sum(len(v) for v in edges.values())
        print(f"{name}: {len(by_file)} files, {n_edges} import edges, {len(circles)} circles")
        for c in circles:
            print("   circle:", ", ".join(sorted(os.path.relpath(x, src) for x in c)))
    print(f"total circles inside crates: {total} (across crates: none, cargo forbids them)")


if __name__ == "__main__":
    main()
