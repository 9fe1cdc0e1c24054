"""`sparklab tune`'s runner without an engine: the space file, what the store gives the search, and the report's
"predicted vs measured" section and the command line's closing lines."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from sparklab import report
from sparklab.cli.tune_text import tune_summary
from sparklab.recipes.plan import build_plan
from sparklab.recipes.schema import recipes_dir
from sparklab.sweep import runner
from sparklab.sweep.store import Store
from sparklab.tune import driver, search


def _planned(tmp_path: Path) -> tuple[Any, Store]:
    space = driver.load_space("cpu-demo")
    assert space is not None
    path = driver.write_space(tmp_path, space, search.Settings(2, 2))
    plan = build_plan(path, run_id="tune-test")
    store = Store.create(tmp_path / "results.sqlite", plan.sweep.model_dump(), "test")
    runner.register(plan, store, only=lambda server, cell: False)
    return plan, store


def _finish(store: Store, cell_id: str, tps: float, per_position: list[float] | None) -> None:
    summary = {"requests": {"measured": 4, "ok": 4, "failed": 0}, "aggregate_tps": tps,
               "ttft_ms": {"p50": 120.0}}
    result: dict[str, Any] = {"summary": summary}
    if per_position is not None:
        result["speculative"] = {"per_position_acceptance": per_position, "drafts": 40,  # vLLM's counters
                                 "acceptance_length": 1 + sum(per_position)}
    store.start_cell(cell_id)
    store.finish_cell(cell_id, summary, result)


def test_the_store_gives_the_search_values_acceptance_and_settled_repeats(tmp_path: Path) -> None:
    plan, store = _planned(tmp_path)
    with store:
        assert store.cells() == [] and len(store.server_configs()) == len(plan.servers)  # no cell yet
        wanted = {("none", None), ("ngram", 3)}
        runner.register(plan, store, only=lambda s, c: (s.method, s.num_speculative_tokens) in wanted and c.repeat < 2)
        ids = {s.id: (s.method, s.num_speculative_tokens) for s in plan.servers}
        for i, cell in enumerate(store.cells()):
            config = ids[cell.server_config_id]
            if config == ("ngram", 3) and cell.concurrency == 4 and cell.repeat == 1:
                store.start_cell(cell.id)
                store.fail_cell(cell.id, "bench_error", "boom", max_attempts=1)
                continue
            _finish(store, cell.id, 20.0 + i, [0.5, 0.3, 0.1] if config[1] else None)
        obs = driver.observations(store, plan, "aggregate")
    assert set(obs) == wanted
    ngram4 = obs[("ngram", 3)][4]
    assert len(ngram4.values) == 1 and ngram4.settled == 2  # the failed repeat is settled, not a value
    assert obs[("ngram", 3)][1].per_position == (0.5, 0.3, 0.1)
    assert obs[("ngram", 3)][1].acceptance_length == 1.9 and obs[("none", None)][1].per_position == ()
    assert obs[("none", None)][1].ttft_ms == (120.0, 120.0)


def test_objective_values() -> None:
    summary = {"aggregate_tps": 10.0, "per_request_tps": {"mean": 3.0}, "decode_tps": {"mean": 4.0}}
    assert [driver.objective_value(summary, o) for o in search.OBJECTIVES] == [10.0, 3.0, 4.0]
    assert driver.objective_value({}, "decode") is None


def test_the_report_and_the_closing_lines_show_picks_predictions_and_up_commands(tmp_path: Path) -> None:
    plan, store = _planned(tmp_path)
    with store:
        runner.register(plan, store, only=lambda s, c: c.repeat < 2)
        ids = {s.id: (s.method, s.num_speculative_tokens) for s in plan.servers}
        for cell in store.cells():
            method, k = ids[cell.server_config_id]
            tps = 20.0 + (k or 0) * (3 if cell.concurrency == 1 else -3) + cell.repeat * 0.1
            _finish(store, cell.id, tps if method != "draft_model" else 10.0, [0.6, 0.4, 0.2] if k else None)
        space = driver.space_of(plan)
        settings = search.Settings(2, 2)
        obs = driver.observations(store, plan, "aggregate")
        done = search.decide(space, settings, obs)
        assert isinstance(done, search.Done)
        state = {"settings": driver.settings_dict(settings), "objective": "aggregate", "loads": 7, "wall_s": 12.0,
                 "rounds": [{"why": "probe", "configs": [], "repeats": 2, "loads": ["vllm-cpu/none"]}],
                 **driver._finish(space, settings, obs, done)}
        state["schedule"] = driver._schedule_args(plan, store, state["schedule"])
        store.set_meta("tune", state)
    with Store.open(tmp_path / "results.sqlite", readonly=True) as store:
        built = report.build(store, "tune-test")
    markdown = report.render(built, "md")
    assert "sparklab tune: the best method and K per concurrency" in markdown
    assert "Predicted vs measured" in markdown and "7 model loads" in markdown
    text = tune_summary(built, json.loads(json.dumps(state)))
    assert "C=1: ngram K=3" in text and "C=4: none" in text
    assert "C=1: sparklab up cpu:ngram --engine vllm-cpu -k 3" in text
    assert "C=4: sparklab up cpu:none --engine vllm-cpu" in text
    # ngram K=3 at C=1 and no drafting at C=4: one server with K per batch size, but the stored engine version
    # is unknown here, so no argument is printed for it
    assert [list(r) for r in state["schedule"]["ranges"]] == [[1, 1, 3], [2, 1024, 0]]
    assert "no K schedule printed" in text and "did not report its vLLM version" in text
    with Store.open(tmp_path / "results.sqlite") as store:  # the K=3 server reported vLLM 0.27.1
        ngram3 = next(s.id for s in plan.servers if (s.method, s.num_speculative_tokens) == ("ngram", 3))
        store.record_server_start(ngram3, image_digest=None, startup_facts=None, ready_s=1.0, log_path=None,
                                  engine_version="0.27.1")
        state["schedule"] = driver._schedule_args(plan, store, {"method": "ngram", "ranges": [[1, 1, 3], [2, 1024, 0]]})
    with Store.open(tmp_path / "results.sqlite", readonly=True) as store:
        text = tune_summary(report.build(store, "tune-test"), json.loads(json.dumps(state)))
    # issue 25: a schedule is printed only with its measured speed; this one was never loaded, so no command
    # (tests/unit/test_tune_schedule.py measures one that wins and one that loses)
    assert "it was not measured" in text and "not recommended" in text
    assert "num_speculative_tokens_per_batch_size" not in text and "--serve-arg" not in text


def test_request_from_a_recipe_builds_the_space_from_flags() -> None:
    from sparklab.cli.main import build_parser
    from sparklab.cli.sweep import TuneArgs

    args = build_parser().parse_args(["tune", "cpu", "--methods", "none", "ngram", "--k", "1-4",
                                      "--concurrency", "1", "8", "--ttft-max", "500", "--objective", "decode"])
    request = driver.request_for(TuneArgs.from_cli_args(args).choices)
    assert request.space["recipe"] == "cpu" and request.space["num_speculative_tokens"] == [1, 2, 3, 4]
    assert request.settings == search.Settings(2, 4, 0.15, 500.0) and request.objective == "decode"


def test_dry_run_prints_the_plan_the_most_loads_and_an_eta_bound_and_starts_nothing(capsys, tmp_path: Path,
                                                                                  monkeypatch) -> None:
    from sparklab.cli.main import main
    from sparklab.runtimes import containers

    def no_docker(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a dry run touched Docker")

    monkeypatch.setattr(containers.Docker, "__init__", no_docker)
    runs = tmp_path / "runs"
    code = main(["tune", "cpu-demo", "--dry-run", "--runs-dir", str(runs), "--repeats", "2", "--max-repeats", "3"])
    out = capsys.readouterr().out
    assert code == 0 and not runs.exists()  # no run directory, no store
    assert "next round: probe" in out and "draft_model K=3: vllm serve" in out and "ngram K=1:" not in out
    # cpu-demo: none, ngram and draft_model at K 1 and 3 = 5 configs, each loaded once (2 runs), then reloaded for
    # the verdict at each of the 2 concurrencies (its third run), and one K-schedule server: 5 + 5 x 2 + 1
    assert "at most 16 model loads (each of the 5 configs once, reloads up to 3 runs per concurrency" in out
    eta = re.search(r"ETA at most (\d+) h (\d+) min.*the full grid: 5 loads, ETA (\d+) h (\d+) min", out)
    assert eta is not None
    upper, grid = (int(eta[1]) * 60 + int(eta[2])), (int(eta[3]) * 60 + int(eta[4]))
    assert upper > grid > 0  # the bound counts the second loads and the third repeats the grid does not
    assert out.rstrip().endswith("dry run: nothing started")



def test_a_sampled_spaces_dry_run_counts_the_lossless_checks_none_at_the_end(capsys, tmp_path: Path) -> None:
    """At temperature > 0 the drafters' answers are scored under `none` (the lossless check): tune does it once,
    when the search is done, with one more `none` load, and the bound says so (cpu-demo at temperature 0: 16)."""
    from sparklab.cli.main import main

    document = yaml.safe_load((recipes_dir() / "sweeps" / "cpu-demo.yaml").read_text())
    document["recipe"] = str(recipes_dir() / "cpu.yaml")
    document["sampling"] = {**document["sampling"], "temperature": 1.0, "top_p": 0.95}
    (tmp_path / "sampled.yaml").write_text(yaml.safe_dump(document))
    code = main(["tune", str(tmp_path / "sampled.yaml"), "--dry-run", "--runs-dir", str(tmp_path / "runs"),
                 "--repeats", "2", "--max-repeats", "3"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "at most 17 model loads (each of the 5 configs once" in out
    assert "`none` once more to score the sampled answers (the lossless check)" in out

def test_a_sweep_of_two_engines_tunes_its_first() -> None:
    space = driver.load_space("cpu-demo")  # vLLM and llama.cpp: tune searches method x K of one engine
    assert space is not None and space["engines"] == ["vllm-cpu"]
    assert all(m.get("engine") in (None, "vllm-cpu") for m in space.get("exclude", []))
