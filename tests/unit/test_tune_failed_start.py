"""A server start that fails inside one of tune's loads is retried in that load, not inside the next one (issue 25 §4:
the reloads that estimate load-to-load noise run in ABBA order).

The runner serves every pending cell in plan order, so before, a load whose start failed (its cells back to pending,
an attempt spent) was started again by the next load's run, after or before that load's own server depending on
where each sat in the plan: A(failed) B A instead of A(failed) A B, and the next round's reloads were out of order.
`sparklab tune` end to end on scripted servers (tests/unit/test_tune_schedule.py's world: none 40 tok/s, ngram K
at 40 + 4K at C=1 and 48 - 2K at C=4), every config's first start failing once."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sparklab.sweep import downloads, runner
from sparklab.sweep.store import Store
from sparklab.tune import driver
from tests.unit.test_tune_schedule import scripted_run, serve_scripted, truth_of


def tune(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fails: Callable[[str, list[tuple[str, bool]]], bool]
         ) -> tuple[driver.TuneOutcome, list[tuple[str, bool]], list[list[str]]]:
    """Tune on scripted servers; fails(label, starts so far) says whether this start fails. Returns the outcome, every
    start in order (server, whether it failed) and the servers each runner.run call started."""
    truth = truth_of(46.0)
    starts: list[tuple[str, bool]] = []
    runs: list[list[str]] = []
    counter = itertools.count(1)

    def run(plan: Any, store: Store, runtime: Any, run_dir: Path, options: Any, say: Any,
            hosts: Any = None, reach: Any = None, score: bool = True) -> dict[str, int]:
        runs.append([])
        pending = store.pending_cells()
        for server in (s for s in plan.servers if any(c.server_config_id == s.id for c in pending)):  # plan order
            label = server.label + (" (schedule)" if server.serve_args else "")
            failing = fails(label, starts)
            starts.append((label, failing))
            runs[-1].append(label)
            if failing:
                store.fail_server_config(server.id, "not_ready", "scripted: the start fails",
                                         max_attempts=plan.sweep.max_attempts)
                continue
            serve_scripted(store, server, pending, f"{next(counter):04d}#{server.id}", truth)
        return store.counts()

    monkeypatch.setattr(runner, "run", run)
    monkeypatch.setattr(downloads, "download", lambda plan, store, say: None)
    choices = driver.TuneChoices("cpu-tune", k=(1, 2, 3), repeats=3, max_repeats=6, runs_dir=tmp_path)
    return driver.run_tune(driver.request_for(choices), say=lambda message: None), starts, runs


def test_a_failed_start_is_retried_in_its_own_load_before_the_next_load_starts(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    outcome, starts, runs = tune(tmp_path, monkeypatch, lambda label, starts: all(n != label for n, _ in starts))

    failed = [i for i, (_, fails) in enumerate(starts) if fails]
    assert len(failed) >= 4, starts  # none, two or more drafting configs and the K schedule's server were loaded
    assert "vllm-cpu/ngram K=3 (schedule)" in {starts[i][0] for i in failed}
    for i in failed:  # the retry is the very next start, before any other server
        assert starts[i + 1] == (starts[i][0], False), starts
    assert all(len(set(labels)) == 1 for labels in runs), runs  # each load's run starts its own server only
    picks = {p["concurrency"]: p["label"] for p in outcome.state["picks"]}
    assert picks == {1: "ngram K=3", 4: "ngram K=1"}  # the verdict as without the failures
    assert outcome.state["schedule"]["verdict"]["recommended"]  # measured after its retry
    with Store.open(outcome.run_dir / "results.sqlite", readonly=True) as store:
        assert not store.cells("failed") and not store.pending_cells()


def test_a_config_whose_every_start_fails_is_left_out_and_the_search_finishes(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    outcome, starts, runs = tune(tmp_path, monkeypatch, lambda label, starts: label == "vllm-cpu/ngram K=3")
    tried = [i for i, (label, _) in enumerate(starts) if label == "vllm-cpu/ngram K=3"]
    assert len(tried) == 3 and tried == list(range(tried[0], tried[0] + 3)), starts  # its 3 attempts, one after another
    assert all(len(set(labels)) == 1 for labels in runs), runs
    picks = {p["concurrency"]: p["label"] for p in outcome.state["picks"]}
    assert "ngram K=3" not in picks.values() and picks[4] == "ngram K=1"
    with Store.open(outcome.run_dir / "results.sqlite", readonly=True) as store:
        assert {c.server_config_id for c in store.cells("failed")} and not store.pending_cells()


def test_a_load_no_host_can_take_stops_the_tune_as_an_incomplete_run_naming_the_cause(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A pair's worker Spark gone: its server goes back to the queue and no host is left to take it, so its cells
    stay pending, round after round. Before, tune stopped with "tune made no progress" and a hint to look at the log
    and retry, exit 1, as if the search had a bug; the cause was only in the lines above. Now it stops as an
    incomplete run does (exit 6, results kept, the same command continues it) and names the configs left and the
    loss."""
    from sparklab.cli.main import main

    def run(plan: Any, store: Store, runtime: Any, run_dir: Path, options: Any, say: Any,
            hosts: Any = None, reach: Any = None, score: bool = True) -> dict[str, int]:
        pending = store.pending_cells()
        server = next(s for s in plan.servers if any(c.server_config_id == s.id for c in pending))
        if not store.failures():  # its first start: the worker's host goes mid-cell
            store.start_cell(next(c.id for c in pending if c.server_config_id == server.id))
            store.host_lost(server.id, "spark-2", f"the Docker host of spark-2 stopped answering during server "
                                                  f"{server.label}")
        say(f"server {server.label}: no host could take it (spark-1: the server needs 2 hosts that can hold it); "
            "its cells stay pending")
        return store.counts()

    monkeypatch.setattr(runner, "run", run)
    monkeypatch.setattr(downloads, "download", lambda plan, store, say: None)
    monkeypatch.setenv("SPARKLAB_STATE", str(tmp_path / "state"))
    code = main(["tune", "cpu-tune", "--k", "1-3", "--runs-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 6, err
    assert "Traceback" not in err and "made no progress" not in err, err
    assert "vllm-cpu/none" in err and "the Docker host of spark-2 stopped answering" in err, err
    assert "run the same command again once the hosts are back: it continues where it stopped" in err.lower(), err
    # the host back: the same command continues that run and finishes it, the cells measured before kept
    (run_dir,) = [d for d in tmp_path.iterdir() if d.name.startswith("tune-cpu-tune-")]
    starts: list[str] = []
    monkeypatch.setattr(runner, "run", scripted_run(truth_of(46.0), starts))
    code = main(["tune", "cpu-tune", "--k", "1-3", "--runs-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 0, err
    assert [d for d in tmp_path.iterdir() if d.name.startswith("tune-cpu-tune-")] == [run_dir]
    with Store.open(run_dir / "results.sqlite", readonly=True) as store:
        assert any(f.kind == "host_lost" for f in store.failures()) and not store.pending_cells()
