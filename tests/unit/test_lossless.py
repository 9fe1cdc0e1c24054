"""The lossless check's parts: vLLM scoring over HTTP, lossy settings read from argv, engines that cannot score,
and the report's verdicts from stored scores."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sparklab import report
from sparklab.engines import engine
from sparklab.engines.api import EngineAPI
from sparklab.engines.base import ScoringError
from sparklab.report import lossless
from sparklab.sweep.store import Store
from sparklab.sweep.store_rows import PlannedCell, Score
from tests.scripted_server import Scripted


def _scripted(reply: Any) -> Scripted:
    return Scripted(lambda body: [(0.0, reply(body))])


def test_vllm_scores_the_answer_tokens_after_the_templated_prompt() -> None:
    seen: list[dict[str, Any]] = []

    def reply(body: dict[str, Any]) -> dict[str, Any]:
        seen.append(body)
        if "messages" in body:
            return {"tokens": [1, 2, 3], "count": 3}
        return {"choices": [{"prompt_logprobs": [None, {"2": {"logprob": -0.1}}, {"3": {"logprob": -0.2}},
                                                 {"7": {"logprob": -1.5, "rank": 3}, "9": {"logprob": -0.3}},
                                                 {"8": {"logprob": -2.0}}]}]}

    server = _scripted(reply)
    try:
        total = engine("vllm").score_answer(EngineAPI(server.root), "m", [{"role": "user", "content": "hi"}],
                                            {"tools": [{"type": "function"}], "tool_choice": "auto"},
                                            {"enable_thinking": False}, [7, 8])
    finally:
        server.close()
    assert total == pytest.approx(-3.5)  # the answer's own tokens (7, 8), not the prompt's, not the top pick (9)
    tokenize, completion = seen
    assert tokenize == {"model": "m", "messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": True,
                        "tools": [{"type": "function"}], "chat_template_kwargs": {"enable_thinking": False}}
    assert completion == {"model": "m", "prompt": [1, 2, 3, 7, 8], "max_tokens": 1, "prompt_logprobs": 0,
                          "temperature": 0}


@pytest.mark.parametrize(("reply", "status", "said"), [
    (lambda b: {"tokens": [1]} if "messages" in b else {"error": "too long"}, 200, "prompt log-probabilities"),
    (lambda b: {"detail": "nope"}, 400, "/tokenize answered HTTP 400"),
    (lambda b: {"count": 1}, 200, "/tokenize gave no token ids"),
    (lambda b: {"tokens": [1]} if "messages" in b else {"choices": [{"prompt_logprobs": [None, {"5": {}}]}]}, 200,
     "no log-probability for token 4"),
])
def test_a_scoring_failure_is_one_line_of_reason(reply: Any, status: int, said: str) -> None:
    server = _scripted(reply)
    server.status = status
    try:
        with pytest.raises(ScoringError, match=said):
            engine("vllm").score_answer(EngineAPI(server.root), "m", [{"role": "user", "content": "x"}], None, None,
                                        [4])
    finally:
        server.close()


def test_synthetic_rejection_sampling_is_lossy_by_design() -> None:
    vllm = engine("vllm")
    dotted = ["serve", "m", "--speculative_config.method", "draft_model", "--speculative_config.model", "m",
              "--speculative_config.num_speculative_tokens", "3", "--speculative_config.rejection_sample_method",
              "synthetic", "--speculative_config.synthetic_acceptance_length", "3"]
    (why,) = vllm.lossy_settings(dotted)
    assert "synthetic" in why and "vllm/config/speculative.py:217-237" in why
    as_json = ["serve", "m", "--speculative-config", json.dumps({"method": "ngram", "num_speculative_tokens": 3,
                                                                   "rejection_sample_method": "synthetic",
                                                                   "synthetic_acceptance_rates": [1, 1, 0]})]
    assert vllm.lossy_settings(as_json)
    assert vllm.lossy_settings(dotted[:8]) == []  # standard rejection sampling
    assert vllm.lossy_settings([*dotted[:8], "--speculative_config.rejection_sample_method", "block"]) == []


@pytest.mark.parametrize("kind", ["llamacpp", "sglang", "trtedge"])
def test_engines_that_cannot_score_say_why(kind: str) -> None:
    adapter = engine(kind)
    assert adapter.scoring_unsupported
    with pytest.raises(ScoringError):
        adapter.score_answer(EngineAPI("http://127.0.0.1:9"), "m", [], None, None, [1])
    assert engine("vllm").scoring_unsupported is None


# -- the report's verdict from stored scores --------------------------------------------------------------------


def _run(tmp_path: Path, kind: str, scores: dict[str, list[float]] | None, argv: list[str] | None = None,
         temperature: float = 1.0, defects: list[str] | None = None, speeds: dict[str, float] | None = None) -> Path:
    """A run with none and ngram at C=1 on the seed workload: 2 repeats x 4 prompts; scores per method, one
    log-likelihood per token per answer (None: no score stored); `speeds`: tok/s per method (else 1)."""
    path = tmp_path / "run" / "results.sqlite"
    sampling = {"max_tokens": 64, "temperature": temperature, "top_p": 0.95}
    with Store.create(path, {"name": "t", "sampling": sampling, "lossless": {"alpha": 0.05}}, "test") as store:
        for method in ("none", "ngram"):
            store.add_server_config(method, engine="e", method=method, k=None if method == "none" else 3,
                                    config={"recipe": "cpu", "kind": kind,
                                            **({"sampling_defects": defects} if defects and method == "ngram" else {})},
                                    argv=argv if method == "ngram" and argv
                                    else [], image="img")
            for repeat in range(2):
                cell = f"{method}-{repeat}"
                store.add_cells([PlannedCell(cell, method, 1, "seed", repeat, {"sampling": sampling})])
                store.start_cell(cell)
                answers = [{"index": i, "prompt_id": f"seed-{i}", "warmup": False, "ok": True, "token_ids": [1] * 10,
                            "ids_len": 10, "text_len": 5, "finish_reason": "stop"} for i in range(4)]
                speed = (speeds or {}).get(method, 1.0) * (1 + 0.01 * repeat)
                summary = {"requests": {"measured": 4, "ok": 4, "failed": 0},
                           "per_request_tps": {"n": 4, "mean": speed}}
                store.finish_cell(cell, summary, {"summary": summary, "outputs": answers})
                if scores is not None:
                    values = scores[method][repeat * 4:(repeat + 1) * 4]
                    store.add_scores(Score(cell, i, "none", "scored", 10, 10 * v) for i, v in enumerate(values))
    return path


def _results(path: Path) -> list[lossless.Lossless]:
    with Store.open(path, readonly=True) as store:
        return list(report.build(store, "run").lossless)


BASE = [-2.0, -1.0, -3.0, -1.5, -2.2, -0.9, -3.1, -1.4]


def test_a_sample_like_the_baseline_is_consistent_with_lossless(tmp_path: Path) -> None:
    near = [v + d for v, d in zip(BASE, [0.1, -0.05, 0.0, 0.08, -0.1, 0.02, 0.05, -0.07], strict=True)]
    (r,) = _results(_run(tmp_path, "vllm", {"none": BASE, "ngram": near}))
    assert r.checked and not r.flagged and lossless.verdict(r) == "consistent with lossless"
    assert r.answers == r.baseline_answers == 8 and r.sampling == "temperature 1, top_p 0.95, max_tokens 64"
    assert r.logprob is not None and r.logprob.low < 0 < r.logprob.high


def test_a_more_likely_sample_is_flagged_even_when_prompts_differ_a_lot(tmp_path: Path) -> None:
    """Drafts accepted without the target's test (greedy drafts) are more likely than the target's own samples;
    centring on the task keeps the prompts' spread (here 2 nats) from hiding a 0.5-nat shift."""
    shifted = [v + 0.5 + d for v, d in zip(BASE, [0.03, -0.02, 0.01, 0.0, -0.03, 0.02, 0.0, -0.01], strict=True)]
    (r,) = _results(_run(tmp_path, "vllm", {"none": BASE, "ngram": shifted}))
    assert r.flagged and "log-likelihood per token differs: +0.5" in r.flagged[0]
    assert lossless.verdict(r).startswith("LOSSY")


