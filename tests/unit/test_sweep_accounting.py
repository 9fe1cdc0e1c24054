"""Issue 27 item 8: no silent mixing or double counting. A duplicate in a sweep's lists is refused (not run
again and again); a cell a failed server never ran is charged one attempt per server start, however many ways
the start failed; one sweep process per sweep name, so two started together never make two runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from sparklab.errors import RecipeError, SparklabError
from sparklab.recipes.plan import build_plan
from sparklab.recipes.sweep_file import load_sweep
from sparklab.sweep import rundir, runner
from sparklab.sweep.store import Store


def _write(tmp_path: Path, **changes: Any) -> Path:
    doc = {"name": "acct", "recipe": "cpu", "methods": ["none"], "concurrency": [1, 2], "requests": 2, **changes}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


# -- duplicates --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("key", "value", "twice"), [
    ("concurrency", [1, 1, 2, 1], "1"),
    ("methods", ["none", "ngram", "none"], "none"),
    ("num_speculative_tokens", [3, 1, 3], "3"),
    ("workloads", ["seed", "seed"], "seed"),
    ("engines", ["vllm-cpu", "vllm-cpu"], "vllm-cpu"),
])
def test_a_duplicate_in_a_sweep_list_is_refused_naming_the_key(tmp_path: Path, key: str, value: list[Any],
                                                               twice: str) -> None:
    """`concurrency: [1, 1, 2, 1]` ran the C=1 cell 6 times (3 entries x 2 attempts), past max_attempts: every
    entry planned the same cell id again. A duplicate is refused: it is a typo more often than a wish, and what
    it would mean (more runs of a load) is what `repeats:` says."""
    path = _write(tmp_path, **{key: value})
    with pytest.raises(RecipeError, match=rf"{key}: .*{twice}.* listed \d times"):
        load_sweep(path)


def test_each_planned_cell_is_planned_once(tmp_path: Path) -> None:
    plan = build_plan(_write(tmp_path, methods=["none", "ngram"], num_speculative_tokens=[1, 3], repeats=2))
    ids = [c.id for c in plan.cells]
    assert len(ids) == len(set(ids)) == (1 + 2) * 2 * 2


# -- one attempt per server start -------------------------------------------------------------------------------

class DeadServer:
    """A server whose container exited under the sweep (dockerd restarted) and cannot be removed now."""

    def __init__(self, spec: Any) -> None:
        self.spec, self.name, self.log_path, self.watch = spec, "dead", None, None

    def state(self) -> tuple[bool, int | None]:
        return False, 0

    def oom_killed(self) -> bool:
        return False

    def log_tail(self, lines: int = 50) -> str:
        return "dockerd: shutting down"

    def __enter__(self) -> DeadServer:
        return self

    def __exit__(self, *exc: object) -> None:
        raise ConnectionError("Error while fetching server API version: the Docker daemon is restarting")


class RestartingDocker:
    def host_facts(self, spec: object) -> None:  # another host whose memory is not read here: it runs unwatched
        return None

    def remove_run_containers(self, run_id: str) -> list[str]:
        raise ConnectionError("the Docker daemon is restarting")


def test_a_cell_that_never_ran_is_charged_one_attempt_when_its_server_dies_with_the_daemon(tmp_path: Path,
                                                                                          monkeypatch) -> None:
    """Before: "exited" charged each unrun cell, then the fault while removing the dead container ("error")
    charged it again: with max_attempts 2 the cells ended failed for good after one server start."""
    from sparklab.engines.scrape import StartupFacts
    from sparklab.recipes.hosts import Host
    from sparklab.runtimes.base import ImageInfo
    from sparklab.runtimes.launch import Ready
    from sparklab.sweep import serverrun as sweep_mod
    from sparklab.sweep.hoststore import HostStore

    plan = build_plan(_write(tmp_path, max_attempts=2), run_id="acct-1")
    (server,) = plan.servers
    store = Store.create(tmp_path / "run" / "results.sqlite", plan.sweep.model_dump(), "test")
    runner.register(plan, store)
    dead = DeadServer(server.spec)
    ready = Ready(dead, ImageInfo("img", "id", None, "amd64"), 1.0, None, StartupFacts())
    monkeypatch.setattr(sweep_mod, "_wait_port_free", lambda *a: None)
    monkeypatch.setattr(sweep_mod.launch, "checked", lambda *a, **k: None)
    monkeypatch.setattr(sweep_mod.launch, "start", lambda *a, **k: ready)
    monkeypatch.setattr(sweep_mod.launch, "read_served_version", lambda *a: None)
    monkeypatch.setattr(sweep_mod.launch, "image_version", lambda *a: None)
    monkeypatch.setattr(sweep_mod, "EngineAPI", lambda *a: None)
    monkeypatch.setattr(sweep_mod, "engine", lambda kind: type("E", (), {"served_facts": lambda self, api: {},
                                                                           "version": lambda self, api: None})())
    said: list[str] = []
    other_host = Host("spark-2", "ssh://root@127.0.0.1:22022", "127.0.0.1")  # not this machine: no memory waits
    with store:
        sweep_mod.serve(sweep_mod.ServerRun(plan, HostStore(store), RestartingDocker(),  # type: ignore[arg-type]
                                            tmp_path / "run", sweep_mod.Options(min_free_mib=0), said.append,
                                            other_host, server, list(server.cells)))
        cells = store.cells()
        kinds = [f.kind for f in store.failures()]
    assert kinds == ["exited", "error"]  # both faults are on record
    assert [(c.status, c.attempts) for c in cells] == [("pending", 1), ("pending", 1)], said


# -- one sweep process per sweep --------------------------------------------------------------------------------

class NoDocker:
    def __getattr__(self, name: str) -> None:
        raise AssertionError(f"the second sweep reached its runtime ({name})")


@pytest.fixture(autouse=True)
def _state(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("SPARKLAB_STATE", str(tmp_path / "state"))  # where the sweep locks live


def test_a_second_sweep_of_the_same_name_is_refused_before_it_makes_a_run(tmp_path: Path) -> None:
    """Two `sparklab sweep S` started in the same second found no run, so each made its own (two run ids), and
    both started servers on the recipe's port. The second now waits for nothing: it is refused at once."""
    runs = tmp_path / "runs"
    request = runner.Request(_write(tmp_path), runs, download=False)
    busy = r"sweep acct is in use by pid \d+ \(another `sparklab sweep` of it"
    with rundir.SweepLock(runs, "acct"), pytest.raises(SparklabError, match=busy):
        runner.sweep(request, say=lambda line: None, runtime=NoDocker())  # type: ignore[arg-type]
    assert not runs.exists() or not list(runs.iterdir()), "the refused sweep made a run (or anything) under runs/"


