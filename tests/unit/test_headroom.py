"""The floor and the fraction agree (issue 23): on GB10's unified memory the engine takes its fraction of the pool,
the OS keeps its baseline, and the memory floor sits below what is left, with a margin; a fraction that leaves
less than the floor is refused by preflight, with the numbers and the fix.

The host here is GB10 as recipes/hardware.yaml models it (MemTotal 121.7 GiB, an idle OS baseline), and a
server's life is played through the floor watchdog as the engine behaves: weights read through the page cache
at load (MemFree falls, MemAvailable does not), the engine's fraction taken at ready, then memory outside its
budget under load (CUDA graphs, the API server, buffers) up to the stated margin."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparklab.host import headroom, preflight, watchdog
from sparklab.host.memory import HostMemory
from sparklab.recipes.plan import build_plan
from sparklab.recipes.render import LaunchOptions, render
from sparklab.recipes.schema import load_hardware, load_recipe, recipes_dir
from sparklab.spec import LaunchSpec

KB_PER_GIB = 1024 * 1024
GB10 = load_hardware()["gb10"]


def _servers(name: str) -> list[tuple[str, LaunchSpec, object]]:
    """(label, spec, recipe) of every server a shipped sweep or recipe starts."""
    if name == "gb10-modelcard":
        recipe = load_recipe(recipes_dir() / "gb10-modelcard.yaml")
        return [("gb10-modelcard/vllm/dspark", render(recipe, "vllm", "dspark", LaunchOptions()), recipe)]
    plan = build_plan(recipes_dir() / "sweeps" / f"{name}.yaml")
    return [(f"{name}/{s.label}", s.spec, s.recipe) for s in plan.servers]


SHIPPED = [server for name in ("seed000", "seed002", "gb10-modelcard") for server in _servers(name)]


def _at(spec: LaunchSpec, fraction: float) -> LaunchSpec:
    """The same launch asking another memory fraction (SGLang's is a literal flag in the recipe, not a var)."""
    argv = list(spec.argv)
    for flag in ("--gpu-memory-utilization", "--mem-fraction-static"):
        if flag in argv:
            argv[argv.index(flag) + 1] = str(fraction)
    return LaunchSpec(**{**spec.__dict__, "argv": tuple(argv)})


def _idle_gb10() -> HostMemory:
    """A DGX Spark before the sweep's first server: MemTotal and the OS baseline from recipes/hardware.yaml."""
    total, baseline = GB10.mem_total_gib, GB10.os_baseline_gib
    assert total is not None and baseline is not None
    return HostMemory(total, total - baseline, total - baseline, 1.0)


def _write(path: Path, total: float, free: float, available: float) -> None:
    path.write_text(f"MemTotal: {int(total * KB_PER_GIB)} kB\nMemFree: {int(free * KB_PER_GIB)} kB\n"
                    f"MemAvailable: {int(max(available, 0.0) * KB_PER_GIB)} kB\nCached: 1048576 kB\n")


def _night(tmp_path: Path, h: headroom.Headroom, floor: float | None) -> int:
    """One server's life on the modelled GB10 through the floor watchdog: how many times the floor tripped."""
    info = tmp_path / "meminfo"
    start = h.total_gib - h.baseline_gib
    weights = 18.0  # ~17.6 GiB of target weights + draft read at load (seed 002's "Model loading took")
    phases = [(start, start),  # idle
              (start - weights, start),  # loading: the page cache fills MemFree, MemAvailable stays
              (h.expected_available_gib, h.expected_available_gib),  # ready: the fraction is taken
              (h.room_gib, h.room_gib)]  # under load: the engine's memory outside its budget, up to the margin
    trips = 0
    for free, available in phases:
        _write(info, h.total_gib, free, available)
        sampler = watchdog.Sampler(floor_gib=floor, meminfo=info, cgroup_root=tmp_path / "cg", gpu=False,
                                   on_floor=lambda: None)
        sampler.tick()
        trips += sampler.tripped is not None
    return trips


def test_hardware_yaml_models_gb10_memory() -> None:
    assert GB10.mem_total_gib == pytest.approx(121.7, abs=0.1)
    assert GB10.os_baseline_gib is not None and 0 < GB10.os_baseline_gib < 16


@pytest.mark.parametrize(("label", "spec", "recipe"), SHIPPED, ids=[s[0] for s in SHIPPED])
def test_shipped_gb10_servers_leave_room_for_the_floor_and_never_trip_it(
        label: str, spec: LaunchSpec, recipe: object, tmp_path: Path) -> None:
    host = _idle_gb10()
    h = headroom.headroom(spec, recipe, host)  # type: ignore[arg-type]
    assert h is not None, label
    floor = watchdog.floor_for(recipe, None, h)  # type: ignore[arg-type]
    assert floor is not None and headroom.MIN_FLOOR_GIB <= floor <= h.room_gib
    assert floor <= watchdog.UNIFIED_FLOOR_GIB  # never above what GB10 users set
    errors = [f for f in preflight.check_memory(spec, recipe, host) if f.level == "error"]  # type: ignore[arg-type]
    assert errors == [], errors
    assert _night(tmp_path, h, floor) == 0


def test_the_users_8_gib_floor_would_stop_the_model_card_setup(tmp_path: Path) -> None:
    """Why the default moved: 0.91 of 121.7 GiB leaves ~11 GiB, less the OS baseline and the engine's memory
    outside its fraction, so MemAvailable under load sits below 8 GiB although the engine does what it asked."""
    (_, spec, recipe), = _servers("gb10-modelcard")
    h = headroom.headroom(spec, recipe, _idle_gb10())  # type: ignore[arg-type]
    assert h is not None and h.total_gib * (1 - 0.91) == pytest.approx(10.95, abs=0.05)
    assert h.room_gib < watchdog.UNIFIED_FLOOR_GIB and _night(tmp_path, h, watchdog.UNIFIED_FLOOR_GIB) > 0


@pytest.mark.parametrize(("label", "spec", "recipe"), SHIPPED, ids=[s[0] for s in SHIPPED])
def test_a_fraction_of_097_is_refused_with_the_numbers_and_the_fix_and_would_trip(
        label: str, spec: LaunchSpec, recipe: object, tmp_path: Path) -> None:
    greedy = _at(spec, 0.97)
    host = _idle_gb10()
    h = headroom.headroom(greedy, recipe, host)  # type: ignore[arg-type]
    assert h is not None and h.room_gib < headroom.MIN_FLOOR_GIB
    errors = [f for f in preflight.check_memory(greedy, recipe, host) if f.level == "error"]  # type: ignore[arg-type]
    assert errors, label
    text = errors[-1].message + "\n" + (errors[-1].hint or "")
    assert "0.97" in text and "121.7 GiB" in text and "floor" in text
    fix = headroom.max_fraction_text(h, headroom.MIN_FLOOR_GIB)
    assert fix in text and float(fix) < 0.97
    assert _night(tmp_path, h, headroom.MIN_FLOOR_GIB) > 0  # forced through, the watchdog would stop it


def test_the_derivation_states_its_terms() -> None:
    (_, spec, recipe), = _servers("gb10-modelcard")
    h = headroom.headroom(spec, recipe, HostMemory(121.7, 100.0, 116.7, 10.0))  # type: ignore[arg-type]
    assert h is not None
    assert (h.total_gib, h.baseline_gib, h.engine_gib) == pytest.approx((121.7, 5.0, 0.91 * 121.7))
    assert h.drafter_gib == 0.0  # vLLM's fraction holds every model it loads, the drafter included
    assert h.expected_available_gib == pytest.approx(121.7 - 5.0 - 0.91 * 121.7)
    assert h.room_gib == pytest.approx(h.expected_available_gib - headroom.OUTSIDE_BUDGET_GIB)
    text = h.explain()
    for part in ("0.91", "121.7", "5.0 GiB", "outside"):
        assert part in text
    # the baseline measured at the sweep's start wins over the moment's MemAvailable (a server may run now)
    later = headroom.headroom(spec, recipe, HostMemory(121.7, 2.0, 4.0, 1.0), available_at_start=116.7)  # type: ignore[arg-type]
    assert later is not None and later.baseline_gib == pytest.approx(5.0)


def test_sglang_takes_its_fraction_of_the_memory_free_at_its_start() -> None:
    plan = build_plan(recipes_dir() / "sweeps" / "seed002.yaml")
    sglang = next(s for s in plan.servers if s.engine == "sglang")
    h = headroom.headroom(sglang.spec, sglang.recipe, HostMemory(121.7, 100.0, 116.7, 10.0))
    assert h is not None and h.engine_gib == pytest.approx(0.85 * 116.7)  # kv_pool_runtime.py:75-77


def test_no_fraction_no_headroom_and_the_users_floor() -> None:
    recipe = load_recipe(recipes_dir() / "gb10.yaml")
    spec = render(recipe, "edgellm", "dspark", LaunchOptions())
    assert headroom.headroom(spec, recipe, _idle_gb10()) is None
    assert watchdog.floor_for(recipe, None, None) == watchdog.UNIFIED_FLOOR_GIB


def test_an_explicit_floor_stays_and_zero_turns_it_off() -> None:
    (_, spec, recipe), = _servers("gb10-modelcard")
    h = headroom.headroom(spec, recipe, _idle_gb10())  # type: ignore[arg-type]
    assert watchdog.floor_for(recipe, 6.0, h) == 6.0  # type: ignore[arg-type]
    assert watchdog.floor_for(recipe, 0, h) is None  # type: ignore[arg-type]


def test_preflight_warns_of_a_configured_floor_above_the_room_and_a_floor_of_zero_refuses_nothing() -> None:
    (_, spec, recipe), = _servers("gb10-modelcard")
    host = _idle_gb10()  # room 3.95 GiB at 0.91
    assert [f for f in preflight.check_memory(spec, recipe, host, 3.5) if f.level == "error"] == []  # type: ignore[arg-type]
    (said,) = preflight.check_memory(spec, recipe, host, 6.0)  # type: ignore[arg-type]
    assert said.level == "warning"  # the user's own floor: kept, and said to be above the room
    assert "less than the memory floor of 6.0 GiB" in said.message and "0.89 or less" in (said.hint or "")
    tight = _at(spec, 0.95)  # room 1.5 GiB: under the least floor, unless the user turned the floor off
    assert [f for f in preflight.check_memory(tight, recipe, host) if f.level == "error"]  # type: ignore[arg-type]
    assert [f for f in preflight.check_memory(tight, recipe, host, 0) if f.level == "error"] == []  # type: ignore[arg-type]
