"""The checks that protect a report's verdict, on scripted runs: output equality against the baseline,
truncation and short answers, prefix-cache hits, sanity ceilings, mixed images."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sparklab import report
from sparklab.outputs import KEEP_TOKENS, compare, equality, kept
from sparklab.report.checks import run_checks
from sparklab.sweep.store import Store

Cellfn = Callable[[str, int | None, int, int], tuple[dict[str, Any], dict[str, Any]]]


def answer(prompt: str, ids: list[int] | None, text: str = "", index: int = 0, ok: bool = True) -> dict[str, Any]:
    return kept(index, prompt, False, ok, "length", text or " ".join(map(str, ids or [])), ids)


def _run(tmp_path: Path, make: Cellfn, sampling: str = "{max_tokens: 64, temperature: 0, ignore_eos: true}",
         methods: str = "[none, dspark]", concurrency: str = "[1]", repeats: int = 1,
         digest: Callable[[str, int], str] | None = None, extra: str = "", engines: str = "[vllm]",
         engine_digest: Callable[[str], str] | None = None) -> Path:
    """A seed000-like plan whose cells are finished with what `make(method, k, concurrency, repeat)` returns."""
    from sparklab.recipes.plan import build_plan
    from sparklab.sweep import runner as sweeper

    sweep_file = tmp_path / "fake.yaml"
    tmp_path.mkdir(parents=True, exist_ok=True)
    sweep_file.write_text(
        f"name: fake\nrecipe: gb10\nengines: {engines}\nmethods: {methods}\nnum_speculative_tokens: [3]\n"
        f"concurrency: {concurrency}\nrepeats: {repeats}\nrequests: 4\nsampling: {sampling}\n{extra}")
    plan = build_plan(sweep_file, run_id="fake")
    path = tmp_path / "fake-run" / "results.sqlite"
    with Store.create(path, plan.sweep.model_dump(), "test") as store:
        sweeper.register(plan, store)
        servers = {s.id: (s.method, s.k) for s in store.server_configs()}
        engine_of = {s.id: s.engine for s in store.server_configs()}
        for cell in store.cells():
            method, k = servers[cell.server_config_id]
            summary, result = make(method, k, cell.concurrency, cell.repeat)
            image = (engine_digest(engine_of[cell.server_config_id]) if engine_digest else
                     digest(method, cell.repeat) if digest else "sha256:aaa")
            store.finish_cell(cell.id, summary, {"summary": summary, **result}, image_digest=image)
    return path


def _build(path: Path) -> report.Report:
    with Store.open(path, readonly=True) as store:
        return report.build(store, path.parent.name)


def _findings(built: report.Report, name: str) -> tuple[str, ...]:
    (check,) = [c for c in run_checks(built) if c.name == name]
    return check.findings


ANSWERS = {f"seed-{i}": list(range(100 * i, 100 * i + 64)) for i in range(4)}


def _summary(**extra: Any) -> dict[str, Any]:
    return {"aggregate_tps": 10.0, "per_request_tps": {"mean": 10.0}, "tokens_per_request": 64.0,
            "finish_reasons": {"length": 4}, "requests": {"measured": 4, "ok": 4, "failed": 0}, **extra}


def _equal_cells(alter: dict[str, int] | None = None) -> Cellfn:
    """Each method answers ANSWERS; `alter[method] = position` changes that token of prompt seed-1's answer."""
    def make(method: str, k: int | None, c: int, repeat: int) -> tuple[dict[str, Any], dict[str, Any]]:
        outputs = []
        for i in range(4):
            ids = list(ANSWERS[f"seed-{i}"])
            if alter and method in alter and i == 1:
                ids[alter[method]] += 1
            outputs.append(answer(f"seed-{i}", ids, index=i))
        return _summary(), {"outputs": outputs}
    return make


# -- equality ----------------------------------------------------------------------------------------------


def test_identical_answers_pass_and_the_column_says_all_of_them() -> None:
    same = compare(answer("p", [1, 2, 3]), answer("p", [1, 2, 3]))
    assert same.identical and same.unit == "token"


def test_a_changed_token_is_found_at_its_position() -> None:
    diff = compare(answer("p", [1, 2, 3, 4]), answer("p", [1, 2, 9, 4]))
    assert not diff.identical and diff.first_diff == 2
    prefix = compare(answer("p", [1, 2, 3]), answer("p", [1, 2, 3, 4]))
    assert not prefix.identical and prefix.first_diff == 3


def test_text_is_compared_when_token_ids_are_missing() -> None:
    diff = compare(answer("p", None, "hello world"), answer("p", [5, 6], "hello there"))
    assert diff.unit == "character" and diff.first_diff == 6


