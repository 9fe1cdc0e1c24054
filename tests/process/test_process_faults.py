"""Issue 27 item 8 with a real host-process engine (the stand-in's Edge-LLM surface): a binary changed between
stop and resume is drift, as a new image digest is; two sweeps of one name started together make one run."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml

from sparklab.sweep.store import Store
from tests.dockerkit import free_port
from tests.process.conftest import RECIPE, STANDIN, HostCli, processes_of


def _sweep(tmp_path: Path, standin: Path, port: int, **changes: Any) -> Path:
    doc: dict[str, Any] = {
        "name": "binary", "recipe": str(RECIPE), "methods": ["none"], "concurrency": [1], "requests": 2,
        "warmup": 0, "workloads": ["seed"], "sampling": {"max_tokens": 8, "temperature": 0, "top_p": None},
        "set": [f"standin_dir={standin}", f"engines.edgellm.port={port}"], **changes,
    }
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _run(host: HostCli, path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return host.run("sweep", str(path), "--runs-dir", str(path.parent / "runs"), "--no-download", *args, timeout=180,
                    cwd=path.parent)


def _copy_of_the_standin(tmp_path: Path) -> Path:
    copy = tmp_path / "standin"
    shutil.copytree(STANDIN, copy, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def test_an_engine_binary_changed_between_stop_and_resume_is_drift(host: HostCli, tmp_path: Path) -> None:
    standin = _copy_of_the_standin(tmp_path)
    port = free_port()
    first = _run(host, _sweep(tmp_path, standin, port))
    assert first.returncode == 0, first.stderr
    (db,) = sorted((tmp_path / "runs").glob("*/results.sqlite"))
    with Store.open(db, readonly=True) as store:
        (cell,) = store.cells("done")
        assert cell.image_digest is not None and cell.image_digest.startswith("sha256:")
        before = cell.image_digest
    program = standin / "bin" / "trtedge"
    program.write_text(program.read_text() + "# rebuilt with another toolchain\n")  # a new binary, same path

    resumed = _run(host, _sweep(tmp_path, standin, port, repeats=2))
    assert resumed.returncode == 8, resumed.stderr  # DriftError
    assert f"earlier cells ran on {before}" in resumed.stderr and "Traceback" not in resumed.stderr
    with Store.open(db, readonly=True) as store:
        assert store.counts()["done"] == 1  # nothing measured on the new binary
    assert not processes_of(str(standin / "bin"))

    allowed = _run(host, _sweep(tmp_path, standin, port, repeats=2), "--allow-drift")
    assert allowed.returncode == 0, allowed.stderr
    with Store.open(db, readonly=True) as store:
        digests = {c.repeat: c.image_digest for c in store.cells("done")}
        assert digests[0] == before and digests[1] not in (None, before)
        assert [f.kind for f in store.failures()] == ["drift"]


def test_an_environment_changed_by_the_sweep_files_set_between_stop_and_resume_is_drift(
        host: HostCli, tmp_path: Path) -> None:
    """A `set:` that changes only the engine's environment kept the server's id (argv and image) and the run's
    fingerprint (the recipe file): the resumed cells ran under the new environment beside the old, unmarked."""
    standin = _copy_of_the_standin(tmp_path)
    port = free_port()

    def sweep(delay: str, **changes: Any) -> Path:
        return _sweep(tmp_path, standin, port, set=[f"standin_dir={standin}", f"engines.edgellm.port={port}",
                                                   f"engines.edgellm.env={{STANDIN_TOKEN_DELAY: '{delay}'}}"],
                      **changes)

    first = _run(host, sweep("0.0"))
    assert first.returncode == 0, first.stderr
    (db,) = sorted((tmp_path / "runs").glob("*/results.sqlite"))
    resumed = _run(host, sweep("0.01", repeats=2))
    assert resumed.returncode == 8, resumed.stderr  # DriftError, one paragraph
    assert "environment STANDIN_TOKEN_DELAY changed (1 measured cell(s)" in " ".join(resumed.stderr.split())
    assert "Traceback" not in resumed.stderr and "0.01" not in resumed.stderr  # names, never values
    with Store.open(db, readonly=True) as store:
        assert store.counts()["done"] == 1  # nothing measured under the new environment
    assert not processes_of(str(standin / "bin"))
    assert _run(host, sweep("0.0", repeats=2)).returncode == 0  # put back: it resumes
    with Store.open(db, readonly=True) as store:
        assert store.counts()["done"] == 2 and store.failures() == []


def test_two_sweeps_of_one_name_started_together_make_one_run(host: HostCli, tmp_path: Path) -> None:
    """Both found no run and each made one (two run ids), then fought over the recipe's port."""
    standin = _copy_of_the_standin(tmp_path)
    path = _sweep(tmp_path, standin, free_port(),
                  set=[f"standin_dir={standin}", f"engines.edgellm.port={free_port()}",
                       "engines.edgellm.env={STANDIN_START_DELAY: '1.0', STANDIN_TOKEN_DELAY: '0.05'}"])
    argv = ("sweep", str(path), "--runs-dir", str(tmp_path / "runs"), "--no-download")
    procs = [host.popen(*argv, cwd=tmp_path) for _ in range(2)]
    started = time.monotonic()
    outcomes = []
    for proc in procs:
        _, err = proc.communicate(timeout=180)
        outcomes.append((proc.returncode, err))
    assert time.monotonic() - started < 180
    codes = sorted(code for code, _ in outcomes)
    assert codes == [0, 1], outcomes
    refused = next(err for code, err in outcomes if code == 1)
    assert "sweep binary is in use by pid" in refused and "Traceback" not in refused
    runs = [p for p in (tmp_path / "runs").iterdir() if p.is_dir()]
    assert len(runs) == 1, runs
    assert not processes_of(str(standin / "bin"))
