"""What mypy (run over the package by scripts/test.sh) cannot hold by itself: every `type: ignore` left in the
package and every `Any` in a public signature at a package boundary says why (docs/architecture.md, "House
rules the tests enforce"). mypy's warn_unused_ignores drops an ignore that is no longer needed; these say the
ones that stay are meant."""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "sparklab"
MARKER = "# Any:"  # the reason's prefix, on the def, the line above it, its class's, or the module's own line
IGNORE = re.compile(r"#\s*type:\s*ignore(\[[^\]]*\])?(?P<tail>.*)$")


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_every_type_ignore_says_why() -> None:
    """`# type: ignore[code]  # why`, or a comment on the line above that says why."""
    bare = []
    for path in _modules():
        lines = path.read_text().splitlines()
        for number, line in enumerate(lines, 1):
            found = IGNORE.search(line)
            if not found:
                continue
            same_line = found["tail"].strip().startswith("#") and found["tail"].strip("# ")
            above = number > 1 and lines[number - 2].strip().startswith("#")
            if not (found.group(1) and (same_line or above)):
                bare.append(f"{path.relative_to(PACKAGE.parent)}:{number}: {line.strip()}")
    assert not bare, "a type: ignore needs its error code and a one-line reason:\n" + "\n".join(bare)


def _boundary_modules() -> set[str]:
    """The modules another package imports: a top-level package (`sparklab.sweep`) or root module
    (`sparklab.records`) is a unit, and what crosses between units is its boundary."""
    try:
        import grimp  # import-linter's import graph
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail("CI must check the package boundaries, but grimp is not installed (pip install -e '.[test]')")
        pytest.skip("grimp (import-linter) is not installed (pip install -e '.[test]')")
    graph = grimp.build_graph("sparklab")

    def unit(module: str) -> str:
        return ".".join(module.split(".")[:2])

    return {m for m in graph.modules
            if any(unit(i) != unit(m) for i in graph.find_modules_that_directly_import(m))}


def _source(module: str) -> Path:
    path = PACKAGE.parent.joinpath(*module.split("."))
    return path.with_suffix(".py") if path.with_suffix(".py").exists() else path / "__init__.py"


def _mentions_any(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    args = node.args
    annotations = [a.annotation for a in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg)
                   if a is not None and a.annotation is not None]
    annotations += [node.returns] if node.returns else []
    return any(isinstance(n, ast.Name) and n.id == "Any" for a in annotations for n in ast.walk(a))


def _reason_at(lines: list[str], node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> bool:
    """`# Any: …` on the definition's header (decorators to the colon) or on the line just above it."""
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    header_end = node.body[0].lineno - 1
    return any(MARKER in line for line in lines[first - 2 if first > 1 else 0:header_end])


def unexplained_any(source: str) -> list[str]:
    """The public functions and methods of one module whose signatures hold Any with no `# Any:` reason at the
    function, its class, or the module (a line of its own at the top level)."""
    lines, tree = source.splitlines(), ast.parse(source)
    starts = [min([n.lineno, *(d.lineno for d in n.decorator_list)]) for n in tree.body
              if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    # the module's reason: a top-level line before its first definition, not the line just above one
    module_reason = any(line.startswith(MARKER) and number + 1 not in starts
                        for number, line in enumerate(lines[:min(starts, default=len(lines)) - 1], 1))
    found = []

    def visit(body: list[ast.stmt], owner: ast.ClassDef | None) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                visit(node.body, node)
            elif (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_")
                  and _mentions_any(node) and not (module_reason or _reason_at(lines, node)
                                                   or (owner is not None and _reason_at(lines, owner)))):
                found.append(f"{node.lineno}: {owner.name + '.' if owner else ''}{node.name}")

    visit(tree.body, None)
    return found


def test_every_any_at_a_package_boundary_says_why() -> None:
    """An `Any` another package sees (a public signature of a module it imports) carries a one-line reason,
    usually that the value is JSON as stored or as an engine sent it."""
    missing = [f"{_source(m).relative_to(PACKAGE.parent)}:{hit}" for m in sorted(_boundary_modules())
               for hit in unexplained_any(_source(m).read_text())]
    assert not missing, (f"Any in a public signature at a package boundary needs a '{MARKER} why' comment (on the "
                         "def or the line above, its class, or the module):\n" + "\n".join(missing))


def test_the_any_check_finds_what_it_must() -> None:
    """The checker itself: an unexplained Any is found; a reason at the def, the class or the module clears it;
    a private function and a comment without the marker do not count."""
    bare = "from typing import Any\n\n\ndef load(data: Any) -> int:  # loads it\n    return 1\n"
    assert unexplained_any(bare) == ["4: load"]
    assert unexplained_any(bare.replace("# loads it", "# Any: YAML as loaded")) == []
    assert unexplained_any(bare.replace("\n\ndef load", "\n# Any: JSON as stored\ndef load")) == []
    assert unexplained_any(bare.replace("def load", "def _load")) == []
    method = ("class Store:  # Any: JSON documents as stored\n    @property\n    def meta(self) -> dict[str, Any]:\n"
              "        return {}\n")
    assert unexplained_any(method) == []
    assert unexplained_any(method.replace("# Any: JSON documents as stored", "")) == ["3: Store.meta"]
    assert unexplained_any("# Any: every value here is JSON\n" + bare) == []
    two = bare + "\n\ndef dump(data: Any) -> int:\n    return 2\n"  # a def's reason covers that def only
    assert unexplained_any(two.replace("\n\ndef load", "\n# Any: YAML as loaded\ndef load")) == ["8: dump"]
