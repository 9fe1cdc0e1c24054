"""The house rules that keep side effects at the edges (style.md habit 1)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "sparklab"


def _importers(module: str) -> set[str]:
    pattern = re.compile(rf"^\s*(import {module}\b|from {module}[. ])", re.MULTILINE)
    return {p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py") if pattern.search(p.read_text())}


@pytest.mark.parametrize(("module", "only"), [
    ("docker", {"runtimes/containers.py"}),
    ("openai", {"bench/client.py"}),
    ("requests", {"engines/api.py", "runtimes/containers.py"}),  # engine HTTP; docker-py's own transport errors
    ("sparklab.bench.sse", {"bench/client.py"}),
    ("jinja2", {"recipes/sandbox.py", "report/document.py"}),  # recipes' templates; the report's HTML page
    ("rich", {"cli/main.py", "cli/console.py", "cli/progress.py"}),
    ("matplotlib", {"report/plots.py"}),
    ("scipy", {"bench/metrics.py"}),
    ("huggingface_hub", {"host/downloads.py"}),
])
def test_one_module_per_external_system(module: str, only: set[str]) -> None:
    assert _importers(module) == only


def test_library_code_never_prints() -> None:
    printing = {p.name for p in PACKAGE.rglob("*.py") if re.search(r"^\s*print\(", p.read_text(), re.MULTILINE)}
    assert printing == set()


def test_engine_knowledge_lives_in_the_adapters() -> None:
    """No module outside sparklab/engines/ branches on an engine's kind or names an engine's variables."""
    pattern = re.compile(r"""kind\s*[!=]=\s*["']|["'](vllm|sglang)["']\s*(==|!=|in\b|:)|VLLM_[A-Z_]+|SGLANG_[A-Z_]+""")
    offenders = {p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py")
                 if "engines" not in p.parts and pattern.search(p.read_text())}
    assert offenders == {"spec.py"}  # its comment lists VLLM_API_KEY among the names treated as secrets


def test_the_offline_report_imports_nothing_that_talks_to_a_network() -> None:
    """`sparklab report` must work where neither the chat client nor Docker nor requests is installed."""
    import subprocess
    import sys

    blocked = ["openai", "requests", "docker", "httpx", "sparklab.bench.client", "sparklab.bench.sse",
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
    """parse → one call → print: the grammar lives in cli_args.py, the work behind one call per command."""
    lines = (PACKAGE / "cli" / "main.py").read_text().count("\n")
    assert lines < 350, f"cli.py has {lines} lines"


def test_host_processes_are_started_and_signalled_in_one_place() -> None:
    """The process runtime is the one door to host processes, as containers.py is to Docker: only processes.py
    (with process_groups.py, and its keeper procwrap.py) starts an engine or signals a process group."""
    pattern = re.compile(r"\b(os\.killpg|subprocess\.Popen|os\.kill)\(")
    users = {p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py") if pattern.search(p.read_text())}
    assert users == {"runtimes/processes.py", "runtimes/runfiles.py", "runtimes/keeper.py"}
