"""Fixtures every tier shares, the tier markers, the per-tier wall time, and the Ctrl-C state of every test.

The tiers (docs/architecture.md, "Test tiers"): a test's folder decides its tier, and the folder's marker is
put on every test in it, so `pytest -m unit` and `pytest tests/unit` select the same tests and a test cannot
sit in one tier carrying another's marker.
"""

from __future__ import annotations

import copy
import os
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from sparklab.recipes.schema import recipes_dir
from tests.signals import ctrl_c_raises, stop_as_in_a_terminal

TESTS = Path(__file__).resolve().parent
# Every process a test starts (`python -m sparklab`, a stand-in, a probe) imports this checkout's sparklab, as the
# tests themselves do: the venv's editable install points at whichever checkout last installed it (scripts/test.sh
# reinstalls for its own), and a test run from another clone then drove the other clone's code through the CLI
# (seen 2026-12-05: a CI clone's install, a test run from the main checkout). Set before any test, inherited by all.
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(TESTS.parent), os.environ.get("PYTHONPATH", "")) if p)
# folder under tests/ -> its tier's marker (declared in pyproject.toml, where --strict-markers holds them)
TIERS = {"unit": "unit", "process": "process", "docker": "docker", "e2e": "engine", "contract": "contract"}


def tier_of(path: str | Path) -> str | None:
    """The tier of a test file (an absolute path, or a node id's file part), or None outside the tier folders."""
    path = Path(path)
    if path.is_absolute():
        if TESTS not in path.parents:
            return None
        parts = path.relative_to(TESTS).parts
    else:
        parts = path.parts[1:] if path.parts[:1] == ("tests",) else path.parts
    return TIERS.get(parts[0]) if len(parts) > 1 else None


# The docker tier's files that use the second host (tests/unit/test_docker_tier_workers.py: every one is listed): under
# pytest-xdist they run one after another on one worker (one freezes that host, another stops it, others count its
# containers), while the tier's other tests spread over the workers one by one.
SECOND_HOST_FILES = frozenset(f"tests/docker/{name}" for name in (
    "test_dead_hosts.py", "test_hosts.py", "test_pair.py", "test_second_host_watched.py"))


_xdist_worker: list[bool] = []  # this pytest is an xdist worker: its failures are said by the pytest it reports to


