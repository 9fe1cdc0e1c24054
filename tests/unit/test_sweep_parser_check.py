"""The image's own parser and the engine's versions in the one sweep loop (issue 24 carried into sweep.runner and
sweep.serverrun): before the first start every pending server config's command goes through its image's parser,
a refusal fails that server config at minute 0 naming the sweep file while the rest goes on; a start records the
verdict, the version the image states and the one the server answers, with the server config and with each cell."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from sparklab.engines import engine
from sparklab.engines.api import Answer, Unreachable
from sparklab.engines.parsers import Verdict
from sparklab.engines.scrape import StartupFacts
from sparklab.recipes.hosts import LOCAL
from sparklab.recipes.plan import Plan, build_plan
from sparklab.runtimes import imagecheck
from sparklab.runtimes.base import ImageInfo
from sparklab.runtimes.launch import Ready
from sparklab.sweep import runner, serverrun
from sparklab.sweep.hoststore import HostStore
from sparklab.sweep.store import Store
from tests.fakes import FakeRuntime, FakeServer

MISSPELT = "--speculative-confg"


def _plan(tmp_path: Path) -> tuple[Path, Plan, Store]:
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({"name": "t", "recipe": "cpu", "methods": ["none", "ngram"], "concurrency": [1],
                                    "requests": 2,
                                    "overrides": [{"match": {"method": "ngram"}, "serve_args": [MISSPELT, "3"]}]}))
    plan = build_plan(path, run_id="t-1")
    store = Store.create(tmp_path / "results.sqlite", plan.sweep.model_dump(), "test")
    runner.register(plan, store)
    return path, plan, store


def _refusing_the_second(version: str = "0.27.1+cpu") -> str:
    """vLLM's parser probe's answer (sparklab/engines/probes/vllm_args.py) for two servers: the first accepted,
    the second refused with the parser's own message."""
    return json.dumps({"vllm_version": version, "version_source": "metadata", "cases": [
        {"id": "0", "ok": True, "errors": []},
        {"id": "1", "ok": False, "errors": [{"flag": None, "message": f"unrecognized arguments: {MISSPELT} 3"}]}]})


def test_the_sweep_loop_runs_the_images_parser_first_and_a_refusal_fails_only_that_server(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path, plan, store = _plan(tmp_path)
    fake = FakeRuntime(images={s.spec.image: "x86_64" for s in plan.servers})
    fake.parser_says = _refusing_the_second()
    served: list[str] = []
    monkeypatch.setattr(runner, "serve", lambda run: served.append(run.server.id))  # no start: what reaches it
    said: list[str] = []
    with store:
        runner.run(plan, store, fake, tmp_path, serverrun.Options(), said.append)
        none, ngram = plan.servers
        assert served == [none.id]  # the refused server config never reaches a start; the rest goes on
        assert len(fake.probed) == 1  # one parser run for both servers of one image
        rows = {s.id: s for s in store.server_configs()}
        assert rows[none.id].image_check["verdict"]["status"] == imagecheck.ACCEPTED
        assert rows[ngram.id].image_check["verdict"]["status"] == imagecheck.REJECTED
        (failure,) = store.failures()
        assert failure.kind == "preflight" and failure.server_config_id == ngram.id
        assert f"unrecognized arguments: {MISSPELT} 3" in failure.message
        assert str(path) in failure.message  # the refusal names the file that wrote the flag
        assert [c.status for c in store.cells() if c.server_config_id == ngram.id] == ["failed"]
    assert any(f"server {ngram.label}: refused by its image's own parser" in line for line in said), said
    assert any(f"server {none.label}: vLLM 0.27.1+cpu's own parser accepts" in line for line in said), said


def test_a_sweep_over_several_hosts_leaves_the_check_to_each_start(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The controller does not pull every image to check it: each host's start checks on that host."""
    from sparklab.recipes.hosts import parse_hosts
    from sparklab.sweep import fleet

    _, plan, store = _plan(tmp_path)
    hosts = {"local": FakeRuntime("local"), "spark-2": FakeRuntime("spark-2")}
    for fake in hosts.values():
        fake.parser_says = _refusing_the_second()
    monkeypatch.setattr(fleet.Docker, "connect", lambda url, tls=None: hosts["spark-2"])
    monkeypatch.setattr(runner, "serve", lambda run: None)
    with store:
        runner.run(plan, store, hosts["local"], tmp_path, serverrun.Options(), lambda m: None,
                   parse_hosts(["local", "ssh://me@spark-2"], "t"))
    assert hosts["local"].probed == [] and hosts["spark-2"].probed == []


def test_a_start_records_the_verdict_and_both_versions_with_the_server_and_each_cell(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path, plan, store = _plan(tmp_path)
    server = plan.servers[0]
    checked = imagecheck.Checked(server.spec, server.spec.image, "sha256:" + "2" * 64,
                                 Verdict(imagecheck.ACCEPTED, version="0.27.1+cpu"), 11.5)
    ready = Ready(FakeServer(server.spec), ImageInfo(server.spec.image, "id", "sha256:" + "2" * 64, "x86_64"), 1.0,
                  None, StartupFacts(), check=checked)
    seen: dict[str, Any] = {}

    def start(prepared: Any, runtime: Any, **kwargs: Any) -> Ready:
        seen.update(kwargs)
        return ready

    class ServerAnswers:
        """The ready server's HTTP answers: vLLM's GET /version (without the image's +cpu), nothing else."""

        def __init__(self, *args: object) -> None:
            pass

        def get(self, path: str, *args: object, **kwargs: object) -> Answer:
            if path == "/version":
                return Answer(200, json.dumps({"version": "0.27.1"}))
            raise Unreachable("nothing else answers here")

        post = get

    result = {"measurement": {"window_started_at": 0.0},
              "summary": {"requests": {"ok": 2, "measured": 2, "failed": 0, "first_errors": []},
                          "aggregate_tps": 10.0}}
    monkeypatch.setattr(serverrun, "_wait_port_free", lambda *a: None)
    monkeypatch.setattr(serverrun.launch, "checked", lambda recipe, spec, *a, **k: None)
    monkeypatch.setattr(serverrun.launch, "start", start)
    monkeypatch.setattr(serverrun, "EngineAPI", ServerAnswers)
    monkeypatch.setattr(serverrun.bench, "run", lambda *a, **k: json.loads(json.dumps(result)))
    monkeypatch.setattr(type(engine("vllm")), "reset_prefix_cache", lambda self, api: None)  # no HTTP from a test
    said: list[str] = []
    with store:
        serverrun._run_server(serverrun.ServerRun(plan, HostStore(store), FakeRuntime(), tmp_path,
                                                  serverrun.Options(), said.append, LOCAL, server, list(server.cells)))
        row = next(s for s in store.server_configs() if s.id == server.id)
        (cell,) = [c for c in store.cells() if c.server_config_id == server.id]
    assert seen["sources"] == (path,)  # a refusal at the start names the sweep file too
    assert row.image_check is not None and row.image_check["verdict"]["version"] == "0.27.1+cpu"
    assert row.engine_version == "0.27.1"  # what the server answered
    assert cell.status == "done" and (cell.engine_version, cell.served_version) == ("0.27.1+cpu", "0.27.1")
    assert cell.result["engine"] == {"version": "0.27.1+cpu", "served_version": "0.27.1",
                                     "image_digest": "sha256:" + "2" * 64}
    assert not any("warning" in line for line in said), said  # 0.27.1+cpu and 0.27.1 name one release
