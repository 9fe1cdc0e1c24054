"""The report's verdicts (issue 25): synthetic acceptance labelled, expected to differ from none and never named best;
intervals and speedups with between-load noise where some config was reloaded, and verdicts on one load named."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sparklab import report
from sparklab.bench.metrics import estimate
from sparklab.outputs import kept
from sparklab.recipes.plan import build_plan
from sparklab.recipes.schema import recipes_dir
from sparklab.report.checks import equality
from sparklab.sweep import runner
from sparklab.sweep.store import Store

PROMPTS = ("p0", "p1")


Config = tuple[str, int | None]  # method, K


def synthetic_run(tmp_path: Path, speeds: dict[Config, float], synthetic_text: str = "copied",
                  loads: dict[Config, list[float]] | None = None, sweep: str = "cpu-tune-dspark",
                  texts: dict[Config, str] | None = None, decode: dict[Config, float] | None = None) -> Path:
    """cpu-tune-dspark's servers (none, synthetic K 1-8) with K in {3} only, C=1, each cell finished with a scripted
    aggregate tok/s and answers; `loads`: per config, a relative offset per load (a reload per entry beyond one).
    Another shipped sweep's vLLM servers with `sweep`; `texts`: a config's answers other than the target's;
    `decode`: a config's decode tok/s."""
    plan = build_plan(recipes_dir() / "sweeps" / f"{sweep}.yaml", run_id="synthetic-test")
    wanted = {s.id: (s.method, s.num_speculative_tokens) for s in plan.servers
              if (s.method, s.num_speculative_tokens) in speeds and s.engine.startswith("vllm")}
    path = tmp_path / "synthetic-test" / "results.sqlite"
    with Store.create(path, plan.sweep.model_dump(), "test") as store:
        runner.register(plan, store, only=lambda s, c: s.id in wanted and c.concurrency == 1)
        for cell in store.cells():
            config = wanted[cell.server_config_id]
            offsets = (loads or {}).get(config, [0.0])
            load = min(cell.repeat * len(offsets) // 3, len(offsets) - 1)  # the repeats split over the loads
            value = speeds[config] * (1 + offsets[load] + (0.002, -0.002, 0.0)[cell.repeat % 3])
            summary: dict[str, Any] = {"requests": {"measured": 2, "ok": 2, "failed": 0}, "aggregate_tps": value,
                                       "per_request_tps": {"n": 2, "mean": value}}
            if decode and config in decode:
                summary["decode_tps"] = {"n": 2, "mean": decode[config]}
            text = synthetic_text if config[0] == "synthetic" else (texts or {}).get(config, "the target's answer")
            result: dict[str, Any] = {"summary": summary, "server_load": {"id": f"{load:04d}#{cell.server_config_id}"},
                                      "sampling": {"temperature": 0},
                                      "outputs": [kept(i, p, False, True, "length", text, None)
                                                  for i, p in enumerate(PROMPTS)]}
            store.start_cell(cell.id)
            store.finish_cell(cell.id, summary, result)
    return path


def build(path: Path) -> report.Report:
    with Store.open(path, readonly=True) as store:
        return report.build(store, path.parent.name)


def test_synthetic_acceptance_is_labelled_expected_to_differ_and_never_named_best(tmp_path: Path) -> None:
    built = build(synthetic_run(tmp_path, {("none", None): 20.0, ("synthetic", 3): 30.0}))
    synthetic = next(s for s in built.servers if s.method == "synthetic" and s.k == 3)
    assert synthetic.synthetic == pytest.approx((0.867, 0.752, 0.652))  # read back from its stored command
    (best,) = built.best
    assert best.group.server.method == "none"  # 50% slower, yet the only real config
    assert [g.server.method for g in best.synthetic_skipped] == ["synthetic"]
    assert not equality(built).findings  # its answers differ from none's, as they must
    markdown = report.render(built, "md")
    assert "## Synthetic acceptance: not drafters" in markdown
    assert "per-position acceptance 0.867 0.752 0.652 (acceptance length 3.27" in markdown
    assert "synthetic acceptance, not a drafter, so never named best: vllm-cpu-synthetic synthetic K=3" in markdown
    assert "(synthetic: expected to differ)" in markdown


def test_synthetic_answers_identical_to_none_are_a_warning(tmp_path: Path) -> None:
    built = build(synthetic_run(tmp_path, {("none", None): 20.0, ("synthetic", 3): 30.0},
                                synthetic_text="the target's answer"))
    (finding,) = equality(built).findings
    assert "synthetic acceptance left every answer identical to `none`" in finding and "not in effect" in finding


def test_reloads_put_between_load_noise_in_every_interval_and_speedup(tmp_path: Path) -> None:
    # none was loaded three times, 10% apart; synthetic K=3 once: its interval borrows none's between-load noise
    path = synthetic_run(tmp_path, {("none", None): 20.0, ("synthetic", 3): 24.0},
                         loads={("none", None): [0.0, 0.10, -0.05]})
    built = build(path)
    none = next(g for g in built.groups if g.server.method == "none")
    synthetic = next(g for g in built.groups if g.server.method == "synthetic")
    assert none.loads == 3 and synthetic.loads == 1
    assert none.load_noise and synthetic.load_noise
    within_only = estimate(c.summary["aggregate_tps"] for c in synthetic.cells)
    assert within_only is not None and synthetic.headline is not None
    assert (synthetic.headline.high - synthetic.headline.low) > 5 * (within_only.high - within_only.low)
    assert synthetic.speedup is not None and synthetic.speedup.low is not None
    assert synthetic.speedup.low < 1.0 < synthetic.speedup.high  # 20% faster is within the drift between loads
    markdown = report.render(built, "md")
    assert "seed, C=1: 1 config(s) reloaded; run-to-run sd within one load" in markdown
    assert "between-load share of a run's variance" in markdown


def test_a_run_without_reloads_says_every_verdict_rests_on_one_load(tmp_path: Path) -> None:
    built = build(synthetic_run(tmp_path, {("none", None): 20.0, ("synthetic", 3): 30.0}))
    assert all(b.one_load for b in built.best) and not any(g.load_noise for g in built.groups)
    markdown = report.render(built, "md")
    assert "no config was reloaded in this run" in markdown and "every verdict rests on one load" in markdown


def test_a_config_whose_answers_differ_from_none_at_temperature_0_is_never_named_best(tmp_path: Path) -> None:
    """Drafting that changes the output is not the target model made faster: its speed answers a different question.
    The fastest config here changed every answer; the report names the next one and says which it passed over."""
    built = build(synthetic_run(tmp_path, {("none", None): 20.0, ("ngram", 3): 30.0, ("draft_model", 1): 24.0},
                                sweep="cpu-demo", texts={("ngram", 3): "another answer"}))
    (best,) = [b for b in built.best if b.concurrency == 1]
    assert (best.group.server.method, best.group.server.k) == ("draft_model", 1)
    assert [g.server.label for g in best.changed_output] == ["vllm-cpu ngram K=3"]
    assert best.best_score_group is best.group  # the passed-over config is not the top score either
    markdown = report.render(built, "md")
    row = next(line for line in markdown.splitlines() if line.startswith("| seed | 1 | vllm-cpu draft model |"))
    assert ("scored above it but its answers differ from `none`'s at temperature 0, so never named best: "
            "vllm-cpu ngram K=3") in row, row
    (entry,) = [b for b in json.loads(report.render(built, "json"))["best"] if b["concurrency"] == 1]
    assert entry["label"] == "vllm-cpu draft model K=1" and entry["changed_output"] == ["vllm-cpu ngram K=3"]


def test_a_pick_whose_number_a_check_flagged_says_so_in_its_row(tmp_path: Path) -> None:
    """A check's warning means a number should not be acted on as it stands: the best row that rests on it (the
    pick's own number, or its baseline's, which its speed-up divides by) says which check, in Markdown and JSON.
    Seen on a loaded machine: none's decode at 9.0 tok/s, ngram K=1's at 20.4 on the next server, over the 2x that
    K=1 allows, and ngram K=1 named best at C=4 with nothing in its row."""
    speeds = {("none", None): 33.0, ("ngram", 1): 61.0, ("draft_model", 3): 48.0}
    decode = {("none", None): 9.0, ("ngram", 1): 20.4, ("draft_model", 3): 16.5}
    built = build(synthetic_run(tmp_path, speeds, sweep="cpu-demo", decode=decode))
    (best,) = [b for b in built.best if b.concurrency == 1]
    assert best.group.server.label == "vllm-cpu ngram K=1"
    markdown = report.render(built, "md")
    row = next(line for line in markdown.splitlines() if line.startswith("| seed | 1 | vllm-cpu ngram |"))
    assert "; rests on a number a check flagged (sanity ceilings): see Checks on the verdict" in row, row
    (entry,) = [b for b in json.loads(report.render(built, "json"))["best"] if b["concurrency"] == 1]
    assert entry["flagged_by"] == ["sanity ceilings"]
    # the baseline's own flag counts too: its number is the speed-up's denominator
    clean = build(synthetic_run(tmp_path / "clean", speeds, sweep="cpu-demo",
                                decode={**decode, ("none", None): 18.0}))
    assert next(b for b in json.loads(report.render(clean, "json"))["best"] if b["concurrency"] == 1)["flagged_by"] == []
