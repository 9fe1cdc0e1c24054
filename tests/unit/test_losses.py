"""Why acceptance does not become speed (issue 25 §6): the gap between a drafting config's acceptance length and its
measured speed-up split into the scheduler's cap, steps without a draft, the verify step's extra cost, the
drafter's cost and the rest, on scripted cells whose parts are worked out by hand."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sparklab import report
from sparklab.recipes.plan import build_plan
from sparklab.recipes.schema import recipes_dir
from sparklab.report.losses import PARTS, losses
from sparklab.sweep import runner
from sparklab.sweep.store import Store

# at C=4, one repeat each: none decodes 50 tok/s per sequence (t0 = 20 ms) and 200 tok/s aggregate
CELLS: dict[tuple[str, int | None], dict[str, Any]] = {
    ("none", None): {"decode": 50.0, "aggregate": 200.0},
    # ngram K=3: 400 tokens, 100 accepted drafts in 125 drafting steps (of 300 sequence-steps), AL 1.8
    ("ngram", 3): {"decode": 60.0, "aggregate": 230.0, "tokens": 400, "accepted": 100, "drafts": 125, "al": 1.8},
    # a draft model at K=3: drafts every step, 240 of 400 tokens accepted (tau = AL = 2.5), slow to draft
    ("draft_model", 3): {"decode": 40.0, "aggregate": 150.0, "tokens": 400, "accepted": 240, "drafts": 160,
                         "al": 2.5},
}


def loss_run(tmp_path: Path, cells: dict[tuple[str, int | None], dict[str, Any]] = CELLS) -> Path:
    plan = build_plan(recipes_dir() / "sweeps" / "cpu-demo.yaml", run_id="loss-test")
    ids = {s.id: (s.method, s.num_speculative_tokens) for s in plan.servers if s.engine == "vllm-cpu"}
    path = tmp_path / "loss-test" / "results.sqlite"
    with Store.create(path, plan.sweep.model_dump(), "test") as store:
        runner.register(plan, store, only=lambda s, c: ids.get(s.id) in cells and c.concurrency == 4
                        and c.repeat == 0)
        for sid, config in ids.items():  # ngram's server logged vLLM's cap: 6 scheduled tokens a step
            if config == ("ngram", 3):
                store.record_server_start(sid, image_digest=None, startup_facts={"max_num_scheduled_tokens": 6},
                                          ready_s=1.0, log_path=None)
        for cell in store.cells():
            x = cells[ids[cell.server_config_id]]
            summary = {"requests": {"measured": 4, "ok": 4, "failed": 0}, "aggregate_tps": x["aggregate"],
                       "decode_tps": {"n": 4, "mean": x["decode"]}, "output_tokens": x.get("tokens", 400)}
            result: dict[str, Any] = {"summary": summary}
            if "al" in x:
                result["speculative"] = {"drafts": x["drafts"], "accepted_tokens": x["accepted"],
                                         "acceptance_length": x["al"], "draft_tokens": 3 * x["drafts"],
                                         "source": "vllm:spec_decode_* counters from /metrics, after warmup and "
                                                   "after the window (delta)"}
            store.start_cell(cell.id)
            store.finish_cell(cell.id, summary, result)
    return path


def test_the_gap_splits_into_its_parts_and_they_add_up_to_the_acceptance_length(tmp_path: Path) -> None:
    with Store.open(loss_run(tmp_path), readonly=True) as store:
        built = report.build(store, "loss-test")
    rows = {x.group.server.method: x for x in losses(built)}
    ngram, draft = rows["ngram"], rows["draft_model"]
    # ngram: tau = 400 / (400 - 100) = 1.333 tokens per sequence-step; t_step = 1.333 / 60 = 22.22 ms; its own
    # drafter (a lookup) costs 0, so t_step - t0 = 2.22 ms is the verify extra, 5.33 ms per step that drafted
    # (125 of 300). The scheduler allows 6 / 4 = 1.5 tokens per sequence per step.
    assert ngram.tau == pytest.approx(4 / 3) and ngram.t0_ms == pytest.approx(20.0)
    assert ngram.step_ms == pytest.approx(1000 * (4 / 3) / 60) and ngram.verify_ms == pytest.approx(20 / 9)
    assert ngram.drafter_ms == 0.0 and ngram.cap == pytest.approx(1.5)
    assert ngram.parts["scheduler cap"] == pytest.approx(0.3)  # 1.8 -> 1.5
    assert ngram.parts["no-draft steps"] == pytest.approx(1.5 - 4 / 3)
    assert ngram.parts["verify"] == pytest.approx(4 / 3 - 1.2)  # x 20 / 22.22 = the decode speed-up 1.2
    assert ngram.parts["other"] == pytest.approx(0.05) and ngram.parts["measured"] == pytest.approx(1.15)
    # draft model: tau = AL = 2.5, t_step = 62.5 ms; the verify extra is ngram's per drafting step (5.33 ms, every
    # step drafts here), the drafter the other 37.17 ms
    assert draft.verify_ms == pytest.approx(16 / 3) and draft.drafter_ms == pytest.approx(62.5 - 20 - 16 / 3)
    assert draft.cap is None and draft.parts["scheduler cap"] == 0.0 and draft.parts["no-draft steps"] == 0.0
    assert draft.parts["verify"] == pytest.approx(2.5 - 2.5 * 20 / (20 + 16 / 3))
    assert draft.parts["drafter"] == pytest.approx(2.5 * 20 / (20 + 16 / 3) - 0.8)
    assert draft.parts["other"] == pytest.approx(0.05) and draft.parts["measured"] == pytest.approx(0.75)
    for x in (ngram, draft):
        assert sum(x.parts[p] for p in PARTS) == pytest.approx(x.ideal)
    markdown = report.render(built, "md")
    assert "## Why acceptance does not become speed" in markdown
    assert "| seed | 4 | vllm-cpu draft model K=3 | 2.50x | 2.50 | 20.00 | 62.50 | 5.33 | 37.17 | - |" in markdown


def test_without_an_ngram_reference_drafting_and_verifying_are_not_split_and_it_says_so(tmp_path: Path) -> None:
    cells = {config: x for config, x in CELLS.items() if config != ("ngram", 3)}
    with Store.open(loss_run(tmp_path, cells), readonly=True) as store:
        built = report.build(store, "loss-test")
    (draft,) = losses(built)
    assert draft.verify_ms is None and draft.parts["drafter"] == 0.0
    assert draft.parts["verify"] == pytest.approx(2.5 - 0.8)  # both, under verify
    assert any("not separable" in note for note in draft.notes)
