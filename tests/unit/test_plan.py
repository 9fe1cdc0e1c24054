"""Sweep files → plans: server axes outer, load axes inner, stable ids, strict files."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sparklab.errors import RecipeError
from sparklab.recipes.plan import TimingModel, build_plan, estimate_seconds
from sparklab.recipes.schema import recipes_dir

SWEEPS = recipes_dir() / "sweeps"


def test_seed_000_loads_the_model_four_times_not_eight() -> None:
    plan = build_plan(SWEEPS / "seed000.yaml")
    assert [s.label for s in plan.servers] == ["vllm/none", "vllm/mtp K=3", "vllm/dflash K=3", "vllm/dspark K=3"]
    # repeats: auto plans up to 5 runs per load (fewer run when the interval is tight)
    assert [(c.concurrency, c.requests) for c in plan.servers[0].cells] == [(1, 10)] * 5 + [(8, 80)] * 5
    assert len(plan.cells) == 40
    # Each server's argv is the seed command (the planner renders through the same code as `sparklab up`).
    assert "--speculative_config.moe_backend" in plan.servers[1].spec.argv
    assert plan.servers[0].spec.labels["sparklab.mode"] == "sweep"


def test_k_is_a_server_axis_but_a_baseline_has_no_k() -> None:
    plan = build_plan(SWEEPS / "seed002.yaml")
    assert [s.label for s in plan.servers] == ["vllm/none", "vllm/dspark K=3", "vllm/dspark K=8", "sglang/none",
                                               "sglang/dspark K=3"]  # sglang K=8 excluded by the file
    k8 = plan.servers[2].spec.argv
    assert k8[k8.index("--speculative_config.num_speculative_tokens") + 1] == "8"


def test_ids_are_stable_and_distinct() -> None:
    a, b = build_plan(SWEEPS / "cpu-demo.yaml"), build_plan(SWEEPS / "cpu-demo.yaml", run_id="other")
    assert [c.id for c in a.cells] == [c.id for c in b.cells]  # the run id is not part of a cell's identity
    # vLLM: 5 servers x 2 concurrencies x 3 repeats; llama.cpp: 2 servers x C=1 x 3 repeats
    assert len({c.id for c in a.cells}) == len(a.cells) == 36
    assert len({s.id for s in a.servers}) == 7


def test_an_engine_without_a_method_is_excluded_for_it_not_an_error() -> None:
    plan = build_plan(SWEEPS / "cpu-demo.yaml")  # llama.cpp has no ngram: excluded for it by the file
    assert [s.label for s in plan.servers if s.engine == "llamacpp-cpu"] == ["llamacpp-cpu/none",
                                                                             "llamacpp-cpu/draft_model K=3"]
    assert {c.concurrency for s in plan.servers if s.engine == "llamacpp-cpu" for c in s.cells} == {1}
    llama = next(s for s in plan.servers if s.engine == "llamacpp-cpu")
    assert llama.spec.argv[llama.spec.argv.index("--model") + 1].endswith(".Q4_1.gguf")  # its own model
    assert llama.spec.env["LLAMA_ARG_CACHE_RAM"] == "0"  # a sweep's prefix-cache reset is whole


def _write(tmp_path: Path, doc: dict) -> Path:
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


BASE = {"name": "t", "recipe": "cpu", "methods": ["none", "ngram"], "num_speculative_tokens": [1, 2],
        "concurrency": [1, 4], "requests": 4}


def test_exclusions_and_overrides(tmp_path: Path) -> None:
    doc = {**BASE, "exclude": [{"method": "ngram", "num_speculative_tokens": 2}, {"concurrency": 4,
                                                                                  "method": "none"}],
           "overrides": [{"match": {"method": "ngram"}, "set": ["prompt_lookup_max=2"],
                          "serve_args": ["--max-num-seqs=4"]}]}
    plan = build_plan(_write(tmp_path, doc))
    assert [s.label for s in plan.servers] == ["vllm-cpu/none", "vllm-cpu/ngram K=1"]
    assert [c.concurrency for c in plan.servers[0].cells] == [1]
    argv = plan.servers[1].spec.argv
    assert argv[argv.index("--speculative_config.prompt_lookup_max") + 1] == "2" and "--max-num-seqs=4" in argv


def test_a_change_of_settings_makes_new_cells(tmp_path: Path) -> None:
    before = build_plan(_write(tmp_path, BASE))
    after = build_plan(_write(tmp_path, {**BASE, "requests": 5}))
    assert {c.id for c in before.cells}.isdisjoint(c.id for c in after.cells)


@pytest.mark.parametrize(("change", "message"), [
    ({"methods": ["none", "mtp"]}, r"methods\[1\]: engine 'vllm-cpu' of .* has no method 'mtp'"),
    ({"concurrency": ["one"]}, r"concurrency\[0\]"),
    ({"workload": ["seed"]}, r"workload: unknown key"),
    ({"engines": ["sglang"]}, r"engines\[0\]: 'sglang' is not an engine"),
    ({"requests": {1: 4}}, r"no request count for concurrency 4"),
    ({"exclude": [{"method": "none"}, {"method": "ngram"}]}, r"the matrix is empty"),
])
def test_bad_sweep_files_name_the_key(tmp_path: Path, change: dict, message: str) -> None:
    with pytest.raises(RecipeError, match=message):
        build_plan(_write(tmp_path, {**BASE, **change}))


def test_eta_counts_startups_and_tokens() -> None:
    plan = build_plan(SWEEPS / "seed000.yaml")
    model = TimingModel(startup_s=100, teardown_s=0, tokens_per_s=100, batching=0)
    tokens = (10 + 2) * 2048 + (80 + 2) * 2048
    # repeats: auto costs at most auto_repeats.max (5) runs of every load
    assert estimate_seconds(plan, model) == pytest.approx(4 * (100 + 5 * tokens / 100))


def test_every_bundled_sweep_plans() -> None:
    for path in sorted(SWEEPS.glob("*.yaml")):
        assert build_plan(path).cells, path


def test_request_and_stall_timeouts_are_sweep_settings(tmp_path: Path) -> None:
    from sparklab.recipes.plan import SweepFile

    defaults = SweepFile.model_validate({k: v for k, v in BASE.items()})
    assert defaults.request_timeout_s == 1800 and defaults.stall_timeout_s == 60
    chosen = SweepFile.model_validate({**BASE, "request_timeout_s": 600, "stall_timeout_s": None})
    assert chosen.request_timeout_s == 600 and chosen.stall_timeout_s is None
    for bad in ({"request_timeout_s": 0}, {"stall_timeout_s": -1}):
        with pytest.raises(RecipeError, match=next(iter(bad))):
            build_plan(_write(tmp_path, {**BASE, **bad}))


def _axes_sweep(tmp_path: Path, sampling: dict) -> Path:
    path = tmp_path / "axes.yaml"
    path.write_text(yaml.safe_dump({"name": "axes", "recipe": "cpu", "methods": ["none", "ngram"],
                                    "num_speculative_tokens": [3], "concurrency": [1], "requests": 2,
                                    "workloads": ["seed"], "sampling": sampling}))
    return path


def test_max_tokens_and_temperature_are_load_axes_on_the_same_server(tmp_path: Path) -> None:
    """Seed 002 found the budget at which answers appear by trying budgets: each is a load, not a server."""
    plan = build_plan(_axes_sweep(tmp_path, {"max_tokens": [4096, 16000], "temperature": [0, 1.0]}))
    assert [s.label for s in plan.servers] == ["vllm-cpu/none", "vllm-cpu/ngram K=3"]
    cells = plan.servers[0].cells
    assert [(c.sampling["temperature"], c.sampling["max_tokens"]) for c in cells] == [
        (0.0, 4096), (0.0, 16000), (1.0, 4096), (1.0, 16000)]
    assert len({c.id for c in plan.cells}) == 8
    assert plan.sweep.sampling.varying() == ("temperature", "max_tokens")
    model = TimingModel(tokens_per_s=100.0, startup_s=0.0, teardown_s=0.0, batching=0.0)
    assert estimate_seconds(plan, model) == pytest.approx(2 * 2 * (2 + 2) * (4096 + 16000) / 100.0)


def test_one_value_keeps_the_cell_ids_it_had(tmp_path: Path) -> None:
    """A sweep that lists nothing plans exactly as before: its resumed runs find their cells."""
    one = build_plan(_axes_sweep(tmp_path, {"max_tokens": 64, "temperature": 0}))
    listed = build_plan(_axes_sweep(tmp_path, {"max_tokens": [64], "temperature": [0]}))
    assert [c.sampling for c in one.cells] == [one.sweep.sampling.model_dump()] * 2
    assert [c.id for c in listed.cells] == [c.id for c in one.cells]  # a list of one value is that value


@pytest.mark.parametrize(("sampling", "where"), [
    ({"max_tokens": [64, 0]}, r"sampling\.max_tokens\[1\]: .*greater than or equal to 1"),
    ({"max_tokens": [64, 64]}, r"sampling\.max_tokens: .*each value once"),
    ({"max_tokens": []}, r"sampling\.max_tokens: .*at least one"),
    ({"temperature": [0, -1]}, r"sampling\.temperature\[1\]: .*greater than or equal to 0"),
    ({"top_p": [0.5, 0]}, r"sampling\.top_p\[1\]: .*greater than 0"),
    ({"seed": [1, 2]}, r"sampling\.seed: "),
])
def test_a_bad_axis_names_the_file_and_the_value(tmp_path: Path, sampling: dict, where: str) -> None:
    path = _axes_sweep(tmp_path, sampling)
    with pytest.raises(RecipeError, match=rf"{path}: {where}"):
        build_plan(path)
