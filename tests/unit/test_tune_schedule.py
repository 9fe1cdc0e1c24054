"""A K schedule is measured before it is recommended (issue 25 §3): `sparklab tune` end to end on scripted servers
(the sweep runner replaced by one that finishes each pending cell with a scripted tok/s, a load id per server
start): when the winners differ in K it loads one more server with vLLM's per-batch-size K, measures it at every
concurrency, and recommends it only where it loses nowhere beyond noise; otherwise the per-concurrency servers."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sparklab import report
from sparklab.cli.tune_text import tune_summary
from sparklab.outputs import kept
from sparklab.recipes.plan import ServerConfig
from sparklab.sweep import downloads, runner
from sparklab.sweep.store import Store
from sparklab.tune import driver
from tests.fakes import FakeRuntime

RATES = [0.6, 0.5, 0.4]
SCHEDULE = "num_speculative_tokens_per_batch_size"


def truth_of(schedule_at_4: float) -> Callable[[ServerConfig, int], float]:
    """none 40 tok/s; ngram K: 40 + 4K at C=1 (K=3 wins) and 48 - 2K at C=4 (K=1 wins); the schedule server (K=3
    at batch size 1, K=1 above) as fast as K=3 at C=1 and `schedule_at_4` at C=4."""
    def truth(server: ServerConfig, c: int) -> float:
        if any(SCHEDULE in a for a in server.serve_args):
            return 52.0 if c == 1 else schedule_at_4
        if server.num_speculative_tokens is None:
            return 40.0
        k = server.num_speculative_tokens
        return 40.0 + 4 * k if c == 1 else 48.0 - 2 * k
    return truth


def serve_scripted(store: Store, server: ServerConfig, cells: list[Any], load: str,
                   truth: Callable[[ServerConfig, int], float],
                   answer: Callable[[ServerConfig, int], str] | None = None) -> None:
    """One scripted load of `server`: each of its pending `cells` done at the truth's tok/s (a small run-to-run
    spread), the load's id on each, acceptance from RATES for a drafter; `answer`: the text of its 4 answers."""
    store.record_server_start(server.id, image_digest=None, startup_facts=None, ready_s=1.0, log_path=None,
                              engine_version="0.27.1")
    for cell in (c for c in cells if c.server_config_id == server.id):
        value = truth(server, cell.concurrency) * (1 + (0.003, -0.003, 0.0)[cell.repeat % 3])
        summary = {"requests": {"measured": 4, "ok": 4, "failed": 0}, "aggregate_tps": value,
                   "ttft_ms": {"p50": 100.0}}
        result: dict[str, Any] = {"summary": summary, "server_load": {"id": load}}
        if answer is not None:
            text = answer(server, cell.concurrency)
            result["outputs"] = [kept(i, f"seed-{i}", False, True, "length", text, None) for i in range(4)]
        k = server.num_speculative_tokens
        if k:
            result["speculative"] = {"per_position_acceptance": RATES[:k], "drafts": 40,
                                     "acceptance_length": 1 + sum(RATES[:k])}
        store.start_cell(cell.id)
        store.finish_cell(cell.id, summary, result)


def scripted_run(truth: Callable[[ServerConfig, int], float], starts: list[str],
                 answer: Callable[[ServerConfig, int], str] | None = None) -> Callable[..., dict[str, int]]:
    counter = itertools.count(1)

    def run(plan: Any, store: Store, runtime: Any, run_dir: Path, options: Any, say: Any,
            hosts: Any = None, reach: Any = None, score: bool = True) -> dict[str, int]:
        pending = store.pending_cells()
        servers = {s.id: s for s in plan.servers}
        for server_id in dict.fromkeys(c.server_config_id for c in pending):
            server = servers[server_id]
            starts.append(server.label + (" (schedule)" if server.serve_args else ""))
            serve_scripted(store, server, pending, f"{next(counter):04d}#{server_id}", truth, answer)
        return store.counts()
    return run


def tune(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, schedule_at_4: float) -> tuple[dict[str, Any], str, list]:
    starts: list[str] = []
    monkeypatch.setattr(runner, "run", scripted_run(truth_of(schedule_at_4), starts))
    monkeypatch.setattr(downloads, "download", lambda plan, store, say: None)
    choices = driver.TuneChoices("cpu-tune", k=(1, 2, 3), repeats=3, max_repeats=6, runs_dir=tmp_path)
    outcome = driver.run_tune(driver.request_for(choices), say=lambda message: None)
    with Store.open(outcome.run_dir / "results.sqlite", readonly=True) as store:
        built = report.build(store, outcome.run_dir.name)
    text = tune_summary(built, json.loads(json.dumps(outcome.state))) + "\n" + report.render(built, "md")
    return json.loads(json.dumps(outcome.state)), text, starts  # as the store keeps it (and the report says it)


