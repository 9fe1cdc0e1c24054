"""Zero spread is not certainty (issue 23): a figure whose repeats all gave the same value has no measured
interval, and every place that prints an interval says "identical repeats: the interval is not measured"
instead of a zero-width one (report Markdown/HTML tables, the tune section, seed 004's table, the closing
table of a sweep, `sparklab tune`'s summary, `repeats: auto`'s skip line, the CSV/JSON exports, the plots)."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path
from typing import Any

from sparklab import report
from sparklab.bench.metrics import IDENTICAL, estimate, ratio
from sparklab.cli.console import sweep_table
from sparklab.cli.tune_text import tune_summary
from sparklab.recipes.plan import build_plan
from sparklab.report import exports, plots
from sparklab.sweep import runner, serverrun
from sparklab.sweep.store import Store
from sparklab.tune import search

ZERO_WIDTH = re.compile(r"± 0\.0+\b|\[(\d[\d.,]*), \1\]")  # "± 0.00" or "[172.9, 172.9]"


def test_identical_repeats_are_not_an_interval() -> None:
    same = estimate([172.9, 172.9, 172.9])
    assert same is not None and same.identical and same.n == 3
    spread = estimate([172.0, 172.9, 173.8])
    assert spread is not None and not spread.identical
    single = estimate([172.9])
    assert single is not None and not single.identical  # one run: no interval, said as such elsewhere
    both = ratio(same, estimate([100.0, 100.0])) # type: ignore[arg-type]
    assert both is not None and both.identical and both.significant is None  # nothing measured: nothing claimed
    one_side = ratio(same, estimate([99.0, 100.0, 101.0]))  # type: ignore[arg-type]
    assert one_side is not None and not one_side.identical and one_side.significant is True
    assert IDENTICAL == "identical repeats: the interval is not measured"


def _run(tmp_path: Path, values: dict[str, list[float]], headline: str = "seed000") -> Path:
    """seed000's plan at C=8, each method's repeats with the given values (aggregate and decode tok/s)."""
    sweep_file = tmp_path / "same.yaml"
    sweep_file.write_text(
        "name: same\nrecipe: gb10\nengines: [vllm]\nmethods: [none, mtp, dspark]\nnum_speculative_tokens: [3]\n"
        f"concurrency: [1, 8]\nrepeats: 3\nrequests: 8\nheadline: {headline}\n")
    plan = build_plan(sweep_file, run_id="same")
    path = tmp_path / "same-run" / "results.sqlite"
    with Store.create(path, plan.sweep.model_dump(), "test") as store:
        runner.register(plan, store)
        methods = {s.id: s.method for s in store.server_configs()}
        for cell in store.cells():
            v = values[methods[cell.server_config_id]][cell.repeat]
            summary: dict[str, Any] = {"requests": {"measured": 8, "ok": 8, "failed": 0}, "aggregate_tps": v,
                                       "per_request_tps": {"n": 8, "mean": v}, "decode_tps": {"n": 8, "mean": v},
                                       "ttft_ms": {"n": 8, "p50": 100.0}}
            store.finish_cell(cell.id, summary, {"summary": summary})
    return path


VALUES = {"none": [172.9, 172.9, 172.9], "mtp": [190.0, 201.0, 212.0], "dspark": [240.5, 240.5, 240.5]}


def _built(path: Path) -> report.Report:
    with Store.open(path, readonly=True) as store:
        return report.build(store, "same-run")


def test_the_report_says_identical_repeats_instead_of_a_zero_width_interval(tmp_path: Path) -> None:
    built = _built(_run(tmp_path, VALUES))
    text = report.render(built, "md")
    assert not ZERO_WIDTH.search(text), ZERO_WIDTH.search(text)
    assert "172.90 (identical repeats)" in text and "240.50 (identical repeats)" in text
    assert "201.00 ± " in text  # a measured interval is still printed
    # dspark vs none: both sides identical, so the speedup has no interval and no significance claim
    assert "139.10% (identical repeats)" in text and "[139.1, 139.1]" not in text
    trust = text.split("## How far to trust this")[1].split("\n## ")[0]
    assert IDENTICAL in trust and "DSpark K=3 C=8" in trust and "every speedup's interval excludes 100%" not in trust
    html = report.render(built, "html", tmp_path / "plots")
    assert not ZERO_WIDTH.search(html) and "identical repeats" in html
    closing = sweep_table(built)
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(closing)
    assert "139.1% (identical repeats)" in console.export_text()


def test_seed004s_table_says_identical_repeats(tmp_path: Path) -> None:
    text = report.render(_built(_run(tmp_path, VALUES, headline="decode")), "md")
    generation = text.split("Generation speed (excluding TTFT)")[1].split("\n## ")[0]
    assert "172.9 (identical repeats)" in generation and not ZERO_WIDTH.search(generation)


def test_exports_leave_an_unmeasured_interval_empty(tmp_path: Path) -> None:
    built = _built(_run(tmp_path, VALUES))
    rows = list(csv.DictReader(io.StringIO(exports.to_csv(built))))
    none = next(r for r in rows if r["method"] == "none" and r["concurrency"] == "8")
    assert none["aggregate_tps_ci95_low"] == none["aggregate_tps_ci95_high"] == ""
    dspark = next(r for r in rows if r["method"] == "dspark" and r["concurrency"] == "8")
    assert dspark["speedup_ci95_low"] == "" and dspark["speedup_significant"] == ""
    mtp = next(r for r in rows if r["method"] == "mtp" and r["concurrency"] == "8")
    assert float(mtp["aggregate_tps_ci95_low"]) < 201.0 < float(mtp["aggregate_tps_ci95_high"])
    document = json.loads(exports.to_json(built))
    group = next(g for g in document["groups"] if g["method"] == "none" and g["concurrency"] == 8)
    assert group["metrics"]["aggregate_tps"]["identical_repeats"] is True
    assert group["metrics"]["aggregate_tps"]["ci95_low"] is None


def test_plots_draw_no_zero_whiskers(tmp_path: Path) -> None:
    built = _built(_run(tmp_path, VALUES))
    none = next(g for g in built.groups if g.server.method == "none")
    mtp = next(g for g in built.groups if g.server.method == "mtp")
    assert plots._interval(none) is None and plots._interval(mtp) is not None


def test_tune_prints_identical_repeats_for_a_pick_and_says_why_it_won() -> None:
    state = {"objective": "aggregate", "settings": {}, "loads": 2, "rounds": [], "wall_s": 1.0,
             "picks": [{"concurrency": 1, "method": "none", "k": None, "label": "none", "mean": 172.9, "low": 172.9,
                        "high": 172.9, "n": 3, "note": "x"}]}

    from types import SimpleNamespace

    text = tune_summary(SimpleNamespace(servers=[]), state)
    assert "C=1: none: 172.90 tok/s (identical repeats: the interval is not measured) (n=3)" in text
    assert "[172.90, 172.90]" not in text
    space = search.Space(("none", "ngram"), (2,), (1,), {"none": False, "ngram": True})
    obs = {("none", None): {1: search.CellObs((172.9,) * 3, (100.0,) * 3, (), None, 3)},
           ("ngram", 2): {1: search.CellObs((150.0,) * 3, (100.0,) * 3, (0.5, 0.3), 1.8, 3)}}
    done = search.decide(space, search.Settings(3, 3), obs)
    assert isinstance(done, search.Done)
    (pick,) = done.picks
    assert pick.config == ("none", None) and "identical repeats" in pick.note and "interval" not in \
        pick.note.split("identical repeats: the interval is not measured")[1]


def test_auto_repeats_does_not_call_identical_runs_a_pinned_mean(tmp_path: Path) -> None:
    from sparklab.recipes.schema import recipes_dir

    said: list[str] = []
    sweep_file = tmp_path / "auto.yaml"
    sweep_file.write_text("name: auto\nrecipe: cpu\nmethods: [none]\nconcurrency: [1]\nrepeats: auto\nrequests: 2\n"
                          "auto_repeats: {min: 2, max: 4}\n")
    assert recipes_dir()
    plan = build_plan(sweep_file, run_id="auto")
    with Store.create(tmp_path / "r.sqlite", plan.sweep.model_dump(), "test") as store:
        runner.register(plan, store)
        server = plan.servers[0]
        for cell in server.cells[:2]:
            summary = {"requests": {"measured": 2, "ok": 2, "failed": 0}, "per_request_tps": {"n": 2, "mean": 50.0}}
            store.start_cell(cell.id)
            store.finish_cell(cell.id, summary, {"summary": summary})
        assert serverrun._measured_enough(plan, store, server, server.cells[2], said.append)
    assert said and IDENTICAL in said[0] and "±0.0%" not in said[0]


def test_equal_values_up_to_float_rounding_are_identical_and_a_tiny_spread_is_not_printed_as_zero() -> None:
    from sparklab.report.formats import fmt

    rounding = estimate([0.1 + 0.2, 0.3, 0.3])  # 0.30000000000000004 and 0.3: one value, two float spellings
    assert rounding is not None and rounding.identical
    tiny = estimate([172.9, 172.9001, 172.9002])  # a real spread, narrower than the printed digits
    assert tiny is not None and not tiny.identical
    assert fmt(tiny) == "172.90 ± <0.01" and fmt(rounding) == "0.30 (identical repeats)"
