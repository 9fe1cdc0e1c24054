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
    ("docker", {"containers.py"}),
    ("openai", {"client.py"}),
    ("jinja2", {"render.py", "report/document.py"}),  # recipes' templates; the report's HTML page
    ("rich", {"cli.py", "console.py", "progress.py"}),
    ("matplotlib", {"report/plots.py"}),
    ("scipy", {"metrics.py"}),
    ("huggingface_hub", {"hub.py"}),
])
def test_one_module_per_external_system(module: str, only: set[str]) -> None:
    assert _importers(module) == only


def test_library_code_never_prints() -> None:
    printing = {p.name for p in PACKAGE.rglob("*.py") if re.search(r"^\s*print\(", p.read_text(), re.MULTILINE)}
    assert printing == set()
