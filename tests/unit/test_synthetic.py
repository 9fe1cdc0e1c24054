"""Synthetic rejection sampling (issue 25 §1): the CPU port of vLLM 0.27.1's kernels (docker/vllm-cpu-synthetic),
the recipe's profile sliced to K, the settings vLLM would refuse caught before launch, and the adapter reading the
profile back from a stored argv."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import yaml

from sparklab.cli.main import main
from sparklab.engines import engine
from sparklab.errors import RecipeError
from sparklab.recipes.plan import build_plan
from sparklab.recipes.render import LaunchOptions, render
from sparklab.recipes.schema import load_recipe, recipes_dir

ROOT = Path(__file__).resolve().parents[2]
PLACEHOLDER = -1


def port() -> ModuleType:
    spec = importlib.util.spec_from_file_location("cpu_synthetic", ROOT / "docker/vllm-cpu-synthetic/cpu_synthetic.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_greedy_port_keeps_drafts_while_the_draw_is_under_the_conditional_rate() -> None:
    # two requests, 3 and 2 drafts; vLLM's conditional rates for unconditional [0.9, 0.45, 0.0]: [0.9, 0.5, 0.0]
    out = np.full((2, 4), PLACEHOLDER)
    cu = np.array([3, 5])
    drafts = np.array([11, 12, 13, 21, 22])
    argmax = np.array([101, 102, 103, 201, 202])
    bonus = np.array([[900], [901]])
    uniform = np.array([0.1, 0.4, 0.0, 0.1, 0.7])  # request 0: kept, kept (0.4 < 0.5), rejected (rate 0)
    rates = np.array([0.9, 0.5, 0.0])
    port().greedy(out, cu, drafts, argmax, bonus, None, uniform, rates)
    assert out[0].tolist() == [11, 12, 103, PLACEHOLDER]  # the target's token where the draw failed, then stop
    assert out[1].tolist() == [21, 202, PLACEHOLDER, PLACEHOLDER]  # 0.7 >= 0.5 at position 2
    every = np.full((1, 3), PLACEHOLDER)
    port().greedy(every, np.array([2]), np.array([5, 6]), np.array([7, 8]), np.array([[9]]), None,
                  np.array([0.0, 0.0]), np.array([1.0, 1.0]))
    assert every[0].tolist() == [5, 6, 9]  # all kept: the bonus token follows


def test_the_greedy_port_rejects_padding_and_skips_sampled_requests() -> None:
    out = np.full((2, 3), PLACEHOLDER)
    port().greedy(out, np.array([2, 4]), np.array([-1, 3, 4, 5]), np.array([70, 71, 72, 73]), np.array([[8], [9]]),
                  np.array([True, False]), np.array([0.0, 0.0, 0.0, 0.0]), np.array([1.0, 1.0]))
    assert out[0].tolist() == [70, PLACEHOLDER, PLACEHOLDER]  # padding (-1) is never accepted
    assert out[1].tolist() == [PLACEHOLDER] * 3  # not greedy: the random kernel's


def test_the_random_port_takes_the_recovered_token_where_the_draw_fails() -> None:
    out = np.full((1, 3), PLACEHOLDER)
    port().random(out, np.array([2]), np.array([3, 4]), np.array([[9]]), np.array([30, 40]), np.array([0.2, 0.8]),
                  np.array([False]), np.array([0.5, 0.5]))
    assert out[0].tolist() == [3, 40, PLACEHOLDER]


def test_the_port_is_switched_by_its_variable(monkeypatch) -> None:
    module = port()
    monkeypatch.delenv(module.SWITCH, raising=False)
    assert not module.enabled()
    monkeypatch.setenv(module.SWITCH, "1")
    assert module.enabled()


def _spec(k: int, sets: list[str] | None = None, engine_name: str = "vllm-cpu-synthetic", extra: tuple = ()):
    recipe = load_recipe(recipes_dir() / "cpu.yaml", sets)
    method = "synthetic" if engine_name == "vllm-cpu-synthetic" else "ngram"
    return render(recipe, engine_name, method, LaunchOptions(num_speculative_tokens=k, extra_args=extra)), recipe


def test_the_recipe_slices_its_profile_to_k_and_the_adapter_reads_it_back() -> None:
    vllm = engine("vllm")
    for k in range(1, 9):
        spec, recipe = _spec(k)
        assert not [f for f in vllm.check_spec(spec, recipe) if f.level == "error"]
        rates = vllm.synthetic_acceptance(spec.argv)
        assert rates is not None and len(rates) == k and rates[0] == pytest.approx(0.867)
    plain, _ = _spec(3, engine_name="vllm-cpu")
    assert vllm.synthetic_acceptance(plain.argv) is None
    by_length = ["--speculative_config.rejection_sample_method", "synthetic",
                 "--speculative_config.synthetic_acceptance_length", "2.5"]
    spec, _ = _spec(3, engine_name="vllm-cpu", extra=tuple(by_length))
    # vLLM's own schedule (vllm/config/speculative.py:239-247): 1.5 accepted drafts = [1, 0.5, 0]
    assert vllm.synthetic_acceptance(spec.argv) == (1.0, 0.5, 0.0)


@pytest.mark.parametrize(("sets", "extra", "message"), [
    (["synthetic_acceptance_rates=[0.9, 0.5]"], (), "has 2 entries for num_speculative_tokens 3"),
    (["synthetic_acceptance_rates=[0.5, 0.9, 0.1]"], (), "must not increase"),
    (["synthetic_acceptance_rates=[1.5, 0.9, 0.1]"], (), "a list of numbers in [0, 1]"),
    (None, ("--speculative_config.synthetic_acceptance_length", "2"), "exactly one of"),
    (["engines.vllm-cpu-synthetic.env.SPARKLAB_VLLM_CPU_SYNTHETIC=\"0\""], (), "does not run on vLLM 0.27.1's CPU build"),
])
def test_settings_vllm_would_refuse_are_caught_before_launch(sets, extra, message) -> None:
    spec, recipe = _spec(3, sets, extra=extra)
    errors = [f for f in engine("vllm").check_spec(spec, recipe) if f.level == "error"]
    assert any(message in f.message for f in errors), [f.message for f in errors]


def test_synthetic_rates_without_synthetic_sampling_are_refused_and_a_gpu_image_may_run_it() -> None:
    stray = ("--speculative_config.synthetic_acceptance_rates", "[0.5, 0.2, 0.1]")
    spec, recipe = _spec(3, engine_name="vllm-cpu", extra=stray)
    assert any("rejection_sample_method is not synthetic" in f.message for f in engine("vllm").check_spec(spec, recipe))
    gb10 = load_recipe(recipes_dir() / "gb10.yaml")
    gpu = render(gb10, "vllm", "dspark", LaunchOptions(extra_args=(
        "--speculative_config.rejection_sample_method", "synthetic",
        "--speculative_config.synthetic_acceptance_length", "3")))
    assert not [f for f in engine("vllm").check_spec(gpu, gb10) if "synthetic" in f.message]


def _sweep(tmp_path: Path, workloads: list[str], **more: object) -> Path:
    """cpu-tune-steep (synthetic acceptance on the CPU engine) with other workloads and two K."""
    doc = yaml.safe_load((recipes_dir() / "sweeps" / "cpu-tune-steep.yaml").read_text())
    doc.update(workloads=workloads, num_speculative_tokens=[1, 2], **more)
    path = tmp_path / "synthetic-tools.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.parametrize(("workload", "prompt"), [("agent", "agent-required-runaway"),
                                                  ("toolcall-probe", "tools-required")])
def test_synthetic_acceptance_with_a_grammar_constrained_request_is_refused_before_any_start(
        tmp_path: Path, workload: str, prompt: str) -> None:
    # vLLM 0.27.1 accepted drafts its grammar forbids and terminated the request (engine log, README): a sweep
    # pairing the two would lose that cell on every synthetic server, after each one's model load.
    path = _sweep(tmp_path, ["seed", workload])
    with pytest.raises(RecipeError) as info:
        build_plan(path)
    message = info.value.message
    assert message.startswith(f"{path}: workloads[1]: {workload!r}"), message
    assert prompt in message and 'tool_choice "required"' in message, message
    assert "synthetic" in message and "vllm-cpu-synthetic" in message, message
    assert f"workload: {workload}" in (info.value.hint or ""), info.value.hint


def test_the_hint_excludes_the_pair_and_the_baseline_keeps_the_workload(tmp_path: Path) -> None:
    path = _sweep(tmp_path, ["seed", "agent"], exclude=[{"method": "synthetic", "workload": "agent"}])
    plan = build_plan(path)
    by_method = {(s.method, c.workload) for s in plan.servers for c in s.cells}
    assert ("none", "agent") in by_method and ("synthetic", "seed") in by_method
    assert ("synthetic", "agent") not in by_method


def test_tool_choice_auto_is_not_grammar_constrained(tmp_path: Path) -> None:
    # vLLM 0.27.1 builds a JSON schema from the tools only for "required" or a named function
    # (vllm/tool_parsers/utils.py:380-420); "auto" leaves the answer free, so synthetic acceptance may run it.
    suite = tmp_path / "auto-only.yaml"
    suite.write_text(yaml.safe_dump({
        "name": "auto-only", "description": "one tool question, tool_choice auto", "kind": "agent",
        "toolsets": {"weather": {"get_weather": ["Weather for a city.", {"city": "string"}]}},
        "tasks": [{"id": "weather", "prompt": "Weather in Oslo?", "tools": "weather", "tool_choice": "auto",
                   "expect": {"tool": "get_weather"}}]}))
    plan = build_plan(_sweep(tmp_path, [str(suite)]))
    assert any(s.method == "synthetic" for s in plan.servers)


@pytest.mark.parametrize(("extra", "why"), [
    ({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "required"},
     'tool_choice "required"'),
    ({"tools": [{"type": "function", "function": {"name": "f"}}],
      "tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice naming function 'f'"),
    ({"response_format": {"type": "json_object"}}, 'response_format "json_object"'),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}},
     'response_format "json_schema"'),
    ({"structured_outputs": {"regex": "a+"}}, "structured_outputs"),
])
def test_every_request_field_that_makes_vllm_constrain_the_answer_is_named(extra: dict[str, object],
                                                                           why: str) -> None:
    vllm = engine("vllm")
    argv = ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3, '
            '"rejection_sample_method": "synthetic", "synthetic_acceptance_rates": [0.5, 0.2]}']
    reason = vllm.request_conflict(argv, extra)
    assert reason is not None and why in reason, reason
    assert vllm.request_conflict(argv, {"tools": extra.get("tools", []), "tool_choice": "auto"}) is None
    assert vllm.request_conflict(argv, {"response_format": {"type": "text"}}) is None
    plain = ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3}']
    assert vllm.request_conflict(plain, extra) is None  # real rejection sampling verifies against the grammar
    assert engine("llamacpp").request_conflict(argv, extra) is None


@pytest.mark.parametrize("dry", [True, False])
def test_tune_refuses_the_pairing_naming_the_users_file_and_leaves_no_run_behind(tmp_path: Path, capsys,
                                                                                  dry: bool) -> None:
    path = _sweep(tmp_path, ["seed", "agent"])
    runs = tmp_path / "runs"
    code = main(["tune", str(path), "--workload", "agent", "--runs-dir", str(runs), *(["--dry-run"] if dry else [])])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith(f"error: tune {path} (the space it searches): workloads[0]: 'agent': prompt "
                          "'agent-required-runaway'"), err
    assert "Traceback" not in err and "tune.yaml" not in err, err
    assert not runs.exists() or not any(runs.iterdir())  # no run directory made for a space that cannot run
