"""Issue 27 item 2: a run belongs to one sweep. Runs are matched on the sweep's exact name (never a prefix), a
`--resume` of another sweep's run (or a tune's) is refused with both names before anything is added, and no
command migrates a results file it was not asked to own."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import pytest
import yaml

from sparklab.errors import SparklabError
from sparklab.recipes.plan import build_plan
from sparklab.sweep import provenance, rundir, runner
from sparklab.sweep.store import Store
from tests.reportkit import CPU_RUN_ID, cpu_run


@pytest.fixture(autouse=True)
def _state(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("SPARKLAB_STATE", str(tmp_path / "state"))  # sweep locks and logs: never the real home


def _sweep_file(tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, "recipe": "cpu", "methods": ["none"], "concurrency": [1],
                                    "requests": 2}))
    return path


def _run_of(tmp_path: Path, runs: Path, name: str, run_id: str, tune: bool = False) -> Path:
    """A run of sweep `name` as `sparklab sweep` (or `tune`) makes it: planned and registered, nothing run."""
    plan = build_plan(_sweep_file(tmp_path, name), run_id=run_id)
    path = runs / run_id / "results.sqlite"
    with Store.create(path, plan.sweep.model_dump(), "test") as store:
        runner.register(plan, store)
        store.set_meta("provenance", provenance.plan_fingerprint(plan))
        if tune:
            store.set_meta("tune", {"rounds": []})
    return path


class NoDocker:
    """The runtime a refused resume must never reach (nothing may start, nothing be removed)."""

    def __getattr__(self, name: str) -> None:
        raise AssertionError(f"the sweep reached its runtime ({name})")


def _sweep(request: runner.Request) -> None:
    runner.sweep(request, say=lambda line: None, runtime=NoDocker())  # type: ignore[arg-type]


def _state(path: Path) -> tuple[str, int, int]:
    conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
    finally:
        conn.close()
    return hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns, version


def _cells(path: Path) -> int:
    with Store.open(path, readonly=True) as store:
        return len(store.cells())


def test_a_sweep_never_continues_the_run_of_a_longer_name(tmp_path: Path) -> None:
    """Sweep `pq` "continued" `pq-long-<id>`: runs were found by the prefix `pq-`."""
    runs = tmp_path / "runs"
    _run_of(tmp_path, runs, "pq-long", "pq-long-20261130-100000-aaaaaa")
    run, exists = rundir.resolve(runs, "pq", None, False)
    assert not exists and run.name.startswith("pq-") and not run.name.startswith("pq-long-")
    _run_of(tmp_path, runs, "pq", "pq-20261129-100000-bbbbbb")
    run, exists = rundir.resolve(runs, "pq", None, False)
    assert exists and run.name == "pq-20261129-100000-bbbbbb"  # its own, although pq-long's is newer


def test_resume_of_another_sweeps_run_is_refused_with_both_names(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    theirs = _run_of(tmp_path, runs, "alpha", "alpha-20261130-100000-aaaaaa")
    before, cells = _state(theirs), _cells(theirs)
    request = runner.Request(_sweep_file(tmp_path, "beta"), runs, resume="alpha-20261130-100000-aaaaaa",
                             download=False)
    with pytest.raises(SparklabError, match=r"alpha-20261130-100000-aaaaaa belongs to sweep 'alpha'.*not 'beta'"):
        _sweep(request)
    with pytest.raises(SparklabError, match="belongs to sweep 'alpha'"):
        runner.dry_run(request)
    assert _state(theirs) == before and _cells(theirs) == cells


def test_resume_of_another_sweeps_v1_file_neither_migrates_nor_adds(tmp_path: Path) -> None:
    """A schema-1 run of sweep cpu-report-fixture: `--resume` by another sweep migrated it in place, then added
    its cells."""
    runs = tmp_path / "runs"
    theirs = cpu_run(runs)
    before = _state(theirs)
    assert before[2] == 1
    request = runner.Request(_sweep_file(tmp_path, "beta"), runs, resume=CPU_RUN_ID, download=False)
    with pytest.raises(SparklabError, match=r"belongs to sweep 'cpu-report-fixture'.*not 'beta'"):
        _sweep(request)
    assert _state(theirs) == before  # same bytes, same mtime, still schema 1


def test_resume_of_a_tune_run_by_a_sweep_is_refused(tmp_path: Path) -> None:
    """A tune's run stores its space under the sweep's own name (tune-<name>-<id>): still not the sweep's run."""
    runs = tmp_path / "runs"
    tune = _run_of(tmp_path, runs, "gamma", "tune-gamma-20261130-100000-aaaaaa", tune=True)
    before = _state(tune)
    request = runner.Request(_sweep_file(tmp_path, "gamma"), runs, resume="tune-gamma-20261130-100000-aaaaaa",
                             download=False)
    with pytest.raises(SparklabError, match="is a `sparklab tune` run"):
        _sweep(request)
    assert _state(tune) == before


def test_a_dry_run_reads_other_runs_without_migrating_them(tmp_path: Path) -> None:
    """The ETA's timing model reads every run under runs/: it opened each for writing, which migrated it."""
    runs = tmp_path / "runs"
    theirs = cpu_run(runs)
    before = _state(theirs)
    runner.dry_run(runner.Request(_sweep_file(tmp_path, "beta"), runs, download=False))
    assert _state(theirs) == before


def test_resume_of_its_own_run_passes_the_owner_check(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    ours = _run_of(tmp_path, runs, "beta", "beta-20261130-100000-aaaaaa")
    request = runner.Request(_sweep_file(tmp_path, "beta"), runs, resume="beta-20261130-100000-aaaaaa",
                             download=False)
    plan, *_ = runner.dry_run(request)
    assert plan.sweep.name == "beta" and ours.exists()
