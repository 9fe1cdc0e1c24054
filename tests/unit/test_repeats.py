"""`repeats: auto`: quiet loads stop after `min` runs, noisy ones run on to `max`; the dry run shows the most it
can cost; a bad value names the key and the fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sparklab.cli.main import main
from sparklab.recipes.plan import build_plan
from sparklab.sweep import repeats, runner, serverrun
from sparklab.sweep.store import Store


def _sweep(tmp_path: Path, value: str = "auto", extra: str = "auto_repeats: {min: 3, max: 5, target: 0.03}\n") -> Path:
    path = tmp_path / "sweep.yaml"
    path.write_text(f"name: auto\nrecipe: cpu\nmethods: [none]\nconcurrency: [1, 4]\nrequests: 2\n"
                    f"repeats: {value}\n{extra}")
    return path


@pytest.mark.parametrize(("values", "stop"), [
    ([100.0, 100.5, 99.8], True),      # half-width ~0.8%
    ([100.0, 130.0, 80.0], False),     # ~62%
    ([100.0, 100.5], False),           # fewer than min
])
def test_a_load_stops_once_its_interval_is_tight(values: list[float], stop: bool) -> None:
    assert repeats.enough(values, 3, 0.03) is stop


def test_the_sweep_skips_the_repeats_a_quiet_load_does_not_need(tmp_path: Path) -> None:
    plan = build_plan(_sweep(tmp_path))
    (server,) = plan.servers
    assert len(server.cells) == 2 * 5  # planned up to max
    said: list[str] = []
    with Store.create(tmp_path / "run" / "results.sqlite", plan.sweep.model_dump(), "test") as store:
        runner.register(plan, store)
        quiet = {1: [20.0, 20.1, 19.9], 4: [60.0, 75.0, 50.0]}
        for cell in server.cells:
            if cell.repeat < 3:
                value = quiet[cell.concurrency][cell.repeat]
                summary = ({"per_request_tps": {"mean": value}} if cell.concurrency == 1 else {"aggregate_tps": value})
                store.start_cell(cell.id)
                store.finish_cell(cell.id, summary, {"summary": summary})
        fourth = {c.concurrency: c for c in server.cells if c.repeat == 3}
        assert serverrun._measured_enough(plan, store, server, fourth[1], said.append) is True
        assert serverrun._measured_enough(plan, store, server, fourth[4], said.append) is False
        assert store.cell(fourth[1].id).status == "skipped" and store.cell(fourth[4].id).status == "pending"
    assert said == ["cell vllm-cpu/none c=1 seed #3: skipped, 3 runs pin the mean to ±1.2% (repeats: auto, target 3%)"]


def test_the_dry_run_says_what_auto_costs_at_most(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sweep", str(_sweep(tmp_path)), "--dry-run", "--runs-dir", str(tmp_path / "runs")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "repeats: auto - each load runs 3 to 5 times" in out and "ETA at most" in out


@pytest.mark.parametrize(("value", "extra", "expected"), [
    ("three", "", "repeats: Value error, expected a whole number of runs per load (1 to 1000) or auto"),
    ("auto", "auto_repeats: {min: 6, max: 4}\n", "auto_repeats: min 6 is more than max 4"),
])
def test_bad_repeats_name_the_key(tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str, extra: str,
                                  expected: str) -> None:
    assert main(["sweep", str(_sweep(tmp_path, value, extra)), "--dry-run", "--runs-dir", str(tmp_path)]) == 2
    assert expected in " ".join(capsys.readouterr().err.split())


def test_plots_draw_no_interval_for_single_runs_and_labels_that_do_not_collide(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The speedup plot once drew whiskers of zero width on single runs (read as a tight interval) and two-line
    tick labels that ran together ("draft modeldraft model")."""
    from matplotlib.axes import Axes

    from sparklab import report
    from sparklab.report.plots import speedup_bars, throughput_vs_k
    from tests.unit.test_checks import _equal_cells, _run

    whiskers: list[int] = []
    labels: list[list[str]] = []
    original_errorbar, original_ticks = Axes.errorbar, Axes.set_xticks
    monkeypatch.setattr(Axes, "errorbar", lambda self, x, *a, **k: (whiskers.append(len(x)),
                                                                      original_errorbar(self, x, *a, **k))[1])
    monkeypatch.setattr(Axes, "set_xticks", lambda self, ticks, names=None, **k: (
        labels.append(list(names or [])), original_ticks(self, ticks, names, **k))[1])
    equal = _equal_cells()

    def varied(method: str, k: int | None, c: int, repeat: int) -> tuple[dict[str, Any], dict[str, Any]]:
        summary, result = equal(method, k, c, repeat)  # repeats that differ: a measured interval to draw
        value = summary["aggregate_tps"] * (1 + 0.01 * repeat)
        return {**summary, "aggregate_tps": value, "per_request_tps": {"mean": value}}, result

    # one run, and (issue 23) identical repeats: no interval was measured, so no whisker; varied repeats: whiskers
    for n, make, drawn in ((1, equal, []), (3, equal, []), (3, varied, [2, 1, 1])):
        path = _run(tmp_path / f"n{n}-{len(drawn)}", make, methods="[none, mtp, dspark]", repeats=n)
        with Store.open(path, readonly=True) as store:
            built = report.build(store, "r")
        whiskers.clear()
        assert speedup_bars(built, "seed", tmp_path / f"plots{n}") and throughput_vs_k(built, "seed", tmp_path)
        assert whiskers == drawn  # bars (mtp, dspark), then one point per K line
    assert labels[0] == ["MTP K=3", "DSpark K=3"] and all("\n" not in name for name in labels[0])


def test_the_best_pick_says_when_the_runner_up_is_not_significantly_different(tmp_path: Path) -> None:

    from sparklab import report
    from tests.unit.test_checks import _run

    speeds = {"none": [100.0, 101.0, 99.0], "mtp": [150.0, 140.0, 160.0], "dspark": [152.0, 141.0, 163.0]}

    def make(method: str, k: int | None, c: int, repeat: int) -> tuple[dict[str, Any], dict[str, Any]]:
        value = speeds[method][repeat]
        return {"aggregate_tps": value, "per_request_tps": {"mean": value}}, {}

    path = _run(tmp_path, make, methods="[none, mtp, dspark]", repeats=3)
    with Store.open(path, readonly=True) as store:
        built = report.build(store, "r")
    (best,) = built.best
    assert best.runner_up is not None and best.versus_runner_up is not None
    assert best.versus_runner_up.significant is False
    text = " ".join(report.render(built, "md").split())
    assert "NOT significantly different from runner-up vllm" in text and "either will do" in text
