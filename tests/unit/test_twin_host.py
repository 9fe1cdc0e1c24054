"""The DGX Spark twin's host facts (host/twin.py) on a fake clock: memory as the engine behaves (weights through the
page cache at load, the fraction at ready, load, a drop, a stop), clocks under load and the throttle, the disk."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparklab.host.clocks import REASONS
from sparklab.host.facts import HostFacts
from sparklab.host.twin import DISK_FULL_GIB, TwinHost
from sparklab.recipes.plan import build_plan
from sparklab.recipes.schema import recipes_dir
from sparklab.recipes.twin import GIB, load_twin
from sparklab.spec import LaunchSpec

TWIN = load_twin("gb10")


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _spec(method: str = "dspark") -> LaunchSpec:
    plan = build_plan(recipes_dir() / "sweeps" / "seed000.yaml")
    return next(s.spec for s in plan.servers if s.method == method)


def _host(**kwargs: object) -> tuple[TwinHost, Clock]:
    clock = Clock()
    return TwinHost(TWIN, 1.0, clock=clock, **kwargs), clock  # type: ignore[arg-type]


def test_the_twin_is_host_facts_and_idles_at_its_baseline() -> None:
    host, _ = _host()
    assert isinstance(host, HostFacts)
    idle = host.meminfo()
    assert idle.total_gib == pytest.approx(121.7)
    # MemTotal - MemAvailable: the OS baseline and the kernel's reserve
    assert idle.total_gib - idle.available_gib == pytest.approx(TWIN.os_baseline_gib + TWIN.host.reserve_gib)
    assert idle.cached_gib == pytest.approx(TWIN.host.page_cache_gib)


def test_load_reads_the_weights_through_the_page_cache_then_ready_takes_the_fraction(tmp_path: Path) -> None:
    host, clock = _host()
    spec = _spec()
    idle = host.meminfo()
    server = host.start(spec, None)
    weights = 17.62 + 1.52  # the target and the DSpark draft (seed 002)
    clock.t = server.ready_after_s * 0.99  # loading: the files are (nearly) all in the page cache
    loading = host.meminfo()
    assert idle.free_gib - loading.free_gib == pytest.approx(weights * 0.99, rel=0.01)  # MemFree falls
    assert loading.available_gib == pytest.approx(idle.available_gib)  # MemAvailable does not
    clock.t = server.ready_after_s + 1
    ready = host.meminfo()
    fraction = 0.91 * 121.7  # --gpu-memory-utilization 0.91 of MemTotal, and vLLM's memory outside it
    assert idle.available_gib - ready.available_gib == pytest.approx(fraction + TWIN.engine("vllm").outside_gib,
                                                                     abs=0.05)
    assert ready.free_gib == pytest.approx(TWIN.host.reserve_gib)  # the kernel keeps its reserve, reclaims cache


def test_requests_in_flight_take_memory_and_the_lowest_is_kept(tmp_path: Path) -> None:
    host, clock = _host()
    load = tmp_path / "load"
    load.write_text("0")
    server = host.start(_spec(), load)
    clock.t = server.ready_after_s + 1
    before = host.meminfo().available_gib
    load.write_text("8")
    under = host.meminfo().available_gib
    assert before - under == pytest.approx(8 * TWIN.engine("vllm").per_request_gib)
    assert server.lowest_available_gib == pytest.approx(under)


def test_a_stopped_engine_gives_its_memory_back_and_a_drop_gives_its_files_back() -> None:
    host, clock = _host()
    spec = _spec()
    server = host.start(spec, None)
    clock.t = server.ready_after_s + 1
    host.meminfo()  # the sampler reads it at ready: the files are in the page cache
    host.stop(spec.name)
    after = host.meminfo()
    assert after.available_gib == pytest.approx(121.7 - TWIN.os_baseline_gib - TWIN.host.reserve_gib)
    cached = after.cached_gib
    count, size = host.evict_model_files(None, spec)  # type: ignore[arg-type]
    assert count == 2 and size > 0
    assert cached - host.meminfo().cached_gib == pytest.approx(size / GIB)


def test_an_engine_whose_process_ended_holds_nothing() -> None:
    host, clock = _host()
    spec = _spec("none")
    server = host.start(spec, None)
    clock.t = server.ready_after_s + 1
    held = host.meminfo().available_gib
    host.watch(spec.name, lambda: False)
    assert host.meminfo().available_gib > held + 100


def test_clocks_idle_then_load_then_the_throttle(tmp_path: Path) -> None:
    host, clock = _host(throttle=True)
    assert host.gpu_clocks().idle  # type: ignore[union-attr]
    load = tmp_path / "load"
    load.write_text("1")
    server = host.start(_spec(), load)
    clock.t = server.ready_after_s + 1
    host.meminfo()  # a sample under load marks its start
    hot = host.gpu_clocks()
    assert hot is not None and hot.sm_mhz == TWIN.host.load.sm_clock_mhz and not hot.reasons
    clock.t += TWIN.host.throttle.after_s + 1
    throttled = host.gpu_clocks()
    assert throttled is not None and throttled.sm_mhz == TWIN.host.throttle.sm_clock_mhz
    assert throttled.reason_names == (TWIN.host.throttle.reason,) and 0x20 in REASONS


def test_disk_full_after_the_first_ready() -> None:
    host, clock = _host(disk_full_after_ready=True)
    assert host.free_bytes(Path("/runs")) == int(TWIN.host.disk_free_gib * GIB)
    server = host.start(_spec(), None)
    clock.t = server.ready_after_s + 1
    assert host.free_bytes(Path("/runs")) == int(DISK_FULL_GIB * GIB)


def test_a_first_start_of_an_image_is_cold_the_next_warm() -> None:
    host, _ = _host()
    spec = _spec()
    cold = host.start_seconds(spec)
    host.start(spec, None)
    assert cold - host.start_seconds(spec) == pytest.approx(TWIN.engine("vllm").cold_init_s)