def test_a_config_the_lossless_check_flags_is_never_named_best(tmp_path: Path) -> None:
    """Its sampled answers are not the target's: a faster wrong model. The pick is none, and the row says which
    faster config it passed over and why; with the same speeds and a lossless sample, ngram is the pick."""
    shifted = [v + 0.5 + d for v, d in zip(BASE, [0.03, -0.02, 0.01, 0.0, -0.03, 0.02, 0.0, -0.01], strict=True)]
    path = _run(tmp_path, "vllm", {"none": BASE, "ngram": shifted}, speeds={"none": 20.0, "ngram": 30.0})
    with Store.open(path, readonly=True) as store:
        built = report.build(store, "run")
    (best,) = built.best
    assert best.group.server.method == "none" and [g.server.method for g in best.lossy] == ["ngram"]
    text = report.render(built, "md")
    assert ("scored above it but its sampled answers are not the target's (lossless check), so never named best: "
            "e ngram K=3") in text
    assert json.loads(report.render(built, "json"))["best"][0]["lossy"] == ["e ngram K=3"]
    near = [v + d for v, d in zip(BASE, [0.1, -0.05, 0.0, 0.08, -0.1, 0.02, 0.05, -0.07], strict=True)]
    path = _run(tmp_path / "lossless", "vllm", {"none": BASE, "ngram": near}, speeds={"none": 20.0, "ngram": 30.0})
    with Store.open(path, readonly=True) as store:
        (best,) = report.build(store, "run").best
    assert best.group.server.method == "ngram" and not best.lossy