def test_a_schedule_that_loses_at_a_concurrency_is_not_recommended_and_the_per_c_servers_are(tmp_path: Path,
                                                                                          monkeypatch) -> None:
    state, text, starts = tune(tmp_path, monkeypatch, schedule_at_4=38.0)  # a K=1 schedule slot slower than K=1
    picks = {p["concurrency"]: p["label"] for p in state["picks"]}
    assert picks == {1: "ngram K=3", 4: "ngram K=1"}
    schedule = state["schedule"]
    assert schedule["ranges"] == [[1, 1, 3], [2, 1024, 1]]
    assert starts.count("vllm-cpu/ngram K=3 (schedule)") == 1  # one more server, measured at every concurrency
    rows = {r["concurrency"]: r for r in schedule["verdict"]["rows"]}
    assert rows[1]["schedule_mean"] == pytest.approx(52.0) and not rows[1]["loses"]
    assert rows[4]["schedule_mean"] == pytest.approx(38.0) and rows[4]["loses"]
    assert not schedule["verdict"]["recommended"]
    assert "the schedule LOSES beyond noise at C=4" in text and "run the per-concurrency servers instead" in text
    assert "C=1: sparklab up cpu:ngram --engine vllm-cpu -k 3" in text
    assert "C=4: sparklab up cpu:ngram --engine vllm-cpu -k 1" in text
    assert "--serve-arg" not in text  # the schedule's command is not offered
    assert "C=4 (K=1): schedule 38.00 [" in text and "vs ngram K=1 46.00 [" in text  # measured, side by side
    assert "The K schedule, measured on one server at every concurrency: the schedule LOSES" in text  # the report


def test_a_schedule_that_loses_nowhere_is_recommended_with_its_measured_speed(tmp_path: Path, monkeypatch) -> None:
    state, text, _ = tune(tmp_path, monkeypatch, schedule_at_4=46.0)
    assert state["schedule"]["verdict"]["recommended"]
    assert "does not lose to any per-concurrency winner beyond noise: one server will do" in text
    flag = "--speculative_config.num_speculative_tokens_per_batch_size=[[1,1,3],[2,1024,1]]"
    assert f"sparklab up cpu:ngram --engine vllm-cpu -k 3 '--serve-arg={flag}'" in text
    assert "C=1 (K=3): schedule 52.00 [" in text and "C=4 (K=1): schedule 46.00 [" in text
    assert "K=0 is in it" not in text and "2-1024: K=0" not in text  # none won nowhere: no K=0 in the schedule


def test_k0_is_written_only_for_a_measured_server_and_the_output_says_why(tmp_path: Path, monkeypatch) -> None:
    # none wins at C=4 (every K is slower there): the schedule has K=0 above batch size 1, measured, and explained
    starts: list[str] = []

    def truth(server: ServerConfig, c: int) -> float:
        if any(SCHEDULE in a for a in server.serve_args):
            return 52.0 if c == 1 else 40.0
        k = server.num_speculative_tokens
        return 40.0 if k is None else (40.0 + 4 * k if c == 1 else 36.0 - k)

    monkeypatch.setattr(runner, "run", scripted_run(truth, starts))
    monkeypatch.setattr(downloads, "download", lambda plan, store, say: None)
    choices = driver.TuneChoices("cpu-tune", k=(1, 2, 3), repeats=3, max_repeats=6, runs_dir=tmp_path)
    outcome = driver.run_tune(driver.request_for(choices), say=lambda message: None)
    schedule = json.loads(json.dumps(outcome.state["schedule"]))
    assert schedule["ranges"] == [[1, 1, 3], [2, 1024, 0]]
    assert "vllm-cpu/ngram K=3 (schedule)" in starts  # K=0 at C=4 only after that server ran at C=4
    assert {r["concurrency"] for r in schedule["verdict"]["rows"] if r["schedule_mean"] is not None} == {1, 4}
    assert "still runs the drafter" in schedule["verdict"]["k0"] and "vllm-project/vllm#49986" in schedule["verdict"]["k0"]
    with Store.open(outcome.run_dir / "results.sqlite", readonly=True) as store:
        text = tune_summary(report.build(store, outcome.run_dir.name), json.loads(json.dumps(outcome.state)))
    assert "K=0 is in it only because the schedule server was measured at that batch size" in text