def test_a_difference_beyond_the_kept_tokens_is_still_caught_by_the_digest() -> None:
    long = list(range(KEEP_TOKENS + 10))
    changed = [*long[:-1], -1]
    a, b = answer("p", long), answer("p", changed)
    assert len(a["token_ids"]) == KEEP_TOKENS  # bounded in the store
    diff = compare(a, b)
    assert not diff.identical and diff.first_diff is None and diff.at_least == KEEP_TOKENS


def test_temperature_above_zero_says_equality_cannot_be_checked() -> None:
    result = equality([answer("p", [1])], [answer("p", [2])], {"temperature": 0.7})
    assert result.status == "sampling" and result.describe() == "not checkable (temperature 0.7)"
    assert equality([answer("p", [1])], [answer("p", [1])], {"temperature": None}).status == "sampling"


def test_the_report_shows_identical_to_none_and_names_the_config_that_differs(tmp_path: Path) -> None:
    built = _build(_run(tmp_path, _equal_cells({"dspark": 5})))
    (drafting,) = [g for g in built.groups if not g.is_baseline]
    assert drafting.equality is not None and (drafting.equality.compared, drafting.equality.identical) == (4, 3)
    text = report.render(built, "md")
    assert "75% (3/4), first diff at token 5" in text
    (finding,) = _findings(built, "identical to none")
    assert finding.startswith("vllm DSpark K=3 C=1 seed: 75% (3/4), first diff at token 5")


def test_equal_answers_leave_no_equality_warning(tmp_path: Path) -> None:
    built = _build(_run(tmp_path, _equal_cells()))
    assert _findings(built, "identical to none") == ()
    assert "| 100% (4/4) |" in report.render(built, "md")


def test_sampled_runs_say_equality_cannot_be_checked(tmp_path: Path) -> None:
    built = _build(_run(tmp_path, _equal_cells({"dspark": 5}), sampling="{max_tokens: 64, temperature: 1.0}"))
    (finding,) = _findings(built, "identical to none")
    assert "not checkable (temperature 1)" in finding
    assert "not checkable (temperature 1)" in report.render(built, "md")


# -- truncation and short answers ----------------------------------------------------------------------------


def test_answers_cut_at_max_tokens_are_flagged_only_when_the_length_was_not_forced(tmp_path: Path) -> None:
    def make(method: str, k: int | None, c: int, repeat: int) -> tuple[dict[str, Any], dict[str, Any]]:
        return _summary(finish_reasons={"length": 3, "stop": 1}, tokens_per_request=600.0), {}

    cut = _build(_run(tmp_path / "a", make, sampling="{max_tokens: 640, temperature: 0}"))
    findings = _findings(cut, "truncation and short answers")
    assert any("3 of 4 answers (75%) ended at max_tokens (640)" in f for f in findings)
    forced = _build(_run(tmp_path / "b", make, sampling="{max_tokens: 640, temperature: 0, ignore_eos: true}"))
    assert _findings(forced, "truncation and short answers") == ()


def test_short_answers_are_flagged(tmp_path: Path) -> None:
    def make(method: str, k: int | None, c: int, repeat: int) -> tuple[dict[str, Any], dict[str, Any]]:
        return _summary(finish_reasons={"stop": 4}, tokens_per_request=20.0 if method == "none" else 200.0), {}

    built = _build(_run(tmp_path, make, sampling="{max_tokens: 2048, temperature: 0}"))
    findings = _findings(built, "truncation and short answers")
    assert any("vllm none C=1 seed: answers average 20 tokens - too short" in f for f in findings)
    assert any("200 tokens, 10% of max_tokens 2048 - far shorter than asked" in f for f in findings)


# -- prefix cache ----------------------------------------------------------------------------------------------


def test_prefix_cache_hits_during_a_window_are_flagged(tmp_path: Path) -> None:
    def make(method: str, k: int | None, c: int, repeat: int) -> tuple[dict[str, Any], dict[str, Any]]:
        hits = 300.0 if method == "dspark" else 0.0
        return _summary(), {"prefix_cache": {"queried_tokens": 1000.0, "hit_tokens": hits}}

    findings = _findings(_build(_run(tmp_path, make)), "prefix-cache hits")
    assert findings == ("vllm DSpark K=3 C=1 seed: 30% of prompt tokens came from the prefix cache (300 of 1,000) - "
                        "its TTFT is flattered; use a workload with more distinct prompts than requests, or turn "
                        "prefix caching off",)