def test_declared_lossy_is_flagged_without_a_test(tmp_path: Path) -> None:
    argv = ["serve", "m", "--speculative_config.method", "ngram", "--speculative_config.num_speculative_tokens", "3",
            "--speculative_config.rejection_sample_method", "synthetic",
            "--speculative_config.synthetic_acceptance_length", "2"]
    path = _run(tmp_path, "vllm", None, argv)
    (r,) = _results(path)
    assert r.declared and not r.checked and lossless.verdict(r).startswith("lossy by design")
    with Store.open(path, readonly=True) as store:
        text = report.render(report.build(store, "run"), "md")
    assert "lossless at temperature > 0: 1 warning(s)" in text and "lossy by design: speculative_config" in text


def test_an_engine_that_cannot_score_is_not_checkable_with_its_reason(tmp_path: Path) -> None:
    (r,) = _results(_run(tmp_path, "llamacpp", None))
    assert not r.checked and "not checkable: llama.cpp" in r.reason and "#27174" in r.reason
    (r,) = _results(_run(tmp_path / "v", "vllm", None))
    assert "the scoring server did not run" in r.reason


def test_greedy_runs_are_left_to_the_equality_check(tmp_path: Path) -> None:
    path = _run(tmp_path, "vllm", None, temperature=0.0)
    assert _results(path) == []
    with Store.open(path, readonly=True) as store:
        text = report.render(report.build(store, "run"), "md")
    assert "lossless at temperature > 0: not checked (no drafting config ran at temperature > 0)" in text


def test_unscorable_answers_give_the_common_reason(tmp_path: Path) -> None:
    path = _run(tmp_path, "vllm", None)
    with Store.open(path) as store:
        store.add_scores(Score(c.id, i, "none", "unscorable", None, None, "/tokenize answered HTTP 400: too long")
                         for c in store.cells() for i in range(4))
    (r,) = _results(path)
    assert r.reason == "not checkable: 16 answer(s) could not be scored (/tokenize answered HTTP 400: too long)"




def test_synthetic_on_the_cpu_build_is_refused_before_launch() -> None:
    """vLLM 0.27.1's CPU rejection kernels assert synthetic mode away (vllm/utils/cpu_triton_utils.py:348, :387):
    measured, the engine became ready and its core died on the first request. A GPU server may run it."""
    from sparklab.recipes.render import LaunchOptions, render
    from sparklab.recipes.schema import load_recipe, recipes_dir

    synthetic = ("--speculative_config.rejection_sample_method", "synthetic",
                 "--speculative_config.synthetic_acceptance_length", "3")
    recipe = load_recipe(recipes_dir() / "cpu.yaml")
    spec = render(recipe, "vllm-cpu", "draft_model", LaunchOptions(extra_args=synthetic))
    (error,) = [f for f in engine("vllm").check_spec(spec, recipe) if f.level == "error"]
    assert "does not run on vLLM 0.27.1's CPU build" in error.message and "cpu_triton_utils.py:348" in error.message
    gb10 = load_recipe(recipes_dir() / "gb10.yaml")
    gpu = render(gb10, "vllm", "dspark", LaunchOptions(extra_args=synthetic))
    assert not [f for f in engine("vllm").check_spec(gpu, gb10) if "CPU build" in f.message]


