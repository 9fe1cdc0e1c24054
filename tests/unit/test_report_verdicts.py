"""The report's verdicts (issue 25): synthetic acceptance labelled, expected to differ from none and never named best;
intervals and speedups with between-load noise where some config was reloaded, and verdicts on one load named."""

from __future__ import annotations

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


def synthetic_run(tmp_path: Path, speeds: dict[tuple[str, int | None], float], synthetic_text: str = "copied",
                  loads: dict[tuple[str, int | None], list[float]] | None = None) -> Path:
    """cpu-tune-dspark's servers (none, synthetic K 1-8) with K in {3} only, C=1, each cell finished with a scripted
    aggregate tok/s and answers; `loads`: per config, a relative offset per load (a reload per entry beyond one)."""
    plan = build_plan(recipes_dir() / "sweeps" / "cpu-tune-dspark.yaml", run_id="synthetic-test")
    wanted = {s.id: (s.method, s.num_speculative_tokens) for s in plan.servers
              if (s.method, s.num_speculative_tokens) in speeds}
    path = tmp_path / "synthetic-test" / "results.sqlite"
    with Store.create(path, plan.sweep.model_dump(), "test") as store:
        runner.register(plan, store, only=lambda s, c: s.id in wanted and c.concurrency == 1)
        for cell in store.cells():
            config = wanted[cell.server_config_id]
            offsets = (loads or {}).get(config, [0.0])
            load = min(cell.repeat * len(offsets) // 3, len(offsets) - 1)  # the repeats split over the loads
            value = speeds[config] * (1 + offsets[load] + (0.002, -0.002, 0.0)[cell.repeat % 3])
            summary = {"requests": {"measured": 2, "ok": 2, "failed": 0}, "aggregate_tps": value,
                       "per_request_tps": {"n": 2, "mean": value}}
            text = synthetic_text if config[0] == "synthetic" else "the target's answer"
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
