"""ETA and deadlines per engine (issue 23): TensorRT Edge-LLM's first start builds its TensorRT engines (the recipe
allows 3600 s), so the build counts in the sweep's and tune's ETA and in the ready deadline (a silent build is not
a stall); and host processes get HF_HUB_OFFLINE=1 only where everything the engine reads from the Hub was
fetched first, into the cache it reads (Edge-LLM: its own checkpoint cache)."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

from sparklab.engines import api, engine
from sparklab.engines.logwatch import LogWatch
from sparklab.errors import NotReadyError
from sparklab.host import downloads
from sparklab.recipes.plan import build_plan, estimate_seconds
from sparklab.recipes.render import LaunchOptions, render
from sparklab.recipes.schema import load_recipe, recipes_dir
from sparklab.runtimes.health import wait_ready
from sparklab.sweep import runner
from sparklab.sweep.store import Store
from tests.unit.test_engine_log import NOBODY, Clock, Container

SEED004 = recipes_dir() / "sweeps" / "seed004.yaml"
# experimental/builder/core/builder.py:485-486 and :499 of tensorrt-edgellm 0.11.0, as its server logs them
# (experimental/server/cli.py:33-37: "%(asctime)s %(levelname)-8s %(name)s: %(message)s")
BUILDING = ("12:00:05 INFO     experimental.builder.core.builder: Building serialized engine (this may take "
            "several minutes)...")
WRITTEN = ("12:25:05 INFO     experimental.builder.core.builder: Engine written to /root/.cache/tensorrt-edgellm/"
           "engines/model-1/i-b1-kv-none-0/llm/llm.engine (17000000000 bytes)")


@pytest.fixture(autouse=True)
def refused(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every readiness try is refused without a socket: these waits run an hour of fake clock, one try a second
    (3600 real connection attempts cost ~3 s of CPU; tests/unit/test_engine_log.py keeps the real refused port)."""
    tries: list[str] = []

    def probe(url: str, headers: dict[str, str] | None, timeout_s: float = 5.0) -> int:
        tries.append(url)
        raise api.Unreachable(f"connection to {url} refused")

    monkeypatch.setattr(api, "probe", probe)
    return tries


def _trtedge_wait(script: dict[float, list[str]], timeout_s: float, stall_s: float) -> tuple[Clock, NotReadyError]:
    watch = LogWatch(engine("trtedge"))
    container: Container | None = None
    due = sorted(script.items())

    def feed(elapsed: float) -> None:
        assert container is not None
        while due and due[0][0] <= elapsed:
            for line in due.pop(0)[1]:
                container.lines.append(line)
                watch.feed(line + "\n")

    clock = Clock(feed)
    container = Container(clock, watch)
    with pytest.raises(NotReadyError) as exc:
        wait_ready(container, NOBODY, kind="trtedge", timeout_s=timeout_s, clock=clock, sleep=clock.sleep,
                   watch=watch, stall_s=stall_s)
    return clock, exc.value


def test_a_silent_tensorrt_build_is_not_a_stall_and_runs_to_the_ready_deadline(refused: list[str]) -> None:
    """Before: load_stall_s (600 s) killed the first start ~600 s into TensorRT's silent build."""
    clock, error = _trtedge_wait({1.0: ["loading checkpoint", BUILDING]}, timeout_s=3600, stall_s=600)
    assert error.kind is None and "not ready after 3600 s" in error.message
    assert clock.now - 1000.0 >= 3600
    assert len(refused) >= 3500  # it kept trying, about once a second, all the way to the deadline


def test_after_the_build_silence_is_a_stall_again() -> None:
    clock, error = _trtedge_wait({1.0: [BUILDING], 1500.0: [WRITTEN]}, timeout_s=3600, stall_s=600)
    assert error.kind == "stalled" and 2100 <= clock.now - 1000.0 <= 2102


def test_other_engines_still_stall_on_the_same_silence() -> None:
    watch = LogWatch(engine("vllm"))
    watch.feed(BUILDING + "\n")
    assert watch.quiet is None


def _dry(tmp_path: Path, history: list[Path] | None = None) -> tuple[float, object]:
    plan = build_plan(SEED004)
    model = runner.timing_model(plan, history or [])
    return estimate_seconds(plan, model), model