def test_drafting_on_the_stock_cpu_build_warns_that_it_samples_garbage_above_temperature_0() -> None:
    """vLLM 0.27.1's (and 0.32.0's) CPU expand kernel never writes the float temperature and top_p it expands for
    drafted tokens (vllm/utils/cpu_triton_utils.py:408-422): measured on this machine, ngram at temperature 1 was
    -4.07 [-4.53, -3.61] nats per token against none (p 4e-22), and +0.13 [-0.27, +0.53] with the kernel fixed. A
    warning (not an error: temperature 0 is exact) on a CPU server that drafts, unless the image's fix is on; none
    on a plain CPU server, on the fixed engine, or on a GPU server."""
    from sparklab.recipes.render import LaunchOptions, render
    from sparklab.recipes.schema import load_recipe, recipes_dir

    recipe = load_recipe(recipes_dir() / "cpu.yaml")

    def said(engine_name: str, method: str, r=recipe) -> list[tuple[str, str]]:
        spec = render(r, engine_name, method, LaunchOptions())
        return [(f.level, f.message + " " + f.hint) for f in engine("vllm").check_spec(spec, r)
                if "temperature" in f.message]

    for method in ("ngram", "draft_model"):
        (found,) = said("vllm-cpu", method)
        assert found[0] == "warning" and "cpu_triton_utils.py:408-422" in found[1], found
        assert "temperature 0" in found[1] and "SPARKLAB_VLLM_CPU_EXPAND_FIX" in found[1], found
    assert said("vllm-cpu", "none") == [] and said("vllm-cpu-synthetic", "ngram") == []
    assert said("vllm-cpu-synthetic", "draft_model") == []  # the fixed kernel drafts from a model too
    gb10 = load_recipe(recipes_dir() / "gb10.yaml")
    assert said("vllm", "dspark", gb10) == []


def test_the_cpu_builds_known_deaths_are_explained() -> None:
    vllm = engine("vllm")
    said = vllm.explain_failure("RuntimeError: Worker failed with error 'Synthetic acceptance not supported with CPU "
                                "sampling', please check the stack trace above")
    assert said and "GPU image" in said
    compiler = vllm.explain_failure("InvalidCxxCompiler: No working C++ compiler found in "
                                    "torch._inductor.config.cpp.cxx: (None, 'g++')")
    assert compiler and "TORCHDYNAMO_DISABLE=1" in compiler


def test_the_very_same_samples_are_consistent_with_lossless(tmp_path: Path) -> None:
    """Two plain vLLM servers with the same default seed sample the same answers to the same requests (measured on
    the CPU build): no spread to test, and nothing to flag."""
    (r,) = _results(_run(tmp_path, "vllm", {"none": BASE, "ngram": BASE}))
    assert r.identical and r.checked and not r.flagged
    assert lossless.verdict(r).startswith("consistent with lossless: the same samples as none")


def test_every_cpu_vllm_engine_samples_at_temperature_above_zero_without_a_compiler() -> None:
    """The vllm-cpu-synthetic engine replaced vllm-cpu's env (its own SPARKLAB_VLLM_CPU_SYNTHETIC) and lost
    TORCHDYNAMO_DISABLE: its first temperature-1.0 request (a sampled sweep, the lossless check's scoring) would
    have died of InvalidCxxCompiler, the image having no compiler."""
    from sparklab.recipes.schema import load_recipe, recipes_dir

    recipe = load_recipe(recipes_dir() / "cpu.yaml")
    vllm = [name for name, spec in recipe.engines.items() if spec.kind == "vllm"]
    assert len(vllm) >= 2
    for name in vllm:
        assert recipe.engines[name].env.get("TORCHDYNAMO_DISABLE") == "1", name


DEFECT = ("drafting on vLLM's CPU build samples drafted tokens at temperature > 0 with garbage temperature and top_p "
          "(vllm/utils/cpu_triton_utils.py:408-422 in 0.27.1)")