def pytest_configure(config: pytest.Config) -> None:
    """A run stopped early, by Ctrl-C or SIGTERM, tears its tests down, however it was started (tests/signals.py)."""
    stop_as_in_a_terminal()
    # from the config, not PYTEST_XDIST_WORKER: a test that runs pytest itself inherits that from its own worker
    _xdist_worker[:] = [hasattr(config, "workerinput")]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadgroup` (scripts/test.sh, the docker tier): the second host's files as one group, every other test
    on its own. xdist's own loadgroup reads `@group` suffixes that it can no longer add to node ids under pytest 9.2
    (Node.nodeid now comes from `_id`; xdist 3.8.0's remote.py sets `_nodeid`), so its groups were silently ignored:
    the second host's freeze and the other workers' use of that host met, and one test failed."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SecondHostTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "second-host" if path in SECOND_HOST_FILES else nodeid

    return SecondHostTogether(config, log)


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        tier = tier_of(item.path)
        if tier is None:
            raise pytest.UsageError(f"{item.nodeid}: every test lives in one tier's folder: "
                                    f"{', '.join(f'tests/{d}/' for d in TIERS)}")
        others = {m.name for m in item.iter_markers() if m.name in TIERS.values()} - {tier}
        if others:
            raise pytest.UsageError(f"{item.nodeid} is in the {tier} tier (its folder) but marked "
                                    f"{', '.join(sorted(others))}: move the file or drop the marker")
        item.add_marker(tier)


_tier_seconds: Counter[str] = Counter()
_tier_outcomes: dict[str, Counter[str]] = {}
_session_started = time.monotonic()


_stopped: list[bool] = []  # set once the run is stopped by Ctrl-C or SIGTERM (scripts/test.sh stopped early)


def pytest_keyboard_interrupt(excinfo: pytest.ExceptionInfo[BaseException]) -> None:
    _stopped.append(True)  # pytest tears down what is still set up after this hook


def interrupted() -> bool:
    """Whether the test being torn down is so because the run was stopped mid-way (Ctrl-C, SIGTERM): a teardown
    guard still cleans up, but a CLI the test waited on was killed while it removed its own servers, which is not
    the test's failure."""
    return bool(_stopped)


FAILURE_LINES, FAILURE_CHARS = 12, 1500  # of a failure's message, in scripts/test.sh's last lines


def _said_failure(report: pytest.TestReport) -> None:
    """A failed test, one paragraph in the file scripts/test.sh names (SPARKLAB_TEST_FAILURES): the test, the line
    that failed and the start of its message, which the script prints last. CI shows a run's start and its end, and
    pytest prints a failing test's whole source before its line: a long test's reason was cut out of what CI showed.
    Said by the pytest that reports (the controller under xdist, whose workers send it their reports)."""
    path = os.environ.get("SPARKLAB_TEST_FAILURES")
    if not path or not report.failed or any(_xdist_worker):
        return
    crash = getattr(report.longrepr, "reprcrash", None)
    where = f" at {crash.path}:{crash.lineno}" if crash is not None else ""
    message = crash.message if crash is not None else str(report.longrepr).strip()  # a string when not a traceback
    lines = message.splitlines()[:FAILURE_LINES] or ["(no message)"]
    text = "\n".join(lines)[:FAILURE_CHARS]
    with open(path, "a", encoding="utf-8") as out:
        out.write(f"{report.nodeid} ({report.when}){where}: " + text.replace("\n", "\n    ") + "\n")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Each tier's wall time: the sum of its tests' setup, call and teardown (tests run one at a time); and each
    failure, said again at the end of scripts/test.sh."""
    _said_failure(report)
    tier = tier_of(report.nodeid.split("::", 1)[0]) or "other"
    _tier_seconds[tier] += report.duration
    if report.when == "call" or (report.when == "setup" and not report.passed):
        _tier_outcomes.setdefault(tier, Counter())[report.outcome] += 1
    elif report.when == "teardown" and report.failed:
        _tier_outcomes.setdefault(tier, Counter())["error"] += 1


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    if not _tier_seconds:
        return
    workers = getattr(config.option, "numprocesses", None)  # pytest-xdist's -n (scripts/test.sh: the unit tier)
    total = time.monotonic() - _session_started
    if workers:  # tests ran side by side: a tier's sum is its tests' time, the session's wall time is the clock's
        terminalreporter.section(f"time per tier over {workers} workers (setup + call + teardown, summed)")
    else:
        terminalreporter.section("wall time per tier (setup + call + teardown of its tests)")
    for tier in [*TIERS.values(), "other"]:
        if tier in _tier_seconds:
            outcomes = ", ".join(f"{n} {what}" for what, n in sorted(_tier_outcomes.get(tier, Counter()).items()))
            terminalreporter.write_line(f"{tier:<9} {_tier_seconds[tier]:8.1f} s   {outcomes}")
    if workers:
        terminalreporter.write_line(f"{'all':<9} {total:8.1f} s   wall ({workers} workers)")
        return
    rest = total - sum(_tier_seconds.values())
    terminalreporter.write_line(f"{'all':<9} {total:8.1f} s   (collection and the rest: {rest:.1f} s)")


@pytest.fixture(autouse=True)
def _ctrl_c_as_in_a_terminal() -> Iterator[None]:
    """Every test starts with Ctrl-C raising KeyboardInterrupt, and so do the processes it starts, however the
    run itself was started (tests/signals.py: under `nohup … &` SIGINT arrives ignored)."""
    with ctrl_c_raises():
        yield


@pytest.fixture
def gb10_doc() -> dict[str, Any]:
    """The GB10 recipe as a raw document, to change and write elsewhere."""
    return copy.deepcopy(yaml.safe_load((recipes_dir() / "gb10.yaml").read_text()))


@pytest.fixture
def write_recipe(tmp_path: Path):
    def write(doc: dict[str, Any], name: str = "custom.yaml") -> Path:
        path = tmp_path / name
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        return path

    return write