def test_the_eta_counts_edgellms_engine_build_on_each_first_start(tmp_path: Path) -> None:
    plan = build_plan(SEED004)
    eta, model = _dry(tmp_path)
    deadline = plan.servers[0].spec.ready_timeout_s
    assert deadline == 3600
    assert all(model.startup_for(s) == deadline for s in plan.servers)  # type: ignore[attr-defined]
    cells = sum(len(s.cells) for s in plan.servers)
    tokens = sum((c.requests + plan.sweep.warmup) * plan.sweep.sampling.max_tokens for s in plan.servers
                 for c in s.cells)
    expected = len(plan.servers) * (deadline + model.teardown_s) + tokens / model.tokens_per_s  # type: ignore[attr-defined]
    assert cells == 30 and eta == pytest.approx(expected)
    assert "first start builds" in model.startup_text()  # type: ignore[attr-defined]


def test_a_measured_start_of_the_same_server_replaces_the_build_allowance(tmp_path: Path) -> None:
    plan = build_plan(SEED004)
    old = tmp_path / "old" / "results.sqlite"
    with Store.create(old, plan.sweep.model_dump(), "test") as store:
        runner.register(plan, store)
        store.record_server_start(plan.servers[0].id, image_digest=None, startup_facts=None, ready_s=95.0,
                                  log_path=None, engine_version=None)
    _, model = _dry(tmp_path, [old])
    assert model.startup_for(plan.servers[0]) == pytest.approx(95.0)  # type: ignore[attr-defined]
    assert model.startup_for(plan.servers[1]) == 3600  # another profile: its own first build


def test_engines_without_a_build_keep_the_hardware_guess() -> None:
    plan = build_plan(recipes_dir() / "sweeps" / "seed000.yaml")
    model = runner.timing_model(plan, [])
    assert {model.startup_for(s) for s in plan.servers} == {300.0}  # type: ignore[attr-defined]


def test_the_sweep_dry_run_prints_the_build_allowance(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from sparklab.cli.main import main

    assert main(["sweep", str(SEED004), "--dry-run", "--runs-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    eta = re.search(r"ETA at most (\d+) h (\d+) min", out)
    assert eta and int(eta[1]) * 60 + int(eta[2]) >= 2 * 60  # two first starts at up to 3600 s each
    assert "edgellm: up to 3600 s" in out


# -- HF_HUB_OFFLINE for host processes --------------------------------------------------------------------


def _edgellm(*extra: str) -> object:
    recipe = load_recipe(recipes_dir() / "gb10.yaml")
    return recipe, render(recipe, "edgellm", "dspark", LaunchOptions(extra_args=extra))


def test_edgellm_checkpoints_are_fetched_into_the_cache_it_reads(monkeypatch: pytest.MonkeyPatch,
                                                                 tmp_path: Path) -> None:
    """tensorrt-edgellm 0.11.0 resolves a Hub id with snapshot_download(model, cache_dir=<cache root>/checkpoints),
    the root being --cache-dir or ~/.cache/tensorrt-edgellm (experimental/server/runtime/engine_build.py:33,
    109-112, 139-140), not the Hugging Face cache."""
    monkeypatch.setenv("HOME", str(tmp_path))
    recipe, spec = _edgellm()
    assert downloads.host_hub_cache(spec) == tmp_path / ".cache" / "tensorrt-edgellm" / "checkpoints"  # type: ignore[arg-type]
    assert {c.cache_dir for c in downloads.checkpoints(recipe, spec)} == {  # type: ignore[arg-type]
        tmp_path / ".cache" / "tensorrt-edgellm" / "checkpoints"}
    _, moved = _edgellm("--cache-dir=/data/edge")
    assert downloads.host_hub_cache(moved) == Path("/data/edge/checkpoints")  # type: ignore[arg-type]
    assert downloads.offline_for(spec) == {"HF_HUB_OFFLINE": "1"}  # type: ignore[arg-type]


def test_a_host_process_that_fetches_on_its_own_gets_no_offline_flag() -> None:
    recipe = load_recipe(recipes_dir() / "cpu.yaml")
    spec = render(recipe, "vllm-cpu", "none", LaunchOptions())
    as_process = replace(spec, runtime="process")
    assert downloads.offline_for(as_process) == {}  # vLLM as a host process: where it reads is not declared
    assert downloads.offline_for(spec) == ({"HF_HUB_OFFLINE": "1"} if downloads.host_hub_cache(spec) else {})
