"""The package's import graph in numbers: modules at the root, levels, edges, cycles and upward imports.

    python scripts/import_graph.py [--package sparklab] [--json]

Every `import sparklab.x` / `from sparklab.x import y` / `from sparklab import x` in a module counts, at any
depth of the file (a function-local import is an edge too; imports under `if TYPE_CHECKING:` are counted
separately). A module's level is 0 when it imports no other module of the package, else one more than the
highest level it imports (cycles are first collapsed into one node). An upward import is an edge that goes
from a module to one on its own or a higher level: only a cycle has them.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports_of(path: Path, package: str, modules: set[str], me: str) -> tuple[set[str], set[str]]:
    """(runtime imports, TYPE_CHECKING-only imports) of package modules by this file."""
    tree = ast.parse(path.read_text())
    typing_only: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _type_checking(node):
            for inner in node.body:
                for sub in ast.walk(inner):
                    typing_only.add(id(sub))
    found: set[str] = set()
    typed: set[str] = set()

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = me if path.name == "__init__.py" else me.rpartition(".")[0]
                for _ in range(node.level - 1):
                    pkg = pkg.rpartition(".")[0]
                base = f"{pkg}.{base}" if base else pkg
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        for target in targets:
            if not (target == package or target.startswith(package + ".")):
                continue
            hit = resolve(target)
            if hit is None or hit == me:
                continue
            # `from sparklab import x` names the module x, not the package
            if (isinstance(node, ast.ImportFrom) and hit == base and f"{base}." in " ".join(targets[:-1])
                    and any(resolve(t) not in (None, base) for t in targets[:-1])):
                continue
            (typed if id(node) in typing_only else found).add(hit)
    return found, typed - found


def strongly_connected(nodes: list[str], edges: dict[str, set[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]
    sys.setrecursionlimit(10000)

    def visit(v: str) -> None:
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

    for v in nodes:
        if v not in index:
            visit(v)
    return out


def module_levels(root: Path) -> dict[str, int]:
    """Each module's level (0: imports nothing of the package), as `measure` counts them."""
    return _graph(root)[1]


def _graph(root: Path, with_typing: bool = True) -> tuple[dict[str, set[str]], dict[str, int], list[list[str]],
                                                            dict[str, Path]]:
    package = root.name
    files = sorted(root.rglob("*.py"))
    names = {module_name(p, root): p for p in files}
    modules = set(names)
    edges: dict[str, set[str]] = {}
    for name, path in names.items():
        found, typed = imports_of(path, package, modules, name)
        edges[name] = found | (typed if with_typing else set())
    # importing a submodule imports its package first: the edge to `sparklab` itself says nothing
    for name in edges:
        edges[name].discard(package)
    comps = strongly_connected(sorted(modules), edges)
    comp_of = {m: i for i, c in enumerate(comps) for m in c}
    level: dict[int, int] = {}

    def comp_level(i: int) -> int:
        if i not in level:
            level[i] = -1
            below = [comp_level(comp_of[w]) for m in comps[i] for w in edges[m] if comp_of[w] != i]
            level[i] = 1 + max(below, default=-1)
        return level[i]

    levels = {m: comp_level(comp_of[m]) for m in modules}
    return edges, levels, comps, names


def measure(root: Path, with_typing: bool = True) -> dict[str, object]:
    package = root.name
    files = sorted(root.rglob("*.py"))
    edges, levels, comps, names = _graph(root, with_typing)
    modules = set(names)
    comp_of = {m: i for i, c in enumerate(comps) for m in c}
    typed_edges = sum(len(imports_of(p, package, modules, n)[1]) for n, p in names.items())
    cycles = [sorted(c) for c in comps if len(c) > 1]
    upward = sorted(f"{a} -> {b}" for a in edges for b in edges[a] if comp_of[a] == comp_of[b])
    root_modules = sorted(p.name for p in root.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    linked = {m for m in modules if edges[m] or any(m in e for e in edges.values())}
    big = sorted((sum(1 for _ in p.open()), module_name(p, root)) for p in files)
    return {
        "files": len(files),
        "files_in_graph": len(linked),
        "root_modules": len(root_modules),
        "lines": sum(n for n, _ in big),
        "levels": 1 + max(levels.values(), default=-1),
        "edges": sum(len(e) for e in edges.values()),
        "type_checking_only_edges": typed_edges,
        "cycles": cycles,
        "upward_imports": upward,
        "over_400_lines": [f"{m} ({n})" for n, m in big if n > 400],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--package", default=str(Path(__file__).resolve().parents[1] / "sparklab"))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    numbers = measure(Path(args.package))
    if args.json:
        print(json.dumps(numbers, indent=1))
        return 0
    for key, value in numbers.items():
        if isinstance(value, list):
            print(f"{key}: {len(value)}")
            for item in value:
                print(f"  {item}")
        else:
            print(f"{key}: {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