@pytest.mark.parametrize("shift", [0.5, 0.0], ids=["flagged", "not flagged"])
def test_a_known_engine_defect_is_named_beside_the_verdict(tmp_path: Path, shift: float) -> None:
    """The engine adapter knew at plan time that this server's sampling at temperature > 0 is broken (vLLM's CPU
    expand kernel): the report names that cause where the check flags the config, and warns where it did not (too
    few answers to see it is no proof of the opposite); the JSON export carries it per group."""
    ngram = [v + shift + d for v, d in zip(BASE, [0.03, -0.02, 0.01, 0.0, -0.03, 0.02, 0.0, -0.01], strict=True)]
    path = _run(tmp_path, "vllm", {"none": BASE, "ngram": ngram}, defects=[DEFECT])
    (r,) = _results(path)
    assert r.known == (DEFECT,) and bool(r.flagged) == bool(shift)
    with Store.open(path, readonly=True) as store:
        built = report.build(store, "run")
    (finding,) = lossless.check(built).findings
    assert DEFECT in finding and "known engine defect" in finding, finding
    assert finding.startswith("e ngram K=3") and (("differs" in finding) == bool(shift)), finding
    text = report.render(built, "md")
    assert "Known engine defects at temperature > 0" in text and DEFECT in text
    exported = json.loads(report.render(built, "json"))
    (group,) = [g for g in exported["groups"] if g["method"] == "ngram"]
    assert group["sampling_defects"] == [DEFECT]


def test_a_run_without_a_known_defect_says_nothing_of_one(tmp_path: Path) -> None:
    (r,) = _results(_run(tmp_path, "vllm", {"none": BASE, "ngram": BASE}))
    assert r.known == ()


def test_the_plan_stores_the_engines_known_sampling_defects_per_server(tmp_path: Path) -> None:
    """vLLM on CPU drafting without the fixed expand kernel: the defect is stored with the server config at plan
    time (so a report of the run names it, whatever image runs later); none, the fixed engine and GB10 have none."""
    import yaml

    from sparklab.recipes.plan import build_plan
    from sparklab.sweep import runner

    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({"name": "t", "recipe": "cpu", "engines": ["vllm-cpu", "vllm-cpu-synthetic"],
                                    "methods": ["none", "ngram"], "num_speculative_tokens": [3],
                                    "concurrency": [1]}))
    plan = build_plan(path, run_id="t-1")
    with Store.create(tmp_path / "results.sqlite", plan.sweep.model_dump(), "test") as store:
        runner.register(plan, store)
        stored = {(r.engine, r.method): r.config.get("sampling_defects") for r in store.server_configs()}
    (defect,) = stored[("vllm-cpu", "ngram")]
    assert "cpu_triton_utils.py:408-422" in defect and "temperature > 0" in defect
    assert stored[("vllm-cpu", "none")] == [] and stored[("vllm-cpu-synthetic", "ngram")] == []
    assert stored[("vllm-cpu-synthetic", "none")] == []


def test_the_check_is_computed_once_when_the_report_is_built_not_again_per_format(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The report's sections, checks and exports read the verdicts `build` made (Report.lossless): two Welch tests per
    checked config (log-likelihood, length), however many formats are written."""
    near = [v + d for v, d in zip(BASE, [0.1, -0.05, 0.0, 0.08, -0.1, 0.02, 0.05, -0.07], strict=True)]
    path = _run(tmp_path, "vllm", {"none": BASE, "ngram": near})
    tests: list[int] = []
    counted = lossless.two_sample

    def counting(*args: Any) -> Any:
        tests.append(1)
        return counted(*args)

    monkeypatch.setattr(lossless, "two_sample", counting)
    with Store.open(path, readonly=True) as store:
        built = report.build(store, "run")
    assert len(tests) == 2
    written = report.write_all(built, tmp_path / "out")
    assert {p.name for p in written} >= {"report.md", "report.csv", "report.json", "report.html"}
    assert len(tests) == 2
    assert "consistent with lossless" in (tmp_path / "out" / "report.md").read_text()
    (found,) = built.lossless
    assert json.loads((tmp_path / "out" / "report.json").read_text())["groups"][1]["lossless"] == lossless.verdict(found)
