"""The test tiers: a test's folder decides its tier and its marker (tests/conftest.py), and each tier is declared."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import TESTS, TIERS, pytest_collection_modifyitems, tier_of

ROOT = TESTS.parent


@dataclass
class Item:
    """What the collection hook reads and writes of a pytest item."""

    path: Path
    marks: list[str] = field(default_factory=list)

    @property
    def nodeid(self) -> str:
        return f"{self.path.relative_to(ROOT)}::test_x"

    def iter_markers(self) -> list[pytest.Mark]:
        return [getattr(pytest.mark, name).mark for name in self.marks]

    def add_marker(self, name: str) -> None:
        self.marks.append(name)


def test_every_test_module_sits_in_a_tier_folder() -> None:
    outside = [p.relative_to(ROOT).as_posix() for p in TESTS.rglob("test_*.py") if tier_of(p) is None]
    assert outside == []


def test_each_tier_marker_is_declared_and_the_markers_are_strict(pytestconfig: pytest.Config) -> None:
    declared = {line.split(":", 1)[0] for line in pytestconfig.getini("markers")}
    assert set(TIERS.values()) <= declared
    assert "--strict-markers" in pytestconfig.getini("addopts")
    assert float(pytestconfig.getini("timeout")) > 0  # pytest-timeout bounds every test


def test_a_test_gets_its_folders_marker() -> None:
    items = [Item(TESTS / folder / "test_x.py") for folder in TIERS]
    pytest_collection_modifyitems(None, items)  # type: ignore[arg-type]
    assert [item.marks for item in items] == [[marker] for marker in TIERS.values()]


@pytest.mark.parametrize(("folder", "marker"), [("unit", "docker"), ("e2e", "contract"), ("contract", "engine")])
def test_a_test_marked_for_another_tier_is_refused(folder: str, marker: str) -> None:
    with pytest.raises(pytest.UsageError, match=f"is in the {TIERS[folder]} tier .* but marked {marker}"):
        pytest_collection_modifyitems(None, [Item(TESTS / folder / "test_x.py", [marker])])  # type: ignore[arg-type]


def test_a_test_outside_the_tier_folders_is_refused() -> None:
    with pytest.raises(pytest.UsageError, match="every test lives in one tier's folder"):
        pytest_collection_modifyitems(None, [Item(TESTS / "test_loose.py")])  # type: ignore[arg-type]


def test_a_process_a_test_starts_runs_this_checkouts_sparklab() -> None:
    """Whatever checkout the venv's editable install points at (tests/conftest.py sets PYTHONPATH for every process
    a test starts), from any directory."""
    found = subprocess.run([sys.executable, "-c", "import sparklab; print(sparklab.__file__)"], capture_output=True,
                           text=True, timeout=60, cwd="/", check=True).stdout.strip()
    assert Path(found).resolve() == ROOT / "sparklab" / "__init__.py", found