def test_prefix_cache_counters_from_vllm_metrics_become_a_window() -> None:
    from sparklab.engines.vllm import prefix_cache

    before = {"prefix_cache": {"vllm:prefix_cache_queries_total": 100.0, "vllm:prefix_cache_hits_total": 10.0}}
    after = {"prefix_cache": {"vllm:prefix_cache_queries_total": 600.0, "vllm:prefix_cache_hits_total": 260.0}}
    window = prefix_cache(before, after)
    assert window is not None and (window["queried_tokens"], window["hit_tokens"], window["hit_rate"]) == (
        500.0, 250.0, 0.5)
    assert prefix_cache({}, {}) is None


# -- sanity ceilings -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("decode", "tokens", "chunks", "accepted", "expected"), [
    (50.0, 256, 85, 171.0, ()),
    # the real CPU engine's ngram K=3 at C=1: 128 tokens in 93 chunks (1.38 per chunk) against acceptance length
    # 1.93 (ngram drafts only on steps with a match), 38 accepted tokens - consistent, no warning
    (50.0, 128, 93, 38.0, ()),
    (90.0, 256, 85, 171.0, ("decode 90.0 tok/s is over (K+1) x the baseline's 20.0 - impossible for K=3",)),
    (50.0, 256, 43, 213.0, ("5.95 tokens per streamed chunk, more than K+1 = 4",)),
    (50.0, 256, 171, 171.0, ("the client saw 85 tokens beyond one per chunk, the server counted 171 accepted",)),
])
def test_impossible_or_contradicting_numbers_are_flagged(tmp_path: Path, decode: float, tokens: int, chunks: int,
                                                         accepted: float, expected: tuple[str, ...]) -> None:
    def make(method: str, k: int | None, c: int, repeat: int) -> tuple[dict[str, Any], dict[str, Any]]:
        if method == "none":
            return _summary(decode_tps={"mean": 20.0}, tokens_per_chunk=1.0, output_tokens=256), {}
        return (_summary(decode_tps={"mean": decode}, tokens_per_chunk=tokens / chunks, output_tokens=tokens),
                {"speculative": {"accepted_tokens": accepted, "acceptance_length": 1.93}})

    findings = _findings(_build(_run(tmp_path, make)), "sanity ceilings")
    assert len(findings) == len(expected), findings
    for finding, part in zip(findings, expected, strict=True):
        assert part in finding


# -- images ----------------------------------------------------------------------------------------------------


def test_cells_from_different_image_digests_are_marked(tmp_path: Path) -> None:
    path = _run(tmp_path, _equal_cells(), repeats=2,
                digest=lambda method, repeat: "sha256:new" if (method, repeat) == ("dspark", 1) else "sha256:old")
    findings = _findings(_build(path), "one image per engine")
    assert any("vllm DSpark K=3 C=1 seed: its repeats ran on 2 images (sha256:new, sha256:old)" in f
               for f in findings)
    one = _run(tmp_path / "one", _equal_cells(), repeats=2)
    assert _findings(_build(one), "one image per engine") == ()


def test_two_engines_on_their_own_images_are_not_mixed_images(tmp_path: Path) -> None:
    """A run that compares engines (the CPU demo: vLLM and llama.cpp) has one image per engine, not a mix."""
    path = _run(tmp_path, _equal_cells(), engines="[vllm, sglang]", engine_digest=lambda e: f"sha256:{e}")
    assert _findings(_build(path), "one image per engine") == ()


def test_an_engine_that_streams_token_by_token_is_not_held_to_one_chunk_per_step(tmp_path: Path) -> None:
    """llama.cpp b11669 streams every token as its own event, drafted or not (a real run: 1.00 tokens per chunk at
    acceptance length 2.53), so its tokens per chunk are not compared with its accepted-token counter."""
    from tests.reportkit import load_dump

    path = load_dump(Path(__file__).parents[1] / "fixtures" / "report" / "llamacpp-cpu-sweep.sql",
                     tmp_path / "wt15-llama-part-20261201-023636-2afa17")
    built = _build(path)
    draft = [g for g in built.groups if not g.is_baseline]
    assert draft and all(g.server.kind == "llamacpp" and not g.server.streams_one_chunk_per_step for g in draft)
    assert all(r["summary"]["tokens_per_chunk"] == 1.0 and r["speculative"]["accepted_tokens"] > 10
               for g in draft for c in g.cells if (r := c.result))
    assert _findings(built, "sanity ceilings") == ()


