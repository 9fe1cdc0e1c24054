"""The house rules that keep side effects at the edges (docs/architecture.md, "House rules the tests enforce")."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.clikit import EVERY_FLAG, namespace_reads

PACKAGE = Path(__file__).resolve().parents[2] / "sparklab"
# sparklab/engines/probes/*.py are not sparklab modules: each runs inside an engine's image, with the engine's own
# Python, importing the engine (sparklab.engines.parsers ships them as text). The house rules are for the package.
PROBES = PACKAGE / "engines" / "probes"
MODULES = [p for p in PACKAGE.rglob("*.py") if PROBES not in p.parents]


def _importers(module: str) -> set[str]:
    pattern = re.compile(rf"^\s*(import {module}\b|from {module}[. ])", re.MULTILINE)
    return {p.relative_to(PACKAGE).as_posix() for p in MODULES if pattern.search(p.read_text())}


def test_the_parser_probes_are_run_in_images_never_imported() -> None:
    """The probe scripts import vLLM, SGLang or Edge-LLM, which sparklab never has: nothing imports them, and no
    __init__.py makes them a package that import-linter or a stray import could load."""
    assert sorted(p.name for p in PROBES.glob("*.py")) == ["edgellm_args.py", "sglang_args.py", "vllm_args.py"]
    assert not (PROBES / "__init__.py").exists()
    assert _importers("sparklab.engines.probes") == set()


# The Docker runtime: containers.py, the door, and the parts only it imports (how a Docker host is reached, a
# host's images, a started server container and its teardown).
DOCKER_DOOR = "runtimes/containers.py"
DOCKER_PARTS = {"sparklab.runtimes.docker_transport": "runtimes/docker_transport.py",
                "sparklab.runtimes.docker_images": "runtimes/docker_images.py",
                "sparklab.runtimes.container_server": "runtimes/container_server.py",
                "sparklab.runtimes.docker_sandbox": "runtimes/docker_sandbox.py"}
DOCKER_RUNTIME = {DOCKER_DOOR, *DOCKER_PARTS.values()}


@pytest.mark.parametrize(("module", "only"), [
    ("docker", DOCKER_RUNTIME),
    ("openai", {"bench/client.py"}),
    ("requests", {"engines/api.py", *DOCKER_RUNTIME}),  # engine HTTP; docker-py's own transport errors
    ("sparklab.bench.sse", {"bench/client.py", "bench/sse_pool.py"}),  # the parser; the pool holds its connections
    ("sparklab.bench.sse_pool", {"bench/client.py"}),
    ("jinja2", {"recipes/sandbox.py", "recipes/template_bounds.py", "report/document.py"}),  # recipes' templates
    # (the sandbox, and its bounds' TemplateBudgetError, a SecurityError); the report's HTML page
    # the consoles, the error boundary, the renderables and progress bars; up's warnings, bench's request bar
    ("rich", {"cli/terminal.py", "cli/main.py", "cli/console.py", "cli/progress.py", "cli/up.py",
              "cli/bench.py"}),
    ("matplotlib", {"report/plots.py"}),
    ("scipy", {"bench/stats.py"}),  # t quantiles, Wilson, McNemar, Welch
    ("huggingface_hub", {"host/downloads.py"}),
    ("jsonschema", {"bench/grading.py"}),  # graded answers' JSON against the task's schema
])
def test_one_module_per_external_system(module: str, only: set[str]) -> None:
    assert _importers(module) == only


def _imports_from(path: Path) -> dict[str, set[str]]:
    """What one file imports, in any form and at any depth: module -> the names taken from it (`import a.b`
    takes a.b whole; `from a import b` takes b from a, and a.b when b is a module)."""
    found: dict[str, set[str]] = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.setdefault(alias.name, set()).add("*")
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                found.setdefault(node.module, set()).add(alias.name)
                found.setdefault(f"{node.module}.{alias.name}", set()).add("*")
    return found


@pytest.mark.parametrize("part", sorted(DOCKER_PARTS))
def test_the_docker_runtime_is_one_door(part: str) -> None:
    """The rest of the package sees one Docker runtime, containers.py: only it imports its parts, in any form
    (`from sparklab.runtimes import docker_images` too), and it takes no private name from them."""
    importers = {p.relative_to(PACKAGE).as_posix(): _imports_from(p)[part] for p in MODULES
                 if part in _imports_from(p)}
    assert set(importers) == {DOCKER_DOOR}
    assert [name for name in importers[DOCKER_DOOR] if name.startswith("_")] == []


def test_library_code_never_prints() -> None:
    printing = {p.name for p in MODULES if re.search(r"^\s*print\(", p.read_text(), re.MULTILINE)}
    assert printing == set()


def _code_words(tree: ast.AST) -> Iterator[tuple[int, str, str]]:
    """(line, "string" or "name", text) of every string constant and every name in a module's code: identifiers,
    attributes, arguments, imported modules. Docstrings and comments say what they like."""
    prose = {id(node.value) for node in ast.walk(tree)
             if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)}
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose:
            yield line, "string", node.value
        elif isinstance(node, ast.Name):
            yield line, "name", node.id
        elif isinstance(node, ast.Attribute):
            yield line, "name", node.attr
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield line, "name", node.name
        elif isinstance(node, (ast.arg, ast.keyword)) and node.arg:
            yield line, "name", node.arg
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield line, "name", node.module
        elif isinstance(node, ast.alias):
            yield line, "name", node.asname or node.name


def _source_prefix_tests(tree: ast.AST) -> Iterator[int]:
    """Lines that tell results apart by how their `source` begins (`….get("source").startswith("vllm:")`)."""
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "startswith"
                and "source" in ast.unparse(node.func.value)):
            yield node.lineno


def _engine_knowledge(path: Path, kinds: list[str], registry: bool = False) -> list[str]:
    """What a module outside the adapters knows of particular engines, one line each (empty: nothing)."""
    tree = ast.parse(path.read_text())
    alternatives = "|".join(map(re.escape, kinds))
    named = re.compile(rf"^(?:{alternatives})(?:[:_]|$)")  # a kind, or a counter/key it names: `vllm:…`, `sglang_…`
    variable = re.compile(r"\b(?:VLLM|SGLANG|LLAMA)_[A-Z_]")  # the engines' own environment variables
    found = []
    for line, what, text in _code_words(tree):
        if what == "string":
            knows = bool(named.search(text) or variable.search(text))
        else:  # a name that contains a kind (`sglang`, `is_vllm`, `LlamaCpp`) or an engine's variable
            registered_module = registry and text in kinds
            knows = bool(variable.search(text)) or (any(k in text.lower() for k in kinds) and not registered_module)
        if knows:
            found.append(f"{line}: the {what} {text!r}")
    found += [f"{line}: a test of how a result's source begins" for line in _source_prefix_tests(tree)]
    return found


def test_engine_knowledge_lives_in_the_adapters() -> None:
    """No module outside the engine adapters (sparklab/engines/<kind>.py) branches on an engine's kind, lists the
    kinds, names an engine's counters, snapshot keys or variables, or tells one engine's results from another's by
    a prefix of their source: a new engine is its adapter. The engine-neutral modules inside engines/ (the
    protocol, the HTTP door, the shared counter arithmetic) are held to the same rule; the registry
    (engines/__init__.py) may import the adapter modules by name."""
    pattern = re.compile(r"""kind\s*[!=]=\s*["']|["'](vllm|sglang)["']\s*(==|!=|in\b|:)|VLLM_[A-Z_]+|SGLANG_[A-Z_]+""")
    offenders = {p.relative_to(PACKAGE).as_posix() for p in MODULES
                 if "engines" not in p.parts and pattern.search(p.read_text())}
    assert offenders == {"spec.py"}  # its comment lists VLLM_API_KEY among the names treated as secrets

    from sparklab.engines import ENGINES

    adapters = {Path(sys.modules[type(e).__module__].__file__ or "").resolve() for e in ENGINES.values()}
    kinds = sorted(ENGINES)
    knowledge = {}
    for path in sorted(MODULES):
        if path.resolve() in adapters:
            found = [f for f in _engine_knowledge(path, kinds) if "source begins" in f]
        else:
            found = _engine_knowledge(path, kinds, registry=path == PACKAGE / "engines" / "__init__.py")
        if found:
            knowledge[path.relative_to(PACKAGE).as_posix()] = found
    assert knowledge == {}


def test_the_offline_report_imports_nothing_that_talks_to_a_network() -> None:
    """`sparklab report` must work where neither the chat client nor Docker nor requests is installed."""
    import subprocess
    import sys

    blocked = ["openai", "requests", "docker", "httpx", "sparklab.bench.client", "sparklab.bench.sse",
               "sparklab.bench.sse_pool",
               "sparklab.engines.api", "sparklab.runtimes"]
    code = (
        "import sys\n"
        f"blocked = {blocked!r}\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if any(name == b or name.startswith(b + '.') for b in blocked):\n"
        "            raise ImportError('blocked: ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import sparklab.report, sparklab.report.plots, sparklab.cli.console\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_the_cli_stays_thin() -> None:
    """parse → one call → print: main.py is the command table and the error boundary; each command's flags,
    typed arguments and call live in its own file under cli/."""
    lines = (PACKAGE / "cli" / "main.py").read_text().count("\n")
    assert lines < 150, f"cli/main.py has {lines} lines"


def test_at_most_three_modules_are_over_400_lines() -> None:
    """Issue 22's bound, which the package had drifted past unnoticed (engines/vllm.py at 404): a module that grows
    past 400 lines splits by what it owns, unless it is one of three at most."""
    long = sorted(f"{p.relative_to(PACKAGE)} ({n})" for p in PACKAGE.rglob("*.py")
                  if (n := p.read_text().count("\n")) > 400)
    assert len(long) <= 3, f"{len(long)} modules over 400 lines: {', '.join(long)}"


def test_no_import_cycle_and_at_most_ten_modules_at_the_root() -> None:
    """Issue 22's bounds for the graph. import-linter's layers contract keeps packages from importing upward, but
    two modules of one package may still import each other (the house had two such cycles): none may, and the
    package root stays the shared vocabulary (at most 10 modules; the stages live in packages)."""
    import grimp

    graph = grimp.build_graph("sparklab")
    ours = {m for m in graph.modules if m.startswith("sparklab.")}
    cycles = sorted(f"{a} <-> {b}" for a in ours for b in graph.find_modules_directly_imported_by(a)
                    if b in ours and a < b and graph.chain_exists(importer=b, imported=a))
    assert cycles == [], f"import cycles (each pair imports the other, directly or through others): {cycles}"
    root = sorted(m for m in ours if m.count(".") == 1 and not graph.find_children(m))
    assert len(root) <= 10, f"{len(root)} modules at the package root: {root}"


def test_host_processes_are_started_and_signalled_in_one_place() -> None:
    """The process runtime is the one door to host processes, as containers.py is to Docker: only processes.py
    (with runfiles.py, and its keeper keeper.py) starts an engine or signals a process group."""
    pattern = re.compile(r"\b(os\.killpg|subprocess\.Popen|os\.kill)\(")
    users = {p.relative_to(PACKAGE).as_posix() for p in MODULES if pattern.search(p.read_text())}
    assert users == {"runtimes/processes.py", "runtimes/runfiles.py", "runtimes/keeper.py"}


def test_only_the_command_line_imports_argparse() -> None:
    """argparse stops at sparklab/cli/. Held by import-linter's forbidden contract `argparse-at-the-edge` in
    pyproject.toml (grimp counts the standard library among external packages, so a contract can name argparse);
    run here so the unit tier enforces it wherever the suite runs."""
    lint = Path(sys.executable).parent / "lint-imports"
    if not lint.exists():
        message = f"no {lint}: pip install -e '.[test]' installs import-linter"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    done = subprocess.run([str(lint), "--contract", "argparse-at-the-edge", "--no-cache", "--no-logo"],
                          cwd=PACKAGE.parent, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_library_code_never_takes_a_namespace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Library functions take typed requests. An `args: Any` parameter would take a Namespace without importing
    argparse (tune's request_from_args did), which no import contract sees: so every read of a parse, by every
    command's from_cli_args and by whole commands run offline, must come from sparklab/cli/."""
    from sparklab.cli.main import COMMANDS, build_parser, main

    named = {p.relative_to(PACKAGE).as_posix() for p in MODULES
             if "cli" not in p.relative_to(PACKAGE).parts and re.search(r"\bNamespace\b", p.read_text())}
    assert named == set()
    parses = {name: build_parser().parse_args(argv) for name, argv in EVERY_FLAG.items()}
    with namespace_reads() as reads:
        for name, namespace in parses.items():
            COMMANDS[name].args.from_cli_args(namespace)
        assert main(["render", "dspark"]) == 0
        assert main(["up", "dspark", "--dry-run", "--hf-cache", str(tmp_path), "--set", "gpu_memory_utilization=0.01",
                     "--port", "18999"]) == 0
        assert main(["tune", "cpu-demo", "--dry-run", "--runs-dir", str(tmp_path / "runs")]) == 0
        assert main(["recipes"]) == 0
    capsys.readouterr()
    readers = {module for module, _ in reads}
    assert "sparklab.cli.sweep" in readers and {m for m in readers if not m.startswith("sparklab.cli.")} == set()


def test_one_port_probe() -> None:
    """Whether a port is taken is asked in one place, binding the address the server will bind (IPv6 too)."""
    users = {p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py") if "socket.socket(" in p.read_text()}
    assert users == {"host/preflight.py"}


def test_the_repository_cites_nothing_outside_itself() -> None:
    """The next maintainer has only this repository: a comment, doc or recipe cites its sources by their public names
    (seed 000, a project's issue) or by a file in the repository, never by a path to the workspace beside it."""
    root = PACKAGE.parent
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, text=True, check=True)
    outside = re.compile(r"\.\./shared\b|\bshared/(docs|seeds|research)\b")
    found = []
    for name in tracked.stdout.split("\0"):
        path = root / name
        if not name or not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        found += [f"{name}:{n}" for n, line in enumerate(text.splitlines(), 1) if outside.search(line)]
    assert found == []
