"""The docker tier on two xdist workers (scripts/test.sh): the second host's files are one scheduling group, every
other docker test its own. xdist 3.8.0's loadgroup ignores its groups under pytest 9.2 (a second-host test met a
freeze on the other worker and failed), so tests/conftest.py schedules them itself."""

from __future__ import annotations

import re
from typing import Any

from tests.conftest import SECOND_HOST_FILES, TESTS, pytest_xdist_make_scheduler


class _Config:
    def __init__(self, dist: str) -> None:
        self.values: dict[str, Any] = {"dist": dist, "tx": ["2*popen"]}

    def getvalue(self, name: str) -> Any:
        return self.values[name]


def test_the_second_hosts_files_are_one_group_and_every_other_test_its_own() -> None:
    scheduler = pytest_xdist_make_scheduler(_Config("loadgroup"), None)
    scopes = {scheduler._split_scope(f"{path}::test_a[x]") for path in SECOND_HOST_FILES}
    scopes |= {scheduler._split_scope(f"{path}::test_b") for path in SECOND_HOST_FILES}
    assert scopes == {"second-host"}
    other = "tests/docker/test_sweep_standin.py"
    assert scheduler._split_scope(f"{other}::test_a") != scheduler._split_scope(f"{other}::test_b")
    assert pytest_xdist_make_scheduler(_Config("load"), None) is None  # the unit tier: xdist's own


def test_every_file_on_the_second_host_is_in_the_group() -> None:
    uses = {f"tests/docker/{p.name}" for p in (TESTS / "docker").glob("test_*.py")
            if re.search(r"\bsecond_(host|client)\b", p.read_text())}
    assert uses and uses <= SECOND_HOST_FILES, sorted(uses - SECOND_HOST_FILES)
    assert all((TESTS.parent / path).is_file() for path in SECOND_HOST_FILES)


def _alone(script: str, name: str) -> set[str]:
    """The files or tests scripts/test.sh runs apart from their tier's lane (its NAME=(...) array)."""
    match = re.search(rf"^{name}=\(([^)]*)\)", script, re.MULTILINE)
    assert match, f"no {name}=(...) in scripts/test.sh"
    return set(match.group(1).split())


def test_every_docker_test_that_reads_the_hosts_memory_or_restarts_its_daemon_runs_alone() -> None:
    """A test that sets a memory floor from what the host has free, or drops its page cache, runs with nothing beside
    it: the engine lane's vLLM servers (~3 GiB each) start and stop meanwhile (a second server crossed such a floor).
    A test that restarts the Docker daemon runs after the engine lane too: it would end that lane's containers."""
    script = (TESTS.parent / "scripts" / "test.sh").read_text()
    reads = {f"tests/docker/{p.name}" for p in (TESTS / "docker").glob("test_*.py")
             if re.search(r"read_meminfo|drop[-_]caches", p.read_text())}
    restarts = set()
    for path in (TESTS / "docker").glob("test_*.py"):
        for test in re.finditer(r"^def (test_\w+)\(.*?(?=^def |\Z)", path.read_text(), re.MULTILINE | re.DOTALL):
            if "_restart_dockerd()" in test.group(0):
                restarts.add(f"tests/docker/{path.name}::{test.group(1)}")
    alone, beside = _alone(script, "DOCKER_ALONE"), _alone(script, "DOCKER_BESIDE_REHEARSAL")
    assert reads and reads <= alone, sorted(reads - alone)  # not beside the rehearsal either (it moves MemAvailable)
    assert restarts and restarts <= alone | beside, sorted(restarts - alone - beside)  # not beside the engine lane
    assert beside and not beside & alone
    assert all((TESTS.parent / item.split("::")[0]).is_file()
               for item in alone | beside | _alone(script, "PROCESS_ALONE"))