def test_an_interrupted_schedule_is_measured_on_the_next_run_not_recommended_unmeasured(tmp_path: Path,
                                                                                      monkeypatch) -> None:
    starts: list[str] = []
    finish = scripted_run(truth_of(46.0), starts)

    def ctrl_c_at_the_schedule(plan: Any, store: Store, *args: Any, **kwargs: Any) -> dict[str, int]:
        if any(any(SCHEDULE in a for a in s.serve_args) for s in plan.servers):
            raise KeyboardInterrupt
        return finish(plan, store, *args, **kwargs)

    monkeypatch.setattr(runner, "run", ctrl_c_at_the_schedule)
    monkeypatch.setattr(downloads, "download", lambda plan, store, say: None)
    choices = driver.TuneChoices("cpu-tune", k=(1, 2, 3), repeats=3, max_repeats=6, runs_dir=tmp_path)
    stopped = driver.run_tune(driver.request_for(choices), say=lambda message: None)
    assert stopped.interrupted and "verdict" not in (stopped.state.get("schedule") or {})
    with Store.open(stopped.run_dir / "results.sqlite", readonly=True) as store:
        text = tune_summary(report.build(store, stopped.run_dir.name), json.loads(json.dumps(stopped.state)))
    assert "--serve-arg" not in text  # never printed without its measurement
    again, _, more = tune(tmp_path, monkeypatch, schedule_at_4=46.0)  # the same command continues the run
    assert more == ["vllm-cpu/ngram K=3 (schedule)"]  # only what was left: the schedule's server
    assert again["schedule"]["verdict"]["recommended"]


def test_a_synthetic_pick_is_labelled_and_never_given_as_a_config_to_run(tmp_path: Path, monkeypatch) -> None:
    starts: list[str] = []

    def truth(server: ServerConfig, c: int) -> float:
        return 40.0 if server.num_speculative_tokens is None else 50.0 - server.num_speculative_tokens

    def answer(server: ServerConfig, c: int) -> str:  # synthetic acceptance keeps drafts the target would reject
        return "the target's answer" if server.num_speculative_tokens is None else "drafts kept as they came"

    monkeypatch.setattr(runner, "run", scripted_run(truth, starts, answer))
    monkeypatch.setattr(downloads, "download", lambda plan, store, say: None)
    choices = driver.TuneChoices("cpu-tune-steep", k=(1, 2, 3), repeats=3, max_repeats=6, runs_dir=tmp_path)
    outcome = driver.run_tune(driver.request_for(choices), say=lambda message: None)
    # its answers must differ from none's (the report's check expects it): a measurement of the step cost, still
    # tune's pick on a synthetic profile, never passed over as a drafter that changed the output
    assert all(p["synthetic"] and p["label"] == "synthetic K=1" for p in outcome.state["picks"])
    assert not outcome.state.get("changed_output")
    with Store.open(outcome.run_dir / "results.sqlite", readonly=True) as store:
        text = tune_summary(report.build(store, outcome.run_dir.name), json.loads(json.dumps(outcome.state)))
    assert "C=1: synthetic K=1 (SYNTHETIC acceptance):" in text
    assert "C=1: not a config to run: synthetic acceptance benchmarks the engine's step cost" in text
    assert "sparklab up cpu:synthetic" not in text


def test_the_schedule_server_is_reached_as_every_other_load_is(tmp_path: Path, monkeypatch) -> None:
    """A tune over several hosts (a rehearsal's twins, reached through `reach`) loads its schedule server on the
    same hosts the same way: before, its run got the hosts without `reach` and would have dialled the twins' names
    with Docker's remote API."""
    starts: list[str] = []
    scripted = scripted_run(truth_of(46.0), starts)
    reached: list[tuple[Any, Any]] = []

    def run(plan: Any, store: Store, runtime: Any, run_dir: Path, options: Any, say: Any,
            hosts: Any = None, reach: Any = None, score: bool = True) -> dict[str, int]:
        reached.append((runtime, reach))
        return scripted(plan, store, runtime, run_dir, options, say, hosts, reach)

    monkeypatch.setattr(runner, "run", run)
    monkeypatch.setattr(downloads, "download", lambda plan, store, say: None)
    runtime, reach = FakeRuntime(), (lambda host: None)
    choices = driver.TuneChoices("cpu-tune", k=(1, 2, 3), repeats=3, max_repeats=6, runs_dir=tmp_path)
    driver.run_tune(driver.request_for(choices), say=lambda message: None, runtime=runtime, reach=reach)
    assert "vllm-cpu/ngram K=3 (schedule)" in starts
    assert reached and all(r == (runtime, reach) for r in reached)
