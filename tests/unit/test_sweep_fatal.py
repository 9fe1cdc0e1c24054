"""The sweep and `up` against a dead engine in a live container (issue 12, part 1): kinds "fatal" and "stalled",
the stall detector's settings, and a fatal line while a cell runs."""

from __future__ import annotations

from sparklab.engines import engine
from sparklab.engines.logwatch import LogWatch
from sparklab.errors import NotReadyError
from tests.fakes import NoEngineAPI


def test_sweep_failure_kinds() -> None:
    from sparklab.sweep.failures import failure_kind as _failure_kind

    assert _failure_kind(NotReadyError("x", kind="fatal")) == "fatal"
    assert _failure_kind(NotReadyError("x", kind="stalled")) == "stalled"
    assert _failure_kind(NotReadyError("x")) == "not_ready"


def test_sweep_files_stall_detector_is_on_by_default_and_can_be_turned_off(tmp_path) -> None:
    import yaml

    from sparklab.recipes.sweep_file import load_sweep

    doc = {"name": "t", "recipe": "cpu", "methods": ["none"], "concurrency": [1]}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert load_sweep(path).load_stall_s == 600
    path.write_text(yaml.safe_dump({**doc, "load_stall_s": None}))
    assert load_sweep(path).load_stall_s is None
    path.write_text(yaml.safe_dump({**doc, "load_stall_s": 90}))
    assert load_sweep(path).load_stall_s == 90


def test_up_has_a_stall_timeout_flag_off_by_default() -> None:
    from sparklab.cli.main import build_parser

    parser = build_parser()
    assert parser.parse_args(["up", "cpu:none"]).stall_timeout is None
    assert parser.parse_args(["up", "cpu:none", "--stall-timeout", "300"]).stall_timeout == 300


def test_a_fatal_line_while_a_cell_runs_fails_the_server_at_once_and_requeues_its_cells(tmp_path,
                                                                                          monkeypatch) -> None:
    """The engine dies mid-cell, its API server runs on and the cell's requests hang. Before: nothing noticed
    it, and the cell waited for request_timeout_s (30 min). Now the container is killed within seconds, the
    server fails as "fatal" with the line, and its cells (the one in flight too) go back to the queue."""
    import time

    import yaml

    from sparklab.engines.scrape import StartupFacts
    from sparklab.recipes.hosts import LOCAL
    from sparklab.recipes.plan import build_plan
    from sparklab.runtimes.base import ImageInfo
    from sparklab.runtimes.launch import Ready
    from sparklab.sweep import runner
    from sparklab.sweep import serverrun as sweep_mod
    from sparklab.sweep.hoststore import HostStore
    from sparklab.sweep.store import Store
    from tests.fakes import FakeRuntime, FakeServer

    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({"name": "t", "recipe": "cpu", "methods": ["none"], "concurrency": [1, 2],
                                    "requests": 2}))
    plan = build_plan(path, run_id="t-1")
    (server,) = plan.servers
    store = Store.create(tmp_path / "results.sqlite", plan.sweep.model_dump(), "test")
    runner.register(plan, store)
    fake = FakeServer(server.spec)  # killed by the sweep's watcher, not by itself
    watch = LogWatch(engine("vllm"))
    ready = Ready(fake, ImageInfo("img", "id", None, "amd64"), 1.0, None, StartupFacts(), watch=watch)
    monkeypatch.setattr(sweep_mod, "_wait_port_free", lambda *a: None)
    monkeypatch.setattr(sweep_mod.launch, "checked", lambda recipe, spec, **kwargs: None)  # kwargs: floor_gib
    monkeypatch.setattr(sweep_mod.launch, "start", lambda *a, **k: ready)

    monkeypatch.setattr(sweep_mod, "EngineAPI", NoEngineAPI)
    fatal = "(EngineCore pid=229) ERROR 11-30 15:30:02 [core.py:1351] EngineCore encountered a fatal error."
    hung_for: list[float] = []

    def bench_run(*args: object, **kwargs: object) -> None:
        started = time.monotonic()
        lines = [fatal, "(EngineCore pid=229) RuntimeError: CUDA error: an illegal memory access"]
        fake.lines.extend(lines)
        for line in lines:
            watch.feed(line + "\n")
        assert fake.killed.wait(10), "the dead engine's container was never killed: requests would hang"
        hung_for.append(time.monotonic() - started)
        raise ConnectionError("Connection reset by peer")  # what in-flight requests see when it is killed

    monkeypatch.setattr(sweep_mod.bench, "run", bench_run)
    said: list[str] = []
    cells = list(server.cells)
    with store:
        sweep_mod._run_server(sweep_mod.ServerRun(plan, HostStore(store), FakeRuntime(), tmp_path, sweep_mod.Options(),
                                                  said.append, LOCAL, server, cells))
        (failure,) = store.failures()
        rows = {c.id: c for c in store.cells()}
    assert len(hung_for) == 1 and hung_for[0] < 5
    assert failure.kind == "fatal" and failure.cell_id is None and failure.server_config_id == server.id
    assert fatal in failure.message and "illegal memory access" in (failure.log_tail or "")
    assert [rows[c.id].status for c in cells] == ["pending", "pending"]  # back to the queue, each one attempt
    assert [rows[c.id].attempts for c in cells] == [1, 1]
    assert any("failed (fatal)" in line and "EngineCore encountered a fatal error" in line for line in said)