def test_the_sweep_lock_is_released_with_its_holder(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    with rundir.SweepLock(runs, "acct"):
        pass
    with rundir.SweepLock(runs, "acct"):  # taken again: the first was released
        pass
    with rundir.SweepLock(runs, "acct"), rundir.SweepLock(runs, "other"):  # other sweeps run side by side
        pass
    with rundir.SweepLock(runs, "acct"), rundir.SweepLock(tmp_path / "elsewhere", "acct"):  # another runs dir
        pass
    assert not runs.exists()  # the locks live in the state directory: runs/ holds runs only


def test_a_sweep_without_a_code_suite_never_reaches_for_docker(tmp_path: Path, monkeypatch) -> None:
    """A host-process engine runs on a machine without a Docker daemon: only a code suite's sandbox needs one. The
    sandbox lookup asked this machine's runtime for its Docker engine before knowing whether the sweep grades code,
    so every host-process sweep failed there with "cannot reach the Docker engine" (tests/process, no dockerd)."""
    from sparklab.errors import ContainerError
    from sparklab.runtimes.local import Runtime as LocalRuntime

    class NoDaemon(LocalRuntime):
        @property
        def docker(self) -> Any:
            raise ContainerError("cannot reach the Docker engine: refused", "Start it.")

    seen: list[Any] = []

    def run(plan, store, runtime, run_dir, options, say, hosts, reach):  # the servers themselves are not this test's
        seen.append(options.sandbox)
        return store.counts()

    monkeypatch.setattr(runner, "run", run)
    request = runner.Request(_write(tmp_path, workloads=["seed"]), tmp_path / "runs", download=False)
    runner.sweep(request, say=lambda line: None, runtime=NoDaemon())
    assert seen == [None]