def test_the_client_keeps_each_answers_token_ids_and_text() -> None:
    from sparklab.bench.client import _on_event
    from sparklab.records import RequestRecord

    record = RequestRecord(index=0, prompt_id="seed-0", warmup=False, start=0.0)
    for chunk in ({"delta": {"reasoning_content": "hm"}, "token_ids": [7]},
                  {"delta": {"content": "Hi"}, "token_ids": [8, 9]},
                  {"delta": {"content": " there"}, "token_ids": [10], "finish_reason": "stop"}):
        _on_event(record, {"choices": [chunk]}, 1.0, 100)
    kept_answer = record.answer()
    assert kept_answer["token_ids"] == [7, 8, 9, 10] and kept_answer["text"] == "hmHi there"
    assert "output_parts" not in record.as_dict()  # results keep answers apart, in `outputs`
    no_ids = RequestRecord(index=1, prompt_id="seed-1", warmup=False, start=0.0)
    _on_event(no_ids, {"choices": [{"delta": {"content": "a"}, "token_ids": [1]}]}, 1.0, 100)
    _on_event(no_ids, {"choices": [{"delta": {"content": "b"}}]}, 1.0, 100)
    assert no_ids.answer()["token_ids"] is None and no_ids.answer()["text"] == "ab"


# -- tool-call runaways ----------------------------------------------------------------------------------------


def test_the_client_joins_streamed_tool_call_deltas_and_counts_identical_calls() -> None:
    from sparklab.bench.client import _on_event
    from sparklab.outputs import runaway
    from sparklab.records import RequestRecord

    record = RequestRecord(index=0, prompt_id="tools-required", warmup=False, start=0.0)
    for i in range(4):  # vLLM streams a call's name first, its arguments in pieces after
        _on_event(record, {"choices": [{"delta": {"tool_calls": [
            {"index": i, "id": f"c{i}", "function": {"name": "get_weather", "arguments": ""}}]}}]}, 1.0, 100)
        for piece in ('{"city": ', '"Tokyo"}'):
            _on_event(record, {"choices": [{"delta": {"tool_calls": [
                {"index": i, "function": {"arguments": piece}}]}}]}, 1.0, 100)
    _on_event(record, {"choices": [{"delta": {}, "finish_reason": "length"}]}, 1.0, 100)
    kept_answer = record.answer()
    assert kept_answer["tool_calls"]["count"] == 4 and kept_answer["tool_calls"]["max_identical"] == 4
    assert kept_answer["tool_calls"]["first"][0] == {"name": "get_weather", "arguments": '{"city": "Tokyo"}'}
    assert runaway(kept_answer)
    one = RequestRecord(index=1, prompt_id="tools-auto", warmup=False, start=0.0, finish_reason="tool_calls")
    _on_event(one, {"choices": [{"delta": {"tool_calls": [
        {"index": 0, "function": {"name": "get_weather", "arguments": "{}"}}]}}]}, 1.0, 100)
    assert not runaway(one.answer())


def test_the_probe_workload_offers_a_tool_with_required_and_auto() -> None:
    from sparklab.bench.workloads import load_workload

    probe = load_workload("toolcall-probe")
    assert [(p.id, (p.extra or {})["tool_choice"]) for p in probe.prompts] == [
        ("tools-required", "required"), ("tools-auto", "auto")]
    assert (probe.prompts[0].extra or {})["tools"][0]["function"]["name"] == "get_weather"


def test_runaways_are_flagged_per_config_and_prompt(tmp_path: Path) -> None:
    from sparklab.outputs import tool_call_summary

    def make(method: str, k: int | None, c: int, repeat: int) -> tuple[dict[str, Any], dict[str, Any]]:
        outputs = []
        for i, prompt in enumerate(("tools-required", "tools-auto") * 2):
            calls = 40 if (method == "dspark" and prompt == "tools-required") else 1
            a = answer(prompt, [1], index=i)
            a["finish_reason"] = "length" if calls > 1 else "tool_calls"
            a["tool_calls"] = tool_call_summary([{"name": "get_weather", "arguments": "{}"}] * calls)
            outputs.append(a)
        return _summary(), {"outputs": outputs}

    built = _build(_run(tmp_path, make, sampling="{max_tokens: 64, temperature: 0}"))
    (finding,) = _findings(built, "tool-call runaways")
    assert finding.startswith("vllm DSpark K=3 C=1 seed tools-required: 2 of 2 answers ran away (up to 40 tool "
                              "calls, the same call up to 40 times; finish: length 2)")
    text = report.render(built, "md")
    assert "## Tool-call probe" in text and "| seed | 1 | vllm DSpark K=3 | tools-required | 2 | 40.0 |" in text
