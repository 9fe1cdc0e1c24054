"""The twin's engines (recipes/twin/gb10.yaml) are the seeds' tables, inverted: every derived step cost follows from
the published tok/s by the file's own arithmetic, the timing model gives the seeds' tables back, no step is faster
than the usable bandwidth allows, and the per-position acceptance lists have the published lengths."""

from __future__ import annotations

import itertools
import math

import pytest

from sparklab.recipes.twin import load_twin

TWIN = load_twin("gb10")
TOLERANCE = 0.005  # the file rounds to 3 decimals


def _al(accept: list[float], k: int) -> float:
    return 1 + sum(accept[:k])


def _ttft_s(profile, c: int) -> float:
    return (profile.prefill_ms or 0) * (1 + profile.per_running * (c - 1)) / 1000


@pytest.mark.parametrize("name", ["seed000", "seed002", "seed002-sglang"])
def test_each_step_cost_is_the_published_figure_inverted(name: str) -> None:
    profile = TWIN.data.profiles[name]
    for key, figure in profile.published.items():
        method = figure.get("method", key)
        k = figure.get("k")
        al = 1.0 if method == "none" else _al(TWIN.data.acceptance[method], k)
        for c, tok_s in figure["tok_s"].items():
            tokens = figure["tokens"][c]
            per_request = tok_s if c == 1 else tok_s / c
            step_ms = (tokens / per_request - _ttft_s(profile, c)) * al / tokens * 1000
            assert math.isclose(profile.step_ms[key][c], step_ms, rel_tol=TOLERANCE), (name, key, c, step_ms)


def test_the_timing_model_gives_seed_000s_table_back() -> None:
    """Per-request tok/s at C=1 and aggregate tok/s at C=8, from the stand-in's own timing (Timing.request_s)."""
    table = {"none": (81.27, 241.67), "mtp": (111.36, 302.27), "dflash": (95.48, 268.61), "dspark": (124.24, 354.56)}
    for method, (c1, c8) in table.items():
        timing = TWIN.timing("vllm", method, None if method == "none" else 3, "seed000")
        one = 1185.3 / timing.request_s(21, 1185.3, 1)
        eight = 8 * 1227.3 / timing.request_s(21, 1227.3, 8)
        assert math.isclose(one, c1, rel_tol=TOLERANCE) and math.isclose(eight, c8, rel_tol=TOLERANCE), method


def test_seed_002s_k8_and_seed_004s_workloads_come_back() -> None:
    k8 = TWIN.timing("vllm", "dspark", 8, "seed002")
    assert math.isclose(256 / k8.request_s(21, 256, 1), 93.54, rel_tol=TOLERANCE)
    k3 = TWIN.timing("vllm", "dspark", 3, "seed002")
    assert math.isclose(256 / k3.request_s(21, 256, 1), 115.75, rel_tol=TOLERANCE)
    published = TWIN.data.profiles["seed004"].published
    words = {"humaneval": 68, "speedbench-1k": 677, "speedbench-2k": 1243}  # mean words of sparklab's workloads
    for method in ("none", "dspark"):
        timing = TWIN.timing("trtedge", method, None if method == "none" else 3, "seed004")
        for workload, tok_s in published[method].items():
            if workload == "k":
                continue
            phase = timing.phase(words[workload])
            decode = phase.acceptance_length / phase.step(1) * 1000  # tokens per second after the first
            assert math.isclose(decode, tok_s, rel_tol=TOLERANCE), (method, workload, decode)
            assert phase.prefill_ms == published["ttft_ms"][method][workload]


def test_seed_004s_dspark_step_is_edge_llms_own_mtp_ratio() -> None:
    ratio = (2.70 / 93.2) / (1 / 75.6)
    assert math.isclose(TWIN.data.profiles["seed004"].published["mtp_step_ratio"], ratio, rel_tol=TOLERANCE)
    for bucket in TWIN.data.profiles["seed004"].buckets:
        none, dspark = bucket.step_ms["none"][1], bucket.step_ms["dspark"][1]
        assert math.isclose(none, 1000 / TWIN.data.profiles["seed004"].published["none"][bucket.workload],
                            rel_tol=TOLERANCE)
        assert math.isclose(dspark, none * ratio, rel_tol=TOLERANCE)


@pytest.mark.parametrize(("method", "al3"), [("dspark", 3.27), ("mtp", 2.70), ("dflash", 2.23)])
def test_acceptance_lists_have_the_published_lengths_and_fall_with_position(method: str, al3: float) -> None:
    accept = TWIN.data.acceptance[method]
    assert math.isclose(_al(accept, 3), al3, abs_tol=0.005)
    assert all(a >= b for a, b in itertools.pairwise(accept)) and len(accept) == 8


def test_no_step_is_faster_than_the_usable_bandwidth_allows() -> None:
    """A decode step reads the active weights at least once: 3 B parameters at 4 bits over 232 GB/s."""
    floor_ms = 3e9 * 4 / 8 / (TWIN.hardware.usable_bandwidth_gbps or 0) / 1e9 * 1000
    assert 6 < floor_ms < 7
    for profile in TWIN.data.profiles.values():
        steps = [ms for by_c in profile.step_ms.values() for ms in by_c.values()]
        steps += [ms for b in profile.buckets for by_c in b.step_ms.values() for ms in by_c.values()]
        assert steps and min(steps) > floor_ms


def test_a_profile_per_sweep_and_a_default_per_kind() -> None:
    assert TWIN.profile("vllm", "seed002")[0] == "seed002"
    assert TWIN.profile("vllm", None)[0] == TWIN.profile("vllm", "my-sweep")[0] == "seed000"
    assert TWIN.profile("sglang", "seed002")[0] == "seed002-sglang"
    assert TWIN.profile("trtedge", None)[0] == "seed004"
    eagle = TWIN.timing("sglang", "eagle", 3, "seed002")
    assert eagle.phases[0].step(1) == TWIN.data.profiles["seed000"].step_ms["mtp"][1]  # measured nowhere else
