"""`sparklab tune` picks only the target model made faster (issue 25, the report's rule): a config whose answers
differ from none's at temperature 0 is not a candidate at that concurrency, however fast, and tune says so once.
End to end on scripted servers (tests/unit/test_tune_schedule.py's runner)."""

from __future__ import annotations

import json
from pathlib import Path

from sparklab import report
from sparklab.cli.tune_text import tune_summary
from sparklab.recipes.plan import ServerConfig
from sparklab.sweep import downloads, runner
from sparklab.sweep.store import Store
from sparklab.tune import driver
from tests.unit.test_tune_schedule import scripted_run, truth_of


def _answer(server: ServerConfig, c: int) -> str:
    """ngram K=3 changes its answers at C=1 (a broken verifier, or numerics of its batch shape); the rest answer as
    none does."""
    return "another answer" if (server.num_speculative_tokens, c) == (3, 1) else "the target's answer"


def test_a_config_whose_answers_differ_from_none_is_never_tunes_pick(tmp_path: Path, monkeypatch) -> None:
    said: list[str] = []
    starts: list[str] = []
    monkeypatch.setattr(runner, "run", scripted_run(truth_of(38.0), starts, _answer))
    monkeypatch.setattr(downloads, "download", lambda plan, store, say: None)
    choices = driver.TuneChoices("cpu-tune", k=(1, 2, 3), repeats=3, max_repeats=6, runs_dir=tmp_path)
    outcome = driver.run_tune(driver.request_for(choices), say=said.append)
    picks = {p["concurrency"]: p["label"] for p in outcome.state["picks"]}
    assert picks[1] == "ngram K=2", picks  # K=3 is the fastest at C=1 (52 tok/s) but changed its answers
    assert picks[4] == "ngram K=1", picks  # unchanged: its answers at C=4 are none's
    lines = [line for line in said if "differ from none's" in line]
    assert lines == ["tune: ngram K=3 at C=1: its answers differ from none's at temperature 0 (identical: 0% (0/12), "
                     "first diff at character 0), so it is not a candidate, however fast"], said
    assert outcome.state["changed_output"] == ["ngram K=3 at C=1"]
    with Store.open(outcome.run_dir / "results.sqlite", readonly=True) as store:
        built = report.build(store, outcome.run_dir.name)
    text = tune_summary(built, json.loads(json.dumps(outcome.state)))
    assert "C=1: sparklab up cpu:ngram --engine vllm-cpu -k 2" in text, text
    assert ("passed over, whatever their speed: answers that differ from none's at temperature 0 (not the target "
            "model made faster): ngram K=3 at C=1") in text, text
    changed = [g.server.label for g in built.groups if g.equality is not None and g.equality.differs]
    assert changed == ["vllm-cpu ngram K=3"]  # the report's equality check sees the same, from the same answers
